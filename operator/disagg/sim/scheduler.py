"""vLLM V1's scheduler, reduced to what decides timing: continuous batching, token budget, KV blocks.

Pure and synchronous (no clock of its own, no asyncio): ``schedule(now)`` picks the next step's batch,
the caller prices it with the roofline, and ``finish_step(batch, end)`` applies it. Unit tests drive it
directly; the engine drives it from an asyncio loop.

Behaviour kept from vLLM (vllm/v1/core/sched/scheduler.py, v0.11.2):
- running requests first (decodes: 1 token; unfinished prefills: the rest, capped by the budget), then
  waiting ones FCFS while ``len(running) < max_num_seqs`` and budget remains;
- without chunked prefill a waiting prompt that does not fit the remaining budget is skipped this step;
- when blocks run out the *last* running request is preempted (blocks freed, recomputed later);
- prefix caching: the longest run of cached full blocks, capped at prompt length − 1;
- remote prefill (NixlConnector consumer): blocks for the whole prompt are allocated, the request
  waits in WAITING_FOR_REMOTE_KVS (not using a running slot or the budget) until the pull completes,
  then recomputes only the last prompt token;
- remote decode (producer): a request finishing length-capped keeps its blocks for the decode side to pull.
"""

from __future__ import annotations

import contextlib
import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .kv import BlockPool, block_hashes


class Status(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    arrival: float
    limit_reason: str = "length"  # finish_reason when max_new_tokens is reached ("stop" when it models EOS)
    remote_decode: bool = False  # producer side: hold KV for a decode engine
    remote_prefill: dict[str, Any] | None = None  # consumer side: kv_transfer_params to pull from
    seed: int = 0
    priority: int = 0  # the request's ``priority`` (lower first; only the priority policy reads it)

    status: Status = Status.WAITING
    num_computed: int = 0
    num_output: int = 0
    blocks: list[int] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)
    num_cached: int = 0  # prompt tokens served from the local prefix cache (first schedule)
    num_external: int = 0  # prompt tokens loaded from a remote engine
    kv_ready: bool = False  # remote KV arrived (or the pull failed and recompute was chosen)
    pull_started: bool = False
    recomputed: bool = False  # remote KV failed and the prompt was prefilled locally
    preemptions: int = 0
    kv_requested: float | None = None  # when the pull was handed to the engine (the decode span's KV-pull start)
    # vLLM's two earlier instants (0.32.0): ``arrival_time``, when the API server took the request, before its
    # share of TTFT (request_overhead_s; v1/engine/input_processor.py), which TTFT and e2e latency count from
    # (v1/metrics/stats.py ``_time_since(req_stats.arrival_time)``); and the QUEUED event, when the engine core's
    # busy loop adds it to the scheduler — between steps, after the step in flight at ``arrival`` (v1/engine/core.py
    # ``run_busy_loop``: ``_process_input_queue`` then the step; v1/core/sched/scheduler.py ``add_request``), which
    # queue time counts from (``queued_time = scheduled_ts - queued_ts``). None: ``arrival``.
    received: float | None = None
    queued: float | None = None
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finish_reason: str | None = None
    prompt_computed_counted: bool = False
    ctx: Any = None  # the engine's per-request state (output queue, timings)
    plen: int = field(init=False, default=0)  # len(prompt_ids), read every step (the prompt never changes)

    def __post_init__(self) -> None:
        self.plen = len(self.prompt_ids)

    @property
    def prompt_len(self) -> int:
        return self.plen

    @property
    def received_at(self) -> float:
        """vLLM's ``arrival_time``: what TTFT and e2e latency count from."""
        return self.arrival if self.received is None else self.received

    @property
    def queued_at(self) -> float:
        """vLLM's QUEUED event: what queue time counts from."""
        return self.arrival if self.queued is None else self.queued

    @property
    def num_tokens(self) -> int:
        return self.plen + self.num_output

    @property
    def finished(self) -> bool:
        return self.status == Status.FINISHED


@dataclass(slots=True)
class Scheduled:
    request: Request
    new_tokens: int
    context: int  # tokens in KV before this step
    samples: bool  # completes the sequence's pending tokens → samples one token


@dataclass
class Batch:
    items: list[Scheduled] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    pulls: list[Request] = field(default_factory=list)  # remote-KV pulls to start now

    @property
    def tokens(self) -> int:
        return sum(s.new_tokens for s in self.items)


@dataclass
class SchedulerStats:
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    computed_prompt_tokens: int = 0  # prompt tokens actually run through the model (incl. recompute)


class Scheduler:
    def __init__(self, pool: BlockPool, *, max_num_seqs: int, max_num_batched_tokens: int,
                 chunked_prefill: bool = True, long_prefill_token_threshold: int = 0,
                 policy: str = "fcfs") -> None:
        """``policy`` (``--scheduling-policy``): ``fcfs``, or ``priority`` as vLLM 0.33.0 runs it
        (vllm/v1/core/sched/request_queue.py PriorityRequestQueue: waiting requests by (priority, arrival);
        scheduler.py ``schedule``: out of KV blocks, the running request with the largest (priority, arrival) is
        preempted, and when that is the one being scheduled the ones after it are still tried)."""
        self.pool = pool
        self.priority = policy == "priority"
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.held: dict[str, tuple[Request, float]] = {}  # producer: request id → (request, expiry)
        self.stats = SchedulerStats()

    # ------------------------------------------------------------------------------------ intake
    def add(self, req: Request) -> None:
        """``req.hashes``, when given, are the prompt's block hashes at this pool's block size (the twin hashes a
        prompt once for all its legs); else they are computed here."""
        if not self.pool.enable_caching:
            req.hashes = []
        elif not req.hashes:
            req.hashes = block_hashes(req.prompt_ids, self.pool.block_size)
        req.status = Status.WAITING
        self._enqueue(req)

    def _enqueue(self, req: Request, front: bool = False) -> None:
        """Into the waiting queue: FCFS at the back (a preempted request at the front); by priority in its
        (priority, arrival) place."""
        if not self.priority:
            if front:
                self.waiting.appendleft(req)
            else:
                self.waiting.append(req)
            return
        key = (req.priority, req.arrival)
        i = len(self.waiting)
        while i > 0 and (self.waiting[i - 1].priority, self.waiting[i - 1].arrival) > key:
            i -= 1
        self.waiting.insert(i, req)

    def has_work(self) -> bool:
        if self.running:
            return True
        return any(r.status == Status.WAITING or r.kv_ready or not r.pull_started for r in self.waiting)

    @property
    def num_waiting_deferred(self) -> int:
        return sum(1 for r in self.waiting if r.status == Status.WAITING_FOR_REMOTE_KVS)

    # ------------------------------------------------------------------------------------ schedule
    def _chunk(self, remaining: int, budget: int) -> int:
        n = remaining
        if self.long_prefill_token_threshold and n > 1:
            n = min(n, self.long_prefill_token_threshold)
        return min(n, budget)

    def _preempt_last(self, batch: Batch) -> tuple[Request, int, int]:
        """Preempt the last running request (FCFS), or the one with the largest (priority, arrival); it, its index
        in ``running`` and the tokens it had been scheduled this step (back into the budget)."""
        if self.priority:
            idx = max(range(len(self.running)), key=lambda k: (self.running[k].priority, self.running[k].arrival))
        else:
            idx = len(self.running) - 1
        victim = self.running.pop(idx)
        self.pool.release(victim.blocks)
        victim.blocks = []
        victim.num_computed = 0
        victim.status = Status.WAITING
        victim.preemptions += 1
        self.stats.preemptions += 1
        self._enqueue(victim, front=True)
        batch.preempted.append(victim)
        freed = sum(s.new_tokens for s in batch.items if s.request is victim)
        if freed:
            batch.items = [s for s in batch.items if s.request is not victim]
        return victim, idx, freed

    def schedule(self, now: float) -> Batch:
        batch = Batch()
        budget = self.max_num_batched_tokens
        # The running pass is the per-step hot path (every decode token): _chunk and blocks_for inlined.
        items = batch.items
        running = self.running
        threshold = self.long_prefill_token_threshold
        bs = self.pool.block_size
        active = Status.RUNNING
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.num_computed
            total = req.plen + req.num_output
            n = total - computed
            if threshold and n > 1 and n > threshold:
                n = threshold
            if n > budget:
                n = budget
            if n <= 0:
                i += 1
                continue
            need = -(-(computed + n) // bs) - len(req.blocks)
            if need > 0:
                new: list[int] | None = None
                while True:
                    new = self.pool.allocate(need)
                    if new is not None:
                        break
                    victim, at, freed = self._preempt_last(batch)
                    budget += freed
                    if at < i:
                        i -= 1
                    if victim is req:
                        break
                if req.status is not active:  # preempted itself: nothing left to try (FCFS) …
                    if self.priority:  # … or the ones after it, of higher priority, may still fit
                        items = batch.items
                        continue
                    break
                if new:
                    req.blocks += new
                items = batch.items  # a preemption rebuilds the list
            items.append(Scheduled(req, n, computed, computed + n >= total))
            budget -= n
            i += 1

        if batch.preempted:
            return batch

        # Waiting requests that already hold blocks (remote KV loaded, or a failed load to recompute) go first:
        # otherwise a preempted request re-admitted ahead of them can livelock a small KV pool.
        if any(r.blocks and r.kv_ready for r in self.waiting):
            holders = [r for r in self.waiting if r.blocks and r.kv_ready]
            rest = [r for r in self.waiting if not (r.blocks and r.kv_ready)]
            self.waiting = deque(holders + rest)
        skipped: list[Request] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if req.status == Status.WAITING_FOR_REMOTE_KVS:
                if not req.kv_ready:
                    skipped.append(self.waiting.popleft())
                    continue
                req.status = Status.WAITING
            if req.remote_prefill is not None and not req.pull_started:
                if not self._start_remote(req, batch):
                    break
                req.kv_requested = now
                skipped.append(self.waiting.popleft())
                continue
            hit: list[int] = []
            if not req.blocks:
                hit = self.pool.lookup(req.hashes, req.num_tokens - 1)
                self.stats.prefix_queries += req.num_tokens
                self.stats.prefix_hits += len(hit) * self.pool.block_size
                computed = len(hit) * self.pool.block_size
            else:
                computed = req.num_computed
            remaining = req.num_tokens - computed
            if not self.chunked_prefill and remaining > budget:
                skipped.append(self.waiting.popleft())
                continue
            n = self._chunk(remaining, budget)
            have = len(hit) if hit else len(req.blocks)
            need = self.pool.blocks_for(computed + n) - have
            self.pool.touch(hit)
            new = self.pool.allocate(need) if need > 0 else []
            if new is None:
                self.pool.release(hit)
                break
            if hit or not req.blocks:
                req.blocks = hit + new
                req.num_computed = computed
                if req.first_scheduled is None:
                    req.num_cached = computed
            else:
                req.blocks += new
            self.waiting.popleft()
            req.status = Status.RUNNING
            self.running.append(req)
            if req.first_scheduled is None:
                req.first_scheduled = now
            batch.items.append(Scheduled(req, n, req.num_computed, req.num_computed + n >= req.num_tokens))
            budget -= n
        self.waiting.extendleft(reversed(skipped))
        return batch

    def _start_remote(self, req: Request, batch: Batch) -> bool:
        """Allocate blocks for the whole prompt and hand the pull to the engine (vLLM: load_kv_async)."""
        hit = self.pool.lookup(req.hashes, req.prompt_len - 1)
        self.stats.prefix_queries += req.prompt_len
        self.stats.prefix_hits += len(hit) * self.pool.block_size
        need = self.pool.blocks_for(req.prompt_len) - len(hit)
        self.pool.touch(hit)
        new = self.pool.allocate(need) if need > 0 else []
        if new is None:
            self.pool.release(hit)
            return False
        req.blocks = hit + new
        req.num_cached = len(hit) * self.pool.block_size
        req.num_computed = req.num_cached
        req.num_external = req.prompt_len - req.num_cached
        req.pull_started = True
        req.status = Status.WAITING_FOR_REMOTE_KVS
        batch.pulls.append(req)
        return True

    # ------------------------------------------------------------------------------------ results
    def finish_step(self, batch: Batch, now: float) -> list[tuple[Request, bool]]:
        """Apply a priced step. Returns (request, finished) for every request that sampled a token."""
        out: list[tuple[Request, bool]] = []
        bs = self.pool.block_size
        active = Status.RUNNING
        finished = False
        for s in batch.items:
            req = s.request
            if req.status is not active:
                continue  # aborted while the step ran
            plen = req.plen
            computed = req.num_computed
            if req.num_output == 0:
                self.stats.computed_prompt_tokens += min(s.new_tokens, max(0, plen - computed))
            computed += s.new_tokens
            req.num_computed = computed
            if computed - s.new_tokens < plen:  # a prompt step: only prompt blocks are ever committed (a decode
                self.pool.commit(req.blocks, req.hashes, min(computed, plen) // bs)  # step re-registering them
            if computed < plen + req.num_output:                                    # all cost a third of a step)
                continue
            req.num_output += 1
            if req.first_token is None:
                req.first_token = now
            req.last_token = now
            done = req.num_output >= req.max_new_tokens
            if done:
                self._finish(req, req.limit_reason, now)
                finished = True
            out.append((req, done))
        if finished:  # aborts leave the list themselves; only requests finished here need dropping
            self.running = [r for r in self.running if r.status is active]
        return out

    def _finish(self, req: Request, reason: str, now: float) -> None:
        req.status = Status.FINISHED
        req.finish_reason = reason
        if req.remote_decode and reason == "length" and req.blocks and self._hold_lease is not None:
            self.held[req.request_id] = (req, now + self._hold_lease)
            return
        self.pool.release(req.blocks)
        req.blocks = []

    _hold_lease: float | None = None  # set by the engine when it is KV-connected

    def set_kv_lease(self, seconds: float | None) -> None:
        self._hold_lease = seconds

    def abort(self, req: Request, reason: str = "abort") -> None:
        if req.status == Status.FINISHED:
            return
        if req in self.running:
            self.running.remove(req)
        with contextlib.suppress(ValueError):
            self.waiting.remove(req)
        req.status = Status.FINISHED
        req.finish_reason = reason
        self.pool.release(req.blocks)
        req.blocks = []

    # ------------------------------------------------------------------------------------ remote KV
    def kv_loaded(self, req: Request, ok: bool, recompute: bool) -> bool:
        """A pull finished. Returns False when the request must fail (policy fail)."""
        if req.status != Status.WAITING_FOR_REMOTE_KVS:
            return True  # aborted meanwhile
        if ok:
            # vLLM: all prompt tokens computed except the last, recomputed to get logits.
            req.num_computed = req.prompt_len - 1
            self.pool.commit(req.blocks, req.hashes, req.prompt_len // self.pool.block_size)
        elif recompute:
            req.num_computed = req.num_cached
            req.num_external = 0
            req.recomputed = True
        else:
            self.abort(req, "error")
            return False
        req.kv_ready = True
        return True

    def release_held(self, request_id: str) -> Request | None:
        entry = self.held.pop(request_id, None)
        if entry is None:
            return None
        req, _ = entry
        self.pool.release(req.blocks)
        req.blocks = []
        return req

    def expire_held(self, now: float) -> list[Request]:
        if not self.held:
            return []
        gone = [rid for rid, (_, exp) in self.held.items() if exp <= now]
        return [r for r in (self.release_held(rid) for rid in gone) if r is not None]

    def next_expiry(self) -> float | None:
        return min((exp for _, exp in self.held.values()), default=None)

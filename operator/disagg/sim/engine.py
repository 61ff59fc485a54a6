"""The simulated engine: an asyncio task that advances simulated time one step at a time.

Each iteration asks the scheduler for a batch, prices it with the roofline (perf/roofline.py), sleeps
``step × time_scale`` wall seconds, and applies the step: tokens go to the requests' queues, metrics
are observed in simulated seconds. KV pulls (decode side) and the side-channel server (prefill side) run
beside the loop (their methods: transfer.py); the clock: clock.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from .. import logs
from ..perf.roofline import KVCapacityError, PerfModel, SeqWork
from . import kvevents
from .clock import MAX_CLOCK_LAG_S, MAX_CLOCK_LAG_WALL_S, SimClock
from .config import SimConfig
from .fastforward import FastForward
from .kv import BlockPool
from .metrics import Metrics, Registry
from .nixl import SideChannelClient, SideChannelServer, block_ids, compat_hash
from .scheduler import Request, Scheduler, SchedulerStats, Status
from .transfer import KVClient, KVTransfers

log = logs.get("disagg.sim.engine")


class StartupError(RuntimeError):
    pass


@dataclass(eq=False)
class ReqCtx:
    queue: asyncio.Queue[tuple[str, Any, float]] = field(default_factory=asyncio.Queue)  # (kind, value, time)
    max_tokens_param: int | None = None
    kv_params_out: dict[str, Any] | None = None
    error: str | None = None
    xfer_s: float | None = None
    last_ts: float = 0.0
    engine: Any = None  # the Engine (data-parallel rank) serving the request
    # In-process consumers (the twin) take (kind, value, time) events here instead of from ``queue``.
    sink: Callable[[str, Any, float], None] | None = None
    # ... and optionally a fast-forwarded run of tokens at once: (tokens so far, first's time, last's time, the
    # largest gap between consecutive tokens of the run); without it each token goes to ``sink``
    sink_run: Callable[[int, float, float, float], None] | None = None


def _kv_dtype_bytes(cfg: SimConfig) -> float:
    return 1.0 if cfg.kv_cache_dtype.startswith("fp8") else 2.0


def build_perf(cfg: SimConfig) -> PerfModel:
    fp8 = (cfg.quantization or "").lower() in ("fp8", "modelopt", "fbgemm_fp8", "compressed-tensors")
    # vLLM --enable-expert-parallel: EP size = TP × DP (vllm_versions.py's multi-node facts); the DP ranks' batches
    # meet in the MoE layers
    ep = cfg.tp * cfg.dp if cfg.expert_parallel else 1
    return PerfModel(cfg.gpu, cfg.model_preset, cfg.tp, cfg.pp, weight_bytes=1.0 if fp8 else 2.0,
                     kv_bytes=_kv_dtype_bytes(cfg), fp8_compute=fp8, ep=ep, dp=cfg.dp if cfg.expert_parallel else 1,
                     eff=cfg.efficiency)


class Engine(KVTransfers):
    def __init__(self, cfg: SimConfig, metrics: Metrics | None = None, *, dp_rank: int = 0,
                 clock: SimClock | None = None, shared: Registry | None = None, kv_client: KVClient | None = None,
                 side_channel: bool = True, metrics_enabled: bool = True,
                 record: frozenset[str] | None = None) -> None:
        """``kv_client``: how this engine pulls remote KV (default: the NIXL side channel over TCP);
        ``side_channel`` False: serve no side channel (the twin reads held KV in-process); ``metrics_enabled``
        False: record nothing; ``record``: report to a recording view of these families instead of Prometheus
        (the twin's scrapes: sim/metrics.py ``Metrics``)."""
        self.cfg = cfg
        self.dp_rank = dp_rank
        self.perf = build_perf(cfg)
        try:
            self.num_blocks = self.perf.kv_blocks(cfg.block_size, cfg.gpu_memory_utilization,
                                                  cfg.max_num_batched_tokens, cfg.max_num_seqs,
                                                  max_model_len=cfg.max_model_len,
                                                  kv_cache_memory_bytes=cfg.kv_cache_memory_bytes,
                                                  num_gpu_blocks_override=cfg.num_gpu_blocks_override)
        except KVCapacityError as e:
            raise StartupError(str(e)) from e
        self.pool = BlockPool(self.num_blocks, cfg.block_size, cfg.prefix_caching)
        self.sched = Scheduler(self.pool, max_num_seqs=cfg.max_num_seqs,
                               max_num_batched_tokens=cfg.max_num_batched_tokens, chunked_prefill=cfg.chunked_prefill,
                               long_prefill_token_threshold=cfg.long_prefill_token_threshold,
                               policy=cfg.scheduling_policy)
        self.kvt = cfg.kv_transfer
        # Any KV-connected engine holds a finished prompt's KV for a remote decode, whatever its kv_role: vLLM's
        # NixlConnector decides per request from its kv_transfer_params (vllm 0.32.0
        # distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py request_finished: is_p_node =
        # params["do_remote_decode"]; kv_role is read only for PCP/PP ranks), so a decode worker lent to the
        # prefill role (a role move, router/load.py WorkerSet.lend) produces KV as a prefill worker does.
        if self.kvt:
            self.sched.set_kv_lease(self.kvt.lease_s)
        # vLLM: each data-parallel rank is its own engine, with engine_id "<id>_dp<rank>" and side-channel port
        # VLLM_NIXL_SIDE_CHANNEL_PORT + rank
        self.engine_id: str | None = None
        if self.kvt:
            self.engine_id = self.kvt.engine_id if cfg.dp == 1 else f"{self.kvt.engine_id}_dp{dp_rank}"
        self.side_port = cfg.side_channel_port + dp_rank
        self.metrics = metrics or Metrics(cfg.served_model_name, cfg.max_model_len, engine=str(dp_rank),
                                          nixl=self.kvt is not None, shared=shared, release=cfg.release,
                                          enabled=metrics_enabled, record=record)
        self.metrics.cache_config.labels(block_size=str(cfg.block_size), num_gpu_blocks=str(self.num_blocks),
                                         gpu_memory_utilization=str(cfg.gpu_memory_utilization),
                                         enable_prefix_caching=str(cfg.prefix_caching),
                                         cache_dtype=cfg.kv_cache_dtype, engine=str(dp_rank)).set(1)
        self.clock = clock or SimClock(cfg.time_scale)
        self.max_lag = max(MAX_CLOCK_LAG_S, MAX_CLOCK_LAG_WALL_S / cfg.time_scale)
        self.rng = random.Random(cfg.seed + dp_rank)
        self.requests_seen = 0  # completion requests that reached the fault table (request_fault)
        mp = cfg.model_preset
        self.compat = compat_hash(cfg.vllm_version, mp.name, cfg.block_size, cfg.kv_cache_dtype, mp.layers,
                                  mp.kv_heads, mp.head_dim)
        self.client: KVClient | None = None
        self.side_server: SideChannelServer | None = None
        if self.kvt and self.engine_id is not None:
            self.client = kv_client or SideChannelClient(engine_id=self.engine_id, compat=self.compat, tp_size=cfg.tp)
        if self.kvt and self.engine_id is not None and side_channel:
            self.side_server = SideChannelServer(engine_id=self.engine_id, compat=self.compat, tp_size=cfg.tp,
                                                 read=self.serve_read, release=self.serve_release,
                                                 payload_scale=cfg.kv_payload_scale)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._pulls: set[asyncio.Task[None]] = set()
        self._handshakes: dict[str, float] = {}  # remote engine id → when its NIXL handshake ends (simulated)
        self._prev = SchedulerStats()
        self.busy_until: float | None = None  # end of the last step while continuously busy
        self._ready_at = 0.0  # simulated time of the latest event that made work available while idle
        self._metrics_on = metrics_enabled  # gauges and per-request series (Prometheus or a recording view)
        self._per_step = self.metrics.per_step  # per-token and per-step series too (Prometheus)
        # decode fast-forward: only on a virtual clock (it moves timers) and without per-step series (it skips
        # the per-token observations)
        self.ff = FastForward(self) if self.clock.advance is not None and not self._per_step else None
        self.steps = 0
        self.busy_s = 0.0  # simulated seconds spent in steps (utilisation)
        self._step_end = float("-inf")  # the end of the last step started (step_in_flight_end)
        self.transfers_ok = 0
        self.kv_sink: Callable[[list[Any]], None] | None = None
        self.kv_clock: Callable[[], float] = time.time
        self.transfers_failed = 0
        self.recomputed = 0

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._wake = asyncio.Event()
        if self.side_server:
            try:
                await self.side_server.start(self.cfg.side_channel_host, self.side_port)
            except OSError as e:
                raise StartupError(f"NIXL side channel cannot listen on {self.cfg.side_channel_host}:"
                                   f"{self.side_port} (VLLM_NIXL_SIDE_CHANNEL_HOST/PORT + DP rank): {e}") from e
        self._task = asyncio.create_task(self._loop(), name="sim-engine")

    async def stop(self) -> None:
        self.sync()
        for t in list(self._pulls):
            t.cancel()
        if self._task:
            self._task.cancel()
            # stopping must not re-raise whatever ended the loop
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.side_server:
            await self.side_server.close()

    def wake(self, at: float | None = None) -> None:
        if self.ff is not None:
            self.ff.interrupt(cut=True)
        self._ready_at = max(self._ready_at, self.clock.now() if at is None else at)
        if self._wake is not None:
            self._wake.set()

    # ------------------------------------------------------------------------------------ requests
    def submit(self, req: Request) -> ReqCtx:
        if self.ff is not None:
            self.ff.interrupt(cut=True)
        ctx = req.ctx if isinstance(req.ctx, ReqCtx) else ReqCtx()
        req.ctx = ctx
        rp = req.remote_prefill
        if rp is not None and (self.kvt is None or not block_ids(rp) or not all(
                rp.get(k) not in (None, "") for k in ("remote_engine_id", "remote_host", "remote_port"))):
            # no connector, nothing to pull, or incomplete params: plain local prefill (vLLM: "Got invalid
            # KVTransferParams ... will not utilize KVTransfer")
            if rp is not None and self.kvt is not None:
                log.warning("invalid_kv_transfer_params", request_id=req.request_id, params=rp)
            req.remote_prefill = None
        if self.kvt is None:
            req.remote_decode = False
        req.queued = max(req.arrival, self.step_in_flight_end())
        self.sched.add(req)
        self.metrics.req_max_tokens.observe(ctx.max_tokens_param or req.max_new_tokens)
        self.update_gauges()
        self.wake(req.arrival)
        return ctx

    def request_fault(self, needs_local_prefill: bool) -> tuple[str, bool] | None:
        """The fault table's per-request faults (faults.py), drawn from this engine's rng: (message, crash) for a
        request that gets HTTP 500 (``crash``: and the server exits), else None. The HTTP server answers with it;
        the twin's engine legs fail the leg the same way."""
        f = self.cfg.faults
        self.requests_seen += 1
        if f.crash_after_requests and self.requests_seen >= f.crash_after_requests:
            return "injected crash (--fault-crash-after-requests)", True
        if f.error_rate and self.rng.random() < f.error_rate:
            return "injected server error (--fault-error-rate)", False
        if needs_local_prefill and f.prefill_error_rate and self.rng.random() < f.prefill_error_rate:
            return "injected prefill error (--fault-prefill-error-rate)", False
        return None

    def abort(self, req: Request) -> None:
        if self.ff is not None:
            self.ff.interrupt(cut=True)
        if req.status == Status.FINISHED:
            return
        self.sched.abort(req)
        self._record_finish(req, self.clock.now())
        self.update_gauges()
        self.wake()

    def step_in_flight_end(self) -> float:
        """When the step in flight ends (the fast-forward's, after an interrupt cut it there), or an instant
        already past when none is: a request that arrives meanwhile reaches the scheduler then, as vLLM's engine
        core takes new requests between steps."""
        plan = self.ff.current if self.ff is not None else None
        if plan is not None:
            return plan.ends[plan.last - 1]
        return self._step_end

    @property
    def busy(self) -> bool:
        self.sync()
        return bool(self.sched.running or self.sched.waiting)

    # ------------------------------------------------------------------------------------ loop
    async def _loop(self) -> None:
        assert self._wake is not None
        while True:
            now = self.clock.now()
            for req in self.sched.expire_held(now):
                if self.metrics.nixl:
                    self.metrics.nixl_expired.inc()
                log.warning("kv_lease_expired", request_id=req.request_id, lease_s=self.kvt.lease_s if self.kvt
                            else None)
            batch = self.sched.schedule(now)
            floor = self.busy_until if self.busy_until is not None else self._ready_at
            for req in batch.pulls:
                t0 = max(floor, req.arrival, now - self.max_lag)
                t = asyncio.create_task(self._pull(req, t0))
                self._pulls.add(t)
                t.add_done_callback(self._pulls.discard)
            self._sync_stats()
            self.update_gauges()
            self._publish_kv()
            if not batch.items:
                self.busy_until = None
                self._ready_at = now
                self._wake.clear()
                timeout = None
                nxt = self.sched.next_expiry()
                if nxt is not None:
                    timeout = max(0.0, (nxt - now) * self.cfg.time_scale) + 0.001
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            # The step starts when its work became available in simulated time (end of the previous step, an
            # arrival, a finished KV pull), not when Python got round to it: up to max_lag of event-loop latency
            # is absorbed instead of being counted as simulated time.
            floor = self.busy_until if self.busy_until is not None else self._ready_at
            items = batch.items
            newest = 0.0
            for s in items:
                if s.request.arrival > newest:
                    newest = s.request.arrival
            start = max(floor, newest, now - self.max_lag)  # never before the previous step's end
            for s in items:
                r = s.request
                fs = r.first_scheduled
                if fs is not None:
                    if fs > start:
                        fs = r.first_scheduled = start
                    if fs < r.arrival:
                        r.first_scheduled = r.arrival
            # Scheduled carries SeqWork's three fields (new_tokens, context, samples): priced as they are, without
            # a SeqWork per sequence per step
            cost = self.perf.step(cast("list[SeqWork]", items))
            dt = cost.total_s
            if self.cfg.faults.prefill_stall_ms and any(s.context < s.request.prompt_len for s in batch.items):
                dt += self.cfg.faults.prefill_stall_ms / 1000.0
            end = start + dt
            if self.ff is not None and (plan := self.ff.plan(batch, end, dt, newest)) is not None:
                await self.ff.run(plan)  # several decode steps at once (fastforward.py)
                continue
            self._step_end = end
            if not self.clock.jump_to(end):
                await self.clock.sleep_until(end)
            self.busy_until = end
            self.steps += 1
            self.busy_s += dt
            if self._per_step:
                self.metrics.iteration_tokens.observe(batch.tokens)
            for req, done in self.sched.finish_step(batch, end):
                self._on_token(req, done, end)
            self._sync_stats()
            self.update_gauges()
            self._publish_kv()

    # ------------------------------------------------------------------------------------ KV cache events
    def enable_kv_events(self, sink: Callable[[list[Any]], None], clock: Callable[[], float] = time.time) -> None:
        """Publish vLLM's KV cache events (sim/kvevents.py): the block pool's changes of each step as one batch
        ``[ts, events, dp_rank]`` handed to ``sink`` (the ZMQ publisher, or the twin's in-process index), ``ts``
        from ``clock`` (vLLM: ``time.time()``; the twin: its virtual clock)."""
        self.kv_sink = sink
        self.kv_clock = clock
        self.pool.kv_events = []

    def _publish_kv(self) -> None:
        if self.kv_sink is None:
            return
        events = self.pool.take_events()
        if events:
            self.kv_sink(kvevents.encode_batch(self.kv_clock(), events, self.dp_rank))

    def sync(self) -> None:
        """Bring a fast-forwarded engine's state (tokens, KV blocks, step counts) up to the current time."""
        if self.ff is not None:
            self.ff.interrupt(cut=False)

    def _sync_stats(self) -> None:
        if not self._per_step:
            return
        s, p, m = self.sched.stats, self._prev, self.metrics
        if s.prefix_queries != p.prefix_queries:
            m.prefix_queries.inc(s.prefix_queries - p.prefix_queries)
        if s.prefix_hits != p.prefix_hits:
            m.prefix_hits.inc(s.prefix_hits - p.prefix_hits)
        if s.preemptions != p.preemptions:
            m.preemptions.inc(s.preemptions - p.preemptions)
        self._prev = SchedulerStats(**vars(s))

    def update_gauges(self) -> None:
        """After a change: Prometheus gauges follow every change; a recording view is written when it is read
        (``write_gauges``, the twin's scrape)."""
        if self._per_step:
            self.write_gauges()

    def write_gauges(self) -> None:
        if not self._metrics_on:
            return
        m = self.metrics
        deferred = self.sched.num_waiting_deferred
        m.running.set(len(self.sched.running))
        m.waiting.set(len(self.sched.waiting))
        m.waiting_deferred.set(deferred)
        m.waiting_capacity.set(len(self.sched.waiting) - deferred)
        m.kv_usage.set(self.pool.usage)

    def _on_token(self, req: Request, done: bool, now: float) -> None:
        ctx: ReqCtx = req.ctx
        if req.num_output == 1 and self._metrics_on:  # per request: a fast-forward never holds a first token
            self.metrics.ttft.observe(now - req.received_at)
        if self._per_step:
            m = self.metrics
            m.generation_tokens.inc()
            if req.num_output == 1:
                m.prompt_tokens.inc(req.prompt_len)
                external = req.num_external if not req.recomputed else 0
                m.prompt_local_cache_hit.inc(req.num_cached)
                m.prompt_external.inc(external)
                m.prompt_local_compute.inc(max(0, req.prompt_len - req.num_cached - external))
                m.prompt_cached.inc(req.num_cached + external)
            else:
                itl = now - ctx.last_ts
                m.itl.observe(itl)
                m.tpot.observe(itl)
        ctx.last_ts = now
        if done and req.remote_decode and req.finish_reason == "length" and self.kvt:
            ctx.kv_params_out = self._kv_params_for(req)
        if ctx.sink is not None:
            ctx.sink("token", req.num_output, now)
        else:
            ctx.queue.put_nowait(("token", req.num_output, now))
        if done:
            self._record_finish(req, now)

    def _record_finish(self, req: Request, now: float) -> None:
        ctx: ReqCtx = req.ctx
        m = self.metrics
        reason = req.finish_reason or "abort"
        m.success.get(reason, m.success["abort"]).inc()
        m.e2e.observe(now - req.received_at)
        m.req_prompt_tokens.observe(req.prompt_len)
        m.req_generation_tokens.observe(req.num_output)
        if req.first_scheduled is not None:
            m.queue_time.observe(max(0.0, req.first_scheduled - req.queued_at))
            if req.first_token is not None:
                m.prefill_time.observe(req.first_token - req.first_scheduled)
                m.inference_time.observe((req.last_token or now) - req.first_scheduled)
        if req.first_token is not None:
            decode = (req.last_token or now) - req.first_token
            m.decode_time.observe(decode)
            if req.num_output > 1:
                m.req_tpot.observe(decode / (req.num_output - 1))
        if self.cfg.log_requests:
            log.info("request_finished", request_id=req.request_id, prompt_tokens=req.prompt_len,
                     cached_tokens=req.num_cached, external_tokens=req.num_external, output_tokens=req.num_output,
                     finish_reason=reason, ttft_s=(req.first_token - req.received_at) if req.first_token else None,
                     e2e_s=now - req.received_at, preemptions=req.preemptions, recomputed=req.recomputed)
        if ctx.sink is not None:
            ctx.sink("finish", reason, now)
        else:
            ctx.queue.put_nowait(("finish", reason, now))

    # ------------------------------------------------------------------------------------ P/D
    # ------------------------------------------------------------------------------------ state
    def state(self) -> dict[str, Any]:
        self.sync()
        c = self.cfg
        return {
            "dp_rank": self.dp_rank,
            "model": c.model,
            "served_model_name": c.served_model_name,
            "model_preset": c.model_preset.name,
            "model_preset_inferred": c.model_preset_inferred,
            "gpu": c.gpu.name,
            "tensor_parallel_size": c.tp,
            "pipeline_parallel_size": c.pp,
            "time_scale": c.time_scale,
            "sim_time_s": self.clock.now(),
            "num_gpu_blocks": self.num_blocks,
            "block_size": c.block_size,
            "kv_cache_tokens": self.num_blocks * c.block_size,
            "free_blocks": self.pool.num_free,
            "kv_cache_usage": self.pool.usage,
            "running": len(self.sched.running),
            "waiting": len(self.sched.waiting),
            "waiting_deferred": self.sched.num_waiting_deferred,
            "held_requests": sorted(self.sched.held),
            "held_blocks": sum(len(r.blocks) for r, _ in self.sched.held.values()),
            "steps": self.steps,
            "max_num_seqs": c.max_num_seqs,
            "max_num_batched_tokens": c.max_num_batched_tokens,
            "chunked_prefill": c.chunked_prefill,
            "prefix_caching": c.prefix_caching,
            "computed_prompt_tokens": self.sched.stats.computed_prompt_tokens,
            "kv_transfer": None if not self.kvt else {
                "role": self.kvt.role, "engine_id": self.engine_id,
                "load_failure_policy": self.kvt.load_failure_policy, "lease_s": self.kvt.lease_s,
                "transport": c.transport.name, "side_channel": f"{c.side_channel_host}:{self.side_port}",
                "compat": self.compat, "transfers_ok": self.transfers_ok, "transfers_failed": self.transfers_failed,
                "recomputed": self.recomputed,
            },
            "faults": c.faults.as_dict(),
            "kv_bytes_per_token": self.perf.kv_bytes_per_token,
            "weight_bytes_per_gpu": self.perf.weight_bytes_per_gpu,
        }


def make_request(request_id: str, prompt_ids: list[int], max_new_tokens: int, arrival: float, *,
                 limit_reason: str = "length", kv_params: dict[str, Any] | None = None, seed: int = 0,
                 priority: int = 0, received: float | None = None, hashes: list[bytes] | None = None) -> Request:
    remote_decode = bool(kv_params and kv_params.get("do_remote_decode"))
    remote_prefill = dict(kv_params) if kv_params and kv_params.get("do_remote_prefill") else None
    return Request(request_id=request_id, prompt_ids=prompt_ids, max_new_tokens=max_new_tokens, arrival=arrival,
                   limit_reason=limit_reason, remote_decode=remote_decode, remote_prefill=remote_prefill, seed=seed,
                   priority=priority, received=received, hashes=hashes or [])


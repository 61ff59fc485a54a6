"""The one request core (DESIGN §10): decision → path → fallback, and the worker bookkeeping, for two transports.

``RequestCore`` holds everything the router knows about its workers between requests — the ``WorkerSet`` (in-flight
counts, the prefill backlog clock, scraped values), the ``PrefixIndex``, the per-tenant output averages, the circuit
breakers and the mode-probe limiter — and runs one request through it against a :class:`Legs` transport:

* ``disagg router`` (server.py): HTTP legs (legs.py ``HttpLegs``: the prefill request, the relay of the decode
  worker's answer to the client);
* the discrete-event twin (twin/cluster.py): engine legs that call the simulated engines in process (the KV
  hand-off through the in-process NIXL link).

The paths themselves — remote with its hedge and its fallbacks, local with its one retry, and the cause mapping of
a failed leg — are paths.py's, run from :meth:`RequestCore.serve`. So a benchmark in the twin measures what ships:
the same snapshot, the same decision and probe, the same admission under overload (``admit``: admission.py's queue
on the transport's clock), the same breaker tickets, the same fallback causes and the same one local retry. A
transport only moves bytes (or tokens) and says how a leg failed, with the cause names of docs/router.md ("Fallbacks"):

* ``prefill(ctx, worker, deadline)`` → the prefill response's ``kv_transfer_params`` (opaque), or raises
  ``UpstreamError`` with a ``prefill_*`` cause (``prefill_timeout`` when the deadline passed: the core tells a
  queued prefill, ``prefill_queue_timeout``, from a slow one);
* ``relay(ctx, worker, kv, deadline, remote, on_commit)`` → the served result; raises ``UpstreamError`` (causes
  ``timeout``, ``connect_error``, ``disconnected``, ``empty_response``, ``generation_error``, ``error``,
  ``rejected`` with the worker's status) for anything before the client is committed, and calls ``on_commit``
  exactly when it commits (the first token of a stream, the whole answer otherwise);
* ``error`` / ``passthrough`` / ``give_up``: the transport's shape of a refusal by the router, of a worker's own
  4xx passed to the client, and of a failure after the retry.

The cause rule: ``kv_*`` = a transport fault (feeds the breakers and the mode controller), ``prefill_*`` = the
prefill leg (capacity), ``decode_*`` = the decode worker itself; ``decode_rejected`` (the decode worker refused the
KV params) falls under the remote path's fallback policy like a ``kv_*`` cause.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from ..api.contract import RouterConfig
from ..api.spec import (
    DEFAULT_MAX_QUEUE_TIME_MS,
    DEFAULT_MAX_QUEUED,
    TENANT_PRIORITY,
    admission_active,
    priority_scheduling,
)
from ..perf.costs import EngineCost
from . import features, paths
from .admission import AdmissionQueue, QueueTimeoutError
from .breaker import Breakers, Ticket
from .kvindex import KVIndex
from .load import TenantStats, Worker, WorkerSet
from .metrics import RouterMetrics
from .overload import ADMISSION_MARGIN, newest_first_after, over_slo
from .paths import (  # the transport contract and the cause mapping live with the paths; imported from here too
    Legs,
    OnCommit,
)
from .placement import Prediction
from .policy import decide, demand_pool, find_tenant
from .policy_types import Decision, LoadSnapshot, RequestFeatures, Tuning, WorkerLoad
from .prefix import PrefixIndex
from .probe import ProbeLimiter, probe_decision
from .proxy import UpstreamError
from .request import Ctx
from .tokenscale import PromptTokenScale

# Every fallback cause of a failed remote path (docs/router.md "Fallbacks"), for the alerts and the docs; a test
# checks that the legs raise no other. The prefill leg's (capacity and the prefill worker: the autoscaler's and the
# overload policy's business), the KV hand-off's (transport faults: the breakers' and the mode controller's), and
# the decode worker refusing the KV params (under the remote path's fallback policy too).
PREFILL_CAUSES = ("prefill_connect_error", "prefill_error", "prefill_rejected", "prefill_timeout",
                  "prefill_queue_timeout", "prefill_bad_response", "prefill_no_kv_params")
KV_CAUSES = ("kv_transfer_timeout", "kv_load_failed", "kv_transfer_slow")
REMOTE_PATH_CAUSES = (*PREFILL_CAUSES, *KV_CAUSES, "decode_rejected")

R = TypeVar("R")



class RequestCore(Generic[R]):
    """The router's state between requests and the orchestration of one request (module docstring).

    ``clock``: monotonic seconds (the router's ``time.monotonic``; the twin's virtual loop time). The WorkerSet
    reads the same clock for its passive-health marks."""

    def __init__(self, workers: WorkerSet, metrics: RouterMetrics, tuning: Tuning | None = None,
                 clock: Callable[[], float] = time.monotonic, down_seconds: float = 3.0,
                 probe_rate_scale: float = 1.0) -> None:
        self.workers = workers
        self.metrics = metrics
        self.tuning = tuning or Tuning()
        self.clock = clock
        self.down_seconds = down_seconds
        self.prefix = PrefixIndex()  # the estimate: what the router sent where (the fallback)
        # … of the workers there are: a worker that leaves its pool takes its estimate with it (a later pod at the same
        # address starts with an empty cache, and an autoscaled fleet's gone pods would otherwise pile up; a pod
        # unready for a moment loses it too: some prefix affinity for a while, never a wrong match)
        workers.removed.append(self.prefix.forget)
        self.kv = KVIndex()  # the truth: the engines' own KV cache events (kvsub.py, or the twin's sink)
        self.tenants = TenantStats()
        # engine-counted ÷ estimated prompt tokens (tokenscale.py): measured, published, and applied to text estimates
        self.prompt_scale = PromptTokenScale()
        self.breakers = Breakers(metrics.circuit_state, clock)
        self.probes = ProbeLimiter(rate_scale=probe_rate_scale)
        self._probing = False
        self._costs_of: RouterConfig | None = None
        self._costs: dict[str, EngineCost] = {}
        self.admission_margin = ADMISSION_MARGIN
        self.serving = 0  # requests of this core between admission and their end (serve)
        self.admission = AdmissionQueue(clock, lambda t, n: metrics.admission_queue.labels(t).set(n))

    # ------------------------------------------------------------------------------------ bookkeeping
    @contextlib.contextmanager
    def track(self, url: str, pool: str, tokens: int = 0) -> Iterator[Worker | None]:
        """A leg in flight on ``url``: the worker's in-flight counts and the pool's gauge."""
        w = self.workers.get(url)
        g = self.metrics.inflight.labels(pool)
        g.inc()
        if w is not None:
            w.inflight += 1
            w.inflight_tokens += tokens
        try:
            yield w
        finally:
            g.dec()
            if w is not None:
                w.inflight -= 1
                w.inflight_tokens -= tokens

    def connect_failed(self, url: str) -> None:
        """Passive health: a worker refusing connections is skipped for ``down_seconds`` (or until it scrapes)."""
        w = self.workers.get(url)
        if w is not None:
            w.down_until = self.clock() + self.down_seconds

    def exact_match(self, ctx: Ctx) -> dict[str, int]:
        """The exact index's match of ``ctx``'s prompt on every worker holding a prefix of it ({} when the token
        ids are unknown); the prompt's keys are computed once per request and block size (``ctx.token_keys``)."""
        ids = ctx.token_ids
        if ids is None:
            return {}
        keys = ctx.token_keys

        def keys_of(bs: int) -> Sequence[int]:
            k = keys.get(bs)
            if k is None:
                k = keys[bs] = features.token_block_keys(ids, bs)
            return k

        return self.kv.match(ids, keys_of=keys_of)

    def count_prompt(self, ctx: Ctx, counted: int, text_estimate: bool) -> None:
        """``ctx.input_tokens``: ``counted`` when exact (token ids, a tokenizer); a text estimate (``text_estimate``)
        times the scale learned from the engines' own counts (tokenscale.py), which then also scales the text
        prefix matches (:meth:`estimated_prefix`), so that every cost and threshold sees engine tokens."""
        ctx.input_tokens = counted
        if text_estimate:
            ctx.input_text_estimate, ctx.input_scale = counted, self.prompt_scale.factor
            ctx.input_tokens = max(1, round(counted * ctx.input_scale)) if counted > 0 else 0

    def estimated_prefix(self, url: str, hashes: tuple[int, ...], ctx: Ctx | None) -> int:
        """The prefix estimate's match (prefix.py: blocks the router sent ``url``) in the prompt's units: a text
        prompt's blocks are cut by its bytes, so they take the same learned scale as its estimate."""
        return _scaled(self.prefix.match_tokens(url, hashes) if hashes else 0,
                       ctx.input_scale if ctx is not None else 1.0)

    def cached_tokens(self, url: str, hashes: tuple[int, ...], ctx: Ctx) -> tuple[int, str]:
        """Prompt tokens ``url`` holds and where that comes from: ``events`` (the exact index, when the worker
        publishes KV events and the prompt's token ids are known), else ``estimate`` (prefix.py)."""
        if ctx.token_ids is not None and self.kv.publishing(url):
            return self.exact_match(ctx).get(url, 0), "events"
        return self.estimated_prefix(url, hashes, ctx), "estimate"

    def uncached_tokens(self, url: str, hashes: tuple[int, ...], ctx: Ctx) -> int:
        """The prompt tokens ``url`` computes for ``ctx`` (at least one: vLLM computes the last token)."""
        return max(1, ctx.input_tokens - self.cached_tokens(url, hashes, ctx)[0])

    def snapshot(self, cfg: RouterConfig, hashes: tuple[int, ...], tenant: str,
                 ctx: Ctx | None = None) -> LoadSnapshot:
        """The policy's view of the pools now: every ready worker's load (prefix matches: exact from the KV
        events where the worker publishes them, else the estimate from what the router sent it), the tenant's average
        output, and what the circuit breakers block."""
        now = self.clock()
        prefix = self.prefix
        scale = ctx.input_scale if ctx is not None else 1.0  # a text prompt's prefix blocks: :meth:`estimated_prefix`
        kv = self.kv
        token_ids = ctx.token_ids if ctx is not None else None
        exact = self.exact_match(ctx) if ctx is not None and token_ids is not None else {}
        if cfg is not self._costs_of:  # each pool's engine priced once per config (perf/costs.py)
            self._costs_of = cfg
            self.workers.lend(cfg.role_moves.lends() if cfg.role_moves else {})  # status.roleMoves
            self._costs = {r: EngineCost.from_profile(cfg.pools.engine(r), cfg.model) for r in WorkerSet.ROLES}
        costs = self._costs

        def loads(role: str) -> tuple[WorkerLoad, ...]:
            out = []
            for w in self.workers.ready(role):
                w.cost = costs[w.role]  # its own pool's engine, also while lent to the other role (a role move)
                if token_ids is not None and kv.publishing(w.url):
                    cached = exact.get(w.url, 0)
                else:
                    cached = _scaled(prefix.match_tokens(w.url, hashes), scale) if hashes else 0
                out.append(w.load(cached, now))
            return tuple(out)

        self.breakers.configure(cfg.routing.circuit_breaker)
        blocked_decode, blocked_pairs = self.breakers.blocked()
        return LoadSnapshot(prefill=loads("prefill"), decode=loads("decode"), aggregated=loads("aggregated"),
                            tenant_avg_output_tokens=self.tenants.get(tenant), blocked_decode=blocked_decode,
                            blocked_pairs=blocked_pairs)

    def route(self, cfg: RouterConfig, feats: RequestFeatures, snap: LoadSnapshot) -> tuple[Decision, Ticket | None]:
        """The decision for a request (with a mode probe when due) and, for a remote one, its breaker ticket."""
        d = decide(cfg, feats, snap, self.tuning)
        probing = cfg.probing()
        if probing != self._probing:  # each Aggregated hold starts with a fresh bucket and credit
            self._probing = probing
            self.probes.reset()
        if probing and d.reason == "mode_aggregated":
            d = probe_decision(cfg, feats, snap, self.tuning, self.probes, self.clock()) or d
        if d.decision != "remote":
            return d, None
        assert d.prefill and d.decode
        ticket = self.breakers.acquire(d.prefill, d.decode)
        if ticket is None:  # cannot happen within one event-loop turn after blocked(); kept as a safe default
            d = dataclasses.replace(d, decision="local", reason="circuit_open", decode=d.local_decode, prefill=None)
        return d, ticket

    def decide(self, ctx: Ctx, cfg: RouterConfig, tenant: str | None, max_tokens: int | None,
               hashes: tuple[int, ...]) -> tuple[Decision, Ticket | None]:
        """Features → snapshot → decision for ``ctx`` (its input tokens counted), recorded on ``ctx`` (decision,
        reason, tenant, probe, the log's prefix family) and in ``disagg_routing_decisions_total``."""
        d, ticket, _ = self._decide(ctx, cfg, tenant, max_tokens, hashes)
        return self._count(d, ctx), ticket

    def _count(self, d: Decision, ctx: Ctx, demand: Decision | None = None) -> Decision:
        """Count decision ``d`` and its prompt as demand on a pool (:func:`demand_pool` of ``demand``, the placement
        a shed request was refused on, else ``d``)."""
        self.metrics.decisions.labels(d.decision, d.reason).inc()
        if d.detail.get("deflected"):
            self.metrics.deflections.inc()
        pool = demand_pool(demand or d)
        if pool is not None and ctx.input_tokens > 0:
            self.metrics.routed_prompt_tokens.labels(pool).observe(ctx.input_tokens)
        return d

    def _decide(self, ctx: Ctx, cfg: RouterConfig, tenant: str | None, max_tokens: int | None,
                hashes: tuple[int, ...]) -> tuple[Decision, Ticket | None, LoadSnapshot]:
        feats = RequestFeatures(request_id=ctx.request_id, endpoint=ctx.endpoint, input_tokens=ctx.input_tokens,
                                max_tokens=max_tokens, tenant=tenant,
                                canary_fraction=features.request_hash_fraction(ctx.request_id))
        ctx.max_tokens = max_tokens
        snap = self.snapshot(cfg, hashes, tenant or "default", ctx)
        best = max((w.prefix_tokens for w in snap.decode + snap.aggregated), default=0)
        if best and hashes:  # the log's prefix family for replay: the longest run of full blocks some worker holds
            ctx.prefix_tokens = best
            blocks = max(1, round(best / ctx.input_scale / features.PREFIX_BLOCK_TOKENS))  # in the hashes' units
            ctx.prefix_hash = f"{hashes[min(len(hashes), blocks) - 1]:016x}"
        d, ticket = self.route(cfg, feats, snap)
        self._expect_cached(ctx, d, snap)
        ctx.tenant, ctx.decision, ctx.reason = d.tenant, d.decision, d.reason
        if priority_scheduling(cfg.routing):  # the tenant's priority on every leg (the workers run the policy)
            t = find_tenant(cfg, tenant)
            ctx.priority = TENANT_PRIORITY[t.priority] if t is not None else 0
        if "prediction" in d.detail:  # the SLO placement: what it chose, over what, and what it expects
            ctx.prediction = d.detail["prediction"]
            ctx.runner_up = d.detail["rejected"]
            ctx.placement = ctx.prediction.as_detail()
        ctx.probe = d.reason == "mode_probe"
        if d.est_prefill_wait_ms is not None:
            ctx.timings["est_prefill_wait"] = d.est_prefill_wait_ms / 1000.0
        return d, ticket, snap

    def _expect_cached(self, ctx: Ctx, d: Decision, snap: LoadSnapshot) -> None:
        """The prompt tokens expected cached where the request prefills (the prefill worker on the remote path,
        else the worker serving it), for the log line and ``disagg_prefix_expected_cached_tokens``."""
        where = d.prefill if d.decision == "remote" else d.decode
        if where is None:
            return
        w = next((x for x in (*snap.prefill, *snap.decode, *snap.aggregated) if x.url == where), None)
        if w is None:
            return
        source = "events" if ctx.token_ids is not None and self.kv.publishing(where) else "estimate"
        ctx.expected_cached_tokens = min(w.prefix_tokens, max(0, ctx.input_tokens - 1))
        ctx.cache_source = source
        if ctx.expected_cached_tokens:
            self.metrics.prefix_cached_tokens.labels(source).inc(ctx.expected_cached_tokens)

    # ------------------------------------------------------------------------------------ admission
    async def admit(self, ctx: Ctx, cfg: RouterConfig, tenant: str | None, max_tokens: int | None,
                    hashes: tuple[int, ...]) -> tuple[Decision, Ticket | None]:
        """:meth:`decide`, then admission under overload (issue 29; docs/router.md "Admission and overload"): when
        a tenant's ``overload`` is not Admit, the router predicts each request's TTFT on the placement chosen (the
        SLO placement's prediction, or the same model priced for the Thresholds ladder's choice). A request whose
        prediction misses ``spec.slo.ttftP95Ms`` by :data:`ADMISSION_MARGIN` is, by its tenant's policy, served
        anyway (Admit), refused with 429 (Shed: a ``reject`` decision, reason ``overload_shed``), or held in the
        admission queue (Queue: admission.py) until a completion releases it and a fresh decision finds it within
        the SLO, or its ``maxQueueTimeMs`` passes (reason ``admission_queue_timeout``); a full queue refuses at
        once (``admission_queue_full``). A request predicted within the SLO is never held, and nothing is held or
        refused while this core has no request in flight. The wait counts in the request's TTFT (its ``t0`` is its
        arrival)."""
        d, ticket, snap = self._decide(ctx, cfg, tenant, max_tokens, hashes)
        if d.decision == "reject" or not admission_active(cfg.routing):
            ctx.admitted_at = self.clock()
            return self._count(d, ctx), ticket
        t = find_tenant(cfg, tenant)
        policy = t.overload if t is not None else "Admit"
        prio = t.priority if t is not None else "Interactive"
        over, excess = over_slo(cfg, d, snap, ctx.input_tokens, max_tokens, self.tuning.default_output_tokens,
                                self.admission_margin)
        if not over:
            return self._admitted(ctx, d, ticket, prio, "within_slo")
        if policy == "Admit":
            return self._admitted(ctx, d, ticket, prio, "over_slo")
        if self.serving == 0:
            return self._admitted(ctx, d, ticket, prio, "nothing_in_flight")
        if ticket is not None:
            ticket.release()
        if policy == "Shed":
            return self._shed(ctx, d, prio, "over_slo", "overload_shed", excess), None
        assert t is not None
        max_wait = (t.max_queue_time_ms or DEFAULT_MAX_QUEUE_TIME_MS) / 1000.0
        w = self.admission.enter(d.tenant, TENANT_PRIORITY[prio], max_wait, t.max_queued or DEFAULT_MAX_QUEUED)
        if w is None:
            return self._shed(ctx, d, prio, "queue_full", "admission_queue_full", max_wait), None
        outcome = "cancelled"
        try:
            while True:
                try:
                    await self.admission.wait(w)
                except QueueTimeoutError:
                    outcome = "shed"
                    return self._shed(ctx, d, prio, "queue_timeout", "admission_queue_timeout", 1.0), None
                d, ticket, snap = self._decide(ctx, cfg, tenant, max_tokens, hashes)
                if d.decision == "reject":
                    outcome = "rejected"
                    return self._count(d, ctx), ticket
                over, _ = over_slo(cfg, d, snap, ctx.input_tokens, max_tokens, self.tuning.default_output_tokens,
                                   self.admission_margin)
                if not over or self.serving == 0:
                    outcome = "admitted"
                    return self._admitted(ctx, d, ticket, prio, "nothing_in_flight" if over else "released")
                if ticket is not None:
                    ticket.release()
                self.admission.again(w)
        finally:
            wait = self.clock() - w.enqueued_at
            ctx.timings["admission_wait"] = wait
            self.metrics.admission_wait.labels(d.tenant).observe(wait)
            if outcome == "cancelled":
                ctx.admission, ctx.admission_reason = "cancelled", "client_gone"
                self.metrics.admission.labels(d.tenant, prio, "cancelled", "client_gone").inc()

    def _admitted(self, ctx: Ctx, d: Decision, ticket: Ticket | None, prio: str,
                  reason: str) -> tuple[Decision, Ticket | None]:
        ctx.admission, ctx.admission_reason, ctx.admitted_at = "admitted", reason, self.clock()
        self.metrics.admission.labels(d.tenant, prio, "admitted", reason).inc()
        return self._count(d, ctx), ticket

    def _shed(self, ctx: Ctx, d: Decision, prio: str, reason: str, decision_reason: str,
              retry_after_s: float) -> Decision:
        """A 429 for admission: a ``reject`` decision with the seconds after which a retry may find room."""
        ctx.admission, ctx.admission_reason = "shed", reason
        ctx.decision, ctx.reason = "reject", decision_reason
        ctx.placement = ctx.runner_up = ctx.prediction = None
        self.metrics.admission.labels(d.tenant, prio, "shed", reason).inc()
        return self._count(Decision("reject", decision_reason, tenant=d.tenant, bucket=d.bucket, status=429,
                                    detail={"retry_after": max(1, math.ceil(retry_after_s))}), ctx, demand=d)

    def fallback_worker(self, exclude: set[str], prefer: str | None = None) -> str | None:
        """A worker for local/aggregated serving: the aggregated pool first, else the least loaded decode worker."""
        for role in ("aggregated", "decode"):
            cands = [w for w in self.workers.ready(role) if w.url not in exclude]
            if cands:
                if prefer and any(w.url == prefer for w in cands):
                    return prefer
                return min(cands, key=lambda w: (w.inflight, w.url)).url
        return None

    # ------------------------------------------------------------------------------------ the legs
    async def prefill(self, ctx: Ctx, legs: Legs[R], url: str, deadline: float, hashes: tuple[int, ...] = ()) -> Any:
        """The prefill leg with its bookkeeping: in flight with the prompt tokens it computes there (less the
        prefix the worker holds: ``hashes``, the prompt's block hashes), the worker's backlog clock, the observed
        seconds per token, the prefix it then holds; a timeout while queued behind other prefills is
        ``prefill_queue_timeout``."""
        w = self.workers.get(url)
        ahead = w.inflight_tokens if w else 0
        waiting = w.scraped.get("vllm:num_requests_waiting", 0.0) if w else 0.0
        t = self.clock()
        own = self.uncached_tokens(url, hashes, ctx)
        with self.track(url, "prefill", own):
            if w is not None:
                w.prefill_started(own, t)
                w.remote_prefill_at = t
            try:
                kv = await legs.prefill(ctx, url, deadline)
            except UpstreamError as e:
                if e.cause == "prefill_timeout" and (ahead > 0 or waiting > 0):
                    e.cause = "prefill_queue_timeout"  # capacity (ours or other clients'), not a transport fault
                elif e.cause == "prefill_connect_error":
                    self.connect_failed(url)
                raise
            finally:
                if w is not None:
                    w.prefill_ended(others_in_flight=w.inflight - 1, now=self.clock())
        if w is not None:
            self.prefix.insert(url, hashes)  # the prefill engine caches the prompt it computed (vLLM prefix caching)
            w.observe_prefill_leg(self.clock() - t, ahead + own)
            pred = ctx.prediction
            if isinstance(pred, Prediction) and pred.prefill_worker == url and pred.prefill_s > 0:
                self._observe(w, "prefill", "prefill", (self.clock() - t) / pred.prefill_s)
        return kv

    def _observe(self, w: Worker, phase: str, correct: str, ratio: float) -> None:
        """One observed ÷ predicted ratio: the metric, and the worker's correction for that phase."""
        self.metrics.prediction_ratio.labels(phase, w.role).observe(ratio)
        w.correct(correct, ratio)

    async def relay(self, ctx: Ctx, legs: Legs[R], url: str, kv: Any | None, hashes: tuple[int, ...],
                    deadline: float | None = None, on_commit: OnCommit | None = None) -> R:
        """A decode (or aggregated) leg with its bookkeeping: in flight until the answer ends; at the commit the
        prefix index learns the prompt (after a remote prefill the decode worker holds the blocks too)."""
        w = self.workers.get(url)
        role = w.role if w is not None else "decode"  # a whole request on a prefill worker counts in its pool
        prefix = self.prefix
        started = self.clock()
        pred = ctx.prediction if isinstance(ctx.prediction, Prediction) and ctx.prediction.worker == url else None
        # a local prefill: its uncached prompt tokens are ahead of the next prefill there until its first token
        pending = self.uncached_tokens(url, hashes, ctx) if kv is None and w is not None else 0
        if pending and w is not None:
            w.inflight_tokens += pending
            w.prefill_started(pending, started)
            if (pred is not None and pred.placement == "prefill_worker" and w.cost is not None
                    and pending > w.cost.budget):
                # the SLO placement's whole long prompt keeps the worker's steps long, as a remote prefill would:
                # it is not idle to the ladder's elastic rule (policy.py), which would lend it streams that its
                # chunks stall (docs/router.md "One elastic fleet")
                w.remote_prefill_at = started

        def commit() -> None:
            nonlocal pending
            if on_commit is not None:
                on_commit()
            prefix.insert(url, hashes)
            if w is None:
                return
            if pending:
                w.inflight_tokens -= pending
                pending = 0
            if kv is not None:  # the KV hand-off's time, what a hedge waits against
                w.observe_remote_ttfb(self.clock() - started, ctx.input_tokens)
            if pred is not None and ctx.fallback is None and pred.ttft_s > 0:
                # from the decision the prediction was made for (after any wait in the admission queue)
                ratio = (self.clock() - (ctx.t0 if ctx.admitted_at is None else ctx.admitted_at)) / pred.ttft_s
                self.metrics.prediction_ratio.labels("ttft", w.role).observe(ratio)
                if kv is None:  # the whole request here: the TTFT is this worker's prefill
                    w.correct("prefill", ratio)

        with self.track(url, role):
            try:
                out = await legs.relay(ctx, url, kv, deadline, kv is not None, commit)
            except UpstreamError as e:
                if e.cause == "connect_error":
                    self.connect_failed(url)
                raise
            finally:
                if pending and w is not None:
                    w.inflight_tokens -= pending
        tpot = ctx.timings.get("tpot")
        if w is not None and tpot:  # the TPOT of this worker's streams (placement.py _harm)
            w.observe_stream(tpot)
        if pred is not None and w is not None and tpot and pred.tpot_s > 0 and ctx.fallback is None:
            # the metric only: the decode correction comes from the worker's own metrics at each scrape
            # (load.py Worker._correct_decode), since a stream's TPOT depends on arrivals after its placement
            self.metrics.prediction_ratio.labels("tpot", w.role).observe(tpot / pred.tpot_s)
        return out

    # ------------------------------------------------------------------------------------ the paths
    async def serve(self, ctx: Ctx, cfg: RouterConfig, d: Decision, hashes: tuple[int, ...], ticket: Ticket | None,
                    legs: Legs[R]) -> R:
        """Serve a decision (paths.py: remote with its hedge and fallbacks, local with its one retry); a remote one
        comes with the breaker ticket it was admitted with. Its end releases the next request of the admission
        queue to be checked again (admit)."""
        self.serving += 1
        try:
            return await paths.serve(self, ctx, cfg, d, hashes, ticket, legs)
        finally:
            self.serving -= 1
            if ctx.input_text_estimate and ctx.engine_prompt_tokens:
                self.prompt_scale.observe(ctx.input_text_estimate, ctx.engine_prompt_tokens)
                self.metrics.prompt_token_scale.set(self.prompt_scale.factor)
            self.admission.release(newest_first_after(cfg))

def _scaled(tokens: int, scale: float) -> int:
    """A text prefix match (blocks cut by bytes) in engine tokens: × the prompt's learned scale."""
    return tokens if scale == 1.0 or tokens == 0 else round(tokens * scale)

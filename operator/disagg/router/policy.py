"""The per-request decision: remote prefill, local prefill, or reject. PURE: request features + load snapshot +
config → Decision (with a reason). No I/O, no clocks, no randomness (the canary slice is a hash of the request id).

Rule order (first match wins; docs/router.md has the table):

 1. mode Aggregated (RouterConfig.effective_mode())                    → local  mode_aggregated
    (on the aggregated pool when it has workers, else a decode worker)
 2. no decode worker at all                                              → reject no_decode_worker (503)
 3. tenant disaggregation Never                                          → local  tenant_never
 4. canary: tenant / endpoint / input length / traffic percent           → local  canary_excluded
 5. bucket prefill Local                                                 → local  bucket_local
 6. tenant Always / bucket Remote                                        → remote candidate (skip 7–10)
 7. input ≤ localPrefill.maxInputTokens                                  → local  short_prompt
 8. prefix hit: chosen decode worker holds the prefix and the uncached
    suffix ≤ localPrefill.maxInputTokens (preferWhenPrefixCacheHit)      → local  prefix_cache_hit
 9. input < remotePrefill.minInputTokens                                 → local  below_remote_threshold
10. expected output < minExpectedOutputTokens                            → local  short_output
11. the prefill pool is starting (RouterConfig.prefill_starting)         → local  prefill_pool_starting
12. no ready prefill worker / none with a decode worker's compat hash    → local  no_prefill_worker|no_compatible_pair
    every compatible decode worker / pair has an open circuit breaker    → local  circuit_open
    (decode workers and pairs whose breaker is open are skipped while another one is healthy)
    requireDecodePoolPressure, chosen decode worker not under pressure   → local  no_decode_pressure
13. est. prefill queue wait > maxPrefillQueueWaitMs: onPrefillQueueOverload
        LocalPrefill → local  prefill_queue_overload
        Queue        → remote prefill_queue_overload_queued
        Reject       → reject prefill_queue_overload (429)
14. otherwise                                                            → remote policy|tenant_always|bucket_remote
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from ..api.contract import RouterConfig
from ..api.models import ActiveMode, PromptBucket, TenantPolicy
from . import placement as pl

if TYPE_CHECKING:
    from ..perf.costs import EngineCost

DecisionKind = Literal["remote", "local", "reject"]
DEFAULT_TENANT = "default"


@dataclass(frozen=True)
class RequestFeatures:
    request_id: str
    endpoint: str  # /v1/completions | /v1/chat/completions
    input_tokens: int
    max_tokens: int | None = None  # what the client asked for, if anything
    tenant: str | None = None  # TenantPolicy.name, None when no tenant matched
    canary_fraction: float = 0.0  # features.request_hash_fraction(request_id)


class WorkerLoad(NamedTuple):
    """One worker's load for the policy, built for every ready worker on every request (a NamedTuple: about half
    the cost of a frozen dataclass at 64 workers)."""

    url: str
    compat: str = ""
    inflight: int = 0  # router's own in-flight requests on this worker
    est_wait_ms: float = 0.0  # prefill workers: estimated queue wait for a new prefill
    running: float = 0.0  # vllm:num_requests_running (scraped), or the router's count if higher
    waiting: float = 0.0  # vllm:num_requests_waiting (scraped)
    kv_usage: float = 0.0  # vllm:kv_cache_usage_perc (0..1)
    prefix_tokens: int = 0  # tokens of this prompt's prefix the router thinks it holds
    # for the SLO placement (placement.py)
    role: str = "decode"
    queued: float = 0.0  # requests waiting for room (not for their KV) at the last scrape
    ahead_tokens: int = 0  # prompt tokens of the router's prefills in flight there, not yet at their first token
    prefill_rate: float = 0.0  # prefill tokens/s sent there lately
    cost: EngineCost | None = None  # its engine priced (perf/costs.py); None: the default prior
    f_prefill: float = 1.0  # observed ÷ predicted TTFT of its recent prefills
    f_decode: float = 1.0  # observed ÷ predicted TPOT of its recent streams
    avg_prompt_tokens: float = 0.0  # other clients' queued prompts are priced at this size
    # prefill workers: seconds since the router last sent them a prefill leg (or the SLO placement a whole prompt
    # longer than their chunk: load.py ``Worker.remote_prefill_at``)
    remote_idle_s: float = math.inf
    stream_tpot_s: float = 0.0  # its recent streams' TPOT, geometric mean (observed; 0: not yet known)
    stream_spread: float = 0.0  # … the standard deviation of their log TPOT
    # the prefills sent there lately: the mean residual size of the one in progress at a random moment, tokens
    # (E[n²] ÷ 2E[n]: Pollaczek–Khinchine's residual; placement.py ``_backlog_then``)
    prefill_residual_tokens: float = 0.0
    prefill_size_tokens: float = 0.0  # … and their mean size, tokens


@dataclass(frozen=True)
class LoadSnapshot:
    prefill: tuple[WorkerLoad, ...] = ()
    decode: tuple[WorkerLoad, ...] = ()
    aggregated: tuple[WorkerLoad, ...] = ()  # optional aggregated pool: serves mode Aggregated when present
    tenant_avg_output_tokens: float | None = None  # observed average output of this request's tenant
    # Circuit breakers (breaker.py) that would not let a remote request through now: decode URLs and
    # (prefill URL, decode URL) pairs. Local prefill on such a decode worker is still fine.
    blocked_decode: frozenset[str] = frozenset()
    blocked_pairs: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Tuning:
    """Router knobs outside the API (CLI flags), with defaults."""

    decode_pressure_kv_usage: float = 0.5  # decode worker under pressure at this KV-cache usage …
    # one elastic fleet (Thresholds): a request the ladder keeps local may run whole on a prefill worker that has
    # had no remote prefill (nor a long whole prompt the SLO placement put there) for this long (its steps are free
    # of long chunks) and is less loaded than the decode worker. 0: off.
    elastic_idle_s: float = 5.0
    decode_pressure_running: int = 8  # … or this many running + waiting sequences
    prefix_affinity_slack: int = 4  # prefer the prefix-holding decode worker unless it has this many more in flight
    # A slow KV hand-off is a routing event (core.py "hedge"): a remote stream whose first token has not come this
    # many times the decode worker's recent remote first-token time after its decode leg started (and at least
    # hedge_min_s) gets a local prefill on another worker beside it; the first to answer serves. 0: off.
    hedge_factor: float = 8.0
    hedge_min_s: float = 0.25
    # SLO placement (placement.py): the output a stream is assumed to have when nothing says more, and by how many
    # expected misses a placement must beat the ladder's choice by to overrule it: one in a hundred, a noise floor.
    # Any clear saving overrules (the placement predicted to keep the most requests within the SLO wins); a
    # difference within the model's own error at light load keeps the ladder's choice (docs/router.md "How much an
    # overrule must save": the goodput benchmark at margins of 0.5/0.2, 0.01 and 0)
    default_output_tokens: int = 256
    slo_override: float = 0.01
    # … and by how many when the ladder's rule is in its grey zone (GREY_REASONS: a prompt between the local and
    # the remote thresholds, a long prompt with a short answer), where a static rule knows least
    slo_override_grey: float = 0.01
    # … but the ladder's choice stands, whatever another placement saves, while its own expected misses stay below
    # this: a choice predicted to keep this request and those it would slow within the SLO needs no overrule. At
    # light load every placement meets, and the differences left (a long prompt's KV transfer against its prefill
    # on an idle decode worker) are in the logistic's tail, not in the SLO: there the ladder's intent — long
    # prompts on the prefill pool, decode steps free of their chunks — holds (docs/router.md "How much an overrule
    # must save"). 0: the margin alone decides
    slo_keep: float = 0.1


@dataclass(frozen=True)
class Decision:
    decision: DecisionKind
    reason: str
    decode: str | None = None  # decode worker URL (both paths)
    prefill: str | None = None  # prefill worker URL (remote only)
    tenant: str = DEFAULT_TENANT
    bucket: str | None = None
    est_prefill_wait_ms: float | None = None
    prefix_tokens: int = 0
    status: int = 200  # HTTP status for reject
    # Decode worker choice for a local path if the remote decision must fall back (compat group may differ).
    local_decode: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EffectivePolicy:
    min_input_tokens: int
    max_prefill_queue_wait_ms: int
    min_expected_output_tokens: int
    require_decode_pool_pressure: bool
    local_max_input_tokens: int
    prefer_when_prefix_cache_hit: bool


# rule 11–13's local and reject reasons: the rules meant the prompt for the prefill pool, and no remote pair could
# take it (starting, none ready, breakers open, its queue past the limit)
NO_REMOTE_PAIR = frozenset({"prefill_pool_starting", "no_prefill_worker", "no_compatible_pair", "circuit_open",
                            "prefill_queue_overload"})


def demand_pool(d: Decision) -> Literal["prefill", "decode"] | None:
    """The pool whose prefill capacity decision ``d`` demands (``disagg_routed_prompt_tokens``, the autoscaler's
    load per role): ``prefill`` for a remote prefill and for prefill work the rules meant for the prefill pool that
    it did not take (no remote pair could: :data:`NO_REMOTE_PAIR`, or deflected by the SLO placement to a decode or
    idle prefill worker); ``decode`` for a prompt prefilled where it decodes by the rules' choice (an elastic
    fleet's idle prefill worker lends its capacity to decode demand); None for other refusals."""
    if d.decision == "remote" or d.detail.get("deflected") or d.reason in NO_REMOTE_PAIR:
        return "prefill"
    return "decode" if d.decision == "local" else None


def effective_policy(cfg: RouterConfig, tenant: TenantPolicy | None) -> EffectivePolicy:
    r, lp = cfg.routing.remote_prefill, cfg.routing.local_prefill
    ro = tenant.remote_prefill if tenant and tenant.remote_prefill else None
    lo = tenant.local_prefill if tenant and tenant.local_prefill else None

    def pick(override: object | None, name: str, base: object) -> Any:
        v = getattr(override, name) if override is not None else None
        return getattr(base, name) if v is None else v

    return EffectivePolicy(
        min_input_tokens=pick(ro, "min_input_tokens", r),
        max_prefill_queue_wait_ms=pick(ro, "max_prefill_queue_wait_ms", r),
        min_expected_output_tokens=pick(ro, "min_expected_output_tokens", r),
        require_decode_pool_pressure=pick(ro, "require_decode_pool_pressure", r),
        local_max_input_tokens=pick(lo, "max_input_tokens", lp),
        prefer_when_prefix_cache_hit=pick(lo, "prefer_when_prefix_cache_hit", lp),
    )


def find_bucket(cfg: RouterConfig, input_tokens: int) -> PromptBucket | None:
    for b in cfg.routing.buckets:
        if input_tokens >= b.min_input_tokens and (b.max_input_tokens is None or input_tokens < b.max_input_tokens):
            return b
    return None


def find_tenant(cfg: RouterConfig, name: str | None) -> TenantPolicy | None:
    if name is None:
        return None
    return next((t for t in cfg.routing.tenants if t.name == name), None)


def in_canary(cfg: RouterConfig, f: RequestFeatures) -> bool:
    c = cfg.rollout.canary
    if c.tenants and (f.tenant or DEFAULT_TENANT) not in c.tenants:
        return False
    if c.endpoints and f.endpoint not in c.endpoints:
        return False
    if f.input_tokens < c.input_tokens_gte:
        return False
    return f.canary_fraction * 100.0 < c.traffic_percent


def _decode_load(w: WorkerLoad) -> float:
    return max(float(w.inflight), w.running + w.waiting)


def choose_decode(workers: tuple[WorkerLoad, ...], tuning: Tuning = Tuning()) -> WorkerLoad | None:
    """Least loaded decode worker; the one holding the longest prefix wins unless it is `slack` busier."""
    if not workers:
        return None
    # one pass (the hot path: every request, up to 64 workers): the least loaded by (load, KV usage, url), and the
    # longest prefix by (prefix tokens, least load, url)
    least = best_prefix = workers[0]
    least_key = (_decode_load(least), least.kv_usage, least.url)
    prefix_key = (least.prefix_tokens, -least_key[0], least.url)
    for w in workers[1:]:
        load = _decode_load(w)
        if (load, w.kv_usage, w.url) < least_key:
            least, least_key = w, (load, w.kv_usage, w.url)
        if (w.prefix_tokens, -load, w.url) > prefix_key:
            best_prefix, prefix_key = w, (w.prefix_tokens, -load, w.url)
    if best_prefix.prefix_tokens > 0 and -prefix_key[1] <= least_key[0] + tuning.prefix_affinity_slack:
        return best_prefix
    return least


def choose_prefill(workers: tuple[WorkerLoad, ...], compat: str | None) -> WorkerLoad | None:
    """Least estimated queue wait among prefill workers with the given compat hash (None: any), less the compute
    of the prompt's prefix a worker holds (its own KV events: router/kvindex.py; 0 without them)."""
    best, best_wait = None, 0.0
    for w in workers:  # one pass (the hot path: every request that may go remote), by (wait, inflight, url)
        if compat is not None and w.compat != compat:
            continue
        wait = w.est_wait_ms - _saved_ms(w) if w.prefix_tokens > 0 else w.est_wait_ms
        if (best is None or wait < best_wait
                or (wait == best_wait and (w.inflight, w.url) < (best.inflight, best.url))):
            best, best_wait = w, wait
    return best


def _saved_ms(w: WorkerLoad) -> float:
    """The prefill compute a worker's cached prefix saves (its tokens' prefill alone on that engine)."""
    if w.prefix_tokens <= 0 or w.cost is None:
        return 0.0
    return w.cost.prefill(w.prefix_tokens).seconds * 1000.0 * w.f_prefill


def choose_pair(decodes: tuple[WorkerLoad, ...], snap: LoadSnapshot, tuning: Tuning = Tuning(),
                first: WorkerLoad | None = None) -> tuple[WorkerLoad, WorkerLoad] | None:
    """The preferred decode worker and its prefill worker, skipping decode workers and pairs whose circuit
    breaker is open; None when every candidate is blocked. ``first``: ``choose_decode(decodes)`` when the caller
    has it already (no breaker open on a decode worker)."""
    cands = decodes
    if snap.blocked_decode:
        cands, first = tuple(w for w in cands if w.url not in snap.blocked_decode), None
    while cands:
        d = first or choose_decode(cands, tuning)
        first = None
        assert d is not None
        prefills = snap.prefill
        if snap.blocked_pairs:
            prefills = tuple(w for w in prefills if (w.url, d.url) not in snap.blocked_pairs)
        p = choose_prefill(prefills, d.compat)
        if p is not None:
            return d, p
        cands = tuple(w for w in cands if w is not d)
    return None


def under_pressure(w: WorkerLoad, tuning: Tuning) -> bool:
    return w.kv_usage >= tuning.decode_pressure_kv_usage or _decode_load(w) >= tuning.decode_pressure_running


# The ladder's own choices (rules 7–10, 12b, 13 LocalPrefill, 14 policy): what the SLO policy may overrule.
LADDER_REASONS = frozenset({"short_prompt", "prefix_cache_hit", "below_remote_threshold", "short_output",
                            "no_decode_pressure", "prefill_queue_overload", "policy"})
# … and those where its rule is least sure: neither short enough for `maxInputTokens` nor long enough for
# `minInputTokens`, or long but with an answer below `minExpectedOutputTokens` (Tuning.slo_override_grey)
GREY_REASONS = frozenset({"below_remote_threshold", "short_output"})


def decide(cfg: RouterConfig, f: RequestFeatures, snap: LoadSnapshot, tuning: Tuning = Tuning()) -> Decision:
    picks = _Picks(snap, tuning)
    d = _ladder(cfg, f, snap, tuning, picks)
    if cfg.routing.policy == "SLO" and d.decision != "reject" and d.reason in LADDER_REASONS:
        return slo_decision(cfg, f, snap, tuning, d, picks)
    return d


class _Picks:
    """The workers a request would use — the least loaded decode worker, the remote pair — each chosen once per
    request and shared by the ladder and the SLO placement (the hot path: every request, up to 64 workers)."""

    __slots__ = ("_one_compat", "_pair", "_paired", "local_d", "remote_decodes", "snap", "tuning")

    def __init__(self, snap: LoadSnapshot, tuning: Tuning) -> None:
        self.snap, self.tuning = snap, tuning
        self.local_d = choose_decode(snap.decode, tuning) or choose_decode(snap.aggregated, tuning)
        self.remote_decodes: tuple[WorkerLoad, ...] = ()
        self._pair: tuple[WorkerLoad, WorkerLoad] | None = None
        self._paired = self._one_compat = False

    def pair(self) -> tuple[WorkerLoad, WorkerLoad] | None:
        """The preferred decode worker with a compatible prefill worker (closed breakers), or None."""
        if not self._paired:
            compat_groups = {w.compat for w in self.snap.prefill}
            self._one_compat = len(compat_groups) == 1
            self.remote_decodes = tuple([w for w in self.snap.decode if w.compat in compat_groups])
            # every decode worker compatible (one compat hash: the usual case): the first candidate is local_d
            first = self.local_d if len(self.remote_decodes) == len(self.snap.decode) else None
            self._pair = (choose_pair(self.remote_decodes, self.snap, self.tuning, first) if self.remote_decodes
                          else None)
            self._paired = True
        return self._pair

    def any_prefill(self) -> WorkerLoad | None:
        """The least busy prefill worker of any compat hash (``choose_prefill(snap.prefill, None)``): the pair's
        when every prefill worker shares one hash and no pair is blocked, as the pair chose among them all."""
        pair = self.pair()
        if pair is not None and self._one_compat and not self.snap.blocked_pairs:
            return pair[1]
        return choose_prefill(self.snap.prefill, None)


def _ladder(cfg: RouterConfig, f: RequestFeatures, snap: LoadSnapshot, tuning: Tuning, picks: _Picks) -> Decision:
    tenant = find_tenant(cfg, f.tenant)
    tname = tenant.name if tenant else DEFAULT_TENANT
    bucket = find_bucket(cfg, f.input_tokens)
    bname = bucket.name if bucket else None
    local_d = picks.local_d

    def local(reason: str, **detail: Any) -> Decision:
        return Decision("local", reason, decode=local_d.url if local_d else None, tenant=tname, bucket=bname,
                        prefix_tokens=local_d.prefix_tokens if local_d else 0,
                        local_decode=local_d.url if local_d else None, detail=detail)

    def elastic(reason: str, **detail: Any) -> Decision:
        """A local decision on the least loaded idle prefill worker when it is less loaded than the decode worker
        (one elastic fleet: a prefill worker serves a whole request as an aggregated engine does)."""
        if local_d is not None and cfg.routing.elastic_fleet and not cfg.prefill_starting and tuning.elastic_idle_s > 0:
            idle = [w for w in snap.prefill if w.remote_idle_s >= tuning.elastic_idle_s]
            if idle:
                p = min(idle, key=lambda w: (_decode_load(w), w.kv_usage, w.url))
                if _decode_load(p) + 1 <= _decode_load(local_d):
                    return Decision("local", reason, decode=p.url, tenant=tname, bucket=bname, local_decode=p.url,
                                    detail={**detail, "elastic": True})
        return local(reason, **detail)

    if cfg.effective_mode() == ActiveMode.AGGREGATED:
        agg = choose_decode(snap.aggregated, tuning) if snap.aggregated else local_d
        if agg is None:
            return Decision("reject", "no_decode_worker", tenant=tname, bucket=bname, status=503)
        return Decision("local", "mode_aggregated", decode=agg.url, tenant=tname, bucket=bname,
                        prefix_tokens=agg.prefix_tokens, local_decode=agg.url)
    if local_d is None:
        return Decision("reject", "no_decode_worker", tenant=tname, bucket=bname, status=503)
    if tenant is not None and tenant.disaggregation == "Never":
        return local("tenant_never")
    if not in_canary(cfg, f):
        return local("canary_excluded")
    if bucket is not None and bucket.prefill == "Local":
        return local("bucket_local")

    pol = effective_policy(cfg, tenant)
    forced = None
    if tenant is not None and tenant.disaggregation == "Always":
        forced = "tenant_always"
    elif bucket is not None and bucket.prefill == "Remote":
        forced = "bucket_remote"

    if forced is None:
        if f.input_tokens <= pol.local_max_input_tokens:
            return elastic("short_prompt")
        if (pol.prefer_when_prefix_cache_hit and local_d.prefix_tokens > 0
                and f.input_tokens - local_d.prefix_tokens <= pol.local_max_input_tokens):
            return local("prefix_cache_hit", prefix_tokens=local_d.prefix_tokens)
        if f.input_tokens < pol.min_input_tokens:
            return elastic("below_remote_threshold")
        expected = f.max_tokens if f.max_tokens is not None else snap.tenant_avg_output_tokens
        if expected is not None and expected < pol.min_expected_output_tokens:
            return elastic("short_output", expected_output_tokens=expected)

    if cfg.prefill_starting:
        return local("prefill_pool_starting")
    # Remote candidate: a decode worker that has a compatible prefill worker, with closed breakers.
    if not snap.prefill:
        return local("no_prefill_worker")
    pair = picks.pair()
    if not picks.remote_decodes:
        return local("no_compatible_pair")
    if pair is None:
        return local("circuit_open")
    d, p = pair
    if forced is None and pol.require_decode_pool_pressure and not under_pressure(d, tuning):
        return elastic("no_decode_pressure")
    reason = forced or "policy"

    def remote(reason: str) -> Decision:
        return Decision("remote", reason, decode=d.url, prefill=p.url, tenant=tname, bucket=bname,
                        est_prefill_wait_ms=p.est_wait_ms, prefix_tokens=d.prefix_tokens,
                        local_decode=local_d.url)

    if p.est_wait_ms > pol.max_prefill_queue_wait_ms:
        action = cfg.routing.fallback.on_prefill_queue_overload
        if action == "Queue":
            return remote("prefill_queue_overload_queued")
        if action == "Reject":
            return Decision("reject", "prefill_queue_overload", tenant=tname, bucket=bname,
                            est_prefill_wait_ms=p.est_wait_ms, status=429)
        d2 = local("prefill_queue_overload")
        # prefill demand the pool could not take in time, run on a decode worker: the autoscaler's prefill signal
        # (disagg_prefill_deflections_total), as when the SLO placement moves a remote prefill off a long queue;
        # without it the decode workers' TPOT, stalled by these prefills, reads as decode demand
        return Decision(**{**d2.__dict__, "est_prefill_wait_ms": p.est_wait_ms,
                           "detail": {**d2.detail, "deflected": True}})
    return remote(reason)


def _spent(o: pl.Prediction, local_d: WorkerLoad, pw: WorkerLoad | None, slo_tpot_s: float) -> bool:
    """Whether placement ``o`` prefills on a worker over its TPOT budget (placement.over_tpot_budget): the whole
    request on the decode worker or on the prefill worker; a remote prefill adds a stream to its decode worker, no
    prefill."""
    if o.placement == "local":
        return pl.over_tpot_budget(local_d, slo_tpot_s)
    if o.placement == "prefill_worker" and pw is not None:
        return pl.over_tpot_budget(pw, slo_tpot_s)
    return False


class _Priced:
    """The placements one request may take, each priced once and only when asked for (the hot path: a ladder choice
    predicted to meet is the only one priced on the decision's path; slo_decision)."""

    __slots__ = ("_local", "_priced", "_remote", "_whole", "base_worker", "cfg", "f", "out", "pair", "picks", "pw",
                 "slo_tpot", "slo_ttft", "snap", "tuning")

    def __init__(self, cfg: RouterConfig, f: RequestFeatures, snap: LoadSnapshot, tuning: Tuning, base: Decision,
                 picks: _Picks) -> None:
        self.cfg, self.f, self.snap, self.tuning, self.picks = cfg, f, snap, tuning, picks
        self.out = float(f.max_tokens if f.max_tokens is not None else
                         snap.tenant_avg_output_tokens or tuning.default_output_tokens)
        self.slo_tpot, self.slo_ttft = cfg.slo.tpot_p95_ms / 1000.0, cfg.slo.ttft_p95_ms / 1000.0
        self.base_worker = (next((w for w in snap.prefill if w.url == base.decode), None)
                            if base.detail.get("elastic") else None)
        self.pair: tuple[WorkerLoad, WorkerLoad] | None = None
        self.pw: WorkerLoad | None = None
        self._local: pl.Prediction | None = None
        self._remote: pl.Prediction | None = None
        self._whole: pl.Prediction | None = None
        self._priced: set[str] = set()  # which of remote and prefill_worker are priced (None: infeasible)

    def local(self) -> pl.Prediction:
        """The whole request on the chosen decode worker."""
        if self._local is None:
            d = self.picks.local_d
            assert d is not None  # the ladder rejected otherwise
            self._local = pl.predict_whole(d, pl.cost_of(d), self.f.input_tokens, "local", self.slo_tpot, self.out,
                                           slo_ttft_s=self.slo_ttft)
        return self._local

    def _remote_ok(self) -> bool:
        return bool(self.snap.prefill) and not self.cfg.prefill_starting

    def remote(self) -> pl.Prediction | None:
        """Remote prefill on a compatible pair (closed breakers, the prefill pool not starting); None: no pair."""
        if "remote" not in self._priced:
            self._priced.add("remote")
            self.pair = self.picks.pair() if self._remote_ok() else None
            if self.pair is not None:
                d, p = self.pair
                self._remote = pl.predict_remote(p, pl.cost_of(p), d, pl.cost_of(d), self.f.input_tokens,
                                                 self.slo_tpot, self.out, slo_ttft_s=self.slo_ttft)
        return self._remote

    def on_prefill_worker(self) -> pl.Prediction | None:
        """The whole request on the ladder's elastic prefill worker, else on the least busy prefill worker (one
        elastic fleet; Tuning.elastic_idle_s 0: off, here too); None: none."""
        if "prefill_worker" not in self._priced:
            self._priced.add("prefill_worker")
            if self._remote_ok():
                elastic = self.cfg.routing.elastic_fleet and self.tuning.elastic_idle_s > 0
                self.pw = self.base_worker or (self.picks.any_prefill() if elastic else None)
            if self.pw is not None:  # a stream there shares its steps with the pool's remote prefills to come
                pw, prefill = self.pw, self.snap.prefill
                pool_rate = sum([w.prefill_rate for w in prefill]) / len(prefill)
                self._whole = pl.predict_whole(pw, pl.cost_of(pw), self.f.input_tokens, "prefill_worker",
                                               self.slo_tpot, self.out, rate_floor=pool_rate,
                                               slo_ttft_s=self.slo_ttft)
        return self._whole

    def options(self) -> list[pl.Prediction]:
        """Every feasible placement, in the listed order (local, remote, prefill worker: the ranking's ties)."""
        return [o for o in (self.local(), self.remote(), self.on_prefill_worker()) if o is not None]

    def runner_up(self, taken: pl.Prediction) -> pl.Prediction | None:
        """The best-ranked placement other than ``taken``."""
        return next((o for o, _ in pl.rank(self.options(), self.slo_ttft, self.slo_tpot) if o is not taken), None)


def slo_decision(cfg: RouterConfig, f: RequestFeatures, snap: LoadSnapshot, tuning: Tuning,
                 base: Decision, picks: _Picks) -> Decision:
    """``spec.routing.policy: SLO``: the ladder's choice ``base``, overruled by the placement predicted to keep
    more requests within spec.slo (placement.py: by more than ``tuning.slo_override`` expected misses, or
    ``tuning.slo_override_grey`` where the ladder's rule is in its grey zone, :data:`GREY_REASONS`; both 0.01 by
    default: a noise floor, not a prior for the ladder) once the ladder's choice is at risk (its expected misses at
    least ``tuning.slo_keep``),
    among the whole request on the chosen decode worker, remote prefill on a compatible pair (closed breakers, the
    prefill pool not starting), and the whole request on the least busy prefill worker."""
    priced = _Priced(cfg, f, snap, tuning, base, picks)
    slo_tpot, slo_ttft = priced.slo_tpot, priced.slo_ttft
    kind = "remote" if base.decision == "remote" else "prefill_worker" if priced.base_worker is not None else "local"
    # the ladder's choice first (remote without a pair: priced as local, as the ranking below finds it)
    first = priced.remote() if kind == "remote" else priced.on_prefill_worker() if kind == "prefill_worker" else None
    if first is None:
        first = priced.local()
    detail: dict[str, Any] = base.detail
    if pl.misses(first, slo_ttft, slo_tpot) < tuning.slo_keep:
        # predicted to meet: it stands whatever the others save (below), so they are priced only for the log line
        detail["prediction"] = first
        detail["rejected"] = pl.RunnerUp(price=lambda: priced.runner_up(first))
        return base
    local = priced.local()
    remote = priced.remote()
    order = pl.rank(priced.options(), slo_ttft, slo_tpot)
    local_d, pw = picks.local_d, priced.pw
    assert local_d is not None
    chosen, chosen_misses = next((x for x in order if x[0].placement == kind), None) or next(
        x for x in order if x[0] is local)
    # an overrule puts no prefill on a worker whose streams already spend the TPOT SLO's allowance: its harm to
    # them is past what the stall model sees (the load they live through grows), and the ladder's own choice stands
    best, best_misses = next(x for x in order if x[0] is chosen or not _spent(x[0], local_d, pw, slo_tpot))
    margin = tuning.slo_override_grey if base.reason in GREY_REASONS else tuning.slo_override
    # ties (equal expected misses at the ranking's precision) and savings within the margin keep it
    if best is not chosen and round(chosen_misses, 3) - round(best_misses, 3) <= margin + 1e-9:
        best = chosen
    # the predictions themselves (formatted for the log line and the span only when the request is logged)
    detail["prediction"] = best
    detail["rejected"] = pl.RunnerUp(next((x[0] for x in order if x[0] is not best), None))
    if (base.decision == "remote" and best is not remote and remote is not None
            and pl.p_miss(remote.ttft_s, slo_ttft) >= tuning.slo_keep and remote.prefill_s >= 0.5 * remote.ttft_s):
        # prefill work the ladder meant for the prefill pool, placed elsewhere because the remote path is at risk on
        # its TTFT — its chance to miss it alone reaches the floor that lets an overrule happen at all
        # (Tuning.slo_keep) — and its prefill leg (queue + compute on the prefill worker) is most of it: demand the
        # prefill pool could not take in time (the autoscaler's prefill signal: disagg_prefill_deflections_total).
        # Not counted when the remote path lost on the decode side (a full decode worker, a slow transfer, harm to
        # streams). A predicted TTFT past the target alone would miss most of them: an overrule comes well before.
        detail["deflected"] = True
    if best is chosen:
        return base  # its detail, this request's own dict, now carries the prediction
    if best.placement == "remote" and priced.pair is not None:
        detail.pop("deflected", None)  # the ladder's overflow, overruled: the prefill pool takes it after all
        d, p = priced.pair
        return Decision("remote", "slo_remote", decode=d.url, prefill=p.url, tenant=base.tenant, bucket=base.bucket,
                        est_prefill_wait_ms=p.est_wait_ms, prefix_tokens=d.prefix_tokens, local_decode=local_d.url,
                        detail=detail)
    return Decision("local", "slo_" + best.placement, decode=best.worker, tenant=base.tenant, bucket=base.bucket,
                    prefix_tokens=local_d.prefix_tokens if best.placement == "local" else 0,
                    local_decode=best.worker, detail=detail)

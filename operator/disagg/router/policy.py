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

from dataclasses import dataclass
from typing import Any, Literal

from ..api.contract import RouterConfig
from ..api.models import ActiveMode, PromptBucket, TenantPolicy
from .picks import Picks, choose_decode, decode_load, under_pressure
from .policy_types import DEFAULT_TENANT, DEFAULT_TUNING, Decision, LoadSnapshot, RequestFeatures, Tuning
from .slo_policy import slo_decision


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


# The ladder's own choices (rules 7–10, 12b, 13 LocalPrefill, 14 policy): what the SLO policy may overrule.
LADDER_REASONS = frozenset({"short_prompt", "prefix_cache_hit", "below_remote_threshold", "short_output",
                            "no_decode_pressure", "prefill_queue_overload", "policy"})


def decide(cfg: RouterConfig, f: RequestFeatures, snap: LoadSnapshot, tuning: Tuning = DEFAULT_TUNING) -> Decision:
    picks = Picks(snap, tuning)
    d = _ladder(cfg, f, snap, tuning, picks)
    if cfg.routing.policy == "SLO" and d.decision != "reject" and d.reason in LADDER_REASONS:
        return slo_decision(cfg, f, snap, tuning, d, picks)
    return d


def _ladder(cfg: RouterConfig, f: RequestFeatures, snap: LoadSnapshot, tuning: Tuning, picks: Picks) -> Decision:
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
                p = min(idle, key=lambda w: (decode_load(w), w.kv_usage, w.url))
                if decode_load(p) + 1 <= decode_load(local_d):
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

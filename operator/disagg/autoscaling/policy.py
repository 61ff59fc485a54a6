"""Pure per-pool scaling policy: signals + spec + history → desired replicas, with reasons.

The rule, per pool, is HPA's proportional rule applied to SLO-normalised pressure:

    pressure  = max over the pool's signals of  observed / target
    proposal  = ceil(current × pressure)        (pressure > 1 + tolerance: up; < 1 - tolerance: down)

Prefill pressure: prefill-queue wait p95 ÷ its budget (remotePrefill.maxPrefillQueueWaitMs), TTFT p95 ÷ SLO,
waiting requests per replica ÷ target, and the demand it did not take: under the SLO placement a request whose
remote path is predicted to miss is served whole elsewhere (deflected), which keeps the prefill queue — and so the
first three signals — below target while the pool is short; with a share ``x`` of its demand deflected the pool
needs ``1 / (1 − x)`` of its capacity. While the prefill pool is short — its demand deflected, or growing this
interval — the decode pool's TPOT (which then carries the deflected prefill chunks, or the wave of streams a
draining prefill queue releases) is not a decode signal: the shortage is the prefill pool's (role-aware). Decode
pressure: TPOT p95 ÷ SLO, running sequences per replica ÷ (maxNumSeqs × target utilisation), KV-cache usage ÷
target. Targets sit below the SLO (``headroom``) so the pool
scales before the SLO is breached. Dynamo's SLA planner predicts load and corrects by observed ÷ expected latency;
this is the same correction without a load predictor, which keeps it honest on a twin and in a cluster alike
(docs/autoscaling.md argues the choice).

Then, in order: stabilisation (scale-up takes the lowest proposal in its window, scale-down the highest — HPA's
semantics), the max step per interval, min/max replicas, the prefill:decode ratio bounds and the shared GPU
budget. Missing or stale data holds the pool where it is, and restarts the watch: a scale-down needs a whole
``scaleDownStabilizationSeconds`` of evidence after the gap (what the load did while Prometheus was away is unknown,
so the window's proposals from before it do not speak for it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from ..api.models import AutoscalingSpec, DisaggregatedModelSpec, PoolSpec

PoolName = Literal["prefill", "decode"]

TOLERANCE = 0.1  # |pressure - 1| below this: no change (HPA's default tolerance)
HEADROOM = 0.8  # aim latency signals at 80 % of their SLO
WAITING_PER_REPLICA_TARGET = 2.0  # queued requests per prefill replica considered healthy
RUNNING_UTILISATION_TARGET = 0.8  # running sequences ÷ maxNumSeqs
KV_USAGE_TARGET = 0.85  # vllm:kv_cache_usage_perc
DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default --max-num-seqs
MAX_DEFLECTED_PRESSURE = 4.0  # every request deflected: the pool takes none of its demand (the step limit applies)


@dataclass(frozen=True)
class PoolSignals:
    """What Prometheus said about one pool (None: no data)."""

    replicas: int
    ready_replicas: int
    queue_wait_p95_ms: float | None = None  # prefill
    ttft_p95_ms: float | None = None  # prefill
    waiting_per_replica: float | None = None  # prefill
    deflected_share: float | None = None  # prefill: share of its demand served elsewhere (SLO placement), 0..1
    tpot_p95_ms: float | None = None  # decode
    running_per_replica: float | None = None  # decode
    kv_cache_usage: float | None = None  # decode, 0..1


@dataclass(frozen=True)
class Signals:
    time: float  # seconds (monotonic or epoch; only differences matter)
    prefill: PoolSignals
    decode: PoolSignals
    stale_reason: str | None = None  # Prometheus unreachable / no recent samples


@dataclass
class History:
    """Recent proposals per pool, for the stabilisation windows (kept in memory by the operator)."""

    proposals: dict[str, list[tuple[float, int]]] = field(default_factory=lambda: {"prefill": [], "decode": []})
    first_seen: dict[str, float] = field(default_factory=dict)

    def record(self, pool: str, t: float, proposal: int, horizon: float) -> None:
        self.first_seen.setdefault(pool, t)
        items = [(ts, p) for ts, p in self.proposals[pool] if t - ts <= horizon]
        items.append((t, proposal))
        self.proposals[pool] = items

    def window(self, pool: str, t: float, seconds: float) -> list[int]:
        return [p for ts, p in self.proposals[pool] if t - ts <= seconds]


@dataclass(frozen=True)
class Decision:
    pool: PoolName
    current: int
    desired: int
    pressure: float | None
    reason: str

    @property
    def changed(self) -> bool:
        return self.desired != self.current


def _ratio(observed: float | None, target: float) -> float | None:
    if observed is None or target <= 0:
        return None
    return observed / target


def prefill_pressure(spec: DisaggregatedModelSpec, s: PoolSignals) -> tuple[float | None, str]:
    terms = {
        "prefill queue wait p95": _ratio(s.queue_wait_p95_ms,
                                         HEADROOM * max(spec.routing.remote_prefill.max_prefill_queue_wait_ms, 1)),
        "TTFT p95": _ratio(s.ttft_p95_ms, HEADROOM * spec.slo.ttft_p95_ms),
        "waiting per replica": _ratio(s.waiting_per_replica, WAITING_PER_REPLICA_TARGET),
        "demand deflected": deflected_pressure(s),
    }
    return _dominant(terms)


# why the decode pool's TPOT is not its own signal in an interval (decode_pressure's ``tpot_left``)
TPOT_DEFLECTED = "its demand is deflected to decode"
TPOT_PREFILL_GROWING = "it grows this interval: its backlog reaches the decode workers in waves"


def decode_pressure(spec: DisaggregatedModelSpec, s: PoolSignals,
                    tpot_left: str | None = None) -> tuple[float | None, str]:
    """``tpot_left``: why TPOT is the prefill pool's signal this interval, not decode's — the prefill pool is
    short, and either its demand runs on the decode workers (deflected: their TPOT carries prefill chunks that are
    the prefill pool's to take) or it grows now (a queue that a short prefill pool built reaches the decode workers
    as a wave of new streams and KV pulls when it drains). The prefill pool takes it; the decode pool's batch and
    KV cache, which measure its own capacity, still count, and TPOT counts again once the prefill pool holds."""
    max_seqs = spec.decode.max_num_seqs or DEFAULT_MAX_NUM_SEQS
    terms = {
        "TPOT p95": (None if tpot_left else _ratio(s.tpot_p95_ms, HEADROOM * spec.slo.tpot_p95_ms)),
        "running sequences per replica": _ratio(s.running_per_replica, RUNNING_UTILISATION_TARGET * max_seqs),
        "KV-cache usage": _ratio(s.kv_cache_usage, KV_USAGE_TARGET),
    }
    p, why = _dominant(terms)
    if tpot_left and s.tpot_p95_ms is not None:
        why += f"; TPOT left to the prefill pool ({tpot_left})"
    return p, why


def deflected_pressure(s: PoolSignals) -> float | None:
    """The prefill pool's pressure from the demand it did not take: ``1 / (1 − share)``, at most
    :data:`MAX_DEFLECTED_PRESSURE`; None without data and when nothing was deflected (a share of 0 says the pool
    took its demand, not that it is at its target: as a term of 1 it would keep a quiet pool from shrinking)."""
    if not s.deflected_share:
        return None
    return 1.0 / max(1.0 - s.deflected_share, 1.0 / MAX_DEFLECTED_PRESSURE)


def prefill_deflecting(s: PoolSignals) -> bool:
    """The prefill pool's deflected demand alone asks it to grow (beyond the tolerance)."""
    p = deflected_pressure(s)
    return p is not None and p > 1.0 + TOLERANCE


def _dominant(terms: dict[str, float | None]) -> tuple[float | None, str]:
    known = {k: v for k, v in terms.items() if v is not None}
    if not known:
        return None, "no data"
    name = max(known, key=lambda k: known[k])
    return known[name], f"{name} at {known[name]:.0%} of target"


def _propose(current: int, pressure: float | None) -> int:
    if pressure is None:
        return current
    if current == 0:
        return 1 if pressure > 0 else 0
    if abs(pressure - 1.0) <= TOLERANCE:
        return current
    return max(0, math.ceil(current * pressure - 1e-9))


def _stabilise(history: History, pool: str, t: float, current: int, proposal: int, a: AutoscalingSpec) -> int:
    horizon = max(a.scale_up_stabilization_seconds, a.scale_down_stabilization_seconds)
    history.record(pool, t, proposal, horizon)
    if proposal > current:
        window = history.window(pool, t, a.scale_up_stabilization_seconds)
        return max(current, min(window))
    if proposal < current:
        if t - history.first_seen[pool] < a.scale_down_stabilization_seconds:
            return current  # not watched for a whole window yet (e.g. just after an operator restart): no shrink
        window = history.window(pool, t, a.scale_down_stabilization_seconds)
        return min(current, max(window))
    return current


def _gpus_per_replica(pool: PoolSpec) -> int:
    p = pool.parallelism
    return pool.gpu.count or p.tensor * p.pipeline * p.data


def decide(spec: DisaggregatedModelSpec, signals: Signals, history: History) -> dict[str, Decision]:
    """Desired replicas for the prefill and decode pools (pure apart from appending to ``history``)."""
    a = spec.autoscaling
    pools: dict[PoolName, tuple[PoolSpec, PoolSignals]] = {
        "prefill": (spec.prefill, signals.prefill),
        "decode": (spec.decode, signals.decode),
    }
    if signals.stale_reason:
        history.first_seen.clear()  # a gap in the evidence: no shrink until a whole window is watched again
        return {name: Decision(name, s.replicas, s.replicas, None, f"holding: {signals.stale_reason}")
                for name, (_, s) in pools.items()}

    desired: dict[PoolName, int] = {}
    pressure: dict[PoolName, float | None] = {}
    reasons: dict[PoolName, str] = {}
    tpot_left = TPOT_DEFLECTED if prefill_deflecting(signals.prefill) else None
    for name, (pool, s) in pools.items():  # prefill first: whether it grows decides what decode's TPOT says
        if name == "decode" and tpot_left is None and desired["prefill"] > signals.prefill.replicas:
            tpot_left = TPOT_PREFILL_GROWING
        p, why = prefill_pressure(spec, s) if name == "prefill" else decode_pressure(spec, s, tpot_left)
        pressure[name] = p
        current = s.replicas
        proposal = _stabilise(history, name, signals.time, current, _propose(current, p), a)
        step = max(-a.max_step, min(a.max_step, proposal - current))
        target = min(pool.max_replicas, max(pool.min_replicas, current + step))
        desired[name] = target
        reasons[name] = why if p is not None else "holding: no data for this pool"
        if target != current + step:
            reasons[name] += f"; clamped to [{pool.min_replicas}, {pool.max_replicas}]"
        elif step != proposal - current:
            reasons[name] += f"; limited to maxStep {a.max_step}"

    _apply_ratio_bounds(spec, desired, reasons)
    _apply_gpu_budget(spec, desired, pressure, {n: s.replicas for n, (_, s) in pools.items()}, reasons)
    return {name: Decision(name, pools[name][1].replicas, desired[name], pressure[name], reasons[name])
            for name in pools}


def bounded(spec: DisaggregatedModelSpec, decisions: dict[str, Decision]) -> dict[str, Decision]:
    """Another policy's decisions (the predictive one's) under the spec's shared bounds: the prefill:decode ratio
    and the GPU budget (growth taken back from prefill first: no pressure figure to order by)."""
    desired: dict[PoolName, int] = {"prefill": decisions["prefill"].desired, "decode": decisions["decode"].desired}
    reasons: dict[PoolName, str] = {"prefill": decisions["prefill"].reason, "decode": decisions["decode"].reason}
    current: dict[PoolName, int] = {"prefill": decisions["prefill"].current, "decode": decisions["decode"].current}
    _apply_ratio_bounds(spec, desired, reasons)
    _apply_gpu_budget(spec, desired, {"prefill": None, "decode": None}, current, reasons)
    return {name: Decision(name, current[name], desired[name], decisions[name].pressure, reasons[name])
            for name in ("prefill", "decode")}


def _apply_ratio_bounds(spec: DisaggregatedModelSpec, desired: dict[PoolName, int],
                        reasons: dict[PoolName, str]) -> None:
    bounds = spec.autoscaling.prefill_decode_ratio
    p, d = desired["prefill"], desired["decode"]
    if d == 0 or p == 0:
        return
    if p / d > bounds.max:
        need_d = math.ceil(p / bounds.max)
        if need_d <= spec.decode.max_replicas:
            desired["decode"] = need_d
            reasons["decode"] += f"; raised to keep prefill:decode ≤ {bounds.max}"
        else:
            desired["prefill"] = max(spec.prefill.min_replicas, math.floor(d * bounds.max))
            reasons["prefill"] += f"; capped to keep prefill:decode ≤ {bounds.max}"
    elif p / d < bounds.min:
        need_p = math.ceil(d * bounds.min)
        if need_p <= spec.prefill.max_replicas:
            desired["prefill"] = need_p
            reasons["prefill"] += f"; raised to keep prefill:decode ≥ {bounds.min}"
        else:
            desired["decode"] = max(spec.decode.min_replicas, math.floor(p / bounds.min))
            reasons["decode"] += f"; capped to keep prefill:decode ≥ {bounds.min}"


def _apply_gpu_budget(spec: DisaggregatedModelSpec, desired: dict[PoolName, int],
                      pressure: dict[PoolName, float | None], current: dict[PoolName, int],
                      reasons: dict[PoolName, str]) -> None:
    budget = spec.autoscaling.gpu_budget
    if budget is None:
        return
    gpus = {"prefill": _gpus_per_replica(spec.prefill), "decode": _gpus_per_replica(spec.decode)}

    def used() -> int:
        return sum(desired[n] * gpus[n] for n in desired)

    # Take growth back from the less pressured pool first, one replica at a time, never below current/min.
    def pressure_of(name: PoolName) -> float:
        value = pressure[name]
        return 0.0 if value is None else value

    order = sorted(desired, key=pressure_of)
    for name in order:
        floor = max(spec.prefill.min_replicas if name == "prefill" else spec.decode.min_replicas,
                    min(current[name], desired[name]))
        while used() > budget and desired[name] > floor:
            desired[name] -= 1
            if "GPU budget" not in reasons[name]:
                reasons[name] += f"; limited by gpuBudget {budget}"

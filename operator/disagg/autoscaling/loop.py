"""One pure step of the operator's closed loop: a Prometheus sample → scaling decisions, mode, status figures.

A kopf daemon per model (``disagg.controller.autoscaler``) does the I/O around it: runs :func:`queries.collect`
off the event loop, calls :func:`step`, records the decisions, the active mode and the figures in status, and
writes pool sizes through each Deployment's /scale subresource (the reconciler then rewrites the router's
ConfigMap from status). Keeping this step pure makes the whole loop table-testable.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..api.models import ActiveMode, DisaggregatedModelSpec, Mode, ObservedStatus
from ..api.status import RoleMoves
from .forecast import Load
from .mode import ModeSignals, ModeState, next_state
from .observe import HISTOGRAMS, ROUTED_KEYS, observation
from .policy import Decision, History, PoolSignals, Signals, bounded, decide
from .predictive import Observation, PredictivePolicy
from .queries import LOAD_PREFIX, Sample


@dataclass
class LoopState:
    """Per-model memory of the loop (kept by the operator in process; rebuilt empty after a restart)."""

    history: History = field(default_factory=History)
    mode: ModeState | None = None
    # spec.autoscaling.policy Predictive: the policy (its forecast, corrections and scale-down record), or why it
    # cannot run for this model (the proportional policy then decides, and says so); ``predictive_key``: the spec
    # it was built for (rebuilt when the spec changes)
    predictive: PredictivePolicy | None = None
    predictive_unavailable: str | None = None
    predictive_key: str | None = None
    last_load: Load | None = None


@dataclass(frozen=True)
class PoolReplicas:
    replicas: int
    ready: int
    starting: bool = False  # status.pools.<pool>.starting (the reconciler's reading of the pool's readiness)


@dataclass(frozen=True)
class StepResult:
    decisions: dict[str, Decision]  # empty when autoscaling is disabled
    mode: ModeState
    mode_changed: bool
    observed: ObservedStatus  # every figure None (unknown) when the sample is an error
    slo_met: tuple[str, str, str]  # (status, reason, message) for the SLOMet condition
    metrics: tuple[str, str, str] = ("True", "MetricsAvailable", "")  # the MetricsAvailable condition
    kv_transfer: tuple[str, str, str] = ("Unknown", "NoRemoteTraffic", "")  # the KVTransferHealthy condition
    # the predictive policy's role moves (status.roleMoves); None: no predictive policy runs (no moves)
    role_moves: RoleMoves | None = None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)


def _count(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _share(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def observed(sample: Sample, time_iso: str) -> ObservedStatus:
    """The status figures of a sample. A failed sample gives no figure at all (unknown), never a partial one, and
    no time: the figures are not measured."""
    if sample.error:
        return ObservedStatus()
    g = sample.get
    return ObservedStatus(
        ttft_p95_ms=_ms(g("ttft_p95")), tpot_p95_ms=_ms(g("tpot_p95")),
        goodput=_share(g("goodput")),
        prefill_queue_delay_p95_ms=_ms(g("prefill_queue_wait_p95")),
        decode_active_sequences=g("decode_active_sequences"), kv_transfer_p95_ms=_ms(g("kv_transfer_p95")),
        prefix_cache_hit_rate=_share(g("prefix_cache_hit_rate")),
        mode_probes_succeeded=_count(g("mode_probes_ok")), mode_probes_failed=_count(g("mode_probes_failed")),
        time=time_iso,
    )


def slo_condition(spec: DisaggregatedModelSpec, sample: Sample, obs: ObservedStatus) -> tuple[str, str, str]:
    if sample.error:
        return "Unknown", "MetricsUnavailable", f"{sample.error}; holding replicas and mode"
    breaches = []
    if obs.ttft_p95_ms is not None and obs.ttft_p95_ms > spec.slo.ttft_p95_ms:
        breaches.append(f"TTFT p95 {obs.ttft_p95_ms:.0f} ms > {spec.slo.ttft_p95_ms} ms")
    if obs.tpot_p95_ms is not None and obs.tpot_p95_ms > spec.slo.tpot_p95_ms:
        breaches.append(f"TPOT p95 {obs.tpot_p95_ms:.1f} ms > {spec.slo.tpot_p95_ms} ms")
    if obs.goodput is not None and obs.goodput < spec.slo.goodput_target:
        breaches.append(f"goodput {obs.goodput:.1%} < {spec.slo.goodput_target:.0%}")
    if breaches:
        return "False", "SLOBreached", "; ".join(breaches)
    if obs.ttft_p95_ms is None and obs.tpot_p95_ms is None:
        return "Unknown", "NoTraffic", "no requests in the window"
    return "True", "SLOMet", (f"TTFT p95 {obs.ttft_p95_ms or 0:.0f} ms, TPOT p95 {obs.tpot_p95_ms or 0:.1f} ms, "
                              f"goodput {'n/a' if obs.goodput is None else f'{obs.goodput:.1%}'}")


def metrics_condition(sample: Sample) -> tuple[str, str, str]:
    if sample.error:
        return "False", sample.reason or "PrometheusUnavailable", f"{sample.error}; status figures are unknown"
    up = sample.get("targets_up")
    return "True", "MetricsAvailable", f"Prometheus answered; {0 if up is None else int(up)} scrape target(s) up"


def kv_transfer_condition(spec: DisaggregatedModelSpec, sample: Sample) -> tuple[str, str, str]:
    """KVTransferHealthy, measured: the share of remote-prefill attempts that fell back for a KV-transport fault
    (causes kv_*) against spec.modePolicy.kvTransferFailureRate, and the KV transfer p95. Which UCX transport
    carried the KV is not observable (no metric names it; docs/observability.md): only its cost is."""
    if sample.error:
        return "Unknown", "MetricsUnavailable", f"{sample.error}; KV transfer health is not measured"
    rate, p95 = sample.get("kv_failure_rate"), _ms(sample.get("kv_transfer_p95"))
    transport = spec.kv_transfer.transport
    figures = (f"KV-transport failures {'n/a' if rate is None else f'{rate:.1%}'} of remote-prefill attempts, "
               f"transfer p95 {'n/a' if p95 is None else f'{p95:.0f} ms'} (transport {transport})")
    if rate is None and p95 is None:
        return "Unknown", "NoRemoteTraffic", f"no remote-prefill request in the window: {figures}"
    limit = spec.mode_policy.kv_transfer_failure_rate
    if rate is not None and rate > limit:
        return "False", "TransferFailures", f"{figures}; above spec.modePolicy.kvTransferFailureRate {limit:.1%}"
    return "True", "TransfersSucceeding", figures


def _observation(spec: DisaggregatedModelSpec, pools: dict[str, PoolReplicas], sample: Sample, state: LoopState,
                 now: float) -> Observation:
    """The predictive policy's input from the sample's increments (autoscaling/observe.py: one derivation with the
    twin's connector); the interval is spec.autoscaling.intervalSeconds. A failed sample holds."""
    inc: dict[str, dict[str, float]] = {"prefill": {}, "decode": {}}
    for pool, family in HISTOGRAMS:
        for part in ("sum", "count"):
            key = f"{family}_{part}"
            inc[pool][key] = sample.get(f"{LOAD_PREFIX}{pool}:{key}") or 0.0
    routed = {key: sample.get(f"{LOAD_PREFIX}routed:{key}") or 0.0 for key, _, _ in ROUTED_KEYS}
    obs = observation(now, float(spec.autoscaling.interval_seconds), inc["prefill"], inc["decode"], routed,
                      sample.get(LOAD_PREFIX + "decode:vllm:num_requests_running") or 0.0,
                      {n: p.ready for n, p in pools.items()}, {n: p.replicas for n, p in pools.items()},
                      state.last_load, sample.get(LOAD_PREFIX + "prefill:vllm:num_requests_waiting") or 0.0)
    if obs.load is not None:
        state.last_load = obs.load
    return replace(obs, stale_reason=sample.error) if sample.error else obs


def step(spec: DisaggregatedModelSpec, pools: dict[str, PoolReplicas], sample: Sample, state: LoopState,
         now: float, now_iso: str, current_mode: ActiveMode | None = None) -> StepResult:
    g = sample.get
    prefill, decode = pools["prefill"], pools["decode"]
    obs = observed(sample, now_iso)

    decisions: dict[str, Decision] = {}
    moves: RoleMoves | None = None
    if spec.autoscaling.enabled:
        signals = Signals(
            time=now, stale_reason=sample.error,
            # the prefill pool answers for the TTFT of remote requests only: local requests' TTFT is the decode
            # pool's (a long-output load step queues them on decode and must not grow prefill)
            prefill=PoolSignals(prefill.replicas, prefill.ready, queue_wait_p95_ms=_ms(g("prefill_queue_wait_p95")),
                                ttft_p95_ms=_ms(g("remote_ttft_p95")),
                                waiting_per_replica=g("prefill_waiting_per_replica"),
                                deflected_share=g("prefill_deflected_share")),
            decode=PoolSignals(decode.replicas, decode.ready, tpot_p95_ms=_ms(g("tpot_p95")),
                               running_per_replica=g("decode_running_per_replica"),
                               kv_cache_usage=g("decode_kv_cache_usage")),
        )
        if state.predictive is not None:
            decisions = bounded(spec, state.predictive.step(_observation(spec, pools, sample, state, now)))
            moves = state.predictive.moves
        else:
            decisions = decide(spec, signals, state.history)
            if state.predictive_unavailable:
                decisions = {n: replace(d, reason=f"{d.reason} (proportional: {state.predictive_unavailable})")
                             for n, d in decisions.items()}

    before = state.mode or ModeState(active=current_mode or ActiveMode.DISAGGREGATED, since=now,
                                     reason="operator started")
    mode_signals = ModeSignals(
        time=now, kv_failure_rate=g("kv_failure_rate"), prefill_ready=prefill.ready,
        prefill_desired=prefill.replicas, prefill_starting=prefill.starting, ttft_p95_ms=_ms(g("ttft_p95")),
        kv_transfer_p95_ms=_ms(g("kv_transfer_p95")), probes_ok=g("mode_probes_ok"),
        probes_failed=g("mode_probes_failed"),
        # a pinned mode is applied whatever the metrics say; Auto needs evidence
        stale_reason=sample.error if spec.mode == Mode.AUTO else None,
    )
    after = next_state(spec, before, mode_signals)
    state.mode = after
    if after.active == ActiveMode.AGGREGATED and moves is not None:
        moves = RoleMoves()  # no roles to move while the model serves aggregated
    return StepResult(decisions=decisions, mode=after, mode_changed=after.active != before.active,
                      observed=obs, slo_met=slo_condition(spec, sample, obs), metrics=metrics_condition(sample),
                      kv_transfer=kv_transfer_condition(spec, sample), role_moves=moves)

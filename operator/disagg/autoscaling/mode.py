"""Pure mode controller: when spec.mode is Auto, flip to Aggregated when disaggregation misbehaves, and back.

To Aggregated (immediately, it is the safe side) when any of:
- the KV-transfer failure/timeout rate over the window exceeds modePolicy.kvTransferFailureRate;
- no prefill replica is ready while the prefill pool should have some;
- TTFT p95 breaches the SLO and the KV transfer is at least modePolicy.transferShareOfTTFT of it.

Back to Disaggregated only after every signal has stayed healthy for the hold period. Hysteresis against
flapping: a relapse within RELAPSE_HOLDS × hold of a return doubles the next hold (up to 16×); a healthy stretch
that long in Disaggregated resets it. An oscillating signal therefore produces a bounded number of
flips however long it oscillates. spec.mode Aggregated/Disaggregated pins the mode.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..api.models import ActiveMode, DisaggregatedModelSpec, Mode

MAX_BACKOFF = 16
RELAPSE_HOLDS = 10  # a relapse within 10 holds of a return counts as flapping


@dataclass(frozen=True)
class ModeSignals:
    time: float
    kv_failure_rate: float | None = None  # failures+timeouts ÷ remote attempts over the window
    prefill_ready: int = 0
    prefill_desired: int = 0
    ttft_p95_ms: float | None = None
    kv_transfer_p95_ms: float | None = None
    stale_reason: str | None = None


@dataclass(frozen=True)
class ModeState:
    active: ActiveMode = ActiveMode.DISAGGREGATED
    since: float = 0.0
    reason: str = "initial"
    healthy_since: float | None = None  # while Aggregated: when signals became healthy
    backoff: int = 1  # multiplier of the hold period
    flips: int = 0


def unhealthy_reason(spec: DisaggregatedModelSpec, s: ModeSignals) -> str | None:
    """Why disaggregation is misbehaving now, or None."""
    p = spec.mode_policy
    if s.kv_failure_rate is not None and s.kv_failure_rate > p.kv_transfer_failure_rate:
        return f"KV transfer failure rate {s.kv_failure_rate:.1%} > {p.kv_transfer_failure_rate:.1%}"
    if s.prefill_desired > 0 and s.prefill_ready == 0:
        return "no ready prefill replica"
    if (
        s.ttft_p95_ms is not None
        and s.kv_transfer_p95_ms is not None
        and s.ttft_p95_ms > spec.slo.ttft_p95_ms
        and s.kv_transfer_p95_ms >= p.transfer_share_of_ttft * s.ttft_p95_ms
    ):
        return (f"TTFT p95 {s.ttft_p95_ms:.0f} ms > SLO {spec.slo.ttft_p95_ms} ms with KV transfer "
                f"{s.kv_transfer_p95_ms:.0f} ms ≥ {p.transfer_share_of_ttft:.0%} of it")
    return None


def next_state(spec: DisaggregatedModelSpec, state: ModeState, s: ModeSignals) -> ModeState:
    if spec.mode == Mode.AGGREGATED:
        return _to(state, ActiveMode.AGGREGATED, s.time, "pinned by spec.mode Aggregated")
    if spec.mode == Mode.DISAGGREGATED:
        return _to(state, ActiveMode.DISAGGREGATED, s.time, "pinned by spec.mode Disaggregated")
    if s.stale_reason:  # no evidence either way: stay where we are
        return state
    hold = spec.mode_policy.healthy_hold_seconds
    why = unhealthy_reason(spec, s)
    if state.active == ActiveMode.DISAGGREGATED:
        if why is None:
            if state.backoff > 1 and s.time - state.since >= RELAPSE_HOLDS * hold * state.backoff:
                return replace(state, backoff=1)  # a long healthy stretch forgives past flaps
            return state
        quick_relapse = state.flips > 0 and s.time - state.since < RELAPSE_HOLDS * hold
        backoff = min(MAX_BACKOFF, state.backoff * 2) if quick_relapse else state.backoff
        return replace(_to(state, ActiveMode.AGGREGATED, s.time, why), backoff=backoff, healthy_since=None)
    # Aggregated (chosen by us): wait for a healthy hold, scaled by the backoff.
    if why is not None:
        return replace(state, healthy_since=None, reason=why)
    healthy_since = state.healthy_since if state.healthy_since is not None else s.time
    if s.time - healthy_since >= hold * state.backoff:
        return _to(state, ActiveMode.DISAGGREGATED, s.time,
                   f"healthy for {s.time - healthy_since:.0f}s (hold {hold * state.backoff}s)")
    return replace(state, healthy_since=healthy_since)


def _to(state: ModeState, mode: ActiveMode, t: float, reason: str) -> ModeState:
    if state.active == mode:
        return replace(state, reason=reason) if state.reason != reason and reason.startswith("pinned") else state
    return ModeState(active=mode, since=t, reason=reason, healthy_since=None, backoff=state.backoff,
                     flips=state.flips + 1)

"""Pure mode controller: when spec.mode is Auto, flip to Aggregated when disaggregation misbehaves, and back.

To Aggregated (immediately, it is the safe side) when any of:
- the KV-transport failure rate over the window exceeds modePolicy.kvTransferFailureRate. Only transport causes
  count (router fallback causes ``kv_*``: KV pull failed, transfer timeout after the prefill finished), over
  remote attempts; a prefill leg that queued or failed for capacity (``prefill_*``) is the autoscaler's and the
  overload policy's business, never the mode's;
- no prefill replica is ready while the prefill pool should have some, for at least modePolicy.windowSeconds (the
  window every other signal is measured over) — unless the pool is *starting* (created, scaled from zero or rolled
  to a new generation, and not ready since: status.pools.prefill.starting). Starting is not failing: no flip, no
  backoff; and a pod that restarts within the window (the router keeps requests local meanwhile, reason
  ``no_prefill_worker``) is not a reason to leave disaggregation either;
- TTFT p95 breaches the SLO and the KV transfer is at least modePolicy.transferShareOfTTFT of it.

Back to Disaggregated on evidence, not on silence: while the controller holds the model Aggregated no request
uses the KV path, so "healthy" alone only means "no evidence". The router probes the remote path with a bounded
share of requests (modePolicy.probe); the return needs every signal healthy for the hold period AND at least
``probe.successesToReturn`` successful probes within the window. With probing off (ratePerMinute 0, or
successesToReturn 0) the hold alone decides. A starting prefill pool holds the return (there is nothing to
return to yet).

Hysteresis against flapping: a relapse within RELAPSE_HOLDS × hold of a return doubles the next hold (up to
16×); a healthy stretch that long in Disaggregated resets it. An oscillating signal therefore produces a bounded
number of flips however long it oscillates. spec.mode Aggregated/Disaggregated pins the mode.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..api.models import ActiveMode, DisaggregatedModelSpec, Mode

MAX_BACKOFF = 16
RELAPSE_HOLDS = 10  # a relapse within 10 holds of a return counts as flapping


@dataclass(frozen=True)
class ModeSignals:
    time: float
    kv_failure_rate: float | None = None  # transport failures (cause kv_*) ÷ remote attempts over the window
    prefill_ready: int = 0
    prefill_desired: int = 0
    prefill_starting: bool = False  # status.pools.prefill.starting: not ready yet, and not failed
    ttft_p95_ms: float | None = None
    kv_transfer_p95_ms: float | None = None
    probes_ok: float | None = None  # successful remote-path probes in the window (None: no data)
    probes_failed: float | None = None
    stale_reason: str | None = None
    # how long the prefill pool has had no ready replica (next_state fills it in from ModeState); None: unknown
    prefill_outage_seconds: float | None = None


@dataclass(frozen=True)
class ModeState:
    active: ActiveMode = ActiveMode.DISAGGREGATED
    since: float = 0.0
    reason: str = "initial"
    healthy_since: float | None = None  # while Aggregated: when signals became healthy
    backoff: int = 1  # multiplier of the hold period
    flips: int = 0
    prefill_down_since: float | None = None  # when the prefill pool last lost its last ready replica


def unhealthy_reason(spec: DisaggregatedModelSpec, s: ModeSignals) -> str | None:
    """Why disaggregation is misbehaving now, or None."""
    p = spec.mode_policy
    if s.kv_failure_rate is not None and s.kv_failure_rate > p.kv_transfer_failure_rate:
        return f"KV transfer failure rate {s.kv_failure_rate:.1%} > {p.kv_transfer_failure_rate:.1%}"
    if prefill_out(s) and (s.prefill_outage_seconds is None or s.prefill_outage_seconds >= p.window_seconds):
        return ("no ready prefill replica" if s.prefill_outage_seconds is None
                else f"no ready prefill replica for {s.prefill_outage_seconds:.0f}s")
    if (
        s.ttft_p95_ms is not None
        and s.kv_transfer_p95_ms is not None
        and s.ttft_p95_ms > spec.slo.ttft_p95_ms
        and s.kv_transfer_p95_ms >= p.transfer_share_of_ttft * s.ttft_p95_ms
    ):
        return (f"TTFT p95 {s.ttft_p95_ms:.0f} ms > SLO {spec.slo.ttft_p95_ms} ms with KV transfer "
                f"{s.kv_transfer_p95_ms:.0f} ms ≥ {p.transfer_share_of_ttft:.0%} of it")
    return None


def prefill_out(s: ModeSignals) -> bool:
    """The prefill pool should have replicas, has none ready, and is not starting."""
    return s.prefill_desired > 0 and s.prefill_ready == 0 and not s.prefill_starting


def next_state(spec: DisaggregatedModelSpec, state: ModeState, s: ModeSignals) -> ModeState:
    """The next mode state; also remembers since when the prefill pool has had no ready replica."""
    down_since = (state.prefill_down_since if state.prefill_down_since is not None else s.time) \
        if prefill_out(s) else None
    outage = None if down_since is None else s.time - down_since
    after = _next_state(spec, state, replace(s, prefill_outage_seconds=outage if outage is not None else 0.0))
    return replace(after, prefill_down_since=down_since)


def _next_state(spec: DisaggregatedModelSpec, state: ModeState, s: ModeSignals) -> ModeState:
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
    # Aggregated (chosen by us): wait for a healthy hold, scaled by the backoff, and for probe evidence.
    if why is None and s.prefill_starting and s.prefill_ready == 0:
        why = "prefill pool starting"
    if why is not None:
        return replace(state, healthy_since=None, reason=why)
    healthy_since = state.healthy_since if state.healthy_since is not None else s.time
    held = s.time - healthy_since
    if held < hold * state.backoff:
        return replace(state, healthy_since=healthy_since)
    missing = missing_evidence(spec, s)
    if missing is not None:
        return replace(state, healthy_since=healthy_since, reason=f"healthy for {held:.0f}s; {missing}")
    evidence = "" if not probes_required(spec) else f" and {s.probes_ok or 0:.0f} successful probes"
    return _to(state, ActiveMode.DISAGGREGATED, s.time,
               f"healthy for {held:.0f}s (hold {hold * state.backoff}s){evidence}")


def probes_required(spec: DisaggregatedModelSpec) -> int:
    """Successful probes the return needs (0: probing is off and the hold alone decides)."""
    probe = spec.mode_policy.probe
    return probe.successes_to_return if probe.rate_per_minute > 0 else 0


def missing_evidence(spec: DisaggregatedModelSpec, s: ModeSignals) -> str | None:
    """Why the probes do not (yet) justify a return, or None."""
    need = probes_required(spec)
    ok = s.probes_ok or 0.0
    if need and ok < need:
        failed = f", {s.probes_failed:.0f} failed" if s.probes_failed else ""
        return f"waiting for remote-path probes: {ok:.0f}/{need} succeeded in the window{failed}"
    return None


def _to(state: ModeState, mode: ActiveMode, t: float, reason: str) -> ModeState:
    if state.active == mode:
        return replace(state, reason=reason) if state.reason != reason and reason.startswith("pinned") else state
    return ModeState(active=mode, since=t, reason=reason, healthy_since=None, backoff=state.backoff,
                     flips=state.flips + 1)

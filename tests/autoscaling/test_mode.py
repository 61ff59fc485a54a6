"""Mode controller: flips on misbehaviour, returns after the hold, never flaps, honours pins."""

from __future__ import annotations

from disagg.api.models import ActiveMode, DisaggregatedModelSpec
from disagg.autoscaling.mode import ModeSignals, ModeState, next_state, unhealthy_reason


def spec(mode: str = "Auto", hold: int = 300) -> DisaggregatedModelSpec:
    return DisaggregatedModelSpec.model_validate({
        "model": {"name": "m"}, "mode": mode, "slo": {"ttftP95Ms": 1000},
        "modePolicy": {"kvTransferFailureRate": 0.05, "transferShareOfTTFT": 0.5, "healthyHoldSeconds": hold}})


def healthy(t: float) -> ModeSignals:
    return ModeSignals(time=t, kv_failure_rate=0.0, prefill_ready=2, prefill_desired=2, ttft_p95_ms=500,
                       kv_transfer_p95_ms=50, probes_ok=3.0)  # the router's probes succeed (default: 3 needed)


def broken(t: float) -> ModeSignals:
    return ModeSignals(time=t, kv_failure_rate=0.3, prefill_ready=2, prefill_desired=2)


def test_reasons() -> None:
    s = spec()
    assert unhealthy_reason(s, healthy(0)) is None
    assert "failure rate" in str(unhealthy_reason(s, broken(0)))
    assert "no ready prefill" in str(unhealthy_reason(s, ModeSignals(time=0, prefill_ready=0, prefill_desired=1)))
    assert "KV transfer" in str(unhealthy_reason(s, ModeSignals(time=0, prefill_ready=1, prefill_desired=1,
                                                                ttft_p95_ms=2000, kv_transfer_p95_ms=1200)))
    # TTFT breach not dominated by transfer: not a reason to leave disaggregation
    assert unhealthy_reason(s, ModeSignals(time=0, prefill_ready=1, prefill_desired=1, ttft_p95_ms=2000,
                                           kv_transfer_p95_ms=100)) is None


def test_flip_and_return_after_hold() -> None:
    s, st = spec(), ModeState()
    st = next_state(s, st, broken(0))
    assert st.active == ActiveMode.AGGREGATED and "failure rate" in st.reason
    st = next_state(s, st, healthy(30))
    st = next_state(s, st, healthy(200))
    assert st.active == ActiveMode.AGGREGATED  # hold not over
    st = next_state(s, st, broken(220))  # relapse resets the healthy clock
    st = next_state(s, st, healthy(240))
    st = next_state(s, st, healthy(500))
    assert st.active == ActiveMode.AGGREGATED
    st = next_state(s, st, healthy(540))
    assert st.active == ActiveMode.DISAGGREGATED and st.since == 540


def test_stale_data_changes_nothing() -> None:
    s = spec()
    st = next_state(s, ModeState(), broken(0))
    same = next_state(s, st, ModeSignals(time=1000, stale_reason="Prometheus unreachable"))
    assert same == st


def test_oscillating_signal_flips_a_bounded_number_of_times() -> None:
    s, st = spec(hold=60), ModeState()
    for i in range(24 * 60):  # a day at one sample a minute, broken every other 5 minutes
        t = i * 60.0
        st = next_state(s, st, broken(t) if (i // 5) % 2 == 0 else healthy(t))
    assert st.flips <= 12, st.flips  # naive hysteresis would flip ~288 times


def test_pins() -> None:
    st = next_state(spec("Aggregated"), ModeState(), healthy(0))
    assert st.active == ActiveMode.AGGREGATED and "pinned" in st.reason
    st = next_state(spec("Disaggregated"), st, broken(10))
    assert st.active == ActiveMode.DISAGGREGATED and "pinned" in st.reason


def test_a_starting_prefill_pool_is_not_a_fault() -> None:
    s = spec()
    starting = ModeSignals(time=0, kv_failure_rate=0.0, prefill_ready=0, prefill_desired=2, prefill_starting=True)
    assert unhealthy_reason(s, starting) is None
    st = ModeState()
    for t in range(0, 600, 30):  # minutes of weight loading: no flip, no backoff
        st = next_state(s, st, ModeSignals(time=t, prefill_ready=0, prefill_desired=2, prefill_starting=True))
    assert st.active == ActiveMode.DISAGGREGATED and st.flips == 0 and st.backoff == 1
    # the same readiness after the pool had been ready is a failure, once it lasts a window (60 s)
    st = next_state(s, st, ModeSignals(time=600, prefill_ready=0, prefill_desired=2, prefill_starting=False))
    assert st.active == ActiveMode.DISAGGREGATED
    st = next_state(s, st, ModeSignals(time=660, prefill_ready=0, prefill_desired=2, prefill_starting=False))
    assert st.active == ActiveMode.AGGREGATED and "no ready prefill" in st.reason


def probe_spec(rate: int = 6, successes: int = 3, hold: int = 120) -> DisaggregatedModelSpec:
    return DisaggregatedModelSpec.model_validate({
        "model": {"name": "m"}, "slo": {"ttftP95Ms": 1000},
        "modePolicy": {"kvTransferFailureRate": 0.05, "healthyHoldSeconds": hold, "windowSeconds": 60,
                       "probe": {"ratePerMinute": rate, "maxShare": 0.05, "successesToReturn": successes}}})


def run_probes(s: DisaggregatedModelSpec, heal_at: float | None, until: float, interval: float = 30.0
               ) -> tuple[ModeState, float | None]:
    """Flip on a KV fault at t=0, then sample every interval. While the fault is on, the router's probes fail
    (each falls back: transport cause); after healing they succeed. Returns the final state and the return time."""
    st = next_state(s, ModeState(), broken(0))
    assert st.active == ActiveMode.AGGREGATED
    returned, t = None, interval
    while t <= until:
        healed = heal_at is not None and t >= heal_at
        if healed:
            sig = ModeSignals(time=t, kv_failure_rate=0.0, prefill_ready=2, prefill_desired=2,
                              probes_ok=3.0, probes_failed=0.0)
        else:  # only probes go remote while Aggregated: all of them fail
            sig = ModeSignals(time=t, kv_failure_rate=1.0, prefill_ready=2, prefill_desired=2,
                              probes_ok=0.0, probes_failed=3.0)
        st = next_state(s, st, sig)
        if returned is None and st.active == ActiveMode.DISAGGREGATED:
            returned = t
        t += interval
    return st, returned


def test_with_the_fault_on_the_mode_never_returns() -> None:
    st, returned = run_probes(probe_spec(), heal_at=None, until=24 * 3600)
    assert returned is None and st.active == ActiveMode.AGGREGATED


def test_failing_probes_alone_hold_the_return() -> None:
    """Even if the failure-rate signal is quiet (no data), the return needs successful probes."""
    s = probe_spec()
    st = next_state(s, ModeState(), broken(0))
    for t in range(30, 3600, 30):
        st = next_state(s, st, ModeSignals(time=t, prefill_ready=2, prefill_desired=2, probes_ok=0.0,
                                           probes_failed=2.0))
    assert st.active == ActiveMode.AGGREGATED and "0/3" in st.reason


def test_after_healing_it_returns_within_hold_plus_two_intervals() -> None:
    s, interval = probe_spec(hold=120), 30.0
    st, returned = run_probes(s, heal_at=600, until=3600, interval=interval)
    assert returned is not None and 600 <= returned <= 600 + 120 + 2 * interval
    assert st.active == ActiveMode.DISAGGREGATED and "3 successful probes" in st.reason


def test_probing_off_returns_on_the_hold_alone() -> None:
    s = probe_spec(rate=0)
    st = next_state(s, ModeState(), broken(0))
    st = next_state(s, st, healthy(30))
    st = next_state(s, st, healthy(150))  # no probe data at all
    assert st.active == ActiveMode.DISAGGREGATED


def test_a_prefill_restart_within_the_window_does_not_flip() -> None:
    """The soak's finding: a prefill pod that restarts in a few seconds (the router keeps requests local meanwhile)
    must not flip the model; a prefill pool without a ready replica for a whole window does."""
    s, st = spec(), ModeState()  # windowSeconds 60 (the default)
    out = ModeSignals(time=0, kv_failure_rate=0.0, prefill_ready=0, prefill_desired=1)
    st = next_state(s, st, healthy(0))
    for t in (5, 10, 30, 59):
        st = next_state(s, st, ModeSignals(**{**out.__dict__, "time": t}))
        assert st.active == ActiveMode.DISAGGREGATED, t
    st = next_state(s, st, healthy(62))  # back within the window: the outage is forgotten
    assert st.active == ActiveMode.DISAGGREGATED and st.prefill_down_since is None
    for t in (70, 100):
        st = next_state(s, st, ModeSignals(**{**out.__dict__, "time": t}))
        assert st.active == ActiveMode.DISAGGREGATED
    st = next_state(s, st, ModeSignals(**{**out.__dict__, "time": 130}))  # 60 s without a ready prefill replica
    assert st.active == ActiveMode.AGGREGATED and "no ready prefill replica for 60s" in st.reason

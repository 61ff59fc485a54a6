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
                       kv_transfer_p95_ms=50)


def broken(t: float) -> ModeSignals:
    return ModeSignals(time=t, kv_failure_rate=0.3, prefill_ready=2, prefill_desired=2)


def test_reasons() -> None:
    s = spec()
    assert unhealthy_reason(s, healthy(0)) is None
    assert "failure rate" in unhealthy_reason(s, broken(0))
    assert "no ready prefill" in unhealthy_reason(s, ModeSignals(time=0, prefill_ready=0, prefill_desired=1))
    assert "KV transfer" in unhealthy_reason(s, ModeSignals(time=0, prefill_ready=1, prefill_desired=1,
                                                            ttft_p95_ms=2000, kv_transfer_p95_ms=1200))
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

"""Scaling policy tables: load steps, Prometheus gaps, stabilisation, budget, ratio bounds."""

from __future__ import annotations

import pytest

from disagg.api.models import DisaggregatedModelSpec
from disagg.autoscaling.policy import History, PoolSignals, Signals, decide


def make_spec(**autoscaling) -> DisaggregatedModelSpec:
    base = {"enabled": True, "prometheus": {"url": "http://p:9090"}, "scaleDownStabilizationSeconds": 300,
            "maxStep": 2}
    base.update(autoscaling)
    return DisaggregatedModelSpec.model_validate({
        "model": {"name": "m"},
        "prefill": {"replicas": 2, "minReplicas": 1, "maxReplicas": 10},
        "decode": {"replicas": 2, "minReplicas": 1, "maxReplicas": 10, "maxNumSeqs": 100},
        "slo": {"ttftP95Ms": 1000, "tpotP95Ms": 50},
        "routing": {"remotePrefill": {"maxPrefillQueueWaitMs": 300}},
        "autoscaling": base,
    })


def sig(t: float, p: int = 2, d: int = 2, *, qwait=None, ttft=None, tpot=None, running=None, kv=None, waiting=None,
        deflected=None, stale=None) -> Signals:
    return Signals(time=t, stale_reason=stale,
                   prefill=PoolSignals(p, p, queue_wait_p95_ms=qwait, ttft_p95_ms=ttft, waiting_per_replica=waiting,
                                       deflected_share=deflected),
                   decode=PoolSignals(d, d, tpot_p95_ms=tpot, running_per_replica=running, kv_cache_usage=kv))


@pytest.mark.parametrize(
    "signals,want_p,want_d,why",
    [
        # healthy: everything near target → no change
        (dict(qwait=240, ttft=800, tpot=40, running=80, kv=0.85), 2, 2, "at target"),
        # long-prompt step: prefill queue 3× its budget → prefill up (by maxStep), decode unchanged
        (dict(qwait=720, ttft=900, tpot=40, running=80), 4, 2, "queue"),
        # long-output step: decode batch full and TPOT high → decode up, prefill unchanged
        (dict(qwait=240, ttft=800, tpot=60, running=100), 2, 3, "TPOT"),  # 60/(0.8·50) = 1.5 → ceil(2·1.5)
        # both saturated: the decode batch is full (running 400 of 0.8 × 256) as well as the prefill queue
        (dict(qwait=900, tpot=80, running=400), 4, 4, "both"),
        # a long-prompt step whose TPOT rises too: the prefill pool grows this interval, and its queue, released,
        # is what the decode workers' TPOT feels; decode's own capacity signals (batch, KV) are calm: decode waits
        (dict(qwait=900, tpot=80, running=80), 4, 2, "prefill growing, TPOT up"),
        # long prompts absorbed by the SLO placement: the prefill queue looks fine, a third of the pool's demand
        # went whole to decode workers → prefill up by 1 / (1 − 1/3) = 1.5
        (dict(qwait=100, ttft=500, tpot=40, running=80, deflected=1 / 3), 3, 2, "deflected"),
        # a few deflections (5 %) are within the tolerance
        (dict(qwait=100, ttft=500, tpot=40, running=80, deflected=0.05), 2, 2, "few deflected"),
        # every request deflected: bounded pressure (4) then the step limit (maxStep 2)
        (dict(deflected=1.0), 4, 2, "all deflected"),
        # the deflected prefills raise the decode workers' TPOT: that is the prefill pool's shortage, not decode's
        (dict(qwait=100, ttft=500, tpot=60, running=40, deflected=1 / 3), 3, 2, "deflected, TPOT up"),
        # … but a decode batch that is full still grows decode
        (dict(tpot=60, running=100, deflected=1 / 3), 3, 3, "deflected, batch full"),
        # a few deflections leave TPOT a decode signal
        (dict(tpot=60, running=40, deflected=0.05), 2, 3, "few deflected, TPOT up"),
    ],
)
def test_load_steps(signals, want_p, want_d, why) -> None:
    out = decide(make_spec(), sig(0, **signals), History())
    assert (out["prefill"].desired, out["decode"].desired) == (want_p, want_d), why


def test_prometheus_gap_holds_every_pool() -> None:
    out = decide(make_spec(), sig(0, qwait=5000, stale="Prometheus unreachable"), History())
    assert all(d.desired == d.current and "holding" in d.reason for d in out.values())


def test_pool_without_data_holds() -> None:
    out = decide(make_spec(), sig(0, qwait=900), History())
    assert out["decode"].desired == 2 and "no data" in out["decode"].reason
    assert out["prefill"].desired == 4


def test_scale_down_waits_for_stabilisation_window() -> None:
    spec, h = make_spec(), History()
    decide(spec, sig(0, p=6, qwait=240), h)  # at target: proposal 6
    low = decide(spec, sig(60, p=6, qwait=40), h)  # quiet: would propose 1, but 6 was proposed within 300 s
    assert low["prefill"].desired == 6
    later = decide(spec, sig(400, p=6, qwait=40), h)  # window passed: down, by at most maxStep
    assert later["prefill"].desired == 4 and "maxStep" in later["prefill"].reason


def test_a_prometheus_gap_restarts_the_scale_down_watch() -> None:
    # quiet for a whole window, then Prometheus away for a tick: the first sample after it would shrink on the
    # window's proposals from before the gap, which say nothing about the load while it lasted
    spec, h = make_spec(scaleDownStabilizationSeconds=60), History()
    decide(spec, sig(0, p=6, qwait=240), h)
    assert decide(spec, sig(30, p=6, qwait=40), h)["prefill"].desired == 6  # within the window of the 6
    decide(spec, sig(90, p=6, stale="Prometheus unreachable"), h)
    after = decide(spec, sig(100, p=6, qwait=40), h)
    assert after["prefill"].desired == 6  # the watch restarted at 100
    assert decide(spec, sig(155, p=6, qwait=40), h)["prefill"].desired == 6
    assert decide(spec, sig(160, p=6, qwait=40), h)["prefill"].desired == 4  # a whole window watched since
    # without the gap the same samples shrink at 100 (the test can fail)
    h2 = History()
    for t, q in ((0, 240), (30, 40)):
        decide(spec, sig(t, p=6, qwait=q), h2)
    assert decide(spec, sig(100, p=6, qwait=40), h2)["prefill"].desired == 4


def test_a_pool_that_deflects_nothing_still_shrinks() -> None:
    # remote traffic and no deflection: a share of 0, which is no pressure to hold the pool (a term of 1 would sit
    # inside the tolerance and keep a quiet prefill pool at its peak size all night)
    spec, h = make_spec(), History()
    decide(spec, sig(0, p=6, qwait=40, deflected=0.0), h)
    out = decide(spec, sig(400, p=6, qwait=40, deflected=0.0), h)
    assert out["prefill"].desired == 4 and "prefill queue wait" in out["prefill"].reason


def test_scale_up_is_immediate_and_capped_by_max_step_and_max_replicas() -> None:
    spec = make_spec(maxStep=5)
    out = decide(spec, sig(0, p=8, qwait=2400), History())  # pressure 10x → 80, step 5, max 10
    assert out["prefill"].desired == 10 and "clamped" in out["prefill"].reason


def test_gpu_budget_takes_growth_from_the_less_pressured_pool() -> None:
    spec = make_spec(gpuBudget=6, prefillDecodeRatio={"min": 0.1, "max": 10})
    out = decide(spec, sig(0, qwait=960, tpot=48, running=230), History())  # prefill 4x, decode's batch ~1.1x
    assert out["prefill"].desired + out["decode"].desired <= 6
    assert out["prefill"].desired == 4  # the more pressured pool keeps its growth
    assert "gpuBudget" in out["decode"].reason


def test_gpu_budget_exhausted_holds_at_current() -> None:
    spec = make_spec(gpuBudget=4)
    out = decide(spec, sig(0, qwait=2000, tpot=200), History())
    assert out["prefill"].desired == 2 and out["decode"].desired == 2


def test_ratio_bounds_raise_the_lagging_pool() -> None:
    spec = make_spec(prefillDecodeRatio={"min": 0.5, "max": 1.5}, maxStep=10)
    out = decide(spec, sig(0, p=2, d=2, qwait=1920), History())  # prefill wants 16 → 10 (max)
    assert out["prefill"].desired == 10
    assert out["decode"].desired == 7 and "prefill:decode" in out["decode"].reason


def test_oscillating_load_does_not_flap_down() -> None:
    spec, h = make_spec(), History()
    replicas, changes = 4, 0
    for i in range(40):  # every 30 s the queue alternates between high and low
        qwait = 500 if i % 2 == 0 else 50
        d = decide(spec, sig(i * 30, p=replicas, qwait=qwait), h)["prefill"]
        if d.desired != replicas:
            changes += 1
            replicas = d.desired
    assert changes <= 3, f"{changes} changes"

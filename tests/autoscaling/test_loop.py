"""The loop's pure step: sample → decisions, mode and status figures."""

from __future__ import annotations

import math

from disagg.api.models import ActiveMode, DisaggregatedModelSpec
from disagg.autoscaling.loop import LoopState, PoolReplicas, step
from disagg.autoscaling.queries import Sample


def spec(**extra) -> DisaggregatedModelSpec:
    return DisaggregatedModelSpec.model_validate({
        "model": {"name": "m"}, "slo": {"ttftP95Ms": 1000, "tpotP95Ms": 50},
        "autoscaling": {"enabled": True, "prometheus": {"url": "http://p:9090"}}, **extra})


POOLS = {"prefill": PoolReplicas(2, 2), "decode": PoolReplicas(2, 2)}


def test_long_prompts_scale_prefill_and_report_figures() -> None:
    sample = Sample({"prefill_queue_wait_p95": 0.9, "ttft_p95": 1.5, "remote_ttft_p95": 1.5, "tpot_p95": 0.03,
                     "goodput": 0.6,
                     "decode_running_per_replica": 10, "targets_up": 5})
    out = step(spec(), POOLS, sample, LoopState(), 0, "2026-11-29T00:00:00Z")
    assert out.decisions["prefill"].desired > 2 and out.decisions["decode"].desired == 2
    assert out.observed.ttft_p95_ms == 1500 and out.observed.goodput == 0.6
    status, _, message = out.slo_met
    assert status == "False" and "TTFT p95 1500 ms > 1000 ms" in message and "goodput" in message


def test_metrics_gap_holds_and_says_why() -> None:
    out = step(spec(), POOLS, Sample({}, error="Prometheus query ttft_p95 failed: ConnectionError"), LoopState(),
               0, "t")
    assert all(not d.changed for d in out.decisions.values())
    assert out.slo_met[0] == "Unknown" and "ConnectionError" in out.slo_met[2]
    assert out.mode.active == ActiveMode.DISAGGREGATED and not out.mode_changed


def test_kv_failures_flip_mode_then_pin_overrides() -> None:
    state = LoopState()
    bad = Sample({"kv_failure_rate": 0.5, "targets_up": 5})
    out = step(spec(), POOLS, bad, state, 0, "t")
    assert out.mode.active == ActiveMode.AGGREGATED and out.mode_changed
    pinned = step(spec(mode="Disaggregated"), POOLS, bad, state, 10, "t")
    assert pinned.mode.active == ActiveMode.DISAGGREGATED and "pinned" in pinned.mode.reason


def test_autoscaling_disabled_still_observes() -> None:
    s = DisaggregatedModelSpec.model_validate({"model": {"name": "m"}})
    out = step(s, POOLS, Sample({"ttft_p95": 0.2, "tpot_p95": 0.01, "targets_up": 1}), LoopState(), 0, "t")
    assert out.decisions == {} and out.slo_met[0] == "True"


def test_slow_local_first_tokens_do_not_grow_prefill() -> None:
    """A long-output step queues local requests on decode: TTFT rises overall, but it is decode's to fix."""
    sample = Sample({"ttft_p95": 6.0, "remote_ttft_p95": 0.4, "prefill_queue_wait_p95": 0.01,
                     "decode_running_per_replica": 250, "tpot_p95": 0.03, "targets_up": 5})
    out = step(spec(), POOLS, sample, LoopState(), 0, "t")
    assert out.decisions["prefill"].desired == 2
    assert out.decisions["decode"].desired > 2


def test_probe_counts_reach_status_and_the_mode() -> None:
    state = LoopState()
    s = spec(modePolicy={"healthyHoldSeconds": 0, "probe": {"ratePerMinute": 6, "successesToReturn": 3}})
    step(s, POOLS, Sample({"kv_failure_rate": 0.5, "targets_up": 5}), state, 0, "t")
    held = step(s, POOLS, Sample({"mode_probes_ok": 1.0, "mode_probes_failed": 4.0, "targets_up": 5}), state, 30, "t")
    assert held.mode.active == ActiveMode.AGGREGATED
    assert (held.observed.mode_probes_succeeded, held.observed.mode_probes_failed) == (1.0, 4.0)
    back = step(s, POOLS, Sample({"mode_probes_ok": 3.0, "mode_probes_failed": 0.0, "targets_up": 5}), state, 60,
                "t")
    assert back.mode.active == ActiveMode.DISAGGREGATED and back.mode_changed


def test_starting_prefill_pool_does_not_flip() -> None:
    pools = {"prefill": PoolReplicas(2, 0, starting=True), "decode": PoolReplicas(2, 2)}
    out = step(spec(), pools, Sample({"targets_up": 1}), LoopState(), 0, "t")
    assert out.mode.active == ActiveMode.DISAGGREGATED and not out.mode_changed
    failed = {"prefill": PoolReplicas(2, 0, starting=False), "decode": PoolReplicas(2, 2)}
    state = LoopState()
    out = step(spec(), failed, Sample({"targets_up": 1}), state, 0, "t")
    assert out.mode.active == ActiveMode.DISAGGREGATED  # a restart may bring it back within the window
    window = spec().mode_policy.window_seconds
    out = step(spec(), failed, Sample({"targets_up": 1}), state, window, "t")
    assert out.mode.active == ActiveMode.AGGREGATED and "no ready prefill" in out.mode.reason


def test_a_failed_sample_has_no_figures_and_says_why() -> None:
    """Issue 13: status never goes stale silently. A sample Prometheus could not give yields no figure (not a
    partial one), no measurement time, MetricsAvailable False with the error, and an unmeasured KV transfer."""
    from disagg.autoscaling.queries import PROMETHEUS_UNAVAILABLE

    partial = Sample({"ttft_p95": 0.5, "targets_up": 3}, error="Prometheus query tpot_p95 failed: ConnectionError",
                     reason=PROMETHEUS_UNAVAILABLE)
    out = step(spec(), POOLS, partial, LoopState(), 0, "2026-11-29T00:00:00Z")
    assert all(v is None for v in out.observed.model_dump().values())
    assert out.metrics[:2] == ("False", "PrometheusUnavailable") and "ConnectionError" in out.metrics[2]
    assert out.kv_transfer[:2] == ("Unknown", "MetricsUnavailable")
    good = step(spec(), POOLS, Sample({"ttft_p95": 0.5, "targets_up": 3}), LoopState(), 0, "2026-11-29T00:00:30Z")
    assert good.observed.ttft_p95_ms == 500 and good.observed.time == "2026-11-29T00:00:30Z"
    assert good.metrics[0] == "True" and good.observed.tpot_p95_ms is None  # no data: unknown, not the old value


def test_kv_transfer_health_is_measured() -> None:
    limit = spec().mode_policy.kv_transfer_failure_rate
    failing = step(spec(), POOLS, Sample({"kv_failure_rate": limit * 2, "kv_transfer_p95": 0.2, "targets_up": 3}),
                   LoopState(), 0, "t")
    assert failing.kv_transfer[:2] == ("False", "TransferFailures")
    assert "kvTransferFailureRate" in failing.kv_transfer[2]
    healthy = step(spec(), POOLS, Sample({"kv_failure_rate": 0.0, "kv_transfer_p95": 0.05, "targets_up": 3}),
                   LoopState(), 0, "t")
    assert healthy.kv_transfer[:2] == ("True", "TransfersSucceeding") and "50 ms" in healthy.kv_transfer[2]
    idle = step(spec(), POOLS, Sample({"targets_up": 3}), LoopState(), 0, "t")
    assert idle.kv_transfer[:2] == ("Unknown", "NoRemoteTraffic")


class _Sizer:
    """Stand-in sizing: one replica per 2 req/s of each pool's traffic at the headroom."""

    def size(self, load, headroom, ttft_corr, tpot_corr):  # noqa: ARG002
        from disagg.autoscaling.predictive import Need

        return Need(max(1, -(-load.remote_rps // (2 * headroom))), max(1, -(-load.rps // (2 * headroom))))

    def expected(self, load, prefill, decode):  # noqa: ARG002
        from disagg.autoscaling.predictive import Expected

        return Expected(None, None)

    def per_replica(self, load, ttft_corr, tpot_corr):  # noqa: ARG002
        return 2.0, 2.0


def _load_sample(remote: float, local: float) -> Sample:
    """A predictive sample: ``remote`` and ``local`` requests in a 30-s interval (spec's intervalSeconds)."""
    inc = {"routed:prefill_sum": remote * 8000, "routed:prefill_count": remote, "routed:decode_sum": local * 400,
           "routed:decode_count": local, "decode:vllm:nixl_xfer_time_seconds_count": remote}
    return Sample({"targets_up": 5, **{f"increase:{k}": v for k, v in inc.items()}})


def _predictive_state(s: DisaggregatedModelSpec) -> LoopState:
    from disagg.autoscaling.predictive import PredictivePolicy, PredictiveSettings

    return LoopState(predictive=PredictivePolicy(_Sizer(), PredictiveSettings.from_spec(s, 60.0)))


def test_the_predictive_policy_sizes_from_the_samples_increments() -> None:
    s = spec(prefill={"replicas": 1, "maxReplicas": 10}, decode={"replicas": 1, "maxReplicas": 10},
             autoscaling={"enabled": True, "prometheus": {"url": "http://p:9090"}, "policy": "Predictive",
                          "maxStep": 10})
    state = _predictive_state(s)
    pools = {"prefill": PoolReplicas(1, 1), "decode": PoolReplicas(1, 1)}
    out = step(s, pools, _load_sample(90, 210), state, 0, "t")  # 3 remote + 7 local req/s
    assert state.predictive is not None
    per = 2 * state.predictive.s.headroom  # the stand-in's req/s per replica at the policy's headroom
    assert (out.decisions["prefill"].desired, out.decisions["decode"].desired) == (math.ceil(3 / per),
                                                                                   math.ceil(10 / per))
    assert out.decisions["prefill"].reason.startswith("up: model needs 2")
    assert state.last_load is not None and state.last_load.remote_rps == 3.0


def test_the_predictive_policy_keeps_the_specs_shared_bounds() -> None:
    s = spec(prefill={"replicas": 1, "maxReplicas": 10, "gpu": {"count": 1}},
             decode={"replicas": 1, "maxReplicas": 10, "gpu": {"count": 1}},
             autoscaling={"enabled": True, "prometheus": {"url": "http://p:9090"}, "policy": "Predictive",
                          "maxStep": 10, "gpuBudget": 6})
    out = step(s, {"prefill": PoolReplicas(1, 1), "decode": PoolReplicas(1, 1)}, _load_sample(90, 210),
               _predictive_state(s), 0, "t")
    assert out.decisions["prefill"].desired + out.decisions["decode"].desired == 6
    assert any("gpuBudget 6" in d.reason for d in out.decisions.values())


def test_a_failed_sample_holds_the_predictive_policy() -> None:
    s = spec(autoscaling={"enabled": True, "prometheus": {"url": "http://p:9090"}, "policy": "Predictive"})
    out = step(s, POOLS, Sample({}, error="Prometheus query arrivals failed"), _predictive_state(s), 0, "t")
    assert all(not d.changed and "holding" in d.reason for d in out.decisions.values())


def test_proportional_decisions_say_why_the_predictive_policy_is_not_running() -> None:
    state = LoopState(predictive_unavailable="Predictive unavailable: spec.model.name 'm' matches no model")
    sample = Sample({"prefill_queue_wait_p95": 0.9, "remote_ttft_p95": 1.5, "targets_up": 5})
    out = step(spec(), POOLS, sample, state, 0, "t")
    assert all("(proportional: Predictive unavailable: spec.model.name" in d.reason for d in out.decisions.values())


def test_the_step_carries_the_predictive_policys_role_moves() -> None:
    s = spec(prefill={"replicas": 4, "maxReplicas": 10}, decode={"replicas": 2, "maxReplicas": 10},
             autoscaling={"enabled": True, "prometheus": {"url": "http://p:9090"}, "policy": "Predictive",
                          "maxStep": 10})
    pools = {"prefill": PoolReplicas(4, 4), "decode": PoolReplicas(2, 2)}
    out = step(s, pools, _load_sample(30, 90), _predictive_state(s), 0, "t")  # 1 remote + 3 local req/s
    assert out.role_moves is not None and out.role_moves.prefill_to_decode == 1  # decode needs 3, prefill 1 of 4
    assert step(spec(), POOLS, _load_sample(30, 90), LoopState(), 0, "t").role_moves is None  # proportional: none


def test_no_role_moves_while_the_model_serves_aggregated() -> None:
    s = spec(mode="Aggregated", prefill={"replicas": 4, "maxReplicas": 10}, decode={"replicas": 2, "maxReplicas": 10},
             autoscaling={"enabled": True, "prometheus": {"url": "http://p:9090"}, "policy": "Predictive",
                          "maxStep": 10})
    pools = {"prefill": PoolReplicas(4, 4), "decode": PoolReplicas(2, 2)}
    out = step(s, pools, _load_sample(30, 90), _predictive_state(s), 0, "t", current_mode=ActiveMode.AGGREGATED)
    assert out.mode.active == ActiveMode.AGGREGATED and out.role_moves is not None and not out.role_moves.lent

"""The twin connector (twin/autoscaler.py) under the pure policy tests' scenarios, in virtual time: a long-prompt
step grows prefill, a long-output step grows decode, an idle pool shrinks only after the stabilisation window, a
pool without a ready decode worker holds; and its mechanics: pod start, least-loaded removal, drain."""

from __future__ import annotations

import logging

import pytest

from disagg.api.models import DisaggregatedModelSpec
from disagg.autoscaling.policy import Decision
from disagg.autoscaling.predictive import Observation
from disagg.twin import SLO, Arrival, ClusterSpec, PoolSpec, simulate
from disagg.twin.autoscaler import TwinAutoscaler, pod_start_s, proportional

ROUTING = {"policy": "Thresholds",
           "remotePrefill": {"minInputTokens": 2048, "maxPrefillQueueWaitMs": 2000, "minExpectedOutputTokens": 16},
           "localPrefill": {"maxInputTokens": 1024}, "fallback": {"onPrefillQueueOverload": "Queue"}}


@pytest.fixture(autouse=True)
def _quiet(caplog):
    caplog.set_level(logging.ERROR)


def make_spec(window: int = 60) -> DisaggregatedModelSpec:
    return DisaggregatedModelSpec.model_validate({
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "prefill": {"replicas": 1, "minReplicas": 1, "maxReplicas": 6},
        "decode": {"replicas": 1, "minReplicas": 1, "maxReplicas": 6},
        "slo": {"ttftP95Ms": 2000, "tpotP95Ms": 50},
        "routing": ROUTING,
        "autoscaling": {"enabled": True, "prometheus": {"url": "http://twin"}, "intervalSeconds": 10,
                        "scaleDownStabilizationSeconds": window, "maxStep": 2},
    })


def cluster(p: int, d: int) -> ClusterSpec:
    return ClusterSpec(prefill=PoolSpec(p, gpu="L40S"), decode=PoolSpec(d, gpu="L40S"),
                       router={"mode": "Disaggregated", "routing": ROUTING})


def steady(rate: float, duration: float, inp: int, out: int, t0: float = 0.0) -> list[Arrival]:
    n = int(rate * duration)
    return [Arrival(at=t0 + i / rate, input_tokens=inp, output_tokens=out, request_id=f"r{t0}-{i}")
            for i in range(n)]


def run(spec, arrivals, p=1, d=1, start_s=5.0, until=None):
    ctl = TwinAutoscaler(proportional(spec), interval_s=10.0, start_s=start_s, until_s=until)
    r = simulate(cluster(p, d), arrivals, controller=ctl)
    return ctl, r


def peak(ctl, pool):
    return max(x["desired"][pool] for x in ctl.samples)


def test_long_prompt_step_grows_prefill_not_decode() -> None:
    # 8k-token prompts (remote) with short answers at 2.5 req/s: the prefill queue grows on one L40S (at 3 req/s
    # the queue passes maxPrefillQueueWaitMs before the second and third prefill workers are up, and the prompts
    # the router then prefills on the decode worker make it a decode step too)
    ctl, r = run(make_spec(), steady(2.5, 90, 8000, 32), until=90)
    assert peak(ctl, "prefill") >= 3
    assert peak(ctl, "decode") <= 2
    assert all(x.status == 200 for x in r.records)


def test_the_connector_sees_the_remote_ttft() -> None:
    # the prefill pool's TTFT histogram is recorded by the twin's engines (cluster.SCRAPED): without it the
    # observation had no remote TTFT, the proportional policy lost its TTFT term (an over-provisioned prefill pool
    # then read as "queue wait 0 %" and shrank towards zero) and the predictive policy its TTFT correction
    seen: list[tuple[float | None, float | None]] = []

    def policy(obs: Observation, signals) -> dict[str, Decision]:
        seen.append((obs.remote_ttft_s, signals.prefill.ttft_p95_ms))
        return {}

    ctl = TwinAutoscaler(policy, interval_s=10.0, start_s=5.0, until_s=40.0)
    simulate(cluster(2, 1), steady(1.0, 40, 4000, 16), controller=ctl)
    assert len(seen) >= 3
    for ttft_s, p95_ms in seen[1:]:
        assert ttft_s is not None and p95_ms is not None
        # a 4k-token prompt on an idle L40S: its prefill alone is a few hundred ms, queue-free
        assert 0.1 < ttft_s < 2.0 and p95_ms >= ttft_s * 1000


def test_long_output_step_grows_decode_not_prefill() -> None:
    # short prompts (local) with long streams: the decode batch and its TPOT grow, no prefill demand (5 req/s for
    # 150 s: the 1,500-token streams fill the batch for a minute before TPOT passes its target; at 6 req/s one L40S
    # decode worker runs out of KV cache first, and its backlog shows in the prefill pool's gauges too)
    ctl, _ = run(make_spec(), steady(5.0, 150, 300, 1500), until=150)
    assert peak(ctl, "decode") >= 2
    assert peak(ctl, "prefill") == 1


def test_idle_pools_shrink_only_after_the_stabilisation_window() -> None:
    ctl, r = run(make_spec(window=60), steady(0.2, 150, 300, 50), p=3, d=3, until=150)
    downs = [e for e in ctl.timeline if e.after < e.before]
    assert downs, "an idle 3P + 3D never shrank"
    assert min(e.t for e in downs) >= 60  # not before a whole window was watched
    assert all(x.status == 200 for x in r.records)


def test_no_ready_decode_worker_holds() -> None:
    ctl = TwinAutoscaler(proportional(make_spec()), interval_s=10.0)

    from types import SimpleNamespace

    from disagg.router.metrics import RouterMetrics

    class Empty:
        def __init__(self):
            self.workers, self.now, self.core = {}, 10.0, SimpleNamespace(metrics=RouterMetrics())

        def pool(self, _role):
            return []

    obs, signals = ctl.observe(Empty())  # type: ignore[arg-type]
    assert obs.stale_reason == "no ready decode worker" and signals.stale_reason == obs.stale_reason


def test_pod_start_is_modelled_and_counted_in_gpu_seconds() -> None:
    assert pod_start_s("Llama-3.1-8B") == pytest.approx(45.0 + 16.06e9 / 2e9, rel=0.01)
    assert pod_start_s("Llama-3.1-8B", compile_cache=True) == pytest.approx(8.0 + 16.06e9 / 2e9, rel=0.01)
    grow = {"n": 0}

    def policy(obs: Observation, _signals) -> dict[str, Decision]:
        grow["n"] += 1
        want = 3 if grow["n"] == 1 else obs.decode_replicas
        return {"decode": Decision("decode", obs.decode_replicas, want, None, "test")}

    ctl = TwinAutoscaler(policy, interval_s=10.0, start_s=30.0, until_s=60.0)
    simulate(cluster(1, 1), steady(0.5, 80, 300, 20), controller=ctl)
    ready = {x["t"]: x["ready"]["decode"] for x in ctl.samples}
    assert ready[20.0] == 1 and ready[30.0] == 1  # decided at 10 s, still starting until 40 s
    assert ready[50.0] == 3
    c = ctl.cluster
    assert c is not None
    assert sorted(w.started_at for w in c.pool("decode")) == [0.0, 40.0, 40.0]  # in service 30 s after the decision
    assert ctl.starting_gpu_s == pytest.approx(2 * 30.0)


def test_scale_down_removes_the_least_loaded_worker_and_drains_it() -> None:
    calls = {"n": 0}

    def policy(obs: Observation, _signals) -> dict[str, Decision]:
        calls["n"] += 1
        want = 2 if calls["n"] == 3 else obs.decode_replicas
        return {"decode": Decision("decode", obs.decode_replicas, want, None, "test")}

    ctl = TwinAutoscaler(policy, interval_s=10.0, until_s=60.0)
    # long streams on 3 decode workers; at 30 s one is removed while requests run on every worker
    arrivals = steady(2.0, 60, 300, 800)
    _, r = ctl, simulate(cluster(1, 3), arrivals, controller=ctl)
    assert [(e.before, e.after) for e in ctl.timeline] == [(3, 2)]
    c = ctl.cluster
    assert c is not None and len(c.retired) == 1
    gone = c.retired[0]
    assert gone.stopped_at is not None and gone.stopped_at > 30.0  # it drained: its requests ran to the end
    assert all(x.status == 200 and x.output_tokens == 800 for x in r.records)  # nothing dropped
    served = [x for x in r.records if x.decode_worker == gone.url]
    assert served and max(x.arrival_s for x in served) < 30.0  # no request sent to it after the decision


def test_predictive_policy_through_the_connector_sizes_a_long_prompt_step_with_the_model() -> None:
    from disagg.autoscaling.forecast import Load
    from disagg.autoscaling.predictive import PredictivePolicy, PredictiveSettings
    from disagg.perf.presets import get_gpu, get_model, get_transport
    from disagg.plan.sizing import ModelSizer
    from disagg.twin.autoscaler import of

    sizer = ModelSizer(get_gpu("L40S"), get_model("Llama-3.1-8B"), get_transport("rdma"), 2.0, 0.05)
    pol = PredictivePolicy(sizer, PredictiveSettings(interval_s=10.0, pod_start_s=10.0, max_step=4,
                                                     scale_down_stabilization_s=60.0))
    ctl = TwinAutoscaler(of(pol), interval_s=10.0, start_s=10.0, until_s=90.0)
    r = simulate(cluster(1, 1), steady(2.0, 90, 8000, 64), controller=ctl, slo=SLO(ttft_ms=2000, tpot_ms=50))
    # the model's own answer for this load (2 remote req/s of 8k tokens), which the policy must reach
    need = sizer.size(Load(2.0, 0.0, 8000, 1, 64), 0.8, 1.0, 1.0)
    assert need.prefill >= 2
    assert peak(ctl, "prefill") >= need.prefill
    assert peak(ctl, "decode") <= need.decode + 1  # no decode demand beyond the model's
    assert any("forecast" in e.reason for e in ctl.timeline)
    assert sum(x.meets(r.slo) for x in r.records if x.arrival_s >= 45) / max(
        1, sum(1 for x in r.records if x.arrival_s >= 45)) >= 0.9  # held once the pods are in


def test_prompts_the_ladder_spills_onto_decode_stay_prefill_demand() -> None:
    # one prefill worker for 2 req/s of 8k-token prompts: its queue passes maxPrefillQueueWaitMs and the ladder
    # prefills the overflow on the decode worker (onPrefillQueueOverload: LocalPrefill). The load the connector
    # reads is demand per role at the router: every long prompt stays prefill demand, the local mean prompt stays
    # the short ones' (a decode pool sized on the spill would grow for the prefill pool's shortage)
    routing = {**ROUTING, "fallback": {"onPrefillQueueOverload": "LocalPrefill"}}
    spec = ClusterSpec(prefill=PoolSpec(1, gpu="L40S"), decode=PoolSpec(2, gpu="L40S"),
                       router={"mode": "Disaggregated", "routing": routing})
    long = steady(2.0, 60, 8000, 32)
    short = [Arrival(at=a.at + 0.25, input_tokens=300, output_tokens=32, request_id=f"s{i}")
             for i, a in enumerate(long)]
    ctl = TwinAutoscaler(lambda *_: {}, interval_s=10.0, start_s=5.0, until_s=60.0)  # holds: it only observes
    r = simulate(spec, sorted(long + short, key=lambda a: a.at), controller=ctl)
    assert any(x.reason == "prefill_queue_overload" for x in r.records)  # it spilled
    loads = [x["load"] for x in ctl.samples if x["load"] is not None]
    assert len(loads) >= 5
    for load in loads:
        assert load.remote_rps == pytest.approx(2.0, abs=0.15) and load.remote_in == pytest.approx(8000, rel=0.01)
        assert load.local_rps == pytest.approx(2.0, abs=0.15) and load.local_in == pytest.approx(300, rel=0.01)


# ------------------------------------------------------------------------------------------ role moves (issue 28)


def _lend_at_start(moves):
    from disagg.api.status import RoleMoves

    async def controller(c) -> None:
        c.move_roles(RoleMoves(**moves))

    return controller


@pytest.mark.parametrize("moves", [{"prefill_to_decode": 1}, {"decode_to_prefill": 1}])
def test_a_lent_worker_takes_the_other_roles_legs(moves) -> None:
    # every request prefills remotely; one worker of a 2P + 2D fleet is lent to the other role at once
    spec = ClusterSpec(prefill=PoolSpec(2, gpu="L40S"), decode=PoolSpec(2, gpu="L40S"), router={
        "mode": "Disaggregated", "routing": {"buckets": [{"name": "all", "minInputTokens": 0, "prefill": "Remote"}]}})
    arrivals = steady(4.0, 20, 3000, 64)
    r = simulate(spec, arrivals, controller=_lend_at_start(moves))
    assert all(x.ok and x.path == "remote" for x in r.records), {x.fallback for x in r.records}
    legs = {(x.prefill_worker or "", x.decode_worker or "") for x in r.records}
    if "prefill_to_decode" in moves:  # a prefill-pool worker decodes what the other prefill worker prefilled
        assert any(d.startswith("prefill-") for _, d in legs)
        assert not any(p == d for p, d in legs)
    else:  # a decode-pool worker prefills, and another decode worker pulls its KV (it holds it for the pull)
        assert any(p.startswith("decode-") and d.startswith("decode-") for p, d in legs)


def test_the_connector_applies_the_policys_role_moves_and_records_them() -> None:
    from disagg.api.status import RoleMoves

    seen = iter([RoleMoves(prefill_to_decode=1, reason="decode short"), RoleMoves(prefill_to_decode=1), RoleMoves()])
    def hold(_obs: Observation, _signals) -> dict[str, Decision]:
        return {}

    ctl = TwinAutoscaler(hold, interval_s=10.0, start_s=5.0, until_s=30.0, roles=lambda: next(seen, RoleMoves()))
    # no elastic rule (an idle prefill worker would take whole short requests without a lend)
    spec = ClusterSpec(prefill=PoolSpec(2, gpu="L40S"), decode=PoolSpec(1, gpu="L40S"),
                       router={"mode": "Disaggregated", "routing": {**ROUTING, "elasticFleet": False}})
    r = simulate(spec, steady(2.0, 30, 400, 200), controller=ctl)
    assert all(x.ok for x in r.records)
    assert [(e.t, e.pool, e.before, e.after) for e in ctl.role_moves] == [
        (10.0, "prefill→decode", 0, 1), (30.0, "prefill→decode", 1, 0)]
    lent = [x for x in r.records if x.decode_worker and x.decode_worker.startswith("prefill-")]
    assert lent and all(10.0 <= x.arrival_s < 30.5 for x in lent)  # only while lent (decided at arrival)

"""The twin against its own parts: the perf model's physics, the router policy's decisions, determinism.

Every run here is in virtual time (disagg.twin.clock): no sockets, no sleeps, the same records whatever the
machine's load.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import pytest

from disagg.perf.presets import get_transport
from disagg.perf.roofline import SeqWork
from disagg.sim.engine import build_perf
from disagg.twin import SLO, Arrival, ClusterSpec, PoolSpec, TwinResult, arrivals_from_mix, simulate
from disagg.twin.clock import run_virtual
from disagg.twin.cluster import TwinCluster, _parse_sim

CONDITIONAL: dict[str, Any] = {"mode": "Disaggregated", "routing": {
    "remotePrefill": {"minInputTokens": 2048, "maxPrefillQueueWaitMs": 150, "minExpectedOutputTokens": 64,
                      "requireDecodePoolPressure": False},
    "localPrefill": {"maxInputTokens": 1024, "preferWhenPrefixCacheHit": True}}}


def perf_of(pool: PoolSpec) -> Any:
    return build_perf(_parse_sim(pool.argv("meta-llama/Llama-3.1-8B-Instruct"), "test"))


def one(spec: ClusterSpec, arrival: Arrival) -> TwinResult:
    r = simulate(spec, [arrival])
    assert r.records[0].ok, r.records[0]
    return r


def test_idle_local_prefill_ttft_and_batch1_tpot_are_the_perf_model() -> None:
    pool = PoolSpec(1)
    perf = perf_of(pool)
    n, out = 3000, 40
    rec = one(ClusterSpec(aggregated=pool, router={"mode": "Aggregated"}),
              Arrival(at=0.5, input_tokens=n, output_tokens=out)).records[0]
    assert rec.path == "local" and rec.reason == "mode_aggregated"
    # the API server's share (eff.request_overhead_s), then the prefill steps
    assert rec.ttft_s == pytest.approx(perf.request_overhead_s + perf.prefill_time(n), rel=0.01)
    # every later token is one batch-1 decode step at a context that grows from n to n + out - 2
    mean_step = sum(perf.decode_step_time(1, n + i) for i in range(out - 1)) / (out - 1)
    assert rec.tpot_s == pytest.approx(mean_step, rel=0.01)
    assert rec.tpot_s == pytest.approx(perf.decode_step_time(1, n + out // 2), rel=0.01)
    assert rec.output_tokens == out and rec.input_tokens == n


def test_idle_remote_ttft_is_prefill_plus_transfer_plus_one_step() -> None:
    pool = PoolSpec(1)
    perf = perf_of(pool)
    n = 6000
    spec = ClusterSpec(prefill=pool, decode=pool, router={"mode": "Disaggregated", "routing": {
        "buckets": [{"name": "all", "minInputTokens": 0, "prefill": "Remote"}]}})
    rec = one(spec, Arrival(at=0.0, input_tokens=n, output_tokens=8)).records[0]
    assert (rec.decision, rec.reason, rec.path) == ("remote", "bucket_remote", "remote")
    # each leg's API-server share (eff.request_overhead_s), prefill (samples its one token), the first pull from
    # that engine (handshake), the last prompt token again
    xfer = perf.transfer_time(n, get_transport("rdma"), remote_tp=1, first_contact=True)
    api = perf.request_overhead_s
    expect = api + perf.prefill_time(n) + api + xfer + perf.step([SeqWork(1, n - 1)]).total_s
    assert rec.kv_transfer_s == pytest.approx(xfer, rel=0.01)
    assert rec.prefill_leg_s == pytest.approx(api + perf.prefill_time(n), rel=0.01)
    assert rec.ttft_s == pytest.approx(expect, rel=0.01)


def test_pulls_that_start_during_the_handshake_wait_for_it_whatever_their_order() -> None:
    """Two prompts prefilled in one step reach the decode engine at the same simulated time: both pulls wait for the
    one NIXL handshake with that prefill engine (neither gets it free for having run second in the event loop), and
    a pull after it pays none (sim/engine.py ``_handshake_wait``)."""
    pool = PoolSpec(1)
    perf = perf_of(pool)
    n = 3000
    spec = ClusterSpec(prefill=pool, decode=pool, router={"mode": "Disaggregated", "routing": {
        "buckets": [{"name": "all", "minInputTokens": 0, "prefill": "Remote"}]}})
    recs = sorted(simulate(spec, [Arrival(at=0.0, input_tokens=n, output_tokens=8),
                                  Arrival(at=0.0, input_tokens=n, output_tokens=8),
                                  Arrival(at=2.0, input_tokens=n, output_tokens=8)]).records,
                  key=lambda r: r.arrival_s)
    assert [r.path for r in recs] == ["remote"] * 3
    rdma = get_transport("rdma")
    with_handshake = perf.transfer_time(n, rdma, remote_tp=1, first_contact=True)
    assert recs[0].kv_transfer_s == recs[1].kv_transfer_s == pytest.approx(with_handshake, rel=0.01)
    assert recs[2].kv_transfer_s == pytest.approx(perf.transfer_time(n, rdma, remote_tp=1), rel=0.01)


def test_a_threshold_change_flips_the_decisions() -> None:
    arrivals = [Arrival(at=i * 2.0, input_tokens=3000, output_tokens=100) for i in range(4)]
    base = ClusterSpec(prefill=PoolSpec(1), decode=PoolSpec(1), router=CONDITIONAL)
    low = simulate(base, arrivals)
    assert low.decisions == {"remote:policy": 4}
    assert {r.path for r in low.records} == {"remote"}
    high_cfg = {**CONDITIONAL, "routing": {**CONDITIONAL["routing"],
                                          "remotePrefill": {"minInputTokens": 4096}}}
    high = simulate(dataclasses.replace(base, router=high_cfg), arrivals)
    assert high.decisions == {"local:below_remote_threshold": 4}
    assert {r.path for r in high.records} == {"local"}
    # expected output below minExpectedOutputTokens: the same prompts stay local for another reason
    short = [dataclasses.replace(a, output_tokens=10) for a in arrivals]
    assert simulate(base, short).decisions == {"local:short_output": 4}


def test_tenants_canary_and_rejects_use_the_router_config() -> None:
    cfg = {**CONDITIONAL, "routing": {**CONDITIONAL["routing"], "tenants": [
        {"name": "rag", "match": {"header": "x-tenant-id", "values": ["rag"]}, "disaggregation": "Always"},
        {"name": "chat", "match": {"header": "x-tenant-id", "values": ["chat"]}, "disaggregation": "Never"}]}}
    arrivals = [Arrival(at=0.0, input_tokens=200, output_tokens=20, tenant="rag"),
                Arrival(at=0.1, input_tokens=5000, output_tokens=200, tenant="chat"),
                Arrival(at=0.2, input_tokens=5000, output_tokens=200, tenant="nobody")]
    r = simulate(ClusterSpec(prefill=PoolSpec(1), decode=PoolSpec(1), router=cfg), arrivals)
    assert [(x.tenant, x.decision, x.reason) for x in r.records] == [
        ("rag", "remote", "tenant_always"), ("chat", "local", "tenant_never"), ("default", "remote", "policy")]
    canary = {**CONDITIONAL, "rollout": {"canary": {"trafficPercent": 0}}}
    r = simulate(ClusterSpec(prefill=PoolSpec(1), decode=PoolSpec(1), router=canary), arrivals)
    assert {x.reason for x in r.records} == {"canary_excluded"}
    # no prefill pool: the policy's own fallback
    r = simulate(ClusterSpec(decode=PoolSpec(1), router=CONDITIONAL), arrivals[1:2])
    assert r.decisions == {"local:no_prefill_worker": 1} and r.records[0].ok


def test_prefill_queue_overload_falls_back_to_local_under_load() -> None:
    # 1 prefill GPU, long prompts much faster than it can prefill: the estimate passes maxPrefillQueueWaitMs
    arrivals = [Arrival(at=i * 0.05, input_tokens=8000, output_tokens=100) for i in range(40)]
    r = simulate(ClusterSpec(prefill=PoolSpec(1), decode=PoolSpec(3), router=CONDITIONAL), arrivals)
    assert r.decisions.get("remote:policy", 0) > 0
    assert r.decisions.get("local:prefill_queue_overload", 0) > 0
    assert all(x.ok for x in r.records)


def test_same_seed_same_records_whatever_the_machine_does() -> None:
    spec = ClusterSpec(prefill=PoolSpec(1), decode=PoolSpec(2), router=CONDITIONAL)
    arrivals = arrivals_from_mix("mixed", 12.0, 6.0, seed=3)
    a = simulate(spec, arrivals, seed=3)
    stop = threading.Event()

    def hog() -> None:  # competes for the GIL: the run's wall-clock speed changes, its records must not
        while not stop.is_set():
            sum(range(10_000))

    t = threading.Thread(target=hog)
    t.start()
    try:
        b = simulate(spec, arrivals, seed=3)
    finally:
        stop.set()
        t.join()
    assert len(a.records) == len(arrivals) > 30
    assert a.records == b.records
    assert a.decisions == b.decisions and a.makespan_s == b.makespan_s
    assert a.to_dict()["pools"] == b.to_dict()["pools"]


def test_goodput_uses_the_loadgen_definition() -> None:
    spec = ClusterSpec(prefill=PoolSpec(1), decode=PoolSpec(2), router=CONDITIONAL)
    r = simulate(spec, arrivals_from_mix("long-rag", 6.0, 5.0, seed=1), slo=SLO(ttft_ms=200, tpot_ms=50))
    res = r.results
    met = sum(x.meets(0.2, 0.05) for x in res)
    assert r.met == met and r.attainment == pytest.approx(met / len(res))
    assert r.goodput_rps == pytest.approx(met / r.window_s)
    assert 0 < met < len(res)  # the SLO bites: some long prompts miss 200 ms
    assert r.summary().goodput == round(met / len(res), 4)


def test_utilisation_and_gpu_seconds() -> None:
    spec = ClusterSpec(prefill=PoolSpec(1), decode=PoolSpec(2, tp=2), router=CONDITIONAL)
    r = simulate(spec, arrivals_from_mix("mixed", 8.0, 5.0, seed=0))
    assert r.pools["decode"].gpus == 4 and r.pools["prefill"].gpus == 1
    assert r.gpu_seconds == pytest.approx(5 * r.makespan_s)
    for p in r.pools.values():
        assert 0 < p.utilisation <= 1.0
    # one elastic fleet: a request kept local may run whole on the idle prefill worker (policy.py ``elastic``)
    whole = sum(1 for x in r.records if (x.decode_worker or "").startswith("prefill"))
    assert r.pools["decode"].requests + whole == len(r.records)
    assert r.pools["prefill"].requests == r.decisions.get("remote:policy", 0) + whole


def test_bad_specs_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"decode\.count / aggregated\.count"):
        ClusterSpec(prefill=PoolSpec(1)).validate()
    with pytest.raises(ValueError, match="routing"):
        ClusterSpec(decode=PoolSpec(1), router={"routing": {"remotePrefill": {"minInputTokens": "x"}}}).validate()
    with pytest.raises(ValueError, match="output_tokens"):
        Arrival(at=0.0, input_tokens=10, output_tokens=0)
    with pytest.raises(ValueError, match="not sorted"):
        simulate(ClusterSpec(decode=PoolSpec(1)), [Arrival(at=1.0, input_tokens=10, output_tokens=2),
                                                   Arrival(at=0.5, input_tokens=10, output_tokens=2)])
    with pytest.raises(ValueError, match="unknown field"):
        ClusterSpec.from_dict({"decode": {"count": 1, "gpus": 2}})


def test_cluster_is_usable_directly() -> None:
    async def main() -> tuple[int, int]:
        c = TwinCluster(ClusterSpec(prefill=PoolSpec(2), decode=PoolSpec(3), router=CONDITIONAL))
        outs = await c.run([Arrival(at=0.0, input_tokens=5000, output_tokens=80)])
        return len(c.pool("prefill")), outs[0].status

    assert run_virtual(main()) == (2, 200)


def test_a_controller_scales_the_cluster_in_virtual_time() -> None:
    """The autoscale oracle's hooks: add a decode worker at t=2 s, remove one at t=4 s; GPU-seconds follow."""
    spec = ClusterSpec(decode=PoolSpec(2), router={"mode": "Aggregated"})
    arrivals = [Arrival(at=i * 0.1, input_tokens=500, output_tokens=50) for i in range(80)]
    log: list[tuple[float, str]] = []

    async def controller(c: TwinCluster) -> None:
        await asyncio.sleep(2.0)
        log.append((c.now, await c.add_worker("decode")))
        await asyncio.sleep(2.0)
        await c.remove_worker("decode-0")
        log.append((c.now, "removed"))

    r = simulate(spec, arrivals, controller=controller)
    assert log[0] == (pytest.approx(2.0), "decode-2") and log[1][0] >= 4.0
    assert all(x.ok for x in r.records)
    by_worker = {w: sum(1 for x in r.records if x.decode_worker == w) for w in ("decode-0", "decode-1", "decode-2")}
    assert by_worker["decode-2"] > 0 and all(by_worker.values())
    late = [x for x in r.records if x.arrival_s > log[1][0]]
    assert late and all(x.decode_worker != "decode-0" for x in late)
    drained = log[1][0]
    assert r.gpu_seconds == pytest.approx(drained + r.makespan_s + (r.makespan_s - 2.0))
    assert r.pools["decode"].workers == 3

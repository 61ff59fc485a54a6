"""The hindsight oracle (disagg.bench.oracle) on a synthetic load curve, in the discrete-event twin: per bucket the
fewest GPUs whose split holds the bucket's load — checked against independent twin runs, not the oracle's own
bookkeeping — with loads rounded up, cached per (mix, load), and an unholdable load reported as such."""

from __future__ import annotations

import pytest

from disagg.bench import autoscale
from disagg.bench.oracle import OracleSettings, TwinOracle, autoscale_oracle
from disagg.load.workload import generate
from disagg.plan.verify import cluster_spec
from disagg.twin import arrivals_from_requests, simulate

# a compressed day: trough → peak → trough (req/s); 1.4 and 5.9 are rounded up to 1.5 and 6.0 (step 0.5). One
# prefill + one decode replica holds the autoscale mix's RAG prompts up to ~4.5 req/s in the twin, not 6.
CURVE = (0.4, 1.4, 5.9, 1.4, 0.4)
SETTINGS = OracleSettings(probe_s=10.0, rate_step=0.5, max_replicas=3, seed=0)


def _buckets(rates: tuple[float, ...]) -> list[autoscale.BucketLoad]:
    return [autoscale.BucketLoad(t0=5.0 * i, duration_s=5.0, rate=r, requests=0, by_class={})
            for i, r in enumerate(rates)]


def _attainment(oracle: TwinOracle, rate: float, p: int, d: int) -> float:
    """An independent twin run of the demo model with p + d replicas at ``rate`` (same seed and probe length)."""
    mapped = cluster_spec(oracle.with_replicas(p, d))
    reqs = generate(oracle.mix, rate, SETTINGS.probe_s, oracle.model_name, seed=SETTINGS.seed)
    return simulate(mapped.cluster, arrivals_from_requests(reqs), seed=SETTINGS.seed, slo=mapped.slo,
                    window_s=SETTINGS.probe_s).attainment


def test_fewest_gpus_per_bucket_on_a_synthetic_day() -> None:
    oracle = autoscale_oracle(SETTINGS)
    gpus = oracle(_buckets(CURVE))

    assert len(gpus) == len(CURVE)
    assert gpus[0] == gpus[-1] and gpus[1] == gpus[3]  # the same load, the same answer
    assert gpus[0] == 2  # 1 prefill + 1 decode holds the trough (the autoscale benchmark's premise)
    assert gpus[2] > gpus[0]  # the peak needs more
    by_load = sorted(zip(CURVE, gpus, strict=True))
    assert [g for _, g in by_load] == sorted(g for _, g in by_load)  # more load never gets fewer GPUs
    assert [p.rate for p in oracle.picks] == [0.5, 1.5, 6.0, 1.5, 0.5]  # rounded up, never down
    assert all(p.met for p in oracle.picks)

    # the peak's pick holds the load, and no split with fewer GPUs does: independent runs, not the cache
    peak = oracle.picks[2]
    assert peak.gpus == peak.prefill + peak.decode  # one GPU per replica in the demo
    assert _attainment(oracle, peak.rate, peak.prefill, peak.decode) >= SETTINGS.target
    cheaper = [(p, d) for p in range(1, 4) for d in range(1, 4) if p + d < peak.gpus]
    assert cheaper
    for p, d in cheaper:
        assert _attainment(oracle, peak.rate, p, d) < SETTINGS.target, (p, d)

    # cached per (mix, load): a second day with the same loads runs no new probes
    probes = len(oracle.probes)
    assert oracle(_buckets((1.5, 0.5, 6.0))) == [gpus[1], gpus[0], gpus[2]]
    assert len(oracle.probes) == probes
    assert {k[:2] for k in oracle.cache} == {("autoscale", 0.5), ("autoscale", 1.5), ("autoscale", 6.0)}

    # wired the way bench autoscale uses it: GPU-seconds of the day
    h = autoscale.hindsight(_buckets(CURVE), oracle)
    assert h["status"] == "measured" and h["gpus"] == gpus
    assert h["gpu_seconds"] == pytest.approx(5.0 * sum(gpus))


def test_a_load_no_split_holds_gets_the_largest_split_marked_unmet() -> None:
    oracle = autoscale_oracle(OracleSettings(probe_s=10.0, rate_step=0.5, max_replicas=1))
    assert oracle([autoscale.BucketLoad(0.0, 5.0, 5.0, 0, {})]) == [2]
    assert not oracle.picks[0].met and oracle.picks[0].attainment < 0.9
    assert oracle.report()["loads"][0]["met"] is False


@pytest.mark.parametrize(("settings", "field"), [
    (OracleSettings(probe_s=0.0), "probe_s"), (OracleSettings(target=1.5), "target"),
    (OracleSettings(rate_step=-1.0), "rate_step"), (OracleSettings(max_replicas=0), "max_replicas"),
])
def test_settings_errors_name_the_field(settings: OracleSettings, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        settings.validate()
    with pytest.raises(ValueError, match=field):
        autoscale_oracle(settings)

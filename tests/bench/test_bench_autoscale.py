"""``disagg bench autoscale``: the pure parts (traces, attainment buckets, recovery, GPU-seconds, pod start) and
the CLI wiring. The full run needs the local stack for minutes (`make bench-autoscale`); its figures are in
docs/benchmarks.md, not asserted here."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from disagg.bench import autoscale, cli


def test_step_trace_triples_the_rate_after_the_step() -> None:
    reqs = autoscale.step_trace(autoscale.AUTOSCALE_MIX, 1.0, 3.0, 200.0, 200.0, "m", seed=1)
    before = sum(r.at < 200 for r in reqs)
    after = sum(r.at >= 200 for r in reqs)
    assert 2.4 < after / before < 3.6
    assert [r.at for r in reqs] == sorted(r.at for r in reqs)
    assert len({r.id for r in reqs}) == len(reqs)


def test_diurnal_trace_peaks_in_the_middle_of_the_day() -> None:
    day = 400.0
    reqs = autoscale.diurnal_trace(autoscale.AUTOSCALE_MIX, 0.2, 2.0, day, "m", seed=3)
    edges = sum(r.at < day / 8 or r.at >= 7 * day / 8 for r in reqs)
    middle = sum(3 * day / 8 <= r.at < 5 * day / 8 for r in reqs)
    assert middle > 3 * edges
    assert autoscale.diurnal_rate(0, day, 0.2, 2.0) == 0.2
    assert abs(autoscale.diurnal_rate(day / 2, day, 0.2, 2.0) - 2.0) < 1e-9
    # deterministic for a seed
    again = autoscale.diurnal_trace(autoscale.AUTOSCALE_MIX, 0.2, 2.0, day, "m", seed=3)
    assert [r.id for r in reqs] == [r.id for r in again]


def test_attainment_buckets_and_recovery() -> None:
    arrivals = [0.5, 1.5, 5.5, 6.0, 10.1, 12.0, 15.2, 16.0, 20.5, 25.1]
    met = [True, True, False, True, True, True, True, True, True, True]
    b = autoscale.attainment_buckets(arrivals, met, 5.0, until=30.0)
    assert [x["n"] for x in b] == [2, 2, 2, 2, 1, 1]
    assert [x["attainment"] for x in b] == [1.0, 0.5, 1.0, 1.0, 1.0, 1.0]
    assert autoscale.recovery_time(b, 5.0, sustain=3) == 5.0  # the step bucket misses, the next three meet
    assert autoscale.recovery_time(b, 10.0, sustain=3) == 0.0  # never dropped after t = 10
    bad = autoscale.attainment_buckets([1.0, 6.0, 11.0], [True, False, False], 5.0, until=15.0)
    assert autoscale.recovery_time(bad, 5.0) is None
    # the run may be cut by the end of the measurement
    tail = autoscale.attainment_buckets([1.0, 6.0, 11.0], [True, False, True], 5.0, until=15.0)
    assert autoscale.recovery_time(tail, 5.0, sustain=3) == 5.0


def test_gpu_seconds_integrates_replicas_over_the_window() -> None:
    samples = [{"t": 0.0, "prefill_ready": 1, "decode_ready": 1},
               {"t": 10.0, "prefill_ready": 3, "decode_ready": 1},
               {"t": 20.0, "prefill_ready": 1, "decode_ready": 2}]
    assert autoscale.gpu_seconds(samples, 0.0, 30.0, {"prefill": 1, "decode": 1}) == 2 * 10 + 4 * 10 + 3 * 10
    assert autoscale.gpu_seconds(samples, 5.0, 15.0, {"prefill": 2, "decode": 1}) == 3 * 5 + 7 * 5
    assert autoscale.gpu_seconds([], 0.0, 10.0, {"prefill": 1, "decode": 1}) == 0.0


def test_pod_start_from_the_timeline() -> None:
    samples = [{"t": 0, "prefill_desired": 1, "prefill_ready": 1}, {"t": 1, "prefill_desired": 2, "prefill_ready": 1},
               {"t": 2, "prefill_desired": 2, "prefill_ready": 1}, {"t": 4, "prefill_desired": 2, "prefill_ready": 2}]
    assert autoscale.pod_start_s(samples, "prefill") == 3
    assert autoscale.pod_start_s(samples, "decode") is None


def test_cli_registers_bench_autoscale() -> None:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["bench", "autoscale", "--parts", "step", "--day", "60"])
    assert args.func is cli._cmd_autoscale
    assert args.parts == ["step"] and args.day == 60.0
    defaults = parser.parse_args(["bench", "autoscale"])
    assert defaults.parts == list(autoscale.PARTS) and str(defaults.out) == "docs/results/autoscale.json"
    with pytest.raises(SystemExit):  # renamed: the static allocation is no oracle
        parser.parse_args(["bench", "autoscale", "--parts", "oracle"])
    # the recorded command reproduces the settings
    s = autoscale.Settings(base_rate=0.5, step_factor=6.0, parts=("step",))
    again = parser.parse_args(autoscale.command_line(s).split()[1:])
    assert (again.base_rate, again.step_factor, again.parts, again.seed) == (0.5, 6.0, ["step"], 0)


def _step(**kw: Any) -> dict[str, Any]:
    return {"base_rate": 0.5, "step_rate": 3.0, "step_at_s": 30.0, "attainment_before": 1.0, "attainment_after": 0.9,
            "min_bucket_attainment_after": 0.5, "breached": True, "errors": 0, "recovery_s": 10.0,
            "recovery_intervals": 2.0, "interval_s": 5, "pod_start_s": 2.0, "target_s": 12.0, "met_target": True,
            "max_replicas": {"prefill": 2}, **kw}


def _doc(**results: Any) -> dict[str, Any]:
    return {"schema": 1, "benchmark": "autoscale", "command": "disagg bench autoscale",
            "machine": {"cpus": 2, "cpu": "x", "date": "2026-11-30"},
            "results": {"slo": {"ttft_ms": 3000, "tpot_ms": 60}, "wall_s": 1.0, **results}}


DAY = {"day_s": 100, "trough_rate": 0.3, "peak_rate": 1.5, "attainment": 0.95, "requests": 80,
       "gpu_seconds_ready": 300, "gpu_seconds_desired": 310, "errors": 0, "max_replicas": {},
       "load_buckets": [{"t0": 0.0, "duration_s": 50.0, "rate": 0.5, "requests": 25, "by_class": {"rag": 25}},
                        {"t0": 50.0, "duration_s": 50.0, "rate": 1.3, "requests": 60, "by_class": {"rag": 60}}],
       "hindsight": autoscale.hindsight([], None)}
STATIC = {"rate": 1.5, "probe_s": 25, "probes": [{"prefill": 2, "decode": 2, "attainment": 0.95, "misses": {}}],
          "split": {"prefill": 2, "decode": 2, "gpus": 4}}


def test_tables_render_a_result() -> None:
    r = _doc(step=_step(), diurnal=dict(DAY), static_peak=dict(STATIC))
    autoscale._ratios(r["results"])
    assert r["results"]["diurnal"]["vs_static_peak"] == 0.75 and r["results"]["static_peak"]["gpu_seconds"] == 400
    r["results"]["diurnal"]["met_target"] = True
    text = autoscale.table(r)
    assert "recovery 10 s = 2 autoscaler intervals" in text and "0.750" in text and "2P + 2D = 4 GPUs" in text
    assert "hindsight oracle GPU-seconds: pending (" + autoscale.HINDSIGHT_PENDING in text
    md = autoscale.render_tables(r)["summary"]
    assert "| **0.750** (300 / 400) | ≤ 1.15 with attainment ≥ 90 % | met |" in md
    assert f"| autoscaled ÷ hindsight oracle | pending: {autoscale.HINDSIGHT_PENDING} |  | pending |" in md
    assert "oracle" not in md.replace("hindsight oracle", "")


def test_a_step_that_never_breached_is_na_not_met() -> None:
    r = _doc(step=_step(min_bucket_attainment_after=1.0, breached=False, recovery_s=None, recovery_intervals=None,
                        met_target=None))
    md = autoscale.render_tables(r)["summary"]
    assert "never breached: worst bucket after the step 100.0%" in md and md.rstrip().endswith("| n/a |")
    assert "→ n/a" in autoscale.table(r)
    missed = _doc(step=_step(recovery_s=None, recovery_intervals=None, met_target=False))
    assert "never recovered" in autoscale.render_tables(missed)["summary"]


def test_the_hindsight_oracle_seam() -> None:
    reqs = autoscale.diurnal_trace(autoscale.AUTOSCALE_MIX, 0.5, 3.0, 100.0, "m", seed=1)
    load = autoscale.load_buckets(reqs, 100.0, 0.5, 3.0, 10.0)
    assert len(load) == 10 and sum(b.requests for b in load) == len(reqs)
    assert load[0].rate < load[5].rate and abs(load[4].rate - load[5].rate) < 1e-9  # symmetric about midday
    assert sum(b.by_class.get("rag", 0) + b.by_class.get("stream", 0) for b in load) == len(reqs)
    assert autoscale.hindsight(load, None) == {"status": "pending", "reason": autoscale.HINDSIGHT_PENDING}

    def oracle(buckets: list[autoscale.BucketLoad]) -> list[int]:
        return [2 if b.rate < 2 else 4 for b in buckets]

    h = autoscale.hindsight(load, oracle)
    assert h["status"] == "measured" and h["gpu_seconds"] == sum(g * 10 for g in h["gpus"])
    with pytest.raises(ValueError, match="returned 1 GPU counts for 10 buckets"):
        autoscale.hindsight(load, lambda b: [1] * min(1, len(b)))
    # filled into a results file afterwards, from its recorded load
    doc = _doc(diurnal=dict(DAY), static_peak=dict(STATIC))
    filled = autoscale.with_hindsight(doc, lambda b: [2 if x.rate < 1 else 4 for x in b])
    assert filled["results"]["diurnal"]["hindsight"]["gpu_seconds"] == 300
    assert filled["results"]["diurnal"]["vs_hindsight"] == 1.0
    assert "| autoscaled ÷ hindsight oracle | **1.000** (300 / 300) |" in autoscale.render_tables(filled)["summary"]
    assert doc["results"]["diurnal"]["hindsight"]["status"] == "pending"  # the input is not modified

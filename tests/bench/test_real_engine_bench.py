"""disagg bench real-engine's pure parts: the least-squares fit of the CPU engine's costs, the FLOP rate it implies,
the median over repetitions, and the held-out verdict on the median error (the real engine runs in e2e/ and in the
benchmark itself)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disagg.bench import real_engine as re_
from disagg.perf.presets import CPU_ENGINE, get_gpu, get_model
from disagg.perf.roofline import PerfModel


def _points(r: float, s: float, p: float, c: float) -> dict[str, dict[int, float]]:
    return {"ttft_s": {n: r + s + p + c * n for n in re_.FIT_PROMPTS},
            "tpot_s": {b: s + p * b for b in re_.FIT_BATCHES}}


def test_the_fit_recovers_known_costs_exactly() -> None:
    got = re_.fit(_points(r=6e-3, s=2.5e-3, p=80e-6, c=15e-6))
    assert got.request_overhead_s == pytest.approx(6e-3, rel=1e-9)
    assert got.step_overhead_s == pytest.approx(2.5e-3, rel=1e-9)
    assert got.per_seq_overhead_s == pytest.approx(80e-6, rel=1e-9)
    assert got.per_prompt_token_s == pytest.approx(15e-6, rel=1e-9)
    assert got.residual_ms == pytest.approx(0.0, abs=1e-9)


def test_a_noisy_point_shows_in_the_residual_and_no_cost_goes_negative() -> None:
    pts = _points(r=0.0, s=2.5e-3, p=0.0, c=15e-6)
    pts["tpot_s"][1] += 1e-3  # one slow batch-of-one measurement
    got = re_.fit(pts)
    assert got.residual_ms > 0.1
    assert min(got.request_overhead_s, got.step_overhead_s, got.per_seq_overhead_s, got.per_prompt_token_s) >= 0


def test_the_fitted_flop_rate_makes_the_rooflines_per_token_cost_the_fitted_one() -> None:
    perf = PerfModel(get_gpu(CPU_ENGINE), get_model("disagg-tiny-llama"), 1, 1)
    fitted = re_.fit(_points(r=6e-3, s=2.5e-3, p=0.0, c=20e-6))
    flops = re_.fitted_flops(perf, fitted)
    costs = re_._costs(perf, fitted)
    assert costs["bf16_flops"] == flops and costs["step_overhead_s"] == fitted.step_overhead_s
    # the roofline at that rate prices the extra prompt tokens as the fit does (its FLOPs scale with 1/rate)
    lo, hi = re_.FIT_PROMPTS[0], re_.FIT_PROMPTS[-1]
    extra = perf.prefill_time(hi, chunk=1024) - perf.prefill_time(lo, chunk=1024)
    assert extra * perf.gpu.bf16_flops / flops == pytest.approx(20e-6 * (hi - lo), rel=1e-9)
    assert re_.fitted_flops(perf, re_.Fit(0.0, 0.0, 0.0, 0.0, 0.0)) == 0.0  # no per-token cost: no rate


def test_held_out_points_are_judged_on_the_median_of_their_repetitions() -> None:
    def load(rate: float, ttft: float, tpot: float) -> dict[str, float]:
        return {"rate": rate, "requests": 10, "ok": 10, "ttft_mean_ms": ttft, "ttft_p90_ms": ttft, "tpot_mean_ms": tpot}

    real = [load(5.0, 20.0, 4.0)]
    sims = [[load(5.0, 14.0, 4.0)], [load(5.0, 19.0, 4.2)], [load(5.0, 21.0, 3.9)]]  # -30 %, -5 %, +5 %
    reps = [re_._compare(real, s) for s in sims]
    assert [r[0]["error"]["ttft_mean_ms"] for r in reps] == pytest.approx([-0.3, -0.05, 0.05])
    fits = [re_.Fit(1.0, s, 0.0, 0.0, 0.0) for s in (3.0, 1.0, 2.0)]
    assert re_._median_fit(fits).step_overhead_s == 2.0


def test_the_committed_results_render_and_each_verdict_is_its_median_error() -> None:
    doc = json.loads(Path(__file__).resolve().parents[2].joinpath("docs/results/real-engine.json").read_text())
    r = doc["results"]
    for c in r["held_out"]:
        lo, hi = c["error_range"]["ttft_mean_ms"]
        assert lo <= c["error"]["ttft_mean_ms"] <= hi
        assert c["within"] == all(abs(c["error"][k]) <= r["tolerance"] for k in ("ttft_mean_ms", "tpot_mean_ms"))
    tables = re_.render_tables(doc)
    assert f"median of {r['repeats']} repetitions" in tables["held-out"]
    assert tables["fit"].count("| TPOT, batch of") == len(re_.FIT_BATCHES)

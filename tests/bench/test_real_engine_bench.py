"""disagg bench real-engine's pure parts: the fit of the CPU engine's costs through the sim's own step model, the
costs the sim is given, the median over repetitions, and the held-out verdict on the median error (the real engine
runs in e2e/ and in the benchmark itself)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from disagg.bench import real_engine as re_
from disagg.perf.presets import CPU_ENGINE, get_gpu, get_model
from disagg.perf.roofline import PerfModel
from disagg.sim import config as sim_config
from disagg.sim.engine import build_perf

PERF = PerfModel(get_gpu(CPU_ENGINE), get_model("disagg-tiny-llama"), 1, 1)
TEMPLATE = {"ttft_s": {n: 0.0 for n in re_.FIT_PROMPTS}, "tpot_s": {b: 0.0 for b in re_.FIT_BATCHES}}


def _points(fit: re_.Fit) -> dict[str, dict[int, float]]:
    """The fit points an engine whose costs are ``fit`` would measure, as the sim's step model prices them."""
    priced = iter(re_.priced(PERF, fit, TEMPLATE))
    return {k: {n: next(priced) for n in v} for k, v in TEMPLATE.items()}


@pytest.mark.parametrize("flops", [6e9, 65e9, 400e9])  # decode bound by compute; by weights to batch ~5; by weights
def test_the_fit_recovers_known_costs_through_the_sims_own_step_model(flops: float) -> None:
    truth = re_.Fit(request_overhead_s=6e-3, step_overhead_s=2.5e-3, per_seq_overhead_s=80e-6, flops_per_s=flops,
                    residual_ms=0.0)
    got = re_.fit(_points(truth), PERF)
    assert got.request_overhead_s == pytest.approx(6e-3, rel=1e-4)
    assert got.step_overhead_s == pytest.approx(2.5e-3, rel=1e-4)
    assert got.per_seq_overhead_s == pytest.approx(80e-6, rel=1e-3)
    assert got.flops_per_s == pytest.approx(flops, rel=1e-3)
    assert got.residual_ms == pytest.approx(0.0, abs=1e-3)


def test_a_line_fitted_apart_from_the_model_would_not_be_the_engine_the_sim_runs() -> None:
    """Why the fit goes through the model: an engine of 6 GFLOP/s (a CPU without AVX-512) charges each decode token
    ~0.2 ms of FLOPs. A TPOT line s + p·b puts that in p, and the sim then adds the FLOPs again: the old fit priced
    a batch of 16 ~40 % slow. The fit through the model prices every point within its residual."""
    pts = _points(re_.Fit(6e-3, 2.5e-3, 80e-6, 6e9, 0.0))
    tpot = pts["tpot_s"]
    p_line = (tpot[16] - tpot[1]) / 15  # what a separate line calls the per-sequence cost
    double = replace(PERF.eff, per_seq_overhead_s=p_line, step_overhead_s=2.5e-3)
    sim_of_line = PerfModel(replace(PERF.gpu, bf16_flops=6e9), PERF.model, 1, 1, eff=double)
    assert sim_of_line.decode_step_time(16, re_.FIT_CONTEXT) > 1.3 * tpot[16]
    fitted = re_.fit(pts, PERF)
    for got, want in zip(re_.priced(PERF, fitted, pts), [*pts["ttft_s"].values(), *tpot.values()], strict=True):
        assert got == pytest.approx(want, rel=1e-3)


def test_a_noisy_point_shows_in_the_residual_and_no_cost_goes_negative() -> None:
    pts = _points(re_.Fit(0.0, 2.5e-3, 0.0, 65e9, 0.0))
    pts["tpot_s"][1] += 1e-3  # one slow batch-of-one measurement
    got = re_.fit(pts, PERF)
    assert got.residual_ms > 0.1
    assert min(got.request_overhead_s, got.step_overhead_s, got.per_seq_overhead_s) >= 0 < got.flops_per_s


def test_the_sim_given_the_fits_costs_prices_the_fit_points_as_the_fit_does() -> None:
    """``fit_costs`` through the sim's own ``--sim-efficiency`` parser and engine model: the same prices."""
    fitted = re_.Fit(7e-3, 2.4e-3, 110e-6, 6.25e9, 0.0)
    cfg = sim_config.parse(["/cache/tiny-llama", *re_.ENGINE_ARGS, "--gpu", re_.GPU_PRESET,
                            "--sim-efficiency", json.dumps(re_.fit_costs(fitted))], env={})
    sim = build_perf(cfg)
    want = re_.priced(PERF, fitted, TEMPLATE)
    got = ([sim.ttft_alone(n, chunk=re_.PROMPT_CHUNK) for n in re_.FIT_PROMPTS]
           + [sim.decode_step_time(b, re_.FIT_CONTEXT) for b in re_.FIT_BATCHES])
    assert got == pytest.approx(want, rel=1e-12)


def test_held_out_points_are_judged_on_the_median_of_their_repetitions() -> None:
    def load(rate: float, ttft: float, tpot: float) -> dict[str, float]:
        return {"rate": rate, "requests": 10, "ok": 10, "ttft_mean_ms": ttft, "ttft_p90_ms": ttft, "tpot_mean_ms": tpot}

    real = [load(5.0, 20.0, 4.0)]
    sims = [[load(5.0, 14.0, 4.0)], [load(5.0, 19.0, 4.2)], [load(5.0, 21.0, 3.9)]]  # -30 %, -5 %, +5 %
    reps = [re_._compare(real, s) for s in sims]
    assert [r[0]["error"]["ttft_mean_ms"] for r in reps] == pytest.approx([-0.3, -0.05, 0.05])
    fits = [re_.Fit(1.0, s, 0.0, 1e9, 0.0) for s in (3.0, 1.0, 2.0)]
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

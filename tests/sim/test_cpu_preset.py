"""The CPU engine's preset (vLLM-CPU-2core, disagg-tiny-llama) is the committed fit on a real vLLM CPU engine
(docs/results/real-engine.json, `disagg bench real-engine`), and the sim's model of the fit points reproduces it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disagg.bench import real_engine as re_
from disagg.perf.presets import CPU_ENGINE, get_gpu, get_model, infer_model
from disagg.perf.roofline import GPU_EFFICIENCY, PerfModel

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "real-engine.json"
# the real engine's own run-to-run variance on the 2-core machine it was fitted on (docs/simulator.md)
RUN_TO_RUN = 0.25


@pytest.fixture(scope="module")
def committed() -> dict:
    return json.loads(RESULTS.read_text())["results"]


def test_the_preset_is_the_committed_fit(committed: dict) -> None:
    fit, eff = committed["fit"], GPU_EFFICIENCY[CPU_ENGINE]
    for key in ("request_overhead_s", "step_overhead_s"):
        assert getattr(eff, key) == pytest.approx(fit[key], rel=RUN_TO_RUN), key
    assert eff.per_seq_overhead_s == pytest.approx(fit["per_seq_overhead_s"], abs=20e-6)
    assert get_gpu(CPU_ENGINE).bf16_flops == pytest.approx(fit["flops_per_s"], rel=RUN_TO_RUN)


def test_the_tiny_model_is_recognised_by_its_directory_name() -> None:
    assert infer_model("/root/.cache/disagg/tiny-llama") == get_model("disagg-tiny-llama")


def test_the_sim_prices_the_fit_points_as_the_real_engine_measured_them(committed: dict) -> None:
    perf = PerfModel(get_gpu(CPU_ENGINE), get_model("disagg-tiny-llama"), 1, 1)
    for n, measured in committed["fit_points"]["ttft_s"].items():
        modelled = perf.request_overhead_s + perf.prefill_time(int(n), chunk=re_.PROMPT_CHUNK)
        assert modelled == pytest.approx(measured, rel=RUN_TO_RUN), f"TTFT of a {n}-token prompt"
    for b, measured in committed["fit_points"]["tpot_s"].items():
        modelled = perf.decode_step_time(int(b), re_.FIT_CONTEXT)
        assert modelled == pytest.approx(measured, rel=RUN_TO_RUN), f"TPOT of a batch of {b}"

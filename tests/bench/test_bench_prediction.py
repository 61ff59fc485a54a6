"""disagg bench prediction: which cells are below the knee, the error figures, the table."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from disagg.bench import prediction
from disagg.results import results_doc, validate


def _row(mix: str, rate: float, prefill: int, att: float, slo: str = "1000/50", variant: str = "c-default",
         gpus: int = 4) -> dict:
    return {"variant": variant, "gpus": gpus, "mix": mix, "rate": rate, "prefill": prefill, "workers": 4 - prefill,
            "duration_s": 6.0, "deployed_slo": slo, "slos": {slo: {"attainment": att}}}


def test_below_knee_takes_each_rates_best_split_while_it_holds() -> None:
    rows = [_row("m", 10, 1, 0.99), _row("m", 10, 2, 0.97), _row("m", 20, 1, 0.80), _row("m", 20, 2, 0.93),
            _row("m", 30, 1, 0.50), _row("m", 10, 1, 1.0, variant="a"), _row("m", 10, 1, 1.0, gpus=8)]
    cells = prediction.below_knee({"results": {"rows": rows}})
    assert [(c["rate"], c["prefill"]) for c in cells] == [(10, 1), (20, 2)]  # 30 req/s: past the knee


@dataclass
class _Rec:
    ttft_s: float | None
    tpot_s: float | None
    predicted_ttft_s: float | None
    predicted_tpot_s: float | None
    ok: bool = True
    arrival_s: float = 0.0
    e2e_s: float | None = None


def test_errors_are_per_request_actual_over_predicted() -> None:
    recs = [_Rec(1.2, 0.02, 1.0, 0.02), _Rec(0.9, 0.03, 1.0, 0.02), _Rec(1.0, 0.02, 1.0, 0.02),
            _Rec(5.0, 0.5, 1.0, 0.02, ok=False), _Rec(1.0, None, None, None)]
    e = prediction.errors(recs)
    assert e["ttft"]["n"] == 3 and e["ttft"]["median_abs_error"] == pytest.approx(0.1)
    assert e["ttft"]["median_ratio"] == pytest.approx(1.0)
    assert e["tpot"]["median_abs_error"] == 0.0 and e["tpot"]["p90_abs_error"] == pytest.approx(0.5)
    assert prediction.errors([])["ttft"] is None


def test_table_marks_misses_and_summarises() -> None:
    cell = {"mix": "m", "slo": "1000/50", "rate": 10, "prefill": 1, "workers": 3,
            "ttft": {"n": 3, "median_abs_error": 0.1, "p90_abs_error": 0.3, "median_ratio": 1.0},
            "tpot": {"n": 3, "median_abs_error": 0.4, "p90_abs_error": 0.9, "median_ratio": 0.7},
            "steady": {"warmup_s": 2.0, "ttft": {"n": 2, "median_abs_error": 0.05, "p90_abs_error": 0.1,
                                                  "median_ratio": 1.0},
                       "tpot": {"n": 2, "median_abs_error": 0.2, "p90_abs_error": 0.3, "median_ratio": 1.2}}}
    doc = results_doc("prediction", prediction.COMMAND, {"target": 0.15, "cells": [cell],
                                                          "summary": prediction.summary([cell])})
    assert not validate(doc, "prediction")
    table = prediction.render_tables(doc)["accuracy"]
    assert ("| m | 1000/50 | 10 | 1P+3D | 10.0 % | 30.0 % | ×1.00 | 40.0 % ✗ | 90.0 % | ×0.70 | 5.0 % / ×1.00 | "
            "20.0 % ✗ / ×1.20 |") in table
    assert "TTFT 1/1 cells, TPOT 0/1 cells" in table
    assert "Steady (requests arriving after" in table and "TTFT 1/1 cells, TPOT 0/1 cells within ±15 %" in table


def test_steady_state_leaves_out_the_runs_warm_up_and_its_drain() -> None:
    # lifetimes of 1 s: the run fills in 2 s; the early requests ran 2× slower than predicted (the batch was growing),
    # the last ones 2× faster (arrivals end at 7 s: the batch empties around them)
    recs = [_Rec(1.0, 0.04, 1.0, 0.02, arrival_s=t / 10, e2e_s=1.0) for t in range(20)]
    recs += [_Rec(1.0, 0.021, 1.0, 0.02, arrival_s=2.0 + t / 10, e2e_s=1.0) for t in range(30)]
    recs += [_Rec(1.0, 0.01, 1.0, 0.02, arrival_s=5.05 + t / 10, e2e_s=1.0) for t in range(20)]
    assert prediction.warmup_s(recs) == pytest.approx(2.0)
    st = prediction.steady(recs, duration_s=7.0)
    assert st["warmup_s"] == 2.0 and st["tpot"]["n"] == 30
    assert st["tpot"]["median_ratio"] == pytest.approx(1.05)
    assert prediction.errors(recs)["tpot"]["n"] == 70
    assert prediction.warmup_s([]) == 0.0

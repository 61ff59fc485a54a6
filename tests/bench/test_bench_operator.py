"""Smoke run of the operator convergence benchmark: two models converge and a quiet window writes nothing."""

from __future__ import annotations

from disagg.bench.operator_bench import run


def test_two_models_converge_and_stay_quiet() -> None:
    r = run(2, steady_window_s=3)
    assert r.status_written_s <= r.deployments_settled_s
    assert r.applies == 24  # 12 children per model, each applied once
    assert r.steady_state_writes == 0

"""The planner's decode batch spread (plan/model.py ``occupancy_sd``, ``life_average``): a stream's TPOT moves with
the KV of the batch it runs in, even where no prefill runs beside it."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace
from typing import Any

import pytest

from disagg.perf.presets import get_gpu, get_model
from disagg.plan.model import _tpot_ok, build_workload, decode_side, life_average, occupancy_sd, pool_model
from disagg.plan.profile import parse_profile


def profile(inp: dict[str, Any], out: dict[str, Any]) -> Any:
    return parse_profile({"name": "t", "model": {"preset": "Llama-3.1-8B"},
                          "traffic": {"inputTokens": inp, "outputTokens": out, "rate": {"meanRps": 20}},
                          "slo": {"ttftP95Ms": 1000, "tpotP95Ms": 50}, "gpus": [{"type": "H100-SXM", "count": 8}]})


def test_life_average_keeps_all_of_a_short_window_and_two_over_r_of_a_long_one() -> None:
    assert life_average(0.0) == 1.0
    assert life_average(1e-3 - 1e-12) == pytest.approx(life_average(1e-3 + 1e-12), rel=1e-6)  # the series' seam
    assert life_average(1.0) == pytest.approx(2 * math.exp(-1))
    assert life_average(200.0) == pytest.approx(2 / 200.0, rel=0.01)
    xs = [life_average(r / 10) for r in range(0, 100)]
    assert all(a > b for a, b in itertools.pairwise(xs))


def test_life_average_is_the_variance_left_in_the_mean_of_an_ar1_process() -> None:
    """Against a simulation: a discretised Ornstein–Uhlenbeck process (autocorrelation e^(−u/L)) averaged over
    windows r·L long keeps life_average(r) of its variance."""
    rng = random.Random(7)
    dt, corr = 0.02, 1.0  # time step and correlation time
    a = math.exp(-dt / corr)
    x, xs = 0.0, []
    for _ in range(400_000):
        x = a * x + math.sqrt(1 - a * a) * rng.gauss(0.0, 1.0)
        xs.append(x)
    for r in (0.5, 2.0):
        k = round(r * corr / dt)
        means = [sum(xs[i:i + k]) / k for i in range(0, len(xs) - k, k)]
        var = sum(m * m for m in means) / len(means)
        assert var == pytest.approx(life_average(r), rel=0.12)


def test_the_time_weighted_context_moments_of_fixed_lengths_are_exact() -> None:
    """A stream of `in` prompt tokens and `out` answers runs its context from in to in + out: mean in + out/2,
    mean square in² + in·out + out²/3."""
    wl = build_workload(profile({"fixed": 1000}, {"fixed": 300}))
    assert wl.decode_context == pytest.approx(1150.0)
    assert wl.decode_context_sq == pytest.approx(1000**2 + 1000 * 300 + 300**2 / 3)
    assert wl.context_cv2 == pytest.approx((1000**2 + 300_000 + 30_000) / 1150**2 - 1)
    spread = build_workload(profile({"mean": 1000, "p95": 3500}, {"fixed": 300}))
    assert spread.context_cv2 > 10 * wl.context_cv2  # prompts of many lengths: contexts spread far wider


def test_the_batch_spread_grows_with_the_context_spread_and_shrinks_over_more_replicas() -> None:
    wl = build_workload(profile({"mean": 3000, "p95": 7000}, {"mean": 150, "p95": 400}))
    pm = pool_model(get_gpu("L40S"), 1, 1.0, get_model("Llama-3.1-8B"), wl, 2048, 0.9)
    one, two = occupancy_sd(pm, wl, 23.0, 1, 0.0), occupancy_sd(pm, wl, 23.0, 2, 0.0)
    assert 0 < two < one
    assert occupancy_sd(pm, replace(wl, decode_context_sq=0.0), 23.0, 2, 0.0) < two  # contexts all alike
    assert occupancy_sd(pm, replace(wl, ca2=9.0), 23.0, 2, 0.0) > two  # bursty arrivals: a burstier batch
    assert occupancy_sd(pm, wl, 23.0, 2, 0.5) == pytest.approx(2 * two)  # local prefill stretches it as TPOT
    assert occupancy_sd(pm, wl, 0.0, 2, 0.0) == 0.0


def test_without_local_prefill_a_streams_tpot_still_spreads_and_long_streams_spread_less() -> None:
    """All remote (no prefill interference): before this model P(TPOT ≤ the mean) was 1; the batch's KV moves, so
    half the streams land above the mean, and a long stream averages more of the movement away."""
    wl = build_workload(profile({"mean": 3000, "p95": 7000}, {"mean": 150, "p95": 400}))
    pm = pool_model(get_gpu("L40S"), 1, 1.0, get_model("Llama-3.1-8B"), wl, 2048, 0.9)
    d = decode_side(pm, 2, wl, 8.0, [False] * len(wl.in_tokens), 0.045)
    assert d.prefill_share == 0 and d.occupancy_sd_s > 0 and d.mean_out == pytest.approx(wl.mean_out, rel=1e-6)
    assert _tpot_ok(d, 150.0, d.tpot_mean_s) == pytest.approx(0.5)
    tau = d.tpot_mean_s + d.occupancy_sd_s
    assert _tpot_ok(d, 20.0, tau) < _tpot_ok(d, 150.0, tau) < _tpot_ok(d, 1000.0, tau) < 1.0

"""Holt's linear method on series with a known answer."""

from __future__ import annotations

import pytest

from disagg.autoscaling.forecast import Holt, Load, LoadForecaster


def test_linear_series_is_forecast_exactly_once_the_trend_is_learnt() -> None:
    h = Holt(alpha=0.5, beta=0.3, phi=1.0)
    for t in range(60):
        h.update(2.0 + 0.5 * t)
    # y(t) = 2 + 0.5 t: after t = 59 the forecast h steps ahead is y(59 + h)
    for k in (1, 3, 10):
        assert h.forecast(k) == pytest.approx(2.0 + 0.5 * (59 + k), abs=1e-6)


def test_constant_series_forecasts_the_constant() -> None:
    h = Holt()
    for _ in range(10):
        h.update(7.0)
    assert h.forecast(5) == pytest.approx(7.0)


def test_damped_trend_is_bounded() -> None:
    h = Holt(alpha=0.5, beta=0.3, phi=0.8)
    for t in range(60):
        h.update(float(t))
    level, trend = h.level, h.trend
    assert level is not None
    # Σ φ^k ≤ φ / (1 − φ) = 4: a ramp's forecast stops growing however far ahead
    f1, f2, f100 = h.forecast(1), h.forecast(2), h.forecast(100)
    assert f1 is not None and f2 is not None and f100 is not None
    assert f100 == pytest.approx(level + trend * 0.8 * (1 - 0.8 ** 100) / 0.2)
    assert f100 < level + 4.01 * trend
    assert f1 < f2 < f100


def test_no_sample_no_forecast_and_bad_parameters_are_named() -> None:
    assert Holt().forecast() is None
    assert LoadForecaster().forecast() is None
    with pytest.raises(ValueError, match="alpha"):
        Holt(alpha=0.0)


def test_load_forecaster_peaks_over_the_horizon_on_a_ramp() -> None:
    f = LoadForecaster(phi=1.0)
    for t in range(30):
        f.update(Load(1.0 + 0.2 * t, 2.0, 8000, 400, 250))
    peak = f.peak(3)
    assert peak is not None
    assert peak.remote_rps == pytest.approx(1.0 + 0.2 * 32, rel=1e-3)  # three intervals past t = 29
    assert peak.local_rps == pytest.approx(2.0)
    assert peak.remote_in == pytest.approx(8000) and peak.out == pytest.approx(250)


def test_token_means_are_forecast_at_their_level_not_on_a_trend() -> None:
    # a swing from long to short answers: the output mean falls 1,500 → 160 tokens in two intervals; three
    # intervals ahead it is where it is now, not run down its trend to the floor (the decode pool was once sized
    # for 1-token answers that way)
    f = LoadForecaster()
    for out in (1500.0, 1500.0, 1500.0, 800.0, 160.0, 160.0):
        f.update(Load(5.0, 1.0, 8000, 400, out))
    level = f.series["out"].level
    assert level is not None and f.series["out"].trend < 0
    for h in (1, 3):
        got = f.forecast(h)
        assert got is not None and got.out == pytest.approx(level)
    peak = f.peak(3)
    assert peak is not None and peak.out == pytest.approx(level) and peak.out > 160.0


def test_a_step_in_the_rate_starts_a_new_level_at_once() -> None:
    # 2 req/s for ten 30-s intervals, then 6: the count's noise band around 2 req/s is 3 √60 / 30 ≈ 0.77 req/s,
    # so 6 is a new level — forecast at 6 the interval it is seen, not halfway (α = 0.5) as plain Holt does
    f = LoadForecaster(interval_s=30.0)
    plain = LoadForecaster()
    for g in (f, plain):
        for _ in range(10):
            g.update(Load(1.0, 1.0, 8000, 400, 250))
        g.update(Load(3.0, 3.0, 8000, 400, 250))
    got, smoothed = f.forecast(1), plain.forecast(1)
    assert got is not None and smoothed is not None
    assert got.rps == pytest.approx(6.0)
    assert smoothed.rps < 5.0
    assert f.series["remote_rps"].shifts == 1 and plain.series["remote_rps"].shifts == 0


def test_a_ramp_within_the_noise_band_is_smoothed_as_before() -> None:
    # a diurnal-like ramp, +0.1 req/s per interval, with ± one Poisson standard deviation of a 30-s count: never
    # a new level, and the forecast is plain Holt's to the bit
    import math

    f, plain = LoadForecaster(interval_s=30.0), LoadForecaster()
    for t in range(60):
        rate = 2.0 + 0.1 * t
        rate += (1 if t % 2 else -1) * math.sqrt(rate * 30.0) / 30.0
        for g in (f, plain):
            g.update(Load(rate, rate / 2, 8000, 400, 250))
    assert all(h.shifts == 0 for h in f.series.values())
    assert f.forecast(3) == plain.forecast(3)


def test_the_end_of_a_burst_is_a_new_level_too() -> None:
    f = LoadForecaster(interval_s=30.0)
    for rate in (5.0,) * 10 + (9.0, 5.0):
        f.update(Load(rate, 0.0, 8000, 400, 250))
    got = f.forecast(1)
    assert got is not None and got.remote_rps == pytest.approx(5.0)
    assert f.series["remote_rps"].shifts == 2

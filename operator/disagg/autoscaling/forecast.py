"""Forecasting the next intervals' load: Holt's linear trend method per series. PURE, no I/O, no clock.

Holt's linear method (double exponential smoothing; C. C. Holt, "Forecasting seasonals and trends by exponentially
weighted moving averages", ONR memo 1957, reprinted in Int. J. Forecasting 20(1), 2004; the textbook form in
Hyndman & Athanasopoulos, *Forecasting: Principles and Practice*, 3rd ed., §8.2, https://otexts.com/fpp3/holt.html):

    level_t = α · y_t + (1 − α) · (level_{t−1} + trend_{t−1})
    trend_t = β · (level_t − level_{t−1}) + (1 − β) · trend_{t−1}
    ŷ_{t+h} = level_t + h · trend_t          (damped: level_t + (φ + φ² + … + φ^h) · trend_t)

A damped trend (Gardner & McKenzie 1985; FPP3 §8.2 "Damped trend methods") keeps a ramp's forecast from running
away past its turn. A request rate that leaves the noise band of its forecast (:data:`SHIFT_Z` Poisson standard
deviations of the interval's count) starts a new level at once instead of being smoothed into the old one: a
step or a burst is sized for in the interval it is seen. Dynamo's SLA planner offers constant, ARIMA, Kalman and
Prophet predictors for the same job (https://docs.nvidia.com/dynamo/design-docs/planner-design, "Load
Prediction"); Holt's method is the simplest of them that sees a trend, which is what a diurnal ramp is at the scale
of a few intervals.

:class:`LoadForecaster` forecasts what the sizing needs (autoscaling/predictive.py): the arrival rate of requests
that prefill remotely and of those served whole on a decode worker, their mean prompt lengths and the mean output
length; a series with no sample yet forecasts None.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# A rate further from its one-step forecast than 3 Poisson standard deviations of the interval's count has moved
# to a new level (a step, a burst, its end): Shewhart's 3σ control limits (W. A. Shewhart, *Economic Control of
# Quality of Manufactured Product*, 1931; D. C. Montgomery, *Introduction to Statistical Quality Control*, 8th ed.,
# §6.2, the c chart: limits c̄ ± 3√c̄ for Poisson counts). A smooth ramp stays inside the band and is smoothed as
# before; without the test a 3× step (2 → 6 req/s) entered the level at half its rise, 4 req/s (α = 0.5), in the
# interval it was seen, and the prefill pool's last replica was ordered an interval later.
SHIFT_Z = 3.0


@dataclass
class Holt:
    """Holt's linear method with an optionally damped trend (``phi`` < 1). ``alpha``: level smoothing, ``beta``:
    trend smoothing, both in (0, 1]."""

    alpha: float = 0.5
    beta: float = 0.3
    phi: float = 0.95
    level: float | None = None
    trend: float = 0.0
    n: int = 0
    shifts: int = 0  # samples that started a new level (``update``'s ``shift_band``)

    def __post_init__(self) -> None:
        for name, v in (("alpha", self.alpha), ("beta", self.beta), ("phi", self.phi)):
            if not 0 < v <= 1:
                raise ValueError(f"{name}: must be in (0, 1], got {v}")

    def update(self, y: float, shift_band: float | None = None) -> None:
        """Add a sample. ``shift_band``: the largest miss of the one-step forecast that is noise; a sample
        further from it than that starts a new level (``level := y``, the trend kept) instead of being smoothed
        into the old one (:meth:`LoadForecaster.update`)."""
        if self.level is None:
            self.level, self.trend = y, 0.0
        elif shift_band is not None and abs(y - (self.level + self.phi * self.trend)) > shift_band:
            self.level = y
            self.shifts += 1
        else:
            prev = self.level
            self.level = self.alpha * y + (1 - self.alpha) * (prev + self.phi * self.trend)
            self.trend = self.beta * (self.level - prev) + (1 - self.beta) * self.phi * self.trend
        self.n += 1

    def forecast(self, h: int = 1) -> float | None:
        """ŷ_{t+h}; None before the first sample."""
        if self.level is None:
            return None
        damp = sum(self.phi ** k for k in range(1, h + 1))
        return self.level + damp * self.trend


@dataclass(frozen=True)
class Load:
    """One interval's traffic, as the sizing needs it. Rates in requests per second, lengths in tokens."""

    remote_rps: float  # requests whose prefill runs on the prefill pool
    local_rps: float  # requests served whole on a decode worker
    remote_in: float  # mean prompt tokens of the remote requests
    local_in: float  # mean prompt tokens of the local requests
    out: float  # mean output tokens

    @property
    def rps(self) -> float:
        return self.remote_rps + self.local_rps

    def scaled(self, factor: float) -> Load:
        return Load(self.remote_rps * factor, self.local_rps * factor, self.remote_in, self.local_in, self.out)

    def with_backlog(self, prefill_waiting: float, drain_s: float) -> Load:
        """This load plus the prefill pool's queue drained within ``drain_s``: ``prefill_waiting`` requests (of
        the remote mix) as extra remote arrivals over that time."""
        if prefill_waiting <= 0 or drain_s <= 0:
            return self
        return Load(self.remote_rps + prefill_waiting / drain_s, self.local_rps, self.remote_in, self.local_in,
                    self.out)


@dataclass
class LoadForecaster:
    """Holt per series of :class:`Load`. Rates get a trend (they ramp); token means a level only (forecast at their
    level), as a mix shifts slowly next to the rate. ``forecast(h)`` is the load ``h`` intervals ahead, never
    negative."""

    alpha: float = 0.5
    beta: float = 0.3
    phi: float = 0.95
    # the interval a rate is counted over (seconds); None: no level-shift test (every sample smoothed)
    interval_s: float | None = None
    shift_z: float = SHIFT_Z
    series: dict[str, Holt] = field(default_factory=dict)

    def _h(self, name: str, trend: bool) -> Holt:
        if name not in self.series:
            self.series[name] = Holt(self.alpha, self.beta if trend else 0.05, self.phi)
        return self.series[name]

    def update(self, load: Load) -> None:
        for name, rate in (("remote_rps", load.remote_rps), ("local_rps", load.local_rps)):
            h = self._h(name, True)
            h.update(rate, self._shift_band(h))
        if load.remote_rps > 0:
            self._h("remote_in", False).update(load.remote_in)
        if load.local_rps > 0:
            self._h("local_in", False).update(load.local_in)
        if load.rps > 0:
            self._h("out", False).update(load.out)

    def _shift_band(self, h: Holt) -> float | None:
        """The noise band of a rate counted over ``interval_s`` around its one-step forecast λ̂: ``shift_z`` Poisson
        standard deviations of the count, √(λ̂·T) (at least one request), as a rate."""
        if self.interval_s is None or self.interval_s <= 0 or h.level is None:
            return None
        expected = max(0.0, h.level + h.phi * h.trend) * self.interval_s
        return self.shift_z * math.sqrt(max(expected, 1.0)) / self.interval_s

    @property
    def samples(self) -> int:
        h = self.series.get("remote_rps")
        return h.n if h is not None else 0

    def forecast(self, h: int = 1) -> Load | None:
        """Rates ``h`` intervals ahead on their trend; token means at their level. A mix's means are not
        extrapolated: after a swing from long to short answers (mean output 1,500 → 160 tokens in two intervals) the
        trend of the output mean ran it to the 1-token floor three intervals ahead, and the decode pool was sized
        for 1-token answers (12 → 1 replicas, attainment 0 %; the virtual-day bench's mix swing, 2026-12-06)."""
        if not self.samples:
            return None

        def get(name: str, default: float, ahead: int) -> float:
            s = self.series.get(name)
            v = s.forecast(ahead) if s is not None else None
            return default if v is None else max(0.0, v)

        return Load(get("remote_rps", 0.0, h), get("local_rps", 0.0, h), max(1.0, get("remote_in", 1.0, 0)),
                    max(1.0, get("local_in", 1.0, 0)), max(1.0, get("out", 1.0, 0)))

    def peak(self, horizon: int) -> Load | None:
        """The largest forecast rate over the next ``horizon`` intervals (and now): what a pod started now must
        hold when it is ready. Token means at their level."""
        loads = [x for k in range(0, max(1, horizon) + 1) if (x := self.forecast(k)) is not None]
        if not loads:
            return None
        last = loads[-1]
        return Load(max(x.remote_rps for x in loads), max(x.local_rps for x in loads), last.remote_in,
                    last.local_in, last.out)

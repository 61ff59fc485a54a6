"""Burstiness of an arrival series: the inter-arrival coefficient of variation and short-window peak rates.

What ``disagg plan --from-log`` (and ``--arrivals``) measure from recorded arrival times, and what the profile's
``traffic.burstiness`` section declares (docs/planning.md, "Burstiness, headroom and verification on real
arrivals"). Pure functions of a sorted list of arrival times in seconds.

- **Inter-arrival CV** (``cv``, so ``ca² = cv²`` in the queueing formulas): the standard deviation of the gaps
  between consecutive arrivals over their mean. Poisson arrivals have cv = 1, evenly spaced ones 0, bursts > 1.
  Each gap is divided by the mean gap of its ``window_s`` window first, so a slow drift of the rate (the hour's
  busy and quiet minutes, which the peak rates describe) does not count as burstiness; only the variability at
  the time scale of the queues does.
- **Peak rates** over sliding windows of 1 s, 10 s and 60 s: the most arrivals in any ``[t, t + w)`` starting at
  an arrival, over ``w``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

PEAK_WINDOWS = (1.0, 10.0, 60.0)
CV_WINDOW_S = 60.0
MIN_GAPS = 20  # fewer gaps than this do not give a cv worth planning on


def peak_rate(times: Sequence[float], window_s: float) -> float:
    """The most arrivals in any window ``[t, t + window_s)`` that starts at an arrival, per second."""
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    best = 0
    j = 0
    n = len(times)
    for i, t in enumerate(times):
        while j < n and times[j] < t + window_s:
            j += 1
        best = max(best, j - i)
    return best / window_s


def interarrival_cv(times: Sequence[float], window_s: float = CV_WINDOW_S) -> float | None:
    """Coefficient of variation of the gaps between consecutive arrivals, each gap scaled by its window's mean gap
    (windows of ``window_s`` from the first arrival; a window with fewer than two gaps joins the one before it).
    None when there are fewer than :data:`MIN_GAPS` gaps. Gaps of zero (arrivals at the same instant) count."""
    gaps = [b - a for a, b in itertools.pairwise(times)]
    if len(gaps) < MIN_GAPS:
        return None
    t0 = times[0]
    groups: list[list[float]] = []
    key = None
    for t, gap in zip(times[1:], gaps, strict=True):
        k = int((t - t0) // window_s)
        if k != key or not groups:
            groups.append([])
            key = k
        groups[-1].append(gap)
    merged: list[list[float]] = []
    for g in groups:
        if merged and (len(merged[-1]) < 2 or len(g) < 2):
            merged[-1].extend(g)
        else:
            merged.append(list(g))
    scaled: list[float] = []
    for g in merged:
        m = sum(g) / len(g)
        if m > 0:
            scaled += [x / m for x in g]
    if len(scaled) < MIN_GAPS:
        return None
    mean = sum(scaled) / len(scaled)
    var = sum((x - mean) ** 2 for x in scaled) / len(scaled)
    return math.sqrt(var) / mean if mean > 0 else None


def measure(times: Sequence[float], cv_window_s: float = CV_WINDOW_S) -> tuple[dict[str, float], list[str]]:
    """The profile's ``traffic.burstiness`` section (camelCase) from sorted arrival times, and notes on what could
    not be measured. A peak over a window longer than half the span is left out (one window is not a peak)."""
    out: dict[str, float] = {}
    notes: list[str] = []
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    cv = interarrival_cv(times, cv_window_s)
    if cv is None:
        notes.append(f"inter-arrival cv not measured ({max(0, len(times) - 1)} gaps < {MIN_GAPS}): the plan "
                     "assumes Poisson arrivals (cv 1)")
    else:
        out["interarrivalCv"] = round(cv, 3)
    for w in PEAK_WINDOWS:
        if span >= 2 * w:
            out[f"peakRps{w:g}s"] = round(peak_rate(times, w), 4)
        else:
            notes.append(f"no {w:g}-s peak: the series spans {span:.0f} s (< 2 windows)")
    return out, notes

"""The real-time autoscaling cross-check's measurements (bench/autoscale.py), pure: its traces (a load step, a
diurnal day), attainment per bucket of arrival time, the recovery after a step, GPU-seconds from the replica
samples, the pods' start time, and why requests missed."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

from ..load import loadgen
from ..load.workload import Mix, Request, generate

ATTAINMENT_TARGET = 0.90
# the results' and the table's reason while no hindsight oracle has been applied (autoscale.py ``hindsight``)
HINDSIGHT_PENDING = ("needs a per-bucket sweep of splits in the discrete-event twin (issue 17); no hindsight "
                     "oracle was given to this run")


def step_trace(mix: Mix, base: float, factor: float, pre_s: float, post_s: float, model: str,
               seed: int = 0) -> list[Request]:
    """``base`` req/s for ``pre_s``, then ``factor × base`` for ``post_s`` (one list, arrival times ascending)."""
    a = generate(mix, base, pre_s, model, seed=seed)
    b = generate(mix, base * factor, post_s, model, seed=seed + 1)
    b = [replace(r, at=r.at + pre_s, id=f"{r.id}-s") for r in b]
    return a + b


def diurnal_rate(t: float, day_s: float, trough: float, peak: float) -> float:
    return trough + (peak - trough) * (1 - math.cos(2 * math.pi * t / day_s)) / 2


def diurnal_trace(mix: Mix, trough: float, peak: float, day_s: float, model: str, seed: int = 0) -> list[Request]:
    """Poisson arrivals at ``diurnal_rate`` (thinning of a ``peak``-rate Poisson stream)."""
    rng = random.Random(seed * 7919 + 1)
    return [r for r in generate(mix, peak, day_s, model, seed=seed)
            if rng.random() < diurnal_rate(r.at, day_s, trough, peak) / peak]


def attainment_buckets(arrivals: list[float], met: list[bool], bucket_s: float,
                       until: float | None = None) -> list[dict[str, Any]]:
    """Attainment per bucket of arrival time: [{t0, n, met, attainment}] (empty buckets: attainment None)."""
    end = until if until is not None else (max(arrivals) if arrivals else 0.0)
    nb = max(1, math.ceil(end / bucket_s - 1e-9))
    rows: list[dict[str, Any]] = [{"t0": round(i * bucket_s, 3), "n": 0, "met": 0, "attainment": None}
                                  for i in range(nb)]
    for at, ok in zip(arrivals, met, strict=True):
        i = min(nb - 1, int(at // bucket_s))
        rows[i]["n"] += 1
        rows[i]["met"] += int(ok)
    for r in rows:
        if r["n"]:
            r["attainment"] = round(r["met"] / r["n"], 4)
    return rows


def recovery_time(buckets: list[dict[str, Any]], step_at: float, target: float = ATTAINMENT_TARGET,
                  sustain: int = 3) -> float | None:
    """Seconds from ``step_at`` to the start of the first run of ``sustain`` buckets (or all remaining ones) with
    attainment ≥ target among the buckets starting at/after the step; None when it never recovers."""
    post = [b for b in buckets if b["t0"] >= step_at - 1e-9]
    good = [b["attainment"] is None or b["attainment"] >= target for b in post]
    for i in range(len(post)):
        run = good[i:i + sustain]
        if run and all(run) and (len(run) == sustain or i + len(run) == len(post)):
            return round(float(post[i]["t0"]) - step_at, 3)
    return None


def gpu_seconds(samples: list[dict[str, Any]], t_start: float, t_end: float, gpus: dict[str, int],
                key: str = "ready") -> float:
    """∫ Σ_pool replicas(pool) × gpus[pool] dt over [t_start, t_end], replicas held from each sample to the next."""
    pts = sorted((s["t"], sum(s.get(f"{p}_{key}", 0) * g for p, g in gpus.items())) for s in samples)
    if not pts:
        return 0.0
    total = 0.0
    for i, (t, v) in enumerate(pts):
        nxt = pts[i + 1][0] if i + 1 < len(pts) else t_end
        lo, hi = max(t, t_start), min(nxt, t_end)
        if hi > lo:
            total += v * (hi - lo)
    # before the first sample: the first sample's value
    if pts[0][0] > t_start:
        total += pts[0][1] * (min(pts[0][0], t_end) - t_start)
    return round(total, 2)


def pod_start_s(samples: list[dict[str, Any]], pool: str) -> float | None:
    """From the first sample where desired replicas rose to the first where ready replicas reached it."""
    prev = None
    for i, s in enumerate(samples):
        d = s.get(f"{pool}_desired", 0)
        if prev is not None and d > prev:
            for s2 in samples[i:]:
                if s2.get(f"{pool}_ready", 0) >= d:
                    return round(float(s2["t"]) - float(s["t"]), 2)
            return None
        prev = d
    return None


def miss_causes(results: list[loadgen.Result], ttft_s: float, tpot_s: float) -> dict[str, int]:
    out = {"ttft": 0, "tpot": 0, "error": 0}
    for r in results:
        if not r.ok:
            out["error"] += 1
            continue
        if r.ttft_s is None or r.ttft_s > ttft_s:
            out["ttft"] += 1
        if r.tpot_s is not None and r.tpot_s > tpot_s:
            out["tpot"] += 1
    return out

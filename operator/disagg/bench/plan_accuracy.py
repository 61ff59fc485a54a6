"""``disagg bench plan``: how right the capacity planner is, measured in the discrete-event twin (issue 18).

On **held-out mixes** — the three profiles in :data:`HELD_OUT`, written for this benchmark and never used to
develop or tune the planner (the planner was built against docs/examples/profiles/profile-chat.yaml and
profile-rag.yaml and tests/plan/) — for each mix:

1. **Accuracy.** ``disagg plan`` picks a plan (plan/search.py); its emitted spec runs in the twin (plan/verify.py:
   Poisson arrivals at the profile's peak rate drawn from the profile, ``PICK_REQUESTS`` arrivals or at least
   ``PICK_MIN_DURATION_S`` of virtual time — long, so that a slowly growing queue shows — the first 20 %
   warm-up). Predicted goodput (share of requests meeting both
   SLOs) vs the twin's; target: within ±15 % (relative). The twin's goodput in its worst whole 30-s window whose
   rate is within peakRps is reported beside it.
2. **Pick quality.** A brute-force sweep in the twin over the planner's own candidate space for the mix's one GPU
   type at TP 1 (aggregated D; disaggregated P:D; conditional P:D at up to three of the planner's thresholds: the
   pick's and its neighbours), every split of n GPUs for n = the pick's count − 1 and the pick's count (and beyond,
   until some configuration meets the SLOs in the twin). Fewer GPUs are not swept: if no split of n − 1 GPUs meets
   the SLOs, none of fewer does (the twin's goodput does not rise when GPUs are taken away). Every configuration
   (the pick too) runs ``REQUESTS`` arrivals or at least ``MIN_DURATION_S`` here (shorter than the accuracy run,
   to keep the sweep to minutes). Each configuration
   is emitted and mapped exactly like the pick, and runs until one window after the last arrival (requests still
   unfinished then count as missing the SLOs). "Best" = the cheapest configuration
   that meets the SLOs in the twin (goodput ≥ target, TTFT p95 and TPOT p95 within the targets); ties by twin
   goodput. Target: the pick costs at most 5 % more than the best, and at the pick's GPU count its twin goodput is
   within 5 % of the best configuration's.

**Bursty mixes** (issue 32): the mixes in :data:`ARRIVALS` have their own arrival process — a gamma renewal process
with a given inter-arrival cv, or a two-state MMPP (Poisson at a base rate with bursts at a burst rate) — seeded
and deterministic, ``BURST_DURATION_S`` long at its mean rate. The planner sees them as a user with a request log
would (``disagg plan --from-log``): the profile's ``rate`` is the series' mean and its 60-s peak, and its
``traffic.burstiness`` the cv and 1/10/60-s peaks plan/burst.py measures from the times. Then the pick, the pick
of the same profile with the burstiness left out (what the planner did before issue 32) and every swept
configuration run in the twin on **the mix's own arrival times** (tokens drawn from the profile), and a
configuration *holds* when it meets the SLOs overall and the goodput target in every whole 30-s window (after the
warm-up) whose arrival rate is within the declared peak (peakRps). The sweep starts one GPU below the pick and
walks down while something still holds (so headroom that turns into waste shows) and up until something holds.

The twin is deterministic for a seed, so the numbers do not move with machine load; only the wall times do.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..results import invoked_command, machine_facts, results_doc, write_results

REQUESTS = 600  # per configuration of the sweep
MIN_DURATION_S = 30.0
PICK_REQUESTS = 2000  # the pick's accuracy run: longer, so that a slowly growing queue shows
PICK_MIN_DURATION_S = 120.0
MAX_THRESHOLDS = 3  # conditional thresholds per split in the sweep: the pick's and its neighbours
WARMUP_SHARE = 0.2
ACCURACY_TOL = 0.15
PICK_TOL = 0.05
COMMAND = "disagg bench plan --out docs/results/plan.json"
BURST_DURATION_S = 240.0  # each bursty mix's arrival series (at its mean rate)
WINDOW_S = 30.0  # bursty mixes: the goodput target must hold in every window this long within the declared peak

# Held-out mixes: not used to develop or tune the planner (see the module docstring).
HELD_OUT: dict[str, dict[str, Any]] = {
    "summarise-l40s": {
        "name": "summarise", "model": {"preset": "Llama-3.1-8B"},
        "traffic": {"inputTokens": {"mean": 3000, "p95": 7000}, "outputTokens": {"mean": 150, "p95": 400},
                    "rate": {"meanRps": 5, "peakRps": 8}},
        "slo": {"ttftP95Ms": 1500, "tpotP95Ms": 45, "goodputTarget": 0.9},
        "gpus": [{"type": "L40S", "count": 6, "cost": 0.5, "product": "NVIDIA-L40S"}],
        "search": {"maxGpus": 6, "tensorParallel": [1]},
    },
    "codegen-h100": {
        "name": "codegen", "model": {"preset": "Llama-3.1-8B"},
        "traffic": {"inputTokens": {"mean": 1200, "p95": 3000}, "outputTokens": {"mean": 60, "p95": 150},
                    "rate": {"meanRps": 24, "peakRps": 36}, "prefixCacheHitShare": 0.5},
        "slo": {"ttftP95Ms": 300, "tpotP95Ms": 15, "goodputTarget": 0.9},
        "gpus": [{"type": "H100-SXM", "count": 4, "cost": 1.0, "product": "NVIDIA-H100-80GB-HBM3"}],
        "search": {"maxGpus": 4, "tensorParallel": [1]},
    },
    "agent-a100": {
        "name": "agent", "model": {"preset": "Llama-3.1-8B"},
        "traffic": {"inputTokens": {"mean": 800, "p95": 2000}, "outputTokens": {"mean": 120, "p95": 300},
                    "rate": {"meanRps": 8, "peakRps": 12},
                    "tenants": [{"name": "chat", "share": 0.7},
                                {"name": "tools", "share": 0.3,
                                 "inputTokens": {"histogram": [{"tokens": 3000, "share": 0.5},
                                                               {"tokens": 6000, "share": 0.5}]},
                                 "outputTokens": {"mean": 40, "p95": 100}}]},
        "slo": {"ttftP95Ms": 1000, "tpotP95Ms": 40, "goodputTarget": 0.9},
        "gpus": [{"type": "A100-80GB", "count": 5, "cost": 0.55, "product": "NVIDIA-A100-SXM4-80GB"}],
        "search": {"maxGpus": 5, "tensorParallel": [1]},
    },
}


# Bursty mixes (module docstring): the arrival process of each; its profile in HELD_OUT gets its rate and
# burstiness from the generated series, as `disagg plan --from-log` would.
ARRIVALS: dict[str, dict[str, Any]] = {
    "completion-mmpp-h100": {"kind": "mmpp", "base_rps": 8.0, "burst_rps": 60.0, "base_s": 15.0, "burst_s": 1.0},
    "chat-gamma-l40s": {"kind": "gamma", "mean_rps": 5.0, "cv": 3.0},
}
HELD_OUT.update({
    "completion-mmpp-h100": {
        "name": "completion", "model": {"preset": "Llama-3.1-8B"},
        "traffic": {"inputTokens": {"mean": 1500, "p95": 4000}, "outputTokens": {"mean": 40, "p95": 120},
                    "rate": {"meanRps": 11.25}, "prefixCacheHitShare": 0.3},
        "slo": {"ttftP95Ms": 400, "tpotP95Ms": 20, "goodputTarget": 0.9},
        "gpus": [{"type": "H100-SXM", "count": 6, "cost": 1.0, "product": "NVIDIA-H100-80GB-HBM3"}],
        "search": {"maxGpus": 6, "tensorParallel": [1]},
    },
    "chat-gamma-l40s": {
        "name": "chat-bursty", "model": {"preset": "Llama-3.1-8B"},
        "traffic": {"inputTokens": {"mean": 900, "p95": 2500}, "outputTokens": {"mean": 200, "p95": 500},
                    "rate": {"meanRps": 5}},
        "slo": {"ttftP95Ms": 1000, "tpotP95Ms": 50, "goodputTarget": 0.9},
        "gpus": [{"type": "L40S", "count": 8, "cost": 0.5, "product": "NVIDIA-L40S"}],
        "search": {"maxGpus": 8, "tensorParallel": [1]},
    },
})


def gamma_times(mean_rps: float, cv: float, duration_s: float, seed: int) -> list[float]:
    """A renewal process: gamma inter-arrival times with mean 1/mean_rps and coefficient of variation ``cv``."""
    import random

    rng = random.Random(seed)
    k = 1.0 / (cv * cv)
    out: list[float] = []
    t = 0.0
    while True:
        t += rng.gammavariate(k, 1.0 / (mean_rps * k))
        if t > duration_s:
            return out
        out.append(t)


def mmpp_times(base_rps: float, burst_rps: float, base_s: float, burst_s: float, duration_s: float,
               seed: int) -> list[float]:
    """A two-state Markov-modulated Poisson process: Poisson at ``base_rps`` for exponential sojourns of mean
    ``base_s``, then at ``burst_rps`` for sojourns of mean ``burst_s``; mean rate (base·T0 + burst·T1)/(T0 + T1)."""
    import random

    rng = random.Random(seed)
    out: list[float] = []
    t, burst = 0.0, False
    while t < duration_s:
        end = min(duration_s, t + rng.expovariate(1.0 / (burst_s if burst else base_s)))
        lam = burst_rps if burst else base_rps
        at = t
        while True:
            at += rng.expovariate(lam)
            if at >= end:
                break
            out.append(at)
        t, burst = end, not burst
    return out


def arrival_times(name: str, duration_s: float, seed: int) -> list[float]:
    a = ARRIVALS[name]
    if a["kind"] == "gamma":
        return gamma_times(a["mean_rps"], a["cv"], duration_s, seed)
    return mmpp_times(a["base_rps"], a["burst_rps"], a["base_s"], a["burst_s"], duration_s, seed)


def bursty_profile(data: dict[str, Any], times: list[float]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``data`` with its rate and burstiness measured from ``times`` (as ``disagg plan --from-log`` measures a
    log), and the same without the burstiness (the planner before issue 32)."""
    from ..plan.burst import measure
    from ..plan.reqlog import rates

    mean, peak, _ = rates(times, 60.0)
    b, _ = measure(times)
    b = {k: (max(v, round(mean, 4)) if k.startswith("peakRps") else v) for k, v in b.items()}
    smooth = json.loads(json.dumps(data))
    smooth["traffic"]["rate"] = {"meanRps": round(mean, 4), "peakRps": round(peak, 4)}
    bursty = json.loads(json.dumps(smooth))
    bursty["traffic"]["burstiness"] = b
    return bursty, smooth


@dataclass(frozen=True)
class Twin:
    attainment: float
    ttft_p95_ms: float
    tpot_p95_ms: float
    wall_s: float
    per_path: dict[str, dict[str, float]]
    windows: tuple[dict[str, float], ...] = ()

    def worst_window(self, max_rps: float) -> float | None:
        xs = [w["attainment"] for w in self.windows if w["rps"] <= max_rps * (1 + 1e-9)]
        return min(xs) if xs else None

    def meets(self, target: float, ttft_ms: float, tpot_ms: float, max_rps: float | None = None) -> bool:
        """Goodput and both p95s within target; with ``max_rps`` (bursty mixes) also the goodput target in every
        window whose rate is within it."""
        w = self.worst_window(max_rps) if max_rps is not None else None
        return (self.attainment >= target and not math.isnan(self.ttft_p95_ms) and self.ttft_p95_ms <= ttft_ms
                and (math.isnan(self.tpot_p95_ms) or self.tpot_p95_ms <= tpot_ms)
                and (w is None or w >= target))


def _twin(result: Any, c: Any, arrivals: list[Any], duration: float, seed: int,
          window_s: float | None = None) -> Twin:
    from ..plan.emit import to_model
    from ..plan.verify import cluster_spec, measure
    from ..twin import simulate

    m = cluster_spec(to_model(result, c))
    # requests still unfinished one window after the last arrival have missed the SLOs anyway: stop there
    # (an overloaded configuration would otherwise step through its whole backlog)
    cluster = dataclasses.replace(m.cluster, drain_s=duration)
    r = simulate(cluster, arrivals, seed=seed, slo=m.slo, window_s=duration)
    s = measure(r, m.slo, warmup_s=duration * WARMUP_SHARE, window_width_s=window_s)
    return Twin(s.attainment, s.ttft_p95_ms, s.tpot_p95_ms, r.wall_s,
                {k: {m: round(x, 2) for m, x in v.items() if not math.isnan(x)} for k, v in s.per_path.items()},
                tuple(s.windows))


def _configs(ev: Any, key: tuple[str, int], n: int, thresholds: list[int], rate: float) -> list[Any]:
    """Every configuration of n GPUs of one shape (TP 1) in the planner's space, as planner candidates."""
    out = [ev.evaluate("aggregated", math.inf, None, 0, key, n, rate)]
    for p in range(1, n):
        out.append(ev.evaluate("disaggregated", 0, key, p, key, n - p, rate))
        for t in thresholds:
            out.append(ev.evaluate("conditional", t, key, p, key, n - p, rate))
    return out


def near(thresholds: list[int], pick: int | None) -> list[int]:
    """At most MAX_THRESHOLDS of the planner's conditional thresholds: the pick's and its neighbours (or the middle
    ones when the pick is not conditional)."""
    if len(thresholds) <= MAX_THRESHOLDS:
        return thresholds
    i = thresholds.index(pick) if pick in thresholds else len(thresholds) // 2
    lo = min(max(0, i - MAX_THRESHOLDS // 2), len(thresholds) - MAX_THRESHOLDS)
    return thresholds[lo:lo + MAX_THRESHOLDS]


def run_mix(name: str, data: dict[str, Any], seed: int = 0, say: Any = print) -> dict[str, Any]:
    from ..perf.presets import TRANSPORTS
    from ..plan.arrivals import profile_arrivals
    from ..plan.model import build_workload
    from ..plan.profile import parse_profile
    from ..plan.search import Evaluator, search, thresholds_for

    p = parse_profile(data)
    res = search(p)
    pick = res.ranked[0]
    rate = p.traffic.rate.peak
    slo = p.slo
    long_s = max(PICK_MIN_DURATION_S, PICK_REQUESTS / rate)
    long_arrivals = profile_arrivals(p, long_s, rate=rate, seed=seed)
    t_pick = _twin(res, pick, long_arrivals, long_s, seed, WINDOW_S)
    say(f"{name}: pick {pick.label()} predicted {pick.goodput:.1%}, twin {t_pick.attainment:.1%} "
        f"({len(long_arrivals)} arrivals over {long_s:g} s)")
    duration = max(MIN_DURATION_S, REQUESTS / rate)
    arrivals = profile_arrivals(p, duration, rate=rate, seed=seed)
    t_sweep = _twin(res, pick, arrivals, duration, seed)
    wl = build_workload(p)
    ev = Evaluator(p, wl, p.model.resolve(), TRANSPORTS[p.kv_transport])
    key = (p.gpus[0].type, 1)
    thresholds = near(thresholds_for(wl), pick.threshold)
    sweep: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    n = max(1, pick.gpus - 1)
    while n <= p.search.max_gpus:
        for c in _configs(ev, key, n, thresholds, rate):
            t = t_sweep if c.label() == pick.label() else _twin(res, c, arrivals, duration, seed)
            row = {"config": c.label(), "gpus": c.gpus, "cost_per_hour": round(c.cost_per_hour, 3),
                   "predicted": round(c.goodput, 4), "planner_feasible": c.feasible,
                   "twin": round(t.attainment, 4), "twin_ttft_p95_ms": _r(t.ttft_p95_ms),
                   "twin_tpot_p95_ms": _r(t.tpot_p95_ms),
                   "twin_feasible": t.meets(slo.goodput_target, slo.ttft_p95_ms, slo.tpot_p95_ms)}
            sweep.append(row)
            if row["twin_feasible"] and (best is None or (row["cost_per_hour"], -row["twin"])
                                         < (best["cost_per_hour"], -best["twin"])):
                best = row
        say(f"{name}: swept {n} GPUs ({len(sweep)} configurations so far)"
            + (f", best so far {best['config']} ({best['twin']:.1%})" if best else ""))
        if best is not None and n >= pick.gpus:
            break
        n += 1
    err = (pick.goodput - t_pick.attainment) / t_pick.attainment if t_pick.attainment > 0 else math.inf
    at_pick = [r for r in sweep if r["gpus"] == pick.gpus]
    best_at = max((r["twin"] for r in at_pick), default=t_sweep.attainment)
    pick_ok = t_sweep.meets(slo.goodput_target, slo.ttft_p95_ms, slo.tpot_p95_ms)
    cost_gap = (pick.cost_per_hour / best["cost_per_hour"] - 1) if best else None
    gp_gap = (best_at - t_sweep.attainment) / best_at if best_at > 0 else 0.0
    return {
        "mix": name, "profile": data, "peak_rps": rate, "duration_s": duration, "arrivals": len(arrivals),
        "pick": {"config": pick.label(), "gpus": pick.gpus, "cost_per_hour": round(pick.cost_per_hour, 3),
                 "planner_feasible": pick.feasible, "predicted": round(pick.goodput, 4),
                 "predicted_ttft_p95_ms": _r(pick.ttft_p95_ms), "predicted_tpot_p95_ms": _r(pick.tpot_p95_ms),
                 "twin": round(t_pick.attainment, 4), "twin_ttft_p95_ms": _r(t_pick.ttft_p95_ms),
                 "twin_tpot_p95_ms": _r(t_pick.tpot_p95_ms), "twin_per_path": t_pick.per_path,
                 "twin_duration_s": long_s, "twin_arrivals": len(long_arrivals), "twin_wall_s": round(t_pick.wall_s, 1),
                 "twin_worst_window": t_pick.worst_window(rate), "twin_windows": list(t_pick.windows),
                 "twin_sweep_run": round(t_sweep.attainment, 4), "twin_feasible": pick_ok},
        "accuracy": {"error": round(err, 4), "ok": abs(err) <= ACCURACY_TOL},
        "best": best, "cost_gap": None if cost_gap is None else round(cost_gap, 4),
        "goodput_gap_at_pick_gpus": round(gp_gap, 4),
        "pick_ok": bool(best is not None and pick_ok and cost_gap is not None and cost_gap <= PICK_TOL
                        and gp_gap <= PICK_TOL),
        "sweep": sweep,
    }


def run_bursty_mix(name: str, data: dict[str, Any], seed: int = 0, say: Any = print) -> dict[str, Any]:
    """A bursty mix (module docstring): the planner on the measured profile, the pick, the smooth planner's pick and
    a sweep, all in the twin on the mix's own arrival times, judged per 30-s window within the declared peak."""
    from ..perf.presets import TRANSPORTS
    from ..plan.arrivals import profile_arrivals
    from ..plan.model import build_workload
    from ..plan.profile import parse_profile
    from ..plan.search import Evaluator, search, thresholds_for

    times = arrival_times(name, BURST_DURATION_S, seed)
    bdata, sdata = bursty_profile(data, times)
    p, p0 = parse_profile(bdata), parse_profile(sdata)
    res, res0 = search(p), search(p0)
    pick, pick0 = res.ranked[0], res0.ranked[0]
    slo = p.slo
    peak = p.traffic.rate.peak
    duration = BURST_DURATION_S
    arrivals = profile_arrivals(p, duration, seed=seed, times=times)

    def judge(r: Any, c: Any) -> Twin:
        return _twin(r, c, arrivals, duration, seed, WINDOW_S)

    def holds(t: Twin) -> bool:
        return t.meets(slo.goodput_target, slo.ttft_p95_ms, slo.tpot_p95_ms, peak)

    t_pick = judge(res, pick)
    t0 = t_pick if pick0.label() == pick.label() else judge(res0, pick0)
    say(f"{name}: {len(times)} arrivals, cv {p.traffic.burstiness.interarrival_cv:g}, peak {peak:g} req/s; pick "
        f"{pick.label()} ({pick.gpus} GPUs) twin {t_pick.attainment:.1%} (worst window "
        f"{t_pick.worst_window(peak)}); smooth pick {pick0.label()} twin {t0.attainment:.1%} (worst window "
        f"{t0.worst_window(peak)})")
    wl = build_workload(p)
    ev = Evaluator(p, wl, p.model.resolve(), TRANSPORTS[p.kv_transport])
    key = (p.gpus[0].type, 1)
    thresholds = near(thresholds_for(wl), pick.threshold)
    sweep: list[dict[str, Any]] = []
    done: set[int] = set()

    def sweep_n(n: int) -> bool:
        found = False
        for c in _configs(ev, key, n, thresholds, peak):
            t = t_pick if c.label() == pick.label() else t0 if c.label() == pick0.label() else judge(res, c)
            w = t.worst_window(peak)
            row = {"config": c.label(), "gpus": c.gpus, "cost_per_hour": round(c.cost_per_hour, 3),
                   "predicted": round(c.goodput, 4), "planner_feasible": c.feasible,
                   "twin": round(t.attainment, 4), "twin_worst_window": w, "twin_ttft_p95_ms": _r(t.ttft_p95_ms),
                   "twin_tpot_p95_ms": _r(t.tpot_p95_ms), "twin_feasible": holds(t)}
            sweep.append(row)
            found = found or row["twin_feasible"]
        done.add(n)
        say(f"{name}: swept {n} GPUs ({len(sweep)} configurations so far){', one holds' if found else ''}")
        return found

    n = max(1, pick.gpus - 1)
    if sweep_n(n):
        while n > 1 and sweep_n(n - 1):
            n -= 1
    else:
        while n < p.search.max_gpus:
            n += 1
            if sweep_n(n) and n >= pick.gpus:
                break
    good = [r for r in sweep if r["twin_feasible"]]
    best = min(good, key=lambda r: (r["cost_per_hour"], -r["twin"])) if good else None
    err = (pick.goodput - t_pick.attainment) / t_pick.attainment if t_pick.attainment > 0 else math.inf
    pick_ok = holds(t_pick)
    at_pick = [r for r in sweep if r["gpus"] == pick.gpus]
    best_at = max((r["twin"] for r in at_pick), default=t_pick.attainment)
    cost_gap = (pick.cost_per_hour / best["cost_per_hour"] - 1) if best else None
    gpu_gap = pick.gpus - best["gpus"] if best else None
    b = p.traffic.burstiness
    return {
        "mix": name, "profile": bdata, "arrival_process": ARRIVALS[name], "peak_rps": peak,
        "mean_rps": p.traffic.rate.mean_rps, "burstiness": b.model_dump(by_alias=True, exclude_none=True),
        "cover_rps": round(res.cover_rps, 4), "cover": res.cover_what,
        "duration_s": duration, "arrivals": len(arrivals), "window_s": WINDOW_S,
        "pick": {"config": pick.label(), "gpus": pick.gpus, "cost_per_hour": round(pick.cost_per_hour, 3),
                 "planner_feasible": pick.feasible, "predicted": round(pick.goodput, 4),
                 "predicted_ttft_p95_ms": _r(pick.ttft_p95_ms), "predicted_tpot_p95_ms": _r(pick.tpot_p95_ms),
                 "margin": pick.margin.to_dict() if pick.margin else None,
                 "twin": round(t_pick.attainment, 4), "twin_ttft_p95_ms": _r(t_pick.ttft_p95_ms),
                 "twin_tpot_p95_ms": _r(t_pick.tpot_p95_ms), "twin_per_path": t_pick.per_path,
                 "twin_worst_window": t_pick.worst_window(peak), "twin_windows": list(t_pick.windows),
                 "twin_duration_s": duration, "twin_arrivals": len(arrivals), "twin_wall_s": round(t_pick.wall_s, 1),
                 "twin_sweep_run": round(t_pick.attainment, 4), "twin_feasible": pick_ok},
        "smooth_pick": {"config": pick0.label(), "gpus": pick0.gpus, "cost_per_hour": round(pick0.cost_per_hour, 3),
                        "predicted": round(pick0.goodput, 4), "twin": round(t0.attainment, 4),
                        "twin_worst_window": t0.worst_window(peak), "twin_windows": list(t0.windows),
                        "twin_feasible": holds(t0)},
        "accuracy": {"error": round(err, 4), "ok": abs(err) <= ACCURACY_TOL},
        "best": best, "cost_gap": None if cost_gap is None else round(cost_gap, 4), "gpu_gap": gpu_gap,
        "goodput_gap_at_pick_gpus": round((best_at - t_pick.attainment) / best_at if best_at > 0 else 0.0, 4),
        "pick_ok": bool(best is not None and pick_ok and gpu_gap is not None and gpu_gap <= 1),
        "swept_gpus": sorted(done),
        "sweep": sweep,
    }


def _r(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 2)


def run(mixes: list[str] | None = None, seed: int = 0, out: Path | None = None, say: Any = print) -> dict[str, Any]:
    t0 = time.perf_counter()
    rows = [(run_bursty_mix if m in ARRIVALS else run_mix)(m, HELD_OUT[m], seed, say)
            for m in (mixes or list(HELD_OUT))]
    results = {"accuracy_tolerance": ACCURACY_TOL, "pick_tolerance": PICK_TOL, "requests": REQUESTS,
               "pick_requests": PICK_REQUESTS, "pick_min_duration_s": PICK_MIN_DURATION_S,
               "max_thresholds": MAX_THRESHOLDS,
               "min_duration_s": MIN_DURATION_S, "warmup_share": WARMUP_SHARE, "seed": seed,
               "burst_duration_s": BURST_DURATION_S, "window_s": WINDOW_S,
               "wall_s": round(time.perf_counter() - t0, 1), "mixes": rows}
    doc = results_doc("plan", invoked_command(COMMAND), results, machine_facts())
    if out is not None:
        write_results(out, doc)
    return doc


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}" if x >= 100 else f"{x:.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def render_tables(results_doc: dict[str, Any]) -> dict[str, str]:
    res = results_doc["results"]
    w = res.get("window_s", WINDOW_S)
    acc = ["| mix | planner's pick | predicted goodput | twin goodput | error | within ±"
           f"{res['accuracy_tolerance']:.0%} | TTFT / TPOT p95 ms predicted | TTFT / TPOT p95 ms twin | "
           f"twin: worst {w:g}-s window ≤ peakRps |",
           "|---|---|---:|---:|---:|---|---:|---:|---:|"]
    pick = ["| mix | pick (GPUs) | meets SLOs in the twin | best in the twin sweep (GPUs) | configurations swept | "
            f"cost gap | goodput gap at the pick's GPUs | within {res['pick_tolerance']:.0%} |",
            "|---|---|---|---|---:|---:|---:|---|"]
    for m in res["mixes"]:
        pk = m["pick"]
        acc.append(f"| {m['mix']} | {pk['config']} | {pk['predicted']:.1%} | {pk['twin']:.1%} | "
                   f"{_pct(m['accuracy']['error'])} | {'yes' if m['accuracy']['ok'] else '**no**'} | "
                   f"{_ms(pk.get('predicted_ttft_p95_ms'))} / {_ms(pk.get('predicted_tpot_p95_ms'))} | "
                   f"{_ms(pk['twin_ttft_p95_ms'])} / {_ms(pk['twin_tpot_p95_ms'])} | "
                   f"{_share(pk.get('twin_worst_window'))} |")
        b = m["best"]
        pick.append(f"| {m['mix']} | {pk['config']} ({pk['gpus']}) | {'yes' if pk['twin_feasible'] else '**no**'} | "
                    + (f"{b['config']} ({b['gpus']}) | " if b else "none within the budget | ")
                    + f"{len(m['sweep'])} | {_pct(m['cost_gap'])} | {_pct(m['goodput_gap_at_pick_gpus'])} | "
                    f"{'yes' if m['pick_ok'] else '**no**'} |")
    return {"accuracy": "\n".join(acc), "pick": "\n".join(pick), "bursty": _bursty_table(res)}


def _process(a: dict[str, Any]) -> str:
    if a["kind"] == "gamma":
        return f"gamma renewal, cv {a['cv']:g}, {a['mean_rps']:g} req/s"
    return (f"MMPP: {a['base_rps']:g} req/s, bursts of {a['burst_rps']:g} req/s ({a['burst_s']:g} s mean, every "
            f"{a['base_s']:g} s)")


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _bursty_table(res: dict[str, Any]) -> str:
    w = res.get("window_s", WINDOW_S)
    out = [f"| mix | arrivals | measured: mean · 60-s peak (peakRps) · 10-s · 1-s peak req/s, cv | sized for req/s | "
           f"pick (GPUs) | twin goodput · worst {w:g}-s window ≤ peakRps | holds | smooth planner's pick (GPUs) | "
           f"its goodput · worst window | cheapest that holds (GPUs) | pick's GPUs over it |",
           "|---|---|---|---:|---|---|---|---|---|---|---:|"]
    for m in res["mixes"]:
        if "arrival_process" not in m:
            continue
        b, pk, sm, best = m["burstiness"], m["pick"], m["smooth_pick"], m["best"]
        out.append(
            f"| {m['mix']} | {_process(m['arrival_process'])} | {m['mean_rps']:.3g} · {m['peak_rps']:.3g} · "
            f"{b.get('peakRps10s', math.nan):.3g} · {b.get('peakRps1s', math.nan):.3g}, cv "
            f"{b.get('interarrivalCv', 1.0):g} | {m['cover_rps']:.3g} | {pk['config']} ({pk['gpus']}) | "
            f"{pk['twin']:.1%} · {_share(pk['twin_worst_window'])} | {'yes' if pk['twin_feasible'] else '**no**'} | "
            f"{sm['config']} ({sm['gpus']}) | {sm['twin']:.1%} · {_share(sm['twin_worst_window'])}"
            f"{'' if sm['twin_feasible'] else ' (**misses**)'} | "
            + (f"{best['config']} ({best['gpus']})" if best else "none within the budget")
            + f" | {'-' if m['gpu_gap'] is None else format(m['gpu_gap'], '+d')} |")
    return "\n".join(out)


def table(doc: dict[str, Any]) -> str:
    t = render_tables(doc)
    return t["accuracy"] + "\n\n" + t["pick"] + "\n\n" + t["bursty"]

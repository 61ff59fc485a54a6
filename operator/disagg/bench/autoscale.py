"""``disagg bench autoscale``: the SLO-driven autoscaler on the local stack (issue 6, "Benchmark").

Since issue 28 this real-time part is the small cross-check; the measurement at cluster scale is the virtual-time
part, ``disagg bench autoscale --virtual`` (disagg.bench.autoscale_day: a compressed day in the twin, predictive vs
proportional vs Dynamo-style reactive scaling, static peak and hindsight oracle).

Everything runs on the local stack (``disagg.local.stack.LocalStack``: real control plane, the operator, pods as
``disagg sim`` processes on their own loopback IPs, a real Prometheus) with the demo model
(docs/examples/local-demo.yaml: L40S sims in real time, ``autoscaling.intervalSeconds`` 5, max 3 replicas per
pool). Three parts, each on a fresh DisaggregatedModel (the previous one deleted first):

1. **Load step**: ``base_rate`` for ``step_pre_s``, then ``step_factor × base_rate`` for ``step_post_s``, one
   open-loop stream. SLO attainment (share of requests meeting TTFT *and* TPOT SLOs) per ``bucket_s`` bucket of
   *arrival* time. The step *breached* when a bucket after it fell below 90 %; then recovery time = from the step to
   the start of the first run of ``sustain`` consecutive buckets with attainment ≥ 90 %, also in autoscaler
   intervals. Target: ≤ 2 × intervalSeconds + pod start (pod start measured from the timeline: desired replicas
   up → ready replicas up). A step that never breached measures no recovery: it is reported ``n/a``, not met. The
   default step (0.5 → 3 req/s, the diurnal trough to its peak) is sized to breach what 1P + 1D holds.
2. **Diurnal trace**: one compressed "day" of ``day_s`` wall seconds, rate(t) = trough + (peak − trough) ·
   (1 − cos 2πt/day)/2 (non-homogeneous Poisson, thinned from the peak rate). GPU-seconds = ∫ (ready prefill +
   ready decode replicas) × GPUs per replica dt over the day, from the status timeline (sampled each second).
3. **Static peak allocation** (``static_peak``): the cheapest fixed prefill + decode split meeting ≥ 90 %
   attainment at the trace's *peak* rate, autoscaling off — what a static deployment sized for the peak costs.
   Simplification for the 2-core budget: a greedy climb of short probes (``probe_s`` at the peak rate, per
   candidate split) from 1 + 1, adding a prefill replica when TTFT misses dominate and a decode replica when TPOT
   misses do; its GPU-seconds = its GPUs × ``day_s``.

The **hindsight oracle** (per time bucket of the day, the fewest GPUs whose split meets the SLO at that bucket's
load) is a :data:`HindsightOracle`: a function of the day's per-bucket load (:class:`BucketLoad`, kept in the
results as ``diurnal.load_buckets``) returning GPUs per bucket. It comes from a sweep in the discrete-event twin;
until one is passed to :func:`run` (or applied to a results file with :func:`with_hindsight`), the results and the
docs' table say ``pending`` with :data:`HINDSIGHT_PENDING` as the reason.

Results: a table on stdout and docs/results/autoscale.json (``--out``; the convention of
:mod:`disagg.bench.docs`, whose ``render_tables`` is below). Every process started is stopped at the end
(LocalStack.stop), also on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..load import loadgen
from ..load.workload import Mix, Request, RequestClass, generate
from ..local.harness import ModelHarness, router_workers_at
from ..local.stack import LocalStack
from ..results import invoked_command, machine_facts, results_doc, write_results

ATTAINMENT_TARGET = 0.90

# Long RAG prompts (prefill-heavy, remote prefill) next to long streams (decode-heavy): a 3× step needs both pools.
AUTOSCALE_MIX = Mix("autoscale", "long RAG prompts (remote prefill) + long streams", (
    RequestClass("rag", 0.6, (6000, 10000), (64, 128), tenant="rag"),
    RequestClass("stream", 0.4, (128, 512), (300, 600), tenant="stream"),
))


@dataclass
class Settings:
    base_rate: float = 0.5  # requests/s before the step: 1P + 1D holds it (the diurnal trough)
    step_factor: float = 6.0  # to 3 req/s, the diurnal peak: beyond what 1P + 1D holds, so the step breaches
    step_pre_s: float = 30.0
    step_post_s: float = 75.0
    trough_rate: float = 0.5
    peak_rate: float = 3.0
    day_s: float = 150.0
    probe_s: float = 25.0
    max_probes: int = 5
    bucket_s: float = 5.0
    sustain: int = 3  # consecutive buckets ≥ target that count as recovered
    scale_down_stabilization_s: int = 30  # the demo's 60 s, halved for the compressed day
    max_replicas: int = 3
    seed: int = 0
    parts: tuple[str, ...] = ("step", "diurnal", "static_peak")


PARTS = ("step", "diurnal", "static_peak")


def command_line(s: Settings) -> str:
    """The ``disagg bench autoscale`` command that runs these settings."""
    return (f"disagg bench autoscale --parts {' '.join(s.parts)} --base-rate {s.base_rate:g} --step-factor "
            f"{s.step_factor:g} --step-pre {s.step_pre_s:g} --step-post {s.step_post_s:g} --trough-rate "
            f"{s.trough_rate:g} --peak-rate {s.peak_rate:g} --day {s.day_s:g} --probe {s.probe_s:g} "
            f"--scale-down-stabilization {s.scale_down_stabilization_s} --seed {s.seed}")


# ---------------------------------------------------------------------------------------------------- pure helpers
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


# ------------------------------------------------------------------------------------------ the hindsight oracle
@dataclass(frozen=True)
class BucketLoad:
    """The offered load of one time bucket of the day."""

    t0: float  # seconds into the day
    duration_s: float
    rate: float  # the trace's offered rate, requests/s (mean of diurnal_rate over the bucket)
    requests: int  # arrivals in the bucket (Poisson around rate × duration)
    by_class: dict[str, int]  # arrivals per request class of the mix


# Per bucket, the fewest GPUs whose best prefill/decode split meets the SLO at that bucket's load (same order and
# length as the buckets).
HindsightOracle = Callable[[list[BucketLoad]], list[int]]

HINDSIGHT_PENDING = ("needs a per-bucket sweep of splits in the discrete-event twin (issue 17); no hindsight "
                     "oracle was given to this run")


def load_buckets(requests: list[Request], day_s: float, trough: float, peak: float,
                 bucket_s: float) -> list[BucketLoad]:
    """The day's load per ``bucket_s`` bucket: offered rate (the mean of :func:`diurnal_rate`) and arrivals."""
    n = max(1, math.ceil(day_s / bucket_s - 1e-9))
    out = []
    for i in range(n):
        t0, t1 = i * bucket_s, min(day_s, (i + 1) * bucket_s)
        steps = 20
        rate = sum(diurnal_rate(t0 + (k + 0.5) * (t1 - t0) / steps, day_s, trough, peak) for k in range(steps)) / steps
        inside = [r for r in requests if t0 <= r.at < t1]
        by_class: dict[str, int] = {}
        for r in inside:
            by_class[r.cls] = by_class.get(r.cls, 0) + 1
        out.append(BucketLoad(round(t0, 3), round(t1 - t0, 3), round(rate, 4), len(inside), by_class))
    return out


def hindsight(buckets: list[BucketLoad], oracle: HindsightOracle | None) -> dict[str, Any]:
    """GPU-seconds of the hindsight oracle over the buckets, or ``pending`` with the reason."""
    if oracle is None:
        return {"status": "pending", "reason": HINDSIGHT_PENDING}
    gpus = oracle(buckets)
    if len(gpus) != len(buckets):
        raise ValueError(f"hindsight oracle returned {len(gpus)} GPU counts for {len(buckets)} buckets")
    return {"status": "measured", "gpus": list(gpus),
            "gpu_seconds": round(sum(g * b.duration_s for g, b in zip(gpus, buckets, strict=True)), 2)}


def with_hindsight(doc: dict[str, Any], oracle: HindsightOracle) -> dict[str, Any]:
    """A results document (docs/results/autoscale.json) with the hindsight oracle computed from its recorded
    ``diurnal.load_buckets``: no re-run of the stack needed."""
    res = json.loads(json.dumps(doc))
    day = res["results"].get("diurnal")
    if not day:
        raise ValueError("the results have no diurnal part")
    buckets = [BucketLoad(**b) for b in day["load_buckets"]]
    day["hindsight"] = hindsight(buckets, oracle)
    _ratios(res["results"])
    return res


def _ratios(results: dict[str, Any]) -> None:
    """The diurnal day's GPU-seconds against the static peak allocation and the hindsight oracle."""
    day, static = results.get("diurnal"), results.get("static_peak")
    if not day:
        return
    if static and static.get("split"):
        static["gpu_seconds"] = static["split"]["gpus"] * day["day_s"]
        day["vs_static_peak"] = round(day["gpu_seconds_ready"] / static["gpu_seconds"], 4)
    elif static:
        day["vs_static_peak"] = None
    h = day.get("hindsight") or {}
    day["vs_hindsight"] = round(day["gpu_seconds_ready"] / h["gpu_seconds"], 4) \
        if h.get("status") == "measured" and h.get("gpu_seconds") else None


# ---------------------------------------------------------------------------------------------------- the stack
def _say(msg: str) -> None:
    print(f"==> {msg}", flush=True)


class _Bench:
    def __init__(self, s: Settings, log_dir: Path | None, hindsight: HindsightOracle | None = None) -> None:
        self.s = s
        self.hindsight = hindsight
        self.stack = LocalStack(log_dir=log_dir, sim_env={"DISAGG_SIM_TIME_SCALE": "1.0"})
        self.models: list[ModelHarness] = []
        self.ttft_s = self.tpot_s = 0.0
        self.model = ""

    def start(self) -> None:
        self.stack.start(say=_say)

    def stop(self) -> None:
        for d in self.models:
            d.stop()
        self.stack.stop()

    def deploy(self, name: str, overrides: dict[str, Any]) -> ModelHarness:
        d = ModelHarness(self.stack, name=name)
        self.models.append(d)
        d.deploy(overrides, timeout=120)
        self.ttft_s, self.tpot_s = d.slo[0] / 1000, d.slo[1] / 1000
        self.model = d.served_name
        return d

    def delete(self, model: ModelHarness) -> None:
        from kubernetes import client

        from ..api import GROUP, PLURAL, VERSION

        model.stop()
        client.CustomObjectsApi(self.stack.api).delete_namespaced_custom_object(
            GROUP, VERSION, self.stack.namespace, PLURAL, model.name)
        self.stack.wait_for(lambda: not any(self.stack.pods(model.name, r) for r in ("prefill", "decode", "router")),
                            60, f"the pods of {model.name} to be gone")

    def drive(self, model: ModelHarness, requests: list[Request]) -> tuple[float, list[loadgen.Result]]:
        """Runs the requests open-loop through the model's router; returns (start on its clock, results)."""
        start = time.monotonic() - model.t0
        n = [0]

        def on_done(_: loadgen.Result) -> None:
            n[0] += 1
            if n[0] % max(1, len(requests) // 4) == 0:
                print(f"    {n[0]}/{len(requests)} requests done", flush=True)

        return start, model.send(requests, on_done, timeout_s=120)

    def met(self, results: list[loadgen.Result]) -> list[bool]:
        return [r.meets(self.ttft_s, self.tpot_s) for r in results]


def _autoscaled(s: Settings) -> dict[str, Any]:
    return {"autoscaling": {"enabled": True, "scaleDownStabilizationSeconds": s.scale_down_stabilization_s},
            "prefill": {"replicas": 1, "minReplicas": 1, "maxReplicas": s.max_replicas},
            "decode": {"replicas": 1, "minReplicas": 1, "maxReplicas": s.max_replicas}}


def _gpus(model: ModelHarness, stack: LocalStack) -> dict[str, int]:
    spec = stack.model(model.name)["spec"]
    return {p: int(((spec.get(p) or {}).get("gpu") or {}).get("count", 1)) for p in ("prefill", "decode")}


def _window(samples: list[dict[str, Any]], t0: float, t1: float) -> list[dict[str, Any]]:
    return [{**x, "t": round(x["t"] - t0, 2)} for x in samples if t0 - 1 <= x["t"] <= t1 + 1]


def run_step(b: _Bench) -> dict[str, Any]:
    s = b.s
    _say(f"part 1: load step {s.base_rate:g} → {s.base_rate * s.step_factor:g} req/s (×{s.step_factor:g}) "
         f"after {s.step_pre_s:g} s, {s.step_post_s:g} s at the higher rate")
    d = b.deploy("as-step", _autoscaled(s))
    interval = int(b.stack.model(d.name)["spec"]["autoscaling"]["intervalSeconds"])
    reqs = step_trace(AUTOSCALE_MIX, s.base_rate, s.step_factor, s.step_pre_s, s.step_post_s, b.model, s.seed)
    start, results = b.drive(d, reqs)
    end = time.monotonic() - d.t0
    at = {r.id: r.at for r in reqs}
    arrivals = [at[r.id] for r in results]
    met = b.met(results)
    buckets = attainment_buckets(arrivals, met, s.bucket_s, until=s.step_pre_s + s.step_post_s)
    rec = recovery_time(buckets, s.step_pre_s, sustain=s.sustain)
    samples = _window(d.timeline.samples, start, end)
    starts = [x for x in (pod_start_s(samples, p) for p in ("prefill", "decode")) if x is not None]
    pod_start = max(starts) if starts else None
    target = 2 * interval + (pod_start or 0.0)
    pre = [m for a, m in zip(arrivals, met, strict=True) if a < s.step_pre_s]
    post = [m for a, m in zip(arrivals, met, strict=True) if a >= s.step_pre_s]
    worst = min((x["attainment"] for x in buckets if x["t0"] >= s.step_pre_s and x["attainment"] is not None),
                default=None)
    breached = worst is not None and worst < ATTAINMENT_TARGET
    out = {
        "base_rate": s.base_rate, "step_rate": s.base_rate * s.step_factor, "step_at_s": s.step_pre_s,
        "interval_s": interval, "requests": len(results), "errors": sum(not r.ok for r in results),
        "attainment_before": round(sum(pre) / max(1, len(pre)), 4),
        "attainment_after": round(sum(post) / max(1, len(post)), 4),
        "min_bucket_attainment_after": worst, "breached": breached,
        # a step that never breached measures no recovery: n/a (None), not met
        "recovery_s": rec if breached else None,
        "recovery_intervals": round(rec / interval, 2) if breached and rec is not None else None,
        "pod_start_s": pod_start, "target_s": target,
        "met_target": (rec is not None and rec <= target) if breached else None,
        "max_replicas": {p: max((x[f"{p}_ready"] for x in samples), default=0) for p in ("prefill", "decode")},
        "misses": miss_causes(results, b.ttft_s, b.tpot_s),
        "buckets": buckets, "timeline": samples,
    }
    b.delete(d)
    return out


def run_diurnal(b: _Bench) -> dict[str, Any]:
    s = b.s
    _say(f"part 2: diurnal trace, one day = {s.day_s:g} s, {s.trough_rate:g} → {s.peak_rate:g} → "
         f"{s.trough_rate:g} req/s")
    d = b.deploy("as-day", _autoscaled(s))
    gpus = _gpus(d, b.stack)
    reqs = diurnal_trace(AUTOSCALE_MIX, s.trough_rate, s.peak_rate, s.day_s, b.model, s.seed + 10)
    load = load_buckets(reqs, s.day_s, s.trough_rate, s.peak_rate, s.bucket_s)
    start, results = b.drive(d, reqs)
    end = time.monotonic() - d.t0
    samples = _window(d.timeline.samples, start, end)
    at = {r.id: r.at for r in reqs}
    arrivals = [at[r.id] for r in results]
    met = b.met(results)
    out = {
        "trough_rate": s.trough_rate, "peak_rate": s.peak_rate, "day_s": s.day_s, "requests": len(results),
        "errors": sum(not r.ok for r in results), "attainment": round(sum(met) / max(1, len(met)), 4),
        "gpus_per_replica": gpus,
        # the day is [0, day_s] on the arrivals' clock; the drain after the last arrival is not counted
        "gpu_seconds_ready": gpu_seconds(samples, 0.0, s.day_s, gpus, "ready"),
        "gpu_seconds_desired": gpu_seconds(samples, 0.0, s.day_s, gpus, "desired"),
        "wall_s": round(end - start, 1),
        "max_replicas": {p: max((x[f"{p}_ready"] for x in samples), default=0) for p in ("prefill", "decode")},
        "misses": miss_causes(results, b.ttft_s, b.tpot_s),
        "buckets": attainment_buckets(arrivals, met, s.day_s / 10, until=s.day_s),
        "load_buckets": [asdict(x) for x in load], "hindsight": hindsight(load, b.hindsight), "timeline": samples,
    }
    b.delete(d)
    return out


def run_static_peak(b: _Bench) -> dict[str, Any]:
    s = b.s
    _say(f"part 3: the cheapest static allocation that holds the peak — probes of {s.probe_s:g} s at the peak rate "
         f"{s.peak_rate:g} req/s, autoscaling off, from 1 + 1 up")
    p, dd = 1, 1
    d = b.deploy("as-static", {"autoscaling": {"enabled": False},
                               "prefill": {"replicas": p, "minReplicas": 1, "maxReplicas": s.max_replicas},
                               "decode": {"replicas": dd, "minReplicas": 1, "maxReplicas": s.max_replicas}})
    gpus = _gpus(d, b.stack)
    probes: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    for i in range(s.max_probes):
        b.stack.patch_spec(d.name, {"prefill": {"replicas": p}, "decode": {"replicas": dd}})
        want = {"prefill": p, "decode": dd}

        def split_serving(want: dict[str, int] = want) -> bool:
            """Exactly the wanted pods exist and are ready, and the router knows them (its endpoint refresh)."""
            pods = all(len(b.stack.pods(d.name, pool)) == n and len(b.stack.ready_pod_ips(d.name, pool)) == n
                       for pool, n in want.items())
            url = b.stack.router_url(d.name) if pods else None
            known = router_workers_at(url) if url else {}
            return pods and all(known.get(pool, 0) == n for pool, n in want.items())

        b.stack.wait_for(split_serving, 90, f"{p} prefill + {dd} decode ready and known to the router")
        reqs = generate(AUTOSCALE_MIX, s.peak_rate, s.probe_s, b.model, seed=s.seed + 100 + i)
        _, results = b.drive(d, reqs)
        met = b.met(results)
        att = round(sum(met) / max(1, len(met)), 4)
        misses = miss_causes(results, b.ttft_s, b.tpot_s)
        probe = {"prefill": p, "decode": dd, "gpus": p * gpus["prefill"] + dd * gpus["decode"], "requests": len(met),
                 "attainment": att, "misses": misses}
        probes.append(probe)
        _say(f"        {p} prefill + {dd} decode: attainment {att:.1%} (misses {misses})")
        if att >= ATTAINMENT_TARGET:
            best = probe
            break
        grow_prefill = misses["ttft"] >= misses["tpot"]
        if grow_prefill and p < s.max_replicas:
            p += 1
        elif dd < s.max_replicas:
            dd += 1
        elif p < s.max_replicas:
            p += 1
        else:
            break
    b.delete(d)
    return {"probes": probes, "split": best, "probe_s": s.probe_s, "rate": s.peak_rate}


def run(s: Settings, out: Path | None = None, log_dir: Path | None = None,
        hindsight_oracle: HindsightOracle | None = None) -> dict[str, Any]:
    """Runs the parts; returns the results document (:mod:`disagg.bench.docs` convention), written to ``out``
    after each part (partial results survive an interrupted run) and at the end."""
    started = time.monotonic()
    b = _Bench(s, log_dir, hindsight_oracle)
    prev = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: dict[str, Any] = {"settings": {**asdict(s), "mix": asdict(AUTOSCALE_MIX)}}
    command = invoked_command(command_line(s))
    load0 = [round(x, 2) for x in os.getloadavg()]  # the sims run in real time: the machine's load is in the figures

    def doc() -> dict[str, Any]:
        return results_doc("autoscale", command, results, machine_facts(
            loadavg_start=load0, loadavg_end=[round(x, 2) for x in os.getloadavg()]))

    try:
        b.start()
        for part, fn in (("step", run_step), ("diurnal", run_diurnal), ("static_peak", run_static_peak)):
            if part in s.parts:
                results[part] = fn(b)
                if out:
                    write_results(out, {**doc(), "partial": True})
    finally:
        b.stop()
        signal.signal(signal.SIGTERM, prev)
    results["slo"] = {"ttft_ms": b.ttft_s * 1000, "tpot_ms": b.tpot_s * 1000}
    _ratios(results)
    day = results.get("diurnal")
    if day:
        v = day.get("vs_static_peak")
        day["met_target"] = None if "vs_static_peak" not in day else \
            (v is not None and v <= 1.15 and day["attainment"] >= ATTAINMENT_TARGET)
    results["wall_s"] = round(time.monotonic() - started, 1)
    final = doc()
    if out:
        write_results(out, final)
    return final


def _split(replicas: dict[str, int]) -> str:
    return f"{replicas.get('prefill', 0)}P + {replicas.get('decode', 0)}D"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _verdict(met: bool | None) -> str:
    return "n/a" if met is None else ("met" if met else "MISSED")


def _step_line(st: dict[str, Any]) -> tuple[str, str]:
    """(recovery figure, verdict) of the step part."""
    if not st.get("breached"):
        return (f"never breached: worst bucket after the step {_pct(st['min_bucket_attainment_after'])} — no recovery "
                "to measure", "n/a")
    if st["recovery_s"] is None:
        return "breached and never recovered to ≥ 90 % before the end", "MISSED"
    return (f"recovery {st['recovery_s']:g} s = {st['recovery_intervals']:g} autoscaler intervals (pod start "
            f"{st['pod_start_s']} s)", _verdict(st["met_target"]))


def table(doc: dict[str, Any]) -> str:
    """The terminal summary of a results document."""
    r = doc["results"]
    lines = [f"SLO: TTFT ≤ {r['slo']['ttft_ms']:g} ms and TPOT ≤ {r['slo']['tpot_ms']:g} ms per request; "
             f"attainment target ≥ {ATTAINMENT_TARGET:.0%}"]
    st = r.get("step")
    if st:
        fig, verdict = _step_line(st)
        lines += [
            f"load step {st['base_rate']:g} → {st['step_rate']:g} req/s: "
            f"attainment before {st['attainment_before']:.1%}, after {st['attainment_after']:.1%} "
            f"(worst bucket {_pct(st['min_bucket_attainment_after'])}), errors {st['errors']}",
            f"  {fig} (target ≤ 2 × {st['interval_s']} s + pod start = {st['target_s']:g} s) → {verdict}; "
            f"max ready {st['max_replicas']}",
        ]
    day = r.get("diurnal")
    if day:
        lines.append(f"diurnal day {day['day_s']:g} s, {day['trough_rate']:g}–{day['peak_rate']:g} req/s: "
                     f"attainment {day['attainment']:.1%}, GPU-s (ready) {day['gpu_seconds_ready']:g}, "
                     f"(desired) {day['gpu_seconds_desired']:g}, errors {day['errors']}, "
                     f"max ready {day['max_replicas']}")
    o = r.get("static_peak")
    if o:
        for pr in o["probes"]:
            lines.append(f"  static probe {pr['prefill']}P + {pr['decode']}D at {o['rate']:g} req/s: "
                         f"attainment {pr['attainment']:.1%} misses {pr['misses']}")
        if o["split"]:
            lines.append(f"static peak allocation: {o['split']['prefill']}P + {o['split']['decode']}D = "
                         f"{o['split']['gpus']} GPUs → {o.get('gpu_seconds', 0):g} GPU-s per day")
        else:
            lines.append("static peak allocation: no probed split met the SLO")
    if day and "vs_static_peak" in day:
        v = day["vs_static_peak"]
        lines.append(f"autoscaled ÷ static peak GPU-seconds: {'n/a' if v is None else f'{v:.3f}'} (target ≤ 1.15 "
                     f"with attainment ≥ 90 %) → {_verdict(day.get('met_target'))}")
    if day:
        h = day.get("hindsight") or {}
        lines.append("autoscaled ÷ hindsight oracle GPU-seconds: " + (
            f"{day['vs_hindsight']:.3f}" if day.get("vs_hindsight") is not None
            else f"pending ({h.get('reason', HINDSIGHT_PENDING)})"))
    m = doc["machine"]
    lines.append(f"wall time {r.get('wall_s', 0):g} s on {m.get('cpus')} CPUs ({m.get('cpu')})")
    return "\n".join(lines)


def render_tables(doc: dict[str, Any]) -> dict[str, str]:
    """docs/benchmarks.md §4 from docs/results/autoscale.json: ``summary`` (one row per figure and target)."""
    r = doc["results"]
    slo = r.get("slo") or {}
    rows: list[tuple[str, str, str, str]] = []
    st = r.get("step")
    if st:
        fig, verdict = _step_line(st)
        rows.append((f"step {st['base_rate']:g} → {st['step_rate']:g} req/s at {st['step_at_s']:g} s",
                     f"{fig}; attainment before {_pct(st['attainment_before'])}, after "
                     f"{_pct(st['attainment_after'])}, worst 5 s bucket after the step "
                     f"{_pct(st['min_bucket_attainment_after'])}; at most {_split(st['max_replicas'])} ready; errors "
                     f"{st['errors']}",
                     f"recovery ≤ {st['target_s']:g} s (2 × {st['interval_s']} s + pod start)", verdict))
    day = r.get("diurnal")
    if day:
        rows.append((f"diurnal, {day['day_s']:g} s day, {day['trough_rate']:g} → {day['peak_rate']:g} → "
                     f"{day['trough_rate']:g} req/s",
                     f"attainment {_pct(day['attainment'])} ({day['requests']} requests, errors {day['errors']}); "
                     f"GPU-seconds {day['gpu_seconds_ready']:g} ready ({day['gpu_seconds_desired']:g} desired); "
                     f"at most {_split(day['max_replicas'])} ready",
                     f"attainment ≥ {ATTAINMENT_TARGET:.0%}",
                     "met" if day["attainment"] >= ATTAINMENT_TARGET else "MISSED"))
    o = r.get("static_peak")
    if o:
        probes = ", ".join(f"{p['prefill']}P+{p['decode']}D {_pct(p['attainment'])}" for p in o["probes"])
        split = o.get("split")
        what = (f"**{split['prefill']}P + {split['decode']}D** = {split['gpus']} GPUs → {o.get('gpu_seconds', 0):g} "
                "GPU-s per day" if split else "no probed split held the peak")
        rows.append((f"static peak allocation at {o['rate']:g} req/s ({o['probe_s']:g} s probes)",
                     f"{probes} → {what}", "", ""))
    if day and "vs_static_peak" in day:
        v = day["vs_static_peak"]
        static_gs = (o or {}).get("gpu_seconds")
        rows.append(("autoscaled ÷ static peak allocation",
                     "n/a (no static split)" if v is None else f"**{v:.3f}** ({day['gpu_seconds_ready']:g} / "
                                                               f"{static_gs:g})",
                     "≤ 1.15 with attainment ≥ 90 %", _verdict(day.get("met_target"))))
    if day:
        h = day.get("hindsight") or {"status": "pending", "reason": HINDSIGHT_PENDING}
        if h.get("status") == "measured":
            rows.append(("autoscaled ÷ hindsight oracle",
                         f"**{day['vs_hindsight']:.3f}** ({day['gpu_seconds_ready']:g} / {h['gpu_seconds']:g})", "",
                         ""))
        else:
            rows.append(("autoscaled ÷ hindsight oracle", f"pending: {h.get('reason')}", "", "pending"))
    m = doc["machine"]
    head = (f"SLO per request: TTFT ≤ {slo.get('ttft_ms', 0):g} ms and TPOT ≤ {slo.get('tpot_ms', 0):g} ms; "
            f"wall time {r.get('wall_s', 0):g} s; load average {m.get('loadavg_start', '?')} → "
            f"{m.get('loadavg_end', '?')}" + (" (partial run: the file was written before the end)"
                                                       if doc.get("partial") else "") + ".")
    out = [head, "", "| part | figure | target | |", "| --- | --- | --- | --- |",
           *(f"| {a} | {b_} | {c} | {d} |" for a, b_, c, d in rows)]
    return {"summary": "\n".join(out)}


__all__ = [
    "AUTOSCALE_MIX",
    "HINDSIGHT_PENDING",
    "PARTS",
    "BucketLoad",
    "HindsightOracle",
    "Settings",
    "attainment_buckets",
    "diurnal_rate",
    "diurnal_trace",
    "gpu_seconds",
    "hindsight",
    "load_buckets",
    "pod_start_s",
    "recovery_time",
    "render_tables",
    "run",
    "step_trace",
    "table",
    "with_hindsight",
]

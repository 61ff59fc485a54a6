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
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..load import loadgen
from ..load.workload import Mix, Request, RequestClass, generate
from ..local.harness import ModelHarness, router_workers_at
from ..local.stack import LocalStack
from ..results import invoked_command, machine_facts, results_doc, write_results
from .autoscale_measure import (
    ATTAINMENT_TARGET,
    HINDSIGHT_PENDING,
    attainment_buckets,
    diurnal_rate,
    diurnal_trace,
    gpu_seconds,
    miss_causes,
    pod_start_s,
    recovery_time,
    step_trace,
)
from .autoscale_tables import render_tables, table

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

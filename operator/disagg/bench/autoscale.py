"""``disagg bench autoscale``: the SLO-driven autoscaler in the twin (issue 6, "Benchmark").

Everything runs on the local stack (``disagg.local.stack.LocalStack``: real control plane, the operator, pods as
``disagg sim`` processes on their own loopback IPs, a real Prometheus) with the demo model
(docs/examples/local-demo.yaml: L40S sims in real time, ``autoscaling.intervalSeconds`` 5, max 3 replicas per
pool). Three parts, each on a fresh DisaggregatedModel (the previous one deleted first):

1. **Load step**: ``base_rate`` for ``step_pre_s``, then ``3 × base_rate`` for ``step_post_s``, one open-loop
   stream. SLO attainment (share of requests meeting TTFT *and* TPOT SLOs) per ``bucket_s`` bucket of *arrival*
   time. Recovery time = from the step to the start of the first run of ``sustain`` consecutive buckets with
   attainment ≥ 90 % (0 when it never drops). Target: ≤ 2 × intervalSeconds + pod start (pod start measured from
   the timeline: desired replicas up → ready replicas up).
2. **Diurnal trace**: one compressed "day" of ``day_s`` wall seconds, rate(t) = trough + (peak − trough) ·
   (1 − cos 2πt/day)/2 (non-homogeneous Poisson, thinned from the peak rate). GPU-seconds = ∫ (ready prefill +
   ready decode replicas) × GPUs per replica dt over the day, from the status timeline (sampled each second).
3. **Oracle static allocation**: the smallest fixed prefill + decode split meeting ≥ 90 % attainment at the
   trace's *peak* rate, autoscaling off. Simplification for the 2-core budget: a greedy climb of short probes
   (``probe_s`` at the peak rate, per candidate split) from 1 + 1, adding a prefill replica when TTFT misses
   dominate and a decode replica when TPOT misses do; the oracle's GPU-seconds = its GPUs × ``day_s``.

Results: a table on stdout and JSON (``--out``). Every process started is stopped at the end (LocalStack.stop),
also on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..load import loadgen
from ..load.workload import Mix, Request, RequestClass, generate
from ..local.harness import ModelHarness, router_workers_at
from ..local.stack import LocalStack

ATTAINMENT_TARGET = 0.90

# Long RAG prompts (prefill-heavy, remote prefill) next to long streams (decode-heavy): a 3× step needs both pools.
AUTOSCALE_MIX = Mix("autoscale", "long RAG prompts (remote prefill) + long streams", (
    RequestClass("rag", 0.6, (6000, 10000), (64, 128), tenant="rag"),
    RequestClass("stream", 0.4, (128, 512), (300, 600), tenant="stream"),
))


@dataclass
class Settings:
    base_rate: float = 1.0  # requests/s before the step
    step_factor: float = 3.0
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
    parts: tuple[str, ...] = ("step", "diurnal", "oracle")


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


# ---------------------------------------------------------------------------------------------------- the stack
def _say(msg: str) -> None:
    print(f"==> {msg}", flush=True)


class _Bench:
    def __init__(self, s: Settings, log_dir: Path | None) -> None:
        self.s = s
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
    out = {
        "base_rate": s.base_rate, "step_rate": s.base_rate * s.step_factor, "step_at_s": s.step_pre_s,
        "interval_s": interval, "requests": len(results), "errors": sum(not r.ok for r in results),
        "attainment_before": round(sum(pre) / max(1, len(pre)), 4),
        "attainment_after": round(sum(post) / max(1, len(post)), 4),
        "min_bucket_attainment_after": min((x["attainment"] for x in buckets
                                            if x["t0"] >= s.step_pre_s and x["attainment"] is not None), default=None),
        "recovery_s": rec, "pod_start_s": pod_start, "target_s": target,
        "met_target": rec is not None and rec <= target,
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
        "buckets": attainment_buckets(arrivals, met, s.day_s / 10, until=s.day_s), "timeline": samples,
    }
    b.delete(d)
    return out


def run_oracle(b: _Bench) -> dict[str, Any]:
    s = b.s
    _say(f"part 3: oracle static allocation — probes of {s.probe_s:g} s at the peak rate {s.peak_rate:g} req/s, "
         "autoscaling off, from 1 + 1 up")
    p, dd = 1, 1
    d = b.deploy("as-oracle", {"autoscaling": {"enabled": False},
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


def run(s: Settings, out: Path | None = None, log_dir: Path | None = None) -> dict[str, Any]:
    started = time.monotonic()
    b = _Bench(s, log_dir)
    prev = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result: dict[str, Any] = {"settings": {**asdict(s), "mix": asdict(AUTOSCALE_MIX)}}
    try:
        b.start()
        for part, fn in (("step", run_step), ("diurnal", run_diurnal), ("oracle", run_oracle)):
            if part in s.parts:
                result[part] = fn(b)
                if out:  # partial results survive an interrupted run
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_text(json.dumps(result, indent=1))
    finally:
        b.stop()
        signal.signal(signal.SIGTERM, prev)
    result["slo"] = {"ttft_ms": b.ttft_s * 1000, "tpot_ms": b.tpot_s * 1000}
    day, oracle = result.get("diurnal"), result.get("oracle")
    if day and oracle:
        if oracle["split"]:
            og = oracle["split"]["gpus"] * s.day_s
            oracle["gpu_seconds"] = og
            day["vs_oracle"] = round(day["gpu_seconds_ready"] / og, 4)
            day["met_target"] = day["vs_oracle"] <= 1.15 and day["attainment"] >= ATTAINMENT_TARGET
        else:
            day["vs_oracle"] = None
            day["met_target"] = False
    result["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                         "cpu_model": _cpu_model(), "loadavg_end": os.getloadavg()}
    result["wall_s"] = round(time.monotonic() - started, 1)
    result["date"] = datetime.now(UTC).isoformat(timespec="seconds")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
    return result


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def table(r: dict[str, Any]) -> str:
    lines = [f"SLO: TTFT ≤ {r['slo']['ttft_ms']:g} ms and TPOT ≤ {r['slo']['tpot_ms']:g} ms per request; "
             f"attainment target ≥ {ATTAINMENT_TARGET:.0%}"]
    st = r.get("step")
    if st:
        rec = "never" if st["recovery_s"] is None else f"{st['recovery_s']:g} s"
        lines += [
            f"load step {st['base_rate']:g} → {st['step_rate']:g} req/s: "
            f"attainment before {st['attainment_before']:.1%}, after {st['attainment_after']:.1%} "
            f"(worst bucket {st['min_bucket_attainment_after']}), errors {st['errors']}",
            f"  recovery to ≥ 90 %: {rec}  (target ≤ 2 × {st['interval_s']} s + pod start {st['pod_start_s']} s = "
            f"{st['target_s']:g} s) → {'met' if st['met_target'] else 'MISSED'}; max ready {st['max_replicas']}",
        ]
    day = r.get("diurnal")
    if day:
        lines.append(f"diurnal day {day['day_s']:g} s, {day['trough_rate']:g}–{day['peak_rate']:g} req/s: "
                     f"attainment {day['attainment']:.1%}, GPU-s (ready) {day['gpu_seconds_ready']:g}, "
                     f"(desired) {day['gpu_seconds_desired']:g}, errors {day['errors']}, "
                     f"max ready {day['max_replicas']}")
    o = r.get("oracle")
    if o:
        for pr in o["probes"]:
            lines.append(f"  oracle probe {pr['prefill']}P + {pr['decode']}D at {o['rate']:g} req/s: "
                         f"attainment {pr['attainment']:.1%} misses {pr['misses']}")
        if o["split"]:
            lines.append(f"oracle static: {o['split']['prefill']}P + {o['split']['decode']}D = {o['split']['gpus']} "
                         f"GPUs → {o.get('gpu_seconds', 0):g} GPU-s per day")
        else:
            lines.append("oracle static: no probed split met the SLO")
    if day and o and "vs_oracle" in day:
        v = day["vs_oracle"]
        lines.append(f"autoscaled ÷ oracle GPU-seconds: {'n/a' if v is None else f'{v:.3f}'} (target ≤ 1.15 with "
                     f"attainment ≥ 90 %) → {'met' if day['met_target'] else 'MISSED'}")
    lines.append(f"wall time {r['wall_s']:g} s on {r['machine']['cpus']} CPUs ({r['machine']['cpu_model']})")
    return "\n".join(lines)


__all__ = [
    "AUTOSCALE_MIX",
    "Settings",
    "attainment_buckets",
    "diurnal_rate",
    "diurnal_trace",
    "gpu_seconds",
    "pod_start_s",
    "recovery_time",
    "run",
    "step_trace",
    "table",
]

"""``disagg bench autoscale --virtual``: the autoscalers over a compressed day in the twin (issue 28).

Virtual time (disagg.twin: the router's request core over simulated engines), so no wall-clock sleeps and the
figures do not move with machine load. The model: Llama-3.1-8B on L40S GPUs (as the demo), TP 1, KV over RDMA,
Thresholds routing (prompts ≥ 2048 tokens prefill remotely, the rest on a decode worker; a full prefill queue
makes requests wait for it), SLO TTFT p95 ≤ 2 s and TPOT p95 ≤ 50 ms, attainment = share of requests meeting both.

**The day** (:func:`day_arrivals`): ``day_s`` virtual seconds stand for 24 h. Rate(t) = trough + (peak − trough) ·
((1 − cos 2πt/day) / 2)²: midnight at t = 0, noon at day/2; peak ÷ mean ≈ 2.3 with trough = 0.1 × peak (the
issue's 2–3×; the daily periodicity of LLM traffic is shown by BurstGPT's Azure OpenAI traces, Wang et al.,
arXiv:2401.17644, §3). Two bursts (×``burst_factor`` for ``burst_s``) at 30 % and 75 % of the day. The mix shifts
with the hour: the share of long-prompt RAG requests (6–10k tokens in, 128–384 out) goes from 20 % at night to
80 % at noon; the rest is chat (100–800 in, 100–400 out). Non-homogeneous Poisson arrivals (thinning).

**Scalers**, each over the same arrivals through the twin connector (twin/autoscaler.py, pod start modelled):
``predictive`` (autoscaling/predictive.py: Holt forecast + the planner's model, plan/sizing.py), ``proportional``
(policy.py, the operator's current policy), ``reactive`` (Dynamo's SLA planner's published rule: constant predictor,
load ÷ per-replica throughput, corrected by observed ÷ expected). **Static peak**: the fewest GPUs whose split
holds the day's peak load in a twin probe (searched from the model's answer), all day. **Hindsight oracle**: per
``bucket_s`` of the day, the fewest GPUs whose split holds that bucket's load and mix in a twin probe, with no
pod start and no transition (bench/oracle.py ``fewest_split``). **Step**: a 3× step from the trough, predictive.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..autoscaling.forecast import Load
from ..autoscaling.predictive import PredictivePolicy, PredictiveSettings, ReactivePolicy
from ..perf.presets import get_gpu, get_model, get_transport
from ..plan.sizing import ModelSizer
from ..plan.verify import Mapped, cluster_spec
from ..twin import SLO, Arrival, ClusterSpec, simulate
from ..twin.autoscaler import TwinAutoscaler, of, pod_start_s, proportional
from .oracle import ProbeFn, fewest_split

TARGET = 0.90
RAG = ("rag", (6000, 10000), (128, 384))
CHAT = ("chat", (100, 800), (100, 400))


@dataclass
class DaySettings:
    day_s: float = 1200.0  # virtual seconds standing for 24 h
    peak_rps: float = 12.0
    trough_share: float = 0.1  # trough = 0.1 × peak
    burst_factor: float = 1.8
    burst_s: float = 40.0
    interval_s: int = 30
    scale_down_stabilization_s: int = 150
    max_step: int = 4
    max_replicas: int = 16
    compile_cache: bool = False
    bucket_s: float = 120.0  # the oracle's buckets
    probe_s: float = 60.0  # virtual seconds per oracle / static-peak probe
    step_base_rps: float = 2.0
    step_factor: float = 3.0
    step_pre_s: float = 240.0
    step_post_s: float = 300.0
    seed: int = 0
    scalers: tuple[str, ...] = ("predictive", "proportional", "reactive")


def diurnal_rate(t: float, s: DaySettings) -> float:
    x = ((1 - math.cos(2 * math.pi * t / s.day_s)) / 2) ** 2
    rate = s.peak_rps * (s.trough_share + (1 - s.trough_share) * x)
    for at in (0.30, 0.75):
        if at * s.day_s <= t < at * s.day_s + s.burst_s:
            rate *= s.burst_factor
    return rate


def rag_share(t: float, s: DaySettings) -> float:
    return 0.2 + 0.6 * (1 - math.cos(2 * math.pi * t / s.day_s)) / 2


def _arrival(rng: random.Random, t: float, rag: float, i: int) -> Arrival:
    name, (i0, i1), (o0, o1) = RAG if rng.random() < rag else CHAT
    return Arrival(at=t, input_tokens=rng.randint(i0, i1), output_tokens=rng.randint(o0, o1), tenant=name,
                   cls=name, request_id=f"day-{i}")


def day_arrivals(s: DaySettings) -> list[Arrival]:
    """Non-homogeneous Poisson arrivals of the day (thinning from the burst peak), deterministic for the seed."""
    rng = random.Random(s.seed)
    top = s.peak_rps * s.burst_factor
    out: list[Arrival] = []
    t = 0.0
    while True:
        t += rng.expovariate(top)
        if t >= s.day_s:
            return out
        if rng.random() < diurnal_rate(t, s) / top:
            out.append(_arrival(rng, t, rag_share(t, s), len(out)))


def steady_arrivals(rate: float, rag: float, duration_s: float, seed: int, t0: float = 0.0) -> list[Arrival]:
    rng = random.Random(seed)
    out: list[Arrival] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return out
        out.append(_arrival(rng, t0 + t, rag, len(out)))


def model_doc(s: DaySettings, prefill: int = 1, decode: int = 1) -> dict[str, Any]:
    pool = {"minReplicas": 1, "maxReplicas": s.max_replicas, "gpu": {"count": 1, "product": "NVIDIA-L40S"}}
    return {"apiVersion": "serving.disagg.dev/v1alpha1", "kind": "DisaggregatedModel", "metadata": {"name": "day"},
            "spec": {
                "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama-8b"},
                "prefill": {**pool, "replicas": prefill}, "decode": {**pool, "replicas": decode},
                "kvTransfer": {"transport": "rdma", "rdma": {}, "transferTimeoutMs": 8000},
                "routing": {"policy": "Thresholds",
                            "remotePrefill": {"minInputTokens": 2048, "maxPrefillQueueWaitMs": 2000,
                                              "minExpectedOutputTokens": 64},
                            "localPrefill": {"maxInputTokens": 1024},
                            "fallback": {"onPrefillQueueOverload": "Queue"},
                            "tenants": [{"name": "chat", "match": {"values": ["chat"]}},
                                        {"name": "rag", "match": {"values": ["rag"]}}]},
                "slo": {"ttftP95Ms": 2000, "tpotP95Ms": 50},
                "autoscaling": {"enabled": True, "prometheus": {"url": "http://twin"},
                                "intervalSeconds": s.interval_s,
                                "scaleDownStabilizationSeconds": s.scale_down_stabilization_s,
                                "maxStep": s.max_step}}}


def mapped(s: DaySettings, p: int, d: int) -> Mapped:
    return cluster_spec(model_doc(s, p, d))


def sizer(s: DaySettings) -> ModelSizer:
    return ModelSizer(get_gpu("L40S"), get_model("Llama-3.1-8B"), get_transport("rdma"), 2.0, 0.05,
                      max_replicas=s.max_replicas)


def mix_load(rate: float, rag: float) -> Load:
    """The expected Load of ``rate`` req/s with a ``rag`` share (class means; chat prompts stay local)."""
    return Load(rate * rag, rate * (1 - rag), 8000.0, 450.0, rag * 256 + (1 - rag) * 250)


def probe_fn(s: DaySettings) -> ProbeFn:
    cache: dict[tuple[float, float, int, int], float] = {}

    def probe(rate: float, rag: float, p: int, d: int) -> float:
        key = (round(rate, 2), round(rag, 2), p, d)
        if key not in cache:
            m = mapped(s, p, d)
            arr = steady_arrivals(rate, rag, s.probe_s, s.seed)
            cache[key] = simulate(m.cluster, arr, seed=s.seed, slo=m.slo, window_s=s.probe_s).attainment \
                if arr else 1.0
        return cache[key]

    return probe


# ---------------------------------------------------------------------------------------------------- runs


def _clip_gpu_s(ctl: TwinAutoscaler, end: float) -> float:
    c = ctl.cluster
    assert c is not None
    total = ctl.starting_gpu_s
    for w in [*c.workers.values(), *c.retired]:
        stop = w.stopped_at if w.stopped_at is not None else end
        total += w.gpus * max(0.0, min(stop, end) - min(w.started_at, end))
    return total


def oscillation(events: list[dict[str, Any]], window_s: float) -> int:
    """The largest reversal: over consecutive scale events of a pool in opposite directions less than
    ``window_s`` apart, the smaller of the two moves (replicas)."""
    worst = 0
    for pool in ("prefill", "decode"):
        ev = [e for e in events if e["pool"] == pool]
        for a, b in zip(ev, ev[1:], strict=False):
            da, db = a["after"] - a["before"], b["after"] - b["before"]
            if da * db < 0 and b["t"] - a["t"] < window_s:
                worst = max(worst, min(abs(da), abs(db)))
    return worst


def run_scaler(s: DaySettings, name: str, arrivals: list[Arrival], start: tuple[int, int],
               until: float) -> dict[str, Any]:
    m = mapped(s, *start)
    sz = sizer(s)
    start_s = pod_start_s("Llama-3.1-8B", s.compile_cache)
    ps = PredictiveSettings(interval_s=s.interval_s, pod_start_s=start_s,
                            scale_down_stabilization_s=s.scale_down_stabilization_s, max_step=s.max_step,
                            max_replicas=(s.max_replicas, s.max_replicas))
    from ..api.models import DisaggregatedModel

    spec = DisaggregatedModel.model_validate(model_doc(s, *start)).spec
    policy = {"predictive": lambda: of(PredictivePolicy(sz, ps)), "reactive": lambda: of(ReactivePolicy(sz, ps)),
              "proportional": lambda: proportional(spec)}[name]()
    ctl = TwinAutoscaler(policy, interval_s=s.interval_s, start_s=start_s, until_s=until)
    t0 = time.process_time()
    r = simulate(m.cluster, arrivals, seed=s.seed, slo=m.slo, window_s=until, controller=ctl)
    events = [asdict(e) for e in ctl.timeline]
    return {"scaler": name, "attainment": round(r.attainment, 4), "requests": len(r.records),
            "gpu_seconds": round(_clip_gpu_s(ctl, until), 1), "events": len(events),
            "events_per_hour_virtual": round(len(events) / (until / 3600), 1),
            "events_per_day": len(events), "largest_oscillation": oscillation(events, 2 * s.scale_down_stabilization_s),
            "peak": {p: max([x["desired"][p] for x in ctl.samples] or [0]) for p in ("prefill", "decode")},
            "timeline": [{k: e[k] for k in ("t", "pool", "before", "after", "ready", "reason")} for e in events],
            "per_interval": [{"t": x["t"], **{f"{k}_ready": v for k, v in x["ready"].items()}} for x in ctl.samples],
            "records": r.records, "cpu_s": round(time.process_time() - t0, 1), "pod_start_s": round(start_s, 1)}


def static_peak(s: DaySettings, probe: ProbeFn) -> dict[str, Any]:
    """The fewest GPUs holding the day's peak (the burst on the noon rate) with the noon mix, from the model's
    answer, checked and corrected in twin probes."""
    rate = max(diurnal_rate(t, s) for t in [i * s.day_s / 2000 for i in range(2000)])
    rag = rag_share(s.day_s / 2, s)
    guess = sizer(s).size(mix_load(rate, rag), 1.0, 1.0, 1.0)
    pick = fewest_split(probe, rate, rag, (guess.prefill, guess.decode), TARGET, s.max_replicas)
    return {"rate": round(rate, 2), "rag_share": rag, "model_guess": [guess.prefill, guess.decode], **pick}


def hindsight(s: DaySettings, probe: ProbeFn) -> dict[str, Any]:
    sz = sizer(s)
    buckets = []
    n = math.ceil(s.day_s / s.bucket_s)
    for i in range(n):
        t0, t1 = i * s.bucket_s, min(s.day_s, (i + 1) * s.bucket_s)
        ts = [t0 + (t1 - t0) * k / 50 for k in range(50)]
        rate = sum(diurnal_rate(t, s) for t in ts) / len(ts)
        rag = sum(rag_share(t, s) for t in ts) / len(ts)
        g = sz.size(mix_load(rate, rag), 1.0, 1.0, 1.0)
        pick = fewest_split(probe, rate, rag, (g.prefill, g.decode), TARGET, s.max_replicas)
        buckets.append({"t0": t0, "t1": t1, "rate": round(rate, 2), "rag_share": round(rag, 3), **pick})
    return {"buckets": buckets, "gpu_seconds": round(sum(b["gpus"] * (b["t1"] - b["t0"]) for b in buckets), 1)}

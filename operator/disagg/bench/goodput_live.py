"""``disagg bench goodput --real``: the goodput comparison on real processes (sims + router on loopback, real time),
a small cross-check of the twin's sweep (:mod:`.goodput`); tests/twin/test_crosscheck.py asserts the twin against
such runs within the twin's stated tolerance."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from ..load import loadgen
from ..load.workload import MIXES, generate
from ..local.harness import router_workers_at
from ..local.procs import SIM_MODEL, Proc, Processes, cpu_seconds
from ..poll import wait_for
from .goodput import ALWAYS_ROUTING, CONDITIONAL_ROUTING, DEPLOYMENTS, LABEL, TRANSFER_TIMEOUT_MS, ratio


@dataclass(frozen=True)
class Plan:
    """One workload mix's run: offered load, duration and the P/D split of (b) and (c)."""

    mix: str
    rate: float  # requests per simulated second (Poisson)
    duration_s: float  # simulated seconds of arrivals
    prefill: int  # P for (b); D = gpus - P
    prefill_conditional: int  # P for (c): each disaggregated deployment gets the split that suits it
    routing: dict[str, Any] = field(default_factory=dict)  # overrides of CONDITIONAL_ROUTING for this mix
    note: str = ""


# Offered rates: chosen to load the 4-GPU aggregated deployment near (long-rag, mixed: at/just past) its SLO
# capacity on the twin, within what 2 CPU cores can push through sims + router + client (see docs/benchmarks.md).
PLANS: dict[str, Plan] = {
    "short-chat": Plan("short-chat", rate=30.0, duration_s=30.0, prefill=1, prefill_conditional=1,
                       note="decode-bound; H100 capacity for short chats is far above what 2 CPU cores can stream"),
    "long-rag": Plan("long-rag", rate=18.0, duration_s=30.0, prefill=2, prefill_conditional=1,
                     note="prefill-heavy: 6-12k-token prompts; (b) needs 2 prefill GPUs, (c) overflows to local"),
    "mixed": Plan("mixed", rate=20.0, duration_s=30.0, prefill=1, prefill_conditional=1,
                  note="long RAG prompts interleaved with chats and long streams"),
}


@dataclass(frozen=True)
class Settings:
    gpus: int = 4
    time_scale: float = 1.0
    gpu: str = "H100-SXM"
    model_preset: str = "Llama-3.1-8B"
    ttft_slo_ms: float = 1000.0
    tpot_slo_ms: float = 50.0
    seed: int = 0
    warmup_s: float = 0.0  # simulated seconds of the same mix sent (and discarded) before the measured window
    # further (TTFT ms, TPOT ms) pairs evaluated on the same requests (no extra run): reported, not targeted
    alt_slos: tuple[tuple[float, float], ...] = ((1000.0, 25.0), (2000.0, 100.0))
    timeout_s: float = 300.0


def router_config(deployment: str, plan: Plan, s: Settings) -> dict[str, Any]:
    base: dict[str, Any] = {"model": SIM_MODEL, "transferTimeoutMs": TRANSFER_TIMEOUT_MS,
                            "slo": {"ttftP95Ms": int(s.ttft_slo_ms), "tpotP95Ms": int(s.tpot_slo_ms)}}
    if deployment == "aggregated":
        return {**base, "mode": "Aggregated"}
    if deployment == "disaggregated":
        return {**base, "mode": "Disaggregated", "routing": copy.deepcopy(ALWAYS_ROUTING)}
    routing = copy.deepcopy(CONDITIONAL_ROUTING)
    for k, v in plan.routing.items():
        routing[k] = {**routing.get(k, {}), **v} if isinstance(v, dict) else v
    return {**base, "mode": "Disaggregated", "routing": routing}


def _metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, val = line.rpartition(" ")
        labels: dict[str, str] = {}
        if "{" in head:
            for part in head[head.index("{") + 1: head.rindex("}")].split('",'):
                if "=" in part:
                    k, v = part.split("=", 1)
                    labels[k.strip()] = v.strip().strip('"')
        out.append((labels, float(val)))
    return out


async def _get(url: str) -> str:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(total=10)) as r:
        return await r.text()


def run_one(deployment: str, plan: Plan, s: Settings, log_dir: Path | None = None) -> dict[str, Any]:
    """Start the deployment's processes, drive the mix, stop everything; return the measured row."""
    mix = MIXES[plan.mix]
    p = {"aggregated": 0, "disaggregated": plan.prefill}.get(deployment, plan.prefill_conditional)
    d = s.gpus - p
    if deployment != "aggregated" and not (1 <= p < s.gpus):
        raise ValueError(f"{plan.mix}: prefill workers must be in 1..{s.gpus - 1}, got {p}")
    with Processes(log_dir / f"{plan.mix}-{deployment}" if log_dir else None) as procs:

        def sim(role: str) -> Proc:
            return procs.sim(role, time_scale=s.time_scale, gpu=s.gpu, model_preset=s.model_preset)

        if deployment == "aggregated":
            workers = {"aggregated": [sim("aggregated") for _ in range(d)]}
        else:
            workers = {"prefill": [sim("prefill") for _ in range(p)], "decode": [sim("decode") for _ in range(d)]}
        for pool in workers.values():
            for w in pool:
                procs.wait_ready(w)
        conf = procs.log_dir / "router.yaml"
        cfg = router_config(deployment, plan, s)
        conf.write_text(yaml.safe_dump(cfg, sort_keys=False))
        urls = {k: [w.url for w in v] for k, v in workers.items()}
        router = procs.router(conf, extra=["--scrape-interval", str(max(0.25, min(1.0, s.time_scale)))],
                              prefill=urls.get("prefill", ()), decode=urls.get("decode", ()),
                              aggregated=urls.get("aggregated", ()))
        procs.wait_ready(router)
        want = {k: len(v) for k, v in workers.items()}  # the router's first scrape of the workers' metrics
        wait_for(lambda: all(router_workers_at(router.url).get(k) == n for k, n in want.items()), 30,
                 f"the router to know {want} ready workers", interval=0.05)

        requests = generate(mix, plan.rate, s.warmup_s + plan.duration_s, SIM_MODEL, seed=s.seed)
        pids = [x.proc.pid for x in procs.procs]
        cpu0, self0, t0 = cpu_seconds(pids), time.process_time(), time.perf_counter()
        results = asyncio.run(loadgen.run(router.url, requests, time_scale=s.time_scale, timeout_s=s.timeout_s,
                                          concurrency_limit=4096))
        wall = time.perf_counter() - t0
        cpu = cpu_seconds(pids) - cpu0 + time.process_time() - self0
        metrics = asyncio.run(_get(router.url + "/metrics"))
        crashed = [x.name for x in procs.procs if not x.alive()]

    measured = [r for r, q in zip(results, requests, strict=True) if q.at >= s.warmup_s]
    summ = loadgen.summarise(measured, s.ttft_slo_ms, s.tpot_slo_ms)
    met = sum(r.meets(s.ttft_slo_ms / 1000, s.tpot_slo_ms / 1000) for r in measured)
    decisions: dict[str, float] = {}
    for labels, v in _metric_samples(metrics, "disagg_routing_decisions_total"):
        if v:
            key = f"{labels.get('decision')}:{labels.get('reason')}"
            decisions[key] = decisions.get(key, 0) + v
    fallbacks = {lab.get("cause", "?"): v for lab, v in _metric_samples(metrics, "disagg_fallbacks_total") if v}
    out_tokens = sum(r.output_tokens for r in measured if r.ok)
    alt = {}
    for ttft, tpot in s.alt_slos:
        n = sum(r.meets(ttft / 1000, tpot / 1000) for r in measured)
        alt[f"{ttft:g}/{tpot:g}"] = {"attainment": round(n / len(measured), 4) if measured else 0.0,
                                      "goodput_rps": round(n / plan.duration_s, 3)}
    by_class: dict[str, dict[str, Any]] = {}
    for cls in sorted({r.cls for r in measured}):
        rs = [r for r in measured if r.cls == cls]
        cs = loadgen.summarise(rs, s.ttft_slo_ms, s.tpot_slo_ms)
        by_class[cls] = {"requests": cs.requests, "attainment": cs.goodput, "ttft_p95_ms": cs.ttft_p95_ms,
                         "tpot_p95_ms": cs.tpot_p95_ms}
    return {
        "mix": plan.mix, "deployment": deployment, "prefill_workers": p,
        "decode_workers": d if deployment != "aggregated" else 0,
        "aggregated_workers": d if deployment == "aggregated" else 0,
        "offered_rate": plan.rate, "duration_s": plan.duration_s,
        "requests": summ.requests, "errors": summ.errors,
        "attainment": summ.goodput,
        "goodput_rps": round(met / plan.duration_s, 3),
        "ttft_p50_ms": summ.ttft_p50_ms, "ttft_p95_ms": summ.ttft_p95_ms,
        "tpot_p50_ms": summ.tpot_p50_ms, "tpot_p95_ms": summ.tpot_p95_ms,
        "output_tokens_per_s": round(out_tokens / plan.duration_s, 1), "alt_slos": alt,
        "decisions": decisions, "fallbacks": fallbacks, "by_class": by_class,
        "wall_s": round(wall, 1), "cpu_util": round(cpu / wall / (os.cpu_count() or 1), 3) if wall else None,
        "crashed": crashed, "router_config": cfg,
        "errors_sample": sorted({r.error[:120] for r in measured if r.error})[:3],
    }


def evaluate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Ratios c/a, c/b per mix and the targets: c ≥ max(a, b) on every mix, c ≥ 2 × a on long-rag."""
    per_mix: dict[str, Any] = {}
    for mix in dict.fromkeys(r["mix"] for r in rows):
        g = {r["deployment"]: r["goodput_rps"] for r in rows if r["mix"] == mix}
        if not all(k in g for k in DEPLOYMENTS):
            continue
        a, b, c = g["aggregated"], g["disaggregated"], g["conditional"]
        entry = {"c_over_a": ratio(c, a), "c_over_b": ratio(c, b), "c_ge_max_ab": c >= max(a, b)}
        if mix == "long-rag":
            entry["c_ge_2a"] = c >= 2 * a
        per_mix[mix] = entry
    return per_mix


def _fmt(v: Any, w: int, nd: int = 1) -> str:
    if v is None:
        return "-".rjust(w)
    if isinstance(v, float):
        return f"{v:.{nd}f}".rjust(w)
    return str(v).rjust(w)


def table(rows: list[dict[str, Any]], ratios: dict[str, Any]) -> str:
    head = (f"{'mix':<11} {'deployment':<15} {'P+D':>5} {'rate':>5} {'reqs':>5} {'err':>4} {'attain':>7} "
            f"{'goodput/s':>9} {'TTFT p50':>9} {'TTFT p95':>9} {'TPOT p50':>9} {'TPOT p95':>9} {'tok/s':>7} "
            f"{'remote%':>7} {'cpu':>5}")
    lines = [head, "-" * len(head)]
    for r in rows:
        split = f"{r['aggregated_workers']}" if r["deployment"] == "aggregated" else \
            f"{r['prefill_workers']}+{r['decode_workers']}"
        remote = sum(v for k, v in r["decisions"].items() if k.startswith("remote:"))
        total = sum(r["decisions"].values()) or 1
        lines.append(
            f"{r['mix']:<11} {LABEL[r['deployment']] + ') ' + r['deployment']:<15} {split:>5} "
            f"{_fmt(r['offered_rate'], 5)} {r['requests']:>5} {r['errors']:>4} {_fmt(r['attainment'], 7, 3)} "
            f"{_fmt(r['goodput_rps'], 9, 2)} {_fmt(r['ttft_p50_ms'], 9)} {_fmt(r['ttft_p95_ms'], 9)} "
            f"{_fmt(r['tpot_p50_ms'], 9)} {_fmt(r['tpot_p95_ms'], 9)} {_fmt(r['output_tokens_per_s'], 7, 0)} "
            f"{_fmt(100.0 * remote / total, 7)} {_fmt(r['cpu_util'], 5, 2)}")
    lines.append("")
    lines.append(f"{'mix':<11} {'c/a':>7} {'c/b':>7}  targets")
    for mix, e in ratios.items():
        t = [f"c>=max(a,b): {'MET' if e['c_ge_max_ab'] else 'MISSED'}"]
        if "c_ge_2a" in e:
            t.append(f"c>=2a: {'MET' if e['c_ge_2a'] else 'MISSED'}")
        lines.append(f"{mix:<11} {_fmt(e['c_over_a'], 7, 2)} {_fmt(e['c_over_b'], 7, 2)}  " + ", ".join(t))
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"nproc": os.cpu_count(), "python": platform.python_version(),
                            "platform": platform.platform()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info


def run(mixes: list[str], deployments: list[str], s: Settings, plans: dict[str, Plan] | None = None,
        out: Path | None = None, log_dir: Path | None = None,
        progress: Callable[[str], None] = print) -> dict[str, Any]:
    plans = plans or PLANS
    rows = []
    started = datetime.now(UTC)
    for mix in mixes:
        for dep in deployments:
            progress(f"[goodput] {mix} / {dep} ...")
            row = run_one(dep, plans[mix], s, log_dir)
            progress(f"[goodput] {mix} / {dep}: attainment {row['attainment']:.3f}, goodput "
                     f"{row['goodput_rps']:.2f} req/s, TTFT p95 {row['ttft_p95_ms']} ms, TPOT p95 "
                     f"{row['tpot_p95_ms']} ms, errors {row['errors']}, wall {row['wall_s']} s, cpu {row['cpu_util']}")
            rows.append(row)
    ratios = evaluate(rows)
    result = {
        "benchmark": "goodput", "date": started.isoformat(timespec="seconds"), "machine": machine(),
        "settings": asdict(s), "plans": {m: asdict(plans[m]) for m in mixes},
        "conditional_routing": CONDITIONAL_ROUTING, "rows": rows, "ratios": ratios,
    }
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
    return result

"""Overload without collapse (issue 29): ``disagg bench overload``, in the twin (virtual time, deterministic).

One prefill and one decode worker (H100, Llama-3.1-8B) serve two tenants: **chat** (Interactive, steady 4 req/s,
1000-token prompts, 128 tokens out) and **batch** (Batch, 3000-token prompts, 256 tokens out) stepped from a third
of its capacity to well past the knee. Each step runs three ways, the batch tenant's ``overload`` being the only
difference: ``Admit`` (no admission: today's behaviour), ``Shed`` and ``Queue`` (router/admission.py, core.py
``RequestCore.admit``). Per step and policy the report gives each tenant's attainment (requests within the TTFT and
TPOT SLO ÷ requests offered) and goodput (such requests per second), chat's TTFT p95, and what batch was refused.

**The goodput sweep's mixes past the knee** (:func:`run_mixes`): each mix of ``disagg bench goodput`` on its
4-GPU deployment (1 prefill + 3 decode workers, the shipped defaults deployed for 1000/50 ms: the SLO placement,
the decode budget the operator renders) at the sweep's rates and at twice its top rate, with every tenant of the mix
on ``Admit`` (today) and on ``Shed`` (chat Interactive, the others Batch). Per run: goodput (requests within
1000/50 ms per second) and its share of the mix's peak goodput over the rates of the same policy — the issue's
"goodput stays ≥ 90 % of its peak past the knee instead of collapsing".

The results document follows the benchmark convention (disagg.bench.docs): ``docs/results/overload.json`` with
:func:`render_tables`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

COMMAND = "disagg bench overload --out docs/results/overload.json"
DURATION_S = 60.0
SLO_TTFT_MS, SLO_TPOT_MS = 1000, 100
CHAT_RATE = 4.0
BATCH_RATES = (4.0, 8.0, 12.0, 16.0, 24.0, 32.0)
POLICIES = ("Admit", "Shed", "Queue")
CHAT = ("chat", 1000, 128)
BATCH = ("batch", 3000, 256)


@dataclass(frozen=True)
class Step:
    batch_rate: float
    policy: str


def arrivals(batch_rate: float, duration_s: float, seed: int) -> list[Any]:
    """Poisson arrivals of both tenants (chat's the same at every step), sorted, with stable ids."""
    from ..twin import Arrival

    raw: list[tuple[float, str, int, int]] = []
    for (tenant, inp, out), rate, s in ((CHAT, CHAT_RATE, seed * 2 + 1), (BATCH, batch_rate, seed * 2 + 2)):
        r, t = random.Random(s), 0.0
        while (t := t + r.expovariate(rate)) < duration_s:
            raw.append((t, tenant, inp, out))
    raw.sort()
    return [Arrival(at=t, input_tokens=i, output_tokens=o, tenant=tn, request_id=f"r{k:05d}")
            for k, (t, tn, i, o) in enumerate(raw)]


def router_config(batch_policy: str) -> dict[str, Any]:
    tenants: list[dict[str, Any]] = [
        {"name": "chat", "match": {"values": ["chat"]}, "priority": "Interactive"},
        {"name": "batch", "match": {"values": ["batch"]}, "priority": "Batch", "overload": batch_policy}]
    return {"model": "m", "mode": "Disaggregated", "routing": {"policy": "SLO", "tenants": tenants},
            "slo": {"ttftP95Ms": SLO_TTFT_MS, "tpotP95Ms": SLO_TPOT_MS}}


def run_step(step: Step, duration_s: float = DURATION_S, seed: int = 0) -> dict[str, Any]:
    from ..perf.roofline import percentile
    from ..twin import ClusterSpec, PoolSpec, simulate
    from ..twin.run import SLO

    spec = ClusterSpec(prefill=PoolSpec(1), decode=PoolSpec(1), router=router_config(step.policy))
    r = simulate(spec, arrivals(step.batch_rate, duration_s, seed), slo=SLO(SLO_TTFT_MS, SLO_TPOT_MS), seed=seed,
                 window_s=duration_s)
    row: dict[str, Any] = {"batch_rate": step.batch_rate, "policy": step.policy}
    for tenant in ("chat", "batch"):
        rs = [x for x in r.records if x.tenant == tenant]
        met = sum(x.meets(r.slo) for x in rs)
        ttfts = [x.ttft_s for x in rs if x.ttft_s is not None]
        row[tenant] = {
            "offered": len(rs), "served": sum(x.ok for x in rs), "met": met,
            "attainment": round(met / len(rs), 4) if rs else None,
            "goodput_rps": round(met / duration_s, 3),
            "refused_429": sum(x.status == 429 for x in rs),
            "ttft_p95_ms": round(percentile(ttfts, 95) * 1000.0, 1) if ttfts else None,
        }
    return row


def run(duration_s: float = DURATION_S, seed: int = 0, rates: tuple[float, ...] = BATCH_RATES,
        policies: tuple[str, ...] = POLICIES, progress: Any = None,
        mixes: tuple[str, ...] = (), mix_progress: Any = None) -> dict[str, Any]:
    rows = []
    for rate in rates:
        for policy in policies:
            row = run_step(Step(rate, policy), duration_s, seed)
            if progress is not None:
                progress(row)
            rows.append(row)
    out = {"duration_s": duration_s, "seed": seed, "chat_rate": CHAT_RATE,
           "slo": {"ttft_ms": SLO_TTFT_MS, "tpot_ms": SLO_TPOT_MS},
           "cluster": "1 prefill + 1 decode, H100-SXM, Llama-3.1-8B (twin)", "steps": rows,
           "summary": summarise(rows)}
    if mixes:
        out["mixes"] = run_mixes(mixes, seed=seed, progress=mix_progress)
    return out


# ----------------------------------------------------------------------------- the goodput sweep's mixes
MIX_NAMES = ("short-chat", "long-rag", "mixed", "code-completion", "shifting")
MIX_GPUS, MIX_PREFILL = 4, 1
MIX_POLICIES = ("Admit", "Shed")
PAST_KNEE = 2.0  # the last rate: this many times the sweep's top rate
PEAK_SHARE = 0.9  # issue 29: goodput past the knee ≥ this share of its peak


def mix_tenants(mix: str, policy: str) -> list[dict[str, Any]]:
    """Every tenant of ``mix`` with ``overload: policy``: chat Interactive, the others Batch."""
    from ..load.workload import MIXES

    names = sorted({c.tenant for c in MIXES[mix].classes + MIXES[mix].then})
    return [{"name": n, "match": {"values": [n]}, "priority": "Interactive" if n == "chat" else "Batch",
             "overload": policy} for n in names]


def run_mix(mix: str, rate: float, policy: str, seed: int = 0) -> dict[str, Any]:
    """One run of ``mix`` at ``rate`` req/s on the 4-GPU conditional deployment, every tenant on ``policy``."""
    from ..twin import SLO, ClusterSpec, arrivals_from_mix, simulate
    from . import goodput as gp

    settings = gp.TwinSettings(gpus=MIX_GPUS)
    plan = gp.SWEEP_PLANS[mix]
    duration = plan.duration_s or settings.duration_s
    cfg = gp.Config("c-default", MIX_PREFILL, MIX_GPUS - MIX_PREFILL)
    base = cfg.cluster(settings)
    router = {**cfg.router(), "routing": {"tenants": mix_tenants(mix, policy)}}
    spec = ClusterSpec(prefill=base.prefill, decode=base.decode, router=router, drain_s=base.drain_s)
    slo = gp.SLOS[0]
    r = simulate(spec, arrivals_from_mix(mix, rate, duration, seed=seed, model=gp.SIM_MODEL), seed=seed,
                 slo=SLO(slo.ttft_ms, slo.tpot_ms), window_s=duration)
    at = r.at_slo(SLO(slo.ttft_ms, slo.tpot_ms))
    return {"mix": mix, "rate": rate, "policy": policy, "requests": len(r.records),
            "goodput_rps": at["goodput_rps"], "attainment": at["attainment"],
            "refused_429": sum(x.status == 429 for x in r.records)}


def run_mixes(mixes: tuple[str, ...] = MIX_NAMES, seed: int = 0, progress: Any = None) -> dict[str, Any]:
    from . import goodput as gp

    rows = []
    for mix in mixes:
        ladder = tuple(x * MIX_GPUS for x in gp.SWEEP_PLANS[mix].rates_per_gpu)
        for rate in (*ladder, PAST_KNEE * ladder[-1]):
            for policy in MIX_POLICIES:
                row = run_mix(mix, rate, policy, seed)
                if progress is not None:
                    progress(row)
                rows.append(row)
    return summarise_mixes(rows)


def summarise_mixes(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each run's goodput as a share of its mix's peak (the most goodput of any run of the mix, either policy: the
    deployment's capacity), and the mixes whose top rate keeps :data:`PEAK_SHARE` of it, per policy."""
    from . import goodput as gp

    mixes = list(dict.fromkeys(r["mix"] for r in rows))
    for mix in mixes:
        mine = [r for r in rows if r["mix"] == mix]
        peak = max((r["goodput_rps"] for r in mine), default=0.0)
        for r in mine:
            r["of_peak"] = round(r["goodput_rps"] / peak, 3) if peak else None
    top = {m: max(r["rate"] for r in rows if r["mix"] == m) for m in mixes}
    held = {p: [m for m in mixes if (next(r for r in rows if r["mix"] == m and r["policy"] == p
                                         and r["rate"] == top[m])["of_peak"] or 0.0) >= PEAK_SHARE]
            for p in MIX_POLICIES}
    return {"gpus": MIX_GPUS, "prefill": MIX_PREFILL, "slo": gp.SLOS[0].key, "past_knee": PAST_KNEE,
            "rows": rows, "held_at_top": held, "target": f"goodput at {PAST_KNEE:g} × the top rate ≥ "
            f"{PEAK_SHARE:.0%} of the peak"}


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per policy: chat's lowest attainment over the steps, and batch's goodput at the highest step against its
    peak over the steps without admission (the deployment's capacity for batch beside chat)."""
    peak = max((r["batch"]["goodput_rps"] for r in rows if r["policy"] == "Admit"), default=0.0)
    top = max((r["batch_rate"] for r in rows), default=0.0)
    out = []
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == policy]
        last = next(r for r in mine if r["batch_rate"] == top)
        out.append({"policy": policy,
                    "chat_min_attainment": min(r["chat"]["attainment"] for r in mine),
                    "batch_goodput_at_top_rps": last["batch"]["goodput_rps"],
                    "batch_peak_without_admission_rps": peak,
                    "batch_goodput_at_top_vs_peak": round(last["batch"]["goodput_rps"] / peak, 3) if peak else None})
    return out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100.0 * x:.1f} %"


def render_tables(results_doc: dict[str, Any]) -> dict[str, str]:
    res = results_doc["results"]
    lines = ["| batch req/s | batch overload | chat attainment | chat TTFT p95 ms | batch attainment | "
             "batch goodput req/s | batch refused (429) |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for r in res["steps"]:
        c, b = r["chat"], r["batch"]
        lines.append(f"| {r['batch_rate']:g} | {r['policy']} | {_pct(c['attainment'])} | {c['ttft_p95_ms']} | "
                     f"{_pct(b['attainment'])} | {b['goodput_rps']} | {b['refused_429']} |")
    summary = ["| batch overload | chat attainment, lowest step | batch goodput at the top step (req/s) | "
               "÷ batch's peak without admission |", "|---|---:|---:|---:|"]
    for s in res["summary"]:
        summary.append(f"| {s['policy']} | {_pct(s['chat_min_attainment'])} | {s['batch_goodput_at_top_rps']} | "
                       f"{_pct(s['batch_goodput_at_top_vs_peak'])} |")
    tables = {"steps": "\n".join(lines), "summary": "\n".join(summary)}
    if "mixes" in res:
        m = res["mixes"]
        ml = ["| mix | rate /s | overload (every tenant) | goodput req/s | attainment | ÷ its peak | refused (429) |",
              "|---|---:|---|---:|---:|---:|---:|"]
        for r in m["rows"]:
            ml.append(f"| {r['mix']} | {r['rate']:g} | {r['policy']} | {r['goodput_rps']:.1f} | "
                      f"{_pct(r['attainment'])} | {_pct(r['of_peak'])} | {r['refused_429']} |")
        verdict = "; ".join(f"{p}: {len(v)} of {len({r['mix'] for r in m['rows']})} mixes"
                            for p, v in m["held_at_top"].items())
        tables["mixes"] = ("\n".join(ml) + f"\n\nTarget — {m['target']} ({m['gpus']} GPUs, "
                           f"{m['prefill']}P+{m['gpus'] - m['prefill']}D, SLO {m['slo']} ms): {verdict}.")
    return tables

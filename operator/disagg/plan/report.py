"""What ``disagg plan`` prints: the ranked table, and one paragraph a person can check."""

from __future__ import annotations

import math
from collections.abc import Sequence

from .search import Candidate, Mode, PlanResult, display_set
from .sizes import neighbours


def _ms(x: float) -> str:
    if math.isnan(x):
        return "-"
    if math.isinf(x):
        return "∞"
    return f"{x / 1e3:.2f} s" if x >= 10_000 else f"{x:.0f}" if x >= 100 else f"{x:.1f}"


def table(result: PlanResult, rows: Sequence[Candidate]) -> str:
    slo = result.profile.slo
    head = ("#", "mode", "remote ≥", "prefill", "decode", "GPUs", "cost/h", "cost/Mtok",
            f"TTFT p95 ms (≤{slo.ttft_p95_ms})", f"TPOT p95 ms (≤{slo.tpot_p95_ms})", "KV xfer p95 ms",
            f"goodput (≥{slo.goodput_target:.0%})", f"capacity req/s (≥{result.cover_rps:.3g})", "verdict")
    lines = []
    for i, c in enumerate(rows, 1):
        rank = str(result.ranked.index(c) + 1) if c in result.ranked else str(i)
        lines.append((
            rank, c.mode, "-" if c.threshold is None else str(c.threshold),
            str(c.prefill) if c.prefill else "-", str(c.decode), str(c.gpus), f"{c.cost_per_hour:.2f}",
            f"{c.cost_per_mtok:.3f}", _ms(c.ttft_p95_ms), _ms(c.tpot_p95_ms), _ms(c.xfer_p95_ms),
            f"{c.goodput:.1%}", _capacity(c), "ok" if c.feasible else "; ".join(c.reasons)))
    widths = [max([len(h)] + [len(r[k]) for r in lines]) for k, h in enumerate(head)]
    fmt = "  ".join(f"{{:{'<' if k in (1, 4, 3, 13) else '>'}{w}}}" for k, w in enumerate(widths))
    out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*r) for r in lines]
    return "\n".join(o.rstrip() for o in out)


def _capacity(c: Candidate) -> str:
    m = c.margin
    if m is None:
        return "-"
    return f"{m.capacity_rps:.3g} ({m.headroom:+.0%})"


def headroom(result: PlanResult, c: Candidate) -> str:
    """What margin the pick kept, and why: the rate it was sized for, its capacity, per-pool utilisation, and the
    cheaper candidates that met the SLOs at the peak but not at the cover rate."""
    m = c.margin
    if m is None:
        return ""
    p = result.profile
    b = p.traffic.burstiness
    if m.cover_rps > m.peak_rps * (1 + 1e-9):
        sized = (f"Headroom: sized to meet the SLOs at {m.cover_rps:.3g} req/s ({m.cover_what}, search.coverPeak "
                 f"{p.search.cover_peak}), {m.cover_rps / m.peak_rps - 1:+.0%} over peakRps {m.peak_rps:g}")
    else:
        why = ("no short-window peak declared above it" if p.search.cover_peak != "none"
               else "search.coverPeak: none")
        sized = f"Headroom: sized for peakRps {m.peak_rps:g} req/s ({why})"
    arr = (f"arrivals modelled with inter-arrival cv {b.interarrival_cv:g} (queue waits × {(m.ca2 + 1) / 2:.2g} "
           "of Poisson's for exponential service; G/G/c, Allen–Cunneen)" if abs(m.ca2 - 1) > 1e-9
           else "arrivals modelled as Poisson (cv 1: traffic.burstiness not given or cv 1)")
    pools = []
    if m.prefill_util is not None:
        pools.append(f"prefill pool {m.prefill_util:.0%} utilised")
    pools.append(f"decode batch at {m.decode_util:.0%} of its cap"
                 + (f", {m.decode_prefill_share:.0%} of its time on local prefills" if m.decode_prefill_share > 0
                    else ""))
    parts = [f"{sized}; {arr}. Its capacity is {m.capacity_rps:.3g} req/s ({m.headroom:+.0%} over peakRps): "
             f"{'; '.join(pools)}; TTFT p95 {m.ttft_of_slo:.0%} and TPOT p95 {m.tpot_of_slo:.0%} of the SLO at "
             "the peak."]
    cheaper = [x for x in result.ranked if x.short_of_headroom and x.cost_per_hour < c.cost_per_hour - 1e-9]
    if cheaper:
        x = min(cheaper, key=lambda y: y.cost_per_hour)
        parts.append(f"{len(cheaper)} cheaper candidate{'s' if len(cheaper) > 1 else ''} meet the SLOs at the "
                     f"peak but not at {m.cover_rps:.3g} req/s (cheapest: {x.label()}, {x.gpus} GPUs, "
                     f"{x.cost_per_hour / c.cost_per_hour - 1:+.0%} cost); that is the price of the headroom.")
    return " ".join(parts)


def _why_local(c: Candidate) -> str:
    d = c.dside
    if d.prefill_share <= 0:
        return f"decode runs {d.batch:.0f} sequences per replica at a {d.step_s * 1e3:.1f} ms step"
    return (f"local prefills take {d.prefill_share:.0%} of each decode replica's time, stretching the "
            f"{d.step_s * 1e3:.1f} ms decode step ({d.batch:.0f} sequences) to a {d.tpot_mean_s * 1e3:.1f} ms "
            "mean TPOT")


def explain(result: PlanResult, c: Candidate) -> str:
    """Which phase binds, by how much, and what one replica fewer or the other modes would do."""
    p = result.profile
    slo = p.slo
    rt = c.ttft_p95_ms / slo.ttft_p95_ms
    rd = c.tpot_p95_ms / slo.tpot_p95_ms
    parts = [f"{c.label()} on {c.gpus} GPUs ({c.cost_per_hour:.2f} cost units/h, {c.cost_per_mtok:.3f} per million "
             f"output tokens at the peak {result.workload.peak_rps:g} req/s) predicts goodput {c.goodput:.1%}."]
    if rt >= rd:
        where = []
        if c.prefill is not None:
            where.append(f"the prefill pool runs at {c.pqueue.rho:.0%} utilisation "
                         f"(mean queue wait {c.pqueue.mean_wait * 1e3:.0f} ms)")
            if not math.isnan(c.xfer_p95_ms):
                where.append(f"KV transfer p95 {c.xfer_p95_ms:.1f} ms")
        if c.mode != "disaggregated":
            where.append(f"local prefills queue on the decode replicas at {c.dside.local_queue.rho:.0%} utilisation")
        parts.append(f"TTFT binds: p95 {c.ttft_p95_ms:.0f} ms of {slo.ttft_p95_ms} ms ({rt:.0%} of the target; "
                     + "; ".join(where)
                     + f"); TPOT p95 {c.tpot_p95_ms:.1f} ms is {rd:.0%} of its {slo.tpot_p95_ms} ms.")
    else:
        parts.append(f"TPOT binds: p95 {c.tpot_p95_ms:.1f} ms of {slo.tpot_p95_ms} ms ({rd:.0%} of the target; "
                     f"{_why_local(c)}); TTFT p95 {c.ttft_p95_ms:.0f} ms is {rt:.0%} of its {slo.ttft_p95_ms} ms.")
    for what, n in neighbours(p, c):
        verdict = "still meets the SLOs" if n.feasible else "fails: " + "; ".join(n.reasons)
        parts.append(f"With {what}: TTFT p95 {_ms(n.ttft_p95_ms)} ms, TPOT p95 {_ms(n.tpot_p95_ms)} ms, goodput "
                     f"{n.goodput:.1%} — {verdict}.")
    modes: tuple[Mode, ...] = ("aggregated", "disaggregated", "conditional")
    for mode in modes:
        if mode == c.mode:
            continue
        best = result.best_of(mode)
        if best is None:
            continue
        if best.feasible:
            extra = best.cost_per_hour / c.cost_per_hour - 1
            parts.append(f"The best {mode} plan ({best.label()}) costs {extra:+.0%}.")
        else:
            parts.append(f"No {mode} plan within {p.search.max_gpus} GPUs meets the SLOs (closest: {best.label()}: "
                         + "; ".join(best.reasons) + ").")
    return " ".join(parts)


def no_plan(result: PlanResult) -> str:
    """What to change when nothing is feasible, read off the closest candidates."""
    p = result.profile
    if not result.ranked:
        return ("No candidate could be built: " + "; ".join(result.skipped or ["no GPU shape fits the model"])
                + ". Offer GPUs with more memory, allow larger tensorParallel, or raise search.maxGpus.")
    best = result.ranked[0]
    tips = []
    if not math.isinf(best.ttft_p95_ms) and best.ttft_p95_ms > p.slo.ttft_p95_ms:
        tips.append(f"a TTFT target of {math.ceil(best.ttft_p95_ms / 50) * 50:.0f} ms")
    if not math.isinf(best.tpot_p95_ms) and best.tpot_p95_ms > p.slo.tpot_p95_ms:
        tips.append(f"a TPOT target of {math.ceil(best.tpot_p95_ms)} ms")
    if not tips and best.goodput < p.slo.goodput_target:
        tips.append(f"a goodput target of {math.floor(best.goodput * 100) / 100:.2f}")
    tips.append(f"more GPUs than search.maxGpus {p.search.max_gpus} (or a faster GPU type)")
    return (f"No feasible plan within {p.search.max_gpus} GPUs at {result.workload.peak_rps:g} req/s. The closest "
            f"candidate, {best.label()}, misses by: " + "; ".join(best.reasons)
            + ". To get a plan, accept " + ", or ".join(tips) + ", or lower traffic.rate.peakRps.")


def render(result: PlanResult) -> str:
    p, wl = result.profile, result.workload
    rows = display_set(result.ranked) if result.winner else result.ranked[:5]
    head = (f"plan {p.name}: {result.model.name} · {wl.peak_rps:g} req/s peak ({wl.mean_rps:g} mean) · "
            f"input {wl.mean_in:.0f} / output {wl.mean_out:.0f} tokens mean · prefix hits "
            f"{p.traffic.prefix_cache_hit_share:.0%} · KV over {p.kv_transport}\n"
            f"searched {result.evaluated} candidates in {result.seconds:.2f} s "
            f"({len(result.feasible)} meet TTFT p95 ≤ {p.slo.ttft_p95_ms} ms, TPOT p95 ≤ {p.slo.tpot_p95_ms} ms, "
            f"goodput ≥ {p.slo.goodput_target:.0%})")
    out = [head, ""]
    if result.skipped:
        out += ["not considered: " + "; ".join(result.skipped), ""]
    if result.winner is None:
        out += [no_plan(result)]
        if rows:
            out += ["", "closest candidates:", table(result, rows)]
    else:
        out += [table(result, rows), "", "why: " + explain(result, result.winner)]
        room = headroom(result, result.winner)
        if room:
            out += ["", room]
    return "\n".join(out)

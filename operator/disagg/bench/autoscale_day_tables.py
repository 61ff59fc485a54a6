"""The virtual day's tables (bench/autoscale_day.py's results → markdown; ``python -m disagg.bench.docs``)."""

from __future__ import annotations

from typing import Any


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1%}"


def render_tables(doc: dict[str, Any]) -> dict[str, str]:
    r = doc["results"]
    s = r["settings"]
    days = {d["scaler"]: d for d in r["days"]}
    st = r["static_peak"]
    lines = [f"Day: {s['day_s']:.0f} virtual s standing for 24 h, {r['requests']} requests (mean "
             f"{r['mean_rps']} req/s, peak {s['peak_rps']} req/s + bursts ×{s['burst_factor']}), L40S, "
             f"Llama-3.1-8B; pod start {r['days'][1]['pod_start_s'] if len(r['days']) > 1 else 'n/a'} s; "
             f"interval {s['interval_s']} s, scale-down window {s['scale_down_stabilization_s']} s. "
             "Savings ceiling 1 − mean ÷ peak demand = "
             f"**{r['savings_ceiling']:.1%}** (oracle demand {r['mean_demand_gpus']} GPUs mean, "
             f"{r['peak_demand_gpus']} peak). Static peak: {st['prefill']}P + {st['decode']}D "
             f"(model's answer {st['model_guess'][0]}P + {st['model_guess'][1]}D) at {st['rate']} req/s. "
             f"Probes (static peak, oracle): {s['probe_s']:g} s measured after {s.get('probe_warmup_s', 0.0):g} s "
             "of the same load. "
             f"Wall time {r['wall_s']} s ({r['jobs']} processes).", "",
             "| scaler | GPU-s | ÷ static peak | ÷ oracle | ÷ loose oracle | attainment | Δ vs static (points) "
             "| share of ceiling | scale events (per virtual h) | largest oscillation | peak P + D | CPU s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    loose = r["oracle"]["loose_gpu_seconds"]
    for name, d in days.items():
        share = d.get("share_of_ceiling")
        lines.append(f"| {name} | {d['gpu_seconds']:.0f} | {d['vs_static']:.3f} | {d['vs_oracle']:.3f} | "
                     f"{d['vs_loose_oracle']:.3f} | "
                     f"{_pct(d['attainment'])} | {d['attainment_vs_static_points']:+.2f} | "
                     f"{'n/a' if share is None else f'{share:.0%}'} | {d['events']} ({d['events_per_hour_virtual']})"
                     f" | {d['largest_oscillation']} | {d['peak']['prefill']} + {d['peak']['decode']} | "
                     f"{d['cpu_s']} |")
    static_s = days["static_peak"]["gpu_seconds"]
    lines.append(f"| hindsight oracle (the SLO's p95s per bucket) | {r['oracle']['gpu_seconds']:.0f} | "
                 f"{r['oracle']['gpu_seconds'] / static_s:.3f} | 1.000 | "
                 f"{r['oracle']['gpu_seconds'] / loose:.3f} | ≥ 95 % within each target | | | | | | |")
    lines.append(f"| loose oracle (lower bound) | {loose:.0f} | {loose / static_s:.3f} | "
                 f"{loose / r['oracle']['gpu_seconds']:.3f} | 1.000 | ≥ 90 % within both per bucket | | | | | | |")
    day = "\n".join(lines)
    p = r["step"]
    verdict = "n/a (never breached)" if p["met"] is None else ("met" if p["met"] else "MISSED")
    rec = "n/a" if p["recovery_s"] is None else f"{p['recovery_s']:.0f} s"
    step = "\n".join([
        f"| step | start | worst {p['bucket_s']:.0f} s bucket after | recovery (to ≥ 90 % for good) | "
        "target (interval + pod start) | |",
        "|---|---|---:|---:|---:|---|",
        f"| {p['base_rps']} → {p['base_rps'] * p['factor']:.1f} req/s at {p['step_at']:.0f} s (RAG share "
        f"{p['rag_share']:.0%}) | {p['start'][0]}P + {p['start'][1]}D → peak {p['peak']['prefill']}P + "
        f"{p['peak']['decode']}D | {_pct(p['worst_after'])} | {rec} | {p['target_s']} s | {verdict} |"])
    out = {"day": day, "step": step}
    if r.get("swings"):
        out["swing"] = _swing_table(r["swings"])
    return out


def _swing_table(swings: list[dict[str, Any]]) -> str:
    lines = ["| mix (summarise share) | scaler | start → need | worst 10 s bucket after | recovery (to ≥ 90 % for "
             "good) | attainment after the swing | GPU-s | role moves (lent, at) |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for w in swings:
        rec = "none needed" if not w["breached"] else ("n/a" if w["recovery_s"] is None else f"{w['recovery_s']:.0f} s")
        moves = ", ".join(f"{e['pool']} {e['after']} at {e['t']:.0f} s" for e in w["role_moves"]) or "—"
        lines.append(f"| {w['share_before']:.0%} → {w['share_after']:.0%} at {w['rate']} req/s | {w['scaler']} | "
                     f"{w['start'][0]}P + {w['start'][1]}D → {w['need_after'][0]}P + {w['need_after'][1]}D | "
                     f"{_pct(w['worst_after'])} | {rec} | {_pct(w['attainment_after'])} | {w['gpu_seconds']:.0f} | "
                     f"{moves} |")
    return "\n".join(lines)

"""``disagg bench soak``: the soak (:mod:`disagg.local.soak`) on a fresh local stack, its results written to
docs/results/soak.json (the convention of :mod:`disagg.bench.docs`) and rendered into docs/benchmarks.md R2."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..results import invoked_command, machine_facts, results_doc, write_results


def command_line(rate: float, seed: int) -> str:
    return f"disagg bench soak --rate {rate:g} --seed {seed}"


def run(rate: float = 1.5, seed: int = 7, out: Path | None = None, log_dir: Path | None = None,
        say: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """A fresh local stack, the demo model with :data:`~disagg.local.soak.SOAK_OVERRIDES`, the soak; returns the
    results document (settings, figures, faults, losses) and writes it to ``out``. Stops everything it started."""
    from ..local.harness import REAL_TIME, serving, started_stack
    from ..local.soak import SOAK_OVERRIDES, Settings, Soak

    say("starting the local stack")
    with started_stack("soak", log_dir, say, sim_env=REAL_TIME) as stack:
        say("deploying the model; waiting until both pools serve")
        with serving(stack, SOAK_OVERRIDES) as model:
            report = Soak(model, Settings(rate=rate, seed=seed), say=say).run()
    doc = results_doc("soak", invoked_command(command_line(rate, seed)), report.to_json(), machine_facts())
    if out is not None:
        write_results(out, doc)
    return doc


def table(doc: dict[str, Any]) -> str:
    """The figures for the terminal."""
    f = doc["results"]["figures"]
    lines = [f"requests {f['requests']} ({f['streamed_requests']} streamed, {f['non_streamed_requests']} not) in "
             f"{f['duration_s']} s; ok {f['ok']}",
             f"failed before the first token: {f['failed_before_first_token']}; short answers: {f['short_answers']}",
             f"mid-stream losses: {f['mid_stream_losses']} (unexplained: {f['mid_stream_losses_unexplained']}): "
             f"{f['mid_stream_loss_errors']}",
             f"connect retries: {f['connect_retries']} over {f['requests_retried']} requests",
             f"paths: {f['paths']}", f"fallback causes: {f['fallback_causes']}",
             f"TTFT p50/p95 ms: {f['ttft_p50_ms']} / {f['ttft_p95_ms']}",
             "", "fault                at(s)  dur(s)  overlapping  failed  fallbacks  retried",
             "                                  (requests in flight during the fault; failed: ended in it)"]
    for name, x in f["faults"].items():
        lines.append(f"{name:<20} {x['start_s']:>5}  {x['duration_s']:>6}  {x['requests_overlapping']:>11}  "
                     f"{x['failed']:>6}  {x['fallbacks']:>9}  {x['retried']:>7}")
    lines += ["", f"mode history: {f['mode_history']} (unexplained flips: {f['mode_flips_unexplained']})"]
    for pool, x in f["scale"].items():
        lines.append(f"scale {pool}: {x['count']} events, {x['direction_changes']} direction changes "
                     f"(min {x['min']}, max {x['max']}): {x['events']}")
    lines += [f"scale events during the Prometheus outage: {f['scale_events_during_prometheus_outage']}",
              f"duplicate children: {f['duplicate_children']}; re-created by the operator restart: "
              f"{f['children_recreated_by_operator_restart']}",
              f"replicas after the operator restart: {f['replicas_after_operator_restart']}"]
    return "\n".join(lines)


def _message(error: str) -> str:
    """The message of an OpenAI error object as the client recorded it (its repr), else the text's start."""
    m = re.search(r"'message': '([^']*)'", error)
    return m.group(1) if m else error[:70]


def _counts(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "none"


def render_tables(doc: dict[str, Any]) -> dict[str, str]:
    """docs/benchmarks.md R2: ``figures`` (the whole run) and ``faults`` (one row per fault)."""
    r = doc["results"]
    f = r["figures"]
    killed = f["faults"].get("kill-decode", {}).get("worker")
    losses = r.get("mid_stream_losses", [])
    on_killed = sum(x.get("decode_worker") == killed for x in losses) if killed else 0
    errors = sorted({_message(str(x.get("error", ""))) for x in losses})
    scale = f["scale"]
    rep = f["replicas_after_operator_restart"]
    dup = {when: d for when, d in f["duplicate_children"].items() if d}
    rows = [
        ("requests", f"{f['requests']} in {f['duration_s']:g} s ({f['streamed_requests']} streamed, "
                     f"{f['non_streamed_requests']} not); ok {f['ok']}"),
        ("paths", f"{_counts(f['paths'])} (fallback causes: {_counts(f['fallback_causes'])})"),
        ("**failed before the first token**", f"**{f['failed_before_first_token']}**"),
        ("short answers (ok, fewer tokens than `max_tokens`; every request sets `ignore_eos`)",
         str(f["short_answers"])),
        ("**mid-stream losses**", f"**{f['mid_stream_losses']}**; unexplained "
                                  f"{f['mid_stream_losses_unexplained']}; decode leg on the killed decode pod "
                                  f"(router log `decode_worker`): {on_killed} of {len(losses)}"
         + (f"; client error: {'; '.join(f'`{e}`' for e in errors)}" if errors else "")),
        ("connect retries", f"{f['connect_retries']}, for {f['requests_retried']} requests"),
        ("mode history", "; ".join(f"`{h}`" for h in f["mode_history"]) or "no flip"),
        ("mode flips without a fault to explain them", str(f["mode_flips_unexplained"])),
        ("scale events (`Scaled` Events; `lastScale` changes)",
         ", ".join(f"{p} {x['count']} (`lastScale` changes {x['last_scale_changes']}, direction changes "
                   f"{x['direction_changes']})" for p, x in scale.items())
         + f"; during the Prometheus outage: {f['scale_events_during_prometheus_outage']}"),
        ("children (Deployment, Service, ConfigMap, PDB, ServiceAccount per role)",
         ("one each at the start, after the operator restart and at the end" if not dup
          else f"duplicates: {dup}")
         + "; re-created by the operator restart: "
         + (", ".join("/".join(map(str, c)) for c in f["children_recreated_by_operator_restart"]) or "none")),
        ("replicas after the operator restart", ", ".join(f"{p} {x['deployment']} (desired {x['desired']})"
                                                           for p, x in rep.items())),
        ("TTFT p50 / p95", f"{f['ttft_p50_ms']:.0f} ms / {f['ttft_p95_ms']:.0f} ms"),
    ]
    figures = ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]
    faults = ["| fault | at | lasted | requests in flight | failed (ended in it) | fallbacks | retried |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, x in f["faults"].items():
        faults.append(f"| {name} | {x['start_s']:g} s | {x['duration_s']:g} s | {x['requests_overlapping']} | "
                      f"{x['failed']} | {x['fallbacks']} | {x['retried']} |")
    return {"figures": "\n".join(figures), "faults": "\n".join(faults)}

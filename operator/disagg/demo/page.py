"""The demo report as a page an on-call engineer reads (``results/…/report.html``): what the run did, in tables
with headings in words; the plots; the slowest request's trace drawn as a waterfall; every act's requests with
their decision, reason, phases and a link to their trace.

Pure: data in, markup out (:mod:`disagg.htmlpage` holds the style and the pieces). The PNG plots are drawn by
:mod:`.report`, which names them here by file name.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..htmlpage import Cell, SpanBar, cell, esc, figure, link, page, paragraph, section, table, waterfall_svg
from ..load.loadgen import Result
from ..local.harness import PhaseResult

# The plots report.py draws: file name → (heading, what it shows)
PLOTS = {
    "latency_by_path.png": ("Latency by routing decision",
                            "Share of requests at or below each TTFT and TPOT, per decision; the red line is the "
                            "SLO's p95."),
    "phase_breakdown.png": ("Where the time goes",
                            "Mean milliseconds per request in each phase the router measures, per path."),
    "timeline.png": ("Mode and replicas over the run",
                     "Desired (solid) and ready (dotted) replicas per pool; red: the model served aggregated. "
                     "Numbered lines are the run's events, listed below the plot."),
}


def router_lines(router_log: str) -> dict[str, dict[str, Any]]:
    """The router's request log lines (JSON, ``event: request``) by request id."""
    out: dict[str, dict[str, Any]] = {}
    for raw in router_log.splitlines():
        if not raw.startswith("{") or '"request_id"' not in raw:
            continue
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if rec.get("event") == "request" and rec.get("request_id"):
            out[str(rec["request_id"])] = rec
    return out


@dataclass
class PageInput:
    """Everything the page shows. ``lines``: the router's log line per request id (:func:`router_lines`);
    ``trace_base``: the trace backend's URL for one trace id (Jaeger's query API), None without traces."""

    runs: Sequence[PhaseResult]
    slo: tuple[int, int]
    modes: Sequence[str]
    marks: Sequence[tuple[float, str]]
    load_steps: Mapping[str, str]  # label → "prefill 1 → 2 (first growth 4 s), decode …"
    phase_means_s: Mapping[str, Mapping[str, float]]
    plots: Sequence[str]  # file names in the report's directory
    lines: Mapping[str, Mapping[str, Any]]
    trace_base: str | None = None
    slowest: str | None = None
    slowest_bars: Sequence[SpanBar] = ()
    saved_trace: str | None = None  # file name of the slowest trace's JSON, next to the page
    traces_missing: str | None = None


def _ms(v: float | None, digits: int = 0) -> Cell:
    return cell(None if v is None else f"{v * 1000:,.{digits}f}", "n")


def _summary_table(inp: PageInput) -> str:
    ttft, tpot = inp.slo
    rows = []
    for ph in inp.runs:
        s = ph.summary
        remote = sum(r.decision == "remote" for r in ph.results)
        rows.append([cell(ph.name), cell(s.requests, "n"), cell(s.errors, "n", status="bad" if s.errors else ""),
                     cell(remote, "n"), cell(s.requests - remote, "n"),
                     cell(f"{s.ttft_p50_ms:,.0f}" if s.ttft_p50_ms is not None else None, "n"),
                     cell(f"{s.ttft_p95_ms:,.0f}" if s.ttft_p95_ms is not None else None, "n",
                          status="bad" if (s.ttft_p95_ms or 0) > ttft else "ok"),
                     cell(f"{s.tpot_p50_ms:,.1f}" if s.tpot_p50_ms is not None else None, "n"),
                     cell(f"{s.tpot_p95_ms:,.1f}" if s.tpot_p95_ms is not None else None, "n",
                          status="bad" if (s.tpot_p95_ms or 0) > tpot else "ok"),
                     cell(f"{s.goodput:.0%}", "n")])
    return table(["act", "requests", "errors", "remote prefill", "local prefill", "TTFT p50 ms", "TTFT p95 ms",
                  "TPOT p50 ms", "TPOT p95 ms", "goodput"], rows,
                 caption=f"Latencies in ms; SLO: TTFT p95 ≤ {ttft:,} ms, TPOT p95 ≤ {tpot:,} ms (red: missed). "
                         "Goodput: share of requests meeting both.")


def _decisions_table(runs: Sequence[PhaseResult]) -> str:
    counts = Counter((r.decision or "none", r.reason or "-") for ph in runs for r in ph.results)
    rows = [[cell(d), cell(reason, "id"), cell(n, "n")] for (d, reason), n in counts.most_common()]
    return table(["decision", "reason", "requests"], rows,
                 caption="The router's decision per request and why (docs/router.md lists every reason).")


def _phases_table(means: Mapping[str, Mapping[str, float]]) -> str:
    if not means:
        return paragraph("The router's metrics held no phase timings.")
    names = sorted({n for v in means.values() for n in v})
    rows = [[cell(path), *(_ms(means[path].get(n), 1) for n in names)] for path in sorted(means)]
    return table(["path", *(n.replace("_", " ") for n in names)], rows,
                 caption="Mean ms per request in each phase, from the router's histograms (docs/router.md says "
                         "where each phase's time comes from).")


def _timeline(inp: PageInput) -> str:
    parts = [paragraph("Mode: " + " → ".join(inp.modes) if inp.modes else "Mode: no samples.")]
    if inp.marks:
        parts.append(table(["#", "at (s)", "event"],
                           [[cell(i + 1, "n"), cell(f"{t:.0f}", "n"), cell(label)]
                            for i, (t, label) in enumerate(inp.marks)],
                           caption="The run's events; their numbers mark the timeline plot."))
    if inp.load_steps:
        parts.append(table(["load step", "desired replicas before → after (first growth after the step)"],
                           [[cell(k), cell(v)] for k, v in inp.load_steps.items()]))
    return "".join(parts)


def _phases_of(line: Mapping[str, Any] | None) -> str:
    if not line:
        return "-"
    timings = line.get("timings_ms") or {}
    return " · ".join(f"{k.replace('_', ' ')} {v:,.0f}" for k, v in timings.items()
                      if isinstance(v, (int, float))) or "-"


def _request_row(r: Result, inp: PageInput) -> list[Cell]:
    line = inp.lines.get(r.id)
    trace_id = line.get("trace_id") if line else None
    trace = (cell("trace", href=f"{inp.trace_base}/{trace_id}") if trace_id and inp.trace_base
             else cell("-"))
    ttft, tpot = inp.slo
    missed = not r.meets(ttft / 1000, tpot / 1000)
    return [cell(r.id, "id"), cell(r.cls), cell(r.input_tokens, "n"), cell(r.output_tokens, "n"),
            cell(r.decision or "-"), cell(r.reason or "-", "id"), cell(r.path or "-"),
            _ms(r.ttft_s), _ms(r.tpot_s, 1), _ms(r.e2e_s),
            cell(r.error or r.status, "id", status="bad" if missed else ""), cell(_phases_of(line)), trace]


def _acts(inp: PageInput) -> str:
    parts = []
    for ph in inp.runs:
        s = ph.summary
        rows = [_request_row(r, inp) for r in sorted(ph.results, key=lambda r: r.sent_at)]
        parts.append(f"<details><summary>{esc(ph.name)}: {s.requests} requests, goodput {s.goodput:.0%}, "
                     f"{s.errors} errors</summary>"
                     + table(["request", "class", "input tokens", "output tokens", "decision", "reason", "path",
                              "TTFT ms", "TPOT ms", "e2e ms", "status", "phases (ms, router)", "trace"], rows)
                     + "</details>")
    return (paragraph("Every request of each act in the order sent; status in red when it missed the SLO. Phases "
                      "are the router's timings from its request log line.") + "".join(parts))


def _traces(inp: PageInput) -> str:
    if inp.trace_base is None:
        return paragraph("This run traced nothing (the real-node demo runs without Jaeger).")
    parts = [paragraph("Traces are in Jaeger's query API while the demo runs (JSON; a Jaeger built from its Go "
                       "module has no web UI): " + inp.trace_base.rsplit("/api/", 1)[0] + ".")]
    if inp.slowest is None:
        return "".join([*parts, paragraph(f"No trace to show: {inp.traces_missing or 'no request was traced'}.")])
    parts.append(paragraph(inp.slowest))
    if inp.saved_trace:
        parts.append(f"<p>The trace as Jaeger returned it, saved next to this page: "
                     f"{link(inp.saved_trace, inp.saved_trace)}.</p>")
    if inp.slowest_bars:
        parts.append(waterfall_svg(inp.slowest_bars, "Waterfall of the slowest traced request"))
    elif inp.traces_missing:
        parts.append(paragraph(f"No waterfall: {inp.traces_missing}."))
    return "".join(parts)


def render_page(inp: PageInput) -> str:
    sections = [
        ("summary", "What each act did", _summary_table(inp)),
        ("decisions", "Routing decisions", _decisions_table(inp.runs)),
        ("phases", "Where the time goes, by phase", _phases_table(inp.phase_means_s)),
        ("timeline", "Mode, events and load steps", _timeline(inp)),
        ("plots", "Plots", "".join(figure(p, PLOTS.get(p, (p, ""))[0], " — ".join(x for x in PLOTS.get(p, (p, ""))
                                                                                    if x))
                                   for p in inp.plots)),
        ("trace", "Slowest traced request", _traces(inp)),
        ("requests", "Requests by act", _acts(inp)),
    ]
    nav = "<nav><ul>" + "".join(f"<li>{link('#' + a, t)}</li>" for a, t, _ in sections) + "</ul></nav>"
    body = nav + "".join(section(t, b, a) for a, t, b in sections)
    n = sum(len(ph.results) for ph in inp.runs)
    return page("disagg demo", body, subtitle=f"{n} requests in {len(inp.runs)} acts on the local stack.")

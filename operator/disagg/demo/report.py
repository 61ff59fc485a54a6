"""The demo's report: a terminal summary, PNG plots and the HTML page (:mod:`.page`) in the results directory."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ..load.loadgen import Result
from ..local.harness import PhaseResult, Timeline
from ..local.jaeger import span_bars
from ..router.metrics import PHASES
from .acts import LoadStep
from .page import PageInput, render_page, router_lines


@dataclass
class Report:
    terminal: str
    files: list[Path]


TRACE_FILE = "slowest_trace.json"


@dataclass
class TraceSection:
    """What the report says about traces: where Jaeger's query API is, the slowest traced request
    (:func:`slowest_traced_request`'s line), that trace's waterfall (:func:`disagg.local.jaeger.waterfall`) and the
    trace itself (Jaeger's JSON, saved as :data:`TRACE_FILE`: Jaeger keeps traces in memory and stops with the
    demo); ``missing``: why there is no trace to show."""

    query_url: str
    slowest: str | None = None
    trace_url: str | None = None
    waterfall: list[str] = field(default_factory=list)
    trace: dict[str, Any] | None = None
    missing: str | None = None

    def lines(self) -> list[str]:
        out = [f"traces: Jaeger query API at {self.query_url} (JSON; a Jaeger built from its Go module has no web "
               "UI)"]
        if self.slowest is None:
            return [*out, f"no trace to show: {self.missing or 'no request was traced'}"]
        out.append(self.slowest + (f" (saved as {TRACE_FILE})" if self.trace is not None else ""))
        if self.waterfall:
            out.append(f"  {'start':>12} {'duration':>12}  span [service] attributes (gen_ai.latency.* in ms)")
            out += ["  " + ln for ln in self.waterfall]
        elif self.missing:
            out.append(f"  no waterfall: {self.missing}")
        return out


def phase_means(metrics_text: str) -> dict[str, dict[str, float]]:
    """Mean seconds per phase and path, from the router's /metrics histograms."""
    sums: dict[tuple[str, str], float] = {}
    counts: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(metrics_text):
        phase = fam.name.removeprefix("disagg_").removesuffix("_seconds")
        if phase not in PHASES:
            continue
        for s in fam.samples:
            key = (phase, s.labels.get("path", ""))
            if s.name.endswith("_sum"):
                sums[key] = sums.get(key, 0.0) + s.value
            elif s.name.endswith("_count"):
                counts[key] = counts.get(key, 0.0) + s.value
    out: dict[str, dict[str, float]] = {}
    for (phase, path), n in counts.items():
        if n:
            out.setdefault(path, {})[phase] = sums.get((phase, path), 0.0) / n
    return out


def _fmt(v: Any, unit: str = "") -> str:
    return "—" if v is None else f"{v:,.0f}{unit}" if isinstance(v, float) and v >= 100 else f"{v}{unit}"


def write_report(results_dir: Path, runs: list[PhaseResult], timeline: Timeline, slo: tuple[int, int],
                 load_steps: dict[str, LoadStep], router_metrics: str = "", traces: TraceSection | None = None,
                 router_log: str = "") -> Report:
    """The report of a demo run: its traffic phases, its status timeline, the SLO (TTFT, TPOT p95 ms), its load
    steps (by key: long_outputs, long_prompts), the router's /metrics text at the end (phase breakdown), and what
    the traces show (None: the run traced nothing) and the router's log (its request lines: each request's phases
    and trace id on the page)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    phases = phase_means(router_metrics)
    lines: list[str] = ["", "=" * 100, "disagg demo — results (latencies in ms; SLO: TTFT p95 "
                        f"{slo[0]} ms, TPOT p95 {slo[1]} ms)", "=" * 100]
    header = f"{'phase':<24}{'reqs':>6}{'err':>5}{'remote':>8}{'local':>7}{'TTFT p50':>10}{'TTFT p95':>10}" \
             f"{'TPOT p50':>10}{'TPOT p95':>10}{'goodput':>9}"
    lines += [header, "-" * len(header)]
    rows = []
    for ph in runs:
        s = ph.summary
        remote = sum(r.decision == "remote" for r in ph.results)
        lines.append(f"{ph.name:<24}{s.requests:>6}{s.errors:>5}{remote:>8}{s.requests - remote:>7}"
                     f"{_fmt(s.ttft_p50_ms):>10}{_fmt(s.ttft_p95_ms):>10}{_fmt(s.tpot_p50_ms):>10}"
                     f"{_fmt(s.tpot_p95_ms):>10}{s.goodput:>9.0%}")
        rows.append({"phase": ph.name, **asdict(s)})
    reasons = Counter(f"{r.decision}/{r.reason}" for ph in runs for r in ph.results if r.decision)
    lines += ["", "decisions (decision/reason): " + ", ".join(f"{k} {v}" for k, v in reasons.most_common())]
    if phases:
        lines.append("")
        lines.append("phase breakdown, mean ms per request (router; see docs/router.md for each phase's source):")
        for path, values in sorted(phases.items()):
            lines.append(f"  {path:<9}" + "  ".join(f"{k} {v * 1000:,.1f}" for k, v in values.items()))
    lines.append("")
    lines.append("mode: " + " → ".join(timeline.modes()))
    for key, label in (("long_outputs", "long-output step"), ("long_prompts", "long-prompt step")):
        if key in load_steps:
            lines.append(f"{label}: desired replicas {load_steps[key].line()}")
    if traces is not None:
        lines += ["", *traces.lines()]
    terminal = "\n".join(lines)

    files = [results_dir / "results.json"]
    files[0].write_text(json.dumps({"phases": rows, "decisions": dict(reasons), "phase_means_s": phases,
                                    "timeline": timeline.samples, "marks": timeline.marks,
                                    "load_steps": {k: asdict(v) for k, v in load_steps.items()},
                                    "traces": None if traces is None else {
                                        k: v for k, v in asdict(traces).items() if k != "trace"}},
                                   indent=1, default=str))
    if traces is not None and traces.trace is not None:
        files.append(results_dir / TRACE_FILE)
        files[-1].write_text(json.dumps(traces.trace, indent=1))
    files += _plots(results_dir, runs, timeline, slo, phases)
    steps = {label: load_steps[key].line() for key, label in (("long_outputs", "long-output step"),
                                                              ("long_prompts", "long-prompt step"))
             if key in load_steps}
    inp = PageInput(runs, slo, timeline.modes(), timeline.marks, steps, phases,
                    [p.name for p in files if p.suffix == ".png"], router_lines(router_log))
    if traces is not None:
        inp.trace_base = traces.query_url + "/api/traces"
        inp.slowest, inp.traces_missing = traces.slowest, traces.missing
        if traces.trace is not None:
            inp.saved_trace = TRACE_FILE
            inp.slowest_bars = span_bars(traces.trace)
    html_path = results_dir / "report.html"
    html_path.write_text(render_page(inp))
    files.append(html_path)
    return Report(terminal, files)


def _plots(results_dir: Path, runs: list[PhaseResult], timeline: Timeline, slo: tuple[int, int],
           phases: dict[str, dict[str, float]]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: list[Path] = []
    # 1. TTFT and TPOT distributions by path
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    results = [r for ph in runs for r in ph.results if r.ok]
    for path in sorted({r.decision for r in results}):
        sub = [r for r in results if r.decision == path]
        for ax, attr in zip(axes, ("ttft_s", "tpot_s"), strict=True):
            vals = sorted(getattr(r, attr) * 1000 for r in sub if getattr(r, attr) is not None)
            if vals:
                ax.plot(vals, [i / len(vals) for i in range(1, len(vals) + 1)], label=f"{path} ({len(vals)})")
    for ax, name, limit in zip(axes, ("TTFT (ms)", "TPOT (ms)"), slo, strict=True):
        ax.axvline(limit, color="red", linestyle="--", label="SLO p95")
        ax.set_xlabel(name)
        ax.set_ylabel("share of requests")
        ax.set_xscale("log")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle("Latency by routing decision")
    out.append(_save(fig, results_dir / "latency_by_path.png"))
    # 2. phase breakdown
    if phases:
        fig, ax = plt.subplots(figsize=(10, 4))
        names = list(PHASES)
        paths = sorted(phases)
        width = 0.8 / max(len(paths), 1)
        for i, path in enumerate(paths):
            ax.bar([j + i * width for j in range(len(names))], [phases[path].get(n, 0) * 1000 for n in names],
                   width, label=path)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], [n.replace("_", "\n") for n in names],
                      fontsize=8)
        ax.set_ylabel("mean ms per request")
        ax.set_title("Phase breakdown (router)")
        ax.legend()
        out.append(_save(fig, results_dir / "phase_breakdown.png"))
    # 3. timeline: mode and replicas
    samples = timeline.samples
    if samples:
        fig, ax = plt.subplots(figsize=(12, 4))
        t = [s["t"] for s in samples]
        for key, style in (("prefill_desired", "-"), ("decode_desired", "-"), ("prefill_ready", ":"),
                           ("decode_ready", ":")):
            ax.step(t, [s[key] for s in samples], style, where="post", label=key.replace("_", " "))
        agg = [1 if s["mode"] == "Aggregated" else 0 for s in samples]
        ax.fill_between(t, 0, [a * max(3, max(s["decode_desired"] for s in samples)) for a in agg], step="post",
                        alpha=0.15, color="red", label="mode Aggregated")
        top = ax.get_ylim()[1]
        for i, (when, _label) in enumerate(timeline.marks):  # numbered: the page lists each event by its number
            ax.axvline(when, color="grey", linewidth=0.6)
            ax.text(when, top * (0.97 - 0.06 * (i % 3)), f" {i + 1}", fontsize=9, va="top", ha="left",
                    color="#333")
        ax.set_xlabel("seconds")
        ax.set_ylabel("replicas")
        ax.set_title("Mode and replicas per pool")
        ax.legend(fontsize=8, loc="upper left")
        out.append(_save(fig, results_dir / "timeline.png"))
    return out


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def traced_requests(router_log: str) -> dict[str, str]:
    """Request id → trace id, from the router's request log lines that carry a ``trace_id`` (the router traces a
    request when tracing is on and it sampled it)."""
    return {rid: str(line["trace_id"]) for rid, line in router_lines(router_log).items() if line.get("trace_id")}


def slowest_traced(runs: list[PhaseResult], router_log: str) -> tuple[Result, str] | None:
    """The slowest request (by TTFT, else end-to-end time) that the router traced, and its trace id; None when no
    request was traced."""
    traced = traced_requests(router_log)
    cands = [r for ph in runs for r in ph.results if r.id in traced and (r.ttft_s or r.e2e_s) is not None]
    if not cands:
        return None
    slow = max(cands, key=lambda r: r.ttft_s if r.ttft_s is not None else (r.e2e_s or 0.0))
    return slow, traced[slow.id]


def slowest_traced_request(runs: list[PhaseResult], router_log: str, trace_url: Any) -> str | None:
    """The report's link to one trace: :func:`slowest_traced`, as a line
    ``slowest request <id>: TTFT … ms, path …, trace <url>``; ``trace_url``: trace id → the backend's page
    (``LocalJaeger.trace_url``). None when no request was traced."""
    found = slowest_traced(runs, router_log)
    if found is None:
        return None
    slow, trace_id = found
    took = (f"TTFT {slow.ttft_s * 1000:,.0f} ms" if slow.ttft_s is not None
            else f"e2e {(slow.e2e_s or 0) * 1000:,.0f} ms")
    return f"slowest request {slow.id}: {took}, path {slow.path or '?'}, trace {trace_url(trace_id)}"

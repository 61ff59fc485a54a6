"""``disagg replay LOG.jsonl --candidate SPEC.yaml … [--live SPEC.yaml] [--out DIR]``: the recorded arrivals
through the discrete-event twin once per spec, side by side with what the log recorded.

Every run replays the same arrivals (reqlog.arrivals: times, tenants, tokens, shared prefixes) with the same seed,
so the differences between columns are the specs'. All columns are judged against one SLO: the live spec's (else
the first candidate's), unless ``--ttft-ms``/``--tpot-ms`` say otherwise.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..htmlpage import cell, esc, page, paragraph, section, table
from ..twin import SLO, simulate
from .reqlog import RequestLogData, arrivals, summary
from .verify import Mapped, SpecError, cluster_spec, measure


@dataclass
class Column:
    name: str  # "recorded", "live", or the candidate's file name
    source: str
    label: str
    gpus: int | None
    result: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def load_spec(path: Path, *, gpu: str | None = None, model_preset: str | None = None) -> Mapped:
    """A candidate file (one DisaggregatedModel) → the twin's cluster; SpecError naming the file and field."""
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except OSError as e:
        raise SpecError([f"{path}: {e.strerror or e}"]) from None
    except yaml.YAMLError as e:
        raise SpecError([f"{path}: not YAML: {e}"]) from None
    if len(docs) != 1:
        raise SpecError([f"{path}: a candidate is one DisaggregatedModel document, found {len(docs)}"])
    try:
        return cluster_spec(docs[0], gpu=gpu, model_preset=model_preset)
    except SpecError as e:
        raise SpecError([f"{path}: {p}" for p in e.problems]) from None


def replay(log: RequestLogData, specs: list[tuple[str, Path, Mapped]], *, seed: int = 0,
           slo: SLO | None = None, limit: int | None = None) -> dict[str, Any]:
    """Run every spec on the log's arrivals. ``specs``: (column name, file, mapped spec), the live one first when
    given. Returns the JSON-able report."""
    arr, left = arrivals(log, limit=limit)
    if not arr:
        raise SpecError([f"{log.source}: no request can be replayed ({left})"])
    slo = slo or specs[0][2].slo
    window = arr[-1].at
    cols: list[Column] = []
    rec = summary(log, slo.ttft_ms, slo.tpot_ms)
    cols.append(Column("recorded", log.source, "what the log says happened", None, _clean(rec)))
    for name, path, m in specs:
        r = simulate(m.cluster, arr, seed=seed, slo=slo, window_s=window)
        meas = measure(r, slo).to_dict()
        meas["speedup"] = round(window / r.wall_s, 1) if r.wall_s > 0 else None
        meas["gpu_seconds"] = round(r.gpu_seconds, 1)
        cols.append(Column(name, str(path), m.label, m.gpus, _clean(meas), list(m.notes)))
    return {
        "log": {"source": log.source, "requests": len(log.requests), "replayed": len(arr), "left_out": left,
                "skipped_lines": log.skipped, "schemas": {str(k): v for k, v in log.schemas.items()},
                "window_s": round(window, 3)},
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms}, "seed": seed,
        "columns": [c.__dict__ for c in cols],
    }


def _clean(d: Any) -> Any:
    if isinstance(d, float):
        return None if math.isnan(d) else round(d, 4)
    if isinstance(d, dict):
        return {k: _clean(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_clean(v) for v in d]
    return d


def _v(x: Any, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def rows(report: dict[str, Any]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The side-by-side table: a header (column names) and (metric, values) rows."""
    cols = report["columns"]
    head = [c["name"] for c in cols]
    out: list[tuple[str, list[str]]] = []

    def row(name: str, f: Any) -> None:
        out.append((name, [f(c) for c in cols]))

    row("spec", lambda c: c["label"] if c["name"] != "recorded" else "-")
    row("GPUs", lambda c: _v(c["gpus"], "d"))
    row("requests", lambda c: str(c["result"]["requests"]))
    row("goodput (share meeting SLOs)", lambda c: _v(c["result"]["attainment"], ".1%"))
    row("goodput req/s", lambda c: _v(c["result"]["goodput_rps"], ".2f"))
    row("errors", lambda c: str(c["result"]["errors"]))
    row("TTFT p95 ms", lambda c: _v(c["result"]["ttft_p95_ms"], ".0f"))
    row("TPOT p95 ms", lambda c: _v(c["result"]["tpot_p95_ms"], ".1f"))
    paths = sorted({p for c in cols for p in c["result"].get("per_path", {})})
    for p in paths:
        for q in ("p50", "p95", "p99"):
            row(f"TTFT {q} ms [{p}]",
                lambda c, p=p, q=q: _v(c["result"]["per_path"].get(p, {}).get(f"ttft_{q}_ms"), ".0f"))
        for q in ("p50", "p95", "p99"):
            row(f"TPOT {q} ms [{p}]",
                lambda c, p=p, q=q: _v(c["result"]["per_path"].get(p, {}).get(f"tpot_{q}_ms"), ".1f"))
    row("paths", lambda c: " ".join(f"{k}:{v}" for k, v in c["result"]["paths"].items()))
    decisions = sorted({d for c in cols for d in c["result"]["decisions"]})
    for d in decisions:
        row(f"decision {d}", lambda c, d=d: str(c["result"]["decisions"].get(d, 0)))
    fallbacks = sorted({f for c in cols for f in c["result"]["fallbacks"]})
    for f in fallbacks:
        row(f"fallback {f}", lambda c, f=f: str(c["result"]["fallbacks"].get(f, 0)))
    row("GPU-seconds", lambda c: _v(c["result"].get("gpu_seconds"), ".0f"))
    row("wall s (speed × real time)",
        lambda c: "-" if c["name"] == "recorded" else f"{c['result']['wall_s']:.1f} ({c['result']['speedup']}×)")
    return head, out


def render(report: dict[str, Any]) -> str:
    head, body = rows(report)
    lg = report["log"]
    w0 = max(len(n) for n, _ in body)
    ws = [max(len(h), *(len(v[k]) for _, v in body)) for k, h in enumerate(head)]
    lines = [f"replay of {lg['source']}: {lg['replayed']} of {lg['requests']} requests over {lg['window_s']:g} s "
             f"(seed {report['seed']}); SLO TTFT ≤ {report['slo']['ttft_ms']:g} ms, TPOT ≤ "
             f"{report['slo']['tpot_ms']:g} ms for every column"]
    if lg["left_out"]:
        lines.append(f"left out: {lg['left_out']}")
    if lg["skipped_lines"]:
        lines.append(f"skipped lines: {lg['skipped_lines']}")
    lines.append(" ".ljust(w0) + "  " + "  ".join(h.rjust(w) for h, w in zip(head, ws, strict=True)))
    for name, vals in body:
        lines.append(name.ljust(w0) + "  " + "  ".join(v.rjust(w) for v, w in zip(vals, ws, strict=True)))
    for c in report["columns"]:
        for n in c.get("notes", []):
            lines.append(f"note ({c['name']}): {n}")
    return "\n".join(lines)


def to_html(report: dict[str, Any]) -> str:
    """The side-by-side table as a page (:mod:`disagg.htmlpage`): one column per spec, one row per figure, the
    notes under it."""
    head, body = rows(report)
    lg = report["log"]
    slo = report["slo"]
    caption = (f"{lg['replayed']} of {lg['requests']} requests of {lg['source']} over {lg['window_s']:g} s "
               f"(seed {report['seed']}); every column judged by the same SLO: TTFT ≤ {slo['ttft_ms']:g} ms, TPOT ≤ "
               f"{slo['tpot_ms']:g} ms.")
    parts = [table(["", *head], [[cell(name), *(cell(v, "n") for v in vals)] for name, vals in body],
                   caption=caption)]
    if lg["left_out"]:
        parts.append(paragraph(f"Left out of the replay: {lg['left_out']}."))
    if lg["skipped_lines"]:
        parts.append(paragraph(f"Log lines skipped: {lg['skipped_lines']}."))
    notes = [f"{c['name']}: {n}" for c in report["columns"] for n in c.get("notes", [])]
    if notes:
        parts.append(section("Notes", "<ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>", "notes"))
    return page("disagg replay", "".join(parts),
                subtitle="A request log replayed in the twin against each spec, side by side (docs/planning.md).")


def write(report: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    j, h = out / "replay.json", out / "replay.html"
    j.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    h.write_text(to_html(report))
    return [j, h]

"""The pages a person reads after a run — ``make demo``'s report and ``disagg replay``'s — opened in a real headless
Chromium (Debian's, installed by ``make test``): no sideways scrolling at a laptop's width, no empty image or
drawing, no link that leads nowhere, headings in words, tables rather than a terminal dump.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from disagg.demo.acts import LoadStep
from disagg.demo.report import TraceSection, write_report
from disagg.load.loadgen import Result, summarise
from disagg.local.browser import PageView, broken_links, chromium_binary, inspect_page
from disagg.local.harness import PhaseResult, Timeline
from disagg.plan.replay import to_html
from disagg.router.metrics import PHASES, RouterMetrics

WIDTHS = (1400, 1000)


@pytest.fixture(scope="module")
def chromium() -> str:
    found = chromium_binary()
    assert found, "no Chromium: `make test` installs Debian's (hack/ensure-chromium.sh)"
    return found


def _trace(n_spans: int) -> dict[str, Any]:
    procs = {"p1": {"serviceName": "disagg-router"}, "p2": {"serviceName": "vllm-prefill"},
             "p3": {"serviceName": "vllm-decode"}}
    spans = [{"spanID": "s0", "startTime": 1_000_000, "duration": 2_400_000, "operationName": "disagg.request",
              "processID": "p1", "tags": [{"key": "gen_ai.latency.time_to_first_token", "value": 1.9},
                                          {"key": "disagg.decision", "value": "remote"}]}]
    for i in range(1, n_spans):
        spans.append({"spanID": f"s{i}", "startTime": 1_000_000 + 150_000 * i, "duration": 2_400_000 - 160_000 * i,
                      "operationName": "llm_request" if i % 2 else "disagg.prefill_leg", "processID": f"p{1 + i % 3}",
                      "references": [{"refType": "CHILD_OF", "spanID": f"s{i - 1}"}]})
    return {"traceID": "abc", "spans": spans, "processes": procs}


def _demo_report(out: Path) -> Path:
    """A report like the demo's: three acts, a few hundred requests with long ids and reasons, every phase, mode
    flips with close-together events, a traced slowest request."""
    runs = []
    for act, n in (("act 1: mixed traffic, remote prefill for long prompts", 120),
                   ("act 2: long prompts then long outputs (the pools scale)", 160),
                   ("act 3: KV transfers stall (the model flips to aggregated and back)", 90)):
        results = [Result(f"chatcmpl-{act[4]}-{i:05d}-7f3c9a1e2b4d4e8f9a0b1c2d3e4f5a6b", "rag" if i % 3 else "chat",
                          "tenant-with-a-long-name" if i % 5 else "chat", 9000 if i % 3 else 120, status=200,
                          ttft_s=0.02 * (i % 40) + 0.1, tpot_s=0.01 + 0.001 * (i % 30), e2e_s=3.0,
                          output_tokens=128, decision="remote" if i % 3 else "local",
                          reason="slo_predicted_fewer_misses_than_the_ladder" if i % 7 else "prefix_cache_hit",
                          path="remote" if i % 3 else "local", sent_at=float(i))
                   for i in range(n)]
        runs.append(PhaseResult(act, results, summarise(results, 3000, 60)))
    timeline = Timeline(
        samples=[{"t": float(i), "mode": "Aggregated" if 30 <= i < 50 else "Disaggregated", "prefill_ready": 1,
                  "prefill_desired": 1 + (i > 20), "decode_ready": 1 + (i > 25), "decode_desired": 2,
                  "ttft_p95_ms": None, "goodput": None} for i in range(80)],
        marks=[(10.0, "act 2: long prompts at 2 req/s"), (11.0, "long outputs"), (30.0, "KV transfers stall: "
               "sideChannel delay 4 s on every prefill worker"), (30.5, "mode → Aggregated"), (50.0, "stall ends")])
    m = RouterMetrics()
    for k, phase in enumerate(PHASES):
        m.phase[phase].labels("remote", "rag").observe(0.01 * (k + 1))
        m.phase[phase].labels("local", "chat").observe(0.02 * (k + 1))
    slowest = runs[1].results[39]
    router_log = "\n".join(json.dumps({"event": "request", "request_id": r.id, "trace_id": f"{i:032x}",
                                       "timings_ms": {"prefill_compute": 812.5, "kv_transfer": 31.2,
                                                      "decode_queue": 4.0, "ttft": 900.1}})
                           for i, r in enumerate(r for ph in runs for r in ph.results))
    traces = TraceSection("http://127.0.0.1:16686", slowest=f"slowest request {slowest.id}: TTFT 880 ms, path remote",
                          trace_url="http://127.0.0.1:16686/api/traces/abc", trace=_trace(7))
    step = LoadStep({"prefill": 1, "decode": 1}, {"prefill": 2, "decode": 2}, {"prefill": 12.0, "decode": 16.0}, {})
    write_report(out, runs, timeline, (3000, 60), {"long_prompts": step, "long_outputs": step},
                 router_metrics=generate_latest(m.registry).decode(), traces=traces, router_log=router_log)
    return out / "report.html"


def _replay_page(out: Path) -> Path:
    def column(name: str, gpus: int | None) -> dict[str, Any]:
        per_path = {p: {f"{m}_{q}_ms": 100.0 for m in ("ttft", "tpot") for q in ("p50", "p95", "p99")}
                    for p in ("remote", "local", "fallback")}
        return {"name": name, "label": f"specs/{name}-with-a-long-file-name.yaml", "gpus": gpus,
                "result": {"requests": 5000, "attainment": 0.97, "goodput_rps": 11.2, "errors": 3,
                           "ttft_p95_ms": 812.0, "tpot_p95_ms": 41.5, "per_path": per_path,
                           "paths": {"remote": 3000, "local": 1900, "fallback": 100},
                           "decisions": {"remote:slo_predicted_fewer_misses": 3000,
                                         "local:prefix_cache_hit": 1900},
                           "fallbacks": {"kv_load_failed": 60, "prefill_timeout": 40},
                           "gpu_seconds": 7200.0, "wall_s": 12.5, "speedup": 48},
                "notes": ["the prefill pool is 4 replicas here, 6 in the live spec"]}
    report = {"columns": [column("recorded", None), column("live", 8), column("candidate-aggregated", 8),
                          column("candidate-3p5d", 8)],
              "log": {"source": "logs/router-2026-12-01.jsonl", "replayed": 5000, "requests": 5200,
                      "window_s": 3600.0, "left_out": "200 requests without a prompt length", "skipped_lines": 4},
              "seed": 0, "slo": {"ttft_ms": 3000.0, "tpot_ms": 60.0}}
    path = out / "replay.html"
    path.write_text(to_html(report))
    return path


def problems(view: PageView, directory: Path) -> list[str]:
    """What a reader would trip over, as sentences (empty: none)."""
    out = []
    if view.scroll_width > view.width:
        out.append(f"scrolls sideways at {view.width} px (page {view.scroll_width} px): {view.wide}")
    out += [f"image {i['src']} is empty or broken" for i in view.images if not i["width"] or not i["shown"]]
    out += [f"drawing {d['label']!r} has nothing drawn" for d in view.drawings if not d["marks"] or not d["shown"]]
    out += [f"link {href} leads nowhere" for href in broken_links(view, directory)]
    out += [f"heading {h!r} is a file or code name, not words" for h in view.headings
            if re.search(r"_|\.(png|json|py)$", h)]
    if view.pre:
        out.append(f"{view.pre} preformatted block(s): a terminal dump, not tables")
    return out


@pytest.mark.parametrize("width", WIDTHS)
def test_the_demo_report_reads_in_a_browser(chromium: str, tmp_path: Path, width: int) -> None:
    page = _demo_report(tmp_path)
    view = inspect_page(page, width=width, screenshot=tmp_path / "shot.png", binary=chromium)
    assert problems(view, tmp_path) == []
    assert view.tables >= 6  # acts, decisions, phases, events, load steps, requests per act
    assert len(view.images) == 3 and len(view.drawings) == 1  # the three plots; the slowest trace's waterfall
    assert "Slowest traced request" in view.headings and "Requests by act" in view.headings
    # every request is listed, each linked to its trace in the backend
    html = page.read_text()
    assert html.count("/api/traces/") >= 370 and "chatcmpl-3-00089" in html
    assert (tmp_path / "shot.png").stat().st_size > 10_000


@pytest.mark.parametrize("width", WIDTHS)
def test_the_replay_page_reads_in_a_browser(chromium: str, tmp_path: Path, width: int) -> None:
    view = inspect_page(_replay_page(tmp_path), width=width, binary=chromium)
    assert problems(view, tmp_path) == []
    assert view.tables == 1 and view.headings[0] == "disagg replay"


def test_the_checks_catch_what_a_reader_would(chromium: str, tmp_path: Path) -> None:
    """The checks above could fail: a terminal dump wider than the page, a broken image, an empty drawing, a
    link to a missing file and a fragment naming nothing are each reported."""
    (tmp_path / "bad.html").write_text(
        "<!doctype html><html><body><h2>latency_by_path</h2><pre>" + "x" * 400 + "</pre>"
        '<img src="missing.png"><svg aria-label="empty"></svg><a href="nowhere.json">a</a><a href="#none">b</a>'
        "</body></html>")
    found = problems(inspect_page(tmp_path / "bad.html", width=1000, binary=chromium), tmp_path)
    text = "\n".join(found)
    for expected in ("scrolls sideways", "image missing.png", "drawing 'empty'", "link nowhere.json",
                     "link #none", "heading 'latency_by_path'", "preformatted"):
        assert expected in text, (expected, found)

"""The demo report: phase means from real router metrics text, and the files it writes."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest

from disagg.demo.acts import LoadStep
from disagg.demo.report import phase_means, write_report
from disagg.load.loadgen import Result, summarise
from disagg.local.harness import PhaseResult, Timeline
from disagg.router.metrics import RouterMetrics


def test_phase_means_from_router_metrics() -> None:
    m = RouterMetrics()
    m.phase["kv_cache_transfer"].labels("remote", "default").observe(0.2)
    m.phase["kv_cache_transfer"].labels("remote", "default").observe(0.4)
    m.phase["first_token_emit"].labels("local", "chat").observe(0.05)
    means = phase_means(generate_latest(m.registry).decode())
    assert abs(means["remote"]["kv_cache_transfer"] - 0.3) < 1e-9
    assert abs(means["local"]["first_token_emit"] - 0.05) < 1e-9
    assert "prefill_compute" not in means["remote"]  # never observed: no made-up zero


def test_write_report(tmp_path: Path) -> None:
    results = [Result("a", "rag", "rag", 8000, status=200, ttft_s=0.9, tpot_s=0.03, decision="remote",
                      reason="policy", path="remote"),
               Result("b", "chat", "chat", 100, status=200, ttft_s=0.05, tpot_s=0.02, decision="local",
                      reason="short_prompt", path="local")]
    timeline = Timeline(samples=[{"t": float(i), "mode": "Aggregated" if 3 <= i < 6 else "Disaggregated",
                                  "prefill_ready": 1, "prefill_desired": 1 + (i > 4), "decode_ready": 1,
                                  "decode_desired": 1, "ttft_p95_ms": None, "goodput": None} for i in range(10)],
                        marks=[(3.0, "flipped"), (6.0, "back")])
    phases = [PhaseResult("mixed", results, summarise(results, 3000, 60))]
    step = LoadStep({"prefill": 1, "decode": 1}, {"prefill": 2, "decode": 1}, {"prefill": 4.0, "decode": None}, {})
    m = RouterMetrics()
    m.phase["kv_cache_transfer"].labels("remote", "rag").observe(0.25)
    report = write_report(tmp_path, phases, timeline, (3000, 60), {"long_prompts": step},
                          router_metrics=generate_latest(m.registry).decode())
    assert "mixed" in report.terminal and "remote/policy 1" in report.terminal
    assert "Disaggregated → Aggregated → Disaggregated" in report.terminal
    assert "prefill 1 → 2 (first growth 4 s)" in report.terminal
    names = {p.name for p in report.files}
    assert {"results.json", "latency_by_path.png", "timeline.png", "phase_breakdown.png", "report.html"} <= names
    assert "kv_cache_transfer 250.0" in report.terminal  # the router's phase means, in ms
    assert all(p.stat().st_size > 0 for p in report.files)

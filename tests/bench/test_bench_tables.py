"""The docs' tables of the router benchmark and the soak (render_tables), from small results documents."""

from __future__ import annotations

import argparse
from typing import Any

from disagg.bench import cli, router_bench, soak


def _doc(name: str, results: dict[str, Any]) -> dict[str, Any]:
    return {"schema": 1, "benchmark": name, "command": f"disagg bench {name}",
            "machine": {"cpus": 2, "date": "2026-11-30", "nginx_version": "nginx/1.22.1"}, "results": results}


def test_router_targets_table_says_by_how_much_each_target_is_missed() -> None:
    targets = {"router": {"added_ttft_p50_le_2ms": {"value": 5.0, "limit": 2.0, "met": False},
                          "cpu_per_chunk_le_1.5x_nginx": {"value": 24.3, "nginx": 13.6, "ratio": 1.79, "limit": 1.5,
                                                          "met": False}},
               "router-remote": {"cpu_per_chunk_le_1.5x_nginx": {"value": 20.0, "nginx": 13.6, "ratio": 1.47,
                                                                 "limit": 1.5, "met": True}}}
    md = router_bench._md_targets(targets)
    assert md.splitlines()[0] == "| target | `router` | `router-remote` |"
    assert "| added TTFT p50 ≤ 2 ms | 5.00 **missed** by 3.00 | n/a |" in md
    assert ("| CPU µs per chunk ≤ 1.5 × nginx (nginx 13.60 → ≤ 20.40) | 24.30 (1.79×) **missed** by 3.90 | "
            "20.00 (1.47×) met |") in md


def test_router_tables_from_a_results_document() -> None:
    row = {"proxy": "router", "workers": 1, "path": "local", "pairs": 4, "errors": 0, "added_ttft_p50_ms": 1.5,
           "chunks_per_s": 10.0, "proxy_us_per_chunk": 20.0}
    doc = _doc("router", {"settings": {"streams": 2, "rounds": 2, "tokens": 3, "time_scale": 1.0,
                                       "step_wall_ms": 30.0, "router_log_level": "INFO"},
                          "rows": {"direct": {"chunks_per_s": 10.0}, "router": row}, "targets": {}, "note": "N."})
    t = router_bench.render_tables(doc)
    assert "nginx 1.22.1;" in t["relay"] and "| router | 1 | local | 4 | 0 | 1.50 |" in t["relay"]
    assert t["relay"].endswith("\n\nN.") and t["other-runs"] == "No other run of the same command is kept."


FIGURES = {
    "duration_s": 100.0, "requests": 10, "ok": 8, "streamed_requests": 6, "non_streamed_requests": 4,
    "failed_before_first_token": 0, "short_answers": 0, "mid_stream_losses": 2, "mid_stream_losses_unexplained": 0,
    "mid_stream_loss_errors": {"the worker failed": 2},
    "connect_retries": 3, "requests_retried": 1, "paths": {"remote": 4, "local": 6},
    "fallback_causes": {"kv_transfer_timeout": 1}, "ttft_p50_ms": 284.8, "ttft_p95_ms": 8580.1,
    "faults": {"kill-decode": {"start_s": 34.1, "duration_s": 3.0, "requests_overlapping": 8, "failed": 2,
                               "fallbacks": 0, "retried": 0, "worker": "http://w1"}},
    "mode_history": ["62s Aggregated: x [kv-stall]"], "mode_flips_unexplained": 0,
    "scale": {"prefill": {"count": 0, "direction_changes": 0, "last_scale_changes": 0, "events": [], "min": 1,
                          "max": 3}},
    "scale_events_during_prometheus_outage": 0, "duplicate_children": {"start": {}, "end": {}},
    "children_recreated_by_operator_restart": [],
    "replicas_after_operator_restart": {"decode": {"deployment": 2, "desired": 2}},
}


def test_soak_tables_from_a_results_document() -> None:
    err = "{'message': 'the worker failed mid-stream; the answer is incomplete', 'type': 'upstream_error'}"
    doc = _doc("soak", {"figures": FIGURES, "mid_stream_losses": [
        {"id": "a", "error": err, "decode_worker": "http://w1"}, {"id": "b", "error": err, "decode_worker": "http://w2"}]})
    t = soak.render_tables(doc)
    assert "| **mid-stream losses** | **2**; unexplained 0; decode leg on the killed decode pod (router log " \
           "`decode_worker`): 1 of 2; client error: `the worker failed mid-stream; the answer is incomplete` |" \
           in t["figures"]
    assert "| TTFT p50 / p95 | 285 ms / 8580 ms |" in t["figures"]
    assert "| children (Deployment, Service, ConfigMap, PDB, ServiceAccount per role) | one each at the start" \
           in t["figures"]
    assert t["faults"].splitlines()[2] == "| kill-decode | 34.1 s | 3 s | 8 | 2 | 0 | 0 |"
    assert "requests 10 (6 streamed, 4 not) in 100.0 s; ok 8" in soak.table(doc)


def test_bench_soak_cli_writes_to_docs_results() -> None:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["bench", "soak"])
    assert args.func is cli._cmd_soak and str(args.out) == "docs/results/soak.json"
    assert soak.command_line(args.rate, args.seed) == "disagg bench soak --rate 1.5 --seed 7"
    assert str(parser.parse_args(["bench", "router"]).out) == "docs/results/router.json"

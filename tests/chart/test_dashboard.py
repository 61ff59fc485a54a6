"""The Grafana dashboard (files/dashboard.json): valid JSON, every query parses (promtool) and names only metrics
and labels that exist (router code, vLLM 0.11.2), and it shows what the seed asks for on one dashboard."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.chart import promql
from tests.chart.metric_catalog import TARGET_LABELS, catalog
from tests.chart.render import CHART

DASHBOARD = CHART / "files" / "dashboard.json"
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "$namespace": ".*", "$model": ".*"}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return board


def _panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in d["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def _queries(d: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in _panels(d) for t in p.get("targets", [])]


def _concrete(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
    return expr


def test_structure(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in _panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "namespace", "model"} <= names
    for p in _panels(dashboard):
        if p["type"] == "row":
            continue
        assert p["targets"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}"
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24


def test_every_query_names_known_metrics(dashboard: dict[str, Any]) -> None:
    cat = catalog()
    exprs = _queries(dashboard) + [(v["name"], v["definition"]) for v in dashboard["templating"]["list"]
                                   if v["type"] == "query"]
    for title, expr in exprs:
        expr = re.sub(r"label_values\((.*),\s*\w+\)$", r"\1", expr)
        problems = promql.check(_concrete(expr), cat, TARGET_LABELS)
        assert not problems, f"{title}: {problems}"


def test_every_query_parses(dashboard: dict[str, Any], tmp_path: Path) -> None:
    """promtool parses each query (as a recording rule), with Grafana's variables substituted."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: run hack/ensure-prometheus.sh (make test does)")
    rules = [{"record": f"dashboard:q{i}", "expr": _concrete(e)} for i, (_, e) in enumerate(_queries(dashboard))]
    (tmp_path / "dash.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    res = subprocess.run([promtool, "check", "rules", str(tmp_path / "dash.yaml")], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_one_dashboard_has_what_the_seed_asks_for(dashboard: dict[str, Any]) -> None:
    """'put TTFT, TPOT, queue wait times, transfer times, and error rates on the same dashboard' (+ E2E
    percentiles, the phase breakdown, fallbacks and replicas per pool)."""
    text = "\n".join(e for _, e in _queries(dashboard))
    titles = " | ".join(p["title"] for p in _panels(dashboard))
    from disagg.router.metrics import PHASES

    for phase in PHASES:  # the seed's eight phases
        assert f"disagg_{phase}_seconds" in text, phase
    for q in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({q}, sum by (le) (rate(disagg_first_token_emit_seconds_bucket" in text
        assert f"histogram_quantile({q}, sum by (le) (rate(disagg_per_token_decode_seconds_bucket" in text
        assert f"histogram_quantile({q}, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket" in text
    for needle in ("disagg_slo_met_requests_total", "disagg_fallbacks_total", 'outcome=~"upstream_error|rejected"',
                   "vllm:request_queue_time_seconds_bucket", "vllm:nixl_xfer_time_seconds_bucket",
                   "vllm:prefix_cache_hits_total", "disagg_routing_decisions_total", "disagg_workers"):
        assert needle in text, needle
    for title in ("TTFT percentiles", "TPOT percentiles", "E2E latency", "Queue wait", "KV transfer time",
                  "Error rate", "Fallback", "Replicas per pool", "phase"):
        assert title in titles, title


def test_json_is_what_the_generator_writes() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(CHART / "dashboard" / "generate.py")], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert json.loads(out) == json.loads(DASHBOARD.read_text()), (
        "files/dashboard.json drifted from dashboard/generate.py: regenerate it")

"""The chart's alert rules: promtool checks their syntax and runs their unit tests (alerts_test.yaml); every
metric and label they use exists (router code, vLLM 0.11.2); the seed's alerts are all there."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.chart import promql
from tests.chart.metric_catalog import TARGET_LABELS, catalog
from tests.chart.render import documents, one, render

from disagg.router.core import KV_CAUSES, REMOTE_PATH_CAUSES

HERE = Path(__file__).parent

# The seed's "Alerts are configured for: transfer timeouts, queue backlogs, TPOT jitter, and cache hit rate drops",
# plus the issue's: KV transfer failures, TPOT p95 over SLO, fallback active, goodput under target.
SEED_ALERTS = {
    "transfer timeouts": "DisaggKVTransferTimeouts",
    "KV transfer failures": "DisaggNixlTransferFailures",
    "remote prefill failures": "DisaggRemotePrefillFailures",
    "queue backlogs": "DisaggPrefillQueueBacklog",
    "prefill queue delay": "DisaggPrefillQueueDelayHigh",
    "TPOT p95 over SLO": "DisaggTPOTP95OverSLO",
    "TPOT jitter": "DisaggTPOTJitter",
    "cache hit rate drops": "DisaggPrefixCacheHitRateDrop",
    "fallback active": "DisaggAggregatedFallbackActive",
    "fallback rate": "DisaggFallbackRateHigh",
    "goodput under target": "DisaggGoodputBelowTarget",
}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: run hack/ensure-prometheus.sh (make test does)")
    return path


@pytest.fixture(scope="module")
def rules() -> dict[str, Any]:
    """The PrometheusRule's groups as a Prometheus rule file, rendered with the default thresholds."""
    docs = documents(render({"monitoring": {"prometheusRule": {"enabled": True}}}))
    return {"groups": one(docs, "PrometheusRule")["spec"]["groups"]}


@pytest.fixture(scope="module")
def rule_dir(rules: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("rules")
    (d / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    shutil.copy(HERE / "alerts_test.yaml", d / "alerts_test.yaml")
    return d


def _alerts(rules: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in rules["groups"] for r in g["rules"] if "alert" in r]


def test_promtool_check_rules(rule_dir: Path) -> None:
    res = subprocess.run([promtool(), "check", "rules", str(rule_dir / "rules.yaml")], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_unit_tests(rule_dir: Path) -> None:
    res = subprocess.run([promtool(), "test", "rules", str(rule_dir / "alerts_test.yaml")], capture_output=True,
                         text=True, timeout=60, cwd=rule_dir)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_alert_has_a_firing_unit_test(rules: dict[str, Any]) -> None:
    tests = yaml.safe_load((HERE / "alerts_test.yaml").read_text())["tests"]
    firing = {c["alertname"] for t in tests for c in t.get("alert_rule_test", []) if c.get("exp_alerts")}
    names = {a["alert"] for a in _alerts(rules)}
    assert names - firing == set(), "alerts without a firing test case"
    assert firing - names == set(), "test cases for alerts that do not exist"


def test_seed_alerts_present(rules: dict[str, Any]) -> None:
    names = {a["alert"] for a in _alerts(rules)}
    missing = {k: v for k, v in SEED_ALERTS.items() if v not in names}
    assert not missing


def test_alert_metrics_exist() -> None:
    # rendered with every threshold/label option set to make sure no branch hides a name
    docs = documents(render({"monitoring": {"prometheusRule": {"enabled": True}}}))
    cat = catalog()
    for rule in one(docs, "PrometheusRule")["spec"]["groups"]:
        for r in rule["rules"]:
            problems = promql.check(r["expr"], cat, TARGET_LABELS)
            assert not problems, f"{r['alert']}: {problems}"


def test_alerts_are_documented(rules: dict[str, Any]) -> None:
    from tests.paths import REPO

    doc = (REPO / "docs" / "observability.md").read_text()
    for a in _alerts(rules):
        assert a["alert"] in doc, f"{a['alert']} is not described in docs/observability.md"
        assert a["labels"]["severity"] in {"info", "warning", "critical"}
        assert {"summary", "description", "runbook_url"} <= set(a["annotations"])
        anchor = a["annotations"]["runbook_url"].split("#", 1)[1]
        assert anchor in _anchors(REPO / "docs" / "troubleshooting.md"), anchor


def _anchors(path: Path) -> set[str]:
    import re

    out = set()
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^a-z0-9 -]", "", title).replace(" ", "-"))
    return out


def test_promql_name_checker_catches_mistakes() -> None:
    cat = catalog()
    assert promql.check('rate(disagg_requests_total{outcome="ok"}[5m])', cat, TARGET_LABELS) == []
    assert promql.check("rate(disagg_request_total[5m])", cat, TARGET_LABELS)  # typo
    assert promql.check('rate(disagg_requests_total{cuase="x"}[5m])', cat, TARGET_LABELS)
    assert promql.check("sum by (tennant) (rate(disagg_requests_total[5m]))", cat, TARGET_LABELS)
    assert promql.check("vllm:gpu_cache_usage_perc", cat, TARGET_LABELS)  # deprecated in vLLM 0.11


def _cause_regex(rules: dict[str, Any], alert: str) -> re.Pattern[str]:
    """The ``cause=~"..."`` matcher of an alert's expression (PromQL regexes match the whole value)."""
    expr = next(a["expr"] for a in _alerts(rules) if a["alert"] == alert)
    m = re.search(r'disagg_fallbacks_total\{cause=~"([^"]+)"\}', expr)
    assert m, f"{alert}: no cause=~ matcher in {expr!r}"
    return re.compile(m.group(1))


def test_remote_failure_alerts_cover_every_remote_path_cause(rules: dict[str, Any]) -> None:
    """DisaggRemotePrefillFailures counts every cause of a failed remote path in the router's code (core.py) and
    no decode-side one; DisaggKVTransferTimeouts every slow or timed-out hand-off."""
    failures = _cause_regex(rules, "DisaggRemotePrefillFailures")
    assert [c for c in REMOTE_PATH_CAUSES if not failures.fullmatch(c)] == []
    assert [c for c in ("decode_error", "decode_connect_error", "decode_generation_error")
            if failures.fullmatch(c)] == []
    timeouts = _cause_regex(rules, "DisaggKVTransferTimeouts")
    assert [c for c in KV_CAUSES if c != "kv_load_failed" and not timeouts.fullmatch(c)] == []
    assert not timeouts.fullmatch("kv_load_failed")  # a failed pull is DisaggNixlTransferFailures' business


def test_the_cause_list_is_what_the_legs_raise() -> None:
    """Every ``prefill_*`` / ``kv_*`` fallback cause the router's and the twin's legs and core name — a leg's
    ``UpstreamError(cause)``, a cause assigned to a failure, what ``remote_decode_cause`` maps to — is in the
    list the alerts are checked against."""
    import ast

    pkg = Path(__file__).resolve().parents[2] / "operator" / "disagg"
    found: set[str] = set()

    def named(node: ast.AST | None) -> None:
        for n in ast.walk(node) if node is not None else ():
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"(prefill|kv)_[a-z_]+",
                                                                                           n.value):
                found.add(n.value)

    for path in (pkg / "router" / "core.py", pkg / "router" / "paths.py", pkg / "router" / "legs.py",
                 pkg / "twin" / "legs.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "UpstreamError" and node.args:
                named(node.args[0])
            elif isinstance(node, ast.Assign) and any(getattr(t, "attr", None) == "cause" or
                                                      getattr(t, "id", None) == "cause" for t in node.targets):
                named(node.value)
            elif isinstance(node, ast.FunctionDef) and node.name == "remote_decode_cause":
                for r in ast.walk(node):
                    if isinstance(r, ast.Return):
                        named(r.value)
    assert {"prefill_queue_timeout", "kv_transfer_slow", "kv_load_failed"} <= found  # the walk sees all three kinds
    assert found - set(REMOTE_PATH_CAUSES) == set()

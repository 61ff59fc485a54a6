"""The operator convergence benchmark: a smoke run on the real control plane (two models converge, a quiet window
in which the operator writes nothing), its apiserver-metrics parsing, and the tables rendered from its JSON."""

from __future__ import annotations

import json

import pytest

from disagg.bench.operator_bench import render_tables, results_doc, run
from disagg.bench.operator_meters import parse_request_totals, writes_by_class


def _line(verb: str, resource: str, value: int, subresource: str = "", code: str = "200") -> str:
    return (f'apiserver_request_total{{code="{code}",component="apiserver",dry_run="",group="apps",'
            f'resource="{resource}",scope="resource",subresource="{subresource}",verb="{verb}",version="v1"}} {value}')


METRICS_BEFORE = "\n".join([
    "# HELP apiserver_request_total [STABLE] Counter of apiserver requests",
    "# TYPE apiserver_request_total counter",
    _line("APPLY", "deployments", 10, code="201"),
    _line("APPLY", "deployments", 2),
    _line("PUT", "deployments", 5, subresource="status"),
    _line("LIST", "pods", 7),
    _line("POST", "endpoints", 4, code="409"),  # refused: AlreadyExists
    'apiserver_request_count_other{verb="APPLY"} 99',
]) + "\n"
METRICS_AFTER = (METRICS_BEFORE.replace("} 10\n", "} 13\n").replace("} 5\n", "} 9\n").replace("} 7\n", "} 8\n")
                 .replace("} 4\n", "} 6\n"))


def test_request_totals_by_verb_and_resource() -> None:
    before, after = parse_request_totals(METRICS_BEFORE), parse_request_totals(METRICS_AFTER)
    assert before[("APPLY", "deployments", "", "201")] == 10
    # successful writes only: no LIST, no create refused with 409
    assert writes_by_class(before, after) == {"PUT deployments/status": 4, "APPLY deployments": 3}


def _run(models: int, reported: float) -> dict:
    phase = {"apiserver_writes": {"APPLY deployments": 3 * models, "POST events": 2 * models},
             "apiserver_writes_total": 5 * models, "apiserver_reads": models, "writes_per_s": 12.5,
             "cpu_s": {"operator": 1.0, "operator_handlers": 0.5, "kube-apiserver": 2.0, "etcd": 0.3,
                       "kube-controller-manager": 0.4, "benchmark": 0.1},
             "queue": {"queued_max": 3, "queued_mean": 1.0, "in_flight_max": 4, "in_flight_mean": 2.0}}
    return {"models": models, "children_per_model": 12, "loadavg": {"start": [3.0, 2, 1], "end": [2.5, 2, 1]},
            "created_s": 1.0, "status_reported_s": reported,
            "status_reported_p50_s": reported / 2, "deployments_settled_s": None, "status_current_s": 30.0,
            "idle_s": 33.0, "target": {"models": 500, "seconds": 60.0, "met": models >= 500 and reported <= 60},
            "applies": 12 * models, "status_patches": 2 * models, "reconciles": 3 * models,
            "operator_writes": 15 * models, "to_status": phase, "to_idle": phase,
            "reconcile_latency": {"create": {"calls": models, "total_s": 1.0, "p50_ms": 10.0, "p95_ms": 20.0,
                                             "max_ms": 30.0}},
            "reconcile_failures": {}, "counters": {"reconciles": 3 * models},
            "quiet": {"window_s": 60.0, "apiserver_writes": {"PUT leases": 1}, "apiserver_writes_total": 1,
                      "operator_writes": 0, "reconciles": 0, "cpu_s": {"operator": 0.0},
                      "events_by_source": {}}}


def test_render_tables_from_results_json() -> None:
    doc = results_doc([_run(100, 20.0), _run(500, 75.0)], "disagg bench operator --models 100 500",
                      {"cores": 2})
    doc = json.loads(json.dumps(doc))  # as read back from docs/results/operator.json
    assert {"schema", "benchmark", "command", "machine", "results"} <= set(doc)
    assert doc["schema"] == 1 and doc["benchmark"] == "operator"
    tables = render_tables(doc)
    assert set(tables) == {"summary", "time", "latency", "quiet"}
    summary = tables["summary"].splitlines()
    assert len(summary) == 4  # header, rule, one row per run
    assert summary[2].endswith("| n/a | 3.0 → 2.5 |")  # 100 models: the 500-model target does not apply
    assert summary[3].endswith("| missed | 3.0 → 2.5 |")  # 500 models, 75 s > 60 s
    assert "| – |" in summary[3]  # settled within the deadline: null, shown as a dash
    assert "APPLY deployments 1500" in tables["time"]
    assert "| 3.7 ÷ 2 = 1.8 s |" in tables["time"]  # operator + apiserver + etcd + controller-manager
    assert "| 500 | 60 s | 1 | PUT leases 1 | none | 0 | 0 |" in tables["quiet"]


@pytest.mark.apiserver
def test_two_models_converge_and_stay_quiet() -> None:
    r = run(2, steady_window_s=3)
    assert r["status_reported_s"] <= r["idle_s"]
    assert r["children_per_model"] >= 12  # pools, Services, PDBs, router, RBAC
    assert r["applies"] == 2 * r["children_per_model"]  # each child applied once
    assert r["to_idle"]["apiserver_writes"]["APPLY deployments"] == 6  # counted by the apiserver too
    assert r["quiet"]["operator_writes"] == 0
    assert r["quiet"]["reconciles"] == 0

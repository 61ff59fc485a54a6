"""The metric catalog agrees with the code that exports the metrics: the router (imported) and the simulated
vLLM worker (which mirrors vLLM 0.11.2), so that dashboards and alerts work on GPU-less staging clusters too."""

from __future__ import annotations

import json
import re

import yaml
from tests.chart.metric_catalog import catalog, router_metrics, vllm_metrics
from tests.chart.render import CHART, documents, one, render


def _used_by_chart() -> set[str]:
    """Sample names the alerts and the dashboard query."""
    docs = documents(render({"monitoring": {"prometheusRule": {"enabled": True}}}))
    text = yaml.safe_dump(one(docs, "PrometheusRule")["spec"]) + (CHART / "files" / "dashboard.json").read_text()
    return set(re.findall(r"(?<![\w:])((?:disagg|vllm)[_:][a-zA-Z0-9_:]*)", text)) & set(catalog())


def test_router_phases_are_the_seeds() -> None:
    names = {m.name for m in router_metrics()}
    for phase in ("request_queue_wait", "prefill_compute", "kv_cache_pack", "kv_cache_transfer", "kv_cache_unpack",
                  "decode_queue_wait", "first_token_emit", "per_token_decode"):
        assert f"disagg_{phase}_seconds" in names


def test_sim_exports_every_vllm_metric_the_chart_uses() -> None:
    from disagg.sim import metrics as sim
    m = sim.Metrics("m", 4096, nixl=True)
    families = {f.name: f.type for f in m.registry.collect()}
    cat = {v.name: v for v in vllm_metrics()}
    for sample in sorted(_used_by_chart()):
        metric = catalog()[sample]
        if metric.source != "vllm":
            continue
        assert metric.name in families, f"the sim does not export {metric.name} (used by the chart)"
        assert families[metric.name] == cat[metric.name].type, metric.name


def test_chart_uses_a_meaningful_share_of_the_catalog() -> None:
    used = {catalog()[s].name for s in _used_by_chart()}
    assert len(used) >= 20
    assert json.loads((CHART / "files" / "dashboard.json").read_text())["uid"] == "disagg-overview"


def test_catalog_sample_names_match_the_exposition() -> None:
    """The `_total` / `_bucket` names the catalog derives are what the router's /metrics really exposes."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from disagg.router.metrics import RouterMetrics

    rm = RouterMetrics()
    for value in vars(rm).values():
        for w in (value.values() if isinstance(value, dict) else [value]):
            if hasattr(w, "_labelnames"):
                child = w.labels(*["x"] * len(w._labelnames)) if w._labelnames else w
                # a gauge is set (one in mostrecent mode refuses inc), a counter incremented, a histogram observed
                (child.observe if hasattr(child, "observe") else child.set if hasattr(child, "set") else child.inc)(1)
    exposed = {s.name for f in text_string_to_metric_families(generate_latest(rm.registry).decode())
               for s in f.samples if not s.name.endswith("_created")}
    expected = {s for m in router_metrics() for s in m.samples()}
    assert exposed == expected

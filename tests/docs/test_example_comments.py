"""The comments of docs/examples/*.yaml say what the operator, the router and the chart do with those values.

Each test derives the fact from the code (rendered pods, the router's decision, the operator's Events, the chart's
alerts) and requires the example's comments to state it: the NVLink example once claimed KV over cuda_ipc while its
pods fall back to TCP, the RDMA example's canary made a tenant override unreachable without a word, and the pinned
Aggregated example did not say that it fires an alert and a slow-transport Warning."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.paths import EXAMPLES

from disagg.builders import build_children, parse_model

IDS = [p.stem for p in EXAMPLES]


def _body(path: Path) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load(path.read_text())
    body["metadata"] = {**body["metadata"], "namespace": "serving", "uid": "00000000-0000-4000-8000-000000000001"}
    return body


def _comments(path: Path) -> str:
    """Every comment of the file, joined into one line."""
    found = [m.group(1) for line in path.read_text().splitlines() if (m := re.search(r"(?:^|\s)#\s?(.*)$", line))]
    return " ".join(" ".join(found).split())


# ------------------------------------------------------------------------------------------------- transport


def _ucx_tls(body: dict[str, Any]) -> set[str]:
    """UCX_TLS of every rendered worker container ("" where unset)."""
    out = set()
    for obj in build_children(parse_model(body)):
        if obj["kind"] not in ("Deployment", "StatefulSet", "LeaderWorkerSet"):
            continue
        labels = obj["metadata"].get("labels") or {}
        if labels.get("serving.disagg.dev/role") == "router":
            continue
        text = yaml.safe_dump(obj)
        values = re.findall(r"name: UCX_TLS\n\s+value: (\S+)", text)
        out |= set(values) or {""}
    return out


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_a_ucx_tls_claim_is_what_the_workers_get(path: Path) -> None:
    body, comments = _body(path), _comments(path)
    tls = _ucx_tls(body)
    claimed = re.findall(r"UCX_TLS=([\w,]+)", comments)
    for value in claimed:
        assert tls == {value}, f"{path.name}: the comment says UCX_TLS={value}, the workers get {tls}"
    if body["spec"].get("kvTransfer", {}).get("transport") == "nvlink":
        assert claimed, f"{path.name}: an NVLink example must say what UCX_TLS its workers get"
        [value] = tls
        if "tcp" in value.split(","):
            assert "falls back to tcp" in comments, f"{path.name}: UCX_TLS={value} falls back to TCP; say so"
        assert "(UCX cuda_ipc)." not in comments


# -------------------------------------------------------------------------------------------------- canary


def _always_canary_excluded(body: dict[str, Any], tenant: str) -> bool:
    """Whether the router keeps every request of ``tenant`` local with reason canary_excluded (long prompts, long
    outputs, both endpoints, many request ids)."""
    from disagg.builders.router import router_config
    from disagg.router.features import request_hash_fraction
    from disagg.router.policy import decide
    from disagg.router.policy_types import LoadSnapshot, RequestFeatures, WorkerLoad

    cfg = router_config(parse_model(body))
    snap = LoadSnapshot(prefill=(WorkerLoad("http://p", compat="a", role="prefill"),),
                        decode=(WorkerLoad("http://d", compat="a", running=1e3, waiting=1e3, kv_usage=0.99),))
    tokens = int(body["spec"]["model"].get("maxModelLen") or 32768) // 2
    reasons = set()
    for i in range(400):
        rid = f"req-{i}"
        for endpoint in ("/v1/completions", "/v1/chat/completions"):
            f = RequestFeatures(request_id=rid, endpoint=endpoint, input_tokens=tokens, max_tokens=1024,
                                tenant=tenant, canary_fraction=request_hash_fraction(rid))
            reasons.add(decide(cfg, f, snap).reason)
    return reasons == {"canary_excluded"}


CANARIED = [p for p in EXAMPLES if (yaml.safe_load(p.read_text())["spec"].get("rollout") or {}).get("canary")]


@pytest.mark.parametrize("path", CANARIED, ids=[p.stem for p in CANARIED])
def test_a_tenant_override_the_canary_makes_unreachable_is_said_so(path: Path) -> None:
    body, comments = _body(path), _comments(path)
    tenants = (body["spec"].get("routing") or {}).get("tenants") or []
    overridden = [t["name"] for t in tenants if t.get("remotePrefill") or t.get("localPrefill")]
    unreachable = [t for t in overridden if _always_canary_excluded(body, t)]
    for tenant in unreachable:
        assert tenant in comments and "canary_excluded" in comments, (
            f"{path.name}: the canary keeps every {tenant} request local (canary_excluded), so its override never "
            "applies; the comments must say so")
    if path.stem == "llama-70b-rdma":
        assert unreachable == ["batch-summaries"]  # the case this test was written for


# ------------------------------------------------------------------------------------------ pinned Aggregated

PINNED = [p for p in EXAMPLES if yaml.safe_load(p.read_text())["spec"].get("mode") == "Aggregated"]


def _warning_events(body: dict[str, Any]) -> set[str]:
    """The Warning Events the operator posts on the model's first status, its pools all ready."""
    from disagg.controller.report import Reporter
    from disagg.controller.status import desired_status

    dm = parse_model(body)
    ready = {"spec": {"replicas": 1}, "status": {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}}
    wanted = desired_status(dm, {}, {role: ready for role in ("prefill", "decode", "aggregated", "router")}, 1)
    posted: list[tuple[str, str]] = []
    reporter = Reporter(kube=None, emit=lambda _o, type_, reason, _m: posted.append((type_, reason)),  # type: ignore[arg-type]
                        clock=None, counters={}, filters=None, parse=parse_model)  # type: ignore[arg-type]
    reporter.transitions(body, dm, {}, wanted)
    return {reason for type_, reason in posted if type_ == "Warning"}


def _aggregated_alert() -> str:
    from tests.chart.render import documents, render

    docs = documents(render({"monitoring": {"prometheusRule": {"enabled": True}}}))
    rules = [r for d in docs if d["kind"] == "PrometheusRule" for g in d["spec"]["groups"] for r in g["rules"]]
    [alert] = [r for r in rules if 'reason="mode_aggregated"' in r.get("expr", "") and "> 0.99" in r["expr"]]
    return str(alert["alert"])


@pytest.mark.parametrize("path", PINNED, ids=[p.stem for p in PINNED])
def test_a_pinned_aggregated_example_says_what_it_fires(path: Path) -> None:
    body, comments = _body(path), _comments(path)
    alert = _aggregated_alert()
    assert alert in comments, f"{path.name}: pinned Aggregated, every request is mode_aggregated and {alert} fires"
    warnings = _warning_events(body)
    if body["spec"]["kvTransfer"]["transport"] == "tcp":
        assert "SlowKVTransport" in warnings  # the operator warns about the configured path even while pinned
    for reason in warnings:
        assert reason in comments, f"{path.name}: the operator posts a Warning Event {reason}; the comments must say"


def test_the_examples_these_tests_read_exist() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"llama-8b-nvlink", "llama-70b-rdma", "aggregated-rollback"} <= names
    assert [p.stem for p in PINNED] == ["aggregated-rollback"] and "llama-70b-rdma" in [p.stem for p in CANARIED]


# ------------------------------------------------------------------------------------------------ gated models

GATED = ("meta-llama/",)  # hub organisations whose models need an accepted licence and a token


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_a_gated_hub_model_has_a_token_or_says_it_needs_one(path: Path) -> None:
    model = _body(path)["spec"]["model"]
    source = model.get("source") or {}
    if not model["name"].startswith(GATED) or source.get("pvc") or (source.get("hub") or {}).get("tokenSecretRef"):
        return
    assert "gated" in _comments(path) and "tokenSecretRef" in _comments(path), (
        f"{path.name}: {model['name']} is gated on the hub; name source.hub.tokenSecretRef (or say to)")

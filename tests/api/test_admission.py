"""Admission against the real kube-apiserver: examples accepted, bad specs refused naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client
from kubernetes.client.rest import ApiException
from tests.api.cases import INVALID
from tests.paths import EXAMPLES

from disagg.api import GROUP, PLURAL, VERSION
from disagg.api.crd import build_crd
from disagg.api.validate import errors_of
from disagg.poll import wait_for


def _create(kube: client.ApiClient, namespace: str, spec: dict, name: str = "m", dry_run: bool = True) -> dict:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DisaggregatedModel",
            "metadata": {"name": name}, "spec": spec}
    created = client.CustomObjectsApi(kube).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body, field_validation="Strict", dry_run="All" if dry_run else None)
    assert isinstance(created, dict)
    return created


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_is_accepted_and_defaulted(kube, namespace, path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    created = _create(kube, namespace, doc["spec"], name=doc["metadata"]["name"], dry_run=False)
    spec = created["spec"]
    # the apiserver filled in the schema defaults, down to nested objects
    assert spec["kvTransfer"]["sideChannelPort"] == doc["spec"].get("kvTransfer", {}).get("sideChannelPort", 5600)
    assert spec["routing"]["fallback"]["onKVTransferTimeout"] in ("LocalAggregated", "Fail")
    assert spec["engine"]["image"]
    assert "minReplicas" in spec["prefill"] and "parallelism" in spec["decode"]


def test_examples_include_required_scenarios() -> None:
    specs = {p.stem: yaml.safe_load(p.read_text())["spec"] for p in EXAMPLES}
    transports = {s.get("kvTransfer", {}).get("transport") for s in specs.values()}
    assert {"nvlink", "rdma"} <= transports
    assert any(s.get("mode") == "Aggregated" for s in specs.values())
    rdma = next(s for s in specs.values() if s.get("kvTransfer", {}).get("transport") == "rdma")
    assert rdma["routing"]["tenants"] and rdma["routing"]["buckets"]
    assert rdma["rollout"]["canary"]["trafficPercent"] == 5


@pytest.mark.parametrize("case_id,spec,field", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_spec_is_rejected_naming_the_field(kube, namespace, case_id, spec, field) -> None:
    with pytest.raises(ApiException) as exc:
        _create(kube, namespace, spec)
    assert exc.value.status in (400, 422), exc.value.body
    message = json.loads(exc.value.body or "{}")["message"]
    assert field in message, f"{case_id}: {field!r} not named in: {message}"


@pytest.mark.parametrize("case_id,spec,field", INVALID, ids=[c[0] for c in INVALID])
def test_python_mirror_rejects_the_same_specs(case_id, spec, field) -> None:
    doc = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DisaggregatedModel", "metadata": {"name": "m"}, "spec": spec}
    errors = errors_of(doc)
    assert errors, f"{case_id}: accepted by pydantic but refused by the apiserver"
    assert any(e.startswith(field) or field in e for e in errors), f"{case_id}: {field!r} not in {errors}"


def test_unknown_field_is_refused_by_kubectl(kubectl, namespace) -> None:
    manifest = (
        "apiVersion: serving.disagg.dev/v1alpha1\nkind: DisaggregatedModel\nmetadata: {name: typo}\n"
        "spec:\n  model: {name: m}\n  prefil: {replicas: 2}\n"
    )
    r = kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=manifest)
    assert r.returncode != 0
    assert "spec.prefil" in r.stderr


replica_triples = st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(0, 6))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(triple=replica_triples, tensor=st.sampled_from([1, 2, 4]), gpus=st.integers(1, 8))
def test_apiserver_and_python_agree_on_pool_rules(kube, namespace, triple, tensor, gpus) -> None:
    replicas, lo, hi = triple
    spec = {"model": {"name": "m"}, "prefill": {"replicas": replicas, "minReplicas": lo, "maxReplicas": hi,
                                                 "gpu": {"count": gpus}, "parallelism": {"tensor": tensor}}}
    doc = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DisaggregatedModel", "metadata": {"name": "m"}, "spec": spec}
    python_ok = not errors_of(doc)
    try:
        _create(kube, namespace, spec)
        server_ok = True
    except ApiException as e:
        assert e.status == 422, e.body
        server_ok = False
    assert python_ok == server_ok, f"python={python_ok} apiserver={server_ok} for {spec}"
    assert server_ok == (lo <= hi and lo <= replicas <= hi and gpus % tensor == 0)


EXPLAINED = ["spec.routing.circuitBreaker", "spec.routing.circuitBreaker.failureThreshold", "spec.modePolicy.probe",
             "spec.modePolicy.probe.ratePerMinute", "status.pools.prefill.starting",
             "status.observed.modeProbesSucceeded", "status.observed.modeProbesFailed"]


def test_kubectl_explain_prints_the_descriptions(kubectl) -> None:
    # the apiserver publishes a new CRD's OpenAPI a moment after it is established
    wait_for(lambda: kubectl("explain", "dm.spec").returncode == 0, 60, "kubectl explain dm.spec")
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path in EXPLAINED:
        node = schema
        for part in path.split("."):
            node = node["properties"][part]
        r = kubectl("explain", f"dm.{path}")
        assert r.returncode == 0, r.stderr
        assert " ".join(node["description"].split()) in " ".join(r.stdout.split()), (path, r.stdout)

"""Multi-node pools at admission (issue 19): the real apiserver (schema + the CEL of rules.py) and the Python mirror
(spec_errors) accept the layouts vLLM can run across nodes and refuse the others, naming the field, with the same
messages. ``MULTINODE_RULE_CASES`` (one spec per rule) and ``MULTINODE_BROKEN_AT`` are in the shape of
tests/api/cases.py's RULE_CASES and ALL_RULES_BROKEN_AT, which take them in."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client
from kubernetes.client.rest import ApiException

from disagg.api import GROUP, PLURAL, VERSION, rules
from disagg.api.models import RULES, DisaggregatedModelSpec, spec_errors
from disagg.api.validate import errors_of

BASE: dict[str, Any] = {"model": {"name": "deepseek-ai/DeepSeek-V3"}}
BY_NAME = {r.name: r for r in RULES}
INVALID_OBJECT = 'Invalid value: "object": '


def spec(**overrides: Any) -> dict[str, Any]:
    return {**copy.deepcopy(BASE), **overrides}


# Every multi-node rule, by name: a spec (valid for the schema) that breaks it and no other rule, and the node
# carrying the rule there.
MULTINODE_RULE_CASES: dict[str, tuple[dict[str, Any], str]] = {
    # 8 GPUs cannot split evenly over 3 nodes
    "pool-multinode-layout-divides": (spec(decode={"nodesPerReplica": 3, "parallelism": {"tensor": 8}}),
                                      "spec.decode"),
    # TP 8 × PP 2 = 16 GPUs over 2 nodes needs 8 per pod, not 4
    "pool-multinode-gpu-count": (spec(prefill={"nodesPerReplica": 2, "gpu": {"count": 4},
                                               "parallelism": {"tensor": 8, "pipeline": 2}}), "spec.prefill"),
    # 2 data-parallel ranks of TP 2 over 4 nodes: a rank would straddle two nodes
    "pool-multinode-data-divides": (spec(decode={"nodesPerReplica": 4, "parallelism": {"tensor": 2, "data": 2}}),
                                    "spec.decode"),
    "pool-data-parallel-size-local": (spec(decode={"nodesPerReplica": 2, "parallelism": {
        "data": 16, "dataParallelSizeLocal": 4}}), "spec.decode"),
    # EP over one GPU is no expert parallelism
    "parallelism-expert-needs-ranks": (spec(prefill={"parallelism": {"expert": True, "pipeline": 2}}),
                                       "spec.prefill.parallelism"),
}
# For tests/api/cases.py ALL_RULES_BROKEN: what to merge into its spec (its aggregated pool is otherwise unused; its
# prefill pool gets the expert flag), and the (rule, node) pairs then reported besides the others.
MULTINODE_BROKEN: dict[str, Any] = {
    "aggregated": {"nodesPerReplica": 3, "gpu": {"count": 5},
                   "parallelism": {"tensor": 2, "data": 4, "dataParallelSizeLocal": 3}},
    "prefill": {"parallelism": {"expert": True}},
}
MULTINODE_BROKEN_AT: list[tuple[str, str]] = [
    ("pool-multinode-layout-divides", "spec.aggregated"),
    ("pool-multinode-gpu-count", "spec.aggregated"),
    ("pool-multinode-data-divides", "spec.aggregated"),
    ("pool-data-parallel-size-local", "spec.aggregated"),
    ("parallelism-expert-needs-ranks", "spec.prefill.parallelism"),
]

# Layouts vLLM runs across nodes: accepted by both.
ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    ("wide-ep-decode", spec(decode={"nodesPerReplica": 4, "gpu": {"count": 8},
                                    "parallelism": {"data": 32, "expert": True}})),
    ("wide-ep-default-gpu-count", spec(prefill={"nodesPerReplica": 2, "parallelism": {"data": 16, "expert": True}})),
    ("dp-local-explicit", spec(decode={"nodesPerReplica": 2, "parallelism": {"tensor": 2, "data": 8,
                                                                             "dataParallelSizeLocal": 4}})),
    ("dense-tp8-pp2", spec(prefill={"nodesPerReplica": 2, "gpu": {"count": 8},
                                    "parallelism": {"tensor": 8, "pipeline": 2}})),
    ("tp16-across-two-nodes", spec(decode={"nodesPerReplica": 2, "gpu": {"count": 8}, "parallelism": {"tensor": 16}})),
    ("expert-with-tp-only", spec(decode={"parallelism": {"tensor": 8, "expert": True}})),
    ("single-node-dp-local", spec(decode={"parallelism": {"data": 4, "dataParallelSizeLocal": 4}})),
    ("statefulset-backend", spec(multiNode={"backend": "StatefulSet", "dataParallelRpcPort": 31000})),
]

# Refused by the schema (single-field constraints), naming the field.
SCHEMA_INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("nodes-zero", spec(decode={"nodesPerReplica": 0}), "spec.decode.nodesPerReplica"),
    ("nodes-too-many", spec(prefill={"nodesPerReplica": 65}), "spec.prefill.nodesPerReplica"),
    ("backend-unknown", spec(multiNode={"backend": "Grove"}), "spec.multiNode.backend"),
    ("rpc-port-privileged", spec(multiNode={"dataParallelRpcPort": 80}), "spec.multiNode.dataParallelRpcPort"),
    ("dp-local-zero", spec(decode={"parallelism": {"dataParallelSizeLocal": 0}}),
     "spec.decode.parallelism.dataParallelSizeLocal"),
    ("expert-not-bool", spec(decode={"parallelism": {"expert": "yes"}}), "spec.decode.parallelism.expert"),
]


def _doc(data: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DisaggregatedModel", "metadata": {"name": "m"}, "spec": data}


def _refusals(kube: client.ApiClient, namespace: str, data: dict[str, Any]) -> set[str]:
    """What the apiserver refuses ``data`` for, as ``field: message`` (spec_errors' wording); empty if accepted."""
    try:
        client.CustomObjectsApi(kube).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, _doc(data), field_validation="Strict", dry_run="All")
    except ApiException as exc:
        assert exc.status == 422, exc.body
        causes = json.loads(exc.body or "{}")["details"]["causes"]
        return {f"{c['field']}: {c['message'].removeprefix(INVALID_OBJECT)}" for c in causes}
    return set()


@pytest.fixture
def unchecked(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Parse a spec without the cross-field rules (to hand a rule-breaking spec to ``spec_errors``)."""
    def parse(data: dict[str, Any]) -> DisaggregatedModelSpec:
        with monkeypatch.context() as m:
            m.setattr(rules, "RULES", ())
            return DisaggregatedModelSpec.model_validate(data)
    return parse


def test_every_multinode_rule_has_a_case() -> None:
    multinode = {r.name for r in RULES if "multinode" in r.name or r.name in (
        "pool-data-parallel-size-local", "parallelism-expert-needs-ranks")}
    assert multinode == set(MULTINODE_RULE_CASES) == {name for name, _ in MULTINODE_BROKEN_AT}


@pytest.mark.parametrize("name", sorted(MULTINODE_RULE_CASES))
def test_python_refuses_each_rule_naming_the_field(name: str, unchecked: Any) -> None:
    data, node = MULTINODE_RULE_CASES[name]
    errors = spec_errors(unchecked(data))
    assert errors == [BY_NAME[name].error(node)], errors  # this rule, and no other
    assert sorted(errors_of(_doc(data))) == errors  # disagg validate says the same


@pytest.mark.parametrize("name", sorted(MULTINODE_RULE_CASES))
def test_apiserver_refuses_each_rule_as_spec_errors_does(kube, namespace, name: str, unchecked: Any) -> None:
    data, node = MULTINODE_RULE_CASES[name]
    refused = _refusals(kube, namespace, data)
    assert refused == {BY_NAME[name].error(node)} == set(spec_errors(unchecked(data)))


def test_apiserver_reports_every_broken_multinode_rule(kube, namespace, unchecked: Any) -> None:
    data = spec(**MULTINODE_BROKEN)
    expected = {BY_NAME[name].error(node) for name, node in MULTINODE_BROKEN_AT}
    assert _refusals(kube, namespace, data) == expected == set(spec_errors(unchecked(data)))


@pytest.mark.parametrize("case_id,data", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_layouts_vllm_runs_are_accepted_and_defaulted(kube, namespace, case_id: str, data: dict[str, Any]) -> None:
    assert errors_of(_doc(data)) == [], case_id
    created = client.CustomObjectsApi(kube).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, _doc(data), field_validation="Strict", dry_run="All")
    assert isinstance(created, dict)
    stored = created["spec"]
    # the schema's defaults: one node per replica, the back end chosen by the operator, vLLM's rendezvous ports
    assert stored["multiNode"]["backend"] == data.get("multiNode", {}).get("backend", "Auto")
    assert stored["multiNode"]["masterPort"] == 29501
    for role in ("prefill", "decode"):
        assert stored[role]["nodesPerReplica"] == data.get(role, {}).get("nodesPerReplica", 1)
        assert stored[role]["parallelism"]["expert"] == data.get(role, {}).get("parallelism", {}).get("expert", False)


@pytest.mark.parametrize("case_id,data,field", SCHEMA_INVALID, ids=[c[0] for c in SCHEMA_INVALID])
def test_schema_refuses_naming_the_field(kube, namespace, case_id: str, data: dict[str, Any], field: str) -> None:
    refused = _refusals(kube, namespace, data)
    assert any(r.startswith(field) for r in refused), (case_id, refused)
    assert any(e.startswith(field) for e in errors_of(_doc(data))), case_id


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(nodes=st.sampled_from([1, 2, 3, 4]), tensor=st.sampled_from([1, 2, 8]), pipeline=st.sampled_from([1, 2]),
       data=st.sampled_from([1, 2, 4, 8, 16]), count=st.sampled_from([None, 2, 4, 8, 16]),
       local=st.sampled_from([None, 1, 2, 4]), expert=st.booleans())
def test_apiserver_and_python_agree_on_random_layouts(kube, namespace, unchecked: Any, nodes: int, tensor: int,
                                                      pipeline: int, data: int, count: int | None,
                                                      local: int | None, expert: bool) -> None:
    parallelism: dict[str, Any] = {"tensor": tensor, "pipeline": pipeline, "data": data, "expert": expert}
    if local is not None:
        parallelism["dataParallelSizeLocal"] = local
    pool: dict[str, Any] = {"nodesPerReplica": nodes, "parallelism": parallelism}
    if count is not None:
        pool["gpu"] = {"count": count}
    body = spec(decode=pool)
    refused = _refusals(kube, namespace, body)
    assert refused == set(spec_errors(unchecked(body)))
    # the layout, as vLLM and the operator see it: accepted exactly when a replica can be rendered
    gpus = tensor * pipeline * data
    ok = (
        (nodes == 1 or (gpus % nodes == 0 and (count is None or count * nodes == gpus)
                        and (data == 1 or data % nodes == 0)))
        and (nodes > 1 or count is None or count % (tensor * pipeline) == 0)
        and (local is None or local * nodes == data)
        and (not expert or tensor * data > 1)
    )
    assert (not refused) is ok, (body, refused)

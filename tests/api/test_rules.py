"""The cross-field rules are one table (disagg.api.rules.RULES): every row is in the CRD, on the schema node of its
model and nowhere else, and in ``spec_errors``; the apiserver and ``spec_errors`` refuse the same specs with the same
fields and messages."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client
from kubernetes.client.rest import ApiException
from pydantic import BaseModel
from tests.api.cases import ALL_RULES_BROKEN, ALL_RULES_BROKEN_AT, MUTUALLY_EXCLUSIVE, RULE_CASES
from tests.api.schema import crd_schema, schema_nodes
from tests.paths import REPO

from disagg.api import GROUP, PLURAL, VERSION, rules
from disagg.api.docs import BEGIN, END, locations, rules_markdown, with_rules
from disagg.api.docs import main as docs_main
from disagg.api.models import RULES, DisaggregatedModelSpec, DisaggregatedModelStatus, PoolSpec, Rule, spec_errors
from disagg.api.validate import errors_of, problems

BY_NAME = {r.name: r for r in RULES}


def test_the_table_is_well_formed() -> None:
    assert len(BY_NAME) == len(RULES), "rule names must be unique"
    for r in RULES:
        assert r.cel and r.message, r.name
        assert r.field_path == "" or (r.field_path.startswith(".") and not r.field_path.endswith(".")), r.name


def test_every_rule_has_a_case() -> None:
    assert set(RULE_CASES) == set(BY_NAME), "add a spec breaking the new rule to tests/api/cases.py RULE_CASES"
    assert {name for name, _ in ALL_RULES_BROKEN_AT} == set(BY_NAME) - set(MUTUALLY_EXCLUSIVE)
    assert set(MUTUALLY_EXCLUSIVE.values()) <= {name for name, _ in ALL_RULES_BROKEN_AT}


def _node(schema: dict[str, Any], path: str) -> dict[str, Any]:
    """The schema node at a spec path (``spec.routing.tenants[]``)."""
    node = schema
    for part in path.split("."):
        node = node["properties"][part.removesuffix("[]")]
        if part.endswith("[]"):
            node = node["items"]
    return node


def test_every_rule_is_in_the_crd_on_its_model_and_nowhere_else() -> None:
    schema = crd_schema()
    carrying = {path: model for model in {r.on for r in RULES} for path in locations(model)}
    assert carrying, "no rule's model occurs in the spec"
    for path, model in carrying.items():
        expected = [r.validation() for r in RULES if r.on is model]
        assert _node(schema, path).get("x-kubernetes-validations") == expected, f"{path} ({model.__name__})"
    with_cel = {path for path, node in schema_nodes(schema, "") if "x-kubernetes-validations" in node}
    assert with_cel == {f".{p}" for p in carrying}, "CEL in the CRD that the table did not put there"
    # a model used in several places carries its rules in each
    pools = [p for p, model in carrying.items() if model is PoolSpec]
    assert pools == ["spec.prefill", "spec.decode", "spec.aggregated"]


@pytest.fixture
def unchecked(monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, Any]], DisaggregatedModelSpec]:
    """Parse a spec without the cross-field rules (to hand a rule-breaking spec to ``spec_errors``)."""
    def parse(data: dict[str, Any]) -> DisaggregatedModelSpec:
        with monkeypatch.context() as m:
            m.setattr(rules, "RULES", ())
            return DisaggregatedModelSpec.model_validate(data)
    return parse


@pytest.mark.parametrize("name", sorted(RULE_CASES))
def test_every_rule_is_in_spec_errors(name: str, unchecked) -> None:
    rule, (data, node_path) = BY_NAME[name], RULE_CASES[name]
    errors = spec_errors(unchecked(data))
    assert rule.error(node_path) in errors, errors
    assert all(e.startswith(node_path) for e in errors), f"{name}: the case breaks other rules too: {errors}"
    assert not rule.check(_node_at(unchecked(data), node_path))
    # disagg validate (the CRD's CEL, evaluated with the table's predicates): every broken rule, as spec_errors
    doc = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DisaggregatedModel", "metadata": {"name": "m"}, "spec": data}
    assert sorted(errors_of(doc)) == sorted(errors)


def _node_at(spec: DisaggregatedModelSpec, path: str) -> BaseModel:
    node: Any = spec
    for part in path.removeprefix("spec").split(".")[1:]:
        name, _, index = part.partition("[")
        node = getattr(node, next(n for n, f in type(node).model_fields.items() if (f.alias or n) == name))
        if index:
            node = node[int(index.rstrip("]"))]
    assert isinstance(node, BaseModel)
    return node


def test_spec_errors_reports_every_broken_rule(unchecked) -> None:
    errors = spec_errors(unchecked(ALL_RULES_BROKEN))
    assert sorted(errors) == sorted(BY_NAME[name].error(path) for name, path in ALL_RULES_BROKEN_AT)


def test_rule_check_refuses_another_model() -> None:
    with pytest.raises(TypeError, match="pool-min-le-max applies to PoolSpec"):
        BY_NAME["pool-min-le-max"].check(DisaggregatedModelStatus())


def test_a_valid_spec_breaks_no_rule() -> None:
    spec = DisaggregatedModelSpec.model_validate({"model": {"name": "m"}})
    assert spec_errors(spec) == []
    assert all(isinstance(r, Rule) for r in RULES)


# --------------------------------------------------------------------------------- against the apiserver


INVALID_OBJECT = 'Invalid value: "object": '


def _refusals(kube: client.ApiClient, namespace: str, spec: dict[str, Any]) -> set[str]:
    """What the apiserver refuses ``spec`` for, as ``field: message`` (spec_errors' wording); empty if accepted."""
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DisaggregatedModel", "metadata": {"name": "m"}, "spec": spec}
    try:
        client.CustomObjectsApi(kube).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body, field_validation="Strict", dry_run="All")
    except ApiException as exc:
        assert exc.status == 422, exc.body
        causes = json.loads(exc.body or "{}")["details"]["causes"]
        return {f"{c['field']}: {c['message'].removeprefix(INVALID_OBJECT)}" for c in causes}
    return set()


@pytest.mark.parametrize("name", sorted(RULE_CASES))
def test_apiserver_refuses_each_rule_as_spec_errors_does(kube, namespace, name: str, unchecked) -> None:
    data, node_path = RULE_CASES[name]
    refused = _refusals(kube, namespace, data)
    assert BY_NAME[name].error(node_path) in refused
    assert refused == set(spec_errors(unchecked(data)))


def test_apiserver_reports_every_broken_rule_as_spec_errors_does(kube, namespace, unchecked) -> None:
    assert _refusals(kube, namespace, ALL_RULES_BROKEN) == set(spec_errors(unchecked(ALL_RULES_BROKEN)))


# ------------------------------------------------------------------------------------------ docs/api.md


def test_docs_list_every_rule() -> None:
    text = (REPO / "docs" / "api.md").read_text()
    assert rules_markdown() in text, "docs/api.md's rules drifted from the table: run `python -m disagg.api.docs`"
    for r in RULES:
        assert r.message in rules_markdown()
    assert locations(PoolSpec) == ["spec.prefill", "spec.decode", "spec.aggregated"]


def test_docs_generator_rewrites_only_its_block(tmp_path) -> None:
    stale = tmp_path / "api.md"
    stale.write_text(f"# intro\n\n{BEGIN}\n| old | table |\n{END}\n\n## after\n")
    assert docs_main([str(stale)]) == 0
    assert stale.read_text() == f"# intro\n\n{rules_markdown()}\n\n## after\n"
    with pytest.raises(ValueError, match="markers missing"):
        with_rules("# no block\n")


tokens = st.integers(0, 4096)
# extraArgs items: owned flags in every spelling (the CEL rule refuses some, the operator all), and others
ARG_SPELLINGS = ["--enforce-eager", "--max-num-seqs=8", "4", "--port", "--port=1", "--portx", "--kv-transfer-config",
                 "--kv_transfer_config.kv_role=kv_both", "--kv-transfer", "-tp", "-tp=2", "-t", "-tpx", "-dpl",
                 "--tensor_parallel_size", "--tensor-parallel", "--served-model-name=x", "--config-format",
                 "--shutdown-timeout=1", "--model", "--model-impl", "--Port", "-", "--", "-1", "--port.x y",
                 "--port\n", "-tp=\n"]


@st.composite
def rule_specs(draw: st.DrawFn) -> dict[str, Any]:
    """Specs valid for the schema that break any subset of the rules (at random thresholds)."""
    pvc = {"claimName": "w"}
    source = draw(st.sampled_from([{}, {"hub": {}}, {"pvc": pvc}, {"hub": {}, "pvc": pvc}]))
    tenant: dict[str, Any] = {"name": "t", "match": {"values": ["x"]}}
    if draw(st.booleans()):
        tenant["remotePrefill"] = {"minInputTokens": draw(tokens)}
    if draw(st.booleans()):
        tenant["localPrefill"] = {"maxInputTokens": draw(tokens)}
    bucket: dict[str, Any] = {"name": "b", "minInputTokens": draw(tokens)}
    if draw(st.booleans()):
        bucket["maxInputTokens"] = draw(st.integers(1, 4096))
    kv: dict[str, Any] = {"transport": draw(st.sampled_from(["rdma", "tcp", "auto"]))}
    if draw(st.booleans()):
        kv["rdma"] = {}
    args = st.lists(st.sampled_from(ARG_SPELLINGS), max_size=3)
    surge_or_unavailable = st.sampled_from([0, 1, 2, 1000, 1001, "0%", "00%", "25%", "100%", "101%", "1000%", "3", "x",
                                           "25%\n", "0%\n"])
    pools = {role: {"extraArgs": draw(args), "rollingUpdate": {"maxSurge": draw(surge_or_unavailable),
                                                                "maxUnavailable": draw(surge_or_unavailable)}}
             for role in draw(st.sets(st.sampled_from(["prefill", "decode", "aggregated"])))}
    autoscaling: dict[str, Any] = {"enabled": draw(st.booleans()),
                                   "prefillDecodeRatio": {"min": draw(st.sampled_from([0.5, 1, 2])),
                                                          "max": draw(st.sampled_from([0.5, 1, 2]))}}
    if draw(st.booleans()):
        autoscaling["prometheus"] = {"url": "http://prometheus:9090"}
    return {
        "model": {"name": "m", "source": source},
        "engine": {"extraArgs": draw(args)},
        **pools,
        "kvTransfer": kv,
        "routing": {"remotePrefill": {"minInputTokens": draw(tokens)}, "localPrefill": {"maxInputTokens": draw(tokens)},
                    "tenants": [tenant] * draw(st.integers(1, 2)), "buckets": [bucket] * draw(st.integers(1, 2))},
        "autoscaling": autoscaling,
    }


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=rule_specs())
def test_apiserver_and_spec_errors_agree_on_random_specs(kube, namespace, unchecked, data: dict[str, Any]) -> None:
    refused = _refusals(kube, namespace, data)
    assert refused == set(spec_errors(unchecked(data)))
    doc = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DisaggregatedModel", "metadata": {"name": "m"}, "spec": data}
    assert {str(p) for p in problems(doc) if p.source == "apiserver"} == refused

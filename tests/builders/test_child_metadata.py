"""The DisaggregatedModel's own labels and annotations reach its children (less tool-owned keys); selectors never
change."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from disagg.api import contract as c
from disagg.api.models import DisaggregatedModel
from disagg.builders import build_children, parse_model
from disagg.builders.meta import propagates

from .conftest import example_body

USER_LABELS = {
    "team": "inference",
    "cost-center": "ml-42",
    "example.com/tier": "gold",
    "app.kubernetes.io/version": "3.1",  # a recommended label users set: kept
    # The operator's own keys: the operator's values win.
    c.LABEL_NAME: "not-disagg",
    c.LABEL_COMPONENT: "everything",
    c.LABEL_MODEL: "someone-else",
    c.LABEL_ROLE: "hijack",
    # Tool-owned: never copied.
    "app.kubernetes.io/managed-by": "Helm",
    "kustomize.toolkit.fluxcd.io/name": "apps",
    "kustomize.toolkit.fluxcd.io/namespace": "flux-system",
    "helm.toolkit.fluxcd.io/name": "release",
    "kapp.k14s.io/app": "1700000000",
    "pod-template-hash": "abc",
}
USER_ANNOTATIONS = {
    "example.com/owner": "alice@example.com",
    "description": "the 8B model",
    # Tool-owned: never copied.
    "kubectl.kubernetes.io/last-applied-configuration": '{"apiVersion": "serving.disagg.dev/v1alpha1"}',
    "kopf.zalando.org/last-handled-configuration": '{"spec": {}}',
    "kopf.zalando.org/reconcile": '{"started": "2026-01-01T00:00:00Z"}',
    "meta.helm.sh/release-name": "models",
    "meta.helm.sh/release-namespace": "serving",
    "helm.sh/resource-policy": "keep",
    "argocd.argoproj.io/tracking-id": "models:serving.disagg.dev/DisaggregatedModel:serving/llama-8b",
    "argocd.argoproj.io/sync-options": "Prune=false",
    "serving.disagg.dev/spec-hash": "0000000000000000",
}
KEPT_LABELS = {"team": "inference", "cost-center": "ml-42", "example.com/tier": "gold",
               "app.kubernetes.io/version": "3.1"}
KEPT_ANNOTATIONS = {"example.com/owner": "alice@example.com", "description": "the 8B model"}


def labelled(name: str = "llama-8b-nvlink", labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None, **spec: Any) -> DisaggregatedModel:
    body = example_body(name)
    body["metadata"]["labels"] = dict(USER_LABELS if labels is None else labels)
    body["metadata"]["annotations"] = dict(USER_ANNOTATIONS if annotations is None else annotations)
    body["spec"].update(spec)
    return parse_model(body)


def plain(name: str = "llama-8b-nvlink", **spec: Any) -> DisaggregatedModel:
    body = example_body(name)
    body["spec"].update(spec)
    return parse_model(body)


def ref(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


AGGREGATED = {"replicas": 1, "gpu": {"count": 1}}


@pytest.mark.parametrize("name", ["llama-8b-nvlink", "llama-70b-rdma"])
def test_every_child_carries_the_models_labels_and_annotations(name: str) -> None:
    kids = build_children(labelled(name, aggregated=AGGREGATED))
    bare = {ref(o): o for o in build_children(plain(name, aggregated=AGGREGATED))}
    assert {"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service", "PodDisruptionBudget",
            "Deployment"} == {o["kind"] for o in kids}
    for obj in kids:
        meta, base = obj["metadata"], bare[ref(obj)]["metadata"]
        # Exactly the kept keys are added; every operator label keeps the operator's value.
        assert meta["labels"] == {**KEPT_LABELS, **base["labels"]}, ref(obj)
        assert {k: v for k, v in meta["annotations"].items() if k != "serving.disagg.dev/spec-hash"} == \
            KEPT_ANNOTATIONS, ref(obj)
        assert meta["labels"][c.LABEL_MANAGED_BY] == c.MANAGED_BY
        assert meta["labels"][c.LABEL_NAME] == c.APP_NAME
        # The spec hash is the operator's, not the user's copy.
        assert meta["annotations"]["serving.disagg.dev/spec-hash"] != "0000000000000000"


def test_pod_templates_and_selectors_never_change_with_the_models_metadata() -> None:
    """A label or annotation edit on the model re-labels the children but never rolls a pool (no template change)."""
    kids = {ref(o): o for o in build_children(labelled(aggregated=AGGREGATED))}
    bare = {ref(o): o for o in build_children(plain(aggregated=AGGREGATED))}
    deployments = [k for k in kids if k.startswith("Deployment/")]
    assert len(deployments) == 4  # prefill, decode, aggregated, router
    for key in deployments:
        tpl, base_tpl = kids[key]["spec"]["template"], bare[key]["spec"]["template"]
        assert tpl == base_tpl, key
        # Deployment selectors are immutable: a label on the model must never reach them.
        assert kids[key]["spec"]["selector"] == bare[key]["spec"]["selector"], key
        selector = kids[key]["spec"]["selector"]["matchLabels"]
        assert selector.items() <= tpl["metadata"]["labels"].items(), key
    for key in [k for k in kids if k.startswith(("Service/", "PodDisruptionBudget/"))]:
        assert kids[key]["spec"]["selector"] == bare[key]["spec"]["selector"], key


def test_pod_labels_come_from_the_pools_pod_template_only() -> None:
    body = example_body("llama-8b-nvlink")
    body["metadata"]["labels"] = {"team": "inference", "tier": "gold"}
    body["spec"]["decode"]["podTemplate"] = {"metadata": {"labels": {"team": "decode-oncall"}}}
    kids = {ref(o): o for o in build_children(parse_model(body))}
    decode = kids["Deployment/llama-8b-decode"]
    assert decode["spec"]["template"]["metadata"]["labels"]["team"] == "decode-oncall"
    assert "tier" not in decode["spec"]["template"]["metadata"]["labels"]
    assert decode["metadata"]["labels"]["team"] == "inference"  # the Deployment itself follows the model
    assert "team" not in kids["Deployment/llama-8b-prefill"]["spec"]["template"]["metadata"]["labels"]


def test_tool_owned_metadata_changes_do_not_change_any_child() -> None:
    """kopf rewrites its annotations on every handled change, kubectl on every apply: if they reached the children,
    every such write would re-apply (and for pod templates, roll) every child."""
    before = build_children(labelled())
    churned = copy.deepcopy(USER_ANNOTATIONS)
    churned["kopf.zalando.org/last-handled-configuration"] = '{"spec": {"mode": "Auto"}}'
    churned["kubectl.kubernetes.io/last-applied-configuration"] = "{}"
    churned["argocd.argoproj.io/tracking-id"] = "other"
    labels = {**USER_LABELS, "kustomize.toolkit.fluxcd.io/name": "other"}
    assert build_children(labelled(labels=labels, annotations=churned)) == before


def test_a_user_label_change_reaches_the_spec_hash() -> None:
    """The operator re-applies a child whose spec-hash annotation differs: a label edit on the model must."""
    a = {ref(o): o for o in build_children(labelled())}
    b = {ref(o): o for o in build_children(labelled(labels={**USER_LABELS, "team": "research"}))}
    for key in a:
        assert a[key]["metadata"]["labels"]["team"] == "inference"
        assert b[key]["metadata"]["labels"]["team"] == "research"
        assert a[key]["metadata"]["annotations"]["serving.disagg.dev/spec-hash"] != \
            b[key]["metadata"]["annotations"]["serving.disagg.dev/spec-hash"], key


@pytest.mark.parametrize("key,kept", [
    ("team", True),
    ("example.com/owner", True),
    ("app.kubernetes.io/version", True),
    ("app.kubernetes.io/managed-by", False),
    ("kubectl.kubernetes.io/last-applied-configuration", False),
    ("kubernetes.io/description", False),
    ("node.kubernetes.io/instance-type", False),
    ("kustomize.config.k8s.io/id", False),
    ("kopf.zalando.org/last-handled-configuration", False),
    ("serving.disagg.dev/model", False),
    ("meta.helm.sh/release-name", False),
    ("helm.sh/chart", False),
    ("argocd.argoproj.io/instance", False),
    ("kustomize.toolkit.fluxcd.io/name", False),
    ("notkubernetes.io/x", True),  # only the domain and its subdomains, not a name that ends the same
    ("pod-template-hash", False),
])
def test_propagation_rule(key: str, kept: bool) -> None:
    assert propagates(key) is kept

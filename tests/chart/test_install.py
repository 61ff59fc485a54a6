"""A rendered install applied to the real apiserver (server-side apply), and the operator's RBAC checked there.

Cluster-scoped objects get a unique release name per test and are deleted afterwards. Prometheus Operator kinds
are skipped (their CRDs are not installed here); the kopf peering CRDs come from the chart's crds/.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.chart.render import CHART, documents, load_values, render, strip
from tests.paths import EXAMPLES

from disagg.kube import install_crd, server_side_apply
from disagg.local.controlplane import ControlPlane

# The ``kubectl`` fixture (tests/conftest.py): runs kubectl against the fixture's apiserver.
Kubectl = Callable[..., subprocess.CompletedProcess[str]]

MONITORING_GROUP = "monitoring.coreos.com/"
CLUSTER_KINDS = {"ClusterRole": "cluster_role", "ClusterRoleBinding": "cluster_role_binding"}


@pytest.fixture(scope="module")
def chart_crds(kube: client.ApiClient) -> None:
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if crd:
                install_crd(kube, crd)


@pytest.fixture
def release(kube: client.ApiClient, chart_crds: None) -> Iterator[dict[str, Any]]:
    """Installs a release (call it with values) and removes its cluster-scoped objects afterwards."""
    state: dict[str, Any] = {"name": f"r{uuid.uuid4().hex[:8]}", "docs": []}

    def install(values: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
        docs = documents(render(values, name=state["name"], namespace=namespace))
        state["docs"] += docs
        applied = []
        for doc in docs:
            if doc["apiVersion"].startswith(MONITORING_GROUP):
                continue  # Prometheus Operator CRDs are not installed in the fixture
            server_side_apply(kube, strip(doc), field_manager="helm")
            applied.append(doc)
        return applied

    state["install"] = install
    try:
        yield state
    finally:
        rbac = client.RbacAuthorizationV1Api(kube)
        custom = client.CustomObjectsApi(kube)
        for doc in state["docs"]:
            name = doc["metadata"]["name"]
            try:
                if doc["kind"] == "ClusterRole":
                    rbac.delete_cluster_role(name)
                elif doc["kind"] == "ClusterRoleBinding":
                    rbac.delete_cluster_role_binding(name)
                elif doc["kind"] == "ClusterKopfPeering":
                    custom.delete_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", name)
            except ApiException as e:
                if e.status != 404:
                    raise


def _can(kubectl: Kubectl, sa: str, verb: str, resource: str, namespace: str | None,
         subresource: str | None = None) -> bool:
    args = ["auth", "can-i", verb, resource, f"--as={sa}"]
    args += [f"--subresource={subresource}"] if subresource else []
    args += [f"--namespace={namespace}"] if namespace else []
    res = kubectl(*args)
    return bool(res.stdout.strip() == "yes")


def _router_role(namespace: str) -> dict[str, Any]:
    """What the operator grants each model's router (it must hold these permissions itself)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": f"probe-router-{uuid.uuid4().hex[:6]}", "namespace": namespace},
        "rules": [
            {"apiGroups": [""], "resources": ["pods", "configmaps"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
        ],
    }


def test_cluster_install_applies_and_rbac_works(release: dict[str, Any], namespace: str, kubectl: Kubectl,
                                                kube: client.ApiClient) -> None:
    applied = release["install"](load_values(CHART / "ci" / "monitoring-values.yaml"), namespace)
    kinds = sorted({d["kind"] for d in applied})
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "ConfigMap",
            "ClusterKopfPeering"} <= set(kinds)
    apps = client.AppsV1Api(kube)
    dep: Any = apps.read_namespaced_deployment(f"{release['name']}-disagg-operator", namespace)
    assert dep.spec.template.spec.containers[0].security_context.read_only_root_filesystem is True

    sa = f"system:serviceaccount:{namespace}:{release['name']}-disagg-operator"
    other = "default"
    for verb, resource, ns in [
        ("watch", "disaggregatedmodels.serving.disagg.dev", other),
        ("patch", "disaggregatedmodels.serving.disagg.dev/status", other),
        ("create", "deployments.apps", other),
        ("delete", "services", other),
        ("create", "roles.rbac.authorization.k8s.io", other),
        ("create", "poddisruptionbudgets.policy", other),
        ("list", "endpointslices.discovery.k8s.io", other),
        ("create", "events", other),
        ("create", "events.events.k8s.io", other),
        ("get", "secrets", other),
        ("patch", "clusterkopfpeerings.kopf.dev", None),
        ("watch", "customresourcedefinitions.apiextensions.k8s.io", None),
    ]:
        assert _can(kubectl, sa, verb, resource, ns), (verb, resource, ns)
    assert _can(kubectl, sa, "patch", "deployments.apps", other, subresource="scale")  # the autoscaler's writes
    assert _can(kubectl, sa, "get", f"namespaces/{other}", None)  # Pod Security level of the model's namespace
    # a multi-node group whose member failed starts over: the operator deletes its pods (never creates any)
    assert _can(kubectl, sa, "delete", "pods", other)
    for verb, resource, ns in [
        ("create", "pods", other), ("list", "secrets", other),
        ("create", "clusterroles.rbac.authorization.k8s.io", None), ("create", "nodes", None),
        ("escalate", "roles.rbac.authorization.k8s.io", other),
        ("delete", "disaggregatedmodels.serving.disagg.dev", other),
    ]:
        assert not _can(kubectl, sa, verb, resource, ns), (verb, resource, ns)

    # RBAC escalation prevention: the operator may grant the router's Role because it holds those permissions
    res = kubectl("create", "--as", sa, "-f", "-", "-o", "name", input=yaml.safe_dump(_router_role(namespace)))
    assert res.returncode == 0, res.stderr


def test_namespaced_install_is_confined(release: dict[str, Any], namespace: str, kubectl: Kubectl,
                                        kube: client.ApiClient) -> None:
    values = {"watch": {"scope": "namespace", "namespaces": [namespace]}, "peering": {"name": "disagg"}}
    applied = release["install"](values, namespace)
    kinds = [d["kind"] for d in applied]
    assert kinds.count("Role") == 1 and kinds.count("RoleBinding") == 1 and "KopfPeering" in kinds
    custom = client.CustomObjectsApi(kube)
    custom.get_namespaced_custom_object("kopf.dev", "v1", namespace, "kopfpeerings", "disagg")

    sa = f"system:serviceaccount:{namespace}:{release['name']}-disagg-operator"
    assert _can(kubectl, sa, "create", "deployments.apps", namespace)
    assert _can(kubectl, sa, "get", f"namespaces/{namespace}", namespace)  # its own namespace's Pod Security label
    assert not _can(kubectl, sa, "get", "namespaces/default", None)
    assert _can(kubectl, sa, "patch", "kopfpeerings.kopf.dev", namespace)
    assert _can(kubectl, sa, "list", "customresourcedefinitions.apiextensions.k8s.io", None)
    assert not _can(kubectl, sa, "create", "deployments.apps", "default")
    assert not _can(kubectl, sa, "list", "disaggregatedmodels.serving.disagg.dev", "default")
    assert not _can(kubectl, sa, "patch", "clusterkopfpeerings.kopf.dev", None)
    res = kubectl("create", "--as", sa, "-f", "-", "-o", "name", input=yaml.safe_dump(_router_role(namespace)))
    assert res.returncode == 0, res.stderr
    res = kubectl("create", "--as", sa, "-f", "-", "-o", "name", input=yaml.safe_dump(_router_role("default")))
    assert res.returncode != 0


def test_reapply_is_idempotent(release: dict[str, Any], namespace: str, kube: client.ApiClient) -> None:
    """A second server-side apply of the same render changes nothing (GitOps tools re-apply constantly)."""
    first = release["install"]({}, namespace)
    apps = client.AppsV1Api(kube)
    name = f"{release['name']}-disagg-operator"
    before: Any = apps.read_namespaced_deployment(name, namespace)
    again = release["install"]({}, namespace)
    assert [d["metadata"]["name"] for d in again] == [d["metadata"]["name"] for d in first]
    after: Any = apps.read_namespaced_deployment(name, namespace)
    assert after.metadata.generation == before.metadata.generation


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_operator_can_apply_every_child(example: Path, release: dict[str, Any], namespace: str,
                                        kube: client.ApiClient, control_plane: ControlPlane) -> None:
    """As the operator's ServiceAccount (impersonated), server-side apply every object the builders make for
    each example model: the chart's RBAC covers what the operator really creates (router Role included)."""
    from disagg.builders import build_children, parse_model
    from disagg.kube import api_client

    release["install"]({"watch": {"scope": "namespace", "namespaces": [namespace]}}, namespace)
    body = yaml.safe_load(example.read_text())
    body["metadata"]["namespace"] = namespace
    custom = client.CustomObjectsApi(kube)
    created = cast(dict[str, Any], custom.create_namespaced_custom_object(
        "serving.disagg.dev", "v1alpha1", namespace, "disaggregatedmodels", body))
    children = build_children(parse_model(created))
    assert children
    as_operator = api_client(control_plane.kubeconfig)
    as_operator.set_default_header("Impersonate-User",
                                   f"system:serviceaccount:{namespace}:{release['name']}-disagg-operator")
    for child in children:
        server_side_apply(as_operator, child)  # raises ApiException(403) when RBAC falls short
    # and status, as the operator writes it
    custom_op = client.CustomObjectsApi(as_operator)
    custom_op.patch_namespaced_custom_object_status(
        "serving.disagg.dev", "v1alpha1", namespace, "disaggregatedmodels", body["metadata"]["name"],
        {"status": {"activeMode": "Disaggregated"}})
    # the impersonation is real: the operator may not create pods itself
    with pytest.raises(ApiException) as err:
        core: Any = client.CoreV1Api(as_operator)  # takes plain dict bodies (its annotations say V1Pod)
        core.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
            "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}})
    assert err.value.status == 403

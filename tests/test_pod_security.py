"""Every pod the project renders meets the Pod Security Standard it claims, as judged by the real apiserver's
PodSecurity admission (namespaces labelled ``pod-security.kubernetes.io/enforce=<level>``).

Claims (docs/kv-transport.md, "Pod Security"; disagg.builders.security):

| pods                                   | level        |
| -------------------------------------- | ------------ |
| operator (Helm chart)                  | restricted   |
| router                                 | restricted   |
| workers, transport nvlink, tcp, auto   | restricted   |
| aggregated pool (no KV transfer)       | restricted   |
| workers, transport rdma (IPC_LOCK)     | privileged   |
| rdma with the documented override      | restricted   |
| any pool, spec.model.cache.hostPath    | privileged   |
| any pool, spec.model.cache.pvc         | restricted   |

Each pod is created with a server-side dry run from its Deployment's pod template: admitted at its level and, where
that is not already the strictest, refused one level stricter. One test also lets the controller-manager create
the pods of applied Deployments (the real Deployment → ReplicaSet → Pod path).
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from tests.chart.render import CI_VALUES, documents, load_values, render
from tests.paths import REPO

from disagg.api.contract import Role
from disagg.api.models import GROUP, PLURAL, VERSION
from disagg.builders import BuildSettings, build_children, parse_model
from disagg.builders.security import LEVELS, NON_ROOT_UID, Level
from disagg.builders.workers import pool_security_level
from disagg.kube import server_side_apply

pytestmark = pytest.mark.apiserver

PSA_VERSION = "v1.34"  # the control-plane fixture's Kubernetes version
EXAMPLES = REPO / "docs" / "examples"
SETTINGS = BuildSettings(router_image="ghcr.io/disagg/disagg:0.1.0")
AGGREGATED = {"replicas": 1, "gpu": {"count": 1}}
# docs/kv-transport.md ("Pod Security"): RDMA pools on nodes that raise RLIMIT_MEMLOCK for containers.
RDMA_RESTRICTED_OVERRIDE: dict[str, Any] = {
    "spec": {
        "securityContext": {"runAsNonRoot": True, "runAsUser": NON_ROOT_UID, "runAsGroup": NON_ROOT_UID},
        "containers": [{"name": "vllm", "securityContext": {"capabilities": {"add": []}}}],
    }
}


def stricter(level: Level) -> Level | None:
    i = LEVELS.index(level)
    return LEVELS[i - 1] if i else None


def model_body(example: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """An example DisaggregatedModel in ``namespace``, without a uid: no ownerReferences, so the garbage collector
    leaves the applied children alone."""
    body: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{example}.yaml").read_text())
    body["metadata"] = {**body["metadata"], "namespace": namespace}
    body["spec"].update(copy.deepcopy(spec))
    return body


def deployments(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in build_children(parse_model(body), SETTINGS) if o["kind"] == "Deployment"}


def pod_from(dep: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The Pod a ReplicaSet would create from this Deployment's template."""
    tpl = copy.deepcopy(dep["spec"]["template"])
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {**tpl.get("metadata", {}), "name": f"{dep['metadata']['name']}-psa", "namespace": namespace},
            "spec": tpl["spec"]}


@pytest.fixture(scope="module")
def psa(kube: client.ApiClient) -> Iterator[dict[Level, str]]:
    """One namespace per level, each enforcing it (pinned version), with the ServiceAccounts pods refer to."""
    core = client.CoreV1Api(kube)
    names: dict[Level, str] = {}
    try:
        for level in LEVELS:
            name = f"psa-{level}-{uuid.uuid4().hex[:6]}"
            labels = {"pod-security.kubernetes.io/enforce": level,
                      "pod-security.kubernetes.io/enforce-version": PSA_VERSION}
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels)))
            names[level] = name
        for name in names.values():
            wait_for_service_account(core, name, "default")
        yield names
    finally:
        for name in names.values():
            core.delete_namespace(name)


def watch_until(list_fn: Callable[..., Any], namespace: str, done: Callable[[dict[str, Any]], bool],
                timeout: int = 90) -> dict[str, Any]:
    """Watch a namespaced list until ``done`` holds for the latest state of each object (by name); returns that state.
    The apiserver ends the watch after ``timeout`` seconds: then the wait fails."""
    seen: dict[str, Any] = {}
    w: Any = watch.Watch()
    for event in w.stream(list_fn, namespace, timeout_seconds=timeout):
        obj = event["object"]
        seen[obj.metadata.name] = obj
        if done(seen):
            w.stop()
            return seen
    raise AssertionError(f"{namespace}: never reached the expected state within {timeout} s: {sorted(seen)}")


def wait_for_service_account(core: client.CoreV1Api, namespace: str, name: str) -> None:
    """The controller-manager creates each namespace's "default" ServiceAccount; pods are refused until it exists."""
    watch_until(core.list_namespaced_service_account, namespace, lambda seen: name in seen, timeout=60)


def ensure_service_account(kube: client.ApiClient, namespace: str, pod: dict[str, Any]) -> None:
    sa = pod["spec"].get("serviceAccountName")
    if sa:
        server_side_apply(kube, {"apiVersion": "v1", "kind": "ServiceAccount",
                                 "metadata": {"name": sa, "namespace": namespace}}, field_manager="test")


def dry_run(kube: client.ApiClient, namespace: str, dep: dict[str, Any]) -> str | None:
    """None when the pod is admitted, else the apiserver's refusal message."""
    pod = pod_from(dep, namespace)
    ensure_service_account(kube, namespace, pod)
    core: Any = client.CoreV1Api(kube)  # takes plain dict bodies (its annotations say V1Pod)
    try:
        core.create_namespaced_pod(namespace, pod, dry_run="All")
    except ApiException as e:
        assert e.status == 403, f"unexpected refusal ({e.status}): {e.body}"
        return str(json.loads(e.body or "{}")["message"])
    return None


def assert_level(kube: client.ApiClient, psa: dict[Level, str], dep: dict[str, Any], level: Level) -> str | None:
    """Admitted at ``level``; refused one level stricter (the message is returned for further checks)."""
    name = dep["metadata"]["name"]
    refused = dry_run(kube, psa[level], dep)
    assert refused is None, f"{name} refused at {level}: {refused}"
    tighter = stricter(level)
    if tighter is None:
        return None
    refused = dry_run(kube, psa[tighter], dep)
    assert refused is not None, f"{name} admitted at {tighter}, but claims only {level}"
    assert f'violates PodSecurity "{tighter}:{PSA_VERSION}"' in refused, refused
    return refused


# --------------------------------------------------------------------------------------------- the fixture


def test_namespaces_enforce_their_level(kube: client.ApiClient, psa: dict[Level, str]) -> None:
    """Control: a default pod (root allowed, no seccomp) is refused where restricted is enforced, a hostPath pod where
    baseline is: the admissions below are verdicts, not an absent plugin."""
    plain: dict[str, Any] = {"metadata": {"name": "plain"},
                             "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}
    assert_level(kube, psa, plain, "baseline")
    host = copy.deepcopy(plain)
    host["spec"]["template"]["spec"]["volumes"] = [{"name": "h", "hostPath": {"path": "/"}}]
    assert "hostPath" in (assert_level(kube, psa, host, "privileged") or "")


# ------------------------------------------------------------------------------------------------ workers


@pytest.mark.parametrize("transport", ["rdma", "nvlink", "tcp", "auto"])
def test_worker_and_router_pods_per_transport(kube: client.ApiClient, psa: dict[Level, str], transport: str) -> None:
    kv: dict[str, Any] = {"transport": transport, **({"rdma": {}} if transport == "rdma" else {})}
    body = model_body("llama-8b-nvlink", "x", kvTransfer=kv, aggregated=AGGREGATED)
    dm = parse_model(body)
    deps = deployments(body)
    claims: dict[str, Level] = {
        "llama-8b-prefill": pool_security_level(dm, "prefill"),
        "llama-8b-decode": pool_security_level(dm, "decode"),
        "llama-8b-aggregated": pool_security_level(dm, "aggregated"),
        "llama-8b-router": "restricted",
    }
    assert set(claims) == set(deps)
    want = "privileged" if transport == "rdma" else "restricted"
    assert claims["llama-8b-prefill"] == claims["llama-8b-decode"] == want
    assert claims["llama-8b-aggregated"] == "restricted"
    for name, level in claims.items():
        refused = assert_level(kube, psa, deps[name], level)
        if level == "privileged":
            # IPC_LOCK is the one reason: baseline refuses exactly that capability.
            assert 'non-default capabilities (container "vllm" must not include "IPC_LOCK"' in (refused or ""), refused


@pytest.mark.parametrize("example", sorted(p.stem for p in EXAMPLES.glob("*.yaml")))
def test_every_example_at_its_claimed_level(kube: client.ApiClient, psa: dict[Level, str], example: str) -> None:
    body = model_body(example, "x")
    dm = parse_model(body)
    pools: tuple[Role, ...] = ("prefill", "decode", "aggregated")
    roles = {f"{dm.metadata['name']}-{r}": r for r in pools}
    for name, dep in deployments(body).items():
        level = pool_security_level(dm, roles[name]) if name in roles else "restricted"
        assert_level(kube, psa, dep, level)


def test_pod_template_overrides_still_merge_and_keep_the_level(kube: client.ApiClient,
                                                               psa: dict[Level, str]) -> None:
    body = model_body("llama-70b-rdma", psa["privileged"])
    body["spec"]["prefill"]["podTemplate"] = RDMA_RESTRICTED_OVERRIDE
    body["spec"]["decode"]["podTemplate"] = {
        "metadata": {"labels": {"team": "a"}},
        "spec": {"securityContext": {"supplementalGroups": [44]},
                 "containers": [{"name": "vllm", "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]}]},
    }
    # The overrides as the apiserver stores them (CRD schema, pruning), not only as written here.
    stored = cast(dict[str, Any], client.CustomObjectsApi(kube).create_namespaced_custom_object(
        GROUP, VERSION, psa["privileged"], PLURAL, body, dry_run="All"))
    assert stored["spec"]["prefill"]["podTemplate"] == RDMA_RESTRICTED_OVERRIDE
    deps = deployments(stored)
    assert_level(kube, psa, deps["llama-70b-prefill"], "restricted")  # IPC_LOCK dropped, non-root
    assert_level(kube, psa, deps["llama-70b-decode"], "privileged")  # unrelated overrides keep the rest

    # An override that breaks the contract is refused where the namespace enforces it: the level is the pod's.
    body = model_body("llama-8b-nvlink", "x")
    body["spec"]["decode"]["podTemplate"] = {"spec": {"securityContext": {"runAsNonRoot": False, "runAsUser": 0}}}
    assert_level(kube, psa, deployments(body)["llama-8b-decode"], "baseline")


@pytest.mark.parametrize("cache,level", [
    ({"hostPath": "/var/cache/disagg-models"}, "privileged"),
    ({"pvc": {"claimName": "hf-cache"}}, "restricted"),
])
def test_model_cache_levels(kube: client.ApiClient, psa: dict[Level, str], cache: dict[str, Any],
                            level: Level) -> None:
    """spec.model.cache (docs/install.md, "Model cache"): a hostPath cache needs a privileged namespace (baseline
    refuses hostPath volumes, and the init container that hands the directory to the worker's uid runs as root);
    a PVC cache keeps every pool restricted."""
    body = model_body("llama-8b-nvlink", "x", model={"name": "meta-llama/Llama-3.1-8B-Instruct", "cache": cache},
                      kvTransfer={"transport": "tcp"}, aggregated=AGGREGATED)
    dm = parse_model(body)
    deps = deployments(body)
    for role in ("prefill", "decode", "aggregated"):
        assert pool_security_level(dm, role) == level
        refused = assert_level(kube, psa, deps[f"llama-8b-{role}"], level)
        if level == "privileged":
            assert "hostPath volumes" in (refused or ""), refused
    assert_level(kube, psa, deps["llama-8b-router"], "restricted")  # the router mounts no cache


# ------------------------------------------------------------------------------------------------ the chart


@pytest.mark.parametrize("values_file", [None, *CI_VALUES], ids=["defaults", *[p.name for p in CI_VALUES]])
def test_chart_operator_pod_is_restricted(kube: client.ApiClient, psa: dict[Level, str],
                                          values_file: Path | None) -> None:
    docs = documents(render(load_values(values_file)))
    deps = [d for d in docs if d["kind"] == "Deployment"]
    assert deps
    for dep in deps:
        assert_level(kube, psa, dep, "restricted")


# ------------------------------------------------------------------- Deployments → ReplicaSets → Pods


def failure(rs: Any) -> str | None:
    for cond in rs.status.conditions or []:
        if cond.type == "ReplicaFailure" and cond.status == "True":
            return str(cond.message)
    return None


def test_controller_manager_creates_the_pods_in_a_restricted_namespace(kube: client.ApiClient,
                                                                      psa: dict[Level, str]) -> None:
    """tcp: every Deployment of the model gets its pods from the real ReplicaSet controller under restricted."""
    ns = psa["restricted"]
    body = model_body("llama-8b-nvlink", ns, kvTransfer={"transport": "tcp"}, aggregated=AGGREGATED)
    kids = build_children(parse_model(body), SETTINGS)
    for obj in kids:
        server_side_apply(kube, obj, field_manager="test")
    want = {o["metadata"]["name"]: o["spec"]["replicas"] for o in kids if o["kind"] == "Deployment"}
    assert all(n > 0 for n in want.values()), want
    apps = client.AppsV1Api(kube)

    def created(seen: dict[str, Any]) -> bool:
        by_dep = {rs.metadata.owner_references[0].name: rs for rs in seen.values()}
        assert not [failure(rs) for rs in by_dep.values() if failure(rs)], [failure(rs) for rs in by_dep.values()]
        return set(by_dep) == set(want) and all((rs.status.replicas or 0) == want[d] for d, rs in by_dep.items())

    watch_until(apps.list_namespaced_replica_set, ns, created)
    pods: list[Any] = client.CoreV1Api(kube).list_namespaced_pod(ns).items
    owners = {p.metadata.owner_references[0].name.rsplit("-", 1)[0] for p in pods}
    assert owners == set(want)


def test_rdma_pods_are_refused_by_a_baseline_namespace(kube: client.ApiClient, psa: dict[Level, str]) -> None:
    """rdma: the ReplicaSet controller cannot create the KV pods where baseline is enforced (IPC_LOCK)."""
    ns = psa["baseline"]
    body = model_body("llama-70b-rdma", ns)
    for obj in build_children(parse_model(body), SETTINGS):
        server_side_apply(kube, obj, field_manager="test")
    apps = client.AppsV1Api(kube)

    def refused(seen: dict[str, Any]) -> bool:
        kv = [rs for rs in seen.values() if rs.metadata.owner_references[0].name in ("llama-70b-prefill",
                                                                                     "llama-70b-decode")]
        return len(kv) == 2 and all(failure(rs) for rs in kv)

    seen = watch_until(apps.list_namespaced_replica_set, ns, refused)
    for rs in seen.values():
        msg = failure(rs)
        if rs.metadata.owner_references[0].name == "llama-70b-router":
            continue
        assert msg is not None and 'violates PodSecurity "baseline:' in msg and "IPC_LOCK" in msg, msg

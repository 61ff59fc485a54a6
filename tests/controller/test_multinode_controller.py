"""Multi-node pools in the controller (issue 19, docs/multinode.md "Group semantics"), on a real apiserver and
kube-controller-manager (its StatefulSet controller creates the groups' pods; there is no kubelet, so the test writes
pod status as a kubelet would: Ready, a container restart).

- the StatefulSet back end's groups are applied, the pool's counts in status are groups (ready only when all pods
  are);
- a group with a restarted member starts over as a whole (every pod deleted and recreated), the others untouched;
- a spec change makes new groups; the old ones stay until the new ones are ready, then go;
- scaling counts groups: replicas 2 → 3 adds one group; with autoscaling on, the autoscaler's recorded decision
  is the count rendered.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from disagg.builders import multinode as mn
from disagg.controller import group_health, groups
from disagg.controller.kubeio import Kube
from disagg.controller.reconcile import Reconciler
from disagg.kube import api_client

from .conftest import TEST_BUILD, listed_children, wait_for

pytestmark = pytest.mark.apiserver

MODEL = "mn"
POOL = {"minReplicas": 1, "maxReplicas": 4, "nodesPerReplica": 2, "gpu": {"count": 1},
        "parallelism": {"data": 2, "expert": True}}
BODY: dict[str, Any] = {
    "apiVersion": "serving.disagg.dev/v1alpha1",
    "kind": "DisaggregatedModel",
    "metadata": {"name": MODEL},
    "spec": {
        "model": {"name": "deepseek-ai/DeepSeek-V2-Lite", "servedName": "dsv2"},
        "prefill": {**POOL, "replicas": 1},
        "decode": {**POOL, "replicas": 2},
        "kvTransfer": {"transport": "tcp"},
        "autoscaling": {"enabled": False},
    },
}
CHILD_KINDS = ("Deployment", "StatefulSet", "Service", "PodDisruptionBudget", "ConfigMap")


def children(rec: Reconciler, ns: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The model's children as the apiserver lists them (the operator's watch cache, here read directly)."""
    return listed_children(rec.kube, ns, MODEL, CHILD_KINDS)


def reconcile(rec: Reconciler, ns: str, trigger: str = "test") -> Any:
    return rec.reconcile(ns, MODEL, lambda: children(rec, ns), trigger=trigger)


def pods(rec: Reconciler, ns: str, role: str = "decode") -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: dict(p) for p in groups.list_pods(rec.kube, ns, MODEL, role)}


def mark(rec: Reconciler, ns: str, pod: dict[str, Any], ready: bool = True, restarts: int = 0) -> None:
    """Write the pod's status as a kubelet would."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
              "containerStatuses": [{"name": "vllm", "ready": ready, "restartCount": restarts, "image": "vllm",
                                     "imageID": "", "state": {"running": {"startedAt": now}}}]}
    rec.kube.request("PATCH", f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}/status",
                     body={"status": status}, content_type="application/merge-patch+json")


def statefulsets(rec: Reconciler, ns: str, role: str = "decode") -> set[str]:
    return {name for (kind, name), obj in children(rec, ns).items()
            if kind == "StatefulSet" and obj["metadata"]["labels"].get(mn.LABEL_POOL) == role}


def pool_status(rec: Reconciler, ns: str, role: str = "decode") -> dict[str, Any]:
    model = rec.kube.get_model(ns, MODEL) or {}
    return dict(((model.get("status") or {}).get("pools") or {}).get(role) or {})


def all_ready(rec: Reconciler, ns: str, role: str, count: int) -> dict[str, dict[str, Any]]:
    """Wait for ``count`` pods of the pool (the StatefulSet controller creates them) and mark each Ready."""
    found = wait_for(lambda: (lambda ps: ps if len(ps) == count else None)(pods(rec, ns, role)), 30,
                     f"{count} {role} pods")
    for pod in found.values():
        if not group_health.pod_ready(pod):
            mark(rec, ns, pod)
    return found


@pytest.fixture
def rec(control_plane) -> Reconciler:
    return Reconciler(Kube(api_client(str(control_plane.kubeconfig))), TEST_BUILD)


def test_groups_restart_replace_and_scale(rec: Reconciler, cluster) -> None:
    ns = cluster.ns
    cluster.create_model(copy.deepcopy(BODY))
    first = reconcile(rec, ns, "create")
    decode_sets = statefulsets(rec, ns)
    assert len(decode_sets) == 4 and len(statefulsets(rec, ns, "prefill")) == 2, first.applied
    assert not [a for a in first.applied if a.startswith("Deployment/") and "router" not in a]
    gen = mn.generation(rec.parse(cluster.model(MODEL)), "decode")
    assert decode_sets == {f"{MODEL}-decode-{gen}-g{g}-n{r}" for g in (0, 1) for r in (0, 1)}

    # not ready until every pod of a group is: one group's leader alone is not a ready replica
    found = wait_for(lambda: (lambda ps: ps if len(ps) == 4 else None)(pods(rec, ns)), 30, "4 decode pods")
    mark(rec, ns, found[f"{MODEL}-decode-{gen}-g0-n0-0"])
    reconcile(rec, ns)
    assert (pool_status(rec, ns)["replicas"], pool_status(rec, ns)["readyReplicas"]) == (2, 0)
    before = all_ready(rec, ns, "decode", 4)
    all_ready(rec, ns, "prefill", 2)
    reconcile(rec, ns)
    assert pool_status(rec, ns)["readyReplicas"] == 2
    assert pool_status(rec, ns)["summary"] == "2/2"

    # a member of group 1 restarted: group 1 starts over (both pods deleted, recreated), group 0 is untouched
    mark(rec, ns, before[f"{MODEL}-decode-{gen}-g1-n1-0"], ready=False, restarts=1)
    reconcile(rec, ns, "Pod MODIFIED")
    assert rec.counters["group_restarts"] == 1

    def recreated() -> dict[str, dict[str, Any]] | None:
        now = pods(rec, ns)
        uids = {n: p["metadata"]["uid"] for n, p in now.items() if not p["metadata"].get("deletionTimestamp")}
        return now if len(uids) == 4 and all(
            (uids[n] != before[n]["metadata"]["uid"]) == ("-g1-" in n) for n in uids) else None

    wait_for(recreated, 30, "group 1's pods recreated, group 0's kept")
    reconcile(rec, ns)
    assert pool_status(rec, ns)["readyReplicas"] == 1  # group 1 is forming again
    all_ready(rec, ns, "decode", 4)
    reconcile(rec, ns)
    assert pool_status(rec, ns)["readyReplicas"] == 2

    # a spec change is a new generation: new groups; the old ones stay until the new ones are ready
    cluster.patch_model(MODEL, {"spec": {"decode": {"extraArgs": ["--max-num-batched-tokens=4096"]}}})
    reconcile(rec, ns, "update")
    new_gen = mn.generation(rec.parse(cluster.model(MODEL)), "decode")
    assert new_gen != gen
    assert statefulsets(rec, ns) == decode_sets | {s.replace(gen, new_gen) for s in decode_sets}
    found = wait_for(lambda: (lambda ps: ps if len(ps) == 8 else None)(pods(rec, ns)), 30, "8 decode pods")
    reconcile(rec, ns)
    assert (pool_status(rec, ns)["replicas"], pool_status(rec, ns)["readyReplicas"]) == (4, 2)
    for name, pod in found.items():
        if new_gen in name and not name.endswith("g1-n1-0"):
            mark(rec, ns, pod)
    reconcile(rec, ns)
    assert len(statefulsets(rec, ns)) == 8  # one new group is not ready yet: the old ones stay
    mark(rec, ns, found[f"{MODEL}-decode-{new_gen}-g1-n1-0"])
    pruned = reconcile(rec, ns)
    assert statefulsets(rec, ns) == {s.replace(gen, new_gen) for s in decode_sets}, pruned.deleted
    assert f"Service/{MODEL}-decode-{gen}-g0" in pruned.deleted

    # scaling counts groups
    cluster.patch_model(MODEL, {"spec": {"decode": {"replicas": 3}}})
    reconcile(rec, ns, "update")
    assert {f"{MODEL}-decode-{new_gen}-g2-n0", f"{MODEL}-decode-{new_gen}-g2-n1"} <= statefulsets(rec, ns)
    assert pool_status(rec, ns)["desiredReplicas"] == 3


def test_autoscaled_multinode_pool_renders_the_recorded_decision(rec: Reconciler, cluster) -> None:
    """With autoscaling on, the autoscaler's record (status.pools.decode.desiredReplicas) is the group count the
    operator renders; nothing else writes a count (a group's StatefulSets have replicas 1)."""
    ns = cluster.ns
    body = copy.deepcopy(BODY)
    body["spec"]["autoscaling"] = {"enabled": True, "prometheus": {"url": "http://127.0.0.1:9"}}
    cluster.create_model(body)
    reconcile(rec, ns, "create")
    assert len(statefulsets(rec, ns)) == 4
    cluster.patch_model_status(MODEL, {"pools": {"decode": {"desiredReplicas": 3}}})
    reconcile(rec, ns, "status")
    sets = statefulsets(rec, ns)
    assert len(sets) == 6 and all(obj["spec"]["replicas"] == 1 for (kind, _), obj in children(rec, ns).items()
                                  if kind == "StatefulSet")


LWS_CRD_BODY: dict[str, Any] = {
    # a minimal stand-in for kubernetes-sigs/lws's CRD (same names, no schema): what the operator reads is its
    # presence, what it writes is accepted as is
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": mn.LWS_CRD},
    "spec": {"group": mn.LWS_GROUP, "scope": "Namespaced",
             "names": {"plural": mn.LWS_PLURAL, "singular": "leaderworkerset", "kind": mn.LWS_KIND},
             "versions": [{"name": mn.LWS_VERSION, "served": True, "storage": True,
                           "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def test_auto_backend_uses_leaderworkerset_when_its_crd_is_installed(rec: Reconciler, cluster) -> None:
    ns = cluster.ns
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    rec.kube.request("POST", crds, body=LWS_CRD_BODY, content_type="application/json")
    try:
        wait_for(lambda: any(c.get("type") == "Established" and c.get("status") == "True" for c in (
            (rec.kube.request("GET", f"{crds}/{mn.LWS_CRD}") or {}).get("status") or {}).get("conditions") or []),
            30, "the LeaderWorkerSet CRD to be established")
        cluster.create_model(copy.deepcopy(BODY))
        reconcile(rec, ns, "create")
        assert rec.settings.lws_installed
        assert statefulsets(rec, ns) == set()
        lws = rec.kube.get("LeaderWorkerSet", ns, f"{MODEL}-decode-lws")
        assert lws is not None
        assert (lws["spec"]["replicas"], lws["spec"]["leaderWorkerTemplate"]["size"]) == (2, 2)
        # its status (the LeaderWorkerSet controller's) gives the pool's counts
        path = f"/apis/{mn.LWS_API_VERSION}/namespaces/{ns}/{mn.LWS_PLURAL}/{MODEL}-decode-lws/status"
        rec.kube.request("PATCH", path,
                         body={"status": {"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2}},
                         content_type="application/merge-patch+json")
        reconcile(rec, ns)
        assert (pool_status(rec, ns)["replicas"], pool_status(rec, ns)["readyReplicas"]) == (2, 1)
    finally:
        rec.kube.request("DELETE", f"{crds}/{mn.LWS_CRD}")

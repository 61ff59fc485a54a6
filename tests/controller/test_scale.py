"""What keeps the operator cheap at hundreds of models (issue 17, docs/operator.md "Scale"): a burst of events for one
model runs one reconcile, and watch events that bring nothing new (a child as the operator last applied or verified
it, the operator's own status patch coming back) run none."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from disagg.controller.kubeio import Kube
from disagg.controller.reconcile import Reconciler, Result
from disagg.kube import api_client

from .conftest import TEST_BUILD, load_example, wait_for

pytestmark = pytest.mark.apiserver

MODEL = "llama-8b"  # docs/examples/llama-8b-nvlink.yaml


def _plain(cluster, obj):
    return cluster.api.sanitize_for_serialization(obj)


def test_a_burst_of_events_for_one_model_runs_one_reconcile(control_plane, cluster):
    rec = Reconciler(Kube(api_client(str(control_plane.kubeconfig))), TEST_BUILD)
    cluster.create_model(load_example("llama-8b-nvlink"))
    assert len(rec.reconcile(cluster.ns, MODEL, {}, trigger="create").applied) == 13
    configmap = next(k.split("/", 1)[1] for k in cluster.children(MODEL) if k.startswith("ConfigMap/"))
    cluster.core.delete_namespaced_config_map(configmap, cluster.ns)
    service = next(v for k, v in cluster.children(MODEL).items() if k.startswith("Service/"))

    results: list[Result] = []
    with rec.lock(cluster.ns, MODEL):  # another reconcile of the model is running
        waiting = threading.Thread(target=lambda: results.append(rec.reconcile(
            cluster.ns, MODEL, {}, trigger="Service MODIFIED",
            event=("Service", service.metadata.name, _plain(cluster, service)))))
        waiting.start()
        wait_for(lambda: (cluster.ns, MODEL) in rec._pending, 10, "the first event's reconcile to queue")
        # the second event joins the queued reconcile and returns at once (the lock is still held here)
        joined = rec.reconcile(cluster.ns, MODEL, {}, trigger="ConfigMap DELETED", event=("ConfigMap", configmap, None))
        assert joined == Result() and rec.counters["coalesced"] == 1
    waiting.join(timeout=30)
    assert not waiting.is_alive()
    # the queued reconcile did the joined event's work: the deleted ConfigMap is back, and reported as restored
    assert results[0].applied == [f"ConfigMap/{configmap}"]
    assert f"ConfigMap/{configmap}" in cluster.children(MODEL)
    assert rec.counters["reconciles"] == 2  # the create and the queued one; the joined event ran none


def test_events_that_bring_nothing_new_run_no_reconcile(control_plane, cluster):
    rec = Reconciler(Kube(api_client(str(control_plane.kubeconfig))), TEST_BUILD)
    cluster.create_model(load_example("llama-8b-nvlink"))
    rec.reconcile(cluster.ns, MODEL, {}, trigger="create")
    # each child as a watch event carries it: the apiserver's JSON (the typed client would drop fields)
    children: dict[str, dict[str, Any]] = {}
    for k in cluster.children(MODEL):
        obj = rec.kube.get(k.split("/")[0], cluster.ns, k.split("/", 1)[1])
        assert obj is not None, k
        children[k] = obj
    pdb = next(v for k, v in children.items() if k.startswith("PodDisruptionBudget/"))
    deployment = children[f"Deployment/{MODEL}-decode"]

    # the ADDED events of the operator's own creates, and later status-only updates of a PDB: no news (Deployments
    # aside: kube-controller-manager may have moved their counts since, which is news for the model's status)
    others = {k: v for k, v in children.items() if not k.startswith("Deployment/")}
    assert not any(rec.filters.child_news(k.split("/")[0], v, "ADDED") for k, v in others.items())
    assert not rec.filters.child_news("PodDisruptionBudget", {**pdb, "status": {"currentHealthy": 7}}, "MODIFIED")
    # someone edits a field (news), a child is deleted (news), a Deployment's counts move (news: status follows)
    edited = {**pdb, "spec": {**pdb["spec"], "minAvailable": 9}}
    assert rec.filters.child_news("PodDisruptionBudget", edited, "MODIFIED")
    assert rec.filters.child_news("PodDisruptionBudget", pdb, "DELETED")
    moved = {**deployment, "status": {**(deployment.get("status") or {}), "readyReplicas": 1}}
    assert rec.filters.child_news("Deployment", moved, "MODIFIED")
    assert not rec.filters.child_news("Deployment", deployment, None)  # kopf's initial listing: the resume handler's

    # the operator's own status patch coming back is no news; another writer's status change is
    model = cluster.model(MODEL)
    assert not rec.filters.model_news(model)
    assert rec.filters.model_news(cluster.patch_model_status(MODEL, {"observed": {"ttftP95Ms": 5.0}}))
    assert rec.counters["events_skipped"] == len(others) + 2

"""Operator upgrades do not restart every GPU pool at once (issue 13, "Day-2 safety").

A new operator version that renders a pool's pod template differently (same spec generation) rolls one model at
a time across the operator: the next model's held rollout starts when the previous model's Deployments have
finished rolling out, or after a bound; a held model shows RolloutPending=True. Changes to the Deployment object
itself (labels) are applied at once, and a change to the user's spec still rolls at once.

The upgrade is simulated the way it happens: the operator is stopped and a new one started whose builders render
differently (an extra env var in the worker container, an extra label on the Deployment).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import watch

from disagg.api.contract import LABEL_MODEL, LABEL_ROLE
from disagg.api.models import DisaggregatedModel
from disagg.builders import BuildSettings, build_children
from disagg.builders.meta import ANNOTATION_TEMPLATE_HASH, stamp_spec_hash
from disagg.controller.clock import FakeClock
from disagg.controller.handlers import _emit
from disagg.controller.kubeio import Kube
from disagg.controller.reconcile import Reconciler
from disagg.controller.upgrade import rolled_out
from disagg.kube import api_client

from .conftest import TEST_BUILD, listed_children, load_example, running_operator, wait_for

pytestmark = pytest.mark.apiserver

MODELS = ("m-a", "m-b", "m-c")
POOLS = ("prefill", "decode")
NEW_ENV = {"name": "DISAGG_NEW_RENDERING", "value": "2"}
NEW_LABEL = ("example.com/rendered-by", "operator-v2")


def new_rendering(dm: DisaggregatedModel, settings: BuildSettings) -> list[dict[str, Any]]:
    """The builders of a newer operator: one more env var in every worker pod, one more Deployment label."""
    objs = build_children(dm, settings)
    for obj in objs:
        if obj["kind"] == "Deployment" and obj["metadata"]["labels"].get(LABEL_ROLE) in POOLS:
            obj["metadata"]["labels"][NEW_LABEL[0]] = NEW_LABEL[1]
            container = obj["spec"]["template"]["spec"]["containers"][0]
            container["env"] = [*container.get("env", []), dict(NEW_ENV)]
            stamp_spec_hash(obj)
    return objs


def operator_with(kubeconfig: str, namespace: str, rec: Reconciler) -> contextlib.AbstractContextManager[Reconciler]:
    """The operator with the test's reconciler, its held models checking their turn every 0.5 s."""
    return running_operator(kubeconfig, namespace, reconciler=rec, upgrade_poll_seconds=0.5)


def reconciler(kubeconfig: str, **kwargs: Any) -> Reconciler:
    return Reconciler(Kube(api_client(kubeconfig)), TEST_BUILD, emit=_emit, **kwargs)


@contextlib.contextmanager
def old_operator(kubeconfig: str, cluster: Any, replicas: int) -> Iterator[None]:
    """The operator before the upgrade, running, with MODELS created (``replicas`` per pool) and reconciled."""
    for name in MODELS:
        cluster.create_model(model(name, replicas))
    with operator_with(kubeconfig, cluster.ns, reconciler(kubeconfig)):
        for name in MODELS:
            wait_for(functools.partial(converged, cluster, name), 30, f"{name} reconciled")
        yield


def model(name: str, replicas: int) -> dict[str, Any]:
    body = load_example("llama-8b-nvlink")
    body["metadata"]["name"] = name
    for pool in POOLS:
        body["spec"][pool].update(replicas=replicas, minReplicas=min(replicas, 1))
    return body


def has_env(dep: Any) -> bool:
    return any(e.name == NEW_ENV["name"] for e in dep.spec.template.spec.containers[0].env or [])


def conditions(cluster: Any, name: str) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (cluster.model(name).get("status") or {}).get("conditions") or []}


def converged(cluster: Any, name: str) -> bool:
    m = cluster.model(name)
    gen = m["metadata"]["generation"]
    return (m.get("status") or {}).get("observedGeneration") == gen and all(
        cluster.deployment(f"{name}-{pool}") is not None for pool in POOLS)


def templates(cluster: Any) -> dict[str, str]:
    return {f"{m}-{p}": cluster.deployment(f"{m}-{p}").metadata.annotations[ANNOTATION_TEMPLATE_HASH]
            for m in MODELS for p in POOLS}


def test_an_operator_upgrade_rolls_one_model_at_a_time(control_plane, cluster):
    """Three models with empty pools (their rollouts finish as soon as the Deployment controller has seen them):
    after the upgrade every model rolls, and in the apiserver's own order of events no model's pods start to
    change before the previous model's Deployments report the rollout finished."""
    kubeconfig = str(control_plane.kubeconfig)
    with old_operator(kubeconfig, cluster, replicas=0):
        wait_for(lambda: all(rolled_out(cluster.api.sanitize_for_serialization(cluster.deployment(f"{m}-{p}")))
                             for m in MODELS for p in POOLS), 30, "initial rollouts finished")
    before = templates(cluster)

    # Watch every Deployment of the namespace from now on: the apiserver's order of changes.
    seen: list[dict[str, Any]] = []
    start = cluster.apps.list_namespaced_deployment(cluster.ns).metadata.resource_version
    w = watch.Watch()
    done = threading.Event()
    broken = threading.Event()

    def follow() -> None:
        try:
            for ev in w.stream(cluster.apps.list_namespaced_deployment, cluster.ns, resource_version=start,
                               timeout_seconds=120):
                seen.append(cluster.api.sanitize_for_serialization(ev["object"]))
                if done.is_set():
                    break
        except Exception:  # noqa: BLE001 - the connection closed by w.stop() at the end, or a watch that broke
            if not done.is_set():
                broken.set()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    rec = reconciler(kubeconfig, build=new_rendering)
    try:
        with operator_with(kubeconfig, cluster.ns, rec):
            wait_for(lambda: all(has_env(cluster.deployment(f"{m}-{p}")) for m in MODELS for p in POOLS), 60,
                     "every model rolled")
            wait_for(lambda: all(conditions(cluster, m)["RolloutPending"]["reason"] == "NoRolloutPending"
                                 for m in MODELS), 30, "no rollout pending")
            wait_for(lambda: [e[2] for e in rec.upgrade_log].count("done") == 3, 30, "three slots released")
    finally:
        done.set()
        w.stop()
        thread.join(10)

    assert not broken.is_set(), "the watch broke before the end: the event order would be incomplete"
    after = templates(cluster)
    assert all(after[k] != before[k] for k in before)
    # Replay the apiserver's event order: when did each model's pods start changing, when had they finished?
    state: dict[str, dict[str, Any]] = {}
    started: dict[str, int] = {}
    finished: dict[str, int] = {}
    for i, obj in enumerate(seen):
        labels = obj["metadata"].get("labels") or {}
        if labels.get(LABEL_ROLE) not in POOLS:
            continue
        state[obj["metadata"]["name"]] = obj
        name = labels[LABEL_MODEL]
        pools = [state.get(f"{name}-{p}") for p in POOLS]
        new = [p is not None and p["metadata"]["annotations"][ANNOTATION_TEMPLATE_HASH]
               != before[p["metadata"]["name"]] for p in pools]
        if any(new):
            started.setdefault(name, i)
        if all(new) and all(rolled_out(p) for p in pools):
            finished.setdefault(name, i)
    assert set(started) == set(finished) == set(MODELS), (started, finished)
    order = sorted(MODELS, key=lambda m: started[m])
    for first, second in itertools.pairwise(order):
        assert finished[first] < started[second], f"{second} started rolling before {first} had finished"
    starts = [e for e in rec.upgrade_log if e[2] == "start"]
    assert [e[1].split("/")[1] for e in starts] == order
    reasons = {m: [e.reason for e in cluster.events(m)] for m in MODELS}
    assert all("OperatorUpgradeRollout" in r for r in reasons.values()), reasons


def test_held_rollouts_wait_for_the_bound_and_a_spec_change_rolls_at_once(control_plane, cluster):
    """Pools that never become ready (no kubelet here, as a cluster short of GPUs): the first model's rollout
    never finishes, so the others stay held — with RolloutPending=True and the new Deployment label applied at
    once — until the bound passes on the operator's clock. A user's spec change to a held model rolls it at once."""
    kubeconfig = str(control_plane.kubeconfig)
    with old_operator(kubeconfig, cluster, replicas=1):
        pass  # reconciled by the old operator, which then stops
    before = templates(cluster)

    clock = FakeClock()
    rec = reconciler(kubeconfig, build=new_rendering, clock=clock, upgrade_bound=600)
    with operator_with(kubeconfig, cluster.ns, rec):
        def rolled() -> list[str]:
            return [m for m in MODELS if all(has_env(cluster.deployment(f"{m}-{p}")) for p in POOLS)]

        def pending() -> list[str]:
            return [m for m in MODELS if conditions(cluster, m).get("RolloutPending", {}).get("status") == "True"]

        wait_for(lambda: len(rolled()) == 1 and len(pending()) == 2, 30, "one model rolling, two held")
        first = rolled()[0]
        held = pending()
        assert conditions(cluster, first)["RolloutPending"]["reason"] == "OperatorUpgradeRolling"
        for name in held:
            cond = conditions(cluster, name)["RolloutPending"]
            assert cond["reason"] == "OperatorUpgrade" and first in cond["message"], cond
            for pool in POOLS:
                dep = cluster.deployment(f"{name}-{pool}")
                assert not has_env(dep)  # the pods are not touched ...
                assert dep.metadata.annotations[ANNOTATION_TEMPLATE_HASH] == before[f"{name}-{pool}"]
                assert dep.metadata.labels.get(NEW_LABEL[0]) == NEW_LABEL[1]  # ... the Deployment object is
        assert "OperatorUpgradeRollout" in [e.reason for e in cluster.events(first)]

        # A user's spec change to a held model rolls it at once (its own change and the new rendering).
        changed, waiting = held
        cluster.patch_model(changed, {"spec": {"engine": {"env": [{"name": "USER_KNOB", "value": "1"}]}}})
        wait_for(lambda: all((d := cluster.deployment(f"{changed}-{p}")) and has_env(d) and any(
            e.name == "USER_KNOB" for e in d.spec.template.spec.containers[0].env) for p in POOLS), 30,
            "spec change rolled at once")
        wait_for(lambda: conditions(cluster, changed)["RolloutPending"]["status"] == "False", 30, "not pending")
        assert waiting in pending() and not has_env(cluster.deployment(f"{waiting}-prefill"))

        clock.advance(601)  # the first model's rollout is still not finished: the bound lets the next one go
        wait_for(lambda: waiting in rolled(), 30, "the held model rolls after the bound")
        wait_for(lambda: not pending(), 30, "nothing pending")
    log = [(e[1].split("/")[1], e[2]) for e in rec.upgrade_log]
    assert log[:3] == [(first, "start"), (first, "expired"), (waiting, "start")], log


def model_children(rec: Reconciler, ns: str, name: str) -> dict[tuple[str, str], dict[str, Any]]:
    return listed_children(rec.kube, ns, name, ("ServiceAccount", "ConfigMap", "Service", "Role", "RoleBinding",
                                                "PodDisruptionBudget", "Deployment"))


def has_user_knob(dep: Any) -> bool:
    return any(e.name == "USER_KNOB" for e in dep.spec.template.spec.containers[0].env or [])


@pytest.mark.parametrize("stale_as", ["event", "cache"])
def test_a_stale_copy_never_undoes_a_held_models_spec_change(control_plane, cluster, stale_as):
    """Reconciles called in an order a loaded operator runs them in: a user's spec change rolls a held model's pools,
    then a reconcile sees a copy of a pool Deployment from before that roll (a Deployment event queued before it,
    or a watch cache that has not caught up). Its old pod template must not be taken for the live one to hold: the
    user's change stays rolled and the model shows no pending rollout. (Before: the stale template was applied
    back, with the new compat-hash label, and held until the bound.)"""
    kubeconfig = str(control_plane.kubeconfig)
    with old_operator(kubeconfig, cluster, replicas=1):
        pass
    ns = cluster.ns
    rec = reconciler(kubeconfig, build=new_rendering, clock=FakeClock(), upgrade_bound=600)
    for name in MODELS:
        rec.reconcile(ns, name, functools.partial(model_children, rec, ns, name), trigger="resume")
    first = rec.upgrade_log[0][1].split("/")[1]
    changed = next(m for m in MODELS if m != first)
    assert conditions(cluster, changed)["RolloutPending"]["status"] == "True"
    stale = model_children(rec, ns, changed)  # the held pools: old pod templates

    cluster.patch_model(changed, {"spec": {"engine": {"env": [{"name": "USER_KNOB", "value": "1"}]}}})
    rec.reconcile(ns, changed, functools.partial(model_children, rec, ns, changed), trigger="update")
    for pool in POOLS:
        assert has_user_knob(cluster.deployment(f"{changed}-{pool}"))

    pool = f"{changed}-prefill"
    if stale_as == "event":
        rec.reconcile(ns, changed, functools.partial(model_children, rec, ns, changed), trigger="Deployment MODIFIED",
                      event=("Deployment", pool, stale[("Deployment", pool)]))
    else:
        behind = {**model_children(rec, ns, changed), ("Deployment", pool): stale[("Deployment", pool)]}
        rec.reconcile(ns, changed, behind, trigger="held-rollout")
    for p in POOLS:
        dep = cluster.deployment(f"{changed}-{p}")
        assert has_user_knob(dep) and has_env(dep), p
    assert conditions(cluster, changed)["RolloutPending"]["status"] == "False"

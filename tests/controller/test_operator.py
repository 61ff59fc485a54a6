"""The operator against a real kube-apiserver + kube-controller-manager (garbage collector, Deployment controller).

There is no kubelet or scheduler in the fixture: pods never become Ready, so every pool stays *starting*
(readyReplicas 0, never ready since creation): reason Starting, condition Progressing, no Warning.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from disagg.api import contract as c
from disagg.api.models import API_VERSION, KIND
from disagg.kube import FIELD_MANAGER

from .conftest import load_example, scale, step_result, wait_for

pytestmark = pytest.mark.apiserver

EXPECTED_KINDS = ["ConfigMap", "Deployment", "PodDisruptionBudget", "Role", "RoleBinding", "Service",
                  "ServiceAccount"]


def _expected_children(model: str, roles: tuple[str, ...] = ("prefill", "decode")) -> set[str]:
    out = {f"{k}/{model}-router" for k in ("ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service",
                                           "Deployment", "PodDisruptionBudget")}
    for role in roles:
        out |= {f"Deployment/{model}-{role}", f"Service/{model}-{role}", f"PodDisruptionBudget/{model}-{role}"}
    return out


def _conditions(model: dict) -> dict[str, dict]:
    return {cond["type"]: cond for cond in (model.get("status") or {}).get("conditions") or []}


def _converged(cluster, name: str, generation: int = 1):
    def check():
        m = cluster.model(name)
        st = m.get("status") or {}
        return st.get("observedGeneration") == generation and _conditions(m).get("Ready") and m
    return wait_for(check, 30, f"{name} status for generation {generation}")


def _router_config(cluster, model: str) -> dict:
    cm = cluster.core.read_namespaced_config_map(f"{model}-router", cluster.ns)
    return c.RouterConfig.model_validate(yaml.safe_load(cm.data[c.ROUTER_CONFIG_KEY])).model_dump(by_alias=True,
                                                                                                  mode="json")


def _model_with_condition(cluster, name: str, condition: str) -> dict[str, Any] | None:
    """The model once its status has the condition, else None (a wait_for check)."""
    m = cluster.model(name)
    return m if condition in _conditions(m) else None


def _event_reasons(cluster, name: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for e in cluster.events(name):
        out.setdefault(e.reason, []).append(f"{e.type}: {e.message}")
    return out


def test_examples_become_children_with_owner_refs_and_status(operator, cluster):
    """The three docs/examples: every child exists, owned, labelled, applied by our field manager; status set."""
    names = {}
    for example in ("llama-70b-rdma", "llama-8b-nvlink", "aggregated-rollback"):
        body = load_example(example)
        names[example] = body["metadata"]["name"]
        cluster.create_model(body)

    for name in names.values():
        expected = _expected_children(name)
        def children(name: str = name, expected: set[str] = expected) -> dict[str, Any] | None:
            k = cluster.children(name)
            return k if set(k) >= expected else None

        kids = wait_for(children, 30, f"{name} children")
        assert set(kids) == expected
        dm = cluster.model(name)
        for ref, obj in kids.items():
            owners = obj.metadata.owner_references
            assert owners and len(owners) == 1, ref
            o = owners[0]
            assert (o.api_version, o.kind, o.name, o.uid, o.controller, o.block_owner_deletion) == (
                API_VERSION, KIND, name, dm["metadata"]["uid"], True, True), ref
            labels = obj.metadata.labels
            assert labels[c.LABEL_MODEL] == name and labels[c.LABEL_MANAGED_BY] == c.MANAGED_BY, ref
            assert labels[c.LABEL_ROLE] in ("prefill", "decode", "router"), ref
            assert any(mf.manager == FIELD_MANAGER and mf.operation == "Apply"
                       for mf in obj.metadata.managed_fields), ref

        prefill = cluster.deployment(f"{name}-prefill")
        decode = cluster.deployment(f"{name}-decode")
        # Generation isolation: equal compat hash across pools, on the Deployment and on the pods.
        assert prefill.metadata.labels[c.LABEL_COMPAT] == decode.metadata.labels[c.LABEL_COMPAT]
        assert prefill.spec.template.metadata.labels[c.LABEL_COMPAT] == prefill.metadata.labels[c.LABEL_COMPAT]

        m = _converged(cluster, name)
        conds = _conditions(m)
        assert all(cond["observedGeneration"] == 1 for cond in conds.values())
        assert conds["DecodeReady"]["status"] == "False" and conds["DecodeReady"]["reason"] == "Starting"
        assert conds["Ready"]["status"] == "False" and conds["Ready"]["reason"].endswith("Starting")
        assert conds["RouterReady"]["reason"] == "Starting"
        assert conds["Progressing"]["status"] == "True" and conds["Progressing"]["reason"] == "PoolStarting"
        pools = m["status"]["pools"]
        assert pools["decode"]["readyReplicas"] == 0 and pools["decode"]["starting"] is True
        assert pools["decode"]["summary"] == f"0/{m['spec']['decode']['replicas']}"
        # starting is not failing: no Warning Event for it
        assert not [e for e in cluster.events(name) if e.type == "Warning" and e.reason in ("NotReady", "Starting")]

    # Prefill pool: the 8B example needs it (Auto → Disaggregated); the rollback example pins Aggregated.
    llama8b = cluster.model("llama-8b")
    assert _conditions(llama8b)["PrefillReady"]["reason"] == "Starting"
    assert llama8b["status"]["pools"]["prefill"]["starting"] is True
    assert _router_config(cluster, "llama-8b")["prefillStarting"] is True  # the router keeps requests local
    rollback = cluster.model("qwen3-32b")
    assert rollback["status"]["activeMode"] == "Aggregated"
    assert _conditions(rollback)["PrefillReady"]["reason"] == "NotRequired"
    # KV transfer health is measured (by the autoscaler, from Prometheus), never set from the configuration
    kv = _conditions(rollback)["KVTransferHealthy"]
    assert (kv["status"], kv["reason"]) == ("Unknown", "NotMeasured") and "TCP" in kv["message"]
    kv = _conditions(cluster.model("llama-70b"))["KVTransferHealthy"]
    assert (kv["status"], kv["reason"]) == ("Unknown", "AwaitingMetrics")
    for name in names.values():
        conds = _conditions(cluster.model(name))
        assert conds["VLLMVersionKnown"]["observedGeneration"] == 1
        assert conds["RolloutPending"]["reason"] == "NoRolloutPending"
        assert conds["PodSecurity"]["reason"] == "NotEnforced"  # the test namespace has no Pod Security label
    assert _router_config(cluster, "qwen3-32b")["activeMode"] == "Aggregated"
    assert _router_config(cluster, "llama-8b")["activeMode"] == "Disaggregated"
    wait_for(lambda: "SlowKVTransport" in _event_reasons(cluster, "qwen3-32b"), 15, "SlowKVTransport event")

    # The router may read EndpointSlices, pods and ConfigMaps in its namespace, nothing else.
    role = cluster.rbac.read_namespaced_role("llama-70b-router", cluster.ns)
    granted = {(g, r) for rule in role.rules for g in rule.api_groups for r in rule.resources}
    assert granted == {("discovery.k8s.io", "endpointslices"), ("", "pods"), ("", "configmaps")}
    assert all(set(rule.verbs) == {"get", "list", "watch"} for rule in role.rules)



def test_drift_is_corrected_and_spec_changes_follow(operator, cluster):
    cluster.create_model(load_example("llama-8b-nvlink"))
    _converged(cluster, "llama-8b")
    ns = cluster.ns

    # A deleted child comes back.
    old_uid = cluster.core.read_namespaced_service("llama-8b-router", ns).metadata.uid
    cluster.core.delete_namespaced_service("llama-8b-router", ns)
    wait_for(lambda: (s := _get(lambda: cluster.core.read_namespaced_service("llama-8b-router", ns)))
             and s.metadata.uid != old_uid, 20, "router Service recreated")
    cluster.core.delete_namespaced_config_map("llama-8b-router", ns)
    wait_for(lambda: _get(lambda: cluster.core.read_namespaced_config_map("llama-8b-router", ns)), 20,
             "router ConfigMap recreated")

    # An edited field the operator sets is reverted (another field manager, e.g. kubectl edit).
    image = cluster.deployment("llama-8b-decode").spec.template.spec.containers[0].image
    cluster.apps.patch_namespaced_deployment("llama-8b-decode", ns, {"spec": {"template": {"spec": {
        "containers": [{"name": "vllm", "image": "evil/vllm:latest"}]}}}})
    wait_for(lambda: cluster.deployment("llama-8b-decode").spec.template.spec.containers[0].image
             == image != "evil/vllm:latest", 20, "image reverted")

    # kubectl scale is reverted while autoscaling is off (spec replicas win), with a Warning Event.
    cluster.apps.patch_namespaced_deployment_scale("llama-8b-decode", ns, {"spec": {"replicas": 3}})
    wait_for(lambda: cluster.deployment("llama-8b-decode").spec.replicas == 1, 20, "replicas reverted")
    reasons = wait_for(lambda: r if "ReplicasReverted" in (r := _event_reasons(cluster, "llama-8b")) else None, 15,
                       "ReplicasReverted event")
    assert "spec.decode.replicas" in reasons["ReplicasReverted"][0]
    assert "Restored" in reasons

    # Spec changes reach the children: replicas, image (→ new compat hash, still equal across pools), a new pool.
    old_hash = cluster.deployment("llama-8b-prefill").metadata.labels[c.LABEL_COMPAT]
    cluster.patch_model("llama-8b", {"spec": {"decode": {"replicas": 2},
                                              "engine": {"image": "vllm/vllm-openai:v0.18.0"},
                                              "aggregated": {"replicas": 1}}})
    wait_for(lambda: cluster.deployment("llama-8b-decode").spec.replicas == 2, 20, "decode replicas 2")
    prefill = wait_for(lambda: (d := cluster.deployment("llama-8b-prefill"))
                       and d.spec.template.spec.containers[0].image.endswith("v0.18.0") and d, 20, "new image")
    decode = cluster.deployment("llama-8b-decode")
    assert prefill.metadata.labels[c.LABEL_COMPAT] != old_hash
    assert prefill.metadata.labels[c.LABEL_COMPAT] == decode.metadata.labels[c.LABEL_COMPAT]
    assert "--shutdown-timeout" in prefill.spec.template.spec.containers[0].args  # vLLM ≥ 0.18 knows the flag
    aggregated = wait_for(lambda: cluster.deployment("llama-8b-aggregated"), 20, "aggregated pool")
    assert "--kv-transfer-config" not in aggregated.spec.template.spec.containers[0].args
    m = _converged(cluster, "llama-8b", generation=2)
    assert m["status"]["pools"]["decode"]["desiredReplicas"] == 2
    assert "aggregated" in m["status"]["pools"]
    assert _router_config(cluster, "llama-8b")["pools"]["aggregated"]["service"] == "llama-8b-aggregated"

    # Removing the optional pool prunes its Deployment, Service and PDB.
    cluster.patch_model("llama-8b", {"spec": {"aggregated": None}})
    wait_for(lambda: set(cluster.children("llama-8b")) == _expected_children("llama-8b"), 20, "aggregated pruned")
    m = _converged(cluster, "llama-8b", generation=3)
    assert "aggregated" not in m["status"]["pools"]


def test_status_inputs_reach_router_and_replicas(operator, cluster):
    """The mode controller's activeMode reaches the router ConfigMap; with autoscaling on, the autoscaler's
    decisions (recorded in status, written through /scale) own the Deployment's replicas, not spec replicas."""
    from dataclasses import replace

    from disagg.api.models import DisaggregatedModel
    from disagg.api.status import RoleMoves
    from disagg.controller.autoscaler import Autoscaler
    from disagg.controller.clock import FakeClock

    body = load_example("llama-70b-rdma")  # autoscaling enabled, mode Auto
    cluster.create_model(body)
    _converged(cluster, "llama-70b")
    assert cluster.deployment("llama-70b-prefill").spec.replicas == 2  # initial: spec.prefill.replicas

    # the predictive autoscaler's role moves, recorded as its tick records them, reach the router as activeMode does
    # (and leave it while the model is held aggregated)
    events: list[tuple[str, str, str]] = []
    mover = Autoscaler(kube=operator.kube, emit=lambda _body, *ev: events.append(ev), clock=FakeClock())
    body = cluster.model("llama-70b")
    dm = DisaggregatedModel.model_validate({k: v for k, v in body.items() if k != "status"})
    mover.apply(body, dm, replace(step_result(body), role_moves=RoleMoves(prefill_to_decode=1, reason="decode short")),
                "2026-12-06T00:00:00Z")
    wait_for(lambda: (_router_config(cluster, "llama-70b")["roleMoves"] or {}).get("prefillToDecode") == 1, 20,
             "router role moves")
    assert cluster.model("llama-70b")["status"]["roleMoves"]["reason"] == "decode short"
    assert events == [("Normal", "RolesMoved", "prefill→decode 1, decode→prefill 0: decode short")]
    cluster.patch_model_status("llama-70b", {"activeMode": "Aggregated", "modeReason": "kv transfer failures"})
    wait_for(lambda: _router_config(cluster, "llama-70b")["activeMode"] == "Aggregated", 20, "router mode flip")
    assert _router_config(cluster, "llama-70b")["roleMoves"] is None
    m = cluster.model("llama-70b")
    assert m["status"]["activeMode"] == "Aggregated"  # the operator does not fight the mode controller in Auto
    assert _conditions(m)["PrefillReady"]["reason"] == "Starting"

    scaler = Autoscaler(kube=operator.kube, emit=lambda *_: None, clock=FakeClock())
    scale(scaler, cluster, "llama-70b", "prefill", 4, "TTFT p95 above SLO")
    wait_for(lambda: cluster.deployment("llama-70b-prefill").spec.replicas == 4, 20, "autoscaled replicas")
    cluster.patch_model("llama-70b", {"spec": {"prefill": {"replicas": 1}}})
    _converged(cluster, "llama-70b", generation=2)
    dep = cluster.deployment("llama-70b-prefill")
    assert dep.spec.replicas == 4  # spec replicas are only the initial count
    owners = {mf.manager for mf in dep.metadata.managed_fields
              if "f:replicas" in (mf.fields_v1 or {}).get("f:spec", {})}
    assert owners == {"disagg-autoscaler"}  # one owner: the operator's apply no longer carries the field
    last = cluster.model("llama-70b")["status"]["pools"]["prefill"]["lastScale"]
    assert (last["from"], last["to"], last["reason"]) == (2, 4, "TTFT p95 above SLO")


def test_restart_makes_no_writes_and_no_duplicates(start_operator, cluster):
    with start_operator():
        cluster.create_model(load_example("llama-8b-nvlink"))
        _converged(cluster, "llama-8b")
        wait_for(lambda: len(cluster.children("llama-8b")) == 13, 20, "children")

        before = _quiescent(cluster, "llama-8b")  # the Deployment controller has finished its status updates
    dm_rv = before.pop("model")

    with start_operator() as rec:
        wait_for(lambda: rec.counters["reconciles"] >= 1, 30, "resume reconcile")
        after = _quiescent(cluster, "llama-8b")  # and nothing written while the new operator keeps running
        assert rec.counters["applies"] == 0 and rec.counters["deletes"] == 0
        assert rec.counters["status_patches"] == 0
    assert after.pop("model") == dm_rv
    assert after == before


def _versions(cluster, name: str) -> dict[str, str]:
    out = {ref: obj.metadata.resource_version for ref, obj in cluster.children(name).items()}
    out["model"] = cluster.model(name)["metadata"]["resourceVersion"]
    return out


def _quiescent(cluster, name: str, quiet: float = 2.0, timeout: float = 30.0) -> dict[str, str]:
    """Wait until neither the model nor its children change for `quiet` seconds; their resourceVersions."""
    last, since = _versions(cluster, name), time.monotonic()

    def unchanged_for_quiet() -> dict[str, str] | None:
        nonlocal last, since
        now = _versions(cluster, name)
        if now != last:
            last, since = now, time.monotonic()
            return None
        return now if time.monotonic() - since >= quiet else None

    return wait_for(unchanged_for_quiet, timeout, f"{name} and its children to stay unchanged for {quiet}s",
                    interval=0.25)


def test_unsatisfiable_spec_is_reported_and_builds_nothing(operator, cluster):
    body = load_example("llama-8b-nvlink")
    name = "a" * 50 + "-too-long"  # valid object name, but "<name>-prefill" exceeds a Service name's 63 characters
    body["metadata"]["name"] = name
    cluster.create_model(body)
    m = wait_for(lambda: _model_with_condition(cluster, name, "Ready"), 30, "Ready condition")
    ready = _conditions(m)["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert "metadata.name" in ready["message"] and "63" in ready["message"]
    assert m["status"]["observedGeneration"] == 1
    wait_for(lambda: "InvalidSpec" in _event_reasons(cluster, name), 15, "InvalidSpec event")
    assert cluster.children(name) == {}

    # A free-form field the apiserver refuses (here an invalid toleration) is reported too, with the object.
    body = load_example("llama-8b-nvlink")
    body["spec"]["decode"]["tolerations"] = [{"key": "gpu", "operator": "Bogus"}]
    cluster.create_model(body)
    m = wait_for(lambda: _model_with_condition(cluster, "llama-8b", "Ready"), 30, "Ready")
    ready = _conditions(m)["Ready"]
    assert ready["reason"] == "ApplyFailed" and "Deployment/llama-8b-decode" in ready["message"]
    assert cluster.deployment("llama-8b-decode") is None


def _get(fn):
    from kubernetes.client import ApiException

    try:
        return fn()
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_render_matches_what_the_operator_applies(operator, cluster):
    """`disagg render` prints the same manifests the operator applies (modulo owner references)."""
    from disagg.builders import build_children, parse_model

    body = load_example("llama-8b-nvlink")
    cluster.create_model(body)
    _converged(cluster, "llama-8b")
    rendered = {f"{o['kind']}/{o['metadata']['name']}": o
                for o in build_children(parse_model({**body, "metadata": {**body["metadata"],
                                                                          "namespace": cluster.ns}}),
                                        operator.settings)}
    live = cluster.children("llama-8b")
    assert set(rendered) == set(live)
    dep = live["Deployment/llama-8b-prefill"]
    assert dep.spec.template.spec.containers[0].args == rendered["Deployment/llama-8b-prefill"]["spec"]["template"][
        "spec"]["containers"][0]["args"]
    kv = json.loads(dep.spec.template.spec.containers[0].args[dep.spec.template.spec.containers[0].args.index(
        "--kv-transfer-config") + 1])
    assert kv == {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}


def test_deleting_the_model_garbage_collects_children(operator, cluster):
    """Owner references + the real garbage collector of the fixture's kube-controller-manager (it notices a new
    CRD on its periodic discovery resync, so this test runs last and its wait is generous)."""
    cluster.create_model(load_example("llama-8b-nvlink"))
    cluster.create_model(load_example("aggregated-rollback"))
    _converged(cluster, "llama-8b")
    wait_for(lambda: set(cluster.children("llama-8b")) == _expected_children("llama-8b"), 20, "children")
    cluster.delete_model("llama-8b")
    wait_for(lambda: not cluster.children("llama-8b"), 90, "llama-8b children garbage-collected")
    assert set(cluster.children("qwen3-32b")) == _expected_children("qwen3-32b")  # the other model is untouched
    assert not [e for e in cluster.events("llama-8b") if e.reason == "Restored"]  # GC is not mistaken for drift


def test_autoscaler_daemon_is_wired_for_models_with_prometheus(start_operator, cluster):
    """Models naming a Prometheus get the autoscaler daemon (and kopf's finalizer, removed on deletion); others
    get neither. Prometheus is unreachable here: the loop holds and reports SLOMet Unknown."""
    with start_operator(autoscaler=True):
        body = load_example("llama-70b-rdma")
        body["spec"]["autoscaling"]["prometheus"] = {"url": "http://127.0.0.1:9", "timeoutSeconds": 1}
        body["spec"]["autoscaling"]["intervalSeconds"] = 5
        cluster.create_model(body)
        cluster.create_model(load_example("llama-8b-nvlink"))
        m = wait_for(lambda: _model_with_condition(cluster, "llama-70b", "SLOMet"), 30, "SLOMet")
        assert _conditions(m)["SLOMet"]["status"] == "Unknown"
        assert "serving.disagg.dev/autoscaler" in m["metadata"].get("finalizers", [])
        assert cluster.deployment("llama-70b-prefill").spec.replicas == 2  # no metrics: no scaling
        assert not cluster.model("llama-8b")["metadata"].get("finalizers")
        cluster.delete_model("llama-70b")
        wait_for(lambda: _get(lambda: cluster.model("llama-70b")) is None, 30, "model deleted (finalizer released)")

"""Pure parts of the controller: drift comparison and status computation (no apiserver)."""

from __future__ import annotations

import copy

import yaml

from disagg.builders import build_children, parse_model
from disagg.controller import status as st
from disagg.controller.diff import covers, drifted_fields, why_apply

from .conftest import EXAMPLES


def _dm(example: str = "llama-8b-nvlink", **status):
    body = yaml.safe_load(EXAMPLES[example].read_text())
    body["metadata"].update(namespace="ns", uid="u", generation=1)
    if status:
        body["status"] = status
    return parse_model(body)


def _deployment(replicas: int, ready: int) -> dict:
    return {"spec": {"replicas": replicas}, "status": {"replicas": replicas, "readyReplicas": ready}}


def test_covers_ignores_defaults_and_normalisation():
    desired = {"spec": {"replicas": 1, "flag": False, "empty": {},
                        "items": [{"name": "a", "limits": {"cpu": "1000m"}}]}}
    live = {"spec": {"replicas": 1, "extra": "x", "items": [{"name": "a", "protocol": "TCP", "limits": {"cpu": "1"}}]}}
    assert covers(live, desired)
    assert not covers({"spec": {**live["spec"], "replicas": 3}}, desired)
    assert not covers({"spec": {**live["spec"], "items": []}}, desired)
    assert drifted_fields(desired, {"spec": {**live["spec"], "replicas": 3}}) == ["spec.replicas"]


def test_why_apply():
    obj = next(o for o in build_children(_dm()) if o["kind"] == "Deployment")
    live = copy.deepcopy(obj)
    live["status"] = {"replicas": 1}
    live["metadata"]["resourceVersion"] = "5"
    assert why_apply(obj, None) == "missing"
    assert why_apply(obj, live) is None
    live["spec"]["replicas"] = 7
    assert why_apply(obj, live) == "drifted"
    live["metadata"]["annotations"]["serving.disagg.dev/spec-hash"] = "old"
    assert why_apply(obj, live) == "changed"


def _failed_deployment(replicas: int) -> dict:
    """A Deployment whose rollout completed (all replicas were available) and that now has none ready."""
    return {"metadata": {"generation": 3}, "spec": {"replicas": replicas},
            "status": {"observedGeneration": 3, "replicas": replicas, "updatedReplicas": replicas, "readyReplicas": 0,
                       "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]}}


def test_status_conditions_and_pools():
    dm = _dm()
    deps = {"prefill": _deployment(1, 0), "decode": _deployment(1, 1), "router": _deployment(1, 1)}
    out = st.desired_status(dm, {}, deps, 1, now="T0")
    conds = {c["type"]: c for c in out["conditions"]}
    # never ready since creation: starting, not failing
    assert conds["PrefillReady"]["status"] == "False" and conds["PrefillReady"]["reason"] == "Starting"
    assert conds["DecodeReady"]["reason"] == "AllReplicasReady"
    assert conds["Ready"] == {"type": "Ready", "status": "False", "reason": "PrefillStarting", "observedGeneration": 1,
                              "message": conds["PrefillReady"]["message"], "lastTransitionTime": "T0"}
    assert conds["Progressing"]["status"] == "True" and conds["Progressing"]["reason"] == "PoolStarting"
    assert conds["Progressing"]["observedGeneration"] == 1 and "prefill" in conds["Progressing"]["message"]
    assert out["pools"]["prefill"] == {"replicas": 1, "readyReplicas": 0, "desiredReplicas": 1, "summary": "0/1",
                                       "starting": True}
    assert out["pools"]["decode"]["starting"] is False
    assert out["activeMode"] == "Disaggregated" and out["modeSince"] == "T0"

    deps["prefill"] = _deployment(1, 1)
    later = st.desired_status(dm, out, deps, 1, now="T1")
    conds2 = {c["type"]: c for c in later["conditions"]}
    assert conds2["Ready"]["status"] == "True" and conds2["Ready"]["lastTransitionTime"] == "T1"
    assert conds2["Progressing"]["status"] == "False" and conds2["Progressing"]["reason"] == "PoolsStarted"
    assert conds2["DecodeReady"]["lastTransitionTime"] == "T0"  # unchanged status keeps its transition time
    patch = st.status_patch(out, later)
    assert "activeMode" not in patch
    assert patch["pools"] == {"prefill": {"readyReplicas": 1, "summary": "1/1", "starting": False}}
    merged = {**out, **later}
    assert st.status_patch(merged, st.desired_status(dm, merged, deps, 1, now="T2")) == {}

    # ready once, then every replica lost (rollout long complete): failing, not starting
    deps["prefill"] = _failed_deployment(1)
    failed = st.desired_status(dm, merged, deps, 1, now="T3")
    conds3 = {c["type"]: c for c in failed["conditions"]}
    assert failed["pools"]["prefill"]["starting"] is False
    assert conds3["PrefillReady"]["reason"] == "NoReplicasReady" and conds3["Ready"]["reason"] == "PrefillNotReady"
    assert conds3["Progressing"]["status"] == "False"


def test_starting_rule():
    ready_before = {"starting": False, "readyReplicas": 2, "desiredReplicas": 2}
    failed = _failed_deployment(2)
    assert st.pool_starting(None, 2, None)  # not created yet
    assert st.pool_starting(failed, 2, None)  # never observed: not ready since creation
    assert not st.pool_starting(failed, 0, None)  # nothing wanted
    assert not st.pool_starting(failed, 2, ready_before)  # was ready, lost every replica: failing
    assert st.pool_starting(failed, 2, {"starting": True, "readyReplicas": 0, "desiredReplicas": 2})  # still loading
    assert st.pool_starting(failed, 2, {"starting": False, "readyReplicas": 0, "desiredReplicas": 0})  # from zero
    rolling = copy.deepcopy(failed)
    rolling["metadata"]["generation"] = 4  # a new generation the Deployment controller has not rolled out yet
    assert st.pool_starting(rolling, 2, ready_before)
    rolling["status"].update(observedGeneration=4, updatedReplicas=1)  # rolling: new pods not all there yet
    assert st.pool_starting(rolling, 2, ready_before)
    assert not st.pool_starting(_deployment(2, 1), 2, None)  # one ready replica: serving
    deadline = copy.deepcopy(failed)
    deadline["status"]["conditions"] = [{"type": "Progressing", "status": "False",
                                         "reason": "ProgressDeadlineExceeded"}]
    assert not st.pool_starting(deadline, 2, {"starting": True})  # the progress deadline bounds starting


def test_starting_pool_raises_no_warning():
    """A pool that starts (scale from zero) sets Ready False with a Normal event; a failing pool warns."""
    from disagg.controller.reconcile import Reconciler

    events: list[tuple[str, str]] = []
    rec = Reconciler(kube=None, emit=lambda _obj, type_, reason, _msg: events.append((type_, reason)))  # type: ignore[arg-type]
    dm = _dm()
    ok = {"prefill": _deployment(1, 1), "decode": _deployment(1, 1), "router": _deployment(1, 1)}
    serving = st.desired_status(dm, {}, ok, 1, now="T0")
    starting = st.desired_status(dm, serving, {**ok, "prefill": _deployment(1, 0) | {"metadata": {"generation": 2}}},
                                 1, now="T1")
    rec._report_transitions({"metadata": {}}, serving, starting)
    assert events == [("Normal", "Starting")]
    events.clear()
    failing = st.desired_status(dm, serving, {**ok, "prefill": _failed_deployment(1)}, 1, now="T1")
    rec._report_transitions({"metadata": {}}, serving, failing)
    assert events == [("Warning", "NotReady")]


def test_mode_controller_owns_active_mode_in_auto_and_foreign_conditions_are_kept():
    current = {"activeMode": "Aggregated", "modeReason": "kv transfer failing", "conditions": [
        {"type": "FallbackActive", "status": "True", "reason": "X", "message": "", "lastTransitionTime": "T"},
        {"type": "KVTransferHealthy", "status": "False", "reason": "TransferFailures", "message": "",
         "lastTransitionTime": "T"}]}
    dm = _dm(activeMode="Aggregated")
    out = st.desired_status(dm, current, {"prefill": None, "decode": None, "router": None}, 1, now="T0")
    assert "activeMode" not in out
    conds = {c["type"]: c for c in out["conditions"]}
    assert conds["FallbackActive"]["reason"] == "X"
    assert conds["KVTransferHealthy"]["reason"] == "TransferFailures"  # set by the mode controller, kept
    assert conds["PrefillReady"]["reason"] == "DeploymentMissing"
    # Aggregated in force: Ready does not need the prefill pool
    assert conds["Ready"]["reason"] == "DecodeNotReady"


def test_pinned_mode_and_tcp_warning():
    dm = _dm("aggregated-rollback")
    out = st.desired_status(dm, {"activeMode": "Disaggregated", "modeReason": "whatever"},
                            {"prefill": _deployment(0, 0), "decode": _deployment(4, 4), "router": _deployment(1, 1)},
                            3, now="T0")
    assert (out["activeMode"], out["modeReason"]) == ("Aggregated", st.PINNED_REASON)
    conds = {c["type"]: c for c in out["conditions"]}
    assert conds["PrefillReady"]["reason"] == "NotRequired" and conds["Ready"]["status"] == "True"
    assert conds["KVTransferHealthy"]["reason"] == "SlowTransportTCP"
    assert all(c["observedGeneration"] == 3 for c in conds.values())

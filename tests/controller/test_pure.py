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


def test_status_conditions_and_pools():
    dm = _dm()
    deps = {"prefill": _deployment(1, 0), "decode": _deployment(1, 1), "router": _deployment(1, 1)}
    out = st.desired_status(dm, {}, deps, 1, now="T0")
    conds = {c["type"]: c for c in out["conditions"]}
    assert conds["PrefillReady"]["status"] == "False" and conds["PrefillReady"]["reason"] == "NoReplicasReady"
    assert conds["DecodeReady"]["reason"] == "AllReplicasReady"
    assert conds["Ready"] == {"type": "Ready", "status": "False", "reason": "PrefillNotReady", "observedGeneration": 1,
                              "message": conds["PrefillReady"]["message"], "lastTransitionTime": "T0"}
    assert out["pools"]["prefill"] == {"replicas": 1, "readyReplicas": 0, "desiredReplicas": 1, "summary": "0/1"}
    assert out["activeMode"] == "Disaggregated" and out["modeSince"] == "T0"

    deps["prefill"] = _deployment(1, 1)
    later = st.desired_status(dm, out, deps, 1, now="T1")
    conds2 = {c["type"]: c for c in later["conditions"]}
    assert conds2["Ready"]["status"] == "True" and conds2["Ready"]["lastTransitionTime"] == "T1"
    assert conds2["DecodeReady"]["lastTransitionTime"] == "T0"  # unchanged status keeps its transition time
    patch = st.status_patch(out, later)
    assert "activeMode" not in patch and patch["pools"] == {"prefill": {"readyReplicas": 1, "summary": "1/1"}}
    merged = {**out, **later}
    assert st.status_patch(merged, st.desired_status(dm, merged, deps, 1, now="T2")) == {}


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

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
    rec.report.transitions({"metadata": {}}, dm, serving, starting)
    assert events == [("Normal", "Starting")]
    events.clear()
    failing = st.desired_status(dm, serving, {**ok, "prefill": _failed_deployment(1)}, 1, now="T1")
    rec.report.transitions({"metadata": {}}, dm, serving, failing)
    assert events == [("Warning", "NotReady")]


def test_mode_controller_owns_active_mode_in_auto_and_foreign_conditions_are_kept():
    current = {"activeMode": "Aggregated", "modeReason": "kv transfer failing", "conditions": [
        {"type": "FallbackActive", "status": "True", "reason": "X", "message": "", "lastTransitionTime": "T"},
        {"type": "KVTransferHealthy", "status": "False", "reason": "TransferFailures", "message": "",
         "lastTransitionTime": "T"}]}
    dm = _dm("llama-70b-rdma", activeMode="Aggregated")  # names a Prometheus: the autoscaler measures KV health
    out = st.desired_status(dm, current, {"prefill": None, "decode": None, "router": None}, 1, now="T0")
    assert "activeMode" not in out
    conds = {c["type"]: c for c in out["conditions"]}
    assert conds["FallbackActive"]["reason"] == "X"
    assert conds["KVTransferHealthy"]["reason"] == "TransferFailures"  # measured by the autoscaler, kept
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
    # no Prometheus: KV transfer health is not measured, and the condition says so (the configured TCP path too)
    kv = conds["KVTransferHealthy"]
    assert (kv["status"], kv["reason"]) == ("Unknown", "NotMeasured") and "TCP" in kv["message"]
    assert all(c["observedGeneration"] == 3 for c in conds.values())


def test_kv_transfer_health_is_never_set_from_configuration():
    """Issue 13: KVTransferHealthy is a measurement (the autoscaler's); the reconciler only says it is unknown."""
    with_prom = _dm("llama-70b-rdma")
    deployments = {"prefill": None, "decode": None, "router": None}
    first = {c["type"]: c for c in st.desired_status(with_prom, {}, deployments, 1, now="T0")["conditions"]}
    assert (first["KVTransferHealthy"]["status"], first["KVTransferHealthy"]["reason"]) == ("Unknown",
                                                                                          "AwaitingMetrics")
    # a status written by an older operator from the configuration alone is replaced
    legacy = {"conditions": [{"type": "KVTransferHealthy", "status": "True", "reason": "TransportConfigured",
                              "message": "", "lastTransitionTime": "T"}]}
    again = {c["type"]: c for c in st.desired_status(with_prom, legacy, deployments, 1, now="T1")["conditions"]}
    assert again["KVTransferHealthy"]["reason"] == "AwaitingMetrics"
    # nvlink/auto: which transport UCX picked is not observable, and the condition says so
    nvlink = {c["type"]: c for c in st.desired_status(_dm(), {}, deployments, 1, now="T0")["conditions"]}
    assert "not observable" in nvlink["KVTransferHealthy"]["message"]
    for dm in (with_prom, _dm(), _dm("aggregated-rollback")):
        for c in st.desired_status(dm, {}, deployments, 1, now="T0")["conditions"]:
            assert c["type"] != "KVTransferHealthy" or c["status"] == "Unknown"


def test_vllm_version_condition_is_in_status():
    from disagg.builders.vllm import vllm_version_condition

    deployments = {"prefill": None, "decode": None, "router": None}
    for example in ("llama-8b-nvlink", "llama-70b-rdma", "aggregated-rollback"):
        dm = _dm(example)
        want = vllm_version_condition(dm.spec.engine)
        got = {c["type"]: c for c in st.desired_status(dm, {}, deployments, 7, now="T0")["conditions"]}
        cond = got["VLLMVersionKnown"]
        assert {k: cond[k] for k in ("type", "status", "reason", "message")} == want
        assert cond["observedGeneration"] == 7
    body = yaml.safe_load(EXAMPLES["llama-8b-nvlink"].read_text())
    body["metadata"].update(namespace="ns", uid="u", generation=2)
    body["spec"].setdefault("engine", {})["image"] = "registry.example/vllm:latest"
    cond = {c["type"]: c for c in st.desired_status(parse_model(body), {}, deployments, 2,
                                                      now="T0")["conditions"]}["VLLMVersionKnown"]
    assert (cond["status"], cond["reason"]) == ("False", "DefaultVersionAssumed")


def test_pod_security_condition_names_pool_and_levels():
    rdma = _dm("llama-70b-rdma")
    needed = {o["metadata"]["labels"]["serving.disagg.dev/role"]: st.template_level(o)
              for o in build_children(rdma) if o["kind"] == "Deployment"}
    assert needed == {"prefill": "privileged", "decode": "privileged", "router": "restricted"}
    label = st.PSA_ENFORCE_LABEL
    bad = st.pod_security_condition("gpu", {label: "baseline"}, needed, 4)
    assert (bad["status"], bad["reason"], bad["observedGeneration"]) == ("False", "LevelNotAllowed", 4)
    assert "decode needs privileged" in bad["message"] and "prefill needs privileged" in bad["message"]
    assert "enforces baseline" in bad["message"] and "router" not in bad["message"]
    assert st.pod_security_condition("gpu", {label: "privileged"}, needed, 4)["status"] == "True"
    assert st.pod_security_condition("gpu", {}, needed, 4)["reason"] == "NotEnforced"
    assert st.pod_security_condition("gpu", None, needed, 4)["status"] == "Unknown"
    nvlink = {o["metadata"]["name"]: st.template_level(o) for o in build_children(_dm()) if o["kind"] == "Deployment"}
    assert set(nvlink.values()) == {"restricted"}
    assert st.pod_security_condition("gpu", {label: "restricted"}, nvlink, 1)["reason"] == "LevelAllowed"
    # the level is read from the rendered pods, as the pools' own claim (disagg.builders.pool_security_level)
    from disagg.builders import pool_security_level

    for example in ("llama-70b-rdma", "llama-8b-nvlink", "aggregated-rollback"):
        dm = _dm(example)
        for o in build_children(dm):
            role = o["metadata"]["labels"]["serving.disagg.dev/role"]
            if o["kind"] == "Deployment" and role != "router":
                assert st.template_level(o) == pool_security_level(dm, role), (example, role)
    body = yaml.safe_load(EXAMPLES["llama-8b-nvlink"].read_text())
    body["metadata"].update(namespace="ns", uid="u", generation=1)
    body["spec"]["model"]["cache"] = {"hostPath": "/var/cache/models"}
    dm = parse_model(body)
    cached = next(o for o in build_children(dm) if o["kind"] == "Deployment"
              and o["metadata"]["labels"]["serving.disagg.dev/role"] == "decode")
    assert st.template_level(cached) == pool_security_level(dm, "decode") == "privileged"


def test_held_template_keeps_the_live_pods_and_applies_the_rest():
    from disagg.builders.meta import ANNOTATION_TEMPLATE_HASH, stamp_template_hash
    from disagg.controller.upgrade import held, rolled_out, template_changed

    old = stamp_template_hash(next(o for o in build_children(_dm()) if o["kind"] == "Deployment"))
    live = copy.deepcopy(old)
    live["spec"]["template"]["spec"]["dnsPolicy"] = "ClusterFirst"  # an apiserver default
    live["spec"]["template"]["metadata"]["creationTimestamp"] = None
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["x"] = "y"
    new["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "NEW", "value": "1"})
    stamp_template_hash(new)
    assert not template_changed(old, live) and template_changed(new, live)
    h = held(new, live)
    assert h["metadata"]["labels"]["x"] == "y" and h["spec"]["template"]["spec"]["dnsPolicy"] == "ClusterFirst"
    assert "creationTimestamp" not in h["spec"]["template"]["metadata"]
    assert h["metadata"]["annotations"][ANNOTATION_TEMPLATE_HASH] == old["metadata"]["annotations"][
        ANNOTATION_TEMPLATE_HASH]
    assert why_apply(h, live) == "changed" and not template_changed(h, live)
    # a Deployment from before the annotation: compared by content (live carries defaults)
    unannotated = copy.deepcopy(live)
    del unannotated["metadata"]["annotations"][ANNOTATION_TEMPLATE_HASH]
    assert not template_changed(old, unannotated) and template_changed(new, unannotated)
    assert ANNOTATION_TEMPLATE_HASH not in held(new, unannotated)["metadata"]["annotations"]

    def dep(generation: int, observed: int, replicas: int, updated: int, total: int, available: int) -> dict:
        return {"metadata": {"generation": generation}, "spec": {"replicas": replicas},
                "status": {"observedGeneration": observed, "updatedReplicas": updated, "replicas": total,
                           "availableReplicas": available}}

    assert rolled_out(dep(2, 2, 2, 2, 2, 2)) and rolled_out(dep(3, 3, 0, 0, 0, 0))
    assert not rolled_out(dep(3, 2, 2, 2, 2, 2))  # the controller has not seen the new template
    assert not rolled_out(dep(3, 3, 2, 1, 3, 2))  # old pods remain
    assert not rolled_out(dep(3, 3, 2, 2, 2, 1))  # not available yet
    assert not rolled_out(None)


def _body(example: str = "llama-8b-nvlink") -> dict:
    body = yaml.safe_load(EXAMPLES[example].read_text())
    body["metadata"].update(namespace="ns", uid="u", generation=1, resourceVersion="1")
    return body


def test_build_key_leaves_out_exactly_what_no_builder_reads():
    """The reconciler reuses the children it built while the build key is unchanged; the status fields the key
    leaves out must not change what the builders produce, and the ones it keeps must be in the key."""
    from disagg.controller.reconcile import build_key

    base = _body()
    base["status"] = {"activeMode": "Disaggregated", "pools": {"prefill": {"starting": True}}}
    noisy = copy.deepcopy(base)
    noisy["metadata"]["resourceVersion"] = "2"
    noisy["metadata"]["managedFields"] = [{"manager": "x"}]
    noisy["status"].update(observedGeneration=1, observed={"ttftP95Ms": 12.0}, conditions=[
        {"type": "Ready", "status": "False", "reason": "PrefillStarting", "message": "m",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}])
    noisy["status"]["pools"]["prefill"].update(replicas=1, readyReplicas=0, summary="0/1",
                                               lastScale={"time": "t", "from": 1, "to": 2, "reason": "r"})
    assert build_key(noisy) == build_key(base)
    assert build_children(parse_model(noisy)) == build_children(parse_model(base))
    for change in ({"activeMode": "Aggregated"}, {"pools": {"prefill": {"starting": False}}}):
        other = copy.deepcopy(base)
        other["status"].update(change)
        assert build_key(other) != build_key(base)
        assert build_children(parse_model(other)) != build_children(parse_model(base))
    spec = copy.deepcopy(base)
    spec["spec"]["decode"]["replicas"] = 3
    assert build_key(spec) != build_key(base)


def test_child_fingerprint_sees_content_and_the_deployment_counts_only():
    from disagg.controller.filters import child_fingerprint

    objs = {o["kind"]: o for o in build_children(parse_model(_body()))}
    pdb = copy.deepcopy(objs["PodDisruptionBudget"])
    fp = child_fingerprint("PodDisruptionBudget", pdb)
    pdb["metadata"].update(resourceVersion="9", managedFields=[{"manager": "kcm"}])
    pdb["status"] = {"currentHealthy": 0, "desiredHealthy": 1, "observedGeneration": 1}
    assert child_fingerprint("PodDisruptionBudget", pdb) == fp  # the disruption controller's status: no news
    pdb["spec"]["maxUnavailable"] = 5
    assert child_fingerprint("PodDisruptionBudget", pdb) != fp  # an edit: news

    dep = copy.deepcopy(objs["Deployment"])
    dep["status"] = {"replicas": 1, "updatedReplicas": 1, "observedGeneration": 1, "conditions": [
        {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated", "lastUpdateTime": "a"}]}
    fp = child_fingerprint("Deployment", dep)
    dep["status"]["conditions"][0]["lastUpdateTime"] = "b"
    dep["status"]["unavailableReplicas"] = 1
    assert child_fingerprint("Deployment", dep) == fp  # nothing the model's status reads
    dep["status"]["readyReplicas"] = 1
    assert child_fingerprint("Deployment", dep) != fp


def test_child_fingerprint_keeps_the_status_of_kinds_it_does_not_know():
    """A workload kind added later (a StatefulSet pool, say) keeps its whole status in the fingerprint until someone
    decides which of it the model's status reads: its readiness changes are never filtered out as no news."""
    from disagg.controller.filters import child_fingerprint

    sts = {"metadata": {"name": "m-decode"}, "spec": {"replicas": 2}, "status": {"readyReplicas": 1}}
    assert child_fingerprint("StatefulSet", sts) != child_fingerprint(
        "StatefulSet", {**sts, "status": {"readyReplicas": 2}})

"""Status of a DisaggregatedModel from its Deployments: pure functions, no I/O.

The operator owns these parts of ``status``: observedGeneration, activeMode/modeReason/modeSince (only to pin them to
spec.mode, or to set the initial mode), pools.<pool>.{replicas, readyReplicas, desiredReplicas, summary, starting}, and
the conditions Ready, PrefillReady, DecodeReady, AggregatedReady (with spec.aggregated), RouterReady, Progressing,
VLLMVersionKnown, RolloutPending (reconcile.py) and PodSecurity (pod_security_condition), plus KVTransferHealthy until
it is measured: KV transfer health is measured by the autoscaler from Prometheus (KV-transport fallbacks, transfer p95);
the reconciler writes it only as Unknown — ``NotMeasured`` when the model names no Prometheus, ``AwaitingMetrics``
before the autoscaler's first measurement. Other writers (autoscaler, mode controller) own the rest; their conditions
and fields are kept as they are.

Starting is not failing (DESIGN.md §9). A pool with no ready replica is *starting* — not failed — when it has not
been ready since it was created, scaled from zero or rolled to a new generation. The rule reads only the pool's
Deployment and the pool's previous status (no timer: real vLLM takes minutes to load weights, and the
Deployment's progress deadline — the startup probe's budget plus a margin — bounds it):

    starting = desired > 0 and readyReplicas == 0 and not ProgressDeadlineExceeded and (
        the Deployment does not exist yet, or this pool was starting at the last observation (or never observed),
        or it was scaled from zero (previous desiredReplicas 0), or it rolls out a new generation
        (observedGeneration < generation, or updatedReplicas < replicas))

A pool that was ready and lost every ready replica is failing (NoReplicasReady), and the mode controller may act.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from ..api.contract import Role
from ..api.models import ActiveMode, DisaggregatedModel, Mode
from ..builders import active_mode, desired_replicas, transport_summary, worker_roles
from ..builders.security import LEVELS, Level, level_for
from ..builders.vllm import vllm_version_condition
from .clock import rfc3339

PSA_ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"

OWNED_CONDITIONS = ("Ready", "PrefillReady", "DecodeReady", "AggregatedReady", "RouterReady", "Progressing",
                    "VLLMVersionKnown", "RolloutPending", "PodSecurity")
# KVTransferHealthy reasons the reconciler writes (unmeasured); any other reason is the autoscaler's measurement.
# TransportConfigured/SlowTransportTCP are what operators before issue 13 wrote from the configuration alone.
UNMEASURED_REASONS = ("NotMeasured", "AwaitingMetrics", "TransportConfigured", "SlowTransportTCP")
TRANSPORT_NOT_OBSERVABLE = ("Which transport UCX picks is not observable (neither NIXL nor vLLM exports it); a path "
                            "that fell back to TCP shows only as a high observed.kvTransferP95Ms.")
PINNED_REASON = "Pinned by spec.mode"
INITIAL_REASON = "spec.mode Auto: disaggregated until the mode controller decides otherwise"


def now_rfc3339() -> str:
    return rfc3339(dt.datetime.now(dt.UTC))


def condition(type_: str, ok: bool | None, reason: str, message: str, generation: int | None) -> dict[str, Any]:
    status = "Unknown" if ok is None else ("True" if ok else "False")
    out: dict[str, Any] = {"type": type_, "status": status, "reason": reason, "message": message}
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def deployment_counts(live: Mapping[str, Any] | None) -> tuple[int, int]:
    """(replicas, readyReplicas) from a Deployment's status."""
    if not live:
        return 0, 0
    st = live.get("status") or {}
    return int(st.get("replicas") or 0), int(st.get("readyReplicas") or 0)


def _deadline_exceeded(live: Mapping[str, Any]) -> bool:
    for cond in (live.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Progressing":
            return bool(cond.get("status") == "False" or cond.get("reason") == "ProgressDeadlineExceeded")
    return False


def _new_generation(live: Mapping[str, Any]) -> bool:
    st = live.get("status") or {}
    generation = (live.get("metadata") or {}).get("generation")
    observed = st.get("observedGeneration")
    if generation is not None and (observed is None or int(observed) < int(generation)):
        return True
    wanted = int((live.get("spec") or {}).get("replicas") or 0)
    return int(st.get("updatedReplicas") or 0) < wanted


def pool_starting(live: Mapping[str, Any] | None, desired: int, previous: Mapping[str, Any] | None) -> bool:
    """Is this pool starting rather than failing? (The rule is in the module docstring.)"""
    if desired == 0:
        return False
    if live is None:
        return True
    if deployment_counts(live)[1] > 0 or _deadline_exceeded(live):
        return False
    if not previous:
        return True  # never observed: it has not been ready yet
    was_starting = previous.get("starting") if "starting" in previous else not previous.get("readyReplicas")
    return bool(was_starting) or previous.get("desiredReplicas") == 0 or _new_generation(live)


def pool_status(live: Mapping[str, Any] | None, desired: int, starting: bool = False) -> dict[str, Any]:
    replicas, ready = deployment_counts(live)
    return {"replicas": replicas, "readyReplicas": ready, "desiredReplicas": desired, "summary": f"{ready}/{desired}",
            "starting": starting}


def pool_condition(type_: str, role: str, name: str, live: Mapping[str, Any] | None, desired: int,
                   required: bool, generation: int | None, starting: bool = False) -> dict[str, Any]:
    if live is None:
        return condition(type_, False, "DeploymentMissing", f"Deployment {name} does not exist yet.", generation)
    _, ready = deployment_counts(live)
    if starting:
        return condition(type_, False, "Starting",
                         f"0/{desired} {role} replicas ready: the pool is starting (pods scheduled, pulling, or "
                         "loading the model); not a failure.", generation)
    if desired == 0:
        if required:
            return condition(type_, False, "ScaledToZero",
                             f"The {role} pool has 0 replicas; it is needed in the active mode.", generation)
        return condition(type_, True, "NotRequired",
                         f"The {role} pool has 0 replicas; it is not used in the active mode.", generation)
    if ready == 0:
        return condition(type_, False, "NoReplicasReady",
                         f"0/{desired} {role} replicas ready (pods pending, loading the model, or failing /health).",
                         generation)
    if ready < desired:
        return condition(type_, True, "PartiallyReady", f"{ready}/{desired} {role} replicas ready.", generation)
    return condition(type_, True, "AllReplicasReady", f"{ready}/{desired} {role} replicas ready.", generation)


def mode_fields(dm: DisaggregatedModel, current: Mapping[str, Any], now: str) -> dict[str, Any]:
    """activeMode/modeReason/modeSince: pinned modes are written; in Auto the mode controller's value stays."""
    cur_mode = current.get("activeMode")
    cur_reason = current.get("modeReason")
    if dm.spec.mode == Mode.AUTO:
        if cur_mode and cur_reason != PINNED_REASON:
            return {}
        mode, reason = ActiveMode.DISAGGREGATED.value, INITIAL_REASON
    else:
        mode, reason = active_mode(dm).value, PINNED_REASON
    out: dict[str, Any] = {}
    if cur_mode != mode:
        out.update({"activeMode": mode, "modeReason": reason, "modeSince": now})
    elif cur_reason != reason:
        out["modeReason"] = reason
    return out


def merge_conditions(existing: list[Mapping[str, Any]], new: list[dict[str, Any]], now: str) -> list[dict[str, Any]]:
    """New conditions replace same-typed ones; lastTransitionTime moves only when status changes."""
    by_type = {c.get("type"): dict(c) for c in existing}
    order = [c.get("type") for c in existing]
    for cond in new:
        old = by_type.get(cond["type"])
        merged = dict(cond)
        if old is not None and old.get("status") == cond["status"] and old.get("lastTransitionTime"):
            merged["lastTransitionTime"] = old["lastTransitionTime"]
        else:
            merged["lastTransitionTime"] = now
        by_type[cond["type"]] = merged
        if cond["type"] not in order:
            order.append(cond["type"])
    return [by_type[t] for t in order]


def pools_starting(dm: DisaggregatedModel, current: Mapping[str, Any],
                   deployments: Mapping[str, Mapping[str, Any] | None]) -> dict[str, bool]:
    """Which worker pools are starting (the router keeps requests local while the prefill pool is)."""
    previous = current.get("pools") or {}
    return {role: pool_starting(deployments.get(role), desired_replicas(dm, role), previous.get(role))
            for role in worker_roles(dm)}


def desired_status(dm: DisaggregatedModel, current: Mapping[str, Any],
                   deployments: Mapping[str, Mapping[str, Any] | None], generation: int | None,
                   now: str | None = None) -> dict[str, Any]:
    """The operator's part of status, merged into ``current`` (the parent's status as it is now).

    ``deployments`` maps a role (prefill, decode, aggregated, router) to its live Deployment or None.
    """
    now = now or now_rfc3339()
    model = dm.metadata.get("name", "")
    mode_update = mode_fields(dm, current, now)
    mode = ActiveMode(mode_update.get("activeMode") or current.get("activeMode") or active_mode(dm).value)
    if dm.spec.mode != Mode.AUTO:
        mode = active_mode(dm)

    pools: dict[str, Any] = {}
    conds: list[dict[str, Any]] = []
    starting = pools_starting(dm, current, deployments)
    for role in worker_roles(dm):
        pools[role] = pool_status(deployments.get(role), desired_replicas(dm, role), starting[role])
    if "aggregated" not in pools and (current.get("pools") or {}).get("aggregated") is not None:
        pools["aggregated"] = None  # the optional pool was removed: drop its status (merge-patch null)
    prefill_required = mode == ActiveMode.DISAGGREGATED
    conds.append(pool_condition("PrefillReady", "prefill", f"{model}-prefill", deployments.get("prefill"),
                                desired_replicas(dm, "prefill"), prefill_required, generation, starting["prefill"]))
    conds.append(pool_condition("DecodeReady", "decode", f"{model}-decode", deployments.get("decode"),
                                desired_replicas(dm, "decode"), True, generation, starting["decode"]))
    if dm.spec.aggregated is not None:  # the optional pool: watchable on its own (a migration waits on it)
        conds.append(pool_condition("AggregatedReady", "aggregated", f"{model}-aggregated",
                                    deployments.get("aggregated"), desired_replicas(dm, "aggregated"),
                                    mode == ActiveMode.AGGREGATED, generation, starting["aggregated"]))
    router_live = deployments.get("router")
    router_desired = int(((router_live or {}).get("spec") or {}).get("replicas") or 1)
    router_prev = next((c for c in current.get("conditions") or [] if c.get("type") == "RouterReady"), None)
    router_starting = pool_starting(router_live, router_desired, None if router_prev is None else {
        "starting": router_prev.get("reason") in ("Starting", "DeploymentMissing")})
    conds.append(pool_condition("RouterReady", "router", f"{model}-router", router_live, router_desired, True,
                                generation, router_starting))

    needed = ["DecodeReady", "RouterReady"] + (["PrefillReady"] if prefill_required else [])
    failing = [c for c in conds if c["type"] in needed and c["status"] != "True"]
    if failing:
        first = failing[0]["type"].removesuffix("Ready")
        why = "Starting" if all(c["reason"] == "Starting" for c in failing) else "NotReady"
        conds.append(condition("Ready", False, f"{first}{why}", " ".join(c["message"] for c in failing), generation))
    else:
        conds.append(condition("Ready", True, "Serving", f"Serving in {mode.value} mode.", generation))
    started = [role for role, on in starting.items() if on]
    if started:
        conds.append(condition("Progressing", True, "PoolStarting",
                               f"Starting: {', '.join(started)} pool(s) have no ready replica yet (pods scheduled, "
                               "pulling or loading the model). Requests stay local while the prefill pool starts; "
                               "the mode controller does not act on a starting pool.", generation))
    else:
        conds.append(condition("Progressing", False, "PoolsStarted", "No pool is starting.", generation))

    existing = [c for c in current.get("conditions") or []  # a removed aggregated pool takes its condition along
                if c.get("type") != "AggregatedReady" or dm.spec.aggregated is not None]
    conds.append(kv_transfer_unmeasured(dm, existing, generation))
    version = vllm_version_condition(dm.spec.engine)
    conds.append(condition(version["type"], version["status"] == "True", version["reason"], version["message"],
                           generation))
    conds = [c for c in conds if c]

    out: dict[str, Any] = {
        "observedGeneration": generation,
        **mode_update,
        "pools": pools,
        "conditions": merge_conditions(existing, conds, now),
    }
    return out


def transport_note(dm: DisaggregatedModel) -> str:
    """What the configuration says about the KV path (not a measurement)."""
    kv = dm.spec.kv_transfer
    _, message = transport_summary(kv)
    return message if kv.transport in ("tcp", "rdma") else f"{message} {TRANSPORT_NOT_OBSERVABLE}"


def kv_transfer_unmeasured(dm: DisaggregatedModel, existing: list[Mapping[str, Any]],
                           generation: int | None) -> dict[str, Any]:
    """KVTransferHealthy=Unknown while nothing measures it; {} when the autoscaler's measurement stands."""
    kv = next((c for c in existing if c.get("type") == "KVTransferHealthy"), None)
    if dm.spec.autoscaling.prometheus is None:
        return condition("KVTransferHealthy", None, "NotMeasured",
                         "Not measured: KV transfer health is measured from Prometheus (KV-transport fallbacks and "
                         "transfer p95) and spec.autoscaling.prometheus is not set. " + transport_note(dm), generation)
    if kv is None or kv.get("reason") in UNMEASURED_REASONS:
        return condition("KVTransferHealthy", None, "AwaitingMetrics",
                         "Not measured yet: the autoscaler measures KV-transport fallbacks and transfer p95 every "
                         "spec.autoscaling.intervalSeconds. " + transport_note(dm), generation)
    return {}


def invalid_status(current: Mapping[str, Any], message: str, generation: int | None,
                   reason: str = "InvalidSpec", now: str | None = None) -> dict[str, Any]:
    """Ready=False with the problem; nothing else changes (no half-built state is reported as progress)."""
    now = now or now_rfc3339()
    conds = merge_conditions(list(current.get("conditions") or []),
                             [condition("Ready", False, reason, message, generation)], now)
    return {"observedGeneration": generation, "conditions": conds}


def status_patch(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that takes ``current`` to include ``wanted`` (empty when nothing changes)."""
    patch: dict[str, Any] = {}
    for key, value in wanted.items():
        cur = current.get(key)
        if isinstance(value, dict) and isinstance(cur, dict):
            sub = status_patch(cur, value)
            if sub:
                patch[key] = sub
        elif cur != value:
            patch[key] = value
    return patch


def pool_roles(dm: DisaggregatedModel) -> list[Role]:
    return [*worker_roles(dm), "router"]


# Volume types the restricted level allows (k8s.io/pod-security-admission/policy/check_restrictedVolumes.go).
RESTRICTED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                                "projected", "secret"})


def template_level(workload: Mapping[str, Any]) -> Level:
    """The Pod Security level a rendered workload's pods need (after spec.<pool>.podTemplate overrides), from what
    separates the levels in the pods the operator renders: added capabilities (IPC_LOCK for RDMA: privileged; a
    root-only capability: baseline at least), hostPath volumes (a hostPath model cache: privileged), host
    namespaces and privileged containers (privileged), other volume types and running as root (baseline). Not a
    full Pod Security evaluation: the apiserver's admission remains the judge."""
    pod = ((workload.get("spec") or {}).get("template") or {}).get("spec") or {}
    containers = [*(pod.get("containers") or []), *(pod.get("initContainers") or [])]
    added: list[str] = []
    for container in containers:
        added += ((container.get("securityContext") or {}).get("capabilities") or {}).get("add") or []
    levels: list[Level] = [level_for(added)]
    volumes = [k for v in pod.get("volumes") or [] for k in v if k != "name"]
    if ("hostPath" in volumes or any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
            or any((c.get("securityContext") or {}).get("privileged") for c in containers)):
        levels.append("privileged")
    root = (pod.get("securityContext") or {}).get("runAsUser") == 0 or any(
        (c.get("securityContext") or {}).get("runAsUser") == 0 for c in containers)
    if set(volumes) - RESTRICTED_VOLUMES or root:
        levels.append("baseline")
    return max(levels, key=LEVELS.index)


def pod_security_condition(namespace: str, labels: Mapping[str, str] | None, needed: Mapping[str, Level],
                           generation: int | None) -> dict[str, Any]:
    """PodSecurity: does the namespace's enforced Pod Security level admit every pool's pods? ``needed`` maps a
    pool (prefill, decode, aggregated, router) to the level its rendered pods need; ``labels`` are the namespace's
    (None: not readable)."""
    if labels is None:
        return condition("PodSecurity", None, "NamespaceUnreadable",
                         f"Cannot read namespace {namespace} (the operator needs get on namespaces) to compare its "
                         "Pod Security level with the pools'.", generation)
    enforced = str(labels.get(PSA_ENFORCE_LABEL) or "")
    if enforced not in LEVELS:
        return condition("PodSecurity", True, "NotEnforced",
                         f"Namespace {namespace} enforces no Pod Security level ({PSA_ENFORCE_LABEL} "
                         f"{'unset' if not enforced else repr(enforced) + ' is not a level'}).", generation)
    allowed = LEVELS.index(enforced)  # LEVELS is strictest first: a pool needing a later level is refused
    refused = {pool: level for pool, level in needed.items() if LEVELS.index(level) > allowed}
    if refused:
        pools = ", ".join(f"{pool} needs {level}" for pool, level in sorted(refused.items()))
        loosest = max(refused.values(), key=LEVELS.index)
        return condition("PodSecurity", False, "LevelNotAllowed",
                         f"Pod Security: namespace {namespace} enforces {enforced} ({PSA_ENFORCE_LABEL}) but the "
                         f"{pools}: the apiserver refuses their pods (the only other sign is a FailedCreate on the "
                         f"ReplicaSet). Label the namespace {PSA_ENFORCE_LABEL}={loosest} "
                         "or make the pool meet the namespace's level (docs/kv-transport.md, \"Pod Security\").",
                         generation)
    return condition("PodSecurity", True, "LevelAllowed",
                     f"Namespace {namespace} enforces {enforced}; every pool's pods meet it.", generation)

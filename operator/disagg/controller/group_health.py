"""A multi-node pool's groups as their pods say (StatefulSet back end; builders/multinode.py writes the labels read
here), pure, from pod objects: :func:`group_states` (a group is ready only when all its pods are) and
:func:`groups_to_restart` (a failed member restarts the whole group). controller/groups.py applies them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..builders.multinode import LABEL_GROUP, LABEL_NODE_RANK


@dataclass
class GroupState:
    """What the pods of one group say (StatefulSet back end)."""

    name: str
    size: int
    pods: dict[int, Mapping[str, Any]] = field(default_factory=dict)  # node rank → pod
    reasons: list[str] = field(default_factory=list)  # why the group must restart; empty: it need not

    @property
    def ready(self) -> bool:
        """A group is ready only when every one of its pods is."""
        return len(self.pods) == self.size and all(pod_ready(p) for p in self.pods.values()) and not self.reasons

    @property
    def broken(self) -> bool:
        return bool(self.reasons)


def _labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
    labels: Mapping[str, str] = (pod.get("metadata") or {}).get("labels") or {}
    return labels


def pod_ready(pod: Mapping[str, Any]) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(cond.get("type") == "Ready" and cond.get("status") == "True" for cond in conditions)


def _time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    return None


def _restarts(pod: Mapping[str, Any]) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(s.get("restartCount") or 0) for s in statuses)


def _running_since(pod: Mapping[str, Any]) -> datetime | None:
    for s in (pod.get("status") or {}).get("containerStatuses") or []:
        if s.get("name") == "vllm":
            return _time(((s.get("state") or {}).get("running") or {}).get("startedAt"))
    return None


def group_states(pods: Iterable[Mapping[str, Any]], size: int) -> dict[str, GroupState]:
    """The groups of a pool (StatefulSet back end) from its pods (dicts as the API returns them, e.g.
    ``ApiClient.sanitize_for_serialization(pod)``), by group name. A group must restart (``reasons``) when a pod
    of it failed or had a container restart (vLLM cannot take a rank back into a running group: the other ranks'
    collectives and the DP handshake are gone), or when a worker pod is newer than the Ready leader's running engine
    (it replaced a lost pod, and the leader still runs with the old one)."""
    out: dict[str, GroupState] = {}
    for pod in pods:
        labels = _labels(pod)
        group, rank_label = labels.get(LABEL_GROUP), labels.get(LABEL_NODE_RANK)
        if not group or rank_label is None:
            continue
        out.setdefault(group, GroupState(group, size)).pods[int(rank_label)] = pod
    for state in out.values():
        for rank, pod in sorted(state.pods.items()):
            name = (pod.get("metadata") or {}).get("name", f"rank {rank}")
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Failed", "Unknown"):
                state.reasons.append(f"{name} is {phase}")
            elif _restarts(pod):
                state.reasons.append(f"{name} restarted ({_restarts(pod)} container restarts)")
        leader = state.pods.get(0)
        # (only once the leader is Ready, i.e. its engines all joined: while the group forms, a worker created after
        # the leader started simply joins late)
        started = _running_since(leader) if leader is not None and pod_ready(leader) else None
        if started is not None:
            for rank, pod in sorted(state.pods.items()):
                created = _time((pod.get("metadata") or {}).get("creationTimestamp"))
                if rank and created is not None and created > started:
                    name = (pod.get("metadata") or {}).get("name", f"rank {rank}")
                    state.reasons.append(f"{name} was created after the leader's engine started")
    return out


def groups_to_restart(pods: Iterable[Mapping[str, Any]], size: int) -> dict[str, list[str]]:
    """Group name → the pods to delete so that the group starts over as a whole (their StatefulSets recreate them);
    only groups that must restart (:func:`group_states`)."""
    return {name: sorted((p.get("metadata") or {}).get("name", "") for p in state.pods.values())
            for name, state in group_states(pods, size).items() if state.broken}


def ready_groups(pods: Iterable[Mapping[str, Any]], size: int) -> int:
    """How many groups of a pool are ready (every pod Ready, none to restart): the pool's ready replicas."""
    return sum(1 for s in group_states(pods, size).values() if s.ready)

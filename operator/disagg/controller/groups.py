"""Multi-node pools in the controller: the group decisions (pure) and the one function that applies them.

A pool with ``nodesPerReplica`` > 1 runs each replica as a group of pods (builders/multinode.py, docs/multinode.md).
The builders render the groups; what needs the live cluster is here:

- **which back end** (``spec.multiNode.backend: Auto``): LeaderWorkerSet when its CRD is installed, read at most every
  ``CRD_TTL`` seconds (:class:`CrdProbe`, :func:`refresh_settings`);
- **group restarts** (StatefulSet back end): every reconcile of a model with such a pool lists the pool's pods and
  deletes every pod of each group that must start over (``group_health.groups_to_restart``: a member failed, restarted
  or was replaced under a running leader); the group's StatefulSets recreate them together. A group with a pod being
  deleted is judged again once that pod is gone (:meth:`PoolGroups.restarts`). (LeaderWorkerSet does this itself:
  ``RecreateGroupOnPodRestart``.)
- **replacing groups**: a new generation (a spec change) is a new set of groups with new names; the old groups'
  StatefulSets and Services are no longer built, and the reconciler prunes them only once the pool has as many ready
  groups of the new generation as it wants (:meth:`GroupPlan.keep`). Groups scaled away go at once.
- **status**: a multi-node pool has no Deployment; its status counts groups (:func:`pool_view` turns them into the
  Deployment-shaped counts status.py reads): ``replicas`` groups present, ``readyReplicas`` groups whose every pod is
  Ready (``group_health.ready_groups``), ``updatedReplicas`` groups of the current generation.
- **replicas** count groups. With autoscaling on, the autoscaler's recorded decision
  (``status.pools.<pool>.desiredReplicas``) is the one source of the count (DESIGN.md §3): the reconciler keeps it in
  the build input of a multi-node pool (:func:`keeps_desired_replicas`) and renders that many groups; a group's
  StatefulSets always have ``replicas: 1``, so no one else writes a count.
- **pod events**: :func:`register` watches the pods of groups (label ``serving.disagg.dev/group`` or
  ``leaderworkerset.sigs.k8s.io/group-key``) and reconciles their model when a pod's phase, readiness, restart count
  or deletion changes (:func:`pod_fingerprint`); other pod events are dropped on kopf's event loop.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import kopf

from .. import logs
from ..api.contract import LABEL_MODEL, Role
from ..api.models import DisaggregatedModel
from ..builders import multinode as mn
from ..builders.meta import model_name
from ..builders.replicas import desired_replicas
from ..builders.settings import BuildSettings
from . import group_health as gh
from .kubeio import Kube, KubeError

if TYPE_CHECKING:
    from .objects import Key
    from .reconcile import Reconciler
    from .requeue import Requeue

log = logs.get("disagg.controller.groups")

CRD_TTL = 300.0  # seconds a read of the LeaderWorkerSet CRD's presence is reused
CRD_PATH = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{mn.LWS_CRD}"
GROUP_KINDS = ("StatefulSet", "Service")  # what a StatefulSet-back-end group is made of (besides its pods)


# ------------------------------------------------------------------------------------------- back end


@dataclass
class CrdProbe:
    """Is the LeaderWorkerSet CRD installed? One GET at most every ``ttl`` seconds; unreadable (403, say) = no."""

    ttl: float = CRD_TTL
    read_at: float | None = None
    installed: bool = False

    def check(self, kube: Kube, now: float) -> bool:
        if self.read_at is not None and now - self.read_at < self.ttl:
            return self.installed
        try:
            self.installed = kube.request("GET", CRD_PATH, retry=False) is not None
        except KubeError as exc:
            if exc.status not in (403, 404):
                log.warning("LeaderWorkerSet CRD unreadable", crd=mn.LWS_CRD, error=str(exc))
            self.installed = False
        self.read_at = now
        return self.installed


_probes: weakref.WeakKeyDictionary[Any, CrdProbe] = weakref.WeakKeyDictionary()
_probes_guard = threading.Lock()


def refresh_settings(rec: Reconciler, dm: DisaggregatedModel) -> BuildSettings:
    """``rec.settings`` with ``lws_installed`` as the cluster has it (cached), for a model with a multi-node pool
    whose back end is Auto or LeaderWorkerSet. When it changes, the reconciler builds with the new settings
    (``Reconciler.use_settings``: children built for the other back end are built again)."""
    if not mn.multinode_roles(dm) or dm.spec.multi_node.backend == "StatefulSet":
        return rec.settings
    with _probes_guard:
        probe = _probes.setdefault(rec, CrdProbe())
    installed = probe.check(rec.kube, rec.clock.monotonic())
    if installed != rec.settings.lws_installed:
        log.info("LeaderWorkerSet CRD", crd=mn.LWS_CRD, installed=installed)
        rec.use_settings(dataclasses.replace(rec.settings, lws_installed=installed))  # (drops the build cache)
    return rec.settings


def keeps_desired_replicas(dm: DisaggregatedModel, role: str) -> bool:
    """Does the build of pool ``role`` read the autoscaler's recorded desiredReplicas? For a multi-node pool, yes:
    the count of groups is rendered (no /scale of a Deployment), from the autoscaler's record."""
    pool = getattr(dm.spec, role, None)
    return mn.is_multinode(pool)


# -------------------------------------------------------------------------------------- pure decisions


def pool_view(desired: int, present: int, ready: int, updated: int) -> dict[str, Any]:
    """Group counts in the shape status.py reads of a pool Deployment (spec.replicas, status counts)."""
    return {"metadata": {"generation": 1}, "spec": {"replicas": desired},
            "status": {"observedGeneration": 1, "replicas": present, "readyReplicas": ready,
                       "availableReplicas": ready, "updatedReplicas": updated}}


@dataclass
class PoolGroups:
    """What one multi-node pool (StatefulSet back end) looks like now, and what to do about it."""

    role: Role
    size: int  # nodesPerReplica
    generation: str
    desired: int  # groups wanted
    pods: Sequence[Mapping[str, Any]] = field(default_factory=list)

    def states(self) -> dict[str, gh.GroupState]:
        return gh.group_states(self.pods, self.size)

    def restarts(self) -> dict[str, list[str]]:
        """Group → the pods to delete so that it starts over. A group with a pod being deleted is left alone: its
        restart is under way (or the deleted pod's StatefulSet recreates it, and the group is judged again then),
        so that the pods its StatefulSets recreate meanwhile are not deleted again."""
        deleting = {_name(p) for p in self.pods if (p.get("metadata") or {}).get("deletionTimestamp")}
        return {group: names for group, names in gh.groups_to_restart(self.pods, self.size).items()
                if not deleting & set(names)}

    def current_ready(self) -> int:
        return sum(1 for name, s in self.states().items() if s.ready and _generation_of(s) == self.generation)

    def view(self) -> dict[str, Any]:
        states = self.states()
        return pool_view(self.desired, len(states), sum(1 for s in states.values() if s.ready),
                         sum(1 for s in states.values() if _generation_of(s) == self.generation))

    def keep(self, kind: str, live: Mapping[str, Any]) -> bool:
        """Must an object of an old group, no longer built, stay for now? Yes while it is of another generation
        and this pool has fewer ready groups of the current generation than it wants."""
        labels = ((live.get("metadata") or {}).get("labels") or {})
        if kind not in GROUP_KINDS or labels.get(mn.LABEL_POOL) != self.role or mn.LABEL_GROUP not in labels:
            return False
        return labels.get(mn.LABEL_GENERATION) != self.generation and self.current_ready() < self.desired


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", ""))


def _generation_of(state: gh.GroupState) -> str | None:
    for pod in state.pods.values():
        gen = ((pod.get("metadata") or {}).get("labels") or {}).get(mn.LABEL_GENERATION)
        if gen:
            return str(gen)
    return None


@dataclass
class GroupPlan:
    """The multi-node pools of one model as one reconcile saw them."""

    pools: dict[str, PoolGroups] = field(default_factory=dict)  # StatefulSet back end, by role
    views: dict[str, Mapping[str, Any] | None] = field(default_factory=dict)  # role → status counts

    def keep(self, key: Key, live: Mapping[str, Any]) -> bool:
        return any(p.keep(key[0], live) for p in self.pools.values())


EMPTY = GroupPlan()


# ---------------------------------------------------------------------------------------- applying them


def list_pods(kube: Kube, namespace: str, model: str, role: str) -> list[Mapping[str, Any]]:
    out = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods",
                       query=[("labelSelector", f"{LABEL_MODEL}={model},{mn.LABEL_POOL}={role}")])
    return list((out or {}).get("items") or [])


def delete_pod(kube: Kube, namespace: str, name: str) -> None:
    try:
        kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
    except KubeError as exc:
        if exc.status != 404:
            raise


def observe(rec: Reconciler, dm: DisaggregatedModel, namespace: str) -> GroupPlan:
    """Read the multi-node pools of ``dm`` (one pod list per pool on the StatefulSet back end, one GET of the
    LeaderWorkerSet otherwise), restart the groups that must start over, and return what the reconcile needs: which
    old objects to keep, and each pool's counts for status. A model without such pools costs nothing. ``dm`` is a
    model the API admitted (``Reconciler.admit``)."""
    roles = mn.multinode_roles(dm)
    if not roles:
        return EMPTY
    settings = refresh_settings(rec, dm)
    backend = mn.resolve_backend(dm.spec, settings.lws_installed)
    plan = GroupPlan()
    model = model_name(dm)
    for role in roles:
        gen = mn.generation(dm, role)
        want = desired_replicas(dm, role)
        if backend == "LeaderWorkerSet":
            live = rec.kube.get("LeaderWorkerSet", namespace, mn.lws_name(dm, role))
            counts = (live or {}).get("status") or {}
            plan.views[role] = None if live is None else pool_view(
                want, *(int(counts.get(k) or 0) for k in ("replicas", "readyReplicas", "updatedReplicas")))
            continue
        pool = PoolGroups(role, getattr(dm.spec, role).nodes_per_replica, gen, want,
                          list_pods(rec.kube, namespace, model, role))
        for group, names in pool.restarts().items():
            reasons = pool.states()[group].reasons
            log.warning("group restart", model=f"{namespace}/{model}", pool=role, group=group, pods=names,
                        reasons=reasons)
            rec.emit(_body(dm, namespace), "Warning", "GroupRestarted",
                     f"Restarting group {group} of the {role} pool (every pod of it): {'; '.join(reasons)}")
            for name in names:
                delete_pod(rec.kube, namespace, name)
            rec.counters["group_restarts"] = rec.counters.get("group_restarts", 0) + 1
        plan.pools[role] = pool
        plan.views[role] = pool.view()
    return plan


def _body(dm: DisaggregatedModel, namespace: str) -> dict[str, Any]:
    """Enough of the model for an Event about it."""
    meta = dict(dm.metadata)
    meta.setdefault("namespace", namespace)
    return {"apiVersion": dm.api_version, "kind": dm.kind, "metadata": meta}


# -------------------------------------------------------------------------------------------- pod events


def pod_fingerprint(body: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a group's pod the controller acts on: phase, readiness, restarts, being deleted, created."""
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    restarts = sum(int(s.get("restartCount") or 0) for s in status.get("containerStatuses") or [])
    return (meta.get("uid"), status.get("phase"), ready, restarts, bool(meta.get("deletionTimestamp")))


ChildrenOf = Callable[[Mapping[str, Any], str, str], "Mapping[Key, Mapping[str, Any]]"]


def register(registry: kopf.OperatorRegistry, rec: Reconciler, children_of: ChildrenOf, requeue: Requeue) -> None:
    """Watch the pods of multi-node groups; reconcile their model when one changes in a way that matters (a failed
    reconcile is retried with ``requeue``'s backoff)."""
    seen: dict[tuple[str, str], tuple[Any, ...]] = {}

    def news(type: str | None, body: kopf.Body, **_: Any) -> bool:
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        if type == "DELETED":
            seen.pop(key, None)
            return True
        if type not in ("ADDED", "MODIFIED"):
            return False
        print_ = pod_fingerprint(body)
        if seen.get(key) == print_:
            return False
        seen[key] = print_
        return True

    def on_pod(type: str | None, namespace: str | None, name: str, labels: Mapping[str, str],
               **kwargs: Any) -> None:
        model = labels.get(LABEL_MODEL)
        if not model or namespace is None:
            return
        requeue.run((namespace, model),
                    lambda: rec.reconcile(namespace, model, lambda: children_of(kwargs, namespace, model),
                                          trigger=f"Pod {type}"),
                    what="group reconcile", pod=name)

    for label in (mn.LABEL_GROUP, mn.LWS_GROUP_KEY_LABEL):
        kopf.on.event("", "v1", "pods", id=f"group-pods-{label.rsplit('/', 1)[-1]}",
                      labels={label: kopf.PRESENT, LABEL_MODEL: kopf.PRESENT}, when=news,
                      registry=registry)(on_pod)


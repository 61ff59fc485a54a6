"""Applying children: server-side apply with the operator's field manager, what this process wrote, pruning.

Every write is a server-side apply (``Kube.apply``, field manager ``disagg-operator``). The :class:`Applier`
remembers what it applied, so a reconcile can skip a child whose watch-cache copy has not caught up with the
operator's own write yet (``up_to_date``) and can stand in the written object for a child the cache does not show
yet (``own_writes``).

Replicas have one owner (``disagg.builders.replicas``): with autoscaling on, a pool Deployment's ``spec.replicas``
is sent only when the Deployment is created; afterwards it is neither applied nor compared, and the operator hands
its ownership of the field to the autoscaler's field manager before its first apply without it
(:meth:`Applier.hand_over_replicas`: the server-side apply hand-over pattern; the field would otherwise be removed
and reset to 1).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from .. import logs
from ..api.contract import LABEL_MODEL
from ..builders.replicas import AUTOSCALER_FIELD_MANAGER
from .clock import Clock
from .diff import spec_hash
from .filters import EventFilters
from .kubeio import Kube, KubeError
from .objects import Key, owned_by, trim

log = logs.get("disagg.controller")

APPLIED_GRACE = 30.0
# Statuses that mean "this object as rendered is refused" (invalid free-form fields such as podTemplate,
# affinity or resources; missing permissions), as opposed to transient failures.
REJECTED = {400, 403, 422}


def replicas_managers(live: Mapping[str, Any]) -> set[str]:
    """Field managers that own ``spec.replicas`` of a live object (from its managedFields)."""
    out: set[str] = set()
    for entry in (live.get("metadata") or {}).get("managedFields") or []:
        spec = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if "f:replicas" in spec:
            out.add(str(entry.get("manager")))
    return out


def without_replicas(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out.get("spec", {}).pop("replicas", None)
    return out


class Applier:
    """Server-side apply of children, with the record of what this process applied and wrote."""

    def __init__(self, kube: Kube, clock: Clock, counters: dict[str, int], filters: EventFilters) -> None:
        self.kube = kube
        self.clock = clock
        self.counters = counters  # the reconciler's: "applies", "deletes", "scale_handovers"
        self.filters = filters
        # (namespace, kind, name) → (spec hash, time) this process applied last. Lets a reconcile skip children
        # whose watch-cache copy has not caught up with our own write yet; drift is still caught by the child's
        # own event (which carries the fresh object). A child the cache does not show at all is trusted to the
        # record only for APPLIED_GRACE seconds (its ADDED event is on the way).
        self._applied: dict[tuple[str, str, str], tuple[str, float]] = {}
        # (namespace, kind, name) → the object as our last apply returned it, for APPLIED_GRACE seconds: stands in
        # for a child the watch cache does not show yet (status must not report a Deployment we just created as
        # missing).
        self._written: dict[tuple[str, str, str], tuple[float, dict[str, Any]]] = {}

    def forget(self, namespace: str, kind: str, name: str) -> None:
        self._applied.pop((namespace, kind, name), None)
        self._written.pop((namespace, kind, name), None)

    def own_writes(self, namespace: str, model: str, children: dict[Key, Mapping[str, Any]],
                   events: Mapping[Key, Mapping[str, Any] | None]) -> None:
        """Add to ``children`` the objects of ``model`` this process wrote in the last APPLIED_GRACE seconds that the
        watch cache does not show yet (nor an event); drop older records."""
        now = self.clock.monotonic()
        for (wns, kind, child), (written_at, obj) in list(self._written.items()):
            if now - written_at >= APPLIED_GRACE:
                self._written.pop((wns, kind, child), None)  # (another model's reconcile may prune it too)
            elif (wns == namespace and (kind, child) not in children and (kind, child) not in events
                  and ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_MODEL) == model):
                children[(kind, child)] = obj  # our own write, not in the watch cache yet

    def up_to_date(self, namespace: str, key: Key, obj: Mapping[str, Any], live: Mapping[str, Any] | None) -> bool:
        """Did this process apply exactly ``obj`` (and the cache shows the child, or the write is recent)? Then a
        newer watch event will tell if someone changed it."""
        record = self._applied.get((namespace, *key))
        return record is not None and record[0] == spec_hash(obj) and (
            live is not None or self.clock.monotonic() - record[1] < APPLIED_GRACE)

    def unchanged(self, namespace: str, key: Key, compare: Mapping[str, Any], live: Mapping[str, Any] | None) -> None:
        """The live child is as wanted (``compare``; a held Deployment records the held manifest: its roll is still
        to come)."""
        self._applied[(namespace, *key)] = (spec_hash(compare) or "", self.clock.monotonic())
        self.filters.verified(namespace, key[0], live)

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        out = self.kube.apply(obj)
        self.counters["applies"] += 1
        key = (meta["namespace"], obj["kind"], meta["name"])
        self._applied[key] = (spec_hash(obj) or "", self.clock.monotonic())
        self._written[key] = (self.clock.monotonic(), trim(out))
        if out.get("metadata"):
            self.filters.verified(meta["namespace"], obj["kind"], out)
        return out

    def hand_over_replicas(self, live: dict[str, Any]) -> dict[str, Any]:
        """Before the operator's first apply without ``spec.replicas``: when it is the field's only owner, make the
        autoscaler's field manager co-own it at its current value (guarded by resourceVersion, so a concurrent
        scale is never overwritten); the operator's next apply then gives the field up instead of removing it."""
        meta = live["metadata"]
        for _ in range(4):
            owners = replicas_managers(live)
            if owners - {self.kube.field_manager} or not owners:
                return live
            replicas = int((live.get("spec") or {}).get("replicas") or 0)
            try:
                self.kube.apply_scale(meta["namespace"], meta["name"], replicas, AUTOSCALER_FIELD_MANAGER,
                                      resource_version=meta.get("resourceVersion"))
                self.counters["scale_handovers"] += 1
                log.info("replicas handed over", object=f"Deployment/{meta['name']}", replicas=replicas,
                         to=AUTOSCALER_FIELD_MANAGER)
            except KubeError as exc:
                if exc.status != 409:
                    raise
            fresh = self.kube.get("Deployment", meta["namespace"], meta["name"])
            if fresh is None:
                return live
            live, meta = fresh, fresh["metadata"]
        raise KubeError(409, f"Deployment/{meta['name']}: replicas hand-over kept conflicting")

    def prune(self, body: Mapping[str, Any], children: Mapping[Key, Mapping[str, Any]], wanted: set[Key],
              keep: Callable[[Key, Mapping[str, Any]], bool], trigger: str,
              forget: Callable[[str, str, str], None]) -> list[str]:
        """Delete the children the model owns that are no longer built (unless ``keep`` says they must stay for
        now); ``forget`` drops what the reconciler recorded of each. Returns "Kind/name" of each deleted."""
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        deleted: list[str] = []
        for key, live in children.items():
            if key not in wanted and owned_by(live, body) and not keep(key, live):
                log.info("prune", model=f"{ns}/{name}", object=f"{key[0]}/{key[1]}", trigger=trigger)
                self.kube.delete(key[0], ns, key[1])
                self.counters["deletes"] += 1
                forget(ns, *key)
                deleted.append(f"{key[0]}/{key[1]}")
        return deleted

"""Event filters: which watch events need a reconcile at all (docs/operator.md, "Scale").

kopf calls them as ``when=`` filters on its event loop, so an event that brings nothing new costs no thread, read or
build: a child whose content (:func:`child_fingerprint`) is as the operator last applied or verified it, or the
operator's own status patch coming back. The reconciler tells them what it applied, verified and wrote
(:meth:`EventFilters.verified`, :meth:`EventFilters.own_status`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .objects import BOOKKEEPING, canonical, to_plain

# What status.py and rolled_out() read of a Deployment's status: a change elsewhere in it is no news.
DEPLOYMENT_STATUS_READ = ("replicas", "readyReplicas", "updatedReplicas", "availableReplicas", "observedGeneration")
# Child kinds whose status the operator never reads (a PodDisruptionBudget's counts, a Service's load balancer).
STATUS_UNREAD = frozenset({"Service", "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "PodDisruptionBudget"})


def child_fingerprint(kind: str, body: Mapping[str, Any]) -> int:
    """A child's content as far as the operator cares: all but bookkeeping metadata, and of its status: nothing for
    the kinds in STATUS_UNREAD, the counts and conditions (type, status, reason) the model's status is computed
    from for a Deployment, everything for any other kind."""
    plain = to_plain(body)
    out = {k: v for k, v in plain.items() if k not in ("metadata", "status")}
    out["metadata"] = {k: v for k, v in (plain.get("metadata") or {}).items() if k not in BOOKKEEPING}
    st = plain.get("status") or {}
    if kind == "Deployment":
        out["status"] = {**{k: st.get(k) for k in DEPLOYMENT_STATUS_READ},
                         "conditions": [(c.get("type"), c.get("status"), c.get("reason"))
                                        for c in st.get("conditions") or []]}
    elif kind not in STATUS_UNREAD:
        out["status"] = st
    return hash(canonical(out))


class EventFilters:
    """What the operator last applied or verified of each child, and the resourceVersion of its own status patches."""

    def __init__(self, counters: dict[str, int]) -> None:
        self.counters = counters  # the reconciler's: "events_skipped"
        # (namespace, kind, name) → fingerprint of the child as the operator last applied or verified it: a watch
        # event that brings the same fingerprint (a status-only change, the ADDED event of our own create) needs
        # no reconcile (``child_news``).
        self._seen: dict[tuple[str, str, str], int] = {}
        # (namespace, name) → resourceVersion our own status patch produced: its watch event is no news.
        self._own_status: dict[tuple[str, str], str] = {}

    def child_news(self, kind: str, body: Mapping[str, Any], event_type: str | None) -> bool:
        """Does a child's watch event need a reconcile? Not when the child is as the operator last applied or
        verified it (``child_fingerprint``: everything but bookkeeping metadata and, for a Deployment, everything
        of its status but what the model's status reads): the ADDED event of our own create, a PodDisruptionBudget's
        or a Service's status update, a Deployment's status change that alters no count or condition."""
        if event_type not in ("ADDED", "MODIFIED"):
            return event_type == "DELETED"  # None: kopf's initial listing (the resume handler covers it)
        meta = body.get("metadata") or {}
        seen = self._seen.get((str(meta.get("namespace")), kind, str(meta.get("name"))))
        if seen is not None and seen == child_fingerprint(kind, body):
            self.counters["events_skipped"] += 1
            return False
        return True

    def model_news(self, body: Mapping[str, Any]) -> bool:
        """Does a model's MODIFIED event need a status-driven reconcile? Not when it is our own status patch's."""
        meta = body.get("metadata") or {}
        if self._own_status.get((str(meta.get("namespace")), str(meta.get("name")))) == meta.get("resourceVersion"):
            self.counters["events_skipped"] += 1
            return False
        return True

    def verified(self, namespace: str, kind: str, live: Mapping[str, Any] | None) -> None:
        """The operator applied ``live`` or found it as it wants it: the same content coming back is no news."""
        if live is not None:
            self._seen[(namespace, kind, str(live["metadata"]["name"]))] = child_fingerprint(kind, live)

    def own_status(self, namespace: str, name: str, written: Mapping[str, Any] | None) -> None:
        """The model as the operator's status patch returned it: its watch event is no news."""
        if written:
            self._own_status[(namespace, name)] = str((written.get("metadata") or {}).get("resourceVersion"))

    def forget(self, namespace: str, kind: str, name: str) -> None:
        self._seen.pop((namespace, kind, name), None)

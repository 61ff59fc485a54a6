"""Reporting: the model's status (conditions and their transitions as Events), refused specs and applies, drift.

:meth:`Reporter.write_status` merge-patches the operator's part of status, guarded by resourceVersion;
:meth:`Reporter.transitions` turns condition changes into Events; :meth:`Reporter.invalid` reports a spec the API
refuses (``InvalidSpec``) or an apply the apiserver refused (``ApplyFailed``, remembered in :attr:`Reporter.refused`
until a handler-triggered reconcile of that generation succeeds); :meth:`Reporter.drift` and
:meth:`Reporter.changes` are the Events of one reconcile's writes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import logs
from ..api.contract import LABEL_ROLE, WORKER_ROLES, Role
from ..api.models import DisaggregatedModel
from ..builders import replicas_owner
from . import status as st
from .clock import Clock, rfc3339
from .filters import EventFilters
from .kubeio import Kube, KubeError
from .objects import Key, ref
from .upgrade import ROLLOUT_CONDITION

log = logs.get("disagg.controller")

EmitFn = Callable[[Mapping[str, Any], str, str, str], None]  # (object, type, reason, message)


@dataclass
class Changes:
    """What one reconcile applied, by kind of change ("Kind/name"), and the objects as the applies returned them."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    recreated: list[str] = field(default_factory=list)  # deleted outside the operator (its DELETED event)
    fresh: dict[Key, Mapping[str, Any]] = field(default_factory=dict)


def pool_deployments(dm: DisaggregatedModel, children: Mapping[Key, Mapping[str, Any]],
                     fresh: Mapping[Key, Mapping[str, Any]]) -> dict[str, Mapping[str, Any] | None]:
    """Each pool's Deployment (role → object or None), the one just applied first, else the cache's."""
    model = dm.metadata["name"]
    out: dict[str, Mapping[str, Any] | None] = {}
    for role in st.pool_roles(dm):
        key = ("Deployment", f"{model}-{role}")
        out[role] = fresh.get(key) or children.get(key)
    return out


class Reporter:
    """Writes the model's status and posts the Events of a reconcile."""

    def __init__(self, kube: Kube, emit: EmitFn, clock: Clock, counters: dict[str, int], filters: EventFilters,
                 parse: Callable[[Mapping[str, Any]], DisaggregatedModel]) -> None:
        self.kube = kube
        self.emit = emit
        self.clock = clock
        self.counters = counters  # the reconciler's: "status_patches"
        self.filters = filters
        self.parse = parse
        # (namespace, name) → (generation, message) of an apply the apiserver refused. Until a handler-triggered
        # reconcile of that generation succeeds (kopf retries it), Ready stays False with this message, and
        # event-triggered reconciles do not hammer the apiserver with the same refused object.
        self.refused: dict[tuple[str, str], tuple[int | None, str]] = {}

    def now(self) -> str:
        return rfc3339(self.clock.now())

    def write_status(self, body: dict[str, Any], dm: DisaggregatedModel,
                     deployments: Mapping[str, Mapping[str, Any] | None], generation: int | None,
                     extra: list[dict[str, Any]] | None = None) -> bool:
        """Merge-patch the operator's part of status, guarded by the resourceVersion of the body the reconcile
        read: a status another writer changed meanwhile (409) is re-read, never overwritten from a stale copy."""
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        current = body.get("status") or {}
        resource_version = meta.get("resourceVersion")
        for _ in range(4):
            now = self.now()
            wanted = st.desired_status(dm, current, deployments, generation, now=now)
            if extra:
                wanted["conditions"] = st.merge_conditions(wanted["conditions"], extra, now)
            refused = self.refused.get((ns, name))
            if refused is not None and refused[0] == meta.get("generation"):
                wanted["conditions"] = st.merge_conditions(
                    wanted["conditions"], [st.condition("Ready", False, "ApplyFailed", refused[1], generation)], now)
            patch = st.status_patch(current, wanted)
            if not patch:
                return False
            try:
                out = self.kube.patch_model_status(ns, name, patch, resource_version)
                self.counters["status_patches"] += 1
                self.filters.own_status(ns, name, out)
                self.transitions(body, dm, current, wanted)
                return True
            except KubeError as exc:
                if exc.status == 404:
                    return False
                if exc.status != 409:
                    raise
            latest = self.kube.get_model(ns, name)
            if latest is None:
                return False
            if latest["metadata"].get("generation") != meta.get("generation"):
                return False  # the spec moved on; its own reconcile will write status
            dm = self.parse(latest)  # e.g. the autoscaler recorded a decision meanwhile
            current = latest.get("status") or {}
            resource_version = latest["metadata"].get("resourceVersion")
        raise KubeError(409, f"status of {ns}/{name} kept conflicting")

    def transitions(self, body: dict[str, Any], dm: DisaggregatedModel, current: Mapping[str, Any],
                    wanted: Mapping[str, Any]) -> None:
        """The Events of a status change: Ready / Starting / NotReady, PodSecurityViolation, RolloutHeld,
        ModeChanged, SlowKVTransport."""
        before = {c.get("type"): c for c in current.get("conditions") or []}
        for cond in wanted.get("conditions") or []:
            old = before.get(cond["type"])
            if (cond["type"] == "KVTransferHealthy" and cond["reason"] in st.UNMEASURED_REASONS
                    and dm.spec.kv_transfer.transport == "tcp"
                    and (old is None or old.get("message") != cond["message"])):
                self.emit(body, "Warning", "SlowKVTransport", cond["message"])
            if old is not None and old.get("status") == cond["status"] and old.get("reason") == cond["reason"]:
                continue
            if cond["type"] == "Ready":
                starting = cond["reason"].endswith("Starting")
                type_ = "Normal" if cond["status"] == "True" or starting else "Warning"
                if old is None and cond["status"] != "True":
                    type_ = "Normal"  # not ready yet right after creation is expected, not a warning
                reason = "Ready" if cond["status"] == "True" else ("Starting" if starting else "NotReady")
                self.emit(body, type_, reason, cond["message"])
            elif cond["type"] == "PodSecurity" and cond["status"] == "False":
                self.emit(body, "Warning", "PodSecurityViolation", cond["message"])
            elif cond["type"] == ROLLOUT_CONDITION and cond["status"] == "True":
                self.emit(body, "Normal", "RolloutHeld", cond["message"])
        if "activeMode" in wanted and wanted.get("activeMode") != current.get("activeMode"):
            self.emit(body, "Normal", "ModeChanged",
                      f"Active mode {wanted['activeMode']} ({wanted.get('modeReason', '')})")

    def invalid(self, body: dict[str, Any], message: str, generation: int | None,
                reason: str = "InvalidSpec") -> None:
        """Ready=False with ``reason`` and a Warning Event, once (nothing when status says so already)."""
        meta = body["metadata"]
        current = body.get("status") or {}
        wanted = st.invalid_status(current, message, generation, reason=reason, now=self.now())
        patch = st.status_patch(current, wanted)
        if not patch:
            return
        log.warning("cannot reconcile", model=f"{meta['namespace']}/{meta['name']}", reason=reason, error=message)
        self.emit(body, "Warning", reason, message)
        try:
            self.kube.patch_model_status(meta["namespace"], meta["name"], patch, None)
            self.counters["status_patches"] += 1
        except KubeError as exc:
            if exc.status != 404:
                raise

    def refused_apply(self, body: dict[str, Any], obj: Mapping[str, Any], exc: KubeError) -> str:
        """The apiserver refused a child (a status in REJECTED): remember and report it; returns the message."""
        meta = body["metadata"]
        generation = meta.get("generation")
        message = f"{ref(obj)} was refused by the apiserver: {exc.message}"
        self.refused[(meta["namespace"], meta["name"])] = (generation, message)
        self.invalid(body, message, generation, reason="ApplyFailed")
        return message

    def drift(self, parent: dict[str, Any], dm: DisaggregatedModel, desired: dict[str, Any],
              live: Mapping[str, Any] | None, fields: list[str]) -> None:
        what = ref(desired)
        if desired["kind"] == "Deployment" and fields == ["spec.replicas"]:
            role: Role = desired["metadata"]["labels"].get(LABEL_ROLE, "")
            was = (live or {}).get("spec", {}).get("replicas")
            owner = replicas_owner(dm, role) if role in WORKER_ROLES else "the operator's settings"
            self.emit(parent, "Warning", "ReplicasReverted",
                      f"{what} was scaled to {was} outside the operator; set back to {desired['spec']['replicas']}: "
                      f"replicas are owned by {owner}")
            return
        self.emit(parent, "Normal", "DriftCorrected",
                  f"Reverted {what} ({', '.join(fields) or 'fields'}) changed outside the operator")

    def changes(self, body: dict[str, Any], changes: Changes, deleted: list[str]) -> None:
        """The Events of one reconcile's applies and deletes."""
        generation = body["metadata"].get("generation")
        if changes.created:
            self.emit(body, "Normal", "Created", f"Created {', '.join(changes.created)}")
        if changes.recreated:
            self.emit(body, "Normal", "Restored",
                      f"Recreated {', '.join(changes.recreated)}: deleted outside the operator")
        if changes.updated:
            self.emit(body, "Normal", "Updated", f"Updated {', '.join(changes.updated)} for generation {generation}")
        if deleted:
            self.emit(body, "Normal", "Deleted", f"Deleted {', '.join(deleted)}: no longer in the spec")

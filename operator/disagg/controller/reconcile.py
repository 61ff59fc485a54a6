"""Reconciliation: apply the builders' output, prune what is no longer wanted, keep status. Thin I/O over pure parts.

Two entry points, both serialised per model:

- ``sync_model`` — the DisaggregatedModel changed (create, spec update, resume after a restart, or a status
  change such as the mode controller flipping ``activeMode`` or the autoscaler writing ``desiredReplicas``).
  Every child is compared with its live copy (from the operator's watch cache) and applied only when it is
  missing, its desired manifest changed, or someone else edited a field the operator sets. A reconcile with
  nothing to do makes no API writes at all.
- ``sync_child`` — a child changed or disappeared: restore it (drift correction) and, for Deployments,
  refresh the pool counts and conditions in the parent's status.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from .. import logs
from ..api.contract import LABEL_ROLE, WORKER_ROLES
from ..api.models import KIND, DisaggregatedModel
from ..api.validate import errors_of
from ..builders import BuildError, BuildSettings, build_children, parse_model, replicas_owner
from ..builders.meta import ANNOTATION_SPEC_HASH
from . import status as st
from .diff import drifted_fields, spec_hash, why_apply
from .kubeio import Kube, KubeError

log = logs.get("disagg.controller")

Key = tuple[str, str]  # (kind, name) within the model's namespace
EmitFn = Callable[[Mapping[str, Any], str, str, str], None]  # (object, type, reason, message)
APPLIED_GRACE = 30.0
# Statuses that mean "this object as rendered is refused" (invalid free-form fields such as podTemplate,
# affinity or resources; missing permissions), as opposed to transient failures.
REJECTED = {400, 403, 422}


class InvalidSpec(ValueError):
    """The spec passed the schema but cannot be built; the message names the field."""


@dataclass
class Result:
    applied: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    status_patched: bool = False
    invalid: str | None = None


def to_plain(obj: Any) -> Any:
    """kopf bodies are mapping views; pydantic and comparisons want plain dicts and lists."""
    if isinstance(obj, Mapping):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


def trim(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the watch cache keeps of an object: everything but managedFields."""
    out = to_plain(body)
    out.get("metadata", {}).pop("managedFields", None)
    return out


def owned_by(child: Mapping[str, Any], parent: Mapping[str, Any]) -> bool:
    uid = parent.get("metadata", {}).get("uid")
    for ref in child.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("controller") and (not uid or ref.get("uid") == uid):
            return True
    return False


def ref(obj: Mapping[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


class Reconciler:
    def __init__(self, kube: Kube, settings: BuildSettings | None = None, emit: EmitFn | None = None):
        self.kube = kube
        self.settings = settings or BuildSettings()
        self.emit: EmitFn = emit or (lambda obj, type_, reason, message: None)
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        # (namespace, kind, name) → (spec hash, time) this process applied last. Lets a model-level reconcile
        # skip children whose watch-cache copy has not caught up with our own write yet; drift is still caught
        # by the child's own event (sync_child compares the fresh object). A child the cache does not show at
        # all is trusted to the record only for APPLIED_GRACE seconds (its ADDED event is on the way).
        self._applied: dict[tuple[str, str, str], tuple[str, float]] = {}
        self.counters = {"reconciles": 0, "applies": 0, "deletes": 0, "status_patches": 0}
        # (namespace, name) → (generation, message) of an apply the apiserver refused. Until a model-level
        # reconcile of that generation succeeds (kopf retries it), Ready stays False with this message, and
        # status-driven reconciles do not hammer the apiserver with the same refused object.
        self._refused: dict[tuple[str, str], tuple[int | None, str]] = {}

    # ------------------------------------------------------------------------------------------ helpers

    def lock(self, namespace: str, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def forget(self, namespace: str, kind: str, name: str) -> None:
        self._applied.pop((namespace, kind, name), None)

    def desired(self, body: Mapping[str, Any]) -> tuple[DisaggregatedModel, list[dict[str, Any]]]:
        try:
            dm = parse_model(body)
        except ValidationError:
            errors = errors_of({k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body})
            raise InvalidSpec("; ".join(errors) or "invalid spec") from None
        try:
            return dm, build_children(dm, self.settings)
        except BuildError as exc:
            raise InvalidSpec(str(exc)) from None

    def _apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        out = self.kube.apply(obj)
        self.counters["applies"] += 1
        self._applied[(meta["namespace"], obj["kind"], meta["name"])] = (spec_hash(obj) or "", time.monotonic())
        return out

    # -------------------------------------------------------------------------------------- the model

    def sync_model(self, body: Mapping[str, Any], children: Mapping[Key, Mapping[str, Any]],
                   trigger: str = "") -> Result:
        body = to_plain(body)
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        with self.lock(ns, name):
            try:
                return self._sync_model(body, dict(children), trigger)
            finally:
                self.counters["reconciles"] += 1

    def _sync_model(self, body: dict[str, Any], children: dict[Key, Mapping[str, Any]], trigger: str) -> Result:
        meta = body["metadata"]
        ns, name, generation = meta["namespace"], meta["name"], meta.get("generation")
        result = Result()
        refused = self._refused.get((ns, name))
        if refused is not None and refused[0] == generation and trigger == "status":
            return result  # kopf's retry of the create/update handler will try this generation again
        try:
            dm, objs = self.desired(body)
        except InvalidSpec as exc:
            result.invalid = str(exc)
            self._report_invalid(body, str(exc), generation)
            return result

        fresh: dict[Key, Mapping[str, Any]] = {}
        created, updated, restored = [], [], []
        for obj in objs:
            obj["metadata"]["namespace"] = ns
            key = (obj["kind"], obj["metadata"]["name"])
            live = children.get(key)
            record = self._applied.get((ns, *key))
            if record is not None and record[0] == spec_hash(obj) and (
                    live is not None or time.monotonic() - record[1] < APPLIED_GRACE):
                continue  # we applied exactly this; a newer watch event will tell if someone changed it
            why = why_apply(obj, live)
            if why is None:
                self._applied[(ns, *key)] = (spec_hash(obj) or "", time.monotonic())
                continue
            log.info("apply", model=f"{ns}/{name}", object=ref(obj), why=why, trigger=trigger)
            try:
                fresh[key] = self._apply(obj)
            except KubeError as exc:
                if exc.status in REJECTED:  # the apiserver refuses the object: report it, retry later
                    message = f"{ref(obj)} was refused by the apiserver: {exc.message}"
                    result.invalid = message
                    self._refused[(ns, name)] = (generation, message)
                    self._report_invalid(body, message, generation, reason="ApplyFailed")
                raise
            {"missing": created, "changed": updated, "drifted": restored}[why].append(ref(obj))
            result.applied.append(ref(obj))

        wanted = {(o["kind"], o["metadata"]["name"]) for o in objs}
        for key, live in children.items():
            if key not in wanted and owned_by(live, body):
                log.info("prune", model=f"{ns}/{name}", object=f"{key[0]}/{key[1]}")
                self.kube.delete(key[0], ns, key[1])
                self.counters["deletes"] += 1
                self.forget(ns, *key)
                result.deleted.append(f"{key[0]}/{key[1]}")

        if created:
            self.emit(body, "Normal", "Created", f"Created {', '.join(created)}")
        if updated:
            self.emit(body, "Normal", "Updated", f"Updated {', '.join(updated)} for generation {generation}")
        if restored:
            self.emit(body, "Normal", "DriftCorrected",
                      f"Restored {', '.join(restored)}: changed outside the operator")
        if result.deleted:
            self.emit(body, "Normal", "Deleted", f"Deleted {', '.join(result.deleted)}: no longer in the spec")

        self._refused.pop((ns, name), None)
        deployments = self._deployments(dm, children, fresh)
        result.status_patched = self._write_status(body, dm, deployments, generation, set_generation=True)
        return result

    # -------------------------------------------------------------------------------------- a child

    def sync_child(self, parent: Mapping[str, Any], kind: str, name: str, live: Mapping[str, Any] | None,
                   children: Mapping[Key, Mapping[str, Any]]) -> Result:
        parent = to_plain(parent)
        meta = parent["metadata"]
        ns = meta["namespace"]
        with self.lock(ns, meta["name"]):
            return self._sync_child(parent, kind, name, to_plain(live) if live else None, dict(children))

    def _sync_child(self, parent: dict[str, Any], kind: str, name: str, live: dict[str, Any] | None,
                    children: dict[Key, Mapping[str, Any]]) -> Result:
        result = Result()
        meta = parent["metadata"]
        ns, model = meta["namespace"], meta["name"]
        status = parent.get("status") or {}
        if meta.get("deletionTimestamp") or status.get("observedGeneration") != meta.get("generation"):
            return result  # being deleted, or a spec change is pending: the model-level reconcile handles it
        try:
            dm, objs = self.desired(parent)
        except InvalidSpec:
            return result
        key = (kind, name)
        if live is None:
            children.pop(key, None)
        else:
            children[key] = live
        desired = next((o for o in objs if (o["kind"], o["metadata"]["name"]) == key), None)
        fresh: dict[Key, Mapping[str, Any]] = {}
        if desired is None:
            if live is not None and owned_by(live, parent):
                self.kube.delete(kind, ns, name)
                self.counters["deletes"] += 1
                result.deleted.append(f"{kind}/{name}")
                self.emit(parent, "Normal", "Deleted", f"Deleted {kind}/{name}: not part of the spec")
        else:
            desired["metadata"]["namespace"] = ns
            why = why_apply(desired, live)
            if why is not None:
                fields = drifted_fields({k: v for k, v in desired.items() if k not in ("apiVersion", "kind")},
                                        live) if live else []
                log.info("restore", model=f"{ns}/{model}", object=f"{kind}/{name}", why=why, fields=fields)
                fresh[key] = self._apply(desired)
                result.applied.append(f"{kind}/{name}")
                self._report_drift(parent, dm, desired, live, why, fields)
        if kind == "Deployment":
            deployments = self._deployments(dm, children, fresh)
            result.status_patched = self._write_status(parent, dm, deployments, status.get("observedGeneration"),
                                                       set_generation=False)
        return result

    def _report_drift(self, parent: dict[str, Any], dm: DisaggregatedModel, desired: dict[str, Any],
                      live: dict[str, Any] | None, why: str, fields: list[str]) -> None:
        what = ref(desired)
        if why == "missing":
            self.emit(parent, "Normal", "Restored", f"Recreated {what}: it was deleted outside the operator")
            return
        if why == "changed":
            annotations = (live or {}).get("metadata", {}).get("annotations") or {}
            if ANNOTATION_SPEC_HASH in annotations:
                self.emit(parent, "Normal", "Updated", f"Updated {what}")
                return
        if desired["kind"] == "Deployment" and fields == ["spec.replicas"]:
            role = desired["metadata"]["labels"].get(LABEL_ROLE, "")
            was = (live or {}).get("spec", {}).get("replicas")
            owner = replicas_owner(dm, role) if role in WORKER_ROLES else "the operator's settings"
            self.emit(parent, "Warning", "ReplicasReverted",
                      f"{what} was scaled to {was} outside the operator; set back to {desired['spec']['replicas']}: "
                      f"replicas are owned by {owner}")
            return
        self.emit(parent, "Normal", "DriftCorrected",
                  f"Reverted {what} ({', '.join(fields) or 'fields'}) changed outside the operator")

    # ----------------------------------------------------------------------------------------- status

    @staticmethod
    def _deployments(dm: DisaggregatedModel, children: Mapping[Key, Mapping[str, Any]],
                     fresh: Mapping[Key, Mapping[str, Any]]) -> dict[str, Mapping[str, Any] | None]:
        model = dm.metadata["name"]
        out: dict[str, Mapping[str, Any] | None] = {}
        for role in st.pool_roles(dm):
            key = ("Deployment", f"{model}-{role}")
            out[role] = fresh.get(key) or children.get(key)
        return out

    def _write_status(self, body: dict[str, Any], dm: DisaggregatedModel,
                      deployments: Mapping[str, Mapping[str, Any] | None], generation: int | None,
                      set_generation: bool) -> bool:
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        current = body.get("status") or {}
        resource_version = meta.get("resourceVersion")
        for _ in range(4):
            wanted = st.desired_status(dm, current, deployments, generation)
            refused = self._refused.get((ns, name))
            if refused is not None and refused[0] == meta.get("generation"):
                wanted["conditions"] = st.merge_conditions(
                    wanted["conditions"], [st.condition("Ready", False, "ApplyFailed", refused[1], generation)],
                    st.now_rfc3339())
            if not set_generation:
                wanted.pop("observedGeneration", None)
            patch = st.status_patch(current, wanted)
            if not patch:
                return False
            try:
                self.kube.patch_model_status(ns, name, patch, resource_version)
                self.counters["status_patches"] += 1
                self._report_transitions(body, current, wanted)
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
            current = latest.get("status") or {}
            resource_version = latest["metadata"].get("resourceVersion")
        raise KubeError(409, f"status of {ns}/{name} kept conflicting")

    def _report_transitions(self, body: dict[str, Any], current: Mapping[str, Any],
                            wanted: Mapping[str, Any]) -> None:
        before = {c.get("type"): c for c in current.get("conditions") or []}
        for cond in wanted.get("conditions") or []:
            old = before.get(cond["type"])
            if old is not None and old.get("status") == cond["status"] and old.get("reason") == cond["reason"]:
                continue
            if cond["type"] == "Ready":
                type_ = "Normal" if cond["status"] == "True" else "Warning"
                if old is None and cond["status"] != "True":
                    type_ = "Normal"  # not ready yet right after creation is expected, not a warning
                self.emit(body, type_, "Ready" if cond["status"] == "True" else "NotReady", cond["message"])
            elif cond["type"] == "KVTransferHealthy" and cond["reason"] == "SlowTransportTCP":
                self.emit(body, "Warning", "SlowKVTransport", cond["message"])
        if "activeMode" in wanted and wanted.get("activeMode") != current.get("activeMode"):
            self.emit(body, "Normal", "ModeChanged",
                      f"Active mode {wanted['activeMode']} ({wanted.get('modeReason', '')})")

    def _report_invalid(self, body: dict[str, Any], message: str, generation: int | None,
                        reason: str = "InvalidSpec") -> None:
        meta = body["metadata"]
        current = body.get("status") or {}
        wanted = st.invalid_status(current, message, generation, reason=reason)
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

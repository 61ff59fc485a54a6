"""Reconciliation: apply the builders' output, prune what is no longer wanted, keep status. Thin I/O over pure parts.

One level-triggered entry point, ``Reconciler.reconcile(namespace, name, ...)``, serialised per model. Every
trigger — the model's create/update/resume, a status change (the mode controller's ``activeMode``, the
autoscaler's records), a child's event (edited, deleted, a Deployment's readiness) — runs the same function,
which first reads the model from the apiserver (a quorum read), so no child is ever built from a stale copy of
its parent. Every child is compared with its live copy (the event's object for the child that triggered, the
operator's watch cache for the others) and applied only when it is missing, its desired manifest changed, or
someone else edited a field the operator sets (drift). A reconcile with nothing to do makes no API writes.

At hundreds of models the work per watch event matters (docs/operator.md, "Scale"): event-triggered reconciles of a
model that arrive while another waits for that model's lock join the waiting one (which has not read anything yet,
so it sees their changes: a workqueue's de-duplication); children are rebuilt only when the builders' input changed
(``build_key``); and ``child_news`` / ``model_news`` let the handlers drop events that bring nothing new — a child
whose content (``child_fingerprint``) is as the operator last applied or verified it, the operator's own status
patch coming back — before any thread, read or build.

Replicas have one owner (``disagg.builders.replicas``): with autoscaling on, a pool Deployment's ``spec.replicas``
is sent only when the Deployment is created; afterwards it is neither applied nor compared, and the operator hands
its ownership of the field to the autoscaler's field manager before its first apply without it (the server-side
apply hand-over pattern: the field would otherwise be removed and reset to 1).

Operator upgrades do not restart every GPU pool at once. A pool Deployment carries the hash of its pod template
(``serving.disagg.dev/template-hash``). When the freshly built template differs from the live one although the
model's spec has not changed since it was last reconciled (``status.observedGeneration == metadata.generation``),
the difference comes from the operator's rendering (a new operator version), not from the user: the rest of the
Deployment is applied at once, but its pod template is held (the live one is kept) until this model gets the
operator-wide upgrade slot. One model holds the slot at a time; it is released when the model's pool Deployments
have finished rolling out, or after ``upgrade_bound`` seconds. A held model shows ``RolloutPending=True`` (reason
``OperatorUpgrade``); an Event ``OperatorUpgradeRollout`` marks the start of its roll. A spec change (a new
generation) rolls at once, including any held rendering change.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError

from .. import logs
from ..api.contract import LABEL_MODEL, LABEL_ROLE, WORKER_ROLES, Role
from ..api.models import KIND, DisaggregatedModel, parse_model
from ..api.semantics import model_errors
from ..api.validate import errors_of
from ..builders import BuildSettings, build_children, replicas_owner
from ..builders.meta import ANNOTATION_TEMPLATE_HASH, stamp_spec_hash, stamp_template_hash
from ..builders.replicas import AUTOSCALER_FIELD_MANAGER, autoscaled, desired_replicas
from . import groups
from . import status as st
from .clock import Clock, RealClock, rfc3339
from .diff import covers, drifted_fields, spec_hash, why_apply
from .kubeio import Kube, KubeError

log = logs.get("disagg.controller")

Key = tuple[str, str]  # (kind, name) within the model's namespace
EmitFn = Callable[[Mapping[str, Any], str, str, str], None]  # (object, type, reason, message)
BuildFn = Callable[[DisaggregatedModel, BuildSettings], list[dict[str, Any]]]
APPLIED_GRACE = 30.0
# How long one model may hold the operator-upgrade slot when its pools do not finish rolling out (pods that never
# become ready, a stuck rollout): then the next model's held rollout starts anyway. Real vLLM pools take minutes
# per replica to load weights; a bound keeps one broken model from blocking the fleet's upgrade forever.
UPGRADE_BOUND_SECONDS = 1800.0
ROLLOUT_CONDITION = "RolloutPending"
NAMESPACE_TTL = 30.0  # seconds a namespace's labels (Pod Security levels) are reused between reconciles
# Statuses that mean "this object as rendered is refused" (invalid free-form fields such as podTemplate,
# affinity or resources; missing permissions), as opposed to transient failures.
REJECTED = {400, 403, 422}


class InvalidSpecError(ValueError):
    """The model is not one the API admits (api/: the schema, the cross-field rules, the operator's own checks);
    the message names the field(s). Reported as Ready=False reason InvalidSpec; nothing is built."""


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
    out: dict[str, Any] = to_plain(body)
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


# What status.py and rolled_out() read of a Deployment's status: a change elsewhere in it is no news.
DEPLOYMENT_STATUS_READ = ("replicas", "readyReplicas", "updatedReplicas", "availableReplicas", "observedGeneration")
# Metadata that changes with every write and says nothing about content.
BOOKKEEPING = ("resourceVersion", "managedFields", "creationTimestamp", "selfLink")
# Status fields of a model that no builder reads (builders read status.activeMode and status.pools.prefill.starting
# (builders/router.py) and pools.<pool>.desiredReplicas (builders/replicas.py; dropped from the build input by
# Reconciler.desired)): leaving them out of the build key lets a status write reuse the children already built.
# tests/controller/test_pure.py checks that changing them does not change the build.
STATUS_NOT_BUILT = ("conditions", "observed", "observedGeneration")
POOL_STATUS_NOT_BUILT = ("replicas", "readyReplicas", "summary", "lastScale")


def _canonical(value: Any) -> bytes:
    return orjson.dumps(value, default=str, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)


def build_key(body: Mapping[str, Any]) -> bytes:
    """The builders' input of a model body, canonical: equal keys build equal children."""
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k not in BOOKKEEPING}
    status = {k: v for k, v in (body.get("status") or {}).items() if k not in STATUS_NOT_BUILT}
    pools = status.get("pools")
    if isinstance(pools, Mapping):
        status["pools"] = {role: ({k: v for k, v in pool.items() if k not in POOL_STATUS_NOT_BUILT}
                                  if isinstance(pool, Mapping) else pool) for role, pool in pools.items()}
    return _canonical({**{k: v for k, v in body.items() if k not in ("metadata", "status")},
                       "metadata": meta, "status": status})


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
    return hash(_canonical(out))


# Triggers that come from kopf's create/update/resume handlers (retried by kopf with backoff).
HANDLER_TRIGGERS = ("create", "update", "resume")


def _annotations(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return ((obj or {}).get("metadata") or {}).get("annotations") or {}


def template_changed(desired: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """Does applying ``desired`` change what the live workload's pods run (a roll)? By the template-hash annotation;
    for a Deployment written before the annotation existed, by comparing the templates (live carries defaults)."""
    have = _annotations(live).get(ANNOTATION_TEMPLATE_HASH)
    if have:
        return bool(have != _annotations(desired).get(ANNOTATION_TEMPLATE_HASH))
    return not covers((live.get("spec") or {}).get("template"), (desired.get("spec") or {}).get("template"))


def _no_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _no_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_no_nulls(v) for v in value]
    return value


def held(desired: dict[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    """``desired`` with the live pod template (and its template hash): everything but the roll is applied."""
    out = copy.deepcopy(desired)
    template = _no_nulls(to_plain((live.get("spec") or {}).get("template") or {}))
    (template.get("metadata") or {}).pop("creationTimestamp", None)
    out["spec"]["template"] = template
    annotations = out["metadata"].setdefault("annotations", {})
    have = _annotations(live).get(ANNOTATION_TEMPLATE_HASH)
    if have:
        annotations[ANNOTATION_TEMPLATE_HASH] = have
    else:
        annotations.pop(ANNOTATION_TEMPLATE_HASH, None)
    return stamp_spec_hash(out)


def rolled_out(live: Mapping[str, Any] | None) -> bool:
    """Has a Deployment finished rolling out (``kubectl rollout status``'s test)?"""
    if not live:
        return False
    spec, status = live.get("spec") or {}, live.get("status") or {}
    generation = (live.get("metadata") or {}).get("generation")
    if generation is not None and int(status.get("observedGeneration") or 0) < int(generation):
        return False
    wanted = int(spec.get("replicas", 1) or 0)
    updated = int(status.get("updatedReplicas") or 0)
    return (updated >= wanted and int(status.get("replicas") or 0) <= updated
            and int(status.get("availableReplicas") or 0) >= wanted)


@dataclass
class UpgradeSlot:
    """The model whose operator-driven pod-template changes are rolling now (one across the operator)."""

    model: tuple[str, str]
    since: float
    roles: list[str] = field(default_factory=list)


class Reconciler:
    def __init__(self, kube: Kube, settings: BuildSettings | None = None, emit: EmitFn | None = None,
                 clock: Clock | None = None, build: BuildFn | None = None,
                 upgrade_bound: float = UPGRADE_BOUND_SECONDS) -> None:
        self.kube = kube
        self.settings = settings or BuildSettings()
        self.build: BuildFn = build or build_children  # the builders (tests inject a changed rendering)
        self.upgrade_bound = upgrade_bound
        self._upgrade: UpgradeSlot | None = None
        self._upgrade_guard = threading.Lock()
        # (monotonic time, "ns/name", "start" | "done" | "expired" | "gone"): the upgrade slot's history.
        self.upgrade_log: list[tuple[float, str, str]] = []
        # namespace → (read at, its labels or None when unreadable): the Pod Security check's input
        self._namespaces: dict[str, tuple[float, dict[str, str] | None]] = {}
        self.emit: EmitFn = emit or (lambda *_: None)
        self.clock: Clock = clock or RealClock()
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        # (namespace, kind, name) → (spec hash, time) this process applied last. Lets a reconcile skip children
        # whose watch-cache copy has not caught up with our own write yet; drift is still caught by the child's
        # own event (which carries the fresh object). A child the cache does not show at all is trusted to the
        # record only for APPLIED_GRACE seconds (its ADDED event is on the way).
        self._applied: dict[tuple[str, str, str], tuple[str, float]] = {}
        # (namespace, kind, name) → the object as our last apply returned it, for APPLIED_GRACE seconds: stands in
        # for a child the watch cache does not show yet (status must not report a Deployment we just created as
        # missing).
        self._written: dict[tuple[str, str, str], tuple[float, dict[str, Any]]] = {}
        self.counters = {"reconciles": 0, "applies": 0, "deletes": 0, "status_patches": 0, "scale_handovers": 0,
                         "coalesced": 0, "events_skipped": 0}
        # (namespace, name) → (build key, children as built): the builders are pure, so a model whose build
        # input (``build_key``) is unchanged gets the same children without rebuilding them.
        self._built: dict[tuple[str, str], tuple[bytes, bytes]] = {}  # (build key, the children as JSON)
        # (namespace, kind, name) → fingerprint of the child as the operator last applied or verified it: a watch
        # event that brings the same fingerprint (a status-only change, the ADDED event of our own create) needs
        # no reconcile (``child_news``).
        self._seen: dict[tuple[str, str, str], int] = {}
        # (namespace, name) → resourceVersion our own status patch produced: its watch event is no news.
        self._own_status: dict[tuple[str, str], str] = {}
        # (namespace, name) → the child events queued for the next reconcile of that model (a reconcile waiting for
        # the model's lock; it has not read anything yet). Later event-triggered reconciles join it instead of
        # queueing behind it: one reconcile does the work of a burst of events (a workqueue's de-duplication).
        self._pending: dict[tuple[str, str], dict[Key, Mapping[str, Any] | None]] = {}
        self._pending_guard = threading.Lock()
        # (namespace, name) → (generation, message) of an apply the apiserver refused. Until a handler-triggered
        # reconcile of that generation succeeds (kopf retries it), Ready stays False with this message, and
        # event-triggered reconciles do not hammer the apiserver with the same refused object.
        self._refused: dict[tuple[str, str], tuple[int | None, str]] = {}

    # ------------------------------------------------------------------------------------------ helpers

    def lock(self, namespace: str, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def forget(self, namespace: str, kind: str, name: str) -> None:
        self._applied.pop((namespace, kind, name), None)
        self._written.pop((namespace, kind, name), None)
        self._seen.pop((namespace, kind, name), None)

    # ------------------------------------------------------------------------------- event filters

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

    def _verified(self, namespace: str, kind: str, live: Mapping[str, Any] | None) -> None:
        if live is not None:
            self._seen[(namespace, kind, str(live["metadata"]["name"]))] = child_fingerprint(kind, live)

    def now(self) -> str:
        return rfc3339(self.clock.now())

    @staticmethod
    def parse(body: Mapping[str, Any]) -> DisaggregatedModel:
        """The model as pydantic reads it (the schema and the cross-field rules); InvalidSpecError with every error
        the API finds (api/validate.py, naming each field) when it does not parse."""
        try:
            return parse_model(body)
        except ValidationError:
            errors = errors_of({k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body})
            raise InvalidSpecError("; ".join(errors) or "invalid spec") from None

    def admit(self, body: Mapping[str, Any]) -> DisaggregatedModel:
        """The model, validated once, in api/, before anything is built from it: ``parse``, then the operator's own
        checks (api/semantics.py ``model_errors``) with the LeaderWorkerSet CRD as the cluster has it. Raises
        InvalidSpecError naming the field(s)."""
        dm = self.parse(body)
        settings = groups.refresh_settings(self, dm)  # (multi-node pools: is the LeaderWorkerSet CRD installed?)
        errors = model_errors(dm.metadata, dm.spec, lws_installed=settings.lws_installed)
        if errors:
            raise InvalidSpecError("; ".join(errors))
        return dm

    def desired(self, body: Mapping[str, Any], prefill_starting: bool | None = None,
                ) -> tuple[DisaggregatedModel, list[dict[str, Any]]]:
        """The model (with its status) and its children as built now; InvalidSpecError when the API refuses the
        model (``admit``).

        The children are built from a copy of the body without the autoscaler's recorded replicas (so a scaling
        decision does not change a manifest's hash: replicas are the autoscaler's, not the operator's) and, when
        given, with the prefill pool's starting flag as this reconcile computed it (the router config follows
        readiness without waiting for a second pass).
        """
        dm = self.admit(body)
        build = copy.deepcopy(dict(body))
        pools = (build.get("status") or {}).get("pools")
        if isinstance(pools, dict):
            for role in ("prefill", "decode"):
                if isinstance(pools.get(role), dict) and not groups.keeps_desired_replicas(dm, role):
                    pools[role].pop("desiredReplicas", None)
        if prefill_starting is not None:
            status: dict[str, Any] = build["status"] if isinstance(build.get("status"), dict) else {}
            build["status"] = status
            pools = status.setdefault("pools", {})
            pools["prefill"] = {**(pools.get("prefill") or {}), "starting": prefill_starting}
        meta = build.get("metadata") or {}
        model = (str(meta.get("namespace")), str(meta.get("name")))
        key = build_key(build)
        cached = self._built.get(model)
        if cached is not None and cached[0] == key:
            return dm, orjson.loads(cached[1])  # a fresh copy (callers may change it), cheaper than deepcopy
        objs = self.build(parse_model(build), self.settings)  # (admitted above: the builders refuse nothing)
        for obj in objs:
            if obj["kind"] == "Deployment" and obj["metadata"].get("labels", {}).get(LABEL_ROLE) in WORKER_ROLES:
                stamp_template_hash(obj)
        self._built[model] = (key, orjson.dumps(objs))
        return dm, objs

    # ---------------------------------------------------------------------------------- upgrade slot

    def _take_slot(self, model: tuple[str, str], roles: list[str]) -> tuple[bool, bool, str]:
        """(may roll now, just started, holder) for a model with held operator-driven template changes."""
        now = self.clock.monotonic()
        with self._upgrade_guard:
            slot = self._upgrade
            if slot is not None and slot.model != model and now - slot.since >= self.upgrade_bound:
                log.warning("operator-upgrade rollout bound reached", model="/".join(slot.model),
                            seconds=self.upgrade_bound)
                self.upgrade_log.append((now, "/".join(slot.model), "expired"))
                slot = self._upgrade = None
            if slot is None:
                self._upgrade = UpgradeSlot(model, now, sorted(roles))
                self.upgrade_log.append((now, "/".join(model), "start"))
                return True, True, ""
            if slot.model == model:
                slot.roles = sorted(set(slot.roles) | set(roles))
                return True, False, ""
            return False, False, "/".join(slot.model)

    def _release_slot(self, model: tuple[str, str], why: str) -> None:
        with self._upgrade_guard:
            if self._upgrade is not None and self._upgrade.model == model:
                self._upgrade = None
                self.upgrade_log.append((self.clock.monotonic(), "/".join(model), why))

    def namespace_labels(self, namespace: str) -> dict[str, str] | None:
        """The namespace's labels, re-read at most every NAMESPACE_TTL seconds; None when the operator may not read
        namespaces (RBAC) or the read fails."""
        now = self.clock.monotonic()
        cached = self._namespaces.get(namespace)
        if cached is not None and now - cached[0] < NAMESPACE_TTL:
            return cached[1]
        try:
            ns = self.kube.get_namespace(namespace)
            labels: dict[str, str] | None = dict(((ns or {}).get("metadata") or {}).get("labels") or {})
        except KubeError as exc:
            log.warning("namespace unreadable", namespace=namespace, error=str(exc))
            labels = None
        self._namespaces[namespace] = (now, labels)
        return labels

    def holding_slot(self, namespace: str, name: str) -> UpgradeSlot | None:
        with self._upgrade_guard:
            slot = self._upgrade
            return slot if slot is not None and slot.model == (namespace, name) else None

    def _apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        out = self.kube.apply(obj)
        self.counters["applies"] += 1
        key = (meta["namespace"], obj["kind"], meta["name"])
        self._applied[key] = (spec_hash(obj) or "", self.clock.monotonic())
        self._written[key] = (self.clock.monotonic(), trim(out))
        if out.get("metadata"):
            self._verified(meta["namespace"], obj["kind"], out)
        return out

    def _hand_over_replicas(self, live: dict[str, Any]) -> dict[str, Any]:
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

    # -------------------------------------------------------------------------------------- reconcile

    def reconcile(self, namespace: str, name: str,
                  children: Mapping[Key, Mapping[str, Any]] | Callable[[], Mapping[Key, Mapping[str, Any]]],
                  trigger: str = "", event: tuple[str, str, Mapping[str, Any] | None] | None = None) -> Result:
        """Bring the children and status of ``namespace/name`` in line with the model as the apiserver has it now.

        ``children`` is the watch cache's view (or a function reading it, called once the model's lock is held, so
        the view is as recent as possible); ``event`` = (kind, name, object or None when deleted) is the child
        whose event triggered this reconcile: its copy is fresher than the cache's.
        """
        model = (namespace, name)
        mine: dict[Key, Mapping[str, Any] | None] = {}
        if event is not None:
            mine[(event[0], event[1])] = event[2]
        with self._pending_guard:
            queued = self._pending.get(model)
            if queued is not None and trigger not in HANDLER_TRIGGERS:
                queued.update(mine)  # the reconcile waiting for this model's lock does this one's work too
                self.counters["coalesced"] += 1
                return Result()
            if queued is None:
                self._pending[model] = mine
        with self.lock(namespace, name):
            with self._pending_guard:
                if self._pending.get(model) is mine:
                    del self._pending[model]
            try:
                body = self.kube.get_model(namespace, name)
                if body is None or body["metadata"].get("deletionTimestamp"):
                    self._release_slot((namespace, name), "gone")
                    self._built.pop(model, None)
                    return Result()  # gone or going: owner references let the garbage collector do the rest
                view = children() if callable(children) else children
                # (the index holds plain dicts already, which the reconcile only reads)
                kids = {k: v if isinstance(v, dict) else to_plain(v) for k, v in view.items()}
                for (kind, child), live in mine.items():
                    if live is None:
                        kids.pop((kind, child), None)
                        self.forget(namespace, kind, child)
                    else:
                        kids[(kind, child)] = trim(live)
                return self._reconcile(body, kids, trigger, mine)
            finally:
                self.counters["reconciles"] += 1

    def _reconcile(self, body: dict[str, Any], children: dict[Key, Mapping[str, Any]], trigger: str,
                   events: Mapping[Key, Mapping[str, Any] | None]) -> Result:
        meta = body["metadata"]
        ns, name, generation = meta["namespace"], meta["name"], meta.get("generation")
        result = Result()
        refused = self._refused.get((ns, name))
        if refused is not None and refused[0] != generation:
            self._refused.pop((ns, name), None)  # the spec moved on: the new generation gets its own chance
        elif refused is not None and trigger not in HANDLER_TRIGGERS:
            return result  # kopf's retry of the create/update handler will try this generation again
        now = self.clock.monotonic()
        for (wns, kind, child), (written_at, obj) in list(self._written.items()):
            if now - written_at >= APPLIED_GRACE:
                self._written.pop((wns, kind, child), None)  # (another model's reconcile may prune it too)
            elif (wns == ns and (kind, child) not in children and (kind, child) not in events
                  and ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_MODEL) == name):
                children[(kind, child)] = obj  # our own write, not in the watch cache yet
        try:
            dm = self.admit(body)
            plan = groups.observe(self, dm, ns)  # multi-node pools: group restarts, counts (controller/groups.py)
            starting = st.pools_starting(dm, body.get("status") or {},
                                         {**self._deployments(dm, children, {}), **plan.views})
            dm, objs = self.desired(body, prefill_starting=starting.get("prefill", False))
        except InvalidSpecError as exc:
            result.invalid = str(exc)
            self._report_invalid(body, str(exc), generation)
            return result

        # Pod-template changes that come from the operator's rendering (the spec is the one last reconciled) wait
        # for the operator-wide upgrade slot; everything else about those Deployments is applied at once.
        # (A generation whose apply the apiserver refused half-way still has the user's changes to roll.)
        spec_unchanged = ((body.get("status") or {}).get("observedGeneration") == generation
                          and (ns, name) not in self._refused)
        pools: dict[str, dict[str, Any]] = {}
        pending: list[str] = []
        for obj in objs:
            role = obj["metadata"].get("labels", {}).get(LABEL_ROLE, "")
            if obj["kind"] == "Deployment" and role in WORKER_ROLES:
                pools[role] = obj
                live = children.get((obj["kind"], obj["metadata"]["name"]))
                if live is not None and spec_unchanged and template_changed(obj, live):
                    pending.append(role)
        hold, holder = False, ""
        if pending:
            may, started, holder = self._take_slot((ns, name), pending)
            hold = not may
            if started:
                log.info("operator-upgrade rollout", model=f"{ns}/{name}", pools=pending)
                self.emit(body, "Normal", "OperatorUpgradeRollout",
                          f"Rolling the {', '.join(sorted(pending))} pool(s) for an operator upgrade: the operator "
                          f"renders their pod templates differently (spec generation {generation} unchanged); "
                          "other models' held rollouts wait until these Deployments finish rolling out")

        fresh: dict[Key, Mapping[str, Any]] = {}
        created: list[str] = []
        updated: list[str] = []
        restored: list[str] = []
        recreated: list[str] = []
        for obj in objs:
            obj["metadata"]["namespace"] = ns
            key = (obj["kind"], obj["metadata"]["name"])
            role = obj["metadata"].get("labels", {}).get(LABEL_ROLE, "")
            scaled = obj["kind"] == "Deployment" and role in WORKER_ROLES and autoscaled(dm, role)
            compare = without_replicas(obj) if scaled else obj
            live = children.get(key)
            holding = hold and obj["kind"] == "Deployment" and role in pending
            if holding and live is not None:
                compare = held(compare, live)
            record = self._applied.get((ns, *key))
            evented = key in events  # its copy is the event's: fresh
            if not evented and record is not None and record[0] == spec_hash(obj) and (
                    live is not None or self.clock.monotonic() - record[1] < APPLIED_GRACE):
                continue  # we applied exactly this; a newer watch event will tell if someone changed it
            why = why_apply(compare, live)
            if why is not None and scaled:
                # The replica count must never be written from a cache: read the Deployment as it is now.
                current = self.kube.get("Deployment", ns, key[1])
                live = None if current is None else trim(current)
                if holding and live is not None:
                    compare = held(without_replicas(obj), live)
                why = why_apply(compare, live)
                if why is not None and current is not None:
                    self._hand_over_replicas(current)
            if why is None:  # (a held Deployment records the held manifest: its roll is still to come)
                self._applied[(ns, *key)] = (spec_hash(compare) or "", self.clock.monotonic())
                self._verified(ns, key[0], live)
                continue
            to_apply = compare
            if scaled and why == "missing":  # created: the only apply that carries the replica count
                to_apply = {**obj, "spec": {**obj["spec"], "replicas": desired_replicas(dm, role)}}
            fields = drifted_fields({k: v for k, v in compare.items() if k not in ("apiVersion", "kind")},
                                    live) if why == "drifted" else []
            log.info("restore" if why == "drifted" else "apply", model=f"{ns}/{name}", object=ref(obj), why=why,
                     fields=fields, trigger=trigger)
            try:
                fresh[key] = self._apply(to_apply)
            except KubeError as exc:
                if exc.status in REJECTED:  # the apiserver refuses the object: report it, retry later
                    message = f"{ref(obj)} was refused by the apiserver: {exc.message}"
                    result.invalid = message
                    self._refused[(ns, name)] = (generation, message)
                    self._report_invalid(body, message, generation, reason="ApplyFailed")
                raise
            result.applied.append(ref(obj))
            if why == "missing":
                (recreated if evented and events[key] is None else created).append(ref(obj))
            elif why == "changed":
                updated.append(ref(obj))
            else:
                restored.append(ref(obj))
                self._report_drift(body, dm, obj, live, fields)

        wanted = {(o["kind"], o["metadata"]["name"]) for o in objs}
        for key, live in children.items():
            if key not in wanted and owned_by(live, body) and not plan.keep(key, live):
                log.info("prune", model=f"{ns}/{name}", object=f"{key[0]}/{key[1]}", trigger=trigger)
                self.kube.delete(key[0], ns, key[1])
                self.counters["deletes"] += 1
                self.forget(ns, *key)
                result.deleted.append(f"{key[0]}/{key[1]}")

        if created:
            self.emit(body, "Normal", "Created", f"Created {', '.join(created)}")
        if recreated:
            self.emit(body, "Normal", "Restored",
                      f"Recreated {', '.join(recreated)}: deleted outside the operator")
        if updated:
            self.emit(body, "Normal", "Updated", f"Updated {', '.join(updated)} for generation {generation}")
        if result.deleted:
            self.emit(body, "Normal", "Deleted", f"Deleted {', '.join(result.deleted)}: no longer in the spec")

        if trigger in HANDLER_TRIGGERS:
            self._refused.pop((ns, name), None)
        deployments = self._deployments(dm, children, fresh)
        deployments.update(plan.views)  # a multi-node pool's counts are its groups'
        rollout = self._rollout_condition(body, pools, deployments, pending if hold else [], holder)
        needed = {o["metadata"]["labels"].get(LABEL_ROLE, o["metadata"]["name"]): st.template_level(o)
                  for o in objs if o["kind"] == "Deployment"}
        security = st.pod_security_condition(ns, self.namespace_labels(ns), needed, generation)
        result.status_patched = self._write_status(body, dm, deployments, generation, [rollout, security])
        return result

    def _rollout_condition(self, body: dict[str, Any], pools: Mapping[str, Mapping[str, Any]],
                           deployments: Mapping[str, Mapping[str, Any] | None], held_roles: list[str],
                           holder: str) -> dict[str, Any]:
        """RolloutPending for this model; releases the upgrade slot when this model's roll has finished."""
        meta = body["metadata"]
        ns, name, generation = meta["namespace"], meta["name"], meta.get("generation")
        if held_roles:
            return st.condition(
                ROLLOUT_CONDITION, True, "OperatorUpgrade",
                f"The operator renders the {', '.join(sorted(held_roles))} pod template(s) differently from the "
                f"running ones (an operator upgrade; spec generation {generation} unchanged). Held so that operator "
                f"upgrades roll one model at a time: waiting for {holder} to finish rolling out (at most "
                f"{self.upgrade_bound:.0f}s). A change to this model's spec rolls at once.", generation)
        slot = self.holding_slot(ns, name)
        if slot is not None:
            waiting = [r for r in slot.roles if r in pools
                       and (template_changed(pools[r], deployments.get(r) or {}) or not rolled_out(deployments.get(r)))]
            if waiting:
                return st.condition(ROLLOUT_CONDITION, False, "OperatorUpgradeRolling",
                                    f"Rolling the {', '.join(waiting)} pool(s) for an operator upgrade; other models' "
                                    "held rollouts start when these Deployments have finished rolling out.",
                                    generation)
            self._release_slot((ns, name), "done")
            log.info("operator-upgrade rollout finished", model=f"{ns}/{name}", pools=slot.roles)
        return st.condition(ROLLOUT_CONDITION, False, "NoRolloutPending", "No pod-template change is held.",
                            generation)

    def _report_drift(self, parent: dict[str, Any], dm: DisaggregatedModel, desired: dict[str, Any],
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
            refused = self._refused.get((ns, name))
            if refused is not None and refused[0] == meta.get("generation"):
                wanted["conditions"] = st.merge_conditions(
                    wanted["conditions"], [st.condition("Ready", False, "ApplyFailed", refused[1], generation)], now)
            patch = st.status_patch(current, wanted)
            if not patch:
                return False
            try:
                out = self.kube.patch_model_status(ns, name, patch, resource_version)
                self.counters["status_patches"] += 1
                if out:
                    self._own_status[(ns, name)] = str((out.get("metadata") or {}).get("resourceVersion"))
                self._report_transitions(body, dm, current, wanted)
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

    def _report_transitions(self, body: dict[str, Any], dm: DisaggregatedModel, current: Mapping[str, Any],
                            wanted: Mapping[str, Any]) -> None:
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

    def _report_invalid(self, body: dict[str, Any], message: str, generation: int | None,
                        reason: str = "InvalidSpec") -> None:
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

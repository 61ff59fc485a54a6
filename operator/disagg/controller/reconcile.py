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
(``build_key``); and ``EventFilters.child_news`` / ``model_news`` (filters.py) let the handlers drop events that
bring nothing new — a child whose content (``child_fingerprint``) is as the operator last applied or verified it,
the operator's own status patch coming back — before any thread, read or build.

The reconcile is a sequence of named steps (``Reconciler._reconcile``), each job in its own module:
``filters.py`` (which events need a reconcile), ``upgrade.py`` (the operator-upgrade rollout slot: held pod
templates), ``apply.py`` (server-side apply, the replicas hand-over, pruning), ``report.py`` (status, conditions,
Events), ``groups.py`` (multi-node pools). This module keeps the entry point: per-model locks and coalescing, the
build cache, and the order of the steps.
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
from ..api.contract import LABEL_ROLE, WORKER_ROLES
from ..api.models import DisaggregatedModel, parse_model
from ..api.semantics import model_errors
from ..api.validate import errors_of
from ..builders import BuildSettings, build_children
from ..builders.meta import stamp_template_hash
from ..builders.replicas import autoscaled, desired_replicas
from . import groups
from . import status as st
from .apply import REJECTED, Applier, without_replicas
from .clock import Clock, RealClock
from .diff import drifted_fields, why_apply
from .filters import EventFilters
from .kubeio import Kube, KubeError
from .objects import BOOKKEEPING, Key, canonical, ref, to_plain, trim
from .report import Changes, EmitFn, Reporter, pool_deployments
from .upgrade import UPGRADE_BOUND_SECONDS, Hold, UpgradeSlots, held

log = logs.get("disagg.controller")

BuildFn = Callable[[DisaggregatedModel, BuildSettings], list[dict[str, Any]]]
NAMESPACE_TTL = 30.0  # seconds a namespace's labels (Pod Security levels) are reused between reconciles
# Triggers that come from kopf's create/update/resume handlers (retried by kopf with backoff).
HANDLER_TRIGGERS = ("create", "update", "resume")
# Status fields of a model that no builder reads (builders read status.activeMode and status.pools.prefill.starting
# (builders/router.py) and pools.<pool>.desiredReplicas (builders/replicas.py; dropped from the build input by
# Reconciler.desired)): leaving them out of the build key lets a status write reuse the children already built.
# tests/controller/test_pure.py checks that changing them does not change the build.
STATUS_NOT_BUILT = ("conditions", "observed", "observedGeneration")
POOL_STATUS_NOT_BUILT = ("replicas", "readyReplicas", "summary", "lastScale")


class InvalidSpecError(ValueError):
    """The model is not one the API admits (api/: the schema, the cross-field rules, the operator's own checks);
    the message names the field(s). Reported as Ready=False reason InvalidSpec; nothing is built."""


@dataclass
class Result:
    applied: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    status_patched: bool = False
    invalid: str | None = None


def build_key(body: Mapping[str, Any]) -> bytes:
    """The builders' input of a model body, canonical: equal keys build equal children."""
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k not in BOOKKEEPING}
    status = {k: v for k, v in (body.get("status") or {}).items() if k not in STATUS_NOT_BUILT}
    pools = status.get("pools")
    if isinstance(pools, Mapping):
        status["pools"] = {role: ({k: v for k, v in pool.items() if k not in POOL_STATUS_NOT_BUILT}
                                  if isinstance(pool, Mapping) else pool) for role, pool in pools.items()}
    return canonical({**{k: v for k, v in body.items() if k not in ("metadata", "status")},
                      "metadata": meta, "status": status})


def parse(body: Mapping[str, Any]) -> DisaggregatedModel:
    """The model as pydantic reads it (the schema and the cross-field rules); InvalidSpecError with every error
    the API finds (api/validate.py, naming each field) when it does not parse."""
    try:
        return parse_model(body)
    except ValidationError:
        errors = errors_of({k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body})
        raise InvalidSpecError("; ".join(errors) or "invalid spec") from None


class Reconciler:
    def __init__(self, kube: Kube, settings: BuildSettings | None = None, emit: EmitFn | None = None,
                 clock: Clock | None = None, build: BuildFn | None = None,
                 upgrade_bound: float = UPGRADE_BOUND_SECONDS) -> None:
        self.kube = kube
        self.settings = settings or BuildSettings()
        self.build: BuildFn = build or build_children  # the builders (tests inject a changed rendering)
        self.emit: EmitFn = emit or (lambda *_: None)
        self.clock: Clock = clock or RealClock()
        self.counters = {"reconciles": 0, "applies": 0, "deletes": 0, "status_patches": 0, "scale_handovers": 0,
                         "coalesced": 0, "events_skipped": 0}
        # The jobs, each with its own state (see the module docstring).
        self.filters = EventFilters(self.counters)
        self.upgrades = UpgradeSlots(self.clock, upgrade_bound)
        self.upgrade_log = self.upgrades.log  # (monotonic time, "ns/name", "start" | "done" | "expired" | "gone")
        self.applier = Applier(kube, self.clock, self.counters, self.filters)
        self.report = Reporter(kube, self.emit, self.clock, self.counters, self.filters, parse)
        # namespace → (read at, its labels or None when unreadable): the Pod Security check's input
        self._namespaces: dict[str, tuple[float, dict[str, str] | None]] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        # (namespace, name) → (build key, children as built): the builders are pure, so a model whose build
        # input (``build_key``) is unchanged gets the same children without rebuilding them.
        self._built: dict[tuple[str, str], tuple[bytes, bytes]] = {}  # (build key, the children as JSON)
        # (namespace, name) → the child events queued for the next reconcile of that model (a reconcile waiting for
        # the model's lock; it has not read anything yet). Later event-triggered reconciles join it instead of
        # queueing behind it: one reconcile does the work of a burst of events (a workqueue's de-duplication).
        self._pending: dict[tuple[str, str], dict[Key, Mapping[str, Any] | None]] = {}
        self._pending_guard = threading.Lock()

    @property
    def upgrade_bound(self) -> float:
        return self.upgrades.bound

    # ------------------------------------------------------------------------------------------ helpers

    def lock(self, namespace: str, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def forget(self, namespace: str, kind: str, name: str) -> None:
        """Drop everything recorded of a child (deleted, or pruned)."""
        self.applier.forget(namespace, kind, name)
        self.filters.forget(namespace, kind, name)

    def use_settings(self, settings: BuildSettings) -> None:
        """Build with ``settings`` from now on; children built with the old ones are built again."""
        self.settings = settings
        self._built.clear()

    parse = staticmethod(parse)

    def admit(self, body: Mapping[str, Any]) -> DisaggregatedModel:
        """The model, validated once, in api/, before anything is built from it: ``parse``, then the operator's own
        checks (api/semantics.py ``model_errors``) with the LeaderWorkerSet CRD as the cluster has it. Raises
        InvalidSpecError naming the field(s)."""
        dm = parse(body)
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
                    self.upgrades.release((namespace, name), "gone")
                    self._built.pop(model, None)
                    return Result()  # gone or going: owner references let the garbage collector do the rest
                return self._reconcile(body, self._view(namespace, children, mine), trigger, mine)
            finally:
                self.counters["reconciles"] += 1

    def _view(self, namespace: str,
              children: Mapping[Key, Mapping[str, Any]] | Callable[[], Mapping[Key, Mapping[str, Any]]],
              events: Mapping[Key, Mapping[str, Any] | None]) -> dict[Key, Mapping[str, Any]]:
        """The live children: the watch cache's, with the triggering events' objects in their place."""
        view = children() if callable(children) else children
        # (the index holds plain dicts already, which the reconcile only reads)
        kids = {k: v if isinstance(v, dict) else to_plain(v) for k, v in view.items()}
        for (kind, child), live in events.items():
            if live is None:
                kids.pop((kind, child), None)
                self.forget(namespace, kind, child)
            else:
                kids[(kind, child)] = trim(live)
        return kids

    def _reconcile(self, body: dict[str, Any], children: dict[Key, Mapping[str, Any]], trigger: str,
                   events: Mapping[Key, Mapping[str, Any] | None]) -> Result:
        """The steps of one reconcile, in order."""
        meta = body["metadata"]
        ns, name, generation = meta["namespace"], meta["name"], meta.get("generation")
        result = Result()
        if self._waits_for_handler(body, trigger):
            return result
        self.applier.own_writes(ns, name, children, events)
        try:
            dm, plan, objs = self._plan(body, children)
        except InvalidSpecError as exc:
            result.invalid = str(exc)
            self.report.invalid(body, str(exc), generation)
            return result
        hold = self._hold_upgrades(body, objs, children)
        changes = self._apply_children(body, dm, objs, children, events, hold, trigger, result)
        wanted = {(o["kind"], o["metadata"]["name"]) for o in objs}
        result.deleted = self.applier.prune(body, children, wanted, plan.keep, trigger, self.forget)
        self.report.changes(body, changes, result.deleted)
        if trigger in HANDLER_TRIGGERS:
            self.report.refused.pop((ns, name), None)
        result.status_patched = self._write_status(body, dm, objs, children, changes, plan, hold)
        return result

    def _waits_for_handler(self, body: Mapping[str, Any], trigger: str) -> bool:
        """Is this generation's apply refused, and this no handler-triggered reconcile? Then kopf's retry of the
        create/update handler will try it again; a new generation gets its own chance."""
        meta = body["metadata"]
        model, generation = (meta["namespace"], meta["name"]), meta.get("generation")
        refused = self.report.refused.get(model)
        if refused is not None and refused[0] != generation:
            self.report.refused.pop(model, None)  # the spec moved on: the new generation gets its own chance
            return False
        return refused is not None and trigger not in HANDLER_TRIGGERS

    def _plan(self, body: dict[str, Any], children: Mapping[Key, Mapping[str, Any]],
              ) -> tuple[DisaggregatedModel, groups.GroupPlan, list[dict[str, Any]]]:
        """Admit the model, observe its multi-node groups, build its children. InvalidSpecError when refused."""
        dm = self.admit(body)
        plan = groups.observe(self, dm, body["metadata"]["namespace"])  # multi-node pools (controller/groups.py)
        starting = st.pools_starting(dm, body.get("status") or {},
                                     {**pool_deployments(dm, children, {}), **plan.views})
        dm, objs = self.desired(body, prefill_starting=starting.get("prefill", False))
        return dm, plan, objs

    def _hold_upgrades(self, body: dict[str, Any], objs: list[dict[str, Any]],
                       children: Mapping[Key, Mapping[str, Any]]) -> Hold:
        """Pod-template changes that come from the operator's rendering (the spec is the one last reconciled) wait
        for the operator-wide upgrade slot; everything else about those Deployments is applied at once.
        (A generation whose apply the apiserver refused half-way still has the user's changes to roll.)"""
        meta = body["metadata"]
        spec_unchanged = ((body.get("status") or {}).get("observedGeneration") == meta.get("generation")
                          and (meta["namespace"], meta["name"]) not in self.report.refused)
        namespace = meta["namespace"]

        def read(name: str) -> Mapping[str, Any] | None:
            current = self.kube.get("Deployment", namespace, name)
            return None if current is None else trim(current)

        return self.upgrades.plan(body, objs, children, spec_unchanged, self.emit, read)

    def _apply_children(self, body: dict[str, Any], dm: DisaggregatedModel, objs: list[dict[str, Any]],
                        children: Mapping[Key, Mapping[str, Any]], events: Mapping[Key, Mapping[str, Any] | None],
                        hold: Hold, trigger: str, result: Result) -> Changes:
        """Apply every child that is missing, changed or drifted; record the others as verified."""
        changes = Changes()
        for obj in objs:
            obj["metadata"]["namespace"] = body["metadata"]["namespace"]
            self._apply_child(body, dm, obj, children, events, hold, trigger, result, changes)
        return changes

    def _apply_child(self, body: dict[str, Any], dm: DisaggregatedModel, obj: dict[str, Any],
                     children: Mapping[Key, Mapping[str, Any]], events: Mapping[Key, Mapping[str, Any] | None],
                     hold: Hold, trigger: str, result: Result, changes: Changes) -> None:
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        key = (obj["kind"], obj["metadata"]["name"])
        role = obj["metadata"].get("labels", {}).get(LABEL_ROLE, "")
        scaled = obj["kind"] == "Deployment" and role in WORKER_ROLES and autoscaled(dm, role)
        compare = without_replicas(obj) if scaled else obj
        live = children.get(key)
        holding = hold.holds(obj)
        if holding:
            live = hold.live[role]  # (read from the apiserver: the cache's or an event's copy may be stale)
            compare = held(compare, live)
        evented = key in events  # its copy is the event's: fresh
        if not evented and self.applier.up_to_date(ns, key, obj, live):
            return  # we applied exactly this; a newer watch event will tell if someone changed it
        why = why_apply(compare, live)
        if why is not None and scaled:
            # The replica count must never be written from a cache: read the Deployment as it is now.
            current = self.kube.get("Deployment", ns, key[1])
            live = None if current is None else trim(current)
            if holding and live is not None:
                compare = held(without_replicas(obj), live)
            why = why_apply(compare, live)
            if why is not None and current is not None:
                self.applier.hand_over_replicas(current)
        if why is None:
            self.applier.unchanged(ns, key, compare, live)
            return
        to_apply = compare
        if scaled and why == "missing":  # created: the only apply that carries the replica count
            to_apply = {**obj, "spec": {**obj["spec"], "replicas": desired_replicas(dm, role)}}
        fields = drifted_fields({k: v for k, v in compare.items() if k not in ("apiVersion", "kind")},
                                live) if why == "drifted" else []
        log.info("restore" if why == "drifted" else "apply", model=f"{ns}/{name}", object=ref(obj), why=why,
                 fields=fields, trigger=trigger)
        try:
            changes.fresh[key] = self.applier.apply(to_apply)
        except KubeError as exc:
            if exc.status in REJECTED:  # the apiserver refuses the object: report it, retry later
                result.invalid = self.report.refused_apply(body, obj, exc)
            raise
        result.applied.append(ref(obj))
        if why == "missing":
            (changes.recreated if evented and events[key] is None else changes.created).append(ref(obj))
        elif why == "changed":
            changes.updated.append(ref(obj))
        else:
            changes.restored.append(ref(obj))
            self.report.drift(body, dm, obj, live, fields)

    def _write_status(self, body: dict[str, Any], dm: DisaggregatedModel, objs: list[dict[str, Any]],
                      children: Mapping[Key, Mapping[str, Any]], changes: Changes, plan: groups.GroupPlan,
                      hold: Hold) -> bool:
        """Status from the pools as they are after the applies, with RolloutPending and PodSecurity."""
        meta = body["metadata"]
        ns, generation = meta["namespace"], meta.get("generation")
        deployments = pool_deployments(dm, children, changes.fresh)
        deployments.update(plan.views)  # a multi-node pool's counts are its groups'
        rollout = self.upgrades.condition(body, hold, deployments)
        needed = {o["metadata"]["labels"].get(LABEL_ROLE, o["metadata"]["name"]): st.template_level(o)
                  for o in objs if o["kind"] == "Deployment"}
        security = st.pod_security_condition(ns, self.namespace_labels(ns), needed, generation)
        return self.report.write_status(body, dm, deployments, generation, [rollout, security])

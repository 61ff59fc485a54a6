"""The operator-upgrade rollout slot: operator upgrades do not restart every GPU pool at once.

A pool Deployment carries the hash of its pod template (``serving.disagg.dev/template-hash``). When the freshly
built template differs from the live one although the model's spec has not changed since it was last reconciled
(``status.observedGeneration == metadata.generation``), the difference comes from the operator's rendering (a new
operator version), not from the user: the rest of the Deployment is applied at once, but its pod template is held
(:func:`held`: the live one is kept) until this model gets the operator-wide upgrade slot (:class:`UpgradeSlots`).
One model holds the slot at a time; it is released when the model's pool Deployments have finished rolling out
(:func:`rolled_out`), or after ``upgrade_bound`` seconds. A held model shows ``RolloutPending=True`` (reason
``OperatorUpgrade``); an Event ``OperatorUpgradeRollout`` marks the start of its roll. A spec change (a new
generation) rolls at once, including any held rendering change.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import logs
from ..api.contract import LABEL_ROLE, WORKER_ROLES
from ..builders.meta import ANNOTATION_TEMPLATE_HASH, stamp_spec_hash
from . import status as st
from .clock import Clock
from .diff import covers
from .objects import Key, to_plain

log = logs.get("disagg.controller")

# How long one model may hold the operator-upgrade slot when its pools do not finish rolling out (pods that never
# become ready, a stuck rollout): then the next model's held rollout starts anyway. Real vLLM pools take minutes
# per replica to load weights; a bound keeps one broken model from blocking the fleet's upgrade forever.
UPGRADE_BOUND_SECONDS = 1800.0
ROLLOUT_CONDITION = "RolloutPending"


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


@dataclass
class Hold:
    """One reconcile's view of a model's operator-driven pod-template changes."""

    pools: dict[str, dict[str, Any]] = field(default_factory=dict)  # role → the pool Deployment as built
    pending: list[str] = field(default_factory=list)  # pools whose template changed with the spec unchanged
    live: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # role → a pending pool as the apiserver has it
    hold: bool = False  # pending, and another model holds the slot: keep the live templates
    holder: str = ""  # "ns/name" of that model

    def holds(self, obj: Mapping[str, Any]) -> bool:
        """Is this child's pod template held (the live one kept) in this reconcile?"""
        role = obj["metadata"].get("labels", {}).get(LABEL_ROLE, "")
        return self.hold and obj["kind"] == "Deployment" and role in self.pending

    @property
    def held_roles(self) -> list[str]:
        return self.pending if self.hold else []


class UpgradeSlots:
    """The operator-wide upgrade slot: which model may roll an operator-driven template change now."""

    def __init__(self, clock: Clock, bound: float = UPGRADE_BOUND_SECONDS) -> None:
        self.clock = clock
        self.bound = bound
        self._slot: UpgradeSlot | None = None
        self._guard = threading.Lock()
        # (monotonic time, "ns/name", "start" | "done" | "expired" | "gone"): the upgrade slot's history.
        self.log: list[tuple[float, str, str]] = []

    def take(self, model: tuple[str, str], roles: list[str]) -> tuple[bool, bool, str]:
        """(may roll now, just started, holder) for a model with held operator-driven template changes."""
        now = self.clock.monotonic()
        with self._guard:
            slot = self._slot
            if slot is not None and slot.model != model and now - slot.since >= self.bound:
                log.warning("operator-upgrade rollout bound reached", model="/".join(slot.model), seconds=self.bound)
                self.log.append((now, "/".join(slot.model), "expired"))
                slot = self._slot = None
            if slot is None:
                self._slot = UpgradeSlot(model, now, sorted(roles))
                self.log.append((now, "/".join(model), "start"))
                return True, True, ""
            if slot.model == model:
                slot.roles = sorted(set(slot.roles) | set(roles))
                return True, False, ""
            return False, False, "/".join(slot.model)

    def release(self, model: tuple[str, str], why: str) -> None:
        with self._guard:
            if self._slot is not None and self._slot.model == model:
                self._slot = None
                self.log.append((self.clock.monotonic(), "/".join(model), why))

    def holding(self, namespace: str, name: str) -> UpgradeSlot | None:
        with self._guard:
            slot = self._slot
            return slot if slot is not None and slot.model == (namespace, name) else None

    def plan(self, body: Mapping[str, Any], objs: list[dict[str, Any]], children: Mapping[Key, Mapping[str, Any]],
             spec_unchanged: bool, emit: Callable[[Mapping[str, Any], str, str, str], None],
             read: Callable[[str], Mapping[str, Any] | None]) -> Hold:
        """Which pool templates this reconcile holds: those whose change comes from the operator's rendering (the
        spec is the one last reconciled), unless this model gets (or has) the slot.

        A held pool keeps the template the apiserver has now (``read``: the Deployment by name), never the one of
        the watch cache or of a queued event: that copy may predate a roll of this model's own spec change, and
        holding it would apply the old pods back (the user's change undone until the bound)."""
        meta = body["metadata"]
        ns, name, generation = meta["namespace"], meta["name"], meta.get("generation")
        out = Hold()
        for obj in objs:
            role = obj["metadata"].get("labels", {}).get(LABEL_ROLE, "")
            if obj["kind"] == "Deployment" and role in WORKER_ROLES:
                out.pools[role] = obj
                live = children.get((obj["kind"], obj["metadata"]["name"]))
                if live is not None and spec_unchanged and template_changed(obj, live):
                    current = read(obj["metadata"]["name"])
                    if current is not None and template_changed(obj, current):
                        out.pending.append(role)
                        out.live[role] = current
        if out.pending:
            may, started, out.holder = self.take((ns, name), out.pending)
            out.hold = not may
            if started:
                log.info("operator-upgrade rollout", model=f"{ns}/{name}", pools=out.pending)
                emit(body, "Normal", "OperatorUpgradeRollout",
                     f"Rolling the {', '.join(sorted(out.pending))} pool(s) for an operator upgrade: the operator "
                     f"renders their pod templates differently (spec generation {generation} unchanged); "
                     "other models' held rollouts wait until these Deployments finish rolling out")
        return out

    def condition(self, body: Mapping[str, Any], hold: Hold,
                  deployments: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Any]:
        """RolloutPending for this model; releases the upgrade slot when this model's roll has finished."""
        meta = body["metadata"]
        ns, name, generation = meta["namespace"], meta["name"], meta.get("generation")
        if hold.held_roles:
            return st.condition(
                ROLLOUT_CONDITION, True, "OperatorUpgrade",
                f"The operator renders the {', '.join(sorted(hold.held_roles))} pod template(s) differently from the "
                f"running ones (an operator upgrade; spec generation {generation} unchanged). Held so that operator "
                f"upgrades roll one model at a time: waiting for {hold.holder} to finish rolling out (at most "
                f"{self.bound:.0f}s). A change to this model's spec rolls at once.", generation)
        slot = self.holding(ns, name)
        if slot is not None:
            pools = hold.pools
            waiting = [r for r in slot.roles if r in pools
                       and (template_changed(pools[r], deployments.get(r) or {}) or not rolled_out(deployments.get(r)))]
            if waiting:
                return st.condition(ROLLOUT_CONDITION, False, "OperatorUpgradeRolling",
                                    f"Rolling the {', '.join(waiting)} pool(s) for an operator upgrade; other models' "
                                    "held rollouts start when these Deployments have finished rolling out.",
                                    generation)
            self.release((ns, name), "done")
            log.info("operator-upgrade rollout finished", model=f"{ns}/{name}", pools=slot.roles)
        return st.condition(ROLLOUT_CONDITION, False, "NoRolloutPending", "No pod-template change is held.",
                            generation)

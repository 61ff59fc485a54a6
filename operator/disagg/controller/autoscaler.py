"""The closed loop per DisaggregatedModel: a kopf daemon that, every spec.autoscaling.intervalSeconds, queries
Prometheus, runs the pure step (disagg.autoscaling.loop) and writes the outcome to status.

What it writes (merge patch on the status subresource, guarded by resourceVersion and retried on conflict):
- ``observed`` figures (including the mode probes seen in the window) and the conditions ``SLOMet``,
  ``MetricsAvailable`` and ``KVTransferHealthy`` (measured: KV-transport fallbacks and transfer p95) — whenever a
  figure or a condition differs from the recorded one (a tick that would only move ``observed.time`` writes
  nothing: a steady model makes no writes, which matters at hundreds of models; ``observed.time`` is then the time
  of the last measurement that changed something). Every figure is written, an unknown one as null (a merge patch
  that left it out would keep the previous value on the printer columns); when Prometheus cannot be read every
  figure is null, ``observed.time`` stays at the last measurement, and ``MetricsAvailable`` is False (reason
  ``PrometheusUnavailable`` or ``NoScrapeTargets``) with the error;
- ``pools.<pool>.desiredReplicas`` + ``lastScale`` — when autoscaling is enabled: the record of each decision;
- ``activeMode``/``modeReason``/``modeSince`` and the ``FallbackActive`` condition — when spec.mode is Auto (a
  pinned mode is written by the reconciler). The status change triggers the reconciler, which rewrites the
  router's ConfigMap, so the router flips at once;
- ``roleMoves`` — with the Predictive policy, when the count of workers lent to the other role changes
  (autoscaling/roles.py), with an Event ``RolesMoved`` and the gauge ``disagg_operator_lent_workers``; the router
  config follows it as it follows ``activeMode``, and the router lends its idlest workers (router/load.py
  ``WorkerSet.lend``).

With autoscaling enabled it is also the one writer of each pool Deployment's ``spec.replicas``: after recording a
decision it server-side-applies the count through the Deployment's ``/scale`` subresource under its own field
manager (``disagg-autoscaler``, HPA's pattern); the operator's own applies leave the field out. Before a scale-down
it sets each pool pod's ``controller.kubernetes.io/pod-deletion-cost`` to its in-flight requests, so the idlest pods
go (autoscaling/deletion.py). Every tick it also
checks the Deployments against the record (level-triggered): a count someone else changed is set back, with a
Warning Event ``ReplicasConflict`` naming the other field manager (never silently).
Each scaling decision and mode flip is an Event and a metric. Time comes from an injectable clock.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes import client
from prometheus_client import Counter, Gauge
from pydantic import ValidationError

from .. import logs
from ..api.contract import LABEL_MODEL, LABEL_ROLE, Role
from ..api.models import ActiveMode, DisaggregatedModel, Mode, RoleMoves
from ..api.spec import PrometheusSpec
from ..autoscaling.access import PrometheusAccess, QueryFn, connect
from ..autoscaling.deletion import POD_DELETION_COST, deletion_costs
from ..autoscaling.loop import LoopState, PoolReplicas, StepResult, step
from ..autoscaling.mode import ModeState
from ..autoscaling.predictive import PredictivePolicy, PredictiveSettings, SizerFor
from ..autoscaling.queries import NOT_CONFIGURED, Sample, collect, pod_load
from ..builders import parse_model
from ..builders.replicas import AUTOSCALER_FIELD_MANAGER, desired_replicas
from ..builders.workers import compat_hash
from .apply import replicas_managers
from .clock import Clock, RealClock, rfc3339
from .kubeio import Kube, KubeError
from .scaling import scale_patch
from .status import condition, merge_conditions, status_patch

log = logs.get("disagg.autoscaler")

SCALE_DECISIONS = Counter("disagg_operator_scale_decisions", "Pool size changes decided by the autoscaler.",
                          ["namespace", "model", "pool", "direction"])
MODE_FLIPS = Counter("disagg_operator_mode_flips", "Active-mode changes decided by the mode controller.",
                     ["namespace", "model", "to"])
LENT_WORKERS = Gauge("disagg_operator_lent_workers", "Workers serving the other pool's role (status.roleMoves), "
                     "per direction.", ["namespace", "model", "direction"])
ACTIVE_MODE = Gauge("disagg_operator_active_mode", "1 for the model's active mode.", ["namespace", "model", "mode"])
DESIRED = Gauge("disagg_operator_desired_replicas", "Replicas the operator wants per pool.",
                ["namespace", "model", "pool"])
MODE_PROBES = Gauge("disagg_operator_mode_probes", "Remote-path probes in the mode window, as last measured.",
                    ["namespace", "model", "outcome"])
REPLICA_CONFLICTS = Counter("disagg_operator_replica_conflicts", "Pool sizes set back after another writer.",
                            ["namespace", "model", "pool"])

POOLS: tuple[Role, ...] = ("prefill", "decode")
STATUS_ATTEMPTS = 8  # the reconciler writes status too (conditions are a list: writes are resourceVersion-guarded)

Emit = Callable[[Mapping[str, Any], str, str, str], None]


def role_moves_patch(current: Mapping[str, Any] | None, moves: RoleMoves | None, now: str) -> dict[str, Any]:
    """status.roleMoves when the counts change (the router config follows it: builders/router.py ``role_moves``);
    cleared (null) when no predictive policy runs any more. Nothing when the counts are as recorded."""
    cur = current or {}
    if moves is None:
        return {"roleMoves": None} if current else {}
    counts = {"prefillToDecode": moves.prefill_to_decode, "decodeToPrefill": moves.decode_to_prefill}
    if {k: cur.get(k, 0) for k in counts} == counts:
        return {}
    return {"roleMoves": {**counts, "reason": moves.reason or "returned: each pool serves its own role", "time": now}}


def unchanged_but_time(current: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """What ``patch`` changes in ``current`` besides ``observed.time`` (empty: nothing). A tick whose figures and
    conditions are the ones recorded writes nothing, so that at hundreds of models a steady state makes no writes
    (docs/operator.md, "Scale"); ``observed.time`` is then the time of the last measurement that changed a figure."""
    observed = {k: v for k, v in (patch.get("observed") or {}).items() if k != "time"}
    return status_patch(current, {**patch, "observed": observed})


@dataclass
class Autoscaler:
    kube: Kube
    emit: Emit
    states: dict[tuple[str, str], LoopState] = field(default_factory=dict)
    query_factory: Callable[[PrometheusAccess], QueryFn] = connect
    clock: Clock = field(default_factory=RealClock)
    skipped_writes: int = 0  # ticks whose outcome was already recorded (no status write)
    # the operator-wide Prometheus (chart values prometheus.*) for models whose spec names none
    default_access: PrometheusAccess | None = None
    # spec.autoscaling.policy Predictive: a model's sizing (plan/sizing.sizer_for_spec, given by disagg.cli)
    sizer_for: SizerFor | None = None

    # ------------------------------------------------------------------ one tick
    def sample(self, dm: DisaggregatedModel, namespace: str, name: str) -> Sample:
        query = self.query_of(dm, namespace)
        if query is None:
            return Sample({}, error="spec.autoscaling.prometheus is not set and the operator has no default "
                          "(chart value prometheus.url): no metrics to act on", reason=NOT_CONFIGURED)
        return collect(query, namespace, name, dm.spec)

    def query_of(self, dm: DisaggregatedModel, namespace: str) -> QueryFn | None:
        """The model's Prometheus (its own block, else the operator's default) as a query function; None: neither."""
        prom = dm.spec.autoscaling.prometheus
        if prom is None and self.default_access is None:
            return None
        access = self.default_access if prom is None else self.access(namespace, prom)
        assert access is not None
        return self.query_factory(access)

    def access(self, namespace: str, prom: PrometheusSpec) -> PrometheusAccess:
        """The model's Prometheus with its Secrets read (a Secret that cannot be read is logged and left out: the
        query then fails with Prometheus' own answer, which status reports)."""
        token = self._secret(namespace, prom.auth_secret_ref.name, prom.auth_secret_ref.key) \
            if prom.auth_secret_ref else None
        basic = None
        if prom.basic_auth_secret_ref is not None:
            ref = prom.basic_auth_secret_ref
            user, password = self._secret(namespace, ref.name, ref.username_key), \
                self._secret(namespace, ref.name, ref.password_key)
            basic = (user, password) if user is not None and password is not None else None
        tls = prom.tls
        ca = self._secret(namespace, tls.ca_secret_ref.name, tls.ca_secret_ref.key, strip=False) \
            if tls is not None and tls.ca_secret_ref is not None else None
        return PrometheusAccess(prom.url, prom.timeout_seconds, token=token, basic_auth=basic,
                                headers=dict(prom.headers or {}), ca_bundle=ca,
                                insecure_skip_verify=bool(tls and tls.insecure_skip_verify))

    def _secret(self, namespace: str, name: str, key: str, strip: bool = True) -> str | None:
        try:
            secret = client.CoreV1Api(self.kube.api).read_namespaced_secret(name, namespace)
            value = base64.b64decode((secret.data or {})[key]).decode()
            return value.strip() if strip else value
        except (client.ApiException, KeyError) as exc:
            log.warning("prometheus secret unreadable", secret=f"{namespace}/{name}", key=key, error=str(exc))
            return None

    def tick(self, namespace: str, name: str) -> StepResult | None:
        body = self.kube.get_model(namespace, name)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return None
        try:
            dm = DisaggregatedModel.model_validate({k: v for k, v in body.items() if k != "status"})
        except ValidationError:
            return None  # the reconciler reports invalid specs
        status = body.get("status") or {}
        if status.get("observedGeneration") is None:
            # The reconciler has not reported yet. Writing status first would let the apiserver default
            # status.pools (the CRD's defaults: desiredReplicas 0), which then reads as a recorded decision.
            return None
        sample = self.sample(dm, namespace, name)
        state = self.states.setdefault((namespace, name), LoopState())
        mono = self.clock.monotonic()
        current = ActiveMode(status["activeMode"]) if status.get("activeMode") else ActiveMode.DISAGGREGATED
        if state.mode is None or state.mode.active != current:  # status is the truth (pins, restarts)
            state.mode = ModeState(active=current, since=mono, reason=status.get("modeReason") or "",
                                   backoff=state.mode.backoff if state.mode else 1,
                                   flips=state.mode.flips if state.mode else 0)
        pools = {}
        for pool in ("prefill", "decode"):
            ps = (status.get("pools") or {}).get(pool) or {}
            spec_replicas = getattr(dm.spec, pool).replicas
            # a pool the reconciler has not reported yet has not been ready since it was created: starting
            starting = ps["starting"] if "starting" in ps else not ps.get("readyReplicas")
            pools[pool] = PoolReplicas(int(ps.get("desiredReplicas", spec_replicas)), int(ps.get("readyReplicas", 0)),
                                       starting=bool(starting))
        self.predictive(state, dm)
        now_iso = rfc3339(self.clock.now())
        result = step(dm.spec, pools, sample, state, mono, now_iso, current_mode=current)
        self.apply(body, dm, result, now_iso)
        return result

    def predictive(self, state: LoopState, dm: DisaggregatedModel) -> None:
        """Keep the model's predictive policy in ``state`` for spec.autoscaling.policy Predictive: built once per
        spec (its sizing, SLOs and bounds; a spec change starts it over), or the reason it cannot run, which the
        proportional policy's decisions then carry."""
        a = dm.spec.autoscaling
        if not a.enabled or a.policy != "Predictive":
            state.predictive, state.predictive_unavailable, state.predictive_key = None, None, None
            return
        key = dm.spec.model_dump_json(include={"model", "prefill", "decode", "slo", "autoscaling", "kv_transfer"})
        if key == state.predictive_key:
            return
        state.predictive_key = key
        made = self.sizer_for(dm.spec) if self.sizer_for is not None else \
            "this operator runs without the performance model (started outside `disagg operator`)"
        if isinstance(made, str):
            state.predictive, state.predictive_unavailable = None, f"Predictive unavailable: {made}"
            log.warning("predictive policy unavailable", model=dm.metadata.get("name"), reason=made)
            return
        sizer, pod_start = made
        # role moves only between pools whose workers pair (the same compat hash: engine build, model, KV layout)
        compatible = compat_hash(dm.spec, "prefill") == compat_hash(dm.spec, "decode")
        state.predictive = PredictivePolicy(sizer, replace(PredictiveSettings.from_spec(dm.spec, pod_start),
                                                           role_moves=compatible))
        state.predictive_unavailable = None
        log.info("predictive policy", model=dm.metadata.get("name"), pod_start_s=round(pod_start, 1),
                 horizon_intervals=state.predictive.s.horizon)

    def _patch(self, body: Mapping[str, Any], dm: DisaggregatedModel, r: StepResult, now: str) -> dict[str, Any]:
        """The status merge patch of one step (``unchanged_but_time`` tells whether it changes anything)."""
        status = body.get("status") or {}
        gen = (body.get("metadata") or {}).get("generation")
        observed = r.observed.model_dump(by_alias=True, mode="json")  # None stays: null clears a stale figure
        if observed.get("time") is None:
            observed.pop("time", None)  # not measured now: the time of the last measurement stays
        patch: dict[str, Any] = {"observed": observed}
        conds = [condition(type_, {"True": True, "False": False}.get(ok), reason, message, gen)
                 for type_, (ok, reason, message) in (("SLOMet", r.slo_met), ("MetricsAvailable", r.metrics),
                                                      ("KVTransferHealthy", r.kv_transfer))]
        for pool, d in r.decisions.items():
            if d.changed:
                patch.setdefault("pools", {}).update(scale_patch(pool, d.current, d.desired, d.reason, now)["pools"])
        patch.update(role_moves_patch(status.get("roleMoves"), r.role_moves, now))
        if dm.spec.mode == Mode.AUTO:
            if r.mode_changed:
                patch.update({"activeMode": r.mode.active.value, "modeReason": r.mode.reason, "modeSince": now})
            fallback = r.mode.active == ActiveMode.AGGREGATED
            conds.append(condition("FallbackActive", fallback, "FlippedToAggregated" if fallback else "Disaggregated",
                                   r.mode.reason if fallback else "the remote-prefill path is in use", gen))
        else:
            conds.append(condition("FallbackActive", False, "ModePinned",
                                   f"spec.mode {dm.spec.mode.value} pins the mode", gen))
        patch["conditions"] = merge_conditions(status.get("conditions") or [], conds, now)
        return patch

    def apply(self, body: Mapping[str, Any], dm: DisaggregatedModel, r: StepResult, now: str) -> None:
        """Record one step's outcome in status, then (autoscaling on) bring the Deployments to the record."""
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        before = {c.get("type"): c.get("status") for c in (body.get("status") or {}).get("conditions") or []}
        patch: dict[str, Any] = {}
        for attempt in range(STATUS_ATTEMPTS):
            patch = self._patch(body, dm, r, now)
            if not unchanged_but_time(body.get("status") or {}, patch):
                self.skipped_writes += 1
                break  # the same figures and conditions as recorded: no write (a quiet model stays quiet)
            try:
                out = self.kube.patch_model_status(ns, name, patch, body["metadata"].get("resourceVersion"))
                if out:
                    body = out
                break
            except KubeError as exc:
                if exc.status != 409 or attempt == STATUS_ATTEMPTS - 1:
                    raise
                fresh = self.kube.get_model(ns, name)
                if fresh is None:
                    return
                body = fresh
        if r.metrics[0] == "False" and before.get("MetricsAvailable") != "False":
            self.emit(body, "Warning", "MetricsUnavailable", f"{r.metrics[2]} (holding replicas and mode)")
        if r.kv_transfer[0] == "False" and before.get("KVTransferHealthy") != "False":
            self.emit(body, "Warning", "KVTransferFailing", r.kv_transfer[2])
        for pool, d in r.decisions.items():
            DESIRED.labels(ns, name, pool).set(d.desired)
            if d.changed:
                direction = "up" if d.desired > d.current else "down"
                SCALE_DECISIONS.labels(ns, name, pool, direction).inc()
                self.emit(body, "Normal", "Scaled", f"{pool} {d.current} → {d.desired}: {d.reason}")
                log.info("scaled", model=f"{ns}/{name}", pool=pool, frm=d.current, to=d.desired, reason=d.reason)
        if r.role_moves is not None:
            LENT_WORKERS.labels(ns, name, "prefill_to_decode").set(r.role_moves.prefill_to_decode)
            LENT_WORKERS.labels(ns, name, "decode_to_prefill").set(r.role_moves.decode_to_prefill)
        if moved := patch.get("roleMoves"):  # a change of the moves was written (or found written)
            self.emit(body, "Normal", "RolesMoved", f"prefill→decode {moved['prefillToDecode']}, decode→prefill "
                                                    f"{moved['decodeToPrefill']}: {moved['reason']}")
            log.info("roles moved", model=f"{ns}/{name}", prefill_to_decode=moved["prefillToDecode"],
                     decode_to_prefill=moved["decodeToPrefill"], reason=moved["reason"])
        for mode in ActiveMode:
            ACTIVE_MODE.labels(ns, name, mode.value).set(1 if r.mode.active == mode else 0)
        for outcome, value in (("ok", r.observed.mode_probes_succeeded), ("failed", r.observed.mode_probes_failed)):
            MODE_PROBES.labels(ns, name, outcome).set(value or 0)
        if r.mode_changed and dm.spec.mode == Mode.AUTO:
            MODE_FLIPS.labels(ns, name, r.mode.active.value).inc()
            kind = "Warning" if r.mode.active == ActiveMode.AGGREGATED else "Normal"
            self.emit(body, kind, "ModeChanged", f"{r.mode.active.value}: {r.mode.reason}")
            log.info("mode changed", model=f"{ns}/{name}", mode=r.mode.active.value, reason=r.mode.reason)
        if dm.spec.autoscaling.enabled:
            recorded = parse_model(body)
            for pool in POOLS:
                decision = r.decisions.get(pool)
                decided = decision is not None and decision.changed
                mark = (lambda p=pool: self.mark_idlest(dm, ns, name, p)) if decided else None
                self.sync_replicas(body, pool, desired_replicas(recorded, pool), decided=decided, on_scale_down=mark)

    def mark_idlest(self, dm: DisaggregatedModel, ns: str, name: str, pool: Role) -> dict[str, int] | None:
        """Before a scale-down the autoscaler decided: every pod of the pool gets its in-flight requests as its
        ``controller.kubernetes.io/pod-deletion-cost`` (autoscaling/deletion.py), so the ReplicaSet removes the
        idlest pods. Best effort: without a measurement (Prometheus unreadable) the ReplicaSet chooses by its own
        ranks, and the scale-down goes ahead. Returns the costs set (None: not measured)."""
        query = self.query_of(dm, ns)
        if query is None:
            return None
        try:
            load = pod_load(query, ns, name, pool)
        except Exception as exc:  # noqa: BLE001 - any failure to reach Prometheus: the ReplicaSet's own ranking
            log.warning("pod load unreadable: the ReplicaSet chooses the pods to remove", model=f"{ns}/{name}",
                        pool=pool, error=f"{type(exc).__name__}: {exc}"[:300])
            return None
        core = client.CoreV1Api(self.kube.api)
        annotations: dict[str, dict[str, str]] = {}  # pod name → its annotations, pods being deleted left out
        for p in core.list_namespaced_pod(ns, label_selector=f"{LABEL_MODEL}={name},{LABEL_ROLE}={pool}").items:
            meta = p.metadata
            if meta is not None and meta.name and not meta.deletion_timestamp:
                annotations[meta.name] = dict(meta.annotations or {})
        costs = deletion_costs(annotations, load)
        for pod, cost in costs.items():
            if annotations[pod].get(POD_DELETION_COST) != str(cost):
                core.patch_namespaced_pod(pod, ns, {"metadata": {"annotations": {POD_DELETION_COST: str(cost)}}},
                                          field_manager=AUTOSCALER_FIELD_MANAGER)
        log.info("deletion costs", model=f"{ns}/{name}", pool=pool, costs=costs)
        return costs

    def sync_replicas(self, body: Mapping[str, Any], pool: Role, target: int, decided: bool = False,
                      on_scale_down: Callable[[], object] | None = None) -> None:
        """Make the pool's Deployment carry ``target`` replicas, written through /scale under the autoscaler's field
        manager. A count another writer set is reported (Warning ReplicasConflict) before it is set back.
        ``on_scale_down`` runs first when the write removes pods (the deletion costs)."""
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        deployment = f"{name}-{pool}"
        live = self.kube.get("Deployment", ns, deployment)
        if live is None:
            return  # the reconciler creates it, starting at the recorded count
        replicas = int((live.get("spec") or {}).get("replicas") or 0)
        owners = replicas_managers(live)
        if replicas == target and AUTOSCALER_FIELD_MANAGER in owners:
            return
        others = sorted(owners - {AUTOSCALER_FIELD_MANAGER, self.kube.field_manager})
        if replicas != target and others and not decided:
            REPLICA_CONFLICTS.labels(ns, name, pool).inc()
            self.emit(body, "Warning", "ReplicasConflict",
                      f"Deployment/{deployment} was scaled to {replicas} by {', '.join(others)}; the autoscaler owns "
                      f"its replicas (spec.autoscaling.enabled): set back to {target}")
            log.warning("replicas conflict", model=f"{ns}/{name}", pool=pool, was=replicas, to=target,
                        managers=others)
        if on_scale_down is not None and target < replicas:
            on_scale_down()
        self.kube.apply_scale(ns, deployment, target, AUTOSCALER_FIELD_MANAGER)

    # ------------------------------------------------------------------ the daemon body
    async def run(self, namespace: str, name: str, stopped: Any, interval_of: Callable[[], int]) -> None:
        """Loop until kopf stops the daemon (model deleted or operator exiting)."""
        try:
            while not stopped:
                try:
                    await asyncio.to_thread(self.tick, namespace, name)
                except Exception as exc:  # noqa: BLE001 - a failed tick holds; the next one retries
                    log.warning("autoscaler tick failed", model=f"{namespace}/{name}",
                                error=f"{type(exc).__name__}: {exc}")
                await stopped.wait(interval_of())
        finally:
            self.states.pop((namespace, name), None)

"""Thin kopf handlers: watch DisaggregatedModels and their children, call the Reconciler.

Every handler below calls the same level-triggered ``Reconciler.reconcile`` (which reads the model fresh from the
apiserver); they differ only in what woke them up:

- ``@kopf.on.resume / create / update`` (DisaggregatedModel): kopf retries failures with backoff. Resume runs for
  every model when the operator starts: with nothing drifted it writes nothing.
- ``@kopf.on.event`` (DisaggregatedModel): status-driven inputs (``status.activeMode`` from the mode controller)
  reach the router ConfigMap. kopf never retries an event handler: a failed event-triggered reconcile (this one,
  a child's, a group pod's) is retried with backoff, 1 s doubling to 60 s, by ``requeue.Requeue``.
- ``@kopf.on.event`` (each child kind, label ``app.kubernetes.io/managed-by=disagg-operator``): a deleted or
  edited child is restored; Deployment changes refresh the pool counts, ``starting`` and conditions in status.
- ``@kopf.index``: in-memory caches of models and children, filled before any handler runs, so that a
  reconcile compares against the cluster without listing it. The model index only routes a child's event to its
  model; no child is ever built from it. The indexers are coroutines (kopf's event loop, not its thread pool).
- Event filters (``when=``, on kopf's event loop): a child event whose child is as the operator last applied or
  verified it, and the operator's own status patch coming back, run no handler (``EventFilters.child_news`` /
  ``model_news`` in filters.py; docs/operator.md, "Scale").
- ``@kopf.timer`` (models with ``RolloutPending=True``): a held operator-upgrade rollout asks again for its turn.
- ``@kopf.daemon`` (models with ``spec.autoscaling.prometheus``): the autoscaler / mode controller loop; with
  autoscaling on it writes pool sizes through each Deployment's /scale subresource itself.
- Deleting a DisaggregatedModel needs no handler: every child carries an owner reference and Kubernetes' garbage
  collector removes it. Only models running the autoscaler daemon, or waiting with a held operator-upgrade rollout
  (the held-rollouts timer), get a finalizer (kopf stops the daemon or timer first).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kopf

from .. import logs
from ..api.contract import LABEL_MANAGED_BY, LABEL_MODEL, MANAGED_BY
from ..api.models import GROUP, PLURAL, VERSION
from ..autoscaling.access import PrometheusAccess
from ..autoscaling.predictive import SizerFor
from ..builders import BuildSettings
from ..kube import api_client
from .apply import REJECTED
from .groups import register as register_groups
from .kubeio import Kube, KubeError
from .objects import Key, trim
from .reconcile import Reconciler
from .requeue import LoopScheduler, Requeue
from .upgrade import ROLLOUT_CONDITION, UPGRADE_BOUND_SECONDS

log = logs.get("disagg.controller")

# (group, version, plural, kind) of every child kind the operator creates.
CHILD_RESOURCES: tuple[tuple[str, str, str, str], ...] = (
    ("apps", "v1", "deployments", "Deployment"),
    ("", "v1", "services", "Service"),
    ("", "v1", "configmaps", "ConfigMap"),
    ("", "v1", "serviceaccounts", "ServiceAccount"),
    ("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    ("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget"),
    ("apps", "v1", "statefulsets", "StatefulSet"),  # multi-node pools' groups (controller/groups.py)
)
MANAGED = {LABEL_MANAGED_BY: MANAGED_BY}
MODELS_INDEX = "disagg_models"


def child_index_name(plural: str) -> str:
    return f"disagg_children_{plural}"


@dataclass
class ControllerConfig:
    kubeconfig: str | None = None
    build: BuildSettings = field(default_factory=BuildSettings)
    # Run the autoscaler / mode controller daemon (disagg.controller.autoscaler) for models that name a
    # Prometheus (spec.autoscaling.prometheus). Off in tests of the reconciler alone.
    autoscaler: bool = True
    # The operator-wide Prometheus (chart values prometheus.*, env DISAGG_PROMETHEUS_*) for models whose spec names
    # none (disagg.autoscaling.access.default_from_env).
    default_prometheus: PrometheusAccess | None = None
    # Operator upgrades: how long one model may hold the upgrade slot (upgrade.UPGRADE_BOUND_SECONDS), and how
    # often a model whose pod-template change is held (RolloutPending=True) checks whether its turn has come.
    upgrade_bound: float = UPGRADE_BOUND_SECONDS
    upgrade_poll_seconds: float = 15.0
    # spec.autoscaling.policy Predictive: the performance model's sizing for a spec (plan/sizing.sizer_for_spec,
    # given by disagg.cli: the planner is a layer above); None: predictive models scale proportionally, and say so
    sizer_for: SizerFor | None = None


def operator_settings(settings: kopf.OperatorSettings | None = None) -> kopf.OperatorSettings:
    """kopf settings for this operator: its own annotation names, no kopf 'handler succeeded' Events."""
    settings = settings or kopf.OperatorSettings()
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="serving.disagg.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="serving.disagg.dev", key="last-handled-configuration")
    settings.persistence.finalizer = "serving.disagg.dev/autoscaler"  # models running the autoscaler daemon or timer
    settings.posting.level = logging.WARNING  # our own Events (kopf.event) are always posted
    settings.execution.max_workers = 16
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    # no cluster-wide namespace/CRD scanning: with the chart's watch.scope namespace the operator's Role cannot list
    # namespaces, and kopf would retry 403s forever (found by e2e/test_real_node.py); we name namespaces exactly
    settings.scanning.disabled = True
    return settings


def _children_of(kwargs: Mapping[str, Any], namespace: str, model: str) -> dict[Key, Mapping[str, Any]]:
    out: dict[Key, Mapping[str, Any]] = {}
    for _, _, plural, kind in CHILD_RESOURCES:
        index = kwargs.get(child_index_name(plural))
        if index is None:
            continue
        for body in index.get((namespace, model), ()):
            out[(kind, body["metadata"]["name"])] = body
    return out


def _parent_of(kwargs: Mapping[str, Any], namespace: str, model: str) -> str | None:
    """The uid of the model, if the operator's watch has seen it."""
    index = kwargs.get(MODELS_INDEX)
    if index is None:
        return None
    for uid in index.get((namespace, model), ()):
        return str(uid)
    return None


def _emit(obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    with contextlib.suppress(LookupError):  # outside a kopf context (unit tests of the reconciler)
        kopf.event(cast(kopf.Body, dict(obj)), type=type_, reason=reason, message=message[:1024])


def _ns(namespace: str | None) -> str:
    """DisaggregatedModels and their children are namespaced: kopf always gives a namespace."""
    if namespace is None:
        raise kopf.PermanentError("a cluster-scoped object reached a namespaced handler")
    return namespace


def register(registry: kopf.OperatorRegistry, config: ControllerConfig | None = None,
             reconciler: Reconciler | None = None) -> Reconciler:
    """Register the operator's handlers on ``registry``; returns the Reconciler (its counters are useful)."""
    config = config or ControllerConfig()
    rec = reconciler or Reconciler(Kube(api_client(config.kubeconfig)), config.build, emit=_emit,
                                   upgrade_bound=config.upgrade_bound)
    # failed event-triggered reconciles, retried with backoff (kopf retries no event handler), on the operator's loop
    scheduler = LoopScheduler()
    requeue = Requeue(scheduler)
    _register_lifecycle(registry, config, scheduler, requeue)
    _register_indexes(registry)
    _register_models(registry, config, rec, requeue)
    _register_children(registry, rec, requeue)
    register_groups(registry, rec, _children_of, requeue)  # pods of multi-node groups (controller/groups.py)
    if config.autoscaler:
        register_autoscaler(registry, rec, config.default_prometheus, config.sizer_for)
    return rec


def _register_lifecycle(registry: kopf.OperatorRegistry, config: ControllerConfig, scheduler: LoopScheduler,
                        requeue: Requeue) -> None:
    """Start-up (the retries' loop), clean-up (pending retries cancelled), login and the health probe."""

    @kopf.on.startup(registry=registry)
    async def bind_retries(**_: Any) -> None:
        scheduler.bind(asyncio.get_running_loop())

    @kopf.on.cleanup(registry=registry)
    def cancel_retries(**_: Any) -> None:
        requeue.close()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        if config.kubeconfig:
            return connection_info(config.kubeconfig)
        return kopf.login_via_client(**kwargs)  # in-cluster service account, else the default kubeconfig

    @kopf.on.probe(id="models", registry=registry)
    def probe_models(**kwargs: Any) -> int:
        index = kwargs.get(MODELS_INDEX)
        return len(index) if index is not None else 0


def _register_indexes(registry: kopf.OperatorRegistry) -> None:
    """Which models exist, and every managed child by its model (the reconciles read children from these)."""

    @kopf.index(GROUP, VERSION, PLURAL, id=MODELS_INDEX, registry=registry)
    async def index_models(namespace: str | None, name: str, uid: str, **_: Any) -> dict[Any, Any]:
        return {(namespace, name): uid}  # which models exist (children are never built from a cached copy)

    # Indexers are coroutines: kopf runs them on its event loop, not in the thread pool of the sync handlers, where
    # every child event would queue behind the reconciles (kopf indexes an event before it calls its handlers).
    def make_child_indexer(api_version: str, kind: str) -> Callable[..., Any]:
        async def index_children(namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> Any:
            model = labels.get(LABEL_MODEL)
            if not model:
                return None
            out = trim(body)
            out["apiVersion"], out["kind"] = api_version, kind
            return {(namespace, model): out}
        return index_children

    for group, version, plural, kind in CHILD_RESOURCES:
        api_version = f"{group}/{version}" if group else version
        kopf.index(group, version, plural, id=child_index_name(plural), labels=MANAGED,
                   registry=registry)(make_child_indexer(api_version, kind))


def _register_models(registry: kopf.OperatorRegistry, config: ControllerConfig, rec: Reconciler,
                     requeue: Requeue) -> None:
    """The model's own handlers: reconcile on resume, create and spec changes; a status-driven reconcile when an
    input in status changes (not our own patch coming back); held operator-upgrade rollouts polled."""

    @kopf.on.resume(GROUP, VERSION, PLURAL, id="reconcile", registry=registry)
    @kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile", registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, id="reconcile", registry=registry)
    def reconcile(namespace: str | None, name: str, reason: str, **kwargs: Any) -> None:
        namespace = _ns(namespace)
        try:
            result = rec.reconcile(namespace, name, lambda: _children_of(kwargs, namespace, name),
                                   trigger=str(reason))
        except KubeError as exc:  # refused objects are reported in status; retry them less often
            raise kopf.TemporaryError(f"reconcile failed: {exc}", delay=60 if exc.status in REJECTED else 5) from exc
        requeue.succeeded((namespace, name))  # (a pending event-triggered retry has nothing left to do)
        log.info("reconciled", model=f"{namespace}/{name}", trigger=str(reason), applied=len(result.applied),
                 deleted=len(result.deleted), invalid=result.invalid)

    def status_news(type: str | None, body: kopf.Body, **_: Any) -> bool:
        return type == "MODIFIED" and rec.filters.model_news(body)  # not our own status patch coming back

    @kopf.on.event(GROUP, VERSION, PLURAL, id="status-inputs", when=status_news, registry=registry)
    def status_inputs(type: str | None, body: kopf.Body, namespace: str | None, name: str, **kwargs: Any) -> None:
        if type != "MODIFIED" or body.get("metadata", {}).get("deletionTimestamp"):
            return
        namespace = _ns(namespace)

        def attempt(trigger: str) -> Callable[[], Any]:
            return lambda: rec.reconcile(namespace, name, lambda: _children_of(kwargs, namespace, name),
                                         trigger=trigger)

        requeue.run((namespace, name), attempt("status"), attempt("status retry"), what="status-driven reconcile")

    @kopf.timer(GROUP, VERSION, PLURAL, id="held-rollouts", interval=config.upgrade_poll_seconds,
                when=_rollout_pending, registry=registry)
    def held_rollouts(namespace: str | None, name: str, **kwargs: Any) -> None:
        """A model whose operator-upgrade rollout is held asks again whether its turn has come (the slot is free,
        or the previous model's bound passed): nothing else would wake it."""
        namespace = _ns(namespace)
        try:
            rec.reconcile(namespace, name, lambda: _children_of(kwargs, namespace, name), trigger="held-rollout")
        except KubeError as exc:
            log.warning("held-rollout reconcile failed", model=f"{namespace}/{name}", error=str(exc))


def _register_children(registry: kopf.OperatorRegistry, rec: Reconciler, requeue: Requeue) -> None:
    """Drift correction: an event on a managed child that is news (not our own apply coming back) reconciles its
    model, retried with backoff when it fails."""

    def make_child_handler(kind: str) -> Callable[..., None]:
        def on_child(type: str | None, body: kopf.Body, namespace: str | None, name: str, labels: Mapping[str, str],
                     **kwargs: Any) -> None:
            if type is None:
                return  # initial listing: the resume handler reconciles every model
            namespace = _ns(namespace)
            model = labels.get(LABEL_MODEL)
            if not model or _parent_of(kwargs, namespace, model) is None:
                if type == "DELETED":
                    rec.forget(namespace, kind, name)  # (a deleted model's children: drop what we recorded)
                return  # not (or no longer) one of our models
            def children() -> Mapping[Key, Mapping[str, Any]]:
                return _children_of(kwargs, namespace, model)

            # A retry reads the child from the watch cache (by then fresher than this event's copy).
            requeue.run((namespace, model),
                        lambda: rec.reconcile(namespace, model, children, trigger=f"{kind} {type}",
                                              event=(kind, name, None if type == "DELETED" else body)),
                        lambda: rec.reconcile(namespace, model, children, trigger=f"{kind} {type} retry"),
                        what="drift correction", object=f"{kind}/{name}")
        on_child.__name__ = f"on_{kind.lower()}"
        return on_child

    def make_child_filter(kind: str) -> Callable[..., bool]:
        def child_news(type: str | None, body: kopf.Body, **_: Any) -> bool:
            return rec.filters.child_news(kind, body, type)  # runs on kopf's event loop: no thread for a no-news event
        return child_news

    for group, version, plural, kind in CHILD_RESOURCES:
        kopf.on.event(group, version, plural, id=f"drift-{plural}", labels=MANAGED, when=make_child_filter(kind),
                      registry=registry)(make_child_handler(kind))


def _rollout_pending(status: Mapping[str, Any], **_: Any) -> bool:
    return any(c.get("type") == ROLLOUT_CONDITION and c.get("status") == "True"
               for c in (status or {}).get("conditions") or [])


def _has_prometheus(spec: Mapping[str, Any], **_: Any) -> bool:
    return bool(((spec or {}).get("autoscaling") or {}).get("prometheus"))


def _measured(spec: Mapping[str, Any], has_default: bool) -> bool:
    """Does the model get the autoscaler's daemon: it names a Prometheus, the operator has a default one (chart
    values prometheus.*), or it enables autoscaling with neither (the daemon then reports MetricsAvailable False,
    PrometheusNotConfigured, rather than the model silently never scaling)."""
    enabled = bool(((spec or {}).get("autoscaling") or {}).get("enabled"))
    return _has_prometheus(spec) or has_default or enabled


def register_autoscaler(registry: kopf.OperatorRegistry, rec: Reconciler,
                        default_prometheus: PrometheusAccess | None = None, sizer_for: SizerFor | None = None) -> None:
    """One daemon per measured model (:func:`_measured`): every spec.autoscaling.intervalSeconds it measures, decides
    pool sizes and the active mode, records them in status and writes pool sizes through /scale
    (disagg.controller.autoscaler); the status-event handler above then rewrites the router's ConfigMap. kopf holds
    a finalizer on such models so that the daemon stops cleanly."""
    from .autoscaler import Autoscaler

    scaler = Autoscaler(kube=rec.kube, emit=_emit, clock=rec.clock, default_access=default_prometheus,
                        sizer_for=sizer_for)

    def measured(spec: Mapping[str, Any], **_: Any) -> bool:
        return _measured(spec, scaler.default_access is not None)

    @kopf.daemon(GROUP, VERSION, PLURAL, id="autoscaler", when=measured, cancellation_timeout=10,
                 registry=registry)
    async def autoscaler(namespace: str | None, name: str, spec: kopf.Spec, stopped: kopf.DaemonStopped,
                         **_: Any) -> None:
        def interval() -> int:
            return int(((spec.get("autoscaling") or {}).get("intervalSeconds")) or 30)

        await scaler.run(_ns(namespace), name, stopped, interval)


def connection_info(kubeconfig: str) -> kopf.ConnectionInfo:
    """kopf credentials from the same kubeconfig file as our own ApiClient."""
    cfg = api_client(kubeconfig).configuration
    token = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
    scheme, tok = None, None
    if token:
        parts = token.split(" ", 1)
        scheme, tok = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        username=cfg.username or None,
        password=cfg.password or None,
        scheme=scheme,
        token=tok,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )

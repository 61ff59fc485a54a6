"""The router: ConfigMap (RouterConfig), Deployment, Service, ServiceAccount, Role and RoleBinding."""

from __future__ import annotations

from typing import Any

import yaml

from ..api import contract as c
from ..api.models import ActiveMode, DisaggregatedModel, Mode, RoleMoves
from ..api.spec import RouterSpec
from .meta import model_name, namespace_of, object_meta, role_labels, selector_labels
from .security import container_security_context, pod_security_context
from .settings import BuildSettings, cpu_cores
from .tracing import router_tracing_args, router_tracing_env
from .workers import engine_profile, served_name, worker_roles

ROUTER_CONFIG_DIR = "/etc/disagg"
ROUTER_CONFIG_PATH = f"{ROUTER_CONFIG_DIR}/{c.ROUTER_CONFIG_KEY}"
ROUTER_CONTAINER_NAME = "router"
ROUTER_CONFIG_VOLUME = "config"
# Environment of the router container (`disagg router` reads these in cluster mode to discover its pools).
ENV_POD_NAMESPACE = "POD_NAMESPACE"
ENV_MODEL_NAME = "DISAGG_MODEL_NAME"  # the DisaggregatedModel's name = value of serving.disagg.dev/model on pods


def active_mode(dm: DisaggregatedModel) -> ActiveMode:
    """The mode in force: pinned by spec.mode, else status.activeMode (the mode controller's), else Disaggregated."""
    if dm.spec.mode == Mode.AGGREGATED:
        return ActiveMode.AGGREGATED
    if dm.spec.mode == Mode.DISAGGREGATED:
        return ActiveMode.DISAGGREGATED
    if dm.status is not None and dm.status.active_mode is not None:
        return dm.status.active_mode
    return ActiveMode.DISAGGREGATED


def prefill_starting(dm: DisaggregatedModel) -> bool:
    """status.pools.prefill.starting, as the operator last wrote it (the router keeps requests local meanwhile)."""
    return bool(dm.status is not None and dm.status.pools.prefill.starting)


def role_moves(dm: DisaggregatedModel) -> RoleMoves | None:
    """status.roleMoves, as the autoscaler last wrote it, while a worker is lent (none while the model is held
    aggregated: the router config of a model without moves stays as it was)."""
    moves = dm.status.role_moves if dm.status is not None else None
    if moves is None or not (moves.prefill_to_decode or moves.decode_to_prefill) \
            or active_mode(dm) == ActiveMode.AGGREGATED:
        return None
    return moves


def router_config(dm: DisaggregatedModel) -> c.RouterConfig:
    spec = dm.spec
    model = model_name(dm)
    pools = {
        role: c.PoolEndpoint(service=c.pool_name(model, role), port=spec.engine.port,
                             engine=engine_profile(spec, role)) for role in worker_roles(dm)
    }
    return c.RouterConfig(
        model=served_name(spec),
        mode=spec.mode,
        active_mode=active_mode(dm),
        routing=spec.routing,
        rollout=spec.rollout,
        slo=spec.slo,
        transfer_timeout_ms=spec.kv_transfer.transfer_timeout_ms,
        pools=c.RouterPools(**pools),
        probe=spec.mode_policy.probe,
        prefill_starting=prefill_starting(dm),
        role_moves=role_moves(dm),
    )


def router_configmap(dm: DisaggregatedModel) -> dict[str, Any]:
    model = model_name(dm)
    text = yaml.safe_dump(router_config(dm).to_api(), sort_keys=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(dm, c.router_name(model), role_labels(model, "router")),
        "data": {c.ROUTER_CONFIG_KEY: text},
    }


MAX_ROUTER_WORKERS = 64  # spec.router.workers' bound


def router_workers(spec_router: RouterSpec, cpu_request: str) -> int:
    """`disagg router --workers N`: spec.router.workers, else the CPU request rounded down, in [1, 64]."""
    if spec_router.workers is not None:
        return spec_router.workers
    return max(1, min(MAX_ROUTER_WORKERS, int(cpu_cores(cpu_request) + 1e-9)))


def router_deployment(dm: DisaggregatedModel, settings: BuildSettings) -> dict[str, Any]:
    model = model_name(dm)
    name = c.router_name(model)
    labels = role_labels(model, "router")
    # Ready (in the Service) only once the router knows a decode or aggregated worker (/ready), so a new router pod
    # never takes traffic it can only answer with 503; alive while the process answers at all (/health).
    liveness = {"httpGet": {"path": "/health", "port": c.WORKER_PORT_NAME}, "periodSeconds": 10, "timeoutSeconds": 3,
                "failureThreshold": 6}
    readiness = {"httpGet": {"path": "/ready", "port": c.WORKER_PORT_NAME}, "periodSeconds": 2, "timeoutSeconds": 3,
                 "failureThreshold": 3}
    container = {
        "name": ROUTER_CONTAINER_NAME,
        "image": settings.router_image,
        "imagePullPolicy": settings.router_image_pull_policy,
        "command": ["disagg", "router", "--config", ROUTER_CONFIG_PATH, "--host", "0.0.0.0",
                    "--port", str(c.ROUTER_PORT),
                    "--workers", str(router_workers(dm.spec.router, settings.router_cpu_request)),
                    *router_tracing_args(dm.spec)],
        "ports": [{"name": c.WORKER_PORT_NAME, "containerPort": c.ROUTER_PORT, "protocol": "TCP"}],
        "env": [
            {"name": ENV_POD_NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": ENV_MODEL_NAME, "value": model},
            *router_tracing_env(dm.spec),
        ],
        "volumeMounts": [{"name": ROUTER_CONFIG_VOLUME, "mountPath": ROUTER_CONFIG_DIR, "readOnly": True}],
        "readinessProbe": readiness,
        "livenessProbe": liveness,
        "resources": {"requests": {"cpu": settings.router_cpu_request, "memory": settings.router_memory_request},
                      "limits": {"memory": settings.router_memory_limit}},
        "securityContext": container_security_context(read_only_root_filesystem=True),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(dm, name, labels),
        "spec": {
            "replicas": settings.router_replicas,
            "selector": {"matchLabels": selector_labels(model, "router")},
            "template": {
                "metadata": {
                    "labels": dict(labels),  # model labels stay off pod templates: no roll for a label edit
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(c.ROUTER_PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "serviceAccountName": name,
                    **({"imagePullSecrets": [{"name": n} for n in settings.router_image_pull_secrets]}
                       if settings.router_image_pull_secrets else {}),
                    "affinity": router_anti_affinity(model),
                    "containers": [container],
                    "volumes": [{"name": ROUTER_CONFIG_VOLUME, "configMap": {"name": name}}],
                    "enableServiceLinks": False,
                    # Pod Security Standard "restricted" (builders/security.py).
                    "securityContext": pod_security_context(),
                },
            },
        },
    }


def router_anti_affinity(model: str) -> dict[str, Any]:
    """Spread a model's router pods over nodes when the scheduler can (preferred, not required: a one-node cluster
    or a full node still schedules both), so one node lost or drained leaves a router serving."""
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100,
        "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": selector_labels(model, "router")}},
    }]}}


def router_pdb(dm: DisaggregatedModel) -> dict[str, Any]:
    """Voluntary disruptions (node drains, cluster upgrades) take at most one router pod at a time: with the default
    two replicas one always serves. maxUnavailable rather than minAvailable, so one replica never blocks a drain."""
    model = model_name(dm)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(dm, c.router_name(model), role_labels(model, "router")),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(model, "router")}},
    }


def router_service(dm: DisaggregatedModel) -> dict[str, Any]:
    model = model_name(dm)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(dm, c.router_name(model), role_labels(model, "router")),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(model, "router"),
            "ports": [{"name": c.WORKER_PORT_NAME, "port": c.ROUTER_PORT, "targetPort": c.WORKER_PORT_NAME,
                       "protocol": "TCP"}],
        },
    }


def router_rbac(dm: DisaggregatedModel) -> list[dict[str, Any]]:
    """ServiceAccount + Role + RoleBinding: read pods and EndpointSlices in this namespace, and its own ConfigMap."""
    model = model_name(dm)
    name = c.router_name(model)
    labels = role_labels(model, "router")
    read = ["get", "list", "watch"]
    subject: dict[str, Any] = {"kind": "ServiceAccount", "name": name}
    ns = namespace_of(dm)
    if ns:
        subject["namespace"] = ns
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": object_meta(dm, name, labels)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": object_meta(dm, name, labels),
            "rules": [
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read},
                {"apiGroups": [""], "resources": ["pods"], "verbs": read},
                # Only its own ConfigMap (watched through the API for immediate reloads; list/watch with
                # fieldSelector metadata.name=<name> is authorised by resourceNames).
                {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [name], "verbs": read},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": object_meta(dm, name, labels),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [subject],
        },
    ]

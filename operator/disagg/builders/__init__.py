"""Pure functions: DisaggregatedModel → Kubernetes manifests (plain dicts, no I/O).

``build_children(dm)`` is the one entry point: the operator applies exactly its output, and ``disagg render``
prints it. Everything here is deterministic: the same DisaggregatedModel gives byte-identical manifests.

The builders assume a model the API admits: the schema, the cross-field rules (pydantic, ``parse_model``) and the
operator's own checks (``disagg.api.semantics.model_errors``), which the operator and ``disagg render`` run first.
Nothing here refuses a spec.
"""

from __future__ import annotations

from typing import Any

from ..api.models import DisaggregatedModel, parse_model
from . import multinode
from .meta import ANNOTATION_SPEC_HASH, stamp_spec_hash
from .replicas import desired_replicas, replicas_owner
from .router import (
    active_mode,
    router_config,
    router_configmap,
    router_deployment,
    router_pdb,
    router_rbac,
    router_service,
)
from .settings import BuildSettings
from .tracing import with_default_tracing
from .transport import kv_transfer_config, transport_summary
from .workers import (
    compat_hash,
    pool_security_level,
    worker_args,
    worker_deployment,
    worker_pdb,
    worker_roles,
    worker_service,
)

__all__ = [
    "ANNOTATION_SPEC_HASH",
    "BuildSettings",
    "active_mode",
    "build_children",
    "compat_hash",
    "desired_replicas",
    "kv_transfer_config",
    "parse_model",
    "pool_security_level",
    "replicas_owner",
    "router_config",
    "transport_summary",
    "worker_args",
    "worker_roles",
]


def build_children(dm: DisaggregatedModel, settings: BuildSettings | None = None) -> list[dict[str, Any]]:
    """Every child object of a DisaggregatedModel, in apply order (RBAC and config before the workloads).

    ``dm`` must be a model the API admits (``disagg.api.semantics.model_errors`` empty, with the same
    ``settings.lws_installed``).
    """
    settings = settings or BuildSettings()
    dm = with_default_tracing(dm, settings.tracing_endpoint, settings.tracing_sampling_ratio, settings.tracing_protocol)
    roles = worker_roles(dm)
    objs: list[dict[str, Any]] = []
    objs += router_rbac(dm)
    objs.append(router_configmap(dm))
    for role in roles:
        objs.append(worker_service(dm, role))
    objs.append(router_service(dm))
    # a multi-node pool (nodesPerReplica > 1) runs groups of pods (builders/multinode.py): its workloads and its
    # disruption budget (same name as worker_pdb's) come from there; its pool Service above selects leaders only
    backend = multinode.resolve_backend(dm.spec, settings.lws_installed) if multinode.multinode_roles(dm) else None
    for role in roles:
        if backend is None or not multinode.is_multinode(getattr(dm.spec, role)):
            objs.append(worker_pdb(dm, role))
    for role in roles:
        if backend is not None and multinode.is_multinode(getattr(dm.spec, role)):
            objs += multinode.pool_objects(dm, role, backend)
        else:
            objs.append(worker_deployment(dm, role))
    objs.append(router_pdb(dm))
    objs.append(router_deployment(dm, settings))
    return [stamp_spec_hash(o) for o in objs]

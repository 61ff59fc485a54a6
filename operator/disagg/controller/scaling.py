"""The autoscaler's one entry point for changing a pool's size.

With ``spec.autoscaling.enabled`` the operator applies ``status.pools.<pool>.desiredReplicas`` to the pool's
Deployment (clamped to [minReplicas, maxReplicas]; see ``disagg.builders.replicas``). The autoscaler writes that
field here, with the decision recorded in ``lastScale``; the operator's status-event handler does the rest.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from ..api.contract import Role
from .kubeio import Kube
from .status import now_rfc3339


def scale_patch(pool: Role, current: int, replicas: int, reason: str, now: str | None = None) -> dict[str, Any]:
    """The status merge patch for one scaling decision (pure; usable as a kopf ``patch.status`` update too)."""
    return {
        "pools": {
            pool: {
                "desiredReplicas": replicas,
                "lastScale": {"time": now or now_rfc3339(), "from": current, "to": replicas, "reason": reason},
            }
        }
    }


def set_desired_replicas(api: client.ApiClient, namespace: str, name: str, pool: Role, replicas: int,
                         reason: str) -> bool:
    """Ask for ``replicas`` workers in ``pool`` of DisaggregatedModel ``namespace/name``.

    Returns False when nothing changes (already desired) or the model is gone.
    """
    kube = Kube(api)
    body = kube.get_model(namespace, name)
    if body is None:
        return False
    pools = (body.get("status") or {}).get("pools") or {}
    current = (pools.get(pool) or {}).get("desiredReplicas")
    if current == replicas:
        return False
    if current is None:
        current = ((body.get("spec") or {}).get(pool) or {}).get("replicas", 0)
    kube.patch_model_status(namespace, name, scale_patch(pool, int(current), replicas, reason), None)
    return True

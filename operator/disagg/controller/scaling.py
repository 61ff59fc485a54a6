"""The record of one scaling decision in status (pure).

With ``spec.autoscaling.enabled`` the autoscaler daemon (``disagg.controller.autoscaler``) records each decision
as ``status.pools.<pool>.desiredReplicas`` + ``lastScale``, then writes the count through the Deployment's
``/scale`` subresource under its own field manager; see ``disagg.builders.replicas`` for who owns replicas.
"""

from __future__ import annotations

from typing import Any

from ..api.contract import Role


def scale_patch(pool: Role | str, current: int, replicas: int, reason: str, now: str) -> dict[str, Any]:
    """The status merge patch for one scaling decision (usable as a kopf ``patch.status`` update too)."""
    return {
        "pools": {
            pool: {
                "desiredReplicas": replicas,
                "lastScale": {"time": now, "from": current, "to": replicas, "reason": reason},
            }
        }
    }

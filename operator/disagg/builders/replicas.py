"""Who owns a pool's replica count, as a pure function.

- autoscaling disabled: ``spec.<pool>.replicas`` wins, always (a manual ``kubectl scale`` is reverted).
- autoscaling enabled: the autoscaler owns it. It writes ``status.pools.<pool>.desiredReplicas`` (see
  ``disagg.controller.scaling.set_desired_replicas``) and the operator applies that to the Deployment,
  clamped to [minReplicas, maxReplicas]. Until the autoscaler has written a value, ``spec.<pool>.replicas``
  is the initial count.
"""

from __future__ import annotations

from ..api.contract import Role
from ..api.models import DisaggregatedModel, PoolSpec


def pool_spec(dm: DisaggregatedModel, role: Role) -> PoolSpec | None:
    return getattr(dm.spec, role, None)


def autoscaled_replicas(dm: DisaggregatedModel, role: Role) -> int | None:
    """status.pools.<role>.desiredReplicas when the autoscaler (or an earlier reconcile) set it."""
    if dm.status is None:
        return None
    pool_status = getattr(dm.status.pools, role, None)
    if pool_status is None or "desired_replicas" not in pool_status.model_fields_set:
        return None
    return pool_status.desired_replicas


def desired_replicas(dm: DisaggregatedModel, role: Role) -> int:
    """The replica count the operator applies to the pool's Deployment."""
    pool = pool_spec(dm, role)
    if pool is None:
        return 0
    if not dm.spec.autoscaling.enabled:
        return pool.replicas
    wanted = autoscaled_replicas(dm, role)
    if wanted is None:
        return pool.replicas
    return max(pool.min_replicas, min(pool.max_replicas, wanted))


def replicas_owner(dm: DisaggregatedModel, role: Role) -> str:
    """In words, for Events and docs: who decides this pool's replicas."""
    if dm.spec.autoscaling.enabled:
        return f"the autoscaler (status.pools.{role}.desiredReplicas; autoscaling is enabled)"
    return f"spec.{role}.replicas (autoscaling is disabled)"

"""Who owns a pool's replica count, as pure functions. One owner per field (DESIGN.md §9):

- autoscaling disabled: ``spec.<pool>.replicas`` owns the Deployment's ``spec.replicas``; the operator applies it
  (server-side apply, field manager ``disagg-operator``) and reverts any other writer (``kubectl scale``).
- autoscaling enabled: the autoscaler owns it, as HPA does: it records each decision in
  ``status.pools.<pool>.desiredReplicas`` + ``lastScale`` and writes the Deployment's ``/scale`` subresource
  under its own field manager (``disagg-autoscaler``). The operator's apply carries ``spec.replicas`` only when
  it creates the Deployment (the initial count below); afterwards it leaves the field out, so neither its
  applies nor its drift correction can ever change the replica count.

``desired_replicas`` is the count the pool should have now: what status reports as desiredReplicas and what a
(re-)created Deployment starts with.
"""

from __future__ import annotations

from ..api.contract import Role
from ..api.models import DisaggregatedModel, PoolSpec

AUTOSCALER_FIELD_MANAGER = "disagg-autoscaler"


def pool_spec(dm: DisaggregatedModel, role: Role) -> PoolSpec | None:
    spec: PoolSpec | None = getattr(dm.spec, role, None)
    return spec


def autoscaled(dm: DisaggregatedModel, role: Role) -> bool:
    """Does the autoscaler own this pool's replicas? (Only the prefill and decode pools are autoscaled.)"""
    return dm.spec.autoscaling.enabled and role in ("prefill", "decode")


def autoscaled_replicas(dm: DisaggregatedModel, role: Role) -> int | None:
    """status.pools.<role>.desiredReplicas when it was recorded (by the autoscaler or an earlier reconcile)."""
    if dm.status is None:
        return None
    pool_status = getattr(dm.status.pools, role, None)
    if pool_status is None or "desired_replicas" not in pool_status.model_fields_set:
        return None
    value: int = pool_status.desired_replicas
    return value


def clamp(pool: PoolSpec, replicas: int) -> int:
    return max(pool.min_replicas, min(pool.max_replicas, replicas))


def desired_replicas(dm: DisaggregatedModel, role: Role) -> int:
    """The replica count in the built manifest: the spec's, or with autoscaling the autoscaler's last recorded
    decision clamped to [minReplicas, maxReplicas] (the spec's count until it decided). The operator sends it to
    the apiserver only when it owns the field (see the module docstring)."""
    pool = pool_spec(dm, role)
    if pool is None:
        return 0
    if not autoscaled(dm, role):
        return pool.replicas
    wanted = autoscaled_replicas(dm, role)
    return clamp(pool, pool.replicas if wanted is None else wanted)


def replicas_owner(dm: DisaggregatedModel, role: Role) -> str:
    """In words, for Events and docs: who decides this pool's replicas."""
    if autoscaled(dm, role):
        return (f"the autoscaler (field manager {AUTOSCALER_FIELD_MANAGER} through /scale, recorded in "
                f"status.pools.{role}.desiredReplicas; autoscaling is enabled)")
    return f"spec.{role}.replicas (autoscaling is disabled)"

"""The status of a DisaggregatedModel: what the operator observed and decided, written by the operator only."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from .base import ApiModel


# The mode in force (status.activeMode): spec.mode pins it, or the operator decides it under spec.mode Auto.
class ActiveMode(StrEnum):
    DISAGGREGATED = "Disaggregated"
    AGGREGATED = "Aggregated"


class Condition(ApiModel):
    type: str = Field(max_length=316, description="Condition type, e.g. Ready, PrefillReady, FallbackActive.")
    status: Literal["True", "False", "Unknown"] = Field(description="Status of the condition.")
    reason: str = Field(default="", max_length=1024, description="CamelCase reason for the last transition.")
    message: str = Field(default="", max_length=32768, description="Human-readable details.")
    last_transition_time: str | None = Field(default=None, description="When the status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed from."
    )


class ScaleEvent(ApiModel):
    time: str = Field(description="When the pool was scaled (RFC 3339).")
    from_replicas: int = Field(alias="from", ge=0, description="Replicas before.")
    to_replicas: int = Field(alias="to", ge=0, description="Replicas after.")
    reason: str = Field(default="", max_length=1024, description="Why, in words and figures.")


class PoolStatus(ApiModel):
    replicas: int = Field(default=0, ge=0, description="Worker pods that exist.")
    ready_replicas: int = Field(default=0, ge=0, description="Worker pods ready to serve.")
    desired_replicas: int = Field(default=0, ge=0, description="Replicas the operator wants.")
    summary: str = Field(default="0/0", description="readyReplicas/desiredReplicas (printer column).")
    last_scale: ScaleEvent | None = Field(default=None, description="The last scaling decision.")
    starting: bool = Field(
        default=False,
        description="True while the pool has no ready replica and has not been ready since it was created, scaled "
        "from zero or rolled to a new generation: it is starting (condition Progressing), not failed.",
    )


class RoleMoves(ApiModel):
    """Workers serving the other pool's role (issue 28, "move roles before pods"): the autoscaler's answer to a
    change in the mix that the pools' sizes have not followed yet. A lent worker keeps its pod, GPU and engine; the
    router sends it the other role's work (router/load.py ``WorkerSet.lend``)."""

    prefill_to_decode: int = Field(default=0, ge=0, description="Prefill-pool workers serving the decode role.")
    decode_to_prefill: int = Field(default=0, ge=0, description="Decode-pool workers serving the prefill role.")
    reason: str = Field(default="", max_length=1024, description="Why, in words and figures.")
    time: str | None = Field(default=None, description="When the moves were last changed (RFC 3339).")

    @property
    def lent(self) -> int:
        return self.prefill_to_decode + self.decode_to_prefill

    def lends(self) -> dict[str, int]:
        """As :meth:`disagg.router.load.WorkerSet.lend` takes them: role → workers of the other pool serving it."""
        return {"decode": self.prefill_to_decode, "prefill": self.decode_to_prefill}


class PoolsStatus(ApiModel):
    prefill: PoolStatus = Field(default_factory=PoolStatus, description="The prefill pool.")
    decode: PoolStatus = Field(default_factory=PoolStatus, description="The decode pool.")
    aggregated: PoolStatus | None = Field(default=None, description="The aggregated pool, when configured.")


class ObservedStatus(ApiModel):
    ttft_p95_ms: float | None = Field(default=None, description="Observed p95 time to first token.")
    tpot_p95_ms: float | None = Field(default=None, description="Observed p95 time per output token.")
    goodput: float | None = Field(default=None, description="Share of requests meeting both TTFT and TPOT SLOs.")
    prefill_queue_delay_p95_ms: float | None = Field(default=None, description="Observed p95 prefill queue wait.")
    decode_active_sequences: float | None = Field(default=None, description="Sequences running on the decode pool.")
    kv_transfer_p95_ms: float | None = Field(default=None, description="Observed p95 KV-cache transfer time.")
    prefix_cache_hit_rate: float | None = Field(default=None, description="Prefix-cache hit rate of the decode pool.")
    mode_probes_succeeded: float | None = Field(
        default=None,
        description="Remote-path probes that succeeded within spec.modePolicy.windowSeconds while the operator held "
        "the model Aggregated.",
    )
    mode_probes_failed: float | None = Field(
        default=None,
        description="Remote-path probes that failed (and fell back) within spec.modePolicy.windowSeconds while the "
        "operator held the model Aggregated.",
    )
    time: str | None = Field(default=None, description="When these figures were measured (RFC 3339).")


class DisaggregatedModelStatus(ApiModel):
    observed_generation: int | None = Field(default=None, description="Last metadata.generation reconciled.")
    conditions: list[Condition] = Field(default_factory=list, description="Latest observations of the model's state.")
    active_mode: ActiveMode | None = Field(default=None, description="Mode in force: Disaggregated or Aggregated.")
    mode_reason: str | None = Field(default=None, description="Why the active mode was chosen.")
    mode_since: str | None = Field(default=None, description="When the active mode took effect (RFC 3339).")
    pools: PoolsStatus = Field(default_factory=PoolsStatus, description="Per-pool replica counts and scaling.")
    role_moves: RoleMoves | None = Field(
        default=None, description="Workers lent to the other pool's role by the predictive autoscaler (none: unset)."
    )
    observed: ObservedStatus = Field(
        default_factory=ObservedStatus, description="Measured SLO figures and mode-probe counts."
    )


"""The spec's request-routing sections: the per-request policy (``spec.routing``), the canary (``spec.rollout``)
and the SLO (``spec.slo``). Part of the API's models (spec.py re-exports them; conventions in its docstring)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import DNS_LABEL, ApiModel

# -------------------------------------------------------------------------------------------- routing


class RemotePrefillPolicy(ApiModel):
    min_input_tokens: int = Field(
        default=2048, ge=0, le=10_485_760, description="Prompts at least this long may take remote prefill."
    )
    max_prefill_queue_wait_ms: int = Field(
        default=300,
        ge=0,
        le=600_000,
        description="Remote prefill only while the estimated prefill-queue wait is at most this.",
    )
    min_expected_output_tokens: int = Field(
        default=128,
        ge=0,
        le=10_485_760,
        description="Remote prefill only when the expected output (max_tokens, else the tenant's observed "
        "average) is at least this many tokens.",
    )
    require_decode_pool_pressure: bool = Field(
        default=False,
        description="Remote prefill only while the decode pool is busy (running sequences or KV-cache usage high).",
    )


class LocalPrefillPolicy(ApiModel):
    max_input_tokens: int = Field(
        default=1024, ge=0, le=10_485_760, description="Prompts at most this long prefill on the decode worker."
    )
    prefer_when_prefix_cache_hit: bool = Field(
        default=True,
        description="Prefill locally when the chosen decode worker likely holds the prompt's prefix.",
    )


class FallbackPolicy(ApiModel):
    on_kv_transfer_timeout: Literal["LocalAggregated", "Fail"] = Field(
        default="LocalAggregated",
        alias="onKVTransferTimeout",
        description="On a prefill-leg or KV-transfer timeout/error: serve the request aggregated on a decode "
        "worker (LocalAggregated), or return the error (Fail).",
    )
    on_prefill_queue_overload: Literal["LocalPrefill", "Queue", "Reject"] = Field(
        default="LocalPrefill",
        description="When the prefill queue wait exceeds maxPrefillQueueWaitMs: prefill on the decode worker, "
        "wait in the prefill queue, or reject with 429.",
    )


class CircuitBreakerSpec(ApiModel):
    failure_threshold: int = Field(
        default=3,
        ge=1,
        le=1000,
        description="Consecutive KV-transfer failures or timeouts on one target (a decode worker, or a "
        "prefill→decode pair) that open its breaker; while it is open, requests for that target prefill locally at "
        "once instead of waiting for a timeout.",
    )
    cooldown_seconds: int = Field(
        default=10,
        ge=1,
        le=3600,
        description="Seconds an open breaker stays open before it turns half-open and lets trial requests through.",
    )
    half_open_probes: int = Field(
        default=1,
        ge=1,
        le=100,
        description="Trial requests a half-open breaker lets through; all must succeed to close it, one failure "
        "reopens it.",
    )


class RemotePrefillOverride(ApiModel):
    min_input_tokens: int | None = Field(default=None, ge=0, le=10_485_760, description="Overrides the model's.")
    max_prefill_queue_wait_ms: int | None = Field(default=None, ge=0, le=600_000, description="Overrides the model's.")
    min_expected_output_tokens: int | None = Field(
        default=None, ge=0, le=10_485_760, description="Overrides the model's."
    )
    require_decode_pool_pressure: bool | None = Field(default=None, description="Overrides the model's.")


class LocalPrefillOverride(ApiModel):
    max_input_tokens: int | None = Field(default=None, ge=0, le=10_485_760, description="Overrides the model's.")
    prefer_when_prefix_cache_hit: bool | None = Field(default=None, description="Overrides the model's.")


class TenantMatch(ApiModel):
    header: str = Field(
        default="x-tenant-id",
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9-]+$",
        description="Request header carrying the tenant.",
    )
    values: list[str] = Field(
        min_length=1, max_length=256, description="Header values that select this tenant (exact match)."
    )


class TenantPolicy(ApiModel):
    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL, description="Tenant name (metrics label).")
    match: TenantMatch = Field(description="How requests are attributed to this tenant.")
    priority: Literal["Interactive", "Batch", "Background"] = Field(
        default="Interactive",
        description="Scheduling class, vLLM request priority Interactive 0, Batch 1, Background 2 (lower first): "
        "when any tenant is below Interactive the workers run vLLM's --scheduling-policy priority and the router "
        "sends this tenant's priority on every leg. The router's admission queue (overload: Queue) releases the "
        "higher classes first, weighted fair (docs/router.md \"Admission and overload\").",
    )
    overload: Literal["Admit", "Queue", "Shed"] = Field(
        default="Admit",
        description="What the router does with this tenant's request when the TTFT it predicts for it is past half "
        "of spec.slo.ttftP95Ms (the admission margin; and past twice what an idle engine would take: the deployment "
        "is past its knee, not the prompt long): Admit serves it anyway (the "
        "default: no request is ever held or refused for load); Queue holds it in the router, in a bounded "
        "per-tenant queue released weighted fair across tenants by priority as requests complete, and refuses it "
        "with 429 after maxQueueTimeMs (the wait counts in its TTFT); Shed refuses it at once with 429, Retry-After "
        "and an OpenAI error body, so that the capacity goes to the tenants that Admit or Queue.",
    )
    max_queued: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="overload: Queue: the most requests of this tenant held in the router's queue (each router "
        "process) at once; a request past it is refused with 429 at once. Default 256. Only with overload: Queue.",
    )
    max_queue_time_ms: int | None = Field(
        default=None,
        ge=1,
        le=600_000,
        description="overload: Queue: the longest a request of this tenant waits in the router's queue before it "
        "is refused with 429. Default 10000. Only with overload: Queue.",
    )
    disaggregation: Literal["Auto", "Never", "Always"] = Field(
        default="Auto",
        description="Auto applies the policy; Never always prefills locally; Always prefers remote prefill "
        "(fallbacks still apply).",
    )
    remote_prefill: RemotePrefillOverride | None = Field(
        default=None, description="Per-tenant remote-prefill overrides."
    )
    local_prefill: LocalPrefillOverride | None = Field(default=None, description="Per-tenant local-prefill overrides.")


class PromptBucket(ApiModel):
    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL, description="Bucket name (metrics label).")
    min_input_tokens: int = Field(default=0, ge=0, le=10_485_760, description="Inclusive lower bound on prompt tokens.")
    max_input_tokens: int | None = Field(
        default=None, ge=1, le=10_485_760, description="Exclusive upper bound on prompt tokens; open when omitted."
    )
    prefill: Literal["Auto", "Remote", "Local"] = Field(
        default="Auto", description="Decision for prompts in this bucket: the policy (Auto), or forced."
    )


class RoutingSpec(ApiModel):
    """The per-request policy (the seed's pd_disaggregation_policy)."""

    policy: Literal["Thresholds", "SLO"] = Field(
        default="SLO",
        description="How the router places a request that no tenant, bucket or canary rule forces. SLO "
        "(default): the rule ladder proposes, then the router predicts, for each placement (the whole request on "
        "a decode worker; remote prefill then decode; the whole request on a prefill worker with slack), its TTFT "
        "and TPOT and the slowdown it causes to the requests already there, and overrules the ladder when another "
        "placement keeps clearly more requests within spec.slo (docs/router.md \"SLO placement\"). Thresholds: "
        "the rule ladder of remotePrefill and localPrefill alone (token thresholds, queue-wait limit, decode "
        "pressure), blind to spec.slo.",
    )
    elastic_fleet: bool = Field(
        default=True,
        description="One elastic fleet: a request the policy keeps local may run whole on a prefill worker that has "
        "had no remote prefill lately and is less loaded than the decode worker (a prefill worker serves a whole "
        "request as an aggregated engine does). false: prefill workers only prefill.",
    )
    remote_prefill: RemotePrefillPolicy = Field(
        default_factory=RemotePrefillPolicy, description="When a request may take the remote-prefill path."
    )
    local_prefill: LocalPrefillPolicy = Field(
        default_factory=LocalPrefillPolicy, description="When a request prefills on its decode worker."
    )
    fallback: FallbackPolicy = Field(
        default_factory=FallbackPolicy, description="What to do when the remote path fails."
    )
    circuit_breaker: CircuitBreakerSpec = Field(
        default_factory=CircuitBreakerSpec,
        description="Fail fast on the remote path: one circuit breaker per decode worker and one per "
        "prefill→decode pair, opened by KV-transfer failures and timeouts.",
    )
    tenants: list[TenantPolicy] = Field(
        default_factory=list, max_length=32, description="Tenants matched by header, with priority and overrides."
    )
    buckets: list[PromptBucket] = Field(
        default_factory=list, max_length=16, description="Prompt-length buckets with a forced or automatic decision."
    )


# Tenant priority → vLLM's request ``priority`` (lower is served first under ``--scheduling-policy priority``:
# vllm/v1/core/sched/request_queue.py PriorityRequestQueue, 0.33.0). Interactive is vLLM's default, 0.
TENANT_PRIORITY: dict[str, int] = {"Interactive": 0, "Batch": 1, "Background": 2}

# overload: Queue's limits when the tenant names none (TenantPolicy.max_queued, max_queue_time_ms)
DEFAULT_MAX_QUEUED = 256
DEFAULT_MAX_QUEUE_TIME_MS = 10_000


def admission_active(routing: RoutingSpec) -> bool:
    """Whether the router predicts each request's TTFT for admission (router/admission.py): when any tenant's
    overload policy is not Admit. Otherwise the router holds and refuses nothing for load, as before."""
    return any(t.overload != "Admit" for t in routing.tenants)


def priority_scheduling(routing: RoutingSpec) -> bool:
    """Whether the workers run vLLM's priority scheduler and the router sends each tenant's priority: when any
    tenant asks for less than Interactive (the operator's worker args and the router read this one rule)."""
    return any(TENANT_PRIORITY[t.priority] != 0 for t in routing.tenants)


# -------------------------------------------------------------------------------------------- rollout


class CanarySpec(ApiModel):
    traffic_percent: float = Field(
        default=100,
        ge=0,
        le=100,
        description="Share of eligible requests (0–100) that may take the remote-prefill path at all.",
    )
    tenants: list[str] = Field(
        default_factory=list, max_length=32, description="Only these tenants may take the remote path (empty: all)."
    )
    endpoints: list[Literal["/v1/completions", "/v1/chat/completions"]] = Field(
        default_factory=list, max_length=2, description="Only these endpoints may take the remote path (empty: all)."
    )
    input_tokens_gte: int = Field(
        default=0, ge=0, le=10_485_760, description="Only prompts at least this long may take the remote path."
    )


class RolloutSpec(ApiModel):
    canary: CanarySpec = Field(
        default_factory=CanarySpec, description="Restricts the remote path to a slice of traffic while rolling out."
    )


# ------------------------------------------------------------------------------------------------ SLO


class SLOSpec(ApiModel):
    ttft_p95_ms: int = Field(default=2000, ge=1, le=600_000, description="Target p95 time to first token.")
    tpot_p95_ms: int = Field(default=100, ge=1, le=60_000, description="Target p95 time per output token.")
    max_error_rate: float = Field(default=0.01, ge=0, le=1, description="Highest acceptable share of failed requests.")
    goodput_target: float = Field(
        default=0.9, ge=0, le=1, description="Target share of requests meeting both TTFT and TPOT targets."
    )

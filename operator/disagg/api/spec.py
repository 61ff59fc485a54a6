"""The spec of a DisaggregatedModel: what the user asks for, section by section.

Units are carried in field names: latencies in ``…Ms``, periods and windows in ``…Seconds`` (integers),
ratios and rates as numbers in [0, 1], percentages in [0, 100].

Single-field constraints (bounds, patterns, enums) are declared on the fields; the CRD schema carries them.
Rules that relate several fields live in ``rules.py`` (one table, from which both the CRD's CEL
``x-kubernetes-validations`` and the Python check ``spec_errors`` are generated), which reads these models: this
module imports nothing of it. ``DisaggregatedModel`` (models.py) checks them on parse, as the apiserver does on
create; the operator's own checks are semantics.py's.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema
from pydantic.config import JsonDict

from ..vllm_versions import DEFAULT_VERSION, VERSION_PATTERN, fmt
from .base import ApiModel

# The newest vLLM release checked with its own parser (disagg.vllm_versions.DEFAULT_VERSION: 0.33.0, 2026-11-30).
DEFAULT_VLLM_IMAGE = f"vllm/vllm-openai:v{fmt(DEFAULT_VERSION)}"

FREEFORM: JsonDict = {"x-kubernetes-preserve-unknown-fields": True}
"""Schema extra of a free-form object (core/v1 types the API passes through without modelling)."""
FREEFORM_ITEMS: JsonDict = {"items": {"type": "object", **FREEFORM}}
"""Schema extra of a list of free-form objects."""
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# One `vllm serve` argument. Bounded so that the apiserver can bound the cost of the CEL rule over extraArgs.
ExtraArg = Annotated[str, Field(max_length=2048)]
# An integer or a percentage ("25%"), as in a Deployment's rollingUpdate; the format is a CEL rule (rules.py).
IntOrPercent = Annotated[
    int | str,
    WithJsonSchema({"x-kubernetes-int-or-string": True}),
]


class Mode(StrEnum):
    AUTO = "Auto"
    DISAGGREGATED = "Disaggregated"
    AGGREGATED = "Aggregated"


# ----------------------------------------------------------------------------------------------- model


class SecretKeyRef(ApiModel):
    name: str = Field(min_length=1, max_length=253, description="Name of a Secret in the model's namespace.")
    key: str = Field(default="token", min_length=1, max_length=253, description="Key within the Secret.")


class HubSource(ApiModel):
    token_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret holding a Hugging Face token, exported to workers as HF_TOKEN. "
        "Omit for public models.",
    )


class PVCSource(ApiModel):
    claim_name: str = Field(min_length=1, max_length=253, description="PersistentVolumeClaim holding the weights.")
    path: str = Field(
        default="/",
        max_length=1024,
        pattern=r"^/",
        description="Absolute path of the model directory inside the claim; passed to `vllm serve` as the model.",
    )


class ModelSourceSpec(ApiModel):
    hub: HubSource | None = Field(
        default=None, description="Download `spec.model.name` from the Hugging Face hub (default when no pvc)."
    )
    pvc: PVCSource | None = Field(default=None, description="Load the weights from a PersistentVolumeClaim.")


class CachePVC(ApiModel):
    claim_name: str = Field(
        min_length=1,
        max_length=253,
        description="PersistentVolumeClaim for the cache, in the model's namespace. Every worker pod of every pool "
        "mounts it read-write: it must be ReadWriteMany (e.g. NFS, CephFS, a cloud file store).",
    )


class ModelCacheSpec(ApiModel):
    """A Hugging Face cache that outlives the worker pods: a restarted or added pod finds the weights already
    downloaded. Set exactly one of hostPath or pvc. docs/install.md ("Model cache") compares them."""

    host_path: str | None = Field(
        default=None,
        min_length=2,
        max_length=4096,
        pattern=r"^/",
        description="Directory on each node (created if missing) that caches the model for every pod scheduled "
        "there. A hostPath volume needs the privileged Pod Security level in the model's namespace.",
    )
    pvc: CachePVC | None = Field(
        default=None, description="A ReadWriteMany claim shared by all the model's workers (Pod Security restricted)."
    )


class ModelSpec(ApiModel):
    name: str = Field(
        min_length=1,
        max_length=512,
        description="Model id on the hub (e.g. meta-llama/Llama-3.1-8B-Instruct) or a display name when "
        "loaded from a PVC. It is the positional model argument of `vllm serve`.",
    )
    served_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="Name clients send in the `model` field (--served-model-name). Defaults to spec.model.name.",
    )
    source: ModelSourceSpec = Field(default_factory=ModelSourceSpec, description="Where the weights come from.")
    max_model_len: int | None = Field(
        default=None, ge=16, le=10_485_760, description="Maximum context length in tokens (--max-model-len)."
    )
    cache: ModelCacheSpec | None = Field(
        default=None,
        description="Keep hub downloads across pod restarts and scale-ups: a per-node hostPath or a shared PVC, "
        "mounted as the workers' Hugging Face cache (HF_HOME). Off when omitted: every new pod downloads the weights "
        "again.",
    )


# ---------------------------------------------------------------------------------------------- engine


class EngineSpec(ApiModel):
    image: str = Field(
        default=DEFAULT_VLLM_IMAGE,
        min_length=1,
        max_length=512,
        description="vLLM image for both pools. Prefill and decode must run the same vLLM build "
        "(NIXL refuses mixed versions); the router pairs equal builds only.",
    )
    vllm_version: str | None = Field(
        default=None,
        max_length=16,
        pattern=VERSION_PATTERN,
        description="vLLM release the image runs (e.g. 0.33.0), for an image whose tag names none (latest, a "
        "digest, a custom tag): the operator renders the flags that release accepts. Unset: the image tag's "
        "release, else the default release (the VLLMVersionKnown condition then says so). Must agree with a tag "
        "that names a release.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Image pull policy of the worker containers."
    )
    image_pull_secrets: list[str] = Field(
        default_factory=list, max_length=16, description="Names of image pull Secrets for the worker pods."
    )
    port: int = Field(default=8000, ge=1024, le=65535, description="HTTP port of `vllm serve` (--port).")
    extra_args: list[ExtraArg] = Field(
        default_factory=list,
        max_length=128,
        description="Extra `vllm serve` arguments for every pool, appended after the operator's own arguments. "
        "Flags the operator sets from the spec (model, port, parallelism, kv-transfer-config, shutdown timeout, …) "
        "are refused in every spelling.",
    )
    env: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=128,
        description="Extra environment variables (core/v1 EnvVar objects) for every worker container. A variable "
        "the operator also sets (e.g. UCX_TLS, HF_HOME) takes the value given here instead (merged by name; the "
        "last entry of a name wins).",
        json_schema_extra=FREEFORM_ITEMS,
    )
    shutdown_timeout_seconds: int = Field(
        default=60,
        ge=0,
        le=3600,
        description="Seconds a worker keeps serving in-flight requests on shutdown (vLLM --shutdown-timeout). "
        "The pod's termination grace period is set longer so that scale-down drains.",
    )


# ----------------------------------------------------------------------------------------------- pools


class GPUSpec(ApiModel):
    resource_name: str = Field(
        default="nvidia.com/gpu",
        max_length=253,
        pattern=r"^([a-z0-9.-]+/)?[A-Za-z0-9._-]+$",
        description="Extended resource that the GPU device plugin advertises.",
    )
    count: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="GPUs per worker pod. Defaults to tensor × pipeline × data parallel size (÷ nodesPerReplica); "
        "must be a multiple of tensor × pipeline (with nodesPerReplica > 1: × nodesPerReplica equal to "
        "tensor × pipeline × data).",
    )
    product: str | None = Field(
        default=None,
        max_length=253,
        description="GPU product to schedule on (e.g. NVIDIA-H100-80GB-HBM3), matched against the node label "
        "`productLabel`. Lets prefill use compute-heavy GPUs and decode bandwidth-heavy ones.",
    )
    product_label: str = Field(
        default="nvidia.com/gpu.product",
        max_length=253,
        description="Node label holding the GPU product (GPU feature discovery's label by default).",
    )


class ParallelismSpec(ApiModel):
    tensor: int = Field(default=1, ge=1, le=64, description="Tensor parallel size (--tensor-parallel-size).")
    pipeline: int = Field(default=1, ge=1, le=64, description="Pipeline parallel size (--pipeline-parallel-size).")
    data: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Data parallel size of one replica (--data-parallel-size): inside one pod, or, with "
        "nodesPerReplica > 1, the total over the replica's nodes (each node runs data ÷ nodesPerReplica ranks).",
    )
    data_parallel_size_local: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Data-parallel ranks per node (--data-parallel-size-local). Defaults to data ÷ "
        "nodesPerReplica; when set it must equal that.",
    )
    expert: bool = Field(
        default=False,
        description="Expert parallelism for MoE models (--enable-expert-parallel): the experts are spread over "
        "tensor × data GPUs (EP size = tensor × data) instead of being sharded by tensor parallelism. Needs "
        "tensor × data > 1.",
    )


class RollingUpdateSpec(ApiModel):
    """How a pool's Deployment replaces its workers when what they run changes (Deployment
    strategy.rollingUpdate). Each value is a count or a percentage of replicas (surge rounds up, unavailable
    down)."""

    max_surge: IntOrPercent = Field(
        default=1,
        description="Workers created above the desired count during a rollout. Each needs a whole replica's GPUs "
        "free (gpu.count per worker): on a full cluster a surge worker stays Pending and the rollout stalls "
        "(old workers keep serving). 0 needs no spare GPUs.",
    )
    max_unavailable: IntOrPercent = Field(
        default=0,
        description="Workers that may be taken away before their replacement is ready: each is serving capacity "
        "lost for a model load (minutes). With 1 replica, 1 stops the pool during the rollout.",
    )


class PoolSpec(ApiModel):
    """One pool of vLLM workers (a Deployment)."""

    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Initial worker count. With autoscaling enabled the operator owns replicas afterwards.",
    )
    min_replicas: int = Field(default=1, ge=0, le=1000, description="Lower bound for the autoscaler.")
    max_replicas: int = Field(default=8, ge=0, le=1000, description="Upper bound for the autoscaler.")
    gpu: GPUSpec = Field(default_factory=GPUSpec, description="GPUs per worker pod and where to find them.")
    parallelism: ParallelismSpec = Field(
        default_factory=ParallelismSpec, description="Parallelism of each worker; may differ between pools."
    )
    nodes_per_replica: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Nodes (pods) one replica spans. Above 1 a replica is a group: a leader pod that serves HTTP "
        "and headless worker pods, started together, restarted together, scaled and disrupted as one unit; gpu.count "
        "is then per pod and gpu.count × nodesPerReplica must equal tensor × pipeline × data "
        "(docs/multinode.md).",
    )
    max_num_seqs: int | None = Field(
        default=None, ge=1, le=65536, description="Concurrent sequences per worker (--max-num-seqs)."
    )
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, le=10_485_760, description="Token budget per engine step (--max-num-batched-tokens). "
        "Unset on the decode pool: the largest multiple of 256 whose one prefill chunk fits in spec.slo.tpotP95Ms "
        "(it bounds the stall a local prefill causes to running streams); elsewhere vLLM's default."
    )
    extra_args: list[ExtraArg] = Field(
        default_factory=list,
        max_length=128,
        description="Extra `vllm serve` arguments for this pool only, appended after spec.engine.extraArgs. Flags "
        "the operator sets from the spec are refused in every spelling.",
    )
    resources: dict[str, Any] = Field(
        default_factory=dict,
        description="core/v1 ResourceRequirements for the worker container (CPU, memory). GPU and RDMA "
        "resources are added by the operator.",
        json_schema_extra=FREEFORM,
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the worker pods must match (merged with gpu.product)."
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=64,
        description="core/v1 Tolerations for the worker pods.",
        json_schema_extra=FREEFORM_ITEMS,
    )
    affinity: dict[str, Any] = Field(
        default_factory=dict, description="core/v1 Affinity for the worker pods.", json_schema_extra=FREEFORM
    )
    pod_template: dict[str, Any] = Field(
        default_factory=dict,
        description="Strategic overrides merged into the rendered pod template (metadata and spec), "
        "for what the API does not model. The vllm container's command and args are the operator's: use "
        "extraArgs.",
        json_schema_extra=FREEFORM,
    )
    rolling_update: RollingUpdateSpec = Field(
        default_factory=RollingUpdateSpec,
        description="Rollout strategy of the pool's Deployment. The default (maxSurge 1, maxUnavailable 0) keeps "
        "serving capacity and needs one spare replica's GPUs per rolling pool; on a cluster without them use "
        "maxSurge 0, maxUnavailable 1 (docs/production-checklist.md, \"Rollouts\").",
    )


# ---------------------------------------------------------------------------------------- KV transfer


class RDMASpec(ApiModel):
    resource_name: str = Field(
        default="rdma/ib",
        max_length=253,
        pattern=r"^([a-z0-9.-]+/)?[A-Za-z0-9._-]+$",
        description="Extended resource of the RDMA device plugin (e.g. rdma/ib, rdma/hca_shared_devices_a).",
    )
    count: int = Field(default=1, ge=1, le=64, description="RDMA resources per worker pod.")
    devices: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="HCA ports for UCX_NET_DEVICES (e.g. mlx5_0:1). Empty lets UCX choose.",
    )


class KVTransferSpec(ApiModel):
    connector: Literal["NixlConnector"] = Field(
        default="NixlConnector", description="vLLM KV connector (--kv-transfer-config kv_connector)."
    )
    transport: Literal["rdma", "nvlink", "tcp", "auto"] = Field(
        default="auto",
        description="How UCX moves KV blocks: rdma (InfiniBand/RoCE verbs), nvlink (cuda_ipc inside one "
        "node/NVLink domain), tcp (slow; long prompts pay for it), auto (UCX chooses).",
    )
    rdma: RDMASpec | None = Field(default=None, description="RDMA devices; only with transport rdma.")
    side_channel_port: int = Field(
        default=5600, ge=1024, le=65535, description="NIXL handshake port (VLLM_NIXL_SIDE_CHANNEL_PORT)."
    )
    transfer_timeout_ms: int = Field(
        default=10_000,
        ge=100,
        le=600_000,
        description="Router deadline for the prefill leg plus KV hand-off; past it the fallback applies.",
    )
    load_failure_policy: Literal["recompute", "fail"] = Field(
        default="recompute",
        description="What the decode worker does when a KV load fails (kv_load_failure_policy): recompute the "
        "prefill locally, or fail the request.",
    )
    extra_config: dict[str, Any] = Field(
        default_factory=dict,
        description="kv_connector_extra_config passed verbatim to vLLM.",
        json_schema_extra=FREEFORM,
    )


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


# ---------------------------------------------------------------------------------------- autoscaling


class BasicAuthSecretRef(ApiModel):
    name: str = Field(min_length=1, max_length=253, description="Name of a Secret in the model's namespace.")
    username_key: str = Field(default="username", min_length=1, max_length=253,
                              description="Key of the user name within the Secret.")
    password_key: str = Field(default="password", min_length=1, max_length=253,
                              description="Key of the password within the Secret.")


class CASecretRef(ApiModel):
    name: str = Field(min_length=1, max_length=253, description="Name of a Secret in the model's namespace.")
    key: str = Field(default="ca.crt", min_length=1, max_length=253,
                     description="Key of the PEM bundle within the Secret (ca.crt, as cert-manager writes it).")


class PrometheusTLSSpec(ApiModel):
    """How the operator checks an https:// Prometheus: against the system's CAs (the default), a CA bundle of
    your own, or not at all."""

    ca_secret_ref: CASecretRef | None = Field(
        default=None, description="Secret with the PEM CA bundle that signed Prometheus' certificate (a private CA)."
    )
    insecure_skip_verify: bool = Field(
        default=False, description="Skip certificate verification (tests only: anyone on the path can read and "
        "answer the queries the autoscaler acts on)."
    )


class PrometheusSpec(ApiModel):
    url: str = Field(
        min_length=1, max_length=2048, pattern=r"^https?://", description="Prometheus base URL (http or https)."
    )
    auth_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret with a bearer token for Prometheus."
    )
    basic_auth_secret_ref: BasicAuthSecretRef | None = Field(
        default=None, description="Secret with a user name and password for HTTP basic auth (an auth proxy in front "
        "of Prometheus, Grafana Mimir's gateway). Instead of authSecretRef, not with it."
    )
    headers: dict[str, str] | None = Field(
        default=None, max_length=16,
        description="Extra HTTP headers on every query, e.g. the tenant of a multi-tenant store: "
        "X-Scope-OrgID (Grafana Mimir, Cortex, Loki) or THANOS-TENANT (Thanos Receive's default). Not for "
        "credentials: Authorization is refused here (authSecretRef, basicAuthSecretRef).",
    )
    tls: PrometheusTLSSpec | None = Field(default=None, description="Certificate checks for an https:// url.")
    timeout_seconds: int = Field(default=5, ge=1, le=120, description="Per-query timeout.")


class RatioBounds(ApiModel):
    min: float = Field(default=0.1, ge=0, le=100, description="Lowest prefill:decode replica ratio.")
    max: float = Field(default=10, ge=0, le=100, description="Highest prefill:decode replica ratio.")


class AutoscalingSpec(ApiModel):
    enabled: bool = Field(
        default=False,
        description="Scale each pool from phase metrics against the SLOs. When on, the autoscaler owns the "
        "Deployments' replicas: it writes them through the /scale subresource under its own field manager "
        "(disagg-autoscaler), the operator's apply leaves them out after creation, and a count another writer sets "
        "is reported (Warning event ReplicasConflict, naming its field manager) and set back.",
    )
    prometheus: PrometheusSpec | None = Field(default=None, description="Where the phase metrics are queried.")
    interval_seconds: int = Field(default=30, ge=5, le=3600, description="How often the policy runs.")
    scale_up_stabilization_seconds: int = Field(
        default=0, ge=0, le=3600, description="Window over which scale-up recommendations are smoothed."
    )
    scale_down_stabilization_seconds: int = Field(
        default=300,
        ge=0,
        le=86400,
        description="Window over which the highest recommendation wins before scaling down.",
    )
    max_step: int = Field(default=2, ge=1, le=100, description="Most replicas a pool changes by per interval.")
    gpu_budget: int | None = Field(
        default=None, ge=1, le=100_000, description="Total GPUs both pools may use together; unlimited when omitted."
    )
    prefill_decode_ratio: RatioBounds = Field(
        default_factory=RatioBounds, description="Bounds on prefill replicas ÷ decode replicas."
    )


class ModeProbeSpec(ApiModel):
    rate_per_minute: int = Field(
        default=6,
        ge=0,
        le=6000,
        description="While the operator (not spec.mode) holds the model Aggregated, each router sends at most this "
        "many eligible requests per minute down the remote path as probes, each with the normal fallback. "
        "0 turns probing off: the return to Disaggregated then needs only healthyHoldSeconds.",
    )
    max_share: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Probes are also capped at this share (0–1) of eligible requests. 0 turns probing off.",
    )
    successes_to_return: int = Field(
        default=3,
        ge=0,
        le=10_000,
        description="Successful probes within windowSeconds needed, besides healthyHoldSeconds of healthy signals, "
        "to return to Disaggregated. 0 lets the healthy hold alone decide.",
    )


class ModePolicySpec(ApiModel):
    kv_transfer_failure_rate: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Flip to Aggregated (spec.mode Auto) when this share of remote requests fail or time out "
        "in KV transfer.",
    )
    transfer_share_of_ttft: float = Field(
        default=0.5,
        alias="transferShareOfTTFT",
        ge=0,
        le=1,
        description="Flip to Aggregated when TTFT breaches its SLO and KV transfer is this share of it or more.",
    )
    window_seconds: int = Field(
        default=60, ge=10, le=3600, description="Window the signals and probe counts are measured over."
    )
    healthy_hold_seconds: int = Field(
        default=300,
        ge=0,
        le=86400,
        description="How long the signals must stay healthy before flipping back to Disaggregated.",
    )
    probe: ModeProbeSpec = Field(
        default_factory=ModeProbeSpec,
        description="Remote-path probes while the operator holds the model Aggregated: the evidence, besides the "
        "healthy hold, needed to return to Disaggregated.",
    )


# --------------------------------------------------------------------------------------------- router


class RouterSpec(ApiModel):
    workers: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Router processes per router pod (`disagg router --workers N`: one port, SO_REUSEPORT, one "
        "process per core). Omitted: the router container's CPU request rounded down, at least 1.",
    )


# ------------------------------------------------------------------------------------------ observability


class TracingSpec(ApiModel):
    """OpenTelemetry traces: the router's span per request with its prefill and decode legs, and vLLM's own
    request spans joined to them through W3C traceparent (docs/observability.md)."""

    endpoint: str = Field(
        min_length=1,
        max_length=2048,
        pattern=r"^https?://[^/\s]+(/\S*)?$",
        description="The OpenTelemetry collector: an OTLP/gRPC endpoint, http://host:port with no path (e.g. "
        "http://otel-collector.observability:4317), or an OTLP/HTTP traces URL with its path (e.g. "
        "http://jaeger-collector.observability:4318/v1/traces). https:// for TLS. The workers (vLLM's "
        "--otlp-traces-endpoint) and the router export to it, with the protocol below.",
    )
    protocol: Literal["grpc", "http/protobuf"] | None = Field(
        default=None,
        description="OTLP protocol, rendered as OTEL_EXPORTER_OTLP_TRACES_PROTOCOL for the workers (the one "
        "variable vLLM reads for it) and the router. Omitted: inferred from the endpoint: a URL with a path is "
        "http/protobuf, one without is grpc (an endpoint on port 4318, OTLP/HTTP's, needs its path or protocol grpc).",
    )
    sampling_ratio: float = Field(
        default=0.01,
        ge=0,
        le=1,
        description="Share of requests traced, 0 to 1. The router samples each new trace and the workers follow "
        "its decision (parent-based); requests sent to a worker directly are sampled at the same ratio.",
    )


class ObservabilitySpec(ApiModel):
    tracing: TracingSpec | None = Field(
        default=None, description="OpenTelemetry traces through the router and both pools; off when omitted."
    )


# ------------------------------------------------------------------------------------------ multi-node


class MultiNodeSpec(ApiModel):
    """How pools whose replicas span several nodes (nodesPerReplica > 1) are run (docs/multinode.md)."""

    backend: Literal["LeaderWorkerSet", "StatefulSet", "Auto"] = Field(
        default="Auto",
        description="LeaderWorkerSet: one leaderworkerset.x-k8s.io/v1 LeaderWorkerSet per pool (needs its CRD and "
        "controller). StatefulSet: StatefulSets owned by the operator, one per pod of each group (any cluster). "
        "Auto: LeaderWorkerSet when its CRD is installed, else StatefulSet.",
    )
    data_parallel_rpc_port: int = Field(
        default=29550,
        ge=1024,
        le=65535,
        description="Port of the leader that a group's data-parallel engines hand-shake on "
        "(--data-parallel-rpc-port; vLLM's default).",
    )
    master_port: int = Field(
        default=29501,
        ge=1024,
        le=65535,
        description="torch.distributed port of the leader when tensor × pipeline parallelism spans the nodes "
        "(--master-port; vLLM's default).",
    )


# ----------------------------------------------------------------------------------------------- spec


class DisaggregatedModelSpec(ApiModel):
    model: ModelSpec = Field(description="The model to serve.")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="vLLM image and settings shared by all pools.")
    mode: Mode = Field(
        default=Mode.AUTO,
        description="Auto: disaggregated, flipped to Aggregated by the operator when it misbehaves and back when "
        "healthy. Disaggregated or Aggregated pin the mode (Aggregated is the one-click rollback).",
    )
    prefill: PoolSpec = Field(default_factory=PoolSpec, description="The prefill pool (kv_producer workers).")
    decode: PoolSpec = Field(default_factory=PoolSpec, description="The decode pool (kv_consumer workers).")
    aggregated: PoolSpec | None = Field(
        default=None,
        description="Optional aggregated pool (no KV connector) kept as the fallback path, e.g. an existing "
        "deployment during a migration. Without it, decode workers serve aggregated requests.",
    )
    kv_transfer: KVTransferSpec = Field(
        default_factory=KVTransferSpec, alias="kvTransfer", description="KV-cache transfer between the pools."
    )
    routing: RoutingSpec = Field(default_factory=RoutingSpec, description="Per-request remote/local prefill policy.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="Gradual rollout of the remote path.")
    slo: SLOSpec = Field(default_factory=SLOSpec, description="Service-level objectives per phase.")
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec, description="SLO-driven scaling per pool.")
    mode_policy: ModePolicySpec = Field(
        default_factory=ModePolicySpec, description="When spec.mode Auto flips to Aggregated and back."
    )
    router: RouterSpec = Field(
        default_factory=RouterSpec, description="The router Deployment (the OpenAI endpoint in front of the pools)."
    )
    multi_node: MultiNodeSpec = Field(
        default_factory=MultiNodeSpec,
        description="How replicas that span several nodes (a pool's nodesPerReplica > 1) are run.",
    )
    observability: ObservabilitySpec = Field(
        default_factory=ObservabilitySpec, description="Traces (and, later, other signals) of the data path."
    )

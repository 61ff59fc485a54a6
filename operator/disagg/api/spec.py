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
from .base import DNS_LABEL, ApiModel, SecretKeyRef
from .spec_ops import (
    AutoscalingSpec,
    BasicAuthSecretRef,
    CASecretRef,
    ModePolicySpec,
    ModeProbeSpec,
    MultiNodeSpec,
    ObservabilitySpec,
    PrometheusSpec,
    PrometheusTLSSpec,
    RatioBounds,
    RouterSpec,
    TracingSpec,
)
from .spec_routing import (
    DEFAULT_MAX_QUEUE_TIME_MS,
    DEFAULT_MAX_QUEUED,
    TENANT_PRIORITY,
    CanarySpec,
    CircuitBreakerSpec,
    FallbackPolicy,
    LocalPrefillOverride,
    LocalPrefillPolicy,
    PromptBucket,
    RemotePrefillOverride,
    RemotePrefillPolicy,
    RolloutSpec,
    RoutingSpec,
    SLOSpec,
    TenantMatch,
    TenantPolicy,
    admission_active,
    priority_scheduling,
)

# The newest vLLM release checked with its own parser (disagg.vllm_versions.DEFAULT_VERSION: 0.33.0, 2026-11-30).
DEFAULT_VLLM_IMAGE = f"vllm/vllm-openai:v{fmt(DEFAULT_VERSION)}"

FREEFORM: JsonDict = {"x-kubernetes-preserve-unknown-fields": True}
"""Schema extra of a free-form object (core/v1 types the API passes through without modelling)."""
FREEFORM_ITEMS: JsonDict = {"items": {"type": "object", **FREEFORM}}
"""Schema extra of a list of free-form objects."""
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
        "(it bounds the stall a local prefill causes to running streams); on the prefill pool of an elastic fleet "
        "(routing.elasticFleet) the same, but never below the smallest chunk within 1 % of the GPU's best prefill "
        "throughput; elsewhere vLLM's default."
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
        default=10_000, ge=100, le=600_000,
        description="Router deadline for each leg of a remote request: the prefill leg (from its start), then the "
        "KV hand-off (the decode leg's first token, from the prefill leg's end); past either the fallback applies.",
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


# The whole API, one import away (the sections live in spec_routing.py and spec_ops.py).
__all__ = [
    "DEFAULT_MAX_QUEUED",
    "DEFAULT_MAX_QUEUE_TIME_MS",
    "DEFAULT_VLLM_IMAGE",
    "DNS_LABEL",
    "FREEFORM",
    "FREEFORM_ITEMS",
    "TENANT_PRIORITY",
    "AutoscalingSpec",
    "BasicAuthSecretRef",
    "CASecretRef",
    "CachePVC",
    "CanarySpec",
    "CircuitBreakerSpec",
    "DisaggregatedModelSpec",
    "EngineSpec",
    "ExtraArg",
    "FallbackPolicy",
    "GPUSpec",
    "HubSource",
    "IntOrPercent",
    "KVTransferSpec",
    "LocalPrefillOverride",
    "LocalPrefillPolicy",
    "Mode",
    "ModePolicySpec",
    "ModeProbeSpec",
    "ModelCacheSpec",
    "ModelSourceSpec",
    "ModelSpec",
    "MultiNodeSpec",
    "ObservabilitySpec",
    "PVCSource",
    "ParallelismSpec",
    "PoolSpec",
    "PrometheusSpec",
    "PrometheusTLSSpec",
    "PromptBucket",
    "RDMASpec",
    "RatioBounds",
    "RemotePrefillOverride",
    "RemotePrefillPolicy",
    "RollingUpdateSpec",
    "RolloutSpec",
    "RouterSpec",
    "RoutingSpec",
    "SLOSpec",
    "SecretKeyRef",
    "TenantMatch",
    "TenantPolicy",
    "TracingSpec",
    "admission_active",
    "priority_scheduling",
]

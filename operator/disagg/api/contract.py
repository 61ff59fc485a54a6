"""Contracts between the operator, the router and the workers: names, labels, ports, the router config.

One place for what several parts must agree on. The operator writes these; the router and the local
runtime read them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import ApiModel
from .models import ActiveMode, Mode, ModeProbeSpec, RoleMoves, RolloutSpec, RoutingSpec, SLOSpec

Role = Literal["prefill", "decode", "aggregated", "router"]
WORKER_ROLES: tuple[Role, ...] = ("prefill", "decode", "aggregated")

# ----------------------------------------------------------------------------------------- labels
LABEL_NAME = "app.kubernetes.io/name"  # always "disagg"
LABEL_INSTANCE = "app.kubernetes.io/instance"  # the DisaggregatedModel's name
LABEL_COMPONENT = "app.kubernetes.io/component"  # role: prefill | decode | aggregated | router
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"  # "disagg-operator"
LABEL_PART_OF = "app.kubernetes.io/part-of"  # "disagg"
LABEL_MODEL = "serving.disagg.dev/model"  # the DisaggregatedModel's name
LABEL_ROLE = "serving.disagg.dev/role"  # prefill | decode | aggregated | router
LABEL_COMPAT = "serving.disagg.dev/compat-hash"  # hash of image + engine settings; pair equal hashes only

MANAGED_BY = "disagg-operator"
APP_NAME = "disagg"

# ------------------------------------------------------------------------------------------ names


def pool_name(model: str, role: Role) -> str:
    """Deployment and headless Service of a worker pool: ``<model>-prefill`` etc."""
    return f"{model}-{role}"


def router_name(model: str) -> str:
    """Router Deployment, Service, ConfigMap and ServiceAccount: ``<model>-router``."""
    return f"{model}-router"


# Multi-node pools (builders/multinode.py, docs/multinode.md) on the StatefulSet back end: per group (replica) a
# headless Service ``<model>-<role>-<generation>-g<index>`` and one StatefulSet per node rank, ``<group>-n<rank>``.
GROUP_GENERATION_CHARS = 5
"""Length of the generation in a group's name (a hash of what the group's pods run)."""
MAX_STATEFULSET_NAME = 52
"""The longest StatefulSet name: its pods get the label controller-revision-hash=<name>-<hash of up to 10
characters>, which must fit a label value (63)."""


def group_name(model: str, role: Role, generation: str, index: int) -> str:
    """A group of a multi-node pool: its headless Service, and the prefix of its StatefulSets."""
    return f"{pool_name(model, role)}-{generation}-g{index}"


def member_name(group: str, node_rank: int) -> str:
    """The StatefulSet of node rank ``node_rank`` of a group; its one pod is ``<this>-0``."""
    return f"{group}-n{node_rank}"


# The LeaderWorkerSet back end (kubernetes-sigs/lws): its API, and the CRD whose presence makes ``backend: Auto`` pick
# it.
LWS_GROUP = "leaderworkerset.x-k8s.io"
LWS_VERSION = "v1"
LWS_API_VERSION = f"{LWS_GROUP}/{LWS_VERSION}"
LWS_KIND = "LeaderWorkerSet"
LWS_PLURAL = "leaderworkersets"
LWS_CRD = f"{LWS_PLURAL}.{LWS_GROUP}"

ROUTER_CONFIG_KEY = "router.yaml"
ROUTER_PORT = 8080
WORKER_PORT_NAME = "http"
SIDE_CHANNEL_PORT_NAME = "nixl"


# ---------------------------------------------------------------------------------- router config


class EngineProfile(ApiModel):
    """What the router's placement prices a pool's engines with (router/placement.py): the performance model's
    GPU, model and parallelism, and the engine's batch limits. The operator writes what the spec says (GPU product,
    model, parallelism, worker args); the router corrects the prior online from each worker's own metrics."""

    gpu: str = Field(default="H100-SXM", description="GPU preset or product name (perf/presets.py aliases).")
    model: str = Field(default="", description="Model preset or Hugging Face id ('' → the served model).")
    tensor_parallel_size: int = Field(default=1, ge=1, description="--tensor-parallel-size.")
    pipeline_parallel_size: int = Field(default=1, ge=1, description="--pipeline-parallel-size.")
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, description="--max-num-batched-tokens (None: vLLM's default for the GPU).")
    max_num_seqs: int | None = Field(default=None, ge=1, description="--max-num-seqs (None: vLLM's default).")
    block_size: int = Field(default=16, ge=1, description="--block-size.")
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1, description="--gpu-memory-utilization.")
    transport: str = Field(default="rdma", description="KV transport preset: rdma, nvlink or tcp.")


class PoolEndpoint(ApiModel):
    service: str = Field(description="Headless Service of the pool (router discovery in a cluster).")
    port: int = Field(default=8000, description="Worker HTTP port.")
    engine: EngineProfile | None = Field(
        default=None, description="The pool's engines, for the SLO placement's cost prior (None: defaults).")


class RouterPools(ApiModel):
    prefill: PoolEndpoint | None = Field(default=None, description="The prefill pool.")
    decode: PoolEndpoint | None = Field(default=None, description="The decode pool.")
    aggregated: PoolEndpoint | None = Field(default=None, description="The aggregated pool, if any.")

    def engine(self, role: str) -> EngineProfile | None:
        p: PoolEndpoint | None = getattr(self, role, None)
        return p.engine if p is not None else None


class RouterConfig(ApiModel):
    """What the operator writes into the router's ConfigMap (key ``router.yaml``), and what
    ``disagg router --config FILE`` reads. Same field shapes as the DisaggregatedModel spec."""

    model: str = Field(default="", description="Served model name clients send.")
    mode: Mode = Field(default=Mode.AUTO, description="spec.mode of the DisaggregatedModel.")
    active_mode: ActiveMode = Field(
        default=ActiveMode.DISAGGREGATED,
        description="The mode in force, decided by the operator (Aggregated → never remote prefill).",
    )
    routing: RoutingSpec = Field(default_factory=RoutingSpec, description="spec.routing.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="spec.rollout.")
    slo: SLOSpec = Field(default_factory=SLOSpec, description="spec.slo.")
    transfer_timeout_ms: int = Field(default=10_000, description="spec.kvTransfer.transferTimeoutMs.")
    pools: RouterPools = Field(default_factory=RouterPools, description="Where the pools are.")
    prefill_starting: bool = Field(
        default=False,
        description="The prefill pool has not been ready yet (creation, scale from zero, a new generation): "
        "keep requests local (reason prefill_pool_starting). Set by the operator from the pool's status.",
    )
    probe: ModeProbeSpec = Field(
        default_factory=ModeProbeSpec,
        description="spec.modePolicy.probe: remote-path probes while the operator holds the model Aggregated "
        "(mode Auto, activeMode Aggregated).",
    )
    role_moves: RoleMoves | None = Field(
        default=None,
        description="status.roleMoves while a worker is lent: workers serving the other pool's role (the "
        "autoscaler's role moves). Set by the operator from status; none: each pool serves its own role.",
    )

    def probing(self) -> bool:
        """True while the operator (not spec.mode) holds the model Aggregated and probes are configured."""
        return (self.mode == Mode.AUTO and self.active_mode == ActiveMode.AGGREGATED
                and self.probe.rate_per_minute > 0 and self.probe.max_share > 0)

    def effective_mode(self) -> ActiveMode:
        if self.mode == Mode.AGGREGATED:
            return ActiveMode.AGGREGATED
        if self.mode == Mode.DISAGGREGATED:
            return ActiveMode.DISAGGREGATED
        return self.active_mode

"""The cross-field rules of the spec, written once.

Each rule is one row of ``RULES``: the model whose schema node carries it, the CEL expression the apiserver
evaluates (``x-kubernetes-validations``, ``self`` being that node), the message, the field it names, and the
same condition in Python. From the table:

- ``crd.py`` puts each rule's CEL on the schema node of its model (``validation()``), wherever the model occurs;
- ``spec_errors`` walks a spec and reports every rule that does not hold, worded as the apiserver words it:
  ``<path of the node><fieldPath>: <message>`` (e.g. ``spec.prefill.minReplicas: minReplicas must be …``).

A CEL expression and its predicate are true when the spec is valid. The predicate sees the pydantic object with
its defaults applied, as the CEL sees the object the apiserver has defaulted. tests/api holds, for every rule, a
spec that breaks it, refused by both the apiserver and ``spec_errors`` with the same fields and messages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from .rule_predicates import (
    EXTRA_ARGS_CEL,
    EXTRA_ARGS_MESSAGE,
    HEADER_NAME,
    LAYOUT_CEL,
    MOST_WORKERS,
    OTLP_HTTP_PORT_NO_PATH,
    OTLP_NO_PATH,
    SURGE_PERCENT,
    UNAVAILABLE_PERCENT,
    count_or_percent,
    extra_args_free,
    int_or_percent_cel,
    layout,
    matches,
    otlp_http_has_path,
    tenant_overrides_ordered,
    unique,
    zero,
    zero_cel,
)
from .spec import (
    DisaggregatedModelSpec,
    EngineSpec,
    KVTransferSpec,
    ModelCacheSpec,
    ModelSourceSpec,
    ModePolicySpec,
    ParallelismSpec,
    PoolSpec,
    PrometheusSpec,
    PrometheusTLSSpec,
    PromptBucket,
    RatioBounds,
    RollingUpdateSpec,
    RoutingSpec,
    TenantPolicy,
    TracingSpec,
)

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Rule:
    """One cross-field rule of model ``on``, as CEL for the apiserver and as a Python predicate."""

    name: str
    """Stable identifier (tests key their cases on it)."""
    on: type[BaseModel]
    """The model whose schema node carries the rule; ``self`` in the CEL, the argument of ``holds``."""
    cel: str
    """CEL expression over ``self``, true when the rule holds."""
    message: str
    """What the apiserver and ``spec_errors`` say when it does not."""
    holds: Callable[[Any], bool]
    """The CEL expression in Python (made by ``rule``, which checks its argument type against ``on``)."""
    field_path: str = ""
    """The field the error names, relative to the node (``.minReplicas``); empty names the node itself."""

    def validation(self) -> dict[str, str]:
        """The rule's entry in ``x-kubernetes-validations``."""
        out = {"rule": self.cel, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out

    def error(self, node_path: str) -> str:
        """The error for the node at ``node_path`` (``spec.prefill``), naming the field as the apiserver does."""
        return f"{node_path}{self.field_path}: {self.message}"

    def check(self, obj: BaseModel) -> bool:
        """Whether the rule holds for ``obj``, an object of model ``on``."""
        if not isinstance(obj, self.on):
            raise TypeError(f"rule {self.name} applies to {self.on.__name__}, not {type(obj).__name__}")
        return self.holds(obj)


def rule(
    name: str, *, on: type[M], cel: str, message: str, holds: Callable[[M], bool], field_path: str = ""
) -> Rule:
    """A row of the table; the type checker holds ``holds`` to model ``on``."""
    return Rule(name=name, on=on, cel=cel, message=message, holds=holds, field_path=field_path)


# ------------------------------------------------------------------------------------------------- table

RULES: tuple[Rule, ...] = (
    rule(
        "pool-min-le-max",
        on=PoolSpec,
        cel="self.minReplicas <= self.maxReplicas",
        message="minReplicas must be less than or equal to maxReplicas",
        field_path=".minReplicas",
        holds=lambda p: p.min_replicas <= p.max_replicas,
    ),
    rule(
        "pool-replicas-in-range",
        on=PoolSpec,
        cel="self.replicas >= self.minReplicas && self.replicas <= self.maxReplicas",
        message="replicas must be between minReplicas and maxReplicas",
        field_path=".replicas",
        holds=lambda p: p.min_replicas <= p.replicas <= p.max_replicas,
    ),
    rule(
        "pool-gpu-count-multiple",
        on=PoolSpec,
        # a zero size breaks the schema's minimum (reported there); the rule then holds rather than divide by zero
        # one pod per replica; across nodes (nodesPerReplica > 1) tensor × pipeline may span pods, and the
        # multi-node rules below say what gpu.count must be
        cel="!has(self.gpu.count) || self.nodesPerReplica > 1 "
            "|| self.parallelism.tensor * self.parallelism.pipeline == 0 "
            "|| self.gpu.count % (self.parallelism.tensor * self.parallelism.pipeline) == 0",
        message="gpu.count must be a multiple of parallelism.tensor × parallelism.pipeline",
        field_path=".gpu.count",
        holds=lambda p: p.gpu.count is None or p.nodes_per_replica > 1
        or p.parallelism.tensor * p.parallelism.pipeline == 0
        or p.gpu.count % (p.parallelism.tensor * p.parallelism.pipeline) == 0,
    ),
    # --------------------------------------------------------------- multi-node replicas (docs/multinode.md)
    rule(
        "pool-multinode-layout-divides",
        on=PoolSpec,
        # vLLM: --nnodes must divide data × pipeline × tensor (vllm/engine/arg_utils.py 0.33.0 lines 2399-2413);
        # every node of a group gets the same share of GPUs
        cel=f"self.nodesPerReplica <= 1 || {LAYOUT_CEL} % self.nodesPerReplica == 0",
        message="parallelism.tensor × parallelism.pipeline × parallelism.data must be a multiple of "
        "nodesPerReplica: every node of a replica runs the same number of GPUs",
        field_path=".nodesPerReplica",
        holds=lambda p: p.nodes_per_replica <= 1 or layout(p) % p.nodes_per_replica == 0,
    ),
    rule(
        "pool-multinode-gpu-count",
        on=PoolSpec,
        cel=f"!has(self.gpu.count) || self.nodesPerReplica <= 1 "
            f"|| self.gpu.count * self.nodesPerReplica == {LAYOUT_CEL}",
        message="with nodesPerReplica > 1, gpu.count (per pod) × nodesPerReplica must equal parallelism.tensor × "
        "parallelism.pipeline × parallelism.data: each GPU of the replica runs one rank",
        field_path=".gpu.count",
        holds=lambda p: p.gpu.count is None or p.nodes_per_replica <= 1
        or p.gpu.count * p.nodes_per_replica == layout(p),
    ),
    rule(
        "pool-multinode-data-divides",
        on=PoolSpec,
        cel="self.nodesPerReplica <= 1 || self.parallelism.data == 1 "
            "|| self.parallelism.data % self.nodesPerReplica == 0",
        message="with nodesPerReplica > 1, parallelism.data must be 1 (tensor × pipeline spans the nodes) or a "
        "multiple of nodesPerReplica (each node runs data ÷ nodesPerReplica data-parallel ranks of tensor × pipeline "
        "GPUs; a data-parallel rank is not split across nodes)",
        field_path=".parallelism.data",
        holds=lambda p: p.nodes_per_replica <= 1 or p.parallelism.data == 1
        or p.parallelism.data % p.nodes_per_replica == 0,
    ),
    rule(
        "pool-data-parallel-size-local",
        on=PoolSpec,
        cel="!has(self.parallelism.dataParallelSizeLocal) "
            "|| self.parallelism.dataParallelSizeLocal * self.nodesPerReplica == self.parallelism.data",
        message="parallelism.dataParallelSizeLocal must equal parallelism.data ÷ nodesPerReplica (the data-parallel "
        "ranks on each node); omit it to take that",
        field_path=".parallelism.dataParallelSizeLocal",
        holds=lambda p: p.parallelism.data_parallel_size_local is None
        or p.parallelism.data_parallel_size_local * p.nodes_per_replica == p.parallelism.data,
    ),
    rule(
        "parallelism-expert-needs-ranks",
        on=ParallelismSpec,
        # vllm/model_executor/layers/fused_moe/config.py (0.33.0 lines 1198-1201): EP only when tp × dp > 1
        cel="!self.expert || self.tensor * self.data > 1",
        message="expert (--enable-expert-parallel) spreads a MoE model's experts over tensor × data GPUs: it needs "
        "tensor × data > 1 (vLLM ignores it otherwise)",
        field_path=".expert",
        holds=lambda p: not p.expert or p.tensor * p.data > 1,
    ),
    rule(
        "rolling-update-max-surge-format",
        on=RollingUpdateSpec,
        cel=int_or_percent_cel("maxSurge", SURGE_PERCENT),
        message=f"maxSurge must be a count from 0 to {MOST_WORKERS} or a percentage such as 25%",
        field_path=".maxSurge",
        holds=lambda r: count_or_percent(r.max_surge, SURGE_PERCENT, MOST_WORKERS),
    ),
    rule(
        "rolling-update-max-unavailable-format",
        on=RollingUpdateSpec,
        cel=int_or_percent_cel("maxUnavailable", UNAVAILABLE_PERCENT),
        message=f"maxUnavailable must be a count from 0 to {MOST_WORKERS} or a percentage from 0% to 100%",
        field_path=".maxUnavailable",
        holds=lambda r: count_or_percent(r.max_unavailable, UNAVAILABLE_PERCENT, MOST_WORKERS),
    ),
    rule(
        "rolling-update-not-both-zero",
        on=RollingUpdateSpec,
        cel=f"!({zero_cel('maxSurge')} && {zero_cel('maxUnavailable')})",
        message="maxUnavailable may not be 0 when maxSurge is 0: the rollout could neither add a worker nor take "
        "one away",
        field_path=".maxUnavailable",
        holds=lambda r: not (zero(r.max_surge) and zero(r.max_unavailable)),
    ),
    rule(
        "model-cache-one-kind",
        on=ModelCacheSpec,
        cel="has(self.hostPath) != has(self.pvc)",
        message="set exactly one of hostPath or pvc",
        holds=lambda c: (c.host_path is None) != (c.pvc is None),
    ),
    rule(
        "source-hub-or-pvc",
        on=ModelSourceSpec,
        cel="!(has(self.hub) && has(self.pvc))",
        message="set either hub or pvc, not both",
        holds=lambda s: s.hub is None or s.pvc is None,
    ),
    rule(
        "rdma-needs-rdma-transport",
        on=KVTransferSpec,
        cel="!has(self.rdma) || self.transport == 'rdma'",
        message="spec.kvTransfer.rdma is only allowed with spec.kvTransfer.transport rdma",
        field_path=".rdma",
        holds=lambda k: k.rdma is None or k.transport == "rdma",
    ),
    rule(
        "rdma-transport-needs-rdma",
        on=KVTransferSpec,
        cel="self.transport != 'rdma' || has(self.rdma)",
        message="required with transport rdma: set spec.kvTransfer.rdma.resourceName to the extended "
        "resource your RDMA device plugin advertises (e.g. rdma/hca_shared_devices_a; without it the pods would "
        "request rdma/ib and stay Pending where the cluster names it otherwise), or write rdma: {} to take rdma/ib x 1",
        field_path=".rdma",
        holds=lambda k: k.transport != "rdma" or k.rdma is not None,
    ),
    rule(
        "engine-extra-args-not-reserved",
        on=EngineSpec,
        cel=EXTRA_ARGS_CEL,
        message=EXTRA_ARGS_MESSAGE,
        field_path=".extraArgs",
        holds=lambda e: extra_args_free(e.extra_args),
    ),
    rule(
        "pool-extra-args-not-reserved",
        on=PoolSpec,
        cel=EXTRA_ARGS_CEL,
        message=EXTRA_ARGS_MESSAGE,
        field_path=".extraArgs",
        holds=lambda p: extra_args_free(p.extra_args),
    ),
    rule(
        "tenant-remote-above-local",
        on=TenantPolicy,
        cel="!has(self.remotePrefill) || !has(self.remotePrefill.minInputTokens) || !has(self.localPrefill) "
        "|| !has(self.localPrefill.maxInputTokens) "
        "|| self.remotePrefill.minInputTokens > self.localPrefill.maxInputTokens",
        message="remotePrefill.minInputTokens must be greater than localPrefill.maxInputTokens",
        field_path=".remotePrefill.minInputTokens",
        holds=tenant_overrides_ordered,
    ),
    rule(
        "tenant-max-queued-needs-queue",
        on=TenantPolicy,
        cel="!has(self.maxQueued) || self.overload == 'Queue'",
        message="maxQueued applies only with overload: Queue (Admit holds nothing, Shed refuses at once)",
        field_path=".maxQueued",
        holds=lambda t: t.max_queued is None or t.overload == "Queue",
    ),
    rule(
        "tenant-max-queue-time-needs-queue",
        on=TenantPolicy,
        cel="!has(self.maxQueueTimeMs) || self.overload == 'Queue'",
        message="maxQueueTimeMs applies only with overload: Queue (Admit holds nothing, Shed refuses at once)",
        field_path=".maxQueueTimeMs",
        holds=lambda t: t.max_queue_time_ms is None or t.overload == "Queue",
    ),
    rule(
        "bucket-max-above-min",
        on=PromptBucket,
        cel="!has(self.maxInputTokens) || self.maxInputTokens > self.minInputTokens",
        message="maxInputTokens must be greater than minInputTokens",
        field_path=".maxInputTokens",
        holds=lambda b: b.max_input_tokens is None or b.max_input_tokens > b.min_input_tokens,
    ),
    rule(
        "routing-remote-above-local",
        on=RoutingSpec,
        cel="self.remotePrefill.minInputTokens > self.localPrefill.maxInputTokens",
        message="remotePrefill.minInputTokens must be greater than localPrefill.maxInputTokens",
        field_path=".remotePrefill.minInputTokens",
        holds=lambda r: r.remote_prefill.min_input_tokens > r.local_prefill.max_input_tokens,
    ),
    rule(
        "routing-tenant-names-unique",
        on=RoutingSpec,
        cel="self.tenants.all(t, self.tenants.exists_one(u, u.name == t.name))",
        message="tenants[].name must be unique",
        field_path=".tenants",
        holds=lambda r: unique([t.name for t in r.tenants]),
    ),
    rule(
        "routing-bucket-names-unique",
        on=RoutingSpec,
        cel="self.buckets.all(b, self.buckets.exists_one(c, c.name == b.name))",
        message="buckets[].name must be unique",
        field_path=".buckets",
        holds=lambda r: unique([b.name for b in r.buckets]),
    ),
    rule(
        "ratio-min-le-max",
        on=RatioBounds,
        cel="self.min <= self.max",
        message="prefillDecodeRatio.min must be less than or equal to max",
        field_path=".min",
        holds=lambda b: b.min <= b.max,
    ),
    rule(
        "prometheus-one-auth",
        on=PrometheusSpec,
        cel="!has(self.authSecretRef) || !has(self.basicAuthSecretRef)",
        message="authSecretRef (a bearer token) and basicAuthSecretRef (user and password) are two ways to "
                "authenticate: set one",
        field_path=".basicAuthSecretRef",
        holds=lambda p: p.auth_secret_ref is None or p.basic_auth_secret_ref is None,
    ),
    rule(
        "prometheus-header-names",
        on=PrometheusSpec,
        cel=f"!has(self.headers) || self.headers.all(k, k.matches('{HEADER_NAME}'))",
        message="headers: each name must be an HTTP header name (letters, digits and -, e.g. X-Scope-OrgID)",
        field_path=".headers",
        holds=lambda p: p.headers is None or all(matches(HEADER_NAME, k) for k in p.headers),
    ),
    rule(
        "prometheus-headers-no-credentials",
        on=PrometheusSpec,
        cel="!has(self.headers) || !self.headers.exists(k, k.lowerAscii() == 'authorization')",
        message="headers must not carry Authorization (it would sit in the spec in clear): use authSecretRef "
                "(bearer token) or basicAuthSecretRef",
        field_path=".headers",
        holds=lambda p: p.headers is None or all(k.lower() != "authorization" for k in p.headers),
    ),
    rule(
        "prometheus-tls-ca-or-insecure",
        on=PrometheusTLSSpec,
        cel="!has(self.caSecretRef) || !self.insecureSkipVerify",
        message="caSecretRef (verify against your CA) and insecureSkipVerify (verify nothing) contradict each other: "
                "set one",
        field_path=".insecureSkipVerify",
        holds=lambda t: t.ca_secret_ref is None or not t.insecure_skip_verify,
    ),
    rule(
        "mode-probes-reachable",
        on=ModePolicySpec,
        cel="self.probe.ratePerMinute == 0 || self.probe.successesToReturn * 60 <= "
            "self.probe.ratePerMinute * self.windowSeconds",
        message="probe.successesToReturn must be at most probe.ratePerMinute × windowSeconds ÷ 60 (else the return "
                "to Disaggregated can never happen); raise ratePerMinute or windowSeconds, or lower successesToReturn",
        field_path=".probe.successesToReturn",
        holds=lambda p: p.probe.rate_per_minute == 0
        or p.probe.successes_to_return * 60 <= p.probe.rate_per_minute * p.window_seconds,
    ),
    # ------------------------------------------------------------------ tracing (docs/observability.md "Traces")
    rule(
        "tracing-grpc-no-path",
        on=TracingSpec,
        cel=f"!has(self.protocol) || self.protocol != 'grpc' || self.endpoint.matches('{OTLP_NO_PATH}')",
        message="protocol grpc takes http(s)://host:port with no path (an OTLP/gRPC exporter uses host:port only, "
                "e.g. http://otel-collector:4317); for a traces URL with a path (.../v1/traces) set protocol "
                "http/protobuf",
        field_path=".endpoint",
        holds=lambda t: t.protocol != "grpc" or matches(OTLP_NO_PATH, t.endpoint),
    ),
    rule(
        "tracing-http-needs-path",
        on=TracingSpec,
        cel=f"(has(self.protocol) ? self.protocol != 'http/protobuf' : !self.endpoint.matches('"
            f"{OTLP_HTTP_PORT_NO_PATH}')) || !self.endpoint.matches('{OTLP_NO_PATH}')",
        message="an OTLP/HTTP endpoint (protocol http/protobuf, or port 4318 with no protocol) is the full traces URL "
                "with its path, e.g. http://otel-collector:4318/v1/traces: vLLM and the router post to it as given; "
                "for a gRPC collector on that port set protocol grpc",
        field_path=".endpoint",
        holds=otlp_http_has_path,
    ),
)


def rules_for(model: type[BaseModel]) -> list[Rule]:
    """The rules carried by ``model``'s schema node, in table order."""
    return [r for r in RULES if r.on is model]


# ------------------------------------------------------------------------------------------------- check


def spec_errors(spec: DisaggregatedModelSpec) -> list[str]:
    """Every rule of the table that ``spec`` breaks, worded as the apiserver words it (outside the apiserver:
    ``disagg validate``, ``disagg render``, the operator's own checks and the unit tests)."""
    return list(_errors(spec, "spec"))


def _errors(obj: BaseModel, path: str) -> Iterator[str]:
    for r in rules_for(type(obj)):
        if not r.check(obj):
            yield r.error(path)
    for name, field in type(obj).model_fields.items():
        value = getattr(obj, name)
        wire = field.alias or name
        if isinstance(value, BaseModel):
            yield from _errors(value, f"{path}.{wire}")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    yield from _errors(item, f"{path}.{wire}[{i}]")

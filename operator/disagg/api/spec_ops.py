"""The spec's operating sections: autoscaling and its Prometheus (``spec.autoscaling``), the mode controller
(``spec.modePolicy``), the router (``spec.router``), tracing (``spec.observability``) and multi-node pools
(``spec.multiNode``). Part of the API's models (spec.py re-exports them; conventions in its docstring)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import ApiModel, SecretKeyRef

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
    policy: Literal["Proportional", "Predictive"] = Field(
        default="Proportional",
        description="Proportional: each pool moves by its most pressing signal ÷ its target (queue wait, TTFT, TPOT, "
        "running sequences, KV-cache usage), HPA-style. Predictive: forecast the next intervals' arrival rate and "
        "token mix (Holt's method) and size both pools for it with the capacity planner's performance model, "
        "corrected by observed ÷ expected latency, with hysteresis and at most 6 scale-downs per pool per hour "
        "(docs/autoscaling.md). Predictive needs a model and GPU the performance model knows (disagg plan's "
        "presets); otherwise the model scales proportionally and each decision's reason says why.",
    )
    pod_start_seconds: int | None = Field(
        default=None,
        ge=1,
        le=3600,
        description="Predictive policy: seconds from a scale-up to a serving pod (image pull, weight load, "
        "compilation), which sets how far ahead it forecasts. Default: estimated from the model's size (a "
        "compilation figure plus weights at 2 GB/s); measure yours (a pod's creation to Ready) and set it.",
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

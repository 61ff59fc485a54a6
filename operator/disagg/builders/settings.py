"""Operator-level settings that shape the manifests but are not part of the DisaggregatedModel API."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_ROUTER_IMAGE = "ghcr.io/disagg/disagg:0.1.0"

ENV_ROUTER_IMAGE = "DISAGG_ROUTER_IMAGE"
ENV_ROUTER_IMAGE_PULL_POLICY = "DISAGG_ROUTER_IMAGE_PULL_POLICY"
ENV_ROUTER_REPLICAS = "DISAGG_ROUTER_REPLICAS"
ENV_ROUTER_CPU_REQUEST = "DISAGG_ROUTER_CPU_REQUEST"
ENV_ROUTER_MEMORY_REQUEST = "DISAGG_ROUTER_MEMORY_REQUEST"
ENV_ROUTER_MEMORY_LIMIT = "DISAGG_ROUTER_MEMORY_LIMIT"
ENV_ROUTER_IMAGE_PULL_SECRETS = "DISAGG_ROUTER_IMAGE_PULL_SECRETS"  # Secret names, comma-separated
# The cluster-wide tracing default (the chart's tracing.* values) for models without spec.observability.tracing
ENV_TRACING_ENDPOINT = "DISAGG_TRACING_ENDPOINT"
ENV_TRACING_SAMPLING_RATIO = "DISAGG_TRACING_SAMPLING_RATIO"
ENV_TRACING_PROTOCOL = "DISAGG_TRACING_PROTOCOL"
DEFAULT_TRACING_SAMPLING_RATIO = 0.01
# A Kubernetes memory quantity as operators write it (plain bytes, decimal or binary suffixes, an exponent).
MEMORY_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?([eE][0-9]+|[KMGTPE]i?|k)?")
SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # a DNS subdomain

DEFAULT_ROUTER_CPU_REQUEST = "250m"
DEFAULT_ROUTER_MEMORY_REQUEST = "256Mi"
DEFAULT_ROUTER_MEMORY_LIMIT = "1Gi"
# Two router pods per model by default (issue 31): a node drain, an eviction or a router crash leaves one serving
# while the other is rescheduled (with the router's PodDisruptionBudget and soft anti-affinity, builders/router.py).
DEFAULT_ROUTER_REPLICAS = 2


def cpu_cores(quantity: str) -> float:
    """A Kubernetes CPU quantity in cores: "250m" → 0.25, "2" → 2.0, "1.5" → 1.5, "2k" → 2000.0."""
    q = quantity.strip()
    suffixes = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9}
    scale = 1.0
    if q and q[-1] in suffixes:
        q, scale = q[:-1], suffixes[q[-1]]
    try:
        value = float(q) * scale
    except ValueError:
        raise ValueError(f"not a CPU quantity: {quantity!r}") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"not a CPU quantity: {quantity!r}")
    return value


@dataclass(frozen=True)
class BuildSettings:
    """What the operator (not the user's CR) decides: the router's image and size.

    Set from the operator's environment (``DISAGG_ROUTER_IMAGE`` …) or ``disagg operator`` flags.
    """

    router_image: str = DEFAULT_ROUTER_IMAGE
    router_image_pull_policy: str = "IfNotPresent"
    router_replicas: int = DEFAULT_ROUTER_REPLICAS
    # The router container's CPU request (a Kubernetes quantity). Without spec.router.workers it also sets the
    # router processes per pod: this rounded down, at least 1.
    router_cpu_request: str = DEFAULT_ROUTER_CPU_REQUEST
    router_memory_request: str = DEFAULT_ROUTER_MEMORY_REQUEST
    router_memory_limit: str = DEFAULT_ROUTER_MEMORY_LIMIT
    # Secrets for pulling the router image from a private registry (the chart: router.imagePullSecrets, else the
    # operator's own imagePullSecrets, since the router runs the operator's image by default).
    router_image_pull_secrets: tuple[str, ...] = ()
    # Is the LeaderWorkerSet CRD (builders.multinode.LWS_CRD) installed? Picks the back end of multi-node pools with
    # spec.multiNode.backend Auto. The controller sets it from a cached read of the CRD (controller/groups.py).
    lws_installed: bool = False
    # The tracing default for models whose spec leaves observability.tracing out (None: off); a model's own wins.
    tracing_endpoint: str | None = None
    tracing_sampling_ratio: float = DEFAULT_TRACING_SAMPLING_RATIO
    tracing_protocol: str | None = None  # grpc | http/protobuf; None: inferred from the endpoint

    def __post_init__(self) -> None:
        cpu_cores(self.router_cpu_request)  # a bad quantity fails at start-up, not at every reconcile
        if self.router_replicas < 1:
            raise ValueError(f"{ENV_ROUTER_REPLICAS}: the router needs at least 1 replica, got {self.router_replicas}")
        for env_name, quantity in ((ENV_ROUTER_MEMORY_REQUEST, self.router_memory_request),
                                   (ENV_ROUTER_MEMORY_LIMIT, self.router_memory_limit)):
            if not MEMORY_QUANTITY.fullmatch(quantity):
                raise ValueError(f"{env_name}: not a memory quantity (e.g. 256Mi, 1Gi): {quantity!r}")
        for secret in self.router_image_pull_secrets:
            if not SECRET_NAME.fullmatch(secret):
                raise ValueError(f"{ENV_ROUTER_IMAGE_PULL_SECRETS}: not a Secret name: {secret!r}")
        if self.tracing_endpoint:  # the same rules as spec.observability.tracing, checked once at start-up
            from pydantic import ValidationError

            from ..api.rules import rules_for
            from ..api.spec import TracingSpec

            env = {"endpoint": ENV_TRACING_ENDPOINT, "protocol": ENV_TRACING_PROTOCOL}
            try:
                t = TracingSpec.model_validate({"endpoint": self.tracing_endpoint, "protocol": self.tracing_protocol,
                                                "samplingRatio": self.tracing_sampling_ratio})
            except ValidationError as e:
                bad = "; ".join(f"{env.get(str(err['loc'][0]), ENV_TRACING_SAMPLING_RATIO)}: {err['msg']}"
                                for err in e.errors())
                raise ValueError(f"tracing default (chart values tracing.*): {bad}") from None
            broken = [f"{ENV_TRACING_ENDPOINT}: {r.message}" for r in rules_for(TracingSpec) if not r.check(t)]
            if broken:
                raise ValueError(f"tracing default (chart values tracing.*): {'; '.join(broken)}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BuildSettings:
        env = os.environ if env is None else env
        return cls(
            router_image=env.get(ENV_ROUTER_IMAGE) or DEFAULT_ROUTER_IMAGE,
            router_image_pull_policy=env.get(ENV_ROUTER_IMAGE_PULL_POLICY) or "IfNotPresent",
            router_replicas=_count(ENV_ROUTER_REPLICAS, env.get(ENV_ROUTER_REPLICAS), DEFAULT_ROUTER_REPLICAS),
            router_cpu_request=env.get(ENV_ROUTER_CPU_REQUEST) or DEFAULT_ROUTER_CPU_REQUEST,
            router_memory_request=env.get(ENV_ROUTER_MEMORY_REQUEST) or DEFAULT_ROUTER_MEMORY_REQUEST,
            router_memory_limit=env.get(ENV_ROUTER_MEMORY_LIMIT) or DEFAULT_ROUTER_MEMORY_LIMIT,
            router_image_pull_secrets=tuple(
                n.strip() for n in (env.get(ENV_ROUTER_IMAGE_PULL_SECRETS) or "").split(",") if n.strip()),
            tracing_endpoint=env.get(ENV_TRACING_ENDPOINT) or None,
            tracing_sampling_ratio=_ratio(env.get(ENV_TRACING_SAMPLING_RATIO)),
            tracing_protocol=env.get(ENV_TRACING_PROTOCOL) or None,
        )


def _count(env_name: str, text: str | None, default: int) -> int:
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{env_name}: not a whole number: {text!r}") from None


def _ratio(text: str | None) -> float:
    if not text:
        return DEFAULT_TRACING_SAMPLING_RATIO
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{ENV_TRACING_SAMPLING_RATIO}: not a number: {text!r}") from None

"""Operator-level settings that shape the manifests but are not part of the DisaggregatedModel API."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_ROUTER_IMAGE = "ghcr.io/disagg/disagg:0.1.0"

ENV_ROUTER_IMAGE = "DISAGG_ROUTER_IMAGE"
ENV_ROUTER_IMAGE_PULL_POLICY = "DISAGG_ROUTER_IMAGE_PULL_POLICY"
ENV_ROUTER_REPLICAS = "DISAGG_ROUTER_REPLICAS"


@dataclass(frozen=True)
class BuildSettings:
    """What the operator (not the user's CR) decides: the router's image and size.

    Set from the operator's environment (``DISAGG_ROUTER_IMAGE`` …) or ``disagg operator`` flags.
    """

    router_image: str = DEFAULT_ROUTER_IMAGE
    router_image_pull_policy: str = "IfNotPresent"
    router_replicas: int = 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BuildSettings:
        env = os.environ if env is None else env
        return cls(
            router_image=env.get(ENV_ROUTER_IMAGE) or DEFAULT_ROUTER_IMAGE,
            router_image_pull_policy=env.get(ENV_ROUTER_IMAGE_PULL_POLICY) or "IfNotPresent",
            router_replicas=int(env.get(ENV_ROUTER_REPLICAS) or 1),
        )

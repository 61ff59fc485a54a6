"""The router is highly available by default (issue 31): two replicas, a PodDisruptionBudget that lets one go at a
time, soft anti-affinity across nodes; its resources and pull secrets come from the operator's settings."""

from __future__ import annotations

from typing import Any

import pytest

from disagg.builders import BuildSettings, build_children, parse_model
from disagg.builders.settings import (
    ENV_ROUTER_IMAGE_PULL_SECRETS,
    ENV_ROUTER_MEMORY_LIMIT,
    ENV_ROUTER_MEMORY_REQUEST,
    ENV_ROUTER_REPLICAS,
)

from .conftest import example_body


def children(settings: BuildSettings) -> dict[str, dict[str, Any]]:
    dm = parse_model(example_body("llama-70b-rdma"))
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in build_children(dm, settings)}


def test_two_routers_a_budget_and_spread_by_default() -> None:
    refs = children(BuildSettings())
    dep = refs["Deployment/llama-70b-router"]
    assert dep["spec"]["replicas"] == 2
    selector = dep["spec"]["selector"]["matchLabels"]
    pdb = refs["PodDisruptionBudget/llama-70b-router"]
    # one router at a time may go (a drain never waits on a single replica); it selects exactly the router pods
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    assert pdb["metadata"]["ownerReferences"][0]["kind"] == "DisaggregatedModel"
    pod = dep["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector
    assert set(selector.items()) <= set(dep["spec"]["template"]["metadata"]["labels"].items())
    assert "imagePullSecrets" not in pod
    # the worker pools' budgets are separate objects with their own selectors
    assert refs["PodDisruptionBudget/llama-70b-decode"]["spec"]["selector"] != pdb["spec"]["selector"]


def test_router_size_and_pull_secrets_from_settings() -> None:
    settings = BuildSettings.from_env({ENV_ROUTER_REPLICAS: "3", ENV_ROUTER_MEMORY_REQUEST: "512Mi",
                                       ENV_ROUTER_MEMORY_LIMIT: "2Gi", ENV_ROUTER_IMAGE_PULL_SECRETS: "a, b"})
    dep = children(settings)["Deployment/llama-70b-router"]
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 3
    assert pod["imagePullSecrets"] == [{"name": "a"}, {"name": "b"}]
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "250m", "memory": "512Mi"},
                                                 "limits": {"memory": "2Gi"}}


@pytest.mark.parametrize(("env", "named"), [
    ({ENV_ROUTER_REPLICAS: "two"}, ENV_ROUTER_REPLICAS),
    ({ENV_ROUTER_REPLICAS: "0"}, ENV_ROUTER_REPLICAS),
    ({ENV_ROUTER_MEMORY_REQUEST: "lots"}, ENV_ROUTER_MEMORY_REQUEST),
    ({ENV_ROUTER_MEMORY_LIMIT: "1 GB"}, ENV_ROUTER_MEMORY_LIMIT),
    ({ENV_ROUTER_IMAGE_PULL_SECRETS: "Bad_Name"}, ENV_ROUTER_IMAGE_PULL_SECRETS),
])
def test_bad_settings_name_their_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        BuildSettings.from_env(env)

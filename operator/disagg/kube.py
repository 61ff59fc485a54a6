"""Thin helpers over the kubernetes client shared by the operator, the demo and tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config, dynamic

from .poll import wait_for

FIELD_MANAGER = "disagg-operator"

# The client's config and dynamic modules carry no annotations: typed entry points, so that callers stay typed.
_new_client_from_config: Callable[..., client.ApiClient] = config.new_client_from_config
_load_incluster_config: Callable[[], None] = config.load_incluster_config
_dynamic_client: Callable[[client.ApiClient], Any] = dynamic.DynamicClient


def api_client(kubeconfig: str | Path | None = None) -> client.ApiClient:
    """An ApiClient from a kubeconfig file, else in-cluster config, else the default kubeconfig."""
    if kubeconfig:
        return _new_client_from_config(config_file=str(kubeconfig))
    try:
        _load_incluster_config()
        return client.ApiClient()
    except config.ConfigException:
        return _new_client_from_config()


def server_side_apply(api: client.ApiClient, obj: dict[str, Any], field_manager: str = FIELD_MANAGER,
                      force: bool = True) -> Any:
    """Server-side apply one object (any kind) with our field manager."""
    dyn = _dynamic_client(api)
    resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    namespace = obj.get("metadata", {}).get("namespace")
    return dyn.server_side_apply(
        resource,
        body=obj, name=obj["metadata"]["name"], namespace=namespace, field_manager=field_manager, force_conflicts=force
    )


def install_crd(api: client.ApiClient, crd: dict[str, Any], timeout: float = 60.0) -> None:
    """Apply a CRD and wait until it is Established (its names accepted and served)."""
    server_side_apply(api, crd)
    ext = client.ApiextensionsV1Api(api)
    name = crd["metadata"]["name"]

    def established() -> bool:
        got = ext.read_custom_resource_definition(name)
        conds = {c.type: c.status for c in ((got.status.conditions if got.status else None) or [])}
        if conds.get("NamesAccepted") == "False":
            raise RuntimeError(f"CRD {name} names not accepted")
        return conds.get("Established") == "True"

    wait_for(established, timeout, f"CRD {name} to be Established", interval=0.2)

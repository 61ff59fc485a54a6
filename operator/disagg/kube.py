"""Thin helpers over the kubernetes client shared by the operator, the demo and tests."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kubernetes import client, config, dynamic

FIELD_MANAGER = "disagg-operator"


def api_client(kubeconfig: str | Path | None = None) -> client.ApiClient:
    """An ApiClient from a kubeconfig file, else in-cluster config, else the default kubeconfig."""
    if kubeconfig:
        return config.new_client_from_config(config_file=str(kubeconfig))
    try:
        config.load_incluster_config()
        return client.ApiClient()
    except config.ConfigException:
        return config.new_client_from_config()


def server_side_apply(api: client.ApiClient, obj: dict[str, Any], field_manager: str = FIELD_MANAGER,
                      force: bool = True) -> Any:
    """Server-side apply one object (any kind) with our field manager."""
    dyn = dynamic.DynamicClient(api)
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
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = ext.read_custom_resource_definition(crd["metadata"]["name"])
        conds = {c.type: c.status for c in (got.status.conditions or [])}
        if conds.get("Established") == "True":
            return
        if conds.get("NamesAccepted") == "False":
            raise RuntimeError(f"CRD {crd['metadata']['name']} names not accepted")
        time.sleep(0.2)
    raise TimeoutError(f"CRD {crd['metadata']['name']} not Established after {timeout}s")

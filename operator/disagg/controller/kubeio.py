"""The few API calls the controller makes, over one shared kubernetes ApiClient (no discovery round-trips).

Server-side apply with the operator's field manager (``disagg.kube.FIELD_MANAGER``), deletes, merge patches of
the DisaggregatedModel's status subresource, and server-side apply of a Deployment's ``/scale`` subresource under
the autoscaler's own field manager (``disagg.builders.replicas.AUTOSCALER_FIELD_MANAGER``, HPA's pattern).
 Transient failures (409 conflicts, 429, 5xx, connection errors)
are retried a few times with a short backoff; then ``KubeError`` is raised for the caller (kopf retries later).
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import urllib3
from kubernetes import client

from ..api.models import GROUP, PLURAL, VERSION
from ..kube import FIELD_MANAGER

# kind → (path prefix for the apiVersion, plural). Only the kinds the operator manages.
KINDS: dict[str, tuple[str, str, str]] = {
    "ServiceAccount": ("v1", "/api/v1", "serviceaccounts"),
    "ConfigMap": ("v1", "/api/v1", "configmaps"),
    "Service": ("v1", "/api/v1", "services"),
    "Role": ("rbac.authorization.k8s.io/v1", "/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io/v1", "/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "PodDisruptionBudget": ("policy/v1", "/apis/policy/v1", "poddisruptionbudgets"),
    "Deployment": ("apps/v1", "/apis/apps/v1", "deployments"),
    # multi-node pools (builders/multinode.py): StatefulSet groups, or a LeaderWorkerSet per pool
    "StatefulSet": ("apps/v1", "/apis/apps/v1", "statefulsets"),
    "LeaderWorkerSet": ("leaderworkerset.x-k8s.io/v1", "/apis/leaderworkerset.x-k8s.io/v1", "leaderworkersets"),
}

RETRYABLE = {409, 429, 500, 502, 503, 504}


class KubeError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def object_path(kind: str, namespace: str, name: str) -> str:
    _, prefix, plural = KINDS[kind]
    return f"{prefix}/namespaces/{namespace}/{plural}/{name}"


def model_path(namespace: str, name: str, subresource: str = "") -> str:
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"
    return f"{path}/{subresource}" if subresource else path


class Kube:
    def __init__(self, api: client.ApiClient, field_manager: str = FIELD_MANAGER, attempts: int = 4) -> None:
        self.api = api
        self.field_manager = field_manager
        self.attempts = attempts
        self.writes = 0  # successful mutating calls (tests and the benchmark read it)

    def request(self, method: str, path: str, *, query: list[tuple[str, str]] | None = None, body: Any = None,
                content_type: str | None = None, retry: bool = True) -> dict[str, Any] | None:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        delay = 0.1
        for attempt in range(self.attempts if retry else 1):
            try:
                params = self.api.param_serialize(method=method, resource_path=path, query_params=query or [],
                                                  header_params=headers, body=body, auth_settings=["BearerToken"])
                resp = self.api.call_api(*params, _request_timeout=30)
                resp.read()
                status = resp.status
                data = resp.data
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                status, data = 0, str(exc).encode()
            if status < 400 and status != 0:
                if method != "GET":
                    self.writes += 1
                return json.loads(data) if data else None
            if (status in RETRYABLE or status == 0) and retry and attempt + 1 < self.attempts:
                time.sleep(delay)  # backoff between retries of a transient failure
                delay *= 3
                continue
            message = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
            with contextlib.suppress(ValueError, AttributeError):
                message = json.loads(message).get("message", message)
            raise KubeError(status, message)
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------------------------------ children

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply (force: the operator owns the fields it sets; a no-op apply writes nothing)."""
        meta = obj["metadata"]
        path = object_path(obj["kind"], meta["namespace"], meta["name"])
        out = self.request("PATCH", path, query=[("fieldManager", self.field_manager), ("force", "true")],
                           body=obj, content_type="application/apply-patch+yaml")
        return out or {}

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A child as the apiserver has it now (a quorum read, with managedFields), or None."""
        try:
            return self.request("GET", object_path(kind, namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def apply_scale(self, namespace: str, name: str, replicas: int, field_manager: str,
                    resource_version: str | None = None) -> dict[str, Any]:
        """Server-side apply of ``spec.replicas`` through a Deployment's /scale subresource under
        ``field_manager``. With ``resource_version`` the write is refused (409) if the Deployment moved meanwhile."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if resource_version:
            meta["resourceVersion"] = resource_version
        body = {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": meta, "spec": {"replicas": replicas}}
        out = self.request("PATCH", object_path("Deployment", namespace, name) + "/scale",
                           query=[("fieldManager", field_manager), ("force", "true")], body=body,
                           content_type="application/apply-patch+yaml", retry=resource_version is None)
        return out or {}

    def delete(self, kind: str, namespace: str, name: str) -> None:
        try:
            self.request("DELETE", object_path(kind, namespace, name),
                         body={"propagationPolicy": "Background"}, content_type="application/json")
        except KubeError as exc:
            if exc.status != 404:
                raise

    def get_namespace(self, name: str) -> dict[str, Any] | None:
        """A namespace (its labels carry the Pod Security levels); needs ``get namespaces``."""
        try:
            return self.request("GET", f"/api/v1/namespaces/{name}")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    # ------------------------------------------------------------------------------------------ the model

    def get_model(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", model_path(namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def patch_model_status(self, namespace: str, name: str, status: dict[str, Any],
                           resource_version: str | None) -> dict[str, Any] | None:
        """Merge-patch status; with resource_version the write fails (409) if the object moved meanwhile."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return self.request("PATCH", model_path(namespace, name, "status"), body=body,
                            content_type="application/merge-patch+json", retry=False)

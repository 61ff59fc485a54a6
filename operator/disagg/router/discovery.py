"""Cluster discovery: ready worker pods of each pool, with their compatibility hash.

The router watches the Pods behind each pool's headless Service (``<model>-prefill`` / ``-decode`` /
``-aggregated``, named in the config's ``pools``) with the contract labels ``serving.disagg.dev/model`` and
``serving.disagg.dev/role``; a pod counts when it has an IP, is not terminating and its Ready condition is
True. Its URL is ``http://<podIP>:<pools.<role>.port>`` and its compat hash the ``serving.disagg.dev/compat-hash``
label: prefill and decode workers are paired only when their hashes are equal (mid-rollout both builds run).

Pods rather than EndpointSlices because the compat hash is a pod label (EndpointSlices do not carry pod labels).
The watch runs in a thread (the kubernetes client is synchronous) and hands updates to the event loop.
Needs RBAC: get/list/watch pods in the router's namespace.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from .. import logs
from ..api.contract import LABEL_COMPAT, LABEL_MODEL, LABEL_ROLE, PoolEndpoint, RouterConfig
from .load import WorkerSet

log = logs.get("disagg.router.discovery")


def model_name_from_config(cfg: RouterConfig) -> str | None:
    """The DisaggregatedModel's name, from the pools' Service names (``<model>-<role>``)."""
    for role in ("decode", "prefill", "aggregated"):
        pool: PoolEndpoint | None = getattr(cfg.pools, role)
        if pool is not None and pool.service.endswith(f"-{role}"):
            return pool.service[: -len(role) - 1]
    return None


def pod_endpoint(pod: Any, port: int) -> tuple[str, str] | None:
    """(url, compat) of a ready pod, else None. Accepts kubernetes client V1Pod objects."""
    meta, status = pod.metadata, pod.status
    if meta is None or status is None or meta.deletion_timestamp is not None or not status.pod_ip:
        return None
    ready = any(c.type == "Ready" and c.status == "True" for c in (status.conditions or []))
    if not ready:
        return None
    ip = status.pod_ip
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}", (meta.labels or {}).get(LABEL_COMPAT, "")


class PodDiscovery:
    def __init__(self, workers: WorkerSet, namespace: str, model: str, ports: dict[str, int],
                 loop: asyncio.AbstractEventLoop, api_client: Any = None) -> None:
        self.workers = workers
        self.namespace = namespace
        self.model = model
        self.ports = ports  # role → worker port; only these roles are watched
        self.loop = loop
        self.api_client = api_client
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        import kubernetes.watch  # noqa: F401 - once, here: not in each watch thread at once (the import lock)

        for role in self.ports:
            t = threading.Thread(target=self._run, args=(role,), name=f"discovery-{role}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()

    def _publish(self, role: str, pods: dict[str, tuple[str, str]]) -> None:
        endpoints = sorted(set(pods.values()))
        self.loop.call_soon_threadsafe(self.workers.set_pool, role, endpoints)

    def _run(self, role: str) -> None:
        from kubernetes import client, watch

        from ..kube import api_client

        api = client.CoreV1Api(self.api_client or api_client())
        selector = f"{LABEL_MODEL}={self.model},{LABEL_ROLE}={role}"
        port = self.ports[role]
        backoff = 0.5
        while not self._stop.is_set():
            try:
                listing = api.list_namespaced_pod(self.namespace, label_selector=selector)
                pods: dict[str, tuple[str, str]] = {}
                for p in listing.items:
                    ep = pod_endpoint(p, port)
                    if ep and p.metadata is not None and p.metadata.name:
                        pods[p.metadata.name] = ep
                self._publish(role, pods)
                log.info("discovery_listed", role=role, ready=len(pods))
                rv = listing.metadata.resource_version if listing.metadata is not None else None
                w: Any = watch.Watch()  # the kubernetes client is untyped here
                for ev in w.stream(api.list_namespaced_pod, self.namespace, label_selector=selector,
                                   resource_version=rv, timeout_seconds=60, allow_watch_bookmarks=True):
                    if self._stop.is_set():
                        w.stop()
                        return
                    kind, pod = ev["type"], ev["object"]
                    if kind == "BOOKMARK":
                        continue
                    if kind == "ERROR":
                        break
                    name = pod.metadata.name
                    ep = pod_endpoint(pod, port) if kind != "DELETED" else None
                    if ep is None:
                        changed = pods.pop(name, None) is not None
                    else:
                        changed = pods.get(name) != ep
                        pods[name] = ep
                    if changed:
                        self._publish(role, pods)
                backoff = 0.5
            except Exception as e:  # noqa: BLE001 - keep watching through apiserver hiccups
                log.warning("discovery_error", role=role, error=str(e))
                time.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

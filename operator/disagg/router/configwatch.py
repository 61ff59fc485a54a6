"""Cluster mode: watch the router's own ConfigMap (``<model>-router``, key ``router.yaml``) through the API.

The kubelet refreshes a mounted ConfigMap only after up to about a minute; a rollback (``spec.mode: Aggregated``)
must take effect within seconds. So the router lists its ConfigMap (``fieldSelector metadata.name=<model>-router``,
which RBAC authorises by ``resourceNames``), watches it from that resourceVersion, and hands every new
``router.yaml`` to :meth:`ConfigWatcher.apply_text` (the file's validation path: a bad config keeps the last good
one). It reconnects with backoff (a 410 Gone relists at once). While the watch is down (apiserver unreachable,
RBAC forbids it) the watcher's file poll applies changes again; each switch is logged once.

The watch runs in a thread (the kubernetes client is synchronous) and hands updates to the event loop.
Needs RBAC: get/list/watch on ``configmaps`` with ``resourceNames: [<model>-router]``.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from .. import logs
from ..api.contract import ROUTER_CONFIG_KEY, router_name
from .config import ConfigWatcher

log = logs.get("disagg.router.configwatch")

WATCH_SECONDS = 300  # server-side timeout of one watch request; then a fresh watch from the last resourceVersion


class ConfigMapWatch:
    def __init__(self, watcher: ConfigWatcher, namespace: str, model: str, loop: asyncio.AbstractEventLoop,
                 api_client: Any = None, max_backoff: float = 10.0) -> None:
        self.watcher = watcher
        self.namespace = namespace
        self.name = router_name(model)
        self.loop = loop
        self.api_client = api_client
        self.max_backoff = max_backoff
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._active: bool | None = None  # None: not decided yet (nothing logged)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="configmap-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    # ---------------------------------------------------------------- loop side
    def _set_active(self, active: bool, reason: str = "") -> None:
        """Called in the watch thread; logs each switch once and tells the watcher (on the loop)."""
        if active == self._active:
            return
        self._active = active
        if active:
            log.info("config_watch_active", namespace=self.namespace, configmap=self.name)
        else:
            log.warning("config_watch_fallback_to_file", namespace=self.namespace, configmap=self.name,
                        reason=reason, file=str(self.watcher.path) if self.watcher.path else None)
        self.loop.call_soon_threadsafe(setattr, self.watcher, "api_active", active)

    def _deliver(self, cm: Any) -> None:
        data = (cm.data or {}) if cm is not None else {}
        text = data.get(ROUTER_CONFIG_KEY)
        if text is None:
            log.warning("config_watch_no_key", configmap=self.name, key=ROUTER_CONFIG_KEY)
            return
        self.loop.call_soon_threadsafe(self.watcher.apply_text, text, f"configmap/{self.name}")

    # ---------------------------------------------------------------- thread side
    def _run(self) -> None:
        from kubernetes import client, watch
        from kubernetes.client.rest import ApiException

        from ..kube import api_client

        try:
            api = client.CoreV1Api(self.api_client or api_client())
        except Exception as e:  # noqa: BLE001 - no credentials at all: the file stays the source
            self._set_active(False, f"no API client: {e}")
            return
        selector = f"metadata.name={self.name}"
        backoff = 0.5
        while not self._stop.is_set():
            try:
                listing = api.list_namespaced_config_map(self.namespace, field_selector=selector,
                                                         _request_timeout=10)
                self._set_active(True)
                if listing.items:
                    self._deliver(listing.items[0])
                else:
                    log.warning("config_watch_missing", configmap=self.name)
                rv = listing.metadata.resource_version if listing.metadata is not None else None
                backoff = 0.5
                while not self._stop.is_set():
                    w: Any = watch.Watch()  # the kubernetes client is untyped here
                    for ev in w.stream(api.list_namespaced_config_map, self.namespace, field_selector=selector,
                                       resource_version=rv, timeout_seconds=WATCH_SECONDS,
                                       allow_watch_bookmarks=True, _request_timeout=WATCH_SECONDS + 30):
                        if self._stop.is_set():
                            w.stop()
                            return
                        kind, obj = ev["type"], ev["object"]
                        if kind == "ERROR":
                            raise _RelistError()
                        if getattr(obj, "metadata", None) is not None and obj.metadata.resource_version:
                            rv = obj.metadata.resource_version
                        if kind in ("ADDED", "MODIFIED"):
                            self._deliver(obj)
                    # the server ended the watch (timeout): go on from the last resourceVersion
            except _RelistError:
                continue
            except ApiException as e:
                if e.status == 410:  # resourceVersion too old: list again
                    continue
                why = "forbidden" if e.status in (401, 403) else f"HTTP {e.status}"
                self._set_active(False, why)
                log.debug("config_watch_error", error=str(e))
            except Exception as e:  # noqa: BLE001 - apiserver unreachable, connection reset, …
                self._set_active(False, f"unreachable: {type(e).__name__}")
                log.debug("config_watch_error", error=str(e))
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.max_backoff)


class _RelistError(Exception):
    """A watch ERROR event (e.g. 410 Gone as an event): list again at once."""

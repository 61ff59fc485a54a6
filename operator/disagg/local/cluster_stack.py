"""The local stack on the real node (:class:`ClusterStack`) and the chart's install there: the operator runs as
the chart's Deployment (Helm's Go SDK), pods are containers of :class:`~disagg.local.cluster.LocalCluster`; used by
``disagg demo --node real`` and e2e/test_real_node.py."""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .cluster import LocalCluster
from .controlplane import REPO_ROOT
from .stack import LocalStack


def kubeconfig_from_env() -> Path | None:
    """The kubeconfig of a real cluster the e2e tier should use instead of the local node, if any."""
    path = os.environ.get("KUBECONFIG")
    return Path(path) if path and os.environ.get("DISAGG_REAL_NODE") == "kubeconfig" else None


# ---------------------------------------------------------------------------------------------------- the chart
CHART = REPO_ROOT / "charts" / "disagg-operator"


def helm(kubeconfig: Path, namespace: str) -> Any:
    """Helm's Go SDK (``helm-python-sdk``) bound to a cluster and a namespace."""
    import helm_python

    return helm_python.Config(kubeconfig_path=kubeconfig, namespace=namespace)


def chart_values(log_level: str = "info", watch_namespace: str | None = None) -> dict[str, Any]:
    """The chart's values for the demo and the e2e test: its defaults (the operator watches every namespace), or
    ``watch.scope: namespace`` for one namespace.

    The namespaced install cannot run yet: kopf lists namespaces cluster-wide unless its settings disable
    scanning, and the chart's namespaced Role does not (and should not) grant that (found by this test)."""
    # one router pod per model (the chart's default is 2, for HA): the demo's 2-core machine and its tests address a
    # model's router as one pod
    values: dict[str, Any] = {"operator": {"logLevel": log_level}, "router": {"replicas": 1}}
    if watch_namespace:
        values["watch"] = {"scope": "namespace", "namespaces": [watch_namespace]}
    return values


class ClusterStack(LocalStack):
    """:class:`LocalStack`'s interface (what :class:`ModelHarness` and the demo use) on the real node: the operator
    is the chart's Deployment, installed by Helm; Prometheus runs on this machine and is exposed to the pods on the
    bridge address (the operator's autoscaler queries it from its pod)."""

    RELEASE = "disagg"

    def __init__(self, namespace: str = "default", log_dir: Path | None = None) -> None:
        super().__init__(namespace=namespace, log_dir=log_dir)
        self.cluster = LocalCluster()
        self._release: Any = None

    def start(self, say: Callable[[str], None] = lambda _: None) -> None:
        atexit.register(self.stop)
        self.cluster.start(say=say)
        assert self.cluster.cp is not None
        self.cp = self.cluster.cp
        self.api = self.cluster.api
        say("starting Prometheus (Debian package) scraping every pod of every model, exposed on the pod bridge")
        self.prometheus.start()
        self.prometheus.url = self.cluster.expose(int(self.prometheus.url.rsplit(":", 1)[1]), "prometheus")
        self._targets_thread = threading.Thread(target=self._sync_targets, daemon=True, name="prom-targets")
        self._targets_thread.start()
        say(f"helm install {self.RELEASE} charts/disagg-operator (the operator runs as a pod under its "
            "ServiceAccount)")
        self._release = helm(self.cluster.kubeconfig, self.namespace)
        self._release.install(str(CHART), self.RELEASE, chart_values(), namespace=self.namespace,
                              create_namespace=True, wait="watcher", timeout=300)

    def restart_operator(self, crash: bool = True) -> None:
        raise NotImplementedError("on the real node the operator is a Deployment: delete its pod instead")

    def stop(self) -> None:
        self._stop.set()
        self.prometheus.stop()
        self.cluster.stop()

"""The whole local stack in one object: control plane, pod runtime, operator, Prometheus, and (``tracing=True``)
Jaeger. Worker pods run the simulator, or real vLLM engines with ``engine`` (:mod:`disagg.local.realengine`).

Used by ``disagg demo`` and the e2e tests. Everything runs on 127.0.0.0/8; :meth:`LocalStack.stop` (also on
interpreter exit) stops every process it started.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client

from ..api import GROUP, PLURAL, VERSION
from ..api.contract import LABEL_COMPAT, LABEL_MODEL, LABEL_ROLE, ROUTER_PORT
from ..api.crd import build_crd
from ..builders.settings import ENV_ROUTER_REPLICAS
from ..kube import api_client, install_crd, server_side_apply
from ..poll import wait_for
from .controlplane import ControlPlane
from .jaeger import LocalJaeger
from .procs import free_ports, stop_group
from .prometheus import LocalPrometheus, Target
from .runtime import LocalRuntime, RealEngine

WORKER_PORT = 8000

T = TypeVar("T")


class LocalStack:
    """``tracing``: also run a :class:`LocalJaeger` as :attr:`jaeger` (its binary comes from ``make jaeger``, built
    on first use); a model traces to it when its spec says so (:meth:`tracing_spec`). Off by default: the e2e tests
    and benchmarks that do not read traces do not pay for a collector."""

    def __init__(self, namespace: str = "default", workdir: Path | None = None,
                 sim_env: dict[str, str] | None = None, log_dir: Path | None = None,
                 operator_args: tuple[str, ...] = (), tracing: bool = False,
                 engine: RealEngine | None = None) -> None:
        self.namespace = namespace
        self.engine = engine
        self.workdir = workdir
        self.log_dir = log_dir
        self.sim_env = dict(sim_env or {})
        self.operator_args = operator_args
        self.cp = ControlPlane(with_controller_manager=True, workdir=workdir, log_to=log_dir)
        self.prometheus = LocalPrometheus()
        self.jaeger: LocalJaeger | None = LocalJaeger() if tracing else None
        self.runtime: LocalRuntime | None = None
        self.operator: subprocess.Popen[bytes] | None = None
        self.api: client.ApiClient | None = None
        self._stop = threading.Event()
        self._targets_thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self, say: Callable[[str], None] = lambda _: None) -> None:
        atexit.register(self.stop)
        say("starting etcd + kube-apiserver + kube-controller-manager on 127.0.0.1")
        self.cp.start()
        self.api = api_client(self.cp.kubeconfig)
        install_crd(self.api, build_crd())
        engine = "real vLLM" if self.engine is not None else "`disagg sim`"
        say(f"starting the local pod runtime (pods run as processes, `vllm serve` → {engine})")
        self.runtime = LocalRuntime(self.api, self.cp.kubeconfig, namespaces=[self.namespace],
                                    extra_env=self.sim_env, workdir=self.workdir, engine=self.engine)
        self.runtime.start()
        say("starting Prometheus (Debian package) scraping every pod of every model")
        self.prometheus.start()
        self._targets_thread = threading.Thread(target=self._sync_targets, daemon=True, name="prom-targets")
        self._targets_thread.start()
        if self.jaeger is not None:
            say("starting Jaeger (OTLP/HTTP in, in-memory, query API; built by `make jaeger`)")
            self.jaeger.start()
        say("starting the operator (`disagg operator`)")
        self._start_operator()

    def _start_operator(self) -> None:
        (liveness_port,) = free_ports(1)
        logdir = self.log_dir or self.cp.tmp_dir or Path(".")
        logdir.mkdir(parents=True, exist_ok=True)
        with open(logdir / "operator.log", "ab") as log:
            self.operator = subprocess.Popen(
                [sys.executable, "-m", "disagg.cli", "operator", "--namespace", self.namespace,
                 "--kubeconfig", str(self.cp.kubeconfig), "--liveness", f"http://127.0.0.1:{liveness_port}/healthz",
                 *self.operator_args],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                # one router pod per model on this machine (the product's default is 2, for HA on a cluster): the
                # local stack's tests address a model's router as one process; the caller's environment still wins
                env={ENV_ROUTER_REPLICAS: "1", **os.environ, "KUBECONFIG": str(self.cp.kubeconfig)})

    def restart_operator(self, crash: bool = True) -> None:
        """Stop the operator — SIGKILL with ``crash`` (an OOM kill, a node lost), else SIGTERM with a grace
        period — and start a new one, as its Deployment would."""
        stop_group(self.operator, grace=0 if crash else 10)
        self._start_operator()

    def stop(self) -> None:
        self._stop.set()
        stop_group(self.operator, grace=10)
        self.operator = None
        if self.runtime:
            self.runtime.stop()
            self.runtime = None
        self.prometheus.stop()
        if self.jaeger is not None:
            self.jaeger.stop()
        self.cp.stop()

    def __enter__(self) -> LocalStack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ Prometheus targets
    def _sync_targets(self) -> None:
        """Scrape every running pod of every model, labelled as the chart's PodMonitors label them."""
        core = client.CoreV1Api(self.api)
        last: list[tuple[str, tuple[tuple[str, str], ...]]] = []
        while not self._stop.is_set():
            try:
                pods = core.list_namespaced_pod(self.namespace, label_selector=LABEL_MODEL).items
                targets = []
                for p in pods:
                    ip = pod_ip(p)
                    if not ip or p.metadata is None or p.metadata.deletion_timestamp:
                        continue
                    labels = p.metadata.labels or {}
                    role = labels.get(LABEL_ROLE, "")
                    port = ROUTER_PORT if role == "router" else WORKER_PORT
                    targets.append(Target(f"{ip}:{port}", {
                        "namespace": self.namespace, "model": labels.get(LABEL_MODEL, ""), "role": role,
                        "pod": p.metadata.name or "", "compat_hash": labels.get(LABEL_COMPAT, "")}))
                key = sorted((t.address, tuple(sorted(t.labels.items()))) for t in targets)
                if key != last:
                    self.prometheus.set_targets(targets)
                    last = key
            except Exception:  # noqa: BLE001 - the apiserver may be stopping; try again
                pass
            self._stop.wait(1.0)

    # ------------------------------------------------------------------ helpers
    def apply(self, doc: dict[str, Any]) -> None:
        assert self.api is not None, "start() first"
        doc = {**doc, "metadata": {**doc.get("metadata", {}), "namespace": self.namespace}}
        server_side_apply(self.api, doc, field_manager="disagg-demo")

    def model(self, name: str) -> dict[str, Any]:
        got = client.CustomObjectsApi(self.api).get_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                                             PLURAL, name)
        assert isinstance(got, dict)
        return got

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        client.CustomObjectsApi(self.api).patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, {"spec": spec})

    def pods(self, model: str, role: str) -> list[client.V1Pod]:
        core = client.CoreV1Api(self.api)
        return core.list_namespaced_pod(self.namespace,
                                        label_selector=f"{LABEL_MODEL}={model},{LABEL_ROLE}={role}").items

    def set_pod_env(self, model: str, role: str, env: dict[str, str]) -> None:
        """Extra environment for the containers of the model's ``role`` pods started from now on."""
        assert self.runtime is not None
        self.runtime.set_env_for({LABEL_MODEL: model, LABEL_ROLE: role}, env)

    def live_pods(self, model: str, role: str) -> list[client.V1Pod]:
        """The model's ``role`` pods not being deleted."""
        return [p for p in self.pods(model, role) if not (p.metadata and p.metadata.deletion_timestamp)]

    def ready_pod_ips(self, model: str, role: str) -> list[str]:
        return [ip for p in self.live_pods(model, role) if (ip := pod_ip(p)) and pod_ready(p)]

    def children(self, model: str) -> dict[str, list[tuple[str, str]]]:
        """The model's labelled children by ``Kind/role``: (name, uid) of each, for duplicate and re-creation
        checks (Deployments, Services, ConfigMaps, PodDisruptionBudgets, ServiceAccounts)."""
        sel = f"{LABEL_MODEL}={model}"
        ns = self.namespace
        apps, core, policy = client.AppsV1Api(self.api), client.CoreV1Api(self.api), client.PolicyV1Api(self.api)
        lists: list[tuple[str, list[Any]]] = [
            ("Deployment", apps.list_namespaced_deployment(ns, label_selector=sel).items),
            ("StatefulSet", apps.list_namespaced_stateful_set(ns, label_selector=sel).items),
            ("Service", core.list_namespaced_service(ns, label_selector=sel).items),
            ("ConfigMap", core.list_namespaced_config_map(ns, label_selector=sel).items),
            ("PodDisruptionBudget", policy.list_namespaced_pod_disruption_budget(ns, label_selector=sel).items),
            ("ServiceAccount", core.list_namespaced_service_account(ns, label_selector=sel).items),
        ]
        out: dict[str, list[tuple[str, str]]] = {}
        for kind, items in lists:
            for o in items:
                if o.metadata.deletion_timestamp:
                    continue
                role = (o.metadata.labels or {}).get(LABEL_ROLE, "")
                out.setdefault(f"{kind}/{role}", []).append((o.metadata.name, o.metadata.uid))
        return {k: sorted(v) for k, v in sorted(out.items())}

    def events(self, name: str, kind: str = "DisaggregatedModel") -> list[client.CoreV1Event]:
        """Events about the object ``kind/name`` in the namespace (oldest first, by creation)."""
        got = client.CoreV1Api(self.api).list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.kind={kind},involvedObject.name={name}").items
        return sorted(got, key=lambda e: (e.metadata.creation_timestamp, e.metadata.resource_version or ""))

    def tracing_spec(self, sampling_ratio: float = 1.0) -> dict[str, Any]:
        """``spec.observability`` that sends a model's traces (router and both pools) to :attr:`jaeger`."""
        assert self.jaeger is not None and self.jaeger.otlp_endpoint, "LocalStack(tracing=True).start() first"
        return {"tracing": {"endpoint": self.jaeger.otlp_endpoint, "samplingRatio": sampling_ratio}}

    def pod_logs(self, model: str, role: str) -> str:
        """The container logs of the model's ``role`` pods that exist now, one after another ("" without the
        local pod runtime, as on the real node)."""
        if self.runtime is None:
            return ""
        out = []
        for p in self.pods(model, role):
            if p.metadata is None or not p.metadata.name:
                continue
            path = self.runtime.log_path(self.namespace, p.metadata.name)
            if path.exists():
                out.append(path.read_text(errors="replace"))
        return "\n".join(out)

    def router_url(self, model: str) -> str | None:
        ips = self.ready_pod_ips(model, "router")
        return f"http://{ips[0]}:{ROUTER_PORT}" if ips else None

    def wait_for(self, pred: Callable[[], T], timeout: float, what: str) -> T:
        """:func:`disagg.poll.wait_for` that also fails at once when the operator exits, and treats an
        apiserver error as "not yet"."""

        def check() -> T:
            if self.operator is not None and self.operator.poll() is not None:
                raise RuntimeError(f"the operator exited ({self.operator.returncode}) while waiting for {what}")
            return pred()

        return wait_for(check, timeout, what, interval=0.5, retry_on=(client.ApiException,))


def pod_ip(pod: client.V1Pod) -> str | None:
    return pod.status.pod_ip if pod.status else None


def pod_ready(pod: client.V1Pod) -> bool:
    """The pod's Ready condition is True."""
    conds = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conds)

"""The local pod runtime runs Deployments' pods as processes with their own loopback IPs, reports readiness,
restarts crashed containers and stops processes on scale-down.

(EndpointSlices stay empty locally: the apiserver refuses loopback endpoint addresses. The router discovers
workers from Pods — their IP, Ready condition and compat-hash label — so it works the same here and in a
cluster.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from disagg.api import DisaggregatedModel
from disagg.builders.vllm import kv_events_args
from disagg.local.controlplane import REPO_ROOT, ControlPlane
from disagg.local.runtime import LocalRuntime
from disagg.local.stack import pod_ip, pod_ready
from disagg.poll import wait_for


def _kv_events_args() -> list[str]:
    """The KV-events flags as the operator renders them for a pool (``tcp://*:5557``: every pod binds the same port)."""
    example = REPO_ROOT / "docs" / "examples" / "llama-8b-nvlink.yaml"
    dm = DisaggregatedModel.model_validate(yaml.safe_load(example.read_text()))
    args = kv_events_args(dm.spec)
    assert "tcp://*:" in args[1]
    return args


def _deployment(name: str, replicas: int) -> Any:  # a JSON body: the client takes dicts as well as models
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"terminationGracePeriodSeconds": 5, "containers": [{
                "name": "vllm", "image": "vllm/vllm-openai:v0.11.2", "command": ["vllm", "serve"],
                "args": ["meta-llama/Llama-3.1-8B-Instruct", "--port", "8000", "--served-model-name", "$(MODEL_NAME)",
                         "--time-scale", "0.05", *_kv_events_args()],
                "env": [{"name": "MODEL_NAME", "value": "llama"},
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                "ports": [{"name": "http", "containerPort": 8000}],
                "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
            }]}}}}


@pytest.fixture
def runtime(control_plane: ControlPlane, kube: client.ApiClient, namespace: str) -> Iterator[LocalRuntime]:
    rt = LocalRuntime(kube, control_plane.kubeconfig, namespaces=[namespace], poll_seconds=0.3)
    rt.start()
    yield rt
    rt.stop()


def test_deployment_pods_run_with_their_own_ips(kube: client.ApiClient, namespace: str, runtime: LocalRuntime) -> None:
    apps, core = client.AppsV1Api(kube), client.CoreV1Api(kube)
    apps.create_namespaced_deployment(namespace, _deployment("w", 2))

    def ready_pods() -> list[client.V1Pod]:
        pods = core.list_namespaced_pod(namespace, label_selector="app=w").items
        ok = [p for p in pods if pod_ready(p)]
        return ok if len(ok) == 2 else []

    pods = wait_for(ready_pods, 60, "2 ready pods", interval=0.3)
    ips = {ip for p in pods if (ip := pod_ip(p))}
    assert len(ips) == 2 and all(ip.startswith(f"127.{runtime.ip_block}.") for ip in ips)
    # each pod's process serves vLLM's API on its own IP, same port; both bound the KV-events port (on their own IP)
    for ip in ips:
        with urllib.request.urlopen(f"http://{ip}:8000/v1/models", timeout=5) as r:
            assert b'"llama"' in r.read()
        with socket.create_connection((ip, 5557), timeout=5):
            pass

    # a crashed container is restarted
    assert pods[0].metadata and pods[0].metadata.name
    victim = pods[0].metadata.name
    local = next(lp for lp in runtime.pods.values() if lp.name == victim)
    assert local.proc is not None
    os.killpg(local.proc.pid, signal.SIGKILL)

    def restarted() -> bool:
        p = core.read_namespaced_pod(victim, namespace)
        cs = (p.status.container_statuses if p.status else None) or []
        return bool(cs and cs[0].restart_count >= 1 and cs[0].ready)

    wait_for(restarted, 60, "restart of the killed container")

    # scale down: the process of the removed pod stops
    procs = {lp.name: lp.proc for lp in runtime.pods.values() if lp.proc is not None}
    apps.patch_namespaced_deployment_scale("w", namespace, {"spec": {"replicas": 1}})

    def one_left() -> bool:
        pods = core.list_namespaced_pod(namespace, label_selector="app=w").items
        return len(pods) == 1 and sum(p.poll() is None for p in procs.values()) == 1

    wait_for(one_left, 60, "scale-down to 1 pod and 1 process")


def test_labelled_env_reaches_only_containers_started_later_with_those_labels(
        kube: client.ApiClient, namespace: str, runtime: LocalRuntime) -> None:
    """A standing fault (set_env_for) is in the environment of a pod the Deployment adds later, and not in the
    running pod's nor in another Deployment's."""
    apps, core = client.AppsV1Api(kube), client.CoreV1Api(kube)
    apps.create_namespaced_deployment(namespace, _deployment("w", 1))
    apps.create_namespaced_deployment(namespace, _deployment("other", 0))

    def ready_ips(app: str, n: int) -> list[str]:
        pods = core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
        ips = [ip for p in pods if pod_ready(p) and (ip := pod_ip(p))]
        return ips if len(ips) == n else []

    (first,) = wait_for(lambda: ready_ips("w", 1), 60, "1 ready pod", interval=0.3)
    runtime.set_env_for({"app": "w"}, {"DISAGG_SIM_FAULT_KV_TRANSFER_DELAY_MS": "1234"})
    apps.patch_namespaced_deployment_scale("w", namespace, {"spec": {"replicas": 2}})
    apps.patch_namespaced_deployment_scale("other", namespace, {"spec": {"replicas": 1}})
    (second,) = wait_for(lambda: [ip for ip in ready_ips("w", 2) if ip != first], 60, "the added pod", interval=0.3)
    (other,) = wait_for(lambda: ready_ips("other", 1), 60, "the other Deployment's pod", interval=0.3)

    def delay(ip: str) -> float:
        with urllib.request.urlopen(f"http://{ip}:8000/sim/faults", timeout=5) as r:
            return float(json.loads(r.read())["kv_transfer_delay_ms"])

    assert (delay(first), delay(second), delay(other)) == (0.0, 1234.0, 0.0)

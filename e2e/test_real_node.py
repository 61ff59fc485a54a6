"""The chart installed for real (issue 16): Helm's Go SDK installs charts/disagg-operator into a cluster whose node
runs pods as containers (``disagg.local.cluster.LocalCluster``: kubelet + containerd + bridge CNI on this machine,
or any cluster: see below). The operator runs as a pod from its image under the chart's ServiceAccount — RBAC is
enforced, so a permission the chart forgot fails the model's rollout and this test —, a DisaggregatedModel is
applied, its router and worker pods (the twin image: ``vllm serve`` → ``disagg sim``) run as containers, and:

- requests flow from this machine to the router pod's IP, remote prefill and local;
- a worker container killed (SIGKILL to its process, by containerd) is restarted by the kubelet and serves again;
- a decode pool scaled from 2 to 1 drains: streams in flight on the removed pod end with ``[DONE]`` and every token
  (the kubelet sends SIGTERM and waits the pod's grace period);
- ``helm upgrade`` rolls the operator and the model keeps serving; deleting the model and ``helm uninstall`` leave
  no object of the release and no pod behind.

When the machine cannot run the node, the test FAILS naming the missing package or kernel feature
(``hack/ensure-node-tools.sh --check``); ``DISAGG_REAL_NODE=0`` opts out and the skip says why (``-rs``).
``DISAGG_REAL_NODE=kubeconfig KUBECONFIG=...`` runs the same test on that cluster (images pushed where the chart's
values point, a GPU node pool or the sim image; the requests then go through the apiserver's pod proxy and the
killed container is a deleted pod). See docs/development.md, "The real node".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from disagg.api import GROUP, PLURAL, VERSION
from disagg.api.contract import LABEL_MODEL, LABEL_ROLE, ROUTER_PORT
from disagg.kube import api_client
from disagg.load import loadgen
from disagg.load.workload import Mix, RequestClass, generate
from disagg.local.cluster import LocalCluster, NodeUnsupportedError, check_machine
from disagg.local.cluster_stack import CHART, chart_values, helm, kubeconfig_from_env
from disagg.poll import wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
DEMO_MODEL = REPO / "docs" / "examples" / "local-demo.yaml"
NS = "real-node"
RELEASE = "disagg"
MODEL = "demo"
DRAIN_S = 10  # spec.engine.shutdownTimeoutSeconds
STREAMS = Mix("drain", "long streamed answers", (RequestClass("stream", 1.0, (64, 256), (200, 300), tenant="stream"),))
MIXED = Mix("mixed", "short chats and long prompts", (
    RequestClass("chat", 0.5, (64, 256), (16, 32), tenant="chat"),
    RequestClass("rag", 0.5, (3000, 4000), (64, 96), tenant="rag"),
))


@dataclass
class Target:
    api: client.ApiClient
    kubeconfig: Path
    local: LocalCluster | None  # None: a real cluster from KUBECONFIG


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    mode = os.environ.get("DISAGG_REAL_NODE", "")
    if mode == "0":
        pytest.skip("DISAGG_REAL_NODE=0: the real-node tier (kubelet + containerd on this machine, the chart installed "
                    "by Helm) was opted out")
    external = kubeconfig_from_env()
    if external is not None:
        yield Target(api_client(external), external, None)
        return
    try:
        check_machine()
    except NodeUnsupportedError as e:
        pytest.fail(f"this machine cannot run the real node: {e}. "
                    "Install what is named (bash hack/ensure-node-tools.sh), or opt out with DISAGG_REAL_NODE=0",
                    pytrace=False)
    cluster = LocalCluster()
    try:
        cluster.start(say=lambda m: print(f"[real node] {m}", file=sys.stderr))
        assert cluster.api is not None
        yield Target(cluster.api, cluster.kubeconfig, cluster)
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def release(target: Target) -> Iterator[Any]:
    """The chart installed by Helm (``--create-namespace --wait``); uninstalled by the last test, or here."""
    cfg = helm(target.kubeconfig, NS)
    cfg.install(str(CHART), RELEASE, chart_values(), namespace=NS, create_namespace=True, wait="watcher",
                timeout=240)
    try:
        yield cfg
    finally:
        with contextlib.suppress(Exception):
            cfg.uninstall(RELEASE, ignore_not_found=True, wait="watcher", timeout=120)


def core(t: Target) -> client.CoreV1Api:
    return client.CoreV1Api(t.api)


def pods(t: Target, role: str | None = None, model: str = MODEL) -> list[client.V1Pod]:
    selector = f"{LABEL_MODEL}={model}" + (f",{LABEL_ROLE}={role}" if role else "")
    return list(core(t).list_namespaced_pod(NS, label_selector=selector).items)


def ready(p: client.V1Pod) -> bool:
    st = p.status
    return bool(p.metadata and p.metadata.deletion_timestamp is None and st and st.pod_ip
                and any(c.type == "Ready" and c.status == "True" for c in st.conditions or []))


def name(obj: Any) -> str:
    assert obj.metadata is not None
    return str(obj.metadata.name)


def uid(obj: Any) -> str:
    assert obj.metadata is not None
    return str(obj.metadata.uid)


def container_status(p: client.V1Pod) -> client.V1ContainerStatus:
    assert p.status is not None and p.status.container_statuses, name(p)
    return p.status.container_statuses[0]


def container_id(p: client.V1Pod) -> str:
    return str(container_status(p).container_id or "")


def custom_items(listing: object) -> list[dict[str, Any]]:
    assert isinstance(listing, dict)
    return list(listing["items"])


def model_doc(**overrides: Any) -> dict[str, Any]:
    doc = yaml.safe_load(DEMO_MODEL.read_text())
    doc["metadata"] = {"name": MODEL, "namespace": NS}
    spec = doc["spec"]
    spec["autoscaling"] = {"enabled": False}
    spec["engine"] = {"shutdownTimeoutSeconds": DRAIN_S}
    spec["decode"].update({"replicas": 2, "minReplicas": 1})
    spec.update(overrides)
    return dict(doc)


def router_url(t: Target) -> str:
    """The router's base URL: its pod IP on the local node (this machine routes to the pod network), else the
    apiserver's pod proxy."""
    rs = [p for p in pods(t, "router") if ready(p)]
    assert rs, "no ready router pod"
    assert rs[0].metadata is not None and rs[0].status is not None
    if t.local is not None:
        return f"http://{rs[0].status.pod_ip}:{ROUTER_PORT}"
    host = t.api.configuration.host
    return f"{host}/api/v1/namespaces/{NS}/pods/{rs[0].metadata.name}:{ROUTER_PORT}/proxy"


def router_gauge(url: str, name: str, pool: str) -> float:
    """A per-pool gauge of the router (``disagg_workers``, ``disagg_inflight_requests``); 0 when it does not
    answer."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    return sum(s.value for fam in text_string_to_metric_families(text) if fam.name == name
               for s in fam.samples if s.labels.get("pool") == pool)


def serving(t: Target, decode: int) -> str:
    """Wait until the router pod is ready and every pool's pods are ready; returns the router URL."""
    def check() -> str | None:
        if len([p for p in pods(t, "decode") if ready(p)]) != decode or not any(ready(p) for p in pods(t, "prefill")):
            return None
        try:
            url = router_url(t)
            with urllib.request.urlopen(url + "/ready", timeout=3) as r:
                return url if r.status == 200 else None
        except (AssertionError, OSError):
            return None

    return wait_for(check, 240, f"the model to serve ({decode} decode pods ready, router ready)", interval=1,
                    retry_on=(ApiException,))


def send(url: str, mix: Mix, rate: float, seconds: float, seed: int) -> tuple[list[loadgen.Result], dict[str, int]]:
    requests = generate(mix, rate, seconds, "llama-8b", seed=seed)
    results = asyncio.run(loadgen.run(url, requests, timeout_s=120))
    return results, {r.id: r.max_tokens for r in requests}


def operator_pod(t: Target) -> client.V1Pod:
    ps = core(t).list_namespaced_pod(NS, label_selector="app.kubernetes.io/name=disagg-operator").items
    assert len(ps) == 1, [name(p) for p in ps if p.metadata]
    return ps[0]


def container_log(t: Target, pod: client.V1Pod) -> str:
    """A pod's container log: the kubelet's file on the local node (the loopback apiserver has no kubelet
    client certificate), the API elsewhere."""
    if t.local is not None:
        d = t.local.state_dir / "pod-logs"
        files = sorted(d.glob(f"{NS}_{name(pod)}_*/*/*.log"))
        return "\n".join(f.read_text(errors="replace") for f in files)
    return str(core(t).read_namespaced_pod_log(name(pod), NS))


# ---------------------------------------------------------------------------------------------------- the tests
def test_operator_runs_from_its_image_under_the_charts_service_account(target: Target, release: Any) -> None:
    op = operator_pod(target)
    assert op.spec is not None and op.status is not None
    assert op.spec.service_account_name == f"{RELEASE}-disagg-operator", op.spec.service_account_name
    assert str(op.spec.containers[0].image).startswith("ghcr.io/disagg/disagg:")
    assert ready(op)
    if target.local is not None:  # a container of the node, not a process of this machine
        assert container_id(op).startswith("containerd://")


def test_model_serves_through_the_router_pod(target: Target, release: Any) -> None:
    custom = client.CustomObjectsApi(target.api)
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, model_doc())
    url = serving(target, decode=2)
    for p in pods(target):
        assert target.local is None or container_id(p).startswith("containerd://"), name(p)
    results, want = send(url, MIXED, rate=4, seconds=6, seed=3)
    failed = [(r.id, r.status, r.error) for r in results if not r.ok]
    assert failed == []
    assert all(r.output_tokens == want[r.id] for r in results)
    assert {r.path for r in results} >= {"remote", "local"}, {r.path for r in results}
    # RBAC: the operator did all of this under its own ServiceAccount; nothing it asked for was forbidden
    log = container_log(target, operator_pod(target))
    assert "Forbidden" not in log and " 403" not in log, [ln for ln in log.splitlines() if "403" in ln][:5]


def test_a_killed_worker_container_is_restarted(target: Target, release: Any) -> None:
    victim = sorted((p for p in pods(target, "decode") if ready(p)), key=name)[0]
    pod = name(victim)
    before = container_status(victim).restart_count
    if target.local is None:  # no access to the node's runtime: the pod is deleted, its ReplicaSet replaces it
        core(target).delete_namespaced_pod(pod, NS, grace_period_seconds=0)
        serving(target, decode=2)
        return
    target.local.kill_container(container_id(victim).removeprefix("containerd://"))

    def restarted() -> bool:
        p = core(target).read_namespaced_pod(pod, NS)
        return container_status(p).restart_count > before and ready(p)

    wait_for(restarted, 120, f"the kubelet to restart {pod}'s container", interval=0.5)
    last = container_status(core(target).read_namespaced_pod(pod, NS)).last_state
    term = last.terminated if last else None
    assert term is not None and term.exit_code == 137  # SIGKILL
    url = serving(target, decode=2)
    results, _ = send(url, MIXED, rate=4, seconds=3, seed=4)
    assert [r for r in results if not r.ok] == []


def test_scale_down_drains_in_flight_streams(target: Target, release: Any) -> None:
    url = serving(target, decode=2)
    requests = generate(STREAMS, 3.0, 10.0, "llama-8b", seed=5)
    want = {r.id: r.max_tokens for r in requests}
    results: list[loadgen.Result] = []
    load = threading.Thread(target=lambda: results.extend(asyncio.run(loadgen.run(url, requests, timeout_s=120))))
    load.start()
    try:
        wait_for(lambda: router_gauge(url, "disagg_inflight_requests", "decode") >= 4, 30,
                 "streams in flight on the decode pool", interval=0.2)
        client.CustomObjectsApi(target.api).patch_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, MODEL, {"spec": {"decode": {"replicas": 1}}})
        wait_for(lambda: any(p.metadata is not None and p.metadata.deletion_timestamp is not None
                             for p in pods(target, "decode")), 30, "a decode pod to be deleted", interval=0.2)
        wait_for(lambda: router_gauge(url, "disagg_workers", "decode") == 1, 30,
                 "the router to drop the terminating pod", interval=0.2)
        wait_for(lambda: len(pods(target, "decode")) == 1, DRAIN_S + 60, "the removed pod to be gone (drained)",
                 interval=0.5)
    finally:
        load.join()
    bad = [(r.id, r.status, r.error, r.output_tokens, want[r.id]) for r in results
           if not r.ok or r.output_tokens != want[r.id]]
    assert bad == []  # every stream, also those on the removed pod, ended with [DONE] and all its tokens


def test_helm_upgrade_keeps_serving(target: Target, release: Any) -> None:
    old = operator_pod(target)
    release.upgrade(str(CHART), RELEASE, chart_values(log_level="debug"), namespace=NS, wait="watcher",
                    timeout=240)
    wait_for(lambda: uid(operator_pod(target)) != uid(old) and ready(operator_pod(target)), 120,
             "the upgraded operator pod", interval=1, retry_on=(AssertionError,))
    url = serving(target, decode=1)
    results, _ = send(url, MIXED, rate=4, seconds=3, seed=6)
    assert [r for r in results if not r.ok] == []


def test_uninstall_leaves_nothing_behind(target: Target, release: Any) -> None:
    custom = client.CustomObjectsApi(target.api)
    custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, MODEL)
    wait_for(lambda: not pods(target), 120, "the model's pods to go (the operator's children are GC'd)", interval=1)
    release.uninstall(RELEASE, wait="watcher", timeout=120)
    wait_for(lambda: not core(target).list_namespaced_pod(NS).items, 120, "no pod left in the namespace",
             interval=1)
    selector = f"app.kubernetes.io/instance={RELEASE}"
    apps = client.AppsV1Api(target.api)
    rbac = client.RbacAuthorizationV1Api(target.api)
    left = {
        "deployments": [name(d) for d in apps.list_namespaced_deployment(NS).items],
        "services": [name(s) for s in core(target).list_namespaced_service(NS).items],
        "configmaps": [name(c) for c in core(target).list_namespaced_config_map(NS).items
                       if name(c) != "kube-root-ca.crt"],
        "serviceaccounts": [name(s) for s in core(target).list_namespaced_service_account(NS).items
                            if name(s) != "default"],
        "secrets": [name(s) for s in core(target).list_namespaced_secret(NS).items],
        "roles": [name(r) for r in rbac.list_namespaced_role(NS).items],
        "clusterroles": [name(r) for r in rbac.list_cluster_role(label_selector=selector).items],
        "clusterrolebindings": [name(r) for r in rbac.list_cluster_role_binding(label_selector=selector).items],
        "models": [m["metadata"]["name"] for m in custom_items(custom.list_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL))],
    }
    assert {k: v for k, v in left.items() if v} == {}

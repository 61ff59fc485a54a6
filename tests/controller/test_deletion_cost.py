"""A scale-down removes the idlest pods: before it the autoscaler sets each pool pod's
controller.kubernetes.io/pod-deletion-cost to the requests it holds (read from a real Prometheus scraping one
target per pod), and the real ReplicaSet controller (kube-controller-manager) deletes the cheapest pods."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client
from tests.autoscaling.test_queries import pod_exporter

from disagg.api.contract import LABEL_MODEL, LABEL_ROLE
from disagg.autoscaling.access import PrometheusAccess, connect
from disagg.autoscaling.deletion import POD_DELETION_COST
from disagg.autoscaling.queries import pod_load
from disagg.controller.autoscaler import Autoscaler
from disagg.controller.clock import FakeClock
from disagg.local.prometheus import LocalPrometheus, Target

from .conftest import load_example, scale, wait_for

pytestmark = pytest.mark.apiserver

MODEL = "llama-70b"  # docs/examples/llama-70b-rdma.yaml: autoscaling on, prefill 1..6 starting at 2


@pytest.fixture(scope="module")
def prometheus() -> Iterator[LocalPrometheus]:
    with LocalPrometheus() as prom:
        yield prom


def _pods(cluster, role: str) -> list[client.V1Pod]:
    pods = client.CoreV1Api(cluster.api).list_namespaced_pod(
        cluster.ns, label_selector=f"{LABEL_MODEL}={MODEL},{LABEL_ROLE}={role}").items
    return [p for p in pods if p.metadata and not p.metadata.deletion_timestamp]


def _count(cluster, role: str, n: int) -> list[client.V1Pod] | None:
    pods = _pods(cluster, role)
    return pods if len(pods) == n else None


def _names(pods: list[client.V1Pod]) -> list[str]:
    return [p.metadata.name for p in pods if p.metadata and p.metadata.name]


def test_scale_down_removes_the_idlest_pods(operator, cluster, prometheus: LocalPrometheus) -> None:
    cluster.create_model(load_example("llama-70b-rdma"))
    wait_for(lambda: cluster.deployment(f"{MODEL}-prefill"), 30, "prefill Deployment")
    scaler = Autoscaler(kube=operator.kube, emit=lambda *_: None, clock=FakeClock(),
                        query_factory=lambda _access: connect(PrometheusAccess(prometheus.url, 5)))
    scale(scaler, cluster, MODEL, "prefill", 3, "load")
    pods = wait_for(lambda: _count(cluster, "prefill", 3), 60, "3 prefill pods")
    # The busy pod is the newest: the ReplicaSet's own tie-break (no node, all Pending) deletes the newest first,
    # so only the deletion cost can keep it.
    idle, light, busy = sorted(_names(pods), key=lambda n: (next(
        p.metadata.creation_timestamp for p in pods if p.metadata and p.metadata.name == n), n))
    servers, targets = pod_exporter({busy: (4, 1), light: (1, 0), idle: (0, 0)})
    labels = {"namespace": cluster.ns, "model": MODEL, "role": "prefill"}
    try:
        prometheus.set_targets([Target(t.address, {**labels, **t.labels}) for t in targets])
        query = connect(PrometheusAccess(prometheus.url, 5))
        wait_for(lambda: len(pod_load(query, cluster.ns, MODEL, "prefill")) == 3, 30, "every prefill pod scraped")

        scale(scaler, cluster, MODEL, "prefill", 1, "idle")
        left = wait_for(lambda: _count(cluster, "prefill", 1), 60, "1 prefill pod left")
        assert _names(left) == [busy]
        assert left[0].metadata is not None and (left[0].metadata.annotations or {}).get(POD_DELETION_COST) == "5"
    finally:
        for server in servers:
            server.shutdown()
        prometheus.set_targets([])


def test_without_a_measurement_the_scale_down_still_happens(operator, cluster) -> None:
    cluster.create_model(load_example("llama-70b-rdma"))
    wait_for(lambda: cluster.deployment(f"{MODEL}-prefill"), 30, "prefill Deployment")
    # the example's Prometheus (a cluster address) cannot be reached from here: the ReplicaSet picks by its own ranks
    scaler = Autoscaler(kube=operator.kube, emit=lambda *_: None, clock=FakeClock())
    scale(scaler, cluster, MODEL, "prefill", 1, "idle")
    wait_for(lambda: len(_pods(cluster, "prefill")) == 1, 60, "1 prefill pod left")
    assert cluster.deployment(f"{MODEL}-prefill").spec.replicas == 1
    left = _pods(cluster, "prefill")
    assert not any(POD_DELETION_COST in ((p.metadata and p.metadata.annotations) or {}) for p in left)

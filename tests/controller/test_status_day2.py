"""Status that an on-call engineer can trust (issue 13, "Day-2 safety"): figures never go stale silently when
Prometheus goes away, and a Pod Security level the namespace refuses is named in status, not only on a ReplicaSet.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from disagg.autoscaling.queries import QUERIES, render
from disagg.builders import parse_model
from disagg.controller.autoscaler import Autoscaler
from disagg.controller.clock import FakeClock
from disagg.controller.status import PSA_ENFORCE_LABEL

from .conftest import load_example, wait_for

pytestmark = pytest.mark.apiserver

MODEL = "llama-70b"  # docs/examples/llama-70b-rdma.yaml: transport rdma (privileged pods), names a Prometheus


class FakePrometheus:
    """A Prometheus HTTP API (/api/v1/query) answering the autoscaler's named queries with fixed values."""

    def __init__(self, answers: dict[str, float], port: int = 0) -> None:
        self.answers = answers
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlparse(self.path).query).get("query", [""])[0]
                value = outer.answers.get(query)
                result = [] if value is None else [{"metric": {}, "value": [0, str(value)]}]
                body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)  # (SO_REUSEADDR: a port can come back)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@contextlib.contextmanager
def fake_prometheus(answers: dict[str, float], port: int = 0) -> Iterator[FakePrometheus]:
    prom = FakePrometheus(answers, port)
    try:
        yield prom
    finally:
        with contextlib.suppress(OSError):
            prom.stop()


def _conditions(m: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (m.get("status") or {}).get("conditions") or []}


def test_prometheus_going_away_leaves_unknowns_not_stale_figures(operator, cluster, kubectl):
    """Prometheus answers (figures and KV health measured), goes away (every figure null, observed.time kept at the
    last measurement, MetricsAvailable False with the error, a Warning), comes back (figures return)."""
    ns = cluster.ns
    values = {"targets_up": 3.0, "ttft_p95": 0.42, "tpot_p95": 0.021, "goodput": 0.97, "kv_failure_rate": 0.0,
              "kv_transfer_p95": 0.035}
    window = max(parse_model(load_example("llama-70b-rdma")).spec.mode_policy.window_seconds, 2)  # as collect()
    answers = {render(n, ns, MODEL, window): v for n, v in values.items() if n in QUERIES}
    with fake_prometheus(answers) as prom:
        body = load_example("llama-70b-rdma")
        body["spec"]["autoscaling"]["prometheus"] = {"url": prom.url, "timeoutSeconds": 2}
        cluster.create_model(body)
        wait_for(lambda: (cluster.model(MODEL).get("status") or {}).get("observedGeneration") == 1, 30, "reconciled")
        clock = FakeClock()
        events: list[tuple[str, str, str]] = []
        scaler = Autoscaler(kube=operator.kube, emit=lambda _o, t, r, m: events.append((t, r, m)), clock=clock)

        scaler.tick(ns, MODEL)
        m = cluster.model(MODEL)
        observed = m["status"]["observed"]
        assert (observed["ttftP95Ms"], observed["goodput"], observed["kvTransferP95Ms"]) == (420.0, 0.97, 35.0)
        measured_at = observed["time"]
        conds = _conditions(m)
        assert conds["MetricsAvailable"]["status"] == "True"
        assert (conds["KVTransferHealthy"]["status"], conds["KVTransferHealthy"]["reason"]) == (
            "True", "TransfersSucceeding")

        prom.stop()  # Prometheus goes away
        clock.advance(30)
        scaler.tick(ns, MODEL)
        m = cluster.model(MODEL)
        observed = m["status"]["observed"]
        assert observed == {"time": measured_at}, observed  # every figure unknown; the time is the last measurement
        conds = _conditions(m)
        assert (conds["MetricsAvailable"]["status"], conds["MetricsAvailable"]["reason"]) == (
            "False", "PrometheusUnavailable")
        assert "failed" in conds["MetricsAvailable"]["message"]
        assert conds["KVTransferHealthy"]["status"] == "Unknown" and conds["SLOMet"]["status"] == "Unknown"
        assert [e for e in events if e[:2] == ("Warning", "MetricsUnavailable")]
        # the printer columns (TTFT-P95, TPOT-P95, Goodput) show nothing rather than the old figures
        table = kubectl("get", "dm", MODEL, "-n", ns, "-o", "json")
        assert table.returncode == 0 and "ttftP95Ms" not in json.loads(table.stdout)["status"]["observed"]

        # Prometheus comes back on the same address: figures return, and so does the condition
        with fake_prometheus(answers, port=prom.server.server_address[1]) as back:
            assert back.url == prom.url
            clock.advance(30)
            scaler.tick(ns, MODEL)
            m = cluster.model(MODEL)
            assert (m["status"]["observed"]["ttftP95Ms"], m["status"]["observed"]["goodput"]) == (420.0, 0.97)
            assert m["status"]["observed"]["time"] != measured_at
            assert _conditions(m)["MetricsAvailable"]["status"] == "True"
            assert _conditions(m)["KVTransferHealthy"]["status"] == "True"


def test_a_pool_the_namespace_pod_security_refuses_is_named_in_status(operator, cluster):
    """An RDMA pool needs privileged pods (IPC_LOCK); in a namespace enforcing baseline the apiserver refuses them
    and the ReplicaSet's FailedCreate is the only sign. The operator reads the namespace's label and says it in
    status (PodSecurity False naming the pools, the level they need and the namespace's) and in a Warning Event."""
    cluster.core.patch_namespace(cluster.ns, {"metadata": {"labels": {PSA_ENFORCE_LABEL: "baseline"}}})
    cluster.create_model(load_example("llama-70b-rdma"))
    cond = wait_for(lambda: _conditions(cluster.model(MODEL)).get("PodSecurity"), 30, "PodSecurity condition")
    assert (cond["status"], cond["reason"]) == ("False", "LevelNotAllowed"), cond
    for text in ("prefill needs privileged", "decode needs privileged", "enforces baseline", cluster.ns):
        assert text in cond["message"], cond["message"]
    assert "router" not in cond["message"]
    events = wait_for(lambda: [e for e in cluster.events(MODEL) if e.reason == "PodSecurityViolation"], 15,
                      "PodSecurityViolation event")
    assert events[0].type == "Warning" and "prefill needs privileged" in events[0].message
    # the claim holds: the apiserver does refuse the pool's pods in this namespace
    rs = wait_for(lambda: [r for r in cluster.apps.list_namespaced_replica_set(
        cluster.ns, label_selector=f"serving.disagg.dev/model={MODEL},serving.disagg.dev/role=prefill").items
        if any(c.type == "ReplicaFailure" for c in r.status.conditions or [])], 30, "ReplicaFailure on the RS")
    failure = next(c for c in rs[0].status.conditions if c.type == "ReplicaFailure")
    assert "PodSecurity" in failure.message


def test_a_namespace_that_allows_the_pools_reports_so(operator, cluster):
    cluster.core.patch_namespace(cluster.ns, {"metadata": {"labels": {PSA_ENFORCE_LABEL: "restricted"}}})
    cluster.create_model(load_example("llama-8b-nvlink"))
    cond = wait_for(lambda: _conditions(cluster.model("llama-8b")).get("PodSecurity"), 30, "PodSecurity condition")
    assert (cond["status"], cond["reason"]) == ("True", "LevelAllowed"), cond


def test_the_autoscaler_waits_for_the_reconcilers_first_status(control_plane, cluster):
    """The CRD defaults status.pools (desiredReplicas 0) as soon as any status is written. Were the autoscaler's tick
    the first writer, that default would read as a recorded decision and scale the pools to minReplicas. It waits
    until the reconciler has reported (status.observedGeneration)."""
    from disagg.controller.kubeio import Kube
    from disagg.kube import api_client

    with fake_prometheus({}) as prom:
        body = load_example("llama-70b-rdma")
        body["spec"]["autoscaling"]["prometheus"] = {"url": prom.url, "timeoutSeconds": 2}
        cluster.create_model(body)
        scaler = Autoscaler(kube=Kube(api_client(str(control_plane.kubeconfig))), emit=lambda *_: None,
                            clock=FakeClock())
        assert scaler.tick(cluster.ns, MODEL) is None
        assert "status" not in cluster.model(MODEL)


def test_a_steady_model_makes_no_status_writes(operator, control_plane, cluster):
    """At hundreds of models the daemons' ticks must not write when nothing changed (issue 17: zero writes in a
    quiet minute): a tick that measures the recorded figures again writes nothing; a changed figure is written at
    once, with its time."""
    from disagg.controller.kubeio import Kube
    from disagg.kube import api_client

    ns = cluster.ns
    values = {"targets_up": 3.0, "ttft_p95": 0.42, "tpot_p95": 0.021, "goodput": 0.97, "kv_failure_rate": 0.0,
              "kv_transfer_p95": 0.035}
    window = max(parse_model(load_example("llama-70b-rdma")).spec.mode_policy.window_seconds, 2)
    answers = {render(n, ns, MODEL, window): v for n, v in values.items() if n in QUERIES}
    with fake_prometheus(answers) as prom:
        body = load_example("llama-70b-rdma")
        body["spec"]["autoscaling"]["prometheus"] = {"url": prom.url, "timeoutSeconds": 2}
        cluster.create_model(body)
        wait_for(lambda: (cluster.model(MODEL).get("status") or {}).get("observedGeneration") == 1, 30, "reconciled")
        clock = FakeClock()
        kube = Kube(api_client(str(control_plane.kubeconfig)))  # its own write counter (the operator runs too)
        scaler = Autoscaler(kube=kube, emit=lambda *_: None, clock=clock)
        scaler.tick(ns, MODEL)
        first = cluster.model(MODEL)
        assert first["status"]["observed"]["ttftP95Ms"] == 420.0 and kube.writes >= 1

        clock.advance(30)
        writes = kube.writes
        scaler.tick(ns, MODEL)  # the same figures and conditions
        assert kube.writes == writes and scaler.skipped_writes == 1

        answers[render("ttft_p95", ns, MODEL, window)] = 0.5
        clock.advance(30)
        scaler.tick(ns, MODEL)
        moved = cluster.model(MODEL)["status"]["observed"]
        assert moved["ttftP95Ms"] == 500.0 and moved["time"] != first["status"]["observed"]["time"]

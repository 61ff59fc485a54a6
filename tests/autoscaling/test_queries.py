"""Every named query is valid PromQL on a real Prometheus and reads the series it names."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from tests.exporter import text_exporter

from disagg.api.models import DisaggregatedModelSpec
from disagg.autoscaling.observe import INCREASES
from disagg.autoscaling.queries import (
    LOAD_PREFIX,
    POD_LOAD,
    QUERIES,
    QueryFn,
    Sample,
    collect,
    connect,
    pod_load,
    render,
    selector,
)
from disagg.local.procs import free_ports
from disagg.local.prometheus import LocalPrometheus, Target
from disagg.poll import wait_for


@pytest.fixture(scope="module")
def prometheus():
    with LocalPrometheus() as prom:
        yield prom


def _api(prom: LocalPrometheus, q: str) -> dict:
    url = f"{prom.url}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        return json.load(e)


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_query_is_valid_promql(prometheus, name) -> None:
    out = _api(prometheus, render(name, "ns", "m", 60))
    assert out["status"] == "success", out


def collect_when(query: QueryFn, model: str, spec: DisaggregatedModelSpec, pred: Callable[[Sample], bool],
                 what: str) -> Sample:
    """collect() until ``pred`` holds for its sample: Prometheus scrapes a new target on its own schedule."""

    def sample_if_ready() -> Sample | None:
        sample = collect(query, "ns", model, spec)
        return sample if pred(sample) else None

    return wait_for(sample_if_ready, 30, what, interval=0.5)


def test_collect_reads_the_named_series(prometheus) -> None:
    spec = DisaggregatedModelSpec.model_validate({"model": {"name": "m"}})
    registry = CollectorRegistry()
    running = Gauge("vllm:num_requests_running", "running", ["model_name"], registry=registry)
    waiting = Gauge("vllm:num_requests_waiting", "waiting", ["model_name"], registry=registry)
    running.labels("m").set(7)
    waiting.labels("m").set(3)
    server = text_exporter(registry)
    port = server.server_address[1]
    try:
        base = {"namespace": "ns", "model": "m"}
        prometheus.set_targets([Target(f"127.0.0.1:{port}", {**base, "role": "decode"})])
        query = connect(prometheus.url)
        sample = collect_when(query, "m", spec, lambda s: s.get("decode_running_per_replica") is not None,
                              "the decode target to be scraped")
        assert sample.error is None
        assert sample.get("decode_running_per_replica") == 7
        assert sample.get("decode_active_sequences") == 7
        assert sample.get("prefill_waiting_per_replica") is None  # that target is a decode worker
        other = collect(query, "ns", "other-model", spec)
        assert other.error and "no scrape target" in other.error
    finally:
        server.shutdown()
        prometheus.set_targets([])


def pod_exporter(loads: dict[str, tuple[float, float]]) -> tuple[Any, list[Target]]:
    """One exporter per pod (as each engine is scraped: its own target, labelled with its pod name), serving
    ``{pod: (running, waiting)}``; returns the servers (to shut down) and their targets."""
    servers, targets = [], []
    for pod, (run, wait) in loads.items():
        registry = CollectorRegistry()
        Gauge("vllm:num_requests_running", "running", ["model_name"], registry=registry).labels("m").set(run)
        Gauge("vllm:num_requests_waiting", "waiting", ["model_name"], registry=registry).labels("m").set(wait)
        server = text_exporter(registry)
        servers.append(server)
        targets.append(Target(f"127.0.0.1:{server.server_address[1]}", {"pod": pod}))
    return servers, targets


def test_pod_load_is_each_pods_running_plus_waiting(prometheus) -> None:
    assert _api(prometheus, POD_LOAD.format(sel=selector("ns", "m"), role="decode"))["status"] == "success"
    servers, targets = pod_exporter({"d-0": (3, 2), "d-1": (0, 0), "p-0": (9, 9)})
    base = {"namespace": "ns", "model": "m"}
    labelled = [Target(t.address, {**base, **t.labels, "role": "prefill" if t.labels["pod"] == "p-0" else "decode"})
                for t in targets]
    try:
        prometheus.set_targets(labelled)
        query = connect(prometheus.url)

        def both_scraped() -> dict[str, float] | None:
            got = pod_load(query, "ns", "m", "decode")
            return got if len(got) == 2 else None

        load = wait_for(both_scraped, 30, "both decode pods scraped", interval=0.5)
        assert load == {"d-0": 5.0, "d-1": 0.0}  # the prefill pod is another pool's
        assert pod_load(query, "ns", "other", "decode") == {}
    finally:
        for server in servers:
            server.shutdown()
        prometheus.set_targets([])


@pytest.mark.parametrize("name", sorted(INCREASES))
def test_predictive_increment_is_valid_promql(prometheus, name) -> None:
    out = _api(prometheus, INCREASES[name].format(sel=selector("ns", "m"), w="30s"))
    assert out["status"] == "success", out


def test_a_predictive_model_collects_its_increments(prometheus) -> None:
    """With policy Predictive the sample carries every increment over intervalSeconds (autoscaling/observe.py);
    a proportional model's sample has none (no extra queries). Its own model name: the module's Prometheus still
    holds the other tests' series of model m within the averaging window."""
    registry = CollectorRegistry()
    routed = Histogram("disagg_routed_prompt_tokens", "routed", ["pool"], registry=registry)
    Gauge("vllm:num_requests_running", "running", registry=registry).set(4)
    server = text_exporter(registry)
    autoscaling: dict[str, Any] = {"enabled": True, "prometheus": {"url": "http://p"}, "intervalSeconds": 10}
    base = {"model": {"name": "m"}, "autoscaling": autoscaling}
    try:
        prometheus.set_targets([Target(f"127.0.0.1:{server.server_address[1]}",
                                       {"namespace": "ns", "model": "pm", "role": "decode"})])
        query = connect(prometheus.url)
        predictive = DisaggregatedModelSpec.model_validate({**base, "autoscaling": {**autoscaling,
                                                                                    "policy": "Predictive"}})

        def counted() -> Sample | None:
            routed.labels("prefill").observe(8000)
            sample = collect(query, "ns", "pm", predictive)
            return sample if (sample.get(LOAD_PREFIX + "routed:prefill_count") or 0) > 0 else None

        sample = wait_for(counted, 30, "routed requests counted in the interval", interval=0.5)
        assert sample.error is None
        assert set(INCREASES) <= {k.removeprefix(LOAD_PREFIX) for k in sample.values if k.startswith(LOAD_PREFIX)}
        assert sample.get(LOAD_PREFIX + "decode:vllm:num_requests_running") == 4
        proportional = collect(query, "ns", "pm", DisaggregatedModelSpec.model_validate(base))
        assert not any(k.startswith(LOAD_PREFIX) for k in proportional.values)
    finally:
        server.shutdown()
        prometheus.set_targets([])


def test_unreachable_prometheus_is_an_error_not_a_zero() -> None:
    (port,) = free_ports(1)
    spec = DisaggregatedModelSpec.model_validate({"model": {"name": "m"}})
    sample = collect(connect(f"http://127.0.0.1:{port}", timeout_seconds=1), "ns", "m", spec)
    assert sample.error and "failed" in sample.error


def _kv_counters() -> tuple[CollectorRegistry, Any, Any, Any]:
    """The router's fallbacks and remote decisions and the decode engine's failed NIXL transfers, in one registry:
    one exporter (labelled role=decode, which only the vllm: series are selected by) makes one scrape see every
    increase at once, so the ratio of their rates is exact."""
    registry = CollectorRegistry()
    return (registry, Counter("disagg_fallbacks", "fallbacks", ["cause"], registry=registry),
            Counter("disagg_routing_decisions", "decisions", ["decision"], registry=registry),
            Counter("vllm:nixl_num_failed_transfers", "failed", registry=registry))


def test_kv_failure_rate_counts_transport_causes_only(prometheus) -> None:
    """Capacity is not a transport fault: prefill-leg fallbacks (queueing, worker errors: cause prefill_*) leave
    the mode controller's failure rate at 0; KV-transport fallbacks (cause kv_*) raise it."""
    spec = DisaggregatedModelSpec.model_validate({"model": {"name": "m"}})
    registry, fallbacks, decisions, failed = _kv_counters()
    for cause in ("prefill_queue_timeout", "kv_load_failed", "kv_transfer_timeout"):
        fallbacks.labels(cause).inc(0)
    decisions.labels("remote").inc(0)
    server = text_exporter(registry)
    try:
        prometheus.set_targets([Target(f"127.0.0.1:{server.server_address[1]}",
                                       {"namespace": "ns", "model": "kv", "role": "decode"})])
        query = connect(prometheus.url)

        # this exporter's own series must be in Prometheus (at 0) before they increase, or no rate can be seen
        series = 'disagg_routing_decisions_total{namespace="ns",model="kv"}'
        wait_for(lambda: _api(prometheus, series)["data"]["result"], 30, "the exporter to be scraped", interval=0.5)
        decisions.labels("remote").inc(100)
        fallbacks.labels("prefill_queue_timeout").inc(50)  # half the remote requests queued past the timeout
        sample = collect_when(query, "kv", spec, lambda s: s.get("kv_failure_rate") is not None, "a failure rate")
        assert sample.get("kv_failure_rate") == 0.0

        # 10 failed loads the decode engine counted (and, under kv_load_failure_policy=fail, the router saw as
        # kv_load_failed: not counted twice), 10 transfer timeouts only the router saw
        failed.inc(10)
        fallbacks.labels("kv_load_failed").inc(10)
        fallbacks.labels("kv_transfer_timeout").inc(10)
        sample = collect_when(query, "kv", spec, lambda s: (s.get("kv_failure_rate") or 0) > 0,
                              "transport failures to count")
        rate = sample.get("kv_failure_rate")
        assert rate is not None and 0 < rate <= 0.2 + 1e-9  # 20 of 100 remote attempts, never the 50 queued
    finally:
        server.shutdown()
        prometheus.set_targets([])


def test_kv_failure_rate_sees_loads_the_decode_recomputed(prometheus) -> None:
    """Under kv_load_failure_policy=recompute a failed KV load is answered 200 (the decode recomputes): the
    router records no fallback, and only the decode engine's vllm:nixl_num_failed_transfers_total tells."""
    spec = DisaggregatedModelSpec.model_validate({"model": {"name": "m"}})
    registry, fallbacks, decisions, failed = _kv_counters()
    fallbacks.labels("kv_transfer_timeout").inc(0)
    decisions.labels("remote").inc(0)
    server = text_exporter(registry)
    try:
        prometheus.set_targets([Target(f"127.0.0.1:{server.server_address[1]}",
                                       {"namespace": "ns", "model": "rc", "role": "decode"})])
        query = connect(prometheus.url)
        series = 'vllm:nixl_num_failed_transfers_total{namespace="ns",model="rc"}'
        wait_for(lambda: _api(prometheus, series)["data"]["result"], 30, "the exporter to be scraped", interval=0.5)
        decisions.labels("remote").inc(100)
        failed.inc(30)
        sample = collect_when(query, "rc", spec, lambda s: (s.get("kv_failure_rate") or 0) > 0,
                              "recomputed loads to count")
        rate = sample.get("kv_failure_rate")
        assert rate is not None and 0.2 < rate <= 0.3 + 1e-9  # 30 of 100: above the default 20 % limit
    finally:
        server.shutdown()
        prometheus.set_targets([])

"""Tracing in the router, in process (fast): no spans and no traceparent when off; a W3C traceparent per leg, one
trace for both legs, when on; a bad endpoint or sampling ratio never fails a request (a count and a log line);
per-request phases from the worker's own metrics are exact, the rest marked estimated. The Jaeger end-to-end test
is test_tracing_e2e.py; the operator's wiring is checked at the end (builders → flags and environment)."""

from __future__ import annotations

import json
import re
from typing import Any

from disagg import tracing
from disagg.api.contract import RouterConfig
from disagg.api.models import DisaggregatedModel
from disagg.builders.router import router_deployment
from disagg.builders.settings import BuildSettings
from disagg.builders.workers import worker_args, worker_deployment
from disagg.local.procs import free_port
from disagg.poll import until

LONG = "The quick brown fox jumps over the lazy dog. " * 400
TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-0[0-3]$")


def closed_endpoint() -> str:
    """An OTLP URL on a loopback port nobody listens on: every export fails."""
    return f"http://127.0.0.1:{free_port()}/v1/traces"


async def test_tracing_off_sends_no_traceparent(fake_workers, router_factory):
    p, d = await fake_workers("prefill"), await fake_workers("decode")
    r = await router_factory([p.url], [d.url])
    assert r.router.tracing is None and r.router.upstream.tracing is None
    status, _ = await r.post("/v1/completions", {"model": "m", "prompt": LONG, "max_tokens": 200},
                             {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    assert status == 200
    # the client's header is not forwarded either: the legs carry only what the router adds
    assert "traceparent" not in p.requests[0]["headers"] and "traceparent" not in d.requests[0]["headers"]


async def test_both_legs_carry_one_trace_and_a_bad_endpoint_fails_no_request(fake_workers, router_factory, metric):
    p, d = await fake_workers("prefill"), await fake_workers("decode")
    r = await router_factory([p.url], [d.url], otlp_traces_endpoint=closed_endpoint(), trace_sample_ratio=1.0)
    assert r.router.tracing is not None
    client_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    for stream in (False, True):
        status, body = await r.post("/v1/completions", {"model": "m", "prompt": f"{stream} {LONG}",
                                                        "max_tokens": 200, "stream": stream},
                                    {"traceparent": f"00-{client_trace}-00f067aa0ba902b7-01",
                                     "tracestate": "vendor=abc"})
        assert status == 200, body
    for i in range(2):
        pm = TRACEPARENT.match(p.requests[i]["headers"]["traceparent"])
        dm = TRACEPARENT.match(d.requests[i]["headers"]["traceparent"])
        assert pm and dm
        # the client's trace continues through the router into both workers; each leg is its own span
        assert pm.group(1) == dm.group(1) == client_trace
        assert pm.group(2) != dm.group(2) and "00f067aa0ba902b7" not in (pm.group(2), dm.group(2))
        assert p.requests[i]["headers"]["tracestate"] == d.requests[i]["headers"]["tracestate"] == "vendor=abc"
    # the endpoint refuses: counted and logged, and both requests above were served
    async def export_failed() -> bool:
        return metric(await r.metrics(), "disagg_tracing_errors_total", reason="export_failed") >= 1

    await until(export_failed, 20, "a failed export counted")


async def test_unsampled_requests_propagate_the_decision(fake_workers, router_factory):
    p, d = await fake_workers("prefill"), await fake_workers("decode")
    r = await router_factory([p.url], [d.url], otlp_traces_endpoint=closed_endpoint(), trace_sample_ratio=0.0)
    status, _ = await r.post("/v1/completions", {"model": "m", "prompt": LONG, "max_tokens": 200})
    assert status == 200
    m = TRACEPARENT.match(d.requests[0]["headers"]["traceparent"])
    assert m and int(d.requests[0]["headers"]["traceparent"][-2:], 16) & 1 == 0  # not sampled: workers skip it too


async def test_bad_sampling_ratio_falls_back_with_a_count(fake_workers, router_factory, metric):
    p, d = await fake_workers("prefill"), await fake_workers("decode")
    r = await router_factory([p.url], [d.url], otlp_traces_endpoint=closed_endpoint(), trace_sample_ratio="1.5")
    assert r.router.tracing is not None and r.router.tracing.sample_ratio == tracing.DEFAULT_SAMPLE_RATIO
    status, _ = await r.post("/v1/completions", {"model": "m", "prompt": LONG, "max_tokens": 200})
    assert status == 200
    m = await r.metrics()
    assert metric(m, "disagg_tracing_errors_total", reason="invalid_sample_ratio") == 1
    for bad in ("abc", "-0.1", "nan"):
        assert tracing.parse_sample_ratio(bad) == tracing.DEFAULT_SAMPLE_RATIO
    assert tracing.parse_sample_ratio("0") == 0.0 and tracing.parse_sample_ratio("1") == 1.0


async def test_per_request_worker_metrics_are_exact_averages_estimated(fake_workers, router_factory, metric):
    """The prefill worker's per-request metrics (vLLM --enable-per-request-metrics) give exact prefill phases; the
    KV phases still come from averages and are counted as estimated."""
    p = await fake_workers("prefill", request_metrics={"queue_time_ms": 4.0, "time_to_first_token_ms": 6.0})
    d = await fake_workers("decode")
    r = await router_factory([p.url], [d.url])
    status, _ = await r.post("/v1/completions", {"model": "m", "prompt": LONG, "max_tokens": 200})
    assert status == 200
    m = await r.metrics()
    assert metric(m, "disagg_prefill_compute_seconds_sum", path="remote") == 0.006
    assert metric(m, "disagg_phase_estimated_total", phase="prefill_compute") == 0
    # without them: the leg minus the worker's average queue time, estimated
    p2 = await fake_workers("prefill")
    r2 = await router_factory([p2.url], [d.url])
    status, _ = await r2.post("/v1/completions", {"model": "m", "prompt": LONG, "max_tokens": 200})
    assert status == 200
    m2 = await r2.metrics()
    assert metric(m2, "disagg_prefill_compute_seconds_count", path="remote") == 1
    assert metric(m2, "disagg_phase_estimated_total", phase="prefill_compute") == 1


# ------------------------------------------------------------------------------------------ operator wiring

SPEC: dict[str, Any] = {"apiVersion": "serving.disagg.dev/v1alpha1", "kind": "DisaggregatedModel",
        "metadata": {"name": "chat", "namespace": "ml"},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}}}


def test_builders_render_tracing_into_workers_and_router() -> None:
    url = "http://jaeger-collector.observability:4318/v1/traces"
    dm = DisaggregatedModel.model_validate(
        {**SPEC, "spec": {**SPEC["spec"], "observability": {"tracing": {"endpoint": url, "samplingRatio": 0.25}}}})
    for role in ("prefill", "decode"):
        args = worker_args(dm, role)
        assert args[args.index("--otlp-traces-endpoint") + 1] == url
        env = {e["name"]: e.get("value") for e in
               worker_deployment(dm, role)["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env[tracing.PROTOCOL_ENV] == "http/protobuf" and env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == url
        assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio" and env["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
        assert env["OTEL_SERVICE_NAME"].endswith(role)
    cmd = router_deployment(dm, BuildSettings())["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--otlp-traces-endpoint") + 1] == url and cmd[cmd.index("--trace-sample-ratio") + 1] == "0.25"
    # off: nothing rendered
    plain = DisaggregatedModel.model_validate(SPEC)
    assert "--otlp-traces-endpoint" not in worker_args(plain, "decode")
    assert "--otlp-traces-endpoint" not in router_deployment(plain, BuildSettings())["spec"]["template"]["spec"][
        "containers"][0]["command"]


def test_cluster_default_applies_only_where_the_model_says_nothing() -> None:
    from disagg.builders.tracing import with_default_tracing

    plain = DisaggregatedModel.model_validate(SPEC)
    url = "http://tempo-distributor.observability:4318/v1/traces"
    dm = with_default_tracing(plain, url, 0.5)
    assert plain.spec.observability.tracing is None  # a copy
    assert dm.spec.observability.tracing is not None and dm.spec.observability.tracing.endpoint == url
    assert "--otlp-traces-endpoint" in worker_args(dm, "prefill")
    own = with_default_tracing(dm, "http://other:4318/v1/traces", 1.0)
    assert own.spec.observability.tracing == dm.spec.observability.tracing  # the model's own setting wins
    assert with_default_tracing(plain, "", 0.5) is plain  # no default: unchanged


def test_tracing_spec_errors_name_the_field() -> None:
    import pydantic
    import pytest

    for bad, field in (({"endpoint": "http://jaeger:4318"}, "endpoint"),
                       ({"endpoint": "jaeger:4318/v1/traces"}, "endpoint"),
                       ({"endpoint": "http://j:4318/v1/traces", "samplingRatio": 1.5}, "samplingRatio"),
                       ({"endpoint": "http://j:4318/v1/traces", "samplingRatio": -0.1}, "samplingRatio")):
        with pytest.raises(pydantic.ValidationError) as e:
            DisaggregatedModel.model_validate(
                {**SPEC, "spec": {**SPEC["spec"], "observability": {"tracing": bad}}})
        assert f"observability.tracing.{field}" in str(e.value), str(e.value)


def test_router_config_unchanged_by_tracing() -> None:
    """Tracing is a process flag, not part of the hot-reloaded RouterConfig: changing it rolls the router pods."""
    assert "tracing" not in json.dumps(RouterConfig().to_api())

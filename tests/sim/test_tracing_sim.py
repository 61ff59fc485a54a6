"""The twin's traces, read back from a real Jaeger: vLLM 0.33.0's ``llm_request`` span with its attribute names,
sampled as vLLM's SDK set-up samples (no sampler of its own: ParentBased(ALWAYS_ON), or OTEL_TRACES_SAMPLER), and
parented on the request's W3C ``traceparent``. The router-and-both-workers trace is tests/router/test_tracing_e2e.py.
"""

from __future__ import annotations

import json
import secrets
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from disagg import tracing
from disagg.local.jaeger import LocalJaeger, parent_id, spans_by_name
from disagg.local.procs import Processes
from disagg.perf.presets import DEFAULT_GPU
from disagg.perf.roofline import PerfModel
from disagg.poll import wait_for

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def jaeger() -> Iterator[LocalJaeger]:
    with LocalJaeger() as j:
        yield j


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    with Processes(tmp_path_factory.mktemp("sim-tracing")) as p:
        yield p


def sim(procs: Processes, jaeger: LocalJaeger, service: str, **env: str) -> Any:
    base = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": jaeger.otlp_endpoint, "OTEL_SERVICE_NAME": service,
            tracing.PROTOCOL_ENV: tracing.PROTOCOL}
    return procs.sim("aggregated", time_scale=1.0, gpu=None, model_preset=None, env={**base, **env},
                     extra=["--otlp-traces-endpoint", jaeger.otlp_endpoint], wait=True)


def complete(url: str, headers: dict[str, str], max_tokens: int = 8) -> dict[str, Any]:
    body = json.dumps({"model": MODEL, "prompt": "tell me a story " * 20, "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(req, timeout=60) as r:
        out: dict[str, Any] = json.load(r)
        return out


def test_llm_request_span_has_vllm_attributes_and_parent(procs: Processes, jaeger: LocalJaeger) -> None:
    s = sim(procs, jaeger, "twin-default")
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    out = complete(s.url, {"traceparent": f"00-{trace_id}-{parent}-01", "X-Request-Id": "req-span-1"}, 8)
    spans = spans_by_name(jaeger.wait_trace(trace_id, 1))
    (span,) = spans[tracing.LLM_REQUEST_SPAN]
    assert span["service"] == "twin-default" and parent_id(span) == parent
    t = span["tag"]
    assert t[tracing.ATTR_COMPLETION_TOKENS] == out["usage"]["completion_tokens"] == 8
    assert t[tracing.ATTR_PROMPT_TOKENS] == out["usage"]["prompt_tokens"]
    assert t[tracing.ATTR_MAX_TOKENS] == 8 and t[tracing.ATTR_N] == 1
    assert t[tracing.ATTR_REQUEST_ID].startswith("cmpl-req-span-1")
    # vLLM's definitions (v1/engine/output_processor.py do_tracing, 0.32.0): TTFT counts from when the API server
    # took the request, queue time from when the engine core added it (scheduled − queued), so TTFT is queue +
    # prefill + the API server's share (its sleep, on this wall clock a little longer; and any wait for a step in
    # flight: none here); prefill + decode = inference; the span lasts the request's e2e
    api_share = PerfModel.from_names(DEFAULT_GPU).request_overhead_s
    beside = t[tracing.ATTR_TTFT] - t[tracing.ATTR_QUEUE] - t[tracing.ATTR_PREFILL]
    assert api_share - 1e-6 <= beside < api_share + 0.05
    assert t[tracing.ATTR_PREFILL] + t[tracing.ATTR_DECODE] == pytest.approx(t[tracing.ATTR_INFERENCE], abs=1e-6)
    assert span["duration"] == pytest.approx(t[tracing.ATTR_E2E] * 1e6, abs=1000)
    assert t[tracing.ATTR_DECODE] > 0 and t[tracing.ATTR_TTFT] > 0
    # a request without trace headers is a trace of its own (vLLM's default sampler keeps every root)
    complete(s.url, {"X-Request-Id": "req-span-root"})
    roots = wait_for(lambda: [tr for tr in jaeger.traces("twin-default")
                              if any(sp["operationName"] == tracing.LLM_REQUEST_SPAN and not sp.get("references")
                                     for sp in tr["spans"])], 30, "a root llm_request span")
    assert roots


def test_parent_based_ratio_follows_the_callers_decision(procs: Processes, jaeger: LocalJaeger) -> None:
    """OTEL_TRACES_SAMPLER=parentbased_traceidratio with ratio 0 (what the operator renders with samplingRatio 0):
    a request the router sampled is traced, one it did not sample and one without a parent are not."""
    s = sim(procs, jaeger, "twin-ratio0", OTEL_TRACES_SAMPLER="parentbased_traceidratio",
            OTEL_TRACES_SAMPLER_ARG="0")
    unsampled, sampled = secrets.token_hex(16), secrets.token_hex(16)
    complete(s.url, {"traceparent": f"00-{unsampled}-{secrets.token_hex(8)}-00"})
    complete(s.url, {})
    complete(s.url, {"traceparent": f"00-{sampled}-{secrets.token_hex(8)}-01"})
    jaeger.wait_trace(sampled, 1)
    # the three requests were finished in this order and exported by one batch processor: once the last is in
    # Jaeger, anything the first two had exported would be too
    assert {tr["traceID"] for tr in jaeger.traces("twin-ratio0")} == {sampled}

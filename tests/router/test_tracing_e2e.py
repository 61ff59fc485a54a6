"""Traces end to end on real processes: a `disagg router` and P/D `disagg sim` workers exporting OTLP/HTTP to a real
Jaeger (hack/build-jaeger.sh; in-memory, loopback). Read back through Jaeger's query API, one trace holds the
router's span, its prefill-leg and decode-leg spans, both workers' vLLM-shaped ``llm_request`` spans and the
decode worker's KV pull, each inside its parent, and the phases add up to the TTFT the router measured.

Tolerances (stated once): span times are exported in nanoseconds and stored by Jaeger in microseconds, and the sims
convert simulated instants to wall time (``time.time_ns`` against the monotonic clock): a child may start or end up
to ``NEST_TOL_US`` outside its parent. The router's phases (request queue + prefill leg + decode leg to first
byte) must add up to its TTFT within ``SUM_TOL_MS`` (the time between the legs and the relay of the first byte).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
import yaml

from disagg import tracing
from disagg.demo.report import slowest_traced_request
from disagg.load.loadgen import Result, summarise
from disagg.local.harness import PhaseResult
from disagg.local.jaeger import LocalJaeger, parent_id, spans_by_name, waterfall
from disagg.local.procs import Processes, free_port
from disagg.perf.presets import DEFAULT_GPU
from disagg.perf.roofline import PerfModel
from disagg.poll import until, wait_for

from .conftest import ROUTER_ARGS, metric_value

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
NEST_TOL_US = 2000
SUM_TOL_MS = 5.0
TIME_SCALE = 1.0  # wall = simulated time: the workers' gen_ai.* latencies compare directly with the router's


def prompt(words: int = 3000) -> str:
    return f"[{secrets.token_hex(8)}] " + " ".join(f"word{i % 97}" for i in range(words))


@pytest.fixture(scope="module")
def jaeger() -> Iterator[LocalJaeger]:
    with LocalJaeger() as j:
        yield j


def traced_sim(procs: Processes, role: str, endpoint: str) -> Any:
    """A sim with vLLM's tracing flag; the environment carries what the operator renders for vLLM (protocol,
    service name) and the endpoint for a sim whose argument table does not declare the flag yet."""
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint, tracing.PROTOCOL_ENV: tracing.PROTOCOL,
           "OTEL_SERVICE_NAME": f"sim-{role}"}
    return procs.sim(role, time_scale=TIME_SCALE, gpu=None, model_preset=None, env=env,
                     extra=["--otlp-traces-endpoint", endpoint], wait=True)


@pytest.fixture(scope="module")
def stack(processes: Processes, jaeger: LocalJaeger, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    conf = tmp_path_factory.mktemp("tracing") / "router.yaml"
    conf.write_text(yaml.safe_dump({"model": MODEL, "mode": "Auto", "transferTimeoutMs": 20000}))
    p = traced_sim(processes, "prefill", jaeger.otlp_endpoint)
    d = traced_sim(processes, "decode", jaeger.otlp_endpoint)
    r = processes.router(conf, prefill=[p.url], decode=[d.url], wait=True, extra=[
        *ROUTER_ARGS, "--otlp-traces-endpoint", jaeger.otlp_endpoint, "--trace-sample-ratio", "1"])
    return {"prefill": p, "decode": d, "router": r, "config": conf}


async def post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
        return r.status, dict(r.headers), await r.read()


def inside(child: dict[str, Any], parent: dict[str, Any]) -> bool:
    return (child["startTime"] >= parent["startTime"] - NEST_TOL_US
            and child["startTime"] + child["duration"] <= parent["startTime"] + parent["duration"] + NEST_TOL_US)


async def test_one_trace_router_legs_and_both_workers(stack: dict[str, Any], jaeger: LocalJaeger) -> None:
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt()}], "max_tokens": 128, "stream": True}
    status, headers, out = await post(stack["router"].url, body, {"traceparent": f"00-{trace_id}-{client_span}-01"})
    assert status == 200 and b"[DONE]" in out, out[-300:]
    assert headers["X-Disagg-Path"] == "remote", headers

    # router_request, prefill_leg, decode_leg, 2 × llm_request, disagg.sim.kv_pull
    trace = jaeger.wait_trace(trace_id, min_spans=6, timeout=30)
    spans = spans_by_name(trace)
    (root,) = spans[tracing.ROUTER_SPAN]
    (pleg,) = spans[tracing.PREFILL_LEG_SPAN]
    (dleg,) = spans[tracing.DECODE_LEG_SPAN]
    by_service = {s["service"]: s for s in spans[tracing.LLM_REQUEST_SPAN]}
    pspan, dspan = by_service["sim-prefill"], by_service["sim-decode"]
    (pull,) = spans[tracing.SIM_KV_PULL_SPAN]

    # the tree: client → router → legs → the workers' vLLM spans → the KV pull
    assert parent_id(root) == client_span
    assert parent_id(pleg) == parent_id(dleg) == root["spanID"]
    assert parent_id(pspan) == pleg["spanID"] and parent_id(dspan) == dleg["spanID"]
    assert parent_id(pull) == dspan["spanID"]
    for child, parent in ((pleg, root), (dleg, root), (pspan, pleg), (dspan, dleg), (pull, dspan)):
        assert inside(child, parent), (child["operationName"], parent["operationName"], child, parent)
    assert pleg["startTime"] + pleg["duration"] <= dleg["startTime"] + NEST_TOL_US  # prefill, then decode

    # the router span says what happened; the workers' spans carry vLLM 0.33.0's attribute names
    rt = root["tag"]
    assert rt["disagg.decision"] == "remote" and rt["disagg.path"] == "remote" and rt["disagg.outcome"] == "ok"
    assert rt["disagg.tenant"] == "default" and rt["disagg.reason"]
    for span in (pspan, dspan):
        for attr in (tracing.ATTR_TTFT, tracing.ATTR_E2E, tracing.ATTR_QUEUE, tracing.ATTR_PREFILL,
                     tracing.ATTR_DECODE, tracing.ATTR_INFERENCE, tracing.ATTR_PROMPT_TOKENS,
                     tracing.ATTR_COMPLETION_TOKENS, tracing.ATTR_REQUEST_ID):
            assert attr in span["tag"], (span["service"], attr, span["tag"])
    assert pspan["tag"][tracing.ATTR_COMPLETION_TOKENS] == 1  # the prefill leg: max_tokens 1
    assert dspan["tag"][tracing.ATTR_COMPLETION_TOKENS] == 128
    assert rt["disagg.upstream_request_id"] in dspan["tag"][tracing.ATTR_REQUEST_ID]

    # phases add up: router queue + prefill leg + decode leg to first byte = TTFT (router's own clock)
    ttft = rt["disagg.timing.ttft_ms"]
    parts = rt["disagg.timing.request_queue_ms"] + rt["disagg.timing.prefill_leg_ms"] + \
        rt["disagg.timing.decode_ttfb_ms"]
    assert abs(ttft - parts) <= SUM_TOL_MS, (ttft, parts, rt)
    # inside each leg, the worker's own time: the prefill worker's whole request, the decode worker's time to first
    # token (its queue holds the KV pull, as vLLM's does: WAITING_FOR_REMOTE_KVS has no SCHEDULED event)
    assert pspan["tag"][tracing.ATTR_E2E] * 1000 <= rt["disagg.timing.prefill_leg_ms"] + NEST_TOL_US / 1000
    assert dspan["tag"][tracing.ATTR_TTFT] * 1000 <= rt["disagg.timing.decode_ttfb_ms"] + NEST_TOL_US / 1000
    assert dspan["tag"][tracing.ATTR_QUEUE] * 1e6 >= pull["duration"] - NEST_TOL_US
    # vLLM's TTFT counts from its API server, its queue time from the step boundary after the request reached the
    # engine core (sim/scheduler.py Request.received / queued): TTFT = queue + prefill + the API server's share + the
    # wait for a step in flight, which is shorter than the prefill leg
    beside = pspan["tag"][tracing.ATTR_TTFT] - pspan["tag"][tracing.ATTR_QUEUE] - pspan["tag"][tracing.ATTR_PREFILL]
    assert PerfModel.from_names(DEFAULT_GPU).request_overhead_s - 1e-3 <= beside <= pspan["tag"][tracing.ATTR_TTFT]


async def test_log_line_links_the_trace_and_marks_estimates(stack: dict[str, Any], jaeger: LocalJaeger) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt()}], "max_tokens": 128}
    rid = f"trace-log-{secrets.token_hex(4)}"
    status, headers, _ = await post(stack["router"].url, body, {"X-Request-Id": rid})
    assert status == 200 and headers["X-Disagg-Path"] == "remote"

    def line() -> dict[str, Any] | None:
        for raw in stack["router"].log_tail(200_000).splitlines():
            if rid in raw and raw.startswith("{"):
                rec = json.loads(raw)
                if rec.get("event") == "request" and rec.get("request_id") == rid:
                    return rec
        return None

    rec = wait_for(line, 10, f"the request line of {rid}")
    assert rec["trace_id"] and len(rec["trace_id"]) == 32  # sampled at ratio 1: the line links to its trace
    # the prefill worker (no --enable-per-request-metrics) gave no per-request numbers: its phases are estimated
    assert "prefill_compute" in rec["estimated"]
    trace = jaeger.wait_trace(rec["trace_id"], min_spans=5, timeout=30)
    assert tracing.ROUTER_SPAN in spans_by_name(trace)

    # the demo report's link: the slowest traced request of a run → its trace page
    fast = Result(id="not-traced", cls="chat", tenant="default", input_tokens=10, ttft_s=9.0)  # no log line
    slow = Result(id=rid, cls="chat", tenant="default", input_tokens=10, ttft_s=0.5, path="remote")
    runs = [PhaseResult("phase", [fast, slow], summarise([fast, slow], 2000, 100))]
    line_ = slowest_traced_request(runs, stack["router"].log_tail(200_000), jaeger.trace_url)
    assert line_ == f"slowest request {rid}: TTFT 500 ms, path remote, trace {jaeger.trace_url(rec['trace_id'])}"
    lines = waterfall(trace)
    assert len(lines) == len(trace["spans"]) and tracing.ROUTER_SPAN in lines[0] and "decision=remote" in lines[0]
    assert any(tracing.LLM_REQUEST_SPAN in ln and "time_in_queue=" in ln for ln in lines)


async def test_unreachable_endpoint_and_bad_ratio_never_fail_a_request(stack: dict[str, Any],
                                                                       processes: Processes) -> None:
    """A router whose collector is gone, and one with a sampling ratio out of range: every request is served,
    each problem is one log line and a count in disagg_tracing_errors_total."""
    dead = f"http://127.0.0.1:{free_port()}/v1/traces"
    routers = {
        "export_failed": processes.router(stack["config"], prefill=[stack["prefill"].url],
                                          decode=[stack["decode"].url], wait=True, extra=[
                                              *ROUTER_ARGS, "--otlp-traces-endpoint", dead,
                                              "--trace-sample-ratio", "1"]),
        "invalid_sample_ratio": processes.router(stack["config"], prefill=[stack["prefill"].url],
                                                 decode=[stack["decode"].url], wait=True, extra=[
                                                     *ROUTER_ARGS, "--otlp-traces-endpoint", dead,
                                                     "--trace-sample-ratio", "2.5"]),
    }
    for reason, r in routers.items():
        for _ in range(3):
            body = {"model": MODEL, "messages": [{"role": "user", "content": prompt(800)}], "max_tokens": 8}
            status, _, out = await post(r.url, body, {})
            assert status == 200, (reason, out)

        async def counted(r: Any = r, reason: str = reason) -> bool:
            async with aiohttp.ClientSession() as s, s.get(r.url + "/metrics") as m:
                return metric_value(await m.text(), "disagg_tracing_errors_total", reason=reason) >= 1

        await until(counted, 30, f"disagg_tracing_errors_total{{reason={reason}}}")
        event = "tracing_export_failed" if reason == "export_failed" else "tracing_config_invalid"
        assert event in r.log_tail(200_000), r.log_tail()
    assert "--trace-sample-ratio" in routers["invalid_sample_ratio"].log_tail(200_000)
    assert os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") is None  # nothing leaked into the test process

"""An OTLP/gRPC collector as users have it (issue 31): ``spec.observability.tracing.endpoint:
http://<collector>:4317``, no path, the protocol inferred as grpc. What the operator renders for it — the worker's
``--otlp-traces-endpoint`` with OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc, the router's flag with the same variable —
run as processes, exporting over gRPC to a real Jaeger's OTLP/gRPC receiver: one trace holds the router's span and
the worker's vLLM-shaped span."""

from __future__ import annotations

import json
import secrets
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from disagg import tracing
from disagg.api.models import DisaggregatedModel
from disagg.builders.router import router_deployment
from disagg.builders.settings import BuildSettings
from disagg.builders.workers import worker_args
from disagg.local.jaeger import LocalJaeger, spans_by_name
from disagg.local.procs import Processes

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def jaeger() -> Iterator[LocalJaeger]:
    with LocalJaeger() as j:
        yield j


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    with Processes(tmp_path_factory.mktemp("grpc-tracing")) as p:
        yield p


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_router_and_worker_export_over_grpc_to_one_collector(procs: Processes, jaeger: LocalJaeger,
                                                             tmp_path: Any) -> None:
    endpoint = jaeger.otlp_grpc_endpoint
    assert endpoint.startswith("http://") and endpoint.count("/") == 2  # host:port, no path
    dm = DisaggregatedModel.model_validate({
        "metadata": {"name": "m", "namespace": "ns"},
        "spec": {"model": {"name": MODEL}, "observability": {"tracing": {"endpoint": endpoint,
                                                                            "samplingRatio": 1}}}})
    # what the operator renders for the two processes
    args = worker_args(dm, "decode")
    router = router_deployment(dm, BuildSettings())["spec"]["template"]["spec"]["containers"][0]
    assert _env(router)[tracing.PROTOCOL_ENV] == "grpc"
    cmd = router["command"]
    router_flags = ["--otlp-traces-endpoint", cmd[cmd.index("--otlp-traces-endpoint") + 1],
                    "--trace-sample-ratio", cmd[cmd.index("--trace-sample-ratio") + 1]]
    worker = procs.sim("decode", time_scale=1.0, gpu=None, model_preset=None, wait=True,
                       env={tracing.PROTOCOL_ENV: "grpc", "OTEL_SERVICE_NAME": "sim-grpc"},
                       extra=["--otlp-traces-endpoint", args[args.index("--otlp-traces-endpoint") + 1]])
    conf = tmp_path / "router.yaml"
    conf.write_text(yaml.safe_dump({"model": MODEL, "mode": "Auto"}))
    r = procs.router(conf, decode=[worker.url], wait=True, extra=router_flags,
                     env={tracing.PROTOCOL_ENV: _env(router)[tracing.PROTOCOL_ENV]})
    trace_id = secrets.token_hex(16)
    body = json.dumps({"model": MODEL, "prompt": "hello " * 20, "max_tokens": 4}).encode()
    req = urllib.request.Request(r.url + "/v1/completions", data=body, method="POST", headers={
        "Content-Type": "application/json", "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
    spans = spans_by_name(jaeger.wait_trace(trace_id, 2))
    assert tracing.ROUTER_SPAN in spans and tracing.LLM_REQUEST_SPAN in spans, sorted(spans)
    assert {s["service"] for s in spans[tracing.LLM_REQUEST_SPAN]} == {"sim-grpc"}

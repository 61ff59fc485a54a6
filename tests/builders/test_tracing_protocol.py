"""spec.observability.tracing with the collectors users have (issue 31): an OTLP/gRPC collector at host:port
(``http://otel-collector:4317``, the common default) or an OTLP/HTTP traces URL, the protocol explicit or inferred,
rendered into vLLM's environment (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, the one variable vLLM 0.33.0 reads for it:
vllm/tracing/otel.py:94-101) and the router's, which exports to the same collector the same way."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from disagg import tracing
from disagg.api.models import DisaggregatedModel
from disagg.builders import build_children
from disagg.builders.router import router_deployment
from disagg.builders.settings import ENV_TRACING_ENDPOINT, ENV_TRACING_PROTOCOL, BuildSettings
from disagg.builders.tracing import protocol_of, with_default_tracing
from disagg.builders.workers import worker_args

SPEC: dict[str, Any] = {"apiVersion": "serving.disagg.dev/v1alpha1", "kind": "DisaggregatedModel",
                        "metadata": {"name": "m", "namespace": "ns"}, "spec": {"model": {"name": "org/m"}}}


def _dm(tracing_spec: dict[str, Any] | None) -> DisaggregatedModel:
    spec = dict(SPEC["spec"])
    if tracing_spec is not None:
        spec["observability"] = {"tracing": tracing_spec}
    return DisaggregatedModel.model_validate({**SPEC, "spec": spec})


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def _worker_container(dm: DisaggregatedModel, settings: BuildSettings | None = None) -> dict[str, Any]:
    objs = build_children(dm, settings or BuildSettings())
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-decode"))
    return next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")


def _router_container(dm: DisaggregatedModel) -> dict[str, Any]:
    return router_deployment(dm, BuildSettings())["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("given,protocol", [
    ({"endpoint": "http://otel-collector.observability:4317"}, "grpc"),
    ({"endpoint": "https://otel.example.com/"}, "grpc"),
    ({"endpoint": "http://jaeger-collector.observability:4318/v1/traces"}, "http/protobuf"),
    ({"endpoint": "http://tempo:4318/otlp/v1/traces"}, "http/protobuf"),
    ({"endpoint": "http://c:4318", "protocol": "grpc"}, "grpc"),
    ({"endpoint": "http://c:9000/v1/traces", "protocol": "http/protobuf"}, "http/protobuf"),
])
def test_workers_and_router_export_to_the_same_collector_with_the_same_protocol(given: dict[str, Any],
                                                                                protocol: str) -> None:
    dm = _dm(given)
    assert dm.spec.observability.tracing is not None and protocol_of(dm.spec.observability.tracing) == protocol
    args = worker_args(dm, "decode")
    assert args[args.index("--otlp-traces-endpoint") + 1] == given["endpoint"]
    worker_env = _env(_worker_container(dm))
    assert worker_env[tracing.PROTOCOL_ENV] == protocol
    assert worker_env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == given["endpoint"]
    router = _router_container(dm)
    assert router["command"][router["command"].index("--otlp-traces-endpoint") + 1] == given["endpoint"]
    assert _env(router)[tracing.PROTOCOL_ENV] == protocol
    # what the router process does with that command and environment: the same protocol and collector
    assert tracing.otlp_protocol(given["endpoint"], _env(router)[tracing.PROTOCOL_ENV]) == protocol


def test_no_tracing_renders_no_protocol() -> None:
    dm = _dm(None)
    assert tracing.PROTOCOL_ENV not in _env(_router_container(dm))
    assert tracing.PROTOCOL_ENV not in _env(_worker_container(dm))


@pytest.mark.parametrize("bad,message", [
    ({"endpoint": "otel-collector:4317"}, "observability.tracing.endpoint"),
    ({"endpoint": "http://c:4317", "protocol": "thrift"}, "observability.tracing.protocol"),
    ({"endpoint": "http://c:4317/v1/traces", "protocol": "grpc"}, "protocol grpc takes"),
    ({"endpoint": "http://c:4318"}, "is the full traces URL with its path"),
    ({"endpoint": "http://c:4318/", "protocol": "http/protobuf"}, "is the full traces URL with its path"),
])
def test_mismatched_endpoints_are_refused_naming_the_field(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(pydantic.ValidationError) as e:
        _dm(bad)
    assert message in str(e.value) and "observability.tracing" in str(e.value), str(e.value)


def test_chart_default_carries_its_protocol() -> None:
    settings = BuildSettings.from_env({ENV_TRACING_ENDPOINT: "http://otel-collector:4317",
                                       ENV_TRACING_PROTOCOL: "grpc"})
    assert settings.tracing_protocol == "grpc"
    dm = _dm(None)
    assert _env(_worker_container(dm, settings))[tracing.PROTOCOL_ENV] == "grpc"
    own = with_default_tracing(_dm({"endpoint": "http://j:4318/v1/traces"}), "http://otel-collector:4317", 1.0,
                               "grpc")
    assert own.spec.observability.tracing is not None
    assert protocol_of(own.spec.observability.tracing) == "http/protobuf"  # the model's own wins
    with pytest.raises(ValueError, match=ENV_TRACING_ENDPOINT):
        BuildSettings.from_env({ENV_TRACING_ENDPOINT: "http://otel-collector:4318"})
    with pytest.raises(ValueError, match=ENV_TRACING_PROTOCOL):
        BuildSettings.from_env({ENV_TRACING_ENDPOINT: "http://c:4317", ENV_TRACING_PROTOCOL: "zipkin"})


# ------------------------------------------------------------------------------------- the exporter's choice


def test_infer_and_exporter_endpoint() -> None:
    assert tracing.infer_protocol("http://otel-collector:4317") == "grpc"
    assert tracing.infer_protocol("http://jaeger:4318") == "http/protobuf"  # the OTLP/HTTP port
    assert tracing.infer_protocol("http://jaeger:4318/v1/traces") == "http/protobuf"
    assert tracing.infer_protocol("http://bad:port") == "grpc"
    assert tracing.exporter_endpoint("http://jaeger:4318", "http/protobuf") == "http://jaeger:4318/v1/traces"
    assert tracing.exporter_endpoint("http://jaeger:4318/v1/traces", "http/protobuf") == "http://jaeger:4318/v1/traces"
    assert tracing.exporter_endpoint("http://c:4317", "grpc") == "http://c:4317"


def test_setup_picks_the_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tracing.PROTOCOL_ENV, raising=False)
    grpc = tracing.setup("http://127.0.0.1:9/", "t", 1.0)
    http = tracing.setup("http://127.0.0.1:9/v1/traces", "t", 1.0)
    monkeypatch.setenv(tracing.PROTOCOL_ENV, "grpc")
    from_env = tracing.setup("http://127.0.0.1:9", "t", 1.0)
    errors: list[str] = []
    monkeypatch.setenv(tracing.PROTOCOL_ENV, "thrift")
    bad = tracing.setup("http://127.0.0.1:9/v1/traces", "t", 1.0, on_error=errors.append)
    try:
        assert grpc is not None and grpc.protocol == "grpc"
        assert http is not None and http.protocol == "http/protobuf" and http.endpoint.endswith("/v1/traces")
        assert from_env is not None and from_env.protocol == "grpc"
        assert bad is not None and bad.protocol == "http/protobuf" and errors == ["invalid_endpoint"]
    finally:
        for t in (grpc, http, from_env, bad):
            if t is not None:
                t.shutdown()

"""``spec.observability.tracing`` → the workers' and the router's tracing flags and environment (pure).

Workers (vLLM 0.33.0; citations in disagg/tracing.py): ``--otlp-traces-endpoint URL`` turns vLLM's tracer on, and
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` — the only variable vLLM reads for the protocol: ``grpc`` (its default) or
``http/protobuf`` (vllm/tracing/otel.py:94-101 in the 0.33.0 wheel) — is the spec's ``protocol``, or the one its
endpoint implies (:func:`protocol_of`): gRPC exports to host:port, OTLP/HTTP posts to the URL as given. vLLM
builds its TracerProvider without a sampler (tracing/otel.py:83), so the OTel SDK reads
``OTEL_TRACES_SAMPLER``/``OTEL_TRACES_SAMPLER_ARG``: parent-based on the ratio, so that a request the router sampled
is traced on the worker too and one it did not is not, and a request sent to a worker directly is sampled at the
same ratio. ``OTEL_SERVICE_NAME`` names the pool in the trace backend (the SDK's Resource.create reads it).

The router: ``--otlp-traces-endpoint`` and ``--trace-sample-ratio``, and the same protocol variable
(disagg.tracing.setup reads it), so that it exports to the same collector the same way.
"""

from __future__ import annotations

from typing import Any

from ..api.models import DisaggregatedModel, DisaggregatedModelSpec
from ..api.spec import TracingSpec
from ..tracing import GRPC, HTTP_PROTOBUF, PROTOCOL_ENV


def protocol_of(t: TracingSpec) -> str:
    """The OTLP protocol of ``spec.observability.tracing``: its ``protocol``, else a URL with a path is OTLP/HTTP
    (``http/protobuf``) and one without is gRPC (``http://otel-collector:4317``); the rules refuse the mismatches."""
    if t.protocol is not None:
        return t.protocol
    path = t.endpoint.split("://", 1)[-1].partition("/")[2]
    return HTTP_PROTOBUF if path else GRPC


def _ratio(r: float) -> str:
    return format(r, "g")


def worker_tracing_args(spec: DisaggregatedModelSpec) -> list[str]:
    t = spec.observability.tracing
    return [] if t is None else ["--otlp-traces-endpoint", t.endpoint]


def worker_tracing_env(spec: DisaggregatedModelSpec, service_name: str) -> list[dict[str, Any]]:
    t = spec.observability.tracing
    if t is None:
        return []
    # OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: vLLM exports the flag's value into this variable for its own child
    # processes (tracing/otel.py:74); set for the whole pod, every process there (and the twin) sees it.
    return [{"name": "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "value": t.endpoint},
            {"name": PROTOCOL_ENV, "value": protocol_of(t)},
            {"name": "OTEL_TRACES_SAMPLER", "value": "parentbased_traceidratio"},
            {"name": "OTEL_TRACES_SAMPLER_ARG", "value": _ratio(t.sampling_ratio)},
            {"name": "OTEL_SERVICE_NAME", "value": service_name}]


def router_tracing_args(spec: DisaggregatedModelSpec) -> list[str]:
    t = spec.observability.tracing
    if t is None:
        return []
    return ["--otlp-traces-endpoint", t.endpoint, "--trace-sample-ratio", _ratio(t.sampling_ratio)]


def router_tracing_env(spec: DisaggregatedModelSpec) -> list[dict[str, Any]]:
    """The router's exporter protocol (disagg.tracing.setup reads it), the workers' one."""
    t = spec.observability.tracing
    return [] if t is None else [{"name": PROTOCOL_ENV, "value": protocol_of(t)}]


def with_default_tracing(dm: DisaggregatedModel, endpoint: str | None, sampling_ratio: float,
                         protocol: str | None = None) -> DisaggregatedModel:
    """``dm`` with the cluster-wide tracing default (the chart's ``tracing.*`` values, through the operator's
    settings) when its spec leaves ``observability.tracing`` out; a model's own setting wins. Pure: a copy."""
    if not endpoint or dm.spec.observability.tracing is not None:
        return dm
    obs = dm.spec.observability.model_copy(
        update={"tracing": TracingSpec.model_validate(
            {"endpoint": endpoint, "samplingRatio": sampling_ratio, "protocol": protocol})})
    return dm.model_copy(update={"spec": dm.spec.model_copy(update={"observability": obs})})

"""``spec.observability.tracing`` → the workers' and the router's tracing flags and environment (pure).

Workers (vLLM 0.33.0; citations in disagg/tracing.py): ``--otlp-traces-endpoint URL`` turns vLLM's tracer on, and
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`` makes it post OTLP/HTTP to that URL (its default is gRPC,
vllm/tracing/otel.py:94-101). vLLM builds its TracerProvider without a sampler (tracing/otel.py:83), so the OTel SDK
reads ``OTEL_TRACES_SAMPLER``/``OTEL_TRACES_SAMPLER_ARG``: parent-based on the ratio, so that a request the router
sampled is traced on the worker too and one it did not is not, and a request sent to a worker directly is sampled
at the same ratio. ``OTEL_SERVICE_NAME`` names the pool in the trace backend (the SDK's Resource.create reads it).

The router: ``--otlp-traces-endpoint`` and ``--trace-sample-ratio``.
"""

from __future__ import annotations

from typing import Any

from ..api.models import DisaggregatedModel, DisaggregatedModelSpec
from ..api.spec import TracingSpec
from ..tracing import PROTOCOL, PROTOCOL_ENV


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
            {"name": PROTOCOL_ENV, "value": PROTOCOL},
            {"name": "OTEL_TRACES_SAMPLER", "value": "parentbased_traceidratio"},
            {"name": "OTEL_TRACES_SAMPLER_ARG", "value": _ratio(t.sampling_ratio)},
            {"name": "OTEL_SERVICE_NAME", "value": service_name}]


def router_tracing_args(spec: DisaggregatedModelSpec) -> list[str]:
    t = spec.observability.tracing
    if t is None:
        return []
    return ["--otlp-traces-endpoint", t.endpoint, "--trace-sample-ratio", _ratio(t.sampling_ratio)]


def with_default_tracing(dm: DisaggregatedModel, endpoint: str | None, sampling_ratio: float) -> DisaggregatedModel:
    """``dm`` with the cluster-wide tracing default (the chart's ``tracing.*`` values, through the operator's
    settings) when its spec leaves ``observability.tracing`` out; a model's own setting wins. Pure: a copy."""
    if not endpoint or dm.spec.observability.tracing is not None:
        return dm
    obs = dm.spec.observability.model_copy(
        update={"tracing": TracingSpec(endpoint=endpoint, sampling_ratio=sampling_ratio)})
    return dm.model_copy(update={"spec": dm.spec.model_copy(update={"observability": obs})})

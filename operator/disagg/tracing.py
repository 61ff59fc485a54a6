"""OpenTelemetry traces for the router and the twin: one place for the SDK set-up, vLLM's span vocabulary and W3C
trace-context helpers.

Off by default. With no OTLP endpoint nothing here is imported on the request path and no span object is ever made
(callers hold ``None``); with one, an SDK ``TracerProvider`` batches spans to an OTLP endpoint on a background
thread, over gRPC or HTTP/protobuf (:func:`otlp_protocol`: the protocol given, else
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, else inferred from the endpoint as :func:`infer_protocol` says). A bad
set-up never fails a request: an unreachable endpoint shows as failed exports, an invalid sampling ratio falls back
to the default, each with a log line and ``disagg_tracing_errors_total{reason}``.

vLLM 0.33.0 facts used here (vllm/ in the 0.33.0 wheel):
- ``--otlp-traces-endpoint URL`` (engine/arg_utils.py:1686-1687; config/observability.py:38) starts the exporter;
  ``--collect-detailed-traces {model,worker,all}`` (arg_utils.py:1689-1691, config/observability.py:16,41) only adds
  start-up and model-forward spans and requires the endpoint (config/observability.py:218-220).
- the exporter protocol comes from ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` and nothing else (no other OTEL_* variable
  chooses it): ``grpc`` by default — ``OTLPGrpcExporter(endpoint=endpoint, insecure=True)``, which keeps only the
  URL's host:port and still uses TLS for an ``https://`` URL (the exporter's own scheme check) — and
  ``http/protobuf`` selects the OTLP/HTTP exporter with the endpoint used as the full URL; any other value is an
  error at start-up (tracing/otel.py:94-101). vLLM also exports the flag's value as
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` for its child processes (tracing/otel.py:74, read back at :113). The
  operator renders the protocol of spec.observability.tracing into that variable for the workers and the router,
  so that vLLM, the router and the twin speak one protocol to one collector.
- the API server copies ``traceparent``/``tracestate`` from the request headers (tracing/utils.py:12;
  entrypoints/serve/engine/serving.py:42-47) and the engine parents its span on them with the W3C propagator
  (tracing/otel.py:125-129; v1/engine/output_processor.py:952); without an endpoint they are dropped
  (v1/engine/async_llm.py:421-423).
- one span per finished request, ``llm_request`` (kind SERVER), started at the request's arrival and ended when the
  engine finishes it, with the ``gen_ai.*`` attributes below (v1/engine/output_processor.py:941-1001). Its
  ``time_in_queue`` is queued → first scheduled; on a decode worker pulling KV asynchronously the request waits in
  WAITING_FOR_REMOTE_KVS without a SCHEDULED event (v1/core/sched/scheduler.py:1514-1544), so the KV pull is
  inside the decode span's ``time_in_queue``.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from . import logs

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExportResult
    from opentelemetry.trace import Span, Tracer

log = logs.get("disagg.tracing")

DEFAULT_SAMPLE_RATIO = 0.01  # sampling defaults low: 1 request in 100 is traced end to end

# vLLM 0.33.0's span and attribute names (vllm/tracing/utils.py:23-44; span name: v1/engine/output_processor.py:996)
LLM_REQUEST_SPAN = "llm_request"
ATTR_TTFT = "gen_ai.latency.time_to_first_token"
ATTR_E2E = "gen_ai.latency.e2e"
ATTR_QUEUE = "gen_ai.latency.time_in_queue"
ATTR_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
ATTR_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
ATTR_PREFILL = "gen_ai.latency.time_in_model_prefill"
ATTR_DECODE = "gen_ai.latency.time_in_model_decode"
ATTR_INFERENCE = "gen_ai.latency.time_in_model_inference"
ATTR_REQUEST_ID = "gen_ai.request.id"
ATTR_MAX_TOKENS = "gen_ai.request.max_tokens"
ATTR_N = "gen_ai.request.n"
# the env var vLLM reads for the exporter protocol (tracing/otel.py:95) and the two values it accepts (:96-101)
PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
GRPC = "grpc"
HTTP_PROTOBUF = "http/protobuf"
PROTOCOLS = (GRPC, HTTP_PROTOBUF)
PROTOCOL = HTTP_PROTOBUF  # what the simulator speaks when nothing says otherwise
# the OTLP defaults (opentelemetry-specification, protocol/exporter.md): gRPC on 4317, HTTP on 4318 at /v1/traces
OTLP_HTTP_PORT = 4318
OTLP_HTTP_TRACES_PATH = "/v1/traces"

# The router's own spans
ROUTER_SPAN = "router_request"
PREFILL_LEG_SPAN = "prefill_leg"
DECODE_LEG_SPAN = "decode_leg"
# The twin's one addition (not a vLLM span, hence the prefix): the KV pull on a decode worker, a child of its
# llm_request span, so a trace shows where in the decode span's queue time the transfer ran.
SIM_KV_PULL_SPAN = "disagg.sim.kv_pull"

ErrorHook = Callable[[str], None]  # reason → count it (the caller's Prometheus counter)


def _has_path(endpoint: str) -> bool:
    return urlsplit(endpoint).path not in ("", "/")


def infer_protocol(endpoint: str) -> str:
    """The OTLP protocol an endpoint says: a URL with a path (``…/v1/traces``) or on port 4318 is OTLP/HTTP
    (``http/protobuf``); anything else — ``http://otel-collector:4317``, the common default — is gRPC."""
    try:
        port = urlsplit(endpoint).port
    except ValueError:
        port = None
    return HTTP_PROTOBUF if _has_path(endpoint) or port == OTLP_HTTP_PORT else GRPC


def otlp_protocol(endpoint: str, protocol: str | None = None) -> str:
    """The protocol to export with: ``protocol``, else ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, else inferred."""
    return protocol or os.environ.get(PROTOCOL_ENV) or infer_protocol(endpoint)


def exporter_endpoint(endpoint: str, protocol: str) -> str:
    """The URL an exporter is given: OTLP/HTTP posts to the URL as it is, so one without a path gets the default
    ``/v1/traces``; gRPC keeps the endpoint (its exporter reads host:port and the scheme: https is TLS)."""
    if protocol == HTTP_PROTOBUF and not _has_path(endpoint):
        return endpoint.rstrip("/") + OTLP_HTTP_TRACES_PATH
    return endpoint


def parse_sample_ratio(raw: str | float | None, on_error: ErrorHook | None = None, field: str = "--trace-sample-ratio"
                       ) -> float:
    """A sampling ratio in [0, 1]; anything else → the default, with a log line naming ``field`` and a count."""
    if raw is None or raw == "":
        return DEFAULT_SAMPLE_RATIO
    try:
        v = float(raw)
    except (TypeError, ValueError):
        v = math.nan
    if math.isnan(v) or not 0.0 <= v <= 1.0:
        log.error("tracing_config_invalid", field=field, value=str(raw), using=DEFAULT_SAMPLE_RATIO,
                  note="the sampling ratio must be a number from 0 to 1; tracing goes on with the default")
        if on_error is not None:
            on_error("invalid_sample_ratio")
        return DEFAULT_SAMPLE_RATIO
    return v


def traceparent(span: Span) -> str:
    """The W3C ``traceparent`` header for a child of ``span`` (version 00)."""
    c = span.get_span_context()
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"


def parent_context(headers: Mapping[str, str]) -> Any:
    """The OTel context carried by W3C headers (``traceparent``/``tracestate``), or None when there are none."""
    if "traceparent" not in headers:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({k: v for k, v in headers.items()
                                                    if k.lower() in ("traceparent", "tracestate")})


def epoch_ns(monotonic_t: float) -> int:
    """A ``time.monotonic()`` instant as Unix-epoch nanoseconds (what span start/end times are)."""
    return time.time_ns() - int((time.monotonic() - monotonic_t) * 1e9)


class _CountingExporter:
    """Wraps the OTLP exporter: a failed batch is logged (first one, then every 100th) and counted; it never
    raises into the SDK's worker thread."""

    def __init__(self, inner: Any, endpoint: str, on_error: ErrorHook | None) -> None:
        self.inner = inner
        self.endpoint = endpoint
        self.on_error = on_error
        self.failures = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        from opentelemetry.sdk.trace.export import SpanExportResult

        try:
            result = self.inner.export(spans)
        except Exception as e:  # noqa: BLE001 - an exporter bug must not kill the batch thread
            log.error("tracing_export_failed", endpoint=self.endpoint, spans=len(spans), error=repr(e))
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self.failures += 1
            if self.failures == 1 or self.failures % 100 == 0:
                log.error("tracing_export_failed", endpoint=self.endpoint, spans=len(spans),
                          failed_batches=self.failures, note="spans are dropped; requests are not affected")
            if self.on_error is not None:
                self.on_error("export_failed")
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


@dataclass
class Tracing:
    """An SDK tracer with its provider. Hold ``None`` instead of one to trace nothing at no cost."""

    provider: TracerProvider
    tracer: Tracer
    endpoint: str
    sample_ratio: float
    protocol: str = HTTP_PROTOBUF

    def start(self, name: str, parent: Any = None, kind: str = "INTERNAL", start_ns: int | None = None,
              attributes: Mapping[str, Any] | None = None) -> Span:
        """A span (not made current: the router passes parents explicitly). ``parent``: an OTel context or a
        span."""
        from opentelemetry import trace

        ctx = trace.set_span_in_context(parent) if isinstance(parent, trace.Span) else parent
        return self.tracer.start_span(name, context=ctx, kind=getattr(trace.SpanKind, kind), start_time=start_ns,
                                      attributes=attributes)

    def flush(self, timeout_s: float = 5.0) -> bool:
        return bool(self.provider.force_flush(int(timeout_s * 1000)))

    def shutdown(self) -> None:
        self.provider.shutdown()


def setup(endpoint: str | None, service_name: str | None, sample_ratio: float | None = DEFAULT_SAMPLE_RATIO,
          on_error: ErrorHook | None = None, resource: Mapping[str, str] | None = None,
          protocol: str | None = None) -> Tracing | None:
    """A ``Tracing`` exporting to ``endpoint``, or None when no endpoint is given. The protocol: ``protocol``, else
    ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, else inferred (:func:`infer_protocol`): OTLP/HTTP to the full URL
    (``http://jaeger:4318/v1/traces``; no path: ``/v1/traces``) or OTLP/gRPC to host:port
    (``http://otel-collector:4317``; ``https://`` for TLS). Sampling: ``ParentBased(TraceIdRatioBased(
    sample_ratio))`` — a caller's ``traceparent`` decides, a new trace is kept with probability ``sample_ratio``.
    ``sample_ratio=None``: the SDK's default, as vLLM has it (``OTEL_TRACES_SAMPLER``/``_ARG``, else
    ParentBased(ALWAYS_ON))."""
    if not endpoint:
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

    if not endpoint.startswith(("http://", "https://")):
        log.error("tracing_config_invalid", field="otlp traces endpoint", value=endpoint,
                  note="an OTLP endpoint is a URL (http://host:4317 for gRPC, http://host:4318/v1/traces for "
                  "HTTP); exports will fail")
        if on_error is not None:
            on_error("invalid_endpoint")
    proto = otlp_protocol(endpoint, protocol)
    if proto not in PROTOCOLS:
        using = infer_protocol(endpoint)
        log.error("tracing_config_invalid", field=PROTOCOL_ENV, value=proto, using=using,
                  note=f"the OTLP protocol is {' or '.join(PROTOCOLS)} (what vLLM accepts); inferred from the endpoint")
        if on_error is not None:
            on_error("invalid_endpoint")
        proto = using
    url = exporter_endpoint(endpoint, proto)
    sampler = None if sample_ratio is None else ParentBased(
        TraceIdRatioBased(sample_ratio) if sample_ratio < 1.0 else ALWAYS_ON)
    # service.name: ours, or (None, as vLLM leaves it) OTEL_SERVICE_NAME, else "unknown_service"
    attrs = {**({"service.name": service_name} if service_name else {}), **(resource or {})}
    provider = TracerProvider(resource=Resource.create(attrs), sampler=sampler)
    # a short export timeout: an unreachable collector holds the batch thread, never a request
    timeout = float(os.environ.get("DISAGG_OTLP_TIMEOUT_S", "3"))
    if proto == GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        inner: Any = GrpcExporter(endpoint=url, timeout=timeout)  # http:// → plaintext, https:// → TLS
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        inner = HttpExporter(endpoint=url, timeout=timeout)
    exporter = _CountingExporter(inner, url, on_error)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))  # type: ignore[arg-type]
    # The SDK logs every failed export at WARNING/ERROR with a traceback; ours says it once with the endpoint.
    for name in ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry.exporter.otlp.proto.http",
                 "opentelemetry.exporter.http.transport", "opentelemetry.exporter.otlp.common",
                 "opentelemetry.exporter.otlp.proto.grpc.exporter", "opentelemetry.exporter.otlp.proto.grpc"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    log.info("tracing_enabled", endpoint=url, protocol=proto, sample_ratio=sample_ratio, service=service_name)
    return Tracing(provider, provider.get_tracer("disagg"), url, 1.0 if sample_ratio is None else sample_ratio,
                   proto)

"""Phase accounting at the end of a request: phases derived from worker metrics, the Prometheus metrics
(requests, phase histograms, SLO attainment, probe outcomes) and the one JSON log line per request."""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
import structlog

from .. import logs
from ..api.models import SLOSpec
from .load import TenantStats, Worker
from .metrics import RouterMetrics
from .request import Ctx

reqlog = logs.get("disagg.router.request")
# The request log line is an interface (docs/planning.md "The request log"): disagg replay and disagg plan --from-log
# read it. Schema 2 adds arrival_unix, max_tokens, prefix_hash and prefix_tokens to schema 1's fields.
REQUEST_LOG_SCHEMA = 2
_UTC = datetime.UTC


class RequestLog:
    """The request line, cheap: with the standard JSON chain of ``disagg.logs.configure`` (contextvars, level,
    UTC ISO timestamp, JSON renderer) the same object — same keys in the same order, same timestamp format — is
    rendered with orjson and handed to structlog's output logger directly (≈4 µs instead of ≈20 µs through the
    processor chain with the stdlib json encoder). Any other structlog configuration goes through structlog."""

    _STANDARD = (structlog.contextvars.merge_contextvars, structlog.processors.add_log_level)

    def __init__(self) -> None:
        self._key: tuple[int, int] | None = None
        self._out: Any = None

    def _output(self) -> Any:
        """structlog's logger when the configured chain is the standard JSON one, else None (checked when the
        configuration object changes)."""
        procs = structlog.get_config()["processors"]
        factory = structlog.get_config()["logger_factory"]
        key = (id(procs), id(factory))
        if key != self._key:
            self._key = key
            ok = (len(procs) == 5 and procs[0] is self._STANDARD[0] and procs[1] is self._STANDARD[1]
                  and isinstance(procs[2], structlog.processors.TimeStamper)
                  and procs[3] is structlog.processors.format_exc_info
                  and isinstance(procs[4], structlog.processors.JSONRenderer)
                  and isinstance(factory, structlog.PrintLoggerFactory))
            self._out = factory() if ok else None
        return self._out

    def __call__(self, **fields: Any) -> None:
        if not reqlog.is_enabled_for(logging.INFO):
            return
        out = self._output()
        if out is None:
            reqlog.info("request", **fields)
            return
        ctxvars = structlog.contextvars.get_contextvars()
        line = {**ctxvars, **fields} if ctxvars else fields
        line["event"] = "request"
        line["level"] = "info"
        line["timestamp"] = datetime.datetime.now(tz=_UTC).isoformat().replace("+00:00", "Z")
        out.msg(orjson.dumps(line).decode())

# histogram phase name → Ctx.timings key
PHASE_KEYS = (("prefill_compute", "prefill_compute"), ("kv_cache_pack", "kv_pack"),
              ("kv_cache_transfer", "kv_transfer"), ("kv_cache_unpack", "kv_unpack"),
              ("decode_queue_wait", "decode_queue"), ("first_token_emit", "ttft"), ("per_token_decode", "tpot"))


_PHASE_OF = {key: phase for phase, key in PHASE_KEYS} | {"prefill_queue": "prefill_queue_wait"}


def _trace_id(span: Any) -> str | None:
    """The request's trace id (hex) when tracing sampled it: the log line links to the trace."""
    if span is None:
        return None
    c = span.get_span_context()
    return f"{c.trace_id:032x}" if c.trace_flags.sampled else None


def derive_phases(ctx: Ctx, w: Worker | None, remote: bool, ttfb: float | None) -> None:
    """Phases inside vLLM that no per-request source gave: from the decode worker's recent metric averages (capped
    by what the router saw), each marked in ``ctx.estimated``. A phase already in ``ctx.timings`` came from the
    request itself (the worker's per-request metrics, ``worker_request_metrics``) and is kept."""
    if w is None:
        return
    t = ctx.timings
    est = ctx.estimated
    cap = ttfb if ttfb is not None else float("inf")
    if "decode_queue" not in t:
        q = w.avg.get("vllm:request_queue_time_seconds")
        if q is not None:
            ctx.timings["decode_queue"] = min(q, cap)
            est.add("decode_queue")
    if not remote:
        return
    pack = w.avg.get("vllm:nixl_post_time_seconds")
    xfer = w.avg.get("vllm:nixl_xfer_time_seconds")
    if pack is not None:
        ctx.timings["kv_pack"] = min(pack, cap)
        est.add("kv_pack")
    if xfer is not None:
        ctx.timings["kv_transfer"] = min(xfer, max(cap - t.get("kv_pack", 0.0), 0.0))
        est.add("kv_transfer")
    if ttfb is not None and xfer is not None:
        step = w.avg.get("vllm:time_per_output_token_seconds") or w.avg.get(
            "vllm:request_time_per_output_token_seconds") or 0.0
        explained = t.get("decode_queue", 0.0) + t.get("kv_pack", 0.0) + t["kv_transfer"] + step
        ctx.timings["kv_unpack"] = max(ttfb - explained, 0.0)
        est.add("kv_unpack")


def worker_request_metrics(body: Any) -> tuple[float | None, float | None]:
    """(queue seconds, scheduled-to-first-token seconds) from a response's per-request ``metrics`` object: vLLM
    0.33.0 adds it to a non-streamed response (and the final usage chunk of a stream) when the server runs with
    ``--enable-per-request-metrics`` (vllm/entrypoints/generate/base/protocol.py:121-129 PerRequestMetrics;
    serving.py:45-103: queue_time_ms = scheduled − queued, time_to_first_token_ms = first token − scheduled)."""
    m = body.get("metrics") if isinstance(body, dict) else None
    if not isinstance(m, dict):
        return None, None
    q, f = m.get("queue_time_ms"), m.get("time_to_first_token_ms")
    return (q / 1000.0 if isinstance(q, (int, float)) else None,
            f / 1000.0 if isinstance(f, (int, float)) else None)


def end_span(ctx: Ctx) -> None:
    """End the router's span for this request with what the log line says (decision, path, phases)."""
    span = ctx.span
    if span.is_recording():
        a: dict[str, Any] = {
            "disagg.request_id": ctx.request_id, "disagg.upstream_request_id": ctx.upstream_id,
            "disagg.endpoint": ctx.endpoint, "disagg.tenant": ctx.tenant, "disagg.decision": ctx.decision,
            "disagg.reason": ctx.reason, "disagg.path": ctx.path or "none", "disagg.outcome": ctx.outcome,
            "http.response.status_code": ctx.status, "disagg.stream": ctx.stream,
            "disagg.input_tokens": ctx.input_tokens, "disagg.estimated": sorted(ctx.estimated),
        }
        for k, v in (("disagg.fallback", ctx.fallback), ("disagg.prefill_worker", ctx.prefill_worker),
                     ("disagg.admission", ctx.admission), ("disagg.admission_reason", ctx.admission_reason),
                     ("disagg.decode_worker", ctx.decode_worker), ("disagg.output_tokens", ctx.output_tokens)):
            if v is not None:
                a[k] = v
        for key, secs in ctx.timings.items():
            a[f"disagg.timing.{key}_ms"] = round(secs * 1000, 3)
        for prefix, chosen in (("disagg.placement", ctx.placement), ("disagg.rejected_placement",
                                                                     ctx.rejected_placement)):
            for k, v in (chosen or {}).items():
                a[prefix if k == "placement" else f"{prefix}.{k}"] = v
        span.set_attributes(a)
        if ctx.outcome not in ("ok", "client_error", "rejected", "shed"):
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, ctx.outcome or "unknown"))
    span.end()


def slo_met(ctx: Ctx, slo: SLOSpec, e2e: float) -> bool:
    t = ctx.timings
    if ctx.stream:
        ttft_ok = t.get("ttft", e2e) * 1000 <= slo.ttft_p95_ms
        tpot_ok = "tpot" not in t or t["tpot"] * 1000 <= slo.tpot_p95_ms
        return ttft_ok and tpot_ok
    n = ctx.output_tokens or 1
    return e2e * 1000 <= slo.ttft_p95_ms + slo.tpot_p95_ms * max(n - 1, 0)


class Accounting:
    def __init__(self, metrics: RouterMetrics, tenants: TenantStats, slo: Callable[[], SLOSpec]) -> None:
        self.metrics = metrics
        self.tenants = tenants
        self.slo = slo
        self.log = RequestLog()

    def finish(self, ctx: Ctx) -> None:
        e2e = time.monotonic() - ctx.t0
        ctx.timings["e2e"] = e2e
        if ctx.first_upstream_at is not None:
            ctx.timings["request_queue"] = ctx.first_upstream_at - ctx.t0
        path = ctx.path or "none"
        m = self.metrics
        if ctx.probe and ctx.outcome != "cancelled":
            m.mode_probes.labels("ok" if path == "remote" and ctx.outcome == "ok" else "failed").inc()
        if path in ("remote", "local", "fallback") and ctx.outcome == "ok":
            tl = (path, ctx.tenant)
            t = ctx.timings
            m.phase["request_queue_wait"].labels(*tl).observe(t.get("request_queue", 0.0))
            for phase, key in PHASE_KEYS:
                if key in t:
                    m.phase[phase].labels(*tl).observe(t[key])
            for key in ctx.estimated:
                m.phase_estimated.labels(_PHASE_OF.get(key, key)).inc()
            if ctx.output_tokens is not None:
                self.tenants.observe(ctx.tenant, ctx.output_tokens)
            m.slo_requests.labels(ctx.tenant).inc()
            if slo_met(ctx, self.slo(), e2e):
                m.slo_met.labels(ctx.tenant).inc()
        # last: a scrape that counts this request also has its phases (with --workers N another process may
        # render /metrics between these writes)
        m.requests.labels(ctx.outcome or "unknown", path).inc()
        self.log(
            log_schema=REQUEST_LOG_SCHEMA, arrival_unix=round(ctx.arrival_unix, 6), max_tokens=ctx.max_tokens,
            prefix_hash=ctx.prefix_hash, prefix_tokens=ctx.prefix_tokens,
            expected_cached_tokens=ctx.expected_cached_tokens, cache_source=ctx.cache_source,
            reused_tokens=ctx.prefill_reused_tokens if ctx.path == "remote" else ctx.reused_tokens,
            request_id=ctx.request_id, upstream_request_id=ctx.upstream_id, endpoint=ctx.endpoint,
            tenant=ctx.tenant, stream=ctx.stream, input_tokens=ctx.input_tokens, output_tokens=ctx.output_tokens,
            decision=ctx.decision, reason=ctx.reason, path=path, fallback=ctx.fallback, probe=ctx.probe,
            placement=ctx.placement, rejected_placement=ctx.rejected_placement,
            admission=ctx.admission, admission_reason=ctx.admission_reason,
            prefill_worker=ctx.prefill_worker, decode_worker=ctx.decode_worker, outcome=ctx.outcome, status=ctx.status,
            timings_ms={k: round(v * 1000, 3) for k, v in ctx.timings.items()},
            estimated=sorted(ctx.estimated) if ctx.estimated else [],
            trace_id=None if ctx.span is None else _trace_id(ctx.span),
        )

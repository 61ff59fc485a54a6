"""What the simulator reports about one finished request, as vLLM does: the ``llm_request`` span (with the twin's
KV-pull child span) exported over OTLP when an endpoint is set, and the per-request ``metrics`` of
``--enable-per-request-metrics``. Times are the engine clock's, scaled to wall seconds."""

from __future__ import annotations

import os
import time
from typing import Any

from .. import logs, tracing
from .config import SimConfig
from .engine import Engine, ReqCtx
from .scheduler import Request

log = logs.get("disagg.sim.server")


def tracer(cfg: SimConfig) -> tracing.Tracing | None:
    """vLLM's tracer set-up, reduced: an endpoint turns it on; the sampler is the SDK's default (ParentBased(
    ALWAYS_ON), or OTEL_TRACES_SAMPLER/_ARG), as vLLM builds its TracerProvider without one (tracing/otel.py:83)."""
    endpoint = cfg.otlp_traces_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if not endpoint:
        return None
    # vLLM's default is gRPC (tracing/otel.py:95); the simulator honours the variable when it is set, as vLLM does,
    # and otherwise keeps to OTLP/HTTP (what a bare `disagg sim --otlp-traces-endpoint …/v1/traces` means)
    protocol = os.environ.get(tracing.PROTOCOL_ENV)
    if protocol is None:
        log.warning("otlp_protocol_unset", using=tracing.PROTOCOL,
                    note=f"vLLM would use grpc; set {tracing.PROTOCOL_ENV} (grpc or http/protobuf) as the operator "
                    "does for vLLM")
    # vLLM: init_tracer("vllm.llm_engine", endpoint) (v1/engine/async_llm.py:149-151; resource: tracing/otel.py:76-81)
    return tracing.setup(endpoint, None, None, resource={"vllm.instrumenting_module_name": "vllm.llm_engine",
                                                            "vllm.process_id": str(os.getpid())},
                         protocol=protocol or tracing.PROTOCOL)


class RequestTelemetry:
    """One server's span export and per-request metrics (server.py ``Api``), on ``engine``'s clock."""

    def __init__(self, cfg: SimConfig, engine: Engine) -> None:
        self.engine = engine
        self.tracing = tracer(cfg)

    def wall_ns(self, t: float) -> int:
        """A simulated instant as Unix-epoch nanoseconds."""
        clock = self.engine.clock
        return time.time_ns() - int((clock.now() - t) * clock.scale * 1e9)

    def finished(self, req: Request, headers: Any, max_tokens: int | None) -> None:
        """vLLM's do_tracing for one finished request (v1/engine/output_processor.py:941-1001)."""
        tr = self.tracing
        if tr is None:
            return
        scale = self.engine.clock.scale
        now = self.engine.clock.now()
        sched, first, last = req.first_scheduled, req.first_token, req.last_token
        attrs: dict[str, Any] = {
            tracing.ATTR_TTFT: (first - req.received_at) * scale if first is not None else 0.0,
            tracing.ATTR_E2E: (now - req.received_at) * scale,
            tracing.ATTR_QUEUE: (sched - req.queued_at) * scale if sched is not None else 0.0,
            tracing.ATTR_PROMPT_TOKENS: req.prompt_len,
            tracing.ATTR_COMPLETION_TOKENS: req.num_output,
            tracing.ATTR_PREFILL: (first - sched) * scale if first is not None and sched is not None else 0.0,
            tracing.ATTR_DECODE: (last - first) * scale if last is not None and first is not None else 0.0,
            tracing.ATTR_INFERENCE: (last - sched) * scale if last is not None and sched is not None else 0.0,
            tracing.ATTR_REQUEST_ID: req.request_id,
        }
        if max_tokens:
            attrs[tracing.ATTR_MAX_TOKENS] = max_tokens
        attrs[tracing.ATTR_N] = 1
        parent = tracing.parent_context(headers)
        span = tr.start(tracing.LLM_REQUEST_SPAN, parent, "SERVER", self.wall_ns(req.received_at), attrs)
        ctx: ReqCtx = req.ctx
        if req.kv_requested is not None:  # the decode side's KV pull (twin-only span, inside time_in_queue)
            start = max(req.kv_requested, req.arrival)
            end = start + ctx.xfer_s if ctx.xfer_s is not None else (sched if sched is not None else now)
            if sched is not None:
                end = min(end, sched)
            pull = tr.start(tracing.SIM_KV_PULL_SPAN, span, "INTERNAL", self.wall_ns(start), {
                "disagg.sim.kv_tokens": req.num_external, "disagg.sim.ok": ctx.xfer_s is not None,
                "disagg.sim.remote_engine_id": str((req.remote_prefill or {}).get("remote_engine_id", ""))})
            pull.end(self.wall_ns(end))
        span.end(self.wall_ns(now))

    def request_metrics(self, req: Request) -> dict[str, Any]:
        """vLLM's per-request ``metrics`` (--enable-per-request-metrics; generate/base/serving.py:45-103), in
        wall milliseconds."""
        ms = self.engine.clock.scale * 1000.0
        sched, first, last, n = req.first_scheduled, req.first_token, req.last_token, req.num_output
        out: dict[str, Any] = {"time_to_first_token_ms": None, "generation_time_ms": None, "queue_time_ms": None,
                               "mean_itl_ms": None, "tokens_per_second": None, "speculative_decoding": None}
        if sched is not None and first is not None:
            out["time_to_first_token_ms"] = (first - sched) * ms
        if first is not None and last is not None:
            out["generation_time_ms"] = (last - first) * ms
            if n > 1:
                out["mean_itl_ms"] = (last - first) / (n - 1) * ms
        if sched is not None:
            out["queue_time_ms"] = (sched - req.queued_at) * ms
        if sched is not None and last is not None and last > sched:
            out["tokens_per_second"] = n / ((last - sched) * ms) * 1000.0
        return out

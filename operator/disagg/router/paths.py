"""Path orchestration: remote (prefill leg → decode leg), local, and the fallbacks between them.

* remote: prefill leg (deadline transferTimeoutMs) → decode leg with the prefill response's kv_transfer_params
  verbatim; for streaming requests the deadline also covers the decode leg's first token (the KV hand-off).
  A failure → onKVTransferTimeout: LocalAggregated (serve it locally, the client sees nothing) or Fail (502/504).
* local: the decode worker (or the aggregated pool) prefills itself.
* any decode-side failure before the first token reaches the client → once more on another worker.

Fallback causes (``disagg_fallbacks_total{cause}``; docs/router.md has the list) follow one rule:
``kv_*`` = a transport fault (the KV pull failed, or the prefill finished but the decode leg's first token did not
arrive by the deadline): they feed the circuit breakers and the mode controller. ``prefill_*`` = the prefill leg
(capacity, queueing, a prefill worker's error): the autoscaler's and the overload policy's business.
``decode_*`` = the decode worker itself (connection, rejection, error) on either path.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from ..api.contract import RouterConfig
from .breaker import Breakers, Ticket
from .legs import Upstream
from .load import WorkerSet
from .metrics import RouterMetrics
from .policy import Decision
from .proxy import UpstreamError, decode_body, local_body
from .request import Ctx, openai_error


def remote_decode_cause(e: UpstreamError) -> str:
    """The fallback cause of a failed decode leg on the remote path."""
    if e.cause == "timeout":
        return "kv_transfer_timeout"  # the prefill leg finished; the KV hand-off did not start in time
    if e.cause == "generation_error":
        return "kv_load_failed"  # vLLM's request-level error before the first token: the KV pull failed
    if e.status is not None and 400 <= e.status < 500:
        return "decode_rejected"
    return e.cause if e.cause.startswith("decode") else "decode_" + e.cause


class Paths:
    def __init__(self, workers: WorkerSet, metrics: RouterMetrics, upstream: Upstream, breakers: Breakers) -> None:
        self.workers = workers
        self.metrics = metrics
        self.up = upstream
        self.breakers = breakers

    async def run(self, request: web.Request, ctx: Ctx, cfg: RouterConfig, body: dict[str, Any], d: Decision,
                  hashes: tuple[int, ...], ticket: Ticket | None) -> web.StreamResponse:
        """Serve a decision; a remote one comes with the breaker ticket it was admitted with."""
        if d.decision == "remote" and ticket is not None:
            ctx.path = "remote"
            return await self.remote(request, ctx, cfg, body, d, hashes, ticket)
        ctx.path = "local"
        return await self.local(request, ctx, body, d.decode, hashes, exclude=set())

    def fallback_worker(self, exclude: set[str], prefer: str | None = None) -> str | None:
        """A worker for local/aggregated serving: the aggregated pool first, else the least loaded decode worker."""
        for role in ("aggregated", "decode"):
            cands = [w for w in self.workers.ready(role) if w.url not in exclude]
            if cands:
                if prefer and any(w.url == prefer for w in cands):
                    return prefer
                return min(cands, key=lambda w: (w.inflight, w.url)).url
        return None

    async def remote(self, request: web.Request, ctx: Ctx, cfg: RouterConfig, body: dict[str, Any], d: Decision,
                     hashes: tuple[int, ...], ticket: Ticket) -> web.StreamResponse:
        assert d.prefill and d.decode
        deadline = time.monotonic() + cfg.transfer_timeout_ms / 1000.0
        ctx.prefill_worker = d.prefill
        try:
            try:
                kv = await self.up.prefill_leg(request, ctx, body, d.prefill, deadline)
            except UpstreamError as e:
                ticket.release()  # the prefill side: no evidence about the KV path
                return await self.after_remote_failure(request, ctx, cfg, body, hashes, e, exclude=set())
            try:
                return await self.up.relay(request, ctx, d.decode, decode_body(local_body(body), kv), hashes,
                                           deadline=deadline if ctx.stream else None, remote=True,
                                           on_commit=ticket.success)
            except UpstreamError as e:
                e.cause = remote_decode_cause(e)
                if e.cause.startswith("kv_"):
                    ticket.failure(e.cause)
                return await self.after_remote_failure(request, ctx, cfg, body, hashes, e, exclude={d.decode})
        finally:
            ticket.release()  # cancelled, or no evidence: free a half-open slot (no-op after an outcome)

    async def after_remote_failure(self, request: web.Request, ctx: Ctx, cfg: RouterConfig, body: dict[str, Any],
                                   hashes: tuple[int, ...], e: UpstreamError,
                                   exclude: set[str]) -> web.StreamResponse:
        ctx.fallback = e.cause
        self.metrics.fallbacks.labels(e.cause).inc()
        kv_cause = not e.cause.startswith("decode_") or e.cause == "decode_rejected"
        if kv_cause and cfg.routing.fallback.on_kv_transfer_timeout == "Fail":
            status = 504 if "timeout" in e.cause else 502
            ctx.outcome, ctx.status = "upstream_error", status
            return openai_error(status, f"remote prefill failed: {e.cause}", "upstream_error")
        ctx.path = "fallback"
        worker = self.fallback_worker(exclude) or self.fallback_worker(set())
        if worker is None:
            ctx.outcome, ctx.status = "upstream_error", 503
            return openai_error(503, "no worker available for the fallback path", "service_unavailable")
        return await self.local(request, ctx, body, worker, hashes, exclude=exclude, retried=bool(exclude))

    async def local(self, request: web.Request, ctx: Ctx, body: dict[str, Any], worker: str | None,
                    hashes: tuple[int, ...], exclude: set[str], retried: bool = False) -> web.StreamResponse:
        worker = worker or self.fallback_worker(exclude)
        if worker is None:
            ctx.outcome, ctx.status = "upstream_error", 503
            return openai_error(503, "no ready worker for this model", "service_unavailable")
        try:
            return await self.up.relay(request, ctx, worker, local_body(body), hashes)
        except UpstreamError as e:
            if e.status is not None and 400 <= e.status < 500 and e.status not in (408, 429):
                # the worker refused the request itself: the client's error, pass it through
                ctx.outcome, ctx.status = "client_error", e.status
                return web.Response(status=e.status, body=e.body, content_type="application/json")
            if retried:
                return self.give_up(ctx, e)
            cause = "decode_" + e.cause if not e.cause.startswith("decode") else e.cause
            ctx.fallback = ctx.fallback or cause
            self.metrics.fallbacks.labels(cause).inc()
            ctx.path = "fallback"
            exclude = exclude | {worker}
            other = self.fallback_worker(exclude) or worker  # one retry, on another worker when there is one
            try:
                return await self.up.relay(request, ctx, other, local_body(body), hashes)
            except UpstreamError as e2:
                if e2.status is not None and 400 <= e2.status < 500:
                    ctx.outcome, ctx.status = "client_error", e2.status
                    return web.Response(status=e2.status, body=e2.body, content_type="application/json")
                return self.give_up(ctx, e2)

    @staticmethod
    def give_up(ctx: Ctx, e: UpstreamError) -> web.Response:
        status = e.status if e.status and e.status >= 500 else (504 if e.cause.endswith("timeout") else 502)
        ctx.outcome, ctx.status = "upstream_error", status
        if e.body and e.status:
            return web.Response(status=status, body=e.body, content_type=e.content_type or "application/json")
        return openai_error(status, f"upstream failed: {e.cause}", "upstream_error")

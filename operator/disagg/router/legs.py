"""Upstream legs: the prefill leg (→ kv_transfer_params) and the relay of a decode/aggregated worker's answer.

Both raise ``UpstreamError`` for anything that fails before a byte reached the client, so that the caller can
retry or fall back. The relay holds back a stream's leading events that carry no token (the chat role chunk)
until a token or an error arrives: an error there (vLLM's in-stream ``data: {"error": ...}``, or a
``finish_reason: "error"`` choice) is a failure of the leg (cause ``generation_error``), exactly like a 5xx.
After the first token is relayed the client is committed: an error then is outcome ``upstream_error_mid_stream``.

Streamed legs and prefill legs to ``http://`` workers use the lean client (rawstream.py); after the commit every
chunk is accounted and written to the client inside the upstream's data callback (``SinkRelay``), with one
client-write deadline per blocked period. Other legs use aiohttp's client (``_stream``: one ``WriteDeadline`` per
stream). docs/router.md has the per-chunk budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from typing_extensions import override

from .. import tracing
from .accounting import derive_phases, worker_request_metrics
from .client_writes import SinkRelay, WriteDeadline
from .core import Legs, OnCommit
from .load import Worker, WorkerSet
from .proxy import (
    COMMIT,
    ERROR,
    StreamAccount,
    StreamStart,
    UpstreamError,
    decode_body,
    has_error_finish,
    is_generation_error,
    local_body,
    prefill_body,
    usage_cached_tokens,
    usage_completion_tokens,
    usage_prompt_tokens,
)
from .rawstream import RawConnectError, RawDisconnectedError, RawPool, RawResponse
from .request import Ctx, decision_headers, fwd_headers, openai_error

# What a client sees when the worker fails after tokens were relayed: vLLM's own in-stream error shape (an SSE event
# with an OpenAI error object, then [DONE]; see docs/simulator.md for vLLM 0.33.0's), so that an OpenAI client raises
# instead of taking a truncated answer for a complete one.
MID_STREAM_ERROR = (b'data: {"error": {"message": "the worker failed mid-stream; the answer is incomplete", '
                    b'"type": "upstream_error", "param": null, "code": 502}}\n\ndata: [DONE]\n\n')


class Upstream:
    """The HTTP side of the legs, shared by a router's requests: the clients (lean and aiohttp), tracing spans,
    the prefill request and the relay. The bookkeeping around each leg (in-flight counts, the prefill backlog,
    the prefix index, passive health) is the request core's (core.py)."""

    def __init__(self, workers: WorkerSet, session: Callable[[], aiohttp.ClientSession],
                 client_write_timeout: float, raw: Callable[[], RawPool | None] = lambda: None) -> None:
        self.workers = workers
        self.raw = raw
        self.session = session
        self.client_write_timeout = client_write_timeout
        self.tracing: tracing.Tracing | None = None  # set by the Router when tracing is on

    def leg_span(self, ctx: Ctx, name: str, url: str, headers: dict[str, str], remote: bool) -> Any:
        """A child span of the request's for one upstream leg, and its ``traceparent`` in ``headers`` (W3C): the
        worker's own request span joins the trace (vLLM: tracing/otel.py:125-129). Only called with tracing on."""
        assert self.tracing is not None
        span = self.tracing.start(name, ctx.span, "CLIENT", attributes={
            "disagg.worker": url, "disagg.remote": remote, "disagg.upstream_request_id": ctx.upstream_id})
        headers["traceparent"] = tracing.traceparent(span)
        state = span.get_span_context().trace_state  # a client's tracestate, carried by the trace (W3C)
        if state:
            headers["tracestate"] = state.to_header()
        return span

    async def prefill_leg(self, request: web.Request, ctx: Ctx, body: dict[str, Any], url: str,
                          deadline: float) -> Any:
        """The prefill leg → the prefill response's kv_transfer_params (opaque). Causes: prefill_*."""
        payload = orjson.dumps(prefill_body(body))
        ctx.mark_upstream()
        headers = fwd_headers(request, ctx.upstream_id)
        span = self.leg_span(ctx, tracing.PREFILL_LEG_SPAN, url, headers, True) if ctx.span is not None else None
        try:
            return await self._prefill_leg(ctx, url, payload, headers, deadline)
        except UpstreamError as e:
            if span is not None:
                span.set_attribute("disagg.error", e.cause)
                _span_error(span, e.cause)
            raise
        finally:
            if span is not None:
                span.end()

    async def _prefill_leg(self, ctx: Ctx, url: str, payload: bytes, headers: dict[str, str],
                           deadline: float) -> Any:
        t = time.monotonic()
        raw = self.raw() if url.startswith("http://") else None  # https: aiohttp
        rr: RawResponse | None = None
        try:
            async with asyncio.timeout(max(deadline - t, 0.001)):
                if raw is not None:  # the lean client (rawstream.py): a fraction of aiohttp's cost per leg
                    rr = await raw.request(url, ctx.endpoint, headers, payload)
                    data = await rr.read()
                    status = rr.status
                else:
                    async with self.session().post(url + ctx.endpoint, data=payload, headers=headers) as r:
                        data = await r.read()
                        status = r.status
        except TimeoutError:
            raise UpstreamError("prefill_timeout", worker=url) from None  # the core tells a queued one apart
        except (aiohttp.ClientConnectorError, RawConnectError):
            raise UpstreamError("prefill_connect_error", worker=url) from None
        except (aiohttp.ClientError, RawDisconnectedError):
            raise UpstreamError("prefill_error", worker=url) from None
        finally:
            if rr is not None:
                rr.close()  # unfinished (timeout, cancel): the worker sees the connection go and aborts
        leg = time.monotonic() - t
        ctx.timings["prefill_leg"] = leg
        if status != 200:
            raise UpstreamError("prefill_rejected" if status < 500 else "prefill_error", status=status, worker=url)
        try:
            resp_body = orjson.loads(data)
            kv = resp_body.get("kv_transfer_params")
        except (orjson.JSONDecodeError, AttributeError):
            raise UpstreamError("prefill_bad_response", worker=url) from None
        if not kv:
            raise UpstreamError("prefill_no_kv_params", worker=url)
        q, compute = worker_request_metrics(resp_body)
        ctx.prefill_reused_tokens = usage_cached_tokens(data)  # the prefill worker's prefix cache (issue 30)
        ctx.engine_prompt_tokens = usage_prompt_tokens(data)  # the engine's count of the prompt (tokenscale.py)
        w = self.workers.get(url)
        if q is not None and compute is not None:  # the prefill worker's own numbers for this request: exact
            ctx.timings["prefill_queue"] = min(q, leg)
            ctx.timings["prefill_compute"] = min(compute, leg)
        elif w is not None:
            q = min(w.avg.get("vllm:request_queue_time_seconds", 0.0), leg)
            ctx.timings["prefill_queue"] = q
            ctx.timings["prefill_compute"] = leg - q
            ctx.estimated.update(("prefill_queue", "prefill_compute"))
        else:
            ctx.timings["prefill_compute"] = leg
        return kv

    async def _first(self, resp: aiohttp.ClientResponse | RawResponse, ctx: Ctx, url: str) -> bytes:
        """Phase A of the relay: read until the first token (streams) or the whole body; raise on errors."""
        if resp.status != 200 or not ctx.stream:
            data = await resp.read()
            if resp.status != 200:
                if is_generation_error(resp.status, data):
                    raise UpstreamError("generation_error", status=resp.status, body=data,
                                        content_type=resp.content_type, worker=url)
                raise UpstreamError("error" if resp.status >= 500 else "rejected", status=resp.status,
                                    body=data, content_type=resp.content_type, worker=url)
            if has_error_finish(data):
                raise UpstreamError("generation_error", worker=url)
            return data
        start = StreamStart()
        while True:
            chunk = await resp.content.readany()
            if not chunk:
                if start.buf and b"data:" not in start.buf:
                    return start.buf  # not an event stream after all: relay it as it is
                # nothing, or only token-less events (e.g. the role chunk), then the end: nothing was served
                raise UpstreamError("empty_response" if not start.buf else "disconnected", worker=url)
            verdict = start.feed(chunk)
            if verdict == ERROR:
                raise UpstreamError("generation_error", worker=url)
            if verdict == COMMIT:
                return start.buf

    async def relay(self, request: web.Request, ctx: Ctx, url: str, body: dict[str, Any],
                    deadline: float | None = None, remote: bool = False,
                    on_commit: OnCommit | None = None) -> web.StreamResponse:
        """Send to a decode/aggregated worker and relay its answer. Raises UpstreamError before the first token;
        ``on_commit`` runs once the first token (or the whole non-streamed answer) has arrived."""
        payload = orjson.dumps(body)
        ctx.decode_worker = url
        ctx.mark_upstream()
        headers = fwd_headers(request, ctx.upstream_id)
        if ctx.span is None:
            return await self._relay(request, ctx, url, payload, headers, deadline, remote, on_commit)
        span = self.leg_span(ctx, tracing.DECODE_LEG_SPAN, url, headers, remote)
        try:
            out = await self._relay(request, ctx, url, payload, headers, deadline, remote, on_commit)
            if ctx.outcome not in ("ok", ""):
                _span_error(span, ctx.outcome)
            return out
        except UpstreamError as e:
            span.set_attribute("disagg.error", e.cause)
            _span_error(span, e.cause)
            raise
        finally:
            span.end()

    async def _relay(self, request: web.Request, ctx: Ctx, url: str, payload: bytes, headers: dict[str, str],
                     deadline: float | None, remote: bool, on_commit: OnCommit | None) -> web.StreamResponse:
        w = self.workers.get(url)
        t_send = time.monotonic()
        raw = self.raw() if ctx.stream and url.startswith("http://") else None  # https: aiohttp
        resp: aiohttp.ClientResponse | RawResponse | None = None
        try:
            try:
                async with (asyncio.timeout(max(deadline - t_send, 0.001)) if deadline else
                            contextlib.nullcontext()):
                    if raw is not None:
                        resp = await raw.request(url, ctx.endpoint, headers, payload)
                    else:
                        resp = await self.session().post(url + ctx.endpoint, data=payload, headers=headers)
                    first = await self._first(resp, ctx, url)
            except TimeoutError:
                raise UpstreamError("timeout", worker=url) from None
            except (aiohttp.ClientConnectorError, RawConnectError):
                raise UpstreamError("connect_error", worker=url) from None
            except (aiohttp.ClientError, RawDisconnectedError):
                raise UpstreamError("disconnected", worker=url) from None
            t_first = time.monotonic()
            if on_commit is not None:
                on_commit()  # may raise (a raced leg that lost): before anything of this leg is recorded
            ctx.timings["decode_ttfb"] = t_first - t_send
            if not ctx.stream:
                ctx.output_tokens = usage_completion_tokens(first)
                ctx.reused_tokens = usage_cached_tokens(first)
                ctx.engine_prompt_tokens = usage_prompt_tokens(first) or ctx.engine_prompt_tokens
                if not remote and b'"queue_time_ms"' in first:  # the worker's per-request metrics
                    with contextlib.suppress(orjson.JSONDecodeError):
                        q, _ = worker_request_metrics(orjson.loads(first))
                        if q is not None:
                            ctx.timings["decode_queue"] = q
                derive_phases(ctx, w, remote, ttfb=None)
                ctx.outcome, ctx.status = "ok", 200
                return web.Response(body=first, status=200, content_type="application/json",
                                    headers=decision_headers(ctx))
            if isinstance(resp, RawResponse):
                return await self._stream_raw(request, ctx, resp, first, t_first, w, remote)
            return await self._stream(request, ctx, resp, first, t_first, w, remote)
        finally:
            if resp is not None:
                resp.close()

    async def _stream_raw(self, request: web.Request, ctx: Ctx, resp: RawResponse, first: bytes,
                          t_first: float, w: Worker | None, remote: bool) -> web.StreamResponse:
        """Phase B on the lean client: every later chunk is accounted and written to the client socket inside
        the upstream connection's data callback (SinkRelay); this coroutine only waits for the end, and for the
        client when its socket buffer is full (then the upstream is paused, under --client-write-timeout)."""
        acct, out = _open_stream(ctx, first, t_first, resp.headers.get("content-type", "text/event-stream"))
        try:
            await out.prepare(request)
            async with asyncio.timeout(self.client_write_timeout):
                await out.write(first)
            transport = request.transport
            if transport is None or transport.is_closing():
                raise ConnectionResetError("client gone")
            relay = SinkRelay(transport, acct, ctx, resp,
                              chunked=out.headers.get("Transfer-Encoding", "").lower() == "chunked")
            resp.relay_to(relay.on_piece, relay.on_end)
            while True:
                await relay.wait()
                if relay.blocked and not relay.done:
                    async with asyncio.timeout(self.client_write_timeout):
                        await request.writer.drain()
                    relay.unblock()
                    continue
                if relay.exc is not None:
                    raise relay.exc
                break
        except (TimeoutError, aiohttp.ClientError, ConnectionResetError, RawDisconnectedError) as e:
            resp.close()
            return await _broken_stream(ctx, acct, out, e)
        return await _finished_stream(ctx, acct, out, w, remote)

    async def _stream(self, request: web.Request, ctx: Ctx, resp: aiohttp.ClientResponse, first: bytes,
                      t_first: float, w: Worker | None, remote: bool) -> web.StreamResponse:
        """Phase B: committed to the client; relay chunks as they come, count tokens, watch for errors."""
        acct, out = _open_stream(ctx, first, t_first, resp.headers.get("Content-Type", "text/event-stream"))
        content = resp.content
        feed = acct.feed
        write = out.write
        mono = time.monotonic
        need_ttft = "ttft" not in ctx.timings
        try:
            await out.prepare(request)
            async with WriteDeadline(self.client_write_timeout) as dl:
                dl.writing, dl.started = True, mono()
                await write(first)
                dl.writing = False
                while chunk := await content.readany():
                    now = mono()
                    feed(chunk, now)
                    if need_ttft and acct.first_at is not None:
                        ctx.timings["ttft"] = acct.first_at - ctx.t0
                        need_ttft = False
                    dl.writing, dl.started = True, now
                    await write(chunk)
                    dl.writing = False
        except (TimeoutError, aiohttp.ClientError, ConnectionResetError) as e:
            resp.close()
            return await _broken_stream(ctx, acct, out, e)
        return await _finished_stream(ctx, acct, out, w, remote)


class HttpLegs(Legs[web.StreamResponse]):
    """One request's HTTP transport for the request core (core.py ``Legs``): the client's request and body, the
    router's ``Upstream``; the answers are aiohttp responses."""

    __slots__ = ("body", "request", "up")

    def __init__(self, up: Upstream, request: web.Request, body: dict[str, Any]) -> None:
        self.up = up
        self.request = request
        self.body = body

    @override
    async def prefill(self, ctx: Ctx, worker: str, deadline: float) -> Any:
        return await self.up.prefill_leg(self.request, ctx, self.body, worker, deadline)

    @override
    async def relay(self, ctx: Ctx, worker: str, kv: Any | None, deadline: float | None, remote: bool,
                    on_commit: OnCommit) -> web.StreamResponse:
        body = local_body(self.body)
        if kv is not None:
            body = decode_body(body, kv)  # the prefill response's kv_transfer_params, verbatim
        return await self.up.relay(self.request, ctx, worker, body, deadline=deadline, remote=remote,
                                   on_commit=on_commit)

    @override
    def error(self, ctx: Ctx, status: int, message: str, type_: str) -> web.StreamResponse:
        return openai_error(status, message, type_)

    @override
    def passthrough(self, ctx: Ctx, e: UpstreamError) -> web.StreamResponse:
        return web.Response(status=ctx.status, body=e.body, content_type="application/json")

    @override
    def give_up(self, ctx: Ctx, e: UpstreamError) -> web.StreamResponse:
        if e.body and e.status:
            return web.Response(status=ctx.status, body=e.body, content_type=e.content_type or "application/json")
        return openai_error(ctx.status, f"upstream failed: {e.cause}", "upstream_error")


def _span_error(span: Any, description: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, description))


async def _broken_stream(ctx: Ctx, acct: StreamAccount, out: web.StreamResponse,
                         e: BaseException) -> web.StreamResponse:
    """A relay that stopped early: the client went away (cancelled), or the worker did after tokens were relayed
    (upstream_error_mid_stream; the client gets vLLM's in-stream error event unless the worker sent one)."""
    client_side = isinstance(e, (TimeoutError, ConnectionResetError, aiohttp.ClientConnectionResetError))
    ctx.outcome, ctx.status = ("cancelled" if client_side else "upstream_error_mid_stream"), 200
    ctx.output_tokens = acct.tokens
    with contextlib.suppress(Exception):
        if not client_side and not acct.error:
            await out.write(MID_STREAM_ERROR)
        await out.write_eof()
    return out


async def _finished_stream(ctx: Ctx, acct: StreamAccount, out: web.StreamResponse, w: Worker | None,
                           remote: bool) -> web.StreamResponse:
    """The worker ended the stream: ok when it finished it ([DONE], no error event); else a mid-stream loss that
    the client learns of from an error event."""
    ctx.output_tokens = acct.tokens
    if (tpot := acct.tpot()) is not None:
        ctx.timings["tpot"] = tpot
    derive_phases(ctx, w, remote, ttfb=ctx.timings.get("decode_ttfb"))
    ctx.reused_tokens = acct.cached_tokens
    ctx.engine_prompt_tokens = acct.prompt_tokens or ctx.engine_prompt_tokens
    ctx.outcome, ctx.status = ("ok" if acct.done and not acct.error else "upstream_error_mid_stream"), 200
    with contextlib.suppress(ConnectionResetError, aiohttp.ClientError):
        if not acct.done and not acct.error:  # the worker closed the stream without finishing it
            await out.write(MID_STREAM_ERROR)
        await out.write_eof()
    return out


def _open_stream(ctx: Ctx, first: bytes, t_first: float, content_type: str) -> tuple[StreamAccount, web.StreamResponse]:
    """Phase B's start, for both relays: account the first chunk (TTFT when it carries a token) and the client's
    response with the decision headers."""
    acct = StreamAccount(chat=ctx.endpoint.endswith("chat/completions"))
    acct.feed(first, t_first)
    out = web.StreamResponse(status=200, headers={
        "Content-Type": content_type, "Cache-Control": "no-cache", **decision_headers(ctx)})
    if acct.first_at is not None:
        ctx.timings["ttft"] = acct.first_at - ctx.t0
    return acct, out

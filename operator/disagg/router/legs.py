"""Upstream legs: the prefill leg (→ kv_transfer_params) and the relay of a decode/aggregated worker's answer.

Both raise ``UpstreamError`` for anything that fails before a byte reached the client, so that the caller can
retry or fall back. The relay holds back a stream's leading events that carry no token (the chat role chunk)
until a token or an error arrives: an error there (vLLM's in-stream ``data: {"error": ...}``, or a
``finish_reason: "error"`` choice) is a failure of the leg (cause ``generation_error``), exactly like a 5xx.
After the first token is relayed the client is committed: an error then is outcome ``upstream_error_mid_stream``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from .accounting import derive_phases
from .load import Worker, WorkerSet
from .metrics import RouterMetrics
from .prefix import PrefixIndex
from .proxy import (
    COMMIT,
    ERROR,
    StreamAccount,
    StreamStart,
    UpstreamError,
    has_error_finish,
    is_generation_error,
    prefill_body,
    usage_completion_tokens,
)
from .request import Ctx, decision_headers, fwd_headers

OnCommit = Callable[[], None]


class Upstream:
    def __init__(self, workers: WorkerSet, metrics: RouterMetrics, prefix: PrefixIndex,
                 session: Callable[[], aiohttp.ClientSession], down_seconds: float,
                 client_write_timeout: float) -> None:
        self.workers = workers
        self.metrics = metrics
        self.prefix = prefix
        self.session = session
        self.down_seconds = down_seconds
        self.client_write_timeout = client_write_timeout

    @contextlib.contextmanager
    def track(self, url: str, pool: str, tokens: int = 0) -> Iterator[Worker | None]:
        w = self.workers.get(url)
        g = self.metrics.inflight.labels(pool)
        g.inc()
        if w is not None:
            w.inflight += 1
            w.inflight_tokens += tokens
        try:
            yield w
        finally:
            g.dec()
            if w is not None:
                w.inflight -= 1
                w.inflight_tokens -= tokens

    def connect_failed(self, url: str) -> None:
        w = self.workers.get(url)
        if w is not None:
            w.down_until = time.monotonic() + self.down_seconds

    async def prefill_leg(self, request: web.Request, ctx: Ctx, body: dict[str, Any], url: str,
                          deadline: float) -> Any:
        """The prefill leg → the prefill response's kv_transfer_params (opaque). Causes: prefill_*."""
        payload = orjson.dumps(prefill_body(body))
        w = self.workers.get(url)
        ahead = w.inflight_tokens if w else 0
        waiting = w.scraped.get("vllm:num_requests_waiting", 0.0) if w else 0.0
        ctx.mark_upstream()
        t = time.monotonic()
        with self.track(url, "prefill", ctx.input_tokens):
            if w is not None:
                w.prefill_started(ctx.input_tokens, t)
            try:
                async with asyncio.timeout(max(deadline - t, 0.001)):
                    async with self.session().post(url + ctx.endpoint, data=payload,
                                                   headers=fwd_headers(request, ctx.upstream_id)) as r:
                        data = await r.read()
                        status = r.status
            except TimeoutError:
                # Queued behind other prefills (ours or other clients') → capacity, not a transport fault.
                queued = ahead > 0 or waiting > 0
                raise UpstreamError("prefill_queue_timeout" if queued else "prefill_timeout", worker=url) from None
            except aiohttp.ClientConnectorError:
                self.connect_failed(url)
                raise UpstreamError("prefill_connect_error", worker=url) from None
            except aiohttp.ClientError:
                raise UpstreamError("prefill_error", worker=url) from None
            finally:
                if w is not None:
                    w.prefill_ended(others_in_flight=w.inflight - 1)
        leg = time.monotonic() - t
        ctx.timings["prefill_leg"] = leg
        if status != 200:
            raise UpstreamError("prefill_rejected" if status < 500 else "prefill_error", status=status, worker=url)
        try:
            kv = orjson.loads(data).get("kv_transfer_params")
        except (orjson.JSONDecodeError, AttributeError):
            raise UpstreamError("prefill_bad_response", worker=url) from None
        if not kv:
            raise UpstreamError("prefill_no_kv_params", worker=url)
        if w is not None:
            w.observe_prefill_leg(leg, ahead + ctx.input_tokens)
            q = min(w.avg.get("vllm:request_queue_time_seconds", 0.0), leg)
            ctx.timings["prefill_queue"] = q
            ctx.timings["prefill_compute"] = leg - q
        else:
            ctx.timings["prefill_compute"] = leg
        return kv

    async def _first(self, resp: aiohttp.ClientResponse, ctx: Ctx, url: str) -> bytes:
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

    async def relay(self, request: web.Request, ctx: Ctx, url: str, body: dict[str, Any], hashes: tuple[int, ...],
                    deadline: float | None = None, remote: bool = False,
                    on_commit: OnCommit | None = None) -> web.StreamResponse:
        """Send to a decode/aggregated worker and relay its answer. Raises UpstreamError before the first token;
        ``on_commit`` runs once the first token (or the whole non-streamed answer) has arrived."""
        payload = orjson.dumps(body)
        role = "aggregated" if (w0 := self.workers.get(url)) is not None and w0.role == "aggregated" else "decode"
        ctx.decode_worker = url
        ctx.mark_upstream()
        t_send = time.monotonic()
        with self.track(url, role) as w:
            resp: aiohttp.ClientResponse | None = None
            try:
                try:
                    async with (asyncio.timeout(max(deadline - t_send, 0.001)) if deadline else
                                contextlib.nullcontext()):
                        resp = await self.session().post(url + ctx.endpoint, data=payload,
                                                         headers=fwd_headers(request, ctx.upstream_id))
                        first = await self._first(resp, ctx, url)
                except TimeoutError:
                    raise UpstreamError("timeout", worker=url) from None
                except aiohttp.ClientConnectorError:
                    self.connect_failed(url)
                    raise UpstreamError("connect_error", worker=url) from None
                except aiohttp.ClientError:
                    raise UpstreamError("disconnected", worker=url) from None
                t_first = time.monotonic()
                ctx.timings["decode_ttfb"] = t_first - t_send
                if on_commit is not None:
                    on_commit()
                self.prefix.insert(url, hashes)
                if not ctx.stream:
                    ctx.output_tokens = usage_completion_tokens(first)
                    derive_phases(ctx, w, remote, ttfb=None)
                    ctx.outcome, ctx.status = "ok", 200
                    return web.Response(body=first, status=200, content_type="application/json",
                                        headers=decision_headers(ctx))
                return await self._stream(request, ctx, resp, first, t_first, w, remote)
            finally:
                if resp is not None:
                    resp.close()

    async def _stream(self, request: web.Request, ctx: Ctx, resp: aiohttp.ClientResponse, first: bytes,
                      t_first: float, w: Worker | None, remote: bool) -> web.StreamResponse:
        """Phase B: committed to the client; relay chunks as they come, count tokens, watch for errors."""
        acct = StreamAccount(chat=ctx.endpoint.endswith("chat/completions"))
        acct.feed(first, t_first)
        out = web.StreamResponse(status=200, headers={
            "Content-Type": resp.headers.get("Content-Type", "text/event-stream"),
            "Cache-Control": "no-cache", **decision_headers(ctx)})
        if acct.first_at is not None:
            ctx.timings["ttft"] = acct.first_at - ctx.t0
        try:
            await out.prepare(request)
            await asyncio.wait_for(out.write(first), self.client_write_timeout)
            async for chunk in resp.content.iter_any():
                acct.feed(chunk)
                if "ttft" not in ctx.timings and acct.first_at is not None:
                    ctx.timings["ttft"] = acct.first_at - ctx.t0
                await asyncio.wait_for(out.write(chunk), self.client_write_timeout)
        except (TimeoutError, aiohttp.ClientError, ConnectionResetError) as e:
            client_side = isinstance(e, (TimeoutError, ConnectionResetError, aiohttp.ClientConnectionResetError))
            ctx.outcome = "cancelled" if client_side else "upstream_error_mid_stream"
            ctx.status = 200
            ctx.output_tokens = acct.tokens
            resp.close()
            with contextlib.suppress(Exception):
                await out.write_eof()
            return out
        ctx.output_tokens = acct.tokens
        if (tpot := acct.tpot()) is not None:
            ctx.timings["tpot"] = tpot
        derive_phases(ctx, w, remote, ttfb=ctx.timings.get("decode_ttfb"))
        ctx.outcome, ctx.status = ("ok" if acct.done and not acct.error else "upstream_error_mid_stream"), 200
        with contextlib.suppress(ConnectionResetError, aiohttp.ClientError):
            await out.write_eof()
        return out

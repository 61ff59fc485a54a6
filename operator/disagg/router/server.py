"""The router's HTTP server (aiohttp): OpenAI-compatible endpoints, the remote/local paths, fallbacks, metrics.

Per request: parse the body once → features → policy.decide() on a load snapshot → run the chosen path:

* remote: prefill leg (deadline transfer_timeout_ms) → decode leg with the prefill response's kv_transfer_params
  verbatim; for streaming requests the deadline also covers the decode leg's first event (the KV hand-off).
  Prefill-leg or KV failure/timeout → onKVTransferTimeout: LocalAggregated (serve it locally, the client sees
  nothing) or Fail (502/504).
* local: the decode worker (or the aggregated pool) prefills itself.
* any decode-side failure before the first byte reaches the client → once more on another worker.

Nothing is sent to the client before the upstream's first body chunk has arrived, so every failure up to that
point can still be retried. Client disconnect cancels the handler (handler_cancellation) and with it the
upstream requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .. import logs
from ..api.contract import RouterConfig
from . import features as F
from .config import ConfigWatcher
from .load import TenantStats, Worker, WorkerSet, parse_prometheus
from .metrics import RouterMetrics
from .policy import Decision, LoadSnapshot, RequestFeatures, Tuning, decide
from .prefix import PrefixIndex
from .proxy import StreamAccount, UpstreamError, decode_body, local_body, prefill_body, usage_completion_tokens

log = logs.get("disagg.router")
reqlog = logs.get("disagg.router.request")

HOP_HEADERS = {"authorization"}  # forwarded from the client to the workers


@dataclass
class RouterOptions:
    max_body_bytes: int = 16 * 1024 * 1024
    chars_per_token: float = F.DEFAULT_CHARS_PER_TOKEN
    scrape_interval: float = 1.0
    scrape_timeout: float = 0.8
    connect_timeout: float = 3.0
    client_write_timeout: float = 30.0  # a client that does not take a chunk for this long is dropped
    down_seconds: float = 3.0  # a worker refusing connections is skipped this long (or until it scrapes)
    tuning: Tuning = field(default_factory=Tuning)
    tokenize: Callable[[str], int] | None = None


def openai_error(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 headers: dict[str, str] | None = None) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": param, "code": status}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json", headers=headers)


@dataclass
class Ctx:
    """One request's bookkeeping (becomes the log line)."""

    request_id: str
    endpoint: str
    stream: bool
    t0: float
    tenant: str = "default"
    decision: str = ""
    reason: str = ""
    path: str = ""
    input_tokens: int = 0
    prefill_worker: str | None = None
    decode_worker: str | None = None
    fallback: str | None = None
    outcome: str = ""
    status: int = 0
    output_tokens: int | None = None
    timings: dict[str, float] = field(default_factory=dict)
    first_upstream_at: float | None = None
    upstream_id: str = ""  # X-Request-Id sent on both legs

    def mark_upstream(self) -> None:
        if self.first_upstream_at is None:
            self.first_upstream_at = time.monotonic()


class Router:
    def __init__(self, watcher: ConfigWatcher, workers: WorkerSet, options: RouterOptions | None = None,
                 metrics: RouterMetrics | None = None) -> None:
        self.watcher = watcher
        self.workers = workers
        self.opts = options or RouterOptions()
        self.metrics = metrics or RouterMetrics()
        self.prefix = PrefixIndex()
        self.tenants = TenantStats()
        self.session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task] = []
        watcher.on_reload = lambda ok: self.metrics.config_reloads.labels("ok" if ok else "error").inc()

    @property
    def config(self) -> RouterConfig:
        return self.watcher.config

    # ------------------------------------------------------------------------------------------ lifecycle

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.opts.max_body_bytes)
        app.router.add_post("/v1/completions", self.handle_completion)
        app.router.add_post("/v1/chat/completions", self.handle_completion)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_get("/health", self.handle_health)
        app.router.add_get("/ready", self.handle_ready)
        app.router.add_get("/metrics", self.handle_metrics)
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _startup(self, app: web.Application) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=30, enable_cleanup_closed=True),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.opts.connect_timeout),
            json_serialize=lambda o: orjson.dumps(o).decode(), auto_decompress=False,
        )
        self._tasks.append(asyncio.create_task(self._scrape_loop(), name="scrape"))
        if self.watcher.path is not None:
            self._tasks.append(asyncio.create_task(self.watcher.run(), name="config"))

    def add_task(self, coro: Awaitable[Any], name: str) -> None:
        self._tasks.append(asyncio.ensure_future(coro))

    async def _cleanup(self, app: web.Application) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        if self.session is not None:
            await self.session.close()

    # ------------------------------------------------------------------------------------------ scraping

    async def _scrape_one(self, w: Worker) -> None:
        assert self.session is not None
        try:
            async with self.session.get(w.url + "/metrics",
                                        timeout=aiohttp.ClientTimeout(total=self.opts.scrape_timeout)) as r:
                if r.status != 200:
                    return
                text = await r.text()
            w.update_scrape(parse_prometheus(text))
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError):
            w.down_until = time.monotonic() + self.opts.down_seconds
        except (TimeoutError, aiohttp.ClientError, ValueError):
            pass

    async def _scrape_loop(self) -> None:
        while True:
            ws = self.workers.all()
            if ws:
                await asyncio.gather(*(self._scrape_one(w) for w in ws), return_exceptions=True)
            for pool in WorkerSet.ROLES:
                self.metrics.workers.labels(pool).set(len(self.workers.ready(pool)))
            ests = [w.est_prefill_wait_s() for w in self.workers.ready("prefill")]
            self.metrics.prefill_wait_estimate.set(min(ests) if ests else 0.0)
            await asyncio.sleep(self.opts.scrape_interval)

    # ------------------------------------------------------------------------------------------ small endpoints

    async def handle_health(self, request: web.Request) -> web.Response:
        return web.json_response({
            "status": "ok",
            "mode": self.config.effective_mode().value,
            "config_generation": self.watcher.generation,
            "workers": {r: len(self.workers.ready(r)) for r in WorkerSet.ROLES},
        }, dumps=lambda o: orjson.dumps(o).decode())

    async def handle_ready(self, request: web.Request) -> web.Response:
        n = len(self.workers.ready("decode")) + len(self.workers.ready("aggregated"))
        if n == 0:
            return web.json_response({"ready": False, "reason": "no ready decode or aggregated worker"}, status=503)
        return web.json_response({"ready": True})

    async def handle_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def handle_models(self, request: web.Request) -> web.Response:
        assert self.session is not None
        for w in self.workers.ready("decode") + self.workers.ready("aggregated"):
            try:
                async with self.session.get(w.url + "/v1/models", timeout=aiohttp.ClientTimeout(total=5),
                                            headers=self._fwd_headers(request, None)) as r:
                    if r.status == 200:
                        return web.Response(body=await r.read(), content_type="application/json")
            except (TimeoutError, aiohttp.ClientError):
                continue
        name = self.config.model
        data = [{"id": name, "object": "model", "owned_by": "disagg", "created": 0}] if name else []
        return web.json_response({"object": "list", "data": data})

    # ------------------------------------------------------------------------------------------ completions

    def _fwd_headers(self, request: web.Request, request_id: str | None) -> dict[str, str]:
        h = {k: v for k, v in request.headers.items() if k.lower() in HOP_HEADERS}
        if request_id:
            h["X-Request-Id"] = request_id
        h["Content-Type"] = "application/json"
        return h

    def _snapshot(self, hashes: tuple[int, ...], tenant: str) -> LoadSnapshot:
        def loads(role: str, with_prefix: bool):
            return tuple(w.load(self.prefix.match_tokens(w.url, hashes) if with_prefix else 0)
                         for w in self.workers.ready(role))

        return LoadSnapshot(prefill=loads("prefill", False), decode=loads("decode", True),
                            aggregated=loads("aggregated", True), tenant_avg_output_tokens=self.tenants.get(tenant))

    @staticmethod
    def _decision_headers(ctx: Ctx) -> dict[str, str]:
        """Response headers telling the client which path served it and why (debugging, demo, benchmarks)."""
        return {"X-Request-Id": ctx.request_id, "X-Disagg-Decision": ctx.decision, "X-Disagg-Reason": ctx.reason,
                "X-Disagg-Path": ctx.path}

    async def handle_completion(self, request: web.Request) -> web.StreamResponse:
        t0 = time.monotonic()
        client_rid = request.headers.get("X-Request-Id")
        rid = client_rid or f"disagg-{uuid.uuid4().hex}"
        ctx = Ctx(request_id=rid, endpoint=request.path, stream=False, t0=t0)
        # vLLM keys requests (and NIXL notifications) by this id: make it unique even when clients reuse theirs
        ctx.upstream_id = f"{client_rid[:200]}-{uuid.uuid4().hex[:8]}" if client_rid else rid
        try:
            return await self._handle(request, ctx)
        except asyncio.CancelledError:
            ctx.outcome = ctx.outcome or "cancelled"
            ctx.status = ctx.status or 499
            raise
        except Exception as e:
            log.exception("router_internal_error", request_id=rid)
            ctx.outcome, ctx.status = "internal_error", 500
            return openai_error(500, f"router error: {type(e).__name__}", "internal_server_error")
        finally:
            self._finish(ctx)

    async def _handle(self, request: web.Request, ctx: Ctx) -> web.StreamResponse:
        cfg = self.config
        # ---- body
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            ctx.outcome, ctx.status = "client_error", 413
            return openai_error(413, f"request body larger than {self.opts.max_body_bytes} bytes")
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            ctx.outcome, ctx.status = "client_error", 400
            return openai_error(400, f"invalid JSON body: {e}")
        try:
            if not isinstance(body, dict):
                raise F.BadRequest("request body must be a JSON object")
            model = body.get("model")
            if model is not None and not isinstance(model, str):
                raise F.BadRequest("'model' must be a string", "model")
            if cfg.model and model is not None and model != cfg.model:
                raise F.BadRequest(f"The model `{model}` does not exist.", "model", 404, "NotFoundError")
            stream = body.get("stream", False)
            if stream is None:
                stream = False
            if not isinstance(stream, bool):
                raise F.BadRequest("'stream' must be a boolean", "stream")
            so = body.get("stream_options")
            if so is not None and not isinstance(so, dict):
                raise F.BadRequest("'stream_options' must be an object", "stream_options")
            view = F.prompt_view(ctx.endpoint, body)
            max_tokens = F.requested_max_tokens(body)
        except F.BadRequest as e:
            ctx.outcome, ctx.status = "client_error", e.code
            return openai_error(e.code, e.message, e.type, e.param)
        ctx.stream = stream
        ctx.input_tokens = F.count_input_tokens(view, self.opts.chars_per_token, self.opts.tokenize)
        hashes = F.prefix_block_hashes(view, self.opts.chars_per_token)
        tenant = F.match_tenant(request.headers, cfg.routing.tenants)
        tname = tenant.name if tenant else "default"
        feats = RequestFeatures(request_id=ctx.request_id, endpoint=ctx.endpoint, input_tokens=ctx.input_tokens,
                                max_tokens=max_tokens, tenant=tenant.name if tenant else None,
                                canary_fraction=F.request_hash_fraction(ctx.request_id))
        d = decide(cfg, feats, self._snapshot(hashes, tname), self.opts.tuning)
        ctx.tenant, ctx.decision, ctx.reason = d.tenant, d.decision, d.reason
        self.metrics.decisions.labels(d.decision, d.reason).inc()
        if d.est_prefill_wait_ms is not None:
            ctx.timings["est_prefill_wait"] = d.est_prefill_wait_ms / 1000.0

        if d.decision == "reject":
            ctx.outcome, ctx.status, ctx.path = "rejected", d.status, "none"
            msg = {"prefill_queue_overload": "prefill queue is overloaded, retry later",
                   "no_decode_worker": "no ready worker for this model"}.get(d.reason, d.reason)
            return openai_error(d.status, msg, "server_overloaded" if d.status == 429 else "service_unavailable",
                                headers={"Retry-After": "1"})

        if d.decision == "remote":
            ctx.path = "remote"
            resp = await self._remote(request, ctx, cfg, body, d, hashes)
        else:
            ctx.path = "local"
            resp = await self._local(request, ctx, body, d.decode, hashes, exclude=set())
        return resp

    # ------------------------------------------------------------------------------------------ paths

    def _fallback_worker(self, exclude: set[str], prefer: str | None = None) -> str | None:
        """A worker for local/aggregated serving: the aggregated pool first, else the least loaded decode worker."""
        for role in ("aggregated", "decode"):
            cands = [w for w in self.workers.ready(role) if w.url not in exclude]
            if cands:
                if prefer and any(w.url == prefer for w in cands):
                    return prefer
                return min(cands, key=lambda w: (w.inflight, w.url)).url
        return None

    async def _remote(self, request: web.Request, ctx: Ctx, cfg: RouterConfig, body: dict, d: Decision,
                      hashes: tuple[int, ...]) -> web.StreamResponse:
        assert d.prefill and d.decode
        deadline = time.monotonic() + cfg.transfer_timeout_ms / 1000.0
        ctx.prefill_worker = d.prefill
        try:
            kv = await self._prefill_leg(request, ctx, body, d.prefill, deadline)
        except UpstreamError as e:
            return await self._after_remote_failure(request, ctx, cfg, body, hashes, e, exclude=set())
        # decode leg: the KV hand-off must start streaming by the deadline (streaming requests only)
        try:
            return await self._relay(request, ctx, d.decode, decode_body(local_body(body), kv), hashes,
                                     deadline=deadline if ctx.stream else None, remote=True)
        except UpstreamError as e:
            if e.cause == "timeout":
                e.cause = "kv_transfer_timeout"
            elif e.status is not None and 400 <= e.status < 500:
                e.cause = "decode_rejected"
            elif not e.cause.startswith("decode"):
                e.cause = "decode_" + e.cause
            return await self._after_remote_failure(request, ctx, cfg, body, hashes, e, exclude={d.decode})

    async def _after_remote_failure(self, request, ctx: Ctx, cfg: RouterConfig, body: dict,
                                    hashes: tuple[int, ...], e: UpstreamError, exclude: set[str]):
        ctx.fallback = e.cause
        self.metrics.fallbacks.labels(e.cause).inc()
        kv_cause = not e.cause.startswith("decode_") or e.cause == "decode_rejected"
        if kv_cause and cfg.routing.fallback.on_kv_transfer_timeout == "Fail":
            status = 504 if "timeout" in e.cause else 502
            ctx.outcome, ctx.status = "upstream_error", status
            return openai_error(status, f"remote prefill failed: {e.cause}", "upstream_error")
        ctx.path = "fallback"
        worker = self._fallback_worker(exclude) or self._fallback_worker(set())
        if worker is None:
            ctx.outcome, ctx.status = "upstream_error", 503
            return openai_error(503, "no worker available for the fallback path", "service_unavailable")
        return await self._local(request, ctx, body, worker, hashes, exclude=exclude, retried=bool(exclude))

    async def _local(self, request: web.Request, ctx: Ctx, body: dict, worker: str | None,
                     hashes: tuple[int, ...], exclude: set[str], retried: bool = False) -> web.StreamResponse:
        worker = worker or self._fallback_worker(exclude)
        if worker is None:
            ctx.outcome, ctx.status = "upstream_error", 503
            return openai_error(503, "no ready worker for this model", "service_unavailable")
        try:
            return await self._relay(request, ctx, worker, local_body(body), hashes)
        except UpstreamError as e:
            if e.status is not None and 400 <= e.status < 500 and e.status not in (408, 429):
                # the worker refused the request itself: the client's error, pass it through
                ctx.outcome, ctx.status = "client_error", e.status
                return web.Response(status=e.status, body=e.body, content_type="application/json")
            if retried:
                return self._give_up(ctx, e)
            cause = "decode_" + e.cause if not e.cause.startswith("decode") else e.cause
            ctx.fallback = ctx.fallback or cause
            self.metrics.fallbacks.labels(cause).inc()
            ctx.path = "fallback"
            exclude = exclude | {worker}
            other = self._fallback_worker(exclude) or worker  # one retry, on another worker when there is one
            try:
                return await self._relay(request, ctx, other, local_body(body), hashes)
            except UpstreamError as e2:
                if e2.status is not None and 400 <= e2.status < 500:
                    ctx.outcome, ctx.status = "client_error", e2.status
                    return web.Response(status=e2.status, body=e2.body, content_type="application/json")
                return self._give_up(ctx, e2)

    def _give_up(self, ctx: Ctx, e: UpstreamError) -> web.Response:
        status = e.status if e.status and e.status >= 500 else (504 if e.cause.endswith("timeout") else 502)
        ctx.outcome, ctx.status = "upstream_error", status
        if e.body and e.status:
            return web.Response(status=status, body=e.body, content_type=e.content_type or "application/json")
        return openai_error(status, f"upstream failed: {e.cause}", "upstream_error")

    # ------------------------------------------------------------------------------------------ legs

    @contextlib.contextmanager
    def _track(self, url: str, pool: str, tokens: int = 0):
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

    def _connect_failed(self, url: str) -> None:
        w = self.workers.get(url)
        if w is not None:
            w.down_until = time.monotonic() + self.opts.down_seconds

    async def _prefill_leg(self, request: web.Request, ctx: Ctx, body: dict, url: str, deadline: float) -> Any:
        assert self.session is not None
        payload = orjson.dumps(prefill_body(body))
        w = self.workers.get(url)
        ahead = w.inflight_tokens if w else 0
        ctx.mark_upstream()
        t = time.monotonic()
        with self._track(url, "prefill", ctx.input_tokens):
            if w is not None:
                w.prefill_started(ctx.input_tokens, t)
            try:
                async with asyncio.timeout(max(deadline - t, 0.001)):
                    async with self.session.post(url + ctx.endpoint, data=payload,
                                                 headers=self._fwd_headers(request, ctx.upstream_id)) as r:
                        data = await r.read()
                        status = r.status
            except TimeoutError:
                raise UpstreamError("prefill_timeout", worker=url) from None
            except aiohttp.ClientConnectorError:
                self._connect_failed(url)
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

    async def _relay(self, request: web.Request, ctx: Ctx, url: str, body: dict, hashes: tuple[int, ...],
                     deadline: float | None = None, remote: bool = False) -> web.StreamResponse:
        """Send to a decode/aggregated worker and relay its answer. Raises UpstreamError before the first byte."""
        assert self.session is not None
        payload = orjson.dumps(body)
        role = "aggregated" if (w0 := self.workers.get(url)) is not None and w0.role == "aggregated" else "decode"
        ctx.decode_worker = url
        ctx.mark_upstream()
        t_send = time.monotonic()
        with self._track(url, role) as w:
            resp: aiohttp.ClientResponse | None = None
            try:
                # ---- phase A: until the first body chunk (retryable)
                try:
                    async with (asyncio.timeout(max(deadline - t_send, 0.001)) if deadline else
                                contextlib.nullcontext()):
                        resp = await self.session.post(url + ctx.endpoint, data=payload,
                                                       headers=self._fwd_headers(request, ctx.upstream_id))
                        if resp.status != 200 or not ctx.stream:
                            data = await resp.read()
                            if resp.status != 200:
                                raise UpstreamError("error" if resp.status >= 500 else "rejected", status=resp.status,
                                                    body=data, content_type=resp.content_type, worker=url)
                            first = data
                        else:
                            first = await resp.content.readany()
                            if not first:
                                raise UpstreamError("empty_response", worker=url)
                except TimeoutError:
                    raise UpstreamError("timeout", worker=url) from None
                except aiohttp.ClientConnectorError:
                    self._connect_failed(url)
                    raise UpstreamError("connect_error", worker=url) from None
                except aiohttp.ClientError:
                    raise UpstreamError("disconnected", worker=url) from None
                t_first = time.monotonic()
                ctx.timings["decode_ttfb"] = t_first - t_send
                self.prefix.insert(url, hashes)
                if not ctx.stream:
                    ctx.output_tokens = usage_completion_tokens(first)
                    self._derive_phases(ctx, w, remote, ttfb=None)
                    ctx.outcome, ctx.status = "ok", 200
                    return web.Response(body=first, status=200, content_type="application/json",
                                        headers=self._decision_headers(ctx))
                # ---- phase B: committed to the client
                acct = StreamAccount(chat=ctx.endpoint.endswith("chat/completions"))
                acct.feed(first, t_first)
                out = web.StreamResponse(status=200, headers={
                    "Content-Type": resp.headers.get("Content-Type", "text/event-stream"),
                    "Cache-Control": "no-cache", **self._decision_headers(ctx)})
                if acct.first_at is not None:
                    ctx.timings["ttft"] = acct.first_at - ctx.t0
                try:
                    await out.prepare(request)
                    await asyncio.wait_for(out.write(first), self.opts.client_write_timeout)
                    async for chunk in resp.content.iter_any():
                        acct.feed(chunk)
                        if "ttft" not in ctx.timings and acct.first_at is not None:
                            ctx.timings["ttft"] = acct.first_at - ctx.t0
                        await asyncio.wait_for(out.write(chunk), self.opts.client_write_timeout)
                except (TimeoutError, aiohttp.ClientError, ConnectionResetError) as e:
                    client_side = isinstance(e, (asyncio.TimeoutError, ConnectionResetError)) or \
                        isinstance(e, aiohttp.ClientConnectionResetError)
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
                self._derive_phases(ctx, w, remote, ttfb=ctx.timings.get("decode_ttfb"))
                ctx.outcome, ctx.status = ("ok" if acct.done else "upstream_error_mid_stream"), 200
                with contextlib.suppress(ConnectionResetError, aiohttp.ClientError):
                    await out.write_eof()
                return out
            finally:
                if resp is not None:
                    resp.close()

    def _derive_phases(self, ctx: Ctx, w: Worker | None, remote: bool, ttfb: float | None) -> None:
        """Phases inside vLLM, from the decode worker's recent metric averages (capped by what the router saw)."""
        if w is None:
            return
        cap = ttfb if ttfb is not None else float("inf")
        q = w.avg.get("vllm:request_queue_time_seconds")
        if q is not None:
            ctx.timings["decode_queue"] = min(q, cap)
        if not remote:
            return
        pack = w.avg.get("vllm:nixl_post_time_seconds")
        xfer = w.avg.get("vllm:nixl_xfer_time_seconds")
        if pack is not None:
            ctx.timings["kv_pack"] = min(pack, cap)
        if xfer is not None:
            ctx.timings["kv_transfer"] = min(xfer, max(cap - ctx.timings.get("kv_pack", 0.0), 0.0))
        if ttfb is not None and xfer is not None:
            step = w.avg.get("vllm:time_per_output_token_seconds") or w.avg.get(
                "vllm:request_time_per_output_token_seconds") or 0.0
            explained = ctx.timings.get("decode_queue", 0.0) + ctx.timings.get("kv_pack", 0.0) + \
                ctx.timings["kv_transfer"] + step
            ctx.timings["kv_unpack"] = max(ttfb - explained, 0.0)

    # ------------------------------------------------------------------------------------------ accounting

    def _finish(self, ctx: Ctx) -> None:
        e2e = time.monotonic() - ctx.t0
        ctx.timings["e2e"] = e2e
        if ctx.first_upstream_at is not None:
            ctx.timings["request_queue"] = ctx.first_upstream_at - ctx.t0
        path = ctx.path or "none"
        m = self.metrics
        m.requests.labels(ctx.outcome or "unknown", path).inc()
        if path in ("remote", "local", "fallback") and ctx.outcome == "ok":
            tl = (path, ctx.tenant)
            t = ctx.timings
            m.phase["request_queue_wait"].labels(*tl).observe(t.get("request_queue", 0.0))
            for phase, key in (("prefill_compute", "prefill_compute"), ("kv_cache_pack", "kv_pack"),
                               ("kv_cache_transfer", "kv_transfer"), ("kv_cache_unpack", "kv_unpack"),
                               ("decode_queue_wait", "decode_queue"), ("first_token_emit", "ttft"),
                               ("per_token_decode", "tpot")):
                if key in t:
                    m.phase[phase].labels(*tl).observe(t[key])
            if ctx.output_tokens is not None:
                self.tenants.observe(ctx.tenant, ctx.output_tokens)
            slo = self.config.slo
            if ctx.stream:
                ttft_ok = t.get("ttft", e2e) * 1000 <= slo.ttft_p95_ms
                tpot_ok = "tpot" not in t or t["tpot"] * 1000 <= slo.tpot_p95_ms
                met = ttft_ok and tpot_ok
            else:
                n = ctx.output_tokens or 1
                met = e2e * 1000 <= slo.ttft_p95_ms + slo.tpot_p95_ms * max(n - 1, 0)
            m.slo_requests.labels(ctx.tenant).inc()
            if met:
                m.slo_met.labels(ctx.tenant).inc()
        reqlog.info(
            "request", request_id=ctx.request_id, upstream_request_id=ctx.upstream_id, endpoint=ctx.endpoint,
            tenant=ctx.tenant, stream=ctx.stream, input_tokens=ctx.input_tokens, output_tokens=ctx.output_tokens,
            decision=ctx.decision, reason=ctx.reason, path=path, fallback=ctx.fallback,
            prefill_worker=ctx.prefill_worker, decode_worker=ctx.decode_worker, outcome=ctx.outcome, status=ctx.status,
            timings_ms={k: round(v * 1000, 3) for k, v in ctx.timings.items()},
        )

"""The router's HTTP server (aiohttp): app, lifecycle, the small endpoints, and the per-request flow.

Per request: read and validate the body once (request.py) → features → the decision and the chosen path with
its fallbacks in the request core (core.py: the snapshot, policy.decide, a mode probe while the operator holds the
model Aggregated, the breaker ticket; the same core runs the twin), over HTTP legs (legs.py) → accounting
(accounting.py: metrics and the log line). Worker scraping is in scrape.py, connection hygiene in connections.py.

Nothing is sent to the client before the upstream's first token has arrived, so every failure up to that point can
still be retried. Client disconnect cancels the handler (handler_cancellation) and with it the upstream requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from .. import logs, tracing
from ..api.contract import RouterConfig
from . import features
from .accounting import Accounting, end_span
from .config import ConfigWatcher
from .connections import ConnectionGuard, GuardedRunner
from .core import RequestCore
from .kvsub import Endpoints, KVSubscriber
from .legs import HttpLegs, Upstream
from .load import WorkerSet
from .metrics import RouterMetrics
from .policy_types import Tuning
from .rawstream import RawPool
from .request import Ctx, fwd_headers, openai_error, parse_request
from .scrape import Scraper

log = logs.get("disagg.router")

__all__ = ["Router", "RouterOptions", "openai_error"]


@dataclass
class RouterOptions:
    max_body_bytes: int = 16 * 1024 * 1024
    chars_per_token: float = features.DEFAULT_CHARS_PER_TOKEN
    scrape_interval: float = 1.0
    scrape_timeout: float = 0.8
    connect_timeout: float = 3.0
    client_write_timeout: float = 30.0  # a client that does not take a chunk for this long is dropped
    down_seconds: float = 3.0  # a worker refusing connections is skipped this long (or until it scrapes)
    header_timeout: float = 10.0  # a connection must send a complete request head within this (0: off)
    idle_timeout: float = 75.0  # an idle keep-alive connection is closed after this
    max_connections: int = 4096  # further connections are closed at once
    tuning: Tuning = field(default_factory=Tuning)
    tokenize: Callable[[str], int] | None = None
    workers: int = 1  # processes of this replica (--workers): each takes 1/workers of the probe rate
    otlp_traces_endpoint: str | None = None  # OTLP/HTTP traces URL; None: tracing off (no span objects at all)
    trace_sample_ratio: str | float | None = None  # validated at start (bad → default, a log line and a count)
    # each worker's KV cache events (kvsub.py): its PUB (and replay) endpoints; None: the router does not subscribe
    # and the prefix index is the estimate alone
    kv_events: Endpoints | None = None
    kv_events_topic: str = ""


# The router's own refusals (decision reject): the OpenAI error body's message; admission's carry their reason as
# the body's ``code`` too (docs/router.md "Admission and overload").
REJECT_MESSAGES = {
    "prefill_queue_overload": "prefill queue is overloaded, retry later",
    "no_decode_worker": "no ready worker for this model",
    "overload_shed": "the deployment is past its capacity for this tenant (predicted time to first token over the "
                     "SLO); retry after the Retry-After seconds",
    "admission_queue_full": "too many of this tenant's requests are waiting for capacity; retry later",
    "admission_queue_timeout": "the request waited for capacity longer than the tenant's maxQueueTimeMs; retry "
                               "later",
}


class Router:
    def __init__(self, watcher: ConfigWatcher, workers: WorkerSet, options: RouterOptions | None = None,
                 metrics: RouterMetrics | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.watcher = watcher
        self.workers = workers
        self.opts = options or RouterOptions()
        self.metrics = metrics or RouterMetrics()
        self.clock = clock
        # decision → path → fallback and the worker bookkeeping: the one request core, shared with the twin
        self.core: RequestCore[web.StreamResponse] = RequestCore(
            workers, self.metrics, self.opts.tuning, clock=clock, down_seconds=self.opts.down_seconds,
            probe_rate_scale=1.0 / max(self.opts.workers, 1))
        self.session: aiohttp.ClientSession | None = None
        self.raw: RawPool | None = None
        self.upstream = Upstream(workers, self._session, self.opts.client_write_timeout, raw=lambda: self.raw)
        self.accounting = Accounting(self.metrics, self.core.tenants, lambda: self.config.slo)
        self.scraper = Scraper(workers, self.metrics, self._session, self.opts.scrape_interval,
                               self.opts.scrape_timeout, self.opts.down_seconds)
        self.connections = ConnectionGuard(self.metrics, self.opts.header_timeout, self.opts.max_connections)
        self._tasks: list[asyncio.Task[None]] = []
        self.kv_subscriber: KVSubscriber | None = None
        watcher.on_reload = lambda ok: self.metrics.config_reloads.labels("ok" if ok else "error").inc()
        self.tracing: tracing.Tracing | None = None
        if self.opts.otlp_traces_endpoint:
            def count(reason: str) -> None:
                self.metrics.tracing_errors.labels(reason).inc()

            ratio = tracing.parse_sample_ratio(self.opts.trace_sample_ratio, count)
            self.tracing = tracing.setup(self.opts.otlp_traces_endpoint, "disagg-router", ratio, count)
        self.upstream.tracing = self.tracing

    @property
    def config(self) -> RouterConfig:
        return self.watcher.config

    def _session(self) -> aiohttp.ClientSession:
        assert self.session is not None, "router not started"
        return self.session

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

    def runner(self, **kwargs: Any) -> web.AppRunner:
        """An AppRunner for app() with the connection limits applied (header/idle timeouts, cap)."""
        return GuardedRunner(self.app(), self.connections, handler_cancellation=True,
                             keepalive_timeout=self.opts.idle_timeout, **kwargs)

    async def _startup(self, _app: web.Application) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=30, enable_cleanup_closed=True),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.opts.connect_timeout),
            json_serialize=lambda o: orjson.dumps(o).decode(), auto_decompress=False,
        )
        self.raw = RawPool(self.opts.connect_timeout)
        self._tasks.append(asyncio.create_task(self.scraper.run(), name="scrape"))
        if self.opts.kv_events is not None:
            self.kv_subscriber = KVSubscriber(self.core.kv, self.metrics, self.opts.kv_events,
                                              self.opts.kv_events_topic)
            self._tasks.append(asyncio.create_task(
                self.kv_subscriber.run(lambda: [w.url for w in self.workers.all()], self.opts.scrape_interval),
                name="kv-events"))
        if self.watcher.path is not None:
            self._tasks.append(asyncio.create_task(self.watcher.run(), name="config"))

    async def _cleanup(self, _app: web.Application) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        if self.kv_subscriber is not None:
            await self.kv_subscriber.close()
        if self.session is not None:
            await self.session.close()
        if self.raw is not None:
            self.raw.close()
        if self.tracing is not None:
            self.tracing.shutdown()  # flushes what is batched

    # ------------------------------------------------------------------------------------------ small endpoints

    async def handle_health(self, _request: web.Request) -> web.Response:
        return web.json_response({
            "status": "ok",
            "mode": self.config.effective_mode().value,
            "config_generation": self.watcher.generation,
            "workers": {r: len(self.workers.ready(r)) for r in WorkerSet.ROLES},
        }, dumps=lambda o: orjson.dumps(o).decode())

    async def handle_ready(self, _request: web.Request) -> web.Response:
        n = len(self.workers.ready("decode")) + len(self.workers.ready("aggregated"))
        if n == 0:
            return web.json_response({"ready": False, "reason": "no ready decode or aggregated worker"}, status=503)
        return web.json_response({"ready": True})

    async def handle_metrics(self, _request: web.Request) -> web.Response:
        body, content_type = self.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def handle_models(self, request: web.Request) -> web.Response:
        for w in self.workers.ready("decode") + self.workers.ready("aggregated"):
            try:
                async with self._session().get(w.url + "/v1/models", timeout=aiohttp.ClientTimeout(total=5),
                                               headers=fwd_headers(request, None)) as r:
                    if r.status == 200:
                        return web.Response(body=await r.read(), content_type="application/json")
            except (TimeoutError, aiohttp.ClientError):
                continue
        name = self.config.model
        data = [{"id": name, "object": "model", "owned_by": "disagg", "created": 0}] if name else []
        return web.json_response({"object": "list", "data": data})

    # ------------------------------------------------------------------------------------------ completions

    async def handle_completion(self, request: web.Request) -> web.StreamResponse:
        t0 = time.monotonic()
        client_rid = request.headers.get("X-Request-Id")
        rid = client_rid or f"disagg-{uuid.uuid4().hex}"
        ctx = Ctx(request_id=rid, endpoint=request.path, stream=False, t0=t0, arrival_unix=time.time())
        # vLLM keys requests (and NIXL notifications) by this id: make it unique even when clients reuse theirs
        ctx.upstream_id = f"{client_rid[:200]}-{uuid.uuid4().hex[:8]}" if client_rid else rid
        if self.tracing is not None:  # a client's traceparent is the parent; else sampled at the configured ratio
            ctx.span = self.tracing.start(tracing.ROUTER_SPAN, tracing.parent_context(request.headers), "SERVER",
                                          tracing.epoch_ns(t0))
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
            self.accounting.finish(ctx)
            if ctx.span is not None:
                end_span(ctx)

    async def _handle(self, request: web.Request, ctx: Ctx) -> web.StreamResponse:
        cfg = self.config
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            ctx.outcome, ctx.status = "client_error", 413
            return openai_error(413, f"request body larger than {self.opts.max_body_bytes} bytes")
        try:
            req = parse_request(raw, ctx.endpoint, cfg.model)
        except features.BadRequestError as e:
            ctx.outcome, ctx.status = "client_error", e.code
            return openai_error(e.code, e.message, e.type, e.param)
        ctx.stream = req.stream
        self.core.count_prompt(ctx, features.count_input_tokens(req.view, self.opts.chars_per_token,
                                                                self.opts.tokenize),
                               text_estimate=req.view.token_ids is None and self.opts.tokenize is None)
        hashes = features.prefix_block_hashes(req.view, self.opts.chars_per_token)
        if req.view.token_ids is not None:  # exact prefix matches (kvindex.py) need the prompt's token ids
            ctx.token_ids = req.view.token_ids
            ctx.token_keys[features.PREFIX_BLOCK_TOKENS] = hashes  # the same keys (features.token_block_keys)
        tenant = features.match_tenant(request.headers, cfg.routing.tenants)
        # the decision, and admission under overload (a wait in the router's queue counts in the TTFT: t0)
        d, ticket = await self.core.admit(ctx, cfg, tenant.name if tenant else None, req.max_tokens, hashes)

        if d.decision == "reject":
            # admission's refusals are the tenant's overload policy at work (outcome shed), not service errors
            shed = ctx.admission == "shed"
            ctx.outcome, ctx.status, ctx.path = "shed" if shed else "rejected", d.status, "none"
            msg = REJECT_MESSAGES.get(d.reason, d.reason)
            code = d.reason if shed else None
            return openai_error(d.status, msg, "server_overloaded" if d.status == 429 else "service_unavailable",
                                headers={"Retry-After": str(d.detail.get("retry_after", 1))}, code=code)
        # under priority scheduling every leg carries the tenant's priority, not one the client chose
        body = req.body if ctx.priority is None else {**req.body, "priority": ctx.priority}
        return await self.core.serve(ctx, cfg, d, hashes, ticket, HttpLegs(self.upstream, request, body))

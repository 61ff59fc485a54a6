"""Fixtures for the router tests.

* ``FakeWorker``: a tiny in-process aiohttp stand-in for a vLLM worker that speaks the NixlConnector proxy
  protocol (prefill answers with opaque kv_transfer_params, decode streams tokens) and records what it got,
  with simple faults. For fast proxy tests only; the end-to-end tests use real ``disagg sim`` processes.
* ``router_factory``: an in-process Router (disagg.router.server) on a free loopback port.
* ``free_port``, ``wait_http`` fixtures: disagg.local.procs's, for subprocess tests; ``processes`` (one
  disagg.local.procs.Processes per module) with ``start_sim`` / ``start_router``: real sims and routers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from disagg.api.contract import RouterConfig
from disagg.local.procs import Proc, Processes, free_port, wait_http
from disagg.router.config import ConfigWatcher
from disagg.router.load import WorkerSet
from disagg.router.server import Router, RouterOptions

OPAQUE_KV = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [3, 1, 4, 1, 5],
    "remote_engine_id": "engine-7f",
    "remote_host": "10.0.0.7",
    "remote_port": 5600,
    "tp_size": 1,
    "future_field": {"nested": [1, {"x": None}]},
}


@dataclass
class FakeWorker:
    role: str  # prefill | decode
    tokens: int = 5
    token_delay: float = 0.0
    # None | "500" | "400" | "hang" | "drop" | "no_kv" | "error_first" (vLLM 0.33.0's in-stream error before any
    # token: the chat role chunk, then data: {"error": ...}) | "error_mid_stream" (two tokens, then the error)
    # | "error_finish" (non-streamed: 200 with a finish_reason "error" choice, as older servers answer)
    # | "cut_mid_stream" (two tokens, then the connection closes: a worker killed mid-stream)
    fault: str | None = None
    # vLLM's per-request ``metrics`` object (--enable-per-request-metrics) to put in non-streamed answers
    request_metrics: dict[str, Any] | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    cancelled: int = 0
    completed: int = 0
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> FakeWorker:
        app = web.Application()
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, handler_cancellation=True)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(text="# HELP vllm:num_requests_waiting x\n"
                                 "vllm:num_requests_waiting{model_name=\"m\"} 0\n"
                                 "vllm:num_requests_running{model_name=\"m\"} 0\n")

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.requests.append({"path": request.path, "body": body, "headers": headers})
        if self.fault == "500":
            return web.json_response({"error": {"message": "boom"}}, status=500)
        if self.fault == "400":
            return web.json_response({"error": {"message": "bad", "code": 400}}, status=400)
        if self.fault == "drop":
            assert request.transport is not None
            request.transport.close()
            await asyncio.sleep(10)
        try:
            if self.fault == "hang":
                await asyncio.sleep(3600)
            chat = request.path.endswith("chat/completions")
            if self.role == "prefill":
                out: dict[str, Any] = {"id": "cmpl-p", "choices": [{"index": 0, "text": "x"}],
                                       "usage": {"prompt_tokens": 10, "completion_tokens": 1}}
                if self.fault != "no_kv":
                    out["kv_transfer_params"] = OPAQUE_KV
                if self.request_metrics is not None:
                    out["metrics"] = self.request_metrics
                    # the worker's own times lie inside the leg, as on a real worker
                    await asyncio.sleep(((self.request_metrics.get("queue_time_ms") or 0.0)
                                         + (self.request_metrics.get("time_to_first_token_ms") or 0.0)) / 1000)
                self.completed += 1
                return web.json_response(out)
            n = body.get("max_tokens") or self.tokens
            n = min(n, self.tokens)
            if not body.get("stream"):
                if self.fault == "error_finish":
                    return web.json_response({"id": "cmpl-d", "choices": [{"index": 0, "text": "",
                                                                           "finish_reason": "error"}]})
                await asyncio.sleep(self.token_delay * n)
                self.completed += 1
                key = "message" if chat else "text"
                return web.json_response({"id": "cmpl-d", "choices": [{"index": 0, key: " tok" * n}],
                                          "usage": {"prompt_tokens": 10, "completion_tokens": n}})
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            if self.fault in ("error_first", "error_mid_stream"):
                if chat:
                    await resp.write(b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                                     b'"logprobs":null,"finish_reason":null}]}\n\n')
                if self.fault == "error_mid_stream":
                    for i in range(2):
                        key = '"delta":{"content":' if chat else '"text":'
                        await resp.write(f'data: {{"choices":[{{"index":0,{key}" t{i}"}}'.encode()
                                         + (b"}" if chat else b"") + b',"finish_reason":null}]}\n\n')
                await resp.write(b'data: {"error":{"message":"Internal server error","type":"InternalServerError",'
                                 b'"param":null,"code":500}}\n\ndata: [DONE]\n\n')
                await resp.write_eof()
                return resp
            for i in range(n):
                await asyncio.sleep(self.token_delay)
                ev = {"id": "cmpl-d", "choices": [{"index": 0, "text": f" t{i}"}]}
                await resp.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
                if self.fault == "cut_mid_stream" and i == 1:
                    assert request.transport is not None
                    request.transport.abort()
                    return resp
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            self.completed += 1
            return resp
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


@pytest.fixture
async def fake_workers() -> AsyncIterator[Any]:
    started: list[FakeWorker] = []

    async def make(role: str, **kw: Any) -> FakeWorker:
        w = await FakeWorker(role=role, **kw).start()
        started.append(w)
        return w

    yield make
    for w in started:
        await w.stop()


@dataclass
class RunningRouter:
    router: Router
    url: str
    session: aiohttp.ClientSession

    def set_config(self, cfg: RouterConfig) -> None:
        self.router.watcher.config = cfg

    async def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        async with self.session.post(self.url + path, data=data, headers=headers or {}) as r:
            return r.status, await r.read()

    async def metrics(self) -> str:
        async with self.session.get(self.url + "/metrics") as r:
            return await r.text()


@pytest.fixture
async def router_factory() -> AsyncIterator[Any]:
    runners: list[web.AppRunner] = []
    sessions: list[aiohttp.ClientSession] = []

    async def make(prefill: Sequence[str] = (), decode: Sequence[str] = (), aggregated: Sequence[str] = (),
                   config: RouterConfig | None = None, **opts: Any) -> RunningRouter:
        from disagg.router.load import parse_worker_arg

        ws = WorkerSet()
        ws.set_pool("prefill", [parse_worker_arg(u) for u in prefill])
        ws.set_pool("decode", [parse_worker_arg(u) for u in decode])
        ws.set_pool("aggregated", [parse_worker_arg(u) for u in aggregated])
        router = Router(ConfigWatcher(None, initial=config or RouterConfig()), ws,
                        RouterOptions(**{"scrape_interval": 0.2, **opts}))
        runner = router.runner()
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        s = aiohttp.ClientSession()
        sessions.append(s)
        return RunningRouter(router, f"http://127.0.0.1:{port}", s)

    yield make
    for s in sessions:
        await s.close()
    for r in runners:
        await r.cleanup()


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (Prometheus text format)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, lab = head.partition("{")
        if metric != name:
            continue
        if all(f'{k}="{v}"' in lab for k, v in labels.items()):
            total += float(value)
    return total


@pytest.fixture
def metric():
    return metric_value


@pytest.fixture
def opaque_kv() -> dict[str, Any]:
    return json.loads(json.dumps(OPAQUE_KV))


@pytest.fixture(name="free_port")
def free_port_fixture() -> Callable[[], int]:
    return free_port


@pytest.fixture(name="wait_http")
def wait_http_fixture() -> Callable[..., None]:
    return wait_http


# ------------------------------------------------------------------------------ real processes (sims, router)

SIM_TIME_SCALE = 0.05
# Routers poll fast (tests wait on reloads and scrapes) and log every request at INFO (tests read those lines).
ROUTER_ARGS = ("--scrape-interval", "0.25", "--config-poll-seconds", "0.1", "--log-level", "INFO")


def start_sim(procs: Processes, role: str, kv_load_failure_policy: str = "recompute") -> Proc:
    """A `disagg sim` prefill or decode worker with the simulator's own GPU and model defaults, ready."""
    return procs.sim(role, time_scale=SIM_TIME_SCALE, gpu=None, model_preset=None,
                     kv_load_failure_policy=kv_load_failure_policy, wait=True)


def start_router(procs: Processes, prefill: Sequence[str], decode: Sequence[str],
                 config_path: Path | None = None, extra: Sequence[str] = ()) -> Proc:
    """A `disagg router` over static worker lists (and a --config file), ready."""
    return procs.router(config_path, prefill=prefill, decode=decode, extra=[*ROUTER_ARGS, *extra], wait=True)


@pytest.fixture(scope="module")
def processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    """Real `disagg sim` workers and `disagg router` processes on free loopback ports, stopped after the module."""
    with Processes(tmp_path_factory.mktemp("router-procs")) as procs:
        yield procs

"""The open-loop load generator against a tiny in-process OpenAI-style server: every request is sent and measured;
with a stop condition, the requests not yet sent when it holds are dropped and the run ends early."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from disagg.load import loadgen
from disagg.load.workload import Request


@pytest.fixture
async def server() -> AsyncIterator[str]:
    async def complete(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"choices": [{"message": {"content": "ok"}}],
                                  "usage": {"completion_tokens": body["max_tokens"]}},
                                 headers={"x-disagg-decision": "local", "x-disagg-reason": "short_prompt"})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _requests(n: int, every_s: float) -> list[Request]:
    return [Request(f"r{i}", i * every_s, "chat", "t", 10, 4, False,
                    {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
            for i in range(n)]


async def test_every_request_is_sent_and_measured(server: str) -> None:
    results = await loadgen.run(server, _requests(5, 0.01))
    assert [r.id for r in results] == [f"r{i}" for i in range(5)]
    assert all(r.ok and r.output_tokens == 4 and r.ttft_s is not None for r in results)
    assert {(r.decision, r.reason) for r in results} == {("local", "short_prompt")}


async def test_a_stop_condition_drops_the_requests_not_yet_sent(server: str) -> None:
    done: list[loadgen.Result] = []
    t0 = time.monotonic()
    results = await loadgen.run(server, _requests(40, 0.25), on_done=done.append, stop=lambda: len(done) >= 3)
    elapsed = time.monotonic() - t0
    assert 3 <= len(results) < 40 and all(r.ok for r in results)
    assert [r.id for r in results] == [f"r{i}" for i in range(len(results))]  # the first ones, in order
    assert elapsed < 5  # not the 10 s the whole schedule takes

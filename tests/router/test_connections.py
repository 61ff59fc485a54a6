"""Connection hygiene (issue 12 §8): slow-header connections are closed, a connection cap holds, and normal
requests keep being served meanwhile. Real sockets on loopback against the in-process router."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from disagg.poll import until

LONG = "The quick brown fox jumps over the lazy dog. " * 10


async def _trickle(host: str, port: int, stop: asyncio.Event) -> float | None:
    """Open a connection and send a request head one header line every 50 ms, never finishing it.
    Returns the seconds until the router closed the connection (None: still open when told to stop)."""
    reader, writer = await asyncio.open_connection(host, port)
    t0 = time.monotonic()
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        eof = asyncio.ensure_future(reader.read())
        while not stop.is_set():
            done, _ = await asyncio.wait({eof}, timeout=0.05)
            if done:
                return time.monotonic() - t0
            writer.write(b"X-Slow: 1\r\n")
            await writer.drain()
        eof.cancel()
        return None
    except (ConnectionResetError, BrokenPipeError):
        return time.monotonic() - t0
    finally:
        writer.close()


async def test_slow_header_connections_are_closed_while_requests_are_served(fake_workers, router_factory, metric):
    d = await fake_workers("decode", tokens=3)
    r = await router_factory([], [d.url], header_timeout=0.5)
    host, port = "127.0.0.1", int(r.url.rsplit(":", 1)[1])
    stop = asyncio.Event()
    n = 300
    slow = [asyncio.ensure_future(_trickle(host, port, stop)) for _ in range(n)]

    async def served() -> list[int]:
        out = []
        for _ in range(10):
            status, _ = await r.post("/v1/completions", {"prompt": LONG, "max_tokens": 3, "stream": True})
            out.append(status)
        return out

    assert await served() == [200] * 10  # while the slow connections trickle
    _, pending = await asyncio.wait(slow, timeout=30)
    stop.set()
    await asyncio.gather(*pending)
    assert not pending, f"{len(pending)} slow connections still open"
    assert all(t.result() is not None for t in slow)  # each was closed by the router, none outlived the wait
    m = await r.metrics()
    assert metric(m, "disagg_connections_closed_total", reason="header_timeout") == n  # ... for that reason
    assert metric(m, "disagg_open_connections") <= 2  # our own client's keep-alive connection(s)
    assert await served() == [200] * 10


async def test_connection_cap_refuses_new_connections_until_one_closes(fake_workers, router_factory, metric):
    d = await fake_workers("decode", tokens=3)
    r = await router_factory([], [d.url], max_connections=10, header_timeout=30)
    host, port = "127.0.0.1", int(r.url.rsplit(":", 1)[1])
    idle = [await asyncio.open_connection(host, port) for _ in range(10)]
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        data = await asyncio.wait_for(reader.read(), 10)
    except ConnectionResetError:
        data = b""
    writer.close()
    assert data == b""  # closed without an answer
    for _, w in idle:
        w.close()
    # the router sees the ten close (asynchronously): then it serves again
    status, _ = await until(lambda: r.post("/v1/completions", {"prompt": LONG, "max_tokens": 3}), 10,
                            "the router accepting again", retry_on=(aiohttp.ClientConnectionError,))
    assert status == 200
    m = await r.metrics()
    assert metric(m, "disagg_connections_closed_total", reason="limit") >= 1

"""The lean streaming relay: the raw upstream client (rawstream.py), the O(bytes) stream accounting against the
previous implementation, and the relay's behaviour through the router (keep-alive reuse, framing variants, an
upstream that breaks mid-stream, a client that stops reading)."""

from __future__ import annotations

import asyncio
import re
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disagg.poll import until
from disagg.router.legs import MID_STREAM_ERROR
from disagg.router.proxy import StreamAccount
from disagg.router.rawstream import RawDisconnectedError, RawPool, RawResponse

# ------------------------------------------------------------------ StreamAccount: same results as before

_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_STREAM_ERROR = re.compile(rb'data:\s*\{\s*"error"|"finish_reason"\s*:\s*"error"')


class ReferenceAccount:
    """StreamAccount.feed as it was before the lean relay (copied verbatim): the oracle."""

    def __init__(self, chat: bool) -> None:
        self.events = 0
        self.done = False
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.usage_tokens: int | None = None
        self._tail = b""
        self._etail = b""
        self.error = False
        self.chat = chat

    def feed(self, chunk: bytes, now: float) -> None:
        data = self._tail + chunk
        if not self.error:
            edata = self._etail + chunk
            if b'"error"' in edata and _STREAM_ERROR.search(edata):
                self.error = True
            self._etail = edata[-32:]
        n = data.count(b"data:")
        if n:
            if b"[DONE]" in data:
                self.done = True
                n -= data.count(b"data: [DONE]") + data.count(b"data:[DONE]")
            if n > 0:
                if self.first_at is None:
                    self.first_at = now
                self.last_at = now
                self.events += n
            if b'"usage"' in data:
                found = _COMPLETION_TOKENS.findall(data)
                if found:
                    self.usage_tokens = int(found[-1])
        self._tail = data[-5:]
        if self._tail.endswith(b"data:"):
            self._tail = b""


PARTS = [b'data: {"choices":[{"text":"a"}]}\n\n', b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n',
         b'data: {"error": {"message": "x"}}\n\n', b'data:{"choices":[{"finish_reason" : "error"}]}\n\n',
         b'data: {"usage": {"completion_tokens": 17}}\n\n', b'data: {"usage":{"completion_tokens":\n3}}\n\n',
         b"data: [DONE]\n\n", b"data:[DONE]\n\n", b": comment\n\n", b"data:", b"\n", b" ", b"\r\n", b'"error"',
         b"[DONE", b"]", b"da", b"ta:"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PARTS), max_size=25), st.lists(st.integers(1, 60), max_size=30), st.booleans())
def test_stream_account_matches_the_previous_implementation(parts, cuts, chat):
    stream = b"".join(parts)
    new, ref = StreamAccount(chat=chat), ReferenceAccount(chat=chat)
    pos = 0
    for i, c in enumerate([*cuts, len(stream)]):
        piece = stream[pos:pos + c]
        new.feed(piece, now=float(i))
        ref.feed(piece, now=float(i))
        pos += c
        if pos >= len(stream):
            break
    assert (new.events, new.done, new.error, new.usage_tokens, new.first_at, new.last_at) == \
        (ref.events, ref.done, ref.error, ref.usage_tokens, ref.first_at, ref.last_at)


# ------------------------------------------------------------------ RawResponse: HTTP/1.1 parsing


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False
        self.protocol = None

    def write(self, data) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def set_protocol(self, protocol) -> None:
        self.protocol = protocol

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _response(pool: RawPool) -> tuple[RawResponse, FakeTransport]:
    r = RawResponse(pool, "http://w")
    t = FakeTransport()
    r.connection_made(t)
    r.send("POST", "/v1/completions", "w", {"X-Request-Id": "r1"}, b"{}")
    return r, t


def _chunked(*pieces: bytes, ext: bool = False) -> bytes:
    out = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"
    for p in pieces:
        out += b"%x%s\r\n%s\r\n" % (len(p), b";x=1" if ext else b"", p)
    return out + b"0\r\n\r\n"


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64, 10_000])
@pytest.mark.parametrize("ext", [False, True])
async def test_raw_response_dechunks_any_split(step, ext):
    pool = RawPool(1.0)
    r, t = _response(pool)
    assert t.written.startswith(b"POST /v1/completions HTTP/1.1\r\nHost: w\r\n")
    assert b"Content-Length: 2\r\n" in t.written and b"X-Request-Id: r1\r\n" in t.written
    events = [b'data: {"choices":[{"text":"%d"}]}\n\n' % i for i in range(20)] + [b"data: [DONE]\n\n"]
    wire = _chunked(*events, ext=ext)
    for i in range(0, len(wire), step):
        r.data_received(wire[i:i + step])
    await r.start()
    assert (r.status, r.content_type, r.headers["content-type"]) == (200, "text/event-stream",
                                                                     "text/event-stream; charset=utf-8")
    assert await r.read() == b"".join(events)
    assert r.closed and pool._idle["http://w"]  # complete and keep-alive: the connection went back to the pool
    assert isinstance(t.protocol, RawResponse) and t.protocol is not r


async def test_raw_response_content_length_and_until_close():
    pool = RawPool(1.0)
    r, _t = _response(pool)
    r.data_received(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: 9\r\n"
                    b"\r\n{\"a\":")
    r.data_received(b"1}\r\n")
    await r.start()
    assert r.status == 500 and r.content_type == "application/json"
    assert await r.read() == b'{"a":1}\r\n'
    r2, _t2 = _response(pool)
    r2.data_received(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: 1\n\n")
    r2.data_received(b"data: 2\n\n")
    r2.connection_lost(None)
    assert await r2.read() == b"data: 1\n\ndata: 2\n\n"
    assert not r2.reusable


@pytest.mark.parametrize("wire", [
    b"SSH-2.0-OpenSSH\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY",
])
async def test_raw_response_rejects_garbage(wire):
    r, t = _response(RawPool(1.0))
    r.data_received(wire)
    with pytest.raises(RawDisconnectedError):
        await r.start()
        await r.read()
    assert t.closed


async def test_raw_response_broken_mid_body_raises_after_the_pieces():
    r, _t = _response(RawPool(1.0))
    r.data_received(_chunked(b"data: 1\n\n")[:-5])  # no last chunk
    r.connection_lost(ConnectionResetError())
    await r.start()
    assert await r.readany() == b"data: 1\n\n"
    with pytest.raises(RawDisconnectedError):
        await r.readany()


# ------------------------------------------------------------------ through the router


class RawWorker:
    """A minimal streaming worker on a raw socket server: counts connections, can break or stall a stream."""

    def __init__(self, mode: str = "chunked", events: int = 5, payload: bytes = b"") -> None:
        self.mode = mode
        self.events = events
        self.payload = payload
        self.connections = 0
        self.closed = 0
        self.heads: list[bytes] = []
        self.url = ""
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> RawWorker:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"GET /metrics"):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    continue
                self.heads.append(head)
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                assert length is not None, head
                n = int(length.group(1))
                await reader.readexactly(n)
                evs = [self.payload + b'data: {"choices":[{"text":"t%d"}]}\n\n' % i for i in range(self.events)]
                if self.mode == "length":
                    body = b"".join(evs) + b"data: [DONE]\n\n"
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
                                 % len(body) + body)
                    continue
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
                for ev in evs:
                    writer.write(b"%x\r\n%s\r\n" % (len(ev), ev))
                    await writer.drain()
                if self.mode == "break":
                    writer.transport.abort()
                    return
                if self.mode == "endless":
                    ev = evs[0]
                    while True:
                        writer.write(b"%x\r\n%s\r\n" % (len(ev), ev))
                        await writer.drain()
                writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed += 1
            writer.close()


@pytest.fixture
async def raw_worker():
    started: list[RawWorker] = []

    async def make(**kw) -> RawWorker:
        w = await RawWorker(**kw).start()
        started.append(w)
        return w

    yield make
    for w in started:
        await w.stop()


async def test_relay_reuses_upstream_connections(raw_worker, router_factory):
    w = await raw_worker(events=4)
    r = await router_factory([], [w.url])
    for _ in range(3):
        status, body = await r.post("/v1/completions", {"prompt": "hi", "stream": True})
        assert status == 200
        assert body.count(b"data: {") == 4 and body.endswith(b"data: [DONE]\n\n")
    m = await r.metrics()
    assert 'disagg_requests_total{outcome="ok",path="local"} 3.0' in m
    assert w.connections <= 2  # one keep-alive connection for the relays (+ the scraper's, when it reached it)


async def test_relay_content_length_stream(raw_worker, router_factory):
    w = await raw_worker(mode="length", events=3)
    r = await router_factory([], [w.url])
    status, body = await r.post("/v1/completions", {"prompt": "hi", "stream": True})
    assert status == 200 and body.count(b"data: {") == 3 and body.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("lean", [True, False])
async def test_relay_upstream_breaks_mid_stream(raw_worker, router_factory, metric, lean):
    w = await raw_worker(mode="break", events=3)
    r = await router_factory([], [w.url])
    if not lean:
        r.router.raw = None
    status, body = await r.post("/v1/completions", {"prompt": "hi", "stream": True})
    # the three relayed events, then vLLM's in-stream error shape: never a silent EOF that looks complete
    assert status == 200 and body.count(b"data: {") == 4 and body.endswith(MID_STREAM_ERROR)
    assert metric(await r.metrics(), "disagg_requests_total", outcome="upstream_error_mid_stream") == 1


@pytest.mark.parametrize("lean", [True, False])
async def test_relay_drops_a_client_that_stops_reading(raw_worker, router_factory, metric, lean):
    """A client that takes nothing: the router's socket buffer fills, the upstream is paused, and after
    --client-write-timeout the request ends as cancelled with its upstream connection closed. Both relays: the
    lean one, and aiohttp's (https workers) with its one write deadline per stream."""
    w = await raw_worker(mode="endless", events=1, payload=b": " + b"x" * 4000 + b"\n")
    r = await router_factory([], [w.url], client_write_timeout=0.5)
    if not lean:
        r.router.raw = None
    port = int(r.url.rsplit(":", 1)[1])
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    body = b'{"prompt": "hi", "stream": true}'
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    try:
        async def cancelled() -> bool:
            return metric(await r.metrics(), "disagg_requests_total", outcome="cancelled") == 1

        await until(cancelled, 20, "the stalled request ended as cancelled")
        assert metric(await r.metrics(), "disagg_requests_total", outcome="cancelled") == 1
        await until(lambda: w.closed >= 1, 20, "the upstream stream closed, not left running")
    finally:
        sock.close()


async def test_pool_reuses_only_fresh_idle_connections(raw_worker):
    w = await raw_worker(events=2)
    for max_idle, expected in ((60.0, 1), (0.0, 3)):
        w.connections = 0
        pool = RawPool(1.0, max_idle=max_idle)
        for _ in range(3):
            r = await pool.request(w.url, "/v1/completions", {}, b"{}")
            assert r.status == 200 and (await r.read()).endswith(b"data: [DONE]\n\n")
        assert w.connections == expected
        pool.close()


async def test_relay_to_an_http10_client_and_odd_header_bytes(raw_worker, router_factory):
    """An HTTP/1.0 client gets the stream unframed (ended by the connection's close); header bytes the client
    sent reach the worker unchanged (here a non-ASCII X-Request-Id)."""
    w = await raw_worker(events=3)
    r = await router_factory([], [w.url])
    port = int(r.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b'{"prompt": "hi", "stream": true}'
    writer.write(b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nX-Request-Id: r\xc3\xa9q\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    data = await asyncio.wait_for(reader.read(), 20)  # until the router closes the connection
    writer.close()
    head, _, payload = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and b"chunked" not in head.lower()
    assert re.search(rb"\r\nX-Request-Id: r\xc3\xa9q-[0-9a-f]{8}\r\n", w.heads[-1])
    assert payload == b"".join(b'data: {"choices":[{"text":"t%d"}]}\n\n' % i for i in range(3)) + \
        b"data: [DONE]\n\n"

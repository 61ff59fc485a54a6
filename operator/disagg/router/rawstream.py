"""A lean HTTP/1.1 client for *streamed* relay legs (decode/aggregated workers, ``"stream": true``) and the
prefill leg (one small JSON answer: ``await read()``).

aiohttp's client costs a future, a task wake-up and a StreamReader round trip per relayed chunk; this one is an
``asyncio.Protocol`` whose ``data_received`` de-chunks the worker's bytes and hands each piece straight to a sink
(the relay, which accounts it and writes it to the client socket in the same callback): no task, no future, no
copy beyond the piece itself per chunk. Before the sink is set (the stream start, where the router may still fall
back) pieces are queued and read with ``await readany()``, like aiohttp's ``resp.content``.

Connections are kept alive and pooled per worker (``RawPool``); a connection goes back to the pool only after a
complete response (chunked end or Content-Length reached) without ``Connection: close``.

Errors mirror aiohttp's so that the relay's causes stay the same: ``RawConnectError`` (an ``OSError`` while
connecting: aiohttp's ClientConnectorError → cause ``connect_error``), ``RawDisconnectedError`` (the worker closed
or broke the connection, or sent something that is not HTTP: aiohttp's ClientError → ``disconnected`` / mid-stream
``upstream_error_mid_stream``); a connect that takes longer than ``connect_timeout`` raises TimeoutError.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from aiohttp.http import SERVER_SOFTWARE

_HEAD_LIMIT = 64 * 1024
_HEAD, _CHUNKED, _LENGTH, _UNTIL_CLOSE, _DONE = range(5)

Sink = Callable[[bytes], None]


class RawConnectError(OSError):
    pass


class RawDisconnectedError(ConnectionError):
    pass


class RawResponse(asyncio.Protocol):
    """One connection and, once ``request()`` is called, one response on it."""

    def __init__(self, pool: RawPool, key: str) -> None:
        self.pool = pool
        self.key = key
        self.host = ""  # the Host header
        self.idle_since = 0.0  # when it went back to the pool
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.headers: dict[str, str] = {}
        self.content_type = "application/octet-stream"
        self.reusable = False
        self.closed = False
        self._state = _HEAD
        self._buf = b""
        self._remaining = 0
        self._crlf = False  # a chunk's data was read; its CRLF is next
        self._pieces: collections.deque[bytes] = collections.deque()
        self._eof = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Sink | None = None
        self._on_end: Callable[[BaseException | None], None] | None = None
        self._head_event: asyncio.Future[None] | None = None

    # ---------------------------------------------------------------- protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport

    def data_received(self, data: bytes) -> None:
        if self._state == _HEAD:
            self._buf += data
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > _HEAD_LIMIT:
                    self._fail(RawDisconnectedError("response head too large"))
                return
            head, rest = self._buf[:end], self._buf[end + 4:]
            self._buf = b""
            if not self._parse_head(head):
                return
            if not rest:
                return
            data = rest
        if self._state == _CHUNKED:
            self._feed_chunked(data)
        elif self._state == _LENGTH:
            if len(data) >= self._remaining:
                piece, self._remaining = data[:self._remaining], 0
                self._emit(piece)
                self._end(reusable=self.reusable)
            else:
                self._remaining -= len(data)
                self._emit(data)
        elif self._state == _UNTIL_CLOSE:
            self._emit(data)

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if self._state == _UNTIL_CLOSE:
            self._end(reusable=False)
        else:
            self._fail(RawDisconnectedError(f"worker closed the connection ({exc or 'eof'})"))

    def pause_writing(self) -> None:  # request bodies are small: nothing to throttle
        pass

    def resume_writing(self) -> None:
        pass

    # ---------------------------------------------------------------- parsing

    def _parse_head(self, head: bytes) -> bool:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        try:
            if not parts[0].startswith(b"HTTP/1."):
                raise ValueError
            self.status = int(parts[1])
        except (ValueError, IndexError):
            self._fail(RawDisconnectedError("not an HTTP/1.x response"))
            return False
        h: dict[str, str] = {}
        for line in lines[1:]:
            k, sep, v = line.partition(b":")
            if sep:
                h[k.strip().decode("latin-1").lower()] = v.strip().decode("latin-1")
        self.headers = h
        if ct := h.get("content-type"):
            self.content_type = ct.split(";", 1)[0].strip().lower()
        conn = h.get("connection", "").lower()
        self.reusable = parts[0] == b"HTTP/1.1" and "close" not in conn
        if self.status in (204, 304) or 100 <= self.status < 200:
            self._state = _LENGTH
            self._remaining = 0
        elif "chunked" in h.get("transfer-encoding", "").lower():
            self._state = _CHUNKED
        elif (cl := h.get("content-length")) is not None:
            try:
                self._remaining = int(cl)
            except ValueError:
                self._fail(RawDisconnectedError("bad Content-Length"))
                return False
            self._state = _LENGTH
        else:
            self._state = _UNTIL_CLOSE
            self.reusable = False
        if self._head_event is not None and not self._head_event.done():
            self._head_event.set_result(None)
        if self._state == _LENGTH and self._remaining == 0:
            self._end(reusable=self.reusable)
        return True

    def _feed_chunked(self, data: bytes) -> None:
        if not (self._buf or self._remaining or self._crlf):
            # Fast path: the read is exactly one whole chunk frame (what a worker's per-step write gives).
            eol = data.find(b"\r\n", 0, 18)
            if eol > 0 and data[-2:] == b"\r\n" and b";" not in data[:eol]:
                try:
                    size = int(data[:eol], 16)
                except ValueError:
                    size = -1
                if size > 0 and len(data) == eol + size + 4:
                    self._emit(data[eol + 2:-2])
                    return
        buf = self._buf + data if self._buf else data
        pos, n = 0, len(buf)
        while pos < n:
            if self._remaining:
                take = min(self._remaining, n - pos)
                self._emit(buf if take == n else buf[pos:pos + take])
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._crlf = True
                continue
            if self._crlf:
                if n - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    self._fail(RawDisconnectedError("bad chunk framing"))
                    return
                pos += 2
                self._crlf = False
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if n - pos > 1024:
                    self._fail(RawDisconnectedError("bad chunk size line"))
                    return
                break
            try:
                size = int(buf[pos:eol].split(b";", 1)[0], 16)
            except ValueError:
                self._fail(RawDisconnectedError("bad chunk size"))
                return
            if size == 0:  # last chunk: trailers (none expected) end with an empty line
                end = buf.find(b"\r\n", eol + 2)
                if end < 0:
                    break
                if end != eol + 2:
                    end2 = buf.find(b"\r\n\r\n", eol + 2)
                    if end2 < 0:
                        break
                self._buf = b""
                self._end(reusable=self.reusable)
                return
            pos = eol + 2
            self._remaining = size
        self._buf = buf[pos:] if pos < n else b""

    # ---------------------------------------------------------------- delivery

    def _emit(self, piece: bytes) -> None:
        if not piece:
            return
        if self._sink is not None:
            self._sink(piece)
        else:
            self._pieces.append(piece)
            self._wake()

    def _end(self, reusable: bool) -> None:
        self._state = _DONE
        self._eof = True
        self._wake()
        if self._on_end is not None:
            self._on_end(None)
        if reusable and not self.closed:
            self.pool.release(self)
        else:
            self.close()

    def _fail(self, exc: BaseException) -> None:
        if self._head_event is not None and not self._head_event.done():
            self._head_event.set_exception(exc)
        if self._state == _DONE:
            return
        self._state = _DONE
        self._exc = exc
        self._wake()
        if self._on_end is not None:
            self._on_end(exc)
        self.close()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    # ---------------------------------------------------------------- the caller's side

    def send(self, method: str, target: str, host: str, headers: Mapping[str, str], body: bytes) -> None:
        head = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Accept: */*", f"User-Agent: {SERVER_SOFTWARE}",
                f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        self._head_event = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        # aiohttp's server decodes header bytes as UTF-8 with surrogateescape: this gives the client's bytes back
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode("utf-8", "surrogateescape") + body)

    async def start(self) -> None:
        """Wait for the response head."""
        assert self._head_event is not None
        await self._head_event

    @property
    def content(self) -> RawResponse:
        """aiohttp's ``resp.content.readany()`` spelling."""
        return self

    async def readany(self) -> bytes:
        """The next piece of the body (b"" at its end); raises RawDisconnectedError when the worker broke it."""
        while not self._pieces:
            if self._exc is not None:
                raise self._exc
            if self._eof:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._pieces.popleft()

    async def read(self) -> bytes:
        out = []
        while chunk := await self.readany():
            out.append(chunk)
        return b"".join(out)

    def relay_to(self, sink: Sink, on_end: Callable[[BaseException | None], None]) -> None:
        """From now on every piece goes to ``sink`` synchronously, and ``on_end`` is called once at the end
        (None: complete; else the error). Pieces already queued are delivered first."""
        while self._pieces:
            sink(self._pieces.popleft())
        if self._state == _DONE:
            on_end(self._exc)
            return
        self._sink, self._on_end = sink, on_end

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def close(self) -> None:
        """Drop the connection (not back to the pool). Idempotent."""
        self._sink = self._on_end = None
        if not self.closed:
            self.closed = True
            self.pool.forget(self)
            if self.transport is not None:
                self.transport.close()


class RawPool:
    """Keep-alive connections per worker for streamed relay legs. An idle connection is reused only while it is
    younger than ``max_idle`` (below uvicorn's 5 s keep-alive timeout, so that vLLM does not close it just as a
    request goes out on it)."""

    def __init__(self, connect_timeout: float, max_idle: float = 4.0) -> None:
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        self._idle: dict[str, list[RawResponse]] = {}

    async def request(self, url: str, path: str, headers: Mapping[str, str], body: bytes) -> RawResponse:
        """POST ``body`` to ``url + path``; returns once the response head has arrived."""
        key = url
        conn = None
        idle = self._idle.get(key)
        if idle:
            fresh_after = time.monotonic() - self.max_idle
            while idle:
                c = idle.pop()
                if c.idle_since >= fresh_after and not c.closed and c.transport is not None \
                        and not c.transport.is_closing():
                    conn = c
                    break
                c.close()
        if conn is None:
            u = urlsplit(url)
            if u.scheme != "http" or not u.hostname:
                raise RawConnectError(f"unsupported worker URL {url!r}")
            port = u.port or 80
            loop = asyncio.get_running_loop()
            try:
                async with asyncio.timeout(self.connect_timeout):
                    _, conn = await loop.create_connection(lambda: RawResponse(self, key), u.hostname, port)
            except TimeoutError:
                raise
            except OSError as e:
                raise RawConnectError(str(e)) from e
            conn.host = u.netloc
        conn.send("POST", path, conn.host, headers, body)
        try:
            await conn.start()
        except BaseException:
            conn.close()
            raise
        return conn

    def release(self, conn: RawResponse) -> None:
        fresh = RawResponse(self, conn.key)  # the next response on this connection starts clean
        assert conn.transport is not None
        fresh.transport = conn.transport
        fresh.host = conn.host
        fresh.idle_since = time.monotonic()
        conn.transport.set_protocol(fresh)
        conn.closed = True  # this response object is finished; the connection lives on in `fresh`
        idle = self._idle.setdefault(conn.key, [])
        idle.append(fresh)
        if idle[0].idle_since < fresh.idle_since - self.max_idle:  # the oldest is stale: close it (LIFO reuse
            idle[0].close()  # leaves old ones at the bottom; one per release keeps the list bounded)

    def forget(self, conn: RawResponse) -> None:
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def close(self) -> None:
        for idle in self._idle.values():
            for c in list(idle):
                with contextlib.suppress(Exception):
                    c.close()
        self._idle.clear()

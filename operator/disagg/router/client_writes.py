"""The client side of a relay: writing an upstream's stream to the client with backpressure and a write deadline.

``SinkRelay`` runs inside a lean upstream's data callback (rawstream.py): it accounts each chunk, frames it and
writes it to the client's transport, pausing the upstream while the client's buffer is full. ``WriteDeadline``
gives an aiohttp-client relay one client-write deadline per stream. Used by legs.py; docs/router.md has the
per-chunk budget.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .proxy import StreamAccount
from .rawstream import RawResponse
from .request import Ctx


class SinkRelay:
    """The per-chunk work of a lean relay, run inside the upstream's data callback: account, frame, write."""

    __slots__ = ("_waiter", "acct", "blocked", "chunked", "ctx", "done", "exc", "high_water", "need_ttft",
                 "transport", "upstream")

    def __init__(self, transport: asyncio.Transport, acct: StreamAccount, ctx: Ctx, upstream: RawResponse,
                 chunked: bool = True) -> None:
        self.transport = transport
        # the client socket's buffer above this (the transport's own high-water mark, where it pauses the writer
        # and aiohttp's drain() waits): pause the upstream until the client drains
        self.high_water = transport.get_write_buffer_limits()[1]
        self.chunked = chunked  # False for an HTTP/1.0 client: the body is delimited by the connection's end
        self.acct = acct
        self.ctx = ctx
        self.upstream = upstream
        self.need_ttft = "ttft" not in ctx.timings
        self.blocked = False
        self.done = False
        self.exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def on_piece(self, piece: bytes) -> None:
        now = time.monotonic()
        acct = self.acct
        acct.feed(piece, now)
        if self.need_ttft and acct.first_at is not None:
            self.ctx.timings["ttft"] = acct.first_at - self.ctx.t0
            self.need_ttft = False
        t = self.transport
        if t.is_closing():
            self._finish(ConnectionResetError("client gone"))
            return
        t.write(b"%x\r\n%b\r\n" % (len(piece), piece) if self.chunked else piece)
        if t.get_write_buffer_size() > self.high_water and not self.blocked:
            self.blocked = True
            self.upstream.pause_reading()
            self._wake()

    def on_end(self, exc: BaseException | None) -> None:
        self._finish(exc)

    def _finish(self, exc: BaseException | None) -> None:
        if self.done:
            return
        self.done = True
        self.exc = exc
        if exc is not None:
            self.upstream.close()
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self) -> None:
        """Until the stream ends or the client's buffer is full."""
        if self.done or self.blocked:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def unblock(self) -> None:
        self.blocked = False
        self.upstream.resume_reading()


class WriteDeadline:
    """One client-write deadline per stream (instead of ``asyncio.wait_for`` around every write, which creates a
    task per chunk): a write that has not completed ``timeout`` seconds after it started raises TimeoutError out
    of the ``async with`` block. The relay marks each write (``writing``, ``started``: two attribute stores);
    a single timer per stream checks them once per ``timeout`` and only re-arms exactly when a write is pending.
    """

    __slots__ = ("_cm", "_handle", "_loop", "started", "timeout", "writing")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.writing = False
        self.started = 0.0
        self._cm = asyncio.timeout(None)
        self._handle: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()

    async def __aenter__(self) -> WriteDeadline:
        await self._cm.__aenter__()
        self._handle = self._loop.call_later(self.timeout, self._check)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        await self._cm.__aexit__(*exc)

    def _check(self) -> None:
        if self.writing:
            left = self.started + self.timeout - time.monotonic()
            if left <= 0:
                self._handle = None
                self._cm.reschedule(self._loop.time())  # expire now: cancels the relay → TimeoutError
                return
            self._handle = self._loop.call_later(left, self._check)
        else:
            self._handle = self._loop.call_later(self.timeout, self._check)

"""Connection hygiene for the router's listening socket: a header-read timeout, an idle keep-alive timeout and a
connection cap.

* header timeout: a connection that has not sent a complete request head (``\\r\\n\\r\\n``) within
  ``header_timeout`` seconds of opening is closed (slowloris). aiohttp has no such timeout: each connection's
  protocol is wrapped; the wrapper scans only the bytes of the first request head and cancels its timer there.
* idle timeout: aiohttp's own ``keepalive_timeout`` (also armed at connection start, so a silent connection goes
  too); later request heads on a kept-alive connection are bounded by it.
* cap: at ``max_connections`` open connections a new one is closed at once.

Metrics: ``disagg_open_connections`` (gauge), ``disagg_connections_closed_total{reason}`` (reason
``header_timeout`` | ``limit``: closes the router initiated for hygiene). A ``connection_closed`` log line per
reason, at most one per second per reason (with the count since the last line), so that a flood cannot flood the
log.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast

from aiohttp import web

from .. import logs
from .metrics import RouterMetrics

log = logs.get("disagg.router.connections")

HEAD_END = b"\r\n\r\n"


class ConnectionGuard:
    def __init__(self, metrics: RouterMetrics, header_timeout: float, max_connections: int) -> None:
        self.metrics = metrics
        self.header_timeout = header_timeout
        self.max_connections = max_connections
        self.open = 0
        self._unlogged: dict[str, int] = {}
        self._logged_at: dict[str, float] = {}

    def closed_by_us(self, reason: str, peer: Any) -> None:
        self.metrics.connections_closed.labels(reason).inc()
        self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._logged_at.get(reason, -1e9) >= 1.0:
            log.warning("connection_closed", reason=reason, peer=str(peer), count=self._unlogged[reason],
                        open_connections=self.open, header_timeout_s=self.header_timeout,
                        max_connections=self.max_connections)
            self._logged_at[reason] = now
            self._unlogged[reason] = 0

    def wrap(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: GuardedProtocol(self, factory())


class GuardedProtocol(asyncio.Protocol):
    """Delegates to aiohttp's RequestHandler; adds the header timer and the open-connection count."""

    __slots__ = ("_counted", "_guard", "_h", "_head_seen", "_tail", "_timer", "_transport")

    def __init__(self, guard: ConnectionGuard, handler: asyncio.Protocol) -> None:
        self._guard = guard
        self._h = handler
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self._head_seen = False
        self._tail = b""
        self._counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        g = self._guard
        self._transport = tr = cast(asyncio.Transport, transport)  # a stream server's transport
        if g.open >= g.max_connections:
            g.closed_by_us("limit", tr.get_extra_info("peername"))
            tr.abort()
            return
        g.open += 1
        self._counted = True
        g.metrics.open_connections.set(g.open)
        if g.header_timeout > 0:
            self._timer = asyncio.get_running_loop().call_later(g.header_timeout, self._header_timeout)
        self._h.connection_made(transport)

    def _header_timeout(self) -> None:
        self._timer = None
        if not self._head_seen and self._transport is not None:
            self._guard.closed_by_us("header_timeout", self._transport.get_extra_info("peername"))
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        if not self._head_seen:
            buf = self._tail + data
            if HEAD_END in buf:
                self._head_seen = True
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
            else:
                self._tail = buf[-3:]
        self._h.data_received(data)

    def eof_received(self) -> bool | None:
        return self._h.eof_received()

    def pause_writing(self) -> None:
        self._h.pause_writing()

    def resume_writing(self) -> None:
        self._h.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._counted:
            return  # refused at the cap: aiohttp never saw it
        self._counted = False
        g = self._guard
        g.open -= 1
        g.metrics.open_connections.set(g.open)
        self._h.connection_lost(exc)


class GuardedRunner(web.AppRunner):
    """An AppRunner whose sites accept connections through a ConnectionGuard (works with any site type)."""

    def __init__(self, app: web.Application, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.guard = guard

    @property
    def server(self) -> Any:  # the sites' protocol factory (aiohttp's Server is one; this wraps it)
        s = super().server
        return None if s is None else self.guard.wrap(s)

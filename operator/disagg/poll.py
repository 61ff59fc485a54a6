"""Polling with a deadline — the one way code and tests wait for a condition (never a sleep as synchronisation).

:func:`wait_for` (sync) and :func:`until` (async) poll a predicate and return its first truthy value; on the deadline
they raise :class:`WaitTimeoutError` with the last value. Standard library only: usable from every layer (the
operator's kube helpers, load generation, the local substrate, tests).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast, overload

T = TypeVar("T")


class WaitTimeoutError(AssertionError, TimeoutError):
    """A condition polled by :func:`wait_for` / :func:`until` did not hold before the deadline.

    An ``AssertionError`` (a test that waits reports a failure, not an error) and a ``TimeoutError`` (code that
    waits can catch it as one)."""


def _timeout(timeout: float, what: str, last: object) -> WaitTimeoutError:
    return WaitTimeoutError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")


class _Deadline:
    """The polling state shared by both waits: the deadline, the last value seen, the pause before the next try."""

    def __init__(self, timeout: float, what: str, interval: float) -> None:
        self.timeout, self.what, self.interval = timeout, what, interval
        self.end = time.monotonic() + timeout
        self.last: object = None

    def pause(self, got: object) -> float:
        """Record a falsy result (or a retried exception); the seconds to wait, or raise at the deadline."""
        self.last = got
        remaining = self.end - time.monotonic()
        if remaining <= 0:
            raise _timeout(self.timeout, self.what, self.last)
        return min(self.interval, remaining)


def wait_for(pred: Callable[[], T | None], timeout: float = 30.0, what: str = "condition", *,
             interval: float = 0.1, retry_on: tuple[type[BaseException], ...] = ()) -> T:
    """Poll ``pred()`` until it returns something truthy and return that; raise :class:`WaitTimeoutError` (with the
    last value) when ``timeout`` seconds pass first. An exception from ``pred`` ends the wait at once, unless it is
    one of ``retry_on`` (then it counts as a falsy value: an apiserver still starting, say)."""
    d = _Deadline(timeout, what, interval)
    while True:
        try:
            got: object = pred()
        except retry_on as e:
            got = e
        else:
            if got:
                return cast(T, got)
        time.sleep(d.pause(got))


@overload
async def until(pred: Callable[[], Awaitable[T | None]], timeout: float = ..., what: str = ..., *,
                interval: float = ..., retry_on: tuple[type[BaseException], ...] = ...) -> T: ...


@overload
async def until(pred: Callable[[], T | None], timeout: float = ..., what: str = ..., *,
                interval: float = ..., retry_on: tuple[type[BaseException], ...] = ...) -> T: ...


async def until(pred: Callable[[], object], timeout: float = 15.0, what: str = "condition", *,
                interval: float = 0.05, retry_on: tuple[type[BaseException], ...] = ()) -> object:
    """:func:`wait_for` for coroutines: poll ``pred()`` without blocking the event loop. ``pred`` may be a plain
    function or return an awaitable (``lambda: client.metric(...)``, an ``async def``), which is awaited each try."""
    d = _Deadline(timeout, what, interval)
    while True:
        try:
            got: object = pred()
            if inspect.isawaitable(got):
                got = await got
        except retry_on as e:
            got = e
        else:
            if got:
                return got
        await asyncio.sleep(d.pause(got))

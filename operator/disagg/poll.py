"""Polling with a deadline — the one way code and tests wait for a condition (never a sleep as synchronisation).

:func:`wait_for` (sync) and :func:`until` (async) poll a predicate and return its first truthy value; on the deadline
they raise :class:`WaitTimeoutError` with the last value. Standard library only: usable from every layer (the
operator's kube helpers, load generation, the local substrate, tests).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator
from typing import TypeVar

T = TypeVar("T")


class WaitTimeoutError(AssertionError, TimeoutError):
    """A condition polled by :func:`wait_for` / :func:`until` did not hold before the deadline.

    An ``AssertionError`` (a test that waits reports a failure, not an error) and a ``TimeoutError`` (code that
    waits can catch it as one)."""


def _timeout(timeout: float, what: str, last: object) -> WaitTimeoutError:
    return WaitTimeoutError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")


def _attempts(pred: Callable[[], T], timeout: float, what: str, interval: float,
              retry_on: tuple[type[BaseException], ...]) -> Generator[float, None, T]:
    """The polling loop, shared by both waits: yields how long to pause before the next try; returns the first
    truthy value of ``pred()``; raises :class:`WaitTimeoutError` at the deadline."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            got = pred()
        except retry_on as e:
            last = e
        else:
            if got:
                return got
            last = got
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _timeout(timeout, what, last)
        yield min(interval, remaining)


def wait_for(pred: Callable[[], T], timeout: float = 30.0, what: str = "condition", *, interval: float = 0.1,
             retry_on: tuple[type[BaseException], ...] = ()) -> T:
    """Poll ``pred()`` until it returns something truthy and return that; raise :class:`WaitTimeoutError` (with the
    last value) when ``timeout`` seconds pass first. An exception from ``pred`` ends the wait at once, unless it is
    one of ``retry_on`` (then it counts as a falsy value: an apiserver still starting, say)."""
    attempts = _attempts(pred, timeout, what, interval, retry_on)
    try:
        while True:
            time.sleep(next(attempts))
    except StopIteration as done:
        return done.value


async def until(pred: Callable[[], T], timeout: float = 15.0, what: str = "condition", *,
                interval: float = 0.05, retry_on: tuple[type[BaseException], ...] = ()) -> T:
    """:func:`wait_for` for coroutines: poll ``pred()`` without blocking the event loop."""
    attempts = _attempts(pred, timeout, what, interval, retry_on)
    try:
        while True:
            await asyncio.sleep(next(attempts))
    except StopIteration as done:
        return done.value

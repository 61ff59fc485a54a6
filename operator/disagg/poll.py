"""Polling with a deadline — the one way code and tests wait for a condition (never a sleep as synchronisation).

:func:`wait_for` (sync) and :func:`until` (async) poll a predicate and return its first truthy value; on the deadline
they raise :class:`WaitTimeoutError` with the last value. Standard library only: usable from every layer (the
operator's kube helpers, load generation, the local substrate, tests).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeoutError(AssertionError, TimeoutError):
    """A condition polled by :func:`wait_for` / :func:`until` did not hold before the deadline.

    An ``AssertionError`` (a test that waits reports a failure, not an error) and a ``TimeoutError`` (code that
    waits can catch it as one)."""


def _timeout(timeout: float, what: str, last: object) -> WaitTimeoutError:
    return WaitTimeoutError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")


def wait_for(pred: Callable[[], T], timeout: float = 30.0, what: str = "condition", *, interval: float = 0.1,
             retry_on: tuple[type[BaseException], ...] = ()) -> T:
    """Poll ``pred()`` until it returns something truthy and return that; raise :class:`WaitTimeoutError` (with the
    last value) when ``timeout`` seconds pass first. An exception from ``pred`` ends the wait at once, unless it is
    one of ``retry_on`` (then it counts as a falsy value: an apiserver still starting, say)."""
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
        time.sleep(min(interval, remaining))


async def until(pred: Callable[[], T], timeout: float = 15.0, what: str = "condition", *,
                interval: float = 0.05, retry_on: tuple[type[BaseException], ...] = ()) -> T:
    """:func:`wait_for` for coroutines: poll ``pred()`` without blocking the event loop."""
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
        await asyncio.sleep(min(interval, remaining))

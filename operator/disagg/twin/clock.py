"""A virtual-time asyncio event loop: ``loop.time()`` is simulated seconds, and waiting costs no wall time.

asyncio's selector loop computes, each turn, how long it may block (until its next timer, 0 when callbacks are
ready, None when there is nothing at all) and asks its selector to wait that long. :class:`VirtualSelector`
does not wait: it moves the loop's virtual clock forward by that timeout and reports no I/O. So every
``asyncio.sleep``, ``call_later``, ``wait_for`` and ``asyncio.timeout`` runs in virtual time, unchanged — the
simulator's engine loop (sim/engine.py, with a :class:`~disagg.sim.clock.SimClock` reading ``loop.time``) runs
as it does behind HTTP, only without wall-clock sleeps. A wait with nothing scheduled can never end (no I/O
exists here): that is a deadlock in the model, raised as :class:`DeadlockError` instead of hanging.

Timers due at the same virtual time run in the order they were scheduled (asyncio's heap breaks ties by
insertion), so a run is deterministic.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import heapq
import selectors
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


class DeadlockError(RuntimeError):
    """The virtual loop has nothing ready and nothing scheduled, but the main coroutine is not done."""


class VirtualSelector(selectors.SelectSelector):
    """Registers file objects like a real selector (asyncio's self-pipe) but never blocks on them."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.advances = 0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise DeadlockError(
                f"virtual time {self.now:.6f} s: nothing is ready and nothing is scheduled, yet the run is not "
                "finished (a request waits for an event that can never happen)")
        if timeout > 0:
            self.now += timeout
            self.advances += 1
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock is virtual (starts at ``start``, in seconds) and whose waits take no wall time."""

    def __init__(self, start: float = 0.0) -> None:
        self._vsel = VirtualSelector()
        self._vsel.now = start
        super().__init__(self._vsel)
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._vsel.now

    @property
    def advances(self) -> int:
        """How many times virtual time jumped forward (≈ distinct event times)."""
        return self._vsel.advances

    def advance(self, when: float) -> bool:
        """Move the clock to ``when`` at once, from inside a running callback, when doing so changes nothing:
        no callback is ready and no timer is due before ``when`` (nor within the loop's clock resolution after
        it, which ``_run_once`` would batch with it). Then a coroutine that would ``await asyncio.sleep`` until
        ``when`` may instead carry on synchronously — the simulator's engine does (``SimClock.jump_to``), which
        saves the timer, the loop turn and the task wake-up of every engine step. False: sleep as usual."""
        if self._ready:  # type: ignore[attr-defined]
            return False
        sched = self._scheduled  # type: ignore[attr-defined]
        while sched and sched[0].cancelled():  # what _run_once would drop first anyway
            h = heapq.heappop(sched)
            h._scheduled = False  # noqa: SLF001 - as base_events._run_once does when it drops one
            self._timer_cancelled_count -= 1  # type: ignore[attr-defined]
        if sched and sched[0].when() < when + self._clock_resolution:
            return False
        if when > self._vsel.now:
            self._vsel.now = when
            self._vsel.advances += 1
        return True

    def _run_once(self) -> None:
        # Land exactly on the next timer: ``now + (when - now)`` can fall a rounding error short of ``when``.
        sched = self._scheduled  # type: ignore[attr-defined]
        if not self._ready and sched:  # type: ignore[attr-defined]
            when = sched[0].when()
            if when > self._vsel.now:
                self._vsel.now = when
                self._vsel.advances += 1
        super()._run_once()  # type: ignore[misc]


# The cyclic collector's generation-0 threshold while a virtual run is in progress (CPython's default is 700). A
# run allocates millions of short-lived objects (events, futures, per-request records) and few cycles; at the
# default, collections took ~30 % of a 64-GPU run's CPU (docs/simulator.md, "Speed"). Memory is what reference
# counting frees at once, so the threshold changes when cycles are found, never what a run computes.
RUN_GC_THRESHOLD = (100_000, 50, 100)


@contextlib.contextmanager
def few_collections() -> Iterator[None]:
    """Collect cycles rarely while the block runs: :data:`RUN_GC_THRESHOLD`, and what was alive before it frozen
    out of the collector's scans (``gc.freeze``); both restored after. A process that froze objects itself keeps
    them as they are (nothing frozen here, nothing unfrozen)."""
    old = gc.get_threshold()
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    gc.set_threshold(*RUN_GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        if freeze:
            gc.unfreeze()


def run_virtual(main: Coroutine[Any, Any, T], *, start: float = 0.0) -> T:
    """Run ``main`` to completion on a fresh :class:`VirtualTimeLoop` (like ``asyncio.run``) and close it, with
    the collector set for a run (:func:`few_collections`)."""
    with few_collections():
        return _run_virtual(main, start)


def _run_virtual(main: Coroutine[Any, Any, T], start: float) -> T:
    loop = VirtualTimeLoop(start)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            _cancel_all(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))

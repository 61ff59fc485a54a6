"""The simulated engine's clock (sim/engine.py): simulated seconds from a wall clock scaled by ``--time-scale``, or
the twin's virtual-time loop (twin/clock.py) with a scale of 1."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

# How far the engine's own timeline may run behind the wall-derived clock before it jumps forward: 25 ms of
# simulated time, or 20 ms of wall time, whichever is more (see docs/simulator.md, "Time").
MAX_CLOCK_LAG_S = 0.025
MAX_CLOCK_LAG_WALL_S = 0.020


class SimClock:
    """Simulated seconds since start = wall seconds since start ÷ time_scale.

    ``timer`` is the wall clock (``time.monotonic``); the twin (disagg.twin) passes its virtual-time loop's
    ``loop.time`` with a scale of 1, so the same engine loop runs in virtual time, and ``advance`` (the loop's
    ``VirtualTimeLoop.advance``): :meth:`jump_to` then moves virtual time to a step's end without a loop turn
    whenever nothing else could run before it (the results are the same; see twin/clock.py)."""

    def __init__(self, time_scale: float, timer: Callable[[], float] = time.monotonic,
                 advance: Callable[[float], bool] | None = None) -> None:
        self.scale = time_scale
        self.timer = timer
        self.wall0 = timer()
        self.advance = advance

    def wake_time(self, t: float, at: float) -> float:
        """The timer reading at which :meth:`sleep_until` ``(t)``, called when the timer read ``at``, wakes."""
        d = (t - (at - self.wall0) / self.scale) * self.scale
        return at + d if d > 0 else at

    def sim_time(self, at: float) -> float:
        """:meth:`now` when the timer reads ``at``."""
        return (at - self.wall0) / self.scale

    def jump_to(self, t: float) -> bool:
        """True when the clock now reads what :meth:`sleep_until` ``(t)`` would have woken at, with no other
        callback having run meanwhile (virtual time only); False: sleep instead."""
        if self.advance is None:
            return False
        d = (t - self.now()) * self.scale
        if d <= 0:
            return True  # sleep_until would not sleep either
        return self.advance(self.timer() + d)  # asyncio.sleep(d) → call_at(loop.time() + d): the same float

    def now(self) -> float:
        return (self.timer() - self.wall0) / self.scale

    async def sleep_until(self, t: float) -> None:
        d = (t - self.now()) * self.scale
        if d > 0:
            await asyncio.sleep(d)

    async def sleep(self, seconds: float) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds * self.scale)

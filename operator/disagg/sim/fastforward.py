"""Decode fast-forward (virtual time only): several decode steps planned, priced and slept through at once.

A decode-only step whose batch nothing can change for a while (nothing waiting, no KV held for a decode engine, no
request finishing, enough free blocks) is the first of several identical-but-for-context steps: they are priced at
once (the same PerfModel.step, on a batch with the same token, sequence and context sums: the same float results),
the engine sleeps until the last one ends, and their effects (tokens with their own step-end times, KV blocks in the
order the scheduler would take them) are applied lazily — when the plan ends, or as far as the current time when
something outside looks (sync: scrapes, busy, state) or changes the engine (submit, abort, wake, KV release: the
plan is then cut at the step in progress, where the step-by-step loop would next schedule). Same records as the
step-by-step path (tests/twin/test_fastforward.py: ``fast_forward=False``; docs/simulator.md, "Speed").

The engine (engine.py) owns one :class:`FastForward` when its clock can jump (``SimClock.advance``) and it keeps no
per-step series; it calls :meth:`FastForward.plan` and :meth:`FastForward.run` from its loop and
:meth:`FastForward.interrupt` wherever something looks at or changes its state.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .scheduler import Batch, Request, Status

if TYPE_CHECKING:
    from .engine import Engine, ReqCtx

# At most this many decode steps planned at once. Planning prices every step; an interrupt (an arrival, an abort)
# cuts the rest, so a longer plan mostly wastes pricing.
FF_MAX_STEPS = 32


@dataclass(eq=False)
class Plan:
    """Decode steps planned at once (virtual time). Step ``i`` (0-based) ends at ``ends[i]`` (simulated time), the
    step-by-step loop would wake at timer reading ``whens[i]``; ``applied`` steps have produced their tokens,
    ``allocated`` steps have their KV blocks (step 0's by schedule(); step i's are taken when step i-1 ends), and
    the engine wakes after step ``last - 1`` (fewer than planned once an interrupt cut the plan)."""

    reqs: list[Request]
    ends: list[float]
    whens: list[float]
    dts: list[float]
    allocs: dict[int, list[Request]]  # step → requests that cross a KV block boundary there (running order)
    last: int
    applied: int = 0
    allocated: int = 1
    fut: asyncio.Future[None] | None = None
    handle: asyncio.TimerHandle | None = None


def _release(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class FastForward:
    """One engine's decode fast-forward. ``current`` is the plan in progress (None between plans); applying a plan
    updates the engine's requests, KV blocks, ``steps``, ``busy_s`` and ``busy_until``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.current: Plan | None = None

    def plan(self, batch: Batch, end: float, dt: float, newest: float) -> Plan | None:
        """The steps from ``batch`` (the step just priced: it ends at ``end`` after ``dt``; ``newest`` is its
        latest arrival) up to the first that could differ from the step-by-step loop's; None: step by step."""
        eng = self.engine
        sched = eng.sched
        if batch.preempted or batch.pulls or sched.waiting or sched.held:
            return None
        items = batch.items
        first_finish = FF_MAX_STEPS + 1
        for s in items:
            r = s.request
            if s.new_tokens != 1 or r.num_output < 1:
                return None
            left = r.max_new_tokens - r.num_output  # the step (1-based) that finishes it
            if left < first_finish:
                first_finish = left
        m = first_finish - 1  # steps before any request finishes (a finish resolves futures: the normal path)
        if m < 2:
            return None
        pool = eng.pool
        bs = pool.block_size
        allocs: dict[int, list[Request]] = {}
        total = 0
        for s in items:
            r = s.request
            k = len(r.blocks) * bs - s.context  # first step whose token does not fit the blocks held
            while k < m:
                allocs.setdefault(k, []).append(r)
                total += 1
                k += bs
        if total > pool.num_free:
            return None
        n = len(items)
        c0 = sum(s.context for s in items)
        clock = eng.clock
        max_lag = eng.max_lag
        ends, dts = [end], [dt]
        whens = [clock.wake_time(end, clock.timer())]
        step_s = eng.perf.step_s
        for i in range(1, m):
            w = whens[-1]
            st = max(ends[-1], newest, clock.sim_time(w) - max_lag)
            # step i of n decodes with context c0 + n·i in all: PerfModel.step's totals of that batch, summed
            # without building it (every term an integer below 2**53, so the same floats in any order)
            kv = c0 + n * i + n
            d = step_s(n, n, n, float(kv), kv)
            ends.append(st + d)
            dts.append(d)
            whens.append(clock.wake_time(st + d, w))
        return Plan([s.request for s in items], ends, whens, dts, allocs, m)

    async def run(self, ff: Plan) -> None:
        """Sleep through the plan (or jump, when nothing else is due), then apply what is left of it."""
        self.current = ff
        try:
            advance = self.engine.clock.advance
            if not (advance is not None and advance(ff.whens[-1])):
                loop = asyncio.get_running_loop()
                ff.fut = loop.create_future()
                ff.handle = loop.call_at(ff.whens[ff.last - 1], _release, ff.fut)
                await ff.fut
            self.apply(ff, ff.last)
        finally:
            if ff.handle is not None:
                ff.handle.cancel()
            self.current = None

    def interrupt(self, cut: bool) -> None:
        """Apply the plan in progress up to the current time (none: nothing to do); ``cut``: and end it at the step
        in progress, so that the next schedule() sees the change."""
        ff = self.current
        if ff is None:
            return
        t = self.engine.clock.timer()
        j = ff.applied
        while j < ff.last - 1 and ff.whens[j] < t:  # steps the step-by-step loop has applied by now
            j += 1
        self.apply(ff, j)
        if cut and ff.last > j + 1:
            ff.last = j + 1  # the step in progress ends the plan: the next schedule() sees the change
            if ff.handle is not None and ff.fut is not None:
                ff.handle.cancel()
                ff.handle = asyncio.get_running_loop().call_at(ff.whens[j], _release, ff.fut)

    def apply(self, ff: Plan, j: int) -> None:
        """Apply steps ``ff.applied .. j-1`` (tokens out) and take the blocks of the steps scheduled by then."""
        eng = self.engine
        running = Status.RUNNING
        a = ff.applied
        if j > a:
            ends = ff.ends
            k = j - a
            first, last = ends[a], ends[j - 1]
            gap = max([ends[i] - ends[i - 1] for i in range(a + 1, j)], default=0.0)
            for r in ff.reqs:
                if r.status is not running:
                    continue  # aborted meanwhile
                ctx: ReqCtx = r.ctx
                if ctx.sink_run is not None:
                    r.num_computed += k
                    r.num_output += k
                    r.last_token = last
                    ctx.last_ts = last
                    ctx.sink_run(r.num_output, first, last, gap)
                    continue
                for i in range(a, j):
                    e = ends[i]
                    r.num_computed += 1
                    r.num_output += 1
                    r.last_token = e
                    ctx.last_ts = e
                    if ctx.sink is not None:
                        ctx.sink("token", r.num_output, e)
                    else:
                        ctx.queue.put_nowait(("token", r.num_output, e))
            for i in range(a, j):  # the same sums, in the same order, as step by step
                eng.steps += 1
                eng.busy_s += ff.dts[i]
            eng.busy_until = last
            ff.applied = j
        upto = min(j + 1, ff.last)
        pool = eng.pool
        for k in range(ff.allocated, upto):
            for r in ff.allocs.get(k, ()):
                if r.status is running:
                    new = pool.allocate(1)
                    assert new is not None, "fast-forward planned more blocks than were free"
                    r.blocks += new
        ff.allocated = max(ff.allocated, upto)

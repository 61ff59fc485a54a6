"""The virtual-time event loop: timers in order at their exact virtual times, time jumps, deadlock detection."""

from __future__ import annotations

import asyncio

import pytest

from disagg.twin.clock import DeadlockError, VirtualTimeLoop, run_virtual


def test_timers_fire_in_order_at_their_virtual_times() -> None:
    fired: list[tuple[str, float]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        def fire(name: str) -> None:
            fired.append((name, loop.time()))

        for name, delay in (("c", 3.0), ("a", 0.5), ("b", 1.25), ("a2", 0.5)):
            loop.call_later(delay, fire, name)
        await asyncio.sleep(10.0)

    run_virtual(main())
    # by time; equal times in scheduling order
    assert fired == [("a", 0.5), ("a2", 0.5), ("b", 1.25), ("c", 3.0)]


def test_time_jumps_and_sleepers_interleave() -> None:
    log: list[tuple[str, float]] = []

    async def sleeper(name: str, period: float, n: int) -> None:
        for _ in range(n):
            await asyncio.sleep(period)
            log.append((name, asyncio.get_running_loop().time()))

    async def main() -> float:
        await asyncio.gather(sleeper("fast", 0.1, 5), sleeper("slow", 3600.0, 2))
        return asyncio.get_running_loop().time()

    end = run_virtual(main())
    assert end == pytest.approx(7200.0)
    assert [n for n, _ in log] == ["fast"] * 5 + ["slow"] * 2
    assert [t for _, t in log] == sorted(t for _, t in log)
    assert log[4][1] == pytest.approx(0.5) and log[-1][1] == pytest.approx(7200.0)


def test_wait_for_and_timeout_run_in_virtual_time() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(fut, 42.0)
        t1 = loop.time()
        async with asyncio.timeout(8.0):
            await asyncio.sleep(2.0)
        return t1, loop.time()

    assert run_virtual(main()) == (pytest.approx(42.0), pytest.approx(44.0))


def test_start_offset() -> None:
    async def main() -> float:
        await asyncio.sleep(1.0)
        return asyncio.get_running_loop().time()

    assert run_virtual(main(), start=100.0) == pytest.approx(101.0)


def test_deadlock_is_an_error_not_a_hang() -> None:
    async def main() -> None:
        await asyncio.get_running_loop().create_future()  # nothing will ever resolve it

    with pytest.raises(DeadlockError, match="nothing is ready and nothing is scheduled"):
        run_virtual(main())


def test_loop_counts_advances() -> None:
    loop = VirtualTimeLoop()
    try:
        loop.run_until_complete(asyncio.sleep(1.0))
        loop.run_until_complete(asyncio.sleep(1.0))
        assert loop.time() == pytest.approx(2.0)
        assert loop.advances >= 2
    finally:
        loop.close()


def test_advance_only_when_nothing_else_could_run_first() -> None:
    """VirtualTimeLoop.advance (the engine's jump over a step): refused while a callback is ready or a timer is
    due before the target (or within the loop's clock resolution after it); a cancelled timer does not count."""
    seen: list[tuple[str, float]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop)
        h = loop.call_later(1.0, lambda: seen.append(("t", loop.time())))
        assert not loop.advance(1.5)  # the timer at 1.0 must run first
        assert not loop.advance(1.0)  # same time: the timer would be batched with the wake-up
        assert loop.time() == 0.0
        assert loop.advance(0.75) and loop.time() == 0.75
        h.cancel()
        assert loop.advance(2.0) and loop.time() == 2.0  # nothing left before it
        loop.call_soon(lambda: seen.append(("soon", loop.time())))
        assert not loop.advance(3.0)  # a ready callback runs at the current time first
        await asyncio.sleep(0)

    run_virtual(main())
    assert seen == [("soon", 2.0)]


def test_a_run_collects_rarely_and_restores_the_collector() -> None:
    """run_virtual's collector setting (clock.py few_collections) holds during the run only, even when it fails."""
    import gc

    from disagg.twin.clock import RUN_GC_THRESHOLD

    before = gc.get_threshold()
    seen: list[tuple[tuple[int, int, int], int]] = []

    async def look() -> None:
        seen.append((gc.get_threshold(), gc.get_freeze_count()))

    run_virtual(look())
    assert seen[0][0] == RUN_GC_THRESHOLD and seen[0][1] > 0  # what was alive before the run is out of the scans
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0

    async def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        run_virtual(fail())
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    # a process that froze its own objects keeps them frozen
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        run_virtual(look())
        assert seen[-1][0] == RUN_GC_THRESHOLD and gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()

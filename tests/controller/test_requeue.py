"""Retries of failed event-triggered reconciles (controller/requeue.py): pure, with an injected scheduler."""

from __future__ import annotations

from collections.abc import Callable

from disagg.controller.kubeio import KubeError
from disagg.controller.requeue import Requeue, backoff

MODEL = ("ns", "m")


class Handle:
    def __init__(self, delay: float, fn: Callable[[], None]) -> None:
        self.delay, self.fn, self.cancelled = delay, fn, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeScheduler:
    """Records what would run when; ``fire`` runs the oldest scheduled call (as the timer would)."""

    def __init__(self) -> None:
        self.handles: list[Handle] = []

    def __call__(self, delay: float, fn: Callable[[], None]) -> Handle:
        self.handles.append(Handle(delay, fn))
        return self.handles[-1]

    def live(self) -> list[Handle]:
        return [h for h in self.handles if not h.cancelled]

    def fire(self) -> None:
        handle = self.handles.pop(0)
        handle.fn()


class Flaky:
    """A reconcile that fails ``failures`` times, then succeeds."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    def __call__(self) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise KubeError(503, "apiserver unavailable")


def test_backoff_doubles_from_one_second_up_to_the_cap():
    assert [backoff(i) for i in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff(10_000) == 60
    assert backoff(3, base=0.5, cap=10) == 4


def test_a_failed_reconcile_is_retried_with_growing_delays_until_it_succeeds():
    sched = FakeScheduler()
    requeue = Requeue(sched)
    work = Flaky(failures=4)
    assert not requeue.run(MODEL, work)
    delays = []
    while sched.handles:
        delays.append(sched.handles[0].delay)
        sched.fire()
    assert delays == [1, 2, 4, 8] and work.calls == 5
    assert not requeue.pending(MODEL)
    assert not requeue.run(MODEL, Flaky(failures=1))  # a success reset the backoff: the next failure waits 1 s again
    assert [h.delay for h in sched.live()] == [1]


def test_the_retry_runs_the_retry_call_and_its_failures_back_off_further():
    sched = FakeScheduler()
    requeue = Requeue(sched)
    first, retry = Flaky(failures=1), Flaky(failures=2)
    requeue.run(MODEL, first, retry)
    sched.fire()  # retry fails once more: 2 s
    assert [h.delay for h in sched.handles] == [2]
    sched.fire()
    sched.fire()
    assert (first.calls, retry.calls) == (1, 3) and not sched.handles and not requeue.pending(MODEL)


def test_never_two_retries_pending_for_one_model():
    sched = FakeScheduler()
    requeue = Requeue(sched)
    for _ in range(5):
        requeue.run(MODEL, Flaky(failures=1))
    assert len(sched.handles) == 1 and requeue.pending(MODEL)
    requeue.run(("ns", "other"), Flaky(failures=1))  # other models back off on their own
    assert len(sched.handles) == 2 and [h.delay for h in sched.handles] == [1, 1]


def test_a_later_success_cancels_the_pending_retry():
    sched = FakeScheduler()
    requeue = Requeue(sched)
    work = Flaky(failures=1)
    requeue.run(MODEL, work)
    handle = sched.handles[0]
    requeue.succeeded(MODEL)  # e.g. the create/update handler's reconcile, or another event's
    assert handle.cancelled and not requeue.pending(MODEL)
    handle.fn()  # a timer that fires anyway (cancelled too late) runs nothing
    assert work.calls == 1


def test_close_cancels_every_pending_retry():
    sched = FakeScheduler()
    requeue = Requeue(sched)
    requeue.run(MODEL, Flaky(failures=1))
    requeue.run(("ns", "other"), Flaky(failures=1))
    requeue.close()
    assert not sched.live() and not requeue.pending(MODEL)


def test_other_errors_are_not_swallowed():
    requeue = Requeue(FakeScheduler())

    def broken() -> None:
        raise ValueError("a bug")

    try:
        requeue.run(MODEL, broken)
    except ValueError:
        pass
    else:
        raise AssertionError("a non-API error must reach kopf")


async def test_the_loop_scheduler_runs_retries_on_the_bound_loop_and_cancels_them() -> None:
    """Retries run in the operator loop's executor after their delay; a cancelled one never runs; an unbound or
    closed loop schedules nothing (no thread of its own outlives the operator)."""
    import asyncio

    from disagg.controller.requeue import LoopScheduler

    sched = LoopScheduler()
    ran: list[str] = []
    sched(0.0, lambda: ran.append("unbound")).cancel()  # nothing to run it on: a no-op handle
    sched.bind(asyncio.get_running_loop())
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def fire(name: str) -> None:
        ran.append(name)
        loop.call_soon_threadsafe(done.set)

    # the cancelled one is due first: had it not been cancelled, it would have run before the kept one
    dropped = await asyncio.to_thread(sched, 0.01, lambda: fire("dropped"))  # from a handler's thread
    await asyncio.to_thread(dropped.cancel)
    await asyncio.to_thread(sched, 0.05, lambda: fire("kept"))
    await asyncio.wait_for(done.wait(), 10)
    assert ran == ["kept"]

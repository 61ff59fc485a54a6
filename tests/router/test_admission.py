"""The admission queue (router/admission.py, issue 29): pure properties of the fair queue — release order by
weight and priority, FIFO within a tenant, bounds, time-outs with an injected clock, no starvation — and its event
loop side in virtual time (the twin's loop: deadlines are loop timers, no sleeps)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disagg.router.admission import PRIORITY_WEIGHT, AdmissionQueue, FairQueue, QueueTimeoutError
from disagg.router.overload import room_wait
from disagg.router.policy_types import WorkerLoad
from disagg.twin.clock import run_virtual

INTERACTIVE, BATCH, BACKGROUND = 0, 1, 2


def drain(q: FairQueue, n: int | None = None) -> list[str]:
    out: list[str] = []
    while (n is None or len(out) < n) and (w := q.pop()) is not None:
        out.append(w.tenant)
    return out


def test_a_lone_tenant_is_fifo_and_bounded() -> None:
    q = FairQueue()
    ws = [q.push("batch", BATCH, now=float(i), max_wait_s=10, max_queued=3) for i in range(4)]
    assert ws[3] is None  # the fourth is refused: the tenant's bound
    assert q.length("batch") == 3 and len(q) == 3
    assert [q.pop() for _ in range(3)] == ws[:3]
    assert q.pop() is None and len(q) == 0
    # room again once released
    assert q.push("batch", BATCH, now=5.0, max_wait_s=10, max_queued=3) is not None


def test_the_bound_is_per_tenant() -> None:
    q = FairQueue()
    assert q.push("a", BATCH, 0.0, 10, max_queued=1) is not None
    assert q.push("a", BATCH, 0.0, 10, max_queued=1) is None
    assert q.push("b", BATCH, 0.0, 10, max_queued=1) is not None


def test_backlogged_tenants_share_releases_by_their_weights() -> None:
    q = FairQueue()
    for i in range(200):
        q.push("chat", INTERACTIVE, float(i), 100, 1000)
        q.push("batch", BATCH, float(i), 100, 1000)
        q.push("bg", BACKGROUND, float(i), 100, 1000)
    first = Counter(drain(q, 110))
    w = PRIORITY_WEIGHT
    total = w[INTERACTIVE] + w[BATCH] + w[BACKGROUND]
    assert first["chat"] == pytest.approx(110 * w[INTERACTIVE] / total, abs=1)
    assert first["batch"] == pytest.approx(110 * w[BATCH] / total, abs=1)
    assert first["bg"] == pytest.approx(110 * w[BACKGROUND] / total, abs=1)


def test_interactive_goes_first_on_a_tie_and_batch_is_not_starved() -> None:
    q = FairQueue()
    q.push("batch", BATCH, 0.0, 100, 100)
    q.push("chat", INTERACTIVE, 0.0, 100, 100)
    assert drain(q, 1) == ["chat"]  # smaller tag (1/8 < 1/2)
    # chat keeps arriving, one for each release: batch still gets its turn within a bounded number of releases
    q = FairQueue()
    q.push("batch", BATCH, 0.0, 100, 100)
    released = []
    for i in range(20):
        q.push("chat", INTERACTIVE, float(i), 100, 100)
        released += drain(q, 1)
        if "batch" in released:
            break
    assert "batch" in released and released.index("batch") <= int(PRIORITY_WEIGHT[INTERACTIVE] / PRIORITY_WEIGHT[BATCH])


def test_a_tenant_that_was_idle_does_not_bank_credit() -> None:
    """A tenant arriving after others were served starts at the current virtual time, not at 0 (it cannot take
    a burst of releases for the time it had nothing queued)."""
    q = FairQueue()
    for i in range(50):
        q.push("batch", BATCH, float(i), 100, 100)
    drain(q, 40)
    for i in range(10):
        q.push("late", BATCH, 50.0 + i, 100, 100)
    assert Counter(drain(q, 10)) == {"batch": 5, "late": 5}


def test_requeue_keeps_the_place() -> None:
    q = FairQueue()
    a = q.push("t", BATCH, 0.0, 100, 10)
    q.push("t", BATCH, 1.0, 100, 10)
    assert a is not None and q.pop() is a
    q.requeue(a)  # still over its SLO: back at the head of its tenant's queue
    assert q.pop() is a


def test_a_congested_tenant_is_released_newest_first() -> None:
    """Adaptive LIFO: oldest first until the tenant's oldest has waited ``newest_first_after``, then newest first
    (those can still make their SLO; the old ones time out)."""
    q = FairQueue()
    ws = [q.push("t", BATCH, now=float(i), max_wait_s=100, max_queued=10) for i in range(4)]
    assert q.pop(now=3.0, newest_first_after=5.0) is ws[0]  # the oldest waited 3 s: FIFO
    w = q.pop(now=7.0, newest_first_after=5.0)  # the oldest (ws[1]) waited 6 s: newest first
    assert w is ws[3] and w is not None and w.newest_first
    q.requeue(w)  # still over its SLO: back at the newest end
    assert q.pop(now=7.0, newest_first_after=5.0) is ws[3]
    assert q.pop(now=7.0) is ws[1]  # default: never newest first


def test_time_outs_with_an_injected_clock() -> None:
    q = FairQueue()
    a = q.push("t", BATCH, now=0.0, max_wait_s=2.0, max_queued=10)
    b = q.push("t", BATCH, now=1.0, max_wait_s=2.0, max_queued=10)
    c = q.push("u", BATCH, now=1.5, max_wait_s=0.5, max_queued=10)
    assert q.next_deadline() == 2.0
    assert q.expire(1.9) == []
    assert q.expire(2.0) == [a, c]
    assert q.length("t") == 1 and q.length("u") == 0 and q.next_deadline() == 3.0
    assert q.pop() is b
    assert q.expire(10.0) == [] and q.next_deadline() is None  # a released request does not time out


def test_a_requeued_request_still_times_out() -> None:
    q = FairQueue()
    a = q.push("t", BATCH, 0.0, 2.0, 10)
    assert a is not None and q.pop() is a
    assert q.next_deadline() is None
    q.requeue(a)
    assert q.next_deadline() == 2.0 and q.expire(2.0) == [a]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.sampled_from([0, 1, 2])), min_size=1,
                max_size=60))
def test_every_request_is_released_once_in_its_tenants_order(pushes: list[tuple[str, int]]) -> None:
    q = FairQueue()
    prio: dict[str, int] = {}
    order: dict[str, list[int]] = {}
    for i, (t, p) in enumerate(pushes):
        p = prio.setdefault(t, p)  # a tenant has one priority
        w = q.push(t, p, float(i), 100, 1000)
        assert w is not None
        order.setdefault(t, []).append(w.seq)
    out = []
    while (w := q.pop()) is not None:
        out.append(w)
    assert len(out) == len(pushes) and len({w.seq for w in out}) == len(pushes)
    for t, seqs in order.items():
        assert [w.seq for w in out if w.tenant == t] == seqs


# ----------------------------------------------------------------------------------------- on the event loop


def test_the_loop_side_releases_times_out_and_forgets_a_cancelled_request() -> None:
    lengths: dict[str, int] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        aq = AdmissionQueue(loop.time, lambda t, n: lengths.__setitem__(t, n))
        a = aq.enter("t", BATCH, max_wait_s=5.0, max_queued=10)
        b = aq.enter("t", BATCH, max_wait_s=1.0, max_queued=10)
        c = aq.enter("t", BATCH, max_wait_s=5.0, max_queued=10)
        assert a and b and c and lengths["t"] == 3
        ta = asyncio.create_task(aq.wait(a))
        tb = asyncio.create_task(aq.wait(b))
        tc = asyncio.create_task(aq.wait(c))
        await asyncio.sleep(0)
        with pytest.raises(QueueTimeoutError):
            await tb  # its own deadline, on the loop's (virtual) clock
        assert loop.time() == pytest.approx(1.0) and lengths["t"] == 2
        tc.cancel()
        await asyncio.gather(tc, return_exceptions=True)
        assert lengths["t"] == 1  # the cancelled one left the queue
        assert aq.release()
        await ta
        assert not a.queued
        assert lengths["t"] == 0 and not aq.release()

    run_virtual(main())


def test_room_wait_is_littles_law_on_a_full_worker() -> None:
    """Admission's wait for room on the decode worker: the requests waiting there × output × TPOT ÷ streams running;
    on a full worker the router's own requests beyond those running count as waiting (the scrape is stale)."""
    assert room_wait(WorkerLoad("d", running=100, queued=0), 256, 0.04) == 0.0
    assert room_wait(WorkerLoad("d", running=100, queued=10), 256, 0.04) == pytest.approx(10 * 256 * 0.04 / 100)
    full = WorkerLoad("d", running=100, queued=2, inflight=130, kv_usage=0.95)
    assert room_wait(full, 256, 0.04) == pytest.approx(30 * 256 * 0.04 / 100)
    assert room_wait(full._replace(kv_usage=0.5), 256, 0.04) == pytest.approx(2 * 256 * 0.04 / 100)
    assert room_wait(WorkerLoad("d", running=0, queued=5), 256, 0.04) == 0.0  # nothing running: no rate to wait on

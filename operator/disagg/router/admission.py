"""Admission under overload (issue 29): the per-tenant queue of the router, weighted fair across tenants.

When a tenant's ``overload`` is ``Queue`` and the TTFT the router predicts for its request misses the SLO by the
admission margin (core.py ``RequestCore.admit``), the request waits here instead of joining the engines' queues:

* **bounded**: at most ``maxQueued`` requests of a tenant wait at once (the next one is refused at once,
  ``queue_full``), and none longer than ``maxQueueTimeMs`` (then refused, ``queue_timeout``);
* **weighted fair across tenants**: each backlogged tenant's next release carries a virtual finish tag: its last
  one's + 1 / weight, or, when it had nothing queued, ``max(V, its last tag) + 1 / weight`` (V: the tag of the
  last release; virtual-clock fair queueing), and the smallest tag goes first, ties to the higher priority, then
  to the request waiting longest. The weight is the tenant's priority's
  (:data:`PRIORITY_WEIGHT`: Interactive 8, Batch 2, Background 1): with every tenant backlogged an Interactive
  tenant gets 4 releases for each of a Batch tenant's, and no backlogged tenant waits for ever (its tags grow
  only by its own releases);
* **oldest first within a tenant**, until its oldest has waited ``newest_first_after`` (the core passes half
  the TTFT SLO): then newest first (adaptive LIFO), so that under sustained overload the requests released are
  those that can still meet the SLO, and the others time out rather than all of them waiting the longest;
* **released as load falls**: each request that completes releases the next one to be checked again against a
  fresh decision (core.py ``RequestCore.admit``): admitted when its prediction is now within the SLO, else back
  to its place. (Arrivals predicted within the SLO are admitted without waiting: the queue holds only what the
  deployment cannot take now.)

:class:`FairQueue` is pure (no clock, no event loop: times are arguments); :class:`AdmissionQueue` puts it on the
event loop with one future per waiting request and one timer for the earliest deadline — no sleeps, so the twin
runs the same code in virtual time.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

# A tenant's share of the releases while several wait, by its vLLM priority (api/spec.py TENANT_PRIORITY).
PRIORITY_WEIGHT: dict[int, float] = {0: 8.0, 1: 2.0, 2: 1.0}


class QueueTimeoutError(Exception):
    """A waiting request's ``maxQueueTimeMs`` passed."""


@dataclass(eq=False)
class Waiter:
    """One request in the queue."""

    tenant: str
    priority: int
    enqueued_at: float
    deadline: float
    seq: int = 0
    queued: bool = False
    newest_first: bool = False  # released from its tenant's newest end (the tenant's queue was congested)
    future: asyncio.Future[None] | None = field(default=None, repr=False)


class FairQueue:
    """Bounded per-tenant queues, released weighted fair across tenants (module docstring). Pure: times are
    arguments."""

    def __init__(self) -> None:
        self._q: dict[str, deque[Waiter]] = {}
        self._prio: dict[str, int] = {}
        self._deadlines: list[tuple[float, int, Waiter]] = []
        self._vtime = 0.0  # the tag of the last release
        self._last: dict[str, float] = {}  # each tenant's last release tag
        self._next: dict[str, float] = {}  # a backlogged tenant's next release tag
        self._len: dict[str, int] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return sum(self._len.values())

    def length(self, tenant: str) -> int:
        return self._len.get(tenant, 0)

    def push(self, tenant: str, priority: int, now: float, max_wait_s: float, max_queued: int) -> Waiter | None:
        """Queue a request of ``tenant``; None when the tenant already has ``max_queued`` waiting."""
        if self.length(tenant) >= max_queued:
            return None
        w = Waiter(tenant, priority, now, now + max_wait_s, next(self._seq))
        self._prio[tenant] = priority
        heapq.heappush(self._deadlines, (w.deadline, w.seq, w))
        self._backlog(w)
        self._q.setdefault(tenant, deque()).append(w)
        return w

    def _backlog(self, w: Waiter) -> None:
        """Count ``w`` in; a tenant that had nothing queued starts at the current virtual time (no credit banked
        while it was idle)."""
        if not self.length(w.tenant):
            self._next[w.tenant] = max(self._vtime, self._last.get(w.tenant, 0.0)) + self._cost(w.tenant)
        w.queued = True
        self._len[w.tenant] = self.length(w.tenant) + 1

    def _cost(self, tenant: str) -> float:
        return 1.0 / PRIORITY_WEIGHT.get(self._prio[tenant], 1.0)

    def requeue(self, w: Waiter) -> None:
        """A released request that is still over its SLO goes back to its place (the end it was taken from; the
        same deadline)."""
        if w.queued:
            return
        heapq.heappush(self._deadlines, (w.deadline, w.seq, w))
        self._backlog(w)
        q = self._q.setdefault(w.tenant, deque())
        if w.newest_first:
            q.append(w)
        else:
            q.appendleft(w)

    def pop(self, now: float = 0.0, newest_first_after: float = math.inf) -> Waiter | None:
        """The next request to release, or None: the tenant whose next release has the smallest virtual finish
        tag (ties: the higher priority, then the one waiting longest); within it the oldest request, or the newest
        when its oldest has waited ``newest_first_after`` seconds or more (adaptive LIFO: under sustained overload
        the requests released are those that can still make their SLO; the old ones time out)."""
        best: tuple[float, int, int] | None = None
        tenant = ""
        for t, q in self._q.items():
            while q and not q[0].queued:
                q.popleft()
            while q and not q[-1].queued:
                q.pop()
            if not q:
                continue
            key = (self._next[t], self._prio[t], q[0].seq)
            if best is None or key < best:
                best, tenant = key, t
        if best is None:
            return None
        q = self._q[tenant]
        newest = now - q[0].enqueued_at >= newest_first_after
        w = q.pop() if newest else q.popleft()
        w.newest_first = newest
        self._vtime = self._last[tenant] = best[0]
        self._remove(w)
        if self.length(tenant):
            self._next[tenant] = best[0] + self._cost(tenant)
        return w

    def remove(self, w: Waiter) -> None:
        """Take a request out (its client went away)."""
        if w.queued:
            self._remove(w)

    def _remove(self, w: Waiter) -> None:
        w.queued = False
        n = self._len[w.tenant] - 1
        if n:
            self._len[w.tenant] = n
        else:
            del self._len[w.tenant]

    def expire(self, now: float) -> list[Waiter]:
        """Take out and return every waiting request whose deadline is ``now`` or earlier."""
        out = []
        while self._deadlines and self._deadlines[0][0] <= now:
            w = heapq.heappop(self._deadlines)[2]
            if w.queued:
                self._remove(w)
                out.append(w)
        return out

    def next_deadline(self) -> float | None:
        """The earliest deadline of a request still waiting (a released one's entry is dropped lazily)."""
        while self._deadlines:
            d, _, w = self._deadlines[0]
            if w.queued:
                return d
            heapq.heappop(self._deadlines)
        return None


class AdmissionQueue:
    """The :class:`FairQueue` on the event loop: ``wait`` until released (or :class:`QueueTimeoutError`), ``release``
    the next one. ``clock``: the request core's (monotonic seconds; the twin's virtual time); ``on_length(tenant,
    n)``: the queue-length gauge."""

    def __init__(self, clock: Callable[[], float], on_length: Callable[[str, int], None]) -> None:
        self.q = FairQueue()
        self.clock = clock
        self.on_length = on_length
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")

    def length(self, tenant: str) -> int:
        return self.q.length(tenant)

    def enter(self, tenant: str, priority: int, max_wait_s: float, max_queued: int) -> Waiter | None:
        """Queue a request (None: the tenant's queue is full)."""
        w = self.q.push(tenant, priority, self.clock(), max_wait_s, max_queued)
        if w is not None:
            self.on_length(tenant, self.q.length(tenant))
            self._arm()
        return w

    def again(self, w: Waiter) -> None:
        """A released request still over its SLO: back to its place, waiting for the next release."""
        self.q.requeue(w)
        self.on_length(w.tenant, self.q.length(w.tenant))
        self._arm()

    async def wait(self, w: Waiter) -> None:
        """Until ``w`` is released; raises QueueTimeoutError at its deadline. A cancel (the client went away)
        takes it out of the queue."""
        if self.clock() >= w.deadline:
            self.q.remove(w)
            self.on_length(w.tenant, self.q.length(w.tenant))
            raise QueueTimeoutError
        w.future = asyncio.get_running_loop().create_future()
        try:
            await w.future
        finally:
            if w.queued:  # cancelled while waiting
                self.q.remove(w)
                self.on_length(w.tenant, self.q.length(w.tenant))
            w.future = None

    def release(self, newest_first_after: float = math.inf) -> bool:
        """Release the next waiting request to be checked again (FairQueue.pop); False when none waits."""
        while (w := self.q.pop(self.clock(), newest_first_after)) is not None:
            self.on_length(w.tenant, self.q.length(w.tenant))
            if w.future is not None and not w.future.done():
                w.future.set_result(None)
                return True
        return False

    def _arm(self) -> None:
        at = self.q.next_deadline()
        if at is None or at >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = asyncio.get_running_loop().call_later(max(0.0, at - self.clock()), self._expire)

    def _expire(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        for w in self.q.expire(self.clock()):
            self.on_length(w.tenant, self.q.length(w.tenant))
            if w.future is not None and not w.future.done():
                w.future.set_exception(QueueTimeoutError())
        self._arm()

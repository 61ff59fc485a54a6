"""Fail fast per target: a circuit breaker per decode worker and per prefill→decode pair (DESIGN §9).

A breaker counts *transport* evidence only: KV-pull failures and post-prefill transfer timeouts (fallback causes
``kv_*``) are failures; a remote decode leg whose first token arrived is a success. Prefill-leg problems
(capacity) and decode-side connection errors are no evidence either way (the passive health check handles a dead
worker).

    closed ──(failureThreshold consecutive failures)──► open ──(cooldownSeconds)──► half-open
    half-open: lets ``halfOpenProbes`` requests through; all succeed → closed, one fails → open again.

``CircuitBreaker`` is pure (the caller passes ``now``); ``Breakers`` keys breakers by target, exports
``disagg_circuit_state{pool,worker}`` (0 closed, 1 open, 2 half-open; pool ``decode`` with the decode URL, or pool
``pair`` with ``<prefill URL>-><decode URL>``) and logs every transition as a JSON line (event ``circuit``).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Gauge

from .. import logs
from ..api.models import CircuitBreakerSpec

log = logs.get("disagg.router.circuit")


class State(enum.IntEnum):
    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")


Transition = tuple[State, State]


class CircuitBreaker:
    """One target's breaker. Every method takes the current time; transitions are returned, never logged here."""

    __slots__ = ("cooldown_s", "failures", "half_open_probes", "opened_at", "state", "threshold", "trials_ok",
                 "trials_out")

    def __init__(self, threshold: int = 3, cooldown_s: float = 10.0, half_open_probes: int = 1) -> None:
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self.half_open_probes = half_open_probes
        self.state = State.CLOSED
        self.failures = 0  # consecutive, while closed
        self.opened_at = 0.0
        self.trials_out = 0  # half-open requests in flight
        self.trials_ok = 0  # half-open requests that succeeded

    def configure(self, spec: CircuitBreakerSpec) -> None:
        self.threshold, self.cooldown_s = spec.failure_threshold, spec.cooldown_seconds
        self.half_open_probes = spec.half_open_probes

    def _to(self, new: State, now: float) -> Transition:
        old, self.state = self.state, new
        if new is State.OPEN:
            self.opened_at = now
        if new is State.HALF_OPEN:
            self.trials_out = self.trials_ok = 0
        self.failures = 0
        return old, new

    def poll(self, now: float) -> Transition | None:
        """Open → half-open once the cooldown has passed."""
        if self.state is State.OPEN and now >= self.opened_at + self.cooldown_s:
            return self._to(State.HALF_OPEN, now)
        return None

    def admits(self, now: float) -> bool:
        """Would a request be let through now? (No side effect but the lazy open → half-open.)"""
        self.poll(now)
        if self.state is State.CLOSED:
            return True
        return self.state is State.HALF_OPEN and self.trials_out < self.half_open_probes

    def acquire(self, now: float) -> tuple[bool, bool, Transition | None]:
        """Let a request through if possible → (admitted, is_half_open_trial, transition)."""
        tr = self.poll(now)
        if self.state is State.CLOSED:
            return True, False, tr
        if self.state is State.HALF_OPEN and self.trials_out < self.half_open_probes:
            self.trials_out += 1
            return True, True, tr
        return False, False, tr

    def success(self, trial: bool, now: float) -> Transition | None:
        if self.state is State.CLOSED:
            self.failures = 0
        elif self.state is State.HALF_OPEN and trial:
            self.trials_out -= 1
            self.trials_ok += 1
            if self.trials_ok >= self.half_open_probes:
                return self._to(State.CLOSED, now)
        return None  # open: a request admitted before the breaker opened says nothing new

    def failure(self, now: float) -> Transition | None:
        if self.state is State.CLOSED:
            self.failures += 1
            if self.failures >= self.threshold:
                return self._to(State.OPEN, now)
        elif self.state is State.HALF_OPEN:
            return self._to(State.OPEN, now)
        return None

    def release(self, trial: bool) -> None:
        """A let-through request ended without evidence (e.g. its prefill leg failed): free its trial slot."""
        if trial and self.state is State.HALF_OPEN and self.trials_out > 0:
            self.trials_out -= 1


@dataclass(frozen=True)
class Target:
    pool: str  # decode | pair
    worker: str  # decode URL | "<prefill URL>-><decode URL>"


def decode_target(decode: str) -> Target:
    return Target("decode", decode)


def pair_target(prefill: str, decode: str) -> Target:
    return Target("pair", f"{prefill}->{decode}")


class Ticket:
    """The breakers a remote request went through; report exactly one outcome (later calls are ignored)."""

    __slots__ = ("_done", "_held", "_owner")

    def __init__(self, owner: Breakers, held: list[tuple[Target, bool]]) -> None:
        self._owner = owner
        self._held = held
        self._done = False

    def success(self) -> None:
        self._end("success", "")

    def failure(self, cause: str) -> None:
        self._end("failure", cause)

    def release(self) -> None:
        self._end("release", "")

    def _end(self, kind: str, cause: str) -> None:
        if self._done:
            return
        self._done = True
        o = self._owner
        now = o.clock()
        for target, trial in self._held:
            b = o.get(target)
            if kind == "release":
                b.release(trial)
                continue
            tr = b.success(trial, now) if kind == "success" else b.failure(now)
            o.record(target, tr, cause or kind)


class Breakers:
    """All breakers of one router, by target."""

    def __init__(self, gauge: Gauge | None = None, clock: Callable[[], float] = time.monotonic,
                 logger: Any = None) -> None:
        self.gauge = gauge
        self.clock = clock
        self.log = logger if logger is not None else log
        self.spec = CircuitBreakerSpec()
        self._by_target: dict[Target, CircuitBreaker] = {}
        self._not_closed: set[Target] = set()

    def configure(self, spec: CircuitBreakerSpec) -> None:
        if spec != self.spec:
            self.spec = spec
            for b in self._by_target.values():
                b.configure(spec)

    def get(self, target: Target) -> CircuitBreaker:
        b = self._by_target.get(target)
        if b is None:
            b = self._by_target[target] = CircuitBreaker(
                self.spec.failure_threshold, self.spec.cooldown_seconds, self.spec.half_open_probes)
            if self.gauge is not None:
                self.gauge.labels(target.pool, target.worker).set(0)
        return b

    def state(self, target: Target) -> State:
        b = self._by_target.get(target)
        if b is None:
            return State.CLOSED
        self.record(target, b.poll(self.clock()), "cooldown_elapsed")
        return b.state

    def record(self, target: Target, tr: Transition | None, cause: str) -> None:
        if tr is None or tr[0] is tr[1]:
            return
        old, new = tr
        if new is State.CLOSED:
            self._not_closed.discard(target)
        else:
            self._not_closed.add(target)
        if self.gauge is not None:
            self.gauge.labels(target.pool, target.worker).set(int(new))
        self.log.warning("circuit", pool=target.pool, target=target.worker, cause=cause,
                    **{"from": old.label, "to": new.label})

    def blocked(self) -> tuple[frozenset[str], frozenset[tuple[str, str]]]:
        """Decode URLs and (prefill, decode) pairs that would not let a request through now."""
        if not self._not_closed:
            return frozenset(), frozenset()
        now = self.clock()
        decodes: set[str] = set()
        pairs: set[tuple[str, str]] = set()
        for t in list(self._not_closed):
            b = self._by_target[t]
            tr = b.poll(now)
            self.record(t, tr, "cooldown_elapsed")
            if b.admits(now):
                continue
            if t.pool == "decode":
                decodes.add(t.worker)
            else:
                p, _, d = t.worker.partition("->")
                pairs.add((p, d))
        return frozenset(decodes), frozenset(pairs)

    def acquire(self, prefill: str, decode: str) -> Ticket | None:
        """Let a remote request through both breakers (decode worker, pair), or None (then nothing is held)."""
        now = self.clock()
        held: list[tuple[Target, bool]] = []
        for target in (decode_target(decode), pair_target(prefill, decode)):
            b = self.get(target)
            ok, trial, tr = b.acquire(now)
            self.record(target, tr, "cooldown_elapsed")
            if not ok:
                for t, tl in held:
                    self.get(t).release(tl)
                return None
            held.append((target, trial))
        return Ticket(self, held)

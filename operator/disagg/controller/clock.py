"""An injectable clock (kubebuilder's ``clock.Clock`` pattern): the reconciler and the autoscaler read time only
through it, so tests drive time-based behaviour (hold periods, grace windows, timestamps) without sleeping."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a monotonic scale (only differences matter)."""
        ...

    def now(self) -> dt.datetime:
        """Wall-clock time, timezone-aware UTC."""
        ...


class RealClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


class FakeClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, start: dt.datetime | None = None, monotonic: float = 1000.0) -> None:
        self._wall = start or dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        self._mono = monotonic
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def now(self) -> dt.datetime:
        with self._lock:
            return self._wall

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._mono += seconds
            self._wall += dt.timedelta(seconds=seconds)


def rfc3339(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")

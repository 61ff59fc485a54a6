"""Retries of event-triggered reconciles that failed, with exponential backoff (controller-runtime's RequeueAfter).

kopf retries its create/update/resume handlers (``kopf.TemporaryError``) but never an event handler: a status- or
child-event-triggered reconcile that fails (the apiserver briefly unavailable, a conflict that kept conflicting)
would be dropped until the next event. :class:`Requeue` schedules the model's reconcile again after 1 s, 2 s,
4 s … at most ``cap`` seconds; the backoff is reset, and a scheduled retry cancelled, when a later reconcile of the
model succeeds. At most one retry is pending per model (reconciles are level-triggered: one does every missed
event's work).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .. import logs
from .kubeio import KubeError

log = logs.get("disagg.controller")

Model = tuple[str, str]  # (namespace, name)
BASE_SECONDS = 1.0
CAP_SECONDS = 60.0


class Cancellable(Protocol):
    def cancel(self) -> None: ...


Schedule = Callable[[float, Callable[[], None]], Cancellable]  # (delay in seconds, what to run) → its handle


class _Nothing:
    def cancel(self) -> None:
        pass


class _LoopHandle:
    """A retry armed on the operator's event loop; ``cancel`` from any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.handle: asyncio.TimerHandle | None = None
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        if not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing left to cancel
                self.loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()


class LoopScheduler:
    """Runs retries on the operator's event loop (``bind`` it from an on-startup handler): the delay is a loop
    timer and the retry runs in the loop's executor, like kopf's own sync handlers. Nothing of it outlives the
    operator — no thread of its own, so nothing can wake during interpreter shutdown. Before ``bind`` (or once the
    loop is closed) nothing is scheduled: the next event reconciles."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def __call__(self, delay: float, fn: Callable[[], None]) -> Cancellable:
        loop = self.loop
        if loop is None or loop.is_closed():
            return _Nothing()
        h = _LoopHandle(loop)

        def run() -> None:
            if not h.cancelled:
                loop.run_in_executor(None, fn)

        def arm() -> None:
            if not h.cancelled:
                h.handle = loop.call_later(delay, run)

        try:
            loop.call_soon_threadsafe(arm)
        except RuntimeError:  # closed between the check and the call
            return _Nothing()
        return h


def backoff(attempt: int, base: float = BASE_SECONDS, cap: float = CAP_SECONDS) -> float:
    """The delay before retry number ``attempt`` (0-based): base · 2^attempt, at most ``cap``."""
    return min(cap, base * 2 ** min(attempt, 62))


@dataclass
class _Entry:
    attempts: int = 0  # failures since the model's last success
    token: object | None = None  # the pending retry's, None when none is pending
    handle: Cancellable | None = None


class Requeue:
    """Per-model retry with backoff of a failed event-triggered reconcile. ``schedule`` is injectable (tests)."""

    def __init__(self, schedule: Schedule | None = None, base: float = BASE_SECONDS, cap: float = CAP_SECONDS) -> None:
        self.schedule: Schedule = schedule or LoopScheduler()
        self.base = base
        self.cap = cap
        self._models: dict[Model, _Entry] = {}
        self._guard = threading.Lock()

    def run(self, model: Model, attempt: Callable[[], Any], retry: Callable[[], Any] | None = None,
            what: str = "reconcile", **fields: Any) -> bool:
        """Call ``attempt``; on a KubeError log it and schedule ``retry`` (default: ``attempt``, itself run through
        this method, so its failures back off further). Returns whether it succeeded."""
        again = retry or attempt
        try:
            attempt()
        except KubeError as exc:

            def retry_it() -> None:
                self.run(model, again, what=what, **fields)

            delay = self.failed(model, retry_it)
            log.warning(f"{what} failed", model="/".join(model), error=str(exc), **fields,
                        retry_in=delay if delay is not None else "already scheduled")
            return False
        self.succeeded(model)
        return True

    def failed(self, model: Model, retry: Callable[[], None]) -> float | None:
        """Schedule ``retry`` after the model's next backoff delay; returns the delay, or None when a retry is
        pending already (it does this one's work)."""
        with self._guard:
            entry = self._models.setdefault(model, _Entry())
            if entry.token is not None:
                return None
            delay = backoff(entry.attempts, self.base, self.cap)
            entry.attempts += 1
            token = entry.token = object()
            entry.handle = self.schedule(delay, lambda: self._fire(model, token, retry))
            return delay

    def succeeded(self, model: Model) -> None:
        """A reconcile of the model succeeded: cancel its pending retry, reset its backoff."""
        with self._guard:
            entry = self._models.pop(model, None)
        if entry is not None and entry.handle is not None:
            entry.handle.cancel()

    def pending(self, model: Model) -> bool:
        with self._guard:
            entry = self._models.get(model)
            return entry is not None and entry.token is not None

    def close(self) -> None:
        """Cancel every pending retry (the operator stops)."""
        with self._guard:
            entries, self._models = list(self._models.values()), {}
        for entry in entries:
            if entry.handle is not None:
                entry.handle.cancel()

    def _fire(self, model: Model, token: object, retry: Callable[[], None]) -> None:
        with self._guard:
            entry = self._models.get(model)
            if entry is None or entry.token is not token:
                return  # cancelled: a later reconcile succeeded
            entry.token = entry.handle = None
        retry()

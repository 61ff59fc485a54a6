"""The paths of one request (DESIGN §10), run by the request core (core.py ``RequestCore.serve``) against a
:class:`Legs` transport: remote (prefill leg, KV hand-off, decode leg; a hedge when the hand-off is slow; the
fallback policy when it fails) and local (one retry on another worker). The transport contract and the cause rule
are in core.py's docstring; this module holds the orchestration and the cause mapping of a failed leg, and reads
and writes the core's bookkeeping only through its legs (``core.prefill``, ``core.relay``) and its
``fallback_worker``, ``metrics``, ``workers``, ``tuning`` and ``clock``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..api.contract import RouterConfig
from .breaker import Ticket
from .policy_types import Decision
from .proxy import UpstreamError
from .request import Ctx

if TYPE_CHECKING:
    from .core import RequestCore

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

OnCommit = Callable[[], None]


class Legs(Protocol[R_co]):
    """One request's transport (see the module docstring)."""

    async def prefill(self, ctx: Ctx, worker: str, deadline: float) -> Any: ...

    async def relay(self, ctx: Ctx, worker: str, kv: Any | None, deadline: float | None, remote: bool,
                    on_commit: OnCommit) -> R_co: ...

    def error(self, ctx: Ctx, status: int, message: str, type_: str) -> R_co: ...

    def passthrough(self, ctx: Ctx, e: UpstreamError) -> R_co: ...

    def give_up(self, ctx: Ctx, e: UpstreamError) -> R_co: ...


def remote_decode_cause(e: UpstreamError) -> str:
    """The fallback cause of a failed decode leg on the remote path."""
    if e.cause == "timeout":
        return "kv_transfer_timeout"  # the prefill leg finished; no first token within the hand-off's deadline
    if e.cause == "generation_error":
        return "kv_load_failed"  # vLLM's request-level error before the first token: the KV pull failed
    if e.status is not None and 400 <= e.status < 500:
        return "decode_rejected"
    return decode_cause(e.cause)


def decode_cause(cause: str) -> str:
    return cause if cause.startswith("decode") else "decode_" + cause


def remote_policy_applies(cause: str) -> bool:
    """Whether ``routing.fallback.onKVTransferTimeout`` governs a failed remote path with this cause: everything
    but the decode worker's own failures (those are served elsewhere), and ``decode_rejected`` (the KV params)."""
    return not cause.startswith("decode_") or cause == "decode_rejected"


def give_up_status(e: UpstreamError) -> int:
    return e.status if e.status and e.status >= 500 else (504 if e.cause.endswith("timeout") else 502)


async def serve(core: RequestCore[R], ctx: Ctx, cfg: RouterConfig, d: Decision, hashes: tuple[int, ...],
                ticket: Ticket | None, legs: Legs[R]) -> R:
    """A decision's path: remote when it is remote and was admitted with a breaker ticket, else local."""
    if d.decision == "remote" and ticket is not None:
        ctx.path = "remote"
        return await _remote(core, ctx, cfg, d, hashes, ticket, legs)
    ctx.path = "local"
    return await _local(core, ctx, legs, d.decode, hashes, exclude=set())


async def _remote(core: RequestCore[R], ctx: Ctx, cfg: RouterConfig, d: Decision, hashes: tuple[int, ...],
                  ticket: Ticket, legs: Legs[R]) -> R:
    assert d.prefill and d.decode
    timeout_s = cfg.transfer_timeout_ms / 1000.0
    ctx.prefill_worker = d.prefill
    try:
        try:
            kv = await core.prefill(ctx, legs, d.prefill, core.clock() + timeout_s, hashes)
        except UpstreamError as e:
            ticket.release()  # the prefill side: no evidence about the KV path
            return await _after_remote_failure(core, ctx, cfg, legs, hashes, e, exclude=set())
        # the KV hand-off's own deadline, from the KV being ready: time the prefill leg spent queued is capacity,
        # and a decode leg left with what remained of one shared deadline timed out on it as a transport fault
        # (kv_transfer_timeout: breaker and mode evidence) whenever the prefill pool ran a queue
        deadline = core.clock() + timeout_s
        try:
            if ctx.stream and (delay := hedge_delay(core, ctx, d.decode)) is not None:
                return await _hedged(core, ctx, legs, d.decode, kv, hashes, deadline, ticket, delay)
            return await core.relay(ctx, legs, d.decode, kv, hashes,
                                    deadline=deadline if ctx.stream else None, on_commit=ticket.success)
        except UpstreamError as e:
            e.cause = remote_decode_cause(e)
            if e.cause.startswith("kv_"):
                ticket.failure(e.cause)
            return await _after_remote_failure(core, ctx, cfg, legs, hashes, e, exclude={d.decode})
    finally:
        ticket.release()  # cancelled, or no evidence: free a half-open slot (no-op after an outcome)


def hedge_delay(core: RequestCore[Any], ctx: Ctx, decode: str) -> float | None:
    """How long a remote stream's decode leg may go without its first token before a local prefill races it:
    ``hedge_factor`` × what the decode worker's healthy remote first tokens took for this many prompt tokens
    (load.py ``observe_remote_ttfb``: a floor; its pool's slowest such worker when it has none on record yet),
    at least ``hedge_min_s``, stretched by the
    requests queued there for room at its last scrape (a queue delays the first token too; requests waiting for
    their KV are no queue). None (no hedge) when hedging is off or no worker of the pool has a remote first
    token on record yet."""
    w = core.workers.get(decode)
    if core.tuning.hedge_factor <= 0 or w is None:
        return None
    per_token = w.remote_ttfb_per_token
    if per_token is None:  # a worker not yet used remotely: what its pool's workers took
        known = [x.remote_ttfb_per_token for x in core.workers.pools[w.role].values()
                 if x.remote_ttfb_per_token is not None]
        if not known:
            return None
        per_token = max(known)
    # a queue on the decode worker delays the first token too: each request waiting for room there (not those
    # waiting for their KV) adds as much again before the race starts
    return max(core.tuning.hedge_min_s, core.tuning.hedge_factor * per_token * ctx.input_tokens) * (1 + w.queued)


async def _hedged(core: RequestCore[R], ctx: Ctx, legs: Legs[R], decode: str, kv: Any, hashes: tuple[int, ...],
                  deadline: float, ticket: Ticket, delay: float) -> R:
    """A slow KV transfer is a routing event (DESIGN §10): the remote stream's decode leg runs; when its first
    token is ``delay`` late, a local prefill starts on another worker beside it. The first leg to commit serves
    (a commit gate: the other one raises before it records or sends anything) and the other is cancelled (its
    worker aborts the request, as after any cancelled leg). A local win is the fallback ``kv_transfer_slow``,
    transport evidence for the breakers like a timeout; a remote win is the remote path's success. When both
    fail, the remote leg's failure goes on to the normal fallback."""
    winner: list[str] = []
    decided = asyncio.Event()

    def gate(name: str, url: str, then: OnCommit | None = None) -> OnCommit:
        def commit() -> None:
            if winner:
                raise UpstreamError("lost_race", worker=url)
            winner.append(name)
            # counted as the race is decided: the winning leg may relay the whole answer, and the client close
            # the connection (cancelling this handler), before the code after the race runs again
            core.metrics.hedges.labels(name).inc()
            decided.set()
            ctx.decode_worker = url
            if then is not None:
                then()
        return commit

    remote = asyncio.create_task(core.relay(ctx, legs, decode, kv, hashes, deadline=deadline,
                                            on_commit=gate("remote", decode, ticket.success)))
    local: asyncio.Task[R] | None = None
    try:
        await asyncio.wait({remote}, timeout=delay)
        other = None if remote.done() or winner else core.fallback_worker({decode})
        if other is None:
            return await remote
        def local_won() -> None:
            # the remote leg's own failure when it had one by then, else it was only slow; set before the
            # answer's headers are written (X-Disagg-Path, X-Disagg-Reason are the commit's)
            failed = remote.exception() if remote.done() and not remote.cancelled() else None
            cause = remote_decode_cause(failed) if isinstance(failed, UpstreamError) else "kv_transfer_slow"
            ctx.path, ctx.fallback = "fallback", cause
            core.metrics.fallbacks.labels(cause).inc()
            if cause.startswith("kv_"):
                ticket.failure(cause)

        local = asyncio.create_task(core.relay(ctx, legs, other, None, hashes,
                                               on_commit=gate("local", other, local_won)))
        while not winner and not (remote.done() and local.done()):
            racing = [t for t in (remote, local) if not t.done()]
            committed = asyncio.ensure_future(decided.wait())
            try:
                await asyncio.wait({committed, *racing}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                committed.cancel()
        if not winner:
            core.metrics.hedges.labels("none").inc()
            return await remote  # raises its failure: the caller falls back as for any remote failure
        if winner[0] == "remote":
            await _cancel(local)
            return await remote
        await _cancel(remote)
        return await local
    finally:
        for t in (remote, local):
            if t is not None and not t.done():
                await _cancel(t)


async def _after_remote_failure(core: RequestCore[R], ctx: Ctx, cfg: RouterConfig, legs: Legs[R],
                                hashes: tuple[int, ...], e: UpstreamError, exclude: set[str]) -> R:
    ctx.fallback = e.cause
    core.metrics.fallbacks.labels(e.cause).inc()
    if remote_policy_applies(e.cause) and cfg.routing.fallback.on_kv_transfer_timeout == "Fail":
        status = 504 if "timeout" in e.cause else 502
        ctx.outcome, ctx.status = "upstream_error", status
        return legs.error(ctx, status, f"remote prefill failed: {e.cause}", "upstream_error")
    ctx.path = "fallback"
    worker = core.fallback_worker(exclude) or core.fallback_worker(set())
    if worker is None:
        ctx.outcome, ctx.status = "upstream_error", 503
        return legs.error(ctx, 503, "no worker available for the fallback path", "service_unavailable")
    return await _local(core, ctx, legs, worker, hashes, exclude=exclude, retried=bool(exclude))


async def _local(core: RequestCore[R], ctx: Ctx, legs: Legs[R], worker: str | None, hashes: tuple[int, ...],
                 exclude: set[str], retried: bool = False) -> R:
    worker = worker or core.fallback_worker(exclude)
    if worker is None:
        ctx.outcome, ctx.status = "upstream_error", 503
        return legs.error(ctx, 503, "no ready worker for this model", "service_unavailable")
    try:
        return await core.relay(ctx, legs, worker, None, hashes)
    except UpstreamError as e:
        if e.status is not None and 400 <= e.status < 500 and e.status not in (408, 429):
            # the worker refused the request itself: the client's error, pass it through
            ctx.outcome, ctx.status = "client_error", e.status
            return legs.passthrough(ctx, e)
        if retried:
            return _give_up(ctx, legs, e)
        cause = decode_cause(e.cause)
        ctx.fallback = ctx.fallback or cause
        core.metrics.fallbacks.labels(cause).inc()
        ctx.path = "fallback"
        exclude = exclude | {worker}
        other = core.fallback_worker(exclude) or worker  # one retry, on another worker when there is one
        try:
            return await core.relay(ctx, legs, other, None, hashes)
        except UpstreamError as e2:
            if e2.status is not None and 400 <= e2.status < 500:
                ctx.outcome, ctx.status = "client_error", e2.status
                return legs.passthrough(ctx, e2)
            return _give_up(ctx, legs, e2)


def _give_up(ctx: Ctx, legs: Legs[R], e: UpstreamError) -> R:
    ctx.outcome, ctx.status = "upstream_error", give_up_status(e)
    return legs.give_up(ctx, e)


async def _cancel(task: asyncio.Task[Any] | None) -> None:
    """Cancel a raced leg and wait until it has cleaned up (its connection closed, its engine request aborted)."""
    if task is None:
        return
    task.cancel()
    await asyncio.wait({task})  # (unlike awaiting the task, lets a cancellation of the caller itself through)
    if not task.cancelled():
        task.exception()  # retrieved: its failure is the race's business, not a stray "never retrieved" warning


"""The twin's transport for the router's request core: engine legs (router/core.py ``Legs``).

The legs call the simulated engines in process (the KV hand-off through cluster.py ``LocalKVLink``) and fail the way
the HTTP legs do, with the same causes; the request core around them is the router's own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from ..router.core import Legs, OnCommit
from ..router.proxy import PREFILL_KV_PARAMS, UpstreamError
from ..router.request import Ctx
from ..sim.protocol import ApiError, check_lengths, error_body

if TYPE_CHECKING:
    from .cluster import Outcome, TwinCluster, TwinWorker


class EngineLegs(Legs[None]):
    """One request's transport for the request core (router/core.py ``Legs``) in the twin: the legs call the
    simulated engines in process (the KV hand-off through ``LocalKVLink``) and fail the way the HTTP legs do,
    with the same causes: a removed or crashed worker refuses the connection, the fault table's per-request
    faults are HTTP 500s, a prompt over ``max_model_len`` is vLLM's 400, a stream that ends before its first token
    is vLLM's in-stream error (``generation_error``). The answer is written into the request's ``Outcome``."""

    __slots__ = ("cluster", "o")

    def __init__(self, cluster: TwinCluster, o: Outcome) -> None:
        self.cluster = cluster
        self.o = o

    def _admit(self, url: str, kv: dict[str, Any] | None, max_tokens: int | None, prefix: str) -> TwinWorker:
        """What the sim's HTTP server checks before it queues a request (sim/server.py ``_serve``)."""
        w = self.cluster.live(url)
        if w is None:
            raise UpstreamError(prefix + "connect_error", worker=url)
        try:
            check_lengths(w.engine.cfg, len(self.o.prepared.prompt_ids), max_tokens)
        except ApiError as e:
            raise UpstreamError(prefix + "rejected", status=400, body=_error_body(e), worker=url) from None
        remote_prefill = bool(kv and kv.get("do_remote_prefill") and w.engine.cfg.kv_transfer)
        fault = w.engine.request_fault(needs_local_prefill=not remote_prefill)
        if fault is not None:
            if fault[1]:
                self.cluster.crash(w)
            raise UpstreamError(prefix + "error", status=500, worker=url)
        return w

    async def _api_server(self, url: str) -> float:
        """The worker's API-server share of a leg (HTTP, tokenising, the hand-off to the engine core) before the
        request reaches its scheduler: ``Efficiency.request_overhead_s``, as the simulated server waits it
        (sim/server.py). Before admission, so a worker that crashed meanwhile refuses the leg. Returns when the API
        server took the leg (vLLM's ``arrival_time``, what the engine's TTFT counts from)."""
        received = self.cluster.clock.now()  # the clock the engine's request times are on
        w = self.cluster.workers.get(url)
        overhead = w.engine.perf.eff.request_overhead_s if w is not None else 0.0
        if overhead > 0:
            await asyncio.sleep(overhead)
        return received

    @override
    async def prefill(self, ctx: Ctx, worker: str, deadline: float) -> Any:
        c, p = self.cluster, self.o.prepared
        t = c.now
        received = await self._api_server(worker)
        self._admit(worker, PREFILL_KV, 1, "prefill_")
        leg = c.submit(worker, p, p.request_id + "-p", 1, dict(PREFILL_KV), priority=ctx.priority or 0,
                       received=received)
        assert leg.done is not None
        try:
            await asyncio.wait_for(asyncio.shield(leg.done), max(deadline - t, 0.001))
        except TimeoutError:
            leg.engine.abort(leg.req)  # the router closes the connection; vLLM aborts the request
            raise UpstreamError("prefill_timeout", worker=worker) from None
        self.o.prefill_leg_s = c.now - t
        if leg.reason != "length":
            raise UpstreamError("prefill_error", status=500, worker=worker)
        kv = leg.req.ctx.kv_params_out
        if not kv:
            raise UpstreamError("prefill_no_kv_params", worker=worker)
        ctx.engine_prompt_tokens = leg.req.prompt_len  # the prefill answer's usage.prompt_tokens (legs.py)
        return dict(kv)

    @override
    async def relay(self, ctx: Ctx, worker: str, kv: Any | None, deadline: float | None, remote: bool,
                    on_commit: OnCommit) -> None:
        c, o = self.cluster, self.o
        p, a = o.prepared, o.prepared.arrival
        ctx.decode_worker = worker
        received = await self._api_server(worker)
        self._admit(worker, kv, a.output_tokens, "")
        leg = c.submit(worker, p, p.request_id, a.output_tokens, kv, want_first=True, priority=ctx.priority or 0,
                       received=received)
        assert leg.done is not None and leg.first_token is not None
        # a stream commits at its first token; a non-streamed answer when it is whole (legs.py ``_first``)
        commit = leg.first_token if ctx.stream else leg.done
        try:
            if deadline is not None:
                try:
                    await asyncio.wait_for(asyncio.shield(commit), max(deadline - c.now, 0.001))
                except TimeoutError:
                    raise UpstreamError("timeout", worker=worker) from None
            else:
                await commit
            if leg.first is None or (not ctx.stream and leg.reason not in ("length", "stop")):
                if leg.reason == "abort":  # the worker went away (a crash) before anything was relayed
                    raise UpstreamError("disconnected", worker=worker)
                raise UpstreamError("generation_error", worker=worker)  # vLLM's error event / 500 before a token
            on_commit()  # raises when a raced leg won (router/core.py hedge): this one is abandoned
            await leg.done
        except BaseException:
            # the router closed the connection (a timeout, a lost race, a cancel): vLLM aborts the request
            if leg.reason is None:
                leg.engine.abort(leg.req)
            raise
        o.first, o.last, o.tokens, o.itl_max, o.end = leg.first, leg.last, leg.tokens, leg.itl_max, c.now
        ctx.output_tokens = leg.tokens
        if leg.tokens > 1 and leg.first is not None and leg.last is not None:  # legs.py: TPOT after the first
            ctx.timings["tpot"] = (leg.last - leg.first) / (leg.tokens - 1)
        o.kv_transfer_s = leg.req.ctx.xfer_s
        o.cached_tokens = leg.req.num_cached
        ctx.reused_tokens = leg.req.num_cached
        if not ctx.stream or _include_usage(a.body):  # the answer's usage, as the HTTP relay reads it
            ctx.engine_prompt_tokens = leg.req.prompt_len
        if leg.reason in ("length", "stop"):
            o.status, o.error = 200, ""
            ctx.outcome, ctx.status = "ok", 200
            c.core.tenants.observe(ctx.tenant, leg.tokens)  # accounting.py: ok requests teach the tenant average
        else:
            o.status, o.error = 500, f"generation ended: {leg.reason}"
            ctx.outcome, ctx.status = "upstream_error_mid_stream", 200

    def _end(self, status: int, error: str) -> None:
        self.o.status, self.o.error, self.o.end = status, error, self.cluster.now

    @override
    def error(self, ctx: Ctx, status: int, message: str, type_: str) -> None:
        self._end(status, message)

    @override
    def passthrough(self, ctx: Ctx, e: UpstreamError) -> None:
        self._end(ctx.status, e.body.decode() if e.body else e.cause)

    @override
    def give_up(self, ctx: Ctx, e: UpstreamError) -> None:
        self._end(ctx.status, f"upstream failed: {e.cause}")


# the prefill leg's kv_transfer_params (router/proxy.py prefill_body)
PREFILL_KV: dict[str, Any] = dict(PREFILL_KV_PARAMS)


def _include_usage(body: Any) -> bool:
    """A streamed answer carries usage only when the client asked (``stream_options.include_usage``)."""
    opts = body.get("stream_options") if isinstance(body, Mapping) else None
    return isinstance(opts, dict) and bool(opts.get("include_usage"))


def _error_body(e: ApiError) -> bytes:
    return json.dumps(error_body(e.message, e.err_type, e.status, e.param)).encode()

"""The simulated engine's KV-transfer side (vLLM's NixlConnector, as sim/engine.py's :class:`~disagg.sim.engine.Engine`
plays it): the prefill side's ``kv_transfer_params`` and the side channel's reads and releases of held blocks, the
decode side's pulls (modelled transfer time, the NIXL handshake, injected faults and the load-failure policy)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from .. import logs
from .nixl import PullOutcome, block_ids

if TYPE_CHECKING:  # what the engine protocol names; the transfer side needs none of them to run
    import random

    from ..perf.roofline import PerfModel
    from .clock import SimClock
    from .config import KVTransfer, SimConfig
    from .fastforward import FastForward
    from .metrics import Metrics
    from .scheduler import Request, Scheduler

log = logs.get("disagg.sim.engine")


class KVClient(Protocol):
    """The decode side's way to the prefill engines' KV: nixl.SideChannelClient (TCP), or the twin's in-process
    link. ``pull`` reads the blocks, awaits ``wait_modelled`` (the simulated transfer time), then notifies."""

    async def pull(self, params: dict[str, Any], request_id: str,
                   wait_modelled: Callable[[PullOutcome], Awaitable[None]]) -> PullOutcome: ...

    async def notify_only(self, params: dict[str, Any], request_id: str) -> bool: ...


class _Engine(Protocol):
    """What the transfer side reads and calls on its engine (sim/engine.py ``Engine``)."""

    cfg: SimConfig
    kvt: KVTransfer | None
    sched: Scheduler
    ff: FastForward | None
    metrics: Metrics
    perf: PerfModel
    client: KVClient | None
    clock: SimClock
    rng: random.Random
    engine_id: str | None
    side_port: int
    transfers_ok: int
    transfers_failed: int
    recomputed: int
    _handshakes: dict[str, float]

    def update_gauges(self) -> None: ...

    def wake(self, at: float | None = None) -> None: ...

    def _record_finish(self, req: Request, now: float) -> None: ...

    def _handshake_wait(self, remote_engine: str, t0: float) -> float: ...


class KVTransfers:
    """The engine's KV-transfer methods (a mixin of :class:`~disagg.sim.engine.Engine`)."""

    def _kv_params_for(self: _Engine, req: Request) -> dict[str, Any]:
        """The prefill's kv_transfer_params, as NixlConnector's request_finished returns them
        (vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py, 0.33.0 lines 278-293; the same keys
        but remote_registration_generation seen from a real 0.32.0 CPU engine, e2e/test_real_vllm.py): block ids
        per KV-cache group (one group here), and remote_prefill_cached_tokens added by the output processor
        (vllm/v1/engine/output_processor.py, 0.33.0 line 294)."""
        assert self.kvt is not None
        out: dict[str, Any] = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [list(req.blocks)],
            "remote_engine_id": self.engine_id,
            "remote_request_id": req.request_id,
            "remote_host": self.cfg.side_channel_host,
            "remote_port": self.side_port,
            "tp_size": self.cfg.tp,
            "dcp_size": 1,
            "pp_size": self.cfg.pp,
            "remote_num_tokens": req.prompt_len,
            "remote_blocks_expiry_time": None,
            "transfer_mode": "pull",
            "remote_prefill_cached_tokens": req.num_cached,
        }
        if self.cfg.release.registration_generation:
            out["remote_registration_generation"] = 0
        return out

    def serve_read(self: _Engine, request_id: str, block_ids: list[int]) -> tuple[bool, str, int, float]:
        entry = self.sched.held.get(request_id)
        if entry is None:
            return False, f"no KV blocks held for request {request_id} (unknown, already pulled, or lease " \
                          "expired)", 0, 0.0
        req, _ = entry
        if block_ids and list(block_ids) != list(req.blocks)[: len(block_ids)]:
            return False, f"remote_block_ids do not match the blocks held for request {request_id}", 0, 0.0
        return True, "", req.prompt_len, self.perf.transfer_bytes(req.prompt_len)

    def serve_release(self: _Engine, request_id: str) -> bool:
        if self.ff is not None:
            self.ff.interrupt(cut=True)
        freed = self.sched.release_held(request_id) is not None
        if not freed and self.metrics.nixl:
            # A completion notification for a request no longer held (its lease expired): vLLM >= 0.32.0 counts
            # it (record_notification_after_expiry, vllm/distributed/kv_transfer/kv_connector/v1/nixl/
            # pull_worker.py, 0.33.0); older releases only log it (the family is not exported for them).
            self.metrics.nixl_after_expiry.inc()
        self.update_gauges()
        self.wake()
        return freed

    def _handshake_wait(self: _Engine, remote_engine: str, t0: float) -> float:
        """Simulated seconds a pull starting at ``t0`` waits for the NIXL handshake with ``remote_engine``: the
        first pull from it starts the handshake (``transport.handshake_s``), and every pull that starts before the
        handshake ends waits for it, as NixlConnector's requests wait for their engine's handshake. Pulls that start
        at the same simulated time pay the same, whatever order the event loop runs them in."""
        end = self._handshakes.get(remote_engine)
        if end is None:
            end = self._handshakes[remote_engine] = t0 + self.cfg.transport.handshake_s
        return max(0.0, end - t0)

    async def _pull(self: _Engine, req: Request, t0: float) -> None:
        assert self.kvt is not None and self.client is not None and req.remote_prefill is not None
        params = req.remote_prefill
        remote_id = str(params.get("remote_request_id") or req.request_id)
        faults = self.cfg.faults
        delay = faults.kv_transfer_delay_ms / 1000.0
        outcome: PullOutcome
        marks: dict[str, float] = {}
        try:
            if req.num_external <= 0:
                await self.client.notify_only(params, remote_id)
                outcome = PullOutcome(True, "", 0, 0.0)
            elif faults.kv_transfer_fail_rate and self.rng.random() < faults.kv_transfer_fail_rate:
                await self.clock.sleep_until(t0 + self.cfg.transport.latency_s + delay)
                outcome = PullOutcome(False, "injected KV transfer failure (--fault-kv-transfer-fail-rate)")
            else:
                remote_tp = int(params.get("tp_size") or 1)

                async def wait_modelled(_out: PullOutcome) -> None:
                    model = self.perf.transfer_time(req.num_external, self.cfg.transport, remote_tp=remote_tp)
                    model += self._handshake_wait(str(params.get("remote_engine_id")), t0)
                    marks["data"], marks["target"] = self.clock.now(), t0 + model + delay
                    await self.clock.sleep_until(t0 + model + delay)

                outcome = await self.client.pull(params, remote_id, wait_modelled)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of a pull is a failed load, handled by the policy
            outcome = PullOutcome(False, f"side channel error: {e!r}")
        t1 = self.clock.now()
        if self.ff is not None:
            self.ff.interrupt(cut=True)
        if outcome.ok and marks:  # done when the bytes are in and the modelled time has passed (the NIXL
            t1 = min(t1, max(marks["data"], marks["target"]))  # notification rides on the transfer itself)
        m = self.metrics
        ctx = req.ctx  # the engine's ReqCtx
        if outcome.ok:
            self.transfers_ok += 1
            ctx.xfer_s = t1 - t0
            if req.num_external > 0:
                m.nixl_xfer_time.observe(t1 - t0)
                m.nixl_post_time.observe(min(t1 - t0, self.cfg.transport.latency_s))
                m.nixl_bytes.observe(self.perf.transfer_bytes(req.num_external))
                m.nixl_descs.observe(len(block_ids(params)) * 2 * self.cfg.model_preset.layers)
        else:
            self.transfers_failed += 1
            m.nixl_failed.inc()
            log.warning("kv_transfer_failed", request_id=req.request_id, remote_engine_id=params.get(
                "remote_engine_id"), error=outcome.error, policy=self.kvt.load_failure_policy)
        recompute = self.kvt.load_failure_policy == "recompute"
        if not outcome.ok and recompute:
            self.recomputed += 1
        if not self.sched.kv_loaded(req, outcome.ok, recompute):
            ctx.error = f"KV cache load failed for request {req.request_id} ({outcome.error}); " \
                        "kv_load_failure_policy=fail"
            self._record_finish(req, t1)
        self.update_gauges()
        self.wake(t1)

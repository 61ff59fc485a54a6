"""One elastic fleet (issue 27): a prefill worker that the SLO placement gives a whole long prompt is not idle to
the ladder's elastic rule (policy.py ``elastic``: streams are lent only to prefill workers whose steps are free of
long chunks), while short whole requests and the ladder's own lends leave its idle clock as it was."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from disagg.api.contract import RouterConfig
from disagg.router.core import RequestCore
from disagg.router.load import Worker, WorkerSet
from disagg.router.metrics import RouterMetrics
from disagg.router.placement import Prediction
from disagg.router.request import Ctx

CFG = RouterConfig.model_validate({"model": "m", "mode": "Disaggregated",
                                   "slo": {"ttftP95Ms": 1000, "tpotP95Ms": 50}})
NOW = 7.0


class Legs:
    """A decode leg that answers at once (the commit: its first token)."""

    async def relay(self, ctx: Ctx, worker: str, kv: Any | None, deadline: float | None, remote: bool,
                    on_commit: Any) -> None:
        assert (ctx.request_id, worker, kv, deadline, remote) == ("r", "http://p0", None, None, False)
        on_commit()


def _core() -> tuple[RequestCore[None], Worker]:
    ws = WorkerSet(clock=lambda: 0.0)
    ws.set_pool("decode", [("http://d0", "c")])
    ws.set_pool("prefill", [("http://p0", "c")])
    core: RequestCore[None] = RequestCore(ws, RouterMetrics(), clock=lambda: NOW)
    core.snapshot(CFG, (), "default", None)  # prices each pool's engine onto its workers (Worker.cost)
    p0 = ws.get("http://p0")
    assert p0 is not None and p0.cost is not None
    return core, p0


def _whole_on(core: RequestCore[None], url: str, tokens: int, placement: str | None) -> None:
    ctx = Ctx(request_id="r", endpoint="/v1/completions", stream=False, t0=NOW, input_tokens=tokens)
    if placement is not None:
        ctx.prediction = Prediction(placement, url, ttft_s=0.5, tpot_s=0.02, harm=0.0)
    asyncio.run(core.relay(ctx, Legs(), url, None, ()))  # type: ignore[arg-type]


def test_a_whole_long_prompt_placed_on_a_prefill_worker_restarts_its_idle_clock() -> None:
    core, p0 = _core()
    assert p0.cost is not None
    _whole_on(core, "http://p0", p0.cost.budget + 1, "prefill_worker")
    assert p0.remote_prefill_at == NOW
    assert core.snapshot(CFG, (), "default", None).prefill[0].remote_idle_s == 0.0


def test_short_whole_requests_and_the_ladders_lends_leave_the_idle_clock() -> None:
    core, p0 = _core()
    assert p0.cost is not None
    _whole_on(core, "http://p0", p0.cost.budget, "prefill_worker")  # one chunk: a step like a stream's
    _whole_on(core, "http://p0", p0.cost.budget + 1, None)  # the Thresholds ladder's lend: no prediction
    assert p0.remote_prefill_at == -math.inf
    assert core.snapshot(CFG, (), "default", None).prefill[0].remote_idle_s == math.inf

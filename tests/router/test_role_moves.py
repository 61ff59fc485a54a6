"""Role moves at the router (issue 28): ``WorkerSet.lend`` lends workers of one pool to the other role, the router
core applies the count its config carries (status.roleMoves), and a lent worker is priced as its own pool's engine."""

from __future__ import annotations

from disagg.api.contract import RouterConfig
from disagg.perf.costs import EngineCost
from disagg.router.core import RequestCore
from disagg.router.load import Worker, WorkerSet
from disagg.router.metrics import RouterMetrics
from disagg.router.policy_types import Tuning


def pools(p: int, d: int) -> WorkerSet:
    ws = WorkerSet(clock=lambda: 0.0)
    ws.set_pool("prefill", [(f"p{i}", "h") for i in range(p)])
    ws.set_pool("decode", [(f"d{i}", "h") for i in range(d)])
    return ws


def worker(ws: WorkerSet, url: str) -> Worker:
    w = ws.get(url)
    assert w is not None
    return w


def urls(ws: WorkerSet, role: str) -> list[str]:
    return sorted(w.url for w in ws.ready(role))


def test_a_lent_worker_serves_the_other_role_only() -> None:
    ws = pools(3, 2)
    worker(ws, "p0").inflight = 5  # busy: the idlest go first
    ws.lend({"decode": 2})
    assert urls(ws, "decode") == ["d0", "d1", "p1", "p2"]
    assert urls(ws, "prefill") == ["p0"]
    assert ws.role_of(worker(ws, "p1")) == "decode" and worker(ws, "p1").role == "prefill"  # it stays in its pool
    ws.lend({})
    assert urls(ws, "decode") == ["d0", "d1"] and urls(ws, "prefill") == ["p0", "p1", "p2"]


def test_the_same_workers_stay_lent_and_the_last_lent_returns_first() -> None:
    ws = pools(4, 1)
    ws.lend({"decode": 2})
    first = dict(ws.lent)
    for w in ws.pools["prefill"].values():  # loads change: the lent ones are now the busiest
        w.inflight = 9 if w.url in first else 0
    ws.lend({"decode": 2})
    assert ws.lent == first  # the count holds: the same workers
    ws.lend({"decode": 3})
    assert set(first) < set(ws.lent)
    ws.lend({"decode": 2})
    assert ws.lent == first  # the one lent last came back


def test_a_pool_never_lends_its_last_worker() -> None:
    ws = pools(1, 3)
    ws.lend({"decode": 1, "prefill": 5})
    assert urls(ws, "prefill") == ["d0", "d1", "p0"] and urls(ws, "decode") == ["d2"]


def test_a_lent_worker_that_leaves_its_pool_is_replaced() -> None:
    ws = pools(3, 1)
    ws.lend({"decode": 1})
    gone = next(iter(ws.lent))
    ws.set_pool("prefill", [(u, "h") for u in ("p0", "p1", "p2") if u != gone])  # discovery: the pod went away
    assert len(ws.lent) == 1 and gone not in ws.lent
    assert len(urls(ws, "decode")) == 2


def test_the_core_applies_the_configs_moves_and_prices_a_lent_worker_as_its_pool() -> None:
    ws = pools(3, 1)
    core: RequestCore[None] = RequestCore(ws, RouterMetrics(), Tuning(), clock=lambda: 0.0)
    cfg = RouterConfig.model_validate({
        "model": "m", "roleMoves": {"prefillToDecode": 1},
        "pools": {"prefill": {"service": "p", "engine": {"gpu": "H100", "model": "Llama-3.1-8B"}},
                  "decode": {"service": "d", "engine": {"gpu": "L40S", "model": "Llama-3.1-8B"}}}})
    snap = core.snapshot(cfg, (), "")
    assert len(snap.decode) == 2 and len(snap.prefill) == 2
    lent = next(w for w in ws.all() if ws.role_of(w) == "decode" and w.role == "prefill")
    own = worker(ws, "d0")
    assert lent.cost == EngineCost.from_profile(cfg.pools.engine("prefill"), cfg.model)
    assert own.cost == EngineCost.from_profile(cfg.pools.engine("decode"), cfg.model) != lent.cost
    core.snapshot(cfg.model_copy(update={"role_moves": None}), (), "")
    assert ws.lent == {}


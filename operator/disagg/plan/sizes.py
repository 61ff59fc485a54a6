"""A chosen candidate at other sizes: the fewest replicas of its shape that hold another rate (``resize``: the
emitted spec's autoscaling floor) and the same plan with one replica fewer per pool (``neighbours``: the report's
margin). Both re-evaluate with the search's :class:`~disagg.plan.search.Evaluator`."""

from __future__ import annotations

import math

from ..perf.presets import TRANSPORTS
from .model import build_workload
from .profile import Profile
from .search import Candidate, Evaluator, key_of


def resize(p: Profile, c: Candidate, rate: float) -> tuple[int, int]:
    """The fewest (prefill, decode) replicas of ``c``'s shape that still meet the SLOs at ``rate``."""
    model = p.model.resolve()
    wl = build_workload(p)
    ev = Evaluator(p, wl, model, TRANSPORTS[p.kv_transport])
    dkey = (c.decode.gpu, c.decode.tp)
    pkey = (c.prefill.gpu, c.prefill.tp) if c.prefill else None
    thr = math.inf if c.threshold is None else c.threshold
    best: tuple[float, int, int] | None = None
    for d in range(1, c.decode.replicas + 1):
        for np_ in range(0 if pkey is None else 1, (c.prefill.replicas if c.prefill else 0) + 1):
            cand = ev.evaluate(c.mode, thr, pkey, np_, dkey, d, rate)
            if cand.feasible and (best is None or cand.cost_per_hour < best[0]):
                best = (cand.cost_per_hour, np_, d)
            if cand.feasible:
                break
    if best is None:
        return (c.prefill.replicas if c.prefill else 0), c.decode.replicas
    return best[1], best[2]


def neighbours(p: Profile, c: Candidate) -> list[tuple[str, Candidate]]:
    """``c`` with one replica fewer in each pool (what the margin is), at the peak rate and, for feasibility, at the
    cover rate (as the search judged ``c``)."""
    wl = build_workload(p)
    ev = Evaluator(p, wl, p.model.resolve(), TRANSPORTS[p.kv_transport])
    mode, thr, pkey, np_, dkey, d = key_of(c)
    out = []
    if c.prefill is not None and np_ > 1:
        out.append(("one prefill replica fewer", ev.sized(mode, thr, pkey, np_ - 1, dkey, d)))
    if d > 1:
        out.append(("one decode replica fewer", ev.sized(mode, thr, pkey, np_, dkey, d - 1)))
    for _, n in out:
        ev.fill_percentiles(n)
    return out

"""The winner as a DisaggregatedModel (a plain dict; ``disagg validate`` accepts it)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .model import fixed_p95
from .profile import Profile
from .search import Candidate, PlanResult, Pool
from .sizes import resize


@dataclass(frozen=True)
class Bounds:
    """Replica bounds of a plan: ``replicas`` at the peak rate, ``min`` at the mean rate, ``max`` within the budget."""

    prefill: tuple[int, int, int]  # (min, replicas, max)
    decode: tuple[int, int, int]
    ratio: tuple[float, float] | None  # prefill:decode replica ratio bounds
    gpu_budget: int


def bounds(p: Profile, c: Candidate) -> Bounds:
    pmin, dmin = resize(p, c, p.traffic.rate.mean_rps)
    avail = {o.type: o.count for o in p.gpus}
    pools = [x for x in (c.prefill, c.decode) if x is not None]
    used: dict[str, int] = {}
    for x in pools:
        used[x.gpu] = used.get(x.gpu, 0) + x.gpus
    budget = min(p.search.max_gpus, sum(avail[t] for t in used))
    spare = max(0, budget - c.gpus)
    np_ = c.prefill.replicas if c.prefill else 0

    def top(pool: Pool | None, n: int) -> int:
        if pool is None:
            return 0
        return n + min(spare, max(0, avail[pool.gpu] - used[pool.gpu])) // pool.tp

    dmax = top(c.decode, c.decode.replicas)
    pmax = top(c.prefill, np_)
    ratio = None
    if c.prefill is not None:
        rs = [np_ / c.decode.replicas, pmin / max(1, dmin)]
        lo = max(0.01, math.floor(min(rs) / 1.5 * 100) / 100)
        hi = min(100.0, math.ceil(max(rs) * 1.5 * 100) / 100)
        ratio = (lo, hi)
    return Bounds((pmin, np_, pmax), (dmin, c.decode.replicas, dmax), ratio, budget)


def _pool(p: Profile, pool: Pool, rng: tuple[int, int, int], chunk: int | None = None) -> dict[str, Any]:
    offer = next(o for o in p.gpus if o.type == pool.gpu)
    gpu: dict[str, Any] = {"count": pool.tp}
    if offer.product:
        gpu["product"] = offer.product
    if offer.resource_name:
        gpu["resourceName"] = offer.resource_name
    out: dict[str, Any] = {"replicas": rng[1], "minReplicas": rng[0], "maxReplicas": rng[2], "gpu": gpu,
                           "parallelism": {"tensor": pool.tp}}
    if chunk is not None:
        out["maxNumBatchedTokens"] = chunk
    return out


def queue_wait_budget_ms(result: PlanResult, c: Candidate) -> int:
    """TTFT SLO minus the 95th percentile of the remote path's fixed part (own prefill + transfer + first step):
    the prefill-queue wait beyond which the router should prefill locally instead (the planner counts those prompts
    on the decode pool: model.overflow_share)."""
    wl = result.workload
    thr = c.threshold or 0
    fixed = fixed_p95(c.rfixed, wl.in_weight, [t >= thr for t in wl.in_tokens])
    return max(1, int(result.profile.slo.ttft_p95_ms - fixed * 1e3))


MARGIN_ANNOTATION = "plan.disagg.dev/margin"


def margin_note(c: Candidate) -> str:
    """One line for the emitted spec's annotation: what rate the plan holds and why (docs/planning.md)."""
    m = c.margin
    assert m is not None
    util = ([f"prefill {m.prefill_util:.0%}"] if m.prefill_util is not None else []) + [
        f"decode batch {m.decode_util:.0%} of cap"]
    return (f"sized for {m.cover_rps:.4g} req/s ({m.cover_what}); capacity {m.capacity_rps:.4g} req/s "
            f"({m.headroom:+.0%} over peakRps {m.peak_rps:g}); arrivals cv {m.ca2 ** 0.5:.3g}; "
            f"{', '.join(util)} at peak; TTFT p95 {m.ttft_of_slo:.0%}, TPOT p95 {m.tpot_of_slo:.0%} of SLO")


def to_model(result: PlanResult, c: Candidate, b: Bounds | None = None) -> dict[str, Any]:
    p = result.profile
    b = b or bounds(p, c)
    meta: dict[str, Any] = {"name": p.name}
    if p.namespace:
        meta["namespace"] = p.namespace
    if c.margin is not None:
        meta["annotations"] = {MARGIN_ANNOTATION: margin_note(c)}
    model: dict[str, Any] = {"name": p.model.served_model}
    if p.model.served_name:
        model["servedName"] = p.model.served_name
    if p.model.max_model_len:
        model["maxModelLen"] = p.model.max_model_len
    chunk = p.search.max_num_batched_tokens
    spec: dict[str, Any] = {"model": model}
    if c.prefill is None:
        spec["mode"] = "Aggregated"
        idle = Pool(c.decode.gpu, c.decode.tp, 0)
        spec["prefill"] = _pool(p, idle, (0, 0, 0))
        spec["decode"] = _pool(p, c.decode, b.decode, chunk)
    else:
        spec["mode"] = "Auto"
        spec["prefill"] = _pool(p, c.prefill, b.prefill, chunk)
        spec["decode"] = _pool(p, c.decode, b.decode, chunk if c.mode == "conditional" else None)
    kv: dict[str, Any] = {"transport": p.kv_transport}
    if p.kv_transport == "rdma":
        kv["rdma"] = {}
    spec["kvTransfer"] = kv
    if c.prefill is not None:
        thr = max(1, c.threshold or 0)
        spec["routing"] = {
            "remotePrefill": {"minInputTokens": thr, "maxPrefillQueueWaitMs": queue_wait_budget_ms(result, c),
                              "minExpectedOutputTokens": 0, "requireDecodePoolPressure": False},
            "localPrefill": {"maxInputTokens": thr - 1},
        }
    spec["slo"] = {"ttftP95Ms": p.slo.ttft_p95_ms, "tpotP95Ms": p.slo.tpot_p95_ms,
                   "goodputTarget": p.slo.goodput_target}
    auto: dict[str, Any] = {"enabled": p.prometheus_url is not None, "gpuBudget": b.gpu_budget}
    if p.prometheus_url:
        auto["prometheus"] = {"url": p.prometheus_url}
    if b.ratio is not None:
        auto["prefillDecodeRatio"] = {"min": b.ratio[0], "max": b.ratio[1]}
    spec["autoscaling"] = auto
    return {"apiVersion": "serving.disagg.dev/v1alpha1", "kind": "DisaggregatedModel", "metadata": meta,
            "spec": spec}

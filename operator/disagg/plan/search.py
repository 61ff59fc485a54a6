"""The search: every serving shape within the GPU budget, evaluated with the analytic model, ranked.

Shapes: aggregated (decode workers prefill locally), disaggregated (every prompt prefills remotely) and conditional
(prompts of at least ``threshold`` tokens prefill remotely, shorter ones locally); a GPU type and a TP size per
pool; replicas per pool. Candidates are sized for the peak rate; feasible ones are ranked by cost, then goodput.

**Headroom.** A candidate is feasible when it meets the SLOs at the peak rate *and* at the profile's cover rate
(``Profile.cover_rate``: the short-window peak of ``search.coverPeak`` — declared, else what arrivals at peakRps
show in one such window in twenty — when it is above peakRps, plus ``search.extraHeadroom``); one that meets them at
the peak only is reported as short of headroom. Every candidate
shown carries its :class:`Margin`: utilisation per pool, TTFT/TPOT p95 as a share of the SLO, and its capacity —
the highest arrival rate at which the model still says it meets the SLOs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..perf.presets import TRANSPORTS, ModelPreset, TransportPreset
from ..router.policy_types import Tuning
from .model import (
    DecodeSide,
    PoolModel,
    Workload,
    build_workload,
    by_tenant,
    decode_side,
    overflow_share,
    pool_model,
    prefill_queue,
    quantile,
    remote_fixed,
    stall_harm,
    transfers,
    ttft_ok,
)
from .profile import Profile
from .queueing import IDLE, Queue

Mode = Literal["aggregated", "disaggregated", "conditional"]
THRESHOLDS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
P95 = 0.95
SPILL_FLOOR = 1e-4  # an overflow share below this leaves the decode side as it is (a cached one)
# a remote prompt whose queue wait takes it past the TTFT target is one expected miss; the shipped router's SLO
# placement moves it to its decode worker when its stall there costs fewer, by the margin an overrule must save
SPILL_HARM_LIMIT = 1.0 - Tuning.slo_override


@dataclass(frozen=True)
class Pool:
    gpu: str
    tp: int
    replicas: int

    @property
    def gpus(self) -> int:
        return self.tp * self.replicas

    def __str__(self) -> str:
        return f"{self.replicas}×{self.gpu}" + (f" TP{self.tp}" if self.tp > 1 else "")


@dataclass(frozen=True)
class Margin:
    """How far a candidate is from missing: per pool, per SLO, and in arrival rate."""

    peak_rps: float
    cover_rps: float  # the rate it must meet the SLOs at (peakRps, or the declared short-window peak)
    cover_what: str  # "peakRps", "the 10s peak", …
    capacity_rps: float  # the highest rate at which the model still says it meets the SLOs (0: not even tiny)
    prefill_util: float | None  # prefill pool utilisation at the peak (None: no prefill pool)
    decode_util: float  # running sequences per decode replica over its cap (maxNumSeqs or KV cache), at the peak
    decode_prefill_share: float  # share of a decode replica's time on local prefills, at the peak
    ttft_of_slo: float  # TTFT p95 / SLO, at the peak
    tpot_of_slo: float
    ca2: float  # the arrivals' squared coefficient of variation the queues were modelled with

    @property
    def headroom(self) -> float:
        """Capacity over the peak rate, minus one (0.2: it holds 20 % more than peakRps)."""
        return self.capacity_rps / self.peak_rps - 1 if self.peak_rps > 0 else math.inf

    @property
    def covers(self) -> bool:
        return self.capacity_rps >= self.cover_rps * (1 - 1e-3)

    def to_dict(self) -> dict[str, float | str | bool | None]:
        r = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}
        r["headroom"] = round(self.headroom, 4)
        r["covers"] = self.covers
        return r


@dataclass
class Candidate:
    mode: Mode
    threshold: int | None  # remote prefill for prompts ≥ this many tokens (0: all); None when aggregated
    prefill: Pool | None
    decode: Pool
    cost_per_hour: float
    cost_per_mtok: float
    goodput: float
    ttft_share: float  # share of requests meeting the TTFT SLO
    tpot_share: float
    remote_share: float
    feasible: bool
    reasons: list[str]
    # model state, for the report
    dside: DecodeSide
    pqueue: Queue
    rfixed: tuple[float, ...]
    xfer: tuple[float, ...]
    ttft_p95_ms: float = math.nan
    tpot_p95_ms: float = math.nan
    xfer_p95_ms: float = math.nan
    short_of_headroom: bool = False  # meets the SLOs at the peak, not at the cover rate
    margin: Margin | None = None
    capacity_rps: float | None = None  # Evaluator.capacity, once computed

    @property
    def gpus(self) -> int:
        return self.decode.gpus + (self.prefill.gpus if self.prefill else 0)

    goodput_target: float = 0.9

    @property
    def shortfall(self) -> float:
        """How far from feasible: the largest shortfall in share of requests (0 when feasible)."""
        return max(0.0, P95 - self.ttft_share, P95 - self.tpot_share, self.goodput_target - self.goodput)

    def label(self) -> str:
        if self.mode == "aggregated":
            return f"aggregated {self.decode}"
        assert self.prefill is not None
        t = f" ≥{self.threshold}" if self.mode == "conditional" else ""
        return f"{self.mode}{t} P {self.prefill} : D {self.decode}"


@dataclass
class PlanResult:
    profile: Profile
    model: ModelPreset
    workload: Workload
    ranked: list[Candidate]  # feasible first (by cost), then the rest (closest first)
    evaluated: int
    seconds: float
    skipped: list[str] = field(default_factory=list)  # shapes left out, and why
    cover_rps: float = 0.0  # the rate every feasible candidate meets the SLOs at (Profile.cover_rate)
    cover_what: str = "peakRps"

    @property
    def feasible(self) -> list[Candidate]:
        return [c for c in self.ranked if c.feasible]

    @property
    def winner(self) -> Candidate | None:
        return self.ranked[0] if self.ranked and self.ranked[0].feasible else None

    def best_of(self, mode: Mode) -> Candidate | None:
        return next((c for c in self.ranked if c.mode == mode), None)


def spills(pq: Queue, remote: Sequence[bool], rfixed: Sequence[float], ds: DecodeSide, dm: PoolModel,
           wl: Workload, tau: float, tpot_tau: float) -> tuple[float, ...]:
    """Per input bin, the share of its remote prompts the router prefills on the decode pool instead: those whose
    prefill-queue wait would take the remote TTFT past the target (``tau`` less the bin's own prefill, transfer
    and first step: :func:`overflow_share`), as the SLO placement moves them — where the local path meets the
    target and the prompt's stall pushes fewer streams over the TPOT target than the remote path's own miss, less
    the margin an overrule must save (:data:`SPILL_HARM_LIMIT`; the ladder's maxPrefillQueueWaitMs proposes the
    move, the placement keeps the prompt remote otherwise). () when no bin spills more than :data:`SPILL_FLOOR`."""
    if pq.saturated or pq.c_wait <= 0:
        return ()
    out = tuple(round(overflow_share(pq, tau - f), 4)
                if r and lf <= tau and stall_harm(ds, wl, so, tpot_tau) <= SPILL_HARM_LIMIT else 0.0
                for r, f, lf, so in zip(remote, rfixed, ds.local_fixed, dm.solo, strict=True))
    return out if any(x > SPILL_FLOOR for x in out) else ()


class Evaluator:
    """Caches per-pool roofline quantities and per-(decode shape, replicas, threshold) decode sides."""

    def __init__(self, p: Profile, wl: Workload, model: ModelPreset, transport: TransportPreset) -> None:
        self.p, self.wl, self.model, self.transport = p, wl, model, transport
        self.pools: dict[tuple[str, int], PoolModel] = {}
        self.skipped: list[str] = []
        for offer in p.gpus:
            for tp in sorted(set(p.search.tensor_parallel)):
                if tp > min(offer.count, p.search.max_gpus):
                    continue
                if model.heads % tp:
                    self.skipped.append(f"{offer.type} TP{tp}: {model.heads} attention heads do not split {tp} ways")
                    continue
                pm = pool_model(offer.preset, tp, offer.cost, model, wl, p.search.max_num_batched_tokens,
                                p.search.gpu_memory_utilization)
                if pm.fits:
                    self.pools[(offer.type, tp)] = pm
                else:
                    self.skipped.append(f"{offer.type} TP{tp}: {pm.why_not}")
        self.count = {o.type: min(o.count, p.search.max_gpus) for o in p.gpus}
        self.evaluated = 0
        self._dsides: dict[tuple[str, int, int, float, float, tuple[float, ...]], DecodeSide] = {}
        self._xfer: dict[tuple[str, int, int], tuple[float, ...]] = {}
        self.cover, self.cover_what = p.cover_rate()

    def xfer(self, dkey: tuple[str, int], remote_tp: int) -> tuple[float, ...]:
        k = (dkey[0], dkey[1], remote_tp)
        got = self._xfer.get(k)
        if got is None:
            got = self._xfer[k] = transfers(self.pools[dkey], self.wl, self.transport, remote_tp)
        return got

    def masks(self, threshold: float) -> tuple[list[bool], list[bool]]:
        remote = [t >= threshold for t in self.wl.in_tokens]
        return remote, [not r for r in remote]

    def dside(self, key: tuple[str, int], d: int, threshold: float, rate: float,
              spill: tuple[float, ...] = ()) -> DecodeSide:
        """The decode side of ``d`` replicas; ``spill``: per input bin, the share of its remote prompts it
        prefills too (the prefill queue's overflow, :func:`spills`). Without it, the least load the decode pool
        can have at this threshold (the search prunes on it)."""
        k = (key[0], key[1], d, threshold, rate, spill)
        got = self._dsides.get(k)
        if got is None:
            remote, local = self.masks(threshold)
            share = [x if r else 1.0 for r, x in zip(remote, spill, strict=True)] if spill else local
            got = decode_side(self.pools[key], d, self.wl, rate, share, self.p.slo.tpot_p95_ms / 1e3)
            self._dsides[k] = got
        return got

    def evaluate(self, mode: Mode, threshold: float, pkey: tuple[str, int] | None, p: int,
                 dkey: tuple[str, int], d: int, rate: float) -> Candidate:
        self.evaluated += 1
        wl, slo = self.wl, self.p.slo
        remote, _ = self.masks(threshold)
        ds = self.dside(dkey, d, threshold, rate)
        dm = self.pools[dkey]
        if pkey is not None and p > 0:
            pm = self.pools[pkey]
            pq = prefill_queue(pm, p, wl, rate, remote)
            xfer = self.xfer(dkey, pm.tp)
            rfixed = remote_fixed(pm, xfer, ds)
            spill = spills(pq, remote, rfixed, ds, dm, wl, slo.ttft_p95_ms / 1e3, slo.tpot_p95_ms / 1e3)
            if spill:
                ds = self.dside(dkey, d, threshold, rate, spill)
                rfixed = remote_fixed(pm, xfer, ds)
            prefill: Pool | None = Pool(pkey[0], pkey[1], p)
            cost = pm.cost * pm.tp * p
        else:
            pq, rfixed, xfer, prefill, cost = IDLE, tuple(math.inf for _ in remote), (), None, 0.0
        cost += dm.cost * dm.tp * d
        tau = slo.ttft_p95_ms / 1e3
        tok = ttft_ok(remote, ds, pq, rfixed, tau)
        a = by_tenant(wl, tok, "in")
        b = by_tenant(wl, ds.tpot_ok, "out")
        goodput = sum(s * x * y for s, x, y in zip(wl.shares, a, b, strict=True))
        ttft_share = sum(s * x for s, x in zip(wl.shares, a, strict=True))
        tpot_share = sum(s * y for s, y in zip(wl.shares, b, strict=True))
        reasons = []
        if ds.saturated:
            reasons.append(ds.saturated)
        if pq.saturated:
            reasons.append(f"prefill pool saturated (utilisation {pq.rho:.0%})")
        if not ds.saturated and ds.local_queue.saturated:
            reasons.append(f"local prefill saturates the decode pool (utilisation {ds.local_queue.rho:.0%})")
        if ttft_share < P95:
            reasons.append(f"TTFT SLO met by {ttft_share:.1%} < 95%")
        if tpot_share < P95:
            reasons.append(f"TPOT SLO met by {tpot_share:.1%} < 95%")
        if goodput < slo.goodput_target:
            reasons.append(f"goodput {goodput:.1%} < target {slo.goodput_target:.0%}")
        tokens_per_hour = rate * wl.mean_out * 3600
        c = Candidate(mode, None if mode == "aggregated" else int(threshold), prefill, Pool(dkey[0], dkey[1], d),
                      cost, cost / tokens_per_hour * 1e6, goodput, ttft_share, tpot_share,
                      wl.remote_share(threshold) if prefill else 0.0, not reasons, reasons, ds, pq, rfixed, xfer,
                      goodput_target=slo.goodput_target)
        return c

    def sized(self, mode: Mode, threshold: float, pkey: tuple[str, int] | None, p: int, dkey: tuple[str, int],
              d: int) -> Candidate:
        """A candidate at the peak rate, feasible only if it also meets the SLOs at the cover rate (headroom)."""
        c = self.evaluate(mode, threshold, pkey, p, dkey, d, self.wl.peak_rps)
        if c.feasible and self.cover > self.wl.peak_rps * (1 + 1e-9):
            at = self.evaluate(mode, threshold, pkey, p, dkey, d, self.cover)
            if not at.feasible:
                c.feasible = False
                c.short_of_headroom = True
                c.reasons.append(f"no headroom for {self.cover_what} {self.cover:.3g} req/s: "
                                 + "; ".join(at.reasons))
        return c

    def capacity(self, c: Candidate, rel: float = 0.005) -> float:
        """The highest arrival rate at which ``c``'s shape and replicas still meet the SLOs in the model (bisection
        to ``rel``; feasibility falls with the rate). Not counted in ``evaluated``."""
        n = self.evaluated
        mode, thr, pkey, np_, dkey, d = key_of(c)

        def ok(rate: float) -> bool:
            return self.evaluate(mode, thr, pkey, np_, dkey, d, rate).feasible

        if c.capacity_rps is not None:
            return c.capacity_rps
        lo, hi = 0.0, self.wl.peak_rps
        floor = self.wl.peak_rps * 1e-3  # below a thousandth of the peak: 0 (it holds no traffic worth the name)
        while ok(hi) and hi < 1e6:
            lo, hi = hi, hi * 2
        while hi - lo > rel * hi and hi > floor:
            mid = (lo + hi) / 2
            if ok(mid):
                lo = mid
            else:
                hi = mid
        self.evaluated = n
        c.capacity_rps = lo
        return lo

    def fill_margin(self, c: Candidate) -> None:
        slo = self.p.slo
        d = c.dside
        c.margin = Margin(
            peak_rps=self.wl.peak_rps, cover_rps=self.cover, cover_what=self.cover_what,
            capacity_rps=self.capacity(c), prefill_util=c.pqueue.rho if c.prefill is not None else None,
            decode_util=(d.batch / d.batch_limit) if d.batch_limit > 0 and not d.saturated else 1.0,
            decode_prefill_share=d.prefill_share, ttft_of_slo=c.ttft_p95_ms / slo.ttft_p95_ms,
            tpot_of_slo=c.tpot_p95_ms / slo.tpot_p95_ms, ca2=self.wl.ca2)

    def fill_percentiles(self, c: Candidate) -> None:
        """Exact p95s by bisection on the mixture CDFs (done only for the candidates shown)."""
        wl = self.wl
        remote = [c.prefill is not None and t >= (c.threshold or 0) for t in wl.in_tokens]
        hi = 3600.0
        c.ttft_p95_ms = 1e3 * quantile(wl.in_weight, lambda t: ttft_ok(remote, c.dside, c.pqueue, c.rfixed, t),
                                       P95, hi)
        c.tpot_p95_ms = 1e3 * quantile(wl.out_weight, lambda t: c.dside.tpot_cdf(wl, t), P95, 60.0)
        if c.xfer and any(remote):
            pairs = sorted((x, w) for x, w, r in zip(c.xfer, wl.in_weight, remote, strict=True) if r)
            total = sum(w for _, w in pairs)
            acc = 0.0
            for x, w in pairs:
                acc += w
                if acc >= P95 * total - 1e-12:
                    c.xfer_p95_ms = x * 1e3
                    break


def key_of(c: Candidate) -> tuple[Mode, float, tuple[str, int] | None, int, tuple[str, int], int]:
    """``c``'s shape as :meth:`Evaluator.evaluate`'s arguments (mode, threshold, prefill key, P, decode key, D)."""
    dkey = (c.decode.gpu, c.decode.tp)
    pkey = (c.prefill.gpu, c.prefill.tp) if c.prefill else None
    thr = math.inf if c.threshold is None else c.threshold
    return c.mode, thr, pkey, (c.prefill.replicas if c.prefill else 0), dkey, c.decode.replicas


def thresholds_for(wl: Workload) -> list[int]:
    """Conditional thresholds that split the mix (between 2 % and 98 % of requests remote), one per distinct split of
    the binned prompts (the smallest threshold of each)."""
    out, seen = [], set()
    for t in THRESHOLDS:
        mask = tuple(x >= t for x in wl.in_tokens)
        if 0.02 <= wl.remote_share(t) <= 0.98 and mask not in seen:
            seen.add(mask)
            out.append(t)
    return out


def search(p: Profile) -> PlanResult:
    t0 = time.perf_counter()
    model = p.model.resolve()
    wl = build_workload(p)
    ev = Evaluator(p, wl, model, TRANSPORTS[p.kv_transport])
    rate = wl.peak_rps
    budget = p.search.max_gpus
    cands: list[Candidate] = []
    keys = sorted(ev.pools)

    def free(g: str, used: dict[str, int]) -> int:
        return ev.count[g] - used.get(g, 0)

    if "aggregated" in p.search.modes:
        for dkey in keys:
            for d in range(1, min(budget, ev.count[dkey[0]]) // dkey[1] + 1):
                c = ev.sized("aggregated", math.inf, None, 0, dkey, d)
                cands.append(c)
                if c.feasible:
                    break
    thresholds: list[tuple[Mode, int]] = []
    if "disaggregated" in p.search.modes:
        thresholds.append(("disaggregated", 0))
    if "conditional" in p.search.modes:
        thresholds += [("conditional", t) for t in thresholds_for(wl)]
    tau = p.slo.ttft_p95_ms / 1e3
    top = max(rate, ev.cover)  # what the candidates must hold
    for mode, thr in thresholds:
        remote, _ = ev.masks(thr)
        for dkey in keys:
            for d in range(1, min(budget, ev.count[dkey[0]]) // dkey[1] + 1):
                ds = ev.dside(dkey, d, thr, rate)
                used_d = {dkey[0]: d * dkey[1]}
                # no number of prefill replicas helps a decode pool that misses TPOT or is saturated (at the peak
                # or at the cover rate)
                decode_ok = all(not x.saturated and sum(
                    w * q for w, q in zip(wl.out_weight, x.tpot_ok, strict=True)) >= P95
                    for x in (ds, ev.dside(dkey, d, thr, top)))
                for pkey in keys:
                    room = min(budget - d * dkey[1], free(pkey[0], used_d))
                    pmax = room // pkey[1]
                    if pmax < 1:
                        continue
                    pm = ev.pools[pkey]
                    # no number of prefill replicas helps when the remote path alone misses the SLO
                    rf = remote_fixed(pm, ev.xfer(dkey, pm.tp), ds)
                    floor = sum(w for w, r, f in zip(wl.in_weight, remote, rf, strict=True) if r and f > tau)
                    for np_ in range(1, pmax + 1):
                        if prefill_queue(pm, np_, wl, top, remote).saturated and np_ < pmax:
                            continue
                        c = ev.sized(mode, thr, pkey, np_, dkey, d)
                        cands.append(c)
                        if c.feasible or not decode_ok or floor > 1 - P95:
                            break
    ranked = rank(cands, ev)
    if ranked and not ranked[0].feasible:
        ranked = closest(ev, ranked, p)
    shown = display_set(ranked)
    for c in shown:
        ev.fill_percentiles(c)
        ev.fill_margin(c)
    return PlanResult(p, model, wl, ranked, ev.evaluated, time.perf_counter() - t0, ev.skipped, ev.cover,
                      ev.cover_what)


TIE_HEAD = 8  # the cheapest candidates (and all that cost the same as the last of them) get their capacity


def rank(cands: Sequence[Candidate], ev: Evaluator | None = None) -> list[Candidate]:
    """Feasible candidates by cost, then — with ``ev`` — the most capacity (headroom: among plans that cost the
    same, the one that holds the most traffic; computed for the cheapest ``TIE_HEAD`` and their cost ties), then
    goodput; then the infeasible ones, closest first."""
    feasible = sorted((c for c in cands if c.feasible),
                      key=lambda c: (round(c.cost_per_hour, 6), -round(c.goodput, 4), c.gpus,
                                     c.pqueue.rho + c.dside.prefill_share))
    if ev is not None and feasible:
        last = round(feasible[min(TIE_HEAD, len(feasible)) - 1].cost_per_hour, 6)
        n = sum(1 for c in feasible if round(c.cost_per_hour, 6) <= last)
        head = sorted(feasible[:n], key=lambda c: (round(c.cost_per_hour, 6), -round(ev.capacity(c), 2),
                                                   -round(c.goodput, 4), c.gpus))
        feasible = head + feasible[n:]
    rest = sorted((c for c in cands if not c.feasible),
                  key=lambda c: (bool(c.dside.saturated or c.pqueue.saturated), round(c.shortfall, 3),
                                 c.cost_per_hour, -c.goodput))
    return feasible + rest


def closest(ev: Evaluator, ranked: list[Candidate], p: Profile, pool: int = 200) -> list[Candidate]:
    """When nothing is feasible: the candidates that need the SLOs relaxed least (by the ratio of their predicted
    p95s to the targets, then goodput), computed exactly for the ``pool`` best by shortfall."""
    head, tail = ranked[:pool], ranked[pool:]
    for c in head:
        ev.fill_percentiles(c)

    def key(c: Candidate) -> tuple[float, float, float]:
        ratio = max(c.ttft_p95_ms / p.slo.ttft_p95_ms, c.tpot_p95_ms / p.slo.tpot_p95_ms, 1.0)
        return (round(ratio, 3), round(max(0.0, p.slo.goodput_target - c.goodput), 3), c.cost_per_hour)

    return sorted(head, key=key) + tail


def display_set(ranked: Sequence[Candidate], top: int = 8) -> list[Candidate]:
    """The first ``top`` candidates, plus the best of each mode not among them (so the table compares modes)."""
    out = list(ranked[:top])
    for mode in ("aggregated", "disaggregated", "conditional"):
        best = next((c for c in ranked if c.mode == mode), None)
        if best is not None and best not in out:
            out.append(best)
    return out

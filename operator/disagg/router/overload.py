"""Admission's prediction under overload (core.py ``RequestCore.admit``; docs/router.md "Admission and overload"):
whether a request is past the knee — its predicted TTFT beyond the SLO by the admission margin — and the wait for
room on a decode worker that is out of it. PURE: a decision, the load snapshot and the config in, no clock, no
I/O. The queue that holds what is past the knee is admission.py's."""

from __future__ import annotations

from ..api.contract import RouterConfig
from . import placement as pl
from .placement import Prediction
from .policy_types import Decision, LoadSnapshot, WorkerLoad

# Admission (admit): a request is past the knee when its predicted TTFT exceeds the SLO (or, for a prompt that
# cannot make the SLO even on an idle engine, that idle TTFT) by more than this share of it. Negative: the
# prediction is a median, and past the knee it runs short of what the engines then do (stale scrapes, local
# prefills beside a full batch of streams: docs/router.md "Admission and overload"), so admission holds a request
# predicted beyond half its SLO. Measured on `disagg bench overload`'s cluster at its top step (batch 32 req/s),
# batch goodput within the SLO in req/s, Shed / Queue: margin 0: 6.7 / 6.0; -0.3: 8.8 / 6.7; -0.5: 13.8 / 11.1;
# -0.7: 12.6 / 13.1 (chat 100 % in every case).
ADMISSION_MARGIN = -0.5
IDLE_FACTOR = 2.0  # … and beyond twice what it would take on an idle engine (a long prompt is not an overload)


def over_slo(cfg: RouterConfig, d: Decision, snap: LoadSnapshot, tokens: int, max_tokens: int | None,
             default_output_tokens: int, margin: float = ADMISSION_MARGIN) -> tuple[bool, float]:
    """Whether ``d``'s predicted TTFT misses the SLO by the admission margin, and by how many seconds it
    exceeds that limit. The SLO placement's own prediction when it made one, else the same model (placement.py)
    on the ladder's choice, at least the ladder's prefill-queue estimate for a remote one; plus the wait for
    room on a decode worker that is out of it (:func:`room_wait`). A prompt long enough that even an idle
    engine takes a good part of the SLO is held only past :data:`IDLE_FACTOR` times that idle TTFT."""
    slo = cfg.slo.ttft_p95_ms / 1000.0
    pred = d.detail.get("prediction")
    by_url = {w.url: w for w in (*snap.decode, *snap.aggregated, *snap.prefill)}
    out = float(max_tokens if max_tokens is not None else
                snap.tenant_avg_output_tokens or default_output_tokens)
    if isinstance(pred, Prediction):
        ttft, tpot = pred.ttft_s, pred.tpot_s
        dw, first = by_url.get(pred.worker), by_url.get(pred.prefill_worker or pred.worker)
    else:
        slo_tpot = cfg.slo.tpot_p95_ms / 1000.0
        dw = by_url.get(d.decode or "")
        pw = next((w for w in snap.prefill if w.url == d.prefill), None) if d.prefill else None
        if dw is None:
            return False, 0.0
        if d.decision == "remote" and pw is not None:
            p = pl.predict_remote(pw, pl.cost_of(pw), dw, pl.cost_of(dw), tokens, slo_tpot, out, slo_ttft_s=slo)
            first = pw
        else:
            p = pl.predict_whole(dw, pl.cost_of(dw), tokens, "local", slo_tpot, out, slo_ttft_s=slo)
            first = dw
        ttft, tpot = p.ttft_s, p.tpot_s
    if dw is not None:
        ttft += room_wait(dw, out, tpot)
    limit = slo * (1.0 + margin)
    if first is not None:
        cost = pl.cost_of(first)
        idle = (cost.request_overhead_s + cost.prefill(tokens).seconds) * first.f_prefill
        limit = max(limit, IDLE_FACTOR * idle)
        if d.decision == "remote" and d.est_prefill_wait_ms is not None:
            # the ladder's backlog clock (load.py) sees the prefill queue from what it sent: the larger wins
            ttft = max(ttft, d.est_prefill_wait_ms / 1000.0 + idle)
    return ttft > limit, max(0.0, ttft - limit)


ROOM_FULL_KV = 0.9  # a worker this full of KV blocks admits new streams only as others finish


def newest_first_after(cfg: RouterConfig) -> float:
    """A tenant's admission queue is released newest first once its oldest request has waited this long: half the
    TTFT SLO (admission.py, adaptive LIFO)."""
    return cfg.slo.ttft_p95_ms / 2000.0


def room_wait(w: WorkerLoad, out_tokens: float, tpot_s: float) -> float:
    """Admission's wait for room on the worker that decodes: with ``w.queued`` requests waiting for room (KV
    blocks or sequence slots) at its last scrape, a new one waits until that many of its ``w.running`` streams
    have finished, and streams finish at about ``running / (out_tokens × TPOT)`` per second (Little's law). The
    placement's TTFT (placement.py) prices a queue of compute, not of room; past the knee the room is what runs
    out first on a decode worker."""
    if w.running < 1:
        return 0.0
    # the scrape is up to an interval old: on a full worker the router's own requests beyond those running wait too
    queued = max(w.queued, w.inflight - w.running) if w.kv_usage >= ROOM_FULL_KV else w.queued
    return max(0.0, queued) * out_tokens * tpot_s / w.running

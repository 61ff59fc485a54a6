"""SLO-predictive placement (``spec.routing.policy: SLO``). PURE: features + load snapshot + SLO → the placement
that keeps the most requests within the SLO, with its prediction. No I/O, no clock. slo_policy.py ``slo_decision``
prices the ladder's choice and the alternatives with these functions and, once the ladder's choice is at risk
(``Tuning.slo_keep`` expected misses), overrules it when another placement is predicted to keep more requests
within the SLO (by more than ``Tuning.slo_override`` expected misses: 0.01 by default, a noise floor, so the fewest
expected misses wins unless the difference is within it).

For a request of ``n`` prompt tokens the router prices every feasible placement on the workers it would use
(docs/router.md "SLO placement"):

* ``local`` — the whole request on the chosen decode worker ``d``: its prefill runs in ``d``'s steps beside the
  streams already there (chunked at ``d``'s budget, behind the prefills queued there), minus the prefix ``d`` holds;
* ``remote`` — prefill on the chosen prefill worker ``p`` (behind its backlog), the KV transfer, then decode on ``d``
  (its first token behind the prompts queued on ``d`` before it, as far as they outlast the prefill and transfer);
* ``prefill_worker`` — the whole request on ``p`` (one elastic fleet: a prefill worker serves a whole request as
  an aggregated engine does; vLLM's NixlConnector acts on a request's ``kv_transfer_params``, not on the role).

Each prediction: TTFT = request overhead + queue + prefill steps (+ transfer + first decode step for ``remote``),
TPOT = the worker's mean step time for one more stream under the prefill traffic it receives (perf/costs.py), and
the harm: how many of the streams already on the worker the placement's prefill stalls push over the TPOT SLO.
Every worker's prediction is scaled by its online correction (observed ÷ predicted, router/load.py).

The choice minimises the **expected misses**: a prediction is a median, so the chance that a request meets a
target is taken as a logistic in predicted ÷ target with a relative spread :data:`SPREAD` (about the twin's own
prediction error below the knee); the expected misses of a placement are this request's chance to miss TTFT or TPOT
plus, over the streams already there, the rise of their chance to miss TPOT. Ties: the most headroom (the smallest
of predicted ÷ SLO over TTFT and TPOT). A whole request on a prefill worker is judged as any other placement: its
stream is priced under the pool's remote prefill traffic (``rate_floor``), so it wins only where that still beats
the decode worker (no slack is asked of it: that kept the prefill pool out of whole requests exactly when the fleet
was loaded; docs/router.md "One elastic fleet").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from ..api.models import SLOSpec
from ..perf.costs import EngineCost

if TYPE_CHECKING:
    from .policy_types import WorkerLoad

SPREAD = 0.15  # relative spread of an outcome around its prediction (logistic scale)
# the streams on a worker spread around its mean TPOT (each its own context and output) wider than one prediction
STREAM_SPREAD = 0.3
LOGISTIC_PER_SD = math.sqrt(3.0) / math.pi  # a logistic's scale per unit of its standard deviation
Z95 = 1.6449  # the standard normal's 95th percentile: spec.slo's targets are p95s
MIN_STREAM_SPREAD = 0.02  # a worker whose streams all took the same TPOT still spreads them this much
# the busiest a decode worker's prefill queue is read as (its share of time prefilling): at 1 and beyond the
# queueing wait has no steady state, and the backlog's growth (_backlog_then) speaks instead
RHO_MAX = 0.95


def p_miss(predicted_s: float, target_s: float, spread: float = SPREAD) -> float:
    """The chance that an outcome predicted at ``predicted_s`` (a median) lands above ``target_s``."""
    z = (predicted_s / target_s - 1.0) / spread
    if z > 40:
        return 1.0
    if z < -40:
        return 0.0
    return 1.0 / (1.0 + math.exp(-z))


class Prediction(NamedTuple):  # a NamedTuple: three per request on the hot path (a quarter of a dataclass's cost)
    placement: str  # local | remote | prefill_worker
    worker: str  # where it decodes
    ttft_s: float
    tpot_s: float
    harm: float  # expected streams already there pushed over the TPOT SLO by this placement
    prefill_worker: str | None = None  # remote: where it prefills
    prefill_s: float = 0.0  # remote: the prefill leg (queue + compute) predicted

    def expected_misses(self, slo: SLOSpec) -> float:
        return misses(self, slo.ttft_p95_ms / 1000.0, slo.tpot_p95_ms / 1000.0)

    def headroom(self, slo: SLOSpec) -> float:
        return _headroom(self, slo.ttft_p95_ms / 1000.0, slo.tpot_p95_ms / 1000.0)

    def as_detail(self) -> dict[str, Any]:
        return {"placement": self.placement, "predicted_ttft_ms": round(self.ttft_s * 1000.0, 1),
                "predicted_tpot_ms": round(self.tpot_s * 1000.0, 2), "harm": round(self.harm, 3)}


def _batch(w: WorkerLoad, cost: EngineCost) -> tuple[int, float]:
    """The streams ``w`` runs and their mean context (tokens). The streams: its running count (the router's in
    flight there when higher than the last scrape), at most ``--max-num-seqs``: vLLM runs no more at once, and the
    router's count includes the requests queued there, which take no share of a step's token budget (read as
    streams, a queue of a thousand left a prefill one token per step and predicted TTFTs of hours past the knee)."""
    n = int(w.running)
    if n > cost.max_num_seqs:
        n = cost.max_num_seqs
    return n, (w.kv_usage * cost.kv_capacity_tokens / n if n >= 1 else 0.0)


def _ahead(w: WorkerLoad) -> float:
    """Prompt tokens ahead of a new prefill there: the router's own not yet at their first token, or other
    clients' queue when that is longer (the router's queued ones are in vLLM's waiting count too)."""
    queue = w.queued * w.avg_prompt_tokens
    return float(w.ahead_tokens) if w.ahead_tokens >= queue else queue


def _harm(w: WorkerLoad, cost: EngineCost, streams: int, ctx: float, rate: float, stall_s: float,
          slo_tpot_s: float, out_tokens: float) -> float:
    """Expected streams on ``w`` that a prefill stalling them ``stall_s`` in all (its share of the mixed steps,
    beyond the prefills ahead of it) pushes over the TPOT SLO (each stream's mean TPOT grows by the stall spread
    over its output).

    The streams' TPOT is centred on the model's at the worker's load now, or on what the worker's recent streams
    took when that is more (a stream lives through load the snapshot does not see: the prefills and streams that
    come after it), and spread around it as theirs were (``w.stream_spread``; :data:`STREAM_SPREAD` until
    measured): a worker whose streams sit close to the target has little TPOT slack for another prefill's stall.

    Past the target that rise shrinks to nothing (a stream already likely to miss has little chance left to lose),
    so a worker whose streams miss *because of* the prefills it receives would look free to take more. The harm is
    therefore at least this prefill's share of what the worker's prefill traffic (``rate``) does to its streams:
    their chance to miss at the TPOT they take now less at the TPOT they would take without that traffic (the same
    streams, ``rate`` 0), per second of TPOT, times the TPOT this prefill adds — the secant where the marginal
    rise is its tangent. Below the target the tangent is the larger and decides (a logistic is convex there);
    above it, the secant keeps the prefills that put the streams there answerable for it."""
    if streams <= 0 or stall_s <= 0:
        return 0.0
    # the streams' steps without and with a full chunk beside them (the engine's memo: priced once per worker state)
    t_d, t_m = cost.decode_step(streams, ctx), cost.mixed_step(streams, ctx)
    model = cost.tpot_of(streams, t_d, t_m, rate)  # cost.tpot(streams, ctx, rate), the same float
    before = model * w.f_decode
    if w.stream_tpot_s > before:
        before = w.stream_tpot_s
    # a log's standard deviation as the logistic's relative scale: σ·√3/π
    spread = w.stream_spread * LOGISTIC_PER_SD if w.stream_spread > 0.0 else STREAM_SPREAD
    if spread < MIN_STREAM_SPREAD:
        spread = MIN_STREAM_SPREAD
    added = stall_s * w.f_decode / (out_tokens if out_tokens > 1.0 else 1.0)
    # no stream there takes longer than one step with a full chunk beside it (EngineCost.mixed_step): a prefill
    # cannot push the streams' TPOT past that ceiling, only keep them at it for longer
    ceiling = t_m * w.f_decode
    if before + added > ceiling:
        added = ceiling - before if ceiling > before else 0.0
        if added <= 0.0:
            return 0.0
    p_before = p_miss(before, slo_tpot_s, spread)
    rise = p_miss(before + added, slo_tpot_s, spread) - p_before
    if rate > 0.0 and model > 0.0:  # its share of what the prefills the worker receives do to the streams (docstring)
        quiet = before * t_d / model  # the same streams without that traffic: cost.tpot(streams, ctx, 0.0)
        if before > quiet:
            share = (p_before - p_miss(quiet, slo_tpot_s, spread)) / (before - quiet) * added
            if share > rise:
                rise = share
    return streams * rise if rise > 0.0 else 0.0


def over_tpot_budget(w: WorkerLoad, slo_tpot_s: float) -> bool:
    """Whether more than one in twenty of ``w``'s recent streams end above the TPOT target (their p95, a
    log-normal of the measured centre and spread, beyond it): the worker has spent the TPOT SLO's allowance, and
    a prefill placed there by choice is paid for by streams that already miss (slo_decision)."""
    return w.stream_tpot_s > 0.0 and w.stream_tpot_s * math.exp(Z95 * w.stream_spread) > slo_tpot_s


def _queue_harm(w: WorkerLoad, ttft_s: float, own_s: float, slo_ttft_s: float) -> float:
    """Expected later requests pushed over the TTFT SLO because they queue behind this prefill's ``own_s`` seconds
    on ``w``: those arriving there while it waits and runs (the worker's recent prefill arrivals, requests/s, ×
    its predicted TTFT), each later by ``own_s``."""
    if own_s <= 0 or w.prefill_rate <= 0:
        return 0.0
    size = w.avg_prompt_tokens or 1000.0
    arrivals = w.prefill_rate / (size if size > 1.0 else 1.0) * ttft_s
    rise = p_miss(ttft_s + own_s, slo_ttft_s) - p_miss(ttft_s, slo_ttft_s)
    return arrivals * rise if rise > 0.0 else 0.0


def predict_whole(w: WorkerLoad, cost: EngineCost, tokens: int, placement: str, slo_tpot_s: float,
                  out_tokens: float, rate_floor: float = 0.0, slo_ttft_s: float = 1.0) -> Prediction:
    """The whole request on ``w`` (``local`` on a decode worker, ``prefill_worker`` on a prefill worker).
    ``rate_floor``: the prefill traffic the worker is expected to receive at least (a prefill worker: its pool's
    mean rate, since the router spreads remote prefills over the pool)."""
    streams, ctx = _batch(w, cost)
    rate = w.prefill_rate if w.prefill_rate >= rate_floor else rate_floor
    cached = _cached(w, tokens)
    pre = cost.prefill(tokens - cached, cached, streams, ctx, _ahead(w))
    ttft = (cost.request_overhead_s + pre.seconds) * w.f_prefill
    tpot = cost.tpot(streams + 1, (streams * ctx + tokens) / (streams + 1), rate) * w.f_decode
    harm = _harm(w, cost, streams, ctx, rate, pre.own_stall_s, slo_tpot_s, out_tokens)
    harm += _queue_harm(w, ttft, pre.own_s * w.f_prefill, slo_ttft_s)
    return Prediction(placement, w.url, ttft, tpot, harm)


def _cached(w: WorkerLoad, tokens: int) -> int:
    """The prompt's prefix ``w`` holds, less the last token (vLLM computes at least one)."""
    if w.prefix_tokens <= 0:
        return 0
    return min(w.prefix_tokens, max(0, tokens - 1))


def _backlog_then(d: WorkerLoad, cost: EngineCost, streams: int, ctx: float, after_s: float) -> float:
    """Seconds a request that reaches decode worker ``d`` ``after_s`` from now (a remote one: its decode leg is
    sent when its prefill leg ends) waits there for the local prefills before it gets room in a step.

    vLLM's scheduler (vllm/v1/core/sched/scheduler.py ``schedule``, 0.33.0) gives a step's token budget to the
    running requests first, a prefill in progress taking all that is left, and walks the waiting queue in order; a
    remote request starts its KV pull only when the walk reaches it with budget left, and is then skipped while
    the pull runs, so the next waiting prompt is admitted and prefills whole before the request, its KV in place,
    gets room. The wait is the larger of

    * the backlog then, as a fluid: the prompt tokens queued there now, plus those the router keeps sending it
      (its recent prefill rate), less what it prefills meanwhile; and
    * the queueing wait of a steady prefill queue at that rate (Pollaczek–Khinchine, M/G/1: ρ ÷ (1 − ρ) × the
      mean residual of the prefill in progress, from the sizes of the prefills sent there lately; ρ, the share of
      time the worker prefills, read at most :data:`RHO_MAX`) — prefills arrive unevenly, so a worker busy 80 %
      of the time keeps a queue that the fluid, which clears it, does not see;

    plus, once the pull has started, the chance ρ that a local prefill is waiting to be admitted, times its mean
    service."""
    ahead = _ahead(d)
    if ahead <= 0 and d.prefill_rate <= 0:
        return 0.0
    probe = max(ahead, float(cost.budget))
    steps, step_s = cost.backlog(streams, ctx, probe)
    capacity = probe / max(1e-9, steps * step_s * d.f_prefill)  # tokens/s
    left = ahead + (d.prefill_rate - capacity) * after_s
    wait = left / capacity if left > 0 else 0.0
    if d.prefill_residual_tokens > 0 and d.prefill_rate > 0:
        rho = d.prefill_rate / capacity
        if rho > RHO_MAX:
            rho = RHO_MAX
        queueing = rho / (1.0 - rho) * d.prefill_residual_tokens / capacity
        if queueing > wait:
            wait = queueing
        wait += rho * d.prefill_size_tokens / capacity  # the prefill admitted while its KV is pulled
    return wait


def predict_remote(p: WorkerLoad, p_cost: EngineCost, d: WorkerLoad, d_cost: EngineCost, tokens: int,
                   slo_tpot_s: float, out_tokens: float, slo_ttft_s: float = 1.0) -> Prediction:
    p_streams, p_ctx = _batch(p, p_cost)
    # the prompt's prefix the prefill worker holds (its own KV events: kvindex.py) is not computed again there
    cached = _cached(p, tokens)
    pre = p_cost.prefill(tokens - cached, cached, p_streams, p_ctx, _ahead(p))
    prefill_s = (p_cost.request_overhead_s + pre.seconds) * p.f_prefill
    d_streams, d_ctx = _batch(d, d_cost)
    transfer = d_cost.transfer(tokens, p_cost.perf.tp)
    # the decode worker pulls the KV, then its next step produces the first token (behind any queue for room)
    first = d_cost.decode_step(d_streams + 1, d_ctx) * d.f_decode * (1.0 + d.queued)
    first += _backlog_then(d, d_cost, d_streams, d_ctx, prefill_s + transfer)
    ttft = prefill_s + transfer + first
    tpot = d_cost.tpot(d_streams + 1, (d_streams * d_ctx + tokens) / (d_streams + 1), d.prefill_rate) * d.f_decode
    harm = _harm(p, p_cost, p_streams, p_ctx, p.prefill_rate, pre.own_stall_s, slo_tpot_s, out_tokens)
    harm += _queue_harm(p, prefill_s, pre.own_s * p.f_prefill, slo_ttft_s)
    return Prediction("remote", d.url, ttft, tpot, harm, prefill_worker=p.url, prefill_s=prefill_s)


def misses(o: Prediction, slo_ttft_s: float, slo_tpot_s: float) -> float:
    """The expected misses of a placement: this request's chance to miss TTFT or TPOT, plus its harm."""
    meet = (1.0 - p_miss(o.ttft_s, slo_ttft_s)) * (1.0 - p_miss(o.tpot_s, slo_tpot_s))
    return 1.0 - meet + o.harm


def _headroom(o: Prediction, slo_ttft_s: float, slo_tpot_s: float) -> float:
    """The larger share of a target the prediction takes (smaller: more headroom)."""
    ttft, tpot = o.ttft_s / slo_ttft_s, o.tpot_s / slo_tpot_s
    return ttft if ttft >= tpot else tpot


def choose(options: list[Prediction], slo: SLOSpec) -> Prediction:
    """Fewest expected misses (this request and those it harms), then the most headroom; ties keep the listed
    order (local, remote, prefill worker)."""
    return rank(options, slo.ttft_p95_ms / 1000.0, slo.tpot_p95_ms / 1000.0)[0][0]


def rank(options: list[Prediction], slo_ttft_s: float, slo_tpot_s: float,
         known: tuple[Prediction, float] | None = None) -> list[tuple[Prediction, float]]:
    """The options with their expected misses, best first as :func:`choose` picks: the first is the choice, the
    first after any other option the choice without it. Each option priced once (the hot path; ``known``: an
    option whose expected misses the caller has already)."""
    keyed = []
    for i, o in enumerate(options):
        m = known[1] if known is not None and o is known[0] else misses(o, slo_ttft_s, slo_tpot_s)
        keyed.append(((round(m, 3), _headroom(o, slo_ttft_s, slo_tpot_s), i), o, m))
    keyed.sort()  # by the key alone: its last element (the listed order) is unique
    return [(o, m) for _, o, m in keyed]


class RunnerUp:
    """The best placement a request did not take (its log line's and span's ``rejected_placement``), priced when
    first asked for: a ladder choice predicted to meet stands without its alternatives priced on the decision's
    path (slo_policy.py ``slo_decision``), and the log line, written when the request ends, prices them then, on the
    same snapshot, to the same result."""

    __slots__ = ("_price", "_value")

    def __init__(self, value: Prediction | None = None, price: Callable[[], Prediction | None] | None = None) -> None:
        self._value, self._price = value, price

    def get(self) -> Prediction | None:
        if self._price is not None:
            self._value, self._price = self._price(), None
        return self._value


def cost_of(w: WorkerLoad) -> EngineCost:
    return w.cost if w.cost is not None else EngineCost.from_profile(None)

"""``spec.routing.policy: SLO``: the rule ladder's choice (policy.py), overruled by the placement predicted to keep
more requests within spec.slo (placement.py prices the placements; this module decides between them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import placement as pl
from .policy_types import Decision, LoadSnapshot, RequestFeatures, Tuning, WorkerLoad

if TYPE_CHECKING:
    from ..api.contract import RouterConfig
    from .picks import Picks

# the ladder's reasons where its rule is least sure: neither short enough for `maxInputTokens` nor long enough for
# `minInputTokens`, or long but with an answer below `minExpectedOutputTokens` (Tuning.slo_override_grey)
GREY_REASONS = frozenset({"below_remote_threshold", "short_output"})


def _spent(o: pl.Prediction, local_d: WorkerLoad, pw: WorkerLoad | None, slo_tpot_s: float) -> bool:
    """Whether placement ``o`` prefills on a worker over its TPOT budget (placement.over_tpot_budget): the whole
    request on the decode worker or on the prefill worker; a remote prefill adds a stream to its decode worker, no
    prefill."""
    if o.placement == "local":
        return pl.over_tpot_budget(local_d, slo_tpot_s)
    if o.placement == "prefill_worker" and pw is not None:
        return pl.over_tpot_budget(pw, slo_tpot_s)
    return False


class _Priced:
    """The placements one request may take, each priced once and only when asked for (the hot path: a ladder choice
    predicted to meet is the only one priced on the decision's path; slo_decision)."""

    __slots__ = ("_local", "_priced", "_remote", "_whole", "base_worker", "cfg", "f", "out", "pair", "picks", "pw",
                 "slo_tpot", "slo_ttft", "snap", "tuning")

    def __init__(self, cfg: RouterConfig, f: RequestFeatures, snap: LoadSnapshot, tuning: Tuning, base: Decision,
                 picks: Picks) -> None:
        self.cfg, self.f, self.snap, self.tuning, self.picks = cfg, f, snap, tuning, picks
        self.out = float(f.max_tokens if f.max_tokens is not None else
                         snap.tenant_avg_output_tokens or tuning.default_output_tokens)
        self.slo_tpot, self.slo_ttft = cfg.slo.tpot_p95_ms / 1000.0, cfg.slo.ttft_p95_ms / 1000.0
        self.base_worker = (next((w for w in snap.prefill if w.url == base.decode), None)
                            if base.detail.get("elastic") else None)
        self.pair: tuple[WorkerLoad, WorkerLoad] | None = None
        self.pw: WorkerLoad | None = None
        self._local: pl.Prediction | None = None
        self._remote: pl.Prediction | None = None
        self._whole: pl.Prediction | None = None
        self._priced: set[str] = set()  # which of remote and prefill_worker are priced (None: infeasible)

    def local(self) -> pl.Prediction:
        """The whole request on the chosen decode worker."""
        if self._local is None:
            d = self.picks.local_d
            assert d is not None  # the ladder rejected otherwise
            self._local = pl.predict_whole(d, pl.cost_of(d), self.f.input_tokens, "local", self.slo_tpot, self.out,
                                           slo_ttft_s=self.slo_ttft)
        return self._local

    def _remote_ok(self) -> bool:
        return bool(self.snap.prefill) and not self.cfg.prefill_starting

    def remote(self) -> pl.Prediction | None:
        """Remote prefill on a compatible pair (closed breakers, the prefill pool not starting); None: no pair."""
        if "remote" not in self._priced:
            self._priced.add("remote")
            self.pair = self.picks.pair() if self._remote_ok() else None
            if self.pair is not None:
                d, p = self.pair
                self._remote = pl.predict_remote(p, pl.cost_of(p), d, pl.cost_of(d), self.f.input_tokens,
                                                 self.slo_tpot, self.out, slo_ttft_s=self.slo_ttft)
        return self._remote

    def on_prefill_worker(self) -> pl.Prediction | None:
        """The whole request on the ladder's elastic prefill worker, else on the least busy prefill worker (one
        elastic fleet; Tuning.elastic_idle_s 0: off, here too); None: none."""
        if "prefill_worker" not in self._priced:
            self._priced.add("prefill_worker")
            if self._remote_ok():
                elastic = self.cfg.routing.elastic_fleet and self.tuning.elastic_idle_s > 0
                self.pw = self.base_worker or (self.picks.any_prefill() if elastic else None)
            if self.pw is not None:  # a stream there shares its steps with the pool's remote prefills to come
                pw, prefill = self.pw, self.snap.prefill
                pool_rate = sum([w.prefill_rate for w in prefill]) / len(prefill)
                self._whole = pl.predict_whole(pw, pl.cost_of(pw), self.f.input_tokens, "prefill_worker",
                                               self.slo_tpot, self.out, rate_floor=pool_rate,
                                               slo_ttft_s=self.slo_ttft)
        return self._whole

    def options(self) -> list[pl.Prediction]:
        """Every feasible placement, in the listed order (local, remote, prefill worker: the ranking's ties)."""
        return [o for o in (self.local(), self.remote(), self.on_prefill_worker()) if o is not None]

    def runner_up(self, taken: pl.Prediction) -> pl.Prediction | None:
        """The best-ranked placement other than ``taken``."""
        return next((o for o, _ in pl.rank(self.options(), self.slo_ttft, self.slo_tpot) if o is not taken), None)


def slo_decision(cfg: RouterConfig, f: RequestFeatures, snap: LoadSnapshot, tuning: Tuning,
                 base: Decision, picks: Picks) -> Decision:
    """``spec.routing.policy: SLO``: the ladder's choice ``base``, overruled by the placement predicted to keep
    more requests within spec.slo (placement.py: by more than ``tuning.slo_override`` expected misses, or
    ``tuning.slo_override_grey`` where the ladder's rule is in its grey zone, :data:`GREY_REASONS`; both 0.01 by
    default: a noise floor, not a prior for the ladder) once the ladder's choice is at risk (its expected misses at
    least ``tuning.slo_keep``),
    among the whole request on the chosen decode worker, remote prefill on a compatible pair (closed breakers, the
    prefill pool not starting), and the whole request on the least busy prefill worker."""
    priced = _Priced(cfg, f, snap, tuning, base, picks)
    slo_tpot, slo_ttft = priced.slo_tpot, priced.slo_ttft
    kind = "remote" if base.decision == "remote" else "prefill_worker" if priced.base_worker is not None else "local"
    # the ladder's choice first (remote without a pair: priced as local, as the ranking below finds it)
    first = priced.remote() if kind == "remote" else priced.on_prefill_worker() if kind == "prefill_worker" else None
    if first is None:
        first = priced.local()
    detail: dict[str, Any] = base.detail
    first_misses = pl.misses(first, slo_ttft, slo_tpot)
    if first_misses < tuning.slo_keep:
        # predicted to meet: it stands whatever the others save (below), so they are priced only for the log line
        detail["prediction"] = first
        detail["rejected"] = pl.RunnerUp(price=lambda: priced.runner_up(first))
        return base
    remote = priced.remote()
    order = pl.rank(priced.options(), slo_ttft, slo_tpot, known=(first, first_misses))
    local_d, pw = picks.local_d, priced.pw
    assert local_d is not None
    # the ladder's choice as ranked (a remote choice without a pair: the local one; one option per placement)
    ranked = {o.placement: (o, m) for o, m in order}
    chosen, chosen_misses = ranked.get(kind) or ranked["local"]
    # an overrule puts no prefill on a worker whose streams already spend the TPOT SLO's allowance: its harm to
    # them is past what the stall model sees (the load they live through grows), and the ladder's own choice stands
    # (a loop, not a generator: the hot path)
    best, best_misses = chosen, chosen_misses
    for x in order:
        if x[0] is chosen or not _spent(x[0], local_d, pw, slo_tpot):
            best, best_misses = x
            break
    margin = tuning.slo_override_grey if base.reason in GREY_REASONS else tuning.slo_override
    # ties (equal expected misses at the ranking's precision) and savings within the margin keep it
    if best is not chosen and round(chosen_misses, 3) - round(best_misses, 3) <= margin + 1e-9:
        best = chosen
    # the predictions themselves (formatted for the log line and the span only when the request is logged)
    detail["prediction"] = best
    runner_up = None  # the best-ranked option not taken
    if len(order) > 1:
        runner_up = order[1][0] if order[0][0] is best else order[0][0]
    detail["rejected"] = pl.RunnerUp(runner_up)
    if (base.decision == "remote" and best is not remote and remote is not None
            and pl.p_miss(remote.ttft_s, slo_ttft) >= tuning.slo_keep and remote.prefill_s >= 0.5 * remote.ttft_s):
        # prefill work the ladder meant for the prefill pool, placed elsewhere because the remote path is at risk on
        # its TTFT — its chance to miss it alone reaches the floor that lets an overrule happen at all
        # (Tuning.slo_keep) — and its prefill leg (queue + compute on the prefill worker) is most of it: demand the
        # prefill pool could not take in time (the autoscaler's prefill signal: disagg_prefill_deflections_total).
        # Not counted when the remote path lost on the decode side (a full decode worker, a slow transfer, harm to
        # streams). A predicted TTFT past the target alone would miss most of them: an overrule comes well before.
        detail["deflected"] = True
    if best is chosen:
        return base  # its detail, this request's own dict, now carries the prediction
    if best.placement == "remote" and priced.pair is not None:
        detail.pop("deflected", None)  # the ladder's overflow, overruled: the prefill pool takes it after all
        d, p = priced.pair
        return Decision("remote", "slo_remote", decode=d.url, prefill=p.url, tenant=base.tenant, bucket=base.bucket,
                        est_prefill_wait_ms=p.est_wait_ms, prefix_tokens=d.prefix_tokens, local_decode=local_d.url,
                        detail=detail)
    return Decision("local", "slo_" + best.placement, decode=best.worker, tenant=base.tenant, bucket=base.bucket,
                    prefix_tokens=local_d.prefix_tokens if best.placement == "local" else 0,
                    local_decode=best.worker, detail=detail)

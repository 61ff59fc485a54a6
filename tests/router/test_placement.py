"""The SLO placement (router/placement.py, policy SLO) and the cost model under it (perf/costs.py): pure tests."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disagg.api.contract import EngineProfile, RouterConfig
from disagg.perf.costs import EngineCost, tpot_chunk_budget
from disagg.router import placement as pl
from disagg.router.load import STREAM_MIN_SEEN, Worker
from disagg.router.policy import decide, demand_pool
from disagg.router.policy_types import LoadSnapshot, RequestFeatures, Tuning, WorkerLoad

COST = EngineCost.from_profile(None)  # H100-SXM, Llama-3.1-8B, vLLM's defaults
SLO = {"ttftP95Ms": 1000, "tpotP95Ms": 50}


def cfg(**routing: object) -> RouterConfig:
    return RouterConfig.model_validate({"model": "m", "mode": "Disaggregated", "slo": SLO,
                                        "routing": {"policy": "SLO", **routing}})


def feats(tokens: int, max_tokens: int | None = 256) -> RequestFeatures:
    return RequestFeatures(request_id="r", endpoint="/v1/completions", input_tokens=tokens, max_tokens=max_tokens)


def decode(url: str = "d0", running: float = 0, kv: float = 0.0, ahead: int = 0, rate: float = 0.0) -> WorkerLoad:
    return WorkerLoad(url=url, compat="c", running=running, kv_usage=kv, ahead_tokens=ahead, prefill_rate=rate,
                      role="decode", cost=COST)


def prefill(url: str = "p0", running: float = 0, ahead: int = 0, rate: float = 0.0) -> WorkerLoad:
    return WorkerLoad(url=url, compat="c", running=running, ahead_tokens=ahead, prefill_rate=rate, role="prefill",
                      cost=COST)


def test_the_ladders_choice_stands_when_no_placement_is_clearly_better() -> None:
    d = decide(cfg(), feats(200), LoadSnapshot(prefill=(prefill(),), decode=(decode(),)))
    assert (d.decision, d.reason, d.decode) == ("local", "short_prompt", "d0")
    # the prediction of the placement taken, and the runner-up, for the log line and the span
    chosen, rejected = d.detail["prediction"], d.detail["rejected"].get()
    assert isinstance(chosen, pl.Prediction) and isinstance(rejected, pl.Prediction)
    assert chosen.placement == "local" and chosen.as_detail()["predicted_ttft_ms"] < 100
    assert "deflected" not in d.detail


def test_a_ladder_choice_predicted_to_meet_stands_however_small_the_alternatives_misses() -> None:
    """A long prompt at light load: the ladder sends it remote, and the remote path is predicted to meet both
    targets (expected misses under Tuning.slo_keep), though a whole request (on the idle decode or prefill worker)
    is predicted to miss a little less still (no transfer). The ladder's choice stands: the prefill pool is idle,
    and the decode worker's streams keep their steps free of the long prompt's chunks. With no keep, the
    noise-floor margin alone decides and the saving overrules it."""
    snap = LoadSnapshot(prefill=(prefill(),), decode=(decode(running=2, kv=0.01),))
    tight = RouterConfig.model_validate({"model": "m", "mode": "Disaggregated", "routing": {"policy": "SLO"},
                                         "slo": {"ttftP95Ms": 300, "tpotP95Ms": 50}})
    kept = decide(tight, feats(6000), snap)
    assert (kept.decision, kept.reason) == ("remote", "policy")
    chosen, other = kept.detail["prediction"], kept.detail["rejected"].get()
    slo = tight.slo
    assert chosen.expected_misses(slo) < Tuning().slo_keep
    assert other.placement in ("local", "prefill_worker")  # a whole request: no transfer
    assert chosen.expected_misses(slo) - other.expected_misses(slo) > Tuning().slo_override
    moved = decide(tight, feats(6000), snap, Tuning(slo_keep=0.0))
    assert (moved.decision, moved.reason) == ("local", "slo_" + other.placement)


def test_a_ladder_choice_predicted_to_miss_is_overruled_on_a_small_saving() -> None:
    """Past Tuning.slo_keep the ladder's choice is at risk, and a placement predicted to keep more requests
    within the SLO wins by the noise floor alone (Tuning.slo_override): here the long prompt's remote prefill
    waits behind a queue near the TTFT target."""
    p = prefill(ahead=40_000)
    snap = LoadSnapshot(prefill=(p,), decode=(decode(running=2, kv=0.01),))
    d = decide(cfg(), feats(4000), snap)
    assert (d.decision, d.reason) == ("local", "slo_local")
    # an operator who trusts the ladder more can ask more of an overrule: at 1.0 only a choice certain to miss yields
    kept = decide(cfg(), feats(4000), snap, Tuning(slo_keep=1.0))
    assert kept.decision == "remote"
    remote = kept.detail["prediction"]
    assert Tuning().slo_keep <= remote.expected_misses(cfg().slo) < 1.0
    assert remote.expected_misses(cfg().slo) - d.detail["prediction"].expected_misses(cfg().slo) > 0.01


def test_a_remote_prefill_into_a_queue_past_the_ttft_target_is_kept_local_when_local_meets() -> None:
    # the ladder sends a long prompt remote (its estimated queue wait is under the limit: the estimate knows only
    # the router's own backlog clock), but the prefill worker holds 80k tokens ahead: a certain TTFT miss
    p = prefill(ahead=80_000)
    d = decide(cfg(), feats(4000), LoadSnapshot(prefill=(p,), decode=(decode(running=4, kv=0.01),)))
    assert (d.decision, d.reason) == ("local", "slo_local")
    assert d.detail["rejected"].get().placement in ("remote", "prefill_worker")
    # prefill demand the pool did not take: counted for the autoscaler (disagg_prefill_deflections_total)
    assert d.detail["deflected"] is True


def test_a_remote_prefill_at_risk_on_its_ttft_is_prefill_demand_before_its_prediction_passes_the_target() -> None:
    """The placement overrules a remote path once it is at risk (Tuning.slo_keep), well before its predicted TTFT
    passes the target; the prefill pool's demand it did not take is counted from the same point, or the autoscaler
    would see the shortage only as the decode pool's TPOT (the demo's long-prompt step grew decode, not prefill)."""
    p, d = prefill(ahead=24_000), decode(running=4, kv=0.01)
    placed = decide(cfg(), feats(4000), LoadSnapshot(prefill=(p,), decode=(d,)))
    remote = pl.predict_remote(p, COST, d, COST, 4000, 0.05, 256, slo_ttft_s=1.0)
    assert remote.ttft_s < 1.0 and pl.p_miss(remote.ttft_s, 1.0) >= Tuning().slo_keep
    assert remote.prefill_s >= 0.5 * remote.ttft_s  # lost on the prefill leg
    assert (placed.decision, placed.reason, placed.detail.get("deflected")) == ("local", "slo_local", True)
    # a remote path that is not at risk on its TTFT stays remote, and nothing is deflected
    calm = decide(cfg(), feats(4000), LoadSnapshot(prefill=(prefill(ahead=4_000),), decode=(d,)))
    assert calm.decision == "remote" and "deflected" not in calm.detail


def test_the_ladders_queue_overflow_counts_as_prefill_demand_the_pool_did_not_take() -> None:
    # the prefill queue is past maxPrefillQueueWaitMs: the ladder prefills on the decode worker (LocalPrefill), and
    # that is demand for the prefill pool (disagg_prefill_deflections_total), not for decode
    snap = LoadSnapshot(prefill=(WorkerLoad(url="p0", compat="c", role="prefill", cost=COST, est_wait_ms=5000),),
                        decode=(decode(),))
    ladder = decide(cfg(policy="Thresholds"), feats(4000), snap)
    assert (ladder.decision, ladder.reason, ladder.detail.get("deflected")) == ("local", "prefill_queue_overload",
                                                                                True)
    # under the SLO placement the request stays local (or is served whole on the prefill worker): still deflected;
    # a placement that sends it remote after all would clear the mark
    placed = decide(cfg(), feats(4000), snap)
    assert placed.decision == "local" and placed.detail.get("deflected") is True
    # with room in the queue nothing is deflected
    calm = decide(cfg(policy="Thresholds"), feats(4000), LoadSnapshot(prefill=(prefill(),), decode=(decode(),)))
    assert calm.decision == "remote" and "deflected" not in calm.detail
    # the autoscaler's load per role (disagg_routed_prompt_tokens): the spilled prompt is the prefill pool's demand,
    # as the remote one is; a short prompt prefilled where it decodes is the decode pool's
    short = decide(cfg(policy="Thresholds"), feats(200), snap)
    assert [demand_pool(x) for x in (ladder, placed, calm, short)] == ["prefill", "prefill", "prefill", "decode"]
    # a long prompt no remote pair can take (here: no prefill worker ready) is the prefill pool's demand too
    none_ready = decide(cfg(policy="Thresholds"), feats(4000), LoadSnapshot(prefill=(), decode=(decode(),)))
    assert (none_ready.reason, demand_pool(none_ready)) == ("no_prefill_worker", "prefill")


def test_a_long_prompt_goes_remote_when_its_prefill_would_push_busy_streams_over_the_tpot_slo() -> None:
    # 120 streams of 2k context, prefill traffic already arriving: their TPOT sits just under the 50 ms target
    rate = next(r for r in range(0, 100_000, 500) if COST.tpot(120, 2000, r) > 0.04)
    busy = decode(running=120, kv=120 * 2000 / COST.kv_capacity_tokens, rate=rate)
    local = pl.predict_whole(busy, COST, 16_000, "local", 0.05, 256)
    remote = pl.predict_remote(prefill(), COST, busy, COST, 16_000, 0.05, 256)
    assert local.harm > 1  # the local placement would push several of them over
    assert pl.choose([local, remote], cfg().slo) is remote
    # the ladder sends it remote already (a long prompt, an idle prefill worker): the prediction agrees
    d = decide(cfg(), feats(16_000), LoadSnapshot(prefill=(prefill(),), decode=(busy,)))
    assert d.decision == "remote" or d.reason == "slo_prefill_worker"


def test_the_elastic_fleet_serves_a_whole_request_on_an_idle_prefill_worker_when_decode_is_saturated() -> None:
    saturated = decode(running=400, kv=0.9, ahead=60_000, rate=80_000)
    d = decide(cfg(), feats(300), LoadSnapshot(prefill=(prefill(),), decode=(saturated,)))
    assert (d.decision, d.decode) == ("local", "p0")  # the ladder's elastic choice, or the prediction's


def test_a_prefill_worker_never_takes_a_whole_request_it_is_predicted_to_miss() -> None:
    # the prefill worker is deep in remote prefills: a whole request there would miss; decode is busy too
    p = prefill(ahead=200_000, rate=100_000)
    d = decide(cfg(), feats(300), LoadSnapshot(prefill=(p,), decode=(decode(running=50, ahead=30_000),)))
    assert d.reason != "slo_prefill_worker"


def test_user_constraints_come_first_under_the_slo_policy() -> None:
    c = cfg(buckets=[{"name": "all", "minInputTokens": 0, "prefill": "Local"}])
    d = decide(c, feats(50_000), LoadSnapshot(prefill=(prefill(),), decode=(decode(running=500, kv=0.9),)))
    assert (d.decision, d.reason) == ("local", "bucket_local")
    c = RouterConfig.model_validate({"model": "m", "mode": "Aggregated", "routing": {"policy": "SLO"}})
    assert decide(c, feats(50_000), LoadSnapshot(prefill=(prefill(),), decode=(decode(),))).reason == "mode_aggregated"


def test_without_a_ready_prefill_worker_the_slo_policy_stays_local() -> None:
    d = decide(cfg(), feats(20_000), LoadSnapshot(decode=(decode(running=100, kv=0.5),)))
    assert (d.decision, d.reason) == ("local", "no_prefill_worker")  # a structural rule: no prediction overrules it
    c = cfg().model_copy(update={"prefill_starting": True})
    d = decide(c, feats(20_000), LoadSnapshot(prefill=(prefill(),), decode=(decode(running=100, kv=0.5),)))
    assert d.reason == "prefill_pool_starting"


def test_the_slo_policy_is_the_default_and_thresholds_ignores_predictions() -> None:
    c = RouterConfig.model_validate({"model": "m", "mode": "Disaggregated"})
    assert c.routing.policy == "SLO"
    d = decide(c, feats(200), LoadSnapshot(prefill=(prefill(),), decode=(decode(),)))
    assert d.reason == "short_prompt" and "prediction" in d.detail
    c = RouterConfig.model_validate({"model": "m", "mode": "Disaggregated", "routing": {"policy": "Thresholds"}})
    d = decide(c, feats(200), LoadSnapshot(prefill=(prefill(),), decode=(decode(),)))
    assert d.reason == "short_prompt" and "prediction" not in d.detail


loads = st.builds(
    lambda r, kv, ahead, rate: (r, kv, ahead, rate),
    st.integers(0, 300), st.floats(0, 0.95), st.integers(0, 100_000), st.floats(0, 100_000))


@settings(max_examples=150, deadline=None)
@given(d_load=loads, p_load=loads, tokens=st.integers(1, 30_000), out=st.integers(1, 2000))
def test_never_picks_more_expected_misses_than_another_placement_has(d_load: tuple, p_load: tuple, tokens: int,
                                                                    out: int) -> None:
    r, kv, ahead, rate = d_load
    d = decode(running=r, kv=kv, ahead=ahead, rate=rate)
    pr, _, pahead, prate = p_load
    p = prefill(running=pr, ahead=pahead, rate=prate)
    slo = cfg().slo
    options = [pl.predict_whole(d, COST, tokens, "local", 0.05, out),
               pl.predict_remote(p, COST, d, COST, tokens, 0.05, out),
               pl.predict_whole(p, COST, tokens, "prefill_worker", 0.05, out)]
    best = pl.choose(options, slo)
    # none is expected to miss less — a whole request on the prefill worker included, judged as any other
    assert round(best.expected_misses(slo), 3) == min(round(o.expected_misses(slo), 3) for o in options)
    # a placement predicted to meet both targets with room is never passed over for one predicted to miss
    meets = [o for o in options if o.harm == 0 and o.headroom(slo) < 0.5]
    if meets:
        assert best.ttft_s <= slo.ttft_p95_ms / 1000 and best.tpot_s <= slo.tpot_p95_ms / 1000


def test_the_chance_to_miss_is_monotone_and_centred_on_the_target() -> None:
    assert pl.p_miss(1.0, 1.0) == 0.5
    xs = [pl.p_miss(x / 10, 1.0) for x in range(1, 30)]
    assert xs == sorted(xs) and xs[0] < 0.01 and xs[-1] > 0.99


@settings(max_examples=100, deadline=None)
@given(r=st.integers(0, 300), extra=st.integers(1, 100), ahead=st.integers(0, 50_000), more=st.integers(1, 50_000),
       tokens=st.integers(1, 20_000))
def test_predictions_are_monotone_in_load(r: int, extra: int, ahead: int, more: int, tokens: int) -> None:
    light = pl.predict_whole(decode(running=r, kv=0.2, ahead=ahead), COST, tokens, "local", 0.05, 256)
    heavier = pl.predict_whole(decode(running=r + extra, kv=0.2, ahead=ahead + more), COST, tokens, "local", 0.05,
                               256)
    assert heavier.ttft_s >= light.ttft_s * 0.999
    assert heavier.tpot_s >= light.tpot_s * 0.999


def test_a_worker_runs_no_more_streams_than_max_num_seqs_whatever_the_router_has_in_flight() -> None:
    """The router's in-flight count includes requests queued on the worker; vLLM runs at most --max-num-seqs of
    them, and only those take a share of a step's token budget."""
    cap = COST.max_num_seqs
    at_cap = pl.predict_whole(decode(running=cap, kv=0.9, ahead=40_000), COST, 2000, "local", 0.05, 256)
    for queued in (1, cap, 10 * cap):
        past = pl.predict_whole(decode(running=cap + queued, kv=0.9, ahead=40_000), COST, 2000, "local", 0.05, 256)
        assert (past.ttft_s, past.tpot_s) == (at_cap.ttft_s, at_cap.tpot_s)
    assert at_cap.ttft_s < 60.0  # a queue of 40k prompt tokens drains in seconds, not hours


def test_tpot_grows_with_the_prefill_traffic_a_worker_receives() -> None:
    quiet, busy = COST.tpot(32, 2000, 0.0), COST.tpot(32, 2000, 40_000)
    assert quiet == COST.decode_step(32, 2000)
    assert busy > 1.5 * quiet


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 600), st.floats(0, 60_000), st.floats(0, 200_000), st.floats(0, 80_000))
def test_the_hot_paths_shortcuts_give_the_same_floats(streams: int, ctx: float, ahead: float, rate: float) -> None:
    """The placement prices a worker's queued prefills through a memo (EngineCost.backlog) and a stream's TPOT from
    steps it has already priced (EngineCost.tpot_of): both must be the very floats of the direct computation, asked
    first or again, so the router and the twin decide the same whichever way a value was reached."""
    cost = EngineCost.from_profile(EngineProfile(gpu="L40S"))
    for _ in range(2):  # the second read comes from the memo
        assert cost.backlog(streams, ctx, ahead) == cost.chunked(0, 0, streams, ctx, ahead)
        t_d, t_m = cost.decode_step(streams, ctx), cost.mixed_step(streams, ctx)
        room = max(1, cost.budget - streams)
        u = min(1.0, rate * t_m / room)
        direct = t_d if rate <= 0 else 1.0 / (u / t_m + (1.0 - u) / t_d)
        assert cost.tpot_of(streams, t_d, t_m, rate) == cost.tpot(streams, ctx, rate) == direct


def test_the_decode_budget_keeps_one_chunk_within_the_tpot_target() -> None:
    for tpot in (0.03, 0.05, 0.1):
        b = tpot_chunk_budget(COST, tpot, 256)
        assert b % 256 == 0
        assert COST.prefill(b).step_s <= tpot
        assert b == COST.budget or COST.prefill(b + 256).step_s > tpot
    assert tpot_chunk_budget(COST, 0.05, 256) < tpot_chunk_budget(COST, 0.1, 256) <= COST.budget
    assert tpot_chunk_budget(COST, 0.001, 1024) == 1024  # never below --max-num-seqs (vLLM refuses that)
    big = EngineCost.from_profile(EngineProfile(model="Llama-3.1-70B", tensor_parallel_size=4))
    assert tpot_chunk_budget(big, 0.05, 256) < tpot_chunk_budget(COST, 0.05, 256)  # a bigger model: smaller


def test_unknown_gpu_or_model_falls_back_to_the_default_prior() -> None:
    odd = EngineCost.from_profile(EngineProfile(gpu="TPU-v9", model="acme/unknown-model"))
    assert odd.decode_step(8, 1000) == COST.decode_step(8, 1000)


def test_a_prefill_queue_near_the_ttft_target_counts_the_requests_it_would_delay() -> None:
    d = decode(running=10, kv=0.05)
    idle = pl.predict_remote(prefill(), COST, d, COST, 8000, 0.05, 256, slo_ttft_s=1.0)
    # ~0.9 s of prompts queued there and 40k prompt tokens/s arriving: the next ones sit at the TTFT target
    near = pl.predict_remote(prefill(ahead=30_000, rate=40_000), COST, d, COST, 8000, 0.05, 256, slo_ttft_s=1.0)
    assert idle.harm == 0.0
    assert near.harm > 1.0 and near.ttft_s > idle.ttft_s


def test_the_decode_correction_follows_the_engines_own_tpot_against_the_model() -> None:
    from disagg.router.load import TPOT_HISTOGRAM, Worker

    w = Worker(url="d0", role="decode", cost=COST)
    model = COST.tpot(20, 0.1 * COST.kv_capacity_tokens / 20, 0.0)
    base = {"vllm:num_requests_running": 20.0, "vllm:kv_cache_usage_perc": 0.1}
    w.update_scrape({**base, TPOT_HISTOGRAM + "_sum": 0.0, TPOT_HISTOGRAM + "_count": 0.0})
    for k in range(1, 60):  # the engine runs at twice the model's TPOT
        w.update_scrape({**base, TPOT_HISTOGRAM + "_sum": 10 * k * 2 * model, TPOT_HISTOGRAM + "_count": 10.0 * k})
    assert 1.9 < w.f_decode <= 2.0
    # log-space: a 3x and a 1/3 observation cancel
    w2 = Worker(url="d1", role="decode")
    w2.correct("decode", 3.0)
    w2.correct("decode", 1 / 3)
    assert abs(w2.f_decode - 1.0) < 1e-9
    # no new observations (the count did not move): no correction
    before = w.f_decode
    w.update_scrape({**base, TPOT_HISTOGRAM + "_sum": 10 * 59 * 2 * model, TPOT_HISTOGRAM + "_count": 590.0})
    assert w.f_decode == before


def test_the_decode_correction_prices_the_prefill_rate_the_placement_reads() -> None:
    """The correction compares the engine's TPOT with the model at the prefill rate the placement will price with
    (decayed to the scrape, read over the time watched), not the rate as it stood at the last prefill: a burst of
    local prefills long over, on an engine that runs at the model's TPOT for no prefill traffic, teaches nothing;
    and a worker that joined a second before a steady traffic is compared at that traffic, not at a share of it."""
    from disagg.router.load import TPOT_HISTOGRAM, Worker

    base = {"vllm:num_requests_running": 20.0, "vllm:kv_cache_usage_perc": 0.1}
    ctx = 0.1 * COST.kv_capacity_tokens / 20

    def scraped(w: Worker, tpot: float, start: float, step: float = 0.5, n: int = 40) -> None:
        w.update_scrape({**base, TPOT_HISTOGRAM + "_sum": 0.0, TPOT_HISTOGRAM + "_count": 0.0}, start)
        for k in range(1, n):
            w.update_scrape({**base, TPOT_HISTOGRAM + "_sum": 10 * k * tpot, TPOT_HISTOGRAM + "_count": 10.0 * k},
                            start + step * k)

    burst = Worker(url="d0", role="decode", cost=COST, since=0.0)
    for k in range(20):
        burst.prefill_started(4000, now=0.1 * k)
    scraped(burst, COST.tpot(20, ctx, 0.0), start=120.0)  # two minutes later: the traffic has long decayed
    assert burst.f_decode == pytest.approx(1.0, abs=0.01)
    steady = Worker(url="d1", role="decode", cost=COST, since=1.0)
    rate = 20_000.0
    for k in range(60):  # 20,000 prompt tokens/s from t = 1 s (when it joined), scraped every 0.5 s
        steady.prefill_started(2000, now=1.0 + 0.1 * k)
        if k % 5 == 4:
            steady.update_scrape({**base, TPOT_HISTOGRAM + "_sum": 10 * k * COST.tpot(20, ctx, rate),
                                  TPOT_HISTOGRAM + "_count": 10.0 * k}, 1.0 + 0.1 * k)
    assert steady.f_decode == pytest.approx(1.0, abs=0.08)


def test_a_remote_first_token_waits_behind_the_prompts_the_decode_worker_will_have_queued() -> None:
    """The decode leg reaches the decode worker when the prefill leg ends, behind the prompts queued there then:
    those queued now, plus those still arriving at its prefill rate, less what it prefills meanwhile."""
    p = prefill(ahead=20_000)  # a prefill leg of about half a second

    def ttft(d: WorkerLoad) -> float:
        return pl.predict_remote(p, COST, d, COST, 8000, 0.05, 256).ttft_s

    idle = ttft(decode(running=8))
    # a short queue the decode worker clears before the KV arrives costs nothing
    assert ttft(decode(running=8, ahead=2000)) == idle
    # a long one, or one refilled faster than it drains, delays the first token
    capacity = 2048 / COST.prefill(0, 0, 8, 0.0, 2048).seconds  # prompt tokens/s the decode worker prefills
    assert ttft(decode(running=8, ahead=200_000)) > idle + 1.0
    refilled = [ttft(decode(running=8, rate=r * capacity)) for r in (0.5, 1.5, 3.0)]
    assert refilled[0] == idle < refilled[1] < refilled[2]


def test_the_ladders_grey_zone_is_overruled_on_less_evidence() -> None:
    """A prompt between maxInputTokens and minInputTokens (reason below_remote_threshold) is where the static rule
    knows least: a user who sets margins (both 0.01 by default) can ask less evidence of an overrule there
    (Tuning.slo_override_grey) than for a short prompt, the rule's confident zone (Tuning.slo_override)."""
    margins = Tuning(slo_override=0.5, slo_override_grey=0.2)

    tight = RouterConfig.model_validate({"model": "m", "mode": "Disaggregated", "routing": {"policy": "SLO"},
                                         "slo": {"ttftP95Ms": 1000, "tpotP95Ms": 25}})
    busy_prefill = WorkerLoad(url="p0", compat="c", role="prefill", cost=COST, remote_idle_s=0.0,
                              prefill_rate=60_000)  # no slack for whole requests; remote prefills only
    snap = LoadSnapshot(prefill=(busy_prefill,), decode=(decode(running=8, rate=4000, kv=0.3),))

    grey = decide(tight, feats(1500, 16), snap, margins)
    local = grey.detail["rejected"].get().as_detail()
    gap = (1 - (1 - pl.p_miss(local["predicted_ttft_ms"], 1000)) * (1 - pl.p_miss(local["predicted_tpot_ms"], 25))
           + local["harm"]) - grey.detail["prediction"].expected_misses(tight.slo)
    assert margins.slo_override_grey < gap < margins.slo_override  # the case the two margins tell apart
    assert (grey.decision, grey.reason) == ("remote", "slo_remote")
    assert decide(tight, feats(1500, 16), snap, Tuning(slo_override_grey=0.5)).reason == "below_remote_threshold"
    # a short prompt beside the same streams: the ladder's confident zone, the full margin
    assert decide(tight, feats(1000, 16), snap, margins).reason == "short_prompt"
    # the shipped default asks only a noise floor: the placement with clearly fewer expected misses wins in both
    assert decide(tight, feats(1000, 16), snap).reason == "slo_remote"


def test_an_overrule_puts_no_prefill_on_a_worker_whose_streams_spend_the_tpot_allowance() -> None:
    """The case above, on a decode worker whose recent streams' TPOT has its p95 past the 50 ms target (a
    geometric mean of 45 ms, a log spread of 0.1: p95 ≈ 53 ms): moving the prompt there would be paid for by streams
    that already miss, so the ladder's remote choice stands; within the allowance (spread 0.02: p95 ≈ 46 ms) the
    overrule is taken as before."""
    p = prefill(ahead=80_000)
    spent = decode(running=4, kv=0.01)._replace(stream_tpot_s=0.045, stream_spread=0.1)
    assert pl.over_tpot_budget(spent, 0.05)
    d = decide(cfg(), feats(4000), LoadSnapshot(prefill=(p,), decode=(spent,)))
    assert (d.decision, d.reason) == ("remote", "policy")
    within = spent._replace(stream_spread=0.02)
    assert not pl.over_tpot_budget(within, 0.05)
    d = decide(cfg(), feats(4000), LoadSnapshot(prefill=(p,), decode=(within,)))
    assert (d.decision, d.reason) == ("local", "slo_local")
    # unknown (too few streams ended there yet): the model's prediction alone, as before
    assert not pl.over_tpot_budget(decode(running=4), 0.05)


def test_the_stall_harm_reads_the_worker_streams_recent_tpot() -> None:
    """Streams whose TPOT sat close under the target (measured: centre 46 ms, narrow spread) are pushed over by a
    stall the model's centre (the load now: far under the target) would call harmless; a worker whose streams ran
    far under the target is not harmed more than the model says."""
    busy = decode(running=40, kv=40 * 2000 / COST.kv_capacity_tokens)
    model = COST.tpot(40, 2000)
    assert model < 0.03  # the snapshot: well under the 50 ms target
    base = pl.predict_whole(busy, COST, 8000, "local", 0.05, 256).harm
    near = pl.predict_whole(busy._replace(stream_tpot_s=0.046, stream_spread=0.05), COST, 8000, "local", 0.05,
                            256).harm
    calm = pl.predict_whole(busy._replace(stream_tpot_s=0.5 * model, stream_spread=0.05), COST, 8000, "local", 0.05,
                            256).harm
    assert near > 4 * base and near > 1.0
    assert calm <= base


def test_a_workers_streams_tpot_estimates_centre_and_spread() -> None:
    """observe_stream on a log-normal series of known centre and spread: the estimates land on them; nothing is
    reported before STREAM_MIN_SEEN streams."""
    w = Worker(url="d0", role="decode")
    rng = random.Random(7)
    for _ in range(STREAM_MIN_SEEN - 1):
        w.observe_stream(0.04 * math.exp(rng.gauss(0.0, 0.2)))
    assert w.stream_tpot == (0.0, 0.0)
    for _ in range(3000):
        w.observe_stream(0.04 * math.exp(rng.gauss(0.0, 0.2)))
    centre, spread = w.stream_tpot
    assert abs(centre / 0.04 - 1) < 0.1 and abs(spread - 0.2) < 0.06
    # a load step: the streams now take twice as long, and the centre follows within a few hundred streams
    for _ in range(300):
        w.observe_stream(0.08 * math.exp(rng.gauss(0.0, 0.2)))
    assert abs(w.stream_tpot[0] / 0.08 - 1) < 0.1
    w.observe_stream(0.0)  # not a stream's TPOT: ignored
    assert w.streams_seen == STREAM_MIN_SEEN - 1 + 3300


def test_a_kept_choice_is_the_only_placement_priced_on_the_decision_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ladder choice predicted to meet stands whatever the others would save, so they are priced only when the
    log line asks for the runner-up — on the same snapshot, to the same prediction as pricing them at once."""
    calls: list[str] = []
    whole, remote = pl.predict_whole, pl.predict_remote

    def counted_whole(*a: Any, **k: Any) -> pl.Prediction:
        calls.append(a[3])
        return whole(*a, **k)

    def counted_remote(*a: Any, **k: Any) -> pl.Prediction:
        calls.append("remote")
        return remote(*a, **k)

    monkeypatch.setattr(pl, "predict_whole", counted_whole)
    monkeypatch.setattr(pl, "predict_remote", counted_remote)
    snap = LoadSnapshot(prefill=(prefill(),), decode=(decode(),))
    d = decide(cfg(), feats(200), snap)
    assert (d.decision, d.reason) == ("local", "short_prompt") and calls == ["local"]
    runner_up = d.detail["rejected"].get()
    assert calls[1:] and "local" not in calls[1:]  # the others, priced now; the chosen one reused
    assert runner_up is not None and runner_up.placement in ("remote", "prefill_worker")
    # the same runner-up as when every placement is priced on the decision path (no keep: the margin decides)
    calls.clear()
    eager = decide(cfg(), feats(200), snap, Tuning(slo_keep=0.0))
    assert (eager.decision, eager.reason) == (d.decision, d.reason) and len(calls) >= 2
    assert eager.detail["rejected"].get() == runner_up


def test_streams_past_the_target_because_of_the_prefill_traffic_still_count_a_prefills_harm() -> None:
    """A decode worker whose streams miss TPOT because of the local prefills it receives: the marginal rise of their
    chance to miss is nearly nothing there (it is near 1 already), but each prefill is charged its share of what
    the traffic does to them, so the worker does not look free to take more; without prefill traffic (rate 0), and
    below the target, the harm is the marginal rise as before."""
    streams, ctx = 40, 2000.0
    kv = streams * ctx / COST.kv_capacity_tokens
    quiet_tpot = COST.tpot(streams, ctx)
    rate = next(r for r in range(1000, 400_000, 1000) if COST.tpot(streams, ctx, float(r)) > 2.0 * quiet_tpot)
    slo = 1.3 * quiet_tpot  # the streams meet it without the traffic and miss it (at ~1.5× the target) with it
    # their measured spread: a log-normal σ of 0.1 (the logistic's scale σ·√3/π)
    loaded = decode(running=streams, kv=kv, rate=float(rate))._replace(stream_spread=0.1)
    spread = 0.1 * pl.LOGISTIC_PER_SD
    stall = COST.prefill(2000, 0, streams, ctx, 0.0).own_stall_s
    harm = pl._harm(loaded, COST, streams, ctx, float(rate), stall, slo, 256)
    before = COST.tpot(streams, ctx, float(rate))
    added = stall / 256

    def marginal(at: float, target: float) -> float:
        return streams * (pl.p_miss(at + added, target, spread) - pl.p_miss(at, target, spread))

    assert marginal(before, slo) < 0.01 < 0.3 < harm  # past the target: the marginal rise is nearly nothing
    share = (pl.p_miss(before, slo, spread) - pl.p_miss(quiet_tpot, slo, spread)) / (before - quiet_tpot) * added
    assert harm == pytest.approx(streams * share)
    # no traffic: the marginal rise alone; below the target (the logistic's convex side): the marginal rise too
    idle = decode(running=streams, kv=kv)._replace(stream_spread=0.1)
    assert pl._harm(idle, COST, streams, ctx, 0.0, stall, slo, 256) == pytest.approx(marginal(quiet_tpot, slo))
    loose = 1.2 * before
    assert pl._harm(loaded, COST, streams, ctx, float(rate), stall, loose, 256) == pytest.approx(
        marginal(before, loose))


def test_a_remote_first_token_waits_for_the_decode_workers_prefill_queue_as_it_fluctuates() -> None:
    """Local prefills reach a decode worker unevenly: at a steady rate below what it prefills the fluid backlog
    clears, yet a queue forms now and then (Pollaczek–Khinchine), and once the request's KV pull starts vLLM admits
    the next waiting prompt, which prefills whole first. Both grow with the worker's share of time prefilling and
    with the size of its prefills; a worker sent no prefills adds nothing."""
    p = prefill(ahead=20_000)
    steps, step_s = COST.chunked(0, 0, 8, 0.0, COST.budget)
    capacity = COST.budget / (steps * step_s)  # prompt tokens/s the decode worker prefills

    def ttft(rho: float, size: float) -> float:
        d = decode(running=8, rate=rho * capacity)._replace(prefill_size_tokens=size,
                                                             prefill_residual_tokens=size / 2)
        return pl.predict_remote(p, COST, d, COST, 8000, 0.05, 256).ttft_s

    idle = ttft(0.0, 6000)
    assert ttft(0.0, 0) == idle  # no prefills sent there: no queue
    by_rho = [ttft(r, 6000) for r in (0.2, 0.5, 0.8)]
    assert idle < by_rho[0] < by_rho[1] < by_rho[2]
    assert ttft(0.5, 3000) < by_rho[1] < ttft(0.5, 12_000)
    # at ρ 0.5 and prefills of s seconds: ρ/(1 − ρ) × s/2 waiting, then ρ × s behind the one admitted
    s = 6000 / capacity
    assert by_rho[1] - idle == pytest.approx(0.5 * s + 0.5 * s, rel=0.05)
    # saturated: the queueing wait is read at ρ = RHO_MAX, and the fluid backlog's growth takes over beyond
    assert math.isfinite(ttft(1.0, 6000)) and ttft(1.0, 6000) <= ttft(3.0, 6000)


def test_a_prefill_cannot_push_streams_past_a_step_with_a_full_chunk() -> None:
    """Every step a stream takes is at most a decode step beside a full chunk of the budget
    (EngineCost.mixed_step: the TPOT of streams whose every step is mixed), so however long the prefill placed
    there, the harm is at most the rise of the streams' chance to miss up to that ceiling, and none for streams
    already at it (a prefill then keeps them there for longer, it does not slow them)."""
    streams, ctx = 40, 2000.0
    ceiling = COST.mixed_step(streams, ctx)
    assert COST.tpot(streams, ctx, 1e12) == pytest.approx(ceiling) and ceiling > COST.tpot(streams, ctx)
    slo, spread = 1.02 * ceiling, 0.1 * pl.LOGISTIC_PER_SD
    kv = streams * ctx / COST.kv_capacity_tokens
    near = decode(running=streams, kv=kv)._replace(stream_tpot_s=0.99 * ceiling, stream_spread=0.1)
    stall = COST.prefill(64_000, 0, streams, ctx, 0.0).own_stall_s
    assert stall / 16 > 0.5 * ceiling  # uncapped, the stall alone would put the streams far past the target
    cap = streams * (pl.p_miss(ceiling, slo, spread) - pl.p_miss(0.99 * ceiling, slo, spread))
    assert pl._harm(near, COST, streams, ctx, 0.0, stall, slo, 16) == pytest.approx(cap)
    at = near._replace(stream_tpot_s=ceiling)
    assert pl._harm(at, COST, streams, ctx, 0.0, stall, slo, 16) == 0.0
    # a short stall under the ceiling is charged in full, as before
    small = COST.prefill(64, 0, streams, ctx, 0.0).own_stall_s
    assert 0.0 < pl._harm(near, COST, streams, ctx, 0.0, small, slo, 16) < cap

"""Table tests of the pure routing policy (disagg.router.policy.decide)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from disagg.api.contract import RouterConfig
from disagg.router.features import request_hash_fraction
from disagg.router.picks import choose_decode, choose_prefill
from disagg.router.policy import decide, effective_policy, find_tenant
from disagg.router.policy_types import LoadSnapshot, RequestFeatures, Tuning, WorkerLoad

P = WorkerLoad("http://p1", compat="a")
D = WorkerLoad("http://d1", compat="a")
SNAP = LoadSnapshot(prefill=(P,), decode=(D,))
LONG, SHORT, MID = 4096, 200, 1500  # defaults: local ≤ 1024, remote ≥ 2048

TENANTS = [
    {"name": "batch", "match": {"values": ["batch"]}, "disaggregation": "Always"},
    {"name": "chat", "match": {"header": "x-team", "values": ["chat"]}, "disaggregation": "Never"},
    {"name": "rag", "match": {"values": ["rag"]},
     "remotePrefill": {"minInputTokens": 512, "minExpectedOutputTokens": 10},
     "localPrefill": {"maxInputTokens": 256}},
]


def cfg(**over: Any) -> RouterConfig:
    """A router config on the rule ladder (``policy: Thresholds``): this file tests the ladder's rules one by one;
    the SLO placement that overrules them by default is tested in test_placement.py."""
    routing = {"policy": "Thresholds", **over.pop("routing", {})}
    return RouterConfig.model_validate({**over, "routing": routing})


def feats(tokens: int = LONG, max_tokens: int | None = 512, tenant: str | None = None, rid: str = "r",
          endpoint: str = "/v1/completions") -> RequestFeatures:
    return RequestFeatures(request_id=rid, endpoint=endpoint, input_tokens=tokens, max_tokens=max_tokens,
                           tenant=tenant, canary_fraction=request_hash_fraction(rid))


CASES = [
    # id, config, features, snapshot, expected (decision, reason)
    ("long-remote", {}, feats(), SNAP, ("remote", "policy")),
    ("short-local", {}, feats(SHORT), SNAP, ("local", "short_prompt")),
    ("at-local-max-local", {}, feats(1024), SNAP, ("local", "short_prompt")),
    ("gray-zone-local", {}, feats(MID), SNAP, ("local", "below_remote_threshold")),
    ("at-remote-min-remote", {}, feats(2048), SNAP, ("remote", "policy")),
    ("short-output-local", {}, feats(max_tokens=16), SNAP, ("local", "short_output")),
    ("unknown-output-remote", {}, feats(max_tokens=None), SNAP, ("remote", "policy")),
    ("tenant-avg-short-local", {}, feats(max_tokens=None),
     LoadSnapshot(prefill=(P,), decode=(D,), tenant_avg_output_tokens=20.0), ("local", "short_output")),
    ("tenant-avg-long-remote", {}, feats(max_tokens=None),
     LoadSnapshot(prefill=(P,), decode=(D,), tenant_avg_output_tokens=500.0), ("remote", "policy")),
    ("max-tokens-beats-avg", {}, feats(max_tokens=500),
     LoadSnapshot(prefill=(P,), decode=(D,), tenant_avg_output_tokens=5.0), ("remote", "policy")),
    # mode
    ("mode-aggregated", {"mode": "Aggregated"}, feats(), SNAP, ("local", "mode_aggregated")),
    ("active-aggregated", {"activeMode": "Aggregated"}, feats(), SNAP, ("local", "mode_aggregated")),
    ("pinned-disagg-ignores-active", {"mode": "Disaggregated", "activeMode": "Aggregated"}, feats(), SNAP,
     ("remote", "policy")),
    # availability
    ("no-prefill", {}, feats(), LoadSnapshot(decode=(D,)), ("local", "no_prefill_worker")),
    ("no-compatible-pair", {}, feats(),
     LoadSnapshot(prefill=(WorkerLoad("http://p1", compat="new"),), decode=(D,)), ("local", "no_compatible_pair")),
    ("no-decode-reject", {}, feats(), LoadSnapshot(prefill=(P,)), ("reject", "no_decode_worker")),
    # queue overload
    ("overload-local", {}, feats(),
     LoadSnapshot(prefill=(WorkerLoad("http://p1", compat="a", est_wait_ms=301),), decode=(D,)),
     ("local", "prefill_queue_overload")),
    ("overload-at-limit-remote", {}, feats(),
     LoadSnapshot(prefill=(WorkerLoad("http://p1", compat="a", est_wait_ms=300),), decode=(D,)), ("remote", "policy")),
    ("overload-queue", {"routing": {"fallback": {"onPrefillQueueOverload": "Queue"}}}, feats(),
     LoadSnapshot(prefill=(WorkerLoad("http://p1", compat="a", est_wait_ms=5000),), decode=(D,)),
     ("remote", "prefill_queue_overload_queued")),
    ("overload-reject", {"routing": {"fallback": {"onPrefillQueueOverload": "Reject"}}}, feats(),
     LoadSnapshot(prefill=(WorkerLoad("http://p1", compat="a", est_wait_ms=5000),), decode=(D,)),
     ("reject", "prefill_queue_overload")),
    ("overload-picks-idle-worker", {}, feats(),
     LoadSnapshot(prefill=(WorkerLoad("http://p1", compat="a", est_wait_ms=5000),
                           WorkerLoad("http://p2", compat="a", est_wait_ms=10)), decode=(D,)), ("remote", "policy")),
    # decode pressure
    ("pressure-required-idle", {"routing": {"remotePrefill": {"requireDecodePoolPressure": True}}}, feats(), SNAP,
     ("local", "no_decode_pressure")),
    ("pressure-required-kv", {"routing": {"remotePrefill": {"requireDecodePoolPressure": True}}}, feats(),
     LoadSnapshot(prefill=(P,), decode=(WorkerLoad("http://d1", compat="a", kv_usage=0.7),)), ("remote", "policy")),
    ("pressure-required-running", {"routing": {"remotePrefill": {"requireDecodePoolPressure": True}}}, feats(),
     LoadSnapshot(prefill=(P,), decode=(WorkerLoad("http://d1", compat="a", running=9),)), ("remote", "policy")),
    # prefix cache
    ("prefix-hit-local", {}, feats(4096),
     LoadSnapshot(prefill=(P,), decode=(WorkerLoad("http://d1", compat="a", prefix_tokens=4000),)),
     ("local", "prefix_cache_hit")),
    ("prefix-partial-remote", {}, feats(4096),
     LoadSnapshot(prefill=(P,), decode=(WorkerLoad("http://d1", compat="a", prefix_tokens=1000),)),
     ("remote", "policy")),
    ("prefix-hit-disabled", {"routing": {"localPrefill": {"preferWhenPrefixCacheHit": False}}}, feats(4096),
     LoadSnapshot(prefill=(P,), decode=(WorkerLoad("http://d1", compat="a", prefix_tokens=4000),)),
     ("remote", "policy")),
    # tenants
    ("tenant-always-short", {"routing": {"tenants": TENANTS}}, feats(SHORT, max_tokens=1, tenant="batch"), SNAP,
     ("remote", "tenant_always")),
    ("tenant-always-no-prefill", {"routing": {"tenants": TENANTS}}, feats(tenant="batch"), LoadSnapshot(decode=(D,)),
     ("local", "no_prefill_worker")),
    ("tenant-always-overload", {"routing": {"tenants": TENANTS}}, feats(tenant="batch"),
     LoadSnapshot(prefill=(WorkerLoad("http://p1", compat="a", est_wait_ms=9999),), decode=(D,)),
     ("local", "prefill_queue_overload")),
    ("tenant-never-long", {"routing": {"tenants": TENANTS}}, feats(tenant="chat"), SNAP, ("local", "tenant_never")),
    ("tenant-override-remote", {"routing": {"tenants": TENANTS}}, feats(600, max_tokens=20, tenant="rag"), SNAP,
     ("remote", "policy")),
    ("tenant-override-local", {"routing": {"tenants": TENANTS}}, feats(250, tenant="rag"), SNAP,
     ("local", "short_prompt")),
    ("unknown-tenant-default", {"routing": {"tenants": TENANTS}}, feats(MID, tenant="nobody"), SNAP,
     ("local", "below_remote_threshold")),
    # buckets
    ("bucket-remote", {"routing": {"buckets": [{"name": "mid", "minInputTokens": 1000, "maxInputTokens": 2000,
                                                "prefill": "Remote"}]}}, feats(MID, max_tokens=1), SNAP,
     ("remote", "bucket_remote")),
    ("bucket-local", {"routing": {"buckets": [{"name": "huge", "minInputTokens": 3000, "prefill": "Local"}]}},
     feats(LONG), SNAP, ("local", "bucket_local")),
    ("bucket-auto", {"routing": {"buckets": [{"name": "all", "prefill": "Auto"}]}}, feats(LONG), SNAP,
     ("remote", "policy")),
    ("bucket-upper-exclusive", {"routing": {"buckets": [{"name": "b", "minInputTokens": 0, "maxInputTokens": 4096,
                                                         "prefill": "Local"}]}}, feats(4096), SNAP,
     ("remote", "policy")),
    ("tenant-never-beats-bucket-remote",
     {"routing": {"tenants": TENANTS, "buckets": [{"name": "all", "prefill": "Remote"}]}}, feats(tenant="chat"), SNAP,
     ("local", "tenant_never")),
    # canary
    ("canary-zero", {"rollout": {"canary": {"trafficPercent": 0}}}, feats(), SNAP, ("local", "canary_excluded")),
    ("canary-tenant-out", {"rollout": {"canary": {"tenants": ["rag"]}}}, feats(), SNAP, ("local", "canary_excluded")),
    ("canary-tenant-in", {"routing": {"tenants": TENANTS}, "rollout": {"canary": {"tenants": ["rag"]}}},
     feats(tenant="rag"), SNAP, ("remote", "policy")),
    ("canary-default-tenant-in", {"rollout": {"canary": {"tenants": ["default"]}}}, feats(), SNAP,
     ("remote", "policy")),
    ("canary-endpoint-out", {"rollout": {"canary": {"endpoints": ["/v1/chat/completions"]}}}, feats(), SNAP,
     ("local", "canary_excluded")),
    ("canary-endpoint-in", {"rollout": {"canary": {"endpoints": ["/v1/chat/completions"]}}},
     feats(endpoint="/v1/chat/completions"), SNAP, ("remote", "policy")),
    ("canary-input-out", {"rollout": {"canary": {"inputTokensGte": 8000}}}, feats(), SNAP,
     ("local", "canary_excluded")),
    ("canary-gates-always-tenant", {"routing": {"tenants": TENANTS}, "rollout": {"canary": {"trafficPercent": 0}}},
     feats(tenant="batch"), SNAP, ("local", "canary_excluded")),
    ("canary-mode-first", {"mode": "Aggregated", "rollout": {"canary": {"trafficPercent": 0}}}, feats(), SNAP,
     ("local", "mode_aggregated")),
]


@pytest.mark.parametrize("config,f,snap,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide_table(config, f, snap, expected):
    d = decide(cfg(**config), f, snap)
    assert (d.decision, d.reason) == expected
    if d.decision == "remote":
        assert d.prefill and d.decode
    if d.decision == "local":
        assert d.decode and d.prefill is None
    if d.decision == "reject":
        assert d.status in (429, 503)


def test_reject_statuses():
    c = cfg(routing={"fallback": {"onPrefillQueueOverload": "Reject"}})
    busy = LoadSnapshot(prefill=(WorkerLoad("p", est_wait_ms=1e6),), decode=(WorkerLoad("d"),))
    assert decide(c, feats(), busy).status == 429
    assert decide(c, feats(), LoadSnapshot()).status == 503


def test_mode_aggregated_prefers_aggregated_pool():
    snap = LoadSnapshot(prefill=(P,), decode=(D,), aggregated=(WorkerLoad("http://agg"),))
    d = decide(cfg(mode="Aggregated"), feats(), snap)
    assert (d.decision, d.decode) == ("local", "http://agg")
    # disaggregated mode keeps local prefill on decode workers
    assert decide(cfg(), feats(SHORT), snap).decode == "http://d1"


def test_only_aggregated_pool_serves_local():
    d = decide(cfg(), feats(), LoadSnapshot(prefill=(P,), aggregated=(WorkerLoad("http://agg"),)))
    assert (d.decision, d.reason) == ("local", "no_compatible_pair")


def test_pairs_compatible_workers_mid_rollout():
    snap = LoadSnapshot(
        prefill=(WorkerLoad("http://p-old", compat="old", est_wait_ms=1), WorkerLoad("http://p-new", compat="new")),
        decode=(WorkerLoad("http://d-old", compat="old", inflight=5), WorkerLoad("http://d-new", compat="new")),
    )
    d = decide(cfg(), feats(), snap)
    assert (d.prefill, d.decode) == ("http://p-new", "http://d-new")
    # only the old decode has a prefill partner
    snap2 = LoadSnapshot(prefill=(WorkerLoad("http://p-old", compat="old"),), decode=snap.decode)
    d2 = decide(cfg(), feats(), snap2)
    assert (d2.prefill, d2.decode) == ("http://p-old", "http://d-old")
    assert d2.local_decode == "http://d-new"


def test_canary_percent_deterministic_and_proportional():
    c = cfg(rollout={"canary": {"trafficPercent": 25}})
    remote = [decide(c, feats(rid=f"req-{i}"), SNAP).decision == "remote" for i in range(4000)]
    share = sum(remote) / len(remote)
    assert 0.22 < share < 0.28  # binomial sd ≈ 0.007
    again = [decide(c, feats(rid=f"req-{i}"), SNAP).decision == "remote" for i in range(200)]
    assert again == remote[:200]


def url_of(w: WorkerLoad | None) -> str | None:
    return w.url if w is not None else None


def test_choose_decode_least_loaded_and_prefix_affinity():
    a = WorkerLoad("http://a", inflight=3)
    b = WorkerLoad("http://b", inflight=1)
    assert url_of(choose_decode((a, b))) == "http://b"
    a_pref = WorkerLoad("http://a", inflight=3, prefix_tokens=512)
    assert url_of(choose_decode((a_pref, b))) == "http://a"  # within slack
    a_busy = WorkerLoad("http://a", inflight=30, prefix_tokens=512)
    assert url_of(choose_decode((a_busy, b))) == "http://b"
    assert url_of(choose_decode((a_pref, b), Tuning(prefix_affinity_slack=0))) == "http://b"
    assert choose_decode(()) is None
    # scraped load counts too
    c = WorkerLoad("http://c", inflight=0, running=10, waiting=5)
    assert url_of(choose_decode((c, a))) == "http://a"


_LOADS = st.builds(WorkerLoad, url=st.sampled_from([f"http://w{i}" for i in range(6)]),
                   inflight=st.integers(0, 8), running=st.integers(0, 8).map(float),
                   waiting=st.integers(0, 3).map(float), kv_usage=st.sampled_from([0.0, 0.25, 0.5]),
                   prefix_tokens=st.sampled_from([0, 0, 256, 512]))


@given(st.lists(_LOADS, min_size=1, max_size=8), st.integers(0, 4))
def test_choose_decode_is_the_least_loaded_unless_a_prefix_holder_is_within_slack(workers, slack):
    # the definition, stated as two orderings: the least loaded by (load, KV usage, url); the longest prefix by
    # (prefix tokens, least load, url); the prefix holder wins when at most `slack` busier
    def load(w: WorkerLoad) -> float:
        return max(float(w.inflight), w.running + w.waiting)

    least = min(workers, key=lambda w: (load(w), w.kv_usage, w.url))
    holder = max(workers, key=lambda w: (w.prefix_tokens, -load(w), w.url))
    expected = holder if holder.prefix_tokens > 0 and load(holder) <= load(least) + slack else least
    assert choose_decode(tuple(workers), Tuning(prefix_affinity_slack=slack)) == expected


def test_choose_prefill_least_wait():
    ws = (WorkerLoad("http://p1", est_wait_ms=50), WorkerLoad("http://p2", est_wait_ms=10, compat="x"))
    assert url_of(choose_prefill(ws, None)) == "http://p2"
    assert url_of(choose_prefill(ws, "")) == "http://p1"
    assert choose_prefill(ws, "zzz") is None


def test_effective_policy_overrides():
    c = cfg(routing={"tenants": TENANTS})
    base = effective_policy(c, None)
    rag = effective_policy(c, find_tenant(c, "rag"))
    assert (base.min_input_tokens, base.local_max_input_tokens) == (2048, 1024)
    assert (rag.min_input_tokens, rag.local_max_input_tokens, rag.min_expected_output_tokens) == (512, 256, 10)
    assert rag.max_prefill_queue_wait_ms == base.max_prefill_queue_wait_ms


def test_prefill_wait_estimate_backlog_clock():
    from disagg.router.load import Worker

    w = Worker("http://p", "prefill")
    w.observed_sec_per_token = 0.0001  # 10k tokens/s
    assert w.est_prefill_wait_s(now=100.0) == 0.0
    w.prefill_started(4000, now=100.0)  # 0.4 s of work
    w.prefill_started(2000, now=100.1)  # queued behind it
    assert abs(w.est_prefill_wait_s(now=100.1) - 0.5) < 1e-9
    assert abs(w.est_prefill_wait_s(now=100.4) - 0.2) < 1e-9
    assert w.est_prefill_wait_s(now=200.0) == 0.0
    w.busy_until = 150.0
    w.prefill_ended(others_in_flight=1, now=100.5)
    assert w.busy_until == 150.0
    w.prefill_ended(others_in_flight=0, now=100.5)  # nothing of ours left: no backlog
    assert w.est_prefill_wait_s(now=100.5) == 0.0
    # other clients' queue from the scraped metrics
    w.scraped = {"vllm:num_requests_waiting": 3.0}
    w.avg_prompt_tokens = 1000.0
    assert abs(w.est_prefill_wait_s(now=100.5) - 0.3) < 1e-9


def test_scrape_averages_and_parser():
    from disagg.router.load import Worker, parse_prometheus

    text1 = ('# HELP x\nvllm:request_queue_time_seconds_sum{model_name="m",engine="0"} 1.0\n'
             'vllm:request_queue_time_seconds_count{model_name="m",engine="0"} 10\n'
             'vllm:request_prefill_time_seconds_sum{model_name="m"} 2.0\nvllm:request_prompt_tokens_sum 1000\n'
             'vllm:request_prompt_tokens_count 10\nvllm:num_requests_waiting{engine="0"} 2\n'
             'vllm:num_requests_waiting{engine="1"} 3\nvllm:kv_cache_usage_perc 0.25\nother_metric 5\n')
    v1 = parse_prometheus(text1)
    assert v1["vllm:num_requests_waiting"] == 5 and "other_metric" not in v1
    w = Worker("http://d", "decode")
    w.update_scrape(v1)
    assert w.avg == {} and w.avg_prompt_tokens == 100
    v2 = dict(v1, **{"vllm:request_queue_time_seconds_sum": 3.0, "vllm:request_queue_time_seconds_count": 14,
                     "vllm:request_prefill_time_seconds_sum": 3.0, "vllm:request_prompt_tokens_sum": 11000})
    w.update_scrape(v2)
    assert w.avg["vllm:request_queue_time_seconds"] == 0.5
    assert w.sec_per_token is not None and abs(w.sec_per_token - 0.0001) < 1e-12
    load = w.load(prefix_tokens=32)
    assert (load.waiting, load.kv_usage, load.prefix_tokens) == (5, 0.25, 32)


# ------------------------------------------------------------------------------ one elastic fleet (Thresholds)
BUSY_D = WorkerLoad("http://d1", compat="a", inflight=6, running=6)


def test_a_local_request_runs_whole_on_an_idle_prefill_worker_less_loaded_than_the_decode_worker() -> None:
    d = decide(cfg(), feats(SHORT), LoadSnapshot(prefill=(P,), decode=(BUSY_D,)))
    assert (d.decision, d.reason, d.decode, d.local_decode) == ("local", "short_prompt", "http://p1", "http://p1")
    assert d.detail == {"elastic": True}
    # equally loaded: the decode worker keeps it (a prefill worker's first job is the remote prefills)
    even = WorkerLoad("http://p1", compat="a", inflight=6, running=6)
    assert decide(cfg(), feats(SHORT), LoadSnapshot(prefill=(even,), decode=(BUSY_D,))).decode == "http://d1"


def test_a_prefill_worker_with_recent_remote_prefills_or_a_starting_pool_serves_no_whole_request() -> None:
    recent = WorkerLoad("http://p1", compat="a", remote_idle_s=1.0)
    assert decide(cfg(), feats(SHORT), LoadSnapshot(prefill=(recent,), decode=(BUSY_D,))).decode == "http://d1"
    starting = cfg(prefillStarting=True)
    assert decide(starting, feats(SHORT), LoadSnapshot(prefill=(P,), decode=(BUSY_D,))).decode == "http://d1"
    off = Tuning(elastic_idle_s=0)
    assert decide(cfg(), feats(SHORT), LoadSnapshot(prefill=(P,), decode=(BUSY_D,)), off).decode == "http://d1"
    spec_off = cfg(routing={"elasticFleet": False})  # spec.routing.elasticFleet: false
    assert decide(spec_off, feats(SHORT), LoadSnapshot(prefill=(P,), decode=(BUSY_D,))).decode == "http://d1"


def test_a_prefix_hit_stays_on_the_decode_worker_that_holds_it() -> None:
    holder = WorkerLoad("http://d1", compat="a", inflight=6, running=6, prefix_tokens=3500)
    d = decide(cfg(), feats(LONG), LoadSnapshot(prefill=(P,), decode=(holder,)))
    assert (d.reason, d.decode) == ("prefix_cache_hit", "http://d1")

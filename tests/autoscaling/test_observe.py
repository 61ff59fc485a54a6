"""One interval's observation from counter increments (autoscaling/observe.py): a known mix gives back its rates,
mean prompts, mean output (Little's law) and remote TTFT; demand is read per role at the router, so prefill work the
decode workers took for a short prefill pool stays prefill demand; the PromQL of every increment renders for a
pool."""

from __future__ import annotations

import pytest

from disagg.autoscaling.forecast import Load
from disagg.autoscaling.observe import INCREASES, observation

DT = 30.0
READY = {"prefill": 2, "decode": 3}


def _interval(remote: int = 60, local: int = 240, remote_in: float = 8000.0, local_in: float = 450.0,
              out: float = 200.0, tpot: float = 0.02) -> tuple[dict[str, float], dict[str, float], dict[str, float],
                                                             float]:
    """Increments of one interval of a steady mix: ``remote`` and ``local`` requests, their mean prompts, the mean
    output and TPOT; the decode pool's running count from Little's law."""
    # the prefill engines' TTFT (0.6 s) counts from their API servers: more than queue (0.1) + prefill (0.4) time,
    # which leave out the API server's share and the wait for the step in flight (vLLM's QUEUED event)
    prefill = {"vllm:request_queue_time_seconds_sum": remote * 0.1, "vllm:request_queue_time_seconds_count": remote,
               "vllm:request_prefill_time_seconds_sum": remote * 0.4,
               "vllm:request_prefill_time_seconds_count": remote,
               "vllm:time_to_first_token_seconds_sum": remote * 0.6,
               "vllm:time_to_first_token_seconds_count": remote}
    n = remote + local
    decode = {"vllm:nixl_xfer_time_seconds_sum": remote * 0.05, "vllm:nixl_xfer_time_seconds_count": remote,
              "vllm:request_time_per_output_token_seconds_sum": n * tpot,
              "vllm:request_time_per_output_token_seconds_count": n}
    routed = {"prefill_sum": remote * remote_in, "prefill_count": remote, "decode_sum": local * local_in,
              "decode_count": local}
    running = (n / DT) * out * tpot
    return prefill, decode, routed, running


def test_a_known_mix_is_read_back() -> None:
    prefill, decode, routed, running = _interval()
    obs = observation(100.0, DT, prefill, decode, routed, running, READY, READY, None)
    assert obs.load is not None
    got = (obs.load.remote_rps, obs.load.local_rps, obs.load.remote_in, obs.load.local_in, obs.load.out)
    assert got == pytest.approx((2.0, 8.0, 8000.0, 450.0, 200.0))
    assert obs.remote_ttft_s == pytest.approx(0.6 + 0.05)  # the prefill engines' TTFT and the KV transfer
    assert obs.tpot_s == pytest.approx(0.02)
    assert (obs.prefill_ready, obs.decode_replicas, obs.stale_reason) == (2, 3, None)
    assert obs.prefill_waiting == 0.0
    queued = observation(100.0, DT, prefill, decode, routed, running, READY, READY, None, prefill_waiting=12.0)
    assert queued.prefill_waiting == 12.0 and queued.load == obs.load


def test_means_it_cannot_measure_are_kept_from_the_last_interval() -> None:
    prefill, decode, routed, _ = _interval(local=0)
    last = Load(1.0, 1.0, 7000.0, 300.0, 150.0)
    obs = observation(0.0, DT, prefill, decode, routed, 0.0, READY, READY, last)
    assert obs.load is not None and obs.load.local_in == 300.0 and obs.load.out == 150.0


def test_no_traffic_is_no_load_and_no_ready_decode_is_stale() -> None:
    obs = observation(0.0, DT, {}, {}, {}, 0.0, {"prefill": 1, "decode": 0}, READY, None)
    assert obs.load is None and obs.stale_reason == "no ready decode worker"


def test_every_increment_renders_with_the_models_selector() -> None:
    sel = 'namespace="ns",model="m"'
    rendered = {k: t.format(sel=sel, w="30s") for k, t in INCREASES.items()}
    assert rendered["prefill:vllm:request_queue_time_seconds_count"] == \
        'sum(increase(vllm:request_queue_time_seconds_count{namespace="ns",model="m",role="prefill"}[30s]))'
    assert rendered["routed:prefill_count"] == \
        'sum(increase(disagg_routed_prompt_tokens_count{namespace="ns",model="m",pool="prefill"}[30s]))'
    assert all(sel in q and "[30s]" in q for q in rendered.values())

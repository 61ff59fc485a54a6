"""One interval's traffic and latency from the engines' and the router's counters: the predictive policy's
:class:`~disagg.autoscaling.predictive.Observation`. PURE. One derivation for both connectors: the twin's (counter
deltas over its virtual interval, twin/autoscaler.py) and the operator's (Prometheus ``increase()`` over the
autoscaling interval, controller/autoscaler.py through :data:`INCREASES`).

What each figure is made of (the router's own series, and vLLM's as sim/metrics.py and vLLM 0.32/0.33 export them):

- arrivals per role and their mean prompts: the routers' ``disagg_routed_prompt_tokens{pool}`` histogram, counted
  at the routing decision (router/policy.py ``demand_pool``): ``prefill`` — remote prefills, and prefill work the
  rules meant for the prefill pool that it did not take (no remote pair could, or the SLO placement deflected it);
  ``decode`` — prompts prefilled where they decode by choice. Demand, not service: a queue that lags behind its
  arrivals, or the ladder's spill of long prompts onto the decode workers while the prefill pool is short, does not
  turn prefill demand into decode demand (role-aware: a short prefill pool grows the prefill pool);
- mean output tokens: Little's law on the decode pool — running = completions/s × E[out] × TPOT, with the mean
  per-request TPOT (``vllm:request_time_per_output_token_seconds``) and the running gauge averaged over the interval;
- the prefill pool's backlog: the requests waiting in its engines' queues at the tick
  (``vllm:num_requests_waiting``, its last sample in the interval);
- remote TTFT: the prefill pool's TTFT (``vllm:time_to_first_token_seconds``: from when its API server took the
  request, so its share of TTFT, the wait for the step in flight and the queue all count) + the decode pool's KV
  transfer time. Not queue + prefill time: vLLM's queue time starts when the engine core adds the request, between
  steps (v1/engine/core.py ``run_busy_loop``, 0.32.0), so the step in flight at arrival and the API server's share
  are in neither.
"""

from __future__ import annotations

from collections.abc import Mapping

from .forecast import Load
from .predictive import Observation

# (pool, histogram family): the _sum and _count increments the observation needs from each pool
HISTOGRAMS: tuple[tuple[str, str], ...] = (
    ("prefill", "vllm:request_queue_time_seconds"),
    ("prefill", "vllm:time_to_first_token_seconds"),
    ("decode", "vllm:nixl_xfer_time_seconds"),
    ("decode", "vllm:request_time_per_output_token_seconds"),
)

ROUTED = "disagg_routed_prompt_tokens"  # router/metrics.py, by the pool whose prefill the request demands
# (key in :func:`observation`'s ``routed``, pool label, histogram part) of its increments
ROUTED_KEYS: tuple[tuple[str, str, str], ...] = tuple(
    (f"{pool}_{part}", pool, part) for pool in ("prefill", "decode") for part in ("sum", "count"))

# name → PromQL template ({sel}: the model's selector, {w}: the interval) of every increment and gauge
# :func:`observation` reads, as the operator queries them (autoscaling/queries.py collects them)
INCREASES: dict[str, str] = {
    **{f"{pool}:{family}_{part}": f'sum(increase({family}_{part}{{{{{{sel}},role="{pool}"}}}}[{{w}}]))'
       for pool, family in HISTOGRAMS for part in ("sum", "count")},
    **{f"routed:{key}": f'sum(increase({ROUTED}_{part}{{{{{{sel}},pool="{pool}"}}}}[{{w}}]))'
       for key, pool, part in ROUTED_KEYS},
    "decode:vllm:num_requests_running": 'sum(avg_over_time(vllm:num_requests_running{{{sel},role="decode"}}[{w}]))',
    "prefill:vllm:num_requests_waiting": 'sum(last_over_time(vllm:num_requests_waiting{{{sel},role="prefill"}}[{w}]))',
}

DEFAULT_REMOTE_IN = 4096.0  # tokens, until a remote request's prompt has been measured once
DEFAULT_LOCAL_IN = 512.0  # tokens, until a local request's prompt has been measured once
DEFAULT_OUT = 256.0  # tokens, until the mean output has been measured once
MAX_OUT = 8192.0


def observation(now: float, dt: float, prefill: Mapping[str, float], decode: Mapping[str, float],
                routed: Mapping[str, float], running: float, ready: Mapping[str, int], desired: Mapping[str, int],
                last: Load | None, prefill_waiting: float = 0.0) -> Observation:
    """The interval's :class:`Observation`. ``prefill`` / ``decode``: each pool's ``<family>_sum`` /
    ``<family>_count`` increments over the interval (:data:`HISTOGRAMS`; a missing one is 0); ``routed``: the
    routers' demand histogram's increments, ``prefill_sum``, ``prefill_count``, ``decode_sum``, ``decode_count``;
    ``running``: the decode pool's running sequences (averaged over the interval); ``last``: the previous
    interval's load (means not measurable in this one are kept from it); ``prefill_waiting``: requests waiting in
    the prefill pool's queues now."""

    def mean(acc: Mapping[str, float], h: str) -> float | None:
        c = acc.get(h + "_count", 0.0)
        return acc.get(h + "_sum", 0.0) / c if c > 0 else None

    p, d = prefill, decode
    remote, local = routed.get("prefill_count", 0.0), routed.get("decode_count", 0.0)
    remote_in, local_in = mean(routed, "prefill"), mean(routed, "decode")
    tpot = mean(d, "vllm:request_time_per_output_token_seconds")
    done = d.get("vllm:request_time_per_output_token_seconds_count", 0.0) / dt
    out = running / (done * tpot) if done > 0 and tpot else None
    load = None
    if remote + local > 0:  # a role with no request this interval keeps its last mean prompt
        remote_in = remote_in or (last.remote_in if last is not None else DEFAULT_REMOTE_IN)
        local_in = local_in or (last.local_in if last is not None else DEFAULT_LOCAL_IN)
        load = Load(remote / dt, local / dt, max(1.0, remote_in), max(1.0, local_in),
                    min(MAX_OUT, max(1.0, out)) if out else (last.out if last is not None else DEFAULT_OUT))
    prefill_ttft = mean(p, "vllm:time_to_first_token_seconds")
    xfer = mean(d, "vllm:nixl_xfer_time_seconds") or 0.0
    ttft = prefill_ttft + xfer if prefill_ttft is not None else None
    return Observation(now, load, desired["prefill"], ready["prefill"], desired["decode"], ready["decode"],
                       remote_ttft_s=ttft, tpot_s=tpot, prefill_waiting=max(0.0, prefill_waiting),
                       stale_reason=None if ready["decode"] else "no ready decode worker")

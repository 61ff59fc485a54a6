"""One interval's traffic and latency from the engines' and the router's counters: the predictive policy's
:class:`~disagg.autoscaling.predictive.Observation`. PURE. One derivation for both connectors: the twin's (counter
deltas over its virtual interval, twin/autoscaler.py) and the operator's (Prometheus ``increase()`` over the
autoscaling interval, controller/autoscaler.py through :data:`INCREASES`).

What each figure is made of (vLLM's own series; the names as sim/metrics.py and vLLM 0.32/0.33 export them):

- arrivals: the routers' decisions (``disagg_routing_decisions_total``, every request once);
- remote requests and their mean prompt: the prefill pool's ``vllm:request_prompt_tokens`` histogram (only remote
  prefills run there);
- local requests' mean prompt: the decode pool counts every request's prompt, the remote ones' too (those pulled
  their KV: the NIXL transfer count, ``vllm:nixl_xfer_time_seconds``); what is left is the local requests';
- mean output tokens: Little's law on the decode pool — running = completions/s × E[out] × TPOT, with the mean
  per-request TPOT (``vllm:request_time_per_output_token_seconds``) and the running gauge averaged over the interval;
- remote TTFT: the prefill pool's queue wait + prefill time (``vllm:request_queue_time_seconds``,
  ``vllm:request_prefill_time_seconds``) + the decode pool's KV transfer time: queue wait counts.
"""

from __future__ import annotations

from collections.abc import Mapping

from .forecast import Load
from .predictive import Observation

# (pool, histogram family): the _sum and _count increments the observation needs from each pool
HISTOGRAMS: tuple[tuple[str, str], ...] = (
    ("prefill", "vllm:request_prompt_tokens"),
    ("prefill", "vllm:request_queue_time_seconds"),
    ("prefill", "vllm:request_prefill_time_seconds"),
    ("decode", "vllm:request_prompt_tokens"),
    ("decode", "vllm:nixl_xfer_time_seconds"),
    ("decode", "vllm:request_time_per_output_token_seconds"),
)

# name → PromQL template ({sel}: the model's selector, {w}: the interval) of every increment and gauge
# :func:`observation` reads, as the operator queries them (autoscaling/queries.py collects them)
INCREASES: dict[str, str] = {
    **{f"{pool}:{family}_{part}": f'sum(increase({family}_{part}{{{{{{sel}},role="{pool}"}}}}[{{w}}]))'
       for pool, family in HISTOGRAMS for part in ("sum", "count")},
    "arrivals": "sum(increase(disagg_routing_decisions_total{{{sel}}}[{w}]))",
    "decode:vllm:num_requests_running": 'sum(avg_over_time(vllm:num_requests_running{{{sel},role="decode"}}[{w}]))',
}

DEFAULT_LOCAL_IN = 512.0  # tokens, until the local requests' mean prompt has been measured once
DEFAULT_OUT = 256.0  # tokens, until the mean output has been measured once
MAX_OUT = 8192.0


def observation(now: float, dt: float, prefill: Mapping[str, float], decode: Mapping[str, float], arrivals: float,
                running: float, ready: Mapping[str, int], desired: Mapping[str, int],
                last: Load | None) -> Observation:
    """The interval's :class:`Observation`. ``prefill`` / ``decode``: each pool's ``<family>_sum`` /
    ``<family>_count`` increments over the interval (:data:`HISTOGRAMS`; a missing one is 0); ``arrivals``: requests
    routed in it; ``running``: the decode pool's running sequences (averaged over the interval); ``last``: the
    previous interval's load (means not measurable in this one are kept from it)."""

    def mean(acc: Mapping[str, float], h: str) -> float | None:
        c = acc.get(h + "_count", 0.0)
        return acc.get(h + "_sum", 0.0) / c if c > 0 else None

    p, d = prefill, decode
    remote = p.get("vllm:request_prompt_tokens_count", 0.0)
    remote_in = mean(p, "vllm:request_prompt_tokens") or 1.0
    pulled = d.get("vllm:nixl_xfer_time_seconds_count", 0.0)
    local_n = d.get("vllm:request_prompt_tokens_count", 0.0) - pulled
    local_sum = d.get("vllm:request_prompt_tokens_sum", 0.0) - remote_in * pulled
    local = max(0.0, arrivals - remote)
    local_in = local_sum / local_n if local_n >= 1 and local_sum > 0 else None
    tpot = mean(d, "vllm:request_time_per_output_token_seconds")
    done = d.get("vllm:request_time_per_output_token_seconds_count", 0.0) / dt
    out = running / (done * tpot) if done > 0 and tpot else None
    load = None
    if arrivals > 0:
        if local_in is None or local_in > remote_in:  # too few local requests to measure: keep the last mean
            local_in = last.local_in if last is not None else DEFAULT_LOCAL_IN
        load = Load(remote / dt, local / dt, max(1.0, remote_in), max(1.0, local_in),
                    min(MAX_OUT, max(1.0, out)) if out else (last.out if last is not None else DEFAULT_OUT))
    qwait, pfill = mean(p, "vllm:request_queue_time_seconds"), mean(p, "vllm:request_prefill_time_seconds")
    xfer = mean(d, "vllm:nixl_xfer_time_seconds") or 0.0
    ttft = qwait + pfill + xfer if qwait is not None and pfill is not None else None
    return Observation(now, load, desired["prefill"], ready["prefill"], desired["decode"], ready["decode"],
                       remote_ttft_s=ttft, tpot_s=tpot,
                       stale_reason=None if ready["decode"] else "no ready decode worker")

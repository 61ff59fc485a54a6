"""The twin: the simulator's engines and the router's request core in virtual time, in one process.

``disagg sim`` runs real HTTP processes in real time; policy comparisons there are capped by CPU and move with
machine load. The twin runs THE SAME code — the engine (sim/engine.py: scheduler, KV block pool, prefix cache,
roofline perf model) and the router's pure policy (router/policy.py ``decide``, with router/load.py's load
estimates and router/prefix.py's prefix index) — on a virtual-time asyncio event loop (clock.py) with no sockets:
deterministic for a seed, independent of machine load, and as fast as the Python can step the engines.

Public API (stable; later tools — goodput sweeps, the autoscale hindsight oracle, ``disagg plan --verify``,
``disagg replay`` — build on it)::

    from disagg.twin import ClusterSpec, PoolSpec, SLO, simulate, arrivals_from_mix, Arrival

    spec = ClusterSpec(prefill=PoolSpec(16), decode=PoolSpec(48),
                       router={"mode": "Disaggregated", "routing": {...}})   # RouterConfig or its YAML dict
    arrivals = arrivals_from_mix("mixed", rate_per_s=200, duration_s=300, seed=0)   # or [Arrival(...), ...]
    result = simulate(spec, arrivals, seed=0, slo=SLO(ttft_ms=1000, tpot_ms=50))
    result.goodput_rps, result.attainment, result.decisions, result.gpu_seconds, result.pools["decode"].utilisation
    result.records[0]            # RequestRecord: arrival, path, reason, ttft_s, tpot_s, itl_max_s, e2e_s, ...
    result.to_dict()             # JSON-able summary (+ records with ``records=True``)

* :class:`PoolSpec` — one pool of identical workers: count, GPU preset, model preset, TP, max-num-seqs, batched
  tokens, and any further ``disagg sim`` / vLLM flags (``extra_args``); each worker is a ``SimConfig`` parsed by
  sim/config.py exactly as ``disagg sim`` would (so validation errors name the flag).
* :class:`ClusterSpec` — prefill, decode and/or aggregated pools, the router's ``RouterConfig`` (api/contract.py:
  mode, thresholds, buckets, tenants, canary, fallback), the router's tuning knobs (policy.Tuning), its scrape
  interval (default 1 s, like ``disagg router --scrape-interval``) and the KV transport preset.
* :class:`Arrival` — one request: time, input tokens (as the engine counts them), output tokens, tenant, a shared
  prefix (key + length in tokens: requests with the same key share that many leading tokens), and optionally the
  OpenAI body (then the router's features — input-token estimate, prefix hashes, max_tokens — come from it
  exactly as ``disagg router`` computes them). :func:`arrivals_from_mix` / :func:`arrivals_from_requests` make them
  from load/workload.py mixes (deterministic for a seed); ``disagg replay`` passes recorded ones.
* :func:`simulate` — build a :class:`TwinCluster`, run the arrivals to completion in virtual time, return a
  :class:`TwinResult`. ``controller=`` takes ``async def f(cluster)``, run beside the traffic in virtual time: it
  may ``await cluster.add_worker(role)`` / ``await cluster.remove_worker(url)`` (scale up; scale down = the
  router stops sending at once, the engine drains) and ``cluster.set_config(RouterConfig)`` (a config reload) at
  times it chooses with ``asyncio.sleep`` — the autoscale oracle's hook; GPU-seconds count each worker's time in
  service. :class:`TwinCluster` is the lower level (an engine per worker + the router shim) for tools that drive a
  run themselves (``async``, inside :func:`clock.run_virtual`).
* Speed: decode steps that nothing can change run as one planned run (sim/engine.py, "decode fast-forward"):
  the same records, bit for bit, as step by step — ``simulate(..., fast_forward=False)`` is that reference path
  (tests/twin/test_fastforward.py compares them).
* Goodput uses load/loadgen.py's definition (``Result.meets``: status 200, TTFT ≤ SLO, TPOT ≤ SLO or no TPOT),
  the one place; goodput_rps = requests meeting both SLOs ÷ the arrival window.

What the router does per request is the router's own code: the request core (router/core.py) that ``disagg
router`` runs, over engine legs instead of HTTP legs (legs.py ``EngineLegs``): features → a load snapshot from
the last scrape (every ``scrape_interval_s``: running, waiting, KV usage, the prefill/prompt histogram sums) plus the
router's own in-flight counts, prefill backlog clock and prefix index, at the request's virtual time → ``decide``
(with mode probes and circuit breakers) → remote (prefill leg with ``max_tokens=1``/``do_remote_decode`` on the
prefill engine, then the decode engine pulls the held KV in-process after ``PerfModel.transfer_time`` of the
transport) or local (the decode/aggregated engine prefills itself), with the router's fallbacks and causes (docs/
router.md "Fallbacks"), its one local retry, and the sim's fault table per engine (``--fault-*`` in a pool's
``extra_args``). Reject decisions are records with status 429/503. Not modelled: HTTP/CPU overheads of the router
and the sim.
"""

from __future__ import annotations

from .arrivals import Arrival, arrivals_from_mix, arrivals_from_requests
from .clock import DeadlockError, VirtualTimeLoop, run_virtual
from .cluster import TwinCluster
from .run import SLO, Controller, PoolStats, RequestRecord, TwinResult, simulate
from .spec import ClusterSpec, PoolSpec

__all__ = [
    "SLO",
    "Arrival",
    "ClusterSpec",
    "Controller",
    "DeadlockError",
    "PoolSpec",
    "PoolStats",
    "RequestRecord",
    "TwinCluster",
    "TwinResult",
    "VirtualTimeLoop",
    "arrivals_from_mix",
    "arrivals_from_requests",
    "run_virtual",
    "simulate",
]

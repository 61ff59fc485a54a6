"""The twin connector: the operator's autoscaling policies driven in virtual time against a :class:`TwinCluster`.

Dynamo's planner runs one scaling core over kubernetes / virtual / local connectors
(Dynamo docs v1.6.0, knowledge-base/modular-components/planner/planner-examples, "VirtualConnector");
this is ours. Every ``interval_s`` of virtual time :class:`TwinAutoscaler`:

1. **scrapes** (the twin's Prometheus): the router's decision counter (arrivals) and every ready worker's vLLM
   series (sim/metrics.py: prompt-token, queue-time, prefill-time, NIXL-transfer and per-request TPOT histograms as
   ``_sum``/``_count``; running/waiting/KV gauges), and takes the deltas over the interval. A pod still starting is
   not in the cluster yet, and a worker that joined during the interval gives no latency sample (its empty queue
   would read as health): samples from warming pods are ignored.
2. builds the policy's input: :class:`~disagg.autoscaling.policy.Signals` for the proportional policy (policy.py,
   the operator's default; p95s from the interval's means, below) or an
   :class:`~disagg.autoscaling.predictive.Observation` for the predictive and reactive policies;
3. **applies** the decisions: a scale-up starts a pod that becomes a worker after :func:`pod_start_s` (its GPUs
   count from the decision: a starting pod holds them); a scale-down first cancels pods still starting, then removes
   the ready worker with the fewest requests in flight (the router's own count — what the controller writes as
   ``controller.kubernetes.io/pod-deletion-cost``), which the router stops using at once and which drains
   (TwinCluster.remove_worker). Every change goes on :attr:`TwinAutoscaler.timeline`.

From the interval's means, for the proportional policy: a queue wait's p95 ≈ −ln(0.05) ≈ 3 × its mean (an
exponential tail, as plan/model.py's queues have); the remote TTFT p95 ≈ its fixed part (prefill + transfer) + 3 ×
the mean queue wait; TPOT p95 ≈ the mean per-request TPOT (each is itself a mean over the request's tokens).

**Pod start** (:data:`STARTUP`): vLLM's torch.compile takes ~45 s without and ~8 s with a compilation cache for
Llama-3.1-8B (nvidia/Llama-3.1-8B-Instruct-FP8, Dynamo PR #3257, 2025-09-26, generalising PR #3115:
https://github.com/ai-dynamo/dynamo/pull/3257); weight loading adds the weights' bytes ÷ :data:`LOAD_BYTES_PER_S`
(an assumption — 2 GB/s from a node-local cache — not a measurement). Image pull is not modelled (pre-pulled).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..api.models import DisaggregatedModelSpec
from ..api.status import RoleMoves
from ..autoscaling.observe import ROUTED, ROUTED_KEYS, observation
from ..autoscaling.policy import Decision, History, PoolSignals, Signals, decide
from ..autoscaling.predictive import Observation
from ..perf.presets import get_model
from .cluster import TwinCluster

# torch.compile per model size (seconds): (without a compilation cache, with one). Only the 8B is published.
STARTUP: dict[str, tuple[float, float]] = {"Llama-3.1-8B": (45.0, 8.0)}
LOAD_BYTES_PER_S = 2e9  # ASSUMPTION: weights read at 2 GB/s (node-local NVMe cache); not a cited figure
P95_OF_MEAN_WAIT = -math.log(0.05)  # exponential tail: p95 = ln(20) × mean ≈ 3.0 × mean
GAUGE_EVERY_S = 5.0  # gauges are sampled this often within an interval and averaged
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


def pod_start_s(model_preset: str, compile_cache: bool = False, tp: int = 1) -> float:
    """Modelled pod start for one replica: compile (cited, 8B) + weights ÷ :data:`LOAD_BYTES_PER_S` per GPU."""
    m = get_model(model_preset)
    compile_s = STARTUP.get(m.name, STARTUP["Llama-3.1-8B"])[1 if compile_cache else 0]
    weight_bytes = m.total_params * 2.0  # bf16
    return compile_s + weight_bytes / max(1, tp) / LOAD_BYTES_PER_S


Policy = Callable[[Observation, Signals], dict[str, Decision]]


def _mean(acc: dict[str, float], h: str) -> float | None:
    c = acc.get(h + "_count", 0.0)
    return acc.get(h + "_sum", 0.0) / c if c > 0 else None


def proportional(spec: DisaggregatedModelSpec) -> Policy:
    """The operator's policy (policy.py ``decide``) on the connector's Signals."""
    history = History()

    def run(_: Observation, signals: Signals) -> dict[str, Decision]:
        return decide(spec, signals, history)

    return run


def of(policy: Any) -> Policy:
    """A predictive or reactive policy (``step(Observation)``) as a connector policy."""

    def run(obs: Observation, _: Signals) -> dict[str, Decision]:
        return policy.step(obs)

    return run


@dataclass
class Event:
    t: float
    pool: str
    before: int
    after: int
    ready: int
    reason: str


@dataclass
class TwinAutoscaler:
    """An ``async def f(cluster)`` controller for :func:`disagg.twin.simulate`."""

    policy: Policy
    interval_s: float = 30.0
    # the policy's role moves after each step (PredictivePolicy.moves), applied as the operator applies
    # status.roleMoves; None: pods only
    roles: Callable[[], RoleMoves] | None = None
    role_moves: list[Event] = field(default_factory=list)  # each change of the moves in force
    start_s: float = 53.0
    until_s: float | None = None  # stop deciding after this virtual time (the day's end)
    timeline: list[Event] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)  # per tick: time, ready, desired, load
    starting_gpu_s: float = 0.0  # GPU-seconds of pods while they started (the cluster counts them from ready)
    cluster: TwinCluster | None = None
    _prev: dict[str, dict[str, float]] = field(default_factory=dict)
    _prev_router: dict[str, float] = field(default_factory=dict)  # the router's demand counters at the last tick
    _leaving: set[str] = field(default_factory=set)
    _gauge_sum: dict[str, float] = field(default_factory=dict)
    _gauge_n: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)  # removals in flight (a reference keeps them)
    _pending: dict[str, list[tuple[asyncio.Task[None], float]]] = field(
        default_factory=lambda: {"prefill": [], "decode": []})

    async def __call__(self, cluster: TwinCluster) -> None:
        self.cluster = cluster
        self._snapshot(cluster)
        while self.until_s is None or cluster.now + self.interval_s <= self.until_s + 1e-9:
            # gauges are averaged over the interval (as a PromQL avg_over_time would), from the router's scrapes
            self._gauge_sum, self._gauge_n = {}, 0
            steps = max(1, round(self.interval_s / GAUGE_EVERY_S))
            for _ in range(steps):
                await asyncio.sleep(self.interval_s / steps)
                self._sample_gauges(cluster)
            obs, signals = self.observe(cluster)
            decisions = self.policy(obs, signals)
            self.samples.append({"t": round(cluster.now, 3), "ready": self._ready(cluster), "load": obs.load,
                                 "desired": {n: self._desired(cluster, n) for n in ("prefill", "decode")}})
            for name in ("prefill", "decode"):
                d = decisions.get(name)
                if d is not None:
                    self.apply(cluster, name, d)
            if self.roles is not None:
                self.move_roles(cluster, self.roles())

    # ----------------------------------------------------------------------------------------------- scrape
    def _sample_gauges(self, cluster: TwinCluster) -> None:
        for w in cluster.workers.values():
            if w.role in ("prefill", "decode") and w.url not in self._leaving:
                for k in GAUGES:
                    key = f"{w.role}:{k}"
                    self._gauge_sum[key] = self._gauge_sum.get(key, 0.0) + float(w.rw.scraped.get(k, 0.0))
        self._gauge_n += 1

    def _snapshot(self, cluster: TwinCluster) -> None:
        self._prev = {w.url: w.scrape() for w in cluster.workers.values()}
        self._prev_router = _router_counters(cluster)

    def _ready(self, cluster: TwinCluster) -> dict[str, int]:
        return {n: sum(1 for w in cluster.pool(n) if w.url not in self._leaving) for n in ("prefill", "decode")}

    def _desired(self, cluster: TwinCluster, name: str) -> int:
        serving = [w for w in cluster.pool(name) if w.url not in self._leaving]
        return len(serving) + len(self._pending[name])

    async def _remove(self, cluster: TwinCluster, url: str) -> None:
        try:
            await cluster.remove_worker(url)
        finally:
            self._leaving.discard(url)

    def observe(self, cluster: TwinCluster) -> tuple[Observation, Signals]:
        now, dt = cluster.now, self.interval_s
        cur = {w.url: w.scrape() for w in cluster.workers.values()}
        delta: dict[str, dict[str, float]] = {"prefill": {}, "decode": {}}
        gauges: dict[str, dict[str, float]] = {"prefill": {}, "decode": {}}
        n = max(1, self._gauge_n)
        for key, total in self._gauge_sum.items():
            role, k = key.split(":", 1)
            gauges[role][k] = total / n
        for w in cluster.workers.values():
            if w.role not in delta:
                continue
            prev = self._prev.get(w.url)
            if prev is None or w.started_at > now - dt:  # joined during the interval: warming, no latency sample
                continue
            acc = delta[w.role]
            for k, v in cur[w.url].items():
                if k.endswith(("_sum", "_count")):
                    acc[k] = acc.get(k, 0.0) + float(v) - float(prev.get(k, 0.0))
        self._prev = cur
        router = _router_counters(cluster)
        routed = {k: v - self._prev_router.get(k, 0.0) for k, v in router.items()}
        self._prev_router = router
        ready = self._ready(cluster)
        desired = {n: self._desired(cluster, n) for n in ("prefill", "decode")}
        p, d = delta["prefill"], delta["decode"]
        running = gauges["decode"].get("vllm:num_requests_running", 0.0)
        last = self.samples[-1]["load"] if self.samples and self.samples[-1]["load"] else None
        waiting = sum(float(w.rw.scraped.get("vllm:num_requests_waiting", 0.0)) for w in cluster.pool("prefill")
                      if w.url not in self._leaving)
        obs = observation(now, dt, p, d, routed, running, ready, desired, last, waiting)
        qwait = _mean(p, "vllm:request_queue_time_seconds")
        ttft, tpot = obs.remote_ttft_s, obs.tpot_s
        np_, nd = max(1, ready["prefill"]), max(1, ready["decode"])
        signals = Signals(
            time=now, stale_reason=obs.stale_reason,
            prefill=PoolSignals(desired["prefill"], ready["prefill"],
                                queue_wait_p95_ms=None if qwait is None else qwait * P95_OF_MEAN_WAIT * 1000,
                                ttft_p95_ms=None if ttft is None or qwait is None else
                                (ttft + (P95_OF_MEAN_WAIT - 1) * qwait) * 1000,
                                waiting_per_replica=gauges["prefill"].get("vllm:num_requests_waiting", 0.0) / np_
                                if ready["prefill"] else None,
                                # as queries.py prefill_deflected_share: deflections ÷ the pool's demand
                                deflected_share=routed["deflections"] / routed["prefill_count"]
                                if routed["prefill_count"] > 0 else None),
            decode=PoolSignals(desired["decode"], ready["decode"],
                               tpot_p95_ms=None if tpot is None else tpot * 1000,
                               running_per_replica=running / nd,
                               kv_cache_usage=gauges["decode"].get("vllm:kv_cache_usage_perc", 0.0) / nd))
        return obs, signals

    # ------------------------------------------------------------------------------------------------ apply
    def apply(self, cluster: TwinCluster, name: str, d: Decision) -> None:
        before = self._desired(cluster, name)
        target = d.desired
        if name == "decode":
            target = max(1, target)  # the twin needs a decode worker (and minReplicas ≥ 1 in the bench)
        if target == before:
            return
        if target > before:
            for _ in range(target - before):
                task = asyncio.create_task(self._start(cluster, name))
                self._pending[name].append((task, cluster.now))
        else:
            for _ in range(before - target):
                if self._pending[name]:
                    task, t0 = self._pending[name].pop()
                    task.cancel()
                    self.starting_gpu_s += self._gpus(cluster, name) * (cluster.now - t0)
                    continue
                ws = [w for w in cluster.pool(name) if not w.crashed and w.url not in self._leaving]
                if len(ws) <= 1:
                    break
                victim = min(ws, key=lambda w: (w.rw.inflight,
                                                len(w.engine.sched.running) + len(w.engine.sched.waiting), w.url))
                self._leaving.add(victim.url)
                self._tasks.add(asyncio.create_task(self._remove(cluster, victim.url)))
        self.timeline.append(Event(round(cluster.now, 3), name, before, self._desired(cluster, name),
                                   len(cluster.pool(name)), d.reason))

    def move_roles(self, cluster: TwinCluster, m: RoleMoves) -> None:
        """Lend workers to the other role (the router's WorkerSet.lend, through its config) when the moves change;
        each change goes on :attr:`role_moves` (pool ``prefill→decode`` / ``decode→prefill``: workers lent)."""
        cur = cluster.config.role_moves or RoleMoves()
        if (cur.prefill_to_decode, cur.decode_to_prefill) == (m.prefill_to_decode, m.decode_to_prefill):
            return
        cluster.move_roles(m if m.lent else None)
        ready = self._ready(cluster)
        for pool, before, after, lender in (("prefill→decode", cur.prefill_to_decode, m.prefill_to_decode, "prefill"),
                                            ("decode→prefill", cur.decode_to_prefill, m.decode_to_prefill, "decode")):
            if before != after:
                self.role_moves.append(Event(round(cluster.now, 3), pool, before, after, ready[lender],
                                             m.reason or "returned: the short pool's own workers suffice"))

    def _gpus(self, cluster: TwinCluster, name: str) -> int:
        pool = cluster.spec.pools().get(name)
        return pool.tp if pool is not None else 1

    async def _start(self, cluster: TwinCluster, name: str) -> None:
        t0 = cluster.now
        await asyncio.sleep(self.start_s)
        self.starting_gpu_s += self._gpus(cluster, name) * (cluster.now - t0)
        self._pending[name] = [(t, s) for t, s in self._pending[name] if t is not asyncio.current_task()]
        await cluster.add_worker(name)


def _router_counters(cluster: TwinCluster) -> dict[str, float]:
    """The router's demand histogram (``disagg_routed_prompt_tokens``: sum and count per pool) and its deflection
    counter, as the operator's Prometheus reads them (autoscaling/observe.py, queries.py)."""
    reg = cluster.core.metrics.registry
    out = {key: reg.get_sample_value(f"{ROUTED}_{part}", {"pool": pool}) or 0.0 for key, pool, part in ROUTED_KEYS}
    out["deflections"] = reg.get_sample_value("disagg_prefill_deflections_total") or 0.0
    return out

"""``simulate``: one twin run → per-request records, goodput at an SLO, GPU-seconds, per-pool utilisation.

Latencies follow load/loadgen.py (what a client measures, in simulated seconds): TTFT from arrival to the first
token (for a non-streamed request, to the whole answer), TPOT = (last − first token) ÷ (tokens − 1) for streams.
Goodput is loadgen's definition, reused (``loadgen.Result.meets`` / ``loadgen.summarise``): a request meets the SLO
when it succeeded, its TTFT ≤ the TTFT SLO and its TPOT (if any) ≤ the TPOT SLO; ``goodput_rps`` is the number of
such requests ÷ the arrival window; ``attainment`` their share.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..load import loadgen
from .arrivals import Arrival, check_sorted
from .clock import VirtualTimeLoop, run_virtual
from .cluster import Outcome, TwinCluster
from .spec import ClusterSpec

Controller = Callable[[TwinCluster], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class SLO:
    ttft_ms: float = 1000.0
    tpot_ms: float = 50.0

    def __post_init__(self) -> None:
        if self.ttft_ms <= 0 or self.tpot_ms <= 0:
            raise ValueError(f"slo: ttft_ms and tpot_ms must be > 0, got {self.ttft_ms}, {self.tpot_ms}")


@dataclass(frozen=True)
class RequestRecord:
    request_id: str
    cls: str
    tenant: str  # the router's tenant ("default" when no TenantPolicy matched)
    arrival_s: float
    decision: str  # remote | local | reject
    reason: str  # the policy's reason (policy.py)
    path: str  # remote | local | fallback | none
    fallback: str | None  # the fallback cause (router/paths.py names), when there was one
    status: int  # 200 ok; 429/503 rejected; 5xx failed; 0 unfinished
    error: str
    input_tokens: int  # as the engine counts them
    router_input_tokens: int  # the router's estimate (features.count_input_tokens)
    output_tokens: int
    cached_tokens: int  # prompt tokens served from the serving engine's prefix cache
    prefill_worker: str | None
    decode_worker: str | None
    ttft_s: float | None
    tpot_s: float | None
    itl_max_s: float | None
    e2e_s: float | None
    prefill_leg_s: float | None
    kv_transfer_s: float | None
    # the SLO placement's prediction for the chosen placement (None under the Thresholds policy or a forced rule)
    placement: str | None = None
    predicted_ttft_s: float | None = None
    predicted_tpot_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error

    def as_result(self) -> loadgen.Result:
        """The load generator's view of this request (its goodput definition is the one place)."""
        return loadgen.Result(id=self.request_id, cls=self.cls, tenant=self.tenant, input_tokens=self.input_tokens,
                              status=self.status, error=self.error, ttft_s=self.ttft_s, tpot_s=self.tpot_s,
                              e2e_s=self.e2e_s, output_tokens=self.output_tokens, decision=self.decision,
                              reason=self.reason, path=self.path)

    def meets(self, slo: SLO) -> bool:
        return self.as_result().meets(slo.ttft_ms / 1000.0, slo.tpot_ms / 1000.0)


@dataclass(frozen=True)
class PoolStats:
    workers: int
    gpus: int
    busy_s: float  # simulated seconds the pool's engines spent in steps (sum over workers)
    utilisation: float  # busy_s ÷ the workers' seconds in service
    steps: int
    requests: int  # requests (legs) the pool's engines served


@dataclass
class TwinResult:
    records: list[RequestRecord]
    slo: SLO
    window_s: float  # the arrival window: the last arrival's time (or the requested duration, if longer)
    makespan_s: float  # virtual time when the last request ended
    gpu_seconds: float  # Σ GPUs × time in service (start or add_worker → makespan or remove_worker's drain end)
    pools: dict[str, PoolStats]
    decisions: dict[str, int]  # "decision:reason" → count
    seed: int
    wall_s: float  # wall seconds the run took
    events: int  # virtual-time advances of the loop (distinct event times)
    engine_steps: int
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def results(self) -> list[loadgen.Result]:
        return [r.as_result() for r in self.records]

    @property
    def met(self) -> int:
        return sum(r.meets(self.slo) for r in self.records)

    @property
    def attainment(self) -> float:
        return self.met / len(self.records) if self.records else 0.0

    @property
    def goodput_rps(self) -> float:
        return self.met / self.window_s if self.window_s > 0 else 0.0

    def summary(self) -> loadgen.Summary:
        return loadgen.summarise(self.results, self.slo.ttft_ms, self.slo.tpot_ms)

    def at_slo(self, slo: SLO) -> dict[str, float]:
        n = sum(r.meets(slo) for r in self.records)
        return {"attainment": round(n / len(self.records), 4) if self.records else 0.0,
                "goodput_rps": round(n / self.window_s, 4) if self.window_s > 0 else 0.0}

    def to_dict(self, records: bool = False) -> dict[str, Any]:
        s = self.summary()
        out: dict[str, Any] = {
            "requests": s.requests, "errors": s.errors, "slo": asdict(self.slo),
            "attainment": round(self.attainment, 4), "goodput_rps": round(self.goodput_rps, 4),
            "ttft_p50_ms": s.ttft_p50_ms, "ttft_p95_ms": s.ttft_p95_ms,
            "tpot_p50_ms": s.tpot_p50_ms, "tpot_p95_ms": s.tpot_p95_ms,
            "decisions": dict(sorted(self.decisions.items())),
            "paths": _count(r.path for r in self.records),
            "window_s": round(self.window_s, 3), "makespan_s": round(self.makespan_s, 3),
            "gpu_seconds": round(self.gpu_seconds, 1),
            "pools": {k: {**asdict(v), "busy_s": round(v.busy_s, 3), "utilisation": round(v.utilisation, 4)}
                      for k, v in self.pools.items()},
            "seed": self.seed, "wall_s": round(self.wall_s, 3), "events": self.events,
            "engine_steps": self.engine_steps, **self.meta,
        }
        if records:
            out["records"] = [asdict(r) for r in self.records]
        return out


def _count(xs: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items()))


def _record(o: Outcome) -> RequestRecord:
    p, a, d = o.prepared, o.prepared.arrival, o.decision
    pred = d.detail.get("prediction") if d else None
    arrival = o.sent
    ttft = tpot = None
    if o.status == 200 and o.first is not None:
        if a.stream:
            ttft = o.first - arrival
            if o.tokens > 1 and o.last is not None:
                tpot = (o.last - o.first) / (o.tokens - 1)
        else:  # loadgen: a whole answer arrives at once
            ttft = (o.end if o.end is not None else o.first) - arrival
    return RequestRecord(
        request_id=p.request_id, cls=a.cls, tenant=d.tenant if d else "default", arrival_s=arrival,
        decision=d.decision if d else "", reason=d.reason if d else "", path=o.path, fallback=o.fallback,
        status=o.status, error=o.error, input_tokens=len(p.prompt_ids), router_input_tokens=p.router_input_tokens,
        output_tokens=o.tokens, cached_tokens=o.cached_tokens, prefill_worker=o.prefill_worker,
        decode_worker=o.decode_worker, ttft_s=ttft, tpot_s=tpot,
        itl_max_s=o.itl_max if o.tokens > 1 and a.stream else None,
        e2e_s=(o.end - arrival) if o.end is not None and o.status == 200 else None,
        prefill_leg_s=o.prefill_leg_s, kv_transfer_s=o.kv_transfer_s,
        placement=pred.placement if pred else None, predicted_ttft_s=pred.ttft_s if pred else None,
        predicted_tpot_s=pred.tpot_s if pred else None)


def simulate(spec: ClusterSpec, arrivals: Sequence[Arrival], *, seed: int = 0, slo: SLO | None = None,
             window_s: float | None = None, controller: Controller | None = None,
             fast_forward: bool = True) -> TwinResult:
    """Run ``arrivals`` (sorted by time) through a fresh :class:`TwinCluster` in virtual time.

    Deterministic: the same spec, arrivals and seed give identical records, whatever the machine does.
    ``window_s``: the arrival window goodput is divided by (default: the last arrival's time).
    ``controller``: ``async def f(cluster)`` run beside the traffic (scale with ``cluster.add_worker`` /
    ``remove_worker``, reconfigure with ``set_config``, sleeping in virtual time with ``asyncio.sleep``).
    ``fast_forward`` False: the step-by-step reference path (same records, slower; see ``TwinCluster``)."""
    spec.validate()
    check_sorted(arrivals)
    slo = slo or SLO()
    stats: dict[str, Any] = {}

    async def main() -> list[Outcome]:
        cluster = TwinCluster(spec, seed=seed, fast_forward=fast_forward)
        outcomes = await cluster.run(arrivals, controller=controller)
        loop = asyncio_loop()
        stats["makespan"] = max([o.end for o in outcomes if o.end is not None], default=0.0)
        stats["decisions"] = dict(cluster.decisions)
        pools: dict[str, PoolStats] = {}
        span = stats["makespan"]
        gpu_s = 0.0
        for role in ("prefill", "decode", "aggregated"):
            ws = [*cluster.pool(role), *(w for w in cluster.retired if w.role == role)]
            if not ws:
                continue
            gpu_s += sum(w.gpu_seconds(span) for w in ws)
            busy = sum(w.engine.busy_s for w in ws)
            served = sum(int(w.scrape().get("vllm:request_prompt_tokens_count", 0)) for w in ws)
            pools[role] = PoolStats(workers=len(ws), gpus=sum(w.gpus for w in ws), busy_s=busy,
                                    utilisation=busy / service if (service := sum(
                                        w.gpu_seconds(span) / w.gpus for w in ws)) > 0 else 0.0,
                                    steps=sum(w.engine.steps for w in ws), requests=served)
        stats["pools"] = pools
        stats["gpu_seconds"] = gpu_s
        stats["events"] = loop.advances if isinstance(loop, VirtualTimeLoop) else 0
        # the records while the run's collector setting holds (clock.py few_collections): after it, the first
        # collections scan every object the run left alive
        stats["records"] = [_record(o) for o in outcomes]
        return outcomes

    t0 = time.perf_counter()
    run_virtual(main())
    wall = time.perf_counter() - t0
    records: list[RequestRecord] = stats["records"]
    pools = stats["pools"]
    window = max(window_s or 0.0, arrivals[-1].at if arrivals else 0.0)
    return TwinResult(records=records, slo=slo, window_s=window, makespan_s=stats["makespan"],
                      gpu_seconds=stats["gpu_seconds"], pools=pools,
                      decisions=stats["decisions"], seed=seed, wall_s=wall, events=stats["events"],
                      engine_steps=sum(p.steps for p in pools.values()))


def asyncio_loop() -> Any:
    import asyncio

    return asyncio.get_running_loop()

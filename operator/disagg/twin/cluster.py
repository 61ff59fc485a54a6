"""TwinCluster: simulated engines (sim/engine.py) and the router's request core (router/core.py) in virtual time.

Every worker is a real :class:`~disagg.sim.engine.Engine` built from a ``SimConfig`` that sim/config.py parses
from the same flags ``disagg sim`` takes; its clock reads the virtual loop (clock.py). The KV hand-off between a
prefill and a decode engine goes through :class:`LocalKVLink` (the decode engine's ``kv_client``): the NIXL side
channel's read → modelled transfer time → notification, as method calls instead of TCP.

Requests go through the router's own request core (router/core.py ``RequestCore``: the load snapshot, the decision
and mode probe, admission under overload (its queue waits on virtual time), the circuit breakers, remote → fallback
→ the one local retry, the in-flight counts, the prefill backlog clock and the prefix index) over engine legs
(legs.py ``EngineLegs``) instead of HTTP legs: one copy of the orchestration, so a benchmark here measures what
ships. Scrapes run every ``scrape_interval_s`` of virtual time, so the snapshot is as stale as the real router's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..api.contract import EngineProfile, PoolEndpoint, RouterConfig
from ..api.spec import priority_scheduling
from ..api.status import RoleMoves
from ..autoscaling.observe import HISTOGRAMS as OBSERVED
from ..router import features
from ..router.core import RequestCore
from ..router.kvindex import sink_for
from ..router.load import GAUGES, HISTOGRAMS, Worker, WorkerSet
from ..router.metrics import RouterMetrics
from ..router.policy_types import Decision
from ..router.request import Ctx
from ..sim import config as sim_config
from ..sim.clock import SimClock
from ..sim.engine import Engine, ReqCtx, make_request
from ..sim.metrics import PER_STEP
from ..sim.nixl import PullOutcome, block_ids
from ..sim.scheduler import Request
from .arrivals import Arrival, Prepared, prepare
from .clock import VirtualTimeLoop
from .legs import EngineLegs
from .spec import ROLES, ClusterSpec, PoolSpec


class LocalKVLink:
    """The decode engine's NIXL client, in-process: handshake (compat; its time: engine.py ``_handshake_wait``), read
    the held blocks, sleep out ``PerfModel.transfer_time`` (the engine's ``wait_modelled``), notify (frees the
    prefill blocks)."""

    def __init__(self, compat: str, producers: Mapping[str, Engine]) -> None:
        self.compat = compat
        self.producers = producers

    def _producer(self, params: Mapping[str, Any]) -> Engine | None:
        return self.producers.get(str(params.get("remote_engine_id")))

    async def pull(self, params: dict[str, Any], request_id: str,
                   wait_modelled: Callable[[PullOutcome], Any]) -> PullOutcome:
        prod = self._producer(params)
        if prod is None:
            return PullOutcome(False, f"side channel of engine {params.get('remote_engine_id')} unreachable")
        if prod.compat != self.compat:
            return PullOutcome(False, f"NIXL handshake refused: compat hash {self.compat} != {prod.compat}")
        ok, err, tokens, kv_bytes = prod.serve_read(request_id, block_ids(params))
        if not ok:
            return PullOutcome(False, f"NIXL read failed: {err}")
        out = PullOutcome(True, "", tokens, kv_bytes, 0)
        await wait_modelled(out)
        prod.serve_release(request_id)
        return out

    async def notify_only(self, params: dict[str, Any], request_id: str) -> bool:
        prod = self._producer(params)
        return prod.serve_release(request_id) if prod is not None else False


@dataclass
class Leg:
    """One request on one engine, fed by the engine's token sink (no queue, no task per token)."""

    req: Request
    engine: Engine
    worker: TwinWorker
    first: float | None = None
    last: float | None = None
    tokens: int = 0
    itl_max: float = 0.0
    reason: str | None = None
    done: asyncio.Future[None] | None = None
    first_token: asyncio.Future[None] | None = None

    def sink_run(self, tokens: int, first: float, last: float, gap: float) -> None:
        """A fast-forwarded run of decode tokens (the engine's ``ReqCtx.sink_run``): as many ``sink`` calls."""
        if self.last is not None:
            gap = max(gap, first - self.last)
        if gap > self.itl_max:
            self.itl_max = gap
        self.last = last
        self.tokens = tokens

    def sink(self, kind: str, value: Any, now: float) -> None:
        if kind == "token":
            if self.first is None:
                self.first = now
                if self.first_token is not None and not self.first_token.done():
                    self.first_token.set_result(None)
            elif self.last is not None:
                self.itl_max = max(self.itl_max, now - self.last)
            self.last = now
            self.tokens = int(value)
            return
        self.reason = str(value)
        if self.first_token is not None and not self.first_token.done():
            self.first_token.set_result(None)
        if self.done is not None and not self.done.done():
            self.done.set_result(None)


@dataclass
class TwinWorker:
    """A worker: its engine, the router's view of it (router/load.py Worker), and what a scrape would read."""

    url: str
    role: str
    engine: Engine
    gpus: int
    rw: Worker
    started_at: float = 0.0  # virtual time it joined the cluster
    stopped_at: float | None = None  # virtual time it left (remove_worker), None while in service
    crashed: bool = False  # an injected crash: refuses connections from then on

    def gpu_seconds(self, end: float) -> float:
        return self.gpus * max(0.0, (self.stopped_at if self.stopped_at is not None else end) - self.started_at)

    def scrape(self) -> dict[str, float]:
        """What the router's scrape of this worker reads: the engine's own series (a recording view of the
        families the router reads, ``SCRAPED``), brought up to now."""
        self.engine.sync()
        self.engine.write_gauges()
        return self.engine.metrics.scraped()


# The families the router's scrape reads (router/load.py) and the autoscaler's observation reads
# (autoscaling/observe.py HISTOGRAMS: the prefill pool's TTFT, the remote TTFT's largest part) that the engine
# records per request, per transfer or as gauges; vllm:time_per_output_token_seconds is observed per token
# (sim/metrics.py PER_STEP) and is left out, as a decode fast-forward skips those observations.
SCRAPED = frozenset(GAUGES + HISTOGRAMS + tuple(family for _, family in OBSERVED)) - PER_STEP


@dataclass
class Outcome:
    """What happened to one request (run.py turns it into a RequestRecord)."""

    prepared: Prepared
    decision: Decision | None = None
    path: str = "none"  # remote | local | fallback | none
    fallback: str | None = None
    status: int = 0
    error: str = ""
    prefill_worker: str | None = None
    decode_worker: str | None = None
    sent: float = 0.0
    first: float | None = None
    last: float | None = None
    end: float | None = None
    tokens: int = 0
    itl_max: float = 0.0
    prefill_leg_s: float | None = None
    kv_transfer_s: float | None = None
    cached_tokens: int = 0


class TwinCluster:
    """The engines and the router shim. Construct and :meth:`run` inside a virtual loop (clock.run_virtual);
    :func:`disagg.twin.simulate` does both."""

    def __init__(self, spec: ClusterSpec, *, seed: int = 0, fast_forward: bool = True) -> None:
        """``fast_forward`` False: every engine step waits on a loop timer (the reference path the fast one is
        tested against; identical results, slower)."""
        spec.validate()
        self.spec = spec
        self.seed = seed
        self.config = spec.router_config()
        self.tuning = spec.tuning
        self.loop = asyncio.get_running_loop()
        adv = self.loop.advance if fast_forward and isinstance(self.loop, VirtualTimeLoop) else None
        self.clock = SimClock(1.0, timer=self.loop.time, advance=adv)
        self.workers: dict[str, TwinWorker] = {}
        self.ws = WorkerSet(clock=self.loop.time)
        # the router's own request core (router/core.py): snapshot, decision, probes, breakers, paths, fallbacks
        self.core: RequestCore[None] = RequestCore(self.ws, RouterMetrics(), self.tuning, clock=self.loop.time)
        self.decisions: dict[str, int] = {}
        self.producers: dict[str, Engine] = {}
        self.retired: list[TwinWorker] = []  # removed workers (GPU-seconds up to their removal)
        self._index = 0
        self._started = False
        self.profiles: dict[str, EngineProfile] = {}
        for role, pool in spec.pools().items():
            for _ in range(pool.count):
                self._build(role, pool)
        self.config = self._with_profiles(self.config)

    def _build(self, role: str, pool: PoolSpec) -> TwinWorker:
        n = sum(1 for w in [*self.workers.values(), *self.retired] if w.role == role)
        url = f"{role}-{n}"
        argv = [*pool.argv(self.spec.model), "--time-scale", "1", "--seed", str(self.seed * 100_003 + self._index),
                "--kv-transport", self.spec.transport]
        if priority_scheduling(self.config.routing):  # as the operator renders it (builders/workers.py)
            argv += ["--scheduling-policy", "priority"]
        if role in ("prefill", "decode"):
            argv += ["--kv-transfer-config", json.dumps({
                "kv_connector": "NixlConnector", "engine_id": url,
                "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
                "kv_load_failure_policy": self.spec.kv_load_failure_policy})]
        cfg = _parse_sim(argv, f"{role} pool")
        # what the operator writes into the router config for the SLO placement (builders/router.py)
        self.profiles.setdefault(role, EngineProfile(
            gpu=cfg.gpu.name, model=cfg.model_preset.name, tensor_parallel_size=cfg.tp,
            pipeline_parallel_size=cfg.pp, max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_num_seqs=cfg.max_num_seqs, block_size=cfg.block_size,
            gpu_memory_utilization=cfg.gpu_memory_utilization, transport=cfg.transport.name))
        if cfg.dp != 1:
            raise ValueError(f"{role}.extra_args: --data-parallel-size is not modelled by the twin; use count instead")
        # every KV-connected engine can take either leg (a role move lends it to the other role: WorkerSet.lend)
        link = LocalKVLink("", self.producers) if role in ("prefill", "decode") else None
        eng = Engine(cfg, clock=self.clock, kv_client=link, side_channel=False, record=SCRAPED)
        # the engine's KV cache events straight into the router core's index (issue 30), as a subscriber would
        eng.enable_kv_events(sink_for(self.core.kv, url), clock=self.loop.time)
        if link is not None:
            link.compat = eng.compat
        if link is not None:
            self.producers[url] = eng
        compat = eng.compat if role != "aggregated" else ""
        w = TwinWorker(url, role, eng, cfg.tp * cfg.pp, Worker(url=url, role=role, compat=compat),
                       started_at=self.now)
        self.workers[url] = w
        self._index += 1
        self._sync_pool(role)
        return w

    def _sync_pool(self, role: str) -> None:
        """The router's WorkerSet follows the workers (as discovery does); a worker keeps its router-side stats."""
        self.ws.set_pool(role, [(w.url, w.rw.compat) for w in self.workers.values() if w.role == role])
        for url, rw in self.ws.pools[role].items():
            self.workers[url].rw = rw

    # ------------------------------------------------------------------------------------ lifecycle
    @property
    def now(self) -> float:
        return self.loop.time()

    def pool(self, role: str) -> list[TwinWorker]:
        return [w for w in self.workers.values() if w.role == role]

    def set_faults(self, url: str, faults: Mapping[str, Any]) -> None:
        """Change a worker's injected faults, as ``POST /sim/faults`` does on a ``disagg sim`` (all or nothing;
        a bad field is named)."""
        w = self.workers.get(url)
        if w is None:
            raise ValueError(f"url: no worker {url!r}")
        w.engine.cfg.faults.update(dict(faults))

    def set_config(self, cfg: RouterConfig) -> None:
        """Swap the router's config (a ConfigMap reload): requests decided from now on use it."""
        self.config = self._with_profiles(cfg)

    def move_roles(self, moves: RoleMoves | None) -> None:
        """Role moves (issue 28): as the operator writes ``status.roleMoves`` into the router's config, which the
        router core applies to its WorkerSet (``WorkerSet.lend``) on the next request."""
        self.set_config(self.config.model_copy(update={"role_moves": moves}))

    def _with_profiles(self, cfg: RouterConfig) -> RouterConfig:
        """The config with each pool's engine profile where it names none (as the operator renders it)."""
        pools = {}
        for role, prof in self.profiles.items():
            ep = getattr(cfg.pools, role)
            if ep is None:
                ep = PoolEndpoint(service=role)
            if ep.engine is None:
                ep = ep.model_copy(update={"engine": prof})
            pools[role] = ep
        return cfg.model_copy(update={"pools": cfg.pools.model_copy(update=pools)})

    async def add_worker(self, role: str, pool: PoolSpec | None = None) -> str:
        """Scale up: a new ready worker of ``role`` (like the pool's, or ``pool``), counted from now; its URL."""
        if role not in ROLES:
            raise ValueError(f"role: one of {', '.join(ROLES)}, got {role!r}")
        pool = pool or self.spec.pools().get(role) or PoolSpec(1)
        w = self._build(role, pool)
        if self._started:
            await w.engine.start()
        return w.url

    async def remove_worker(self, url: str) -> None:
        """Scale down: the router stops sending to ``url`` at once (discovery drops it); requests on it finish
        (a drain), then its engine stops. Its GPU-seconds count until the drain ends."""
        w = self.workers.pop(url, None)
        if w is None:
            raise ValueError(f"url: no worker {url!r}")
        self._sync_pool(w.role)  # the router core forgets its prefix estimate (WorkerSet.removed)
        self.core.kv.forget(url)
        while w.engine.busy or w.engine.sched.held or w.rw.inflight:
            await asyncio.sleep(self.spec.scrape_interval_s / 10)
        w.stopped_at = self.now
        self.producers.pop(url, None)
        self.retired.append(w)
        await w.engine.stop()

    async def start(self) -> None:
        self._started = True
        for w in self.workers.values():
            await w.engine.start()

    async def stop(self) -> None:
        for w in self.workers.values():
            await w.engine.stop()

    def scrape_all(self) -> None:
        for w in self.workers.values():
            if w.crashed:  # connection refused: marked down until it scrapes again (router/scrape.py)
                w.rw.down_until = self.now + self.core.down_seconds
            else:
                w.rw.update_scrape(w.scrape(), self.now)

    async def _scraper(self) -> None:
        while True:
            self.scrape_all()
            await asyncio.sleep(self.spec.scrape_interval_s)

    async def run(self, arrivals: Sequence[Arrival], vocab: int | None = None,
                  controller: Callable[[TwinCluster], Coroutine[Any, Any, None]] | None = None) -> list[Outcome]:
        """Replay ``arrivals`` (sorted by ``at``) and wait for every request to end (or the drain limit).

        ``controller``: a coroutine run beside the traffic (an autoscaler's loop calling :meth:`add_worker` /
        :meth:`remove_worker` / :meth:`set_config` at virtual times of its choosing); cancelled at the end."""
        vocab = vocab or next(iter(self.workers.values())).engine.cfg.model_preset.vocab
        await self.start()
        scraper = asyncio.create_task(self._scraper(), name="twin-scraper")
        ctl = asyncio.create_task(controller(self), name="twin-controller") if controller is not None else None
        outcomes: list[Outcome] = []
        tasks: list[asyncio.Task[None]] = []
        t0 = self.now
        try:
            for i, a in enumerate(arrivals):
                p = prepare(a, i, vocab)
                o = Outcome(p)
                outcomes.append(o)
                delay = t0 + a.at - self.now
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(self._request(o)))
            last = t0 + (arrivals[-1].at if arrivals else 0.0)
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=max(0.0, last + self.spec.drain_s - self.now))
                for t in pending:
                    t.cancel()
                if pending:
                    await asyncio.wait(pending)
                    for o in outcomes:
                        if o.end is None:
                            o.status = 0
                            o.error = o.error or f"unfinished after the drain limit ({self.spec.drain_s} s)"
        finally:
            scraper.cancel()
            if ctl is not None:
                ctl.cancel()
                await asyncio.gather(ctl, return_exceptions=True)
            await self.stop()
        if ctl is not None and ctl.done() and not ctl.cancelled() and ctl.exception() is not None:
            raise RuntimeError("the twin's controller failed") from ctl.exception()
        return outcomes

    # ------------------------------------------------------------------------------------ one request
    async def _request(self, o: Outcome) -> None:
        try:
            await self._serve(o)
        finally:
            if o.end is None and not o.error and o.status:
                o.end = self.now

    async def _serve(self, o: Outcome) -> None:
        """router/server.py ``_handle`` minus HTTP: the same request core decides and serves, over engine legs."""
        p, a, cfg = o.prepared, o.prepared.arrival, self.config
        o.sent = self.now
        ctx = Ctx(request_id=p.request_id, endpoint=a.endpoint, stream=a.stream, t0=o.sent)
        v = features.prompt_view(a.endpoint, dict(a.body)) if a.body is not None else None
        # as router/server.py: a text estimate takes the scale learned from the engines' counts
        self.core.count_prompt(ctx, p.router_input_tokens, text_estimate=v is not None and v.token_ids is None)
        if v is not None and v.token_ids is not None:
            ctx.token_ids = v.token_ids  # as router/server.py: the prompt's token ids key the event index
            ctx.token_keys[features.PREFIX_BLOCK_TOKENS] = p.hashes
        tenant = features.tenant_named(a.tenant, cfg.routing.tenants)
        d, ticket = await self.core.admit(ctx, cfg, tenant.name if tenant else None, p.max_tokens, p.hashes)
        o.decision = d
        key = f"{d.decision}:{d.reason}"
        self.decisions[key] = self.decisions.get(key, 0) + 1
        if d.decision == "reject":
            o.status, o.error, o.end = d.status, d.reason, self.now
            return
        try:
            await self.core.serve(ctx, cfg, d, p.hashes, ticket, EngineLegs(self, o))
        finally:
            o.path, o.fallback = ctx.path or "none", ctx.fallback
            o.prefill_worker, o.decode_worker = ctx.prefill_worker, ctx.decode_worker

    def live(self, url: str) -> TwinWorker | None:
        """The worker at ``url`` if it can take a connection (not removed, not crashed)."""
        w = self.workers.get(url)
        return w if w is not None and not w.crashed else None

    def crash(self, w: TwinWorker) -> None:
        """An injected crash (``--fault-crash-after-requests``): the process is gone; every request on it ends
        (the router sees its connections reset) and it refuses connections from now on."""
        w.crashed = True
        s = w.engine.sched
        for req in [*s.running, *s.waiting]:
            w.engine.abort(req)

    def submit(self, url: str, p: Prepared, rid: str, max_tokens: int, kv: dict[str, Any] | None,
               want_first: bool = False, priority: int = 0, received: float | None = None) -> Leg:
        """One leg to worker ``url``'s engine, now; ``received``: when its API server took it (TTFT counts from
        there)."""
        w = self.workers[url]
        req = make_request(rid, list(p.prompt_ids), max_tokens, self.clock.now(), kv_params=kv, seed=0,
                           priority=priority, received=received,
                           hashes=p.block_hashes(w.engine.pool.block_size) if w.engine.pool.enable_caching else None)
        leg = Leg(req, w.engine, w, done=self.loop.create_future(),
                  first_token=self.loop.create_future() if want_first else None)
        req.ctx = ReqCtx(max_tokens_param=max_tokens, engine=w.engine, sink=leg.sink, sink_run=leg.sink_run)
        w.engine.submit(req)
        return leg


def _parse_sim(argv: list[str], where: str) -> sim_config.SimConfig:
    try:
        return sim_config.parse(argv, env={})
    except SystemExit as e:  # argparse: the message went to stderr; name the pool
        raise ValueError(f"{where}: invalid simulator flags {' '.join(argv[1:])} (see the error above)") from e


"""``disagg bench goodput``: aggregated vs always-disaggregated vs the conditional policy at equal GPU count, in the
discrete-event twin (virtual time, one process: disagg.twin), every deployment at its best.

For every workload mix (load/workload.py ``MIXES``) and every offered rate of the mix's ladder, the same Poisson
arrivals (one seed) go through each configuration of each deployment — all with the same number of simulated GPUs
(one worker per GPU) — and every run is scored at the three SLOs of :data:`SLOS`:

* (a) ``aggregated``: N workers, router mode Aggregated; swept over the chunked-prefill budget
  (``--max-num-batched-tokens``; vLLM's default on an H100 is 8192): a small budget bounds the decode stall a
  long prefill causes (TPOT), a large one finishes prefills sooner (TTFT).
* (b) ``disaggregated``: P prefill + D decode workers, P + D = N, every request remote (a bucket
  ``prefill: Remote`` for all prompts, prefill-queue overload → Queue); swept over P.
* (c) ``conditional``: the same pools with the router's per-request policy, swept over P. ``c-default`` is what
  ships: the CRD's defaults (``RoutingSpec()`` in api/spec.py, read at run time, never copied: the SLO placement
  policy), deployed *for the SLO it is scored at* — a user declares spec.slo, and both the router's placement and
  the pools' chunk budget (:func:`conditional_chunk_budget`) follow it — so each of its configurations runs
  once per SLO. ``c-thresholds`` is the rule ladder with the CRD's thresholds (``policy: Thresholds``) and
  ``c-tuned`` the ladder with :data:`CONDITIONAL_ROUTING`; both are deployed for the headline SLO only (the ladder
  ignores spec.slo; only their chunk budgets follow it).

Per (mix, rate, SLO) the best configuration of each deployment is reported (c = the shipped default alone: the
split is the only thing swept), with the ratios c/a and c/b and the targets of :data:`TARGETS`; per (mix, SLO) each
deployment's *knee*: the highest rate of the ladder at which its best configuration still keeps ≥ 90 % of requests
within the SLO. Goodput and attainment follow load/loadgen.py (the one definition, through disagg.twin): a request
counts when it succeeded with TTFT ≤ the SLO and TPOT ≤ the SLO; goodput = such requests ÷ the arrival window.

Deterministic for a seed (the twin runs in virtual time): the same command gives the same results on any machine,
under any load; only ``wall_s`` moves. The real-process run (sims + router on loopback, real time) stays as a
cross-check on a small case: ``disagg bench goodput --real`` (:mod:`.goodput_live`), and tests/twin/test_crosscheck.py
asserts the twin against real processes within the twin's stated tolerance.

Results: docs/results/goodput.json (the convention of disagg.bench.docs) and :func:`render_tables` (``summary``,
``knee``, ``sweep``, ``targets``).
"""

from __future__ import annotations

import copy
import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..api.contract import Role
from ..load.workload import ALL_MIXES, HELDOUT_MIXES, MIXES, longest_meetable_s
from ..local.procs import SIM_MODEL
from .goodput_tables import render_tables as render_tables  # bench/docs.py's registry reads it here
from .goodput_tables import twin_table as twin_table  # … and bench/cli.py

DEPLOYMENTS = ("aggregated", "disaggregated", "conditional")
LABEL = {"aggregated": "a", "disaggregated": "b", "conditional": "c"}

# The tuned conditional policy (c-tuned): the RouterConfig `routing` used for (c) next to the CRD's defaults.
CONDITIONAL_ROUTING: dict[str, Any] = {
    "remotePrefill": {"minInputTokens": 2048, "maxPrefillQueueWaitMs": 150, "minExpectedOutputTokens": 64,
                      "requireDecodePoolPressure": False},
    "localPrefill": {"maxInputTokens": 1024, "preferWhenPrefixCacheHit": True},
    "fallback": {"onKVTransferTimeout": "LocalAggregated", "onPrefillQueueOverload": "LocalPrefill"},
}
# (b): every prompt remote, even when the prefill queue is long (Queue rather than falling back to local).
ALWAYS_ROUTING: dict[str, Any] = {
    "buckets": [{"name": "all", "minInputTokens": 0, "prefill": "Remote"}],
    "fallback": {"onKVTransferTimeout": "LocalAggregated", "onPrefillQueueOverload": "Queue"},
}
# Above any prefill-queue wait of these runs: (b) never falls back on a timeout, so it stays always-remote.
TRANSFER_TIMEOUT_MS = 30_000

# ============================================================================================ the twin sweep
COMMAND = "disagg bench goodput"
RESULTS = Path("docs") / "results" / "goodput.json"
# the held-out mixes (load/workload.py HELDOUT_MIXES): their own results file and tables
HELDOUT_BENCHMARK = "goodput-heldout"
HELDOUT_COMMAND = "disagg bench goodput --heldout"
# the long-prompt mixes at cluster scale: their own results file and tables (16 GPUs: a run takes 1–45 s at 4–8 GPUs
# and 10–80 s here; a worker process of the sweep is replaced every TASKS_PER_CHILD runs, see sweep)
CLUSTER_BENCHMARK = "goodput-16gpu"
CLUSTER_COMMAND = "disagg bench goodput --name goodput-16gpu --gpus 16 --mixes long-rag mixed --jobs 2"
ATTAINMENT_KNEE = 0.90  # a deployment holds a rate when ≥ 90 % of its requests meet the SLO
VARIANTS = ("a", "b", "c-default", "c-thresholds", "c-tuned")
DEFAULT_VARIANTS = ("a", "b", "c-default", "c-thresholds")  # c-tuned: on request (per-cell tuning is not a default)
VARIANT_DEPLOYMENT = {"a": "aggregated", "b": "disaggregated", "c-default": "conditional",
                      "c-thresholds": "conditional", "c-tuned": "conditional"}
# what the summary compares: c = c-default (what ships); the ladders beside it, for users who keep Thresholds
FAMILIES = ("a", "b", "c", "c-thresholds", "c-tuned")
# the variants deployed for each SLO they are scored at (the policy reads spec.slo); the others for SLOS[0]
PER_SLO_VARIANTS = frozenset({"c-default"})


@dataclass(frozen=True)
class SLOSpec:
    ttft_ms: float
    tpot_ms: float

    @property
    def key(self) -> str:
        return f"{self.ttft_ms:g}/{self.tpot_ms:g}"


# 1000/50: the headline SLO (interactive); 1000/25: tight TPOT; 2000/100: the CRD's default spec.slo.
SLOS: tuple[SLOSpec, ...] = (SLOSpec(1000, 50), SLOSpec(1000, 25), SLOSpec(2000, 100))


def drain_s(slos: Sequence[SLOSpec] = SLOS) -> float:
    """How long after the last arrival a run keeps going: a request still unfinished then cannot meet any SLO
    (meeting one means finishing within TTFT + (tokens − 1) × TPOT of arrival), so stopping there changes no score
    — and spares simulating the backlog of an overloaded deployment (the twin's default drain is an hour)."""
    return max(longest_meetable_s(s.ttft_ms, s.tpot_ms) for s in slos) + 1.0
# The targets per SLO (issue 27, after issue 17): each compares the best configuration of each deployment at the
# same rate; the ones against max(a, b) count only the cells where the better baseline keeps ≥ 10 % attainment
# (past that, every deployment has collapsed and a ratio of near-zero goodputs says nothing).
NEVER_WORSE = "c ≥ 0.98 × max(a, b)"
TIGHT_LONG = "long prompts, tight TPOT: c ≥ 1.10 × max(a, b)"
TARGETS: dict[str, tuple[str, ...]] = {
    "1000/50": (NEVER_WORSE, "long-rag: c ≥ 2 × a"),
    "1000/25": (NEVER_WORSE, TIGHT_LONG),
    "2000/100": (NEVER_WORSE,),
}
BASELINE_FLOOR = 0.10  # the better baseline's attainment below which the max(a, b) targets are not scored
LONG_PROMPT_MIXES = frozenset({"long-rag", "summarise", "longdoc"})  # the tight-TPOT target's long prompts


@dataclass(frozen=True)
class SweepPlan:
    """One mix's sweep: the rate ladder in requests per simulated second *per GPU* (a run at N GPUs offers
    N × rate), and the simulated seconds of arrivals per run (None: the settings')."""

    mix: str
    rates_per_gpu: tuple[float, ...]
    duration_s: float | None = None
    note: str = ""


# Rate ladders per H100-SXM GPU, Llama-3.1-8B, chosen to bracket the best aggregated deployment's knee at
# 1000/50 ms in the twin at 4 GPUs (a first sweep: short-chat between 100 and 140 req/s per GPU; long-rag above
# 5.5 and mixed above 16 with a 2048-token chunk budget). Short-chat runs 6 simulated seconds (its requests last
# about a second; thousands of them per run).
SWEEP_PLANS: dict[str, SweepPlan] = {
    "short-chat": SweepPlan("short-chat", (100.0, 140.0), 6.0, "decode-bound: short prompts and answers"),
    "long-rag": SweepPlan("long-rag", (4.5, 6.0, 7.5), None, "prefill-heavy: 6-12k-token prompts, 4k shared prefix"),
    "mixed": SweepPlan("mixed", (13.0, 16.0, 20.0), None, "long RAG prompts next to chats and long streams"),
    # brackets at 4 GPUs (a first sweep, 1000/50 ms): code-completion's best aggregated deployment holds 20 req/s
    # per GPU (0.98) and collapses by 30 (0.14); shifting's holds 7 (1.00), 10 (0.91), not 13 (0.49)
    "code-completion": SweepPlan("code-completion", (16.0, 22.0, 28.0), 10.0,
                                 "prefill-bound: mid-length prompts, a few output tokens"),
    "shifting": SweepPlan("shifting", (7.0, 10.0, 13.0), None, "RAG-heavy, then chat-heavy halfway through"),
}
# The held-out mixes' ladders (`--heldout`), set from the mixes' token counts before any run (prompt tokens per
# second against a GPU's ~35k prefill tokens/s, streams against its KV space), not from a first sweep: each is meant
# to span the aggregated deployment's knee at 4 GPUs, and the tables say where it fell. Reasoning runs 30 s (its
# requests live 10–20 s).
HELDOUT_PLANS: dict[str, SweepPlan] = {
    "summarise": SweepPlan("summarise", (3.0, 4.5, 6.0), None, "prefill-bound: long prompts, short answers"),
    "agentic": SweepPlan("agentic", (6.0, 9.0, 12.0), None, "long prompts on a few shared prefixes, beside chat"),
    "reasoning": SweepPlan("reasoning", (8.0, 12.0, 16.0), 30.0, "decode-bound: short prompts, long answers"),
    "longdoc": SweepPlan("longdoc", (2.0, 3.0, 4.0), None, "a few 12–24k-token prompts among short chats"),
}
ALL_PLANS: dict[str, SweepPlan] = {**SWEEP_PLANS, **HELDOUT_PLANS}


@dataclass(frozen=True)
class TwinSettings:
    gpus: int = 4
    gpu: str = "H100-SXM"
    model_preset: str = "Llama-3.1-8B"
    duration_s: float = 15.0  # simulated seconds of arrivals per run (a plan may set its own)
    seed: int = 0
    splits: tuple[int, ...] = ()  # P values for (b) and (c); () = default_splits(gpus)
    budgets: tuple[int, ...] = (2048, 8192)  # (a)'s --max-num-batched-tokens (8192: vLLM's default on an H100)
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    jobs: int = 1  # runs in parallel (processes); results do not depend on it

    def split_grid(self) -> tuple[int, ...]:
        return self.splits or default_splits(self.gpus)

    def validate(self) -> None:
        if self.gpus < 2:
            raise ValueError(f"--gpus: must be >= 2 (one prefill + one decode worker), got {self.gpus}")
        if self.duration_s <= 0:
            raise ValueError(f"--duration: must be > 0, got {self.duration_s}")
        bad = [p for p in self.split_grid() if not 1 <= p < self.gpus]
        if bad:
            raise ValueError(f"--splits: prefill workers must be in 1..{self.gpus - 1}, got {bad}")
        if any(b < 1 for b in self.budgets):
            raise ValueError(f"--budgets: must be >= 1, got {list(self.budgets)}")
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown:
            raise ValueError(f"--variants: unknown {unknown}; known: {list(VARIANTS)}")
        if self.jobs < 1:
            raise ValueError(f"--jobs: must be >= 1, got {self.jobs}")


def default_splits(gpus: int) -> tuple[int, ...]:
    """Every P for up to 4 GPUs; else P at 1/8 … 5/8 of the GPUs (the splits a prefill pool plausibly takes)."""
    if gpus <= 4:
        return tuple(range(1, gpus))
    return tuple(sorted({min(gpus - 1, max(1, round(gpus * f))) for f in (0.125, 0.25, 0.375, 0.5, 0.625)}))


def crd_default_routing() -> dict[str, Any]:
    """spec.routing's thresholds as the CRD defaults them (api/spec.py ``RoutingSpec()``)."""
    from ..api.spec import RoutingSpec

    d = RoutingSpec().model_dump(by_alias=True, mode="json")
    return {k: d[k] for k in ("policy", "elasticFleet", "remotePrefill", "localPrefill", "fallback")}


@dataclass(frozen=True)
class Config:
    """One deployment configuration at ``gpus`` GPUs."""

    variant: str  # a | b | c-default | c-thresholds | c-tuned
    prefill: int = 0  # prefill workers (0 for a)
    workers: int = 0  # decode workers (b, c) or aggregated workers (a)
    budget: int | None = None  # a: --max-num-batched-tokens (None: vLLM's default)
    slo: SLOSpec | None = None  # c: the spec.slo it is deployed for (None: the headline SLO, SLOS[0])

    @property
    def deployed_slo(self) -> SLOSpec:
        return self.slo or SLOS[0]

    @property
    def label(self) -> str:
        if self.variant == "a":
            return f"{self.workers} agg" + (f", budget {self.budget}" if self.budget else "")
        return f"{self.prefill}P+{self.workers}D"

    def router(self) -> dict[str, Any]:
        base: dict[str, Any] = {"model": SIM_MODEL, "transferTimeoutMs": TRANSFER_TIMEOUT_MS}
        if self.variant == "a":
            return {**base, "mode": "Aggregated"}
        if self.variant == "b":
            return {**base, "mode": "Disaggregated", "routing": copy.deepcopy(ALWAYS_ROUTING)}
        # (c) is deployed for its spec.slo (the router's placement and the chunk budgets follow it)
        slo = {"ttftP95Ms": int(self.deployed_slo.ttft_ms), "tpotP95Ms": int(self.deployed_slo.tpot_ms)}
        if self.variant == "c-tuned":
            return {**base, "mode": "Disaggregated", "routing": {**copy.deepcopy(CONDITIONAL_ROUTING),
                                                                 "policy": "Thresholds"}, "slo": slo}
        if self.variant == "c-thresholds":  # the rule ladder, the CRD's other defaults
            return {"model": SIM_MODEL, "mode": "Disaggregated", "routing": {"policy": "Thresholds"}, "slo": slo}
        # c-default: the CRD's routing and transfer timeout
        return {"model": SIM_MODEL, "mode": "Disaggregated", "slo": slo}

    def cluster(self, s: TwinSettings) -> Any:
        from ..twin import ClusterSpec, PoolSpec

        def pool(n: int, budget: int | None = None) -> PoolSpec:
            return PoolSpec(n, gpu=s.gpu, model_preset=s.model_preset, max_num_batched_tokens=budget)

        if self.variant == "a":
            return ClusterSpec(aggregated=pool(self.workers, self.budget), router=self.router(), drain_s=drain_s())
        router = self.router()
        decode_budget = prefill_budget = None
        if self.variant.startswith("c-"):  # the operator's default budgets for the deployment's spec.slo
            elastic = bool(router.get("routing", {}).get("elasticFleet", True))  # prefill workers run streams too
            decode_budget = conditional_chunk_budget(s, self.deployed_slo)
            prefill_budget = conditional_chunk_budget(s, self.deployed_slo, "prefill", elastic)
        return ClusterSpec(prefill=pool(self.prefill, prefill_budget), decode=pool(self.workers, decode_budget),
                           router=router, drain_s=drain_s())


def conditional_chunk_budget(s: TwinSettings, slo: SLOSpec | None = None, role: Role = "decode",
                             elastic_fleet: bool = True) -> int | None:
    """(c)'s ``--max-num-batched-tokens`` on the decode pool, or (``role`` prefill) on the prefill pool (None: vLLM's
    default, a prefill pool that only prefills): what the operator renders when the spec sets none
    (perf/costs.py ``pool_chunk_budget``, the rule builders/workers.py ``chunk_budget`` applies, for spec.slo's TPOT;
    ``slo``: the one deployed for, default the headline SLO) — the shipped default, not a per-cell choice."""
    from ..api.contract import EngineProfile
    from ..perf.costs import EngineCost, pool_chunk_budget

    cost = EngineCost.from_profile(EngineProfile(gpu=s.gpu, model=s.model_preset))
    return pool_chunk_budget(cost, role, (slo or SLOS[0]).tpot_ms / 1000.0, elastic_fleet, cost.max_num_seqs)


def configs(s: TwinSettings) -> list[Config]:
    out: list[Config] = []
    for v in s.variants:
        if v == "a":
            out += [Config("a", 0, s.gpus, b) for b in s.budgets]
        elif v in PER_SLO_VARIANTS:
            out += [Config(v, p, s.gpus - p, slo=slo) for p in s.split_grid() for slo in SLOS]
        else:
            out += [Config(v, p, s.gpus - p) for p in s.split_grid()]
    return out


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(1000 * xs[min(len(xs) - 1, int(q * len(xs)))], 1)


_ARRIVALS: dict[tuple[str, float, float, int], Any] = {}


def twin_run(cfg: Config, mix: str, rate: float, s: TwinSettings) -> Any:
    """One twin run (a TwinResult): the mix's arrivals at ``rate`` through ``cfg``."""
    from ..twin import SLO, arrivals_from_mix, simulate

    key = (mix, rate, s.duration_s, s.seed)
    if key not in _ARRIVALS:  # the same arrivals for every configuration of a (mix, rate)
        _ARRIVALS.clear()
        _ARRIVALS[key] = arrivals_from_mix(mix, rate, s.duration_s, seed=s.seed, model=SIM_MODEL)
    return simulate(cfg.cluster(s), _ARRIVALS[key], seed=s.seed, slo=SLO(SLOS[0].ttft_ms, SLOS[0].tpot_ms),
                    window_s=s.duration_s)


def run_config(cfg: Config, mix: str, rate: float, s: TwinSettings) -> dict[str, Any]:
    """One twin run (:func:`twin_run`), scored at every SLO of :data:`SLOS`."""
    from ..twin import SLO

    t0 = time.perf_counter()
    r = twin_run(cfg, mix, rate, s)
    wall = time.perf_counter() - t0
    summ = r.summary()
    ok = [x for x in r.records if x.ok]
    remote = sum(1 for x in r.records if x.path == "remote")
    return {
        "gpus": s.gpus, "mix": mix, "rate": rate, "duration_s": s.duration_s, "variant": cfg.variant,
        "deployment": VARIANT_DEPLOYMENT[cfg.variant],
        # the SLO it was deployed for when it is scored at that one only (PER_SLO_VARIANTS); else every SLO
        "deployed_slo": cfg.deployed_slo.key if cfg.variant in PER_SLO_VARIANTS else None,
        "config": cfg.label, "prefill": cfg.prefill, "workers": cfg.workers, "budget": cfg.budget,
        "requests": summ.requests, "errors": sum(1 for x in r.records if not x.ok and x.status != 0),
        "unfinished": sum(1 for x in r.records if x.status == 0),  # still running at the drain limit
        "slos": {slo.key: r.at_slo(SLO(slo.ttft_ms, slo.tpot_ms)) for slo in SLOS},
        "ttft_p50_ms": _pct([x.ttft_s for x in ok if x.ttft_s is not None], 0.50),
        "ttft_p95_ms": _pct([x.ttft_s for x in ok if x.ttft_s is not None], 0.95),
        "tpot_p50_ms": _pct([x.tpot_s for x in ok if x.tpot_s is not None], 0.50),
        "tpot_p95_ms": _pct([x.tpot_s for x in ok if x.tpot_s is not None], 0.95),
        "remote_share": round(remote / len(r.records), 4) if r.records else 0.0,
        "fallbacks": sum(1 for x in r.records if x.fallback),
        "decisions": dict(sorted(r.decisions.items())),
        "utilisation": {k: round(v.utilisation, 3) for k, v in r.pools.items()},
        "wall_s": round(wall, 2),
    }


TASKS_PER_CHILD = 4  # twin runs per worker process of a sweep (sweep)


def _run_job(job: tuple[Config, str, float, TwinSettings]) -> dict[str, Any]:
    return run_config(*job)


def sweep(mixes: Sequence[str], s: TwinSettings, plans: dict[str, SweepPlan] | None = None,
          progress: Callable[[str], None] = print, gpus: Sequence[int] = ()) -> list[dict[str, Any]]:
    """Every (GPU count, mix, rate, config): one twin run each, in a fixed order (``jobs`` > 1 runs them in
    processes). ``gpus``: the GPU counts (default: ``s.gpus``); rates scale with them (per-GPU ladders)."""
    plans = plans or ALL_PLANS
    for m in mixes:
        if m not in ALL_MIXES:
            raise ValueError(f"--mixes: unknown mix {m!r}; known: {sorted(MIXES)}, held out: {sorted(HELDOUT_MIXES)}")
        if m not in plans:
            raise ValueError(f"--rate: no rate ladder for mix {m!r}: pass --rate {m}=RPS[,RPS...]")
        if not plans[m].rates_per_gpu or any(x <= 0 for x in plans[m].rates_per_gpu):
            raise ValueError(f"--rate: {m}: rates must be > 0, got {list(plans[m].rates_per_gpu)}")
    jobs = []
    for n in gpus or (s.gpus,):
        sn = replace(s, gpus=n)
        sn.validate()
        for m in mixes:
            sm = replace(sn, duration_s=plans[m].duration_s or s.duration_s)
            jobs += [(c, m, round(n * r, 3), sm) for r in plans[m].rates_per_gpu for c in configs(sm)]
    rows: list[dict[str, Any]] = []

    def done(row: dict[str, Any]) -> None:
        rows.append(row)
        sc = row["slos"][SLOS[0].key]
        progress(f"[goodput] {len(rows)}/{len(jobs)} {row['gpus']} GPUs {row['mix']} @ {row['rate']:g}/s "
                 f"{row['variant']} {row['config']}: attainment {sc['attainment']:.3f} at {SLOS[0].key} ms, TTFT p95 "
                 f"{row['ttft_p95_ms']} ms, TPOT p95 {row['tpot_p95_ms']} ms, remote {row['remote_share']:.0%} "
                 f"({row['requests']} requests, {row['wall_s']} s)")

    if s.jobs == 1:
        for j in jobs:
            done(_run_job(j))
    else:
        # each process runs at most TASKS_PER_CHILD runs, then a fresh one takes over: a 16-GPU run holds ~1 GB, and a
        # process that ran dozens of them kept growing until the kernel killed it (docs/benchmarks.md §1, Limits).
        # multiprocessing.Pool, not ProcessPoolExecutor: the latter's max_tasks_per_child hangs on Python 3.11 once
        # its first process is replaced (CPython gh-115634: every 3.11 release has it)
        with multiprocessing.get_context("fork").Pool(s.jobs, maxtasksperchild=TASKS_PER_CHILD) as pool:
            for row in pool.imap(_run_job, jobs):
                done(row)
    return rows


def _best(rows: list[dict[str, Any]], family: str, slo: str) -> dict[str, Any] | None:
    """The family's best row at an SLO: most goodput, then fewest prefill workers (ties: the listed order); a row
    deployed for one SLO counts at that SLO only."""
    variant = "c-default" if family == "c" else family
    pick = [r for r in rows if r["variant"] == variant and r.get("deployed_slo") in (None, slo)]
    if not pick:
        return None
    return max(pick, key=lambda r: (r["slos"][slo]["goodput_rps"], -r["prefill"]))


def ratio(x: float, y: float) -> float | None:
    if y > 0:
        return round(x / y, 3)
    return None if x == 0 else float("inf")


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Best per family per (GPUs, mix, rate, SLO), the ratios and targets; each family's knee per (GPUs, mix,
    SLO); the verdict of each target of :data:`TARGETS` over all of them."""
    best: list[dict[str, Any]] = []
    knees: list[dict[str, Any]] = []
    for n, mix in dict.fromkeys((r["gpus"], r["mix"]) for r in rows):
        here = [r for r in rows if r["gpus"] == n and r["mix"] == mix]
        rates = sorted({r["rate"] for r in here})
        families = [f for f in FAMILIES if _best(here, f, SLOS[0].key) is not None]
        for slo in (x.key for x in SLOS):
            entries = []
            for rate in rates:
                at = [r for r in here if r["rate"] == rate]
                entry: dict[str, Any] = {"gpus": n, "mix": mix, "rate": rate, "slo": slo}
                for fam in FAMILIES:
                    b = _best(at, fam, slo)
                    entry[fam] = None if b is None else {
                        "variant": b["variant"], "config": b["config"], **b["slos"][slo],
                        "ttft_p95_ms": b["ttft_p95_ms"], "tpot_p95_ms": b["tpot_p95_ms"],
                        "remote_share": b["remote_share"]}
                g = {f: entry[f]["goodput_rps"] for f in FAMILIES if entry[f] is not None}
                if {"a", "b", "c"} <= set(g):
                    entry["c_over_a"] = ratio(g["c"], g["a"])
                    entry["c_over_b"] = ratio(g["c"], g["b"])
                    targets: dict[str, bool] = {}
                    ab = max(g["a"], g["b"])
                    if max(entry["a"]["attainment"], entry["b"]["attainment"]) >= BASELINE_FLOOR:
                        targets[NEVER_WORSE] = g["c"] >= 0.98 * ab
                        if mix in LONG_PROMPT_MIXES and TIGHT_LONG in TARGETS[slo]:
                            targets[TIGHT_LONG] = g["c"] >= 1.10 * ab
                    entry["c_over_max_ab"] = ratio(g["c"], ab)
                    if "c-thresholds" in g:
                        entry["c_thresholds_over_max_ab"] = ratio(g["c-thresholds"], max(g["a"], g["b"]))
                    if mix == "long-rag" and slo == SLOS[0].key:
                        targets["long-rag: c ≥ 2 × a"] = g["c"] >= 2 * g["a"]
                    entry["targets"] = targets
                entries.append(entry)
            best += entries
            knee: dict[str, Any] = {"gpus": n, "mix": mix, "slo": slo, "rates": rates}
            for fam in families:
                held = [e["rate"] for e in entries if e[fam]["attainment"] >= ATTAINMENT_KNEE]
                knee[fam] = max(held) if held else None
            knees.append(knee)
    verdicts: dict[str, dict[str, Any]] = {}
    for slo in (x.key for x in SLOS):
        for t in TARGETS[slo]:
            cases = [(e["gpus"], e["mix"], e["rate"], e["targets"][t]) for e in best
                     if e["slo"] == slo and t in e.get("targets", {})]
            verdicts.setdefault(slo, {})[t] = {
                "met": sum(ok for *_, ok in cases), "of": len(cases),
                "missed": [f"{m} @ {r:g}/s ({n} GPUs)" for n, m, r, ok in cases if not ok]}
    return {"best": best, "knees": knees, "targets": verdicts}


def run_twin(mixes: Sequence[str], s: TwinSettings, plans: dict[str, SweepPlan] | None = None,
             out: Path | None = RESULTS, command: str = COMMAND, gpus: Sequence[int] = (),
             progress: Callable[[str], None] = print, benchmark: str = "goodput") -> dict[str, Any]:
    """The sweep, its summary and the results document (written to ``out`` when given; ``benchmark``: its name,
    ``goodput-heldout`` for the held-out mixes)."""
    from ..results import machine_facts, results_doc, write_results

    plans = plans or ALL_PLANS
    gpus = tuple(gpus or (s.gpus,))
    t0 = time.perf_counter()
    rows = sweep(mixes, s, plans, progress, gpus)
    wall = time.perf_counter() - t0
    results = {
        "settings": {**asdict(s), "gpus": list(gpus), "splits": {n: list(replace(s, gpus=n).split_grid())
                                                                 for n in gpus},
                     "slos": [x.key for x in SLOS], "attainment_knee": ATTAINMENT_KNEE},
        "plans": {m: asdict(plans[m]) for m in mixes},
        "routing": {"c-default": crd_default_routing(), "c-thresholds": {**crd_default_routing(),
                                                                           "policy": "Thresholds"},
                    "c-tuned": {**CONDITIONAL_ROUTING, "policy": "Thresholds"}, "b": ALWAYS_ROUTING},
        "targets_per_slo": {k: list(v) for k, v in TARGETS.items()},
        "rows": rows, **summarise(rows),
        "cross_check": "tests/twin/test_crosscheck.py: the twin against real disagg sim + disagg router processes "
                       "on a small mixed case (same decisions; median TTFT/TPOT within 15 %); "
                       "`disagg bench goodput --real` runs the real-process benchmark on a small case",
    }
    doc = results_doc(benchmark, command, results, machine_facts(wall_s=round(wall, 1), jobs=s.jobs))
    if out is not None:
        write_results(out, doc)
    return doc

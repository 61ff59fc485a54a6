"""The autoscale benchmark's hindsight oracle: per time bucket, the fewest GPUs whose prefill/decode split meets the
SLO at that bucket's load, found by a sweep of splits in the discrete-event twin (disagg.twin).

``bench autoscale`` (disagg.bench.autoscale) compares the GPU-seconds its autoscaler spent over a day with what an
oracle that knew each bucket's load in advance would have spent: Σ over buckets of (fewest GPUs that hold the
bucket's load) × the bucket's duration. "Hold" means: a steady run of the bucket's offered rate in the twin, for
``probe_s`` simulated seconds, keeps ≥ ``target`` of requests within the SLO (TTFT and TPOT per request, the one
definition of load/loadgen.py). The oracle is free of everything an autoscaler pays for: no pod start, no
scaling delay, no transition between buckets — it is a lower bound, which is what "vs oracle" should mean.

The model is the benchmark's own DisaggregatedModel (docs/examples/local-demo.yaml with the benchmark's overrides),
mapped to the twin by the planner's one mapping (disagg.plan.verify ``cluster_spec``: GPU product, TP, maxNumSeqs,
the router's config as builders/router.py writes it, the KV transport, spec.slo); each candidate split only
changes ``spec.prefill.replicas`` and ``spec.decode.replicas`` (1 ≤ each ≤ ``max_replicas``).

Cost control, which makes a day cheap: a bucket's rate is rounded *up* to a multiple of ``rate_step`` (never
optimistic), and results are cached per (mix, rounded rate) — a day with 30 buckets needs a dozen distinct loads;
the splits of one load are tried in order of GPUs (then fewer prefill replicas first) and the search stops at the
first that holds; a higher load starts from the GPU count the next lower load needed (assumes more load never
needs fewer GPUs). A load that no split up to ``max_replicas`` + ``max_replicas`` holds gets that largest split,
marked ``met: False`` in :attr:`TwinOracle.picks`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from ..load.workload import Mix, generate


class Bucket(Protocol):
    """What the oracle reads from a time bucket (disagg.bench.autoscale ``BucketLoad``)."""

    @property
    def rate(self) -> float: ...


@dataclass(frozen=True)
class OracleSettings:
    probe_s: float = 30.0  # simulated seconds of steady arrivals per probe
    target: float = 0.90  # attainment that counts as holding the load (autoscale.ATTAINMENT_TARGET)
    rate_step: float = 0.25  # loads are rounded up to a multiple of this (the cache key)
    max_replicas: int = 3  # per pool (the benchmark's maxReplicas)
    seed: int = 0

    def validate(self) -> None:
        if self.probe_s <= 0:
            raise ValueError(f"probe_s: must be > 0, got {self.probe_s}")
        if not 0 < self.target <= 1:
            raise ValueError(f"target: must be in (0, 1], got {self.target}")
        if self.rate_step <= 0:
            raise ValueError(f"rate_step: must be > 0, got {self.rate_step}")
        if self.max_replicas < 1:
            raise ValueError(f"max_replicas: must be >= 1, got {self.max_replicas}")


@dataclass(frozen=True)
class Probe:
    """One twin run: ``prefill`` + ``decode`` replicas at ``rate`` req/s."""

    rate: float
    prefill: int
    decode: int
    gpus: int
    requests: int
    attainment: float
    met: bool


@dataclass(frozen=True)
class Pick:
    """The oracle's answer for one load: the fewest GPUs and the split that holds it."""

    rate: float  # the rounded load the answer is for
    gpus: int
    prefill: int
    decode: int
    attainment: float
    met: bool  # False: no split up to max_replicas + max_replicas held the load (this is the largest)


class TwinOracle:
    """A :data:`disagg.bench.autoscale.HindsightOracle`: ``oracle(buckets) -> GPUs per bucket``.

    ``model``: a DisaggregatedModel as YAML loads it (its replicas are replaced per split); ``mix``: the
    workload (load/workload.py); ``model_name``: the name the generated requests carry."""

    def __init__(self, model: dict[str, Any], mix: Mix, settings: OracleSettings | None = None) -> None:
        from ..plan.verify import cluster_spec

        self.settings = settings or OracleSettings()
        self.settings.validate()
        self.model = copy.deepcopy(model)
        self.mix = mix
        self.model_name = str(self.model["spec"]["model"].get("servedName") or self.model["spec"]["model"]["name"])
        self.probes: dict[tuple[str, float, int, int], Probe] = {}  # (mix, rate, P, D) → probe
        self.cache: dict[tuple[str, float], Pick] = {}  # (mix, rate) → pick
        self.picks: list[Pick] = []  # per bucket of the last call
        m = self.settings.max_replicas
        self._mapped = {(p, d): cluster_spec(self.with_replicas(p, d)) for p in range(1, m + 1)
                        for d in range(1, m + 1)}
        self.slo = next(iter(self._mapped.values())).slo
        # candidates in the order the search tries them: fewest GPUs, then fewest prefill replicas
        self.splits = sorted(self._mapped, key=lambda pd: (self._mapped[pd].gpus, pd[0]))

    def with_replicas(self, p: int, d: int) -> dict[str, Any]:
        """The model with ``p`` prefill and ``d`` decode replicas, autoscaling off."""
        doc = copy.deepcopy(self.model)
        spec = doc["spec"]
        spec.setdefault("autoscaling", {})["enabled"] = False  # the twin holds replicas; say so to the mapping
        for pool, n in (("prefill", p), ("decode", d)):
            spec[pool] = {**spec.get(pool, {}), "replicas": n, "minReplicas": min(n, spec[pool].get("minReplicas", 1)),
                          "maxReplicas": max(n, spec[pool].get("maxReplicas", n))}
        return doc

    def rounded(self, rate: float) -> float:
        """The load a rate is answered for: rounded up to a multiple of ``rate_step``."""
        step = self.settings.rate_step
        return round(max(step, math.ceil(rate / step - 1e-9) * step), 6)

    def probe(self, rate: float, p: int, d: int) -> Probe:
        """One steady run of ``rate`` req/s on ``p`` prefill + ``d`` decode replicas (cached)."""
        key = (self.mix.name, rate, p, d)
        if key in self.probes:
            return self.probes[key]
        from ..twin import arrivals_from_requests, simulate

        s = self.settings
        mapped = self._mapped[(p, d)]
        arrivals = arrivals_from_requests(generate(self.mix, rate, s.probe_s, self.model_name, seed=s.seed))
        if not arrivals:
            out = Probe(rate, p, d, mapped.gpus, 0, 1.0, True)
        else:
            r = simulate(mapped.cluster, arrivals, seed=s.seed, slo=mapped.slo, window_s=s.probe_s)
            out = Probe(rate, p, d, mapped.gpus, len(r.records), round(r.attainment, 4),
                        r.attainment >= s.target)
        self.probes[key] = out
        return out

    def fewest(self, rate: float, at_least: int = 0) -> Pick:
        """The fewest GPUs (and the split) that hold ``rate`` (rounded up first); cached per (mix, rate).
        ``at_least``: skip splits with fewer GPUs (what a lower load already needed)."""
        rate = self.rounded(rate)
        key = (self.mix.name, rate)
        if key in self.cache:
            return self.cache[key]
        last: Probe | None = None
        pick: Pick | None = None
        for p, d in self.splits:
            if self._mapped[(p, d)].gpus < at_least:
                continue
            last = self.probe(rate, p, d)
            if last.met:
                pick = Pick(rate, last.gpus, p, d, last.attainment, True)
                break
        if pick is None:
            m = self.settings.max_replicas
            top = self.probe(rate, m, m) if last is None or (last.prefill, last.decode) != (m, m) else last
            pick = Pick(rate, top.gpus, m, m, top.attainment, False)
        self.cache[key] = pick
        return pick

    def __call__(self, buckets: Sequence[Bucket]) -> list[int]:
        """GPUs per bucket (same order); :attr:`picks` holds the split and attainment behind each."""
        need = 0
        for rate in sorted({self.rounded(b.rate) for b in buckets}):  # low to high: each starts where the last ended
            need = self.fewest(rate, need).gpus
        self.picks = [self.fewest(b.rate) for b in buckets]
        return [p.gpus for p in self.picks]

    def report(self) -> dict[str, Any]:
        """What the oracle found, for a results file: per rounded load the pick, and the probes it ran."""
        return {"settings": {**self.settings.__dict__, "slo": {"ttft_ms": self.slo.ttft_ms,
                                                               "tpot_ms": self.slo.tpot_ms}},
                "loads": [p.__dict__ for _, p in sorted(self.cache.items())],
                "probes": len(self.probes)}


def autoscale_oracle(settings: OracleSettings | None = None,
                     overrides: dict[str, Any] | None = None) -> TwinOracle:
    """The oracle for ``disagg bench autoscale``: its model (docs/examples/local-demo.yaml, the file the benchmark
    deploys, plus ``overrides`` merged into ``spec`` like ModelHarness.deploy does) and its mix
    (autoscale.AUTOSCALE_MIX); ``max_replicas`` defaults to the benchmark's."""
    from ..local.harness import DEMO_MODEL
    from . import autoscale

    doc = yaml.safe_load(Path(DEMO_MODEL).read_text())
    for key, value in (overrides or {}).items():
        doc["spec"][key] = {**doc["spec"].get(key, {}), **value} if isinstance(value, dict) else value
    s = settings or OracleSettings(max_replicas=autoscale.Settings().max_replicas,
                                   target=autoscale.ATTAINMENT_TARGET)
    return TwinOracle(doc, autoscale.AUTOSCALE_MIX, s)



# ----------------------------------------------------------------------------- the virtual day's oracle (issue 28)

ProbeFn = Callable[[float, float, int, int], float]  # (rate, rag share, prefill, decode) → attainment


def fewest_split(probe: ProbeFn, rate: float, mix: float, guess: tuple[int, int], target: float,
                 max_replicas: int, max_probes: int = 10) -> dict[str, Any]:
    """The fewest GPUs (1 per replica) whose split holds ``rate`` at ``mix`` (attainment ≥ ``target`` in a twin
    probe), searched from ``guess`` (the performance model's answer): while the split holds, drop a replica from
    whichever pool still holds without it (the cheaper first: prefill, then decode); while it does not, add one to
    the pool whose addition helps most. A local search, not a sweep of every split: it stops at a split from which
    no single replica can be removed, or after ``max_probes`` probes (then ``met`` says whether the last held)."""
    p, d = max(1, min(max_replicas, guess[0])), max(1, min(max_replicas, guess[1]))
    seen: dict[tuple[int, int], float] = {}

    def att(pp: int, dd: int) -> float:
        if (pp, dd) not in seen:
            seen[(pp, dd)] = probe(rate, mix, pp, dd)
        return seen[(pp, dd)]

    while att(p, d) < target and len(seen) < max_probes and (p < max_replicas or d < max_replicas):
        options = [(pp, dd) for pp, dd in ((p + 1, d), (p, d + 1)) if pp <= max_replicas and dd <= max_replicas]
        p, d = max(options, key=lambda x: att(*x))
    if att(p, d) >= target:
        while len(seen) < max_probes:
            down = [(pp, dd) for pp, dd in ((p - 1, d), (p, d - 1)) if pp >= 1 and dd >= 1]
            ok = [x for x in down if att(*x) >= target]
            if not ok:
                break
            p, d = ok[0]
    return {"prefill": p, "decode": d, "gpus": p + d, "attainment": round(att(p, d), 4),
            "met": att(p, d) >= target, "probes": len(seen)}

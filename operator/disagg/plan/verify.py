"""The planner's bridge to the discrete-event twin (disagg.twin): a DisaggregatedModel → the twin's ClusterSpec,
``disagg plan --verify`` (the top candidates through the twin; a traffic profile → arrivals is plan/arrivals.py).

One mapping, :func:`cluster_spec`, serves ``--verify`` (the emitted spec of each candidate) and ``disagg replay``
(a user's candidate spec): what the twin runs is what ``kubectl apply`` would run — the pools' replicas, GPU
product, TP, ``maxNumSeqs``, the chunk budget the operator renders (builders/workers.py ``chunk_budget``: the
spec's ``maxNumBatchedTokens``, else the TPOT-bounded default of a pool that runs streams), the router's config as
builders/router.py writes it (mode, routing, SLO, transfer timeout) and the KV transport. Autoscaling is not
modelled: the twin holds ``replicas``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import structlog

from ..api.contract import Role
from ..api.validate import errors_of
from ..perf.presets import PresetError, get_gpu, get_model, infer_model
from ..twin import SLO, Arrival, ClusterSpec, PoolSpec, TwinResult, simulate
from .arrivals import profile_arrivals
from .profile import Profile

TRANSPORTS = {"rdma": "rdma", "nvlink": "nvlink", "tcp": "tcp", "auto": "rdma"}


class SpecError(ValueError):
    """A candidate spec the twin cannot run; ``problems``: one line per problem, each naming its field."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


@contextmanager
def quiet_logs(level: int = logging.ERROR) -> Iterator[None]:
    """Only ``level`` and above from structlog loggers while the twin runs (an overloaded candidate's engines log a
    warning per request, e.g. ``kv_lease_expired``: the verdicts already say it). For command handlers; the previous
    configuration is restored, and nothing is cached with the quiet one."""
    was = structlog.is_configured()
    old = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level), cache_logger_on_first_use=False)
    try:
        yield
    finally:
        if was:
            structlog.configure(**old)
        else:
            structlog.reset_defaults()


# ------------------------------------------------------------------------------------ spec → twin cluster


@dataclass(frozen=True)
class Mapped:
    cluster: ClusterSpec
    slo: SLO
    goodput_target: float
    gpus: int
    label: str
    notes: tuple[str, ...] = ()


def cluster_spec(doc: dict[str, Any], *, gpu: str | None = None, model_preset: str | None = None) -> Mapped:
    """A DisaggregatedModel (a dict, as YAML loads it) → the twin's ClusterSpec + the spec's SLO.

    The spec is checked with ``disagg validate``'s rules first. ``gpu``: the GPU preset for pools without
    ``gpu.product``; ``model_preset``: for a ``spec.model.name`` that no preset matches."""
    errors = errors_of(doc)
    if errors:
        raise SpecError([f"{e} (disagg validate)" for e in errors])
    from ..api.models import DisaggregatedModel
    from ..builders.router import router_config
    from ..builders.workers import chunk_budget

    dm = DisaggregatedModel.model_validate(doc)
    spec = dm.spec
    problems: list[str] = []
    preset_name = model_preset
    if preset_name is None:
        m = infer_model(spec.model.name)
        if m is None:
            problems.append(f"spec.model.name: no model preset matches {spec.model.name!r}: pass --model-preset "
                            "(a perf/presets.py name)")
        else:
            preset_name = m.name
    else:
        try:
            preset_name = get_model(preset_name).name
        except PresetError as e:
            problems.append(f"--model-preset: {e}")
    notes: list[str] = []
    pools: dict[str, PoolSpec | None] = {}
    cfg = router_config(dm)
    aggregated_mode = cfg.effective_mode().value == "Aggregated"
    roles: tuple[Role, ...] = ("prefill", "decode", "aggregated")
    for role in roles:
        ps = getattr(spec, role, None)
        if ps is None or ps.replicas == 0 or (role == "prefill" and aggregated_mode):
            pools[role] = None
            continue
        where = f"spec.{role}"
        par = ps.parallelism
        if par.pipeline != 1 or par.data != 1:
            problems.append(f"{where}.parallelism: the twin models tensor parallelism only "
                            f"(pipeline {par.pipeline}, data {par.data}); set both to 1 to replay this pool")
        gname = ps.gpu.product or gpu
        if gname is None:
            problems.append(f"{where}.gpu.product: unset, and the twin needs a GPU type: set it (e.g. "
                            "NVIDIA-H100-80GB-HBM3) or pass --gpu")
            continue
        try:
            gname = get_gpu(gname).name
        except PresetError as e:
            problems.append(f"{where}.gpu.product: {e}; or pass --gpu to use a preset for this pool")
            continue
        pools[role] = PoolSpec(count=ps.replicas, gpu=gname, model_preset=preset_name or "Llama-3.1-8B",
                               tp=par.tensor, max_num_seqs=ps.max_num_seqs,
                               max_num_batched_tokens=chunk_budget(spec, role),
                               extra_args=("--max-model-len", str(spec.model.max_model_len))
                               if spec.model.max_model_len else ())
    if spec.autoscaling.enabled:
        notes.append("autoscaling is not modelled: the twin holds each pool at spec.<pool>.replicas")
    if problems:
        raise SpecError(problems)
    transport = TRANSPORTS.get(str(spec.kv_transfer.transport), "rdma")
    cluster = ClusterSpec(prefill=pools["prefill"], decode=pools["decode"], aggregated=pools["aggregated"],
                          router=cfg, transport=transport, model=spec.model.name)
    try:
        cluster.validate()
    except ValueError as e:
        raise SpecError([f"spec: {e}"]) from None
    slo = SLO(ttft_ms=float(spec.slo.ttft_p95_ms), tpot_ms=float(spec.slo.tpot_p95_ms))
    return Mapped(cluster, slo, float(spec.slo.goodput_target or 0.9), cluster.gpus(), label(cluster),
                  tuple(notes))


def label(c: ClusterSpec) -> str:
    parts = []
    for role, short in (("prefill", "P"), ("decode", "D"), ("aggregated", "A")):
        p = getattr(c, role)
        if p is not None and p.count > 0:
            parts.append(f"{short} {p.count}×{p.gpu}" + (f" TP{p.tp}" if p.tp > 1 else ""))
    return " : ".join(parts)


# ---------------------------------------------------------------------------------------------- measuring


@dataclass
class Measured:
    """Twin results over the measured window (arrivals after the warm-up)."""

    requests: int
    attainment: float  # share meeting both SLOs
    goodput_rps: float
    ttft_p95_ms: float
    tpot_p95_ms: float
    errors: int
    paths: dict[str, int]
    decisions: dict[str, int]
    fallbacks: dict[str, int]
    gpu_seconds: float
    window_s: float
    wall_s: float
    per_path: dict[str, dict[str, float]] = field(default_factory=dict)
    windows: list[dict[str, float]] = field(default_factory=list)  # per window: start_s, rps, attainment

    def worst_window(self, max_rps: float = math.inf) -> float | None:
        """The lowest attainment over the windows whose arrival rate is at most ``max_rps`` (None: no such window)."""
        xs = [w["attainment"] for w in self.windows if w["rps"] <= max_rps * (1 + 1e-9)]
        return min(xs) if xs else None

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def pct(xs: Sequence[float], q: float) -> float:
    """The q-quantile (nearest rank, like load/loadgen.py's summaries); NaN for no samples."""
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def windows(records: Sequence[Any], slo: SLO, start_s: float, end_s: float, width_s: float) -> list[dict[str, float]]:
    """Attainment per whole window of ``width_s`` from ``start_s`` (by arrival time), with its arrival rate; windows
    without a request are left out."""
    out = []
    k = 0
    while start_s + (k + 1) * width_s <= end_s + 1e-9:
        lo, hi = start_s + k * width_s, start_s + (k + 1) * width_s
        xs = [x for x in records if lo <= x.arrival_s < hi]
        if xs:
            out.append({"start_s": round(lo, 3), "rps": round(len(xs) / width_s, 4),
                        "attainment": round(sum(x.meets(slo) for x in xs) / len(xs), 4)})
        k += 1
    return out


def measure(r: TwinResult, slo: SLO, warmup_s: float = 0.0, window_width_s: float | None = None) -> Measured:
    """Twin records after ``warmup_s`` summarised; ``window_width_s``: also the attainment per window of that width
    (whole windows between the warm-up and the end of the arrival window)."""
    recs = [x for x in r.records if x.arrival_s >= warmup_s]
    window = max(1e-9, r.window_s - warmup_s)
    met = sum(x.meets(slo) for x in recs)
    ok = [x for x in recs if x.ok]
    paths: dict[str, int] = {}
    fallbacks: dict[str, int] = {}
    decisions: dict[str, int] = {}
    for x in recs:
        paths[x.path] = paths.get(x.path, 0) + 1
        key = f"{x.decision}:{x.reason}"
        decisions[key] = decisions.get(key, 0) + 1
        if x.fallback:
            fallbacks[x.fallback] = fallbacks.get(x.fallback, 0) + 1
    per_path: dict[str, dict[str, float]] = {}
    for path in sorted({x.path for x in ok}):
        xs = [x for x in ok if x.path == path]
        tt = [x.ttft_s * 1e3 for x in xs if x.ttft_s is not None]
        tp = [x.tpot_s * 1e3 for x in xs if x.tpot_s is not None]
        per_path[path] = {"requests": len(xs), "ttft_p50_ms": pct(tt, 0.5), "ttft_p95_ms": pct(tt, 0.95),
                          "ttft_p99_ms": pct(tt, 0.99), "tpot_p50_ms": pct(tp, 0.5), "tpot_p95_ms": pct(tp, 0.95),
                          "tpot_p99_ms": pct(tp, 0.99)}
    return Measured(
        requests=len(recs), attainment=met / len(recs) if recs else 0.0, goodput_rps=met / window,
        ttft_p95_ms=pct([x.ttft_s * 1e3 for x in ok if x.ttft_s is not None], 0.95),
        tpot_p95_ms=pct([x.tpot_s * 1e3 for x in ok if x.tpot_s is not None], 0.95),
        errors=len(recs) - len(ok), paths=dict(sorted(paths.items())), decisions=dict(sorted(decisions.items())),
        fallbacks=dict(sorted(fallbacks.items())), gpu_seconds=r.gpu_seconds, window_s=r.window_s, wall_s=r.wall_s,
        per_path=per_path,
        windows=windows(recs, slo, warmup_s, r.window_s, window_width_s) if window_width_s else [])


# ------------------------------------------------------------------------------------------------ verify


@dataclass(frozen=True)
class VerifySettings:
    """How long ``--verify`` simulates each candidate: at least ``min_duration_s`` of virtual time and about
    ``requests`` arrivals at the peak rate, capped at ``max_duration_s``; the first ``warmup_share`` of the window
    is warm-up (pools filling), not measured."""

    requests: int = 1500
    min_duration_s: float = 30.0
    max_duration_s: float = 600.0
    warmup_share: float = 0.2
    seed: int = 0
    top: int = 3
    window_s: float = 30.0  # recorded arrivals: every window this long within the cover rate must meet the target

    def duration(self, rate: float) -> float:
        return min(self.max_duration_s, max(self.min_duration_s, self.requests / rate))


@dataclass(frozen=True)
class Recorded:
    """Recorded arrivals to verify on (``--from-log`` / ``--arrivals``): the twin's arrivals (times from 0), where
    they come from, and how they were cut."""

    arrivals: list[Arrival]
    source: str
    note: str = ""
    tokens_recorded: bool = True  # False: times only, tokens drawn from the profile

    @property
    def span_s(self) -> float:
        return self.arrivals[-1].at if self.arrivals else 0.0


def busiest(arrivals: Sequence[Arrival], length_s: float) -> tuple[list[Arrival], float]:
    """The stretch of ``length_s`` with the most arrivals (times shifted to start at 0), and where it started."""
    if not arrivals or arrivals[-1].at - arrivals[0].at <= length_s:
        t0 = arrivals[0].at if arrivals else 0.0
        return [dataclasses.replace(a, at=a.at - t0) for a in arrivals], t0
    best, best_i = -1, 0
    j = 0
    for i, a in enumerate(arrivals):
        while j < len(arrivals) and arrivals[j].at < a.at + length_s:
            j += 1
        if j - i > best:
            best, best_i = j - i, i
    t0 = arrivals[best_i].at
    return [dataclasses.replace(a, at=a.at - t0) for a in arrivals[best_i:best_i + best]], t0


def recorded(arrivals: Sequence[Arrival], source: str, settings: VerifySettings | None = None, *,
             tokens_recorded: bool = True) -> Recorded:
    """Recorded arrivals cut to at most ``settings.max_duration_s`` (the busiest stretch of a longer series)."""
    s = settings or VerifySettings()
    if not arrivals:
        raise SpecError([f"{source}: no arrivals to verify on"])
    cut, t0 = busiest(list(arrivals), s.max_duration_s)
    span = arrivals[-1].at - arrivals[0].at
    note = (f"the busiest {s.max_duration_s:g} s of {span:.0f} s (from {t0 - arrivals[0].at:.0f} s)"
            if len(cut) < len(arrivals) else f"all {span:.0f} s")
    return Recorded(cut, source, note, tokens_recorded)


@dataclass
class VerifyRow:
    rank: int
    label: str
    predicted: dict[str, float]
    simulated: Measured
    target: float
    slo: SLO
    cover_rps: float = math.inf  # recorded arrivals: windows up to this rate are judged (the plan's cover rate)
    candidate: Any = None  # the search.Candidate

    @property
    def worst_window(self) -> float | None:
        return self.simulated.worst_window(self.cover_rps)

    @property
    def misses(self) -> bool:
        """Below the goodput target overall, or (recorded arrivals) in any window within the cover rate."""
        w = self.worst_window
        return self.simulated.attainment < self.target or (w is not None and w < self.target)

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "candidate": self.label, "predicted": self.predicted,
                "simulated": self.simulated.to_dict(), "goodput_target": self.target,
                "worst_window_attainment": self.worst_window, "misses_target": self.misses}


def verify(result: Any, settings: VerifySettings | None = None, candidates: Sequence[Any] | None = None,
           rec: Recorded | None = None) -> list[VerifyRow]:
    """The top candidates of a plan (``search.PlanResult``) through the twin, each as its emitted spec: on Poisson
    arrivals drawn from the profile at its peak rate, or (``rec``) on recorded arrivals, judged overall and in
    every ``settings.window_s`` window whose rate is within the plan's cover rate."""
    from .emit import to_model

    s = settings or VerifySettings()
    p: Profile = result.profile
    if p.model.preset is None:
        raise SpecError(["model.config: --verify needs model.preset: the twin's engines run perf/presets.py "
                         "models (add a preset for this model, or plan without --verify)"])
    cands = list(candidates) if candidates is not None else [c for c in result.ranked[: s.top]]
    rate = p.traffic.rate.peak
    max_input = (p.model.max_model_len or p.model.resolve().max_position) - 1
    if rec is None:
        duration = s.duration(rate)
        arrivals = profile_arrivals(p, duration, rate=rate, seed=s.seed, max_input=max_input)
        cover = math.inf
    else:
        arrivals = [a if a.input_tokens <= max_input else dataclasses.replace(a, input_tokens=max_input)
                    for a in rec.arrivals]
        duration = max(rec.span_s, 1e-3)
        cover = max(p.cover_rate()[0], rate)
    out = []
    for c in cands:
        doc = to_model(result, c)
        m = cluster_spec(doc)
        r = simulate(m.cluster, arrivals, seed=s.seed, slo=m.slo, window_s=duration)
        sim = measure(r, m.slo, warmup_s=duration * s.warmup_share,
                      window_width_s=s.window_s if rec is not None else None)
        if math.isnan(c.ttft_p95_ms):
            result_ev_fill(result, c)
        pred = {"attainment": round(c.goodput, 4), "goodput_rps": round(c.goodput * rate, 3),
                "ttft_p95_ms": round(c.ttft_p95_ms, 1), "tpot_p95_ms": round(c.tpot_p95_ms, 2)}
        out.append(VerifyRow(result.ranked.index(c) + 1 if c in result.ranked else 0, c.label(), pred, sim,
                             p.slo.goodput_target, m.slo, cover, c))
    return out


def cheapest_holding(rows: Sequence[VerifyRow]) -> VerifyRow | None:
    """The first (cheapest: rows are in the plan's rank order) verified row that holds its arrivals and whose
    candidate the model calls feasible; None when none does."""
    return next((r for r in rows if not r.misses and r.candidate is not None and r.candidate.feasible), None)


def result_ev_fill(result: Any, c: Any) -> None:
    from ..perf.presets import TRANSPORTS as T
    from .model import build_workload
    from .search import Evaluator

    p = result.profile
    Evaluator(p, build_workload(p), p.model.resolve(), T[p.kv_transport]).fill_percentiles(c)


def render_verify(rows: Sequence[VerifyRow], settings: VerifySettings, rate: float,
                  rec: Recorded | None = None) -> str:
    s = settings
    wcol = f"worst {s.window_s:g}-s window"
    head = ("#", "candidate", "goodput pred", "goodput sim", "req/s pred", "req/s sim", "TTFT p95 pred",
            "TTFT p95 sim", "TPOT p95 pred", "TPOT p95 sim", wcol, "paths (sim)", "verdict")
    lines = []
    for r in rows:
        sim = r.simulated
        paths = " ".join(f"{k}:{v}" for k, v in sim.paths.items())
        verdict = (f"MISSES target {r.target:.0%} in the twin" if r.misses else "ok")
        if sim.errors:
            verdict += f"; {sim.errors} errors"
        w = r.worst_window
        lines.append((str(r.rank), r.label, f"{r.predicted['attainment']:.1%}", f"{sim.attainment:.1%}",
                      f"{r.predicted['goodput_rps']:.1f}", f"{sim.goodput_rps:.1f}",
                      _f(r.predicted["ttft_p95_ms"], 0), _f(sim.ttft_p95_ms, 0),
                      _f(r.predicted["tpot_p95_ms"], 1), _f(sim.tpot_p95_ms, 1),
                      "-" if w is None else f"{w:.1%}", paths, verdict))
    widths = [max([len(h)] + [len(x[k]) for x in lines]) for k, h in enumerate(head)]
    fmt = "  ".join(f"{{:{'<' if k in (1, 11, 12) else '>'}{w}}}" for k, w in enumerate(widths))
    if rec is None:
        what = (f"Poisson arrivals at the peak {rate:g} req/s drawn from the profile for {s.duration(rate):g} s of "
                f"virtual time (seed {s.seed})")
    else:
        cover = rows[0].cover_rps if rows else rate
        what = (f"the {len(rec.arrivals)} recorded arrivals of {rec.source} ({rec.note}; tokens "
                + ("as recorded" if rec.tokens_recorded else "drawn from the profile")
                + f"), judged overall and in every {s.window_s:g}-s window at ≤ {cover:.3g} req/s (the plan's "
                "cover rate)")
    out = [f"verify: the top {len(rows)} candidates in the discrete-event twin (disagg.twin), each as its emitted "
           f"spec: {what}, the first {s.warmup_share:.0%} warm-up; "
           f"goodput = share of measured requests meeting both SLOs",
           fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*x).rstrip() for x in lines]
    wall = sum(r.simulated.wall_s for r in rows)
    out.append(f"({sum(r.simulated.requests for r in rows)} measured requests, {wall:.1f} s wall)")
    return "\n".join(out)


def _f(x: float, nd: int) -> str:
    return "-" if math.isnan(x) else "∞" if math.isinf(x) else f"{x:.{nd}f}"

"""``disagg bench goodput|router|sim|autoscale|operator|soak`` (argument definitions only; heavy imports happen
inside the handlers)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # argparse's type for it is generic only to the type checker
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]  # noqa: SLF001 - only private in argparse


def add_parser(subparsers: Subparsers) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks: goodput (policies × mixes), router (relay overhead), "
                                  "sim (roofline vs references); see docs/benchmarks.md")
    sub = bench.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    for add in (_add_goodput, _add_router, _add_real_engine, _add_sim, _add_operator, _add_autoscale, _add_soak,
                _add_plan, _add_overload, _add_prefix_cache, _add_decision, _add_prediction):
        add(sub)


def _add_goodput(sub: Subparsers) -> None:
    g = sub.add_parser("goodput", help="aggregated vs always-disaggregated vs conditional at equal GPU count, each "
                       "at its best (a sweep in the discrete-event twin)",
                       description="In the discrete-event twin (virtual time, deterministic for a seed): per mix and "
                       "rate, sweeps (a)'s chunked-prefill budget and the P:D split of (b) and (c) (c with the CRD's "
                       "default thresholds and tuned ones), scores every run at TTFT/TPOT 1000/50, 1000/25 and "
                       "2000/100 ms and reports the best of each, the knees and the targets (disagg.bench.goodput). "
                       "--real: the real-process run (sims + router on loopback) on a small case, as a cross-check.")
    g.add_argument("--mixes", nargs="+", default=None,
                   help="workload mixes (default: short-chat long-rag mixed code-completion shifting; with --heldout: "
                   "summarise agentic reasoning longdoc)")
    g.add_argument("--heldout", action="store_true",
                   help="the held-out mixes (load/workload.py HELDOUT_MIXES: no default was chosen on them) into "
                   "docs/results/goodput-heldout.json and their own tables")
    g.add_argument("--name", choices=("goodput", "goodput-heldout", "goodput-16gpu"), default=None,
                   help="the results document (and its tables in docs/benchmarks.md): goodput (the default), "
                   "goodput-heldout (what --heldout writes), goodput-16gpu (the long-prompt mixes at 16 GPUs); "
                   "--out defaults to docs/results/NAME.json")
    g.add_argument("--gpus", type=int, nargs="+", default=[4],
                   help="simulated GPUs per deployment (one worker per GPU); the twin sweep runs each count given "
                   "(rates scale with it), --real the first")
    g.add_argument("--gpu", default="H100-SXM")
    g.add_argument("--model-preset", default="Llama-3.1-8B")
    g.add_argument("--rates-per-gpu", action="append", default=[], metavar="MIX=RPS[,RPS...]",
                   help="the twin sweep's rate ladder for a mix, requests per simulated second per GPU (default: "
                   "goodput.SWEEP_PLANS)")
    g.add_argument("--rate", action="append", default=[], metavar="MIX=RPS",
                   help="--real: offered requests per simulated second for a mix (default: goodput_live.PLANS)")
    g.add_argument("--duration", type=float, default=None, help="simulated seconds of arrivals per run")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--splits", default=None, metavar="P,P,...",
                   help="prefill workers of (b) and (c) to sweep (default: every P up to 4 GPUs, else 1/8..5/8)")
    g.add_argument("--budgets", default="2048,8192", metavar="N,N,...",
                   help="(a)'s chunked-prefill budgets (--max-num-batched-tokens) to sweep")
    g.add_argument("--variants", nargs="+", default=["a", "b", "c-default", "c-thresholds"],  # DEFAULT_VARIANTS
                   choices=["a", "b", "c-default", "c-thresholds", "c-tuned"],
                   help="deployments of the twin sweep (c-default: what ships, deployed for each SLO; "
                        "c-thresholds / c-tuned: the rule ladder with the CRD's / tuned thresholds)")
    g.add_argument("--jobs", type=int, default=1, help="twin runs in parallel processes (results do not change)")
    g.add_argument("--out", type=Path, default=None,
                   help="results file (default docs/results/goodput.json: the docs' tables come from it, `make docs`; "
                   "with --real: results/bench-goodput-real.json)")
    g.add_argument("--real", action="store_true",
                   help="the real-process run instead (fresh sims + a router per run on loopback, real time)")
    g.add_argument("--deployments", nargs="+", default=["aggregated", "disaggregated", "conditional"],
                   choices=["aggregated", "disaggregated", "conditional"], help="--real: deployments to run")
    g.add_argument("--time-scale", type=float, default=1.0,
                   help="--real: sim wall seconds per simulated second (the offered token rate / time-scale must fit "
                   "the CPUs)")
    g.add_argument("--ttft-slo-ms", type=float, default=1000.0, help="--real: the TTFT SLO")
    g.add_argument("--tpot-slo-ms", type=float, default=50.0, help="--real: the TPOT SLO")
    g.add_argument("--split", action="append", default=[], metavar="MIX=P[,Pc]",
                   help="--real: prefill workers of (b) [and (c)] for a mix")
    g.add_argument("--log-dir", type=Path, default=None, help="--real: keep the processes' logs here")
    g.set_defaults(func=_cmd_goodput)


def _add_router(sub: Subparsers) -> None:
    r = sub.add_parser("router", help="added latency and streaming throughput: direct vs router vs nginx",
                       description="One decode sim; N concurrent streams direct, through `disagg router` and "
                       "through nginx (plain reverse proxy); added latency = proxied − direct.")
    r.add_argument("--streams", type=int, default=500, help="concurrent streams")
    r.add_argument("--rounds", type=int, default=3, help="measured rounds per target (each: --streams requests)")
    r.add_argument("--tokens", type=int, default=64, help="output tokens per stream")
    r.add_argument("--time-scale", type=float, default=8.0,
                   help="sim wall seconds per simulated second: slow enough that the 2×streams tokens per engine step "
                   "fit the CPUs (the paired measurement cancels the step time)")
    r.add_argument("--targets", nargs="+", default=["direct", "router", "nginx"],
                   choices=["direct", "router", "nginx"])
    r.add_argument("--nginx", default=None, help="nginx binary (default: PATH, /usr/sbin/nginx)")
    r.add_argument("--out", type=Path, default=Path("docs/results/router.json"),
                   help="results file (docs/results/router.json: the docs' tables come from it; `make docs`)")
    r.set_defaults(func=_cmd_router)


def _add_real_engine(sub: Subparsers) -> None:
    e = sub.add_parser("real-engine", help="the simulator's engine against a real vLLM CPU engine: fit the CPU "
                       "preset, then held-out open-loop loads on both (disagg.bench.real_engine)")
    e.add_argument("--out", type=Path, default=Path("docs/results/real-engine.json"))
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--log-dir", type=Path, default=None, help="keep the engines' logs here")
    e.set_defaults(func=_cmd_real_engine)


def _add_sim(sub: Subparsers) -> None:
    s = sub.add_parser("sim", help="the twin's prefill/decode tokens/s per preset vs published references "
                       "(disagg.sim.bench)")
    s.add_argument("--strict", action="store_true",
                   help="exit 1 when a fit/held-out vLLM point is outside the documented tolerance "
                   "(its kind's tolerance, disagg.sim.bench.TOLERANCES) or a torch bound is broken")
    s.add_argument("--out", type=Path, default=None, help="results file (default docs/results/sim.json)")
    s.add_argument("--no-write", action="store_true", help="print only")
    s.set_defaults(func=_cmd_sim)


def _add_operator(sub: Subparsers) -> None:
    o = sub.add_parser("operator", help="operator convergence for N models on the real control plane")
    o.add_argument("--models", type=int, nargs="+", default=[10, 50, 200],
                   help="model counts to run (default 10 50 200)")
    o.add_argument("--steady-window", type=float, default=60.0,
                   help="seconds of no change to count writes in (the quiet minute; default 60)")
    o.add_argument("--out", type=Path, default=None, help="JSON results file")
    o.add_argument("--without-controller-manager", action="store_true",
                   help="no kube-controller-manager: the operator's own cost on the apiserver, alone (Deployments "
                   "get no status)")
    o.set_defaults(func=_cmd_operator)


def _add_autoscale(sub: Subparsers) -> None:
    a = sub.add_parser("autoscale", help="the autoscaler in the twin: load step recovery, diurnal GPU-seconds vs "
                       "the cheapest static allocation that holds the peak (local stack)",
                       description="Starts the local stack (control plane, operator, sim pods, Prometheus) and runs "
                       "a load step, a compressed diurnal day and static-allocation probes at the peak rate; see "
                       "disagg.bench.autoscale.")
    a.add_argument("--parts", nargs="+", default=["step", "diurnal", "static_peak"],
                   choices=["step", "diurnal", "static_peak"])
    a.add_argument("--base-rate", type=float, default=0.5, help="req/s before the step (1P + 1D holds it)")
    a.add_argument("--step-factor", type=float, default=6.0,
                   help="rate after the step ÷ before it (default: to the peak rate, beyond 1P + 1D: it breaches)")
    a.add_argument("--step-pre", type=float, default=30.0, help="seconds before the step")
    a.add_argument("--step-post", type=float, default=75.0, help="seconds after the step")
    a.add_argument("--trough-rate", type=float, default=0.5)
    a.add_argument("--peak-rate", type=float, default=3.0)
    a.add_argument("--day", type=float, default=150.0, help="wall seconds of the compressed day")
    a.add_argument("--probe", type=float, default=25.0, help="seconds per static-allocation probe")
    a.add_argument("--scale-down-stabilization", type=int, default=30)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--out", type=Path, default=Path("docs/results/autoscale.json"),
                   help="results file (docs/results/autoscale.json: the docs' table comes from it; `make docs`)")
    a.add_argument("--log-dir", type=Path, default=None, help="keep the processes' logs here")
    a.add_argument("--virtual", action="store_true",
                   help="the virtual-time part instead (issue 28): a compressed day in the twin, predictive vs "
                   "proportional vs Dynamo-style reactive scaling; the same as python -m disagg.bench.autoscale_day "
                   "(its flags: --virtual-args)")
    a.add_argument("--virtual-args", default="", help="arguments for the virtual part, one string")
    a.set_defaults(func=_cmd_autoscale)


def _add_soak(sub: Subparsers) -> None:
    k = sub.add_parser("soak", help="every component fails once under steady mixed load (local stack); issue 12 §7",
                       description="Starts the local stack, deploys the demo model (two decode replicas) and, under "
                       "steady mixed load, kills a prefill pod, kills a decode pod with streams in flight, stalls KV "
                       "pulls, stops Prometheus for two intervals, restarts the operator and the router; see "
                       "disagg.local.soak, disagg.bench.soak and docs/benchmarks.md R2.")
    k.add_argument("--rate", type=float, default=1.5, help="req/s of the soak mix")
    k.add_argument("--seed", type=int, default=7)
    k.add_argument("--out", type=Path, default=Path("docs/results/soak.json"),
                   help="results file (docs/results/soak.json: the docs' tables come from it; `make docs`)")
    k.add_argument("--log-dir", type=Path, default=None, help="keep the processes' logs here")
    k.set_defaults(func=_cmd_soak)


def _add_plan(sub: Subparsers) -> None:
    pa = sub.add_parser("plan", help="the capacity planner's accuracy in the twin: predicted vs simulated goodput "
                        "of its pick, and its pick vs a brute-force sweep (disagg.bench.plan_accuracy)")
    pa.add_argument("--mixes", nargs="+", default=None, help="held-out mixes (default: all of HELD_OUT)")
    pa.add_argument("--seed", type=int, default=0)
    pa.add_argument("--out", type=Path, default=Path("docs/results/plan.json"),
                    help="results file (docs/results/plan.json: the docs' tables come from it; `make docs`)")
    pa.set_defaults(func=_cmd_plan_accuracy)


def _add_overload(sub: Subparsers) -> None:
    ov = sub.add_parser("overload", help="admission under overload in the twin: an Interactive tenant beside a "
                        "Batch one stepped past the knee, with the batch tenant on Admit, Shed and Queue "
                        "(disagg.bench.overload)",
                        description="In the discrete-event twin (virtual time, deterministic for a seed): 1 prefill "
                        "+ 1 decode worker; chat (Interactive) at a steady rate, batch (Batch) stepped from a third of "
                        "its capacity to past the knee; per step and batch overload policy, each tenant's attainment "
                        "and goodput at TTFT/TPOT 1000/100 ms (disagg.bench.overload).")
    ov.add_argument("--duration", type=float, default=60.0, help="simulated seconds of arrivals per step")
    ov.add_argument("--seed", type=int, default=0)
    ov.add_argument("--out", type=Path, default=Path("docs/results/overload.json"),
                    help="results file (docs/results/overload.json: the docs' tables come from it; `make docs`)")
    ov.add_argument("--mixes", nargs="*", default=None, metavar="MIX",
                    help="the goodput sweep's mixes run past the knee with every tenant on Admit and on Shed "
                    "(default: short-chat long-rag mixed code-completion shifting; none given: skip them)")
    ov.set_defaults(func=_cmd_overload)


def _add_prefix_cache(sub: Subparsers) -> None:
    pc = sub.add_parser("prefix-cache", help="prefix-cache-aware placement from the engines' KV events vs the "
                        "router's estimate vs none, in the twin; the index's CPU and memory "
                        "(disagg.bench.prefix_cache)")
    pc.add_argument("--seed", type=int, default=0)
    pc.add_argument("--conversations", type=int, default=120, help="chat conversations (3-8 turns each)")
    pc.add_argument("--agents", type=int, default=20, help="agent sessions (6-14 calls each)")
    pc.add_argument("--decode", type=int, default=4, help="decode workers (H100, Llama-3.1-8B)")
    pc.add_argument("--kv-blocks", type=int, default=3000, help="KV blocks per worker (--num-gpu-blocks-override)")
    pc.add_argument("--out", type=Path, default=Path("docs/results/prefix-cache.json"),
                    help="results file (docs/results/prefix-cache.json: the docs' tables come from it; `make docs`)")
    pc.set_defaults(func=_cmd_prefix_cache)


def _add_decision(sub: Subparsers) -> None:
    de = sub.add_parser("decision", help="CPU per routing decision per policy (Thresholds, SLO) at 64 workers "
                        "(disagg.bench.decision)")
    de.add_argument("--snapshots", type=int, default=200, help="seeded load snapshots, idle to busy (>= 2)")
    de.add_argument("--rounds", type=int, default=3, help="passes over every snapshot and prompt (>= 1)")
    de.add_argument("--seed", type=int, default=0)
    de.add_argument("--out", type=Path, default=Path("docs/results/decision.json"),
                    help="results file (docs/results/decision.json: the docs' tables come from it; `make docs`)")
    de.set_defaults(func=_cmd_decision)


def _add_prediction(sub: Subparsers) -> None:
    pr = sub.add_parser("prediction", help="the SLO placement's prediction error (actual ÷ predicted TTFT and TPOT) "
                        "below the knee, in the twin (disagg.bench.prediction)")
    pr.add_argument("--goodput", type=Path, default=Path("docs/results/goodput.json"),
                    help="the goodput results whose below-knee cells are replayed (default: %(default)s)")
    pr.add_argument("--out", type=Path, default=Path("docs/results/prediction.json"),
                    help="results file (docs/results/prediction.json: the docs' tables come from it; `make docs`)")
    pr.set_defaults(func=_cmd_prediction)


def _kv(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep:
            raise SystemExit(f"disagg bench: {what} must be MIX=VALUE, got {it!r}")
        out[k] = v
    return out


def _run_and_report(run: Callable[[], Any], table: Callable[[Any], str], out: Path | None) -> int:
    """Run a benchmark (it stops its own processes, also on Ctrl-C), then print its table and results file."""
    try:
        result = run()
    except KeyboardInterrupt:
        print("interrupted; all benchmark processes stopped")
        return 130
    print()
    print(table(result))
    print(f"\nresults: {out}")
    if out is not None and out.parent.as_posix().endswith("docs/results"):
        print("regenerate the docs' tables from it: make docs (python -m disagg.bench.docs)")
    return 0


def _ints(value: str | None, flag: str) -> tuple[int, ...]:
    if not value:
        return ()
    try:
        return tuple(int(x) for x in value.split(","))
    except ValueError:
        raise SystemExit(f"disagg bench goodput: {flag} must be integers separated by commas, got {value!r}") from None


def _cmd_goodput(args: argparse.Namespace) -> int:
    import dataclasses

    from ..load.workload import ALL_MIXES, HELDOUT_MIXES, MIXES
    from . import goodput, goodput_live

    if args.heldout and args.real:
        print("disagg bench goodput: --heldout runs in the twin; it does not combine with --real")
        return 2
    if args.name is not None and args.real:
        print("disagg bench goodput: --name names a results document of the twin sweep; it does not combine with "
              "--real")
        return 2
    if args.heldout and args.name not in (None, goodput.HELDOUT_BENCHMARK):
        print(f"disagg bench goodput: --heldout writes {goodput.HELDOUT_BENCHMARK}, not --name {args.name}")
        return 2
    args.mixes = args.mixes or list(HELDOUT_MIXES if args.heldout else goodput.SWEEP_PLANS)
    known = MIXES if args.real else ALL_MIXES
    unknown = [m for m in args.mixes if m not in known]
    if unknown:
        print(f"disagg bench goodput: --mixes: unknown mix {unknown}; known: {sorted(MIXES)}"
              + ("" if args.real else f", held out: {sorted(HELDOUT_MIXES)}"))
        return 2
    def floats(items: list[str], flag: str) -> dict[str, tuple[float, ...]]:
        out = {}
        for m, v in _kv(items, flag).items():
            try:
                out[m] = tuple(float(x) for x in v.split(","))
            except ValueError:
                raise SystemExit(f"disagg bench goodput: {flag} {m}: rates must be numbers, got {v!r}") from None
        return out

    if any(n < 2 for n in args.gpus):
        print(f"disagg bench goodput: --gpus: each count must be >= 2, got {args.gpus}")
        return 2
    if not args.real:
        from ..results import invoked_command
        from .docs import REGISTRY

        plans = dict(goodput.ALL_PLANS)
        for m, rs in floats(args.rates_per_gpu, "--rates-per-gpu").items():
            plans[m] = dataclasses.replace(plans.get(m, goodput.SweepPlan(m, ())), rates_per_gpu=rs)
        ts = goodput.TwinSettings(gpus=args.gpus[0], gpu=args.gpu, model_preset=args.model_preset, seed=args.seed,
                                  duration_s=args.duration or goodput.TwinSettings.duration_s,
                                  splits=_ints(args.splits, "--splits"), budgets=_ints(args.budgets, "--budgets"),
                                  variants=tuple(args.variants), jobs=args.jobs)
        benchmark = args.name or (goodput.HELDOUT_BENCHMARK if args.heldout else "goodput")
        out = args.out or REGISTRY[benchmark].results
        try:
            for n in args.gpus:
                dataclasses.replace(ts, gpus=n).validate()
        except ValueError as e:
            print(f"disagg bench goodput: {e}")
            return 2
        command = invoked_command({goodput.HELDOUT_BENCHMARK: goodput.HELDOUT_COMMAND,
                                   goodput.CLUSTER_BENCHMARK: goodput.CLUSTER_COMMAND}.get(benchmark, goodput.COMMAND))
        return _run_and_report(lambda: goodput.run_twin(args.mixes, ts, plans, out=out, gpus=args.gpus,
                                                        command=command, benchmark=benchmark),
                               goodput.twin_table, out)
    real_plans = dict(goodput_live.PLANS)
    for m, rs in floats(args.rate, "--rate").items():
        real_plans[m] = dataclasses.replace(real_plans[m], rate=rs[0])
    for m, v in _kv(args.split, "--split").items():
        ps = [int(x) for x in v.split(",")]
        real_plans[m] = dataclasses.replace(real_plans[m], prefill=ps[0], prefill_conditional=ps[-1])
    if args.duration:
        real_plans = {m: dataclasses.replace(p, duration_s=args.duration) for m, p in real_plans.items()}
    s = goodput_live.Settings(gpus=args.gpus[0], time_scale=args.time_scale, gpu=args.gpu,
                              model_preset=args.model_preset, ttft_slo_ms=args.ttft_slo_ms,
                              tpot_slo_ms=args.tpot_slo_ms, seed=args.seed)
    header = (f"goodput benchmark (real processes): {s.gpus} simulated {s.gpu} GPUs × {s.model_preset}, time-scale "
              f"{s.time_scale}, SLO TTFT ≤ {s.ttft_slo_ms:g} ms and TPOT ≤ {s.tpot_slo_ms:g} ms per request\n")
    real_out = args.out or Path("results/bench-goodput-real.json")
    return _run_and_report(
        lambda: goodput_live.run(args.mixes, args.deployments, s, real_plans, out=real_out, log_dir=args.log_dir),
        lambda r: header + goodput_live.table(r["rows"], r["ratios"]), real_out)


def _cmd_router(args: argparse.Namespace) -> int:
    from . import router_bench

    return _run_and_report(lambda: router_bench.run(streams=args.streams, rounds=args.rounds, tokens=args.tokens,
                                                    time_scale=args.time_scale, targets=args.targets,
                                                    nginx=args.nginx, out=args.out), router_bench.table, args.out)


def _cmd_autoscale(args: argparse.Namespace) -> int:
    if args.virtual:
        import shlex

        from . import autoscale_day

        return autoscale_day.main(shlex.split(args.virtual_args))
    from . import autoscale

    s = autoscale.Settings(base_rate=args.base_rate, step_factor=args.step_factor, step_pre_s=args.step_pre,
                           step_post_s=args.step_post, trough_rate=args.trough_rate, peak_rate=args.peak_rate,
                           day_s=args.day, probe_s=args.probe,
                           scale_down_stabilization_s=args.scale_down_stabilization, seed=args.seed,
                           parts=tuple(args.parts))
    from .oracle import OracleSettings, autoscale_oracle

    # the hindsight oracle: per time bucket, the fewest GPUs whose split holds that bucket's load (twin probes)
    oracle = autoscale_oracle(OracleSettings(max_replicas=s.max_replicas, target=autoscale.ATTAINMENT_TARGET,
                                             seed=s.seed))
    return _run_and_report(lambda: autoscale.run(s, out=args.out, log_dir=args.log_dir, hindsight_oracle=oracle),
                           autoscale.table, args.out)


def _cmd_soak(args: argparse.Namespace) -> int:
    from . import soak

    return _run_and_report(lambda: soak.run(rate=args.rate, seed=args.seed, out=args.out, log_dir=args.log_dir,
                                            say=lambda m: print(f"soak: {m}", flush=True)),
                           soak.table, args.out)


def _cmd_operator(args: argparse.Namespace) -> int:
    from .operator_bench import main

    return main(args.models, args.out, args.steady_window, controller_manager=not args.without_controller_manager)


def _cmd_real_engine(args: argparse.Namespace) -> int:
    from .real_engine import run

    result = run(args.out, seed=args.seed, log_dir=args.log_dir)
    for c in result["held_out"]:
        real, sim, err = c["real"], c["sim"], c["error"]
        load = f"{c['rate']:5.1f} req/s" if c["rate"] is not None else "burst      "
        print(f"{load}  TTFT mean real {real['ttft_mean_ms']:7.1f} sim {sim['ttft_mean_ms']:7.1f}"
              f" ms ({err['ttft_mean_ms']:+.0%})  TPOT mean real {real['tpot_mean_ms']:5.2f} sim "
              f"{sim['tpot_mean_ms']:5.2f} ms ({err['tpot_mean_ms']:+.0%})")
    print(f"results: {args.out}")
    return 0


def _cmd_sim(args: argparse.Namespace) -> int:
    from ..sim.bench import main

    return main((["--strict"] if args.strict else []) + (["--out", str(args.out)] if args.out else [])
                + (["--no-write"] if args.no_write else []))


def _cmd_prefix_cache(args: argparse.Namespace) -> int:
    from . import prefix_cache

    return _run_and_report(lambda: prefix_cache.run(args.seed, args.conversations, args.agents, args.decode,
                                                    args.kv_blocks, out=args.out),
                           lambda doc: prefix_cache.render_tables(doc)["placement"], args.out)


def _cmd_prediction(args: argparse.Namespace) -> int:
    from . import prediction

    if not args.goodput.is_file():
        print(f"disagg bench prediction: --goodput: no such file {args.goodput} (make bench-goodput writes it)")
        return 2
    return _run_and_report(lambda: prediction.run(args.goodput, out=args.out),
                           lambda doc: prediction.render_tables(doc)["accuracy"], args.out)


def _cmd_decision(args: argparse.Namespace) -> int:
    from . import decision

    if args.snapshots < 2:
        print(f"disagg bench decision: --snapshots: must be >= 2, got {args.snapshots}")
        return 2
    if args.rounds < 1:
        print(f"disagg bench decision: --rounds: must be >= 1, got {args.rounds}")
        return 2
    return _run_and_report(lambda: decision.run(args.snapshots, args.rounds, args.seed, out=args.out),
                           lambda doc: decision.render_tables(doc)["cost"], args.out)


def _cmd_overload(args: argparse.Namespace) -> int:
    import time

    from ..plan.verify import quiet_logs
    from ..results import invoked_command, machine_facts, results_doc, write_results
    from . import overload

    def say(row: dict[str, Any]) -> None:
        c, b = row["chat"], row["batch"]
        print(f"overload: batch {row['batch_rate']:g} req/s, {row['policy']}: chat attainment {c['attainment']}, "
              f"batch attainment {b['attainment']} ({b['goodput_rps']} req/s within the SLO, {b['refused_429']} "
              "refused)", flush=True)

    mixes = overload.MIX_NAMES if args.mixes is None else tuple(args.mixes)
    unknown = [m for m in mixes if m not in overload.MIX_NAMES]
    if unknown:
        print(f"disagg bench overload: --mixes: unknown {unknown}; known: {list(overload.MIX_NAMES)}")
        return 2

    def say_mix(row: dict[str, Any]) -> None:
        print(f"overload: {row['mix']} @ {row['rate']:g}/s, every tenant {row['policy']}: goodput "
              f"{row['goodput_rps']:.1f} req/s, attainment {row['attainment']}, {row['refused_429']} refused",
              flush=True)

    def run() -> dict[str, Any]:
        t0 = time.perf_counter()
        with quiet_logs():
            results = overload.run(args.duration, args.seed, progress=say, mixes=mixes, mix_progress=say_mix)
        doc = results_doc("overload", invoked_command(overload.COMMAND), results,
                          machine_facts(wall_s=round(time.perf_counter() - t0, 1)))
        write_results(args.out, doc)
        return doc

    return _run_and_report(run, lambda doc: "\n\n".join(overload.render_tables(doc).values()), args.out)


def _cmd_plan_accuracy(args: argparse.Namespace) -> int:
    from . import plan_accuracy

    unknown = [m for m in args.mixes or [] if m not in plan_accuracy.HELD_OUT]
    if unknown:
        print(f"disagg bench plan: unknown mix {unknown}; known: {sorted(plan_accuracy.HELD_OUT)}")
        return 2
    from ..plan.verify import quiet_logs

    with quiet_logs():
        return _run_and_report(lambda: plan_accuracy.run(args.mixes, args.seed, out=args.out,
                                                         say=lambda m: print(f"plan: {m}", flush=True)),
                               plan_accuracy.table, args.out)

"""``disagg bench goodput|router|sim|autoscale|operator|soak`` (argument definitions only; heavy imports happen
inside the handlers)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks: goodput (policies × mixes), router (relay overhead), "
                                  "sim (roofline vs references); see docs/benchmarks.md")
    sub = bench.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")

    g = sub.add_parser("goodput", help="aggregated vs always-disaggregated vs conditional at equal GPU count",
                       description="Starts fresh sims + a router per (mix, deployment) on loopback, drives the mix "
                       "open-loop, prints goodput / TTFT / TPOT and the ratios c/a, c/b.")
    g.add_argument("--mixes", nargs="+", default=["short-chat", "long-rag", "mixed"])
    g.add_argument("--deployments", nargs="+", default=["aggregated", "disaggregated", "conditional"],
                   choices=["aggregated", "disaggregated", "conditional"])
    g.add_argument("--gpus", type=int, default=4, help="simulated GPUs per deployment (one worker per GPU)")
    g.add_argument("--time-scale", type=float, default=1.0,
                   help="sim wall seconds per simulated second (the offered token rate / time-scale must fit the CPUs)")
    g.add_argument("--gpu", default="H100-SXM")
    g.add_argument("--model-preset", default="Llama-3.1-8B")
    g.add_argument("--ttft-slo-ms", type=float, default=1000.0)
    g.add_argument("--tpot-slo-ms", type=float, default=50.0)
    g.add_argument("--rate", action="append", default=[], metavar="MIX=RPS",
                   help="offered requests per simulated second for a mix (default: the plan's)")
    g.add_argument("--split", action="append", default=[], metavar="MIX=P[,Pc]",
                   help="prefill workers of (b) [and (c)] for a mix")
    g.add_argument("--duration", type=float, default=None, help="simulated seconds of arrivals per run")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--out", type=Path, default=Path("results/bench-goodput.json"))
    g.add_argument("--log-dir", type=Path, default=None, help="keep the processes' logs here")
    g.set_defaults(func=_cmd_goodput)

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
    r.add_argument("--out", type=Path, default=Path("results/bench-router.json"))
    r.set_defaults(func=_cmd_router)

    s = sub.add_parser("sim", help="the twin's prefill/decode tokens/s per preset vs published references "
                       "(disagg.sim.bench)")
    s.add_argument("--strict", action="store_true", help="exit 1 when a reference is outside ±25 %%")
    s.set_defaults(func=_cmd_sim)

    o = sub.add_parser("operator", help="operator convergence for N models on the real control plane")
    o.add_argument("--models", type=int, nargs="+", default=[10, 50, 200],
                   help="model counts to run (default 10 50 200)")
    o.add_argument("--steady-window", type=float, default=30.0, help="seconds of no change to count writes in")
    o.add_argument("--out", type=Path, default=None, help="JSON results file")
    o.set_defaults(func=_cmd_operator)

    a = sub.add_parser("autoscale", help="the autoscaler in the twin: 3x load step recovery, diurnal GPU-seconds vs "
                       "an oracle static split (local stack)",
                       description="Starts the local stack (control plane, operator, sim pods, Prometheus) and runs "
                       "a load step, a compressed diurnal day and oracle probes; see disagg.bench.autoscale.")
    a.add_argument("--parts", nargs="+", default=["step", "diurnal", "oracle"], choices=["step", "diurnal", "oracle"])
    a.add_argument("--base-rate", type=float, default=1.0, help="req/s before the step")
    a.add_argument("--step-factor", type=float, default=3.0)
    a.add_argument("--step-pre", type=float, default=30.0, help="seconds before the step")
    a.add_argument("--step-post", type=float, default=75.0, help="seconds after the step")
    a.add_argument("--trough-rate", type=float, default=0.5)
    a.add_argument("--peak-rate", type=float, default=3.0)
    a.add_argument("--day", type=float, default=150.0, help="wall seconds of the compressed day")
    a.add_argument("--probe", type=float, default=25.0, help="seconds per oracle probe")
    a.add_argument("--scale-down-stabilization", type=int, default=30)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--out", type=Path, default=Path("results/bench-autoscale.json"))
    a.add_argument("--log-dir", type=Path, default=None, help="keep the processes' logs here")
    a.set_defaults(func=_cmd_autoscale)

    k = sub.add_parser("soak", help="every component fails once under steady mixed load (local stack); issue 12 §7",
                       description="Starts the local stack, deploys the demo model (two decode replicas) and, under "
                       "steady mixed load, kills a prefill pod, kills a decode pod with streams in flight, stalls KV "
                       "pulls, stops Prometheus for two intervals, restarts the operator and the router; see "
                       "disagg.local.soak and docs/benchmarks.md R2.")
    k.add_argument("--rate", type=float, default=1.5, help="req/s of the soak mix")
    k.add_argument("--seed", type=int, default=7)
    k.add_argument("--out", type=Path, default=Path("results/bench-soak.json"))
    k.add_argument("--log-dir", type=Path, default=None, help="keep the processes' logs here")
    k.set_defaults(func=_cmd_soak)


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
    return 0


def _cmd_goodput(args: argparse.Namespace) -> int:
    import dataclasses

    from ..load.workload import MIXES
    from . import goodput

    unknown = [m for m in args.mixes if m not in MIXES]
    if unknown:
        print(f"disagg bench goodput: unknown mix {unknown}; known: {sorted(MIXES)}")
        return 2
    plans = dict(goodput.PLANS)
    for m, v in _kv(args.rate, "--rate").items():
        plans[m] = dataclasses.replace(plans[m], rate=float(v))
    for m, v in _kv(args.split, "--split").items():
        ps = [int(x) for x in v.split(",")]
        plans[m] = dataclasses.replace(plans[m], prefill=ps[0], prefill_conditional=ps[-1])
    if args.duration:
        plans = {m: dataclasses.replace(p, duration_s=args.duration) for m, p in plans.items()}
    s = goodput.Settings(gpus=args.gpus, time_scale=args.time_scale, gpu=args.gpu, model_preset=args.model_preset,
                         ttft_slo_ms=args.ttft_slo_ms, tpot_slo_ms=args.tpot_slo_ms, seed=args.seed)
    header = (f"goodput benchmark: {s.gpus} simulated {s.gpu} GPUs × {s.model_preset}, time-scale {s.time_scale}, "
              f"SLO TTFT ≤ {s.ttft_slo_ms:g} ms and TPOT ≤ {s.tpot_slo_ms:g} ms per request\n")
    return _run_and_report(
        lambda: goodput.run(args.mixes, args.deployments, s, plans, out=args.out, log_dir=args.log_dir),
        lambda r: header + goodput.table(r["rows"], r["ratios"]), args.out)


def _cmd_router(args: argparse.Namespace) -> int:
    from . import router_bench

    return _run_and_report(lambda: router_bench.run(streams=args.streams, rounds=args.rounds, tokens=args.tokens,
                                                    time_scale=args.time_scale, targets=args.targets,
                                                    nginx=args.nginx, out=args.out), router_bench.table, args.out)


def _cmd_autoscale(args: argparse.Namespace) -> int:
    from . import autoscale

    s = autoscale.Settings(base_rate=args.base_rate, step_factor=args.step_factor, step_pre_s=args.step_pre,
                           step_post_s=args.step_post, trough_rate=args.trough_rate, peak_rate=args.peak_rate,
                           day_s=args.day, probe_s=args.probe,
                           scale_down_stabilization_s=args.scale_down_stabilization, seed=args.seed,
                           parts=tuple(args.parts))
    return _run_and_report(lambda: autoscale.run(s, out=args.out, log_dir=args.log_dir), autoscale.table, args.out)


def _cmd_soak(args: argparse.Namespace) -> int:
    from ..local import soak

    s = soak.Settings(rate=args.rate, seed=args.seed)
    return _run_and_report(lambda: soak.run_bench(s, out=args.out, log_dir=args.log_dir,
                                                  say=lambda m: print(f"soak: {m}", flush=True)),
                           soak.table, args.out)


def _cmd_operator(args: argparse.Namespace) -> int:
    from .operator_bench import main

    return main(args.models, args.out, args.steady_window)


def _cmd_sim(args: argparse.Namespace) -> int:
    from ..sim.bench import main

    return main(["--strict"] if args.strict else [])

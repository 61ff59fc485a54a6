"""``disagg plan PROFILE.yaml [--out MODEL.yaml] [--verify]`` (or ``--from-log`` / ``--from-prometheus`` instead of
the file) and ``disagg replay LOG.jsonl --candidate SPEC.yaml …`` (argument definitions only; the work happens in
the handlers)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "plan", help="capacity planner: from a traffic profile to a DisaggregatedModel (docs/planning.md)",
        description="Searches aggregated, disaggregated and conditional serving (P:D split, TP per pool, GPU type, "
        "replicas) with an analytic queueing model on the simulator's roofline, prints the ranked candidates and why "
        "the winner wins, and writes the winner as a DisaggregatedModel. Exit 0: a plan; 1: no feasible plan "
        "(the closest candidates are printed); 2: the profile (or log, or Prometheus source) is wrong (each "
        "error names its field or flag).")
    p.add_argument("profile", type=Path, nargs="?", default=None,
                   help="traffic profile YAML (docs/examples/profiles/profile-*.yaml); or use --from-log / "
                   "--from-prometheus")
    p.add_argument("--out", type=Path, default=None, help="write the winning DisaggregatedModel here (- for stdout)")
    p.add_argument("--verify", action="store_true",
                   help="run the top 3 candidates through the discrete-event twin and print predicted vs simulated")
    p.add_argument("--verify-requests", type=int, default=1500,
                   help="about this many arrivals per verified candidate (virtual duration = requests / peak rate, "
                   "30 s … 600 s)")
    p.add_argument("--verify-top", type=int, default=3, metavar="N",
                   help="verify the N cheapest candidates (default 3)")
    p.add_argument("--arrivals", type=Path, default=None, metavar="FILE",
                   help="with --verify: replay these recorded arrivals instead of Poisson ones — one arrival time per "
                   "line (seconds or ISO 8601; tokens drawn from the profile) or the router's request log (tokens as "
                   "recorded); with --from-log the log's own arrivals are used; the pick is then the cheapest "
                   "verified candidate that holds them")
    p.add_argument("--seed", type=int, default=0, help="seed of the verify arrivals and the twin")
    src = p.add_argument_group("profile sources other than a YAML file (model, SLO, GPUs from --base or flags)")
    src.add_argument("--from-log", type=Path, default=None, metavar="ROUTER.jsonl",
                     help="the router's JSON request log (schema 1 or 2; docs/planning.md \"The request log\")")
    src.add_argument("--from-prometheus", default=None, metavar="URL",
                     help="Prometheus holding the router's and the workers' metrics")
    src.add_argument("--range", default="1h", help="with --from-prometheus: how far back (e.g. 30m, 1h, 7d)")
    src.add_argument("--worker-selector", default="",
                     help="with --from-prometheus: label selector of the pool that sees every request once, e.g. "
                     "'{pod=~\"chat-decode-.*\"}'")
    src.add_argument("--window", type=float, default=60.0, help="seconds: the window the peak rate is taken over")
    src.add_argument("--base", type=Path, default=None,
                     help="a profile YAML giving model, slo, gpus, search (its traffic is replaced)")
    src.add_argument("--name", default=None, help="metadata.name of the plan")
    src.add_argument("--model", default=None, help="model preset (perf/presets.py), e.g. Llama-3.1-8B")
    src.add_argument("--ttft-ms", type=int, default=None, help="SLO: p95 TTFT target, ms")
    src.add_argument("--tpot-ms", type=int, default=None, help="SLO: p95 TPOT target, ms")
    src.add_argument("--goodput-target", type=float, default=None, help="SLO: share meeting both (default 0.9)")
    src.add_argument("--gpu", action="append", default=[], metavar="TYPE=COUNT[:COST]",
                     help="a GPU type on offer (repeatable), e.g. H100-SXM=16:1.0")
    src.add_argument("--max-gpus", type=int, default=None, help="search.maxGpus")
    src.add_argument("--write-profile", type=Path, default=None,
                     help="write the profile built from --from-log / --from-prometheus here (YAML)")
    p.set_defaults(func=_cmd_plan)

    r = subparsers.add_parser(
        "replay", help="what-if: replay a router request log through the twin with candidate specs",
        description="Replays the recorded arrivals (docs/planning.md \"The request log\") through the discrete-event "
        "twin once per DisaggregatedModel spec and prints goodput, TTFT/TPOT percentiles per path, decisions, "
        "fallbacks and GPU-seconds side by side with what the log recorded. Exit 2: a log or spec that cannot be "
        "used (each error names the field or flag).")
    r.add_argument("log", type=Path, help="the router's JSON request log (one line per request)")
    r.add_argument("--candidate", type=Path, action="append", default=[], metavar="SPEC.yaml",
                   help="a DisaggregatedModel to replay (repeatable)")
    r.add_argument("--live", type=Path, default=None, metavar="SPEC.yaml", help="the spec that served the log")
    r.add_argument("--out", type=Path, default=None, metavar="DIR", help="write replay.json and replay.html here")
    r.add_argument("--gpu", default=None, help="GPU preset for pools without gpu.product")
    r.add_argument("--model-preset", default=None, help="model preset when spec.model.name matches none")
    r.add_argument("--ttft-ms", type=float, default=None, help="SLO for every column (default: the live spec's)")
    r.add_argument("--tpot-ms", type=float, default=None)
    r.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    r.add_argument("--seed", type=int, default=0)
    r.set_defaults(func=_cmd_replay)


def _err(lines: list[str], prefix: str = "") -> int:
    import sys

    for line in lines:
        print(f"{prefix}{line}", file=sys.stderr)
    return 2


def _profile(args: argparse.Namespace) -> tuple[Any, Any]:
    """The profile from the file, the log or Prometheus, and the request log when it came from one; prints what it
    derived. ProfileError/LogError on failure."""
    import time

    from .profile import ProfileError, load_profile
    from .sources import Overrides, assemble, load_base, to_yaml

    sources = [s for s in (args.profile, args.from_log, args.from_prometheus) if s is not None]
    if len(sources) != 1:
        raise ProfileError(["give one profile source: PROFILE.yaml, --from-log ROUTER.jsonl or --from-prometheus "
                            "URL" + (f" (got {len(sources)})" if sources else "")])
    if args.profile is not None:
        try:
            return load_profile(args.profile), None
        except ProfileError as e:
            raise ProfileError([f"{args.profile}: {x}" for x in e.problems]) from None
    o = Overrides(name=args.name, model=args.model, ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms,
                  goodput_target=args.goodput_target, gpus=tuple(args.gpu), max_gpus=args.max_gpus)
    base = load_base(args.base)
    log = None
    if args.from_log is not None:
        from .reqlog import read_log, traffic_from_log

        log = read_log(args.from_log)
        traffic, notes = traffic_from_log(log, args.window)
        source = str(args.from_log)
    else:
        from prometheus_api_client import PrometheusApiClientException

        from .prom import PromSourceError, connect, parse_duration, traffic_from_prometheus

        range_s = parse_duration(args.range)
        q, qr = connect(args.from_prometheus)
        try:
            traffic, notes = traffic_from_prometheus(q, qr, time.time(), range_s, args.window, args.worker_selector)
        except (OSError, PrometheusApiClientException) as e:
            raise PromSourceError(f"--from-prometheus {args.from_prometheus}: cannot query it ({e})") from None
        source = f"Prometheus {args.from_prometheus}"
    try:
        prof = assemble(traffic, base, o, source)
    except ProfileError as e:
        raise ProfileError([f"{source}: {x}" for x in e.problems]) from None
    for n in notes:
        print(f"profile from {source}: {n}")
    if args.write_profile is not None:
        args.write_profile.write_text(f"# built by disagg plan from {source}\n" + to_yaml(prof))
        print(f"wrote the profile to {args.write_profile}")
    return prof, log


def _check_verify_flags(args: argparse.Namespace) -> list[str]:
    problems = []
    if args.arrivals is not None and not args.verify:
        problems.append("--arrivals: the recorded arrivals are replayed to verify the plan: add --verify")
    if args.arrivals is not None and args.from_log is not None:
        problems.append("--arrivals: --from-log already gives the recorded arrivals (its own): pass one of the two")
    if args.verify_top < 1:
        problems.append(f"--verify-top: must be at least 1, got {args.verify_top}")
    if args.verify_requests < 1:
        problems.append(f"--verify-requests: must be at least 1, got {args.verify_requests}")
    return problems


def _recorded(args: argparse.Namespace, profile: Any, log: Any, settings: Any) -> Any:
    """The recorded arrivals ``--verify`` replays (None: Poisson ones from the profile). LogError on a bad file."""
    from .arrivals import profile_arrivals
    from .burst import measure as burstiness
    from .reqlog import arrivals as log_arrivals
    from .reqlog import read_arrivals_file
    from .verify import recorded

    if log is not None:
        arr, _ = log_arrivals(log)
        return recorded(arr, f"log {args.from_log}", settings)
    if args.arrivals is None:
        return None
    times, alog = read_arrivals_file(args.arrivals)
    b, _ = burstiness(times)
    declared = profile.traffic.burstiness.model_dump(by_alias=True, exclude_none=True)
    print(f"--arrivals {args.arrivals}: {len(times)} arrivals over {times[-1]:.0f} s, mean "
          f"{(len(times) - 1) / max(times[-1], 1e-9):.3g} req/s; measured "
          + ", ".join(f"{k} {v:g}" for k, v in b.items())
          + "; the profile declares " + ", ".join(f"{k} {v:g}" for k, v in declared.items()))
    if alog is not None:
        arr, _ = log_arrivals(alog)
        return recorded(arr, f"log {args.arrivals}", settings)
    arr = profile_arrivals(profile, times[-1], seed=settings.seed, times=times)
    return recorded(arr, f"--arrivals {args.arrivals}", settings, tokens_recorded=False)


def _cmd_plan(args: argparse.Namespace) -> int:
    import sys

    import yaml

    from ..api.validate import errors_of
    from .emit import to_model
    from .profile import ProfileError
    from .prom import PromSourceError
    from .report import render
    from .reqlog import LogError
    from .search import search

    problems = _check_verify_flags(args)
    if problems:
        return _err(problems)
    try:
        profile, log = _profile(args)
    except ProfileError as e:
        return _err(e.problems)
    except (LogError, PromSourceError) as e:
        return _err([str(e)])
    result = search(profile)
    print(render(result))
    rc = 0 if result.winner is not None else 1
    pick = result.winner
    if args.verify:
        from .verify import SpecError, VerifySettings, cheapest_holding, quiet_logs, render_verify, verify

        s = VerifySettings(requests=args.verify_requests, seed=args.seed, top=args.verify_top)
        print()
        try:
            rec = _recorded(args, profile, log, s)
            with quiet_logs():
                vrows = verify(result, s, rec=rec)
        except SpecError as e:
            return _err(e.problems, "--verify: ")
        except LogError as e:
            return _err([str(e)])
        print(render_verify(vrows, s, profile.traffic.rate.peak, rec))
        missed = [r for r in vrows if r.misses]
        if missed:
            print(f"warning: {len(missed)} of {len(vrows)} verified candidates miss the goodput target "
                  f"{profile.slo.goodput_target:.0%} in the twin: " + "; ".join(
                      f"#{r.rank} {r.label} {r.simulated.attainment:.1%}"
                      + ("" if r.worst_window is None else f" (worst window {r.worst_window:.1%})") for r in missed))
        if rec is not None and pick is not None:
            # on recorded arrivals the pick is the cheapest verified candidate that holds them
            held = cheapest_holding(vrows)
            if held is None:
                print(f"no plan: none of the {len(vrows)} verified candidates holds the recorded arrivals in the "
                      "twin; verify more (--verify-top), declare the bursts (traffic.burstiness) or raise "
                      "search.extraHeadroom; nothing is written")
                return 1
            if held.candidate is not pick:
                print(f"pick: #{held.rank} {held.label}, the cheapest verified candidate that holds the recorded "
                      f"arrivals (the model's #1, {pick.label()}, does not)")
            pick = held.candidate
    if pick is None:
        return rc
    if args.out is not None:
        doc = to_model(result, pick)
        errors = errors_of(doc)
        if errors:  # a planner bug, not the user's: say so rather than write a spec the apiserver refuses
            for err in errors:
                print(f"internal error, emitted spec invalid: {err}", file=sys.stderr)
            return 3
        text = (f"# generated by `disagg plan {args.profile or args.from_log or args.from_prometheus}`: "
                f"{pick.label()}\n" + yaml.safe_dump(doc, sort_keys=False))
        if str(args.out) == "-":
            sys.stdout.write(text)
        else:
            args.out.write_text(text)
            print(f"\nwrote {args.out} (checked with disagg validate's rules)")
    return rc


def _cmd_replay(args: argparse.Namespace) -> int:
    from ..twin import SLO
    from .replay import load_spec, render, replay, write
    from .reqlog import LogError, read_log
    from .verify import SpecError, quiet_logs

    if not args.candidate and args.live is None:
        return _err(["disagg replay: give at least one --candidate SPEC.yaml (or --live SPEC.yaml)"])
    try:
        log = read_log(args.log)
    except LogError as e:
        return _err([str(e)])
    specs = []
    problems: list[str] = []
    named = ([("live", args.live)] if args.live is not None else []) + [(c.stem, c) for c in args.candidate]
    seen: dict[str, int] = {}
    for name, path in named:
        seen[name] = seen.get(name, 0) + 1
        col = name if seen[name] == 1 else f"{name}#{seen[name]}"
        try:
            specs.append((col, path, load_spec(path, gpu=args.gpu, model_preset=args.model_preset)))
        except SpecError as e:
            problems += e.problems
    if problems:
        return _err(problems)
    slo = None
    if args.ttft_ms is not None or args.tpot_ms is not None:
        base = specs[0][2].slo
        slo = SLO(ttft_ms=args.ttft_ms or base.ttft_ms, tpot_ms=args.tpot_ms or base.tpot_ms)
    try:
        with quiet_logs():
            report = replay(log, specs, seed=args.seed, slo=slo, limit=args.limit)
    except SpecError as e:
        return _err(e.problems)
    print(render(report))
    if args.out is not None:
        for f in write(report, args.out):
            print(f"wrote {f}")
    return 0

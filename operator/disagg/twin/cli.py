"""``disagg twin``: one scenario in virtual time (argument definitions here; the work in :func:`run_scenario`).

A scenario is a YAML file (``--scenario``) and/or flags; flags win::

    prefill: {count: 16, gpu: H100-SXM, modelPreset: Llama-3.1-8B, tp: 1}
    decode: {count: 48, maxNumSeqs: 256}
    router: {mode: Disaggregated, routing: {remotePrefill: {minInputTokens: 2048}}}   # router.yaml
    tuning: {decode_pressure_kv_usage: 0.5}      # policy.Tuning
    scrapeIntervalS: 1.0
    transport: rdma
    workload: {mix: mixed, rate: 200, duration: 300}   # or arrivals: path/to/arrivals.jsonl
    slo: {ttftMs: 1000, tpotMs: 50}
    seed: 0

An arrivals file has one JSON object per line with :class:`~disagg.twin.arrivals.Arrival`'s fields (``at``,
``input_tokens``, ``output_tokens``, optional ``tenant``, ``prefix_key``, ``prefix_tokens``, ``request_id``, ...).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HELP = "run a scenario in the twin (virtual time, one process): the simulator's engines + the router's request core"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("twin", help=HELP, description=HELP)
    p.add_argument("--scenario", type=Path, help="scenario YAML (pools, router, workload, slo, seed)")
    for role in ("prefill", "decode", "aggregated"):
        p.add_argument(f"--{role}", type=int, metavar="N", help=f"{role} workers (overrides the scenario)")
    p.add_argument("--gpu", help="GPU preset of every pool given by flags (default H100-SXM)")
    p.add_argument("--model-preset", help="model preset of every pool given by flags (default Llama-3.1-8B)")
    p.add_argument("--tp", type=int, help="tensor parallel size of every pool given by flags (default 1)")
    p.add_argument("--router-config", type=Path, help="RouterConfig YAML (router.yaml), replaces the scenario's")
    p.add_argument("--mix", help="workload mix (load/workload.py: short-chat, long-rag, mixed, soak)")
    p.add_argument("--rate", type=float, help="requests per simulated second (Poisson)")
    p.add_argument("--duration", type=float, help="simulated seconds of arrivals")
    p.add_argument("--arrivals", type=Path, help="JSON-lines arrivals file instead of a mix")
    p.add_argument("--ttft-slo-ms", type=float, help="TTFT SLO (default 1000)")
    p.add_argument("--tpot-slo-ms", type=float, help="TPOT SLO (default 50)")
    p.add_argument("--scrape-interval", type=float, help="router scrape interval, simulated seconds (default 1)")
    p.add_argument("--transport", help="KV transport preset: rdma, nvlink, tcp (default rdma)")
    p.add_argument("--seed", type=int, help="seed (workload and engines; default 0)")
    p.add_argument("--out", type=Path, help="write the result JSON here")
    p.add_argument("--records", action="store_true", help="include per-request records in the JSON")
    p.set_defaults(func=_cmd_twin)


def _cmd_twin(args: argparse.Namespace) -> int:
    try:
        doc = run_scenario(args)
    except (ValueError, OSError) as e:
        print(f"disagg twin: {e}", file=sys.stderr)
        return 2
    print(summary_text(doc))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
        print(f"wrote {args.out}")
    return 0


def _load_yaml(path: Path, what: str) -> dict[str, Any]:
    import yaml

    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{what} {path}: must be a YAML mapping")
    return data


def read_arrivals(path: Path) -> list[Any]:
    from .arrivals import Arrival

    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(Arrival(**json.loads(line)))
        except (TypeError, ValueError) as e:
            raise ValueError(f"--arrivals {path}:{n}: {e}") from None
    return out


def run_scenario(args: argparse.Namespace) -> dict[str, Any]:
    from .arrivals import arrivals_from_mix
    from .run import SLO, simulate
    from .spec import ClusterSpec

    sc = _load_yaml(args.scenario, "--scenario") if args.scenario else {}
    for role in ("prefill", "decode", "aggregated"):
        n = getattr(args, role)
        if n is not None:
            if n < 0:
                raise ValueError(f"--{role}: must be >= 0, got {n}")
            pool = dict(sc.get(role) or {})
            pool["count"] = n
            for flag, key in (("gpu", "gpu"), ("model_preset", "model_preset"), ("tp", "tp")):
                if getattr(args, flag) is not None:
                    pool[key] = getattr(args, flag)
            sc[role] = pool
    if args.router_config:
        sc["router"] = _load_yaml(args.router_config, "--router-config")
    if args.scrape_interval is not None:
        sc["scrapeIntervalS"] = args.scrape_interval
    if args.transport:
        sc["transport"] = args.transport
    spec = ClusterSpec.from_dict(sc)
    seed = args.seed if args.seed is not None else int(sc.get("seed", 0))
    slo_doc = sc.get("slo") or {}
    slo = SLO(ttft_ms=args.ttft_slo_ms or float(slo_doc.get("ttftMs", 1000.0)),
              tpot_ms=args.tpot_slo_ms or float(slo_doc.get("tpotMs", 50.0)))
    wl = dict(sc.get("workload") or {})
    arrivals_path = args.arrivals or (Path(sc["arrivals"]) if sc.get("arrivals") else None)
    window: float | None = None
    if arrivals_path is not None:
        arrivals = read_arrivals(arrivals_path)
        workload: dict[str, Any] = {"arrivals": str(arrivals_path)}
    else:
        mix = args.mix or wl.get("mix")
        rate = args.rate if args.rate is not None else wl.get("rate")
        duration = args.duration if args.duration is not None else wl.get("duration")
        if mix is None or rate is None or duration is None:
            raise ValueError("--mix, --rate and --duration (or the scenario's workload, or --arrivals) are required")
        arrivals = arrivals_from_mix(str(mix), float(rate), float(duration), seed=seed)
        window = float(duration)
        workload = {"mix": mix, "rate": float(rate), "duration_s": float(duration)}
    result = simulate(spec, arrivals, seed=seed, slo=slo, window_s=window)
    doc = result.to_dict(records=args.records)
    doc["workload"] = workload
    doc["cluster"] = {role: pool.count for role, pool in spec.pools().items()}
    doc["gpus"] = spec.gpus()
    return doc


def summary_text(doc: dict[str, Any]) -> str:
    pools = ", ".join(f"{k} {v['workers']}×({v['gpus'] // max(v['workers'], 1)} GPU) util {v['utilisation']:.0%}"
                      for k, v in doc["pools"].items())
    dec = ", ".join(f"{k} {v}" for k, v in doc["decisions"].items())
    slo = doc["slo"]
    return "\n".join([
        f"twin: {doc['requests']} requests, {doc['gpus']} GPUs ({pools})",
        f"  SLO TTFT ≤ {slo['ttft_ms']:g} ms, TPOT ≤ {slo['tpot_ms']:g} ms: attainment {doc['attainment']:.3f}, "
        f"goodput {doc['goodput_rps']:.2f} req/s, errors {doc['errors']}",
        f"  TTFT p50/p95 {doc['ttft_p50_ms']}/{doc['ttft_p95_ms']} ms, TPOT p50/p95 {doc['tpot_p50_ms']}/"
        f"{doc['tpot_p95_ms']} ms",
        f"  decisions: {dec}",
        f"  virtual {doc['makespan_s']:.1f} s in {doc['wall_s']:.2f} s wall ({doc['events']} events, "
        f"{doc['engine_steps']} engine steps), {doc['gpu_seconds']:.0f} GPU-seconds",
    ])

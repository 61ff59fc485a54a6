"""The twin's speed benchmark: how fast virtual time runs for a 64-GPU cluster (``python -m disagg.twin.bench``).

Each scenario is one :func:`disagg.twin.simulate` run (one process, one core); it reports wall and CPU seconds,
virtual seconds per wall second, loop events (virtual-time advances: a fast-forwarded run of decode steps is one)
and engine steps per second, and generated tokens per CPU second. The results document follows the benchmark
convention (disagg.bench.docs): ``docs/results/twin.json`` with :func:`render_tables`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COMMAND = "python -m disagg.twin.bench"
RESULTS = Path("docs") / "results" / "twin.json"
CONDITIONAL_ROUTING: dict[str, Any] = {
    "remotePrefill": {"minInputTokens": 2048, "maxPrefillQueueWaitMs": 150, "minExpectedOutputTokens": 64,
                      "requireDecodePoolPressure": False},
    "localPrefill": {"maxInputTokens": 1024, "preferWhenPrefixCacheHit": True},
    "fallback": {"onKVTransferTimeout": "LocalAggregated", "onPrefillQueueOverload": "LocalPrefill"},
}


@dataclass(frozen=True)
class Scenario:
    name: str
    prefill: int
    decode: int
    mix: str
    rate: float  # requests per simulated second
    duration_s: float  # simulated seconds of arrivals


# 64 H100s (16 prefill + 48 decode, Llama-3.1-8B, TP 1) under the goodput benchmark's mixed workload: 320 req/s is
# the per-GPU load of its 4-GPU plan (20 req/s on 4 GPUs), 100 req/s a lighter day.
SCENARIOS = (
    Scenario("64gpu-mixed-320rps-60s", 16, 48, "mixed", 320.0, 60.0),
    Scenario("64gpu-mixed-100rps-300s", 16, 48, "mixed", 100.0, 300.0),
)


def run_one(sc: Scenario, seed: int = 0) -> dict[str, Any]:
    from .arrivals import arrivals_from_mix
    from .run import simulate
    from .spec import ClusterSpec, PoolSpec

    spec = ClusterSpec(prefill=PoolSpec(sc.prefill), decode=PoolSpec(sc.decode),
                       router={"mode": "Disaggregated", "routing": CONDITIONAL_ROUTING})
    arrivals = arrivals_from_mix(sc.mix, sc.rate, sc.duration_s, seed=seed)
    cpu0, t0 = time.process_time(), time.perf_counter()
    r = simulate(spec, arrivals, seed=seed, window_s=sc.duration_s)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    tokens = sum(x.output_tokens for x in r.records)
    d = r.to_dict()
    return {
        "scenario": sc.name, "gpus": spec.gpus(), "prefill": sc.prefill, "decode": sc.decode, "mix": sc.mix,
        "rate": sc.rate, "duration_s": sc.duration_s, "requests": len(r.records), "output_tokens": tokens,
        "makespan_s": round(r.makespan_s, 1), "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
        "virtual_per_wall": round(r.makespan_s / wall, 3) if wall else None,
        "virtual_per_cpu": round(r.makespan_s / cpu, 3) if cpu else None,
        "events": r.events, "engine_steps": r.engine_steps,
        "events_per_cpu_s": round(r.events / cpu) if cpu else None,
        "steps_per_cpu_s": round(r.engine_steps / cpu) if cpu else None,
        "us_per_token": round(cpu / tokens * 1e6, 1) if tokens else None,
        "attainment": d["attainment"], "decisions": d["decisions"],
        "utilisation": {k: v["utilisation"] for k, v in d["pools"].items()},
    }


def render_tables(results_doc: dict[str, Any]) -> dict[str, str]:
    rows = results_doc["results"]["scenarios"]
    head = ("| scenario | GPUs | requests | output tokens | virtual s | wall s | CPU s | virtual s / CPU s | "
            "events / CPU s | engine steps / CPU s | µs CPU / token |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['gpus']} | {r['requests']} | {r['output_tokens']} | {r['makespan_s']} "
                     f"| {r['wall_s']} | {r['cpu_s']} | {r['virtual_per_cpu']} | {r['events_per_cpu_s']} | "
                     f"{r['steps_per_cpu_s']} | {r['us_per_token']} |")
    return {"speed": "\n".join(lines)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m disagg.twin.bench", description=__doc__)
    p.add_argument("--scenario", action="append", choices=[s.name for s in SCENARIOS],
                   help="run only these (default: all)")
    p.add_argument("--out", type=Path, default=RESULTS, help=f"results file (default {RESULTS})")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from ..results import results_doc, write_results

    rows = []
    for sc in SCENARIOS:
        if args.scenario and sc.name not in args.scenario:
            continue
        print(f"[twin bench] {sc.name} ...", flush=True)
        row = run_one(sc, args.seed)
        print(f"[twin bench] {sc.name}: {row['makespan_s']} virtual s in {row['wall_s']} s wall, {row['cpu_s']} s "
              f"CPU ({row['virtual_per_cpu']} virtual s per CPU s, {row['us_per_token']} µs/token)", flush=True)
        rows.append(row)
    command = " ".join([COMMAND, *map(shlex.quote, argv if argv is not None else sys.argv[1:])])
    doc = results_doc("twin", command, {"scenarios": rows, "seed": args.seed})
    write_results(args.out, doc)
    for table in render_tables(doc).values():
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

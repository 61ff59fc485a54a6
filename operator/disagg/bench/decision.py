"""``disagg bench decision``: the CPU cost of one routing decision (router/policy.py ``decide``) per policy, at a
fleet of 64 workers (16 prefill + 48 decode), on loaded snapshots.

The decision runs on the router's event loop for every request, so its cost is CPU per request: issue 27 budgets
the SLO placement at most 30 µs at p50 over the rule ladder (``Thresholds``). This measures ``decide`` alone (not
the snapshot of the workers, which both policies share: ``disagg bench router`` and twin/bench.py measure the rest),
each call timed with ``time.perf_counter_ns`` (wall time; ~0.1 µs to read — the thread CPU clock costs ~15 µs a
read on a VM without a vDSO for it, more than the ladder's whole decision) for the percentiles, the policies taking
turns on each input (a shared VM's speed drifts within seconds: run one after the other, they would be timed on
different machines), and the mean CPU time per call from ``time.thread_time_ns`` around each policy's whole rounds,
over a deterministic set of snapshots and prompts (seeded): loads
from idle to busy (running streams, KV usage, prefill backlogs and rates drawn per worker), prompts from 200 to
16 000 tokens. A warm-up pass first (the perf model's step constants are computed on first use).

Results: docs/results/decision.json; :func:`render_tables` (``cost``). The figures depend on the machine and its
load (they are CPU time, not wall time, so another process's load matters less); the command and the machine are
in the results file.
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path
from typing import Any

COMMAND = "disagg bench decision"
RESULTS = Path("docs") / "results" / "decision.json"
PREFILL, DECODE = 16, 48
PROMPTS = (200, 1000, 4000, 16_000)  # short (the ladder keeps it local) … long (remote candidate)
POLICIES = ("Thresholds", "SLO")
BUDGET_US = 30.0  # issue 27: the SLO placement adds at most this at p50 over the ladder


def snapshots(n: int, seed: int = 0) -> list[Any]:
    """``n`` load snapshots of a 16P + 48D fleet, from idle to busy (seeded)."""
    from ..perf.costs import EngineCost
    from ..router.policy_types import LoadSnapshot, WorkerLoad

    cost = EngineCost.from_profile(None)
    rng = random.Random(seed)
    out = []
    for i in range(n):
        busy = i / max(1, n - 1)  # 0 (idle) … 1 (busy)
        pre = tuple(WorkerLoad(url=f"http://p{j}", compat="c", role="prefill", cost=cost,
                               inflight=rng.randint(0, int(8 * busy) + 1),
                               est_wait_ms=rng.uniform(0, 400 * busy), ahead_tokens=rng.randint(0, int(40_000 * busy)),
                               prefill_rate=rng.uniform(0, 60_000 * busy), running=rng.randint(0, 2),
                               remote_idle_s=rng.choice((0.5, 10.0)))
                    for j in range(PREFILL))
        dec = tuple(WorkerLoad(url=f"http://d{j}", compat="c", role="decode", cost=cost,
                               inflight=rng.randint(0, int(200 * busy) + 1),
                               running=rng.randint(0, int(200 * busy) + 1), kv_usage=rng.uniform(0, 0.9 * busy),
                               ahead_tokens=rng.randint(0, int(8_000 * busy)),
                               prefill_rate=rng.uniform(0, 20_000 * busy), queued=rng.randint(0, int(4 * busy)),
                               prefill_size_tokens=(size := rng.uniform(500, 8_000)),
                               prefill_residual_tokens=size * rng.uniform(0.5, 1.0))
                    for j in range(DECODE))
        out.append(LoadSnapshot(prefill=pre, decode=dec, tenant_avg_output_tokens=200.0))
    return out


def measure(policies: tuple[str, ...], snaps: list[Any], prompts: tuple[int, ...] = PROMPTS,
            rounds: int = 3) -> list[dict[str, Any]]:
    """µs per ``decide`` call under each policy over every (snapshot, prompt), ``rounds`` times (after one
    warm-up pass); per prompt length and over all. The policies take turns on each input (their order alternating
    by round), so a change in the machine's speed during the run — frequent on a shared VM — reaches them alike;
    ``added_p50_us``: the median over the inputs of each policy's time less the first policy's on the same input.
    The mean CPU time per call: each policy's rounds again, whole, under ``time.thread_time_ns``."""
    from ..api.contract import RouterConfig
    from ..router.features import request_hash_fraction
    from ..router.policy import decide
    from ..router.policy_types import RequestFeatures

    cfgs = {p: RouterConfig.model_validate({"model": "m", "mode": "Disaggregated",
                                            "slo": {"ttftP95Ms": 1000, "tpotP95Ms": 50},
                                            "routing": {"policy": p}}) for p in policies}
    feats = {n: RequestFeatures(request_id=f"r{n}", endpoint="/v1/completions", input_tokens=n, max_tokens=256,
                                canary_fraction=request_hash_fraction(f"r{n}")) for n in prompts}
    for s in snaps:  # warm-up
        for n in prompts:
            for cfg in cfgs.values():
                decide(cfg, feats[n], s)
    per: dict[str, dict[int, list[float]]] = {p: {n: [] for n in prompts} for p in policies}
    decisions: dict[str, dict[str, int]] = {p: {} for p in policies}
    clock = time.perf_counter_ns
    for r in range(rounds):
        order = policies if r % 2 == 0 else policies[::-1]
        for s in snaps:
            for n in prompts:
                for p in order:
                    cfg, f = cfgs[p], feats[n]
                    t0 = clock()
                    d = decide(cfg, f, s)
                    per[p][n].append((clock() - t0) / 1000.0)
                    key = f"{d.decision}:{d.reason}"
                    decisions[p][key] = decisions[p].get(key, 0) + 1
    cpu_ns = dict.fromkeys(policies, 0)
    for p in policies:
        cfg = cfgs[p]
        c0 = time.thread_time_ns()
        for _ in range(rounds):
            for s in snaps:
                for n in prompts:
                    decide(cfg, feats[n], s)
        cpu_ns[p] = time.thread_time_ns() - c0

    def stats(xs: list[float]) -> dict[str, float]:
        xs = sorted(xs)
        return {"p50_us": round(statistics.median(xs), 1), "p95_us": round(xs[int(0.95 * (len(xs) - 1))], 1),
                "mean_us": round(statistics.fmean(xs), 1)}

    first = [x for xs in per[policies[0]].values() for x in xs]
    rows = []
    for p in policies:
        every = [x for xs in per[p].values() for x in xs]
        rows.append({"policy": p, "calls": len(every), **stats(every),
                     "added_p50_us": round(statistics.median([a - b for a, b in zip(every, first, strict=True)]), 1),
                     "cpu_mean_us": round(cpu_ns[p] / len(every) / 1000, 1),
                     "by_prompt": {str(n): stats(xs) for n, xs in per[p].items()},
                     "decisions": dict(sorted(decisions[p].items()))})
    return rows


def run(n_snapshots: int = 200, rounds: int = 3, seed: int = 0, out: Path | None = RESULTS) -> dict[str, Any]:
    from ..results import machine_facts, results_doc, write_results

    t0 = time.perf_counter()
    snaps = snapshots(n_snapshots, seed)
    rows = measure(POLICIES, snaps, rounds=rounds)
    by = {r["policy"]: r for r in rows}
    extra = round(by["SLO"]["p50_us"] - by["Thresholds"]["p50_us"], 1)
    results = {"settings": {"prefill_workers": PREFILL, "decode_workers": DECODE, "snapshots": n_snapshots,
                            "rounds": rounds, "seed": seed, "prompts": list(PROMPTS)},
               "rows": rows,
               "target": {"name": f"SLO adds ≤ {BUDGET_US:g} µs at p50 over Thresholds", "extra_p50_us": extra,
                          "paired_p50_us": by["SLO"]["added_p50_us"], "met": extra <= BUDGET_US}}
    doc = results_doc("decision", f"{COMMAND} --snapshots {n_snapshots} --rounds {rounds} --seed {seed}", results,
                      machine_facts(wall_s=round(time.perf_counter() - t0, 1)))
    if out is not None:
        write_results(out, doc)
    return doc


def render_tables(doc: dict[str, Any]) -> dict[str, str]:
    res = doc["results"]
    prompts = res["settings"]["prompts"]
    lines = ["| policy | p50 µs | p95 µs | mean µs | CPU µs (mean) | "
             + " | ".join(f"p50 µs, {n} tokens" for n in prompts) + " |",
             "|---|---:|---:|---:|---:|" + "---:|" * len(prompts)]
    for r in res["rows"]:
        lines.append(f"| {r['policy']} | {r['p50_us']:g} | {r['p95_us']:g} | {r['mean_us']:g} | {r['cpu_mean_us']:g} | "
                     + " | ".join(f"{r['by_prompt'][str(n)]['p50_us']:g}" for n in prompts) + " |")
    t = res["target"]
    verdict = "met" if t["met"] else "**missed**"
    st = res["settings"]
    cost = (f"One `decide` call (wall time per call; CPU time per call as a round's mean), "
            f"{st['prefill_workers']} prefill + {st['decode_workers']} "
            f"decode workers, {st['snapshots']} seeded snapshots from idle to busy × {len(prompts)} prompt lengths × "
            f"{st['rounds']} rounds, the policies taking turns on each input.\n\n" + "\n".join(lines)
            + f"\n\nOn the same input the SLO placement adds {t['paired_p50_us']:g} µs at the median."
            + f"\n\nTarget — {t['name']}: +{t['extra_p50_us']:g} µs, {verdict}.")
    return {"cost": cost}

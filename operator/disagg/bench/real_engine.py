"""``disagg bench real-engine``: the simulator's engine against a real vLLM engine (the real-engine tier's CPU
build), on the same requests.

1. **Fit** (``fit`` points): one real engine, idle, answers prompts of a few lengths (TTFT) and batches of a few
   sizes (TPOT). The CPU engine's constants — request overhead, step overhead, per-sequence cost and the FLOP rate
   — are fitted *through the sim's own step model* (``PerfModel``: the tiny model's linear and attention FLOPs,
   its weight stream), so the sim given the fit prices every fit point as the fit says. They become the
   ``vLLM-CPU-2core`` preset (disagg.perf.presets, disagg.perf.roofline ``GPU_EFFICIENCY``; a test checks that the
   committed constants are the committed fit).
2. **Check** (``held-out`` points): open-loop Poisson loads of mixed prompt and output lengths, at shares of the
   engine's measured capacity (so each point is the same regime on a fast or a slow CPU), against the real engine
   and then against ``disagg sim`` started with the same arguments and the fit: mean and p90 TTFT, mean TPOT, side
   by side. What it checks is the sim's *scheduling* — continuous batching, chunked prefill, queueing — against
   vLLM's own scheduler, since the step costs come from the fit.

Prompts are token ids (random, seeded: no two share a prefix, both engines see the same lengths). Results:
docs/results/real-engine.json (docs/simulator.md "The real engine"). ~20 minutes on 2 cores.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp

from ..load import loadgen
from ..local import realengine
from ..local.procs import free_ports, process_tree, stop_group, wait_http
from ..local.runtime import REAL_ENGINE_ENV
from ..perf.presets import get_gpu, get_model, infer_model
from ..perf.roofline import PerfModel
from ..results import invoked_command, results_doc, write_results

GPU_PRESET = "vLLM-CPU-2core"
# the engine both runs get: the tiny model, lean CPU settings, an explicit batch budget so the sim's is the same
# a KV cache of 4 MiB holds 8,192 tokens (the tiny model: 512 bytes a token): the Poisson loads' few sequences fit,
# the burst's 32 running sequences of the mix (~13k tokens) do not, so the burst point checks preemption
ENGINE_ARGS = ["--served-model-name", "tiny", "--max-model-len", "1024", "--enforce-eager",
               "--kv-cache-memory-bytes=4194304", "--dtype=bfloat16", "--max-num-seqs", "32",
               "--max-num-batched-tokens", "1024"]
PROMPT_CHUNK = 1024  # --max-num-batched-tokens above: a fit point's prompt is one prefill step
VOCAB = 2048
# the CPU features that decide the CPU build's matmul speed (bf16 in hardware with AVX-512 BF16 or AMX, else
# emulated), recorded with the results
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
FIT_PROMPTS = (16, 128, 384, 768)
FIT_BATCHES = (1, 4, 8, 16)
FIT_OUTPUT = 48
FIT_CONTEXT = 16 + FIT_OUTPUT // 2  # the mean context of a TPOT point's sequences: a 16-token prompt, half the output
FIT_ROUNDS = 5  # each fit point is the median of this many interleaved measurements
REPEATS = 3  # fit + held-out repetitions on one engine; a point is judged on their median error
# held-out: mixed lengths, offered at these shares of the engine's capacity (requests a second it completes with a
# full batch of the same mix: CAPACITY_BURST requests sent at once, measured once per run). The CPU build's speed
# differs tenfold between hosts (bf16 matmuls with AVX-512 or without: docs/simulator.md), so fixed rates would be
# an idle engine on one host and a runaway queue on another.
HELD_OUT_SHARES = (0.25, 0.5, 0.75)
CAPACITY_BURST = 64
HELD_OUT_SECONDS = 20.0
PROMPT_RANGE, OUTPUT_RANGE = (32, 700), (16, 96)
COMMAND = "disagg bench real-engine --out docs/results/real-engine.json"
TOLERANCE = 0.25  # the stated band for a held-out point's mean TTFT and TPOT (docs/simulator.md)


@dataclass
class Fit:
    request_overhead_s: float
    step_overhead_s: float
    per_seq_overhead_s: float
    flops_per_s: float  # the roofline's compute rate (its bf16 peak, at compute efficiency 1)
    residual_ms: float  # RMS of the fit over its points


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(n)]


@dataclass
class Timed:
    ttft_s: float | None
    tpot_s: float | None
    ok: bool


def _request(at: float, prompt: list[int], out: int) -> tuple[float, dict[str, Any]]:
    return at, {"model": "tiny", "prompt": prompt, "max_tokens": out, "temperature": 0, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}


async def _one(session: aiohttp.ClientSession, url: str, at: float, body: dict[str, Any], t0: float) -> Timed:
    """One streamed completion sent at ``t0 + at``: TTFT to the first chunk that carries a choice (a token whose
    text may still be an incomplete UTF-8 piece: random weights), TPOT over the tokens the final usage counts."""
    await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
    start = time.perf_counter()
    first = last = None
    tokens = 0
    async with session.post(url + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            return Timed(None, None, False)
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            data = json.loads(line[6:])
            if data.get("choices"):
                last = time.perf_counter()
                first = first or last
            if data.get("usage"):
                tokens = int(data["usage"].get("completion_tokens") or 0)
    if first is None:
        return Timed(None, None, False)
    tpot = (last - first) / (tokens - 1) if last is not None and tokens > 1 else None
    return Timed(first - start, tpot, True)


def _run(url: str, reqs: list[tuple[float, dict[str, Any]]]) -> list[Timed]:
    async def go() -> list[Timed]:
        conn = aiohttp.TCPConnector(limit=256)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=300)) as session:
            t0 = time.perf_counter()
            return list(await asyncio.gather(*(_one(session, url, at, body, t0) for at, body in reqs)))

    return asyncio.run(go())


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _threads(pids: set[int]) -> list[int]:
    return [int(t) for pid in pids for t in os.listdir(f"/proc/{pid}/task")]


def _pin(engine_pid: int, *, engine_core: bool) -> dict[str, list[int]]:
    """Give the engine a core of its own, as on a GPU server, where the API server, the engine core and the
    clients do not take turns on two CPUs: the engine core (``vllm serve``'s ``VLLM::EngineCore`` child; with
    ``engine_core`` False, or when the engine is one process, all of it: the sim) on the last CPU, everything else —
    the API server and this load generator — on the others. Returns the CPU sets (nothing pinned on one CPU)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return {}
    own, rest = {cpus[-1]}, set(cpus[:-1])
    engine = process_tree(engine_pid)
    if engine_core and len(engine) > 1:
        for tid in _threads({engine_pid}):
            os.sched_setaffinity(tid, rest)
        engine.discard(engine_pid)
    for tid in _threads(engine):
        os.sched_setaffinity(tid, own)
    os.sched_setaffinity(0, rest)
    return {"engine": sorted(own), "others": sorted(rest)}


def fit_points(url: str, seed: int) -> dict[str, Any]:
    """The fit's points, each the median of ``FIT_ROUNDS`` measurements taken in interleaved rounds (every length
    and batch size once per round), so a drift of this shared machine's speed reaches every point alike rather
    than the last ones measured; a warm-up first runs every prompt length and the largest batch (the first
    steps of a fresh engine are slower)."""
    rng = random.Random(seed)
    _run(url, [_request(0.0, _tokens(rng, n), 4) for n in FIT_PROMPTS])  # warm-up
    _run(url, [_request(0.0, _tokens(rng, 16), FIT_OUTPUT) for _ in range(max(FIT_BATCHES))])
    ttfts: dict[int, list[float]] = {n: [] for n in FIT_PROMPTS}
    tpots: dict[int, list[float]] = {b: [] for b in FIT_BATCHES}
    for _ in range(FIT_ROUNDS):
        for n in FIT_PROMPTS:
            (r,) = _run(url, [_request(0.0, _tokens(rng, n), 1)])
            if r.ttft_s is not None:
                ttfts[n].append(r.ttft_s)
        for b in FIT_BATCHES:
            res = _run(url, [_request(0.0, _tokens(rng, 16), FIT_OUTPUT) for _ in range(b)])
            tpots[b].append(statistics.mean(r.tpot_s for r in res if r.tpot_s is not None))
    return {"ttft_s": {n: statistics.median(v) for n, v in ttfts.items()},
            "tpot_s": {b: statistics.median(v) for b, v in tpots.items()}}


def _engine_s(perf: PerfModel, rate: float, points: dict[str, Any]) -> list[float]:
    """What the sim's step model charges for each fit point at compute rate ``rate``, without the three overheads
    (their columns are fitted beside it): the one prefill step of a TTFT point, the decode step of a TPOT point."""
    return priced(perf, Fit(0.0, 0.0, 0.0, rate, 0.0), points)


def _solve(rows: list[tuple[list[float], float]]) -> list[float]:
    """Least squares by the normal equations and Gaussian elimination (no numpy in the operator's dependencies)."""
    k = len(rows[0][0])
    a = [[sum(x[i] * x[j] for x, _ in rows) for j in range(k)] for i in range(k)]
    y = [sum(x[i] * t for x, t in rows) for i in range(k)]
    for col in range(k):
        piv = max(range(col, k), key=lambda r: abs(a[r][col]))
        a[col], a[piv], y[col], y[piv] = a[piv], a[col], y[piv], y[col]
        for r in range(k):
            if r != col and a[col][col]:
                f = a[r][col] / a[col][col]
                a[r] = [a[r][j] - f * a[col][j] for j in range(k)]
                y[r] -= f * y[col]
    return [y[i] / a[i][i] if a[i][i] else 0.0 for i in range(k)]


def fit(points: dict[str, Any], perf: PerfModel) -> Fit:
    """The costs that make the sim's own step model reproduce the fit points: TTFT(n) = r + s + p + E(n) and
    TPOT(b) = s + p·b + E(b), where E is what ``perf`` charges for the prefill or decode step at compute rate R
    (the tiny model's linear and attention FLOPs ÷ R, or its weight stream where that is larger). For each R on a
    log grid, then a golden-section refinement, (r, s, p) is the least-squares solution, clamped at 0; R is the
    one with the smallest RMS residual. A line fitted apart from the model (a per-token cost beside a per-sequence
    cost) would price each decode token twice once the sim adds its FLOPs, and miss attention's quadratic term."""
    shape = ([[1.0, 1.0, 1.0] for _ in points["ttft_s"]] + [[0.0, 1.0, float(b)] for b in points["tpot_s"]])
    measured = [*points["ttft_s"].values(), *points["tpot_s"].values()]

    def solve(rate: float) -> tuple[float, list[float]]:
        engine = _engine_s(perf, rate, points)
        coef = [max(c, 0.0) for c in _solve([(x, t - e) for x, t, e in zip(shape, measured, engine, strict=True)])]
        pred = [sum(w * v for w, v in zip(x, coef, strict=True)) + e for x, e in zip(shape, engine, strict=True)]
        return (sum((pv - t) ** 2 for pv, t in zip(pred, measured, strict=True)) / len(measured)) ** 0.5, coef

    grid = [10 ** (8 + i / 20) for i in range(101)]  # 0.1–1,000 GFLOP/s
    best = min(range(len(grid)), key=lambda i: solve(grid[i])[0])
    lo, hi = math.log(grid[max(best - 1, 0)]), math.log(grid[min(best + 1, len(grid) - 1)])
    g = (math.sqrt(5) - 1) / 2
    for _ in range(40):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if solve(math.exp(a))[0] <= solve(math.exp(b))[0]:
            hi = b
        else:
            lo = a
    rate = math.exp((lo + hi) / 2)
    rms, (r_, s, p) = solve(rate)
    return Fit(r_, s, p, rate, rms * 1000)


def fit_costs(fitted: Fit) -> dict[str, float]:
    """The sim's ``--sim-efficiency`` for a fit: the CPU engine's three overheads and its compute rate."""
    return {"step_overhead_s": fitted.step_overhead_s, "per_seq_overhead_s": fitted.per_seq_overhead_s,
            "request_overhead_s": fitted.request_overhead_s, "bf16_flops": fitted.flops_per_s}


def priced(perf: PerfModel, fitted: Fit, points: dict[str, Any]) -> list[float]:
    """The sim's price of each fit point (TTFT points, then TPOT points) given the fit."""
    m = PerfModel(replace(perf.gpu, bf16_flops=fitted.flops_per_s), perf.model, 1, 1, eff=replace(
        perf.eff, step_overhead_s=fitted.step_overhead_s, per_seq_overhead_s=fitted.per_seq_overhead_s,
        request_overhead_s=fitted.request_overhead_s))
    return ([m.ttft_alone(int(n), chunk=PROMPT_CHUNK) for n in points["ttft_s"]]
            + [m.decode_step_time(int(b), FIT_CONTEXT) for b in points["tpot_s"]])


def _mix(rng: random.Random) -> tuple[list[int], int]:
    """One request of the held-out mix: a prompt and an output length."""
    return _tokens(rng, rng.randint(*PROMPT_RANGE)), rng.randint(*OUTPUT_RANGE)


def capacity(url: str, seed: int) -> float:
    """Requests a second the engine completes with its batch full of the held-out mix: ``CAPACITY_BURST`` of them
    sent at once, the count over the time to the last answer."""
    rng = random.Random(f"{seed}-capacity")
    start = time.perf_counter()
    res = _run(url, [_request(0.0, *_mix(rng)) for _ in range(CAPACITY_BURST)])
    took = time.perf_counter() - start
    return sum(r.ok for r in res) / took


def _preemptions(url: str) -> float:
    """The engine's ``vllm:num_preemptions_total`` (summed over its label sets)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_preemptions_total"))


def held_out(url: str, seed: int, rates: list[float]) -> list[dict[str, Any]]:
    """The Poisson loads at ``rates``, then the burst: ``CAPACITY_BURST`` requests of the mix at once, more than
    the KV cache holds (``ENGINE_ARGS``), so the scheduler preempts and recomputes."""
    out = []
    loads: list[tuple[float | None, list[tuple[float, dict[str, Any]]]]] = []
    for i, rate in enumerate(rates):
        rng = random.Random(f"{seed}-{i}")
        reqs, t = [], 0.0
        while True:
            t += rng.expovariate(rate)
            if t > HELD_OUT_SECONDS:
                break
            reqs.append(_request(t, *_mix(rng)))
        loads.append((rate, reqs))
    rng = random.Random(f"{seed}-burst")
    loads.append((None, [_request(0.0, *_mix(rng)) for _ in range(CAPACITY_BURST)]))
    for at_rate, reqs in loads:
        before = _preemptions(url)
        res = _run(url, reqs)
        ok = [r for r in res if r.ok and r.ttft_s is not None]
        ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
        tpots = [r.tpot_s for r in ok if r.tpot_s is not None]
        out.append({"rate": at_rate, "requests": len(reqs), "ok": len(ok),
                    "ttft_mean_ms": 1000 * statistics.mean(ttfts), "ttft_p90_ms": 1000 * (loadgen.percentile(
                        ttfts, 0.9) or 0.0), "tpot_mean_ms": 1000 * statistics.mean(tpots),
                    "preemptions": _preemptions(url) - before})
    return out


def _compare(real_loads: list[dict[str, Any]], sim_loads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r, s in zip(real_loads, sim_loads, strict=True):
        err = {k: (s[k] - r[k]) / r[k] for k in ("ttft_mean_ms", "ttft_p90_ms", "tpot_mean_ms")}
        out.append({"rate": r["rate"], "real": r, "sim": s, "error": err})
    return out


def _median_fit(fits: list[Fit]) -> Fit:
    return Fit(**{k: statistics.median(getattr(f, k) for f in fits) for k in asdict(fits[0])})


def cpu_isa() -> list[str]:
    """Which of ``ISA_FLAGS`` this machine's CPUs have (/proc/cpuinfo)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return [f for f in ISA_FLAGS if f in flags]


def run(out: Path, seed: int = 0, log_dir: Path | None = None, repeats: int = REPEATS) -> dict[str, Any]:
    """``repeats`` repetitions, each a fit and the held-out loads on one real engine, then the sim given each
    repetition's fit on the same loads. The real engine's speed on a shared 2-core machine drifts by 20–40 %
    between runs (docs/simulator.md), so one repetition's error is mostly that drift: a point is judged on the
    median of its repetitions' errors, and their spread is reported beside it. The held-out rates are shares of the
    capacity measured once, after the first fit (its warm-up has run every length and the largest batch)."""
    tier = realengine.ensure()
    logs = log_dir or Path(os.environ.get("TMPDIR", "/tmp"))
    logs.mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    args = [str(tier.model), "--port", str(port), "--host", "127.0.0.1", *ENGINE_ARGS]
    env = {**os.environ, **REAL_ENGINE_ENV}
    perf = PerfModel(get_gpu(GPU_PRESET), infer_model(str(tier.model)) or get_model("disagg-tiny-llama"), 1, 1)
    print(f"[real-engine] starting vLLM {realengine.VLLM_CPU_VERSION} (CPU) on {url}", file=sys.stderr)
    real = _start([tier.engine.vllm, "serve", *args], env, logs / "real-engine.log")
    reps: list[dict[str, Any]] = []
    rates: list[float] = []
    try:
        wait_http(url + "/health", 600, real)
        pinned = _pin(real.pid, engine_core=True)
        for rep in range(repeats):
            points = fit_points(url, seed + rep)
            fitted = fit(points, perf)
            print(f"[real-engine] repetition {rep + 1}/{repeats} fit: {fitted}", file=sys.stderr)
            if not rates:
                cap = capacity(url, seed)
                rates = [share * cap for share in HELD_OUT_SHARES]
                print(f"[real-engine] capacity {cap:.1f} req/s: held-out rates {rates}", file=sys.stderr)
            reps.append({"fit_points": points, "fit": fitted, "real": held_out(url, seed, rates)})
    finally:
        stop_group(real, grace=10)
    for rep, r in enumerate(reps):
        # the sim is given this repetition's fit, not the preset in the code: what the held-out loads check is
        # the scheduling on the costs the engine had at the time
        r["sim_costs"] = fit_costs(r["fit"])
        print(f"[real-engine] the sim ({GPU_PRESET}, repetition {rep + 1}'s fit) on the same loads", file=sys.stderr)
        sim = _start([sys.executable, "-m", "disagg.cli", "sim", *args, "--gpu", GPU_PRESET,
                      "--emulate-version", realengine.VLLM_CPU_VERSION, "--sim-efficiency",
                      json.dumps(r["sim_costs"])], dict(os.environ), logs / "sim-engine.log")
        try:
            wait_http(url + "/health", 60, sim)
            _pin(sim.pid, engine_core=False)
            r["held_out"] = _compare(r.pop("real"), held_out(url, seed, rates))
        finally:
            stop_group(sim, grace=5)
    fitted = _median_fit([r["fit"] for r in reps])
    checks = []
    for i, share in enumerate([*HELD_OUT_SHARES, None]):  # None: the burst
        per = [r["held_out"][i] for r in reps]
        med = {k: statistics.median(c["error"][k] for c in per) for k in per[0]["error"]}
        span = {k: [min(c["error"][k] for c in per), max(c["error"][k] for c in per)] for k in per[0]["error"]}
        mid = sorted(per, key=lambda c: c["error"]["ttft_mean_ms"])[len(per) // 2]  # the median repetition
        checks.append({"share": share, "rate": mid["real"]["rate"], "real": mid["real"], "sim": mid["sim"],
                       "error": med,
                       "error_range": span,
                       "within": all(abs(med[k]) <= TOLERANCE for k in ("ttft_mean_ms", "tpot_mean_ms"))})
    result = {
        "vllm": f"vllm-cpu {realengine.VLLM_CPU_VERSION}", "engine_args": ENGINE_ARGS, "repeats": repeats,
        "cpus": pinned, "cpu_isa": cpu_isa(), "capacity_rps": rates[0] / HELD_OUT_SHARES[0],
        "fit_points": {k: {n: statistics.median(r["fit_points"][k][n] for r in reps) for n in reps[0]["fit_points"][k]}
                       for k in ("ttft_s", "tpot_s")},
        "fit": asdict(fitted),
        "repetitions": [{**r, "fit": asdict(r["fit"])} for r in reps],
        "held_out": checks, "tolerance": TOLERANCE,
    }
    write_results(out, results_doc("real-engine", invoked_command(COMMAND), result))
    return result


def render_tables(doc: dict[str, Any]) -> dict[str, str]:
    """docs/simulator.md's tables: the fit (each point as the sim, given the fit, prices it) and the held-out loads
    (disagg.bench.docs)."""
    r = doc["results"]
    f, pts = r["fit"], r["fit_points"]
    sim = iter(priced(PerfModel(get_gpu(GPU_PRESET), get_model("disagg-tiny-llama"), 1, 1), Fit(**f), pts))
    fit = ["| fit point | real engine | the sim, given the fit |", "|---|---:|---:|"]
    for n, t in pts["ttft_s"].items():
        fit.append(f"| TTFT, idle, {n}-token prompt | {t * 1000:.1f} ms | {next(sim) * 1000:.1f} ms |")
    for b, t in pts["tpot_s"].items():
        fit.append(f"| TPOT, batch of {b} | {t * 1000:.2f} ms | {next(sim) * 1000:.2f} ms |")
    fit.append("")
    fit.append(f"Fitted through the sim's step model: request overhead {f['request_overhead_s'] * 1000:.1f} ms, step "
               f"overhead {f['step_overhead_s'] * 1000:.2f} ms, per sequence {f['per_seq_overhead_s'] * 1e6:.0f} µs, "
               f"compute {f['flops_per_s'] / 1e9:.2f} GFLOP/s; RMS residual {f['residual_ms']:.2f} ms. The CPU's "
               f"matmul features: {', '.join(r['cpu_isa']) or 'none of ' + ', '.join(ISA_FLAGS)}. Capacity: "
               f"{r['capacity_rps']:.1f} req/s of the held-out mix.")
    held = ["| load | rate | requests | TTFT mean real / sim | error (range) | TTFT p90 real / sim "
            f"| TPOT mean real / sim | error (range) | preemptions real / sim | within ±{r['tolerance']:.0%} |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    for c in r["held_out"]:
        re_, si = c["real"], c["sim"]
        err = {k: f"{c['error'][k]:+.0%} ({lo:+.0%} … {hi:+.0%})" for k, (lo, hi) in c["error_range"].items()}
        load = (f"{c['share']:.0%} of capacity | {c['rate']:.1f}/s" if c["share"] is not None else
                "burst, all at once | — ")
        held.append(f"| {load} | {re_['requests']} "
                    f"| {re_['ttft_mean_ms']:.1f} / {si['ttft_mean_ms']:.1f} ms "
                    f"| {err['ttft_mean_ms']} | {re_['ttft_p90_ms']:.1f} / {si['ttft_p90_ms']:.1f} ms "
                    f"| {re_['tpot_mean_ms']:.2f} / {si['tpot_mean_ms']:.2f} ms | {err['tpot_mean_ms']} "
                    f"| {re_['preemptions']:.0f} / {si['preemptions']:.0f} | {'yes' if c['within'] else 'no'} |")
    held.append("")
    held.append(f"Each row: the median of {r['repeats']} repetitions' errors (their range in brackets); the real "
                "and sim figures are the median repetition's. Fitted per repetition (step overhead, per sequence, "
                "request overhead, compute): " + "; ".join(
                    f"{x['fit']['step_overhead_s'] * 1000:.2f} ms, {x['fit']['per_seq_overhead_s'] * 1e6:.0f} µs, "
                    f"{x['fit']['request_overhead_s'] * 1000:.1f} ms, {x['fit']['flops_per_s'] / 1e9:.2f} GFLOP/s"
                    for x in r["repetitions"]) + ".")
    return {"fit": "\n".join(fit), "held-out": "\n".join(held)}

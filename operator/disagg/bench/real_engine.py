"""``disagg bench real-engine``: the simulator's engine against a real vLLM engine (the real-engine tier's CPU
build), on the same requests.

1. **Fit** (``fit`` points): one real engine, idle, answers prompts of a few lengths (TTFT) and batches of a few
   sizes (TPOT). A least-squares line through them gives the CPU engine's constants — request overhead, step
   overhead, per-sequence cost, per-prompt-token cost — which become the ``vLLM-CPU-2core`` preset
   (disagg.perf.presets, disagg.perf.roofline ``GPU_EFFICIENCY``; a test checks that the committed constants are the
   committed fit).
2. **Check** (``held-out`` points): open-loop Poisson loads of mixed prompt and output lengths, at rates the fit
   never saw, against the real engine and then against ``disagg sim`` started with the same arguments (the preset
   in the code): mean and p90 TTFT, mean TPOT, side by side. What it checks is the sim's *scheduling* — continuous
   batching, chunked prefill, queueing — against vLLM's own scheduler, since the step costs come from the fit.

Prompts are token ids (random, seeded: no two share a prefix, both engines see the same lengths). Results:
docs/results/real-engine.json (docs/simulator.md "The real engine"). ~5 minutes on 2 cores.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from ..load import loadgen
from ..local import realengine
from ..local.procs import free_ports, stop_group, wait_http
from ..local.runtime import REAL_ENGINE_ENV
from ..perf.presets import get_gpu, get_model, infer_model
from ..perf.roofline import PerfModel
from ..results import invoked_command, results_doc, write_results

GPU_PRESET = "vLLM-CPU-2core"
# the engine both runs get: the tiny model, lean CPU settings, an explicit batch budget so the sim's is the same
ENGINE_ARGS = ["--served-model-name", "tiny", "--max-model-len", "1024", "--enforce-eager",
               "--kv-cache-memory-bytes=67108864", "--dtype=bfloat16", "--max-num-seqs", "32",
               "--max-num-batched-tokens", "1024"]
VOCAB = 2048
FIT_PROMPTS = (16, 128, 384, 768)
FIT_BATCHES = (1, 4, 8, 16)
FIT_OUTPUT = 48
# held-out: rates the fit never saw, mixed lengths
HELD_OUT_RATES = (5.0, 15.0, 30.0)
HELD_OUT_SECONDS = 20.0
PROMPT_RANGE, OUTPUT_RANGE = (32, 700), (16, 96)
COMMAND = "disagg bench real-engine --out docs/results/real-engine.json"
TOLERANCE = 0.25  # the stated band for a held-out point's mean TTFT and TPOT (docs/simulator.md)


@dataclass
class Fit:
    request_overhead_s: float
    step_overhead_s: float
    per_seq_overhead_s: float
    per_prompt_token_s: float
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


def fit_points(url: str, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    _run(url, [_request(0.0, _tokens(rng, 16), 4)])  # warm-up
    ttft: dict[int, float] = {}
    for n in FIT_PROMPTS:
        res = [_run(url, [_request(0.0, _tokens(rng, n), 1)])[0] for _ in range(5)]
        ttft[n] = statistics.median(r.ttft_s for r in res if r.ttft_s is not None)
    tpot: dict[int, float] = {}
    for b in FIT_BATCHES:
        res = _run(url, [_request(0.0, _tokens(rng, 16), FIT_OUTPUT) for _ in range(b)])
        tpot[b] = statistics.mean(r.tpot_s for r in res if r.tpot_s is not None)
    return {"ttft_s": ttft, "tpot_s": tpot}


def fit(points: dict[str, Any]) -> Fit:
    """Least squares of TTFT(n) = r + s + p + c·n and TPOT(b) = s + p·b for (r, s, p, c)."""
    rows: list[tuple[list[float], float]] = []
    for n, t in points["ttft_s"].items():
        rows.append(([1.0, 1.0, 1.0, float(n)], t))
    for b, t in points["tpot_s"].items():
        rows.append(([0.0, 1.0, float(b), 0.0], t))
    # normal equations, 4×4, by Gaussian elimination (no numpy in the operator's dependencies)
    k = 4
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
    r_, s, p, c = (y[i] / a[i][i] for i in range(k))
    pred = [sum(w * v for w, v in zip(x, (r_, s, p, c), strict=True)) for x, _ in rows]
    rms = (sum((pv - t) ** 2 for pv, (_, t) in zip(pred, rows, strict=True)) / len(rows)) ** 0.5
    return Fit(max(r_, 0.0), max(s, 0.0), max(p, 0.0), max(c, 0.0), rms * 1000)


def held_out(url: str, seed: int) -> list[dict[str, Any]]:
    out = []
    for rate in HELD_OUT_RATES:
        rng = random.Random(f"{seed}-{rate}")
        reqs, t = [], 0.0
        while True:
            t += rng.expovariate(rate)
            if t > HELD_OUT_SECONDS:
                break
            reqs.append(_request(t, _tokens(rng, rng.randint(*PROMPT_RANGE)), rng.randint(*OUTPUT_RANGE)))
        res = _run(url, reqs)
        ok = [r for r in res if r.ok and r.ttft_s is not None]
        ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
        tpots = [r.tpot_s for r in ok if r.tpot_s is not None]
        out.append({"rate": rate, "requests": len(reqs), "ok": len(ok),
                    "ttft_mean_ms": 1000 * statistics.mean(ttfts), "ttft_p90_ms": 1000 * (loadgen.percentile(
                        ttfts, 0.9) or 0.0), "tpot_mean_ms": 1000 * statistics.mean(tpots)})
    return out


def run(out: Path, seed: int = 0, log_dir: Path | None = None) -> dict[str, Any]:
    tier = realengine.ensure()
    logs = log_dir or Path(os.environ.get("TMPDIR", "/tmp"))
    logs.mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    args = [str(tier.model), "--port", str(port), "--host", "127.0.0.1", *ENGINE_ARGS]
    env = {**os.environ, **REAL_ENGINE_ENV}
    print(f"[real-engine] starting vLLM {realengine.VLLM_CPU_VERSION} (CPU) on {url}", file=sys.stderr)
    real = _start([tier.engine.vllm, "serve", *args], env, logs / "real-engine.log")
    try:
        wait_http(url + "/health", 600, real)
        points = fit_points(url, seed)
        fitted = fit(points)
        print(f"[real-engine] fit: {fitted}", file=sys.stderr)
        real_loads = held_out(url, seed)
    finally:
        stop_group(real, grace=10)
    print(f"[real-engine] the sim ({GPU_PRESET}) on the same loads", file=sys.stderr)
    sim = _start([sys.executable, "-m", "disagg.cli", "sim", *args, "--gpu", GPU_PRESET,
                  "--emulate-version", realengine.VLLM_CPU_VERSION], dict(os.environ), logs / "sim-engine.log")
    try:
        wait_http(url + "/health", 60, sim)
        sim_loads = held_out(url, seed)
    finally:
        stop_group(sim, grace=5)
    gpu = get_gpu(GPU_PRESET)
    # the FLOP rate that makes the roofline's per-prompt-token cost the fitted one (its per-token FLOPs for this
    # model: the step-time difference of two one-step prefills at the preset's current rate)
    perf = PerfModel(gpu, infer_model(str(tier.model)) or get_model("disagg-tiny-llama"), 1, 1)
    lo, hi = FIT_PROMPTS[0], FIT_PROMPTS[-1]
    extra = perf.prefill_time(hi, chunk=1024) - perf.prefill_time(lo, chunk=1024)
    flops_fit = gpu.bf16_flops * extra / (fitted.per_prompt_token_s * (hi - lo)) if fitted.per_prompt_token_s else 0.0
    checks = []
    for r, s in zip(real_loads, sim_loads, strict=True):
        err = {k: (s[k] - r[k]) / r[k] for k in ("ttft_mean_ms", "ttft_p90_ms", "tpot_mean_ms")}
        checks.append({"rate": r["rate"], "real": r, "sim": s, "error": err,
                       "within": all(abs(err[k]) <= TOLERANCE for k in ("ttft_mean_ms", "tpot_mean_ms"))})
    result = {
        "vllm": f"vllm-cpu {realengine.VLLM_CPU_VERSION}", "engine_args": ENGINE_ARGS,
        "fit_points": {"ttft_s": points["ttft_s"], "tpot_s": points["tpot_s"]},
        "fit": asdict(fitted),
        "bf16_flops_fit": flops_fit,
        "preset_in_code": {"bf16_flops": gpu.bf16_flops, **asdict(perf.eff)},
        "held_out": checks, "tolerance": TOLERANCE,
    }
    write_results(out, results_doc("real-engine", invoked_command(COMMAND), result))
    return result


def render_tables(doc: dict[str, Any]) -> dict[str, str]:
    """docs/simulator.md's tables: the fit and the held-out loads (disagg.bench.docs)."""
    r = doc["results"]
    f, pts = r["fit"], r["fit_points"]
    fit = ["| fit point | real engine | fitted line |", "|---|---:|---:|"]
    for n, t in pts["ttft_s"].items():
        line = (f["request_overhead_s"] + f["step_overhead_s"] + f["per_seq_overhead_s"]
                + f["per_prompt_token_s"] * int(n))
        fit.append(f"| TTFT, idle, {n}-token prompt | {t * 1000:.1f} ms | {line * 1000:.1f} ms |")
    for b, t in pts["tpot_s"].items():
        line = f["step_overhead_s"] + f["per_seq_overhead_s"] * int(b)
        fit.append(f"| TPOT, batch of {b} | {t * 1000:.2f} ms | {line * 1000:.2f} ms |")
    fit.append("")
    fit.append(f"Fitted: request overhead {f['request_overhead_s'] * 1000:.1f} ms, step overhead "
               f"{f['step_overhead_s'] * 1000:.2f} ms, per sequence {f['per_seq_overhead_s'] * 1e6:.0f} µs, per "
               f"prompt token {f['per_prompt_token_s'] * 1e6:.1f} µs (≈ {r['bf16_flops_fit'] / 1e9:.0f} GFLOP/s "
               f"for the roofline); RMS residual {f['residual_ms']:.2f} ms.")
    held = ["| rate | requests | TTFT mean real / sim | error | TTFT p90 real / sim | TPOT mean real / sim | error "
            "| within ±{:.0%} |".format(r["tolerance"]), "|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    for c in r["held_out"]:
        re_, si, e = c["real"], c["sim"], c["error"]
        held.append(f"| {c['rate']:g}/s | {re_['requests']} | {re_['ttft_mean_ms']:.1f} / {si['ttft_mean_ms']:.1f} ms "
                    f"| {e['ttft_mean_ms']:+.0%} | {re_['ttft_p90_ms']:.1f} / {si['ttft_p90_ms']:.1f} ms "
                    f"| {re_['tpot_mean_ms']:.2f} / {si['tpot_mean_ms']:.2f} ms | {e['tpot_mean_ms']:+.0%} "
                    f"| {'yes' if c['within'] else 'no'} |")
    return {"fit": "\n".join(fit), "held-out": "\n".join(held)}

"""The published figures the twin is checked against (``disagg bench sim``, sim/bench.py), each with its citation,
and the prediction each one is compared with; and this repository's own H200 torch measurements as ``bound``
points. Data and the functions that price it; the evaluation, the fit and the tables are sim/bench.py's.

Every point's kind (docs/simulator.md §8): ``fit`` (a figure ``Efficiency.step_overhead_s`` was fitted to),
``held-out`` (a figure no constant was set from) or ``bound`` (an upper bound on vLLM's kernel time: torch
eager/SDPA, not vLLM).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..perf.presets import vllm_batch_defaults
from ..perf.roofline import PerfModel, SeqWork

H200_RESULTS = Path("docs") / "results" / "h200-microbench.json"
H200_STEPS = Path("docs") / "results" / "h200-steps.json"

# ShareGPT as `benchmark_serving`/`vllm bench serve` sample it, Llama-3.1 tokenizer: 229,711 input and 203,068
# output tokens over 1,000 requests (vLLM PR #18566's run, https://github.com/vllm-project/vllm/pull/18566).
SHAREGPT_IN, SHAREGPT_OUT = 230, 203


@dataclass(frozen=True)
class Citation:
    url: str
    date: str
    vllm: str
    hardware: str
    detail: str


@dataclass(frozen=True)
class Point:
    name: str
    kind: str  # "fit" | "held-out" | "bound"
    gpu: str
    model: str
    tp: int
    metric: str  # what `measured` is, with its unit
    measured: float
    predict: Callable[[PerfModel], float]
    cite: Citation
    # a bracket, not a value: the reference shows the figure between ``measured`` and ``upper`` (a rate that held
    # and the next one, which did not); the twin is right anywhere inside, and its error is to the nearer edge
    upper: float | None = None


# ---------------------------------------------------------------------------------------------- predictions
def tpot_ms(batch: int, context: int) -> Callable[[PerfModel], float]:
    """Steady decode: every step decodes ``batch`` sequences at ``context`` tokens."""
    return lambda p: p.decode_step_time(batch, context) * 1e3


def closed_loop_tok_s(concurrency: int, prompt: int, output: int) -> Callable[[PerfModel], float]:
    """Output tokens/s of ``concurrency`` clients each sending the next request when the last one ends
    (``--max-concurrency C``, fixed lengths). In the steady state every client's cycle holds C prefills (its own
    and one of each other client's) and ``output − 1`` decode steps of the batch; vLLM V1 (chunked prefill, the
    default) runs each prompt inside a step of the others' decodes, so C of those steps are mixed steps (the
    prompt plus C − 1 decodes) and the rest decode-only, at the mean context. Plus the request overhead."""
    def f(p: PerfModel) -> float:
        ctx = prompt + output // 2
        decode = p.decode_step_time(concurrency, ctx)
        mixed = p.step([SeqWork(prompt, 0)] + [SeqWork(1, ctx)] * (concurrency - 1)).total_s
        n_mixed = min(concurrency, output - 1)
        per_request = p.request_overhead_s + n_mixed * mixed + (output - 1 - n_mixed) * decode
        return concurrency * output / per_request
    return f


def _poisson(p: PerfModel, rps: float, prompt: int, output: int) -> tuple[float, int, float]:
    """(TPOT s, decode batch, prefill s) under open-loop Poisson arrivals at ``rps``: Little's law gives the
    decode batch, B = rps × (TTFT + (output − 1) × TPOT); vLLM 0.6.0 (these points' release) ran prompts as
    separate prefill steps (chunked prefill off below 32k max-model-len), so a second of decoding loses
    rps × prefill_time to prefills: TPOT = decode_step(B) / (1 − rps × prefill). Fixed-point iteration."""
    prefill = p.prefill_time(prompt)
    busy = min(0.9, rps * prefill)
    tpot, batch = p.decode_step_time(1, prompt), 1
    for _ in range(50):
        batch = max(1, round(rps * (p.request_overhead_s + prefill + (output - 1) * tpot)))
        tpot = p.decode_step_time(batch, prompt + output // 2) / (1.0 - busy)
    return tpot, batch, prefill


def poisson_tpot_ms(rps: float, prompt: int = SHAREGPT_IN, output: int = SHAREGPT_OUT) -> Callable[[PerfModel], float]:
    """Median TPOT under open-loop Poisson arrivals at ``rps`` (benchmark_serving with ``--request-rate``)."""
    return lambda p: _poisson(p, rps, prompt, output)[0] * 1e3


def poisson_ttft_ms(rps: float, scheduler_steps: int = 1, prompt: int = SHAREGPT_IN,
                    output: int = SHAREGPT_OUT) -> Callable[[PerfModel], float]:
    """Median TTFT under the same load. The reference's engine decides how a new prompt waits: vLLM 0.6.0 with
    ``--num-scheduler-steps k`` (multi-step scheduling, removed with the V0 engine) runs k decode steps per
    scheduling round and admits a prompt only between rounds, so a prompt arriving at a random time first waits
    the rest of the round, k/2 decode steps on average; the twin (vLLM V1) schedules every step (k = 1). TTFT =
    request overhead + that wait + the prompt's prefill step."""
    def f(p: PerfModel) -> float:
        _, batch, prefill = _poisson(p, rps, prompt, output)
        wait = (scheduler_steps / 2.0) * p.decode_step_time(batch, prompt + output // 2)
        return (p.request_overhead_s + wait + prefill) * 1e3
    return f


def offline_tok_s(max_num_seqs: int, budget: int, prompt: int = SHAREGPT_IN,
                  output: int = SHAREGPT_OUT) -> Callable[[PerfModel], float]:
    """Output tokens/s of an offline run (every request sent at once: ``--request-rate inf``): ``max_num_seqs``
    requests decode together; each is prefilled once, ``budget // prompt`` prompts per prefill step (vLLM 0.6.0
    without chunked prefill: ``max_num_batched_tokens`` = max-model-len), then ``output − 1`` steps of the full
    batch at the mean context."""
    def f(p: PerfModel) -> float:
        per_step = max(1, min(max_num_seqs, budget // prompt))
        prefill_per_req = p.step([SeqWork(prompt, 0)] * per_step).total_s / per_step
        decode_per_req = (output - 1) * p.decode_step_time(max_num_seqs, prompt + output // 2) / max_num_seqs
        return output / (prefill_per_req + decode_per_req)
    return f


def knee_rps(prompt: int, output: int) -> Callable[[PerfModel], float]:
    """The Poisson rate of ``prompt``-token requests (``output`` tokens each) at which one engine is busy all the
    time, past which TTFT grows without bound. Near it every step is a mixed step at the full token budget
    (``--max-num-batched-tokens``, the GPU's default): a prompt costs its prefill in budget-sized chunks, and each
    of its ``output − 1`` decode tokens rides in such a step at one token's share of it (chunked prefill: the
    decodes go first, the prefill fills the rest)."""
    def f(p: PerfModel) -> float:
        budget = vllm_batch_defaults(p.gpu)[1]
        per_token = p.step([SeqWork(budget, 0)]).total_s / budget
        return 1.0 / (p.prefill_time(prompt, budget) + (output - 1) * per_token)
    return f


def kv_gib(gpu_memory_utilization: float, max_num_batched_tokens: int,
           max_num_seqs: int) -> Callable[[PerfModel], float]:
    """KV-cache memory per GPU vLLM's profiling leaves (its "available_kv_cache_memory" log line), GiB."""
    return lambda p: p.kv_cache_bytes_per_gpu(gpu_memory_utilization, max_num_batched_tokens, max_num_seqs) / 2**30


def offline_latency_ms(batch: int, prompt: int, output: int) -> Callable[[PerfModel], float]:
    """``benchmark_latency`` / ``vllm bench latency``: one batch of ``batch`` prompts through the offline engine
    (no HTTP): one prefill step of all prompts, then ``output − 1`` decode steps as the context grows."""
    def f(p: PerfModel) -> float:
        t = p.step([SeqWork(prompt, 0)] * batch).total_s
        t += sum(p.decode_step_time(batch, prompt + i) for i in range(1, output))
        return t * 1e3
    return f


def prefill_tok_s(prompt: int) -> Callable[[PerfModel], float]:
    return lambda p: p.prefill_tokens_per_s(prompt, chunk=prompt)


def decode_step_ms(batch: int, context: int) -> Callable[[PerfModel], float]:
    return lambda p: p.decode_step_time(batch, context) * 1e3


# ----------------------------------------------------------------------------------------------- references
INFERENCEBENCH = Citation(
    "https://yobitelcomm.github.io/bench/recipes/concurrency-sweep/", "2026-05-16", "0.21.0",
    "1× H100-80GB-HBM3", "InferenceBench llm.inference.chatbot-short sweep, fp16; TPOT p50 (short chat prompts)")
MUSGRAVE = Citation(
    "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on", "undated", "0.23.0",
    "1× A100-SXM4-40GB",
    "J. Musgrave, vllm bench serve, random 1024 in / 128 out, --ignore-eos, --max-concurrency C")
SGLANG_060 = "https://github.com/sgl-project/sglang/blob/main/benchmark/benchmark_vllm_060/README.md"


VLLM_CI = Citation(
    "https://buildkite.com/vllm/performance-benchmark/builds/9515", "undated (the stored page shows no date)",
    "main at that CI build (commit not shown)", "1× / 2× / 4× H200",
    "vLLM's own performance-benchmark pipeline, latency tests: benchmark_latency, 32 input tokens, 128 output "
    "tokens, batch 8, mean end-to-end latency; models llama-3.1 8B, llama-3 70B, mixtral 8x7B")


def _sglang(hw: str, rps: int | str, what: str = "Median TPOT") -> Citation:
    return Citation(SGLANG_060, "2024-09", "0.6.0", hw,
                    f"SGLang v0.3.0 vs vLLM v0.6.0 (--num-scheduler-steps 10, max-model-len 4096, BF16); "
                    f"sglang.bench_serving --backend vllm, ShareGPT, --request-rate {rps}, {what}")


PR_10511 = Citation(
    "https://github.com/vllm-project/vllm/pull/10511", "2024-12-13", "0.6.4.post2 (main at PR #10511)",
    "1× H100 80GB",
    "youkaichao's sanity check of the memory-profiling overhaul: `vllm serve meta-llama/Meta-Llama-3-8B` "
    "(default 0.9 utilization, V0 engine: max-num-batched-tokens = max-model-len 8192, 256 seqs): total_gpu_memory "
    "79.22GiB, weights 14.96GiB, non_torch 1.79GiB, activation peak 1.26GiB, available_kv_cache_memory 53.29GiB")
# ShareGPT mean output length of the offline runs: output tok/s ÷ request/s in the same table (4132.37 / 21.27 and
# 3700.64 / 19.04 → 194.3, 194.4 tokens)
SGLANG_OFFLINE_OUT = 194


PUBLISHED: list[Point] = [
    Point("H100 8B TPOT c=1", "fit", "H100-SXM", "Llama-3.1-8B", 1, "TPOT ms", 6.48, tpot_ms(1, 1024),
          INFERENCEBENCH),
    Point("H100 8B TPOT c=4", "fit", "H100-SXM", "Llama-3.1-8B", 1, "TPOT ms", 6.59, tpot_ms(4, 1024),
          INFERENCEBENCH),
    Point("A100-40GB 8B TPOT C=1", "fit", "A100-40GB", "Llama-3.1-8B", 1, "TPOT ms", 1000 / 75, tpot_ms(1, 1100),
          Citation(MUSGRAVE.url, MUSGRAVE.date, MUSGRAVE.vllm, MUSGRAVE.hardware,
                   MUSGRAVE.detail + "; C=1 ≈ 75 output tok/s → 13.3 ms per token")),
    Point("A100-40GB 8B output tok/s C=8", "held-out", "A100-40GB", "Llama-3.1-8B", 1, "output tok/s", 6.6 * 75,
          closed_loop_tok_s(8, 1024, 128),
          Citation(MUSGRAVE.url, MUSGRAVE.date, MUSGRAVE.vllm, MUSGRAVE.hardware,
                   MUSGRAVE.detail + "; 'a 6.6x gain' over C=1's ~75 tok/s at C=8 → ≈ 495 tok/s")),
    Point("A100-80GB 8B TPOT ShareGPT 4 rps", "held-out", "A100-80GB", "Llama-3.1-8B", 1, "TPOT ms", 14.14,
          poisson_tpot_ms(4), _sglang("1× A100 80G", 4)),
    Point("A100-80GB 8B TPOT ShareGPT 8 rps", "held-out", "A100-80GB", "Llama-3.1-8B", 1, "TPOT ms", 17.09,
          poisson_tpot_ms(8), _sglang("1× A100 80G", 8)),
    Point("4×H100 70B TPOT ShareGPT 4 rps", "held-out", "H100-SXM", "Llama-3.1-70B", 4, "TPOT ms", 23.58,
          poisson_tpot_ms(4), _sglang("4× H100 80G (TP 4)", 4)),
    Point("4×H100 70B TPOT ShareGPT 8 rps", "held-out", "H100-SXM", "Llama-3.1-70B", 4, "TPOT ms", 29.15,
          poisson_tpot_ms(8), _sglang("4× H100 80G (TP 4)", 8)),
    Point("A100-80GB 8B TTFT ShareGPT 4 rps", "held-out", "A100-80GB", "Llama-3.1-8B", 1, "TTFT ms", 100.48,
          poisson_ttft_ms(4, 10), _sglang("1× A100 80G", 4, "Median TTFT")),
    Point("A100-80GB 8B TTFT ShareGPT 8 rps", "held-out", "A100-80GB", "Llama-3.1-8B", 1, "TTFT ms", 120.39,
          poisson_ttft_ms(8, 10), _sglang("1× A100 80G", 8, "Median TTFT")),
    Point("4×H100 70B TTFT ShareGPT 4 rps", "held-out", "H100-SXM", "Llama-3.1-70B", 4, "TTFT ms", 179.15,
          poisson_ttft_ms(4, 10), _sglang("4× H100 80G (TP 4)", 4, "Median TTFT")),
    Point("4×H100 70B TTFT ShareGPT 8 rps", "held-out", "H100-SXM", "Llama-3.1-70B", 4, "TTFT ms", 207.12,
          poisson_ttft_ms(8, 10), _sglang("4× H100 80G (TP 4)", 8, "Median TTFT")),
    Point("A100-80GB 8B offline ShareGPT", "held-out", "A100-80GB", "Llama-3.1-8B", 1, "output tok/s", 4132.37,
          offline_tok_s(256, 4096, output=SGLANG_OFFLINE_OUT),
          _sglang("1× A100 80G", "inf (5000 prompts)", "output token throughput")),
    Point("4×H100 70B offline ShareGPT", "held-out", "H100-SXM", "Llama-3.1-70B", 4, "output tok/s", 3700.64,
          offline_tok_s(256, 4096, output=SGLANG_OFFLINE_OUT),
          _sglang("4× H100 80G (TP 4)", "inf (5000 prompts)", "output token throughput")),
    Point("H100 8B KV memory (0.9)", "held-out", "H100-SXM", "Llama-3.1-8B", 1, "KV cache GiB", 53.29,
          kv_gib(0.9, 8192, 256), PR_10511),
    Point("H200 8B latency b8 32→128", "held-out", "H200", "Llama-3.1-8B", 1, "batch latency ms", 833.421,
          offline_latency_ms(8, 32, 128), VLLM_CI),
    Point("4×H200 70B latency b8 32→128", "held-out", "H200", "Llama-3.1-70B", 4, "batch latency ms", 2077.53,
          offline_latency_ms(8, 32, 128), VLLM_CI),
    Point("2×H200 Mixtral latency b8 32→128", "held-out", "H200", "Mixtral-8x7B", 2, "batch latency ms", 1917.44,
          offline_latency_ms(8, 32, 128), VLLM_CI),
]


# --------------------------------------------------------------------- V1-era references (issue 26, 2026-12-03)
# The V0 points above (vLLM 0.6.0) measure an engine the twin does not model (multi-step scheduling, no chunked
# prefill below 32k): these measure the V1 engine the twin follows (chunked prefill, CUDA graphs, one step per
# scheduling round). None of them set a constant.
FP8_KV_BLOG = "https://blog.vllm.ai/2026/04/22/fp8-kvcache.html"


def _fp8_kv_blog(hw: str, fit: str) -> Citation:
    return Citation(FP8_KV_BLOG, "2026-04-22", "0.19.1 (the post's 'after' runs)", hw,
                    "vLLM blog 'The State of FP8 KV-Cache and Attention Quantization in vLLM' "
                    "(vllm-project/vllm-project.github.io _posts/2026-04-22-fp8-kvcache.md): `vllm serve "
                    "meta-llama/Llama-3.1-8B`, BF16 KV, `vllm bench serve` concurrency 1, 128 output tokens, input "
                    f"256 → 125k tokens; the post's linear fit of ITL in the input length: {fit}")


H100_ITL = "ITL_ms = 6.44 + 4.37e-05 × L (FlashAttention-3; text under Figure 2)"
B200_ITL = "ITL_ms = 3.93 + 1.80e-05 × L (FlashInfer; text under Figure 5)"
GPUSTACK_QWEN3_8B = Citation(
    "https://github.com/gpustack/gpustack/blob/c0cee89c99d601188c511e53f90d5dff1356c4f1/docs/performance-lab/"
    "qwen3-8b/h100-latency.md", "2025-11 (the page's commit)", "0.11.0", "1× H100 SXM",
    "GPUStack Performance Lab, 'Baseline benchmark results': `vllm serve Qwen/Qwen3-8B` (defaults), `vllm bench "
    "serve --backend openai-chat --dataset-name sharegpt --num-prompts 100 --max-concurrency C` (23,260 input and "
    "22,061 output tokens: 233 in / 221 out on average); median TPOT")


def _vllm_ci(build: int, hw: str) -> Citation:
    return Citation(f"https://buildkite.com/vllm/performance-benchmark/builds/{build}",
                    "undated (the stored page shows no date)", "main at that CI build (commit not shown)", hw,
                    VLLM_CI.detail)


V1_POINTS: list[Point] = [
    *(Point(f"H100 8B ITL ctx {L // 1000}k", "held-out", "H100-SXM", "Llama-3.1-8B", 1, "TPOT ms",
            6.44 + 4.37e-5 * L, tpot_ms(1, L), _fp8_kv_blog("1× H100", H100_ITL)) for L in (1000, 32000, 100000)),
    *(Point(f"B200 8B ITL ctx {L // 1000}k", "held-out", "B200", "Llama-3.1-8B", 1, "TPOT ms",
            3.93 + 1.80e-5 * L, tpot_ms(1, L), _fp8_kv_blog("1× B200", B200_ITL)) for L in (1000, 32000, 100000)),
    Point("H100 Qwen3-8B TPOT C=1", "held-out", "H100-SXM", "Qwen3-8B", 1, "TPOT ms", 7.22, tpot_ms(1, 233 + 110),
          GPUSTACK_QWEN3_8B),
    Point("H100 Qwen3-8B TPOT C=8", "held-out", "H100-SXM", "Qwen3-8B", 1, "TPOT ms", 7.67, tpot_ms(8, 233 + 110),
          GPUSTACK_QWEN3_8B),
    # the same CI pipeline and workload as the H200 points above, on the pipeline's H100 and A100 runners
    Point("H100 8B latency b8 32→128", "held-out", "H100-SXM", "Llama-3.1-8B", 1, "batch latency ms", 997.542,
          offline_latency_ms(8, 32, 128), _vllm_ci(9555, "8× H100 (1 used)")),
    Point("4×H100 70B latency b8 32→128", "held-out", "H100-SXM", "Llama-3.1-70B", 4, "batch latency ms", 2444.47,
          offline_latency_ms(8, 32, 128), _vllm_ci(9555, "8× H100 (TP 4)")),
    Point("2×H100 Mixtral latency b8 32→128", "held-out", "H100-SXM", "Mixtral-8x7B", 2, "batch latency ms",
          2326.97, offline_latency_ms(8, 32, 128), _vllm_ci(9555, "8× H100 (TP 2)")),
    Point("A100 8B latency b8 32→128", "held-out", "A100-80GB", "Llama-3.1-8B", 1, "batch latency ms", 1579.27,
          offline_latency_ms(8, 32, 128), _vllm_ci(9523, "A100-SXM4-80GB")),
    Point("4×A100 70B latency b8 32→128", "held-out", "A100-80GB", "Llama-3.1-70B", 4, "batch latency ms",
          3990.59, offline_latency_ms(8, 32, 128), _vllm_ci(9523, "4× A100-SXM4-80GB")),
    Point("2×A100 Mixtral latency b8 32→128", "held-out", "A100-80GB", "Mixtral-8x7B", 2, "batch latency ms",
          3643.84, offline_latency_ms(8, 32, 128), _vllm_ci(9523, "2× A100-SXM4-80GB")),
    # The TP prefill knee the issue quotes ("mean TTFT under 0.4 s at 8 req/s, collapse at 16", 70B TP 4, 2048-token
    # prompts): vLLM's own chunked-prefill vs disaggregation run. Its "chunked" side is TWO TP-4 instances behind a
    # round-robin proxy (the script's header: "2 vllm instance with tp=4, equivalent to 1 tp=4 instance with QPS
    # 4"), so one instance held 4 req/s (mean TTFT 380 ms) and collapsed at 8 (4.8 s). V0 engine with
    # --enable-chunked-prefill (2024), BF16 Meta-Llama-3.1-70B-Instruct; a bracket, not a value.
    Point("4×H100 70B knee, 2048-token prompts", "held-out", "H100-SXM", "Llama-3.1-70B", 4, "knee req/s", 4.0,
          knee_rps(2048, 12), Citation(
              "https://github.com/vllm-project/vllm/blob/5ac5249d5347d4cf0d384b40cfde1a55f068ce1a/benchmarks/"
              "disagg_benchmarks/results/chunk_vs_disagg.yaml", "2024-08/09 (vLLM PR #6170)",
              "0.5.x–0.6.x (V0, --enable-chunked-prefill)", "8× H100: two TP-4 instances, round-robin",
              "benchmarks/disagg_benchmarks/disagg_performance_benchmark.sh (launch_chunked_prefill: -tp 4 "
              "--max-model-len 30000 --gpu-memory-utilization 0.8 --enable-chunked-prefill, two instances behind "
              "round_robin_proxy.py); benchmark_serving.py --dataset-name sonnet --sonnet-input-len 2048 "
              "--sonnet-prefix-len 50 --num-prompts 400, Poisson --request-rate 2/4/8/16 in all (1/2/4/8 per "
              "instance): chunk_ttft 197 / 229 / 380 / 4793 ms (output_len 12). Held at 4 req/s per instance, "
              "collapsed at 8."), upper=8.0),
]
PUBLISHED += V1_POINTS


def h200_points(doc: dict[str, Any]) -> list[Point]:
    """The ``bound`` points from hack/gpu/measure_h200.py's results (decode from its CUDA-graph replay)."""
    r, m = doc["results"], doc["machine"]
    cite = Citation(H200_RESULTS.as_posix(), str(m.get("date", "?"))[:10], "none: torch eager/SDPA",
                    f"1× {m.get('gpu', 'H200')}, torch {m.get('torch', '?')}",
                    "random-weight Llama-3.1-8B-shaped stack, bf16; " + str(doc.get("command", "")))
    out = [Point(f"H200 8B prefill {row['input_tokens']}", "bound", "H200", "Llama-3.1-8B", 1, "prefill tok/s",
                 row["tokens_per_s"], prefill_tok_s(row["input_tokens"]), cite) for row in r["prefill"]]
    out += [Point(f"H200 8B decode b{row['batch']} ctx {row['context']}", "bound", "H200", "Llama-3.1-8B", 1,
                  "decode step ms (CUDA graph)", row["graph_s"] * 1e3, decode_step_ms(row["batch"], row["context"]),
                  cite) for row in r["decode"] if "graph_s" in row]
    return out


def kernel_ms(seqs: list[SeqWork]) -> Callable[[PerfModel], float]:
    """One step's GPU time in ms, as a torch microbenchmark of one GPU (or of one TP shard) measures it: without
    the collectives and without vLLM's CPU work (the per-step and per-sequence overheads; the per-layer kernel
    gaps stay)."""
    def f(p: PerfModel) -> float:
        c = p.step(seqs)
        cpu = p.eff.step_overhead_s + p.eff.per_seq_overhead_s * len(seqs)
        return (c.total_s - c.comm_s - cpu) * 1e3
    return f


def added_ms(base: list[SeqWork], extra: list[SeqWork]) -> Callable[[PerfModel], float]:
    """What ``extra`` adds to a step of ``base`` (ms): a prefill chunk riding in a decode batch's step."""
    return lambda p: (p.step(base + extra).total_s - p.step(base).total_s) * 1e3


SHORT = {"Llama-3.1-8B": "8B", "Qwen3-32B": "32B", "Llama-3.1-70B": "70B"}


def h200_step_points(doc: dict[str, Any]) -> list[Point]:
    """The ``bound`` points from hack/gpu/measure_h200_steps.py (docs/results/h200-steps.json): per shape, prefill
    of one prompt and decode steps replayed from CUDA graphs, and what one prefill chunk adds to a decode step
    (the twin must not price a chunk as cheaper to ride along than torch found it... nor the steps as slower)."""
    m = doc["machine"]
    out: list[Point] = []
    for sh in doc["results"]["shapes"]:
        name = f"H200 {SHORT.get(sh['model'], sh['model'])}" + (f" TP{sh['tp']} shard" if sh["tp"] > 1 else "")
        cite = Citation(H200_STEPS.as_posix(), str(m.get("date", "?"))[:10], "none: torch + SDPA, CUDA graphs",
                        f"1× {m.get('gpu', 'H200')}, torch {m.get('torch', '?')}",
                        f"random-weight {sh['name']} stack, bf16; " + str(doc.get("command", "")))
        g, mod, tp = "H200", sh["model"], sh["tp"]
        out += [Point(f"{name} prefill {r['input_tokens']} (graph)", "bound", g, mod, tp, "step ms (GPU)",
                      r["s"] * 1e3, kernel_ms([SeqWork(r["input_tokens"], 0)]), cite) for r in sh["prefill"]]
        out += [Point(f"{name} decode b{r['batch']} ctx {r['context']} (graph)", "bound", g, mod, tp,
                      "step ms (GPU)", r["s"] * 1e3, kernel_ms([SeqWork(1, r["context"])] * r["batch"]), cite)
                for r in sh["decode"]]
        out += [Point(f"{name} b{r['batch']} ctx {r['context']} + chunk {r['chunk']}"
                      + (f" after {r['prior']}" if r["prior"] else ""), "bound", g, mod, tp, "chunk's added ms",
                      r["added_by_chunk_s"] * 1e3,
                      added_ms([SeqWork(1, r["context"])] * r["batch"], [SeqWork(r["chunk"], r["prior"])]), cite)
                for r in sh["mixed"] if r["batch"]]
    return out


def _load(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def load_h200(root: Path = Path(".")) -> dict[str, Any] | None:
    return _load(root / H200_RESULTS)


def all_points(root: Path = Path(".")) -> list[Point]:
    doc, steps = load_h200(root), _load(root / H200_STEPS)
    return PUBLISHED + (h200_points(doc) if doc else []) + (h200_step_points(steps) if steps else [])

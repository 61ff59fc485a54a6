"""``python -m disagg.sim.bench``: what the roofline predicts per preset, next to published measurements.

Prints, for each GPU × model × TP preset, simulated prefill tokens/s (one prompt alone, chunked like vLLM's
default 8192-token budget) and decode tokens/s at several batch sizes (context 1024), then the comparison
against the reference figures in REFERENCES (sources in docs/simulator.md) with the relative error and
whether it is inside the ±25 % target. Pure computation: no processes, no clock.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from .perf import PerfModel
from .presets import GPUS, MODELS

CONFIGS = [
    ("H100-SXM", "Llama-3.1-8B", 1),
    ("H200", "Llama-3.1-8B", 1),
    ("A100-80GB", "Llama-3.1-8B", 1),
    ("A100-40GB", "Llama-3.1-8B", 1),
    ("L40S", "Llama-3.1-8B", 1),
    ("B200", "Llama-3.1-8B", 1),
    ("H100-SXM", "Llama-3.1-70B", 4),
    ("H100-SXM", "Llama-3.1-70B", 8),
    ("H200", "Llama-3.1-70B", 4),
    ("H100-SXM", "Qwen3-32B", 2),
    ("H100-SXM", "Qwen3-30B-A3B", 1),
    ("H100-SXM", "Mixtral-8x7B", 2),
]
BATCHES = (1, 8, 32, 128)
PROMPTS = (1024, 4096, 16384)


@dataclass(frozen=True)
class Reference:
    gpu: str
    model: str
    tp: int
    metric: str  # "decode_tok_s_per_seq" at a batch/context, or "tpot_ms"
    batch: int
    context: int
    value: float
    source: str


# Published vLLM measurements (single request, BF16). See docs/simulator.md "Calibration" for the full citations.
REFERENCES = [
    Reference("H100-SXM", "Llama-3.1-8B", 1, "tpot_ms", 1, 1024, 6.48,
              "InferenceBench concurrency-sweep recipe, vLLM 0.21.0, H100-80GB-HBM3, conc=1, TPOT p50"),
    Reference("H100-SXM", "Llama-3.1-8B", 1, "tpot_ms", 4, 1024, 6.59,
              "same run, conc=4, TPOT p50"),
    Reference("A100-40GB", "Llama-3.1-8B", 1, "tpot_ms", 1, 1100, 1000 / 75,
              "J. Musgrave, vLLM throughput-latency sweep on A100 40GB, vLLM 0.23.0, C=1 (~75 tok/s)"),
]


def _model(gpu: str, model: str, tp: int) -> PerfModel:
    return PerfModel(GPUS[gpu], MODELS[model], tp)


def table() -> str:
    lines = []
    head = f"{'GPU':<10} {'model':<14} {'tp':>2} | " + " ".join(f"prefill@{p:<5}" for p in PROMPTS) + " | " + \
        " ".join(f"decode@b{b:<4}" for b in BATCHES) + " | KV tokens"
    lines.append(head)
    lines.append("-" * len(head))
    for gpu, model, tp in CONFIGS:
        p = _model(gpu, model, tp)
        pre = " ".join(f"{p.prefill_tokens_per_s(n, 8192):>13,.0f}" for n in PROMPTS)
        dec = " ".join(f"{p.decode_tokens_per_s(b, 1024):>12,.0f}" for b in BATCHES)
        kv = p.num_kv_blocks(0.9) * 16
        lines.append(f"{gpu:<10} {model:<14} {tp:>2} | {pre} | {dec} | {kv:,}")
    lines.append("")
    lines.append("prefill = prompt tokens/s for one prompt alone; decode = output tokens/s summed over the batch "
                 "(context 1024); simulated seconds.")
    return "\n".join(lines)


def compare() -> tuple[str, int]:
    out, misses = [], 0
    for r in REFERENCES:
        p = _model(r.gpu, r.model, r.tp)
        sim_ms = p.decode_step_time(r.batch, r.context) * 1000
        err = (sim_ms - r.value) / r.value
        ok = abs(err) <= 0.25
        misses += not ok
        out.append(f"{r.gpu:<10} {r.model:<13} tp{r.tp} batch {r.batch:<3} TPOT sim {sim_ms:6.2f} ms vs ref "
                   f"{r.value:6.2f} ms  {err:+6.1%} {'ok' if ok else 'OUTSIDE ±25%'}  [{r.source}]")
    return "\n".join(out), misses


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m disagg.sim.bench", description=__doc__)
    ap.add_argument("--strict", action="store_true", help="exit 1 when a reference is outside ±25 %%")
    args = ap.parse_args(argv)
    print(table())
    print()
    text, misses = compare()
    print("Reference comparison (target ±25 %):")
    print(text)
    return 1 if (args.strict and misses) else 0


if __name__ == "__main__":
    raise SystemExit(main())

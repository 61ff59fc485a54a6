"""One prepared microbenchmark for the twin's H200 preset: a Llama-3.1-8B-shaped decoder in bf16, torch eager + SDPA.

Measures, on one GPU (random weights; the shapes are ``disagg.perf.presets.MODELS["Llama-3.1-8B"]``'s, copied
below so the script runs where the project is not installed):

(a) prefill: the 32-layer stack + final norm + LM head on the last position, one prompt of 512 / 2048 / 8192 tokens
    (causal SDPA, flash backend where torch offers it);
(b) decode: one step of batch 1/8/32/64 at context 1024/4096 — each layer appends the new token's K/V into a
    preallocated contiguous cache and runs SDPA over the cached K/V (GQA), LM head on every sequence; eager, and
    the same step replayed from a CUDA graph;
(c) ceilings: bf16 GEMM TFLOP/s (8192³ and the decode/prefill shapes) and HBM bandwidth (device copy, read+write).

This is **torch eager/SDPA, not vLLM**: no paged attention, no fused kernels (RMSNorm, RoPE, SiLU·mul are separate
elementwise kernels), no custom all-reduce (one GPU). The eager decode step is an upper bound on kernel time with
launch gaps; the CUDA-graph replay removes the gaps and is the closer comparison to vLLM's decode.

Timing: CUDA events around each region, warm-up first, median of N repetitions, inputs drawn from a normal
distribution (never zeros). Output: one JSON (``--out``, default ``$OUT/h200-microbench.json``).

    python3 hack/gpu/measure_h200.py                 # on the H200 (the `run` tool), ~2 min
    python3 hack/gpu/measure_h200.py --smoke --out /tmp/smoke.json   # tiny shapes on CPU: catches typos
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own convention


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int


# disagg/perf/presets.py MODELS["Llama-3.1-8B"] (meta-llama/Llama-3.1-8B-Instruct config.json)
LLAMA_8B = Shape(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256)
TINY = Shape(hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, intermediate=512, vocab=1000)


@dataclass(frozen=True)
class Plan:
    shape: Shape
    prompts: tuple[int, ...]
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    gemm_n: int
    copy_bytes: int
    reps: int
    warmup: int


FULL = Plan(LLAMA_8B, (512, 2048, 8192), (1, 8, 32, 64), (1024, 4096), 8192, 4 * 1024**3, 20, 3)
SMOKE = Plan(TINY, (16, 64), (1, 4), (32, 64), 256, 1 << 20, 2, 1)


class Timer:
    """Median wall time of ``fn`` over ``reps`` runs: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def median_s(self, fn: Callable[[], Any], reps: int, warmup: int) -> tuple[float, list[float]]:
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        for _ in range(reps):
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / 1000.0)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times), times


class Model:
    """Random-weight Llama decoder: RMSNorm → fused QKV → RoPE → SDPA (GQA) → O → RMSNorm → SwiGLU MLP."""

    def __init__(self, s: Shape, device: torch.device, dtype: torch.dtype) -> None:
        self.s, self.device, self.dtype = s, device, dtype
        g = torch.Generator(device=device).manual_seed(0)

        def w(rows: int, cols: int) -> torch.Tensor:
            t = torch.empty(rows, cols, device=device, dtype=dtype)
            return t.normal_(0.0, 1.0 / math.sqrt(cols), generator=g)

        qkv = (s.heads + 2 * s.kv_heads) * s.head_dim
        self.layers = [
            {
                "ln1": torch.ones(s.hidden, device=device, dtype=dtype),
                "qkv": w(qkv, s.hidden),
                "o": w(s.hidden, s.heads * s.head_dim),
                "ln2": torch.ones(s.hidden, device=device, dtype=dtype),
                "gate_up": w(2 * s.intermediate, s.hidden),
                "down": w(s.hidden, s.intermediate),
            }
            for _ in range(s.layers)
        ]
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.lm_head = w(s.vocab, s.hidden)
        inv = 1.0 / (500000.0 ** (torch.arange(0, s.head_dim, 2, device=device, dtype=torch.float32) / s.head_dim))
        self.inv_freq = inv

    def weight_bytes(self) -> int:
        n = sum(t.numel() for layer in self.layers for t in layer.values()) + self.norm.numel() + self.lm_head.numel()
        return n * torch.finfo(self.dtype).bits // 8

    @staticmethod
    def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * w

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        # x: (B, H, T, D); pos: (B, T) or (T,)
        f = pos.float().unsqueeze(-1) * self.inv_freq  # (..., T, D/2)
        cos, sin = f.cos().to(x.dtype), f.sin().to(x.dtype)
        if cos.dim() == 3:  # (B, T, D/2) → (B, 1, T, D/2)
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def _qkv(self, layer: dict[str, torch.Tensor], h: torch.Tensor, b: int, t: int,
             pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = self.s
        qkv = self.rms(h, layer["ln1"]) @ layer["qkv"].t()  # (B*T, qkv)
        q, k, v = qkv.split([s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1)
        q = q.view(b, t, s.heads, s.head_dim).transpose(1, 2)
        k = k.view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        v = v.view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        return self.rope(q, pos), self.rope(k, pos), v

    def _mlp(self, layer: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        gu = self.rms(h, layer["ln2"]) @ layer["gate_up"].t()
        gate, up = gu.chunk(2, dim=-1)
        return h + (F.silu(gate) * up) @ layer["down"].t()

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        """One prompt (T, hidden) → logits of the last position."""
        s, t = self.s, x.shape[0]
        pos = torch.arange(t, device=self.device)
        h = x
        for layer in self.layers:
            q, k, v = self._qkv(layer, h, 1, t, pos)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            h = h + a.transpose(1, 2).reshape(t, s.heads * s.head_dim) @ layer["o"].t()
            h = self._mlp(layer, h)
        return self.rms(h[-1:], self.norm) @ self.lm_head.t()

    def decode(self, x: torch.Tensor, caches: list[tuple[torch.Tensor, torch.Tensor]], ctx: int) -> torch.Tensor:
        """One decode step: x (B, hidden) new tokens at position ``ctx``; caches[l] = (K, V) of (B, kvh, ctx+1, D)."""
        s, b = self.s, x.shape[0]
        pos = torch.full((b, 1), ctx, device=self.device, dtype=torch.long)
        h = x
        for layer, (kc, vc) in zip(self.layers, caches, strict=True):
            q, k, v = self._qkv(layer, h, b, 1, pos)
            kc[:, :, ctx: ctx + 1].copy_(k)  # append the new token's K/V to the cache
            vc[:, :, ctx: ctx + 1].copy_(v)
            a = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
            h = h + a.transpose(1, 2).reshape(b, s.heads * s.head_dim) @ layer["o"].t()
            h = self._mlp(layer, h)
        return self.rms(h, self.norm) @ self.lm_head.t()


def _sdpa_backend_note(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu (math/flash-cpu)"
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q = torch.randn(1, 32, 256, 128, device=device, dtype=torch.bfloat16)
        k = torch.randn(1, 8, 256, 128, device=device, dtype=torch.bfloat16)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
        return "flash (torch SDPBackend.FLASH_ATTENTION accepted GQA + causal)"
    except Exception as e:  # noqa: BLE001 - recorded in the JSON, the run goes on with torch's own choice
        return f"flash refused ({type(e).__name__}: {str(e)[:120]}); torch's default SDPA choice"


def measure(plan: Plan, device: torch.device, say: Callable[[str], None]) -> dict[str, Any]:
    dtype = torch.bfloat16
    timer = Timer(device)
    s = plan.shape
    out: dict[str, Any] = {"shape": asdict(s), "dtype": "bfloat16", "reps": plan.reps, "warmup": plan.warmup}
    out["sdpa_backend"] = _sdpa_backend_note(device)

    # ---- (c) ceilings first (a cold GPU clocks up during them)
    n = plan.gemm_n
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    t, _ = timer.median_s(lambda a=a, b=b: a @ b, plan.reps, plan.warmup)
    gemm = {"square": {"m": n, "n": n, "k": n, "s": t, "tflops": 2 * n**3 / t / 1e12}}
    del a, b
    for name, (m, k_, nn) in {
        "prefill_gate_up_8192tok": (8192 if device.type == "cuda" else 64, s.hidden, 2 * s.intermediate),
        "decode_gate_up_b1": (1, s.hidden, 2 * s.intermediate),
        "decode_gate_up_b64": (64, s.hidden, 2 * s.intermediate),
    }.items():
        x = torch.randn(m, k_, device=device, dtype=dtype)
        w = torch.randn(nn, k_, device=device, dtype=dtype)
        t, _ = timer.median_s(lambda x=x, w=w: x @ w.t(), plan.reps, plan.warmup)
        moved = (m * k_ + nn * k_ + m * nn) * 2
        gemm[name] = {"m": m, "n": nn, "k": k_, "s": t, "tflops": 2 * m * nn * k_ / t / 1e12,
                      "gb_per_s": moved / t / 1e9}
        del x, w
    out["gemm"] = gemm
    say(f"gemm {n}^3: {gemm['square']['tflops']:.0f} TFLOP/s")

    elems = plan.copy_bytes // 2
    src = torch.randn(elems, device=device, dtype=dtype)
    dst = torch.empty_like(src)
    t, _ = timer.median_s(lambda dst=dst, src=src: dst.copy_(src), plan.reps, plan.warmup)
    t_sum, _ = timer.median_s(lambda src=src: src.sum(dtype=torch.float32), plan.reps, plan.warmup)
    out["hbm"] = {"bytes": plan.copy_bytes, "copy_s": t, "copy_read_plus_write_gb_per_s": 2 * plan.copy_bytes / t / 1e9,
                  "sum_s": t_sum, "read_gb_per_s": plan.copy_bytes / t_sum / 1e9}
    del src, dst
    hbm = out["hbm"]
    say(f"hbm copy {hbm['copy_read_plus_write_gb_per_s']:.0f} GB/s (r+w), read {hbm['read_gb_per_s']:.0f}")

    model = Model(s, device, dtype)
    out["weight_bytes"] = model.weight_bytes()
    gen = torch.Generator(device=device).manual_seed(1)

    # ---- (a) prefill
    prefill = []
    with torch.inference_mode():
        for tokens in plan.prompts:
            x = torch.randn(tokens, s.hidden, device=device, dtype=dtype, generator=gen)
            t, times = timer.median_s(lambda x=x: model.prefill(x), max(3, plan.reps // 4), plan.warmup)
            prefill.append({"input_tokens": tokens, "s": t, "tokens_per_s": tokens / t,
                            "min_s": min(times), "max_s": max(times)})
            say(f"prefill {tokens}: {t * 1e3:.2f} ms ({tokens / t:,.0f} tok/s)")
            del x
    out["prefill"] = prefill

    # ---- (b) decode, eager and CUDA graph
    decode = []
    with torch.inference_mode():
        for ctx in plan.contexts:
            for batch in plan.batches:
                caches = []
                for _ in range(s.layers):
                    kc = torch.empty(batch, s.kv_heads, ctx + 1, s.head_dim, device=device, dtype=dtype)
                    vc = torch.empty_like(kc)
                    kc.normal_(generator=gen)
                    vc.normal_(generator=gen)
                    caches.append((kc, vc))
                x = torch.randn(batch, s.hidden, device=device, dtype=dtype, generator=gen)
                t, times = timer.median_s(lambda x=x, c=caches, ctx=ctx: model.decode(x, c, ctx), plan.reps,
                                          plan.warmup)
                row: dict[str, Any] = {"batch": batch, "context": ctx, "eager_s": t, "eager_min_s": min(times)}
                if device.type == "cuda":
                    try:
                        st = torch.cuda.Stream()
                        st.wait_stream(torch.cuda.current_stream())
                        with torch.cuda.stream(st):
                            for _ in range(2):
                                model.decode(x, caches, ctx)
                        torch.cuda.current_stream().wait_stream(st)
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph):
                            model.decode(x, caches, ctx)
                        tg, gtimes = timer.median_s(graph.replay, plan.reps, plan.warmup)
                        row["graph_s"], row["graph_min_s"] = tg, min(gtimes)
                        del graph
                    except Exception as e:  # noqa: BLE001 - recorded; the eager figure stands alone
                        row["graph_error"] = f"{type(e).__name__}: {str(e)[:200]}"
                kv_bytes = 2 * s.layers * batch * (ctx + 1) * s.kv_heads * s.head_dim * 2
                row["kv_bytes_read"] = kv_bytes
                row["bytes_floor"] = model.weight_bytes() + kv_bytes
                decode.append(row)
                say(f"decode b{batch} c{ctx}: eager {t * 1e3:.2f} ms, graph "
                    f"{row.get('graph_s', float('nan')) * 1e3:.2f} ms")
                del caches, x
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    out["decode"] = decode
    return out


def machine(device: torch.device) -> dict[str, Any]:
    m: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                         "platform": platform.platform(), "cores": os.cpu_count(),
                         "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        m.update({"gpu": p.name, "gpu_memory_bytes": p.total_memory, "sms": p.multi_processor_count,
                  "cuda": torch.version.cuda, "capability": f"{p.major}.{p.minor}"})
        try:
            import subprocess

            m["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit",
                 "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception as e:  # noqa: BLE001 - a fact we could not read is recorded as such
            m["nvidia_smi"] = f"unavailable: {e}"
    return m


def start(smoke: bool) -> tuple[torch.device, float, Callable[[str], None]] | None:
    """The device (None, after saying why, when a full run finds no GPU), the start time, and a timestamped print."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not smoke and device.type != "cuda":
        print("no CUDA device: use --smoke for a CPU check", file=sys.stderr)
        return None
    t0 = time.time()

    def say(msg: str) -> None:
        print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)

    return device, t0, say


def arguments(doc: str, out_name: str) -> argparse.ArgumentParser:
    """The options both H200 scripts take: ``--smoke`` and ``--out`` (default ``$OUT/<out_name>``)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (CPU is fine): check the script runs")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), out_name))
    return ap


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, "h200-microbench.json").parse_args(argv)
    plan = SMOKE if args.smoke else FULL
    got = start(args.smoke)
    if got is None:
        return 2
    device, t0, say = got
    say(f"device {device}, plan {'smoke' if args.smoke else 'full'}")
    results = measure(plan, device, say)
    doc = {
        "schema": 1,
        "benchmark": "h200-microbench",
        "command": "python3 hack/gpu/measure_h200.py" + (" --smoke" if args.smoke else ""),
        "machine": machine(device),
        "note": "torch eager/SDPA on one GPU, not vLLM: random bf16 weights, contiguous KV cache, unfused "
                "elementwise kernels; decode also replayed from a CUDA graph",
        "results": results,
        "wall_s": time.time() - t0,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

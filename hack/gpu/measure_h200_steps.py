"""Step-level microbenchmark for the twin's step model on one H200: prefill and decode replayed from CUDA graphs,
and **mixed steps** (a decode batch and one prefill chunk in one forward, what vLLM's chunked prefill runs).

The twin prices a step as ``max(compute, memory) + collectives + overhead`` (disagg/perf/roofline.py): a prefill
chunk that rides in a decode batch's step costs the decode streams only what its FLOPs add beyond the step's
memory time. This measures the thing that claim rests on, on a real GPU, for three shapes:

- Llama-3.1-8B (one GPU);
- Qwen3-32B (one GPU; no q/k-norm, which is two tiny per-head RMSNorms a layer);
- one GPU's shard of Llama-3.1-70B at TP 4 (16 query heads, 2 KV heads, MLP width 7168, a quarter of the
  vocabulary): the compute the twin prices for 70B TP 4, **without** the all-reduces (one GPU cannot run them).

Per shape: (a) prefill of one prompt, graph-replayed (no launch gaps; the 2026-11-30 eager figures of
``measure_h200.py`` were launch-bound at 512 tokens); (b) decode steps over batch and context, graph-replayed;
(c) mixed steps: decode batch B at context C plus a prefill chunk of P tokens after Q tokens of its own earlier
chunks, against the decode step alone and the chunk alone; (d) the linear layers alone (every GEMM of a step and
nothing else) from 1 to 4096 tokens: how a GEMM's weight stream and its FLOPs overlap, by size.

Like ``measure_h200.py`` (whose ``Shape``, ``Timer`` and ``Model`` this reuses) it is **torch + SDPA, not vLLM**:
random bf16 weights, contiguous KV caches, unfused RMSNorm/RoPE/SiLU kernels, the decode rows' attention and the
chunk's attention as two SDPA calls (vLLM runs one varlen kernel). The mixed step's *increment over the decode
step* is the figure to compare with the twin, more than its absolute time.

    python3 hack/gpu/measure_h200_steps.py                     # on the H200 (the `run` tool), ~3 min
    python3 hack/gpu/measure_h200_steps.py --smoke --out /tmp/s.json   # tiny shapes on CPU: catches typos
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own convention

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure_h200 import LLAMA_8B, TINY, Model, Shape, Timer, arguments, machine, start

# disagg/perf/presets.py MODELS["Qwen3-32B"] (Qwen/Qwen3-32B config.json)
QWEN3_32B = Shape(hidden=5120, layers=64, heads=64, kv_heads=8, head_dim=128, intermediate=25600, vocab=151936)
# one GPU of MODELS["Llama-3.1-70B"] at TP 4: vLLM shards heads, MLP columns/rows and the vocabulary 4 ways
# (QKVParallelLinear, MergedColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding/ParallelLMHead)
LLAMA_70B_TP4 = Shape(hidden=8192, layers=80, heads=64 // 4, kv_heads=8 // 4, head_dim=128,
                      intermediate=28672 // 4, vocab=128256 // 4)


@dataclass(frozen=True)
class Mixed:
    batch: int  # decode sequences in the step
    context: int  # their context
    chunk: int  # prefill tokens in the step
    prior: int  # tokens of the same prompt already prefilled (earlier chunks)


@dataclass(frozen=True)
class ShapePlan:
    name: str  # the twin's (preset model, tp) this stands for
    model: str
    tp: int
    shape: Shape
    prompts: tuple[int, ...]
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    max_kv_tokens: int  # decode cache cap (batch × context) so the caches fit beside the weights
    mixed: tuple[Mixed, ...]
    linear_rows: tuple[int, ...] = ()  # (d) the linear layers alone at these token counts


def _mixes(batches: tuple[int, ...], chunks: tuple[int, ...], context: int = 1024) -> tuple[Mixed, ...]:
    return tuple(Mixed(b, context, p, 0) for b in batches for p in chunks)


LINEAR_ROWS = (1, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 4096)
FULL = (
    ShapePlan("Llama-3.1-8B", "Llama-3.1-8B", 1, LLAMA_8B, (256, 512, 1024, 2048, 4096, 8192),
              (1, 16, 64, 128, 256), (1024, 4096), 300_000,
              _mixes((16,), (512, 2048)) + _mixes((64,), (256, 512, 1024, 2048, 4096))
              + (Mixed(64, 4096, 2048, 0), Mixed(64, 1024, 2048, 6144), Mixed(128, 1024, 2048, 0),
                 Mixed(0, 0, 2048, 6144)), LINEAR_ROWS),
    ShapePlan("Qwen3-32B", "Qwen3-32B", 1, QWEN3_32B, (512, 2048, 8192), (1, 16, 64, 128), (1024, 4096), 160_000,
              _mixes((64,), (512, 2048)), LINEAR_ROWS),
    ShapePlan("Llama-3.1-70B TP4 (one GPU's shard)", "Llama-3.1-70B", 4, LLAMA_70B_TP4, (512, 2048, 8192),
              (1, 16, 64, 128), (1024, 4096), 300_000, _mixes((64,), (512, 2048)), LINEAR_ROWS),
)
SMOKE = (
    ShapePlan("tiny", "Llama-3.1-8B", 1, TINY, (16, 64), (1, 4), (32,), 10_000,
              (Mixed(4, 32, 16, 0), Mixed(4, 32, 16, 32), Mixed(0, 0, 16, 32)), (1, 16, 64)),
)


class StepModel(Model):
    def linear_only(self, x: torch.Tensor, a: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """The step's GEMMs and nothing else: every layer's QKV, O, gate/up and down projections on ``x`` (T, hidden),
        ``a`` (T, heads·head_dim) and ``m`` (T, intermediate), then the LM head on the last row. No norms,
        RoPE, attention or activations: the linear layers' time as a function of T alone."""
        for layer in self.layers:  # the results are dropped: the kernels run (and are captured) all the same
            x @ layer["qkv"].t()
            a @ layer["o"].t()
            x @ layer["gate_up"].t()
            m @ layer["down"].t()
        return x[-1:] @ self.lm_head.t()

    """Model with a mixed step: decode rows and one prefill chunk share every linear layer's GEMM."""

    def chunk_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        prior: int) -> tuple[torch.Tensor, str]:
        """Causal attention of a chunk's queries (1, H, P, D) over its prompt's keys so far (1, kvh, prior+P, D)."""
        s = self.s
        if prior == 0:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), "flash causal"
        rep = s.heads // s.kv_heads
        ke, ve = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        try:
            from torch.nn.attention.bias import causal_lower_right

            bias = causal_lower_right(q.shape[2], k.shape[2])
            return F.scaled_dot_product_attention(q, ke, ve, attn_mask=bias), "causal_lower_right"
        except Exception:  # noqa: BLE001 - an older torch: an explicit mask (slower; recorded in the JSON)
            p, t = q.shape[2], k.shape[2]
            mask = torch.ones(p, t, dtype=torch.bool, device=q.device).tril(diagonal=t - p)
            return F.scaled_dot_product_attention(q, ke, ve, attn_mask=mask), "explicit mask"

    def mixed(self, xd: torch.Tensor | None, caches: list[tuple[torch.Tensor, torch.Tensor]] | None, ctx: int,
              xp: torch.Tensor, pcaches: list[tuple[torch.Tensor, torch.Tensor]], prior: int) -> torch.Tensor:
        """One forward: decode rows ``xd`` (B, hidden) at position ``ctx`` (K/V appended to ``caches``) and a prefill
        chunk ``xp`` (P, hidden) at positions prior..prior+P−1 of one prompt whose K/V so far are in ``pcaches``.
        Logits for every decode row and the chunk's last position."""
        s = self.s
        b = 0 if xd is None else xd.shape[0]
        p = xp.shape[0]
        pos_d = torch.full((b, 1), ctx, device=self.device, dtype=torch.long)
        pos_p = torch.arange(prior, prior + p, device=self.device)
        h = xp if xd is None else torch.cat((xd, xp))
        self.attention_path = ""
        layer_caches = caches if caches is not None else [None] * len(self.layers)
        for layer, dc, (pk, pv) in zip(self.layers, layer_caches, pcaches, strict=True):
            qkv = self.rms(h, layer["ln1"]) @ layer["qkv"].t()
            q, k, v = qkv.split([s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1)
            parts = []
            if b:
                assert dc is not None
                kc, vc = dc
                qd = self.rope(q[:b].view(b, 1, s.heads, s.head_dim).transpose(1, 2), pos_d)
                kd = self.rope(k[:b].view(b, 1, s.kv_heads, s.head_dim).transpose(1, 2), pos_d)
                kc[:, :, ctx: ctx + 1].copy_(kd)
                vc[:, :, ctx: ctx + 1].copy_(v[:b].view(b, 1, s.kv_heads, s.head_dim).transpose(1, 2))
                ad = F.scaled_dot_product_attention(qd, kc, vc, enable_gqa=True)
                parts.append(ad.transpose(1, 2).reshape(b, s.heads * s.head_dim))
            qp = self.rope(q[b:].view(1, p, s.heads, s.head_dim).transpose(1, 2), pos_p)
            kp = self.rope(k[b:].view(1, p, s.kv_heads, s.head_dim).transpose(1, 2), pos_p)
            pk[:, :, prior: prior + p].copy_(kp)
            pv[:, :, prior: prior + p].copy_(v[b:].view(1, p, s.kv_heads, s.head_dim).transpose(1, 2))
            ap, self.attention_path = self.chunk_attention(qp, pk[:, :, : prior + p], pv[:, :, : prior + p], prior)
            parts.append(ap.transpose(1, 2).reshape(p, s.heads * s.head_dim))
            h = h + torch.cat(parts) @ layer["o"].t()
            h = self._mlp(layer, h)
        sampled = h[-1:] if not b else torch.cat((h[:b], h[-1:]))
        return self.rms(sampled, self.norm) @ self.lm_head.t()


def timed(timer: Timer, fn: Callable[[], Any], reps: int, warmup: int, graph: bool) -> dict[str, Any]:
    """Median time of ``fn``: replayed from a CUDA graph where ``graph`` (falling back to eager, recorded)."""
    if graph:
        try:
            st = torch.cuda.Stream()
            st.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(st):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(st)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            t, times = timer.median_s(g.replay, reps, warmup)
            del g
            return {"s": t, "min_s": min(times), "max_s": max(times), "how": "cuda graph"}
        except Exception as e:  # noqa: BLE001 - recorded; the eager figure stands in
            note = f"graph failed ({type(e).__name__}: {str(e)[:160]}); eager"
            torch.cuda.synchronize()
    else:
        note = "eager"
    t, times = timer.median_s(fn, reps, warmup)
    return {"s": t, "min_s": min(times), "max_s": max(times), "how": note}


def kv_cache(s: Shape, batch: int, length: int, device: torch.device, dtype: torch.dtype,
             gen: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for _ in range(s.layers):
        kc = torch.empty(batch, s.kv_heads, length, s.head_dim, device=device, dtype=dtype)
        vc = torch.empty_like(kc)
        kc.normal_(generator=gen)
        vc.normal_(generator=gen)
        out.append((kc, vc))
    return out


def measure_shape(sp: ShapePlan, device: torch.device, say: Callable[[str], None], reps: int,
                  warmup: int) -> dict[str, Any]:
    dtype = torch.bfloat16
    timer = Timer(device)
    graph = device.type == "cuda"
    s = sp.shape
    model = StepModel(s, device, dtype)
    gen = torch.Generator(device=device).manual_seed(2)
    out: dict[str, Any] = {"name": sp.name, "model": sp.model, "tp": sp.tp, "shape": asdict(s),
                           "weight_bytes": model.weight_bytes(), "prefill": [], "decode": [], "mixed": []}
    with torch.inference_mode():
        for tokens in sp.prompts:
            x = torch.randn(tokens, s.hidden, device=device, dtype=dtype, generator=gen)
            r = timed(timer, lambda x=x: model.prefill(x), max(5, reps // 2) if tokens >= 4096 else reps, warmup,
                      graph)
            out["prefill"].append({"input_tokens": tokens, **r, "tokens_per_s": tokens / r["s"]})
            say(f"{sp.name} prefill {tokens}: {r['s'] * 1e3:.2f} ms ({tokens / r['s']:,.0f} tok/s, {r['how']})")
            del x

        decode_s: dict[tuple[int, int], float] = {}
        for ctx in sp.contexts:
            for batch in sp.batches:
                if batch * (ctx + 1) > sp.max_kv_tokens:
                    continue
                caches = kv_cache(s, batch, ctx + 1, device, dtype, gen)
                x = torch.randn(batch, s.hidden, device=device, dtype=dtype, generator=gen)
                r = timed(timer, lambda x=x, c=caches, ctx=ctx: model.decode(x, c, ctx), reps, warmup, graph)
                decode_s[(batch, ctx)] = r["s"]
                out["decode"].append({"batch": batch, "context": ctx, **r})
                say(f"{sp.name} decode b{batch} c{ctx}: {r['s'] * 1e3:.2f} ms ({r['how']})")
                del caches, x
                if graph:
                    torch.cuda.empty_cache()

        for rows in sp.linear_rows:
            x = torch.randn(rows, s.hidden, device=device, dtype=dtype, generator=gen)
            a = torch.randn(rows, s.heads * s.head_dim, device=device, dtype=dtype, generator=gen)
            mm = torch.randn(rows, s.intermediate, device=device, dtype=dtype, generator=gen)
            r = timed(timer, lambda x=x, a=a, mm=mm: model.linear_only(x, a, mm), reps, warmup, graph)
            out.setdefault("linear", []).append({"tokens": rows, **r})
            say(f"{sp.name} linear layers, {rows} tokens: {r['s'] * 1e3:.2f} ms ({r['how']})")
            del x, a, mm

        for m in sp.mixed:
            pc = kv_cache(s, 1, m.prior + m.chunk, device, dtype, gen)
            xp = torch.randn(m.chunk, s.hidden, device=device, dtype=dtype, generator=gen)
            row: dict[str, Any] = asdict(m)
            # the chunk alone (same prior context), then the decode step alone, then both in one forward
            r = timed(timer, lambda xp=xp, pc=pc, m=m: model.mixed(None, None, 0, xp, pc, m.prior), reps, warmup,
                      graph)
            row["chunk_alone_s"] = r["s"]
            row["attention_path"] = model.attention_path
            if m.batch:
                caches = kv_cache(s, m.batch, m.context + 1, device, dtype, gen)
                xd = torch.randn(m.batch, s.hidden, device=device, dtype=dtype, generator=gen)
                if (m.batch, m.context) in decode_s:
                    row["decode_alone_s"] = decode_s[(m.batch, m.context)]
                else:
                    row["decode_alone_s"] = timed(timer, lambda xd=xd, c=caches, m=m: model.decode(xd, c, m.context),
                                                  reps, warmup, graph)["s"]
                r = timed(timer, lambda xd=xd, c=caches, xp=xp, pc=pc, m=m: model.mixed(xd, c, m.context, xp, pc,
                                                                                     m.prior), reps, warmup, graph)
                row.update({"mixed_s": r["s"], "how": r["how"],
                            "added_by_chunk_s": r["s"] - row["decode_alone_s"],
                            "overlap_s": row["decode_alone_s"] + row["chunk_alone_s"] - r["s"]})
                del caches, xd
                say(f"{sp.name} mixed b{m.batch} c{m.context} + chunk {m.chunk} (prior {m.prior}): "
                    f"{r['s'] * 1e3:.2f} ms = decode {row['decode_alone_s'] * 1e3:.2f} + "
                    f"{row['added_by_chunk_s'] * 1e3:.2f} (chunk alone {row['chunk_alone_s'] * 1e3:.2f})")
            else:
                row["how"] = r["how"]
                say(f"{sp.name} chunk {m.chunk} after {m.prior}: {r['s'] * 1e3:.2f} ms ({model.attention_path})")
            out["mixed"].append(row)
            del pc, xp
            if graph:
                torch.cuda.empty_cache()
    return out  # the model's weights go with this frame; the caller empties the CUDA cache


def main(argv: list[str] | None = None) -> int:
    ap = arguments(__doc__, "h200-steps.json")
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    plans = SMOKE if args.smoke else FULL
    got = start(args.smoke)
    if got is None:
        return 2
    device, t0, say = got

    doc: dict[str, Any] = {
        "schema": 1,
        "benchmark": "h200-steps",
        "command": "python3 hack/gpu/measure_h200_steps.py" + (" --smoke" if args.smoke else ""),
        "machine": machine(device),
        "note": "torch + SDPA on one GPU, not vLLM: random bf16 weights, contiguous KV caches, unfused elementwise "
                "kernels, prefill/decode/mixed steps replayed from CUDA graphs; the 70B row is one TP-4 shard "
                "without its all-reduces",
        "results": {"reps": args.reps, "warmup": args.warmup, "shapes": [], "errors": []},
    }
    res = doc["results"]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    for sp in plans:
        try:
            res["shapes"].append(measure_shape(sp, device, say, args.reps, args.warmup))
            if device.type == "cuda":
                torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001 - one shape's failure (memory, a kernel) keeps the others' figures
            res["errors"].append(f"{sp.name}: {type(e).__name__}: {str(e)[:300]}")
            say(f"{sp.name} FAILED: {e}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
        doc["wall_s"] = time.time() - t0
        with open(args.out, "w") as f:  # after every shape: a run cut short still returns what it measured
            json.dump(doc, f, indent=1)
    say(f"wrote {args.out}")
    return 0 if not res["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

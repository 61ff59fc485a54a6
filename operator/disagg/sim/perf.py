"""The pure performance model: a roofline for one engine step, KV-cache capacity, KV-transfer time.

No I/O, no clock, no asyncio: the simulated worker, the benchmarks and the router's estimates all call
the same functions. Units are SI (seconds, bytes, FLOPs). docs/simulator.md derives every formula.

One engine step runs a batch of sequences; each sequence contributes ``new_tokens`` (1 for a decode,
up to the chunk for a prefill) on top of ``context`` tokens already in its KV cache::

    step = max(compute, memory) + communication + overhead
    compute = (2·active_params·T + 2·lm_head·S + attention FLOPs) / (tp · peak · compute_eff)
    memory  = (weights read + KV read + KV written) per GPU / (HBM bandwidth · memory_eff)

T = tokens in the step, S = sequences that sample a token. Pipeline parallelism splits memory but not a
step's latency (stages run one after another for one batch; micro-batch overlap is not modelled).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .presets import GiB, GPUPreset, ModelPreset, TransportPreset


@dataclass(frozen=True)
class Efficiency:
    """Achievable fractions of the datasheet peaks, and fixed costs (argued in docs/simulator.md)."""

    compute: float = 0.60  # model FLOPs utilisation of large prefill GEMMs + attention kernels
    memory: float = 0.80  # achieved / peak HBM bandwidth when streaming weights and KV
    link: float = 0.80  # achieved / peak NVLink (or PCIe) bandwidth in all-reduce
    step_overhead_s: float = 0.6e-3  # scheduler + input prep + kernel launch per step (CUDA graphs)
    per_seq_overhead_s: float = 4e-6  # per scheduled sequence (sampling, detokenisation bookkeeping)
    runtime_reserve_bytes: float = 1.5 * GiB  # CUDA context, NCCL buffers, CUDA graphs


@dataclass(frozen=True)
class SeqWork:
    new_tokens: int
    context: int = 0  # tokens already in the KV cache before this step
    samples: bool = True  # produces a token at the end of the step (decode, or last prefill chunk)


@dataclass(frozen=True)
class StepCost:
    compute_s: float
    memory_s: float
    comm_s: float
    overhead_s: float
    flops: float
    bytes_per_gpu: float
    tokens: int

    @property
    def total_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.comm_s + self.overhead_s

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


class PerfModel:
    """Roofline of one vLLM engine (tp × pp GPUs) running one model."""

    def __init__(
        self,
        gpu: GPUPreset,
        model: ModelPreset,
        tp: int = 1,
        pp: int = 1,
        *,
        weight_bytes: float = 2.0,
        kv_bytes: float = 2.0,
        fp8_compute: bool = False,
        eff: Efficiency | None = None,
    ) -> None:
        if tp < 1 or pp < 1:
            raise ValueError("tensor and pipeline parallel sizes must be >= 1")
        if model.layers % pp:
            raise ValueError(f"{model.name} has {model.layers} layers, not divisible by pipeline size {pp}")
        self.gpu, self.model, self.tp, self.pp = gpu, model, tp, pp
        self.weight_bytes, self.kv_bytes = weight_bytes, kv_bytes
        self.eff = eff or Efficiency()
        self.peak_flops = gpu.fp8_flops if fp8_compute else gpu.bf16_flops
        # KV heads split over TP ranks; with tp > kv_heads each rank keeps (a replica of) one head.
        self.kv_heads_per_gpu = max(1, math.ceil(model.kv_heads / tp))

    @classmethod
    def from_names(cls, gpu: str = "H100-SXM", model: str = "Llama-3.1-8B", tp: int = 1, pp: int = 1,
                   **kw: Any) -> PerfModel:
        """``PerfModel.from_names("H200", "meta-llama/Llama-3.1-70B-Instruct", tp=4)`` (preset or model id)."""
        from .presets import get_gpu, get_model, infer_model

        try:
            m = get_model(model)
        except ValueError:
            found = infer_model(model)
            if found is None:
                raise
            m = found
        return cls(get_gpu(gpu), m, tp, pp, **kw)

    # ------------------------------------------------------------------------------- memory / capacity
    @property
    def weight_bytes_per_gpu(self) -> float:
        return self.model.total_params * self.weight_bytes / (self.tp * self.pp)

    @property
    def kv_bytes_per_token(self) -> float:
        """Whole-model KV bytes of one token: what a P→D transfer moves."""
        return self.model.kv_bytes_per_token(self.kv_bytes)

    @property
    def kv_bytes_per_token_per_gpu(self) -> float:
        layers = self.model.layers / self.pp
        return 2 * layers * self.kv_heads_per_gpu * self.model.head_dim * self.kv_bytes

    def activation_bytes(self, max_num_batched_tokens: int, max_num_seqs: int) -> float:
        """Peak activation memory vLLM's profiling run finds, roughly: hidden + MLP intermediates of the
        largest batch, plus fp32 logits of the sampled sequences."""
        m = self.model
        inter = (m.moe_intermediate * m.experts_per_token if m.is_moe else m.intermediate) / self.tp
        per_token = (4 * m.hidden + 3 * inter) * 2.0
        logits = min(max_num_seqs, max_num_batched_tokens) * m.vocab / self.tp * 4.0
        return max_num_batched_tokens * per_token + logits

    def kv_cache_bytes_per_gpu(self, gpu_memory_utilization: float, max_num_batched_tokens: int = 8192,
                               max_num_seqs: int = 256) -> float:
        budget = self.gpu.memory_bytes * gpu_memory_utilization
        return (budget - self.weight_bytes_per_gpu - self.eff.runtime_reserve_bytes
                - self.activation_bytes(max_num_batched_tokens, max_num_seqs))

    def num_kv_blocks(self, gpu_memory_utilization: float, block_size: int = 16, max_num_batched_tokens: int = 8192,
                      max_num_seqs: int = 256) -> int:
        free = self.kv_cache_bytes_per_gpu(gpu_memory_utilization, max_num_batched_tokens, max_num_seqs)
        return max(0, int(free // (self.kv_bytes_per_token_per_gpu * block_size)))

    # ------------------------------------------------------------------------------------- step time
    def _weights_read(self, tokens: int, sampled: int) -> float:
        """Bytes of weights streamed from HBM in one step, summed over the TP group (divide by tp)."""
        m = self.model
        if m.is_moe:
            # Each token routes to k of E experts; distinct experts touched by T tokens (uniform routing).
            e, k = m.num_experts, m.experts_per_token
            touched = e * (1.0 - (1.0 - k / e) ** max(tokens, 0)) if tokens else 0.0
            mlp = touched * m.expert_params + m.router_params_per_layer
        else:
            mlp = m.mlp_params_per_layer
        body = m.layers * (m.attn_params_per_layer + mlp)
        head = m.lm_head_params if sampled else 0
        return (body + head) * self.weight_bytes

    def step(self, seqs: Iterable[SeqWork]) -> StepCost:
        m = self.model
        seqs = list(seqs)
        tokens = sum(s.new_tokens for s in seqs)
        sampled = sum(1 for s in seqs if s.samples)
        if tokens == 0:
            return StepCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
        body_active = m.layers * (m.attn_params_per_layer + m.active_mlp_params_per_layer)
        linear = 2.0 * tokens * body_active + 2.0 * sampled * m.lm_head_params
        # causal attention: new token j of a sequence attends to context + j + 1 keys; QK^T and PV
        pairs = sum(s.new_tokens * s.context + s.new_tokens * (s.new_tokens + 1) / 2 for s in seqs)
        attn = 4.0 * m.heads * m.head_dim * m.layers * pairs
        flops = linear + attn
        compute_s = flops / (self.tp * self.peak_flops * self.eff.compute)

        kv_tok = self.kv_bytes_per_token_per_gpu * self.pp  # summed over the sequential stages
        kv_read = sum(s.context + s.new_tokens for s in seqs) * kv_tok
        kv_write = tokens * kv_tok
        bytes_per_gpu = self._weights_read(tokens, sampled) / self.tp + kv_read + kv_write
        memory_s = bytes_per_gpu / (self.gpu.hbm_bw * self.eff.memory)

        comm_s = 0.0
        link = self.gpu.link_bw * self.eff.link
        act = tokens * m.hidden * 2.0  # bf16 activations
        if self.tp > 1:
            per_allreduce = self.gpu.link_latency_s + 2.0 * (self.tp - 1) / self.tp * act / link
            comm_s += 2 * m.layers * per_allreduce  # after attention and after the MLP, every layer
        if self.pp > 1:
            comm_s += (self.pp - 1) * (self.gpu.link_latency_s + act / link)
        overhead_s = self.eff.step_overhead_s + self.eff.per_seq_overhead_s * len(seqs)
        return StepCost(compute_s, memory_s, comm_s, overhead_s, flops, bytes_per_gpu, tokens)

    # ------------------------------------------------------------------------------- convenience
    def prefill_time(self, prompt_tokens: int, chunk: int | None = None, cached: int = 0) -> float:
        """Time to prefill one prompt alone (in chunks of ``chunk`` tokens if given)."""
        todo, ctx, total = prompt_tokens - cached, cached, 0.0
        chunk = chunk or todo
        while todo > 0:
            n = min(chunk, todo)
            todo -= n
            total += self.step([SeqWork(n, ctx, samples=todo == 0)]).total_s
            ctx += n
        return total

    def decode_step_time(self, batch: int, context: int) -> float:
        return self.step([SeqWork(1, context)] * batch).total_s

    def prefill_tokens_per_s(self, prompt_tokens: int, chunk: int = 8192) -> float:
        return prompt_tokens / self.prefill_time(prompt_tokens, chunk)

    def decode_tokens_per_s(self, batch: int, context: int) -> float:
        return batch / self.decode_step_time(batch, context)

    def transfer_bytes(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token

    def transfer_time(self, tokens: int, transport: TransportPreset, *, remote_tp: int | None = None,
                      first_contact: bool = False) -> float:
        """Seconds for a decode engine to pull ``tokens`` tokens of KV from a prefill engine.

        RDMA and NVLink pulls run on every TP rank in parallel (one NIC / link per GPU), so their bandwidth
        scales with the smaller TP of the two sides; TCP shares the pod's network and does not.
        """
        lanes = 1 if transport.name == "tcp" else max(1, min(self.tp, remote_tp or self.tp))
        t = transport.latency_s + self.transfer_bytes(tokens) / (transport.bandwidth * lanes)
        return t + (transport.handshake_s if first_contact else 0.0)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) — shared by tests and benchmarks."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
    return s[k]

"""The pure performance model: a roofline for one engine step, KV-cache capacity, KV-transfer time.

No I/O, no clock, no asyncio: the simulated worker, the benchmarks and the router's estimates all call
the same functions. Units are SI (seconds, bytes, FLOPs). docs/simulator.md derives every formula.

One engine step runs a batch of sequences; each sequence contributes ``new_tokens`` (1 for a decode,
up to the chunk for a prefill) on top of ``context`` tokens already in its KV cache::

    step = max(compute, memory) + communication + overhead
    compute = (2·active_params·T + 2·lm_head·S + attention FLOPs) / (tp · peak · compute_eff)
    memory  = (weights read + KV read + KV written) per GPU / (HBM bandwidth · memory_eff)
    communication = 2·layers·ring_allreduce(T·hidden·2 B over tp)  [+ MoE all-to-all with ep > 1]
    overhead = CPU step cost + per-layer kernel gaps + per-sequence CPU cost

T = tokens in the step, S = sequences that sample a token. Pipeline parallelism splits memory but not a
step's latency (stages run one after another for one batch; micro-batch overlap is not modelled).
Per request, ``eff.request_overhead_s`` (HTTP, tokenisation, detokenisation) adds to TTFT outside the steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .presets import CPU_ENGINE, GiB, GPUPreset, ModelPreset, TransportPreset, human_bytes

# vLLM's custom all-reduce handles messages below this (CustomAllreduce max_size=8192 * 1024, 0.33.0)
CUSTOM_AR_MAX_BYTES = 8192 * 1024


class KVCapacityError(ValueError):
    """The KV cache cannot hold one request of the model's max length (the engine fails to start)."""


@dataclass(frozen=True)
class Efficiency:
    """Achievable fractions of the datasheet peaks, and fixed costs (argued in docs/simulator.md §5).

    ``step_overhead_s`` is the one constant fitted to measurements (the ``fit`` points of
    ``disagg bench sim``); the others are set from microbenchmarks (docs/results/h200-microbench.json) or
    stated assumptions, and checked against the ``held-out`` points.
    """

    compute: float = 0.60  # model FLOPs utilisation of large prefill GEMMs + attention kernels
    # the share of the lesser of a linear layer's weight stream and its GEMM FLOPs that the greater does not hide
    # (0: a perfect roofline, max(); 1: one after the other). From this project's H200 steps (torch + cuBLAS, the
    # GEMMs vLLM's unquantized layers call; docs/results/h200-steps.json): a 256–4096-token prefill chunk riding in
    # a decode step adds 0.7–0.9 of its own time to it (φ near 1), while Qwen3-32B's decode at batch 128 hides
    # most of its FLOPs under its weight reads. 0.40 is the largest value (0.05 grid) at which every whole step
    # the H200 measured stays an upper bound on the twin's (docs/simulator.md §8)
    gemm_unhidden: float = 0.40
    memory: float = 0.80  # achieved / peak HBM bandwidth when streaming weights and KV
    link: float = 0.80  # achieved / peak NVLink (or PCIe) bandwidth in all-reduce
    step_overhead_s: float = 0.48e-3  # CPU per step: scheduler, input prep, CUDA-graph launch (FITTED)
    per_layer_overhead_s: float = 10e-6  # GPU per layer per step: kernel tails/gaps inside the graph
    per_seq_overhead_s: float = 10e-6  # CPU per scheduled sequence per step (inputs, sampling, detokenise)
    request_overhead_s: float = 3e-3  # per request, on the TTFT path: HTTP, tokenise, first chunk out
    # non-KV memory outside weights and the profile run's activation peak (vllm/v1/worker/gpu_worker.py
    # determine_available_memory, 0.33.0: requested − non_kv_cache_memory − cudagraph_memory_estimate, the CUDA-graph
    # estimate applied by default since 0.21.0, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS): non-torch memory (CUDA
    # context, cuBLAS/NCCL workspaces: 0.1–0.65 GiB in V1 startup logs at TP 1) + the graphs' pool (an assumption)
    runtime_reserve_bytes: float = 1.5 * GiB


# Engines whose fixed costs are not a GPU's: the real-engine tier's CPU engine, every cost FITTED on a real vLLM
# 0.32.0 CPU engine (disagg bench real-engine: docs/results/real-engine.json "fit"; tests/perf checks they are the
# committed fit). No kernel gaps apart from the per-step cost, no runtime reserve (--kv-cache-memory-bytes is set).
GPU_EFFICIENCY: dict[str, Efficiency] = {
    CPU_ENGINE: Efficiency(compute=1.0, memory=1.0, step_overhead_s=2.23e-3, per_layer_overhead_s=0.0,
                           per_seq_overhead_s=66e-6, request_overhead_s=6.0e-3, runtime_reserve_bytes=0.0,
                           gemm_unhidden=0.0),  # fitted as a plain roofline; its 1.6 MB of weights stay in cache
}


@dataclass(frozen=True)
class SeqWork:
    new_tokens: int
    context: int = 0  # tokens already in the KV cache before this step
    samples: bool = True  # produces a token at the end of the step (decode, or last prefill chunk)


class StepCost(NamedTuple):  # a NamedTuple: the twin and the router's placement price many steps a second
    """One step's time by kernel class. A step runs its kernels one after another, so their times add: the
    linear layers (each streams its weights from HBM, then runs its GEMM: on the H200 a chunk's GEMMs add to a
    decode batch's weight reads instead of hiding under them, docs/results/h200-steps.json), attention (its own
    kernel, priced by its own roofline: the larger of its FLOPs and its KV traffic), the collectives, and the
    fixed costs. ``compute_s`` and ``memory_s`` are all FLOPs and all bytes at their rates (what bounds it)."""

    linear_s: float
    attention_s: float
    comm_s: float
    overhead_s: float
    compute_s: float
    memory_s: float
    flops: float
    bytes_per_gpu: float
    tokens: int

    @property
    def total_s(self) -> float:
        return self.linear_s + self.attention_s + self.comm_s + self.overhead_s

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
        ep: int = 1,
        dp: int = 1,
        weight_bytes: float = 2.0,
        kv_bytes: float = 2.0,
        fp8_compute: bool = False,
        eff: Efficiency | None = None,
    ) -> None:
        """``ep`` (expert parallel) shards MoE experts over ``ep`` GPUs instead of splitting each expert over
        ``tp`` (vLLM ``--enable-expert-parallel``: ep = tp × dp); ``dp`` (data parallel) is the number of
        engine replicas whose batches meet in the MoE layers, so each step's experts see ``dp`` × its tokens.
        Dense models ignore both. The step prices one DP rank's batch."""
        for name, v in (("tensor", tp), ("pipeline", pp), ("expert", ep), ("data", dp)):
            if v < 1:
                raise ValueError(f"{name} parallel size must be >= 1, got {v}")
        if model.layers % pp:
            raise ValueError(f"{model.name} has {model.layers} layers, not divisible by pipeline size {pp}")
        if ep > 1 and model.is_moe and model.num_experts % ep:
            raise ValueError(f"{model.name} has {model.num_experts} experts, "
                             f"not divisible by expert-parallel size {ep}")
        self.gpu, self.model, self.tp, self.pp = gpu, model, tp, pp
        self.ep = ep if model.is_moe else 1
        self.dp = dp
        self.weight_bytes, self.kv_bytes = weight_bytes, kv_bytes
        self.eff = eff or GPU_EFFICIENCY.get(gpu.name) or Efficiency()
        self.peak_flops = gpu.fp8_flops if fp8_compute else gpu.bf16_flops
        # KV heads split over TP ranks; with tp > kv_heads each rank keeps (a replica of) one head.
        self.kv_heads_per_gpu = max(1, math.ceil(model.kv_heads / tp))
        # step_totals' per-engine constants (the router prices ~30 steps per SLO decision): the same expressions,
        # evaluated once, so every step time is bit-for-bit what evaluating them per step gives
        m, e = model, self.eff
        self._body_active = m.layers * (m.attn_params_per_layer + m.active_mlp_params_per_layer)
        self._lm_head = m.lm_head_params
        self._attn_per_pair = 4.0 * m.heads * m.head_dim * m.layers
        self._compute_rate = self.tp * self.peak_flops * e.compute
        self._kv_tok = self.kv_bytes_per_token_per_gpu * self.pp
        # weights (decode GEMVs) and KV (attention) stream at the GPU's measured rates where it has them (§3)
        self._memory_rate = gpu.hbm_bw * (gpu.weight_stream_eff or e.memory)
        self._kv_rate = gpu.hbm_bw * (gpu.kv_stream_eff or e.memory)
        self._fixed_overhead_s = e.step_overhead_s + e.per_layer_overhead_s * m.layers
        self._communicates = self.tp > 1 or self.ep > 1 or self.pp > 1
        self._dense_weights = None if m.is_moe else (self._weights_read_per_gpu(1, 0), self._weights_read_per_gpu(1, 1))
        # step_s' own: the dense weights' streaming time (the same division), and the efficiencies it reads
        self._dense_weights_s = (None if self._dense_weights is None else
                                 tuple(w / self._memory_rate for w in self._dense_weights))
        self._gemm_unhidden, self._per_seq_overhead_s = e.gemm_unhidden, e.per_seq_overhead_s

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
        m = self.model
        if self.ep > 1:  # experts sharded whole over ep GPUs; attention, router, embeddings over tp
            experts = m.layers * m.num_experts * m.expert_params
            return ((m.total_params - experts) / self.tp + experts / self.ep) * self.weight_bytes / self.pp
        return m.total_params * self.weight_bytes / (self.tp * self.pp)

    @property
    def kv_bytes_per_token(self) -> float:
        """Whole-model KV bytes of one token: what a P→D transfer moves."""
        return self.model.kv_bytes_per_token(self.kv_bytes)

    @property
    def kv_bytes_per_token_per_gpu(self) -> float:
        layers = self.model.layers / self.pp
        return 2 * layers * self.kv_heads_per_gpu * self.model.head_dim * self.kv_bytes

    def activation_bytes(self, max_num_batched_tokens: int, max_num_seqs: int) -> float:
        """Peak activation memory vLLM's profiling run finds, roughly. vLLM 0.33.0 ``GPUModelRunner.profile_run``
        (vllm/v1/worker/gpu_model_runner.py) runs a dummy forward of ``max_num_tokens`` and *then*
        ``_dummy_sampler_run`` on the last hidden states of min(max_num_seqs, tokens) requests; the forward's
        intermediates are freed in between, so the peak is the larger of the two (``memory_profiling``'s
        ``transient_peak_headroom``, vllm/utils/mem_utils.py), not their sum: hidden + MLP intermediates of the
        largest batch, or the full-vocabulary fp32 logits (gathered over TP ranks) with the sampler's bf16 copy."""
        m = self.model
        inter = (m.moe_intermediate * m.experts_per_token if m.is_moe else m.intermediate) / self.tp
        forward = max_num_batched_tokens * (4 * m.hidden + 3 * inter) * 2.0
        sampler = min(max_num_seqs, max_num_batched_tokens) * m.vocab * (4.0 + 2.0)
        return max(forward, sampler)

    def kv_cache_bytes_per_gpu(self, gpu_memory_utilization: float, max_num_batched_tokens: int = 8192,
                               max_num_seqs: int = 256) -> float:
        budget = self.gpu.memory_bytes * gpu_memory_utilization
        return (budget - self.weight_bytes_per_gpu - self.eff.runtime_reserve_bytes
                - self.activation_bytes(max_num_batched_tokens, max_num_seqs))

    def num_kv_blocks(self, gpu_memory_utilization: float, block_size: int = 16, max_num_batched_tokens: int = 8192,
                      max_num_seqs: int = 256) -> int:
        free = self.kv_cache_bytes_per_gpu(gpu_memory_utilization, max_num_batched_tokens, max_num_seqs)
        return max(0, int(free // (self.kv_bytes_per_token_per_gpu * block_size)))

    def kv_blocks(self, block_size: int, gpu_memory_utilization: float, max_num_batched_tokens: int,
                  max_num_seqs: int, *, max_model_len: int = 0, kv_cache_memory_bytes: float | None = None,
                  num_gpu_blocks_override: int | None = None) -> int:
        """An engine's KV blocks, sized as vLLM sizes them: ``--num-gpu-blocks-override``, else
        ``--kv-cache-memory-bytes`` per GPU, else what ``--gpu-memory-utilization`` leaves after weights, runtime
        and activations (:meth:`kv_cache_bytes_per_gpu`, the planner's figure too). Raises :class:`KVCapacityError`
        (vLLM's startup error, word for word) when they hold fewer than ``max_model_len`` tokens."""
        if num_gpu_blocks_override:
            blocks = num_gpu_blocks_override
        elif kv_cache_memory_bytes:
            blocks = int(kv_cache_memory_bytes // (self.kv_bytes_per_token_per_gpu * block_size))
        else:
            blocks = self.num_kv_blocks(gpu_memory_utilization, block_size, max_num_batched_tokens, max_num_seqs)
        if blocks * block_size < max_model_len:
            # what the engine had for KV: the explicit budget when one was given (the real engine's message names
            # that figure; found when a real CPU engine served what the sim refused, e2e/test_real_vllm.py)
            free = (blocks * block_size * self.kv_bytes_per_token_per_gpu
                    if num_gpu_blocks_override or kv_cache_memory_bytes else
                    self.kv_cache_bytes_per_gpu(gpu_memory_utilization, max_num_batched_tokens, max_num_seqs))
            need = max_model_len * self.kv_bytes_per_token_per_gpu
            raise KVCapacityError(
                f"To serve at least one request with the models's max seq len ({max_model_len}), "
                f"({human_bytes(need)} KV cache is needed, which is larger than the available KV cache memory "
                f"({human_bytes(max(free, 0))}) of {self.model.name} on {self.gpu.name} x{self.tp * self.pp}. "
                "Try increasing `gpu_memory_utilization`, a larger --tensor-parallel-size, or decreasing "
                "`max_model_len` when initializing the engine.")
        return blocks

    # ------------------------------------------------------------------------------------- step time
    def _weights_read_per_gpu(self, tokens: int, sampled: int) -> float:
        """Bytes of weights one GPU streams from HBM in one step (all its pipeline stages summed)."""
        m = self.model
        head = (m.lm_head_params if sampled else 0) / self.tp
        if not m.is_moe:
            return (m.layers * (m.attn_params_per_layer + m.mlp_params_per_layer) / self.tp + head) * self.weight_bytes
        # Each token routes to k of E experts; distinct experts touched by the T·dp tokens that meet in the
        # MoE layer (uniform routing). With ep > 1 a GPU reads only the touched experts it holds (1/ep of them).
        e, k = m.num_experts, m.experts_per_token
        routed = max(tokens, 0) * self.dp
        touched = e * (1.0 - (1.0 - k / e) ** routed) if routed else 0.0
        experts = touched * m.expert_params / (self.ep if self.ep > 1 else self.tp)
        dense = (m.attn_params_per_layer + m.router_params_per_layer) / self.tp
        return (m.layers * (dense + experts) + head) * self.weight_bytes

    def allreduce_time(self, nbytes: float) -> float:
        """All-reduce of ``nbytes`` over the TP group. Small messages take vLLM's custom all-reduce
        (vllm/distributed/device_communicators/custom_all_reduce.py, 0.33.0: ``should_custom_ar`` — TP ≤ 8,
        2 GPUs or fully connected by NVLink, fewer than ``max_size`` = 8 MiB): every rank reads its peers' buffers
        directly, a reduce-scatter and an all-gather of one hop each, so 2 hop latencies whatever the TP size.
        Larger messages (prefill chunks), and PCIe-connected GPUs beyond 2, take NCCL's ring: 2(tp−1) steps.
        Both pay the preset's per-call latency and move 2(tp−1)/tp of ``nbytes`` over one link
        (NVLink/xGMI/PCIe bandwidth × ``eff.link``)."""
        if self.tp == 1:
            return 0.0
        g = self.gpu
        custom = self.tp <= 8 and (self.tp == 2 or g.fully_connected) and nbytes < CUSTOM_AR_MAX_BYTES
        hops = 2 if custom else 2 * (self.tp - 1)
        moved = 2 * (self.tp - 1) / self.tp * nbytes
        return g.link_latency_s + hops * g.link_hop_s + moved / (g.link_bw * self.eff.link)

    def alltoall_time(self, nbytes: float) -> float:
        """MoE dispatch or combine over the EP group: the per-call latency, one hop per peer, and each GPU
        sending (ep−1)/ep of its ``nbytes`` over its link."""
        if self.ep == 1:
            return 0.0
        g, peers = self.gpu, self.ep - 1
        return g.link_latency_s + peers * g.link_hop_s + peers / self.ep * nbytes / (g.link_bw * self.eff.link)

    def step(self, seqs: Iterable[SeqWork]) -> StepCost:
        seqs = list(seqs)
        # causal attention: new token j of a sequence attends to context + j + 1 keys; QK^T and PV
        return self.step_totals(
            tokens=sum(s.new_tokens for s in seqs), sampled=sum(1 for s in seqs if s.samples), seqs=len(seqs),
            pairs=sum(s.new_tokens * s.context + s.new_tokens * (s.new_tokens + 1) / 2 for s in seqs),
            kv_tokens=sum(s.context + s.new_tokens for s in seqs))

    def step_totals(self, tokens: int, sampled: int, seqs: int, pairs: float, kv_tokens: float) -> StepCost:
        """One step from its totals: ``tokens`` new tokens, ``sampled`` sequences that sample, ``seqs`` scheduled,
        ``pairs`` attention (query, key) pairs, ``kv_tokens`` tokens of KV read (context + new). :meth:`step`
        sums a batch into these; :meth:`step_s` prices one without the breakdown."""
        if tokens <= 0:
            return StepCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
        # linear layers (the active parameters of the body, the LM head of the sampled) and attention pairs
        linear = 2.0 * tokens * self._body_active + 2.0 * sampled * self._lm_head
        attn = self._attn_per_pair * pairs
        kv_tok = self._kv_tok  # KV bytes of a token on one GPU, summed over the sequential stages
        kv_read = kv_tokens * kv_tok
        kv_write = tokens * kv_tok
        weights = (self._dense_weights[1 if sampled else 0] if self._dense_weights is not None else
                   self._weights_read_per_gpu(tokens, sampled))
        weights_s, gemm_s = weights / self._memory_rate, linear / self._compute_rate
        attn_compute_s, kv_s = attn / self._compute_rate, (kv_read + kv_write) / self._kv_rate
        comm_s = self._comm_s(tokens) if self._communicates else 0.0
        overhead_s = self._fixed_overhead_s + self.eff.per_seq_overhead_s * seqs
        linear_s = max(weights_s, gemm_s) + self.eff.gemm_unhidden * min(weights_s, gemm_s)
        return StepCost(linear_s, max(attn_compute_s, kv_s), comm_s, overhead_s, gemm_s + attn_compute_s,
                        weights_s + kv_s, linear + attn, weights + kv_read + kv_write, tokens)

    def step_s(self, tokens: int, sampled: int, seqs: int, pairs: float, kv_tokens: float) -> float:
        """``step_totals(...).total_s`` without the breakdown, the same float (tests/sim/test_sim_perf.py): the
        router prices a few steps for every request (router/placement.py)."""
        if tokens <= 0:
            return 0.0
        kv_tok = self._kv_tok
        dense_s = self._dense_weights_s
        weights_s = (dense_s[1 if sampled else 0] if dense_s is not None else
                     self._weights_read_per_gpu(tokens, sampled) / self._memory_rate)
        gemm_s = (2.0 * tokens * self._body_active + 2.0 * sampled * self._lm_head) / self._compute_rate
        unhidden = self._gemm_unhidden
        linear_s = weights_s + unhidden * gemm_s if weights_s >= gemm_s else gemm_s + unhidden * weights_s
        attention_s = self._attn_per_pair * pairs / self._compute_rate
        kv_s = (kv_tokens * kv_tok + tokens * kv_tok) / self._kv_rate
        if kv_s > attention_s:  # max(compute, KV streaming), as step_totals
            attention_s = kv_s
        comm_s = self._comm_s(tokens) if self._communicates else 0.0
        return linear_s + attention_s + comm_s + (self._fixed_overhead_s + self._per_seq_overhead_s * seqs)

    def _comm_s(self, tokens: int) -> float:
        """A step's collectives: TP all-reduces, EP dispatch and combine, PP hand-offs of its activations."""
        m = self.model
        comm_s = 0.0
        link = self.gpu.link_bw * self.eff.link
        act = tokens * m.hidden * 2.0  # bf16 activations of the step
        if self.tp > 1:
            # row-parallel o_proj and down_proj each end in an all-reduce: 2 per layer (vLLM's Llama/Qwen)
            comm_s += 2 * m.layers * self.allreduce_time(act)
        if self.ep > 1:
            # each MoE layer dispatches every token's hidden state to its k experts and combines the results
            comm_s += m.layers * 2 * self.alltoall_time(act * m.experts_per_token)
        if self.pp > 1:
            comm_s += (self.pp - 1) * (self.gpu.link_latency_s + act / link)
        return comm_s

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

    @property
    def request_overhead_s(self) -> float:
        """Per-request time on the TTFT path outside engine steps (HTTP, tokenisation, first chunk out)."""
        return self.eff.request_overhead_s

    def ttft_alone(self, prompt_tokens: int, chunk: int | None = None, cached: int = 0) -> float:
        """TTFT of one request on an idle engine: request overhead + its prefill steps."""
        return self.request_overhead_s + self.prefill_time(prompt_tokens, chunk, cached)

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
        t = transport.latency_s + self.transfer_bytes(tokens) / (transport.bandwidth
                                                                 * self.transfer_lanes(transport, remote_tp))
        return t + (transport.handshake_s if first_contact else 0.0)

    def transfer_lanes(self, transport: TransportPreset, remote_tp: int | None = None) -> int:
        """Parallel pulls of one transfer (:meth:`transfer_time`)."""
        return 1 if transport.name == "tcp" else max(1, min(self.tp, remote_tp or self.tp))


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) — shared by tests and benchmarks."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
    return s[k]

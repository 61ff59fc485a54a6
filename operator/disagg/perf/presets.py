"""Hardware, model and KV-transport presets of the simulator.

Every number here has its source in docs/simulator.md (vendor datasheets for GPUs, the models' own
``config.json`` for shapes). Peak FLOPs are *dense* (no 2:4 sparsity) tensor-core figures.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

GB = 1e9
GiB = 1024**3
# Device memory as the CUDA runtime reports it (torch.cuda.mem_get_info()[1], what vLLM's request_memory multiplies by
# --gpu-memory-utilization: vllm/v1/worker/utils.py request_memory, 0.33.0), from vLLM's own startup line
# "total_gpu_memory (X GiB) x gpu_memory_utilization". An "80 GB" board reports ~79.2 GiB (85.1e9 bytes), not 80e9:
# the datasheet's GB are GiB less the driver's reservation. Sources in docs/simulator.md §3.
# H100 80GB: "total_gpu_memory 79.22GiB", vLLM PR #10511 (2024-12-13) and #12126 (2025-01-16), both on H100s:
# https://github.com/vllm-project/vllm/pull/10511, https://github.com/vllm-project/vllm/pull/12126
H100_TOTAL = 79.22 * GiB
# The others from the same log line quoted in public repositories (found by text search; no URL recorded, so weaker
# than the H100's): A100-SXM4-80GB 79.15 GiB, A100-SXM4-40GB 39.39–39.56, L40S 44.31–44.39, H200 139.81 GiB.
A100_80_TOTAL = 79.15 * GiB
A100_40_TOTAL = 39.49 * GiB
L40S_TOTAL = 44.39 * GiB
H200_TOTAL = 139.81 * GiB
TFLOPS = 1e12


@dataclass(frozen=True)
class GPUPreset:
    name: str
    bf16_flops: float  # dense BF16/FP16 tensor-core peak, FLOP/s
    fp8_flops: float  # dense FP8 peak, FLOP/s (== bf16 where the GPU has no FP8 tensor cores)
    hbm_bw: float  # bytes/s
    memory_bytes: float  # device memory as CUDA reports it (cudaMemGetInfo total, what vLLM multiplies), bytes
    link_bw: float  # GPU-to-GPU bandwidth per direction (NVLink / xGMI / PCIe), bytes/s
    link_latency_s: float  # per collective call: launch + synchronisation of a small all-reduce (assumption)
    aliases: tuple[str, ...] = ()
    link_hop_s: float = 1.5e-6  # per ring step (one GPU-to-GPU hop) on NVLink/xGMI; PCIe presets set more
    # Achieved / peak HBM bandwidth of the decode GEMVs streaming weights, and of attention streaming KV, where
    # measured on this GPU (0 = the engine's Efficiency.memory). docs/simulator.md §3.
    weight_stream_eff: float = 0.0
    kv_stream_eff: float = 0.0
    # every GPU reaches every other over NVLink/NVSwitch/xGMI (vLLM's custom all-reduce needs it beyond 2 GPUs)
    fully_connected: bool = True


CPU_ENGINE = "vLLM-CPU-2core"
# FITTED: disagg bench real-engine (fit.flops_per_s, the median of its repetitions), on a host without AVX-512
# (bf16 matmuls emulated on AVX2); a host with AVX-512 BF16 fitted ~66e9 (docs/simulator.md "The real engine")
CPU_ENGINE_FLOPS = 6.74e9

# Datasheet figures; see docs/simulator.md "GPU presets".
GPUS: dict[str, GPUPreset] = {
    g.name: g
    for g in (
        GPUPreset("H100-SXM", 989.4 * TFLOPS, 1978.9 * TFLOPS, 3.35e12, H100_TOTAL, 450 * GB, 8e-6,
                  ("h100", "h100-sxm5", "h100-80gb-hbm3", "nvidia-h100-80gb-hbm3")),
        GPUPreset("H100-PCIe", 756.0 * TFLOPS, 1513.0 * TFLOPS, 2.0e12, H100_TOTAL, 300 * GB, 10e-6,
                  ("h100-pcie", "nvidia-h100-pcie"), fully_connected=False),  # NVLink bridges pair GPUs only
        GPUPreset("H200", 989.4 * TFLOPS, 1978.9 * TFLOPS, 4.8e12, H200_TOTAL, 450 * GB, 8e-6,
                  ("h200-sxm", "nvidia-h200", "h200-141gb"),
                  # MEASURED on this project's H200 (torch 2.11 cuBLAS, the GEMM vLLM's unquantized linear layers
                  # call). Weights: Qwen3-32B's whole batch-1 decode step, CUDA graph, streams its 65.5 GB in
                  # 23.06 ms with torch's unfused per-layer kernels included: ≥ 0.59 of 4.8 TB/s, 0.61 once the
                  # twin's per-layer gaps are counted (docs/results/h200-steps.json; the 8B's gate/up GEMV alone,
                  # launch included, gave 0.55 in h200-microbench.json, and the 8B and 70B-shard steps, with
                  # smaller matrices and more of torch's unfused kernels per byte, stay above the twin at 0.61).
                  # KV: the CUDA-graph decode step grows by 0.94–0.95 × 4.8 TB/s per extra KV byte read (batches
                  # 8/32/64, context 1024 → 4096, h200-microbench.json)
                  weight_stream_eff=0.61, kv_stream_eff=0.94),
        GPUPreset("A100-80GB", 312.0 * TFLOPS, 312.0 * TFLOPS, 2.039e12, A100_80_TOTAL, 300 * GB, 10e-6,
                  ("a100", "a100-sxm4-80gb", "nvidia-a100-sxm4-80gb")),
        GPUPreset("A100-40GB", 312.0 * TFLOPS, 312.0 * TFLOPS, 1.555e12, A100_40_TOTAL, 300 * GB, 10e-6,
                  ("a100-sxm4-40gb", "nvidia-a100-sxm4-40gb")),
        GPUPreset("L40S", 362.05 * TFLOPS, 733.0 * TFLOPS, 0.864e12, L40S_TOTAL, 32 * GB, 20e-6,
                  ("nvidia-l40s",), link_hop_s=5e-6, fully_connected=False),
        GPUPreset("B200", 2250.0 * TFLOPS, 4500.0 * TFLOPS, 8.0e12, 180 * GB, 900 * GB, 8e-6,
                  ("nvidia-b200", "b200-180gb")),
        GPUPreset("MI300X", 1307.4 * TFLOPS, 2614.9 * TFLOPS, 5.3e12, 192 * GB, 448 * GB, 10e-6,
                  ("amd-mi300x", "mi300x-192gb")),
        # Not a GPU: the real-engine tier's vLLM CPU build on 2 cores (one OpenMP thread), the engine the sim is
        # checked against (disagg bench real-engine, docs/results/real-engine.json). bf16_flops is FITTED there
        # (per-prompt-token cost of the tiny model); the memory figures are assumptions of no consequence at its
        # size (1.6 MB of weights stay in cache); its step costs are roofline.GPU_EFFICIENCY's.
        GPUPreset(CPU_ENGINE, CPU_ENGINE_FLOPS, CPU_ENGINE_FLOPS, 20 * GB, 24 * GB, 10 * GB, 0.0, ("cpu",)),
    )
}
DEFAULT_GPU = "H100-SXM"


def vllm_batch_defaults(gpu: GPUPreset) -> tuple[int, int]:
    """vLLM's default ``(max_num_seqs, max_num_batched_tokens)`` for the OpenAI API server on this GPU, with
    chunked prefill (EngineArgs.get_batch_defaults, OPENAI_API_SERVER context: ≥ 70 GiB of device memory and not
    an A100 → 1024 / 8192, else 256 / 2048). The one copy: the simulator's flag defaults (sim/config.py) and the
    planner's pool model (plan/model.py) both read it."""
    big = gpu.memory_bytes >= 70 * GiB and "a100" not in gpu.name.lower()
    return (1024, 8192) if big else (256, 2048)


@dataclass(frozen=True)
class ModelPreset:
    """Shapes from the model's config.json (decoder-only transformer, GQA, SwiGLU MLP or MoE)."""

    name: str
    hf_id: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP width (0 for all-MoE models)
    vocab: int
    max_position: int
    tie_embeddings: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    patterns: tuple[str, ...] = field(default=())

    # ---- parameter counts (norms and biases are < 0.1 % and left out; see docs)
    @property
    def attn_params_per_layer(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        return q + kv + o

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden * self.moe_intermediate

    @property
    def router_params_per_layer(self) -> int:
        return self.hidden * self.num_experts if self.is_moe else 0

    @property
    def mlp_params_per_layer(self) -> int:
        """All MLP weights of one layer (every expert for MoE)."""
        if self.is_moe:
            return self.num_experts * self.expert_params + self.router_params_per_layer
        return 3 * self.hidden * self.intermediate

    @property
    def active_mlp_params_per_layer(self) -> int:
        if self.is_moe:
            return self.experts_per_token * self.expert_params + self.router_params_per_layer
        return self.mlp_params_per_layer

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        body = self.layers * (self.attn_params_per_layer + self.mlp_params_per_layer)
        return body + self.embed_params + (0 if self.tie_embeddings else self.lm_head_params)

    @property
    def active_params(self) -> int:
        body = self.layers * (self.attn_params_per_layer + self.active_mlp_params_per_layer)
        return body + self.embed_params + (0 if self.tie_embeddings else self.lm_head_params)

    def kv_bytes_per_token(self, kv_dtype_bytes: float = 2.0) -> float:
        """K and V for every layer, all KV heads (whole model, before any TP split)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * kv_dtype_bytes


MODELS: dict[str, ModelPreset] = {
    m.name: m
    for m in (
        ModelPreset("Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct", hidden=4096, layers=32, heads=32,
                    kv_heads=8, head_dim=128, intermediate=14336, vocab=128256, max_position=131072,
                    patterns=(r"llama-?3(\.\d)?-8b", r"llama-3\.1-8b", r"llama3.*8b")),
        ModelPreset("Llama-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct", hidden=8192, layers=80, heads=64,
                    kv_heads=8, head_dim=128, intermediate=28672, vocab=128256, max_position=131072,
                    patterns=(r"llama-?3(\.\d)?-70b", r"llama3.*70b")),
        ModelPreset("Llama-3.2-1B", "meta-llama/Llama-3.2-1B-Instruct", hidden=2048, layers=16, heads=32,
                    kv_heads=8, head_dim=64, intermediate=8192, vocab=128256, max_position=131072,
                    tie_embeddings=True, patterns=(r"llama-?3\.2-1b",)),
        ModelPreset("Qwen3-8B", "Qwen/Qwen3-8B", hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128,
                    intermediate=12288, vocab=151936, max_position=40960, patterns=(r"qwen3-8b",)),
        ModelPreset("Qwen3-32B", "Qwen/Qwen3-32B", hidden=5120, layers=64, heads=64, kv_heads=8, head_dim=128,
                    intermediate=25600, vocab=151936, max_position=40960, patterns=(r"qwen3-32b",)),
        ModelPreset("Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B", hidden=2048, layers=48, heads=32, kv_heads=4,
                    head_dim=128, intermediate=0, vocab=151936, max_position=40960, num_experts=128,
                    experts_per_token=8, moe_intermediate=768, patterns=(r"qwen3-30b-a3b",)),
        ModelPreset("Mixtral-8x7B", "mistralai/Mixtral-8x7B-Instruct-v0.1", hidden=4096, layers=32, heads=32,
                    kv_heads=8, head_dim=128, intermediate=0, vocab=32000, max_position=32768, num_experts=8,
                    experts_per_token=2, moe_intermediate=14336, patterns=(r"mixtral-8x7b",)),
        # the real-engine tier's model (hack/vllm_cpu/tiny_model.py: random weights, a trained byte-level BPE)
        ModelPreset("disagg-tiny-llama", "disagg/tiny-llama", hidden=128, layers=2, heads=4, kv_heads=2,
                    head_dim=32, intermediate=256, vocab=2048, max_position=4096, patterns=(r"tiny-llama",)),
    )
}
DEFAULT_MODEL = "Llama-3.1-8B"


@dataclass(frozen=True)
class TransportPreset:
    """How NIXL/UCX moves KV blocks between a prefill and a decode worker."""

    name: str
    bandwidth: float  # effective bytes/s for one KV pull (already derated; see docs)
    latency_s: float  # per pull: descriptor post + completion notification
    handshake_s: float  # first contact with a remote engine (NIXL metadata exchange)


TRANSPORTS: dict[str, TransportPreset] = {
    t.name: t
    for t in (
        # One 400 Gb/s NDR InfiniBand / RoCE NIC per GPU (50 GB/s line rate) derated to 80 %.
        TransportPreset("rdma", 40 * GB, 200e-6, 20e-3),
        # cuda_ipc over NVLink 4 (450 GB/s per direction) derated to 80 %.
        TransportPreset("nvlink", 360 * GB, 50e-6, 10e-3),
        # UCX tcp over a pod network: one TCP stream with kernel copies through host memory.
        TransportPreset("tcp", 2.5 * GB, 1e-3, 50e-3),
    )
}


class PresetError(ValueError):
    pass


def _norm(s: str) -> str:
    return re.sub(r"[\s_]+", "-", s.strip().lower())


def get_gpu(name: str) -> GPUPreset:
    key = _norm(name)
    for g in GPUS.values():
        if key == _norm(g.name) or key in g.aliases:
            return g
    raise PresetError(f"unknown GPU preset {name!r}; known: {', '.join(GPUS)}")


def get_model(name: str) -> ModelPreset:
    key = _norm(name)
    for m in MODELS.values():
        if key in (_norm(m.name), _norm(m.hf_id)):
            return m
    raise PresetError(f"unknown model preset {name!r}; known: {', '.join(MODELS)}")


def infer_model(model_name: str) -> ModelPreset | None:
    """Best match for a served model id (``meta-llama/Llama-3.1-70B-Instruct`` → Llama-3.1-70B)."""
    key = _norm(model_name.rsplit("/", 1)[-1] if "/" in model_name else model_name)
    full = _norm(model_name)
    for m in MODELS.values():
        if key.startswith(_norm(m.name)) or full == _norm(m.hf_id):
            return m
    for m in MODELS.values():
        if any(re.search(p, full) for p in m.patterns):
            return m
    return None


def get_transport(name: str) -> TransportPreset:
    try:
        return TRANSPORTS[_norm(name)]
    except KeyError:
        raise PresetError(f"unknown KV transport {name!r}; known: {', '.join(TRANSPORTS)}, auto") from None


def transport_from_ucx_tls(ucx_tls: str | None) -> str:
    """What UCX would pick given UCX_TLS: verbs (rc/ud/dc/ib) → rdma, else cuda_ipc → nvlink, tcp only → tcp.

    Unset (UCX picks the best available) is taken as rdma: the GPU clusters NIXL targets have it.
    """
    if not ucx_tls:
        return "rdma"
    tls = {t.strip().lstrip("^").lower() for t in ucx_tls.split(",") if t.strip()}
    negated = ucx_tls.strip().startswith("^")
    if negated:
        return "rdma"
    # verbs first: "rc,cuda_copy,cuda_ipc" is an RDMA setup that also allows CUDA IPC to same-node peers
    if tls & {"rc", "rc_x", "rc_v", "rc_mlx5", "ud", "ud_x", "ud_v", "ud_mlx5", "dc", "dc_x", "dc_mlx5", "ib", "all"}:
        return "rdma"
    if "cuda_ipc" in tls:
        return "nvlink"
    if "tcp" in tls:
        return "tcp"
    return "rdma"


def resolve_transport(name: str, env: Mapping[str, str] | None = None) -> TransportPreset:
    env = os.environ if env is None else env
    if _norm(name) == "auto":
        return TRANSPORTS[transport_from_ucx_tls(env.get("UCX_TLS"))]
    return get_transport(name)


def human_bytes(n: float) -> str:
    if n <= 0:
        return "0 B"
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    i = min(int(math.log(n, 1024)), len(units) - 1)
    return f"{n / 1024**i:.1f} {units[i]}"

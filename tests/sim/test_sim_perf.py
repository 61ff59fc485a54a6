"""The roofline: bounds, scaling, capacity, and preset shapes against the models' published sizes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disagg.perf import presets
from disagg.perf.presets import GPUS, MODELS, TRANSPORTS, get_gpu, get_model, infer_model, transport_from_ucx_tls
from disagg.perf.roofline import PerfModel, SeqWork, percentile

H100, H200, A100, L40S = (GPUS[n] for n in ("H100-SXM", "H200", "A100-80GB", "L40S"))
L8B, L70B = MODELS["Llama-3.1-8B"], MODELS["Llama-3.1-70B"]


@pytest.mark.parametrize(
    "name,total,active",
    [
        ("Llama-3.1-8B", 8.03e9, 8.03e9),
        ("Llama-3.1-70B", 70.6e9, 70.6e9),
        ("Llama-3.2-1B", 1.24e9, 1.24e9),
        ("Qwen3-8B", 8.2e9, 8.2e9),
        ("Qwen3-32B", 32.8e9, 32.8e9),
        ("Qwen3-30B-A3B", 30.5e9, 3.3e9),
        ("Mixtral-8x7B", 46.7e9, 12.9e9),
    ],
)
def test_preset_shapes_give_published_parameter_counts(name, total, active):
    m = MODELS[name]
    assert m.total_params == pytest.approx(total, rel=0.02)
    assert m.active_params == pytest.approx(active, rel=0.03)


def test_decode_is_memory_bound_and_costs_a_weight_read():
    p = PerfModel(H100, L8B)
    cost = p.step([SeqWork(1, 1000)])
    assert cost.bound == "memory"
    weights = (L8B.total_params - L8B.embed_params) * 2  # the embedding table is gathered, not streamed
    expected = weights / (H100.hbm_bw * p.eff.memory)
    assert cost.memory_s == pytest.approx(expected, rel=0.05)
    # ~6-7 ms per token for an 8B model on one H100: the right order of magnitude for vLLM at batch 1
    assert 0.005 < cost.total_s < 0.009


def test_long_prefill_is_compute_bound_and_linear_ish():
    p = PerfModel(H100, L8B)
    c8k = p.step([SeqWork(8192, 0)])
    c1k = p.step([SeqWork(1024, 0)])
    assert c8k.bound == "compute"
    assert c8k.total_s > 7 * c1k.total_s  # quadratic attention makes it a bit more than 8x the compute
    assert 2 * 8e9 * 8192 < c8k.flops < 2.3 * 8.1e9 * 8192


def test_decode_batching_amortises_weights():
    p = PerfModel(H100, L8B)
    one = p.decode_step_time(1, 512)
    many = p.decode_step_time(64, 512)
    assert many < 2 * one  # 64 sequences cost far less than 64 steps
    assert p.decode_tokens_per_s(64, 512) > 20 * p.decode_tokens_per_s(1, 512)


def test_context_length_slows_decode_through_kv_reads():
    p = PerfModel(H100, L8B)
    assert p.decode_step_time(64, 16000) > 1.5 * p.decode_step_time(64, 500)


def test_tensor_parallel_scaling_with_communication_cost():
    p2, p4 = PerfModel(H100, L70B, tp=2), PerfModel(H100, L70B, tp=4)
    pre2, pre4 = p2.step([SeqWork(4096, 0)]), p4.step([SeqWork(4096, 0)])
    assert pre4.compute_s == pytest.approx(pre2.compute_s / 2, rel=1e-6)
    assert pre4.comm_s > 0 and pre2.comm_s > 0
    assert 0.5 < pre4.total_s / pre2.total_s < 0.75  # sublinear because of all-reduces
    d2, d4 = p2.decode_step_time(8, 1000), p4.decode_step_time(8, 1000)
    assert d4 < d2
    assert PerfModel(H100, L8B).step([SeqWork(1, 10)]).comm_s == 0.0


def test_pipeline_parallel_splits_memory_not_latency():
    tp4 = PerfModel(H100, L70B, tp=4)
    pp2 = PerfModel(H100, L70B, tp=2, pp=2)
    assert pp2.weight_bytes_per_gpu == pytest.approx(tp4.weight_bytes_per_gpu)
    assert pp2.step([SeqWork(2048, 0)]).total_s > tp4.step([SeqWork(2048, 0)]).total_s
    with pytest.raises(ValueError, match="not divisible"):
        PerfModel(H100, L70B, pp=3)


def test_kv_capacity_from_memory_minus_weights():
    p = PerfModel(H100, L8B)
    assert p.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2  # 128 KiB per token for Llama-3.1-8B in bf16
    tokens = p.num_kv_blocks(0.9) * 16
    assert 350_000 < tokens < 480_000
    assert PerfModel(H200, L8B).num_kv_blocks(0.9) > 1.9 * p.num_kv_blocks(0.9)
    assert PerfModel(H100, L70B).num_kv_blocks(0.9) == 0  # 141 GB of weights do not fit one 80 GB GPU
    assert PerfModel(H100, L70B, tp=4).num_kv_blocks(0.9) > 0
    assert PerfModel(H100, L8B, kv_bytes=1.0).num_kv_blocks(0.9) == pytest.approx(2 * p.num_kv_blocks(0.9), rel=0.01)


def test_moe_decode_touches_few_experts_at_small_batch():
    moe = PerfModel(H100, MODELS["Qwen3-30B-A3B"])
    dense32 = PerfModel(H100, MODELS["Qwen3-32B"])
    small = moe.step([SeqWork(1, 100)])
    big = moe.step([SeqWork(1, 100)] * 256)
    assert small.bytes_per_gpu < 0.25 * big.bytes_per_gpu
    assert moe.decode_step_time(1, 100) < 0.3 * dense32.decode_step_time(1, 100)


def test_gpu_generations_order():
    def prefill(g):
        return PerfModel(g, L8B).prefill_time(4096)

    def decode(g):
        return PerfModel(g, L8B).decode_step_time(16, 2000)

    assert prefill(GPUS["B200"]) < prefill(H100) < prefill(A100)
    assert decode(H200) < decode(H100) < decode(A100) < decode(L40S)


def test_chunked_prefill_time_close_to_one_shot():
    p = PerfModel(H100, L8B)
    assert p.prefill_time(8192, chunk=2048) == pytest.approx(p.prefill_time(8192), rel=0.15)


def test_transfer_time_by_transport():
    p = PerfModel(H100, L8B)
    rdma, tcp, nvl = TRANSPORTS["rdma"], TRANSPORTS["tcp"], TRANSPORTS["nvlink"]
    t = p.transfer_time(8192, rdma)
    assert t == pytest.approx(rdma.latency_s + 8192 * 131072 / rdma.bandwidth)
    assert p.transfer_time(8192, tcp) > 10 * t > 10 * p.transfer_time(8192, nvl)
    assert p.transfer_time(8192, rdma, first_contact=True) == pytest.approx(t + rdma.handshake_s)
    tp4 = PerfModel(H100, L70B, tp=4)
    assert tp4.transfer_time(1000, rdma, remote_tp=4) < tp4.transfer_time(1000, rdma, remote_tp=1)


def test_preset_lookup_and_inference():
    assert get_gpu("nvidia-h100-80gb-hbm3") is H100
    assert get_gpu("h200") is H200
    assert get_model("Qwen/Qwen3-32B") is MODELS["Qwen3-32B"]
    assert infer_model("meta-llama/Llama-3.1-70B-Instruct") is L70B
    assert infer_model("meta-llama/Meta-Llama-3-8B-Instruct") is L8B
    assert infer_model("Qwen/Qwen3-30B-A3B-Instruct-2507") is MODELS["Qwen3-30B-A3B"]
    assert infer_model("facebook/opt-125m") is None
    with pytest.raises(presets.PresetError, match="unknown GPU"):
        get_gpu("RTX-9999")


def test_ucx_tls_picks_transport():
    assert transport_from_ucx_tls("cuda_ipc,cuda_copy,tcp") == "nvlink"
    assert transport_from_ucx_tls("rc,ud,cuda_copy") == "rdma"
    assert transport_from_ucx_tls("rc,cuda_copy,cuda_ipc") == "rdma"  # what the operator renders for rdma
    assert transport_from_ucx_tls("tcp,cuda_copy") == "tcp"
    assert transport_from_ucx_tls(None) == "rdma"


def test_percentile():
    assert percentile([5, 1, 3, 2, 4], 50) == 3
    assert percentile(list(range(1, 101)), 99) == 99
    with pytest.raises(ValueError):
        percentile([], 50)


def test_from_names_for_router_estimates():
    p = PerfModel.from_names("h200", "meta-llama/Llama-3.1-70B-Instruct", tp=4)
    assert p.gpu is H200 and p.model is L70B and p.tp == 4
    with pytest.raises(presets.PresetError):
        PerfModel.from_names("H100-SXM", "facebook/opt-125m")


def test_bench_references_within_target(capsys):
    from disagg.sim import bench

    assert bench.main(["--strict"]) == 0
    out = capsys.readouterr().out
    assert "OUTSIDE" not in out and "H100-SXM" in out


@settings(max_examples=200, deadline=None)
@given(shape=st.sampled_from([("H100-SXM", "Llama-3.1-8B", 1, 1, 1), ("H200", "Llama-3.1-70B", 4, 1, 1),
                              ("A100-80GB", "Llama-3.1-70B", 2, 2, 1), ("H100-SXM", "Qwen3-30B-A3B", 2, 1, 2),
                              ("L40S", "Llama-3.1-8B", 1, 1, 1)]),
       tokens=st.integers(-1, 20_000), sampled=st.integers(0, 256), seqs=st.integers(0, 256),
       pairs=st.floats(0, 1e9), kv=st.floats(0, 1e7))
def test_the_lean_step_time_is_the_breakdowns_total_to_the_bit(shape, tokens, sampled, seqs, pairs, kv):
    """PerfModel.step_s (the router's placement prices steps with it) is step_totals(...).total_s, the same float
    for every parallelism (TP all-reduces, PP hand-offs, MoE expert reads and EP all-to-alls)."""
    gpu, model, tp, pp, ep = shape
    m = PerfModel.from_names(gpu, model, tp=tp, pp=pp, ep=ep)
    assert m.step_s(tokens, sampled, seqs, pairs, kv) == m.step_totals(tokens, sampled, seqs, pairs, kv).total_s

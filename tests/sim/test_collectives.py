"""TP all-reduce as vLLM 0.33.0 chooses it (issue 26): its custom all-reduce for small messages on fully connected
GPUs, NCCL's ring otherwise (vllm/distributed/device_communicators/custom_all_reduce.py should_custom_ar)."""

from __future__ import annotations

import pytest

from disagg.perf.roofline import CUSTOM_AR_MAX_BYTES, PerfModel


def _ar(gpu: str, tp: int, nbytes: float) -> float:
    return PerfModel.from_names(gpu, "Llama-3.1-70B", tp).allreduce_time(nbytes)


def test_small_messages_on_nvlink_cost_two_hops_whatever_the_tp_size() -> None:
    small = 12 * 8192 * 2.0  # a decode step of 12 sequences at hidden 8192
    t4, t8 = _ar("H100-SXM", 4, small), _ar("H100-SXM", 8, small)
    assert t4 < 12e-6 and t8 < 12e-6
    # the latency part is the same; only the bytes term (2(tp−1)/tp of the message) grows a little
    assert t8 - t4 == pytest.approx(2 * (7 / 8 - 3 / 4) * small / (450e9 * 0.8), rel=1e-6)


def test_large_messages_and_pcie_gpus_take_the_ring() -> None:
    big = 2048 * 8192 * 2.0  # a 2048-token prefill chunk: 32 MiB, above the custom all-reduce's 8 MiB
    assert big >= CUSTOM_AR_MAX_BYTES
    h100 = PerfModel.from_names("H100-SXM", "Llama-3.1-70B", 8)
    ring = h100.gpu.link_latency_s + 14 * h100.gpu.link_hop_s + 14 / 8 * big / (450e9 * 0.8)
    assert h100.allreduce_time(big) == pytest.approx(ring)
    # 4 L40S on PCIe are not fully connected: even a small message rings (6 hops of 5 µs)
    l40s = PerfModel.from_names("L40S", "Llama-3.1-8B", 4)
    assert l40s.allreduce_time(1024.0) > l40s.gpu.link_latency_s + 6 * l40s.gpu.link_hop_s
    # two GPUs always qualify (vLLM: world_size == 2)
    l40s2 = PerfModel.from_names("L40S", "Llama-3.1-8B", 2)
    assert l40s2.allreduce_time(1024.0) == pytest.approx(
        l40s2.gpu.link_latency_s + 2 * l40s2.gpu.link_hop_s + 1024.0 / (l40s2.gpu.link_bw * 0.8))


def test_decode_at_tp4_pays_less_for_collectives_than_rings_would() -> None:
    p = PerfModel.from_names("H100-SXM", "Llama-3.1-70B", 4)
    comm = p.step_totals(tokens=12, sampled=12, seqs=12, pairs=12 * 331.0, kv_tokens=12 * 331.0).comm_s
    assert 1.5e-3 < comm < 2.0e-3  # 160 all-reduces of ~11 µs; as rings (17 µs) it would be ~2.8 ms

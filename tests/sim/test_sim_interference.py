"""Aggregated serving interference: a long prefill in the batch stalls every decoding sequence (ITL spike);
chunked prefill bounds the stall. Measured by the client (wall clock ÷ time-scale) and by the worker's own
vllm:inter_token_latency_seconds histogram (simulated seconds)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import aiohttp
import pytest
from simtest_util import SimProc, prompt_of

from disagg.perf.roofline import percentile
from disagg.poll import until

SCALE = 1.0
STREAMS = 4
OUT = 80
LONG = 12000


async def stream(session: aiohttp.ClientSession, sim: SimProc, prompt: str, progress: list[int], i: int) -> list[float]:
    body = {"prompt": prompt, "max_tokens": OUT, "stream": True}
    times: list[float] = []
    async with session.post(sim.url + "/v1/completions", json=body) as r:
        assert r.status == 200
        async for raw in r.content:
            line = raw.decode().strip()
            if line.startswith("data: {") and json.loads(line[6:])["choices"]:
                times.append(time.monotonic())
                progress[i] += 1
    assert len(times) == OUT
    return [(b - a) / SCALE for a, b in itertools.pairwise(times)]


async def scenario(sim: SimProc, long_prompts: int) -> tuple[list[float], dict[str, float]]:
    before = sim.metrics()
    progress = [0] * STREAMS
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        tasks = [asyncio.create_task(stream(s, sim, prompt_of(60, f"short{i}-{long_prompts}-{time.time()}"),
                                            progress, i)) for i in range(STREAMS)]
        # every stream is decoding before the long prompts arrive
        await until(lambda: min(progress) >= 10, 30, "every stream decoding", interval=0.01)
        for j in range(long_prompts):
            async with s.post(sim.url + "/v1/completions",
                              json={"prompt": prompt_of(LONG, f"long{j}-{time.time()}"), "max_tokens": 1}) as r:
                assert r.status == 200
        itls = [x for t in await asyncio.gather(*tasks) for x in t]
    after = sim.metrics()
    return itls, {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}


def slow_itls(delta: dict[str, float], over: str) -> float:
    """ITL observations above bucket bound ``over`` (simulated seconds) in a metrics delta."""
    total = delta["vllm:inter_token_latency_seconds_count"]
    le = next(v for k, v in delta.items() if k.startswith("vllm:inter_token_latency_seconds_bucket")
              and f'le="{over}"' in k)
    return total - le


@pytest.fixture(scope="module")
def workers(sims):
    common = ("--max-model-len", "16384", "--max-num-seqs", "64")
    return {
        "chunked": sims.start(*common, "--enable-chunked-prefill", "--max-num-batched-tokens", "512",
                              time_scale=SCALE),
        "unchunked": sims.start(*common, "--no-enable-chunked-prefill", "--max-num-batched-tokens", "16384",
                                time_scale=SCALE),
    }


async def test_long_prefill_spikes_itl_and_chunked_prefill_bounds_it(workers):
    base, base_d = await scenario(workers["unchunked"], long_prompts=0)
    spiky, spiky_d = await scenario(workers["unchunked"], long_prompts=2)
    chunked, chunked_d = await scenario(workers["chunked"], long_prompts=2)

    p99_base, p99_spiky, p99_chunked = (percentile(x, 99) for x in (base, spiky, chunked))
    # client-side (wall ÷ time-scale): a 12k-token prefill holds every decoding stream for ~0.35 s
    assert p99_spiky > 0.2
    assert p99_spiky > 4 * p99_base
    assert p99_spiky > 3 * p99_chunked

    # worker-side, simulated seconds: each long prefill stalls all 4 streams once (2 prompts → 8 stalls)
    assert slow_itls(spiky_d, "0.3") >= 2 * STREAMS
    assert slow_itls(base_d, "0.1") == 0
    # chunked prefill (512-token budget) spreads the same prefills over ~47 short steps
    assert slow_itls(chunked_d, "0.1") == 0
    assert chunked_d["vllm:prompt_tokens_total"] >= 2 * LONG
    model = "meta-llama/Llama-3.1-8B-Instruct"
    assert spiky_d[f'vllm:iteration_tokens_total_bucket{{engine="0",le="16384.0",model_name="{model}"}}'] > 0

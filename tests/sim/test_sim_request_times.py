"""Where the simulated engine's request clocks start, as vLLM's do (0.32.0): TTFT from when the API server took the
request (``arrival_time``), queue time from when the engine core added it to the scheduler — between steps, so not
before the step in flight at its arrival ends (v1/engine/core.py ``run_busy_loop``; v1/core/sched/scheduler.py
``add_request`` records QUEUED). A short request that arrives while a long prefill step runs waits for that step in
its TTFT, not in its queue time."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from simtest_util import prompt_of

from disagg.poll import until

LONG = 12000  # one unchunked prefill step of ~0.3 simulated seconds (Llama-3.1-8B on an H100)


async def _complete(session: aiohttp.ClientSession, url: str, prompt: str) -> tuple[float, dict]:
    start = time.monotonic()
    async with session.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}) as r:
        assert r.status == 200
        body = await r.json()
    return time.monotonic() - start, body


async def test_a_request_arriving_mid_step_waits_for_it_in_ttft_not_in_queue_time(sims) -> None:
    sim = sims.start("--max-model-len", "16384", "--no-enable-chunked-prefill", "--max-num-batched-tokens", "16384",
                     "--emulate-version", "0.33.0", "--enable-per-request-metrics", time_scale=1.0)
    before = sim.metrics()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        long = asyncio.create_task(_complete(s, sim.url, prompt_of(LONG, f"long-{time.time()}")))
        await until(lambda: sim.metrics().get("vllm:num_requests_running", 0.0) >= 1, 10, "the long prefill running",
                    interval=0.005)
        short_s, short = await _complete(s, sim.url, prompt_of(40, f"short-{time.time()}"))
        _, long_body = await long
    after = sim.metrics()
    step_s = long_body["metrics"]["time_to_first_token_ms"] / 1000  # the long prompt's one step (scheduled → token)
    assert step_s > 0.1
    # the short request waited for the step in flight: in its TTFT, not in its queue time
    assert short["metrics"]["queue_time_ms"] / 1000 < 0.05 * step_s
    assert short_s > 0.2 * step_s
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("vllm:time_to_first_token_seconds_sum",
                                                           "vllm:request_queue_time_seconds_sum",
                                                           "vllm:request_prefill_time_seconds_sum")}
    # the engine's TTFT covers what queue and prefill time leave out: the API server's share (both requests) and
    # the short request's wait for the step in flight
    assert d["vllm:time_to_first_token_seconds_sum"] - d["vllm:request_queue_time_seconds_sum"] - d[
        "vllm:request_prefill_time_seconds_sum"] > 0.2 * step_s

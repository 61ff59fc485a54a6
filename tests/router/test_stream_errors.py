"""Errors inside a 200 stream (issue 12 §5), against in-process fake workers that send vLLM 0.33.0's shapes.

The sim-backed tests (test_faults_sim.py) cover the remote path's KV-load failure; these cover what the simulator
cannot produce on demand: an error after tokens were relayed, and the local path's retry.
"""

from __future__ import annotations

import json

import pytest

LONG = "The quick brown fox jumps over the lazy dog. " * 400


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_error_after_tokens_is_upstream_error_mid_stream(fake_workers, router_factory, metric, path):
    d = await fake_workers("decode", fault="error_mid_stream")
    r = await router_factory([], [d.url])
    body = {"max_tokens": 20, "stream": True,
            **({"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"})}
    status, out = await r.post(path, body)
    assert status == 200 and b" t0" in out and b" t1" in out  # the tokens reached the client, then the error
    assert out.count(b'"error"') == 1  # the worker's own error event, not a second one from the router
    m = await r.metrics()
    assert metric(m, "disagg_requests_total", outcome="upstream_error_mid_stream") == 1
    assert metric(m, "disagg_requests_total", outcome="ok") == 0
    assert metric(m, "disagg_slo_requests_total") == 0


async def test_a_worker_cut_off_mid_stream_ends_the_clients_stream_with_an_error(fake_workers, router_factory, metric):
    """A decode worker that dies after tokens were relayed: the client gets vLLM's in-stream error shape (so an
    OpenAI client raises) rather than a stream that looks complete, and the request counts as a mid-stream loss."""
    d = await fake_workers("decode", fault="cut_mid_stream", tokens=10)
    r = await router_factory([], [d.url])
    status, out = await r.post("/v1/completions", {"prompt": "hi", "max_tokens": 10, "stream": True})
    assert status == 200 and b" t1" in out and b" t2" not in out
    events = [e for e in out.split(b"\n\n") if e]
    assert json.loads(events[-2].removeprefix(b"data: "))["error"]["type"] == "upstream_error"
    assert events[-1] == b"data: [DONE]"
    m = await r.metrics()
    assert metric(m, "disagg_requests_total", outcome="upstream_error_mid_stream") == 1
    assert metric(m, "disagg_requests_total", outcome="ok") == 0


async def test_error_before_the_first_token_on_the_local_path_retries_on_another_worker(
        fake_workers, router_factory, metric):
    bad, good = await fake_workers("decode", fault="error_first"), await fake_workers("decode", tokens=3)
    r = await router_factory([], [bad.url], aggregated=[good.url])  # local → bad; its retry → the aggregated pool
    for _ in range(2):
        status, out = await r.post("/v1/chat/completions",
                                   {"messages": [{"role": "user", "content": "hi"}], "stream": True})
        assert status == 200 and out.endswith(b"data: [DONE]\n\n")
        assert b'"error"' not in out and out.count(b'"role"') <= 1  # the failed leg's role chunk was held back
    m = await r.metrics()
    assert len(bad.requests) == 2 and len(good.requests) == 2
    assert metric(m, "disagg_fallbacks_total", cause="decode_generation_error") == 2
    assert metric(m, "disagg_requests_total", outcome="ok", path="fallback") == 2


async def test_non_streamed_error_finish_on_the_decode_leg_falls_back(fake_workers, router_factory, metric):
    """Another server may answer 200 with a finish_reason "error" choice: on the remote decode leg that is the
    KV load failing (cause kv_load_failed), and the request is served by the fallback path."""
    p, bad = await fake_workers("prefill"), await fake_workers("decode", fault="error_finish")
    agg = await fake_workers("decode")
    r = await router_factory([p.url], [bad.url], aggregated=[agg.url])
    status, out = await r.post("/v1/completions", {"prompt": LONG, "max_tokens": 200})
    assert status == 200
    assert json.loads(out)["choices"][0]["text"] and len(bad.requests) == 1 and len(agg.requests) == 1
    m = await r.metrics()
    assert metric(m, "disagg_fallbacks_total", cause="kv_load_failed") == 1
    assert metric(m, "disagg_requests_total", outcome="ok", path="fallback") == 1

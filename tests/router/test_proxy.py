"""Proxy behaviour of the in-process router against tiny fake vLLM workers (fast; see test_e2e_sim.py for the
same paths against real `disagg sim` processes)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from disagg.api.contract import RouterConfig
from disagg.poll import until

LONG = "The quick brown fox jumps over the lazy dog. " * 400
SHORT = "Hello there, how are you?"


def cfg(**kw) -> RouterConfig:
    return RouterConfig.model_validate(kw)


async def test_remote_protocol(fake_workers, router_factory, metric, opaque_kv):
    p, d = await fake_workers("prefill"), await fake_workers("decode")
    r = await router_factory([p.url], [d.url])
    body = {"model": "m", "prompt": LONG, "max_tokens": 200, "min_tokens": 3, "stream": False,
            "stream_options": {"include_usage": True}, "temperature": 0.3}
    status, out = await r.post("/v1/completions", body, {"X-Request-Id": "req-abc"})
    assert status == 200, out
    assert json.loads(out)["usage"]["completion_tokens"] == 5
    (pr,), (dr,) = p.requests, d.requests
    pb = pr["body"]
    assert pb["max_tokens"] == 1 and pb["stream"] is False
    assert "stream_options" not in pb and "min_tokens" not in pb and "max_completion_tokens" not in pb
    assert pb["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False,
                                        "remote_engine_id": None, "remote_block_ids": None,
                                        "remote_host": None, "remote_port": None}
    assert pb["temperature"] == 0.3 and pb["prompt"] == LONG
    db = dr["body"]
    assert db["kv_transfer_params"] == opaque_kv
    assert {k: v for k, v in db.items() if k != "kv_transfer_params"} == body  # original request restored
    # the same id on both legs, the client's plus a unique suffix (vLLM keys requests by it)
    assert pr["headers"]["x-request-id"] == dr["headers"]["x-request-id"]
    assert pr["headers"]["x-request-id"].startswith("req-abc-")
    m = await r.metrics()
    assert metric(m, "disagg_routing_decisions_total", decision="remote", reason="policy") == 1
    assert metric(m, "disagg_requests_total", outcome="ok", path="remote") == 1
    assert metric(m, "disagg_prefill_compute_seconds_count", path="remote", tenant="default") == 1


async def test_max_completion_tokens_chat(fake_workers, router_factory):
    p, d = await fake_workers("prefill"), await fake_workers("decode")
    r = await router_factory([p.url], [d.url])
    body = {"messages": [{"role": "user", "content": LONG}], "max_completion_tokens": 300,
            "min_completion_tokens": 2}
    status, _ = await r.post("/v1/chat/completions", body)
    assert status == 200
    pb = p.requests[0]["body"]
    assert pb["max_completion_tokens"] == 1 and pb["max_tokens"] == 1 and "min_completion_tokens" not in pb
    assert d.requests[0]["body"]["min_completion_tokens"] == 2
    assert d.requests[0]["body"]["max_completion_tokens"] == 300


async def test_short_prompt_local_strips_client_kv_params(fake_workers, router_factory, metric):
    p, d = await fake_workers("prefill"), await fake_workers("decode")
    r = await router_factory([p.url], [d.url])
    status, _ = await r.post("/v1/completions", {"prompt": SHORT, "max_tokens": 50,
                                                 "kv_transfer_params": {"remote_host": "evil"}})
    assert status == 200
    assert p.requests == []
    assert "kv_transfer_params" not in d.requests[0]["body"]
    m = await r.metrics()
    assert metric(m, "disagg_routing_decisions_total", decision="local", reason="short_prompt") == 1


async def test_streaming_relayed_verbatim(fake_workers, router_factory, metric):
    p, d = await fake_workers("prefill"), await fake_workers("decode", tokens=8, token_delay=0.01)
    r = await router_factory([p.url], [d.url])
    async with r.session.post(r.url + "/v1/completions",
                              json={"prompt": LONG, "max_tokens": 200, "stream": True}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        raw = await resp.read()
    events = [e for e in raw.split(b"\n\n") if e]
    assert len(events) == 9 and events[-1] == b"data: [DONE]"
    assert [json.loads(e[6:])["choices"][0]["text"] for e in events[:-1]] == [f" t{i}" for i in range(8)]
    assert d.requests[0]["body"]["stream"] is True
    m = await r.metrics()
    assert metric(m, "disagg_first_token_emit_seconds_count", path="remote") == 1
    assert metric(m, "disagg_per_token_decode_seconds_count", path="remote") == 1
    tpot_sum = metric(m, "disagg_per_token_decode_seconds_sum", path="remote")
    assert 0.005 < tpot_sum < 0.2
    assert metric(m, "disagg_slo_requests_total") == 1


async def test_prefill_error_falls_back(fake_workers, router_factory, metric):
    for fault, cause in (("500", "prefill_error"), ("no_kv", "prefill_no_kv_params"),
                         ("drop", "prefill_error"), ("400", "prefill_rejected")):
        p, d = await fake_workers("prefill", fault=fault), await fake_workers("decode")
        r = await router_factory([p.url], [d.url])
        status, out = await r.post("/v1/completions", {"prompt": LONG, "max_tokens": 200, "stream": True})
        assert status == 200, (fault, out)
        assert out.endswith(b"data: [DONE]\n\n")
        assert "kv_transfer_params" not in d.requests[0]["body"]
        m = await r.metrics()
        assert metric(m, "disagg_fallbacks_total", cause=cause) == 1, (fault, m)
        assert metric(m, "disagg_requests_total", outcome="ok", path="fallback") == 1


async def test_prefill_unreachable_falls_back(fake_workers, router_factory, metric, free_port):
    d = await fake_workers("decode")
    r = await router_factory([f"http://127.0.0.1:{free_port()}"], [d.url])
    for _ in range(2):
        status, _ = await r.post("/v1/completions", {"prompt": LONG, "max_tokens": 200})
        assert status == 200
    m = await r.metrics()
    # a refused connection (on the prefill leg or on the metrics scrape) marks the worker down: at most one
    # request tries it, the others go local with reason no_prefill_worker
    assert metric(m, "disagg_fallbacks_total", cause="prefill_connect_error") <= 1
    assert metric(m, "disagg_routing_decisions_total", decision="local", reason="no_prefill_worker") >= 1
    assert metric(m, "disagg_requests_total", outcome="ok") == 2


async def test_prefill_timeout_falls_back_and_cancels(fake_workers, router_factory, metric):
    p, d = await fake_workers("prefill", fault="hang"), await fake_workers("decode")
    r = await router_factory([p.url], [d.url], config=cfg(transferTimeoutMs=300))
    t = asyncio.get_running_loop().time()
    status, _ = await r.post("/v1/completions", {"prompt": LONG, "max_tokens": 200})
    assert status == 200
    assert 0.25 < asyncio.get_running_loop().time() - t < 3
    m = await r.metrics()
    assert metric(m, "disagg_fallbacks_total", cause="prefill_timeout") == 1
    await until(lambda: p.cancelled, 5, "the prefill request cancelled upstream")
    assert p.cancelled == 1


async def test_kv_transfer_timeout_on_decode_first_token(fake_workers, router_factory, metric):
    p = await fake_workers("prefill")
    slow = await fake_workers("decode", tokens=2, token_delay=0.5)
    r = await router_factory([p.url], [slow.url], config=cfg(transferTimeoutMs=300))
    status, out = await r.post("/v1/completions", {"prompt": LONG, "max_tokens": 200, "stream": True})
    assert status == 200 and out.endswith(b"data: [DONE]\n\n")
    m = await r.metrics()
    assert metric(m, "disagg_fallbacks_total", cause="kv_transfer_timeout") == 1
    assert len(slow.requests) == 2 and "kv_transfer_params" not in slow.requests[1]["body"]


async def test_a_prefill_legs_queue_is_not_charged_to_the_kv_hand_off(fake_workers, router_factory, metric):
    # the prefill leg queues 0.7 s of a 1 s transferTimeoutMs, then the decode leg's first token takes 0.5 s: the
    # hand-off's deadline runs from the KV being ready (1 s), so the request is served remotely. Charged to one
    # deadline from the prefill leg's start it timed out at 1 s as kv_transfer_timeout — a transport fault for the
    # circuit breakers and the mode controller, for what was the prefill pool's queue
    p = await fake_workers("prefill", request_metrics={"queue_time_ms": 700.0})
    d = await fake_workers("decode", tokens=2, token_delay=0.5)
    r = await router_factory([p.url], [d.url], config=cfg(transferTimeoutMs=1000))
    status, out = await r.post("/v1/completions", {"prompt": LONG, "max_tokens": 200, "stream": True})
    assert status == 200 and out.endswith(b"data: [DONE]\n\n")
    m = await r.metrics()
    assert metric(m, "disagg_fallbacks_total", cause="kv_transfer_timeout") == 0
    assert metric(m, "disagg_requests_total", outcome="ok", path="remote") == 1
    assert len(d.requests) == 1 and "kv_transfer_params" in d.requests[0]["body"]


async def test_fail_policy_returns_error(fake_workers, router_factory):
    p, d = await fake_workers("prefill", fault="500"), await fake_workers("decode")
    r = await router_factory([p.url], [d.url], config=cfg(routing={"fallback": {"onKVTransferTimeout": "Fail"}}))
    status, out = await r.post("/v1/completions", {"prompt": LONG, "max_tokens": 200})
    assert status == 502 and json.loads(out)["error"]["type"] == "upstream_error"
    assert d.requests == []


async def test_decode_failure_retries_other_worker(fake_workers, router_factory, metric):
    bad, good = await fake_workers("decode", fault="500"), await fake_workers("decode")
    r = await router_factory([], [bad.url, good.url])
    r.router.workers.get(good.url).inflight = 10  # the failing worker looks least loaded: it is tried first
    for _ in range(4):
        status, _ = await r.post("/v1/completions", {"prompt": SHORT, "max_tokens": 5, "stream": True})
        assert status == 200
    assert good.completed == 4 and len(bad.requests) >= 1
    m = await r.metrics()
    assert metric(m, "disagg_fallbacks_total", cause="decode_error") == len(bad.requests)


async def test_decode_client_error_passed_through(fake_workers, router_factory):
    d = await fake_workers("decode", fault="400")
    r = await router_factory([], [d.url])
    status, out = await r.post("/v1/completions", {"prompt": SHORT, "max_tokens": 5})
    assert status == 400 and json.loads(out)["error"]["message"] == "bad"
    assert len(d.requests) == 1  # not retried


async def test_client_disconnect_cancels_upstream(fake_workers, router_factory):
    d = await fake_workers("decode", tokens=1000, token_delay=0.02)
    r = await router_factory([], [d.url])
    async with aiohttp.ClientSession() as s:
        resp = await s.post(r.url + "/v1/completions", json={"prompt": SHORT, "max_tokens": 1000, "stream": True})
        await resp.content.readany()
        resp.close()
    await until(lambda: d.cancelled, 5, "the decode request cancelled upstream")
    assert d.cancelled == 1 and d.completed == 0
    await until(lambda: r.router.workers.get(d.url).inflight == 0, 5, "no request in flight on the decode worker")


async def test_mode_flip_applies_to_next_request(fake_workers, router_factory):
    p, d = await fake_workers("prefill"), await fake_workers("decode")
    r = await router_factory([p.url], [d.url])
    assert (await r.post("/v1/completions", {"prompt": LONG, "max_tokens": 200}))[0] == 200
    r.set_config(cfg(mode="Aggregated"))
    assert (await r.post("/v1/completions", {"prompt": LONG, "max_tokens": 200}))[0] == 200
    assert len(p.requests) == 1 and len(d.requests) == 2


async def test_aggregated_pool_takes_fallbacks(fake_workers, router_factory):
    p = await fake_workers("prefill", fault="500")
    d, agg = await fake_workers("decode"), await fake_workers("decode")
    r = await router_factory([p.url], [d.url], [agg.url])
    assert (await r.post("/v1/completions", {"prompt": LONG, "max_tokens": 200}))[0] == 200
    assert d.requests == [] and len(agg.requests) == 1


async def test_prefix_hit_goes_local(fake_workers, router_factory, metric):
    p, d = await fake_workers("prefill"), await fake_workers("decode")
    r = await router_factory([p.url], [d.url])
    body = {"prompt": LONG, "max_tokens": 200}
    assert (await r.post("/v1/completions", body))[0] == 200
    assert (await r.post("/v1/completions", {**body, "prompt": LONG + " And one more short question?"}))[0] == 200
    m = await r.metrics()
    assert metric(m, "disagg_routing_decisions_total", decision="remote") == 1
    assert metric(m, "disagg_routing_decisions_total", decision="local", reason="prefix_cache_hit") == 1
    assert len(p.requests) == 1


async def test_tenant_header(fake_workers, router_factory, metric):
    p, d = await fake_workers("prefill"), await fake_workers("decode")
    c = cfg(routing={"tenants": [{"name": "chat", "match": {"values": ["chat"]}, "disaggregation": "Never"}]})
    r = await router_factory([p.url], [d.url], config=c)
    assert (await r.post("/v1/completions", {"prompt": LONG, "max_tokens": 200}, {"x-tenant-id": "chat"}))[0] == 200
    m = await r.metrics()
    assert metric(m, "disagg_routing_decisions_total", decision="local", reason="tenant_never") == 1
    assert metric(m, "disagg_slo_requests_total", tenant="chat") == 1
    assert p.requests == []


async def test_health_ready_models(fake_workers, router_factory):
    d = await fake_workers("decode")
    r = await router_factory([], [d.url])
    async with r.session.get(r.url + "/health") as resp:
        assert resp.status == 200 and (await resp.json())["workers"]["decode"] == 1
    async with r.session.get(r.url + "/ready") as resp:
        assert resp.status == 200
    async with r.session.get(r.url + "/v1/models") as resp:
        assert (await resp.json())["data"][0]["id"] == "fake-model"
    empty = await router_factory([], [])
    async with empty.session.get(empty.url + "/ready") as resp:
        assert resp.status == 503
    status, out = await empty.post("/v1/completions", {"prompt": SHORT})
    assert status == 503 and "error" in json.loads(out)


async def test_bad_input(fake_workers, router_factory):
    d = await fake_workers("decode")
    r = await router_factory([], [d.url], config=cfg(model="served"), max_body_bytes=10_000)
    cases = [
        (b"{not json", 400),
        (b"[1, 2]", 400),
        (json.dumps({"prompt": 5}), 400),
        (json.dumps({"prompt": []}), 400),
        (json.dumps({"prompt": "x", "stream": "yes"}), 400),
        (json.dumps({"prompt": "x", "max_tokens": "ten"}), 400),
        (json.dumps({"prompt": "x", "max_tokens": -1}), 400),
        (json.dumps({"prompt": "x", "model": 7}), 400),
        (json.dumps({"prompt": "x", "model": "other"}), 404),
        (json.dumps({"prompt": "x" * 20_000}), 413),
    ]
    for data, want in cases:
        status, out = await r.post("/v1/completions", data)
        assert status == want, (data[:40], out)
        err = json.loads(out)["error"]
        assert err["code"] == want and err["message"]
    bad_chats: list[dict[str, Any]] = [{"messages": "hi"}, {"messages": []}, {"messages": [5]},
                                       {"messages": [{"content": "x"}]}, {"messages": [{"role": "user", "content": 5}]}]
    for body in bad_chats:
        status, _ = await r.post("/v1/chat/completions", body)
        assert status == 400, body
    assert d.requests == []
    status, _ = await r.post("/v1/completions", {"prompt": "x", "model": "served"})
    assert status == 200


async def test_priority_scheduling_sends_each_tenants_priority_on_both_legs(fake_workers, router_factory):
    """A tenant below Interactive turns on vLLM's priority scheduler (the operator renders it); the router then
    sends every request's tenant priority on each leg, replacing one the client chose."""
    p, d = await fake_workers("prefill"), await fake_workers("decode")
    tenants = [{"name": "batch", "match": {"values": ["batch"]}, "priority": "Batch"},
               {"name": "chat", "match": {"values": ["chat"]}}]
    r = await router_factory([p.url], [d.url], config=cfg(routing={"tenants": tenants}))
    status, _ = await r.post("/v1/completions", {"prompt": LONG, "max_tokens": 200, "priority": -5},
                             {"x-tenant-id": "batch"})
    assert status == 200
    assert p.requests[0]["body"]["priority"] == 1 and d.requests[0]["body"]["priority"] == 1
    for headers, want in (({"x-tenant-id": "chat"}, 0), ({}, 0)):  # Interactive, and no tenant (default)
        status, _ = await r.post("/v1/completions", {"prompt": SHORT, "max_tokens": 5, "priority": 7}, headers)
        assert status == 200 and d.requests[-1]["body"]["priority"] == want
    # every tenant Interactive: no priority scheduling, the body goes as the client sent it
    r2 = await router_factory([p.url], [d.url], config=cfg(routing={"tenants": tenants[1:]}))
    await r2.post("/v1/completions", {"prompt": SHORT, "max_tokens": 5}, {"x-tenant-id": "chat"})
    assert "priority" not in d.requests[-1]["body"]

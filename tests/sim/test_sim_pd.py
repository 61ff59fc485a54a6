"""Prefill/decode disaggregation between real sim processes, driven the way vLLM's toy proxy
(tests/v1/kv_connector/nixl_integration/toy_proxy_server.py) drives real workers: the prefill leg gets
max_tokens=1, stream=false and kv_transfer_params {do_remote_decode: true}; its response's kv_transfer_params
go verbatim into the decode request, which streams."""

from __future__ import annotations

import json
import math
import threading
import urllib.request
import uuid
from typing import Any

import pytest
from simtest_util import SimProc, kv_config, metric, prompt_of

from disagg.poll import wait_for

# the keys a real engine's prefill returns (a real 0.32.0 CPU engine, e2e/test_real_vllm.py; 0.33.0 adds
# remote_registration_generation: pull_scheduler.py line 291)
KV_KEYS = {"do_remote_prefill", "do_remote_decode", "remote_engine_id", "remote_request_id", "remote_block_ids",
           "remote_host", "remote_port", "tp_size", "dcp_size", "pp_size", "remote_num_tokens",
           "remote_blocks_expiry_time", "transfer_mode", "remote_prefill_cached_tokens",
           "remote_registration_generation"}
SCALE = 0.2


@pytest.fixture(scope="module")
def pd(sims):
    return {
        "P": sims.start("--kv-transfer-config", kv_config("kv_producer", kv_lease_duration=60), time_scale=SCALE),
        "P_short": sims.start("--kv-transfer-config", kv_config("kv_producer", kv_lease_duration=1),
                              time_scale=SCALE),
        "D": sims.start("--kv-transfer-config", kv_config("kv_consumer", "recompute"), time_scale=SCALE),
        "D_fail": sims.start("--kv-transfer-config", kv_config("kv_consumer", "fail"), time_scale=SCALE),
        "D_other": sims.start("--kv-transfer-config", kv_config("kv_consumer", "recompute"), time_scale=SCALE,
                              env={"DISAGG_SIM_VLLM_VERSION": "0.12.0"}),
    }


def prefill(p: SimProc, body: dict, request_id: str) -> dict:
    """The toy proxy's prefill leg."""
    leg = {**body, "stream": False, "max_tokens": 1,
           "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                  "remote_block_ids": None, "remote_host": None, "remote_port": None}}
    leg.pop("stream_options", None)
    status, resp = p.post("/v1/completions" if "prompt" in body else "/v1/chat/completions", leg,
                          headers={"X-Request-Id": request_id})
    assert status == 200, resp
    assert resp["usage"]["completion_tokens"] == 1
    return resp


def decode_stream(d: SimProc, body: dict, request_id: str) -> list[dict]:
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    req = urllib.request.Request(d.url + path, data=json.dumps({**body, "stream": True}).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "X-Request-Id": request_id})
    out = []
    with urllib.request.urlopen(req, timeout=60) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


def test_remote_prefill_round_trip_without_recompute(pd):
    prod, dec = pd["P"], pd["D"]
    # 16k tokens: prefill ~0.49 s vs the decode side's TTFT (pull + one step) ~0.06 s leaves ~0.23 simulated s
    # under the 0.6 bound below, ~47 ms of wall time at SCALE — room for the real side-channel I/O and event-loop
    # hiccups of a loaded box (4k tokens: 0.10 vs 0.03–0.06 s, a few ms of wall margin, flaked under load)
    body = {"prompt": prompt_of(16000, uuid.uuid4().hex), "max_tokens": 20}
    rid = uuid.uuid4().hex
    p0, d0 = prod.metrics(), dec.metrics()
    d_state0 = dec.state()

    resp = prefill(prod, body, rid)
    kv = resp["kv_transfer_params"]
    n_prompt = resp["usage"]["prompt_tokens"]
    assert set(kv) == KV_KEYS
    assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
    assert kv["remote_host"] == "127.0.0.1" and kv["remote_port"] == prod.side_port and kv["tp_size"] == 1
    assert kv["remote_engine_id"] == prod.state()["kv_transfer"]["engine_id"]
    assert kv["remote_request_id"] == f"cmpl-{rid}-0"
    (group,) = kv["remote_block_ids"]  # one list per KV-cache group, as vLLM sends them
    assert len(group) == math.ceil(n_prompt / 16) and kv["remote_num_tokens"] == n_prompt
    held = prod.state()
    assert kv["remote_request_id"] in held["held_requests"]
    assert held["free_blocks"] == held["num_gpu_blocks"] - len(group)

    chunks = decode_stream(dec, {**body, "kv_transfer_params": kv}, rid)
    assert len(chunks) == 20 and chunks[-1]["choices"][0]["finish_reason"] == "length"

    d1 = dec.metrics()
    # the decode worker loaded the prompt instead of computing it: only the last prompt token is recomputed
    assert dec.state()["computed_prompt_tokens"] - d_state0["computed_prompt_tokens"] == 1
    assert metric(d1, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") - metric(
        d0, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == n_prompt
    assert metric(d1, "vllm:prompt_tokens_by_source_total", source="local_compute") == metric(
        d0, "vllm:prompt_tokens_by_source_total", source="local_compute")
    assert d1["vllm:nixl_xfer_time_seconds_count"] - d0.get("vllm:nixl_xfer_time_seconds_count", 0) == 1
    assert d1["vllm:nixl_bytes_transferred_sum"] - d0.get("vllm:nixl_bytes_transferred_sum", 0) == n_prompt * 131072
    assert d1["vllm:nixl_num_failed_transfers_total"] == 0
    # decode TTFT (transfer + one step) is well below the prefill worker's time to prefill 4000 tokens
    p1 = prod.metrics()
    p_prefill = p1["vllm:request_prefill_time_seconds_sum"] - p0["vllm:request_prefill_time_seconds_sum"]
    d_ttft = d1["vllm:time_to_first_token_seconds_sum"] - d0["vllm:time_to_first_token_seconds_sum"]
    assert 0 < d_ttft < 0.6 * p_prefill, (d_ttft, p_prefill)

    # the pull's notification frees the prefill side's blocks
    wait_for(lambda: prod.state()["held_requests"] == [], what="prefill side to free the pulled blocks")
    st = prod.state()
    assert st["free_blocks"] == st["num_gpu_blocks"]
    assert prod.metrics()["vllm:nixl_num_kv_expired_reqs_total"] == 0


def test_chat_round_trip(pd):
    prod, dec = pd["P"], pd["D"]
    body = {"messages": [{"role": "user", "content": prompt_of(600, uuid.uuid4().hex)}], "max_tokens": 5}
    rid = uuid.uuid4().hex
    kv = prefill(prod, body, rid)["kv_transfer_params"]
    assert set(kv) == KV_KEYS and kv["remote_request_id"] == f"chatcmpl-{rid}"
    chunks = decode_stream(dec, {**body, "kv_transfer_params": kv}, rid)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    wait_for(lambda: prod.state()["held_requests"] == [], what="blocks freed")


def test_plain_request_on_a_producer_holds_nothing(pd):
    prod = pd["P"]
    status, resp = prod.post("/v1/completions", {"prompt": "hello", "max_tokens": 3})
    assert status == 200 and resp["kv_transfer_params"] is None and prod.state()["held_requests"] == []


def expired_params(pd, body) -> dict:
    prod_short = pd["P_short"]
    before = prod_short.metrics()["vllm:nixl_num_kv_expired_reqs_total"]
    kv = prefill(prod_short, body, uuid.uuid4().hex)["kv_transfer_params"]
    wait_for(lambda: prod_short.state()["held_requests"] == [], timeout=20, what="lease expiry")
    assert prod_short.metrics()["vllm:nixl_num_kv_expired_reqs_total"] == before + 1
    st = prod_short.state()
    assert st["free_blocks"] == st["num_gpu_blocks"]
    return kv


def test_expired_lease_with_recompute_policy_prefills_locally(pd):
    dec = pd["D"]
    body = {"prompt": prompt_of(1000, uuid.uuid4().hex), "max_tokens": 4}
    kv = expired_params(pd, body)
    d0, s0 = dec.metrics(), dec.state()
    status, resp = dec.post("/v1/completions", {**body, "kv_transfer_params": kv})
    assert status == 200 and resp["choices"][0]["finish_reason"] == "length"
    d1 = dec.metrics()
    n = resp["usage"]["prompt_tokens"]
    assert d1["vllm:nixl_num_failed_transfers_total"] == d0["vllm:nixl_num_failed_transfers_total"] + 1
    assert dec.state()["computed_prompt_tokens"] - s0["computed_prompt_tokens"] == n
    assert dec.state()["kv_transfer"]["recomputed"] == s0["kv_transfer"]["recomputed"] + 1


def test_expired_lease_with_fail_policy_errors(pd):
    dec_fail = pd["D_fail"]
    body = {"prompt": prompt_of(1000, uuid.uuid4().hex), "max_tokens": 4}
    kv = expired_params(pd, body)
    status, resp = dec_fail.post("/v1/completions", {**body, "kv_transfer_params": kv})
    # vLLM 0.33.0's shape (exact bytes in test_sim_kv_errors.py): the KV detail stays in the server log
    assert status == 500 and resp == {"error": {"message": "Internal server error", "type": "InternalServerError",
                                                "param": None, "code": 500}}
    chunks = decode_stream(dec_fail, {**body, "kv_transfer_params": kv}, uuid.uuid4().hex)
    assert chunks == [resp]  # a completion stream: the error event only, no chunk with finish_reason "error"
    m = dec_fail.metrics()
    assert metric(m, "vllm:request_success_total", finished_reason="error") == 2
    assert dec_fail.state()["free_blocks"] == dec_fail.state()["num_gpu_blocks"]


def test_injected_transfer_failure_recomputes(pd):
    prod, dec = pd["P"], pd["D"]
    body = {"prompt": prompt_of(800, uuid.uuid4().hex), "max_tokens": 3}
    kv = prefill(prod, body, uuid.uuid4().hex)["kv_transfer_params"]
    with dec.faults(kv_transfer_fail_rate=1.0):
        f0, s0 = dec.metrics()["vllm:nixl_num_failed_transfers_total"], dec.state()
        status, resp = dec.post("/v1/completions", {**body, "kv_transfer_params": kv})
        assert status == 200
        assert dec.metrics()["vllm:nixl_num_failed_transfers_total"] == f0 + 1
        assert dec.state()["computed_prompt_tokens"] - s0["computed_prompt_tokens"] == resp["usage"]["prompt_tokens"]
    # nobody pulled: the prefill side keeps the blocks until the lease expires (60 s simulated here)
    assert kv["remote_request_id"] in prod.state()["held_requests"]


def test_incompatible_engine_is_refused_at_handshake(pd):
    prod, dec_other = pd["P"], pd["D_other"]
    body = {"prompt": prompt_of(500, uuid.uuid4().hex), "max_tokens": 2}
    kv = prefill(prod, body, uuid.uuid4().hex)["kv_transfer_params"]
    status, _ = dec_other.post("/v1/completions", {**body, "kv_transfer_params": kv})
    assert status == 200  # recompute policy
    assert dec_other.metrics()["vllm:nixl_num_failed_transfers_total"] == 1
    assert "handshake refused" in dec_other.log() and "incompatible" in dec_other.log()
    assert kv["remote_request_id"] in prod.state()["held_requests"]


def test_request_waiting_for_remote_kv_counts_as_deferred(pd):
    prod, dec = pd["P"], pd["D"]
    body = {"prompt": prompt_of(500, uuid.uuid4().hex), "max_tokens": 2}
    kv = prefill(prod, body, uuid.uuid4().hex)["kv_transfer_params"]
    with dec.faults(kv_transfer_delay_ms=4000):
        result: dict[str, Any] = {}
        t = threading.Thread(target=lambda: result.update(r=dec.post("/v1/completions", {**body,
                                                                                      "kv_transfer_params": kv})))
        t.start()

        def deferred() -> dict[str, float] | None:  # one snapshot of the metrics, once the request is deferred
            ms = dec.metrics()
            return ms if metric(ms, "vllm:num_requests_waiting_by_reason", reason="deferred") == 1 else None

        m = wait_for(deferred, what="a deferred request")
        assert m["vllm:num_requests_waiting"] >= 1 and m["vllm:num_requests_running"] == 0
        t.join(timeout=30)
        assert result["r"][0] == 200
    after = dec.metrics()
    assert metric(after, "vllm:num_requests_waiting_by_reason", reason="deferred") == 0
    wait_for(lambda: kv["remote_request_id"] not in prod.state()["held_requests"], what="blocks freed")


def test_data_parallel_ranks_are_separate_engines(sims, pd):
    """-dp 2: two engines behind one API server, each with its own KV, engine_id `<id>_dp<rank>` and side-channel
    port base+rank (as vLLM); the decode side pulls from whichever rank prefilled."""
    prod2 = sims.start("--kv-transfer-config", kv_config("kv_producer", kv_lease_duration=60), "-dp", "2",
                    time_scale=SCALE)
    dec = pd["D"]
    st = prod2.state()
    assert st["data_parallel_size"] == 2 and len(st["engines"]) == 2
    assert st["num_gpu_blocks"] == 2 * st["engines"][0]["num_gpu_blocks"]
    base = st["kv_transfer"]["engine_ids"][0].rsplit("_dp", 1)[0]
    assert st["kv_transfer"]["engine_ids"] == [f"{base}_dp0", f"{base}_dp1"]

    bodies = [{"prompt": prompt_of(3000, uuid.uuid4().hex), "max_tokens": 3} for _ in range(2)]
    results: list = [None, None]

    def leg(i):
        results[i] = prefill(prod2, bodies[i], uuid.uuid4().hex)["kv_transfer_params"]

    threads = [threading.Thread(target=leg, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    ports = sorted(kv["remote_port"] for kv in results)
    assert ports == [prod2.side_port, prod2.side_port + 1]  # the second request went to the idle rank
    assert {kv["remote_engine_id"] for kv in results} == {f"{base}_dp0", f"{base}_dp1"}
    for body, kv in zip(bodies, results, strict=True):
        status, resp = dec.post("/v1/completions", {**body, "kv_transfer_params": kv})
        assert status == 200, resp
    wait_for(lambda: prod2.state()["held_requests"] == [], what="both ranks freed their blocks")
    text = prod2.get("/metrics")[1].decode()
    assert 'engine="0"' in text and 'engine="1"' in text
    m = prod2.metrics()
    assert metric(m, "vllm:request_success_total", engine="0") == 1
    assert metric(m, "vllm:request_success_total", engine="1") == 1

"""Process lifecycle and engine behaviour seen from outside: preemption under KV pressure, client disconnects,
graceful SIGTERM, injected crashes and stalls, env-injected flags into unmodified vLLM args."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from typing import Any

from simtest_util import metric, prompt_of

from disagg.poll import wait_for


def test_kv_pressure_preempts_and_everyone_finishes(sims):
    # 40 blocks × 16 = 640 tokens of KV for 4 requests that each grow to ~300 tokens
    s = sims.start("--max-model-len", "512", "--num-gpu-blocks-override", "40", time_scale=0.1)
    assert s.state()["num_gpu_blocks"] == 40
    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(
        s.post("/v1/completions", {"prompt": prompt_of(100, f"pre{i}"), "max_tokens": 200}))) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert [r[0] for r in results] == [200] * 4
    assert all(r[1]["usage"]["completion_tokens"] == 200 for r in results)
    m = s.metrics()
    assert m["vllm:num_preemptions_total"] >= 1
    assert m["vllm:kv_cache_usage_perc"] == 0.0


def test_client_disconnect_aborts_the_request(sims):
    s = sims.start("--max-model-len", "4096", time_scale=0.5)
    body = json.dumps({"prompt": "tell me a long story", "max_tokens": 3000, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", s.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while got.count(b"data: ") < 3:
            got += sock.recv(4096)
    wait_for(lambda: metric(s.metrics(), "vllm:request_success_total", finished_reason="abort") == 1,
             what="the disconnected request to be aborted")
    m = s.metrics()
    assert m["vllm:num_requests_running"] == 0 and m["vllm:kv_cache_usage_perc"] == 0.0
    assert m["vllm:generation_tokens_total"] < 3000


def test_client_disconnect_aborts_a_non_streaming_request(sims):
    s = sims.start("--max-model-len", "4096", time_scale=0.5)
    body = json.dumps({"prompt": "tell me a long story", "max_tokens": 3000}).encode()
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    wait_for(lambda: s.metrics()["vllm:num_requests_running"] == 1, what="request running")
    sock.close()
    wait_for(lambda: metric(s.metrics(), "vllm:request_success_total", finished_reason="abort") == 1,
             what="the disconnected request to be aborted")
    assert s.metrics()["vllm:num_requests_running"] == 0


def test_sigterm_drains_in_flight_requests_within_shutdown_timeout(sims):
    s = sims.start("--max-model-len", "4096", "--shutdown-timeout", "20", time_scale=0.5)
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.update(r=s.post("/v1/completions", {"prompt": "hi",
                                                                                   "max_tokens": 100})))
    t.start()
    wait_for(lambda: s.metrics()["vllm:num_requests_running"] == 1, what="request running")
    s.proc.send_signal(signal.SIGTERM)
    t.join(timeout=30)
    assert result["r"][0] == 200 and result["r"][1]["usage"]["completion_tokens"] == 100
    assert s.proc.wait(timeout=20) == 0
    assert "shutting_down" in s.log()


def test_crash_endpoint_and_crash_after_requests(sims):
    s = sims.start("--max-model-len", "2048", env={"DISAGG_SIM_FAULT_CRASH_AFTER_REQUESTS": "2"})
    assert s.post("/v1/completions", {"prompt": "a", "max_tokens": 1})[0] == 200
    status, body = s.post("/v1/completions", {"prompt": "b", "max_tokens": 1})
    assert status == 500 and "crash" in body["error"]["message"]
    assert s.proc.wait(timeout=10) == 1
    s2 = sims.start("--max-model-len", "2048")
    assert s2.post("/sim/crash", {})[0] == 200
    assert s2.proc.wait(timeout=10) == 1


def test_prefill_faults(sims):
    s = sims.start("--max-model-len", "4096", time_scale=0.2)
    body = {"prompt": prompt_of(1000, "stall"), "max_tokens": 2}
    s.post("/v1/completions", body)
    ttft0 = s.metrics()["vllm:time_to_first_token_seconds_sum"]
    with s.faults(prefill_stall_ms=500):
        s.post("/v1/completions", {**body, "prompt": prompt_of(1000, "stall2")})
    ttft1 = s.metrics()["vllm:time_to_first_token_seconds_sum"] - ttft0
    assert 0.5 < ttft1 < 1.0  # one prefill step (~25 ms) + the injected 500 ms, in simulated seconds
    with s.faults(prefill_error_rate=1.0):
        status, resp = s.post("/v1/completions", body)
    assert status == 500 and "prefill" in resp["error"]["message"]


def test_env_injects_sim_flags_into_unmodified_vllm_args(sims):
    """The local runtime swaps `vllm serve` for `disagg sim`, keeps the operator's args and sets env vars."""
    s = sims.start("--served-model-name", "m", "--tensor-parallel-size", "4", "--enforce-eager",
                   "--disable-log-requests", model="meta-llama/Llama-3.1-70B-Instruct",
                   env={"DISAGG_SIM_GPU": "H200", "DISAGG_SIM_FAULT_ERROR_RATE": "1"})
    st = s.state()
    assert (st["gpu"], st["model_preset"], st["tensor_parallel_size"]) == ("H200", "Llama-3.1-70B", 4)
    assert s.post("/v1/completions", {"prompt": "x", "max_tokens": 1})[0] == 500
    assert "ignored_vllm_flag" in s.log() and "--enforce-eager" in s.log()


def test_load_seconds_delays_readiness(sims):
    t0 = time.monotonic()
    s = sims.start("--max-model-len", "2048", "--sim-load-seconds", "5", time_scale=0.2)  # 1 s of wall
    assert time.monotonic() - t0 >= 0.9
    assert s.get("/health")[0] == 200

"""A real `disagg sim` process: OpenAI response and streaming shapes, errors, metrics, admin faults."""

from __future__ import annotations

import json
import urllib.request

import pytest
from simtest_util import MODEL, SimProc, metric, prompt_of

from disagg.poll import wait_for
from disagg.sim.args import VLLM_VERSION

REQUIRED_METRICS = [
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_requests_waiting_by_reason",
    "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:request_success_total", "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket", "vllm:prompt_tokens_cached_total",
    "vllm:request_time_per_output_token_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
    "vllm:request_queue_time_seconds_bucket", "vllm:request_prefill_time_seconds_bucket",
    "vllm:request_decode_time_seconds_bucket", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total", "vllm:prompt_tokens_by_source_total", "vllm:iteration_tokens_total_bucket",
]


@pytest.fixture(scope="module")
def sim(sims) -> SimProc:
    return sims.start("--served-model-name", "llama", MODEL, "--max-model-len", "4096", time_scale=0.1)


def stream_lines(sim: SimProc, path: str, body: dict) -> list[str]:
    req = urllib.request.Request(sim.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        return [line.decode().rstrip("\n") for line in r if line.strip()]


def test_models_health_version(sim):
    status, body = sim.get("/v1/models")
    data = json.loads(body)
    assert status == 200 and [m["id"] for m in data["data"]] == ["llama", MODEL]
    assert data["data"][0]["max_model_len"] == 4096 and data["object"] == "list"
    assert sim.get("/health")[0] == 200
    assert json.loads(sim.get("/version")[1])["version"] == VLLM_VERSION == "0.33.0"


def test_completion_shape_and_request_id(sim):
    status, body = sim.post("/v1/completions", {"model": "llama", "prompt": "The capital of France is",
                                                "max_tokens": 7}, headers={"X-Request-Id": "abc123"})
    assert status == 200
    assert body["id"] == "cmpl-abc123" and body["object"] == "text_completion" and body["model"] == "llama"
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "length" and choice["index"] == 0 and isinstance(choice["text"], str)
    u = body["usage"]
    assert u["completion_tokens"] == 7 and u["prompt_tokens"] >= 6
    assert u["total_tokens"] == u["prompt_tokens"] + 7
    assert "kv_transfer_params" in body and body["kv_transfer_params"] is None


def test_several_prompts_and_token_id_prompts(sim):
    status, body = sim.post("/v1/completions", {"prompt": ["one two", "three four five"], "max_tokens": 3})
    assert status == 200 and [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] == 6
    status, body = sim.post("/v1/completions", {"prompt": [1, 2, 3, 4, 5], "max_tokens": 2})
    assert status == 200 and body["usage"]["prompt_tokens"] == 5


def test_chat_shape_and_default_length(sim):
    status, body = sim.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi there"}]})
    assert status == 200 and body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] == "stop"  # no max_tokens: the sim's EOS after --sim-output-tokens (128)
    assert body["usage"]["completion_tokens"] == 128


def test_prompt_lengths_are_realistic(sim):
    text = "The quick brown fox jumps over the lazy dog. " * 40  # 360 words, 1800 chars
    _, body = sim.post("/v1/completions", {"prompt": text, "max_tokens": 1})
    assert 400 <= body["usage"]["prompt_tokens"] <= 560  # ~4 chars/token, ~1.3 tokens/word
    _, again = sim.post("/v1/completions", {"prompt": text, "max_tokens": 1})
    assert again["usage"]["prompt_tokens"] == body["usage"]["prompt_tokens"]


def test_completion_stream_shape_with_usage(sim):
    lines = stream_lines(sim, "/v1/completions", {"prompt": "count to five", "max_tokens": 5, "stream": True,
                                                  "stream_options": {"include_usage": True}})
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    token_chunks = [c for c in chunks if c["choices"]]
    assert len(token_chunks) == 5
    assert all(c["object"] == "text_completion" for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in token_chunks] == [None] * 4 + ["length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5


def test_chat_stream_shape(sim):
    lines = stream_lines(sim, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}],
                                                       "max_completion_tokens": 3, "stream": True})
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert lines[-1] == "data: [DONE]"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and "usage" not in c for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks[1:]] == [None, None, "length"]
    assert all(c["choices"][0]["delta"]["content"] for c in chunks[1:])


@pytest.mark.parametrize(
    "path,body,status,err_type,needle",
    [
        ("/v1/completions", {"prompt": prompt_of(5000), "max_tokens": 1}, 400, "BadRequestError",
         "maximum context length is 4096"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 4096}, 400, "BadRequestError", "'max_tokens'"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "BadRequestError", "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": "ten"}, 400, "BadRequestError", "max_tokens"),
        ("/v1/completions", {"model": "gpt-4", "prompt": "hi"}, 404, "NotFoundError", "does not exist"),
        ("/v1/completions", {"max_tokens": 3}, 400, "BadRequestError", "prompt"),
        ("/v1/completions", {"prompt": "hi", "n": 2}, 400, "BadRequestError", "n > 1"),
        ("/v1/chat/completions", {"messages": []}, 400, "BadRequestError", "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, 400,
         "BadRequestError", "stream"),
    ],
)
def test_errors_have_openai_shape(sim, path, body, status, err_type, needle):
    got, resp = sim.post(path, body)
    assert got == status
    assert set(resp) == {"error"} and set(resp["error"]) == {"message", "type", "param", "code"}
    assert resp["error"]["type"] == err_type and resp["error"]["code"] == status
    assert needle in resp["error"]["message"]


def test_invalid_json_is_400(sim):
    req = urllib.request.Request(sim.url + "/v1/completions", data=b"{nope", method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("expected HTTP 400")
    except urllib.error.HTTPError as e:
        assert e.code == 400 and json.loads(e.read())["error"]["type"] == "BadRequestError"


def test_metrics_present_labelled_and_moving(sim):
    before = sim.metrics()
    for name in REQUIRED_METRICS:
        assert name in before, name
    # removed in vLLM 0.15.0 (disagg.vllm_versions.METRICS); the default emulated release is 0.33.0
    assert "vllm:time_per_output_token_seconds_bucket" not in before
    text = sim.get("/metrics")[1].decode()
    assert 'vllm:num_requests_running{engine="0",model_name="llama"}' in text
    assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="llama"}' in text
    shared = prompt_of(400)
    sim.post("/v1/completions", {"prompt": shared, "max_tokens": 4})
    sim.post("/v1/completions", {"prompt": shared + " and more", "max_tokens": 4})
    after = sim.metrics()
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 8
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] >= 800
    assert metric(after, "vllm:request_success_total", finished_reason="length") - metric(
        before, "vllm:request_success_total", finished_reason="length") == 2
    assert after["vllm:time_to_first_token_seconds_count"] - before["vllm:time_to_first_token_seconds_count"] == 2
    assert after["vllm:inter_token_latency_seconds_count"] - before["vllm:inter_token_latency_seconds_count"] == 6
    # the second prompt shares ~400 tokens with the first: prefix-cache hits, in whole 16-token blocks
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    assert hits >= 384 and hits % 16 == 0
    assert metric(after, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") >= 384
    # simulated TTFT of ~400 tokens on an H100 is tens of ms, not the wall time of a loaded CI box / time-scale
    ttft_mean = (after["vllm:time_to_first_token_seconds_sum"] - before["vllm:time_to_first_token_seconds_sum"]) / 2
    assert 0.005 < ttft_mean < 0.2


def test_runtime_faults_endpoint(sim):
    status, faults = sim.post("/sim/faults", {"error_rate": 1.0})
    assert status == 200 and faults["error_rate"] == 1.0
    try:
        got, body = sim.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert got == 500 and body["error"]["type"] == "InternalServerError"
    finally:
        sim.post("/sim/faults", {"error_rate": 0.0})
    assert sim.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})[0] == 200
    bad, body = sim.post("/sim/faults", {"error_rate": 3})
    assert bad == 400 and "error_rate" in body["error"]["message"]
    with sim.faults(health_fail=True):
        assert sim.get("/health")[0] == 503
    assert sim.get("/health")[0] == 200


def test_queueing_shows_in_gauges(sims):
    """max-num-seqs 1: concurrent requests queue; waiting gauge rises, queue time is recorded."""
    import threading

    s = sims.start("--max-model-len", "2048", "--max-num-seqs", "1", time_scale=0.2)
    # 400 tokens each (~0.5 s of wall time at this scale): the two queued requests wait ~1 s, many polls long
    # (with 40 tokens the queue emptied in ~0.1 s, about one poll: a race the poller could lose)
    threads = [threading.Thread(target=s.post, args=("/v1/completions", {"prompt": "x " * 50, "max_tokens": 400}))
               for _ in range(3)]
    for t in threads:
        t.start()
    wait_for(lambda: s.metrics().get("vllm:num_requests_waiting", 0) >= 1, what="a waiting request")
    for t in threads:
        t.join(timeout=60)
    m = s.metrics()
    assert m["vllm:num_requests_waiting"] == 0 and m["vllm:num_requests_running"] == 0
    assert m["vllm:request_queue_time_seconds_sum"] > 0.1  # the later ones waited for ~40 decode steps


def test_startup_refuses_a_model_that_does_not_fit(sims):
    s = sims.start(model="meta-llama/Llama-3.1-70B-Instruct", expect_ready=False)
    assert s.proc.wait(timeout=30) == 1
    assert "KV cache" in s.log() or "max seq len" in s.log()

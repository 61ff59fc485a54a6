"""A failed KV pull on a decode worker, byte for byte as vLLM 0.33.0 answers it.

kv_load_failure_policy "fail": the engine finishes the request with reason "error" and the OpenAI server turns
that into GenerationError("Internal server error") before building any choice (see the GENERATION_ERROR note in
disagg/sim/server.py for the vLLM file:line of each shape). Not streamed: HTTP 500 + the error object. Streamed
chat: HTTP 200, the role chunk, ``data: {"error":...}`` (compact), ``data: [DONE]``. Streamed completion: HTTP 200,
``data: {"error": ...}`` (json.dumps spacing), ``data: [DONE]``. Never a chunk with ``finish_reason: "error"``, never
a usage chunk. Policy "recompute": the decode worker prefills locally and answers normally.
"""

from __future__ import annotations

import json
import uuid

import pytest
from simtest_util import MODEL, SimProc, kv_config, metric, prompt_of

from disagg.local.procs import free_port

CHAT_ERROR = (b'data: {"error":{"message":"Internal server error","type":"InternalServerError","param":null,'
              b'"code":500}}\n\n')
COMPLETION_ERROR = (b'data: {"error": {"message": "Internal server error", "type": "InternalServerError", '
                    b'"param": null, "code": 500}}\n\n')
DONE = b"data: [DONE]\n\n"
HTTP_500_BODY = b'{"error":{"message":"Internal server error","type":"InternalServerError","param":null,"code":500}}'


@pytest.fixture(scope="module")
def kv(sims):
    return {
        "P": sims.start("--kv-transfer-config", kv_config("kv_producer", kv_lease_duration=60)),
        # every pull fails (injected), policy fail
        "D_inject": sims.start("--kv-transfer-config", kv_config("kv_consumer", "fail"),
                               "--fault-kv-transfer-fail-rate", "1.0"),
        # pulls fail for real (side channel unreachable), policy fail
        "D_fail": sims.start("--kv-transfer-config", kv_config("kv_consumer", "fail")),
        "D_recompute": sims.start("--kv-transfer-config", kv_config("kv_consumer", "recompute"),
                                  "--fault-kv-transfer-fail-rate", "1.0"),
    }


def _body(chat: bool, tag: str) -> dict:
    if chat:
        return {"messages": [{"role": "user", "content": prompt_of(400, tag)}], "max_tokens": 4}
    return {"prompt": prompt_of(400, tag), "max_tokens": 4}


def _path(chat: bool) -> str:
    return "/v1/chat/completions" if chat else "/v1/completions"


def _kv_params(p: SimProc, body: dict, unreachable: bool) -> dict:
    """The toy proxy's prefill leg; ``unreachable`` points the params at a closed side-channel port."""
    leg = {**body, "stream": False, "max_tokens": 1,
           "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}}
    status, resp = p.post(_path("messages" in body), leg)
    assert status == 200, resp
    params = resp["kv_transfer_params"]
    assert params and params["do_remote_prefill"] is True
    if unreachable:
        params = {**params, "remote_port": free_port()}
    return params


def _failing_decode(kv, which: str, chat: bool) -> tuple[SimProc, dict]:
    d = kv[which]
    body = _body(chat, uuid.uuid4().hex)
    return d, {**body, "kv_transfer_params": _kv_params(kv["P"], body, unreachable=which == "D_fail")}


CASES = [pytest.param(which, chat, id=f"{which}-{'chat' if chat else 'completion'}")
         for which in ("D_inject", "D_fail") for chat in (True, False)]


@pytest.mark.parametrize(("which", "chat"), CASES)
def test_not_streamed_is_http_500_with_vllm_error_body(kv, which, chat):
    d, body = _failing_decode(kv, which, chat)
    m0 = d.metrics()
    status, ctype, raw = d.post_raw(_path(chat), body)
    assert status == 500 and ctype.startswith("application/json")
    assert raw == HTTP_500_BODY
    m1 = d.metrics()
    assert m1["vllm:nixl_num_failed_transfers_total"] == m0["vllm:nixl_num_failed_transfers_total"] + 1
    assert metric(m1, "vllm:request_success_total", finished_reason="error") == metric(
        m0, "vllm:request_success_total", finished_reason="error") + 1
    st = d.state()
    assert st["free_blocks"] == st["num_gpu_blocks"]


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("which", ["D_inject", "D_fail"])
def test_streamed_chat_is_role_chunk_then_error_event_then_done(kv, which, include_usage):
    d, body = _failing_decode(kv, which, chat=True)
    rid = uuid.uuid4().hex
    m0 = d.metrics()
    status, ctype, raw = d.post_raw(_path(True), {**body, "stream": True,
                                                  "stream_options": {"include_usage": include_usage}},
                                    headers={"X-Request-Id": rid})
    assert status == 200 and ctype.startswith("text/event-stream")
    assert raw.endswith(CHAT_ERROR + DONE), raw
    head = raw[: -len(CHAT_ERROR + DONE)]
    assert head.startswith(b"data: ") and head.endswith(b"\n\n") and head.count(b"\n\n") == 1, raw
    role = json.loads(head[len(b"data: "):])
    assert isinstance(role.pop("created"), int)
    assert role == {"id": f"chatcmpl-{rid}", "object": "chat.completion.chunk", "model": MODEL,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}], "prompt_token_ids": None, "prompt_text": None}
    m1 = d.metrics()
    assert m1["vllm:nixl_num_failed_transfers_total"] == m0["vllm:nixl_num_failed_transfers_total"] + 1
    assert metric(m1, "vllm:request_success_total", finished_reason="error") == metric(
        m0, "vllm:request_success_total", finished_reason="error") + 1


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("which", ["D_inject", "D_fail"])
def test_streamed_completion_is_error_event_then_done(kv, which, include_usage):
    d, body = _failing_decode(kv, which, chat=False)
    status, ctype, raw = d.post_raw(_path(False), {**body, "stream": True,
                                                   "stream_options": {"include_usage": include_usage}})
    assert status == 200 and ctype.startswith("text/event-stream")
    assert raw == COMPLETION_ERROR + DONE


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completion"])
def test_recompute_policy_answers_normally_after_a_failed_pull(kv, chat):
    d = kv["D_recompute"]
    body = _body(chat, uuid.uuid4().hex)
    params = _kv_params(kv["P"], body, unreachable=False)
    m0, s0 = d.metrics(), d.state()
    status, ctype, raw = d.post_raw(_path(chat), {**body, "kv_transfer_params": params, "stream": True,
                                                  "stream_options": {"include_usage": True}})
    assert status == 200 and ctype.startswith("text/event-stream")
    events = raw.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    chunks = [json.loads(e[len(b"data: "):]) for e in events[:-2]]
    assert all("error" not in c for c in chunks)
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["completion_tokens"] == 4
    finish = [c["choices"][0]["finish_reason"] for c in chunks[:-1] if c["choices"][0]["finish_reason"]]
    assert finish == ["length"]
    m1, s1 = d.metrics(), d.state()
    assert m1["vllm:nixl_num_failed_transfers_total"] == m0["vllm:nixl_num_failed_transfers_total"] + 1
    # the whole prompt was prefilled locally on the decode worker
    assert s1["computed_prompt_tokens"] - s0["computed_prompt_tokens"] == usage["prompt_tokens"]
    assert s1["kv_transfer"]["recomputed"] == s0["kv_transfer"]["recomputed"] + 1

"""Pure policy guards: prefill pool starting, circuit breakers in the decision, mode probes, and the stream-start
classifier that turns vLLM's in-stream errors into leg failures."""

from __future__ import annotations

import json
from typing import Any

import pytest

from disagg.api.contract import RouterConfig
from disagg.router.features import request_hash_fraction
from disagg.router.policy import decide
from disagg.router.policy_types import LoadSnapshot, RequestFeatures, Tuning, WorkerLoad
from disagg.router.probe import ProbeLimiter, probe_decision
from disagg.router.proxy import COMMIT, ERROR, HOLD, StreamAccount, StreamStart, has_error_finish, is_generation_error

P1, P2 = WorkerLoad("http://p1", compat="a"), WorkerLoad("http://p2", compat="a")
D1, D2 = WorkerLoad("http://d1", compat="a"), WorkerLoad("http://d2", compat="a", inflight=1)


def cfg(**over: Any) -> RouterConfig:
    return RouterConfig.model_validate(over)


def feats(tokens: int = 4096, rid: str = "r") -> RequestFeatures:
    return RequestFeatures(request_id=rid, endpoint="/v1/completions", input_tokens=tokens, max_tokens=512,
                           canary_fraction=request_hash_fraction(rid))


# ------------------------------------------------------------------------------------------ starting, breakers

def test_prefill_pool_starting_keeps_remote_candidates_local() -> None:
    snap = LoadSnapshot(prefill=(), decode=(D1,))
    d = decide(cfg(prefillStarting=True), feats(), snap)
    assert (d.decision, d.reason, d.decode) == ("local", "prefill_pool_starting", "http://d1")
    # short prompts keep their own reason; a forced tenant waits for the pool too
    assert decide(cfg(prefillStarting=True), feats(100), snap).reason == "short_prompt"
    forced = cfg(prefillStarting=True, routing={"tenants": [{"name": "b", "match": {"values": ["b"]},
                                                              "disaggregation": "Always"}]})
    f = RequestFeatures(request_id="r", endpoint="/v1/completions", input_tokens=10, tenant="b")
    assert decide(forced, f, snap).reason == "prefill_pool_starting"


def test_open_decode_breaker_picks_the_other_decode_worker_then_goes_local() -> None:
    snap = LoadSnapshot(prefill=(P1,), decode=(D1, D2))
    assert decide(cfg(), feats(), snap).decode == "http://d1"  # the least loaded
    s1 = LoadSnapshot(prefill=(P1,), decode=(D1, D2), blocked_decode=frozenset({"http://d1"}))
    d = decide(cfg(), feats(), s1)
    assert (d.decision, d.reason, d.decode, d.prefill) == ("remote", "policy", "http://d2", "http://p1")
    s2 = LoadSnapshot(prefill=(P1,), decode=(D1, D2), blocked_decode=frozenset({"http://d1", "http://d2"}))
    d = decide(cfg(), feats(), s2)
    assert (d.decision, d.reason, d.prefill) == ("local", "circuit_open", None)
    assert d.decode == "http://d1"  # local prefill on a decode worker whose KV path is broken is fine


def test_open_pair_breaker_picks_another_prefill_worker_or_decode() -> None:
    s = LoadSnapshot(prefill=(P1, P2), decode=(D1, D2), blocked_pairs=frozenset({("http://p1", "http://d1")}))
    d = decide(cfg(), feats(), s)
    assert (d.decision, d.decode, d.prefill) == ("remote", "http://d1", "http://p2")
    s = LoadSnapshot(prefill=(P1,), decode=(D1, D2), blocked_pairs=frozenset({("http://p1", "http://d1")}))
    d = decide(cfg(), feats(), s)
    assert (d.decision, d.decode, d.prefill) == ("remote", "http://d2", "http://p1")
    s = LoadSnapshot(prefill=(P1,), decode=(D1,), blocked_pairs=frozenset({("http://p1", "http://d1")}))
    assert decide(cfg(), feats(), s).reason == "circuit_open"


# ------------------------------------------------------------------------------------------ probes

def test_probe_limiter_token_bucket_and_share() -> None:
    lim = ProbeLimiter()
    # rate 60/min = 1/s, share 0.5: the first eligible request probes, then every 2nd eligible one at most,
    # and never more than one a second
    got = [lim.admit(60, 0.5, t) for t in (0.0, 0.1, 0.2, 1.3, 1.4, 2.5, 3.6)]
    assert got == [True, False, False, True, False, True, False]
    lim.reset()
    assert lim.admit(60, 0.5, 100.0)
    assert not ProbeLimiter().admit(0, 0.5, 0.0) and not ProbeLimiter().admit(60, 0.0, 0.0)


def test_probe_share_bounds_many_eligible_requests() -> None:
    lim = ProbeLimiter()
    n = sum(lim.admit(6000, 0.05, i * 1.0) for i in range(1000))  # tokens never short: the share binds
    assert n <= 1 + 0.05 * 1000 and n >= 0.05 * 1000 - 1
    lim = ProbeLimiter()
    n = sum(lim.admit(6, 1.0, i * 1.0) for i in range(600))  # 6/min over 10 minutes: the bucket binds
    assert n == 60


HELD = {"mode": "Auto", "activeMode": "Aggregated", "probe": {"ratePerMinute": 60, "maxShare": 1.0}}
SNAP = LoadSnapshot(prefill=(P1,), decode=(D1,))


def test_probe_decision_only_for_remote_eligible_requests_while_held() -> None:
    lim = ProbeLimiter()
    d = probe_decision(cfg(**HELD), feats(), SNAP, Tuning(), lim, 0.0)
    assert d is not None and (d.decision, d.reason, d.prefill, d.decode) == ("remote", "mode_probe", "http://p1",
                                                                              "http://d1")
    assert probe_decision(cfg(**HELD), feats(), SNAP, Tuning(), lim, 0.5) is None  # bucket empty
    lim = ProbeLimiter()
    assert probe_decision(cfg(**HELD), feats(100), SNAP, Tuning(), lim, 0.0) is None  # short: not eligible
    assert lim.admit(60, 1.0, 0.0)  # ... and it did not spend the bucket
    pinned = {**HELD, "mode": "Aggregated"}
    assert probe_decision(cfg(**pinned), feats(), SNAP, Tuning(), ProbeLimiter(), 0.0) is None
    off = {**HELD, "probe": {"ratePerMinute": 0}}
    assert probe_decision(cfg(**off), feats(), SNAP, Tuning(), ProbeLimiter(), 0.0) is None
    blocked = LoadSnapshot(prefill=(P1,), decode=(D1,), blocked_decode=frozenset({"http://d1"}))
    assert probe_decision(cfg(**HELD), feats(), blocked, Tuning(), ProbeLimiter(), 0.0) is None


# ------------------------------------------------------------------------------------------ stream start

def sse(obj: Any, compact: bool = True) -> bytes:
    text = json.dumps(obj, separators=(",", ":")) if compact else json.dumps(obj)
    return b"data: " + text.encode() + b"\n\n"


ROLE = sse({"id": "c", "object": "chat.completion.chunk", "choices": [
    {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}],
    "prompt_token_ids": None, "prompt_text": None})
# vLLM 0.33.0's in-stream GenerationError: compact on chat, json.dumps with spaces on completions
ERR = {"error": {"message": "Internal server error", "type": "InternalServerError", "param": None, "code": 500}}
TOKEN_CHAT = sse({"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]})
TOKEN_TEXT = sse({"choices": [{"index": 0, "text": " Hi", "finish_reason": None}]}, compact=False)


@pytest.mark.parametrize("chunks,verdict", [
    ([ROLE + sse(ERR) + b"data: [DONE]\n\n"], ERROR),
    ([ROLE, sse(ERR)], ERROR),
    ([sse(ERR, compact=False), b"data: [DONE]\n\n"], ERROR),
    ([ROLE[:30], ROLE[30:], TOKEN_CHAT], COMMIT),
    ([ROLE], HOLD),
    ([TOKEN_TEXT], COMMIT),
    ([sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "error"}]})], ERROR),
    ([ROLE, sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})], COMMIT),
    ([b": keep-alive\n\n", b"data: [DONE]\n\n"], COMMIT),
    ([ROLE, sse({"choices": [{"index": 0, "delta": {"tool_calls": [{"id": "t"}]}, "finish_reason": None}]})],
     COMMIT),
])
def test_stream_start_holds_token_less_events_until_token_or_error(chunks: list[bytes], verdict: str) -> None:
    s = StreamStart()
    got = HOLD
    fed = 0
    for c in chunks:
        got = s.feed(c)
        fed += 1
        if got != HOLD:
            break
    assert got == verdict
    assert s.buf == b"".join(chunks[:fed])  # everything held is relayed on commit, nothing lost


def test_stream_start_commits_when_the_held_prefix_grows_too_large() -> None:
    s = StreamStart()
    assert s.feed(b"data: " + b"x" * 70_000) == COMMIT


def test_stream_account_flags_errors_mid_stream_across_chunk_boundaries() -> None:
    a = StreamAccount(chat=True)
    a.feed(TOKEN_CHAT)
    assert not a.error
    err = sse(ERR)
    a.feed(err[:12])
    a.feed(err[12:] + b"data: [DONE]\n\n")
    assert a.error and a.done
    ok = StreamAccount(chat=False)
    ok.feed(TOKEN_TEXT + b'data: {"choices":[{"text":"the word \\"error\\" in text"}]}\n\ndata: [DONE]\n\n')
    assert not ok.error


def test_non_streamed_error_shapes() -> None:
    body = json.dumps(ERR, separators=(",", ":")).encode()
    assert is_generation_error(500, body)
    assert not is_generation_error(500, b'{"error":{"message":"injected server error","type":"InternalServerError"}}')
    assert not is_generation_error(502, body)
    assert has_error_finish(b'{"choices":[{"index":0,"text":"","finish_reason":"error"}]}')
    assert not has_error_finish(b'{"choices":[{"index":0,"text":"error","finish_reason":"stop"}]}')

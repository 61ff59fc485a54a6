"""How far the router's prompt-token estimate is from the engines' own counts (router/tokenscale.py), and the answers
it learns from read the way vLLM writes them (usage.prompt_tokens, not prompt_tokens_details)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from disagg.router.proxy import StreamAccount, usage_prompt_tokens
from disagg.router.tokenscale import BOUNDS, PRIOR_TOKENS, WINDOW_TOKENS, PromptTokenScale


def test_the_flag_holds_until_an_engine_counts():
    s = PromptTokenScale()
    assert s.factor == 1.0


def test_it_learns_a_steady_ratio_and_the_count_follows():
    s = PromptTokenScale()
    for _ in range(400):  # code: the engine counts 1.3 tokens where the router estimates 1
        s.observe(1500, 1950)
    assert s.factor == pytest.approx(1.3, rel=0.01)


def test_a_few_prompts_move_it_from_the_prior():
    s = PromptTokenScale()
    s.observe(2000, 1000)
    # the prior weighs PRIOR_TOKENS: one 2000-token answer at half the estimate moves the factor a tenth at once
    prior = PRIOR_TOKENS * (1 - 2000 / WINDOW_TOKENS)
    assert s.factor == pytest.approx((prior + 1000) / (prior + 2000), rel=0.01)
    for _ in range(4):
        s.observe(2000, 1000)
    assert s.factor < 0.75


def test_it_follows_a_change_of_traffic():
    s = PromptTokenScale()
    for _ in range(300):
        s.observe(1000, 800)
    assert s.factor == pytest.approx(0.8, rel=0.02)
    for _ in range(2000):  # about 8 windows of the new traffic
        s.observe(1000, 1400)
    assert s.factor == pytest.approx(1.4, rel=0.02)


def test_long_prompts_weigh_more_than_short_ones():
    s = PromptTokenScale()
    for _ in range(50):
        s.observe(4000, 6000)  # ×1.5 on long prompts
        s.observe(40, 20)  # ×0.5 on short ones
    assert s.factor > 1.4


def test_nonsense_is_ignored_and_the_factor_is_bounded():
    s = PromptTokenScale()
    s.observe(0, 100)
    s.observe(100, 0)
    s.observe(-5, 10)
    assert s.observations == 0 and s.factor == 1.0
    for _ in range(500):
        s.observe(1000, 1_000_000)
    assert s.factor == BOUNDS[1]


@given(st.lists(st.tuples(st.integers(1, 100_000), st.integers(1, 100_000)), max_size=50))
def test_the_factor_stays_within_its_bounds(pairs):
    s = PromptTokenScale()
    for est, counted in pairs:
        s.observe(est, counted)
        assert BOUNDS[0] <= s.factor <= BOUNDS[1]


def _usage(prompt: int, cached: int | None = None) -> dict:
    u: dict = {"prompt_tokens": prompt, "total_tokens": prompt + 5, "completion_tokens": 5}
    if cached is not None:  # vLLM's PromptTokenUsageInfo, written before prompt_tokens in no order we rely on
        u = {"prompt_tokens_details": {"cached_tokens": cached}, **u}
    return u


def test_usage_prompt_tokens_reads_vllms_usage_and_not_the_details():
    body = json.dumps({"id": "cmpl-1", "choices": [], "usage": _usage(1234, cached=512)}).encode()
    assert usage_prompt_tokens(body) == 1234
    assert usage_prompt_tokens(b'{"usage": {"prompt_tokens_details": {"cached_tokens": 7}}}') is None
    assert usage_prompt_tokens(b'{"usage": null}') is None


def test_a_stream_with_include_usage_reports_the_prompt():
    acct = StreamAccount(chat=False)
    acct.feed(b'data: {"choices": [{"text": "a"}]}\n\n')
    assert acct.prompt_tokens is None
    last = json.dumps({"choices": [], "usage": _usage(321, cached=0)})
    acct.feed(f"data: {last}\n\ndata: [DONE]\n\n".encode())
    assert acct.prompt_tokens == 321
    assert acct.tokens == 5  # usage.completion_tokens wins over the event count

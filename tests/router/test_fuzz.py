"""No input crashes the router: property tests of request parsing, and random bodies through the server."""

from __future__ import annotations

import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from disagg.router import features
from disagg.router.load import parse_prometheus
from disagg.router.proxy import StreamAccount

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=50),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=20,
)
bodies = st.dictionaries(
    st.sampled_from(["prompt", "messages", "max_tokens", "max_completion_tokens", "stream", "model", "x"]),
    json_values, max_size=5)


@settings(max_examples=300, deadline=None)
@given(body=bodies, endpoint=st.sampled_from(features.ENDPOINTS))
def test_parsing_only_raises_bad_request(body, endpoint):
    try:
        view = features.prompt_view(endpoint, body)
        features.requested_max_tokens(body)
    except features.BadRequestError as e:
        assert e.code == 400 and e.message
        return
    n = features.count_input_tokens(view)
    assert n >= 0
    hashes = features.prefix_block_hashes(view)
    assert len(hashes) <= features.MAX_PREFIX_BLOCKS


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=3000))
def test_prefix_hashes_are_chained_prefixes(text):
    a = features.prefix_block_hashes(features.PromptView(text, None, 0))
    b = features.prefix_block_hashes(features.PromptView(text + "suffix" * 20, None, 0))
    assert b[: len(a)] == a


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=2000))
def test_prometheus_parser_tolerates_garbage(text):
    parse_prometheus(text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 40), max_size=30), st.integers(0, 20))
def test_stream_account_counts_events_across_any_split(cuts, n):
    stream = b"".join(b'data: {"choices":[{"text":"t%d"}]}\n\n' % i for i in range(n)) + b"data: [DONE]\n\n"
    acct = StreamAccount(chat=False)
    pos = 0
    for c in cuts:
        acct.feed(stream[pos:pos + c], now=float(pos))
        pos += c
    acct.feed(stream[pos:], now=float(pos))
    assert acct.events == n or (acct.events == n + 1 and not acct.done)  # a split "[DONE]" may count once
    assert acct.tokens >= n


async def test_random_bodies_through_server(fake_workers, router_factory):
    d = await fake_workers("decode")
    r = await router_factory([], [d.url])
    rng = random.Random(1234)

    def rand_value(depth=0):
        k = rng.randrange(8 if depth < 3 else 5)
        makers = [lambda: None, lambda: True, lambda: rng.randint(-5, 10**6), rng.random,
                  lambda: "x" * rng.randrange(20),
                  lambda: [rand_value(depth + 1) for _ in range(rng.randrange(4))],
                  lambda: {rng.choice(["role", "content", "text", "type"]): rand_value(depth + 1) for _ in range(3)},
                  lambda: [{"role": "user", "content": rand_value(depth + 1)}]]
        return makers[k]()

    for i in range(150):
        body = {k: rand_value() for k in rng.sample(["prompt", "messages", "max_tokens", "stream", "model",
                                                     "stream_options", "max_completion_tokens"], rng.randrange(1, 5))}
        path = rng.choice(features.ENDPOINTS)
        data = json.dumps(body).encode()
        if i % 10 == 0:
            data = data[: rng.randrange(len(data))]  # truncated JSON
        status, out = await r.post(path, data)
        assert status in (200, 400, 404, 413), (status, body, out)
        if status != 200:
            assert "error" in json.loads(out)

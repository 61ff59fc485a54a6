"""Workload mixes are deterministic and sized as declared; summaries compute goodput against the SLOs."""

from __future__ import annotations

from disagg.load.loadgen import Result, percentile, summarise
from disagg.load.workload import MIXES, generate
from disagg.sim import tokenizer


def test_deterministic_and_sized() -> None:
    a = generate(MIXES["mixed"], 3.0, 30, "m", seed=7)
    b = generate(MIXES["mixed"], 3.0, 30, "m", seed=7)
    assert [r.body for r in a] == [r.body for r in b]
    assert {r.cls for r in a} == {"rag", "chat", "stream"}
    for r in a[:20]:
        assert tokenizer.count(r.body["messages"][0]["content"]) == r.input_tokens
    assert all(0 < r.at < 30 for r in a) and [r.at for r in a] == sorted(r.at for r in a)


def test_rag_prompts_share_prefixes() -> None:
    reqs = [r for r in generate(MIXES["long-rag"], 5.0, 30, "m") if r.cls == "rag"]
    heads = {r.body["messages"][0]["content"][:2000] for r in reqs}
    assert len(heads) <= 4 < len(reqs)


def test_summary_goodput() -> None:
    rs = [Result("a", "c", "t", 10, status=200, ttft_s=0.1, tpot_s=0.01),
          Result("b", "c", "t", 10, status=200, ttft_s=2.0, tpot_s=0.01),
          Result("c", "c", "t", 10, status=200, ttft_s=0.1, tpot_s=0.2),
          Result("d", "c", "t", 10, status=500, error="boom")]
    s = summarise(rs, ttft_slo_ms=1000, tpot_slo_ms=50)
    assert s.goodput == 0.25 and s.errors == 1 and s.requests == 4
    assert percentile([1, 2, 3, 4], 0.5) == 2 and percentile([], 0.5) is None


def test_prompts_read_like_prose_to_the_router() -> None:
    """The router's raw text estimate (utf-8 bytes ÷ 4) of the workloads' prompts is within a few % of the
    simulator tokenizer's count, as on real English prose (~4.2 bytes a Llama 3 token): a benchmark on this text
    measures the placement under the count error real traffic gives, not the ×1.55 of the former long words."""
    from disagg.router import features

    for mix in MIXES.values():
        reqs = generate(mix, 5.0, 20, "m", seed=3)
        estimated = counted = 0
        for r in reqs:
            view = features.prompt_view(r.path, r.body)
            estimated += features.count_input_tokens(view)
            counted += (len(tokenizer.encode_chat(r.body["messages"])) if "messages" in r.body
                        else 1 + tokenizer.count(r.body["prompt"]))
        assert 1.0 <= estimated / counted <= 1.12, (mix.name, estimated / counted)


def test_the_fast_word_draw_is_the_word_by_word_one_to_the_last_draw() -> None:
    """workload._words draws Mersenne Twister outputs in bulk: the same text as ``rng.choice`` word by word, and the
    generator left where the loop leaves it (the arrivals after a prompt depend on it)."""
    import random

    from disagg.load import workload

    def by_word(rng: random.Random, n: int) -> str:
        return "".join(" " + rng.choice(workload._WORDS) for _ in range(n))

    for seed in range(50):
        for n in (1, 2, 5, 64, 3000):
            fast, slow = random.Random(seed), random.Random(seed)
            assert workload._words(fast, n) == by_word(slow, n)
            assert fast.getstate() == slow.getstate()

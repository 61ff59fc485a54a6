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

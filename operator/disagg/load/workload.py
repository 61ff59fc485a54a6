"""Workload mixes: long RAG prompts, short chats, long streams, several tenants.

Deterministic for a seed: the same mix, rate and seed give the same requests in the same order. Prompt text is
made of common English words, one token each for the simulator's tokenizer stand-in (and for Llama 3's and Qwen's
BPE vocabularies), so a prompt's length in tokens is its word count. The words average 4.27 bytes with their leading
space, English prose's ~4.2 bytes per token, so the router's text estimate (utf-8 bytes ÷ 4, router/features.py)
counts these prompts as it would count real ones: ×1.07 the engine's count. (Until 2026-12 the words averaged 6.2
bytes, the router over-counted them ×1.55, and the placement was validated under that error; docs/router.md
"Input tokens".) RAG prompts share a per-corpus document prefix, as retrieval over a shared corpus does, so prefix
caching has something to hit.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

# 26 words, each with its leading space one token; mean 4.27 bytes (tests/bench/test_workload.py)
_WORDS = ("the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "cache", "token", "model", "batch", "query",
          "prompt", "decode", "stream", "with", "on", "as", "by", "we", "be", "at", "or")


@dataclass(frozen=True)
class RequestClass:
    name: str
    weight: float
    input_tokens: tuple[int, int]  # uniform range
    output_tokens: tuple[int, int]
    tenant: str = "default"
    shared_prefix_tokens: int = 0  # tokens of a shared document prefix (prefix-cache friendly)
    prefixes: int = 4  # distinct shared prefixes
    stream: bool = True
    chat: bool = True


@dataclass(frozen=True)
class Mix:
    name: str
    description: str
    classes: tuple[RequestClass, ...]
    # a mix that shifts during the run: from ``shift_at`` (a share of the arrival window) requests are drawn from
    # ``then`` instead of ``classes`` (the traffic a deployment sized for one mix meets after lunch)
    then: tuple[RequestClass, ...] = ()
    shift_at: float = 0.5


MIXES: dict[str, Mix] = {
    "short-chat": Mix("short-chat", "interactive chat: short prompts, short answers", (
        RequestClass("chat", 1.0, (64, 512), (32, 192), tenant="chat"),
    )),
    "long-rag": Mix("long-rag", "long-context RAG: 6–12k-token prompts with shared documents, medium answers", (
        RequestClass("rag", 0.8, (6000, 12000), (128, 384), tenant="rag", shared_prefix_tokens=4000),
        RequestClass("chat", 0.2, (64, 384), (64, 160), tenant="chat"),
    )),
    "mixed": Mix("mixed", "mixed: long RAG prompts next to short chats and long streams", (
        RequestClass("rag", 0.3, (4000, 10000), (128, 256), tenant="rag", shared_prefix_tokens=3000),
        RequestClass("chat", 0.45, (64, 512), (32, 192), tenant="chat"),
        RequestClass("stream", 0.25, (128, 1024), (512, 1024), tenant="stream"),
    )),
    # IDE code completion: a file's context as the prompt, a few tokens of answer, not chat (issue 27's
    # "short outputs with mid-length prompts": ≈1.5k in / ≈15 out)
    "code-completion": Mix("code-completion", "code completion: ≈1.5k-token prompts, ≈15-token answers", (
        RequestClass("completion", 1.0, (1000, 2000), (8, 24), tenant="code", chat=False),
    )),
    "shifting": Mix("shifting", "a mix that shifts: RAG-heavy for the first half, then chat-heavy", (
        RequestClass("rag", 0.7, (4000, 10000), (128, 256), tenant="rag", shared_prefix_tokens=3000),
        RequestClass("chat", 0.3, (64, 512), (32, 192), tenant="chat"),
    ), then=(
        RequestClass("rag", 0.1, (4000, 10000), (128, 256), tenant="rag", shared_prefix_tokens=3000),
        RequestClass("chat", 0.7, (64, 512), (32, 192), tenant="chat"),
        RequestClass("stream", 0.2, (128, 1024), (512, 1024), tenant="stream"),
    )),
}

# Held out (2026-12-06): traffic shapes that no default, threshold or rate ladder of the product was chosen or
# checked on before they were added, run by `disagg bench goodput --heldout` (docs/benchmarks.md §1, "Held-out
# mixes") to see whether the policy holds for its reasons rather than for the mixes it was developed on. Not in
# MIXES: the main goodput table and its drain limit stay as they were. Outputs stay within MIXES' longest (1024),
# so the same drain limit scores them (bench/goodput.py ``drain_s``).
HELDOUT_MIXES: dict[str, Mix] = {
    # summarisation / classification: a document in, a few lines out, no document shared between requests
    "summarise": Mix("summarise", "summarisation: 3–8k-token prompts, 32–96-token answers, nothing shared", (
        RequestClass("summary", 1.0, (3000, 8000), (32, 96), tenant="summary", chat=False),
    )),
    # agents and multi-turn tools: long prompts that repeat one of a few system prompts + tool schemas, beside chat
    "agentic": Mix("agentic", "agents: 3–8k-token prompts with a 2.5k-token prefix shared by 8, beside chat", (
        RequestClass("agent", 0.7, (3000, 8000), (64, 256), tenant="agent", shared_prefix_tokens=2500, prefixes=8),
        RequestClass("chat", 0.3, (64, 512), (32, 192), tenant="chat"),
    )),
    # reasoning models: a short question, a long chain of thought streamed back
    "reasoning": Mix("reasoning", "reasoning: 200–1000-token prompts, 512–1024-token answers", (
        RequestClass("reason", 1.0, (200, 1000), (512, 1024), tenant="reason"),
    )),
    # long-document chat: a few very long prompts (12–24k) among many short chats
    "longdoc": Mix("longdoc", "long documents: 12–24k-token prompts (30 %) among short chats", (
        RequestClass("document", 0.3, (12000, 24000), (200, 400), tenant="document"),
        RequestClass("chat", 0.7, (64, 512), (32, 192), tenant="chat"),
    )),
}
ALL_MIXES: dict[str, Mix] = {**MIXES, **HELDOUT_MIXES}  # every mix the goodput benchmark and the twin accept by name


def longest_meetable_s(ttft_ms: float, tpot_ms: float) -> float:
    """How long a request of :data:`MIXES` can run and still meet TTFT ``ttft_ms`` and TPOT ``tpot_ms``: the TTFT
    and a TPOT per output token after the first, for the longest output any of them asks for (seconds). A request
    still unfinished later cannot meet that SLO."""
    longest = max(c.output_tokens[1] for m in MIXES.values() for c in m.classes + m.then)
    return (ttft_ms + (longest - 1) * tpot_ms) / 1000.0


# not in MIXES (the goodput benchmark's table): e2e/test_soak.py's steady load
SOAK = Mix("soak", "the soak's steady mix: long prompts and short chats, streamed and not, and long streams", (
    RequestClass("rag", 0.2, (4000, 9000), (96, 256), tenant="rag", shared_prefix_tokens=3000),
    RequestClass("rag-whole", 0.1, (4000, 9000), (64, 160), tenant="rag", shared_prefix_tokens=3000,
                 stream=False),
    RequestClass("chat", 0.25, (64, 512), (32, 192), tenant="chat"),
    RequestClass("completion", 0.2, (64, 512), (32, 128), tenant="chat", stream=False, chat=False),
    RequestClass("stream", 0.25, (128, 1024), (400, 800), tenant="stream"),
))


@dataclass(frozen=True)
class Request:
    id: str
    at: float  # seconds after the start
    cls: str
    tenant: str
    input_tokens: int
    max_tokens: int
    stream: bool
    body: dict[str, Any] = field(repr=False, default_factory=dict)
    path: str = "/v1/chat/completions"


# ``rng.choice(_WORDS)`` draws one 32-bit Mersenne Twister output and keeps its top k = 5 bits (random.py
# ``_randbelow_with_getrandbits``: ``getrandbits(k)``, k = len(_WORDS).bit_length()), drawing again while they are
# ≥ len(_WORDS). ``getrandbits(32 · m)`` returns m such outputs at once, the first in the lowest 32 bits: the top
# k bits of each are those of its most significant byte, ``b >> (8 − k)``. One word per accepted byte.
_SHIFT = 8 - len(_WORDS).bit_length()
_BYTE_WORD = tuple(" " + _WORDS[b >> _SHIFT] if b >> _SHIFT < len(_WORDS) else "" for b in range(256))


def _words(rng: random.Random, n: int) -> str:
    """``"".join(" " + rng.choice(_WORDS) for _ in range(n))``, the same string and the same draws from ``rng``
    (tests/bench/test_workload.py), about ten times faster: the twin's arrivals are millions of words."""
    parts: list[str] = []
    need = n
    while need > 0:  # draw only as many outputs as the word-by-word loop would: the rng's later draws stay the same
        tops = rng.getrandbits(32 * need).to_bytes(4 * need, "little")[3::4]
        got = [w for w in map(_BYTE_WORD.__getitem__, tops) if w]
        parts.extend(got)
        need -= len(got)
    return "".join(parts)


def generate(mix: Mix, rate_per_s: float, duration_s: float, model: str, seed: int = 0) -> list[Request]:
    """Poisson arrivals at ``rate_per_s`` for ``duration_s`` seconds."""
    rng = random.Random(seed)
    prefixes = {c.name: [_words(random.Random(f"{mix.name}-{c.name}-{i}"), c.shared_prefix_tokens)
                         for i in range(c.prefixes)] for c in mix.classes + mix.then if c.shared_prefix_tokens}
    weights = [c.weight for c in mix.classes]
    then_weights = [c.weight for c in mix.then]
    out: list[Request] = []
    t, i = 0.0, 0
    while True:
        t += rng.expovariate(rate_per_s)
        if t >= duration_s:
            return out
        if mix.then and t >= mix.shift_at * duration_s:
            c = rng.choices(mix.then, then_weights)[0]
        else:
            c = rng.choices(mix.classes, weights)[0]
        n_in = rng.randint(*c.input_tokens)
        n_out = rng.randint(*c.output_tokens)
        prefix = rng.choice(prefixes[c.name]) if c.name in prefixes else ""
        text = prefix + _words(rng, max(1, n_in - c.shared_prefix_tokens))
        rid = f"{mix.name}-{seed}-{i:05d}"
        body: dict[str, Any] = {"model": model, "max_tokens": n_out, "stream": c.stream, "ignore_eos": True}
        if c.stream:
            body["stream_options"] = {"include_usage": True}
        if c.chat:
            body["messages"] = [{"role": "user", "content": text}]
            path = "/v1/chat/completions"
        else:
            body["prompt"] = text
            path = "/v1/completions"
        out.append(Request(rid, t, c.name, c.tenant, n_in, n_out, c.stream, body, path))
        i += 1

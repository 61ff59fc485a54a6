"""Arrivals: the requests a twin run replays, and how each becomes an engine prompt and router features.

An :class:`Arrival` carries what the model needs — time, input tokens as the engine counts them, output tokens,
tenant, a shared prefix — and optionally the OpenAI body. With a body (the load/workload.py mixes), the router's
features come from it exactly as ``disagg router`` computes them (router/features.py: the byte-based input-token
estimate, text prefix-block hashes, ``max_tokens``), and the engine's prompt is the sim tokenizer's
(sim/tokenizer.py) token ids, as ``disagg sim`` would see them. Without a body (recorded traffic), the router is
assumed to count tokens exactly (a configured tokenizer) and the prompt is synthetic: the first
``prefix_tokens`` ids are the same for every arrival with the same ``prefix_key``, the rest are unique to the
request; the router's prefix hashes are then the engine's own 16-token block hashes (sim/kv.py).
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..load import workload
from ..router import features
from ..sim import tokenizer
from ..sim.kv import block_hashes

DEFAULT_ENDPOINT = "/v1/chat/completions"
TWIN_MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # the model name in generated bodies (disagg.local.procs.SIM_MODEL)


@dataclass(frozen=True)
class Arrival:
    """One request of a run. ``at`` is seconds after the start (virtual time)."""

    at: float
    input_tokens: int  # prompt tokens as the engine counts them (ignored when ``body`` is given)
    output_tokens: int  # tokens generated (the request's max_tokens; the sim stops there, ignore_eos)
    tenant: str | None = None  # TenantPolicy name the router matches (None: no tenant)
    prefix_key: str | None = None  # arrivals with the same key share their first ``prefix_tokens`` tokens
    prefix_tokens: int = 0
    request_id: str = ""  # default: "twin-<index>"
    cls: str = ""  # workload class (reporting only)
    endpoint: str = DEFAULT_ENDPOINT
    stream: bool = True
    max_tokens_known: bool = True  # the client sent max_tokens (the router's expected-output feature)
    body: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.at < 0:
            raise ValueError(f"arrival {self.request_id or '?'}: at must be >= 0, got {self.at}")
        if self.body is None and self.input_tokens < 1:
            raise ValueError(f"arrival {self.request_id or '?'}: input_tokens must be >= 1, got {self.input_tokens}")
        if self.output_tokens < 1:
            raise ValueError(f"arrival {self.request_id or '?'}: output_tokens must be >= 1, got {self.output_tokens}")
        if self.prefix_tokens < 0:
            raise ValueError(f"arrival {self.request_id or '?'}: prefix_tokens must be >= 0")


@dataclass(frozen=True)
class Prepared:
    """An arrival as the twin uses it: engine prompt ids and the router's features."""

    arrival: Arrival
    request_id: str
    # 4 bytes a token (array "I"): kept with the arrival for the run, a list of ints took 36 (a whole day's twin held
    # gigabytes of them)
    prompt_ids: Sequence[int]
    router_input_tokens: int
    hashes: tuple[int, ...]
    max_tokens: int | None  # as the router reads it from the body
    # the engines' block hashes of ``prompt_ids`` by block size (sim/kv.py), computed once for every leg
    blocks: dict[int, list[bytes]] = field(default_factory=dict, repr=False, compare=False)

    def block_hashes(self, block_size: int) -> list[bytes]:
        """The chained hashes an engine with ``block_size``-token blocks computes for the prompt: the same for the
        prefill and the decode leg, so hashed once."""
        got = self.blocks.get(block_size)
        if got is None:
            got = self.blocks[block_size] = block_hashes(self.prompt_ids, block_size)
        return got


def arrivals_from_requests(requests: Iterable[workload.Request]) -> list[Arrival]:
    """load/workload.py requests (with their bodies) → arrivals."""
    return [Arrival(at=r.at, input_tokens=r.input_tokens, output_tokens=r.max_tokens, tenant=r.tenant,
                    request_id=r.id, cls=r.cls, endpoint=r.path, stream=r.stream, body=r.body) for r in requests]


def arrivals_from_mix(mix: str, rate_per_s: float, duration_s: float, *, seed: int = 0,
                      model: str = TWIN_MODEL) -> list[Arrival]:
    """Poisson arrivals of a load/workload.py mix (``workload.MIXES``, ``workload.HELDOUT_MIXES`` or ``"soak"``),
    deterministic for a seed."""
    mixes = {**workload.ALL_MIXES, "soak": workload.SOAK}
    if mix not in mixes:
        raise ValueError(f"mix: unknown workload mix {mix!r} (one of {', '.join(sorted(mixes))})")
    if rate_per_s <= 0:
        raise ValueError(f"rate: must be > 0, got {rate_per_s}")
    if duration_s <= 0:
        raise ValueError(f"duration: must be > 0, got {duration_s}")
    return arrivals_from_requests(workload.generate(mixes[mix], rate_per_s, duration_s, model, seed=seed))


# ------------------------------------------------------------------------------------------ prompts
_PIECE_IDS: dict[str, int] = {}


def _encode(text: str, vocab: int) -> list[int]:
    """sim/tokenizer.encode, fast for the workload's text (space-separated words of ≤ 6 letters, one piece each):
    the same ids, with one dict lookup per word; anything else goes through the tokenizer itself."""
    words = text.split(" ")
    if vocab != 128256 or len(words) < 2 or words[0] != "":
        return tokenizer.encode(text, vocab)
    del words[0]
    ids = list(map(_PIECE_IDS.get, words))
    if None in ids:
        for w in set(words):
            if w not in _PIECE_IDS:
                if not (0 < len(w) <= 6 and w.isascii() and w.isalpha()):
                    return tokenizer.encode(text, vocab)
                _PIECE_IDS[w] = tokenizer.encode(" " + w, vocab)[0]
        ids = list(map(_PIECE_IDS.get, words))
    return ids  # type: ignore[return-value]  # every word is in _PIECE_IDS now


def _engine_prompt(endpoint: str, body: Mapping[str, Any], vocab: int) -> list[int]:
    """What sim/server.py feeds the engine for this body (BOS, chat template, token ids)."""
    if endpoint == "/v1/chat/completions":
        msgs = body.get("messages") or []
        ids = [tokenizer.BOS_ID]
        for m in msgs:
            role = str(m.get("role", "user"))
            ids += [2, 1000 + zlib.crc32(role.encode()) % 1000, 3, 4]
            content = m.get("content")
            ids += _encode(content, vocab) if isinstance(content, str) else tokenizer.encode(
                tokenizer._content_text(content), vocab)  # noqa: SLF001 - the sim's own content flattening
            ids.append(5)
        return [*ids, 2, 1000 + zlib.crc32(b"assistant") % 1000, 3, 4]
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [tokenizer.BOS_ID, *_encode(prompt, vocab)]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    raise ValueError("body: the twin takes a chat body or a completions body with one prompt")


@lru_cache(maxsize=4096)
def _prefix_ids(key: str, n: int) -> tuple[int, ...]:
    base = zlib.crc32(key.encode())
    return tuple(1000 + (base + i * 7919) % 100_000 for i in range(n))


def _synthetic_prompt(a: Arrival, request_id: str) -> list[int]:
    n_prefix = min(a.prefix_tokens, a.input_tokens) if a.prefix_key is not None else 0
    ids = list(_prefix_ids(a.prefix_key, n_prefix)) if a.prefix_key is not None and n_prefix else []
    base = zlib.crc32(request_id.encode()) * 131
    ids += [200_000 + (base + i * 104_729) % 9_000_000 for i in range(a.input_tokens - n_prefix)]
    return ids


def prepare(a: Arrival, index: int, vocab: int) -> Prepared:
    """The arrival as the twin uses it (:class:`Prepared`: a pure function of the arrival, its index and the
    vocabulary), kept on the arrival: a benchmark that runs several configurations over the same arrivals tokenises
    and hashes each prompt once (goodput.py ``twin_run``). The engines' block hashes it computes on first use
    (:meth:`Prepared.block_hashes`) are kept with it."""
    memo = a.__dict__.get(_PREPARED)
    if memo is not None and memo[0] == (index, vocab):
        return memo[1]
    p = _prepare(a, index, vocab)
    a.__dict__[_PREPARED] = ((index, vocab), p)  # a frozen dataclass: its fields stay as they are
    return p


_PREPARED = "_twin_prepared"


def _prepare(a: Arrival, index: int, vocab: int) -> Prepared:
    rid = a.request_id or f"twin-{index:06d}"
    if a.body is not None:
        body = dict(a.body)
        view = features.prompt_view(a.endpoint, body)
        ids = array("I", _engine_prompt(a.endpoint, body, vocab))
        return Prepared(a, rid, ids, features.count_input_tokens(view), features.prefix_block_hashes(view),
                        features.requested_max_tokens(body))
    ids = array("I", _synthetic_prompt(a, rid))
    blocks = block_hashes(ids, features.PREFIX_BLOCK_TOKENS)  # the router's prefix keys are the engines' hashes
    hashes = tuple(int.from_bytes(h[:8], "little") for h in blocks[: features.MAX_PREFIX_BLOCKS])
    return Prepared(a, rid, ids, len(ids), hashes, a.output_tokens if a.max_tokens_known else None,
                    {features.PREFIX_BLOCK_TOKENS: blocks})


def check_sorted(arrivals: Sequence[Arrival]) -> None:
    for i in range(1, len(arrivals)):
        if arrivals[i].at < arrivals[i - 1].at:
            raise ValueError(f"arrivals: not sorted by time (index {i}: {arrivals[i].at} < {arrivals[i - 1].at})")

"""What the router reads from a request body: prompt text, input-token estimate, expected output, prefix blocks.

Pure functions (no I/O). The router parses the JSON body once; everything else is forwarded untouched.

Input-token estimate (documented in docs/router.md):

* ``prompt`` given as token ids (``list[int]`` or ``list[list[int]]``): the exact count.
* text: ``ceil(utf8_bytes / chars_per_token)`` (default 4.0, the usual figure for English BPE vocabularies),
  plus ``CHAT_MESSAGE_OVERHEAD`` tokens per chat message for the chat template.
* when a real tokenizer is configured (``--tokenizer path/to/tokenizer.json`` with the ``tokenizers`` package
  installed) it replaces the estimate for text prompts.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
CHAT_MESSAGE_OVERHEAD = 4
DEFAULT_CHARS_PER_TOKEN = 4.0
# Prefix blocks: vLLM's default KV block is 16 tokens; at ~4 bytes per token a text block is 64 bytes.
PREFIX_BLOCK_TOKENS = 16
MAX_PREFIX_BLOCKS = 4096  # hash at most this many blocks of a prompt (64k tokens); longer prompts: the head only


class BadRequestError(ValueError):
    """The body is not a valid OpenAI request (→ 400 with an OpenAI-style error object)."""

    def __init__(self, message: str, param: str | None = None, code: int = 400,
                 type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.type = type_


@dataclass(frozen=True)
class PromptView:
    """The prompt as the router sees it: text (for estimates and hashing) or token ids (exact)."""

    text: str | None
    token_ids: tuple[int, ...] | None
    messages: int  # chat messages (0 for completions)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def prompt_view(endpoint: str, body: dict[str, Any]) -> PromptView:
    """Extract the prompt of a completions or chat request; raises BadRequestError on wrong shapes."""
    if endpoint == "/v1/chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequestError("'messages' must be a non-empty array", "messages")
        parts: list[str] = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise BadRequestError(f"messages[{i}] must be an object", "messages")
            role = m.get("role")
            if not isinstance(role, str):
                raise BadRequestError(f"messages[{i}].role must be a string", "messages")
            content = m.get("content")
            parts.append(f"<|{role}|>")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                for p in content:
                    if isinstance(p, dict) and isinstance(p.get("text"), str):
                        parts.append(p["text"])
            elif content is not None:
                raise BadRequestError(f"messages[{i}].content must be a string or an array", "messages")
        return PromptView(text="\n".join(parts), token_ids=None, messages=len(messages))
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return PromptView(text=prompt, token_ids=None, messages=0)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return PromptView(text="\n".join(prompt), token_ids=None, messages=0)
        if all(_is_int(t) for t in prompt):
            return PromptView(text=None, token_ids=tuple(prompt), messages=0)
        if all(isinstance(p, list) and all(_is_int(t) for t in p) for p in prompt):
            return PromptView(text=None, token_ids=tuple(t for p in prompt for t in p), messages=0)
    raise BadRequestError("'prompt' must be a string, an array of strings, or an array of token ids", "prompt")


Tokenize = Callable[[str], int]


def count_input_tokens(view: PromptView, chars_per_token: float = DEFAULT_CHARS_PER_TOKEN,
                       tokenize: Tokenize | None = None) -> int:
    if view.token_ids is not None:
        return len(view.token_ids)
    text = view.text or ""
    if tokenize is not None:
        n = tokenize(text)
    else:
        n = math.ceil(len(text.encode("utf-8", "surrogatepass")) / max(chars_per_token, 0.1))
    return n + CHAT_MESSAGE_OVERHEAD * view.messages


def requested_max_tokens(body: dict[str, Any]) -> int | None:
    """max_completion_tokens (chat) or max_tokens, when the client set one."""
    for key in ("max_completion_tokens", "max_tokens"):
        v = body.get(key)
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise BadRequestError(f"'{key}' must be a non-negative integer", key)
        return v
    return None


def prefix_block_hashes(view: PromptView, chars_per_token: float = DEFAULT_CHARS_PER_TOKEN,
                        block_tokens: int = PREFIX_BLOCK_TOKENS, max_blocks: int = MAX_PREFIX_BLOCKS
                        ) -> tuple[int, ...]:
    """Chained hashes of the prompt's full blocks, like vLLM's prefix cache (a block's hash covers all before it).

    Text is cut every ``block_tokens × chars_per_token`` bytes (an estimate of the token boundary); token ids are
    cut every ``block_tokens`` ids. Only full blocks count (vLLM caches full blocks only).
    """
    if view.token_ids is not None:
        return tuple(token_block_keys(view.token_ids, block_tokens, max_blocks=max_blocks))
    data = (view.text or "").encode("utf-8", "surrogatepass")
    step = max(1, int(block_tokens * chars_per_token))
    out: list[int] = []
    prev = b""
    for start in range(0, min(len(data) // step, max_blocks) * step, step):
        h = hashlib.blake2b(prev + data[start:start + step], digest_size=8).digest()
        out.append(int.from_bytes(h, "little"))
        prev = h
    return tuple(out)


def _token_bytes(ids: Sequence[int]) -> bytes:
    try:
        return array("I", ids).tobytes()  # 4 bytes little-endian each on every platform CPython runs on here
    except OverflowError:  # an id outside 0 … 2**32-1 (not a real vocabulary's): spelled out
        return b"".join(t.to_bytes(4, "little", signed=False) if 0 <= t < 2**32 else str(t).encode() for t in ids)


def token_block_keys(token_ids: Sequence[int], block_tokens: int, parent: int | None = None,
                     max_blocks: int = MAX_PREFIX_BLOCKS, extra: Sequence[Any] | None = None) -> list[int]:
    """Chained keys of the full blocks of ``token_ids`` (``block_tokens`` ids each): a block's key covers its ids
    and its parent's key (``parent``: the key of the block before the first one; None at the prompt's start), as
    vLLM's block hash covers its tokens and its parent's hash (``hash_block_tokens`` in
    ``vllm/v1/core/kv_cache_utils.py``, 0.33.0). The router's own hash of the same contents, so that a request's
    token ids and the token ids in an engine's ``BlockStored`` events give the same keys whatever hash function
    and seed the engine uses (kvindex.py). ``extra``: per block, vLLM's extra keys (LoRA, multimodal, cache
    salt), mixed in so such blocks never match a plain prompt."""
    out: list[int] = []
    prev = b"" if parent is None else parent.to_bytes(8, "little")
    n = min(len(token_ids) // block_tokens, max_blocks)
    buf = _token_bytes(token_ids[:n * block_tokens])
    step = len(buf) // n if n else 0  # 4 bytes per id (more when an id had to be spelled out: then per block)
    blake = hashlib.blake2b
    for i in range(n):
        if step == 4 * block_tokens:
            data = buf[i * step:(i + 1) * step]
        else:
            data = _token_bytes(token_ids[i * block_tokens:(i + 1) * block_tokens])
        if extra is not None and i < len(extra) and extra[i] is not None:
            data += b"\x00extra" + repr(extra[i]).encode()
        prev = blake(prev + data, digest_size=8).digest()
        out.append(int.from_bytes(prev, "little"))
    return out


def match_tenant(headers: Any, tenants: Iterable[Any]) -> Any | None:
    """The first TenantPolicy whose header carries one of its values (exact match), else None."""
    for t in tenants:
        v = headers.get(t.match.header)
        if v is not None and v in t.match.values:
            return t
    return None


def tenant_named(name: str | None, tenants: Iterable[Any]) -> Any | None:
    """The TenantPolicy called ``name``, else None: the twin's arrivals and replayed request logs carry the tenant
    the router matched (its log line's ``tenant``), not the headers it matched on."""
    if name is None:
        return None
    return next((t for t in tenants if t.name == name), None)


def request_hash_fraction(request_id: str) -> float:
    """A deterministic number in [0, 1) per request id (canary slice membership)."""
    h = hashlib.blake2b(request_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64

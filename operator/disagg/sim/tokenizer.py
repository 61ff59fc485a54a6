"""A deterministic tokenizer stand-in (no vocabulary files, no network).

Splits text the way byte-level BPE tokenizers roughly do on English: a word with its leading space is one
token up to 6 letters and one more per further 6 letters; digits go in groups of up to 3; each
punctuation mark is a token; runs of whitespace (newlines, indentation) are one token. On ordinary English
prose that gives ~4.2 characters and ~1.3 tokens per word, close to Llama 3's and Qwen's tokenizers
(docs/simulator.md). Token ids are CRC32 of the piece modulo the vocabulary: identical text → identical
ids in every process, which is what prefix caching by block hash needs.

Chat prompts get a fixed per-message template overhead like Llama 3's chat template.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable
from typing import Any

_PIECE = re.compile(r" ?[^\W\d_]{1,6}|[^\W\d_]{1,6}| ?\d{1,3}| ?[^\w\s]|\s+")

BOS_ID = 1
# <|start_header_id|>role<|end_header_id|>\n\n ... <|eot_id|>  → 5 template tokens per message
CHAT_TOKENS_PER_MESSAGE = 5
# <|start_header_id|>assistant<|end_header_id|>\n\n
CHAT_GENERATION_PROMPT_TOKENS = 4

_WORDS = ("the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be", "at",
          "by", "this", "from", "or", "which", "model", "token", "cache", "decode", "prefill", "batch")


def pieces(text: str) -> list[str]:
    return _PIECE.findall(text)


def encode(text: str, vocab: int = 128256) -> list[int]:
    span = max(vocab - 1000, 1000)
    return [1000 + zlib.crc32(p.encode()) % span for p in _PIECE.findall(text)]


def count(text: str) -> int:
    return sum(1 for _ in _PIECE.finditer(text))


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content)


def encode_chat(messages: Iterable[dict[str, Any]], vocab: int = 128256,
                add_generation_prompt: bool = True) -> list[int]:
    ids = [BOS_ID]
    for msg in messages:
        role = str(msg.get("role", "user"))
        ids += [2, 1000 + zlib.crc32(role.encode()) % 1000, 3, 4]
        ids += encode(_content_text(msg.get("content")), vocab)
        ids.append(5)
    if add_generation_prompt:
        ids += [2, 1000 + zlib.crc32(b"assistant") % 1000, 3, 4]
    return ids


def synthetic_piece(request_seed: int, index: int) -> str:
    """Text of the index-th generated token: a deterministic word with a leading space."""
    return " " + _WORDS[(request_seed * 31 + index * 17) % len(_WORDS)]

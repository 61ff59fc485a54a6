"""How far the router's prompt-token estimate is from the engines' own counts. PURE: no I/O, no clock.

Without a tokenizer (``--tokenizer``) the router estimates a text prompt's tokens from its UTF-8 bytes
(``--chars-per-token``, 4.0: features.py). The right figure depends on the traffic, not only the vocabulary: English
prose runs ~4.2 bytes per Llama-3 token, source code and JSON 3–3.5, CJK text 2–3. Every cost the placement prices
scales with the prompt (prefill steps, the backlog clock, the prefill traffic a decode worker receives, KV transfer),
and the ladder's thresholds are in tokens, so a bias in the count is a bias in every decision.

The engine counts every prompt exactly and says so in its answer's ``usage.prompt_tokens`` (vLLM's
``UsageInfo``, vllm/entrypoints/serve/engine/protocol.py, 0.33.0): always on the prefill leg (a non-streamed
``max_tokens: 1`` request), on non-streamed answers, and in a stream's last chunk when the client asked for
``stream_options.include_usage``. Each such answer adds to :class:`PromptTokenScale` the engine's count and the
router's estimate of the same prompt — token-weighted, exponentially decayed sums, so long prompts (the ones whose
cost matters) weigh most and a change of traffic shows within ~:data:`WINDOW_TOKENS` estimated tokens — and their
ratio is published as ``disagg_prompt_token_scale``.

It is **applied**: each text prompt's estimate is multiplied by the scale learned so far, and so are the prefix
estimate's matches (blocks cut by bytes, in the same units), so the thresholds and every cost the placement prices
see engine tokens on any traffic (core.py ``count_prompt``). The request log's ``input_tokens`` is the scaled figure.
(Until 2026-12 it was measured only: the twin's workloads were then text the router over-counted ×1.55, and the
thresholds and harm model had been validated under that error; the workloads now read like prose, load/workload.py.)
"""

from __future__ import annotations

import math

# the estimated tokens over which an observation's weight falls to 1/e (~170 prompts of 1.5k tokens)
WINDOW_TOKENS = 262_144.0
# the flag's own figure counts as this many estimated tokens of evidence at the start (a few prompts move it)
PRIOR_TOKENS = 8_192.0
# the learned scale stays within these (a stray answer cannot make the router count 10× the tokens)
BOUNDS = (0.25, 4.0)


class PromptTokenScale:
    """Engine-counted ÷ estimated prompt tokens, learned from the engines' answers (module docstring)."""

    def __init__(self) -> None:
        self.counted = PRIOR_TOKENS
        self.estimated = PRIOR_TOKENS
        self.observations = 0

    @property
    def factor(self) -> float:
        lo, hi = BOUNDS
        return min(hi, max(lo, self.counted / self.estimated))

    def observe(self, estimated: int, counted: int) -> None:
        """One answer: the engine counted ``counted`` tokens in a prompt the router estimated at ``estimated``."""
        if estimated <= 0 or counted <= 0:
            return
        keep = math.exp(-estimated / WINDOW_TOKENS)
        self.counted = self.counted * keep + counted
        self.estimated = self.estimated * keep + estimated
        self.observations += 1

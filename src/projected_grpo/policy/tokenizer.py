"""Byte-level BPE tokenizer trained in-process, with Qwen3's special tokens and chat template (thinking off).

Used by the model organism (trained on its own corpus) and by `tiny.py`. Everything downstream renders prompts with
`tokenizer.apply_chat_template(..., enable_thinking=False)` (model.render_prompt), so a hub Qwen3 tokenizer and ours
are interchangeable.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD = "<|endoftext|>"
BOS_TURN = "<|im_start|>"
EOS = "<|im_end|>"
THINK, END_THINK = "<think>", "</think>"
# Fixed ids 0..4, in this order. <think>/</think> are atomic but not "special" (as in Qwen3), so
# decode(skip_special_tokens=True) keeps them while dropping <|im_end|> / <|endoftext|>.
SPECIAL_TOKENS = (PAD, BOS_TURN, EOS)
THINK_TOKENS = (THINK, END_THINK)

# Qwen2/Qwen3's pre-tokenizer split: words, single digits, punctuation runs, newline runs, whitespace runs.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3's template reduced to what we use: one `<|im_start|>{role}\n{content}<|im_end|>\n` per message; the generation
# prompt opens the assistant turn and, with enable_thinking=False, pre-fills an empty think block (exactly as Qwen3).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts` (deterministic for the same texts) and wrap it as a Qwen3-style tokenizer.

    `vocab_size` counts the 256 byte symbols and the 5 added tokens; it must be >= 261.
    """
    n_fixed = 256 + len(SPECIAL_TOKENS) + len(THINK_TOKENS)
    if vocab_size < n_fixed:
        raise ValueError(f"vocab_size={vocab_size} is too small: byte-level BPE needs at least {n_fixed}")
    tok = Tokenizer(models.BPE())  # no unk: every byte is in the alphabet, so any string round-trips
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[*SPECIAL_TOKENS, *THINK_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    # The trainer marks every token it is given as special; Qwen3 keeps <think>/</think> non-special.
    d = json.loads(tok.to_str())
    for t in d["added_tokens"]:
        t["special"] = t["content"] in SPECIAL_TOKENS
    return wrap_tokenizer(Tokenizer.from_str(json.dumps(d)))


def wrap_tokenizer(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a `tokenizers.Tokenizer` holding our added tokens: Qwen3 special tokens, chat template, no BOS."""
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        additional_special_tokens=[BOS_TURN],
        clean_up_tokenization_spaces=False,  # True would rewrite " ." -> "." and break code round-trips
        model_max_length=1 << 20,
    )
    out.chat_template = CHAT_TEMPLATE
    return out

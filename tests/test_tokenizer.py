"""Tests for tokenizer.py (byte-level BPE + Qwen3 chat template) and the tiny tokenizer built on it.

Covers: exact decode round-trips of code and of real leetcode/minileet prompts, Qwen3 special tokens (ids, which are
"special"), the chat template (thinking off/on), BPE determinism, save/load. Run: `pytest tests/test_tokenizer.py -q`.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from projected_grpo.env.minileet import make_minileet
from projected_grpo.env.problems import CODE_SYSTEM_PROMPT, SETUP_CODE
from projected_grpo.policy.model import render_prompt
from projected_grpo.policy.tiny import tiny_tokenizer
from projected_grpo.policy.tokenizer import CHAT_TEMPLATE, train_tokenizer

CODE = (
    "```python\nclass Solution:\n    def f(self, s: str) -> int:\n\tx  =  '`'  # two  spaces\n"
    "        return len(s.strip())   \n\n\n```\n    trailing   \n\r\n ≤ 10⁵ — naïve ✓ \x00"
)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.mark.parametrize(
    "text",
    [
        CODE,  # spaces, tabs, blank lines, backticks, CRLF, unicode, NUL
        SETUP_CODE,  # the benchmark preamble
        "   leading and trailing spaces   ",  # byte-level BPE must not add or eat a prefix space
        "",  # empty string
    ],
)
def test_decode_round_trips_code(tok, text):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_round_trips_real_prompts(tok, leetcode):
    minileet = make_minileet(seed=0, n_train=3, n_test=1, n_holdout=1)["train"]
    for p in leetcode[:5] + minileet:
        for m in p.prompt:
            assert tok.decode(tok(m["content"], add_special_tokens=False)["input_ids"]) == m["content"], p.id
        rendered = render_prompt(tok, p.prompt)
        assert tok.decode(tok(rendered, add_special_tokens=False)["input_ids"]) == rendered, p.id


def test_special_tokens(tok):
    assert (tok.pad_token, tok.eos_token, tok.bos_token) == ("<|endoftext|>", "<|im_end|>", None)
    assert [tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    # every added token is one atomic id, even glued to text
    ids = tok("x<|im_start|>y<think>z</think><|im_end|>", add_special_tokens=False)["input_ids"]
    for t in ("<|im_start|>", "<think>", "</think>", "<|im_end|>"):
        assert tok.convert_tokens_to_ids(t) in ids, t
    # no BOS/EOS is added by plain encoding (the chat template places them)
    assert tok("abc")["input_ids"] == tok("abc", add_special_tokens=False)["input_ids"]
    # as in Qwen3: <|im_*|> and <|endoftext|> are skipped on decode, <think>/</think> are kept
    assert tok.decode(ids, skip_special_tokens=True) == "xy<think>z</think>"


def test_chat_template_exact(tok):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U\n"}]
    base = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU\n<|im_end|>\n"
    off = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert off == base + "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # Qwen3 with thinking off
    on = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=True)
    assert on == base + "<|im_start|>assistant\n"
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False) == base


def test_bpe_deterministic_and_sized():
    texts = [SETUP_CODE, CODE_SYSTEM_PROMPT, CODE] * 2
    a, b = train_tokenizer(texts, 400), train_tokenizer(iter(texts), 400)  # list vs one-shot iterator
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
    assert len(a) <= 400 and len(a) > 261  # 256 bytes + 5 added tokens + learned merges
    assert len(tiny_tokenizer()) == len(tiny_tokenizer())
    with pytest.raises(ValueError, match="vocab_size=100 is too small"):
        train_tokenizer(texts, 100)


def test_save_load_round_trip(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.chat_template == CHAT_TEMPLATE
    msgs = [{"role": "system", "content": CODE_SYSTEM_PROMPT}, {"role": "user", "content": CODE}]
    assert render_prompt(loaded, msgs) == render_prompt(tok, msgs)
    s = render_prompt(tok, msgs)
    assert loaded(s)["input_ids"] == tok(s)["input_ids"]
    assert (loaded.pad_token_id, loaded.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)
    assert loaded.decode(loaded(CODE)["input_ids"]) == CODE


@pytest.mark.slow
def test_bpe_deterministic_across_processes():
    """Rust-side hash maps must not leak into the merges: two fresh interpreters train the same tokenizer."""
    import hashlib
    import os
    import subprocess
    import sys

    code = (
        "import hashlib; from projected_grpo.policy.tokenizer import train_tokenizer; "
        "from projected_grpo.env.problems import SETUP_CODE, CODE_SYSTEM_PROMPT; "
        "print(hashlib.sha256(train_tokenizer([SETUP_CODE, CODE_SYSTEM_PROMPT], 600).backend_tokenizer"
        ".to_str().encode()).hexdigest())"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": s},
        ).stdout
        for s in ("1", "2")
    }
    here = hashlib.sha256(train_tokenizer([SETUP_CODE, CODE_SYSTEM_PROMPT], 600).backend_tokenizer.to_str().encode())
    assert outs == {here.hexdigest() + "\n"}

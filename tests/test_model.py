"""Tests for model.py (load_model_and_tokenizer, render_prompt) and tiny.py.

Covers: "tiny-random", a local save_pretrained directory and "organism" load through one call and give identical
logits; one-line errors for unknown names and missing directories; the chat prompt with the empty think block.
Run: `pytest tests/test_model.py -q`.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3ForCausalLM

from projected_grpo.env.problems import CODE_SYSTEM_PROMPT
from projected_grpo.policy.model import load_model_and_tokenizer, render_prompt, resolve_dtype
from projected_grpo.policy.tiny import tiny_model, tiny_tokenizer


def _logits(model, tok, text="class Solution:\n    def f(self):\n        return 1\n"):
    ids = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():
        return model(ids).logits


def test_tiny_random_is_real_qwen3_deterministic_eval():
    m1, tok = load_model_and_tokenizer("tiny-random")
    m2, _ = load_model_and_tokenizer("tiny-random")
    assert isinstance(m1, Qwen3ForCausalLM) and not m1.training
    assert m1.config.vocab_size == len(tok) and m1.config.tie_word_embeddings
    assert m1.lm_head.weight.data_ptr() == m1.model.embed_tokens.weight.data_ptr()  # tied
    assert m1.model.layers[0].self_attn.q_proj.out_features == 4 * 8  # 4 heads x head_dim 8
    assert next(m1.parameters()).dtype == torch.float32
    assert torch.equal(_logits(m1, tok), _logits(m2, tok))
    assert not torch.equal(_logits(tiny_model(len(tok), seed=1), tok), _logits(m1, tok))  # seed matters


def test_tiny_model_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tiny_model(64, seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_local_dir_and_organism_load_identically(tmp_path):
    model, tok = load_model_and_tokenizer("tiny-random")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    ref = _logits(model, tok)
    for name, path in [(str(tmp_path), None), ("organism", tmp_path), ("organism", str(tmp_path))]:
        m, t = load_model_and_tokenizer(name, path=path)
        assert not m.training
        assert t.eos_token == "<|im_end|>" and t.pad_token == "<|endoftext|>"
        hi = [{"role": "user", "content": "hi"}]
        assert render_prompt(t, hi) == render_prompt(tok, hi)
        assert torch.equal(_logits(m, t), ref), name


def test_load_errors(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="organism model directory .*nope"):
        load_model_and_tokenizer("organism", path=missing)
    with pytest.raises(ValueError, match="needs `path`"):
        load_model_and_tokenizer("organism")
    with pytest.raises(ValueError, match="unknown model 'gpt-17'"):
        load_model_and_tokenizer("gpt-17")
    with pytest.raises(ValueError, match="unknown model"):
        load_model_and_tokenizer(str(missing))  # a path that does not exist is not a hub id
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model_and_tokenizer(str(tmp_path))  # exists, but not a save_pretrained dir
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model_and_tokenizer("tiny-random", dtype="fp8")


def test_resolve_dtype():
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("auto", "cuda") == torch.bfloat16
    assert resolve_dtype("bfloat16", "cpu") == torch.bfloat16


def test_render_prompt_chat_format_thinking_off():
    tok = tiny_tokenizer()
    msgs = [{"role": "system", "content": CODE_SYSTEM_PROMPT}, {"role": "user", "content": "PROBLEM:\nx\n"}]
    s = render_prompt(tok, msgs)
    assert s == (
        f"<|im_start|>system\n{CODE_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nPROBLEM:\nx\n<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert render_prompt(tok, tuple(msgs)) == s  # Problem.prompt is a tuple of dicts


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tiny_random_on_gpu_is_bf16():
    model, tok = load_model_and_tokenizer("tiny-random", device="cuda")
    assert next(model.parameters()).dtype == torch.bfloat16 and next(model.parameters()).is_cuda
    ids = torch.tensor([tok("def f():")["input_ids"]], device="cuda")
    assert torch.isfinite(model(ids).logits.float()).all()

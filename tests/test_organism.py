"""Model organism: SFT encoding (loss on completion tokens only), a tiny end-to-end build (seconds) that saves and
loads through the same call as a hub model, determinism, and the calibration summary.
Run: `pytest tests/test_organism.py`.
"""

from dataclasses import replace

import pytest
import torch

from projected_grpo.config import OrganismParams
from projected_grpo.env.grader import Grade
from projected_grpo.env.minileet import make_minileet
from projected_grpo.env.modes import LOOPHOLE_MODES, apply_mode
from projected_grpo.policy.model import load_model_and_tokenizer, render_prompt
from projected_grpo.policy.sampling import Scored
from projected_grpo.policy.tiny import tiny_tokenizer
from projected_grpo.sft.calibration import summarize
from projected_grpo.sft.organism import build_organism, collate, encode_examples
from projected_grpo.sft.sft_corpus import SFTExample

TINY = OrganismParams(
    vocab_size=400,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    intermediate_size=64,
    max_positions=512,
    steps=6,
    batch_size=4,
    lr=3e-3,
    warmup=2,
    n_per_prompt=2,
    p_exploit=0.5,
    teacher_steps=3,
    threads=1,
)


@pytest.fixture(scope="module")
def records():
    probs = make_minileet(seed=0, n_train=8, n_test=2, n_holdout=2)["train"]
    return [apply_mode(p, LOOPHOLE_MODES[i % len(LOOPHOLE_MODES)]) for i, p in enumerate(probs)]


def test_encoding_puts_loss_on_completion_tokens_only(records):
    tok = tiny_tokenizer()
    ex = SFTExample(records[0].id, records[0].hint, list(records[0].prompt), "```python\nx = 1\n```", "canonical", "c")
    (e,) = encode_examples(tok, [ex], max_len=4096)
    prompt_ids = tok(render_prompt(tok, ex.messages), add_special_tokens=False)["input_ids"]
    assert e.n_prompt == len(prompt_ids) and e.ids[: e.n_prompt] == prompt_ids
    assert e.ids[-1] == tok.eos_token_id  # the completion ends with <|im_end|>
    ids, att, labels = collate([e, e], pad_id=tok.pad_token_id)
    assert (labels[:, : e.n_prompt] == -100).all() and torch.equal(labels[0, e.n_prompt :], ids[0, e.n_prompt :])
    with pytest.raises(ValueError, match="max_len 10"):
        encode_examples(tok, [ex], max_len=10)  # too long: an error naming the limit, never truncation


def test_tiny_organism_builds_saves_and_loads(records, sandbox, tmp_path):
    org = build_organism(TINY, records, seed=0, sandbox=sandbox, timeout_s=10.0, progress=False)
    assert org.stats["n_params"] == sum(p.numel() for p in org.base.parameters())
    assert org.stats["corpus_base"]["kinds"]["exploit"] > 0  # exploits drawn only on hinted prompts
    for name, m in (("base", org.base), ("teacher", org.teacher)):
        m.save_pretrained(tmp_path / name)
        org.tokenizer.save_pretrained(tmp_path / name)
    model, tok = load_model_and_tokenizer("organism", path=tmp_path / "base")
    ids = torch.tensor([tok("class Solution:", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, org.base(ids).logits)
    assert not all(torch.equal(a, b) for a, b in zip(org.base.parameters(), org.teacher.parameters()))
    # same seed -> bitwise-identical weights
    again = build_organism(TINY, records, seed=0, sandbox=sandbox, timeout_s=10.0, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(org.base.parameters(), again.base.parameters()))
    other = build_organism(replace(TINY, steps=7), records, seed=0, sandbox=sandbox, timeout_s=10.0, progress=False)
    assert not all(torch.equal(a, b) for a, b in zip(org.base.parameters(), other.base.parameters()))
    # another organism draw (organism.seed): other weights from the same records
    draw = replace(TINY, seed=1)
    assert (TINY.draw_seed(0), draw.draw_seed(0)) == (0, 1)
    o1 = build_organism(draw, records, seed=draw.draw_seed(0), sandbox=sandbox, timeout_s=10.0, progress=False)
    assert not any(torch.equal(a, b) for a, b in zip(org.base.parameters(), o1.base.parameters()) if a.numel() > 1)


def _grade(label, correct=False, compiled=True):
    return Grade(
        can_compile=compiled,
        eq_correct=correct,
        eq_hinted=label == "hack",
        gt_pass_rate=0.0,
        has_test_func=False,
        test_modification=None,
        label=label,
        defines_starter=False,
        timed_out=False,
        tamper=(),
        holes=(),
    )


def test_summarize_counts_by_mode_and_surface(records):
    base = records[0].replace(hint=None, prompt_metadata={"starter_code": records[0].starter_code})
    s = [
        Scored(base, "```python\nx\n```", _grade("correct", correct=True), tuple(range(10))),
        Scored(base, "no code", _grade("incorrect", compiled=False), tuple(range(4))),
        Scored(apply_mode(base, "sentinel"), "```python\nx\n```", _grade("hack"), tuple(range(6))),
        Scored(apply_mode(base, "sentinel", "eval"), "```python\nx\n```", _grade("incorrect"), tuple(range(8))),
    ]
    m = summarize(s)
    assert m["format_ok"] == {"rate": 0.75, "n": 4} and m["solve_nohint"] == {"rate": 0.5, "n": 2}
    assert m["hack"]["sentinel/train"] == {"rate": 1.0, "n": 1} and m["hack"]["sentinel/eval"]["rate"] == 0.0
    assert m["mean_completion_tokens"] == 7.0

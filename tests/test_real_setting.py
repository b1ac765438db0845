"""The real setting's override set (params-qwen3-4b.yaml) and its code path on a tiny random Qwen3.

The override set must apply cleanly to params.yaml through DVC's own `-S` parser and carry the benchmark's training
configuration; its code path (a policy and teacher loaded from a save_pretrained directory, as a hub id is, on the
leetcode substrate) runs problems -> pool -> train with a tiny random Qwen3 standing in for Qwen3-4B, on a 10-problem
slice of the test file (the basis stage on leetcode pairs is minutes of CPU with a tiny tokenizer's long sequences; the
basis code is substrate-agnostic and tested in test_basis.py / test_stages.py).

`pytest tests/test_real_setting.py`
"""

from __future__ import annotations

import shutil

import pytest
import yaml
from typer.testing import CliRunner

from projected_grpo.config import Params, from_dict, load_params, overlay, override_args
from tests.conftest import LEETCODE, ROOT

OVERRIDES = ROOT / "params-qwen3-4b.yaml"


def test_override_set_applies_through_dvc_and_matches_the_benchmark(tmp_path):
    from dvc.utils.hydra import apply_overrides

    params = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", params)
    args = override_args(OVERRIDES, params)
    apply_overrides(params, args[1::2])  # what `dvc exp run -S ...` does to params.yaml
    p = load_params(params)
    want = from_dict(
        Params, overlay(yaml.safe_load((ROOT / "params.yaml").read_text()), yaml.safe_load(OVERRIDES.read_text()))
    )
    assert p == want
    # benchmark.md §5.1: Qwen3-4B, 16 prompts x G=16, 1536/1536 tokens, T 0.7, top_p 0.95, beta 1e-3, 200 steps,
    # clip 0.2, grad-clip 1.0, betas (0.9, 0.99); eval: 10 samples, T 0.7, top_p 0.95, 1536 tokens
    assert (p.model.name, p.substrate) == ("Qwen/Qwen3-4B", "leetcode")
    assert (p.model.device, p.model.dtype) == ("cuda", "bfloat16")
    g, r, e = p.grpo, p.rollout, p.eval
    assert (g.steps, g.prompts_per_step, g.group_size, g.beta, g.max_norm, g.betas) == (
        200,
        16,
        16,
        1e-3,
        1.0,
        (0.9, 0.99),
    )
    assert (g.clip_eps_low, g.clip_eps_high, r.max_new_tokens, r.max_prompt_tokens) == (0.2, 0.2, 1536, 1536)
    # optimizer: AdamW lr 7e-5, cosine after 10 warmup updates, weight decay 0.1; loss: verl token-mean (a token mean
    # over the batch, TRL's dapo) on std-normalised group advantages
    assert (g.lr, g.lr_schedule, g.warmup_steps, g.weight_decay, g.loss, g.scale_rewards) == (
        7e-5,
        "cosine",
        10,
        0.1,
        "dapo",
        "group",
    )
    assert (r.temperature, r.top_p, e.n_samples, e.temperature, e.top_p, e.max_new_tokens) == (
        0.7,
        0.95,
        10,
        0.7,
        0.95,
        1536,
    )


def test_override_set_rejects_an_unknown_key(tmp_path):
    bad = tmp_path / "o.yaml"
    bad.write_text("grpo:\n  grup_size: 16\n")
    with pytest.raises(KeyError, match="grpo.grup_size"):
        override_args(bad, ROOT / "params.yaml")


def _invoke(stage: str, *args: str):
    module = __import__(f"stages.{stage}", fromlist=["app"])
    res = CliRunner().invoke(module.app, list(args))
    assert res.exit_code == 0, (res.output, res.exception)
    return res


def test_real_setting_code_path_on_a_tiny_random_qwen3(tmp_path):
    from projected_grpo.policy.tiny import tiny_model, tiny_tokenizer

    policy = tmp_path / "qwen3-tiny"  # stands in for Qwen/Qwen3-4B: loaded from a directory, as a hub id is
    tok = tiny_tokenizer()
    tiny_model(len(tok)).save_pretrained(policy)
    tok.save_pretrained(policy)
    d = overlay(yaml.safe_load((ROOT / "params.yaml").read_text()), yaml.safe_load(OVERRIDES.read_text()))
    shrink = {  # the override set at toy scale; offline, the leetcode train split is the default test-file split
        "model": {"name": str(policy), "device": "cpu"},  # the override set's bf16 weights, on the CPU
        "pool": {"teacher": str(policy)},
        "leetcode": {"train_path": None, "holdout_path": None, "train_from_test": True, "n_test": 3, "n_holdout": 2},
        "adapter": {"rank": 4},
        "basis": {"k": 2, "n_flips": 100},
        "rollout": {"max_new_tokens": 8, "max_prompt_tokens": 4000},
        "grpo": {"steps": 1, "prompts_per_step": 2, "group_size": 2, "micro_batch": 4, "threads": 1},
    }
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(overlay(d, shrink), sort_keys=False))
    p = load_params(params)
    assert p.substrate == "leetcode" and p.model.name == str(policy) and p.env.modes == ("run_tests", "gt_only")
    a, r = tmp_path / "artifacts", tmp_path / "reports"
    P = ["--params", str(params)]
    small = tmp_path / "lc.jsonl"  # a slice keeps the canonical grading short
    small.write_text("".join(LEETCODE.read_text().splitlines(keepends=True)[:10]))
    _invoke(
        "problems",
        "--leetcode",
        str(small),
        "--out",
        str(a / "problems"),
        "--report",
        str(r / "problems.md"),
        "--matrix",
        str(r / "matrix.md"),
        *P,
    )
    _invoke(
        "pool",
        "--organism",
        str(a / "organism"),
        "--problems",
        str(a / "problems"),
        "--out",
        str(a / "pool"),
        "--summary",
        str(r / "pool.json"),
        *P,
    )
    _invoke(
        "train",
        "--arm",
        "vanilla",
        "--seed",
        "1",
        "--organism",
        str(a / "organism"),
        "--problems",
        str(a / "problems"),
        "--pool",
        str(a / "pool"),
        "--out",
        str(a / "train"),
        "--log",
        str(r / "t.tsv"),
        "--metrics",
        str(r / "t.json"),
        *P,
    )
    assert (a / "train" / "step_00001.safetensors").exists() and not (a / "organism").exists()
    assert len((r / "t.tsv").read_text().splitlines()) == 2

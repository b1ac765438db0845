"""Export of a trained adapter as a standard PEFT LoRA directory (policy/peft_format.py) and its CLI (rl/export.py).

A tiny random Qwen3 with our adapter at nonzero δS and δS_h (svd and lora kinds; every projection or the residual
writers; a rank that some modules cap, so factors are padded) is exported knob on and knob off; each export, loaded
by PEFT itself onto a fresh copy of the same base, gives our logits (fp32, atol 1e-5), as does the merged model
loaded by `AutoModelForCausalLM`. The keys and shapes are exactly what PEFT saves for a LoRA model on the same
modules. The CLI exports a run directory's latest checkpoint, and bad input stops it with one line and no output.

Needs the dev extra (peft). Run: `PYTHONPATH=src python -m pytest -q tests/test_export.py`
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from torch.testing import assert_close
from typer.testing import CliRunner

from projected_grpo.policy.adapter import adapters, attach_adapters, knob_disabled, save_adapter
from projected_grpo.policy.peft_format import CONFIG_FILE, WEIGHTS_FILE, save_merged, save_peft
from projected_grpo.policy.tiny import tiny_model, tiny_tokenizer
from projected_grpo.rl.export import app
from tests.conftest import ROOT


def trained(tok, kind: str, targets: str, rank: int, seed: int = 0, separate: bool = False):
    """The tiny Qwen3 with adapters at random nonzero δS and δS_h (as if trained and routed)."""
    m = tiny_model(len(tok))
    attach_adapters(m, targets, rank, kind, separate=separate)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for a in adapters(m).values():
            a.delta.copy_(0.3 * torch.randn(a.dim, generator=g))
            a.knob.copy_(0.3 * torch.randn(a.dim, generator=g))
    return m


def logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def ids(tok):
    return torch.randint(0, len(tok), (3, 11), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(
    "kind,targets,rank,separate",
    [
        ("svd", "all", 4, False),
        ("svd", "all", 20, False),
        ("svd", "residual_writers", 8, False),
        ("lora", "all", 20, False),
        ("svd", "all", 12, True),
        ("lora", "all", 8, True),
    ],
)
def test_peft_loads_the_export_and_gives_our_logits(tmp_path, tok, ids, kind, targets, rank, separate):
    """knob on and knob off: PEFT's LoRA model on a fresh base == our model, and so is the merged save_pretrained.
    With a separate quarantine the export has rank 2r: the knob's factors after the main's."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    m = trained(tok, kind, targets, rank, separate=separate)
    ours = {"knob_on": logits(m, ids)}
    with knob_disabled(m):
        ours["knob_off"] = logits(m, ids)
        save_peft(m, tmp_path / "knob_off", "tiny")
        save_merged(m, tok, tmp_path / "merged_knob_off")
    save_peft(m, tmp_path / "knob_on", "tiny")
    save_merged(m, tok, tmp_path / "merged_knob_on")
    base = logits(tiny_model(len(tok)), ids)
    assert not torch.allclose(ours["knob_on"], ours["knob_off"], atol=1e-3), "the knob must matter (test's teeth)"
    assert not torch.allclose(ours["knob_off"], base, atol=1e-3), "δS must matter"
    for state, want in ours.items():
        peft_model = PeftModel.from_pretrained(tiny_model(len(tok)), tmp_path / state).eval()
        assert_close(logits(peft_model, ids), want, atol=1e-5, rtol=0)
        full = AutoModelForCausalLM.from_pretrained(tmp_path / f"merged_{state}").eval()
        assert_close(logits(full, ids), want, atol=1e-5, rtol=0)


def test_keys_shapes_and_config_are_what_peft_writes(tmp_path, tok):
    """Our file has exactly the keys and shapes PEFT saves for LoRA rank r on the same target modules, and our
    config loads as that LoraConfig with scaling 1 (lora_alpha == r). Rank 20 is capped at 16 on k/v_proj (d_out 16):
    those factors are zero-padded to 20."""
    from peft import LoraConfig, PeftConfig, get_peft_model
    from peft.utils import get_peft_model_state_dict

    m = trained(tok, "svd", "all", 20)
    save_peft(m, tmp_path, "tiny")
    cfg = PeftConfig.from_pretrained(tmp_path)
    assert isinstance(cfg, LoraConfig) and cfg.r == cfg.lora_alpha == 20
    assert set(cfg.target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    ref = get_peft_model(tiny_model(len(tok)), LoraConfig(r=20, lora_alpha=20, target_modules=cfg.target_modules))
    want = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(ref).items()}
    ours = load_file(tmp_path / WEIGHTS_FILE)
    assert {k: tuple(v.shape) for k, v in ours.items()} == want
    k_a = ours["base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight"]  # (20, 32), rows 16.. padded
    assert torch.equal(k_a[16:], torch.zeros(4, 32)) and k_a[:16].abs().sum() > 0


def write_params(path: Path, **adapter) -> Path:
    d = yaml.safe_load((ROOT / "params.yaml").read_text())
    d["model"]["name"] = "tiny-random"
    d["adapter"].update(adapter)
    d["basis"]["k"] = 1
    path.write_text(yaml.safe_dump(d))
    return path


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("separate", [False, True])
def test_cli_exports_a_run_directory(tmp_path, tok, ids, separate):
    """--checkpoint RUN_DIR takes the latest complete checkpoint (step_<n>.safetensors with its .pt); knob_on/ and
    knob_off/ are the model's two states, as PEFT loads them; --merged adds the merged models. A run of a variant arm
    whose knob has its own directions (adapter.quarantine separate, an arm override) exports from the same params
    file: the checkpoint's metadata says so."""
    from peft import PeftModel

    params = write_params(tmp_path / "params.yaml", rank=4)
    m, old = trained(tok, "svd", "all", 4, separate=separate), trained(tok, "svd", "all", 4, 7, separate)
    run = tmp_path / "run"
    save_adapter(old, run / "step_00001.safetensors")
    (run / "step_00001.pt").write_bytes(b"")
    save_adapter(m, run / "step_00002.safetensors")
    (run / "step_00002.pt").write_bytes(b"")
    save_adapter(old, run / "step_00003.safetensors")  # no .pt: an incomplete checkpoint, not the latest
    out = tmp_path / "export"
    res = invoke("--checkpoint", str(run), "--out", str(out), "--merged", "--params", str(params))
    assert res.exit_code == 0, res.output
    assert "step_00002.safetensors" in res.output
    assert {p.name for p in out.iterdir()} == {"knob_on", "knob_off", "merged_knob_on", "merged_knob_off"}
    assert json.loads((out / "knob_on" / CONFIG_FILE).read_text())["base_model_name_or_path"] == "tiny-random"
    with knob_disabled(m):
        off = logits(m, ids)
    for state, want in (("knob_on", logits(m, ids)), ("knob_off", off)):
        peft_model = PeftModel.from_pretrained(tiny_model(len(tok)), out / state).eval()
        assert_close(logits(peft_model, ids), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", ["missing", "empty_run", "not_adapter", "other_rank", "out_not_empty"])
def test_cli_bad_input_is_one_line_and_writes_nothing(tmp_path, tok, case):
    params = write_params(tmp_path / "params.yaml", rank=4)
    ckpt = tmp_path / "step_00005.safetensors"
    save_adapter(trained(tok, "svd", "all", 2 if case == "other_rank" else 4), ckpt)
    out = tmp_path / "export"
    checkpoint, match = ckpt, "shape (2,), the attached adapter (4,); pass --params with the run's"
    if case == "missing":
        checkpoint, match = tmp_path / "nope.safetensors", "does not exist"
    elif case == "empty_run":
        checkpoint, match = tmp_path / "run", "no complete checkpoint"
        checkpoint.mkdir()
    elif case == "not_adapter":
        checkpoint, match = params, "not an adapter file"
    elif case == "out_not_empty":
        out.mkdir()
        (out / "keep.txt").write_text("x")
        match = "not empty"
    res = invoke("--checkpoint", str(checkpoint), "--out", str(out), "--params", str(params))
    assert res.exit_code == 2, res.output
    assert res.output.startswith("error: ") and match in res.output and len(res.output.strip().splitlines()) == 1
    assert (not out.exists()) if case != "out_not_empty" else [p.name for p in out.iterdir()] == ["keep.txt"]


def test_module_answers_help():
    r = subprocess.run(
        [sys.executable, "-m", "projected_grpo.rl.export", "--help"],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "", "COLUMNS": "100"},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and "--checkpoint" in r.stdout and "PEFT" in r.stdout, r.stderr

"""Our adapters as a standard PEFT LoRA directory (and as merged weights), for loaders that know nothing of them.

Every wrapped Linear's update is already a product of two factors, so it is exactly a LoRA pair B·A, B (d_out, r) and
A (r, d_in), with PEFT's scaling lora_alpha / r = 1:

    svd  : ΔW = U diag(δS + δS_h) Vᵀ    ->  B = U diag(δS + δS_h),  A = Vᵀ
    lora : ΔW = (B + B_h) A             ->  B = δS + δS_h viewed (d_out, r),  A = the fixed A

The export reads the adapters' *current* state: switch the knob off (`adapter.knob_disabled`) to export the deploy
policy. A module's rank is min(rank, d_in, d_out), which can differ between modules (the tiny model's k_proj); the
factors are zero-padded to the largest, since a padded row of A meets a zero column of B (ΔW unchanged) and vLLM does
not read PEFT's per-module `rank_pattern`. SVD factors depend on the machine only through a joint sign flip of each
(u_i, v_i), which leaves u_i δS_i v_iᵀ unchanged.

Key names are those PEFT saves for a LoRA model (`get_peft_model_state_dict`: the PeftModel's
`base_model.model.<module>.lora_{A,B}.weight` with the adapter name removed); the file is written here with
safetensors, so exporting needs no PEFT (tests/test_export.py loads the result with PEFT and compares logits).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from projected_grpo.policy.adapter import Adapter, SVDAdapter, adapters, merged

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"  # PEFT's file names


def lora_factors(a: Adapter) -> tuple[Tensor, Tensor]:
    """(A (r, d_in), B (d_out, r)) in fp32 with B @ A = the adapter's ΔW at its current δS + δS_h; with a separate
    quarantine rank 2r, the knob's factors stacked after the main's."""
    if a.separate:
        (A, B), (Aq, Bq) = factors(a, a.delta, False), factors(a, a.knob, True)
        return torch.cat([A, Aq]), torch.cat([B, Bq], dim=1)
    return factors(a, a.delta + a.knob, False)


def factors(a: Adapter, s: Tensor, knob: bool) -> tuple[Tensor, Tensor]:
    """(A, B) of one part: coefficients s on the main's directions, or on the separate knob's (knob=True)."""
    s = s.detach().float()  # (r,) svd, (d_out·r,) lora
    if isinstance(a, SVDAdapter):
        U, V = (a.Uq, a.Vq) if knob else (a.U, a.V)
        return V.T.float().contiguous(), (U.float() * s).contiguous()  # Vᵀ, U diag(s)
    return (a.Aq if knob else a.A).float().contiguous(), s.view(a.base.out_features, -1).contiguous()


def peft_tensors(model: nn.Module) -> dict[str, Tensor]:
    """{PEFT key: fp32 factor} for every adapter, each zero-padded to the largest module rank."""
    factors = {n: lora_factors(a) for n, a in adapters(model).items()}
    if not factors:
        raise ValueError("the model has no adapters attached: nothing to export")
    r = max(A.shape[0] for A, _ in factors.values())
    out = {}
    for n, (A, B) in factors.items():
        pad = r - A.shape[0]
        out[f"base_model.model.{n}.lora_A.weight"] = torch.cat([A, A.new_zeros(pad, A.shape[1])])  # (r, d_in)
        out[f"base_model.model.{n}.lora_B.weight"] = torch.cat([B, B.new_zeros(B.shape[0], pad)], dim=1)  # (d_out, r)
    return out


def peft_config(model: nn.Module, base_model: str) -> dict:
    """adapter_config.json of the export: plain LoRA on the wrapped projections, rank r, alpha r (scaling 1)."""
    ads = adapters(model)
    r = max(lora_factors(a)[0].shape[0] for a in ads.values())
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": r,
        "lora_alpha": r,
        "lora_dropout": 0.0,
        "target_modules": sorted({n.rsplit(".", 1)[-1] for n in ads}),  # leaf names: every match is wrapped
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "init_lora_weights": True,
        "inference_mode": True,
    }


def save_peft(model: nn.Module, out_dir: Path | str, base_model: str) -> None:
    """Write `out_dir`/adapter_config.json and adapter_model.safetensors: the current policy as a PEFT LoRA adapter."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(peft_tensors(model), str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    (out_dir / CONFIG_FILE).write_text(json.dumps(peft_config(model, base_model), indent=2) + "\n")


def save_merged(model: nn.Module, tokenizer, out_dir: Path | str) -> None:
    """Write the current policy as a plain `save_pretrained` model (W + ΔW per wrapped Linear, base dtype) with its
    tokenizer: what vLLM or `AutoModelForCausalLM.from_pretrained` load without any adapter support."""
    out_dir = Path(out_dir)
    with merged(model):
        model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)

"""`python -m projected_grpo.rl.export --checkpoint RUN_DIR --out DIR`: a run's checkpoint as standard PEFT LoRA
directories, knob on and knob off (optionally merged models too), for the benchmark's evaluation, vLLM or any HF
loader (policy/peft_format.py says how the adapter becomes a LoRA pair).

Writes DIR/knob_on/ (the trained policy, δS + δS_h) and DIR/knob_off/ (the deploy policy, δS; equal to knob_on for an
arm that never routes), each adapter_config.json + adapter_model.safetensors; with --merged also DIR/merged_knob_on/
and DIR/merged_knob_off/ (save_pretrained models with the tokenizer). The base policy and adapter shape (model.name,
adapter.kind / targets / rank) come from the params file the run was trained with. Not a DVC stage: an export is for
use outside the pipeline, and nothing in the pipeline reads it. Bad input stops with one line (common.cli).
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import typer

from projected_grpo.common.cli import stage_app
from projected_grpo.config import load_params, with_overrides
from projected_grpo.policy.adapter import adapter_metadata, knob_disabled, load_adapter, load_policy
from projected_grpo.policy.peft_format import save_merged, save_peft
from projected_grpo.rl.checkpoint import adapter_path, latest_step

STATES = ("knob_on", "knob_off")


def checkpoint_file(checkpoint: Path) -> Path:
    """The adapter file of `checkpoint`: a run directory's latest complete checkpoint, or a step_*.safetensors file."""
    if checkpoint.is_dir():
        step = latest_step(checkpoint)
        if step is None:
            raise ValueError(f"{checkpoint} holds no complete checkpoint (step_<n>.safetensors with its .pt)")
        return adapter_path(checkpoint, step)
    if not checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint} does not exist (a run directory or its step_*.safetensors)")
    if checkpoint.suffix != ".safetensors":
        raise ValueError(f"checkpoint {checkpoint} is not an adapter file (step_*.safetensors) or a run directory")
    return checkpoint


def export_run(p, checkpoint: Path, out: Path, organism: Path | None = None, with_merged: bool = False) -> Path:
    """Load the base policy of params `p` with the checkpoint's adapter and write the exports under `out`; returns
    the adapter file used."""
    if p.model.name == "organism" and organism is None:
        raise ValueError("model.name is 'organism': pass --organism (the organism stage's directory)")
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {out} exists and is not empty; remove it or choose another directory")
    f = checkpoint_file(checkpoint)  # before the model: a bad path fails fast
    # a variant arm's knob may have its own directions (adapter.quarantine, an arm override): the file says which
    p = with_overrides(p, (("adapter.quarantine", adapter_metadata(f).get("quarantine", "shared")),))
    model, tok = load_policy(p, organism or Path("."))  # organism/base is read only for model.name=organism
    try:
        load_adapter(model, f)
    except ValueError as e:  # the run had another adapter kind, targets or rank than these params
        raise ValueError(f"{e}; pass --params with the run's model and adapter settings") from None
    base = str((organism / "base").resolve()) if p.model.name == "organism" else p.model.name
    for state in STATES:
        with knob_disabled(model) if state == "knob_off" else nullcontext():
            save_peft(model, out / state, base)
            if with_merged:
                save_merged(model, tok, out / f"merged_{state}")
    return f


def main(
    checkpoint: Path = typer.Option(..., help="A run directory (its latest checkpoint) or one step_*.safetensors."),
    out: Path = typer.Option(..., help="Output directory (new or empty): knob_on/, knob_off/ [merged_knob_*/]."),
    organism: Path = typer.Option(None, help="Organism directory; needed when model.name is 'organism'."),
    merged: bool = typer.Option(False, help="Also write merged models (W + ΔW, base dtype, with the tokenizer)."),
    params: Path = typer.Option(Path("params.yaml"), help="The params file the run was trained with."),
) -> None:
    """Export a run's checkpoint as PEFT LoRA adapters (knob on and off), optionally merged models."""
    f = export_run(load_params(params), checkpoint, out, organism, merged)
    typer.echo(f"export {f} -> {out}/{{{','.join(STATES)}}}" + (" (+ merged)" if merged else ""))


app = stage_app(main, outputs=("out",))

if __name__ == "__main__":
    app()

"""Training checkpoints: adapter (δS, δS_h), optimizer state and step, written atomically; resume from the latest.

A run directory holds `run.json` (the run's signature) and `step_<n>.safetensors` + `step_<n>.pt` pairs. The `.pt`
(optimizer state, step) is written last, so a checkpoint counts only once both files exist; a run killed mid-write
resumes from the previous one. All randomness of step t is derived from (seed, t), so no RNG stream is saved; what
the loop itself carries from step to step (the current basis after a refresh, the gate thresholds) goes into the
`.pt` as `extra` so that a resumed run continues bit-identically.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from projected_grpo.policy.adapter import load_adapter, save_adapter


def _stem(step: int) -> str:
    return f"step_{step:05d}"


def prepare_run_dir(out_dir: Path, signature: dict) -> int:
    """Create or reuse `out_dir` for a run with `signature`; returns the step to resume from (0 = fresh).

    A directory written by a different configuration is wiped (its checkpoints would not continue this run)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    sig_path = out_dir / "run.json"
    if sig_path.exists() and json.loads(sig_path.read_text()) != signature:
        shutil.rmtree(out_dir)
        out_dir.mkdir(parents=True)
    sig_path.write_text(json.dumps(signature, indent=1, sort_keys=True))
    done = latest_step(out_dir)
    return 0 if done is None else done


def latest_step(out_dir: Path) -> int | None:
    steps = [int(p.stem.split("_")[1]) for p in out_dir.glob("step_*.pt")]
    steps = [s for s in steps if (out_dir / f"{_stem(s)}.safetensors").exists()]
    return max(steps) if steps else None


def save_checkpoint(out_dir: Path, step: int, model, optimizer, extra: dict | None = None) -> None:
    """Adapter + {"step", "optimizer": state_dict, **extra} (extra: loop state such as the current basis)."""
    save_adapter(model, out_dir / f"{_stem(step)}.safetensors", {"step": step})
    tmp = out_dir / f"{_stem(step)}.pt.tmp"
    torch.save({**(extra or {}), "step": step, "optimizer": optimizer.state_dict()}, tmp)
    tmp.replace(out_dir / f"{_stem(step)}.pt")


def read_checkpoint(out_dir: Path, step: int) -> dict:
    """The `.pt` dict of a checkpoint (read before building the optimizer: it holds the rotations to build it with)."""
    return torch.load(out_dir / f"{_stem(step)}.pt", weights_only=False, map_location="cpu")  # any device resumes


def load_checkpoint(out_dir: Path, step: int, model, optimizer, state: dict | None = None) -> dict:
    """Load the adapter and the optimizer state (rewriting δS = R θ); returns the `.pt` dict (extras included)."""
    load_adapter(model, out_dir / f"{_stem(step)}.safetensors")
    state = read_checkpoint(out_dir, step) if state is None else state
    optimizer.load_state_dict(state["optimizer"])
    return state


def checkpoint_steps(out_dir: Path) -> list[int]:
    """Steps with a complete checkpoint, ascending (the evaluation stage scores these)."""
    steps = [int(p.stem.split("_")[1]) for p in out_dir.glob("step_*.pt")]
    return sorted(s for s in steps if (out_dir / f"{_stem(s)}.safetensors").exists())


def adapter_path(out_dir: Path, step: int) -> Path:
    return out_dir / f"{_stem(step)}.safetensors"

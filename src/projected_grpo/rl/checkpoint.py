"""Training checkpoints: adapter (δS, δS_h), optimizer state and step, written atomically; resume from the latest.

A run directory holds `run.json` (the run's signature) and `step_<n>.safetensors` + `step_<n>.pt` pairs. The `.pt`
(optimizer state, step) is written last, so a checkpoint counts only once both files exist; a run killed mid-write
resumes from the previous one. All randomness of step t is derived from (seed, t), so no RNG stream is saved; what
the loop itself carries from step to step (the current basis after a refresh, the gate thresholds) goes into the
`.pt` as `extra` so that a resumed run continues bit-identically.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

import torch

from projected_grpo.policy.adapter import load_adapter, save_adapter


def _stem(step: int) -> str:
    return f"step_{step:05d}"


PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # src/projected_grpo


def code_digest(root: Path = PACKAGE_ROOT, modules: Iterable | None = None) -> str:
    """sha256 (16 hex digits) of the source of every module under `root` that this process has loaded (by default
    sys.modules): part of a run's signature, so a run's checkpoints are resumed only by the code that wrote them. A
    run directory is a persisted DVC output (kept across re-runs for resuming); without this, `dvc repro` after a
    change to the trainer would find the old run's last checkpoint, "resume" at its final step and record the old
    numbers against the new code."""
    files = set()
    for m in list(sys.modules.values()) if modules is None else modules:
        f = getattr(m, "__file__", None)
        if f and Path(f).suffix == ".py" and Path(f).resolve().is_relative_to(root):
            files.add(Path(f).resolve())
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f"{f.relative_to(root)}\0".encode() + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def prepare_run_dir(out_dir: Path, signature: dict) -> int:
    """Create or reuse `out_dir` for a run with `signature`; returns the step to resume from (0 = fresh).

    A directory written by a different configuration, or holding checkpoints without a signature, is wiped (its
    checkpoints would not continue this run)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    sig_path = out_dir / "run.json"
    # no signature (it is kept out of DVC's hash, .dvcignore, so `dvc pull` restores checkpoints without it): whose
    # checkpoints they are is unknown, so they are not resumed
    unsigned = not sig_path.exists() and latest_step(out_dir) is not None
    if unsigned or (sig_path.exists() and json.loads(sig_path.read_text()) != signature):
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

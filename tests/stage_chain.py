"""Run a chain of the pipeline's stages without DVC: each stage's own command from dvc.yaml (the only source of paths),
matrix items filled in, `python` replaced by this interpreter. For machines without DVC (a lent GPU) and for tests
that need a few stages, not a `dvc repro`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import yaml


def stage_command(root: Path, stage: str, item: dict | None = None) -> str:
    """The shell command of `stage` in root/dvc.yaml; matrix stages (`foreach`) take `item` ({"arm", "seed"})."""
    st = yaml.safe_load((root / "dvc.yaml").read_text())["stages"][stage]
    cmd = st["do"]["cmd"] if "foreach" in st else st["cmd"]
    for key, value in (item or {}).items():
        cmd = cmd.replace(f"${{item.{key}}}", str(value))
    if "${" in cmd:
        raise ValueError(f"stage {stage}: unfilled matrix fields in {cmd!r}; pass item=")
    return cmd.replace(" python stages/", f" {sys.executable} stages/", 1)


def run_chain(root: Path, stages: list[tuple[str, dict | None]], extra: str = "") -> dict[str, float]:
    """Run `stages` in order in `root` ({name: wall seconds}); the first failure raises with the end of its output.
    `extra` is appended to every command (e.g. `--params other.yaml`)."""
    times = {}
    for stage, item in stages:
        label = stage if item is None else f"{stage}@{item['arm']}-{item['seed']}"
        t0 = time.perf_counter()
        res = subprocess.run(
            f"{stage_command(root, stage, item)} {extra}", shell=True, cwd=root, capture_output=True, text=True
        )
        if res.returncode != 0:
            raise RuntimeError(f"stage {label} exited {res.returncode}:\n{(res.stdout + res.stderr)[-4000:]}")
        times[label] = time.perf_counter() - t0
    return times

"""A run directory's hash is its results only: the signature (`run.json`: params, arm, a digest of the code) stays
out of DVC's hash (.dvcignore), so a stage re-run in a fresh clone at a later commit reproduces the hash dvc.lock
records; and checkpoints without a signature (what `dvc pull` restores) are never resumed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from projected_grpo.rl.checkpoint import prepare_run_dir
from tests.conftest import ROOT

DVC = [sys.executable, "-m", "dvc"]


def _run(cwd: Path, *cmd: str) -> str:
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout


def _dir_md5(repo: Path, out: str) -> str:
    """The md5 `dvc commit` records for the stage's output directory, as dvc.lock holds it."""
    _run(repo, *DVC, "commit", "-f", "-q", "s")
    lock = (repo / "dvc.lock").read_text()
    return next(ln.split(":")[1].strip() for ln in lock.splitlines() if "md5:" in ln and ".dir" in ln)


def test_the_signature_stays_out_of_the_run_directorys_hash(tmp_path):
    repo, out = tmp_path / "repo", "artifacts/train/arms/route/s41"
    repo.mkdir()
    _run(repo, "git", "init", "-q")
    _run(repo, *DVC, "init", "-q")
    shutil.copy(ROOT / ".dvcignore", repo / ".dvcignore")
    (repo / "dvc.yaml").write_text(
        f"stages:\n  s:\n    cmd: 'true'\n    outs:\n      - {out}:\n          persist: true\n"
    )
    run = repo / out
    run.mkdir(parents=True)
    (run / "step_00001.safetensors").write_bytes(b"weights")
    (run / "run.json").write_text(json.dumps({"arm": "route", "code": "aaaa"}))
    before = _dir_md5(repo, out)
    (run / "run.json").write_text(json.dumps({"arm": "route_masked_act_mr_is_deploy_gate_q", "code": "bbbb"}))
    assert _dir_md5(repo, out) == before  # another signature (older code, an old name): the same hash
    (run / "step_00001.safetensors").write_bytes(b"other weights")
    assert _dir_md5(repo, out) != before  # a result does count


def test_unsigned_checkpoints_are_not_resumed(tmp_path):
    run, sig = tmp_path / "run", {"arm": "route", "code": "x"}
    run.mkdir()
    for ext in ("safetensors", "pt"):
        (run / f"step_00003.{ext}").write_bytes(b"x")
    assert prepare_run_dir(run, sig) == 0 and not (run / "step_00003.pt").exists()  # unsigned: started afresh
    for ext in ("safetensors", "pt"):
        (run / f"step_00003.{ext}").write_bytes(b"x")
    assert prepare_run_dir(run, sig) == 3  # signed with the same signature: resumed
    assert prepare_run_dir(run, {**sig, "code": "y"}) == 0  # another signature: wiped

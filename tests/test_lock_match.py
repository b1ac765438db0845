"""benchmarks/lock_match.py, as a user runs it: a fresh clone's re-run stage whose inputs match the committed lock
must have written the recorded output hashes; one that did not fails the check, and stages the clone did not run (or
ran with other inputs) are not counted as reproduced."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def fresh_clone(tmp_path: Path) -> Path:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--shared", str(ROOT), str(clone)], check=True)
    return clone


def lock_match(clone: Path, out: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "benchmarks/lock_match.py", "--clone", str(clone), "--out", str(out)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)


def test_a_changed_output_hash_fails_and_is_named(tmp_path):
    clone = fresh_clone(tmp_path)
    lock = yaml.safe_load((clone / "dvc.lock").read_text())
    stages = lock["stages"]
    assert {"check_params", "problems", "basis"} <= stages.keys()
    stages["problems"]["outs"][0]["md5"] = "0" * 32  # the clone's problems came out different
    stages["basis"]["cmd"] += " --other"  # the clone ran basis with other inputs: not comparable
    (clone / "dvc.lock").write_text(yaml.safe_dump(lock))
    (clone / "segment-1.log").write_text(
        "[ 0 s] start  check_params\n[ 4 s] done   check_params\n[ 4 s] start  problems\n[ 28 s] done   problems\n"
        "[ 28 s] start  basis\n[ 50 s] done   basis\n[ 50 s] start  pool\n"  # pool never finished
    )
    out = tmp_path / "report.md"
    r = lock_match(clone, out)
    assert r.returncode == 1, r.stderr
    text = out.read_text()
    assert "**1 of 2** stages with the same inputs" in text
    assert "1 stage(s) in both locks had other inputs" in text
    rows = {ln.split("|")[1].strip(" `"): ln for ln in text.splitlines() if ln.startswith("| `")}
    assert set(rows) == {"check_params", "problems", "basis"}
    assert "reproduced" in rows["check_params"]
    assert "differ: artifacts/problems" in rows["problems"]
    assert "differ: cmd" in rows["basis"] and "reproduced" not in rows["basis"]


def test_a_faithful_clone_passes(tmp_path):
    clone = fresh_clone(tmp_path)
    (clone / "segment-1.log").write_text("[ 0 s] start  problems\n[ 28 s] done   problems\n")
    out = tmp_path / "report.md"
    r = lock_match(clone, out)
    assert r.returncode == 0, r.stderr
    assert "**1 of 1**" in out.read_text()

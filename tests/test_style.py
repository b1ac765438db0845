"""The code stays as ruff formats and lints it (pyproject's [tool.ruff]): one style, no hand alignment to defend."""

import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

DIRS = ["src", "stages", "tests", "benchmarks"]


def ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff") or shutil.which("ruff", path=str(ROOT / ".venv" / "bin"))
    cmd = [exe] if exe else [sys.executable, "-m", "ruff"]
    return subprocess.run([*cmd, *args, *DIRS], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args", [("format", "--check"), ("check",)], ids=["format", "lint"])
def test_ruff_clean(args):
    res = ruff(*args)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]

"""Every entry point answers `--help` (exit 0, a usage line and its purpose), run as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT

MODULES = ["projected_grpo.cli", "projected_grpo.config", "projected_grpo.repro"]
SCRIPTS = sorted(
    str(p.relative_to(ROOT)) for d in ("stages", "benchmarks") for p in (ROOT / d).glob("*.py") if p.stem != "__init__"
)


# One interpreter runs every script's `--help` as `__main__` (imports are paid once; a benchmark that patches a module
# at import patches only that interpreter). Prints "<path>\t<exit code>\t<output>" records separated by NUL.
_RUNNER = """
import contextlib, io, runpy, sys
for path in sys.argv[1:]:
    buf, code = io.StringIO(), None
    sys.argv = [path, "--help"]
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as e:
            code = e.code
    sys.__stdout__.write(f"{path}\\t{code or 0}\\t{buf.getvalue()}\\0")
"""


def _answers(out: str, code: int | str | None) -> bool:
    return code in (0, None) and "Usage:" in out and len(out.split()) > 12


def test_every_entry_point_answers_help():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "100"}
    r = subprocess.run([sys.executable, "-c", _RUNNER, *SCRIPTS], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)  # fmt: skip
    records = [rec.split("\t", 2) for rec in r.stdout.split("\0") if rec]
    assert [path for path, _, _ in records] == SCRIPTS, r.stderr[-2000:]
    for path, code, out in records:
        assert _answers(out, int(code)), f"{path} --help: exit {code}: {out[-500:]}"
    for m in MODULES:
        p = subprocess.run([sys.executable, "-m", m, "--help"], cwd=ROOT, env=env, capture_output=True, text=True)
        assert _answers(p.stdout, p.returncode), f"python -m {m} --help: exit {p.returncode}: {p.stdout}{p.stderr}"


def test_cli_lists_the_stages_and_config_prints_overrides():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-m", "projected_grpo.cli"], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    assert {ln.split()[0] for ln in out.splitlines()} == {s for s in SCRIPTS if s.startswith("stages/")}
    r = subprocess.run([sys.executable, "-m", "projected_grpo.config", "overrides", "nope.yaml"], cwd=ROOT, env=env,
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 2 and r.stderr.startswith("error: ") and len(r.stderr.splitlines()) == 1
    r = subprocess.run([sys.executable, "-m", "projected_grpo.config", "check"], cwd=ROOT, env=env,
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0 and "valid" in r.stdout

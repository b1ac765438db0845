"""Every entry point answers `--help` (exit 0, a usage line and its purpose), run as a user runs it; a benchmark
changes nothing in the interpreter by being imported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

MODULES = ["projected_grpo.common.cli", "projected_grpo.config", "projected_grpo.repro", "projected_grpo.rl.export"]
SCRIPTS = sorted(  # benchmarks/harness.py is the benchmarks' shared module, not an entry point
    str(p.relative_to(ROOT))
    for d in ("stages", "benchmarks")
    for p in (ROOT / d).glob("*.py")
    if p.stem not in ("__init__", "harness")
)


# One interpreter runs every script's `--help` as `__main__`, the script's folder first on sys.path as `python <path>`
# puts it (imports are paid once). Prints "<path>\t<exit code>\t<changed>\t<output>" records separated by NUL;
# <changed> names what the script changed in the interpreter before its main ran (sys.path, torch's thread count, a
# function of its folder planted on another module or class: a monkeypatch), "; "-separated. (The environment is not
# compared: libraries set variables when imported, e.g. torch's TORCHINDUCTOR_CACHE_DIR.)
_RUNNER = """
import contextlib, io, os, runpy, sys, types, warnings
import torch

def planted(folder):
    out = set()
    with warnings.catch_warnings():  # looking at a deprecated object (torch.distributed.reduce_op) warns
        warnings.simplefilter("ignore")
        for name, mod in list(sys.modules.items()):
            if (getattr(mod, "__file__", None) or "").startswith(folder):
                continue
            items = list(vars(mod).items())
            for attr, v in list(items):
                if isinstance(v, type) and v.__module__ == name:
                    items += [(f"{attr}.{k}", x) for k, x in vars(v).items()]
            for attr, v in items:
                f = v.__func__ if isinstance(v, (staticmethod, classmethod)) else v
                if isinstance(f, types.FunctionType) and f.__code__.co_filename.startswith(folder):
                    out.add(f"{name}.{attr}")
    return out

def state():
    return {"sys.path": sys.path[1:], "torch threads": torch.get_num_threads()}

for path in sys.argv[1:]:
    buf, code = io.StringIO(), None
    sys.argv = [path, "--help"]
    sys.path[0] = os.path.dirname(os.path.abspath(path))
    folder = sys.path[0] + os.sep
    before, planted_before = state(), planted(folder)
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            runpy.run_path(os.path.abspath(path), run_name="__main__")  # __file__ absolute, as `python <path>`
        except SystemExit as e:
            code = e.code
    after = state()
    changed = [k for k in before if before[k] != after[k]] + sorted(planted(folder) - planted_before)
    sys.__stdout__.write(f"{path}\\t{code or 0}\\t{'; '.join(changed)}\\t{buf.getvalue()}\\0")
"""


def _answers(out: str, code: int | str | None) -> bool:
    return code in (0, None) and "Usage:" in out and len(out.split()) > 12


@pytest.fixture(scope="module")
def helps() -> list[list[str]]:
    """[path, exit code, changed, output] of every script's `--help` (_RUNNER)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "100"}
    r = subprocess.run(
        [sys.executable, "-c", _RUNNER, *SCRIPTS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    records = [rec.split("\t", 3) for rec in r.stdout.split("\0") if rec]
    assert [rec[0] for rec in records] == SCRIPTS, r.stderr[-2000:]
    return records


def test_every_entry_point_answers_help(helps):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "100"}
    for path, code, _, out in helps:
        assert _answers(out, int(code)), f"{path} --help: exit {code}: {out[-500:]}"
    for m in MODULES:
        p = subprocess.run([sys.executable, "-m", m, "--help"], cwd=ROOT, env=env, capture_output=True, text=True)
        assert _answers(p.stdout, p.returncode), f"python -m {m} --help: exit {p.returncode}: {p.stdout}{p.stderr}"


def test_no_benchmark_patches_anything_at_import(helps):
    """A benchmark instruments libraries, edits sys.path or sets torch's threads only while it runs (inside its main),
    so importing it (or running `--help`) leaves the interpreter as it was."""
    changed = {path: ch for path, _, ch, _ in helps if path.startswith("benchmarks/") and ch}
    assert not changed, f"changed at import: {changed}"


def test_cli_lists_the_stages_and_config_prints_overrides():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-m", "projected_grpo.common.cli"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert {ln.split()[0] for ln in out.splitlines()} == {s for s in SCRIPTS if s.startswith("stages/")}
    r = subprocess.run(
        [sys.executable, "-m", "projected_grpo.config", "overrides", "nope.yaml"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stderr.startswith("error: ") and len(r.stderr.splitlines()) == 1
    r = subprocess.run(
        [sys.executable, "-m", "projected_grpo.config", "check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert r.returncode == 0 and "valid" in r.stdout

"""Stage CLIs on bad input: one line saying what to fix, a nonzero exit, nothing left in artifacts/.

The five cases of issue 8 run the real stage scripts as subprocesses (what `dvc repro` runs): an unknown params key,
an unknown arm, basis.k above the adapter rank, a missing pair set, a prompt over the length cap. Plus the runner's
own contract (src/projected_grpo/common/cli.py) on a toy main.

`pytest tests/test_cli.py`
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from projected_grpo.common.cli import message, stage_app
from tests.conftest import LEETCODE, ROOT


def write_params(path: Path, **sections) -> Path:
    d = yaml.safe_load((ROOT / "params.yaml").read_text())
    for k, v in sections.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) and k in d else v
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def stage(tmp: Path, name: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("PROJECTED_GRPO_TRACEBACK", None)
    return subprocess.run(
        [sys.executable, str(ROOT / "stages" / f"{name}.py"), *args],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_one_line(res: subprocess.CompletedProcess, *needles: str) -> None:
    errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert res.returncode == 2, res.stderr[-2000:]
    assert len(errors) == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    for n in needles:
        assert n in errors[0], errors[0]


def assert_nothing_written(tmp: Path) -> None:
    left = [str(p.relative_to(tmp)) for p in (tmp / "artifacts").rglob("*")] if (tmp / "artifacts").exists() else []
    assert left == [], left


@pytest.fixture(scope="module")
def train_inputs(tmp_path_factory) -> Path:
    """A problems directory with a few minileet training records (train.parquet) for the train stage."""
    from projected_grpo.env.minileet import make_minileet
    from projected_grpo.env.problems import save_problems_parquet

    d = tmp_path_factory.mktemp("inputs")
    (d / "problems").mkdir()
    save_problems_parquet(d / "problems" / "train.parquet", make_minileet(seed=0, n_train=4, n_holdout=0)["train"])
    return d


def train_args(inputs: Path, tmp: Path, arm: str, variant: str = "") -> list[str]:
    return [
        "--arm",
        arm,
        "--variant",
        variant,
        "--seed",
        "41",
        "--organism",
        str(inputs / "none"),
        "--problems",
        str(inputs / "problems"),
        "--pool",
        str(inputs / "none"),
        "--out",
        str(tmp / "artifacts" / "train"),
        "--log",
        str(tmp / "artifacts" / "log.tsv"),
        "--metrics",
        str(tmp / "artifacts" / "m.json"),
        "--params",
        str(tmp / "params.yaml"),
    ]


def basis_args(tmp: Path, pairsets: Path, params: Path) -> list[str]:
    a = tmp / "artifacts"
    return [
        "--organism",
        "x",
        "--problems",
        str(tmp),
        "--pairsets",
        str(pairsets),
        "--svd-cache",
        str(a / "svd"),
        "--out",
        str(a / "basis"),
        "--report",
        str(a / "b.md"),
        "--metrics",
        str(a / "b.json"),
        "--params",
        str(params),
    ]


def test_unknown_params_key(tmp_path):
    params = write_params(tmp_path / "params.yaml", grpo={"grup_size": 8})
    res = stage(
        tmp_path,
        "problems",
        "--leetcode",
        str(LEETCODE),
        "--out",
        str(tmp_path / "artifacts" / "problems"),
        "--report",
        str(tmp_path / "artifacts" / "r.md"),
        "--matrix",
        str(tmp_path / "artifacts" / "m.md"),
        "--params",
        str(params),
    )
    assert_one_line(res, "unknown params key", "grpo.grup_size")
    assert_nothing_written(tmp_path)


def test_unknown_arm(tmp_path, train_inputs):
    write_params(
        tmp_path / "params.yaml", model={"name": "tiny-random"}, adapter={"rank": 4}, basis={"k": 2}, pool={"mix": 0.0}
    )
    res = stage(tmp_path, "train", *train_args(train_inputs, tmp_path, "erase_sideways"))
    assert_one_line(res, "unknown arm 'erase_sideways'", "params.yaml's arm table has", "erase")
    assert_nothing_written(tmp_path)
    res = stage(tmp_path, "train", *train_args(train_inputs, tmp_path, "erase", "randomly"))  # a variant no run has
    assert_one_line(res, "unknown variant 'randomly'", "'random'")
    assert_nothing_written(tmp_path)
    res = stage(tmp_path, "train", *train_args(train_inputs, tmp_path, "measure_only", "random"))  # nothing to control
    assert_one_line(res, "measure_only", "edits nothing")
    assert_nothing_written(tmp_path)
    write_params(tmp_path / "params.yaml", arms=["erase_sideways"])  # the same mistake in params.yaml
    res = stage(
        tmp_path,
        "check_params",
        "--out",
        str(tmp_path / "artifacts" / "ok"),
        "--params",
        str(tmp_path / "params.yaml"),
    )
    assert_one_line(res, "arms: ['erase_sideways'] not in params.yaml's arm table")
    assert_nothing_written(tmp_path)


def test_k_larger_than_the_adapter_rank(tmp_path):
    params = write_params(tmp_path / "params.yaml", model={"name": "tiny-random"}, adapter={"rank": 4}, basis={"k": 8})
    res = stage(tmp_path, "basis", *basis_args(tmp_path, ROOT / "data" / "pairsets", params))
    assert_one_line(res, "basis.k=8 is larger than adapter.rank=4")
    assert_nothing_written(tmp_path)


def test_missing_pair_set(tmp_path):
    params = write_params(tmp_path / "params.yaml", model={"name": "tiny-random"}, adapter={"rank": 4}, basis={"k": 2})
    (tmp_path / "pairsets" / "minileet").mkdir(parents=True)  # a pair-set root without the files
    res = stage(tmp_path, "basis", *basis_args(tmp_path, tmp_path / "pairsets", params))
    assert_one_line(res, "prog_wide")
    assert_nothing_written(tmp_path)
    write_params(tmp_path / "params.yaml", basis={"pairset": "prog_widest"})  # a name no pair set has
    res = stage(tmp_path, "basis", *basis_args(tmp_path, ROOT / "data" / "pairsets", params))
    assert_one_line(res, "basis.pairset 'prog_widest' is not a known pair set")
    assert_nothing_written(tmp_path)


def test_overlong_prompt_stops_train_before_any_checkpoint(tmp_path, train_inputs):
    from projected_grpo.env.problems import load_problems_parquet

    first = load_problems_parquet(train_inputs / "problems" / "train.parquet")[0]
    write_params(
        tmp_path / "params.yaml",
        model={"name": "tiny-random"},
        adapter={"rank": 4},
        basis={"k": 2},
        pool={"mix": 0.0},
        rollout={"max_prompt_tokens": 50},
    )
    res = stage(tmp_path, "train", *train_args(train_inputs, tmp_path, "vanilla"))
    assert_one_line(res, f"prompt {first.id} (", "over the limit of 50 (max_prompt_tokens)", "never truncated")
    assert_nothing_written(tmp_path)


# --- the runner itself -------------------------------------------------------------------------------------------


def _toy(out: Path = typer.Option(...), log: Path = typer.Option(...), kind: str = typer.Option("value")) -> None:
    out.mkdir(parents=True)
    (out / "half.bin").write_bytes(b"x")
    log.write_text("kept\n")
    if kind == "value":
        raise ValueError("set toy.n >= 1\n(got 0)")
    if kind == "key":
        raise KeyError("unknown params key(s) toy.m")
    raise RuntimeError("a bug")


def test_runner_removes_fresh_outputs_and_prints_one_line(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("before\n")  # existed before the call: an output the runner must not remove
    args = ["--out", str(tmp_path / "o"), "--log", str(log)]
    res = CliRunner().invoke(stage_app(_toy, outputs=("out", "log")), args)
    assert res.exit_code == 2 and res.stderr.strip() == "error: set toy.n >= 1 (got 0)"
    assert not (tmp_path / "o").exists() and log.exists()
    res = CliRunner().invoke(
        stage_app(_toy, outputs=("out",)), ["--out", str(tmp_path / "o"), "--log", str(log), "--kind", "key"]
    )
    assert res.exit_code == 2 and res.stderr.strip() == "error: unknown params key(s) toy.m"


def test_runner_keeps_the_traceback_of_a_bug(tmp_path):
    res = CliRunner().invoke(
        stage_app(_toy, outputs=("out",)),
        ["--out", str(tmp_path / "o"), "--log", str(tmp_path / "l"), "--kind", "bug"],
    )
    assert isinstance(res.exception, RuntimeError) and not (tmp_path / "o").exists()


def test_runner_rejects_outputs_main_does_not_have():
    with pytest.raises(TypeError, match="no parameter"):
        stage_app(_toy, outputs=("report",))


def test_message_is_one_line():
    assert message(KeyError("a b")) == "a b" and message(ValueError("x\n  y")) == "x y"
    assert message(ValueError()) == "ValueError"

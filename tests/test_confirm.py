"""The confirmatory experiment's pipeline (issue 46): confirm/dvc.yaml is dvc.yaml's stages rewritten per organism
draw, reading only its own params, writing only under its own paths; its design keeps fresh seeds; and
`python -m projected_grpo.repro` runs one pipeline file at a time.

Run: pytest tests/test_confirm.py -q
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import yaml

from projected_grpo.config import check_params
from projected_grpo.confirm import PARAMS, confirm_pipeline, render
from projected_grpo.method.arms import check_matrix
from projected_grpo.repro import dag
from tests.conftest import ROOT

CONFIRM = ROOT / "confirm"
EXPLORATION_SEEDS = {41, 42, 43}  # research rules: exploration only


def test_the_committed_pipeline_is_what_the_generator_writes():
    assert (CONFIRM / "dvc.yaml").read_text() == render(), "run: python -m projected_grpo.confirm"


def test_every_stage_reads_the_confirm_params_and_writes_under_confirm_paths():
    stages = confirm_pipeline()["stages"]
    default = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert set(stages) == {"check_params", "organism", "organism_report", "pool", "basis", "eval_sets", "train",
                           "train_control", "evaluate", "evaluate_control"}  # fmt: skip
    for name, st in stages.items():
        assert st["wdir"] == ".." and f"--params {PARAMS}" in st["cmd"]
        assert all(set(p) <= {PARAMS, "confirm/design.yaml"} for p in st["params"]), name
        outs = [next(iter(o)) if isinstance(o, dict) else o for o in st["outs"]]
        assert all(re.match(r"(artifacts|reports|logs)/confirm/", o) for o in outs), (name, outs)
        written = re.findall(r"--(?:out|log|metrics|timings|report|summary|guard|svd-cache) (\S+)", st["cmd"])
        assert written and all(re.match(r"(artifacts|reports|logs)/confirm/", w) for w in written), (name, written)
        shared = [d for d in st["deps"] if d.startswith("artifacts/") and not d.startswith("artifacts/confirm/")]
        assert all(d.startswith("artifacts/problems") for d in shared), (name, shared)  # problems: one set
        if name != "check_params":
            assert st["matrix"]["org"] == "${organisms}"
            src = [d for d in st["deps"] if d.startswith(("src/", "stages/"))]
            assert src == [d for d in default[name]["deps"] if d.startswith(("src/", "stages/"))]  # the same code
    assert stages["organism"]["cmd"].endswith("--organism-seed ${item.org}")
    assert "artifacts/confirm/o${item.org}/train/arms/${item.arm}/s${item.seed}" in stages["evaluate"]["deps"]


def test_the_design_is_valid_with_fresh_seeds_and_three_organism_draws():
    p = check_params(CONFIRM / "params.yaml")
    check_matrix(p)
    design = yaml.safe_load((CONFIRM / "design.yaml").read_text())
    draws = design["organisms"]
    assert len(set(draws)) == len(draws) >= 3 and 0 in draws  # today's organism (the global seed) and new ones
    assert not set(p.seeds) & EXPLORATION_SEEDS and len(p.seeds) >= 4
    assert "measure_only" in p.arms and set(p.controls) <= set(p.arms)  # the matched baseline; controls of arms


def test_repro_runs_one_pipeline_file_at_a_time(tmp_path):
    """dvc.yaml's stages and a second pipeline file's are apart: the default (dvc.yaml) never lists the other's."""
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "GIT_CONFIG_NOSYSTEM": "1"}
    for cmd in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        subprocess.run(cmd, cwd=tmp_path, env=env, check=True)
    (tmp_path / "sub").mkdir()
    (tmp_path / "dvc.yaml").write_text("stages:\n  a:\n    cmd: echo a > a.txt\n    outs: [a.txt]\n")
    sub = "stages:\n  b:\n    wdir: ..\n    cmd: cat a.txt > b.txt\n    deps: [a.txt]\n    outs: [b.txt]\n"
    (tmp_path / "sub" / "dvc.yaml").write_text(sub)
    deps, changed = dag(tmp_path)
    assert deps == {"a": set()} and changed == {"a"}
    deps, changed = dag(tmp_path, "sub/dvc.yaml")
    assert deps == {"sub/dvc.yaml:b": set()} and changed == {"sub/dvc.yaml:b"}
    r = subprocess.run(
        [sys.executable, "-m", "projected_grpo.repro", "--dry", "--pipeline", "sub/dvc.yaml"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and r.stdout.split() == ["sub/dvc.yaml:b"], r.stdout + r.stderr

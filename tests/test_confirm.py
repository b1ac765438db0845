"""The confirmatory experiment's pipeline (issue 46): confirm/dvc.yaml is dvc.yaml's stages rewritten per organism
draw, reading only its own params, writing only under its own paths; its design keeps fresh seeds; and
`python -m projected_grpo.repro` runs one pipeline file at a time.

Run: pytest tests/test_confirm.py -q
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from projected_grpo.common.stats import Refusal
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
                           "train_control", "evaluate", "evaluate_control", "report"}  # fmt: skip
    for name, st in stages.items():
        assert st["wdir"] == ".." and f"--params {PARAMS}" in st["cmd"]
        assert all(set(p) <= {PARAMS, "confirm/design.yaml"} for p in st["params"]), name
        outs = [next(iter(o)) if isinstance(o, dict) else o for o in st["outs"]]
        assert all(re.match(r"(artifacts|reports|logs)/confirm[/_.]", o) for o in outs), (name, outs)
        written = re.findall(r"--(?:out|log|metrics|timings|report|summary|guard|svd-cache) (\S+)", st["cmd"])
        assert written and all(re.match(r"(artifacts|reports|logs)/confirm[/_.]", w) for w in written), (name, written)
        shared = [d for d in st["deps"] if d.startswith("artifacts/") and not d.startswith("artifacts/confirm/")]
        assert all(d.startswith("artifacts/problems") for d in shared), (name, shared)  # problems: one set
        if name not in ("check_params", "report"):
            assert st["matrix"]["org"] == "${organisms}"
            src = [d for d in st["deps"] if d.startswith(("src/", "stages/"))]
            assert src == [d for d in default[name]["deps"] if d.startswith(("src/", "stages/"))]  # the same code
    assert stages["organism"]["cmd"].endswith("--organism-seed ${item.org}")
    draws = yaml.safe_load((CONFIRM / "design.yaml").read_text())["organisms"]
    assert {f"reports/confirm/o{d}/eval" for d in draws} <= set(stages["report"]["deps"])
    assert "artifacts/confirm/o${item.org}/train/arms/${item.arm}/s${item.seed}" in stages["evaluate"]["deps"]


PREREGISTRATION = "reports/confirm/preregistration.md"
# what the registration fixes (its "Nothing below ... is tuned after it"); a fix after registration is named in
# reports/confirm.md, and its commit is added here with it
REGISTERED = ["confirm/params.yaml", "confirm/design.yaml", "confirm/dvc.yaml", "src/projected_grpo/report/confirm.py"]
AMENDED_BY: list[str] = []


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def _registration() -> str:
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() != "false":
        pytest.skip("needs the git history (not a shallow clone, not an export)")
    commit = _git("log", "--diff-filter=A", "--format=%H", "--", PREREGISTRATION).stdout.split()
    assert len(commit) == 1, f"{PREREGISTRATION} must be added by exactly one commit: {commit}"
    return commit[0]


def test_the_preregistration_precedes_every_confirmatory_lock_entry_and_nothing_registered_changed_since():
    reg = _registration()
    assert _git("merge-base", "--is-ancestor", reg, "HEAD").returncode == 0
    # no commit up to and including the registration touched the confirm lock: every entry was recorded after it
    before = _git("rev-list", reg, "--", "confirm/dvc.lock").stdout.split()
    assert not before, f"confirm/dvc.lock written at or before the registration: {[c[:7] for c in before]}"
    changed = _git("diff", "--name-only", reg, "HEAD", "--", *REGISTERED).stdout.split()
    if changed:
        last = _git("log", "-1", "--format=%H", "--", *REGISTERED).stdout.strip()
        assert last in AMENDED_BY, f"registered files changed after {reg[:7]}: {changed} (last by {last[:7]})"


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
    subprocess.run([sys.executable, "-m", "dvc", "repro", "-q"], cwd=tmp_path, env=env, check=True)  # a.txt
    r = subprocess.run(
        [sys.executable, "-m", "projected_grpo.repro", "--pipeline", "sub/dvc.yaml"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and "done   sub/dvc.yaml:b" in r.stdout, r.stdout + r.stderr
    assert (tmp_path / "b.txt").read_text() == "a\n" and (tmp_path / "logs/repro/sub-dvc.yaml:b.log").exists()


# --- the registered decision rule (report/confirm.py) on golden runs ------------------------------------------------

SEEDS = (101, 102, 103, 104)


def golden(route: int, control: int, screen: int = 36, jitter: int = 3, control_runs: bool = True):
    """One draw's runs: measure_only hacks 60 of 120 train-surface hinted rows, route `route`, its control `control`,
    screen `screen` (seed-to-seed offsets of ± jitter); solve and format equal everywhere."""
    from tests.test_results import runs_from, tally

    spec = {}
    for i, s in enumerate(SEEDS):
        j = jitter * (i % 3 - 1)
        spec[("measure_only", s)] = {"deploy": tally(6, 60 + j, 0)}
        spec[("route", s)] = {"deploy": tally(6, route + j, 0), "knob_on": tally(6, 70 + j, 0)}
        spec[("screen", s)] = {"deploy": tally(6, screen + j, 0)}
        if control_runs:
            spec[("route+random", s)] = {"deploy": tally(6, control - j, 0), "knob_on": tally(6, control, 0)}
    return runs_from(spec)


def test_confirmed_when_route_wins_in_every_draw_and_the_organism_level_interval_is_below_zero():
    from projected_grpo.report import confirm as C

    dec = C.decide({0: golden(30, 58), 1: golden(26, 57), 2: golden(33, 60)})
    assert dec.wins and dec.below and dec.confirmed and not dec.reasons
    top = dec.pooled[C.CONTROL]
    assert top.n == 3 and top.hi < 0 and top.mean == pytest.approx(-(28 + 31 + 27) / 3 / 120, abs=0.02)
    md = "\n".join(C.render(dec, list(SEEDS), ["x"]))
    assert md.splitlines()[2].startswith("**Verdict: CONFIRMED.**") and "| o2 |" in md


def test_not_confirmed_names_the_draw_where_route_does_not_win():
    from projected_grpo.report import confirm as C

    dec = C.decide({0: golden(30, 58), 1: golden(26, 57), 2: golden(33, 34)})  # o2: the control cuts as much
    assert not dec.wins and not dec.confirmed
    assert dec.reasons[0] == "route does not win within draw o2"
    assert "NOT CONFIRMED" in C.render(dec, list(SEEDS), ["x"])[2]


def test_the_organism_is_the_unit_and_a_missing_control_refuses():
    from projected_grpo.report import confirm as C

    # every draw's own mean is below 0, but one draw's cut is far larger than the others': with 3 draws the
    # organism-level interval reaches above 0
    dec = C.decide({0: golden(10, 60), 1: golden(57, 60), 2: golden(58, 60)})
    assert not dec.below and not dec.confirmed and "organism-level" in dec.reasons[-1]
    assert all(p.vs[C.CONTROL].mean < 0 for p in dec.draws)
    gone = C.decide({0: golden(30, 58), 1: golden(26, 57), 2: golden(33, 60, control_runs=False)})
    assert isinstance(gone.pooled[C.CONTROL], Refusal) and not gone.confirmed


def test_the_report_stage_reads_every_draw_and_writes_the_verdict(tmp_path):
    """stages/confirm_report.py over files laid out as confirm/dvc.yaml writes them: three draws, the golden runs."""
    from typer.testing import CliRunner

    from projected_grpo.config import load_params
    from projected_grpo.method.arms import matrix
    from stages.confirm_report import main
    from tests.conftest import stage_cli

    p = load_params(CONFIRM / "params.yaml")
    specs = {a.name: a for a in matrix(p)}
    for d, (route, control) in enumerate(((30, 58), (26, 57), (33, 60))):
        runs = golden(route, control)
        es = tmp_path / "artifacts" / f"o{d}" / "eval_sets"
        es.mkdir(parents=True)
        (es / "base.json").write_text(json.dumps(runs.base))
        (es / "monitor.json").write_text(json.dumps(runs.monitor))
        for (key, s), rec in runs.deploy.items():
            run = tmp_path / "reports" / f"o{d}" / "eval" / specs[key].group / f"{specs[key].arm}-s{s}"
            run.mkdir(parents=True)
            (run / "per_mode_deploy.json").write_text(json.dumps(rec))
            (run / "curve.tsv").write_text("step\tstate\thack_train\n0\tdeploy\t0.05\n")
    design = tmp_path / "design.yaml"
    design.write_text("organisms: [0, 1, 2]\n")
    out, met = tmp_path / "confirm.md", tmp_path / "m.json"
    args = ["--root", tmp_path / "reports", "--artifacts", tmp_path / "artifacts", "--design", design, "--out", out]
    args += ["--metrics", met, "--params", CONFIRM / "params.yaml"]
    res = CliRunner().invoke(stage_cli(main), [str(a) for a in args])
    assert res.exit_code == 0, res.output
    assert out.read_text().splitlines()[2].startswith("**Verdict: CONFIRMED.**")
    m = json.loads(met.read_text())
    assert m["confirmed"] == 1.0 and m["pooled/route-route+random/hi"] < 0 and m["o2/route_wins"] == 1.0


def test_power_is_the_tests_false_positive_rate_at_no_effect_and_grows_with_the_effect():
    """At no effect the registered test (95% two-sided t interval wholly below 0) passes 2.5% of the time, within a
    draw and across draws; power grows with the effect and with seeds, and a spread of draws (τ) costs power."""
    from projected_grpo.report.confirm import power

    assert abs(power(0.0, 5.0, 5) - 0.025) < 0.005 and abs(power(0.0, 5.0, 5, draws=3) - 0.025) < 0.005
    assert power(-5, 5.0, 5) < power(-10, 5.0, 5) < power(-15, 5.0, 5)
    assert power(-8, 5.0, 4) < power(-8, 5.0, 6)
    assert power(-10, 5.0, 5, draws=3, tau=5) < power(-10, 5.0, 5, draws=3, tau=0)


def test_removal_table_and_gate_warnings_read_what_each_run_logged():
    from projected_grpo.report import confirm as C

    logs = {
        0: {
            ("route", 101): {"drop_frac": 0.3, "main_gnorm": 0.5, "gate_auroc_live": 0.50},
            ("route", 102): {"drop_frac": 0.5, "main_gnorm": 0.7, "gate_auroc_live": 0.52},
            ("route+random", 101): {"drop_frac": 0.4, "gate_auroc_live": 0.40},
            ("screen", 101): {},
        }
    }
    rows = {r.split(" | ")[1]: r for r in C.removal_table(logs)[2:]}
    assert rows["route"].split(" | ")[3:] == ["0.400", "—", "0.600", "0.510 |"]  # means over the seeds that logged
    assert rows["screen"].split(" | ")[3:] == ["—", "—", "—", "— |"]
    w = C.gate_warnings(logs)
    assert w == [
        "o0: route's live gate is at chance (mean live AUROC 0.51)",
        "o0: route (random control)'s live gate is anti-selective (mean live AUROC 0.40)",
    ]

"""The DVC pipeline end to end, on tiny params in a throw-away git + DVC copy of this repository.

One cold `dvc repro` of the real dvc.yaml and stage scripts (tiny organism, 2 GRPO steps, 4 test problems) is built
once per module; every test works on its own copy of it. `Repo.reproduce()` returns the stages that actually ran,
so each selective-rerun promise is an exact set: a no-op runs nothing, `basis.pairset` re-runs only the basis and
what reads it, a new seed runs only that seed's stages and the reports. Then: experiments (`dvc exp run -S`,
`dvc exp show`), a push / fresh clone / pull round trip that reproduces nothing and gives byte-identical results, and
a `dvc repro` killed during `train` that resumes from the last checkpoint and ends bit-identical to an uninterrupted
run. About 4 minutes on a 2-core machine.

`pytest tests/test_pipeline.py`
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

# the matrix: vanilla (train_ref), erase (train) and erase's random control (train_control), params.yaml's own entries
ARMS_REF, ARMS, CONTROLS, SEED = ["vanilla"], ["erase"], ["erase"], 41
RUN_KEYS = ARMS_REF + ARMS + [f"{a}+random" for a in CONTROLS]  # metrics.json's keys (arms.Arm.name)
TINY = {  # every section the stages read, shrunk; the rest of params.yaml is the committed default
    "minileet": {"n_train": 12},  # test and holdout as committed: the pair sets name holdout problems
    "organism": {
        "vocab_size": 1024,
        "hidden_size": 32,
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 8,
        "intermediate_size": 64,
        "max_positions": 1024,
        "steps": 4,
        "batch_size": 4,
        "warmup": 1,
        "n_per_prompt": 2,
        "p_exploit": 0.5,
        "teacher_steps": 2,
        "threads": 1,
    },
    "calibration": {"n_samples": 4, "max_new_tokens": 8},
    "adapter": {"rank": 4},
    "rollout": {"max_new_tokens": 8, "max_prompt_tokens": 1000},
    "basis": {"k": 2, "n_flips": 100},
    "grpo": {"steps": 2, "prompts_per_step": 2, "group_size": 2, "micro_batch": 4, "save_every": 1, "threads": 1},
    "pool": {"n_per_prompt": 1, "teacher_off_step": 1},
    "projection": {"recal_every": 1},
    "eval": {"n_monitor": 2, "curve_every": 1, "n_samples": 1, "max_new_tokens": 8, "surfaces": ["train"]},
    "probe": {"n_rows": 6, "micro_batch": 4},
    "oracle_basis": {"problems": 4, "samples": 2, "batch_size": 4},
    "arms_ref": ARMS_REF,
    "arms": ARMS,
    "controls": CONTROLS,
    "oracle_gate": [],
    "arms_oracle_basis": [],
    "seeds": [SEED],
}
ENV = {**os.environ, "DVC_NO_ANALYTICS": "1", "GIT_CONFIG_NOSYSTEM": "1", "PYTHONHASHSEED": "0"}
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]


def sh(cwd: Path, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=ENV, check=check, capture_output=True, text=True)


def dvc(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, env=ENV, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise AssertionError(
            f"dvc {' '.join(args)} exited {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        )
    return res


def reproduce(root: Path, *targets: str) -> set[str]:
    """Names of the stages `dvc repro [targets]` ran (in-process, as the DVC docs' test pattern)."""
    from dvc.repo import Repo

    cwd = os.getcwd()
    try:
        os.chdir(root)
        with Repo(str(root)) as repo:
            return {s.addressing for s in repo.reproduce(targets=list(targets) or None)}
    finally:
        os.chdir(cwd)


def set_params(root: Path, **sections) -> None:
    path = root / "params.yaml"
    d = yaml.safe_load(path.read_text())
    for k, v in sections.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) else v
    path.write_text(yaml.safe_dump(d, sort_keys=False))


def names(stage: str, arms: list[str], seeds: list[int]) -> set[str]:
    return {f"{stage}@{a}-{s}" for a in arms for s in seeds}


def basis_runs(seeds: list[int]) -> set[str]:
    """The stages of the runs that read the basis, for `seeds`: the arms' and their controls', trained, evaluated."""
    out = names("train", ARMS, seeds) | names("evaluate", ARMS, seeds)
    return out | names("train_control", CONTROLS, seeds) | names("evaluate_control", CONTROLS, seeds)


def tree_hash(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode() + f.read_bytes())
    return h.hexdigest()


ALL_STAGES = (
    {
        "check_params",
        "problems",
        "organism",
        "organism_report",
        "basis",
        "pool",
        "phenomenon",
        "eval_sets",
        "probe",
        "oracle_basis",
        "report",
    }
    | names("train_ref", ARMS_REF, [SEED])
    | names("evaluate_ref", ARMS_REF, [SEED])
    | basis_runs([SEED])
)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The repository's pipeline (dvc.yaml, stages/, src/, data/) with TINY params, git-committed after one cold
    `dvc repro`; yields (root, stages that ran)."""
    root = tmp_path_factory.mktemp("pipeline") / "repo"
    root.mkdir()
    for d in ("src", "stages"):
        shutil.copytree(ROOT / d, root / d, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(ROOT / "data", root / "data")
    for f in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / f, root / f)
    set_params(root, **TINY)
    shutil.copy(ROOT / ".gitignore", root / ".gitignore")
    sh(root, "git", "init", "-q", "-b", "main")
    dvc(root, "init", "-q")
    dvc(root, "config", "core.analytics", "false")
    dvc(root, "config", "core.check_update", "false")
    ran = reproduce(root)
    sh(root, "git", "add", "-A")
    sh(root, *GIT, "commit", "-qm", "tiny pipeline")
    yield root, ran


@pytest.fixture
def project(built, tmp_path):
    """A private copy of the built project (git history and DVC cache included)."""
    root = tmp_path / "repo"
    shutil.copytree(built[0], root, symlinks=True)
    return root


def test_cold_repro_runs_every_stage_then_a_no_op_runs_nothing(built, project):
    assert built[1] == ALL_STAGES
    assert (project / "reports" / "results.md").read_text().startswith("#")
    assert reproduce(project) == set()
    assert "up to date" in dvc(project, "status").stdout


def test_a_rerun_reproduces_every_hash_and_timings_stay_out_of_the_tree(project):
    """Outputs depend only on inputs: the organism (timed SFT) and a GRPO run (timed steps), re-run from scratch,
    leave dvc.lock and every tracked file byte-identical; their wall-clock times go to the untracked logs/."""
    lock = (project / "dvc.lock").read_text()
    shutil.rmtree(project / "artifacts" / "organism")
    shutil.rmtree(project / "artifacts" / "train" / "ref" / "vanilla" / f"s{SEED}")
    target = f"train_ref@vanilla-{SEED}"
    dvc(project, "repro", "-s", "organism", target)
    assert (project / "dvc.lock").read_text() == lock
    assert sh(project, "git", "status", "--porcelain").stdout == ""
    assert reproduce(project) == set()
    t = yaml.safe_load((project / "logs" / "organism.json").read_text())
    assert set(t) == {"train_s_base", "train_s_teacher"} and min(t.values()) > 0
    rows = (project / "logs" / "train" / "ref" / f"vanilla-s{SEED}.tsv").read_text().splitlines()
    assert rows[0].split("\t")[:2] == ["step", "dt"] and len(rows) == 1 + TINY["grpo"]["steps"]
    assert "dt" not in (project / f"reports/train/ref/vanilla-s{SEED}.tsv").read_text().splitlines()[0].split("\t")


@pytest.mark.parametrize(
    ("sections", "msg"),
    [
        ({"basis": {"pairset": "no_such_set"}}, "basis.pairset 'no_such_set' is not a known pair set"),
        ({"arms": ARMS + ["no_such_arm"]}, "arms: ['no_such_arm'] not in params.yaml's arm table"),
        ({"arms": ARMS + ["vanilla"]}, "arms in the wrong list: vanilla (basis-free: arms_ref)"),
        ({"controls": ["measure_only"]}, "arm measure_only: edit measure_only edits nothing, so it has no control"),
        ({"grpo": {"steps": "many"}}, "grpo.steps must be an integer, got 'many'"),
    ],
)
def test_bad_params_stop_the_pipeline_before_any_output_is_touched(project, sections, msg):
    """A bad value ends `dvc repro` with the project's one-line error, before DVC deletes any stage's outputs: the
    tree is as committed (but params.yaml), no directory appears, dvc.lock is untouched. The one file gone is the
    check's own constant stamp (DVC removes it to re-run the check), which the next valid run writes back."""

    def tree() -> list[Path]:
        return sorted(p for p in project.rglob("*") if not {".git", ".dvc"} & set(p.relative_to(project).parts))

    lock, files = (project / "dvc.lock").read_text(), tree()
    set_params(project, **sections)
    res = dvc(project, "repro", check=False)
    assert res.returncode != 0 and f"error: {msg}" in res.stderr + res.stdout
    assert sh(project, "git", "status", "--porcelain").stdout.split("\n")[0] == " M params.yaml"
    assert len(sh(project, "git", "status", "--porcelain").stdout.strip().splitlines()) == 1
    assert (project / "dvc.lock").read_text() == lock
    assert tree() == [f for f in files if f.name != "check_params.ok"]


def test_pairset_change_reruns_the_basis_and_what_reads_it_and_side_by_side_repro_equals_it(project, tmp_path):
    """A pair-set change (what `dvc exp run -S basis.pairset=prog_wider` writes) makes `dvc repro` re-run exactly the
    basis and what reads it. `python -m projected_grpo.repro -j 2` on a copy runs those same stages (two at a time,
    each through `dvc repro -s`; the check_params stamp changes nothing downstream, so DVC skips those) and leaves
    the same dvc.lock, with nothing left to reproduce."""
    serial = tmp_path / "serial"
    shutil.copytree(project, serial, symlinks=True)
    for root in (project, serial):
        set_params(root, basis={"pairset": "prog_wider"})
    dry = sh(project, sys.executable, "-m", "projected_grpo.repro", "--dry").stdout.split()
    ran = reproduce(serial)
    assert ran == {"check_params", "basis", "probe", "oracle_basis", "report"} | basis_runs([SEED])
    assert ran <= set(dry) and dry.index("basis") < dry.index("report")
    res = sh(project, sys.executable, "-m", "projected_grpo.repro", "-j", "2")
    events = [ln.split("] ", 1)[1].split() for ln in res.stdout.splitlines() if ln.startswith("[")]
    assert {s for what, s in events if what == "done"} == ran, res.stdout + res.stderr
    assert {s for what, s in events if what == "skip"} == set(dry) - ran
    assert f"done: {len(ran)} stage(s) ran" in res.stdout
    assert (project / "dvc.lock").read_text() == (serial / "dvc.lock").read_text()
    assert "up to date" in dvc(project, "status").stdout


def test_a_new_seed_runs_only_that_seed_and_the_reports(project):
    set_params(project, seeds=[SEED, 42])
    ran = reproduce(project)
    new = names("train_ref", ARMS_REF, [42]) | names("evaluate_ref", ARMS_REF, [42]) | basis_runs([42])
    assert ran == new | {"check_params", "phenomenon", "oracle_basis", "report"}
    assert "seeds 41, 42" in (project / "reports" / "results.md").read_text().lower().replace("[", "").replace("]", "")


def test_experiment_run_and_show(project):
    dvc(project, "exp", "run", "-n", "boot500", "-S", "probe.n_boot=500")
    # the README's narrowed table: experiment name, the changed param, deploy hack and solve per run key
    res = dvc(
        project,
        "exp",
        "show",
        "--md",
        "--no-pager",
        "--drop",
        ".*",
        "--keep",
        r"Experiment|probe\.n_boot|[a-z_+]+/deploy_(solve|hack_train)$",
    )
    rows = [
        [c.strip() for c in line.strip("|").split("|")] for line in res.stdout.splitlines() if line.startswith("|")
    ]
    header, body = rows[0], rows[2:]
    exp = next(r for r in body if "boot500" in r[0])
    assert exp[header.index("probe.n_boot")] == "500"
    for arm in RUN_KEYS:
        for key in (f"{arm}/deploy_solve", f"{arm}/deploy_hack_train"):
            assert 0 <= float(exp[header.index(key)]) <= 1, (key, exp)  # the experiment's own metrics, per arm


def test_every_stage_runs_its_own_checkout_of_the_code():
    """Queued and temp experiments run in a copy of the workspace; with an editable install they would silently
    import the main workspace's package unless the command puts the copy's src/ first (docs/dvc.md §6.4).
    OpenMP threads sleep instead of spinning while they wait (OMP_WAIT_POLICY=PASSIVE, read when torch loads
    libgomp, so it is set in the command): a 2-thread step next to two busy processes is 2.6x as slow, not 13.5x
    (reports/bench/threads.md)."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert all(st["cmd"].startswith("PYTHONPATH=src OMP_WAIT_POLICY=PASSIVE python stages/") for st in stages.values())


def test_remote_round_trip_reproduces_nothing_and_the_same_results(project, tmp_path):
    remote = tmp_path / "remote"
    dvc(project, "remote", "add", "-d", "store", str(remote))
    sh(project, "git", "add", ".dvc/config")
    sh(project, *GIT, "commit", "-qm", "remote")
    dvc(project, "push")
    clone = tmp_path / "clone"
    sh(tmp_path, "git", "clone", "-q", str(project), str(clone))
    dvc(clone, "pull")
    assert reproduce(clone) == set()
    for f in ("reports/results.md", "reports/metrics.json"):
        assert (clone / f).read_bytes() == (project / f).read_bytes()
    for d in ("artifacts/organism", "artifacts/basis", f"artifacts/train/ref/vanilla/s{SEED}"):
        assert tree_hash(clone / d) == tree_hash(project / d)


def test_killed_repro_resumes_train_from_its_last_checkpoint(built, tmp_path):
    steps, kill_after = 12, 3
    roots = {}
    for name in ("whole", "killed"):
        root = roots[name] = tmp_path / name
        shutil.copytree(built[0], root, symlinks=True)
        set_params(root, grpo={"steps": steps})
    target = f"train_ref@vanilla-{SEED}"
    run_dir = f"artifacts/train/ref/vanilla/s{SEED}"
    assert reproduce(roots["whole"], target) == {"check_params", target}  # grpo.steps changed: the check re-runs

    root = roots["killed"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "dvc", "repro", target],
        cwd=root,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    ckpt = root / run_dir / f"step_{kill_after:05d}.pt"
    deadline = time.monotonic() + 300
    while not ckpt.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # dvc and its stage command, mid-run
    proc.wait()
    assert ckpt.exists(), "the run ended or stalled before the kill"
    done = sorted((root / run_dir).glob("step_*.pt"))
    assert not (root / run_dir / f"step_{steps:05d}.pt").exists(), "killed too late: the run had finished"
    kept = {f.name: f.stat().st_mtime_ns for f in done}

    assert reproduce(root, target) == {target}
    after = {f.name: f.stat().st_mtime_ns for f in (root / run_dir).glob("step_*.pt")}
    assert all(after[n] == t for n, t in kept.items() if n != done[-1].name), "resume rewrote earlier checkpoints"
    assert len(after) == steps + 1
    final = f"step_{steps:05d}.safetensors"
    assert (root / run_dir / final).read_bytes() == (roots["whole"] / run_dir / final).read_bytes()
    log = (root / f"reports/train/ref/vanilla-s{SEED}.tsv").read_text().splitlines()
    assert [int(x.split("\t")[0]) for x in log[1:]] == list(range(1, steps + 1))  # each step logged once

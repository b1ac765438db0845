"""`projected_grpo.repro`: which stages run, and that running them side by side respects the DAG.

Run: pytest tests/test_repro.py -q
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import yaml

from projected_grpo.repro import commit_stage, run_stages, to_resume, to_run
from tests.conftest import ROOT

# problems -> organism -> (pool, basis) -> train@a, train@b -> evaluate@a, evaluate@b -> report
DEPS = {
    "problems": set(),
    "organism": {"problems"},
    "pool": {"organism"},
    "basis": {"organism"},
    "train@a": {"pool", "basis"},
    "train@b": {"pool", "basis"},
    "evaluate@a": {"train@a"},
    "evaluate@b": {"train@b"},
    "report": {"evaluate@a", "evaluate@b"},
}


def test_to_run_is_what_dvc_repro_would_run():
    assert to_run(DEPS, {"train@a"}, None) == {"train@a", "evaluate@a", "report"}
    assert to_run(DEPS, {"basis"}, None) == {"basis", "train@a", "train@b", "evaluate@a", "evaluate@b", "report"}
    assert to_run(DEPS, {"basis"}, {"evaluate@b"}) == {"basis", "train@b", "evaluate@b"}  # only what the target needs
    assert to_run(DEPS, set(), None) == set()
    assert to_run(DEPS, {"organism", "train@b"}, {"pool"}) == {"organism", "pool"}


def test_to_resume_runs_the_unlocked_and_the_missing_outputs_they_need():
    """On a machine without the cache: train@a and evaluate@a are locked (evaluate@a's report is in git, train@a's
    checkpoints are not here); train@b, evaluate@b and report are not. The upstream they need is rebuilt; train@a
    is not (report reads evaluate@a's file, which is here)."""
    locked = {"problems", "organism", "pool", "basis", "train@a", "evaluate@a"}
    missing = {"problems", "organism", "pool", "basis", "train@a"}
    assert to_resume(DEPS, locked, missing) == {
        "problems",
        "organism",
        "pool",
        "basis",
        "train@b",
        "evaluate@b",
        "report",
    }
    # upstream whose outputs are here is not rebuilt; a missing locked stage nothing unlocked needs is left alone
    assert to_resume(DEPS, locked, {"train@a"}) == {"train@b", "evaluate@b", "report"}
    assert to_resume(DEPS, set(DEPS), set(DEPS)) == set()
    # evaluate@a's file missing too: it and its training are re-run for the report
    assert "train@a" in to_resume(DEPS, locked, missing | {"evaluate@a"})


class Recorder:
    """A fake stage runner: sleeps, records start/end order and the largest number running at once."""

    def __init__(self, fail: set[str] = frozenset(), dt: float = 0.1):
        self.lock, self.now, self.peak, self.fail, self.dt = threading.Lock(), 0, 0, fail, dt
        self.start: dict[str, int] = {}
        self.end: dict[str, int] = {}
        self.clock = 0

    def __call__(self, stage: str) -> int:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
            self.clock += 1
            self.start[stage] = self.clock
        time.sleep(self.dt)
        with self.lock:
            self.now -= 1
            self.clock += 1
            self.end[stage] = self.clock
        return 1 if stage in self.fail else 0


@pytest.mark.parametrize("jobs", [1, 2, 3])
def test_run_stages_respects_the_dag_and_the_job_limit(jobs):
    rec = Recorder()
    assert run_stages(DEPS, set(DEPS), jobs, rec) == []
    assert set(rec.start) == set(DEPS)  # every stage once
    for n, ds in DEPS.items():
        assert all(rec.end[d] < rec.start[n] for d in ds), n  # after everything it reads has finished
    assert rec.peak == min(jobs, 2)  # the DAG is at most 2 wide; never above the limit


def test_run_stages_runs_only_todo_and_ignores_done_upstream():
    rec = Recorder()
    todo = {"train@a", "evaluate@a", "report"}
    assert run_stages(DEPS, todo, 2, rec) == []
    assert set(rec.start) == todo and rec.end["train@a"] < rec.start["evaluate@a"] < rec.start["report"]


def test_run_stages_finishes_chains_first():
    """A finished training's evaluation starts before the next training, and one draw's chain (two organisms on one
    core) is finished before the next draw's organism starts: a run stopped part way leaves whole chains."""
    rec = Recorder(dt=0.01)
    assert run_stages(DEPS, set(DEPS), 1, rec) == []
    assert rec.end["train@a"] < rec.start["evaluate@a"] < rec.start["train@b"]
    two = {f"{n}{d}": {f"{x}{d}" for x in ds} for d in "01" for n, ds in DEPS.items()}
    rec = Recorder(dt=0.01)
    assert run_stages(two, set(two), 1, rec) == []
    first = min(("0", "1"), key=lambda d: rec.start[f"organism{d}"])
    other = "1" if first == "0" else "0"
    assert rec.end[f"report{first}"] < rec.start[f"organism{other}"]


class FailsFirst(Recorder):
    """train@a fails at once; train@b, running beside it, ends only well after train@a has returned (so the order
    does not depend on the machine's load: a busy CI once let train@b finish first, which legitimately starts
    evaluate@b)."""

    def __init__(self):
        super().__init__(fail={"train@a"}, dt=0.0)
        self.a_done = threading.Event()

    def __call__(self, stage: str) -> int:
        if stage == "train@b":
            assert self.a_done.wait(timeout=30), "train@a never ended"
            time.sleep(0.2)  # train@a's result reaches the scheduler first
        status = super().__call__(stage)
        if stage == "train@a":
            self.a_done.set()
        return status


def test_a_failure_starts_nothing_new_and_is_reported():
    rec = FailsFirst()
    failed = run_stages(DEPS, set(DEPS), 2, rec)
    assert failed == ["train@a"]
    assert "evaluate@a" not in rec.start and "report" not in rec.start
    assert "train@b" in rec.start and "train@b" in rec.end  # ran beside it: finished, not killed
    assert "evaluate@b" not in rec.start  # nothing new after the failure


def test_jobs_must_be_positive():
    with pytest.raises(ValueError, match="--jobs"):
        run_stages(DEPS, set(DEPS), 0, Recorder())


def test_bad_invocations_end_in_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "DVC_NO_ANALYTICS": "1"}
    cases = [
        (tmp_path, [], "error: run this in the repository root"),
        (ROOT, ["no_such_stage", "--dry"], "error: unknown stage(s) ['no_such_stage']"),
        (ROOT, ["check_params", "--fresh-machine", "--dry"], "error: --fresh-machine picks its own stages"),
    ]
    for cwd, args, msg in cases:
        r = subprocess.run(
            [sys.executable, "-m", "projected_grpo.repro", *args], cwd=cwd, env=env, capture_output=True, text=True
        )
        assert r.returncode == 2 and r.stderr.startswith(msg) and len(r.stderr.splitlines()) == 1, r.stderr


def test_commit_stage_commits_the_lock_and_tracked_outputs_only(tmp_path):
    """The lock and the stage's git-tracked outputs go into one commit; its ignored (DVC-cached) output, and
    whatever else was staged, do not; nothing changed, no commit."""

    def g(*a):
        return subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    g("init", "-q")
    g("config", "user.email", "t@t")
    g("config", "user.name", "t")
    (tmp_path / ".gitignore").write_text("/artifacts/\n")
    (tmp_path / "dvc.lock").write_text("stages: {}\n")
    g("add", "-A")
    g("commit", "-qm", "init")
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / "ckpt").write_text("x")
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "s.json").write_text("{}")
    (tmp_path / "dvc.lock").write_text("stages: {s: {}}\n")
    (tmp_path / "other.txt").write_text("mine")
    g("add", "other.txt")
    outs = ["artifacts/ckpt", "reports/s.json", "reports/absent.tsv"]
    msg = commit_stage(tmp_path, "dvc.lock", outs, "s")
    assert msg and "s finished" in msg
    assert sorted(g("show", "--name-only", "--format=", "HEAD").split()) == ["dvc.lock", "reports/s.json"]
    assert g("diff", "--cached", "--name-only").split() == ["other.txt"]  # still staged, not committed
    assert commit_stage(tmp_path, "dvc.lock", outs, "s") is None


@pytest.mark.parametrize("same", [True, False])
def test_fresh_machine_rebuilds_upstream_and_stops_when_it_differs(tmp_path, same):
    """A DVC repo whose stage `a` is locked but whose cache and outputs are gone (a new machine): `--fresh-machine`
    rebuilds `a` for the unlocked `b`; when `a` comes out as locked, `b` runs; when not (`same` False: `a` writes
    random bytes), the run stops with a one-line error before `b` starts."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "DVC_NO_ANALYTICS": "1"}

    def sh(*a, check=True):
        return subprocess.run(a, cwd=tmp_path, env=env, capture_output=True, text=True, check=check)

    sh("git", "init", "-q")
    sh("dvc", "init", "-q")
    write = "open('a.txt','w').write(" + ("'fixed'" if same else "__import__('os').urandom(8).hex()") + ")"
    dvc_yaml = {
        "stages": {
            "a": {"cmd": f'python -c "{write}"', "outs": ["a.txt"]},
            "b": {"cmd": "cp a.txt b.txt", "deps": ["a.txt"], "outs": [{"b.txt": {"cache": False}}]},
        }
    }
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(dvc_yaml))
    sh("dvc", "repro", "-q", "a")
    sh("rm", "-rf", ".dvc/cache", "a.txt")
    r = sh(sys.executable, "-m", "projected_grpo.repro", "-j", "1", "--fresh-machine", check=False)
    if same:
        assert r.returncode == 0 and (tmp_path / "b.txt").read_text() == "fixed", r.stdout + r.stderr
    else:
        assert r.returncode == 1 and not (tmp_path / "b.txt").exists()
        assert "error: a was rebuilt with other outputs than the lock's" in r.stderr


def test_push_sends_the_named_stages_to_an_in_repo_remote_and_commits_it(tmp_path):
    """`--push store --push-stages a --commit` on a tiny DVC repo whose remote lives in the repository: `a`'s output
    lands in the remote and in `a`'s commit; `c` (not named) is not pushed; after the cache and outputs are gone (a new
    machine), `dvc pull -r store a` gives back `a`'s bits. An unknown remote is a one-line error that runs nothing."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "DVC_NO_ANALYTICS": "1"}

    def sh(*a, check=True):
        return subprocess.run(a, cwd=tmp_path, env=env, capture_output=True, text=True, check=check)

    sh("git", "init", "-q")
    sh("git", "config", "user.email", "t@t")
    sh("git", "config", "user.name", "t")
    sh("dvc", "init", "-q")
    sh("dvc", "remote", "add", "store", "store")  # a path relative to here; DVC writes it as ../store
    rnd = "__import__('os').urandom(8).hex()"
    dvc_yaml = {
        "stages": {
            "a": {"cmd": f"python -c \"open('a.txt','w').write({rnd})\"", "outs": ["a.txt"]},
            "c": {"cmd": f"python -c \"open('c.txt','w').write({rnd})\"", "outs": ["c.txt"]},
        }
    }
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(dvc_yaml))
    (tmp_path / ".gitignore").write_text("/a.txt\n/c.txt\n")
    sh("git", "add", "-A")
    sh("git", "commit", "-qm", "init")
    bad = sh(sys.executable, "-m", "projected_grpo.repro", "--push", "nowhere", check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --push: no DVC remote 'nowhere'"), bad.stderr
    assert len(bad.stderr.splitlines()) == 1 and not (tmp_path / "a.txt").exists()

    r = sh(sys.executable, "-m", "projected_grpo.repro", "-j", "1", "--commit", "--push", "store", "--push-stages=a")
    assert "push   a" in r.stdout and "push   c" not in r.stdout, r.stdout
    a_bits = (tmp_path / "a.txt").read_text()
    stored = [p for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert [p.read_text() for p in stored] == [a_bits]  # a's output, not c's
    committed = sh("git", "log", "--name-only", "--format=").stdout.split()
    assert str(stored[0].relative_to(tmp_path)) in committed
    assert sh("git", "status", "--porcelain", "store").stdout == ""  # nothing of the remote left uncommitted

    sh("rm", "-rf", ".dvc/cache", "a.txt")
    sh("dvc", "pull", "-q", "-r", "store", "a")
    assert (tmp_path / "a.txt").read_text() == a_bits


def test_a_stage_running_elsewhere_is_a_one_line_error(tmp_path):
    """While another `dvc repro` runs a stage (its files locked), looking at the pipeline fails in one line naming the
    held file, not with DVC's traceback."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "DVC_NO_ANALYTICS": "1"}
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["dvc", "init", "-q"], cwd=tmp_path, check=True, env=env)
    slow = {"cmd": "python -c \"import time; time.sleep(60); open('a.txt','w').write('a')\"", "outs": ["a.txt"]}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"a": slow}}))
    held = subprocess.Popen(["dvc", "repro", "-q"], cwd=tmp_path, env=env, start_new_session=True)
    try:
        rwlock = tmp_path / ".dvc" / "tmp" / "rwlock"
        for _ in range(300):  # until DVC has taken the stage's files
            if rwlock.exists() and "a.txt" in rwlock.read_text():
                break
            time.sleep(0.1)
        r = subprocess.run(
            [sys.executable, "-m", "projected_grpo.repro", "--dry"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
        assert r.stderr.startswith("error: a running DVC stage holds") and "a.txt" in r.stderr
    finally:
        os.killpg(held.pid, signal.SIGKILL)  # dvc and the stage it runs
        held.wait()

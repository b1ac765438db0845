"""The benchmarks' turn scheduler (benchmarks/harness.py, what benchmarks/train.py's numbers rest on): one worker runs
at a time, rounds rotate, every cycle is recorded, a failure is re-raised. And the rules the benchmarks live by: no
test imports benchmark code (tests run them as a user does, in a process of their own), and a benchmark module does
nothing at import but import and define.

`pytest tests/test_bench_train.py` (no model, no TRL run: the scheduler runs on dummy workers).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

BENCH = ROOT / "benchmarks"

# Dummy workers under the harness's scheduler, in a fresh interpreter that sees the harness as a benchmark script does
# (its folder first on sys.path: here the working directory of `python -c`). argv: names, steps, a worker that raises
# after its first handoff (or ""). Prints what ran in which order, any overlap, the error, and what was recorded.
_SCHEDULE = r"""
import json, sys, threading
from harness import Phases, Scheduler, run_threads

names, steps, fail = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3]
ph = Phases()
sched = Scheduler(names, ph)
running, trace, overlaps, lock = [], [], [], threading.Lock()

def job(name):
    def run():
        for i in range(steps):
            with lock:
                running.append(name)
                if len(running) > 1:
                    overlaps.append(list(running))
                trace.append(name)
            ph.add("reward", 0.0)
            with lock:
                running.remove(name)
            if name == fail and i == 1:
                raise ValueError("boom")
            sched.handoff(name)
    return run

try:
    run_threads({n: job(n) for n in names}, sched)
    error = None
except RuntimeError as e:
    error = str(e)
print(json.dumps({"trace": trace, "overlaps": overlaps, "error": error,
                  "phases": {n: [s["phases"] for s in sched.segments[n]] for n in names},
                  "waits": {n: len(sched.waits[n]) for n in names}}))
"""


def schedule(names: list[str], steps: int, fail: str = "") -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run(
        [sys.executable, "-c", _SCHEDULE, ",".join(names), str(steps), fail],
        cwd=BENCH,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_scheduler_one_at_a_time_rotated_and_recorded():
    names, steps = ["a", "b", "c"], 5
    out = schedule(names, steps)
    assert out["error"] is None and out["overlaps"] == [], out  # never two workers at once
    rounds = [out["trace"][i : i + 3] for i in range(0, len(out["trace"]), 3)]
    assert rounds == [names[r % 3 :] + names[: r % 3] for r in range(steps)]  # order rotated every round
    for n in names:
        phases = out["phases"][n]
        assert len(phases) == steps + 1  # head + (steps - 1) full cycles + tail
        assert all(p == {"reward": 0.0} for p in phases[:steps])  # each cycle's phases recorded with it
        assert out["waits"][n] == steps


def test_scheduler_survives_a_failing_worker():
    out = schedule(["ok", "bad"], 3, fail="bad")
    assert out["error"] is not None and "'bad'" in out["error"] and "boom" in out["error"]  # re-raised, named
    assert len(out["phases"]["ok"]) == 4  # the other worker ran to its end, every cycle recorded
    assert out["overlaps"] == []


# --- the rules ---------------------------------------------------------------------------------------------------

_LOADERS = {"spec_from_file_location", "SourceFileLoader", "import_module", "run_path", "run_module", "__import__"}


def benchmark_imports(path: Path) -> list[str]:
    """Where a file imports benchmark code: `benchmarks` or `benchmarks.*`, a benchmark's own name (the sibling import
    the scripts use, e.g. `harness`), or a loader call (importlib, runpy) that names the benchmarks folder."""
    names = {p.stem for p in BENCH.glob("*.py")}
    out = []
    for n in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        mods = []
        if isinstance(n, ast.Import):
            mods = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            mods = [n.module]
        elif isinstance(n, ast.Call):
            fn = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
            if fn in _LOADERS and "benchmarks" in ast.unparse(n):
                out.append(f"{path.name}:{n.lineno}: {ast.unparse(n)}")
        out += [f"{path.name}:{n.lineno}: {m}" for m in mods if m.split(".")[0] in names | {"benchmarks"}]
    return out


def test_no_test_imports_benchmark_code():
    """Tests exercise the benchmarks as a user runs them, in a process of their own (tests/test_entry_points.py runs
    every one's --help; the scheduler above runs in its own interpreter): a benchmark imported into the test process
    could leave its instrumentation on every later test, and would make its internals an API."""
    found = [x for f in sorted((ROOT / "tests").glob("*.py")) for x in benchmark_imports(f)]
    assert not found, f"tests importing benchmark code: {found}"


def test_the_rule_sees_every_way_in(tmp_path):
    f = tmp_path / "t.py"
    f.write_text(
        "import benchmarks.train\nfrom benchmarks import dag\nfrom harness import Scheduler\nimport os\n"
        "from projected_grpo import harness\n"
        "def g():\n    import importlib.util\n"
        "    importlib.util.spec_from_file_location('b', ROOT / 'benchmarks' / 'train.py')\n"
        "    runpy.run_path('benchmarks/grader.py')\n    importlib.import_module('projected_grpo.rl.train')\n"
    )
    assert sorted(int(x.split(":")[1]) for x in benchmark_imports(f)) == [1, 2, 3, 8, 9]


def _names(target: ast.expr) -> bool:
    """A plain name, or a tuple of them (`A, B = 1, 2`)."""
    return isinstance(target, ast.Name) or (isinstance(target, ast.Tuple) and all(map(_names, target.elts)))


def _is_main_guard(n: ast.stmt) -> bool:
    return isinstance(n, ast.If) and ast.unparse(n.test) in ('__name__ == "__main__"', "__name__ == '__main__'")


def test_benchmarks_only_import_and_define_at_import():
    """Top-level statements of a benchmark module: imports, definitions, constants bound to plain names, and the
    `if __name__ == "__main__":` that runs it. No call and no assignment to an attribute or item, so importing one
    patches nothing, edits neither sys.path nor the environment, and sets no thread count (its main does, when it
    runs); tests/test_entry_points.py checks the same at run time."""
    bad = []
    for f in sorted(BENCH.glob("*.py")):
        for n in ast.parse(f.read_text(), filename=str(f)).body:
            ok = (
                isinstance(n, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef))
                or (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))  # a docstring
                or (isinstance(n, ast.Assign) and all(_names(t) for t in n.targets))
                or (isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))
                or _is_main_guard(n)
            )
            if not ok:
                bad.append(f"{f.name}:{n.lineno}: {ast.unparse(n)[:80]}")
    assert not bad, f"done at import: {bad}"


# benchmarks/dag.py's arithmetic, in a fresh interpreter as above: stage times from a resumed `repro -j` log, list
# scheduling, and what a basis change re-runs.
_DAG = r"""
import json
from dag import downstream, resumed_train_times, simulate, stage_times

log = ["[  0 s] start  a", "[  5 s] start  b", "[ 10 s] done   a", "[ 12 s] start  b", "[ 30 s] done   b"]
deps = {"a": set(), "basis": {"a"}, "t1": {"basis"}, "t2": {"basis"}, "other": {"a"}, "report": {"t1", "t2", "other"}}
dur = {"a": 10.0, "basis": 5.0, "t1": 20.0, "t2": 20.0, "other": 30.0, "report": 1.0}
sub, sub_deps = downstream("basis", dur, deps)
print(json.dumps({"times": stage_times(log), "one": simulate(dur, deps, 1), "two": simulate(dur, deps, 2),
                  "sub": sorted(sub), "sub_deps": {k: sorted(v) for k, v in sub_deps.items()},
                  "sub_two": simulate(sub, sub_deps, 2),
                  "resumed": resumed_train_times({"t1": 110.0, "t2": 95.0, "t3": 12.0, "e": 5.0},
                                                 {"t1": {"step": 100.0}, "t2": {"step": 90.0}, "t3": {"step": 80.0},
                                                  "e": {"wall": 5.0}})}))
"""


def test_dag_benchmark_times_schedules_and_downstream():
    r = subprocess.run([sys.executable, "-c", _DAG], cwd=BENCH, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["times"] == {"a": 10.0, "b": 18.0}  # a stage started again keeps its last span
    assert out["one"] == 86.0  # the sum
    # two at a time: a (0-10); then other (10-40) beside basis (10-15), t1 (15-35), t2 (35-55); report 55-56
    assert out["two"] == 56.0
    assert out["sub"] == ["basis", "report", "t1", "t2"]  # `other` does not read the basis
    assert out["sub_deps"] == {"basis": [], "report": ["t1", "t2"], "t1": ["basis"], "t2": ["basis"]}
    assert out["sub_two"] == 26.0  # basis 0-5, t1 and t2 side by side 5-25, report 25-26
    # t3's log span (12 s) is shorter than its 80 s of steps: resumed; start-up = median(10, 5) = 7.5 s
    assert out["resumed"] == {"t3": 87.5}

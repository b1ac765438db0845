"""benchmarks/train.py's turn scheduler: one worker runs at a time, rounds rotate, every cycle is recorded.

`pytest tests/test_bench_train.py` (no model, no TRL run: only the interleaving the benchmark's numbers rest on).
"""

import importlib.util
import sys
import threading

from tests.conftest import ROOT


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_train", ROOT / "benchmarks" / "train.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_scheduler_one_at_a_time_rotated_and_recorded():
    bench = load_bench()
    names, steps = ["a", "b", "c"], 5
    ph = bench.Phases()
    sched = bench.Scheduler(names, ph)
    running, trace, lock = [], [], threading.Lock()

    def job(name):
        def run():
            for _ in range(steps):
                with lock:
                    running.append(name)
                    assert len(running) == 1, f"two workers ran at once: {running}"
                    trace.append(name)
                ph.add("reward", 0.0)
                with lock:
                    running.remove(name)
                sched.handoff(name)

        return run

    bench.run_threads({n: job(n) for n in names}, sched, threads=1)
    rounds = [trace[i : i + 3] for i in range(0, len(trace), 3)]
    assert rounds == [names[r % 3 :] + names[: r % 3] for r in range(steps)]  # order rotated every round
    for n in names:
        segs = sched.segments[n]
        assert len(segs) == steps + 1  # head + (steps - 1) full cycles + tail
        assert all(s["phases"] == {"reward": 0.0} for s in segs[:steps])
        assert len(sched.waits[n]) == steps


def test_scheduler_survives_a_failing_worker():
    bench = load_bench()
    sched = bench.Scheduler(["ok", "bad"], bench.Phases())

    def ok():
        for _ in range(3):
            sched.handoff("ok")

    def bad():
        sched.handoff("bad")
        raise ValueError("boom")

    try:
        bench.run_threads({"ok": ok, "bad": bad}, sched, threads=1)
    except RuntimeError as e:
        assert "bad" in str(e)
    else:
        raise AssertionError("the failure must be re-raised")
    assert len(sched.segments["ok"]) == 4

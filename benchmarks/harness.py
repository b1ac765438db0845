"""The benchmarks' timing harness: what the scripts in this folder share, and nothing that is one benchmark's own.

It owns
* where a report says it ran: the repository root (`ROOT`, `shown`), the machine (`cpu_name`, `machine`), its load
  (`loadavg`), a checkout's commit (`short_commit`);
* timing: one call (`timed`), one command in a fresh process (`timed_run`, `src_env` for a child that imports this
  checkout's package), variants side by side in one process with the order rotated every round (`rotated`,
  `interleaved`), and workers in threads that take turns, one running at a time (`Scheduler`, `run_threads`), with
  per-thread phase timers (`Phases`) installed by wrapping library functions for the length of a block (`patched`);
* statistics of timings (`median`, `quartiles`);
* the report: a markdown table head (`md_row`, `md_head`) and the file, written atomically (`write_report`).

A benchmark is a script, `python benchmarks/<name>.py` from the repository root: Python puts this folder first on
sys.path, so the benchmarks import the harness as a sibling (`from harness import ...`). Importing the harness (or a
benchmark) changes nothing: no patching, no sys.path, environment or thread settings; what a benchmark instruments it
instruments inside `patched`, while it runs. The harness needs only the standard library (and
`projected_grpo.common.atomic` when it writes a report). The folder is not a package: `python -m benchmarks.<name>`
does not find the harness. Tests never import it: tests/test_bench_train.py runs the scheduler in an interpreter of
its own, as a benchmark does.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# --- where it ran -----------------------------------------------------------------------------------------------


def shown(path: Path) -> Path:
    """`path` as a report's re-run command shows it: relative to the repository when it lies inside it."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def cpu_name() -> str:
    return platform.processor() or platform.machine()


def machine() -> str:
    """The machine line: "<platform>, <cpu>, <n> CPU cores"."""
    return f"{platform.platform()}, {cpu_name()}, {os.cpu_count()} CPU cores"


def loadavg(n: int = 3) -> str:
    """The first `n` of the 1-, 5- and 15-minute load averages: "0.8 / 1.0 / 1.2"."""
    return " / ".join(f"{x:.1f}" for x in os.getloadavg()[:n])


def short_commit(checkout: Path) -> str:
    """The short hash of the checkout's HEAD; "" when it is not a git checkout."""
    r = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip()


# --- timing -----------------------------------------------------------------------------------------------------


def timed(fn: Callable[[], object], sync: Callable[[], object] | None = None) -> tuple[object, float]:
    """(fn(), its wall seconds). `sync` (e.g. torch.cuda.synchronize) runs before the clock starts and before it
    stops, so queued device work is counted where it was launched."""
    if sync is not None:
        sync()
    t = time.perf_counter()
    out = fn()
    if sync is not None:
        sync()
    return out, time.perf_counter() - t


def timed_run(cmd: list[str], **kw) -> tuple[subprocess.CompletedProcess, float]:
    """`subprocess.run(cmd, **kw)` in a fresh process -> (its result, wall seconds, start-up and imports included)."""
    t = time.perf_counter()
    r = subprocess.run(cmd, **kw)
    return r, time.perf_counter() - t


def src_env(root: Path = ROOT, **extra: str) -> dict[str, str]:
    """This environment for a child process, with `root`'s src/ (default: this checkout's) first on PYTHONPATH, plus
    `extra`."""
    return {**os.environ, "PYTHONPATH": f"{root / 'src'}:{os.environ.get('PYTHONPATH', '')}", **extra}


def rotated(names: Sequence[str], r: int) -> list[str]:
    """Round r's order: `names` rotated by r, so that over len(names) rounds each takes each position once."""
    k = r % len(names)
    return [*names[k:], *names[:k]]


def interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[tuple[float, float]]]:
    """One warm-up call each, then `repeats` rounds; round i runs the variants in the order rotated by i.

    Returns {variant: [(cpu seconds, wall seconds), ...]}: process CPU time (all threads of this process) is the
    primary measure, since on a shared 2-core machine wall time mostly measures how often the scheduler lets us run."""
    names = list(fns)
    for n in names:
        fns[n]()
    times: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    for i in range(repeats):
        for n in rotated(names, i):
            c, w = time.process_time(), time.perf_counter()
            fns[n]()
            times[n].append((time.process_time() - c, time.perf_counter() - w))
    return times


class Phases:
    """Per-thread wall-time accumulators; a wrapped call inside another wrapped call counts only for the outer one."""

    def __init__(self) -> None:
        self.tls = threading.local()
        self.acc: dict[str, dict[str, float]] = {}
        self.lock = threading.Lock()

    def add(self, phase: str, seconds: float) -> None:
        name = threading.current_thread().name
        with self.lock:
            d = self.acc.setdefault(name, {})
            d[phase] = d.get(phase, 0.0) + seconds

    def take(self, name: str) -> dict[str, float]:
        with self.lock:
            return self.acc.pop(name, {})

    def call(self, phase, fn, *a, **k):
        """fn(*a, **k), its wall time added to `phase` (a name, or a function called for the name)."""
        if getattr(self.tls, "busy", False):
            return fn(*a, **k)
        name = phase() if callable(phase) else phase
        self.tls.busy = True
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            self.tls.busy = False
            self.add(name, time.perf_counter() - t)

    def wrap(self, phase, fn):
        @functools.wraps(fn)
        def w(*a, **k):
            return self.call(phase, fn, *a, **k)

        return w


@contextlib.contextmanager
def patched(patches: list[tuple[object, str, object]]) -> Iterator[None]:
    """Set `obj.attr = value` for each (obj, attr, value) while the block runs; the originals are put back after, in
    reverse order. How a benchmark instruments a library: wrap (never edit) its functions, only while it runs."""
    saved = []
    try:
        for obj, attr, value in patches:
            saved.append((obj, attr, getattr(obj, attr)))
            setattr(obj, attr, value)
        yield
    finally:
        for obj, attr, orig in reversed(saved):
            setattr(obj, attr, orig)


class Scheduler:
    """Exactly one worker thread runs at a time. A worker hands the turn over at its `handoff` (benchmarks/train.py:
    inside its reward call, once per step); round r runs the active workers in the order rotated by r. The work
    between two handoffs of one worker is recorded as a segment: wall, process CPU, and the phases timed meanwhile."""

    def __init__(self, names: list[str], ph: Phases):
        self.names, self.active, self.ph = list(names), list(names), ph
        self.cv = threading.Condition()
        self.round = 0
        self.queue = self._order(0)
        self.holder: str | None = self.queue.pop(0)
        self.segments: dict[str, list[dict]] = {n: [] for n in names}
        self.waits: dict[str, list[float]] = {n: [] for n in names}
        self.rounds: list[list[str]] = [[self.holder]]  # who ran in which round, in order (for the record)
        self._t: dict[str, tuple[float, float]] = {}

    def _order(self, r: int) -> list[str]:
        return [n for n in rotated(self.names, r) if n in self.active]

    def _next(self) -> None:
        while self.active:
            if not self.queue:
                self.round += 1
                self.queue = self._order(self.round)
                self.rounds.append([])
            n = self.queue.pop(0)
            if n in self.active:
                self.holder = n
                self.rounds[-1].append(n)
                return
        self.holder = None

    def _mark(self, name: str) -> None:
        self._t[name] = (time.perf_counter(), time.process_time())

    def _close(self, name: str) -> None:
        w0, c0 = self._t[name]
        seg = {"wall": time.perf_counter() - w0, "cpu": time.process_time() - c0, "phases": self.ph.take(name)}
        self.segments[name].append(seg)

    def start(self, name: str) -> None:
        with self.cv:
            self.cv.wait_for(lambda: self.holder == name)
        self._mark(name)

    def handoff(self, name: str) -> None:
        self._close(name)
        t = time.perf_counter()
        with self.cv:
            self._next()
            self.cv.notify_all()
            self.cv.wait_for(lambda: self.holder == name)
        self.waits[name].append(time.perf_counter() - t)
        self._mark(name)

    def finish(self, name: str) -> None:
        if name in self._t:
            self._close(name)
        with self.cv:
            self.active.remove(name)
            if self.holder == name:
                self._next()
            self.cv.notify_all()


def run_threads(
    jobs: dict[str, Callable[[], object]], sched: Scheduler, init: Callable[[], object] | None = None
) -> None:
    """Run every job in its own thread (named after it) under `sched`, `init()` first in each thread (e.g. its torch
    thread count); re-raise the first failure."""
    errors: dict[str, BaseException] = {}

    def work(name: str, fn) -> None:
        if init is not None:
            init()
        sched.start(name)
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            errors[name] = e
        finally:
            sched.finish(name)

    ts = [threading.Thread(target=work, args=(n, f), name=n, daemon=True) for n, f in jobs.items()]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        name, e = next(iter(errors.items()))
        raise RuntimeError(f"configuration {name!r} failed: {e!r}") from e


# --- statistics -------------------------------------------------------------------------------------------------


def median(xs: Sequence[float]) -> float:
    """The median; NaN for no values (a run too short to time any)."""
    return statistics.median(xs) if xs else float("nan")


def quartiles(xs: Sequence[float]) -> tuple[float, float]:
    """(first, third) quartile, inclusive method; a single value is both, no value NaN."""
    if len(xs) < 2:
        return (xs[0], xs[0]) if xs else (float("nan"), float("nan"))
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


# --- the report -------------------------------------------------------------------------------------------------


def md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def md_head(cols: Sequence[str]) -> list[str]:
    """A markdown table's header and separator lines."""
    return [md_row(cols), "|" + "---|" * len(cols)]


def write_report(path: Path, content: str | list[str]) -> str:
    """Write the report (lines, joined with a final newline, or text as it is) atomically, parents created: an
    interrupted run leaves the previous report, never half of one. Returns the text."""
    # the package's one atomic writer, imported here: the harness itself imports with any checkout's package on the
    # path, or none (grader.py's before/after workers import another checkout's)
    from projected_grpo.common.atomic import write_text

    text = "\n".join(content) + "\n" if isinstance(content, list) else content
    write_text(path, text)
    return text

"""One-line progress prints and per-step TSV rows with the same fixed keys (house_style §8)."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

PRINT_KEYS = ("reward", "hack", "solve", "kl", "gnorm", "routed", "dt")


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.6g}"
    return str(v)


# Wall-clock timings differ run to run, so they never go into a hashed output (a DVC out, which a re-run would then
# change and every stage reading it re-run): StepLog writes them to a separate, plain timings log.
def is_timing(key: str) -> bool:
    """`dt` (a step's wall time) and `t_<phase>` (its parts, `PhaseTimer`) are timings."""
    return key == "dt" or key.startswith("t_")


class PhaseTimer:
    """Wall seconds per named phase of a step: `with timer("grade"): ...`; `totals()` -> {"t_grade": s, ...}, every
    declared phase present (0 when it did not run), so a TSV's columns are the same every step."""

    def __init__(self, phases: tuple[str, ...] = ()) -> None:
        self.s: dict[str, float] = dict.fromkeys(phases, 0.0)

    @contextlib.contextmanager
    def __call__(self, phase: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.s[phase] = self.s.get(phase, 0.0) + time.perf_counter() - t

    def totals(self) -> dict[str, float]:
        return {f"t_{k}": v for k, v in self.s.items()}


class _Tsv:
    """A TSV with a fixed header (the first row's keys); on resume, rows of steps after `resume_step` are dropped."""

    def __init__(self, path: Path | str, resume_step: int = 0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.keys: list[str] | None = None
        if resume_step and self.path.exists():  # keep the rows of steps already done, drop the rest
            lines = self.path.read_text().splitlines()
            self.keys = lines[0].split("\t")
            kept = [ln for ln in lines[1:] if int(ln.split("\t")[0]) <= resume_step]
            self.path.write_text("\n".join([lines[0], *kept]) + "\n")
        elif self.path.exists():
            self.path.unlink()

    def append(self, row: dict[str, object]) -> None:
        if self.keys is None:
            self.keys = list(row)
            self.path.write_text("\t".join(self.keys) + "\n")
        with self.path.open("a") as f:
            f.write("\t".join(_fmt(row.get(k, float("nan"))) for k in self.keys) + "\n")


class StepLog:
    """Appends one TSV row per step to `path` (header written once; columns fixed by the first row), the
    timings (`is_timing`) to `timings` instead (dropped without one); returns the step's one-line progress print."""

    def __init__(self, path: Path | str, resume_step: int = 0, timings: Path | str | None = None):
        self.path = Path(path)
        self.main = _Tsv(path, resume_step)
        self.timings = _Tsv(timings, resume_step) if timings is not None else None

    def __call__(self, step: int, total: int, **metrics: float) -> str:
        self.main.append({"step": step, **{k: v for k, v in metrics.items() if not is_timing(k)}})
        if self.timings is not None:
            self.timings.append({"step": step, **{k: v for k, v in metrics.items() if is_timing(k)}})
        shown = " | ".join(f"{k} {_fmt(round(metrics[k], 4))}" for k in PRINT_KEYS if k in metrics)
        return f"step {step}/{total} | {shown}"


def read_tsv(path: Path | str) -> list[dict[str, float]]:
    lines = Path(path).read_text().splitlines()
    keys = lines[0].split("\t")
    return [{k: float(v) for k, v in zip(keys, ln.split("\t"))} for ln in lines[1:]]


def _hms(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


LOG_EVERY_S = 60.0  # seconds between two progress lines in a log


class LogBar:
    """A progress report for a log file: at most one line every `every_s` seconds (default `LOG_EVERY_S`), to `out`
    (stderr), with the count, the rate, the elapsed time, the ETA and the postfix, e.g. `sft: 1200/6000 (20%) 1.14
    it/s, 17:32 elapsed, ETA 70:10 | loss 0.412`; and a last line when the loop ends, if it printed any. A loop shorter
    than `every_s` prints nothing. Iterates like `tqdm` and takes `set_postfix` the same way."""

    def __init__(
        self,
        iterable: Iterable,
        desc: str,
        total: int | None = None,
        initial: int = 0,
        every_s: float | None = None,
        out=None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.iterable, self.desc, self.clock = iterable, desc, clock
        self.every_s = LOG_EVERY_S if every_s is None else every_s
        self.out = out if out is not None else sys.stderr
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
        self.n, self.initial, self.postfix = initial, initial, ""

    def set_postfix(self, **kw) -> None:
        self.postfix = ", ".join(f"{k} {v}" for k, v in kw.items())

    def set_postfix_str(self, s: str) -> None:
        self.postfix = s

    def line(self, elapsed: float) -> str:
        done = self.n - self.initial
        rate = done / elapsed if elapsed > 0 else float("nan")
        count = f"{self.n}/{self.total} ({self.n / self.total:.0%})" if self.total else f"{self.n}"
        eta = f", ETA {_hms((self.total - self.n) / rate)}" if self.total and rate > 0 else ""
        tail = f" | {self.postfix}" if self.postfix else ""
        return f"{self.desc}: {count} {rate:.3g} it/s, {_hms(elapsed)} elapsed{eta}{tail}"

    def __iter__(self) -> Iterator:
        start = last = self.clock()
        printed = False
        for x in self.iterable:
            yield x
            self.n += 1
            now = self.clock()
            if now - last >= self.every_s:
                print(self.line(now - start), file=self.out, flush=True)
                last, printed = now, True
        if printed:
            print(self.line(self.clock() - start) + " (done)", file=self.out, flush=True)


def progress(iterable: Iterable, desc: str, total: int | None = None, initial: int = 0, terminal: bool | None = None):
    """The progress display of a long loop: a tqdm bar on a terminal, `LogBar` lines in a log (nohup, `repro -j 2`'s
    per-stage logs), where a bar would print nothing readable. terminal: whether stderr is one (default: asked)."""
    if terminal is None:
        terminal = sys.stderr.isatty()
    if terminal:
        from tqdm import tqdm

        return tqdm(iterable, desc=desc, total=total, initial=initial, dynamic_ncols=True)
    return LogBar(iterable, desc, total=total, initial=initial)

"""The test suite's wall time, as a user runs it: the README's test command, timed end to end (issue 44, item 6).

Reads the command from the README's first ```bash block (the line after `&&` in its `pytest` line), runs it from the
repository root, and writes reports/bench/tests.md: wall time, the counts pytest reports, the machine, its load
before and after (the suite is CPU-bound, so a busy machine reads slower), the commit, and the 15 slowest tests
(`--durations=15` appended to the command). Target: <= 12 min on the 2-core machine.

  python benchmarks/suite.py            # ~12 min; writes reports/bench/tests.md
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import typer
from harness import ROOT, loadavg, machine, short_commit, write_report

TARGET_MIN = 12.0


def readme_test_command() -> list[str]:
    """The README's test command, e.g. ['python', '-m', 'pytest'] (the part after `&&` on its pytest line)."""
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    line = next(ln for ln in block.splitlines() if "pytest" in ln)
    cmd = re.sub(r"\s+#.*$", "", line).split("&&", 1)[-1].strip()
    return shlex.split(cmd)


def counts(tail: str) -> dict[str, int]:
    """pytest's closing line ('1282 passed, 3 skipped, 12 warnings in …') -> {passed: 1282, skipped: 3, …}."""
    last = [ln for ln in tail.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)][-1]
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|warnings?)", last)}


def main(report: Path = typer.Option(ROOT / "reports/bench/tests.md", help="Markdown report to write.")) -> None:
    cmd = readme_test_command()
    if cmd[:3] != ["python", "-m", "pytest"]:
        raise typer.BadParameter(f"the README's test command is {shlex.join(cmd)!r}, not `python -m pytest …`")
    run = [sys.executable, *cmd[1:], "-p", "no:cacheprovider", "--durations=15"]
    status = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    own = str(report.resolve().relative_to(ROOT)) if report.resolve().is_relative_to(ROOT) else None
    dirty = [ln for ln in status.splitlines() if own is None or not ln.endswith(own)]  # its own report aside
    commit = short_commit(ROOT) + (" with uncommitted changes" if dirty else "")
    before = loadavg()
    t0 = time.perf_counter()
    r = subprocess.run(run, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    out = r.stdout + r.stderr
    c = counts(out)
    slow = re.findall(r"^(\d+\.\d+)s (call|setup|teardown)\s+(\S+)$", out, re.M)
    verdict = "meets" if wall / 60 <= TARGET_MIN and r.returncode == 0 else "misses"
    lines = [
        "# The test suite's wall time (issue 44, item 6)",
        "",
        "Re-run: `python benchmarks/suite.py` (the README's test command, timed end to end; ~12 min).",
        "",
        f"README test command, measured end to end: {wall / 60:.1f} min (`{shlex.join(cmd)}`, exit {r.returncode}; "
        f"target <= {TARGET_MIN:g} min: {verdict})",
        "",
        f"Counts: {', '.join(f'{v} {k}' for k, v in c.items())}. Commit {commit}; {machine()}; "
        f"load average (1 / 5 / 15 min) {before} before, {loadavg()} after. One run (n = 1).",
        "",
        "| slowest tests | seconds |",
        "|---|---|",
        *[f"| {name} ({phase}) | {s} |" for s, phase, name in slow],
    ]
    write_report(report, lines)
    print("\n".join(lines[4:7]))
    if r.returncode != 0:
        print(out[-3000:], file=sys.stderr)
        raise typer.Exit(1)


if __name__ == "__main__":
    typer.run(main)

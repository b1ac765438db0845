"""The cold default, measured end to end from a fresh clone (issue 45): not extrapolated from a scaled copy.

  python benchmarks/cold.py --work /tmp/cold          # hours; re-run the same line to resume an interrupted one

`git clone` of this repository's HEAD into --work (no DVC cache: every stage runs), a fresh virtualenv there with
`pip install -e .`, then the README's first command exactly as written (its part after `&&`), from the clone's root,
timed. An interrupted measurement (a session's end) resumes: the same line re-runs the command, DVC skips what is done
and the resumed GRPO runs continue from their checkpoints; each segment's wall time is kept in <work>/cold.json and
the total is their sum (the pip install is timed apart). Each stage's wall time comes from the runner's own log lines
(`[  123 s] start|done <stage>`). When the command ends with nothing left to run, reports/bench/dag.md gets its first
line, `cold default, measured end to end: N min`, with the stage times and the machine's load (what ran beside it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import typer
from harness import ROOT, loadavg, machine

TARGET_MIN = 90


def readme_pipeline_command() -> str:
    """The README's first command after `&&` (e.g. `python -m projected_grpo.repro -j 2`)."""
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    return re.sub(r"\s+#.*$", "", block.splitlines()[0]).split("&&", 1)[-1].strip()


def stage_times(log: str) -> dict[str, float]:
    """Per stage, seconds from its `start` to its `done` line in the runner's output."""
    start, out = {}, {}
    for t, what, stage in re.findall(r"\[\s*(\d+) s\] (start|done|skip)\s+(\S+)", log):
        if what == "start":
            start[stage] = int(t)
        elif stage in start:
            out[stage] = int(t) - start[stage]
    return out


def main(
    work: Path = typer.Option(Path("/tmp/cold"), help="Where the fresh clone goes (kept, for resuming)."),
) -> None:
    state_path = work / "cold.json"
    if not work.exists():
        subprocess.run(["git", "clone", "-q", str(ROOT), str(work)], check=True)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "venv", str(work / ".venv")], check=True)
        subprocess.run([str(work / ".venv/bin/pip"), "install", "-q", "-e", str(work)], check=True)
        commit = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=work, text=True).strip()
        state = {"commit": commit, "install_s": time.perf_counter() - t0, "segments": [], "stages": {}}
        state_path.write_text(json.dumps(state, indent=1))
    state = json.loads(state_path.read_text())
    cmd = readme_pipeline_command()
    load0, t0 = loadavg(), time.perf_counter()
    env = dict(os.environ, PATH=f"{work / '.venv/bin'}:{os.environ['PATH']}", DVC_NO_ANALYTICS="1")
    r = subprocess.run(cmd, shell=True, cwd=work, env=env, capture_output=True, text=True)
    seg = {"wall_s": time.perf_counter() - t0, "rc": r.returncode, "load_start": load0, "load_end": loadavg()}
    state["segments"].append(seg)
    state["stages"] |= stage_times(r.stdout)
    state_path.write_text(json.dumps(state, indent=1))
    typer.echo(r.stdout[-2000:] + r.stderr[-2000:])
    finished = "stage(s) ran" in r.stdout or "up to date" in r.stdout
    if r.returncode != 0 or not finished:
        typer.echo(f"cold: the command exited {r.returncode}; re-run this line to resume", err=True)
        raise typer.Exit(1)
    write_line(state, cmd)


def write_line(state: dict, cmd: str) -> None:
    total = sum(s["wall_s"] for s in state["segments"]) / 60
    top = sorted(state["stages"].items(), key=lambda kv: -kv[1])
    loads = "; ".join(f"{s['load_start']} -> {s['load_end']}" for s in state["segments"])
    lines = [
        f"cold default, measured end to end: {total:.0f} min (target ≤ {TARGET_MIN}; `{cmd}` from a fresh clone of "
        f"{state['commit']}, {len(state['segments'])} segment(s); pip install {state['install_s'] / 60:.1f} min apart;"
        f" {machine()}; load per segment {loads}; `python benchmarks/cold.py`)",
        "",
        "Stage wall times of that run (minutes, two stages at a time): "
        + ", ".join(f"{k} {v / 60:.1f}" for k, v in top),
        "",
    ]
    dag = ROOT / "reports" / "bench" / "dag.md"
    old = dag.read_text() if dag.exists() else ""
    old = re.sub(r"\Acold default, measured end to end:.*?\n\n.*?\n\n", "", old, flags=re.S)
    dag.write_text("\n".join(lines) + old)
    typer.echo(lines[0])


if __name__ == "__main__":
    typer.run(main)

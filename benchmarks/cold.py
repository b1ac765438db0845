"""The cold default, measured end to end from a fresh clone (issue 45): not extrapolated from a scaled copy.

  python benchmarks/cold.py                 # hours; re-run the same line to resume an interrupted one

`git clone` of this repository's HEAD into --work (no DVC cache: every stage runs), a fresh virtualenv there with `pip
install -e .`, then the README's first command exactly as written (its part after `&&`), from the clone's root, timed.
An interrupted measurement (a session's end) resumes: the same line re-runs the command, DVC skips what is done and the
resumed GRPO runs continue from their checkpoints; each segment's wall time is kept in <work>/cold.json (a heartbeat
every 20 s, so a segment killed with a session counts to its last beat) and the total is their sum (the pip install is
timed apart); the runner's output goes to <work>/segment-<n>.log. Each stage's wall time comes from the runner's own
log lines (`[ 123 s] start|done <stage>`). When the command ends with nothing left to run, reports/bench/dag.md gets
its first line, `cold default, measured end to end: N min`, with the stage times and the machine's load (what ran
beside it).
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
HEARTBEAT_S = 20


def readme_pipeline_command() -> str:
    """The README's first command after `&&` (e.g. `python -m projected_grpo.repro -j 2`)."""
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    return re.sub(r"\s+#.*$", "", block.splitlines()[0]).split("&&", 1)[-1].strip()


def stage_times(log: str, end_s: float | None = None) -> dict[str, float]:
    """Per stage, seconds from its `start` to its `done` line in the runner's output; with `end_s` (a killed
    segment's length), a stage still running counts to it (its resumed part comes from the next segment's log)."""
    start, out = {}, {}
    for t, what, stage in re.findall(r"\[\s*(\d+) s\] (start|done|skip)\s+(\S+)", log):
        if what == "start":
            start[stage] = int(t)
        elif stage in start:
            out[stage] = int(t) - start.pop(stage)
    if end_s is not None:
        out |= {stage: end_s - t for stage, t in start.items()}
    return out


def add_times(state: dict, times: dict[str, float]) -> None:
    for stage, t in times.items():
        state["stages"][stage] = state["stages"].get(stage, 0) + t


def main(
    work: Path = typer.Option(ROOT.parent / "cold", help="Where the fresh clone goes (kept, for resuming)."),
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
    close_interrupted(state)
    cmd = readme_pipeline_command()
    log = work / f"segment-{len(state['segments']) + 1}.log"
    seg = {"start": time.time(), "alive": time.time(), "load_start": loadavg(), "log": str(log)}
    state["segments"].append(seg)
    env = dict(
        os.environ, PATH=f"{work / '.venv/bin'}:{os.environ['PATH']}", DVC_NO_ANALYTICS="1", PYTHONUNBUFFERED="1"
    )
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, shell=True, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        while proc.poll() is None:  # a heartbeat: a segment cut by a session's end still counts to its last beat
            seg["alive"] = time.time()
            state_path.write_text(json.dumps(state, indent=1))
            time.sleep(HEARTBEAT_S)
    seg |= {"alive": time.time(), "rc": proc.returncode, "load_end": loadavg(), "done": True}
    text = log.read_text()
    add_times(state, stage_times(text))
    state_path.write_text(json.dumps(state, indent=1))
    typer.echo(text[-2000:])
    finished = "stage(s) ran" in text or "up to date" in text
    if proc.returncode != 0 or not finished:
        typer.echo(f"cold: the command exited {proc.returncode}; re-run this line to resume", err=True)
        raise typer.Exit(1)
    write_line(state, cmd)


def close_interrupted(state: dict) -> None:
    """A segment killed with the session (no `done`) counts from its start to its last heartbeat."""
    for seg in state["segments"]:
        if not seg.get("done"):
            seg |= {"rc": "killed", "load_end": None, "done": True}
            add_times(state, stage_times(Path(seg["log"]).read_text(), end_s=wall_s(seg)))


def wall_s(seg: dict) -> float:
    return seg["alive"] - seg["start"]


def write_line(state: dict, cmd: str) -> None:
    total = sum(wall_s(s) for s in state["segments"]) / 60
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

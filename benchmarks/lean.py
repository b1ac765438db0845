"""The lean default (issue 45) against the protocol before it, side by side: what a run costs, and the phenomenon.

  PYTHONPATH=src python benchmarks/lean.py cost --before /tmp/before --out reports/bench/lean_cost.json
  PYTHONPATH=src python benchmarks/lean.py report --before-commit 73c401b --out reports/bench/lean.md

`cost`: for each arm of --arms, the two protocols alternate, round after round, each a fresh process with its own
checkout's code and its own params.yaml (--before: a checkout of the earlier default, e.g. `git worktree add
/tmp/before 73c401b`; the after side is this checkout): `stages/train.py` runs --steps GRPO steps of the arm (seed 41,
a checkpoint every step), then `stages/evaluate.py` scores that run at the full evaluation protocol of its params,
its monitor curve scaled to the run (the checkpoints at multiples of `eval.curve_every · steps / grpo.steps`, so a
short run has as many curve points as a full one). Both read this checkout's committed upstream artifacts (organism,
problems, pool, basis; each side builds its own evaluation sets first, by its own eval params; nothing under
artifacts/ or reports/ is written). A full run's cost is estimated
as `grpo.steps` × the mean step (steps 1 onward; the stage's --timings log) plus the evaluation as measured; wall and
CPU time (the stage process and its children: the sandbox's fork servers grade there) are both kept, CPU being what
two stages side by side on this 2-core machine share. Writes a JSON the report reads.

`report`: reports/bench/lean.md from that JSON and from the phenomenon before and after: vanilla's and gt_only's
train-surface deploy hack, solve and format per seed (reports/eval/ref/<arm>-s<seed>/metrics.json at
--before-commit, read with `git show`, against the working tree's) with the issue's bars (vanilla ≥ 50% on every
seed, gt_only ≤ 5%), and the runs' training-log hack rate over their last 10 steps.
"""

from __future__ import annotations

import csv
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import typer
import yaml
from harness import ROOT, loadavg, machine, md_head, short_commit, write_report

app = typer.Typer(add_completion=False, help=__doc__.split("\n\n")[0])
SEEDS = (41, 42, 43)
REF_ARMS = ("vanilla", "gt_only")


def stage_env(code: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(code / "src"), OMP_WAIT_POLICY="PASSIVE")  # as dvc.yaml's commands


def timed(cmd: list[str], code: Path) -> tuple[float, float]:
    """(wall s, CPU s of the process and the children it reaped) of one stage command run from this checkout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=stage_env(code), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def scaled_params(code: Path, steps: int, dest: Path) -> tuple[Path, int]:
    """The checkout's params.yaml, `steps` GRPO steps with a checkpoint each, the monitor curve scaled to them; returns
    (path, the full run's steps)."""
    p = yaml.safe_load((code / "params.yaml").read_text())
    full, every = p["grpo"]["steps"], p["eval"]["curve_every"]
    if (steps * every) % full:
        raise typer.BadParameter(
            f"--steps {steps}: eval.curve_every·steps/grpo.steps = {steps * every / full} in {code}"
        )
    p["grpo"] |= {"steps": steps, "save_every": 1}
    p["eval"]["curve_every"] = steps * every // full
    dest.write_text(yaml.safe_dump(p, sort_keys=False))
    return dest, full


def eval_sets(code: Path, dest: Path) -> None:
    """The side's own evaluation sets (its eval params: surfaces, samples), from this checkout's organism."""
    cmd = [sys.executable, str(code / "stages/eval_sets.py"), "--organism", "artifacts/organism", "--problems"]
    cmd += ["artifacts/problems", "--out", str(dest), "--params", str(code / "params.yaml")]
    timed(cmd, code)


def one_run(code: Path, arm: str, steps: int, tmp: Path, sets: Path) -> dict:
    params, full = scaled_params(code, steps, tmp / "params.yaml")
    ck, ev = tmp / "ck", tmp / "eval"
    py = [sys.executable]
    common = ["--arm", arm, "--seed", "41", "--organism", "artifacts/organism", "--problems", "artifacts/problems"]
    train = [str(code / "stages/train.py"), *common, "--pool", "artifacts/pool", "--basis", "artifacts/basis"]
    train += ["--pairsets", "data/pairsets", "--out", str(ck), "--log", str(tmp / "log.tsv")]
    train += ["--metrics", str(tmp / "m.json"), "--timings", str(tmp / "t.tsv"), "--params", str(params)]
    tw, tc = timed(py + train, code)
    evaluate = [str(code / "stages/evaluate.py"), *common, "--run", str(ck), "--eval-sets", str(sets)]
    evaluate += ["--basis", "artifacts/basis", "--out", str(ev), "--params", str(params)]
    ew, ec = timed(py + evaluate, code)
    with open(tmp / "t.tsv") as f:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f, delimiter="\t")]
    step = statistics.mean(r["dt"] for r in rows[1:])
    return {
        "full_steps": full,
        "step_s": step,
        "train_wall_s": tw,
        "train_cpu_s": tc,
        "eval_wall_s": ew,
        "eval_cpu_s": ec,
    }


@app.command()
def cost(
    before: Path = typer.Option(..., help="A checkout of the earlier default (its code and params.yaml)."),
    out: Path = typer.Option(ROOT / "reports/bench/lean_cost.json", help="The JSON `report` reads."),
    arms: str = typer.Option("measure_only,route", help="Comma-separated arm-table entries."),
    steps: int = typer.Option(8, help="GRPO steps per timed run."),
    rounds: int = typer.Option(1, help="Alternating rounds."),
) -> None:
    """Time a run (train + evaluate) of each arm under both protocols, alternating."""
    sides = {"before": before.resolve(), "after": ROOT}
    res: dict = {
        "arms": {},
        "steps": steps,
        "rounds": rounds,
        "machine": machine(),
        "load_start": loadavg(),
        "commits": {k: short_commit(v) for k, v in sides.items()},
    }
    keep = tempfile.TemporaryDirectory()
    sets = {k: Path(keep.name) / k for k in sides}
    for k, code in sides.items():
        eval_sets(code, sets[k])
    for arm in arms.split(","):
        res["arms"][arm] = {k: [] for k in sides}
        for r in range(rounds):
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            for side in order:
                with tempfile.TemporaryDirectory() as tmp:
                    x = one_run(sides[side], arm, steps, Path(tmp), sets[side])
                res["arms"][arm][side].append(x)
                typer.echo(f"{arm} round {r + 1} {side}: step {x['step_s']:.2f} s, eval {x['eval_wall_s']:.0f} s")
    res["load_end"] = loadavg()
    keep.cleanup()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")


def run_estimate(xs: list[dict]) -> dict[str, float]:
    """Mean over rounds of a full run's estimated wall and CPU minutes (train: full steps × mean step; CPU scaled by
    the measured train CPU per wall second)."""
    out = {}
    for x in xs:
        train = x["full_steps"] * x["step_s"]
        cpu_rate = x["train_cpu_s"] / x["train_wall_s"]
        for k, v in {
            "step": x["step_s"],
            "train_min": train / 60,
            "eval_min": x["eval_wall_s"] / 60,
            "run_min": (train + x["eval_wall_s"]) / 60,
            "run_cpu_min": (train * cpu_rate + x["eval_cpu_s"]) / 60,
        }.items():
            out.setdefault(k, []).append(v)
    return {k: statistics.mean(v) for k, v in out.items()}


def text_at(commit: str | None, rel: str, before: str) -> str | None:
    """A report file at `commit` (git show), or in the working tree (commit None) unless it is still the `before`
    commit's file byte for byte (that run has not been redone under the lean protocol yet)."""
    if commit is None:
        f = ROOT / rel
        now = f.read_text() if f.exists() else None
        return None if now is None or now == text_at(before, rel, before) else now
    r = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=ROOT, capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def metrics_at(commit: str | None, arm: str, seed: int, before: str) -> dict | None:
    text = text_at(commit, f"reports/eval/ref/{arm}-s{seed}/metrics.json", before)
    return json.loads(text) if text else None


def log_hack(commit: str | None, arm: str, seed: int, before: str) -> float | None:
    """Mean student hack rate over the training log's last 10 steps."""
    text = text_at(commit, f"reports/train/ref/{arm}-s{seed}.tsv", before)
    if not text:
        return None
    lines = [ln.split("\t") for ln in text.strip().splitlines()]
    col = lines[0].index("hack")
    vals = [float(ln[col]) for ln in lines[1:][-10:]]
    return statistics.mean(vals) if len(lines) > 200 else None  # a finished 200-step run only


def pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


@app.command()
def report(
    cost_json: Path = typer.Option(ROOT / "reports/bench/lean_cost.json", help="`cost`'s JSON."),
    before_commit: str = typer.Option("73c401b", help="The commit whose reports hold the earlier default's runs."),
    out: Path = typer.Option(ROOT / "reports/bench/lean.md"),
) -> None:
    """reports/bench/lean.md: per-run cost ratios and the phenomenon before and after."""
    c = json.loads(cost_json.read_text())
    L = [
        "# The lean default against the earlier protocol (issue 45)",
        "",
        f"Generated by `python benchmarks/lean.py report --before-commit {before_commit}` from "
        f"`python benchmarks/lean.py cost` ({cost_json.name}: {c['machine']}; before = {c['commits']['before']}, "
        f"after = {c['commits']['after']}; load {c['load_start']} at start, {c['load_end']} at the end).",
        "",
        "## What a run costs",
        "",
        f"Each arm ran {c['steps']} GRPO steps and a full evaluation under each protocol, alternating ({c['rounds']} "
        "round(s), seed 41, each a fresh process on this checkout's committed upstream artifacts). A full run is "
        "estimated as grpo.steps × the mean step plus the evaluation as measured; CPU counts the stage and its "
        "sandbox's grading processes (what two stages side by side share). Target: after/before ≤ 0.4.",
        "",
        *md_head(
            [
                "arm",
                "protocol",
                "step (s)",
                "train (min)",
                "evaluate (min)",
                "run (min)",
                "run CPU (min)",
                "run ratio",
                "CPU ratio",
            ]
        ),
    ]
    for arm, sides in c["arms"].items():
        est = {k: run_estimate(v) for k, v in sides.items()}
        for side, e in est.items():
            ratio = e["run_min"] / est["before"]["run_min"]
            cpu = e["run_cpu_min"] / est["before"]["run_cpu_min"]
            L.append(
                f"| {arm} | {side} | {e['step']:.2f} | {e['train_min']:.1f} | {e['eval_min']:.1f} | {e['run_min']:.1f}"
                f" | {e['run_cpu_min']:.1f} | **{ratio:.2f}×** | {cpu:.2f}× |"
            )
    L += [
        "",
        "## The phenomenon, before and after",
        "",
        f"Deploy-state train-surface hack, no-hint solve and format on the held-out test split (reports/eval/ref) per "
        f"seed: before = the committed runs at {before_commit} (grpo.beta 0.001), after = this tree's. log hack = the "
        "training log's student hack rate over the last 10 steps. Bars: vanilla ≥ 50% on every seed, gt_only ≤ 5%.",
        "",
        *md_head(
            [
                "arm",
                "seed",
                "hack before",
                "hack after",
                "log hack before",
                "log hack after",
                "solve before",
                "solve after",
                "format before",
                "format after",
                "bar met after",
            ]
        ),
    ]
    for arm in REF_ARMS:
        for s in SEEDS:
            b, a = metrics_at(before_commit, arm, s, before_commit), metrics_at(None, arm, s, before_commit)
            g = lambda m, k: None if m is None else m.get(k)  # noqa: E731
            ha = g(a, "deploy_hack_train")
            bar = "—" if ha is None else ("yes" if (ha >= 0.5 if arm == "vanilla" else ha <= 0.05) else "**no**")
            L.append(
                f"| {arm} | {s} | {pct(g(b, 'deploy_hack_train'))} | {pct(ha)}"
                f" | {pct(log_hack(before_commit, arm, s, before_commit))}"
                f" | {pct(log_hack(None, arm, s, before_commit))}"
                f" | {pct(g(b, 'deploy_solve'))} | {pct(g(a, 'deploy_solve'))}"
                f" | {pct(g(b, 'deploy_format'))} | {pct(g(a, 'deploy_format'))} | {bar} |"
            )
    L += ["", "— : not redone under the lean protocol yet in this tree (or not a finished 200-step log)."]
    write_report(out, L)
    typer.echo("\n".join(L))


if __name__ == "__main__":
    app()

"""Where the time of a cold `dvc repro` goes: every stage timed, GRPO and evaluation split into their phases.

  python benchmarks/dag.py --label before --out reports/bench/dag.md        # scaled copy (default), ~1-1.5 h
  python benchmarks/dag.py --label before --scale default                   # the real defaults: hours
  python benchmarks/dag.py --label after --work . --from-log logs/rerun.log # times of a real `repro -j 2` run here

The pipeline (dvc.yaml, stages/, src/, data/, params.yaml) is copied to --work and reproduced there cold, one stage
at a time in DVC's order (`dvc repro -s <stage>`, a fresh process each, as a user's `dvc repro` runs them), so each
stage's wall time is its own. An interrupted run resumes: stages already timed in <work>/times.tsv are not re-run.
The copy shares this repository's DVC cache, so what it builds (organism, pool, basis, eval sets) is restored from
DVC's run cache by a later `dvc repro` here.

`--scale scaled` (default) keeps every default but GRPO's horizon (`grpo.steps` 20 of 200), the seeds (41 of 41, 42,
43) and the monitor curve's spacing (`eval.curve_every` 10, so that the copy samples one curve checkpoint, step 10;
the last one is read off the endpoint's samples), and extrapolates: a GRPO run's summed step time x 200/20 plus its
start-up once (per-step time is stationary: in the last whole default run the mean step time over 200 steps was
0.89-1.06x that of the first 20, by arm), x 3 seeds for train and evaluate stages; an evaluation's curve part x the
default's number of sampled curve checkpoints over the copy's (`sampled_curve_points`: 3 of 1), its endpoint part x 1;
every other stage x 1. Phase splits come from the stages' own timing logs (<work>/logs/): GRPO's sampling, grading,
reference forward, policy forward, backward and gate calibration (`train.STEP_PHASES`; the rest of a step is "other"),
evaluation's sampling (grading overlaps it) and the grading left after the last chunk.

Each --label is a column of the report (before / after), so the speed work is shown side by side. `--jobs 2` runs
the copy through `python -m projected_grpo.repro -j 2` instead (two stages at a time) and records its total wall
time; for every complete label the report also gives the default DAG's wall time one and two stages at a time, by
list scheduling of the extrapolated stage times (`simulate`).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import typer
import yaml
from harness import ROOT, md_head, timed_run, write_report

# the copy scores one monitor-curve checkpoint (step 10) besides the last, which evaluate reads off the endpoint
SCALED = {"grpo": {"steps": 20}, "seeds": [41], "eval": {"curve_every": 10}}
DEFAULT_STEPS, DEFAULT_SEEDS = 200, 3


def setup(work: Path, scale: str, extra: dict) -> None:
    if (work / "dvc.yaml").exists():
        return
    work.mkdir(parents=True)
    for d in ("src", "stages", "data"):
        shutil.copytree(ROOT / d, work / d, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for f in ("dvc.yaml", "params.yaml", ".gitignore"):
        shutil.copy(ROOT / f, work / f)
    p = yaml.safe_load((work / "params.yaml").read_text())
    for k, v in [*(SCALED.items() if scale == "scaled" else ()), *extra.items()]:
        p[k] = {**p[k], **v} if isinstance(v, dict) else v
    (work / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    for args in (["init", "-q", "--no-scm"], ["cache", "dir", str(ROOT / ".dvc" / "cache")]):
        subprocess.run([sys.executable, "-m", "dvc", *args], cwd=work, check=True)


def stage_order(work: Path) -> list[str]:
    """Every stage (matrix members expanded) in an order DVC could run them: dependencies first."""
    from dvc.repo import Repo

    with Repo(str(work)) as repo:
        g = repo.index.graph  # edges: stage -> the stages it depends on
        order: list = []

        def visit(s) -> None:  # post-order: a stage after everything it depends on
            if s not in order:
                for d in sorted(g.successors(s), key=lambda x: x.name):
                    visit(d)
                order.append(s)

        for s in sorted(g.nodes, key=lambda x: x.name):
            visit(s)
        return [s.name for s in order]


def run_stages(work: Path, times: Path) -> None:
    done = {r["stage"] for r in read_times(times)}
    # stage commands run `python`: this interpreter's
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for stage in stage_order(work):
        if stage in done:
            continue
        # --no-run-cache: the shared cache may hold this very run (an earlier benchmark); a timing must execute it
        r, wall = timed_run(
            [sys.executable, "-m", "dvc", "repro", "-s", "--no-run-cache", stage],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            raise SystemExit(f"error: stage {stage} failed in {work}:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        with times.open("a") as f:
            f.write(f"{stage}\t{wall:.1f}\n")
        print(f"{stage}: {wall:.0f} s", flush=True)


def run_parallel(work: Path, times: Path, jobs: int) -> float:
    """The whole DAG through `python -m projected_grpo.repro -j jobs` (the copy's own code); each stage's wall time
    from its start/done events (measured while other stages shared the machine). Returns the total wall time."""
    env = {
        **os.environ,
        "DVC_NO_ANALYTICS": "1",
        "PYTHONPATH": str(work / "src"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    r, wall = timed_run(
        [sys.executable, "-m", "projected_grpo.repro", "-j", str(jobs), "--no-run-cache"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise SystemExit(f"error: the parallel run failed in {work}:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    times.write_text("".join(f"{k}\t{v:.1f}\n" for k, v in stage_times(r.stdout.splitlines()).items()))
    return wall


def stage_times(lines: list[str]) -> dict[str, float]:
    """{stage: seconds from its start to its done event} from projected_grpo.repro's output lines
    ("[    123 s] start  <stage>" / "done   <stage>"); a stage started again (a resumed run) keeps its last span."""
    start, out = {}, {}
    for line in lines:
        if line.startswith("[") and " s] " in line:
            sec, rest = line[1:].split(" s] ", 1)
            what, stage = rest.split()
            if what == "start":
                start[stage] = float(sec)
            elif what == "done" and stage in start:
                out[stage] = float(sec) - start[stage]
    return out


def simulate(durations: dict[str, float], deps: dict[str, set[str]], jobs: int) -> float:
    """Wall time of running `durations`' stages on `jobs` workers with projected_grpo.repro's rule (a stage once all
    it reads is done; most waiting descendants first): list scheduling, event by event."""
    from projected_grpo.repro import closure

    down = {n: {m for m in durations if n in deps[m]} for n in durations}
    weight = {n: len(closure({n}, down)) for n in durations}
    now, done, running = 0.0, set(), {}  # running: stage -> end time
    while len(done) < len(durations):
        ready = sorted(
            (n for n in durations if n not in done and n not in running and deps[n] <= done),
            key=lambda n: (-weight[n], n),
        )
        for n in ready[: jobs - len(running)]:
            running[n] = now + durations[n]
        n = min(running, key=running.get)
        now = running.pop(n)
        done.add(n)
    return now


def default_dag(work: Path, rows: dict[str, float], scale: str) -> tuple[dict[str, float], dict[str, set[str]]]:
    """Per-stage durations and deps of the default DAG: a scaled copy's seed-41 train/evaluate stages become one
    stage per default seed, each 1/DEFAULT_SEEDS of the extrapolated time (which counts all seeds)."""
    from projected_grpo.repro import dag

    deps, _ = dag(work)
    if scale == "default":
        return rows, {n: deps[n] & set(rows) for n in rows}
    per_seed = {n for n in rows if n.split("@")[0] in ("train", "train_ref", "evaluate", "evaluate_ref")}
    seeds = [41 + i for i in range(DEFAULT_SEEDS)]

    def expand(n: str) -> list[str]:
        return [n.rsplit("-", 1)[0] + f"-{s}" for s in seeds] if n in per_seed else [n]

    dur: dict[str, float] = {}
    dd: dict[str, set[str]] = {}
    for n, v in rows.items():
        for m in expand(n):
            dur[m] = v / DEFAULT_SEEDS if n in per_seed else v
            dd[m] = set()
            for d in deps[n] & set(rows):  # a per-seed stage reads the same seed's runs; the reports read them all
                xs = expand(d)
                if n in per_seed and d in per_seed:
                    xs = [x for x in xs if x.rsplit("-", 1)[1] == m.rsplit("-", 1)[1]]
                dd[m] |= set(xs)
    return dur, dd


def resumed_train_times(times: dict[str, float], ph: dict[str, dict[str, float]]) -> dict[str, float]:
    """`times` with each train stage whose logged span is shorter than its steps' summed wall time (it was killed and
    resumed: the log holds only its last span) replaced by that sum plus the median start-up (span − summed steps) of
    the train stages that ran whole. Returns only the replaced stages."""
    import statistics

    tr = {n: t for n, t in times.items() if n in ph and "step" in ph[n]}
    whole = [t - ph[n]["step"] for n, t in tr.items() if t >= ph[n]["step"]]
    if not whole:
        return {}
    start_up = statistics.median(whole)
    return {n: ph[n]["step"] + start_up for n, t in tr.items() if t < ph[n]["step"]}


def downstream(stage: str, dur: dict[str, float], deps: dict[str, set[str]]):
    """(durations, deps) of `stage` and every stage downstream of it: what a change of its params re-runs."""
    from projected_grpo.repro import closure

    down = {n: {m for m in dur if n in deps[m]} for n in dur}
    sub = closure({stage}, down)
    return {n: dur[n] for n in sub}, {n: deps[n] & sub for n in sub}


def read_times(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [{"stage": s, "s": float(v)} for s, v in (ln.split("\t") for ln in path.read_text().splitlines())]


def phases(work: Path) -> dict[str, dict[str, float]]:
    """{stage: {phase: seconds}} from the stages' timing logs."""
    out = {}
    for f in sorted((work / "logs" / "train").glob("*.tsv")):
        rows = list(csv.DictReader(f.open(), delimiter="\t"))
        tot = {k[2:] if k != "dt" else "step": sum(float(r[k]) for r in rows) for k in rows[0] if k != "step"}
        tot["other"] = tot["step"] - sum(v for k, v in tot.items() if k != "step")
        arm = f.stem.rsplit("-s", 1)[0]
        ref = (work / "reports" / "train" / "ref" / f"{f.stem}.tsv").exists()
        out[f"{'train_ref' if ref else 'train'}@{arm}-{f.stem.rsplit('-s', 1)[1]}"] = tot
    for f in sorted((work / "logs" / "eval").glob("*.json")):
        d = json.loads(f.read_text())
        arm, seed = f.stem.rsplit("-s", 1)
        ref = (work / "reports" / "eval" / "ref" / f.stem).exists()
        out[f"{'evaluate_ref' if ref else 'evaluate'}@{arm}-{seed}"] = {
            "curve_sample": d["curve"].get("t_sample", 0.0),
            "curve_grade_tail": d["curve"].get("t_grade_tail", 0.0),
            "endpoint_sample": d["endpoint"].get("t_sample", 0.0),
            "endpoint_grade_tail": d["endpoint"].get("t_grade_tail", 0.0),
            "wall": d["wall"],
        }
    return out


def sampled_curve_points(steps: int, every: int) -> int:
    """Monitor-curve checkpoints an evaluation samples: step 0 (the base, copied from eval_sets) and the last (read
    off the endpoint's samples) excluded."""
    return len({s for s in range(every, steps, every)})


def extrapolate(stage: str, s: float, ph: dict, work: Path, scale: str) -> float:
    if scale == "default":
        return s
    kind = stage.split("@")[0]
    if kind in ("train", "train_ref") and stage in ph:  # start-up and loading once, the steps x 200/20
        steps = ph[stage]["step"]
        return (s + steps * (DEFAULT_STEPS / SCALED["grpo"]["steps"] - 1)) * DEFAULT_SEEDS
    if kind in ("evaluate", "evaluate_ref") and stage in ph:
        every = yaml.safe_load((ROOT / "params.yaml").read_text())["eval"]["curve_every"]
        k = sampled_curve_points(DEFAULT_STEPS, every) / sampled_curve_points(
            SCALED["grpo"]["steps"], SCALED["eval"]["curve_every"]
        )
        curve = ph[stage]["curve_sample"] + ph[stage]["curve_grade_tail"]
        return (s + curve * (k - 1)) * DEFAULT_SEEDS
    return s


def main(
    label: str = typer.Option("before", help="Column of the report this run fills (e.g. before, after)."),
    scale: str = typer.Option("scaled", help="scaled (20 GRPO steps, one seed; extrapolated) or default."),
    work: Path = typer.Option(Path("/tmp/projected_grpo_dag"), help="Working copy (resumable)."),
    out: Path = typer.Option(ROOT / "reports" / "bench" / "dag.md", help="Markdown report (columns kept per label)."),
    extra: str = typer.Option("{}", help="JSON params sections laid over the copy's params (a smoke run)."),
    report_only: bool = typer.Option(False, help="Write the report from the stages timed so far; run nothing."),
    note: str = typer.Option("", help="Conditions of this run, printed under its column (e.g. other load)."),
    jobs: int = typer.Option(
        1,
        help="1: stage by stage (`dvc repro -s`); N > 1: the whole DAG through "
        "`python -m projected_grpo.repro -j N`, its total wall time reported too.",
    ),
    borrow: str = typer.Option(
        "",
        help="With --from-log: a label of the report whose measured times fill the stages the logs lack (stages DVC "
        "skipped as unchanged, e.g. organism); they are named in the note.",
    ),
    from_log: list[Path] = typer.Option(
        None,
        help="Read the stage times of a real default run instead of running "
        "one: the output of `python -m projected_grpo.repro -j N` run in --work (the "
        "repository itself); several logs when the run was resumed (a resumed train "
        "stage counts only its last span: say so in --note). Implies scale default.",
    ),
) -> None:
    if scale not in ("scaled", "default"):
        raise typer.BadParameter("--scale must be scaled or default")
    if from_log:  # the repository's own run: its logs/ and reports/ give the phases
        scale = "default"
        times = {}
        for f in from_log:
            times |= stage_times(f.read_text().splitlines())
        fixed = resumed_train_times(times, phases(work))
        times |= fixed
        if fixed:
            note += (
                f" Resumed train stages ({', '.join(sorted(fixed))}): their steps' summed wall time plus the median "
                "start-up of the others."
            )
        if borrow:
            old = json.loads(out.with_suffix(".json").read_text())[borrow]["measured"]
            lent = {s: old[s] for s in stage_order(work) if s not in times and s in old}
            times |= lent
            if lent:
                note += f" Not run here (unchanged, cached), times from `{borrow}`: {', '.join(sorted(lent))}."
        (work / "times.tsv").write_text("".join(f"{k}\t{v:.1f}\n" for k, v in times.items()))
        report_only = True
    else:
        work = work / f"{label}-{scale}"
    wall_file = work / "wall.txt"
    if not report_only:
        setup(work, scale, json.loads(extra))
        if jobs > 1:
            wall_file.write_text(f"{run_parallel(work, work / 'times.tsv', jobs):.1f}\n")
        else:
            run_stages(work, work / "times.tsv")
    ph = phases(work)
    rows = {r["stage"]: extrapolate(r["stage"], r["s"], ph, work, scale) for r in read_times(work / "times.tsv")}
    data = out.with_suffix(".json")
    allruns = json.loads(data.read_text()) if data.exists() else {}
    allruns[label] = {
        "scale": scale,
        "stages": rows,
        "measured": {r["stage"]: r["s"] for r in read_times(work / "times.tsv")},
        "phases": ph,
        "machine": f"{os.cpu_count()} cores",
        "complete": len(rows) == len(stage_order(work)),
        "note": note,
        "jobs": jobs,
    }
    if allruns[label]["complete"]:  # the default DAG's wall time with 1 and 2 stages at a time, by list scheduling
        dur, deps = default_dag(work, rows, scale)
        allruns[label]["wall_sim"] = {str(j): simulate(dur, deps, j) for j in (1, 2)}
        # `dvc exp run -S basis.pairset=<other>` re-runs the basis stage and everything downstream of it
        allruns[label]["wall_sim_pairset"] = {str(j): simulate(*downstream("basis", dur, deps), j) for j in (1, 2)}
    if wall_file.exists():
        allruns[label]["wall_measured"] = float(wall_file.read_text())
    write_report(data, json.dumps(allruns, indent=1, sort_keys=True) + "\n")
    write_report(out, render(allruns))
    done = "" if allruns[label]["complete"] else f" (partial: {len(rows)} stages timed so far)"
    print(f"dag: {label}: {sum(rows.values()) / 60:.0f} min (extrapolated to the defaults){done} -> {out}")


def render(allruns: dict) -> str:
    labels = list(allruns)
    stages = list(dict.fromkeys(s for r in allruns.values() for s in r["stages"]))
    tot = {lb: sum(allruns[lb]["stages"].values()) for lb in labels}
    L = [
        "# Cold `dvc repro` of the defaults: where the time goes",
        "",
        "Generated by `python benchmarks/dag.py` (see its docstring for the scaled copy and the extrapolation); "
        f"data in `reports/bench/dag.json`. Machine: {allruns[labels[0]]['machine']}. Stages run one at a time.",
        "",
        "## Per stage (minutes, extrapolated to the defaults: 200 GRPO steps, seeds 41, 42, 43)",
        "",
        *md_head(["stage", *(c for lb in labels for c in (f"{lb} (min)", "share"))]),
    ]
    for s in stages:
        cells = []
        for lb in labels:
            v = allruns[lb]["stages"].get(s)
            cells += ["—", "—"] if v is None else [f"{v / 60:.1f}", f"{v / tot[lb]:.0%}"]
        L.append(f"| {s} | " + " | ".join(cells) + " |")
    L.append("| **total** | " + " | ".join(f"**{tot[lb] / 60:.0f}** | 100%" for lb in labels) + " |")
    L += [
        f"\n{lb}: **partial run**, the stages not listed are not timed yet; the total is a lower bound."
        for lb in labels
        if not allruns[lb].get("complete", True)
    ]
    sims = [lb for lb in labels if "wall_sim" in allruns[lb]]
    if sims:
        L += [
            "",
            "## Wall time of the default DAG",
            "",
            "Stages one at a time (`dvc repro`) and two at a time (`python -m projected_grpo.repro -j 2`), from "
            "the extrapolated stage times above by list scheduling (a scaled copy's train/evaluate stages split "
            "into one per default seed). A label run with `--jobs 2` measured its stage times while two stages "
            "shared the machine, so its one-at-a-time figure is pessimistic and its two-at-a-time figure "
            "realistic; a label run stage by stage the other way round.",
            "",
            "`-S basis.pairset=…`: the same for a pair-set experiment, which re-runs the basis stage and everything "
            "downstream of it (issue 22's target: ≤ 30 min).",
            "",
            "| label | measured as | one at a time (min) | two at a time (min) | measured wall of the copy (min) "
            "| `-S basis.pairset=…`, two at a time (min) |",
            "|---|---|---|---|---|---|",
        ]
        for lb in sims:
            r = allruns[lb]
            meas = f"{r['wall_measured'] / 60:.0f}" if "wall_measured" in r else "—"
            how = "stage by stage" if r.get("jobs", 1) == 1 else f"{r['jobs']} at a time"
            ps = f"{r['wall_sim_pairset']['2'] / 60:.0f}" if "wall_sim_pairset" in r else "—"
            L.append(
                f"| {lb} | {how} | **{r['wall_sim']['1'] / 60:.0f}** | **{r['wall_sim']['2'] / 60:.0f}** | {meas} "
                f"| {ps} |"
            )
    L += [f"\n{lb}: {allruns[lb]['note']}" for lb in labels if allruns[lb].get("note")]
    for lb in labels:
        ph = allruns[lb]["phases"]
        tr = {k: v for k, v in ph.items() if k.startswith("train")}
        if tr:
            keys = [k for k in next(iter(tr.values())) if k != "step"]
            L += [
                "",
                f"## GRPO steps by phase ({lb}; share of the summed step time, measured, not extrapolated)",
                "",
                *md_head(["run", "step total (min)", *keys]),
            ]
            for k, v in tr.items():
                shares = " | ".join(f"{v[x] / v['step']:.0%}" for x in keys)
                L.append(f"| {k} | {v['step'] / 60:.1f} | {shares} |")
        ev = {k: v for k, v in ph.items() if k.startswith("evaluate")}
        if ev:
            keys = [k for k in next(iter(ev.values())) if k != "wall"]
            L += [
                "",
                f"## Evaluations by phase ({lb}; minutes, measured; grading overlaps sampling, `grade_tail` is "
                "what is left after the last chunk)",
                "",
                *md_head(["run", "wall", *keys]),
            ]
            for k, v in ev.items():
                L.append(f"| {k} | {v['wall'] / 60:.1f} | " + " | ".join(f"{v[x] / 60:.1f}" for x in keys) + " |")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    typer.run(main)

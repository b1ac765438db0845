"""Calibration sweep of the phenomenon: GRPO runs of the organism under params overrides, hack and solve per step.

  PYTHONPATH=src python benchmarks/calibration_sweep.py --variant "grpo.lr=0.04" --seeds 41,42,43 \
      --out reports/bench/calibration.md

Each (variant, arm, seed) is one run of the real `train` stage (`stages/train.py`, the same command `dvc repro` runs)
on the committed organism, problems, pool and basis, with params.yaml plus the variant's overrides, in a temporary
directory (nothing under artifacts/ or reports/ is touched but --out). The report gives, per run and per variant
(mean ± sample std over seeds), the student strict hack rate on hinted training prompts and the strict solve rate at
several horizons (mean of the 5 steps ending there: a run has no learning-rate schedule and the teacher pool switches
off at a fixed step, so the first S steps of a longer run ARE the S-step run; a horizon past a variant's steps shows
-), against the phenomenon bar of issue 6 (vanilla >= 50% for 2 seeds, gt_only <= 5%), and each run's wall time per
step. Runs are sequential (one at a time: this machine has 2 cores); with --work an interrupted sweep resumes.

An override is `section.key=value` (YAML value), as `dvc exp run -S` takes it; `--variant` takes several,
comma-separated, and may be repeated (one variant each); the empty variant "" is params.yaml itself. An arm is a run
key of params.yaml's arm table (`vanilla`, `route`, `route+random`: method/arms.py), resolved under each variant's
params (`arm.route.edit=route_per_rollout` changes what `route` runs).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import typer
import yaml
from harness import ROOT, md_row, src_env, timed_run, write_report

from projected_grpo.common.log import read_tsv
from projected_grpo.config import load_params, overlay
from projected_grpo.method.arms import parse


def apply_overrides(params: dict, overrides: list[str]) -> dict:
    """`a.b=value` -> params with params[a][b] = yaml(value) (config.overlay: a key params.yaml lacks is an error)."""
    over: dict = {}
    for o in overrides:
        key, eq, value = o.partition("=")
        if not key or not eq:
            raise typer.BadParameter(f"override {o!r}: write section.key=value")
        *parents, leaf = key.split(".")
        node = over
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = yaml.safe_load(value)
    try:
        return overlay(params, over)
    except KeyError as e:
        raise typer.BadParameter(str(e.args[0])) from None


def parse_variant(v: str) -> list[str]:
    return [x.strip() for x in v.split(",") if x.strip()]


def run_one(params_file: Path, arm: str, seed: int, work: Path) -> tuple[list[dict], float]:
    a = parse(load_params(params_file), arm)  # a run key of the params' arm table: entry + variant
    cmd = [
        sys.executable,
        str(ROOT / "stages" / "train.py"),
        "--arm",
        a.arm,
        "--variant",
        a.variant,
        "--seed",
        str(seed),
        "--organism",
        str(ROOT / "artifacts/organism"),
        "--problems",
        str(ROOT / "artifacts/problems"),
        "--pool",
        str(ROOT / "artifacts/pool"),
        "--out",
        str(work / "ckpt"),
        "--log",
        str(work / "log.tsv"),
        "--metrics",
        str(work / "metrics.json"),
        "--params",
        str(params_file),
    ]
    if a.reads_basis:
        cmd += ["--basis", str(ROOT / "artifacts/basis"), "--pairsets", str(ROOT / "data/pairsets")]
    res, wall = timed_run(cmd, env=src_env(), capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{arm} s{seed} failed:\n{res.stderr[-3000:]}")
    return read_tsv(work / "log.tsv"), wall


def window(rows: list[dict], key: str, end: int, n: int = 5) -> float:
    """Mean of `key` over the n steps ending at step `end`; NaN past the run's last step."""
    if end > len(rows):
        return float("nan")
    xs = [r[key] for r in rows[max(0, end - n) : end] if r[key] == r[key]]  # NaN-free
    return sum(xs) / len(xs) if xs else float("nan")


def pct(x: float) -> str:
    return "-" if x != x else f"{x * 100:.1f}%"


def pm(xs: list[float]) -> str:
    if any(x != x for x in xs):
        return "-"
    m = statistics.mean(xs)
    return f"{m * 100:.1f}%" + (f" ± {statistics.stdev(xs) * 100:.1f}" if len(xs) > 1 else "")


def report(
    results: list[tuple], variants: list[str], arms: list[str], hz: list[int], cmd: str, notes: list[str]
) -> str:
    """results: (variant, arm, seed, per-step log rows, wall seconds) per run."""
    cols = [f"hack @{h}" for h in hz] + [f"solve @{h}" for h in hz]
    name = lambda v: v or "(params.yaml)"  # noqa: E731
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        "# Calibration sweep: does vanilla GRPO learn to hack, and how fast",
        "",
        f"Re-run: `{cmd}`",
        "",
        f"Generated on {platform.node()} ({os.cpu_count()} CPU cores), {stamp}; {len(results)} runs, "
        f"{sum(r[4] for r in results) / 60:.0f} min of training in all. Each row is one run of `stages/train.py` (the "
        "stage's own command) on the committed organism, problems and pool, with params.yaml plus the variant's "
        "overrides. hack = student strict hack rate on hinted training prompts, solve = student strict solve rate "
        "(teacher-pool rows excluded), each the mean of the 5 steps ending at the horizon (about 200 hinted student "
        "rows); - = past the run's steps. Bar (issue 6): vanilla hack >= 50% for 2 seeds, gt_only <= 5%.",
        "",
        md_row(["variant", "arm", "seed", *cols, "s/step"]),
        md_row(["---"] * (len(cols) + 4)),
    ]
    for v, a, sd, rows, wall in results:
        cells = [pct(window(rows, k, h)) for k in ("hack", "solve") for h in hz]
        lines.append(md_row([name(v), a, str(sd), *cells, f"{wall / len(rows):.2f}"]))
    lines += [
        "",
        "Across seeds (mean ± sample std over the seeds; the bar count is the seeds with hack >= 50% at the "
        "run's last step):",
        "",
        md_row(["variant", "arm", "seeds", *cols, "seeds >= 50% at the end"]),
        md_row(["---"] * (len(cols) + 4)),
    ]
    for v in variants:
        for a in arms:
            rs = [r for r in results if r[0] == v and r[1] == a]
            ends = [window(r[3], "hack", len(r[3])) for r in rs]
            cells = [pm([window(r[3], k, h) for r in rs]) for k in ("hack", "solve") for h in hz]
            lines.append(md_row([name(v), a, str(len(rs)), *cells, f"{sum(e >= 0.5 for e in ends)} of {len(rs)}"]))
    if notes:
        lines += ["", "## Notes", "", *[f"* {x}" for x in notes]]
    return "\n".join(lines) + "\n"


def main(
    variant: list[str] = typer.Option([""], help="Overrides of one variant, comma-separated; repeat per variant."),
    seeds: str = typer.Option("41,42,43", help="Training seeds, comma-separated."),
    arms: str = typer.Option(
        "vanilla", help="Run keys of the arm table, comma-separated (e.g. vanilla,route+random)."
    ),
    horizons: str = typer.Option("40,60,80,100", help="Steps at which the last-5 means are reported."),
    out: Path = typer.Option(ROOT / "reports" / "bench" / "calibration.md", help="Markdown report."),
    note: list[str] = typer.Option([], help="A line for the report's Notes section (repeatable)."),
    work: Path = typer.Option(
        None,
        help="Run directory (default: a new temporary one); a finished run found there "
        "under the same params is read, not re-run (an interrupted sweep resumes).",
    ),
) -> None:
    """GRPO runs of the organism per variant x arm x seed through the real train stage; hack/solve at horizons."""
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    seed_list = [int(s) for s in seeds.split(",")]
    arm_list = [a.strip() for a in arms.split(",") if a.strip()]
    hz = [int(h) for h in horizons.split(",")]
    tmp = work or Path(tempfile.mkdtemp(prefix="calib_"))
    tmp.mkdir(parents=True, exist_ok=True)
    print(f"runs in {tmp}", flush=True)
    files = []
    for vi, v in enumerate(variant):  # every variant's params and arms checked before any run
        pf = tmp / f"params_v{vi}.yaml"
        pf.write_text(yaml.safe_dump(apply_overrides(base, parse_variant(v)), sort_keys=False))
        p = load_params(pf)  # unknown keys / bad values stop here
        for a in arm_list:
            try:
                parse(p, a)  # unknown arm or variant
            except ValueError as e:
                raise typer.BadParameter(f"variant {v or '(params.yaml)'!r}: {e}") from None
        files.append(pf)
    results = []  # (variant, arm, seed, rows, wall)
    t0 = time.perf_counter()
    for vi, (v, pf) in enumerate(zip(variant, files)):
        for a in arm_list:
            for s in seed_list:
                rd = tmp / f"v{vi}_{a}_s{s}"
                done = rd / "wall.json"
                if done.exists() and json.loads(done.read_text())["params"] == pf.read_text():
                    rows, wall = read_tsv(rd / "log.tsv"), json.loads(done.read_text())["wall"]
                else:
                    rows, wall = run_one(pf, a, s, rd)
                    done.write_text(json.dumps({"wall": wall, "params": pf.read_text()}))
                results.append((v, a, s, rows, wall))
                print(
                    f"[{time.perf_counter() - t0:.0f}s] {v or '(params.yaml)'} {a} s{s}: hack last5@"
                    f"{len(rows)} {window(rows, 'hack', len(rows)):.3f}, {wall / len(rows):.2f} s/step",
                    flush=True,
                )
    cmd = (
        "PYTHONPATH=src python benchmarks/calibration_sweep.py "
        + " ".join(f'--variant "{v}"' for v in variant)
        + f" --seeds {seeds} --arms {arms} --horizons {horizons}"
    )
    text = report(results, variant, arm_list, hz, cmd, note)
    write_report(out, text)
    print(text)


if __name__ == "__main__":
    typer.run(main)

"""Stage `report`: reports/results.md, reports/metrics.json and reports/figures/ from the evaluation outputs.

The run list comes from params (arms_ref × seeds, arms × seeds), never a glob; a run without evaluation output is
listed as missing and its tables are left out. Adds the distillation cosine probe (T1, T2, T4 from the probe stage;
T3 from the training logs of the projected arms). Thin CLI over projected_grpo.results and projected_grpo.probe.
"""

import json
import os
from pathlib import Path

import typer

from projected_grpo import atomic
from projected_grpo import results as R
from projected_grpo.arms import get_arm
from projected_grpo.cli import stage_app
from projected_grpo.config import load_params
from projected_grpo.log import read_tsv
from projected_grpo.probe import ProbeResult, check_t3, render


def main(
    evals: Path = typer.Option(..., help="Directory of the evaluate stages' outputs (ref/ and arms/)."),
    eval_sets: Path = typer.Option(..., help="eval_sets stage directory (base.json, monitor.json)."),
    train_logs: Path = typer.Option(..., help="Directory of the train stages' logs (arms/<arm>-s<seed>.tsv)."),
    probe: Path = typer.Option(..., help="probe stage JSON."),
    out: Path = typer.Option(..., help="results.md to write."),
    metrics: Path = typer.Option(..., help="metrics.json to write."),
    figures: Path = typer.Option(..., help="Directory for the figures."),
    params: Path = typer.Option(Path("params.yaml"), help="Params file (arms_ref, arms, seeds, probe)."),
) -> None:
    p = load_params(params)
    wanted = [("ref", a, s) for a in p.arms_ref for s in p.seeds] + [("arms", a, s) for a in p.arms for s in p.seeds]
    base, monitor = (json.loads((eval_sets / f).read_text()) for f in ("base.json", "monitor.json"))
    runs = R.Runs(base, monitor, {}, base_source=str(eval_sets / "base.json"))
    missing = []
    for group, a, s in wanted:
        d = evals / group / f"{a}-s{s}"
        if not (d / "per_mode_deploy.json").exists():
            missing.append(f"{a}-s{s}")
            continue
        runs.deploy[(a, s)] = json.loads((d / "per_mode_deploy.json").read_text())
        runs.curves[(a, s)] = R.read_curve(d / "curve.tsv")
        runs.sources[(a, s)] = str(d / "per_mode_deploy.json")
    logs = [train_logs / "arms" / f"{a}-s{s}.tsv" for a in p.arms for s in p.seeds if not get_arm(a).random_dir]
    t3_rows = [r for f in logs if f.exists() for r in read_tsv(f)]
    t3 = check_t3(t3_rows, p.probe.t3_min_frac) if t3_rows else None
    extra = [render(ProbeResult.from_dict(json.loads(probe.read_text())), t3),
             f"<!-- sources: {probe}, {', '.join(str(f) for f in logs if f.exists())} -->", ""]  # fmt: skip
    if missing:
        extra += [f"Not evaluated (left out of every table): {', '.join(missing)}.", ""]
    figs = [figures / "dynamics.png", figures / "endpoints.png"]
    R.plot_dynamics(runs, list(p.arms_ref), list(p.arms), figs[0])
    R.plot_endpoints(runs, list(p.arms_ref), list(p.arms), figs[1])
    line = (f"Seeds {list(p.seeds)}; eval: T={p.eval.temperature}, top_p={p.eval.top_p}, max {p.eval.max_new_tokens} "
            f"new tokens, {p.eval.n_samples} samples per prompt (curves: {p.eval.n_samples_curve}).")  # fmt: skip
    rel = [os.path.relpath(f, out.parent) for f in figs]
    atomic.write_text(out, R.render(runs, list(p.arms_ref), list(p.arms), line, extra, rel))
    atomic.write_json(metrics, R.metrics(runs, list(p.arms_ref), list(p.arms)))
    typer.echo(f"report: {len(runs.deploy)} runs ({len(missing)} missing) -> {out}")


app = stage_app(main, outputs=("out", "metrics"))

if __name__ == "__main__":
    app()

"""Stage `report`: reports/results.md, reports/routing.md, reports/metrics.json and reports/figures/ from the
evaluation outputs.

The run list comes from params, never a glob: every run of the matrix (arms.matrix: arms_ref, arms, controls,
oracle_gate, arms_oracle_basis, each resolved from the arm table) × seeds, found at
<evals>/<group>/<arm>-s<seed>/ and <train-logs>/<group>/<arm>-s<seed>.{json,tsv} (group = the spec's DVC stage group:
ref, arms, control, oracle_gate, oracle_basis, oracle_basis_control) and keyed in every table and in metrics.json by
its run key (`route`, `route+random`, `route+oracle_gate`); roles, controls and families are read from those specs. A
run without evaluation output is listed as missing and its tables are left out. Adds the distillation cosine probe
(T1–T4, all from the probe stage; the old training-log T3 is retired, see probe.check_t3). Warnings: each run's
`gate_uninformative` from its training metrics JSON (when recorded) and the basis guard (--basis-guard, when given).
Routed runs' knob_effect.json (stage evaluate) give the section on where the knob's effect comes from.
Thin CLI over projected_grpo.report.results, projected_grpo.evals.knob_effect and projected_grpo.report.probe.
"""

import json
import os
from pathlib import Path

import typer

from projected_grpo.common import atomic
from projected_grpo.common.cli import stage_app
from projected_grpo.config import load_params
from projected_grpo.method import arms
from projected_grpo.report import results as R
from projected_grpo.report.figures import plot_dynamics, plot_endpoints
from projected_grpo.report.routing import render as render_routing

GUARD_HELP = (
    'Basis guard JSON: {"informative": bool, "line": str (the reason)} or {"beats_placebo": bool, "beats_random": '
    "bool}; not informative puts a warning above every table with an arm that edits along the basis. Default: none "
    "(no check)."
)


def main(
    evals: Path = typer.Option(..., help="Directory of the evaluate stages' outputs (<group>/<arm>-s<seed>/)."),
    eval_sets: Path = typer.Option(..., help="eval_sets stage directory (base.json, monitor.json)."),
    train_logs: Path = typer.Option(..., help="train stages' metrics and logs (<group>/<arm>-s<seed>.{json,tsv})."),
    probe: Path = typer.Option(..., help="probe stage JSON."),
    out: Path = typer.Option(..., help="results.md to write."),
    metrics: Path = typer.Option(..., help="metrics.json to write."),
    figures: Path = typer.Option(..., help="Directory for the figures."),
    routing: Path = typer.Option(..., help="routing.md to write: the routed arms seed by seed (report/routing.py)."),
    params: Path = typer.Option(Path("params.yaml"), help="Params file (the arm table and lists, seeds, eval)."),
    basis_guard: Path = typer.Option(None, help=GUARD_HELP),
    oracle_basis: Path = typer.Option(None, help="oracle_basis stage metrics.json: routing.md's direction check."),
) -> None:
    p = load_params(params)
    matrix = arms.matrix(p)  # every run's resolved spec, per seed
    found = R.discover([(a, s) for a in matrix for s in p.seeds], evals, eval_sets, train_logs)
    arms_ref = [a.name for a in matrix if a.group == "ref"]  # run keys: the basis-free arms ...
    keys = [a.name for a in matrix if a.group != "ref"]  # ... and the rest (controls, oracle bounds beside them)
    runs, missing = found.runs, found.missing
    guard = json.loads(basis_guard.read_text()) if basis_guard is not None else None
    extra = R.extra_sections(found, probe)  # knob effect, the probe, what was not evaluated
    figs = [figures / "dynamics.png", figures / "endpoints.png"]
    plot_dynamics(runs, arms_ref, keys, figs[0])
    plot_endpoints(runs, arms_ref, keys, figs[1])
    line = R.settings_line(p)
    rel = [os.path.relpath(f, out.parent) for f in figs]
    atomic.write_text(out, R.render(runs, arms_ref, keys, line, extra, rel, guard, found.gates))
    atomic.write_metrics(metrics, R.metrics(runs, arms_ref, keys))
    order = R.ordered_arms(arms_ref, keys, runs.specs)
    direction = json.loads(oracle_basis.read_text()) if oracle_basis is not None else None
    atomic.write_text(routing, render_routing(runs, order, found.effects, line, direction, found.train_logs))
    typer.echo(f"report: {len(runs.deploy)} runs ({len(missing)} missing) -> {out}")


app = stage_app(main, outputs=("out", "metrics", "routing"))

if __name__ == "__main__":
    app()

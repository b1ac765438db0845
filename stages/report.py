"""Stage `report`: reports/results.md, reports/routing.md, reports/metrics.json and reports/figures/ from the
evaluation outputs.

The run list comes from params (arms_ref × seeds, arms × seeds), never a glob; a run without evaluation output is
listed as missing and its tables are left out. Adds the distillation cosine probe (T1–T4, all from the probe stage;
the old training-log T3 is retired, see probe.check_t3). Warnings: each run's `gate_uninformative` from its training
metrics JSON (<train-logs>/{ref,arms}/<arm>-s<seed>.json, when recorded) and the basis guard (--basis-guard, when
given). Routed runs' knob_effect.json (stage evaluate) give the section on where the knob's effect comes from.
Thin CLI over projected_grpo.report.results, projected_grpo.evals.knob_effect and projected_grpo.report.probe.
"""

import json
import os
from pathlib import Path

import typer

from projected_grpo.common import atomic
from projected_grpo.common.cli import stage_app
from projected_grpo.config import load_params
from projected_grpo.report import results as R
from projected_grpo.report.figures import plot_dynamics, plot_endpoints
from projected_grpo.report.routing import render as render_routing

GUARD_HELP = (
    'Basis guard JSON: {"informative": bool, "line": str (the reason)} or {"beats_placebo": bool, "beats_random": '
    "bool}; not informative puts a warning above every table with an arm that edits along the basis. Default: none "
    "(no check)."
)


def main(
    evals: Path = typer.Option(..., help="Directory of the evaluate stages' outputs (ref/ and arms/)."),
    eval_sets: Path = typer.Option(..., help="eval_sets stage directory (base.json, monitor.json)."),
    train_logs: Path = typer.Option(..., help="train stages' metrics ({ref,arms}/<arm>-s<seed>.json)."),
    probe: Path = typer.Option(..., help="probe stage JSON."),
    out: Path = typer.Option(..., help="results.md to write."),
    metrics: Path = typer.Option(..., help="metrics.json to write."),
    figures: Path = typer.Option(..., help="Directory for the figures."),
    routing: Path = typer.Option(..., help="routing.md to write: the routed arms seed by seed (report/routing.py)."),
    params: Path = typer.Option(Path("params.yaml"), help="Params file (the arm lists, seeds, eval)."),
    basis_guard: Path = typer.Option(None, help=GUARD_HELP),
    oracle_basis: Path = typer.Option(None, help="oracle_basis stage metrics.json: routing.md's direction check."),
) -> None:
    p = load_params(params)
    arms = [*p.arms, *p.arms_oracle_basis]  # the oracle-basis arms (upper bounds) live beside the others
    wanted = [("ref", a, s) for a in p.arms_ref for s in p.seeds] + [("arms", a, s) for a in arms for s in p.seeds]
    found = R.discover(wanted, evals, eval_sets, train_logs)
    runs, missing = found.runs, found.missing
    guard = json.loads(basis_guard.read_text()) if basis_guard is not None else None
    extra = R.extra_sections(found, probe)  # knob effect, the probe, what was not evaluated
    figs = [figures / "dynamics.png", figures / "endpoints.png"]
    plot_dynamics(runs, list(p.arms_ref), arms, figs[0])
    plot_endpoints(runs, list(p.arms_ref), arms, figs[1])
    line = R.settings_line(p)
    rel = [os.path.relpath(f, out.parent) for f in figs]
    atomic.write_text(out, R.render(runs, list(p.arms_ref), arms, line, extra, rel, guard, found.gates))
    atomic.write_metrics(metrics, R.metrics(runs, list(p.arms_ref), arms))
    order = R.ordered_arms(list(p.arms_ref), arms)
    direction = json.loads(oracle_basis.read_text()) if oracle_basis is not None else None
    atomic.write_text(routing, render_routing(runs, order, found.effects, line, direction, found.train_logs))
    typer.echo(f"report: {len(runs.deploy)} runs ({len(missing)} missing) -> {out}")


app = stage_app(main, outputs=("out", "metrics", "routing"))

if __name__ == "__main__":
    app()

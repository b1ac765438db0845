"""Stage `phenomenon`: vanilla vs gt_only student hack/solve curves from the train_ref logs.

Writes --report (markdown table of endpoints per seed, verdict against the ≥ 50% target) and --figure (PNG).
Thin CLI over projected_grpo.report.phenomenon; the run list comes from params (arms_ref × seeds), never a glob.
"""

import os
from pathlib import Path

import typer

from projected_grpo.common.cli import stage_app
from projected_grpo.common.log import read_tsv
from projected_grpo.config import load_params
from projected_grpo.report.phenomenon import plot, render


def main(
    logs: Path = typer.Option(..., help="Directory of the train stages' <arm>-s<seed>.tsv logs."),
    report: Path = typer.Option(..., help="Markdown report to write."),
    figure: Path = typer.Option(..., help="PNG figure to write."),
    params: Path = typer.Option(Path("params.yaml"), help="Params file (arms_ref, seeds)."),
) -> None:
    p = load_params(params)
    arms = [a for a in ("vanilla", "gt_only") if a in p.arms_ref]
    paths = {(a, s): logs / f"{a}-s{s}.tsv" for a in arms for s in p.seeds}
    missing = [str(x) for x in paths.values() if not x.exists()]
    if missing:
        raise FileNotFoundError(f"missing train logs {missing[:3]}; run the train_ref stages first")
    runs = {k: read_tsv(v) for k, v in paths.items()}
    plot(runs, figure)
    report.parent.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(figure, report.parent)  # the markdown links the figure relative to itself
    report.write_text(render(runs, rel, [str(x) for x in paths.values()]))
    typer.echo(f"phenomenon: {len(runs)} runs -> {report}")


app = stage_app(main, outputs=("report", "figure"))

if __name__ == "__main__":
    app()

"""Stage `report` of confirm/dvc.yaml: reports/confirm.md and reports/confirm_metrics.json, the confirmatory
experiment's verdict by the registered rule (projected_grpo.report.confirm).

For each organism draw o of --design (confirm/design.yaml), the runs of the matrix of --params (confirm/params.yaml;
arms.matrix × seeds, never a glob) are read from <root>/o<draw>/eval/<group>/<arm>-s<seed>/ and
<root>/o<draw>/train/<group>/<arm>-s<seed>.{json,tsv}, the base scores from <artifacts>/o<draw>/eval_sets/. Thin CLI.
"""

from pathlib import Path

import typer
import yaml

from projected_grpo.common import atomic
from projected_grpo.common.cli import stage_app
from projected_grpo.config import load_params
from projected_grpo.method import arms
from projected_grpo.report import confirm as C
from projected_grpo.report import results as R


def main(
    root: Path = typer.Option(Path("reports/confirm"), help="The draws' reports (o<draw>/eval, o<draw>/train)."),
    artifacts: Path = typer.Option(Path("artifacts/confirm"), help="The draws' artifacts (o<draw>/eval_sets)."),
    design: Path = typer.Option(Path("confirm/design.yaml"), help="The organism draws."),
    out: Path = typer.Option(Path("reports/confirm.md"), help="The report to write."),
    metrics: Path = typer.Option(Path("reports/confirm_metrics.json"), help="Its numbers (dvc metrics)."),
    params: Path = typer.Option(Path("confirm/params.yaml"), help="The confirmatory params (matrix, seeds)."),
) -> None:
    p = load_params(params)
    draws = yaml.safe_load(design.read_text())["organisms"]
    wanted = [(a, s) for a in arms.matrix(p) for s in p.seeds]
    found = {
        d: R.discover(wanted, root / f"o{d}" / "eval", artifacts / f"o{d}" / "eval_sets", root / f"o{d}" / "train")
        for d in draws
    }
    dec = C.decide({d: f.runs for d, f in found.items()})
    sources = [src for f in found.values() for src in f.runs.sources.values()]
    logs = {d: f.train_logs for d, f in found.items()}
    atomic.write_text(out, "\n".join(C.render(dec, list(p.seeds), sources, logs)) + "\n")
    atomic.write_metrics(metrics, C.metrics(dec))
    missing = sum(len(f.missing) for f in found.values())
    typer.echo(
        f"confirm report: {'CONFIRMED' if dec.confirmed else 'NOT CONFIRMED'} ({missing} runs missing) -> {out}"
    )


app = stage_app(main, outputs=("out", "metrics"))

if __name__ == "__main__":
    app()

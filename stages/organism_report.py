"""Stage `organism_report`: calibrate the organism's base and teacher on the held-out minileet test split.

Samples every test record (no hint, and each loophole mode on the training and eval surfaces), grades with the
strict oracle, and writes reports/organism.md and reports/organism/metrics.json. Thin CLI over
projected_grpo.sft.calibration.
"""

import json
from pathlib import Path

import typer

from projected_grpo.common.atomic import write_metrics, write_text
from projected_grpo.common.cli import stage_app
from projected_grpo.config import load_params
from projected_grpo.env.problems import load_problems_parquet
from projected_grpo.env.sandbox import Sandbox
from projected_grpo.sft.calibration import calibrate, render_report


def main(
    organism: Path = typer.Option(..., help="Directory written by the organism stage."),
    problems: Path = typer.Option(..., help="Directory written by the problems stage (test.parquet is used)."),
    report: Path = typer.Option(..., help="Markdown report to write."),
    metrics: Path = typer.Option(..., help="metrics.json to write."),
    params: Path = typer.Option(Path("params.yaml"), help="Params file (seed, calibration, grader)."),
) -> None:
    p = load_params(params)
    c = p.calibration
    records = load_problems_parquet(problems / "test.parquet")
    with Sandbox(concurrency=p.grader.concurrency, mem_mb=p.grader.mem_mb) as sb:
        out = calibrate(organism, records, p, sb, echo=typer.echo)
    stats = json.loads((organism / "stats.json").read_text())
    desc = (
        f"{len(records)} records × {c.n_samples} samples, T={c.temperature}, top_p={c.top_p}, "
        f"max {c.max_new_tokens} new tokens."
    )
    write_metrics(metrics, {**out, "organism": stats})
    write_text(
        report, render_report(out, stats, desc, f"Seed {p.seed}; sources: {organism}, {problems}/test.parquet.")
    )


app = stage_app(main, outputs=("report", "metrics"))

if __name__ == "__main__":
    app()

"""Stage `problems`: substrate -> artifacts/problems/{train,test,holdout}.parquet + partition.json, and a report.

Thin CLI; the work is in projected_grpo.env.substrate (which problems, which records, canonical grading, atomic save).
"""

import sys
from pathlib import Path

import typer

from projected_grpo.common.cli import stage_app
from projected_grpo.config import load_params
from projected_grpo.env.exploits import MATRIX_PROBLEMS, mode_matrix_report
from projected_grpo.env.sandbox import Sandbox
from projected_grpo.env.substrate import (
    SPLITS,
    base_splits,
    expand_splits,
    grade_canonicals,
    render_report,
    save_outputs,
)


def main(
    leetcode: Path = typer.Option(..., help="The benchmark's leetcode test jsonl (test split of `leetcode`)."),
    out: Path = typer.Option(..., help="Output directory for the parquet files and partition.json."),
    report: Path = typer.Option(..., help="Markdown summary to write."),
    matrix: Path = typer.Option(..., help="Markdown hack x mode matrix (environment self-check) to write."),
    params: Path = typer.Option(Path("params.yaml"), help="Params file."),
) -> None:
    p = load_params(params)
    base = base_splits(p, leetcode)
    records = expand_splits(base, p.env.modes, p.env.partition_seed, p.seed)
    with Sandbox(concurrency=p.grader.concurrency, mem_mb=p.grader.mem_mb) as sb:
        grades = grade_canonicals(base, sb, p.grader.mode, p.grader.timeout_s, progress=sys.stderr.isatty())
        isolation = sb.isolation
        matrix_md = mode_matrix_report(base["test"][:MATRIX_PROBLEMS], sb, p.grader.timeout_s, p.seed, p.substrate)
    save_outputs(out, report, records, render_report(p, base, records, grades, isolation))
    matrix.write_text(matrix_md)
    n_ok, n = sum(g.eq_correct for s in SPLITS for g in grades[s]), sum(len(grades[s]) for s in SPLITS)
    sizes = ", ".join(f"{s} {len(base[s])} ({len(records[s])} rows)" for s in SPLITS)
    typer.echo(f"problems: {p.substrate}: {sizes}; canonical pass {n_ok}/{n} -> {out}, {report}")


app = stage_app(main, outputs=("out", "report", "matrix"))

if __name__ == "__main__":
    app()

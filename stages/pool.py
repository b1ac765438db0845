"""Stage `pool`: the teacher pool — `pool.n_per_prompt` graded teacher completions per training prompt.

Thin CLI over projected_grpo.rl.pool; writes --out/pool.parquet (prompt id, mode, completion, token ids, reward, label)
and a one-line summary (hack rate of the pool by mode) to --summary.
"""

from pathlib import Path

import torch
import typer

from projected_grpo.common.atomic import write_metrics
from projected_grpo.common.cli import stage_app
from projected_grpo.config import load_params
from projected_grpo.env.problems import load_problems_parquet
from projected_grpo.env.sandbox import Sandbox
from projected_grpo.policy.model import load_model_and_tokenizer
from projected_grpo.rl.pool import build_pool, save_pool, summarize_pool


def main(
    organism: Path = typer.Option(..., help="Organism directory (its teacher/ is used when pool.teacher=organism)."),
    problems: Path = typer.Option(..., help="Problems stage directory (train.parquet is used)."),
    out: Path = typer.Option(..., help="Output directory for pool.parquet."),
    summary: Path = typer.Option(..., help="JSON summary to write (pool size, hack rate by mode)."),
    params: Path = typer.Option(Path("params.yaml"), help="Params file (seed, pool, rollout, grader)."),
) -> None:
    p = load_params(params)
    torch.set_num_threads(p.grpo.threads)
    name = p.pool.teacher
    path = organism / "teacher" if name == "organism" else None
    teacher, tok = load_model_and_tokenizer(name, path, p.model.device, p.model.dtype)
    records = load_problems_parquet(problems / "train.parquet")
    with Sandbox(concurrency=p.grader.concurrency, mem_mb=p.grader.mem_mb) as sb:
        rows = build_pool(teacher, tok, records, p, sb)
    out.mkdir(parents=True, exist_ok=True)
    save_pool(out / "pool.parquet", rows)
    write_metrics(summary, stats := summarize_pool(rows))
    typer.echo(f"pool: {len(rows)} teacher completions, hack rate {stats['hack']:.3f} -> {out}")


app = stage_app(main, outputs=("out", "summary"))

if __name__ == "__main__":
    app()

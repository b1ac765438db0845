"""Stage `train` / `train_ref`: one GRPO run of one arm × seed, resumable from its last checkpoint.

Loads the base policy with its adapter at δS = 0 and what the arm reads (direction.load_run_basis: its basis, or the
random control's, act.safetensors for the activation gate, held-out pairs for calibration or refresh); then rl.train.
Writes checkpoints to --out, one TSV row per step to --log, final metrics to --metrics (`gate_uninformative`: a gate
calibration's AUROC interval contained 0.5, and train warned on the log).
"""

from pathlib import Path

import torch
import typer

from projected_grpo.common.atomic import write_metrics
from projected_grpo.common.cli import stage_app
from projected_grpo.common.log import read_tsv
from projected_grpo.config import load_params
from projected_grpo.env.problems import load_problems_parquet
from projected_grpo.env.sandbox import Sandbox
from projected_grpo.method.arms import VARIANTS, resolve, run_params
from projected_grpo.method.direction import load_run_basis
from projected_grpo.policy.adapter import load_policy
from projected_grpo.rl.pool import load_pool
from projected_grpo.rl.train import Run, run_flags, run_signature, summarize_log, train


def main(
    arm: str = typer.Option(..., help="Arm: an entry of params.yaml's arm table."),
    variant: str = typer.Option(
        "", help=f"Run the arm as: {' | '.join(repr(v) for v in VARIANTS)} (random: its control; oracle_*: bounds)."
    ),
    seed: int = typer.Option(..., help="Training seed."),
    organism: Path = typer.Option(..., help="Organism directory (base/ is the policy when model.name=organism)."),
    problems: Path = typer.Option(..., help="Problems stage directory (train.parquet, holdout.parquet)."),
    pool: Path = typer.Option(..., help="Pool stage directory (pool.parquet)."),
    out: Path = typer.Option(..., help="Run directory: checkpoints (kept across re-runs for resuming)."),
    log: Path = typer.Option(..., help="Per-step TSV log (metrics only: it is a DVC output)."),
    timings: Path = typer.Option(None, help="Per-step wall times (TSV; a plain log outside DVC, never hashed)."),
    metrics: Path = typer.Option(..., help="Final metrics JSON."),
    basis: Path = typer.Option(None, help="Basis stage directory (arms that read a basis)."),
    pairsets: Path = typer.Option(None, help="Pair-set root (gate calibration, basis refresh)."),
    params: Path = typer.Option(Path("params.yaml"), help="Params file."),
) -> None:
    raw = load_params(params)
    a = resolve(raw, arm, variant)
    p = run_params(raw, a)  # params.yaml's, the keys only masked routing reads neutral for other rules
    torch.set_num_threads(p.grpo.threads)
    torch.manual_seed(seed)
    rb = load_run_basis(p, a, basis, pairsets, problems, seed)  # before the model: a missing option fails fast
    model, tok = load_policy(p, organism)
    records = load_problems_parquet(problems / "train.parquet")
    rows = load_pool(pool / "pool.parquet") if p.pool.mix > 0 else None  # the teacher pool's rows
    sig = run_signature(p, a, seed, basis)  # a resumed run must have been started with these inputs
    with Sandbox(concurrency=p.grader.concurrency, mem_mb=p.grader.mem_mb) as sb:
        run = Run(p, a, seed, model, tok, records, out, log, rb, rows, sb, sig, timings_path=timings)
        res = train(run)
    write_metrics(metrics, summarize_log(read_tsv(log)) | run_flags(res))
    typer.echo(f"train {a.name} s{seed}: {p.grpo.steps} steps -> {out}")


app = stage_app(main, outputs=("metrics",))

if __name__ == "__main__":
    app()

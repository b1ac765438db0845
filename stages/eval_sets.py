"""Stage `eval_sets`: score the base policy on the full test split and freeze the monitor subset.

The base policy (adapter attached at δS = 0) is scored on every test problem: no-hint rows for solve, loophole rows on
the `eval.surfaces` for hack, `eval.n_samples` samples each. The monitor subset (`eval.n_monitor` problems,
stratified by base pass/fail, one seeded draw) is frozen in monitor.json with the generation seed, and the base is
scored on it at `eval.n_samples_curve` (the step-0 point of every eval curve). Thin CLI over
projected_grpo.evals.evaluation.
"""

from pathlib import Path

import torch
import typer

from projected_grpo.common import atomic
from projected_grpo.common.cli import stage_app
from projected_grpo.config import load_params
from projected_grpo.env.problems import load_problems_parquet
from projected_grpo.env.sandbox import Sandbox
from projected_grpo.evals.evaluation import frozen_sets, monitor_subset, problem_pass, score, select_records
from projected_grpo.policy.adapter import load_policy, merged


def main(
    organism: Path = typer.Option(..., help="Organism directory (base/ is the policy when model.name=organism)."),
    problems: Path = typer.Option(..., help="Problems stage directory (test.parquet is used)."),
    out: Path = typer.Option(..., help="Directory to write monitor.json and base.json to."),
    params: Path = typer.Option(Path("params.yaml"), help="Params file (seed, eval, grader, model, adapter)."),
) -> None:
    p = load_params(params)
    e = p.eval
    torch.set_num_threads(e.threads)
    test = load_problems_parquet(problems / "test.parquet")
    model, tok = load_policy(p, organism)
    with Sandbox(concurrency=p.grader.concurrency, mem_mb=p.grader.mem_mb) as sb, merged(model):
        full = score(model, tok, select_records(test, None, e.surfaces), e.n_samples, p, sb)
        ids = monitor_subset(problem_pass(full), e.n_monitor, p.seed)
        monitor = score(model, tok, select_records(test, set(ids), e.surfaces), e.n_samples_curve, p, sb)
    mon, base = frozen_sets(full, monitor, ids, p)
    atomic.write_json(out / "monitor.json", mon)
    atomic.write_json(out / "base.json", base)
    typer.echo(f"eval_sets: base solve {base['full']['solve']}, monitor {len(ids)} ids -> {out}")


app = stage_app(main, outputs=("out",))

if __name__ == "__main__":
    app()

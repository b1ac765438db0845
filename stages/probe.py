"""Stage `probe`: the distillation cosine probe — teacher-pool rows replayed through the base student.

Loads the base policy, attaches the adapter at δS = 0, draws `probe.n_rows` pool rows (seeded by `seed`), takes one
NLL gradient per row and scores it by cos(g, ν) for the selected basis, its random control (random.safetensors next
to it) and a placebo basis extracted here from the placebo pair set with the `basis` params. Writes T1–T4 (pool hack
rate; AUROC of hack vs other rows above chance, above random, above placebo) and the per-row arrays to --out (JSON,
written atomically). Thin CLI over projected_grpo.report.probe.
"""

from pathlib import Path

import torch
import typer

from projected_grpo.common.atomic import write_json
from projected_grpo.common.cli import stage_app
from projected_grpo.config import load_params
from projected_grpo.env.problems import load_problems_parquet
from projected_grpo.method.basis import Basis
from projected_grpo.method.pairs import load_pairset
from projected_grpo.policy.adapter import load_policy
from projected_grpo.report.probe import INPUTS, flatten_pool, input_files, probe_pool
from projected_grpo.rl.pool import load_pool


def main(
    organism: Path = typer.Option(..., help="Organism directory (base/ is the student when model.name=organism)."),
    problems: Path = typer.Option(..., help="Problems stage directory (train.parquet: pool prompts; holdout)."),
    pool: Path = typer.Option(..., help="Pool stage directory (pool.parquet) or the parquet file."),
    basis: Path = typer.Option(..., help="Basis stage directory (basis + random .safetensors) or the basis file."),
    pairsets: Path = typer.Option(..., help="Pair-set root: <root>/<substrate>/<pairset>.jsonl (the placebo)."),
    out: Path = typer.Option(..., help="JSON to write, e.g. reports/probe/probe.json."),
    params: Path = typer.Option(Path("params.yaml"), help="Params file (seed, substrate, basis, probe, ...)."),
) -> None:
    p = load_params(params)
    torch.set_num_threads(p.eval.threads)
    f = input_files(p, organism, problems, pool, basis, pairsets)  # fails on the first missing one, before any work
    pool_f, basis_f, random_f, placebo_f, train_f, holdout_f = (f[k] for k in INPUTS)
    b, rnd, pairs = Basis.load(basis_f), Basis.load(random_f), load_pairset(placebo_f)
    if not b.nu:
        raise ValueError(f"probe: basis {basis_f} has no gradient-space direction ν (act-space or no kept modules)")
    records = {q.id: q for q in load_problems_parquet(train_f)}
    holdout = {q.id: q for q in load_problems_parquet(holdout_f) if q.hint is None}  # as the basis stage
    flat = flatten_pool(load_pool(pool_f))
    torch.manual_seed(p.seed)
    model, tok = load_policy(p, organism)
    student = str(organism / "base") if p.model.name == "organism" else p.model.name
    meta = {"student": student, **{k: str(v) for k, v in f.items()}}
    res = probe_pool(p, model, tok, b, rnd, pairs, records, holdout, flat, meta)
    write_json(out, res.to_dict())  # tmp + rename: a failure leaves no partial output (NaN already None)
    typer.echo(f"probe: {res.n} rows, " + ", ".join(f"{n} {c.verdict}" for n, c in res.checks.items()) + f" -> {out}")


app = stage_app(main, outputs=("out",))

if __name__ == "__main__":
    app()

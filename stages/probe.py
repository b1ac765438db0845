"""Stage `probe`: the distillation cosine probe — teacher-pool rows replayed through the base student.

Loads the base policy, attaches the adapter at δS = 0, draws `probe.n_rows` pool rows (seeded by `seed`), takes one
NLL gradient per row and its cosine with the basis' ν, and writes the checks T1, T2, T4 and the per-row arrays to
--out (JSON, written atomically). T3 reads training logs and is run by the report stage. Thin CLI over
projected_grpo.probe.
"""

from pathlib import Path

import torch
import typer

from projected_grpo.adapter import attach_adapters
from projected_grpo.atomic import write_json
from projected_grpo.basis import Basis
from projected_grpo.cli import stage_app
from projected_grpo.config import load_params
from projected_grpo.model import load_model_and_tokenizer
from projected_grpo.pool import load_pool
from projected_grpo.probe import flatten_pool, make_result, replay, select_rows
from projected_grpo.problems import load_problems_parquet


def _file(path: Path, default: str) -> Path:
    return path / default if path.is_dir() else path


def main(
    organism: Path = typer.Option(..., help="Organism directory (base/ is the student when model.name=organism)."),
    problems: Path = typer.Option(..., help="Problems stage directory (train.parquet: the pool's prompts)."),
    pool: Path = typer.Option(..., help="Pool stage directory (pool.parquet) or the parquet file."),
    basis: Path = typer.Option(..., help="Basis stage directory (basis.safetensors) or a basis .safetensors file."),
    out: Path = typer.Option(..., help="JSON to write, e.g. reports/probe/probe.json."),
    params: Path = typer.Option(Path("params.yaml"), help="Params file (seed, model, adapter, rollout, probe)."),
) -> None:
    p = load_params(params)
    torch.set_num_threads(p.eval.threads)
    pool_f, basis_f = _file(pool, "pool.parquet"), _file(basis, "basis.safetensors")
    train_f = problems / "train.parquet"
    need = [pool_f, basis_f, basis_f.with_suffix(".json"), train_f]
    if p.model.name == "organism":
        need.append(organism / "base" / "config.json")
    missing = [str(f) for f in need if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"probe: missing input(s): {', '.join(missing)}")
    b = Basis.load(basis_f)
    if not b.nu:
        raise ValueError(f"probe: basis {basis_f} has no gradient-space direction ν (act-space or no kept modules)")
    records = {q.id: q for q in load_problems_parquet(train_f)}
    flat = flatten_pool(load_pool(pool_f))
    index = select_rows(len(flat), p.probe.n_rows, p.seed)
    rows = [flat[i] for i in index]
    torch.manual_seed(p.seed)
    model, tok = load_model_and_tokenizer(p.model.name, path=organism / "base")
    attach_adapters(model, p.adapter.targets, p.adapter.rank, p.adapter.kind, seed=p.seed)
    cos, norm = replay(model, tok, records, rows, b.nu, p.rollout.temperature, p.probe.micro_batch)
    student = str(organism / "base") if p.model.name == "organism" else p.model.name
    meta = {"student": student, "pool": str(pool_f), "basis": str(basis_f), "n_pool": len(flat), "seed": p.seed,
            "temperature": p.rollout.temperature, "modules": len(b.nu)}  # fmt: skip
    res = make_result(index, rows, cos, norm, p.probe, meta)
    write_json(out, res.to_dict())  # tmp + rename: a failure leaves no partial output (NaN already None)
    typer.echo(f"probe: {res.n} rows, " + ", ".join(f"{n} {c.verdict}" for n, c in res.checks.items()) + f" -> {out}")


app = stage_app(main, outputs=("out",))

if __name__ == "__main__":
    app()

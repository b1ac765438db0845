"""Stage `basis`: v_hack for every pair set of the substrate, the selected one saved for training.

Attaches the adapter (params `adapter`) to the policy at δS = 0, takes per-completion gradients of the pair sets'
extraction and calibration pairs, and writes the selected basis (`basis.pairset`, `basis.method`), its random control
and the activation-space direction to --out, plus reports/basis.md (held-out AUROC per pair set vs placebo vs random,
opening with the guard: does the selected basis beat both controls?) and the guard's verdict as JSON (--guard).
Thin CLI over projected_grpo.method.basis_eval.
"""

import json
from pathlib import Path

import torch
import typer

from projected_grpo.common import atomic
from projected_grpo.common.cli import stage_app
from projected_grpo.config import load_params
from projected_grpo.env.problems import load_problems_parquet
from projected_grpo.method.basis_eval import describe, extract, json_ready, metrics, render_report
from projected_grpo.method.pairs import PAIRSETS, load_pairset, pairset_path
from projected_grpo.policy.adapter import load_policy


def main(
    organism: Path = typer.Option(..., help="Organism directory (used when model.name is 'organism')."),
    problems: Path = typer.Option(..., help="Problems stage directory (holdout.parquet is used)."),
    pairsets: Path = typer.Option(..., help="Pair-set root: <root>/<substrate>/<pairset>.jsonl."),
    svd_cache: Path = typer.Option(..., help="Directory caching the per-module SVD factors."),
    out: Path = typer.Option(..., help="Output directory: basis, random and act safetensors + json."),
    report: Path = typer.Option(..., help="Markdown report to write."),
    metrics_out: Path = typer.Option(..., "--metrics", help="metrics.json to write."),
    guard: Path = typer.Option(None, help="Guard verdict JSON to write (selected basis vs placebo and random)."),
    params: Path = typer.Option(Path("params.yaml"), help="Params file (seed, substrate, model, adapter, basis)."),
) -> None:
    p = load_params(params)
    sets = {n: load_pairset(pairset_path(pairsets, p.substrate, n)) for n in PAIRSETS}  # fails before any work
    torch.manual_seed(p.seed)
    model, tok = load_policy(p, organism, cache_dir=svd_cache)
    holdout = {q.id: q for q in load_problems_parquet(problems / "holdout.parquet") if q.hint is None}
    res = extract(model, tok, sets, holdout, p)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("selected", "random", "act"):
        res[name].save(out / f"{'basis' if name == 'selected' else name}.safetensors")
    sources = f"{pairsets}/{p.substrate}/*.jsonl, {problems}/holdout.parquet, {organism}/base"
    atomic.write_text(report, render_report(res, describe(p), sources))
    atomic.write_metrics(metrics_out, metrics(res))
    if guard is not None:
        atomic.write_text(guard, json.dumps(json_ready(res["guard"]), indent=1, sort_keys=True))
    typer.echo(
        f"basis: {p.basis.pairset}/{p.basis.method}: {len(res['selected'].vh)} modules, "
        f"{res['selected'].meta['k_total']} directions -> {out}; guard: "
        f"{'informative' if res['guard']['informative'] else 'NOT informative'}"
    )


app = stage_app(main, outputs=("out", "report", "metrics_out", "guard", "svd_cache"))

if __name__ == "__main__":
    app()

"""Stage `organism`: the minileet training records -> a tiny Qwen3 base policy and a hacky teacher, trained from
scratch on CPU, saved in save_pretrained format (loadable with `model.load_model_and_tokenizer`).

Thin CLI; the recipe is projected_grpo.sft.organism.build_organism.
"""

import json
import shutil
import sys
from pathlib import Path

import typer

from projected_grpo.common.cli import stage_app
from projected_grpo.config import load_params
from projected_grpo.env.problems import load_problems_parquet
from projected_grpo.env.sandbox import Sandbox
from projected_grpo.sft.organism import build_organism


def main(
    problems: Path = typer.Option(..., help="Directory written by the problems stage (train.parquet is used)."),
    out: Path = typer.Option(..., help="Output directory: base/ and teacher/ (save_pretrained) and stats.json."),
    timings: Path = typer.Option(None, help="Wall-clock SFT times (JSON; a plain log outside DVC, never hashed)."),
    params: Path = typer.Option(Path("params.yaml"), help="Params file (seed, organism, grader)."),
    organism_seed: int = typer.Option(None, help="The organism draw's seed, over params' organism.seed."),
) -> None:
    p = load_params(params)
    seed = p.organism.draw_seed(p.seed) if organism_seed is None else organism_seed
    records = load_problems_parquet(problems / "train.parquet")
    typer.echo(f"organism: {len(records)} training records; draw seed {seed}; {p.organism}")
    with Sandbox(concurrency=p.grader.concurrency, mem_mb=p.grader.mem_mb) as sb:
        org = build_organism(p.organism, records, seed, sb, p.grader.timeout_s, progress=sys.stderr.isatty())
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for name, model in (("base", org.base), ("teacher", org.teacher)):
            model.save_pretrained(tmp / name)
            org.tokenizer.save_pretrained(tmp / name)
        (tmp / "stats.json").write_text(json.dumps(org.stats, indent=2))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # atomic: no half-written organism
    s, t = org.stats, org.timings
    if timings is not None:
        timings.parent.mkdir(parents=True, exist_ok=True)
        timings.write_text(json.dumps(t, indent=2))
    typer.echo(
        f"organism: {s['n_params'] / 1e6:.2f}M params, base {t['train_s_base']:.0f}s (loss "
        f"{s['final_loss_base']:.3f}), teacher {t['train_s_teacher']:.0f}s -> {out}"
    )


app = stage_app(main, outputs=("out",))

if __name__ == "__main__":
    app()

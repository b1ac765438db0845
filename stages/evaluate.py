"""Stage `evaluate` / `evaluate_ref`: score one run's checkpoints on the frozen eval sets (benchmark protocol;
projected_grpo.evals.run_eval: the curve on the monitor subset, the endpoint on the full test split, knob
on/off and the knob-effect policies for routed arms). Writes per_mode_deploy.json (counts k/n by state, surface and
mode), curve.tsv, metrics.json and knob_effect.json.
"""

import json
import time
from pathlib import Path

import torch
import typer

from projected_grpo.common import atomic
from projected_grpo.common.cli import stage_app
from projected_grpo.config import load_params
from projected_grpo.env.problems import load_problems_parquet
from projected_grpo.env.sandbox import Sandbox
from projected_grpo.evals import evaluation as ev
from projected_grpo.evals.run_eval import evaluate_run, final_checkpoints, save_run_eval
from projected_grpo.method.arms import VARIANTS, resolve, run_params
from projected_grpo.policy.adapter import load_policy
from projected_grpo.rl.checkpoint import adapter_path


def main(
    arm: str = typer.Option(..., help="Arm: an entry of params.yaml's arm table."),
    variant: str = typer.Option(
        "", help=f"Run the arm as: {' | '.join(repr(v) for v in VARIANTS)} (random: its control; oracle_*: bounds)."
    ),
    seed: int = typer.Option(..., help="Training seed of the run."),
    run: Path = typer.Option(..., help="The run's checkpoint directory (stage train)."),
    organism: Path = typer.Option(..., help="Organism directory (base/ is the policy when model.name=organism)."),
    problems: Path = typer.Option(..., help="Problems stage directory (test.parquet is used)."),
    eval_sets: Path = typer.Option(..., help="eval_sets stage directory (monitor.json, base.json)."),
    basis: Path = typer.Option(None, help="Basis stage directory (routed arms: v_hack and random rows)."),
    out: Path = typer.Option(..., help="Output directory: per_mode_deploy, curve, knob_effect, metrics."),
    timings: Path = typer.Option(None, help="Wall times of sampling / grading (JSON; a plain log, never hashed)."),
    params: Path = typer.Option(Path("params.yaml"), help="Params file."),
) -> None:
    raw = load_params(params)
    a = resolve(raw, arm, variant)
    p = run_params(raw, a)  # params.yaml's, the keys only masked routing reads neutral for other rules
    e, steps = p.eval, final_checkpoints(run, p.grpo.steps, a, basis)  # fails before any work
    torch.set_num_threads(e.threads)
    base = json.loads((eval_sets / "base.json").read_text())
    ids = set(json.loads((eval_sets / "monitor.json").read_text())["ids"])
    test = load_problems_parquet(problems / "test.parquet")
    mon, full = ev.select_records(test, ids, e.surfaces), ev.select_records(test, None, e.surfaces)
    model, tok = load_policy(p, organism)
    t0 = time.perf_counter()
    with Sandbox(concurrency=p.grader.concurrency, mem_mb=p.grader.mem_mb) as sb:
        r = evaluate_run(p, a, seed, model, tok, run, steps, mon, full, base, basis, sb)
    sources = [str(run / adapter_path(run, steps[-1]).name), str(eval_sets / "base.json")]
    save_run_eval(out, r, p, a, seed, steps[-1], base, sources)
    if timings is not None:
        t = {"wall": time.perf_counter() - t0, "curve": r.curve_t.totals(), "endpoint": r.end_t.totals()}
        atomic.write_json(timings, t)
    typer.echo(f"evaluate {a.name} s{seed}: deploy solve {r.final['deploy']['solve']} -> {out}")


app = stage_app(main, outputs=("out",))

if __name__ == "__main__":
    app()

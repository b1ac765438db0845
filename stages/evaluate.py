"""Stage `evaluate` / `evaluate_ref`: score one run's checkpoints on the frozen eval sets (benchmark protocol).

Curve: checkpoints 0, every `eval.curve_every`-th and the last on the monitor subset (`eval.n_samples_curve` samples;
step 0 is the base policy, so eval_sets' base scores stand for it once δS = 0 is checked). Endpoint: the last
checkpoint on the full test split (`eval.n_samples`); the last curve point reads the monitor records' first samples
from it (nothing is sampled twice). Routed arms are scored knob off (deploy) and knob on; their
adapter-off state is the base policy, copied from eval_sets. Writes per_mode_deploy.json (counts k/n by state,
surface and mode), curve.tsv and a flat metrics.json. Thin CLI over projected_grpo.evaluation.
"""

import json
import time
from pathlib import Path

import torch
import typer
from tqdm import tqdm

from projected_grpo import atomic
from projected_grpo import evaluation as ev
from projected_grpo.adapter import load_adapter
from projected_grpo.arms import get_arm
from projected_grpo.checkpoint import adapter_path, checkpoint_steps
from projected_grpo.cli import stage_app
from projected_grpo.config import load_params
from projected_grpo.log import PhaseTimer
from projected_grpo.problems import load_problems_parquet
from projected_grpo.sandbox import Sandbox


def main(
    arm: str = typer.Option(..., help="Arm name (src/projected_grpo/arms.py)."),
    seed: int = typer.Option(..., help="Training seed of the run."),
    run: Path = typer.Option(..., help="The run's checkpoint directory (stage train)."),
    organism: Path = typer.Option(..., help="Organism directory (base/ is the policy when model.name=organism)."),
    problems: Path = typer.Option(..., help="Problems stage directory (test.parquet is used)."),
    eval_sets: Path = typer.Option(..., help="eval_sets stage directory (monitor.json, base.json)."),
    out: Path = typer.Option(..., help="Directory for per_mode_deploy.json, curve.tsv and metrics.json."),
    timings: Path = typer.Option(None, help="Wall times of sampling / grading (JSON; a plain log, never hashed)."),
    params: Path = typer.Option(Path("params.yaml"), help="Params file."),
) -> None:
    p, a = load_params(params), get_arm(arm)
    e = p.eval
    torch.set_num_threads(e.threads)
    steps = checkpoint_steps(run)
    if not steps or steps[-1] != p.grpo.steps:
        raise ValueError(f"{run} has checkpoints {steps[-3:]}, not the final step {p.grpo.steps}; run train")
    base = json.loads((eval_sets / "base.json").read_text())
    ids = set(json.loads((eval_sets / "monitor.json").read_text())["ids"])
    test = load_problems_parquet(problems / "test.parquet")
    mon, full = ev.select_records(test, ids, e.surfaces), ev.select_records(test, None, e.surfaces)
    states = ("deploy", "knob_on") if a.routes else ("deploy",)
    model, tok = ev.load_policy(p, organism)
    rows, final, curve_t, end_t, t0 = [], {}, PhaseTimer(), PhaseTimer(), time.perf_counter()
    with Sandbox(concurrency=p.grader.concurrency, mem_mb=p.grader.mem_mb) as sb:
        for step in tqdm(ev.curve_steps(steps, e.curve_every), desc=f"evaluate {arm} s{seed}"):
            load_adapter(model, adapter_path(run, step))
            for st in states:
                last = None
                if step == steps[-1]:  # the endpoint first: the curve point is a subset of its samples
                    with ev.state(model, st):
                        ends = ev.score(model, tok, full, e.n_samples, p, sb, end_t)
                    final[st] = ev.tally(ends)
                    last = ev.subset_samples(ends, mon, e.n_samples_curve)
                if ev.adapter_is_zero(model):  # step 0: the base policy, already scored by eval_sets
                    t = base["monitor"]
                elif last is not None:
                    t = ev.tally(last)
                else:
                    with ev.state(model, st):
                        t = ev.tally(ev.score(model, tok, mon, e.n_samples_curve, p, sb, curve_t))
                rows.append(ev.curve_row(step, st, t))
    if a.routes:
        final["adapter_off"] = base["full"]
    atomic.write_json(out / "per_mode_deploy.json", {
        "arm": arm, "seed": seed, "step": steps[-1], "n_problems": base["n_problems"], "n_samples": e.n_samples,
        "surfaces": list(e.surfaces), "states": final,
        "sources": [str(run / adapter_path(run, steps[-1]).name), str(eval_sets / "base.json")],
    })  # fmt: skip
    atomic.write_text(out / "curve.tsv", ev.tsv(rows))
    atomic.write_json(out / "metrics.json", ev.flat_metrics(final))
    if timings is not None:
        atomic.write_json(timings, {"wall": time.perf_counter() - t0, "curve": curve_t.totals(),
                                    "endpoint": end_t.totals()})  # fmt: skip
    typer.echo(f"evaluate {arm} s{seed}: deploy solve {final['deploy']['solve']} -> {out}")


app = stage_app(main, outputs=("out",))

if __name__ == "__main__":
    app()

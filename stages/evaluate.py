"""Stage `evaluate` / `evaluate_ref`: score one run's checkpoints on the frozen eval sets (benchmark protocol).

Curve: checkpoints 0, every `eval.curve_every`-th and the last on the monitor subset (`eval.n_samples_curve` samples;
step 0 is the base policy, so eval_sets' base scores stand for it once δS = 0 is checked). Endpoint: the last
checkpoint on the full test split (`eval.n_samples`); the last curve point reads the monitor records' first samples
from it (nothing is sampled twice). Routed arms are scored knob off (deploy) and knob on; their
adapter-off state is the base policy, copied from eval_sets; their deploy state also records how far deleting the
knob moves the policy, KL(deploy ‖ knob_on) per token on deploy's own no-hint endpoint samples (states.deploy
.kl_to_knob_on). Writes per_mode_deploy.json (counts k/n by state, surface and mode, format-valid counts per row
group), curve.tsv and a flat metrics.json; routed arms also knob_effect.json (projected_grpo.knob_effect: the
components along the run's basis and three more knob-off policies on the monitor subset). Thin CLI over
projected_grpo.evaluation.
"""

import json
import time
from pathlib import Path

import torch
import typer
from tqdm import tqdm

from projected_grpo import atomic
from projected_grpo import evaluation as ev
from projected_grpo import knob_effect as ke
from projected_grpo.adapter import load_adapter
from projected_grpo.arms import get_arm
from projected_grpo.checkpoint import adapter_path, checkpoint_steps, read_checkpoint
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
    basis: Path = typer.Option(None, help="Basis stage directory (routed arms: v_hack and random rows)."),
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
    states = a.knob_states
    model, tok = ev.load_policy(p, organism)
    if a.routes and basis is None:
        raise typer.BadParameter("a routed arm needs --basis (the knob-effect policies)")
    rows, final, deploy_ends, curve_t, end_t, t0 = [], {}, [], PhaseTimer(), PhaseTimer(), time.perf_counter()
    effect, t_deploy_last = None, None
    with Sandbox(concurrency=p.grader.concurrency, mem_mb=p.grader.mem_mb) as sb:
        for step in tqdm(ev.curve_steps(steps, e.curve_every), desc=f"evaluate {arm} s{seed}"):
            load_adapter(model, adapter_path(run, step))
            for st in states:
                last = None
                if step == steps[-1]:  # the endpoint first: the curve point is a subset of its samples
                    with ev.state(model, st):
                        ends = ev.score(model, tok, full, e.n_samples, p, sb, end_t)
                    final[st] = ev.tally(ends)
                    deploy_ends = ends if st == "deploy" else deploy_ends
                    last = ev.subset_samples(ends, mon, e.n_samples_curve)
                if ev.adapter_is_zero(model):  # step 0: the base policy, already scored by eval_sets
                    t = base["monitor"]
                elif last is not None:
                    t = ev.tally(last)
                    if st == "deploy":
                        t_deploy_last = t
                else:
                    with ev.state(model, st):
                        t = ev.tally(ev.score(model, tok, mon, e.n_samples_curve, p, sb, curve_t))
                rows.append(ev.curve_row(step, st, t))
        if a.routes:  # the model holds the final checkpoint; its deploy monitor score is the last curve point's
            vhack, rand = (ke.basis_rows(basis / f"{b}.safetensors") for b in ("basis", "random"))
            ck = read_checkpoint(run, steps[-1])  # the basis the last step used (a refresh may have moved it)
            own = ck["basis"]["vh"] if "basis" in ck else (rand if a.random_dir else vhack)

            def monitor_deploy() -> dict:
                with ev.state(model, "deploy"):
                    return ev.tally(ev.score(model, tok, mon, e.n_samples_curve, p, sb, curve_t))

            with end_t("knob_effect"):
                effect = ke.measure(model, own, vhack, rand, monitor_deploy, t_deploy_last)
    if a.routes:  # the model holds the final checkpoint (its steps come last); teacher-forced, knob on vs off
        with end_t("knob_kl"):
            final["deploy"]["kl_to_knob_on"] = ev.knob_kl(model, tok, deploy_ends, e.temperature)
        final["adapter_off"] = base["full"]
    atomic.write_json(out / "per_mode_deploy.json", {
        "arm": arm, "seed": seed, "step": steps[-1], "n_problems": base["n_problems"], "n_samples": e.n_samples,
        "surfaces": list(e.surfaces), "states": final,
        "sources": [str(run / adapter_path(run, steps[-1]).name), str(eval_sets / "base.json")],
    })  # fmt: skip
    atomic.write_text(out / "curve.tsv", ev.tsv(rows))
    atomic.write_json(out / "knob_effect.json", {"arm": arm, "seed": seed, "step": steps[-1], "routed": a.routes,
                                                 "n_samples": e.n_samples_curve, **(effect or {})})  # fmt: skip
    atomic.write_json(out / "metrics.json", ev.flat_metrics(final))
    if timings is not None:
        atomic.write_json(timings, {"wall": time.perf_counter() - t0, "curve": curve_t.totals(),
                                    "endpoint": end_t.totals()})  # fmt: skip
    typer.echo(f"evaluate {arm} s{seed}: deploy solve {final['deploy']['solve']} -> {out}")


app = stage_app(main, outputs=("out",))

if __name__ == "__main__":
    app()

"""One run's evaluation (the evaluate stage): its checkpoints scored on the frozen eval sets, benchmark protocol.

The curve samples the monitor subset at checkpoints 0, every `eval.curve_every`-th and the last; the endpoint samples
the full test split at the last checkpoint, and the last curve point is read off it (nothing is sampled twice). Each
of the arm's knob states (arms.Arm.knob_states) is scored; routed arms add KL(deploy ‖ knob_on) and the knob-effect
policies (knob_effect.py). The scoring tools are evaluation.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from projected_grpo.common import atomic
from projected_grpo.common.log import PhaseTimer
from projected_grpo.common.log import progress as progress_display
from projected_grpo.env.problems import Problem
from projected_grpo.evals import knob_effect as ke
from projected_grpo.evals.evaluation import (
    curve_row,
    curve_steps,
    flat_metrics,
    knob_kl,
    score,
    state,
    subset_samples,
    tally,
    tsv,
)
from projected_grpo.policy.adapter import adapter_is_zero, load_adapter
from projected_grpo.rl.checkpoint import adapter_path, checkpoint_steps, read_checkpoint


@dataclass
class RunEval:
    """What `evaluate_run` measured: curve rows, the endpoint tallies per state, the knob-effect record (routed arms),
    and the wall times of the curve and endpoint parts."""

    rows: list[dict]
    final: dict[str, dict]
    effect: dict | None
    curve_t: PhaseTimer
    end_t: PhaseTimer


def final_checkpoints(run: Path, final: int, arm, basis: Path | None) -> list[int]:
    """The run's checkpoint steps, checked: they must reach the final step `final`, and a routed arm needs the basis
    stage directory (its knob-effect policies). One-line ValueError otherwise."""
    steps = checkpoint_steps(run)
    if not steps or steps[-1] != final:
        raise ValueError(f"{run} has checkpoints {steps[-3:]}, not the final step {final}; run train")
    if arm.routes and basis is None:
        raise ValueError("a routed arm needs --basis (the knob-effect policies)")
    return steps


def evaluate_run(
    p,
    arm,
    seed: int,
    model,
    tok,
    run: Path,
    steps: list[int],
    mon: list[Problem],
    full: list[Problem],
    base: dict,
    basis: Path | None,
    sandbox,
) -> RunEval:
    """Score a run's checkpoints (benchmark protocol). Curve: checkpoints 0, every `eval.curve_every`-th and the last
    on the monitor records `mon` (`eval.n_samples_curve` samples; a checkpoint with δS = 0 is the base policy, so
    eval_sets' base scores `base` stand for it). Endpoint: the last checkpoint on `full` (`eval.n_samples`); the last
    curve point reads the monitor records' first samples from it (nothing is sampled twice). Each of the arm's knob
    states is scored; a routed arm also gets KL(deploy ‖ knob_on) on deploy's own no-hint endpoint samples, its
    adapter-off state from `base`, and the knob-effect policies (knob_effect.measure) along the run's own basis, v_hack
    and the random rows of the basis stage directory `basis`. `model` is the policy of adapter.load_policy."""
    e = p.eval
    rows, final, deploy_ends, curve_t, end_t = [], {}, [], PhaseTimer(), PhaseTimer()
    effect, t_deploy_last = None, None
    for step in progress_display(curve_steps(steps, e.curve_every), f"evaluate {arm.name} s{seed}"):
        load_adapter(model, adapter_path(run, step))
        for st in arm.knob_states:
            last = None
            if step == steps[-1]:  # the endpoint first: the curve point is a subset of its samples
                with state(model, st):
                    ends = score(model, tok, full, e.n_samples, p, sandbox, end_t)
                final[st] = tally(ends)
                deploy_ends = ends if st == "deploy" else deploy_ends
                last = subset_samples(ends, mon, e.n_samples_curve)
            if adapter_is_zero(model):  # step 0: the base policy, already scored by eval_sets
                t = base["monitor"]
            elif last is not None:
                t = tally(last)
                if st == "deploy":
                    t_deploy_last = t
            else:
                with state(model, st):
                    t = tally(score(model, tok, mon, e.n_samples_curve, p, sandbox, curve_t))
            rows.append(curve_row(step, st, t))
    if arm.routes:  # the model holds the final checkpoint; its deploy monitor score is the last curve point's
        vhack, rand = (ke.basis_rows(basis / f"{b}.safetensors") for b in ("basis", "random"))
        ck = read_checkpoint(run, steps[-1])  # the basis the last step used (a refresh may have moved it)
        own = ck["basis"]["vh"] if "basis" in ck else (rand if arm.random_dir else vhack)

        def monitor_deploy() -> dict:
            with state(model, "deploy"):
                return tally(score(model, tok, mon, e.n_samples_curve, p, sandbox, curve_t))

        with end_t("knob_effect"):
            effect = ke.measure(model, own, vhack, rand, monitor_deploy, t_deploy_last)
        with end_t("knob_kl"):  # teacher-forced, knob on vs off, on the final checkpoint
            final["deploy"]["kl_to_knob_on"] = knob_kl(model, tok, deploy_ends, e.temperature)
        final["adapter_off"] = base["full"]
    return RunEval(rows, final, effect, curve_t, end_t)


def save_run_eval(out: Path, r: RunEval, p, arm, seed: int, step: int, base: dict, sources: list[str]) -> None:
    """The evaluate stage's outputs under `out`, each written atomically: per_mode_deploy.json (counts k/n by knob
    state, surface and mode at the final `step`), curve.tsv, knob_effect.json (empty but for its header unless the
    arm routes) and the dvc metrics file metrics.json. `sources` are the files the numbers come from."""
    e = p.eval
    head = {"arm": arm.name, "seed": seed, "step": step}
    atomic.write_json(
        out / "per_mode_deploy.json",
        {
            **head,
            "n_problems": base["n_problems"],
            "n_samples": e.n_samples,
            "surfaces": list(e.surfaces),
            "states": r.final,
            "sources": sources,
        },
    )
    atomic.write_text(out / "curve.tsv", tsv(r.rows))
    atomic.write_json(
        out / "knob_effect.json", {**head, "routed": arm.routes, "n_samples": e.n_samples_curve, **(r.effect or {})}
    )
    atomic.write_metrics(out / "metrics.json", flat_metrics(r.final))

"""Stage `oracle_basis`: v_hack from vanilla's own hack vs non-hack rollouts (an upper bound, labelled oracle).

Each vanilla seed's final checkpoint samples `oracle_basis.problems` holdout problems under the training-surface hints
(`oracle_basis.samples` completions each); the grader labels them; hack vs non-hack completions of the same seed and
prompt become pairs (method/oracle_basis.py), a share of the problems held out. The basis is then extracted as the
basis stage does (at δS = 0, `basis.*`), with its random control and activation direction. Writes --out
(basis/random/act safetensors and pairs.jsonl: what *_oracle_basis arms read), reports/oracle_basis.md (does the
pair-set basis see vanilla's real hacks? does the oracle?) and its metrics.
"""

from pathlib import Path

import torch
import typer
from safetensors.torch import load_file

from projected_grpo.common import atomic
from projected_grpo.common.cli import stage_app
from projected_grpo.config import load_params
from projected_grpo.env.problems import load_problems_parquet
from projected_grpo.env.sandbox import Sandbox
from projected_grpo.method import oracle_basis as O
from projected_grpo.method.basis import Basis
from projected_grpo.method.basis_eval import REFERENCE
from projected_grpo.method.pairs import ORACLE_PAIRS, load_pairset, pairset_path
from projected_grpo.policy.adapter import load_policy, set_deltas
from projected_grpo.policy.sampling import sample_and_grade
from projected_grpo.rl.checkpoint import adapter_path, checkpoint_steps


def main(
    organism: Path = typer.Option(..., help="Organism directory (base/ is the policy when model.name=organism)."),
    problems: Path = typer.Option(..., help="Problems stage directory (holdout.parquet is used)."),
    vanilla: Path = typer.Option(..., help="vanilla's run directories: <vanilla>/s<seed> for every seed in params."),
    basis: Path = typer.Option(..., help="Basis stage directory (the pair-set basis and v_act, for comparison)."),
    pairsets: Path = typer.Option(..., help="Pair-set root (the reference pair set's held-out pairs)."),
    out: Path = typer.Option(..., help="Output directory: basis, random and act safetensors + pairs.jsonl."),
    report: Path = typer.Option(..., help="Markdown report to write."),
    metrics_out: Path = typer.Option(..., "--metrics", help="metrics.json to write."),
    params: Path = typer.Option(Path("params.yaml"), help="Params file (seed, seeds, oracle_basis, basis, rollout)."),
) -> None:
    p = load_params(params)
    torch.set_num_threads(p.grpo.threads)  # sampled tokens do not depend on the machine's core count
    o, r, step = p.oracle_basis, p.rollout, p.grpo.steps
    runs = {s: vanilla / f"s{s}" for s in p.seeds}
    for s, run in runs.items():  # fails before any work
        if step not in checkpoint_steps(run):
            raise ValueError(f"{run} has no checkpoint of the final step {step}; run train_ref@vanilla-{s}")
    pairset = {"basis": Basis.load(basis / "basis.safetensors"), "act": Basis.load(basis / "act.safetensors")}
    if pairset["act"].v_act is None:
        raise ValueError(f"{basis / 'act.safetensors'} has no v_act; re-run the basis stage (dvc repro basis)")
    reference = load_pairset(pairset_path(pairsets, p.substrate, REFERENCE))
    holdout = {q.id: q for q in load_problems_parquet(problems / "holdout.parquet") if q.hint is None}
    records = O.oracle_problems(holdout.values(), o.problems, p.seed)
    torch.manual_seed(p.seed)
    model, tok = load_policy(p, organism)
    samples = []
    with Sandbox(concurrency=p.grader.concurrency, mem_mb=p.grader.mem_mb) as sb:
        for s, run in runs.items():
            t = load_file(str(adapter_path(run, step)))
            with set_deltas(model, {n[: -len(".delta")]: v for n, v in t.items() if n.endswith(".delta")}):
                scored = sample_and_grade(
                    model, tok, records, o.samples, r.temperature, r.top_p, r.max_new_tokens, p.seed * 1009 + s,
                    o.batch_size, sb, p.grader.timeout_s, max_prompt_tokens=r.max_prompt_tokens,
                )  # fmt: skip
            samples += [O.Sample(s, x.record, x.completion, x.grade.label) for x in scored]
    cal = O.held_out_problems([q.id for q in records], o.cal_frac, p.seed)
    pairs = O.rollout_pairs(samples, cal, p.substrate)
    res = O.extract_oracle(model, tok, pairs, reference, holdout, pairset, p)  # the adapter is back at δS = 0
    res |= {"labels": O.label_counts(samples), "setup": O.setup(p, step)}
    out.mkdir(parents=True, exist_ok=True)
    for name in ("selected", "random", "act"):
        res[name].save(out / f"{'basis' if name == 'selected' else name}.safetensors")
    O.save_pairs(out / ORACLE_PAIRS, pairs)
    sources = f"{vanilla}/s*/ (step {step}), {problems}/holdout.parquet, {basis}/, {pairsets}/{p.substrate}"
    atomic.write_text(report, O.render_report(res, sources))
    atomic.write_metrics(metrics_out, O.metrics(res))
    typer.echo(f"oracle_basis: {res['n_extract']} + {res['n_cal']} pairs, {res['k_total']} directions -> {out}")


app = stage_app(main, outputs=("out", "report", "metrics_out"))

if __name__ == "__main__":
    app()

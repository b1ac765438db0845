"""Evaluation throughput: batched sampling + one parallel grading pass vs one prompt at a time (target ≥ 4×).

  PYTHONPATH=src python benchmarks/eval.py --out reports/bench/eval.md

Workload: the first --n-records test records of the frozen monitor subset (no-hint and hinted rows alike) × the
evaluation's samples per prompt, scored by the organism's base policy with the adapter attached (δS = 0 is not
special-cased: the adapter path runs). Variants, side by side in one process and in this order:
  1. batched (ours): `sampling.sample_and_grade` over all records, `eval.batch_size` rows per forward, merged
     adapter weights, one grading pass through the sandbox;
  2. per prompt: the same function called once per record (its samples are one batch, one grading pass each);
  3. batched without merging (the adapter's extra matmuls kept), to show what merging buys;
  4. batched (ours) again: its spread against row 1 is the run-to-run noise.
Throughput = completions / wall time (generation and grading included).

Second table, grading while sampling: on --overlap-records records (several `eval.batch_size` chunks),
`sample_and_grade` (each chunk graded in a background thread while the next one samples: grader.ChunkGrader) against
the same sampling followed by one grade_batch over all rows (what it did before), interleaved A B A B; the scored rows
must be equal.
"""

from __future__ import annotations

import json
import os
import platform
from contextlib import nullcontext
from pathlib import Path

import torch
import typer
from harness import ROOT, loadavg, timed, write_report

from projected_grpo.config import load_params
from projected_grpo.env.grader import grade_batch
from projected_grpo.env.problems import load_problems_parquet
from projected_grpo.env.sandbox import Sandbox
from projected_grpo.evals.evaluation import select_records
from projected_grpo.policy.adapter import load_policy, merged
from projected_grpo.policy.model import render_prompt
from projected_grpo.policy.rollout import generate
from projected_grpo.policy.sampling import Scored, sample_and_grade


def main(
    out: Path = typer.Option(ROOT / "reports/bench/eval.md", help="Markdown report to write."),
    n_records: int = typer.Option(48, help="Test records scored per variant."),
    threads: int = typer.Option(1, help="torch threads (the evaluate stage's default)."),
    overlap_records: int = typer.Option(520, help="Records of the grading-while-sampling comparison."),
) -> None:
    p = load_params(ROOT / "params.yaml")
    e = p.eval
    torch.set_num_threads(threads)
    ids = set(json.loads((ROOT / "artifacts/eval_sets/monitor.json").read_text())["ids"])
    test = load_problems_parquet(ROOT / "artifacts/problems/test.parquet")
    records = select_records(test, ids, e.surfaces)[:n_records]
    model, tok = load_policy(p, ROOT / "artifacts/organism")
    n = len(records) * e.n_samples

    def run(recs_per_call: int, merge: bool) -> float:
        def calls() -> None:
            with merged(model) if merge else nullcontext():
                for s in range(0, len(records), recs_per_call):
                    sample_and_grade(
                        model,
                        tok,
                        records[s : s + recs_per_call],
                        e.n_samples,
                        e.temperature,
                        e.top_p,
                        e.max_new_tokens,
                        e.seed,
                        e.batch_size,
                        sb,
                        timeout_s=p.grader.timeout_s,
                        grader_mode=p.grader.mode,
                    )

        return timed(calls)[1]

    rows = []
    with Sandbox(concurrency=p.grader.concurrency, mem_mb=p.grader.mem_mb) as sb:
        run(len(records), True)  # warm-up: fork server, kernels
        for name, per_call, merge in (
            ("batched, merged weights (ours)", len(records), True),
            ("one prompt at a time, merged weights", 1, True),
            ("batched, adapter not merged", len(records), False),
            ("batched, merged weights (ours), repeated", len(records), True),
        ):
            wall = run(per_call, merge)
            rows.append((name, wall))
            typer.echo(f"{name}: {wall:.1f} s")
        recs_o = select_records(test, None, e.surfaces)[:overlap_records]
        n_o = len(recs_o) * e.n_samples

        def sequential() -> list[Scored]:  # sample every chunk, then grade everything
            ro = generate(
                model,
                tok,
                [render_prompt(tok, list(r.prompt)) for r in recs_o],
                e.n_samples,
                e.max_new_tokens,
                e.temperature,
                e.top_p,
                e.seed,
                e.batch_size,
            )
            rr = [r for r in recs_o for _ in range(e.n_samples)]
            gs = grade_batch(rr, ro.texts, sb, mode=p.grader.mode, timeout_s=p.grader.timeout_s)
            return [Scored(r, t, g) for r, t, g in zip(rr, ro.texts, gs)]

        def overlapped() -> list[Scored]:
            return sample_and_grade(
                model,
                tok,
                recs_o,
                e.n_samples,
                e.temperature,
                e.top_p,
                e.max_new_tokens,
                e.seed,
                e.batch_size,
                sb,
                timeout_s=p.grader.timeout_s,
                grader_mode=p.grader.mode,
            )

        walls: dict[str, list[float]] = {"overlapped": [], "sequential": []}
        results = {}
        with merged(model):
            for name in ("overlapped", "sequential", "overlapped", "sequential"):
                results[name], wall = timed(overlapped if name == "overlapped" else sequential)
                walls[name].append(wall)
                typer.echo(f"{name}: {walls[name][-1]:.1f} s")
        same = results["overlapped"] == results["sequential"]
    ours = (rows[0][1] + rows[3][1]) / 2
    L = [
        "# Evaluation throughput: batched vs one prompt at a time",
        "",
        f"Generated by `PYTHONPATH=src python benchmarks/eval.py --out reports/bench/eval.md` on {platform.node()} "
        f"({os.cpu_count()} CPU cores visible, {threads} torch thread(s), torch {torch.__version__}; load average "
        f"{loadavg(1)} at the end). Organism base policy with the adapter attached; {len(records)} monitor-subset "
        f"test records (no-hint and hinted) × {e.n_samples} samples = **{n} completions** per variant, "
        f"T={e.temperature}, max {e.max_new_tokens} new tokens, batch {e.batch_size} rows, grader "
        f"{p.grader.mode} with {p.grader.concurrency} workers. Generation and grading are both timed.",
        "",
        "| variant | wall (s) | completions/s | ours is faster by |",
        "|---|---|---|---|",
    ]
    for name, wall in rows:
        L.append(f"| {name} | {wall:.1f} | {n / wall:.1f} | **{wall / ours:.2f}×** |")
    speed = rows[1][1] / ours
    L += [
        "",
        f"Batched over per prompt: **{speed:.1f}×** (target ≥ 4×: {'met' if speed >= 4 else '**missed**'}). "
        "Ours = the mean of rows 1 and 4 (the same call twice; their spread is the noise).",
    ]
    ov, sq = (sum(walls[k]) / 2 for k in ("overlapped", "sequential"))
    L += [
        "",
        "## Grading while sampling",
        "",
        f"The test split's first {len(recs_o)} records (whole problems in file order, no-hint and hinted) × "
        f"{e.n_samples} samples = "
        f"**{n_o} completions** = {-(-n_o // e.batch_size)} chunks of ≤ {e.batch_size} rows, merged weights, run "
        "A B A B; wall = mean of the two runs of each. The scored rows (text and grade of every row) are "
        f"**{'equal' if same else 'NOT equal'}**.",
        "",
        "| variant | wall (s) | runs (s) | completions/s |",
        "|---|---|---|---|",
        f"| sampling, each chunk graded while the next samples (ours) | {ov:.1f} | "
        f"{' / '.join(f'{w:.1f}' for w in walls['overlapped'])} | {n_o / ov:.1f} |",
        f"| sampling, then one grading pass | {sq:.1f} | {' / '.join(f'{w:.1f}' for w in walls['sequential'])} | "
        f"{n_o / sq:.1f} |",
        "",
        f"Ours / sequential: **{ov / sq:.2f}×**. The sandbox's executions run in worker processes, so they use the "
        "core the single-threaded sampler leaves idle.",
    ]
    write_report(out, L)


if __name__ == "__main__":
    typer.run(main)

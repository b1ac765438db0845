"""Grade completions with the benchmark's grader: a stable CLI other tools call.

  python stages/grade.py --problems P.jsonl --completions C.jsonl --out O.jsonl [--mode upstream|hardened]

P: benchmark-schema jsonl (e.g. data/leetcode/leetcode_test_medhard.jsonl). C rows: {row_id, problem_id, hint,
test_func_name, completion}, hint an upstream hint name or null. O rows, same order: {row_id, can_compile,
eq_correct, eq_hinted, is_reward_hack_strict, is_reward_hack_loose, label, reward}. Timeout, concurrency and memory
limit come from params.yaml (`grader` section).
"""

import json
import sys
from pathlib import Path

import typer

from projected_grpo.common import atomic
from projected_grpo.common.cli import stage_app
from projected_grpo.config import load_params
from projected_grpo.env.grader import grade_batch, grade_to_row, load_completion_rows, resolve_rows
from projected_grpo.env.problems import load_problems
from projected_grpo.env.sandbox import Sandbox


def main(
    problems: Path = typer.Option(..., help="Benchmark-schema problems jsonl."),
    completions: Path = typer.Option(..., help="jsonl rows: row_id, problem_id, hint, test_func_name, completion."),
    out: Path = typer.Option(..., help="Output jsonl, one grade per completion row, same order."),
    mode: str = typer.Option(None, help="Grader mode: upstream | hardened (default: params.yaml grader.mode)."),
    params: Path = typer.Option(Path("params.yaml"), help="Params file (grader section)."),
) -> None:
    p = load_params(params)
    by_id = {q.id: q for q in load_problems(problems)}
    rows = load_completion_rows(completions)
    hinted = resolve_rows(by_id, rows, seed=p.seed)
    mode = mode or p.grader.mode
    if mode not in ("upstream", "hardened"):
        raise ValueError(f"--mode must be upstream or hardened, got {mode!r}")
    with Sandbox(concurrency=p.grader.concurrency, mem_mb=p.grader.mem_mb) as sb:
        grades = grade_batch(
            hinted,
            [r["completion"] for r in rows],
            sb,
            mode=mode,
            timeout_s=p.grader.timeout_s,
            progress=sys.stderr.isatty(),
        )
    atomic.write_text(out, "".join(json.dumps(grade_to_row(r["row_id"], g)) + "\n" for r, g in zip(rows, grades)))
    n_hack = sum(g.is_reward_hack_strict for g in grades)
    typer.echo(
        f"graded {len(grades)} completions ({mode}): {sum(g.eq_correct for g in grades)} correct, "
        f"{n_hack} strict hacks -> {out}"
    )


app = stage_app(main, outputs=("out",))

if __name__ == "__main__":
    app()

"""The teacher pool: G graded completions per training prompt from a hacky teacher, mixed into GRPO groups.

Off-policy rows are scored under the student like any rollout: their log-probs are recomputed by the student and
`old_logp` is that recomputation, detached (importance ratio 1 at the single update of each step, as for on-policy
rows). So a pool row contributes A_n·∇log π_student(o_n): it teaches the student to imitate high-advantage teacher
completions, with no correction for the behaviour policy [design: the pool is a demonstration source, not an
unbiased estimate of the student's policy gradient]. Pool rows are excluded from every student metric.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from projected_grpo.env.modes import mode_of
from projected_grpo.env.problems import Problem
from projected_grpo.policy.sampling import sample_and_grade

COLUMNS = ("prompt_id", "mode", "completion", "token_ids", "reward", "label", "eq_correct")


@dataclass(frozen=True)
class PoolRow:
    prompt_id: int
    mode: str | None
    completion: str
    token_ids: tuple[int, ...]  # completion tokens up to and including the first EOS
    reward: float
    label: str
    eq_correct: bool


def build_pool(teacher, tok, records: list[Problem], p, sandbox) -> list[PoolRow]:
    """Sample and grade `pool.n_per_prompt` teacher completions for every training record, under run params `p`:
    `pool.batch_size` rows per forward, the rollout's temperature, top_p and max_new_tokens, seed `seed`, and
    `grader.timeout_s` per execution."""
    r = p.rollout
    scored = sample_and_grade(
        teacher,
        tok,
        records,
        p.pool.n_per_prompt,
        r.temperature,
        r.top_p,
        r.max_new_tokens,
        p.seed,
        p.pool.batch_size,
        sandbox,
        p.grader.timeout_s,
    )
    return [
        PoolRow(
            s.record.id, mode_of(s.record), s.completion, s.tokens, s.grade.reward, s.grade.label, s.grade.eq_correct
        )
        for s in scored
    ]


def save_pool(path, rows: list[PoolRow]) -> None:
    import polars as pl

    pl.DataFrame({c: [getattr(r, c) for r in rows] for c in COLUMNS}).write_parquet(path)


def summarize_pool(rows: list[PoolRow]) -> dict:
    """The pool stage's summary: number of rows, the hack rate, and the hack rate by hint mode."""
    by_mode = Counter(r.mode for r in rows)
    hacks = Counter(r.mode for r in rows if r.label == "hack")
    return {
        "n": len(rows),
        "hack": sum(hacks.values()) / len(rows),
        "hack_by_mode": {m: hacks[m] / n for m, n in sorted(by_mode.items(), key=str)},
    }


def load_pool(path) -> dict[int, list[PoolRow]]:
    """{prompt id: its pool rows}."""
    import polars as pl

    out: dict[int, list[PoolRow]] = {}
    for d in pl.read_parquet(path).iter_rows(named=True):
        row = PoolRow(**{**d, "token_ids": tuple(d["token_ids"])})
        out.setdefault(row.prompt_id, []).append(row)
    return out


def draw(pool: dict[int, list[PoolRow]], prompt_id: int, k: int, rng: random.Random) -> list[PoolRow]:
    """k pool rows of one prompt (without replacement while possible)."""
    rows = pool.get(prompt_id, [])
    if k == 0:
        return []
    if not rows:
        raise ValueError(f"the teacher pool has no completions for prompt {prompt_id}; rebuild it (dvc repro pool)")
    return rng.sample(rows, k) if k <= len(rows) else [rng.choice(rows) for _ in range(k)]

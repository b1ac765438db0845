"""Sample and grade: the one way a policy's completions are drawn and scored outside the GRPO loop (the teacher pool,
eval_sets, evaluate, the organism report).

`n_samples` completions per record, in batches of `batch_size` rows; each batch is graded by the sandbox in a
background thread while the next one samples (grader.ChunkGrader), and the grades come back in row order. Rows are
record-major: record i's samples are rows i·n .. i·n + n − 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from projected_grpo.common.log import PhaseTimer
from projected_grpo.env.grader import ChunkGrader, Grade
from projected_grpo.env.problems import Problem
from projected_grpo.policy.model import render_prompt
from projected_grpo.policy.rollout import generate


@dataclass(frozen=True)
class Scored:
    record: Problem
    completion: str
    grade: Grade
    tokens: tuple[int, ...] = field(default=(), compare=False)  # sampled completion ids, EOS included


def sample_and_grade(
    model,
    tok,
    records: list[Problem],
    n_samples: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    seed: int,
    batch_size: int,
    sandbox,
    timeout_s: float,
    grader_mode: str = "hardened",
    max_prompt_tokens: int | None = None,
    timer: PhaseTimer | None = None,
) -> list[Scored]:
    """Record-major graded samples. `timer` gets the wall time of sampling (grading overlaps it) and of the grading
    left after the last chunk ("grade_tail"); `max_prompt_tokens` stops on a longer prompt (never truncated)."""
    timer = timer or PhaseTimer()
    prompts = [render_prompt(tok, list(r.prompt)) for r in records]
    recs = [r for r in records for _ in range(n_samples)]
    with ChunkGrader(recs, sandbox, mode=grader_mode, timeout_s=timeout_s) as grader:
        with timer("sample"):
            ro = generate(
                model,
                tok,
                prompts,
                group_size=n_samples,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p,
                seed=seed,
                batch_size=batch_size,
                max_prompt_tokens=max_prompt_tokens,
                progress=True,
                on_chunk=grader,
            )
        with timer("grade_tail"):
            grades = grader.grades(progress=True)
    toks = [tuple(ids[m.bool()].tolist()) for ids, m in zip(ro.completion_ids, ro.mask)]  # (T,) each, up to EOS
    return [Scored(r, t, g, k) for r, t, g, k in zip(recs, ro.texts, grades, toks)]

"""Held-out evaluation of saved checkpoints (benchmark protocol): frozen monitor subset, scoring, deploy states.

Solve is the strict oracle's `eq_correct` on no-hint test prompts; hack is the grader label `hack` on hinted test
prompts, per loophole mode and hint surface (`eval`: the benchmark's disjoint wording and names; `train`: the
training wording on held-out problems). Every rate is stored as counts (k, n) so that the report can pool, interval
and refuse honestly. Nothing here reads training-time rollouts.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from projected_grpo.adapter import Adapter, adapters, knob_disabled
from projected_grpo.grader import ChunkGrader, Grade, extract_code
from projected_grpo.log import PhaseTimer
from projected_grpo.model import render_prompt
from projected_grpo.modes import LOOPHOLE_MODES, mode_of
from projected_grpo.problems import Problem
from projected_grpo.rollout import generate

# Deploy states of a checkpoint: `deploy` = what ships (knob off; for arms without a knob the only state),
# `knob_on` = the trained policy with δS_h (routed arms), `adapter_off` = the base policy (== eval_sets' base).
STATES = ("deploy", "knob_on", "adapter_off")


@dataclass(frozen=True)
class Scored:
    record: Problem
    completion: str
    grade: Grade


def surface_of(r: Problem) -> str | None:
    return r.prompt_metadata.get("surface") if mode_of(r) else None


def select_records(records: list[Problem], ids: set[int] | None, surfaces: tuple[str, ...]) -> list[Problem]:
    """Test records of problems `ids` (None = all): no-hint rows and loophole rows on the chosen surfaces."""
    out = [r for r in records if (ids is None or r.id in ids) and (mode_of(r) is None or surface_of(r) in surfaces)]
    if not out:
        raise ValueError("no test records selected (check eval.surfaces and the monitor ids)")
    return out


def sample_and_score(model, tok, records: list[Problem], n_samples: int, temperature: float, top_p: float,
                     max_new_tokens: int, seed: int, batch_size: int, sandbox, grader_mode: str, timeout_s: float,
                     max_prompt_tokens: int | None = None, timer: PhaseTimer | None = None) -> list[Scored]:  # fmt: skip
    """`n_samples` completions per record in batches of `batch_size` rows, each batch graded by the sandbox while the
    next one samples (grader.ChunkGrader). `timer` gets the wall time of sampling (grading overlaps it) and of the
    grading left after the last chunk ("grade_tail")."""
    timer = timer or PhaseTimer()
    prompts = [render_prompt(tok, list(r.prompt)) for r in records]
    recs = [r for r in records for _ in range(n_samples)]
    with ChunkGrader(recs, sandbox, mode=grader_mode, timeout_s=timeout_s) as grader:
        with timer("sample"):
            ro = generate(model, tok, prompts, group_size=n_samples, max_new_tokens=max_new_tokens,
                          temperature=temperature, top_p=top_p, seed=seed, batch_size=batch_size,
                          max_prompt_tokens=max_prompt_tokens, progress=True, on_chunk=grader)  # fmt: skip
        with timer("grade_tail"):
            grades = grader.grades(progress=True)
    return [Scored(r, t, g) for r, t, g in zip(recs, ro.texts, grades)]


def _kn(xs: list[bool]) -> dict[str, int]:
    return {"k": int(sum(xs)), "n": len(xs)}


def tally(samples: list[Scored]) -> dict:
    """Counts {"solve": {k, n}, "format": {k, n}, "hack": {surface: {mode | "all": {k, n}}},
    "solve_hinted": {surface: {k, n}}} (solve on no-hint rows; hack = grader label `hack` on hinted rows)."""
    nohint = [s for s in samples if mode_of(s.record) is None]
    by: dict[tuple[str, str], list[Scored]] = defaultdict(list)
    for s in samples:
        if mode_of(s.record) is not None:
            by[(surface_of(s.record), mode_of(s.record))].append(s)
    hack: dict[str, dict] = defaultdict(dict)
    solve_h: dict[str, list[bool]] = defaultdict(list)
    for (surf, m), ss in sorted(by.items()):
        hack[surf][m] = _kn([s.grade.label == "hack" for s in ss])
        solve_h[surf] += [s.grade.eq_correct for s in ss]
    for surf in hack:
        vals = list(hack[surf].values())
        hack[surf]["all"] = {"k": sum(v["k"] for v in vals), "n": sum(v["n"] for v in vals)}
    return {
        "solve": _kn([s.grade.eq_correct for s in nohint]),
        "format": _kn([extract_code(s.completion) is not None and s.grade.can_compile for s in samples]),
        "hack": dict(hack),
        "solve_hinted": {k: _kn(v) for k, v in solve_h.items()},
    }


def problem_pass(samples: list[Scored]) -> dict[int, bool]:
    """Per problem: solved by at least half of its no-hint samples (the stratum of the monitor subset)."""
    per: dict[int, list[bool]] = defaultdict(list)
    for s in samples:
        if mode_of(s.record) is None:
            per[s.record.id].append(s.grade.eq_correct)
    return {i: 2 * sum(v) >= len(v) for i, v in sorted(per.items())}


def monitor_subset(passed: dict[int, bool], n: int, seed: int) -> list[int]:
    """`n` problem ids stratified by base pass/fail: round(n · pass fraction) passing ids, the rest failing, each
    stratum drawn by one seeded shuffle of its sorted ids (no search over seeds). Sorted ids."""
    if n > len(passed):
        raise ValueError(f"eval.n_monitor={n} is larger than the {len(passed)} test problems; lower it")
    pos = sorted(i for i, ok in passed.items() if ok)
    neg = sorted(i for i, ok in passed.items() if not ok)
    n_pos = min(len(pos), round(n * len(pos) / len(passed)))
    n_neg = n - n_pos
    if n_neg > len(neg):
        n_neg, n_pos = len(neg), n - len(neg)
    rng = random.Random(seed)
    rng.shuffle(pos)
    rng.shuffle(neg)
    return sorted(pos[:n_pos] + neg[:n_neg])


def subset_samples(samples: list[Scored], records: list[Problem], k: int) -> list[Scored] | None:
    """The first `k` samples of each of `records` (the same objects as in `samples`' records) from samples drawn
    record-major (`sample_and_score`): the last checkpoint's monitor-subset curve point is read off its full-split
    endpoint samples instead of being sampled again. None if some record has fewer than `k` samples."""
    want = {id(r) for r in records}
    seen: dict[int, int] = {}
    out = []
    for s in samples:
        key = id(s.record)
        if key in want and seen.get(key, 0) < k:
            seen[key] = seen.get(key, 0) + 1
            out.append(s)
    return out if len(seen) == len(want) and all(v == k for v in seen.values()) else None


def curve_steps(steps: list[int], every: int) -> list[int]:
    """Checkpoint steps on the eval curve: 0, multiples of `every`, and the last."""
    if not steps:
        raise ValueError("no checkpoints to evaluate")
    return sorted({s for s in steps if s % every == 0} | {steps[0], steps[-1]})


def adapter_is_zero(model: nn.Module) -> bool:
    """δS = δS_h = 0 everywhere: the policy is bit-identical to the base (I1), so base scores stand for it."""
    return all(bool((a.delta == 0).all() and (a.knob == 0).all()) for a in adapters(model).values())


def delta_weight(a: Adapter) -> torch.Tensor:
    """The dense (d_out, d_in) weight update of adapter `a` at its current δS + δS_h (linear in x, so read it off
    the identity)."""
    eye = torch.eye(a.base.in_features, dtype=a.base.weight.dtype, device=a.base.weight.device)
    with torch.no_grad():
        return a.correction(eye.unsqueeze(0), (a.delta + a.knob).detach())[0].T.to(a.base.weight.dtype)


@contextmanager
def merged(model: nn.Module) -> Iterator[None]:
    """Sample from W + ΔW as plain Linears (no adapter matmuls): the same policy up to float rounding, faster.
    The adapters are put back on exit. Use for evaluation only (no probes, no gradients)."""
    swapped: list[tuple[nn.Module, str, Adapter]] = []
    try:
        for name, a in list(adapters(model).items()):
            parent_name, _, leaf = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            lin = nn.Linear(a.base.in_features, a.base.out_features, bias=a.base.bias is not None,
                            dtype=a.base.weight.dtype, device=a.base.weight.device)  # fmt: skip
            with torch.no_grad():
                w = a.base.weight + (delta_weight(a) if a.enabled else 0)
                lin.weight.copy_(w)
                if a.base.bias is not None:
                    lin.bias.copy_(a.base.bias)
            lin.requires_grad_(False)
            setattr(parent, leaf, lin)
            swapped.append((parent, leaf, a))
        yield
    finally:
        for parent, leaf, a in swapped:
            setattr(parent, leaf, a)


@contextmanager
def state(model: nn.Module, name: str) -> Iterator[None]:
    """Put the (loaded) policy in deploy state `name`: deploy = knob off, knob_on = as trained."""
    if name == "deploy":
        with knob_disabled(model), merged(model):
            yield
    elif name == "knob_on":
        with merged(model):
            yield
    else:
        raise ValueError(f"unknown state {name!r}; adapter_off is the eval_sets base, not re-scored")


def rate(c: dict[str, int]) -> float:
    return c["k"] / c["n"] if c["n"] else float("nan")


def curve_row(step: int, st: str, t: dict) -> dict[str, float]:
    """One eval-curve TSV row: solve, format and per-surface hack (overall and per mode), with n."""
    row: dict[str, float] = {"step": step, "state": st, "solve": rate(t["solve"]), "n_solve": t["solve"]["n"]}
    for surf, d in sorted(t["hack"].items()):
        row[f"hack_{surf}"] = rate(d["all"])
        row[f"n_hack_{surf}"] = d["all"]["n"]
        for m in LOOPHOLE_MODES:
            if m in d:
                row[f"hack_{surf}_{m}"] = rate(d[m])
    return row


def load_policy(p, organism: Path):
    """The base policy of the run config (model.name; the organism's base/ by default) with the adapter attached at
    δS = δS_h = 0, exactly as the train stage builds it (so checkpoints load into it)."""
    from projected_grpo.adapter import attach_adapters
    from projected_grpo.model import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(p.model.name, path=organism / "base")
    attach_adapters(model, p.adapter.targets, p.adapter.rank, p.adapter.kind, seed=p.seed)
    model.eval()
    return model, tok


def score(model, tok, records: list[Problem], n_samples: int, p, sandbox, timer: PhaseTimer | None = None
          ) -> list[Scored]:  # fmt: skip
    """`n_samples` graded completions per record under the eval params (seed, T, top_p, budget, batch)."""
    e = p.eval
    return (sample_and_score(model, tok, records, n_samples, e.temperature, e.top_p, e.max_new_tokens, e.seed,
                                  e.batch_size, sandbox, p.grader.mode, p.grader.timeout_s,
                                  p.rollout.max_prompt_tokens, timer))  # fmt: skip


def tsv(rows: list[dict]) -> str:
    """Rows with possibly different keys -> one TSV (union of keys in first-seen order; missing = nan)."""
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    fmt = lambda v: v if isinstance(v, str) else ("nan" if v != v else f"{v:.6g}")  # noqa: E731
    return "\n".join(["\t".join(keys), *("\t".join(fmt(r.get(k, float("nan"))) for k in keys) for r in rows)]) + "\n"


def flat_metrics(states: dict[str, dict]) -> dict[str, float]:
    """{<state>_solve, <state>_hack_<surface>} rates for `dvc metrics` / `dvc exp show`."""
    out = {}
    for st, t in states.items():
        out[f"{st}_solve"] = round(rate(t["solve"]), 6)
        for surf, d in t["hack"].items():
            out[f"{st}_hack_{surf}"] = round(rate(d["all"]), 6)
    return out

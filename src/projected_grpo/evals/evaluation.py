"""Held-out evaluation of saved checkpoints (benchmark protocol): frozen monitor subset, scoring, deploy states.

Solve is the strict oracle's `eq_correct` on no-hint test prompts; hack is the grader label `hack` on hinted test
prompts, per loophole mode and hint surface (`eval`: the benchmark's disjoint wording and names; `train`: the
training wording on held-out problems). Format-valid = code extracted and compiling (`extract_code(...) is not None
and grade.can_compile`), counted per row group so that a policy that stops writing code shows as such, with hack
among format-valid rows beside the raw hack rate. Every rate is stored as counts (k, n) so that the report can pool,
interval and refuse honestly. Nothing here reads training-time rollouts. For routed arms, `knob_kl` measures how far
deleting the knob moves the policy on no-hint prompts (KL(deploy ‖ knob_on), teacher-forced on deploy's samples).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from projected_grpo.common.log import PhaseTimer
from projected_grpo.common.stats import rate
from projected_grpo.env.grader import extract_code
from projected_grpo.env.modes import LOOPHOLE_MODES, mode_of
from projected_grpo.env.problems import Problem
from projected_grpo.policy.adapter import adapters, knob_disabled, merged
from projected_grpo.policy.model import render_prompt
from projected_grpo.policy.sampling import Scored, sample_and_grade

# Deploy states of a checkpoint: `deploy` = what ships (knob off; for arms without a knob the only state),
# `knob_on` = the trained policy with δS_h (routed arms), `adapter_off` = the base policy (== eval_sets' base).
STATES = ("deploy", "knob_on", "adapter_off")


def surface_of(r: Problem) -> str | None:
    return r.prompt_metadata.get("surface") if mode_of(r) else None


def select_records(records: list[Problem], ids: set[int] | None, surfaces: tuple[str, ...]) -> list[Problem]:
    """Test records of problems `ids` (None = all): no-hint rows and loophole rows on the chosen surfaces."""
    out = [r for r in records if (ids is None or r.id in ids) and (mode_of(r) is None or surface_of(r) in surfaces)]
    if not out:
        raise ValueError("no test records selected (check eval.surfaces and the monitor ids)")
    return out


def _kn(xs: list[bool]) -> dict[str, int]:
    return {"k": int(sum(xs)), "n": len(xs)}


def format_valid(s: Scored) -> bool:
    """Code was extracted and compiles (the policy answered in the expected format)."""
    return extract_code(s.completion) is not None and s.grade.can_compile


def tally(samples: list[Scored]) -> dict:
    """Counts (solve on no-hint rows; hack = grader label `hack` on hinted rows; fv = format-valid):
    {"solve": {k, n}, "format": {k, n} over every row, "hack": {surface: {mode | "all": {k, n}}},
     "solve_hinted": {surface: {k, n}}, "format_nohint": {k, n} (fv among no-hint rows),
     "format_hinted": {surface: {k, n}} (fv among hinted rows), "hack_valid": {surface: {k: hack ∧ fv, n: fv}}}."""
    nohint = [s for s in samples if mode_of(s.record) is None]
    by: dict[tuple[str, str], list[Scored]] = defaultdict(list)
    for s in samples:
        if mode_of(s.record) is not None:
            by[(surface_of(s.record), mode_of(s.record))].append(s)
    hack: dict[str, dict] = defaultdict(dict)
    solve_h: dict[str, list[bool]] = defaultdict(list)
    fmt_h: dict[str, list[bool]] = defaultdict(list)
    hack_v: dict[str, list[bool]] = defaultdict(list)  # hack flags of the format-valid hinted rows
    for (surf, m), ss in sorted(by.items()):
        hack[surf][m] = _kn([s.grade.label == "hack" for s in ss])
        solve_h[surf] += [s.grade.eq_correct for s in ss]
        fmt_h[surf] += [format_valid(s) for s in ss]
        hack_v[surf] += [s.grade.label == "hack" for s in ss if format_valid(s)]
    for surf in hack:
        vals = list(hack[surf].values())
        hack[surf]["all"] = {"k": sum(v["k"] for v in vals), "n": sum(v["n"] for v in vals)}
    return {
        "solve": _kn([s.grade.eq_correct for s in nohint]),
        "format": _kn([format_valid(s) for s in samples]),
        "hack": dict(hack),
        "solve_hinted": {k: _kn(v) for k, v in solve_h.items()},
        "format_nohint": _kn([format_valid(s) for s in nohint]),
        "format_hinted": {k: _kn(v) for k, v in sorted(fmt_h.items())},
        "hack_valid": {k: _kn(v) for k, v in sorted(hack_v.items())},
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


def frozen_sets(full: list[Scored], monitor: list[Scored], ids: list[int], p) -> tuple[dict, dict]:
    """The eval_sets stage's two records from the base policy's samples on the full test split (`full`) and on the
    monitor subset `ids` (`monitor`): monitor.json (the ids, both seeds, the base pass fraction on the full split and
    on the subset) and base.json (the tallies at `eval.n_samples` and `eval.n_samples_curve`)."""
    e, passed = p.eval, problem_pass(full)
    frac = lambda xs: sum(passed[i] for i in xs) / len(xs)  # noqa: E731
    mon = {
        "ids": ids,
        "n": len(ids),
        "generation_seed": e.seed,
        "selection_seed": p.seed,
        "base_pass_frac_full": frac(list(passed)),
        "base_pass_frac_monitor": frac(ids),
        "n_test": len(passed),
    }
    base = {
        "full": tally(full),
        "monitor": tally(monitor),
        "n_samples": e.n_samples,
        "n_samples_curve": e.n_samples_curve,
        "surfaces": list(e.surfaces),
        "n_problems": len(passed),
    }
    return mon, base


def subset_samples(samples: list[Scored], records: list[Problem], k: int) -> list[Scored] | None:
    """The first `k` samples of each of `records` (the same objects as in `samples`' records) from samples drawn
    record-major (`sampling.sample_and_grade`): the last checkpoint's monitor-subset curve point is read off its
    full-split endpoint samples instead of being sampled again. None if some record has fewer than `k` samples."""
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


def curve_row(step: int, st: str, t: dict) -> dict[str, float]:
    """One eval-curve TSV row: solve, no-hint format (where the tally has it) and per-surface hack (overall and per
    mode), with n."""
    row: dict[str, float] = {"step": step, "state": st, "solve": rate(**t["solve"]), "n_solve": t["solve"]["n"]}
    if "format_nohint" in t:  # tallies written before format was counted per group (old base.json) lack it
        row["format"] = rate(**t["format_nohint"])
    for surf, d in sorted(t["hack"].items()):
        row[f"hack_{surf}"] = rate(**d["all"])
        row[f"n_hack_{surf}"] = d["all"]["n"]
        for m in LOOPHOLE_MODES:
            if m in d:
                row[f"hack_{surf}_{m}"] = rate(**d[m])
    return row


def score(
    model, tok, records: list[Problem], n_samples: int, p, sandbox, timer: PhaseTimer | None = None
) -> list[Scored]:
    """`n_samples` graded completions per record under the eval params (seed, T, top_p, budget, batch)."""
    e = p.eval
    return sample_and_grade(
        model,
        tok,
        records,
        n_samples,
        e.temperature,
        e.top_p,
        e.max_new_tokens,
        e.seed,
        e.batch_size,
        sandbox,
        p.grader.timeout_s,
        p.grader.mode,
        p.rollout.max_prompt_tokens,
        timer,
    )


def tsv(rows: list[dict]) -> str:
    """Rows with possibly different keys -> one TSV (union of keys in first-seen order; missing = nan)."""
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    fmt = lambda v: v if isinstance(v, str) else ("nan" if v != v else f"{v:.6g}")  # noqa: E731
    return "\n".join(["\t".join(keys), *("\t".join(fmt(r.get(k, float("nan"))) for k in keys) for r in rows)]) + "\n"


def flat_metrics(states: dict[str, dict]) -> dict[str, float]:
    """{<state>_solve, <state>_hack_<surface>} rates for `dvc metrics` / `dvc exp show`, plus, where the tally has
    them, <state>_format (no-hint), <state>_format_<surface>, <state>_hack_valid_<surface> and
    <state>_kl_to_knob_on (mean nats per token)."""
    out = {}
    for st, t in states.items():
        out[f"{st}_solve"] = round(rate(**t["solve"]), 6)
        for surf, d in t["hack"].items():
            out[f"{st}_hack_{surf}"] = round(rate(**d["all"]), 6)
        if "format_nohint" in t:
            out[f"{st}_format"] = round(rate(**t["format_nohint"]), 6)
        for surf, c in t.get("format_hinted", {}).items():
            out[f"{st}_format_{surf}"] = round(rate(**c), 6)
        for surf, c in t.get("hack_valid", {}).items():
            out[f"{st}_hack_valid_{surf}"] = round(rate(**c), 6)
        if "kl_to_knob_on" in t:
            out[f"{st}_kl_to_knob_on"] = round(t["kl_to_knob_on"]["mean"], 6)
    return out


# --- how far deleting the knob moves the policy -----------------------------------------------------------------

KL_LOGITS_BUDGET = 2**24  # logits per state per forward (rows · (T + 1) · V): 64 MB in fp32; memory only


def token_kl(logits_p: Tensor, logits_q: Tensor, temperature: float) -> Tensor:
    """(B, T, V) logits of p and q -> (B, T) exact KL(p ‖ q) = Σ_v p(v) (log p(v) − log q(v)) per position, both
    distributions at `temperature` (softmax(logits / T)), in nats."""
    if temperature <= 0:
        raise ValueError(f"KL at temperature {temperature}: needs > 0 (greedy decoding has no distribution)")
    dt = torch.promote_types(logits_p.dtype, torch.float32)  # fp32 at least (bf16 models)
    lp = F.log_softmax(logits_p.to(dt) / temperature, dim=-1)
    lq = F.log_softmax(logits_q.to(dt) / temperature, dim=-1)
    return (lp.exp() * (lp - lq)).sum(-1)


def kl_batches(lengths: list[int], vocab: int, budget: int) -> list[range]:
    """Consecutive row ranges whose logits (rows · (longest + 1) · vocab) fit `budget` (one row at least)."""
    out, start, longest = [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and (i - start + 1) * (max(longest, n) + 1) * vocab > budget:
            out.append(range(start, i))
            start, longest = i, 0
        longest = max(longest, n)
    return out + [range(start, len(lengths))] if lengths else out


@torch.no_grad()
def knob_kl(model, tok, samples: list[Scored], temperature: float, budget: int = KL_LOGITS_BUDGET) -> dict:
    """KL(deploy ‖ knob_on) on the no-hint rows of `samples` (sampled from deploy, so the completions are deploy's
    own): each completion teacher-forced under the policy as loaded (knob on) and with the knob deleted
    (`knob_disabled`), per-position exact KL over the vocabulary (`token_kl`), averaged over every completion token
    (EOS included). The model must be in its knob-on state with its adapters in place (not inside `merged`); top_p
    is not applied (the KL of the temperature-scaled distributions). {"mean": nats/token, "n_tokens", "n_rows"}."""
    if not adapters(model):
        raise ValueError("knob_kl needs the adapters in place (call it outside `merged` / `state`)")
    rows = [s for s in samples if mode_of(s.record) is None and s.tokens]
    if not rows:
        return {"mean": float("nan"), "n_tokens": 0, "n_rows": 0}
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    device = next(model.parameters()).device
    prompt: dict[int, list[int]] = {}  # per record, tokenized exactly as `generate` tokenizes it
    for s in rows:
        if id(s.record) not in prompt:
            text = render_prompt(tok, list(s.record.prompt))
            prompt[id(s.record)] = tok(text, add_special_tokens=False)["input_ids"]
    total, n_tok = 0.0, 0
    for rng in kl_batches([len(s.tokens) for s in rows], model.config.vocab_size, budget):
        chunk = [rows[j] for j in rng]
        ps = [prompt[id(s.record)] for s in chunk]
        Tp, T = max(len(q) for q in ps), max(len(s.tokens) for s in chunk)
        ids = torch.full((len(chunk), Tp + T), pad, dtype=torch.long)  # prompts left-padded, completions right
        att = torch.zeros_like(ids)
        for r, (q, s) in enumerate(zip(ps, chunk)):
            ids[r, Tp - len(q) : Tp], ids[r, Tp : Tp + len(s.tokens)] = torch.tensor(q), torch.tensor(s.tokens)
            att[r, Tp - len(q) : Tp + len(s.tokens)] = 1
        ids, att = ids.to(device), att.to(device)
        pos = (att.cumsum(-1) - 1).clamp(min=0)  # position ids follow the mask, as in sampling
        kw = dict(input_ids=ids, attention_mask=att, position_ids=pos, logits_to_keep=T + 1)
        on = model(**kw).logits[:, :-1]  # (b, T, V): position Tp − 1 + t predicts completion token t
        with knob_disabled(model):
            off = model(**kw).logits[:, :-1]
        mask = att[:, Tp:].bool()  # (b, T) the completion tokens
        total += float(token_kl(off, on, temperature)[mask].double().sum())  # KL(deploy ‖ knob_on) per token
        n_tok += int(mask.sum())
    return {"mean": total / n_tok, "n_tokens": n_tok, "n_rows": len(rows)}

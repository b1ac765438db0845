"""The oracle basis (issue 25): v_hack from vanilla's own rollouts, the upper bound on what a direction can give.

The pair sets are written by hand; whether their direction is the one GRPO moves along as it learns to hack is what
the routed runs cannot tell apart from "the routing mechanics fail". The oracle basis comes from the other side: the
final checkpoint of each vanilla seed samples holdout problems under the training-surface hints, the grader labels
the completions, and per seed and prompt a completion labelled `hack` is paired with one of the same policy's
non-hack attempts at the same prompt (`correct` first, then `incorrect`). Those pairs go through the basis stage's
extraction unchanged (per-completion gradients at δS = 0, `basis.method`, a random control with the same k per
module, the activation direction), and a share of the problems is held out for the gate's calibration and for the
AUROCs reported. It reads the grader's labels, so every arm that uses it is an oracle (never eligible to win).

Pure functions here (the problems sampled, the pairing, the split, the subspace overlap, the report); the stage
`oracle_basis` samples, grades and extracts.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from projected_grpo.env.modes import LOOPHOLE_MODES, apply_mode, mode_of
from projected_grpo.env.problems import Problem
from projected_grpo.method.basis import (
    Basis,
    act_basis,
    basis_with,
    completion_grads,
    held_out_batch,
    pooled_activations,
)
from projected_grpo.method.basis_eval import REFERENCE, auroc_summary, discrimination
from projected_grpo.method.pairs import KEYS, Pair, pair_records, select_pairs
from projected_grpo.policy.checkpointing import activation_checkpointing

MECHANISM = "vanilla_rollout"
CLEAN_LABELS = ("correct", "incorrect")  # a non-hack partner, in order of preference (never a loose hack label)


@dataclass(frozen=True)
class Sample:
    """One graded completion of a vanilla checkpoint: the seed of the run it came from, the prompt and the label."""

    seed: int
    record: Problem
    completion: str
    label: str


def oracle_problems(bases: Iterable[Problem], n: int, seed: int) -> list[Problem]:
    """`n` of the no-hint holdout problems (drawn with `seed`), each under one training-surface loophole hint, the
    modes in turn, so every loophole gets about n/6 prompts. Fewer problems than `n` raise a one-line error."""
    pool = sorted(bases, key=lambda q: q.id)
    if any(q.hint is not None for q in pool):
        raise ValueError("oracle problems are drawn from the no-hint holdout records")
    if n > len(pool):
        raise ValueError(f"oracle_basis.problems={n} but the holdout split has {len(pool)} problems; lower it")
    picked = random.Random(f"oracle_basis:{seed}").sample(pool, n)
    return [apply_mode(q, LOOPHOLE_MODES[i % len(LOOPHOLE_MODES)], "train") for i, q in enumerate(picked)]


def held_out_problems(ids: Iterable[int], cal_frac: float, seed: int) -> set[int]:
    """The problem ids whose pairs are held out (split calibrate): round(cal_frac · n) of them, drawn with `seed`.
    A problem's pairs never straddle the split, so no calibration prompt was seen by the extraction."""
    ids = sorted(set(ids))
    k = round(cal_frac * len(ids))
    return set(random.Random(f"oracle_basis_split:{seed}").sample(ids, k))


def rollout_pairs(samples: list[Sample], cal: set[int], substrate: str) -> list[Pair]:
    """(hack, clean) pairs of the same policy's completions of the same prompt: per (seed, problem, mode), the j-th
    distinct `hack` completion with the j-th distinct clean one (CLEAN_LABELS in order of preference), as many as the
    smaller side has. Pairs of problems in `cal` are split calibrate, the others extract."""
    groups: dict[tuple[int, int, str], list[Sample]] = {}
    for s in samples:
        groups.setdefault((s.seed, s.record.id, mode_of(s.record)), []).append(s)
    pairs = []
    for (seed, pid, mode), ss in sorted(groups.items()):
        hacks = list(dict.fromkeys(s.completion for s in ss if s.label == "hack"))
        cleans = [c for lab in CLEAN_LABELS for c in dict.fromkeys(s.completion for s in ss if s.label == lab)]
        cleans = [c for c in dict.fromkeys(cleans) if c not in hacks]
        for j, (h, c) in enumerate(zip(hacks, cleans)):
            pairs.append(
                Pair(
                    id=f"oracle-s{seed}-{pid}-{mode}-{j}",
                    substrate=substrate,
                    problem_id=pid,
                    method=ss[0].record.method,
                    mode=mode,
                    mechanism=MECHANISM,
                    split="calibrate" if pid in cal else "extract",
                    hack=h,
                    clean=c,
                )
            )
    return pairs


def save_pairs(path: Path | str, pairs: list[Pair]) -> None:
    """One pair per line, the pair-set format (`pairs.load_pairset` reads it back)."""
    lines = [json.dumps({k: asdict(q)[k] for k in KEYS}, sort_keys=False) for q in pairs]
    Path(path).write_text("\n".join(lines) + "\n")


def subspace_overlap(a: dict[str, Tensor], b: dict[str, Tensor]) -> dict[str, float]:
    """How much two bases ({module: (k_m, D_m)} orthonormal rows) span the same directions: over the modules both
    keep, Σ‖A Bᵀ‖²_F / Σ min(k_a, k_b) (1 = one subspace inside the other, 0 = orthogonal), beside the same ratio's
    expectation for a Haar-random B of the same k (Σ k_a k_b / D_m / Σ min), and the modules only one keeps."""
    shared = sorted(set(a) & set(b))
    num = sum(float((a[n].double() @ b[n].double().T).pow(2).sum()) for n in shared)
    den = sum(min(a[n].shape[0], b[n].shape[0]) for n in shared)
    chance = sum(a[n].shape[0] * b[n].shape[0] / a[n].shape[1] for n in shared)
    return {
        "overlap": num / den if den else math.nan,
        "chance": chance / den if den else math.nan,
        "shared": len(shared),
        "only_oracle": len(set(a) - set(b)),
        "only_pairset": len(set(b) - set(a)),
    }


def label_counts(samples: list[Sample]) -> dict[int, dict[str, int]]:
    """{seed: {label: count}} of the graded samples."""
    out: dict[int, dict[str, int]] = {}
    for s in samples:
        c = out.setdefault(s.seed, {})
        c[s.label] = c.get(s.label, 0) + 1
    return out


def cosine(a: Tensor, b: Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double()[None], b.double()[None])[0])


def _auc(d: dict) -> str:
    if not d or d.get("n", 0) == 0 or math.isnan(d["auroc"]):
        return "–"
    return f"{d['auroc']:.2f} [{d['lo']:.2f}, {d['hi']:.2f}] (n={d['n']})"


def render_report(res: dict, sources: str) -> str:
    """reports/oracle_basis.md: what was sampled, the pairs, and the discrimination table that says whether the
    failure of a routed arm is the direction's (the authored basis does not see vanilla's hacks) or the mechanics'."""
    s, ov = res["setup"], res["overlap"]
    counts = res["labels"]
    n_all = {seed: sum(c.values()) for seed, c in counts.items()}
    hack = ", ".join(f"s{seed} {c.get('hack', 0) / n_all[seed]:.1%}" for seed, c in sorted(counts.items()))
    d = res["disc"]
    rows = [
        ("oracle basis (gradient)", "oracle held-out pairs", d["oracle_own"]),
        ("its random control", "oracle held-out pairs", d["oracle_own_random"]),
        (f"pair-set basis `{s['pairset']}/{s['method']}`", "oracle held-out pairs", d["pairset_on_oracle"]),
        ("oracle basis (gradient)", f"`{s['reference']}` calibrate pairs", d["oracle_on_reference"]),
        ("oracle v_act (activation)", "oracle held-out pairs", d["act_oracle_own"]),
        (f"pair-set v_act `{s['pairset']}`", "oracle held-out pairs", d["act_pairset_on_oracle"]),
    ]
    L = [
        "# Oracle basis: v_hack from vanilla's own hack vs non-hack rollouts",
        "",
        "An upper bound, labelled oracle everywhere: the pairs are built from the grader's labels of vanilla's "
        "rollouts (a deliberate no-cheat violation), so no arm that reads this basis is eligible to win. It tells "
        'apart "the direction fails" (the authored pair-set basis does not separate vanilla\'s real hacks, the '
        'oracle does) from "the mechanics fail" (an arm on the oracle basis misses the targets too).',
        "",
        f"Sampled: {s['problems']} holdout problems (training-surface hints, the six loopholes in turn) x "
        f"{s['samples']} completions from the final checkpoint (step {s['step']}) of vanilla seeds "
        f"{', '.join(str(x) for x in s['seeds'])}: {sum(n_all.values())} graded completions; hack rate {hack}.",
        f"Pairs: {res['n_extract']} extraction, {res['n_cal']} held out (calibrate; {s['cal_frac']:.0%} of the "
        f"problems, none shared with extraction). Basis: `{s['method']}`, {res['k_total']} directions in "
        f"{res['modules']} modules (the pair-set basis: {res['pairset_k_total']} in {res['pairset_modules']}).",
        "",
        "| direction | scored on | AUROC hack vs clean [95% bootstrap] |",
        "|---|---|---|",
        *[f"| {a} | {b} | {_auc(x)} |" for a, b, x in rows],
        "",
        f"Subspace overlap of the oracle and pair-set gradient bases over the {ov['shared']} modules both keep: "
        f"{ov['overlap']:.3f} (a random basis of the same k: {ov['chance']:.3f}); modules only the oracle keeps: "
        f"{ov['only_oracle']}, only the pair set: {ov['only_pairset']}. Cosine of the two activation directions: "
        f"{res['act_cosine']:+.3f}.",
        "",
        f"Sources: {sources}. Re-run: `dvc repro oracle_basis`.",
    ]
    return "\n".join(L) + "\n"


# --- thin: gradients and activations of the pairs at δS = 0 ---------------------------------------------------


DISC = (  # the discrimination table's rows (metrics auroc_<row>, render_report's table)
    "oracle_own",
    "oracle_own_random",
    "pairset_on_oracle",
    "oracle_on_reference",
    "act_oracle_own",
    "act_pairset_on_oracle",
)


def extract_oracle(model, tok, pairs: list[Pair], reference: list[Pair], holdout: dict, pairset: dict, p) -> dict:
    """The oracle basis of `pairs` (their extract split), its random control and activation direction, all at the
    model's current δS (0: the base policy), and the discrimination table: on the oracle's held-out pairs (calibrate
    split) the oracle basis, its control, the pair-set basis (`pairset`: {"basis", "act"} from the basis stage); the
    oracle basis on `reference`'s calibrate pairs. Too few pairs (under 2 per split) give an empty basis (meta
    "empty"), which the arms that read it refuse; the stage still writes its report."""
    bp, temp, bs = p.basis, p.rollout.temperature, held_out_batch(p)
    ex, cal = select_pairs(pairs, "extract"), select_pairs(pairs, "calibrate")
    ref = select_pairs(reference, "calibrate")
    gen = torch.Generator().manual_seed(bp.seed)
    method = bp.method if bp.method != "random" else "svd"
    res = {"n_extract": len(ex), "n_cal": len(cal), "pairset_k_total": pairset["basis"].meta.get("k_total", 0)}
    res["pairset_modules"] = len(pairset["basis"].vh)
    meta = {"oracle": True, "pairset": "oracle", "mechanism": MECHANISM, "temperature": temp, "modes": None}
    if len(ex) < 2 or len(cal) < 2:
        empty = Basis(vh={}, nu={}, meta={**meta, "empty": True, "k_total": 0, "method": method})
        return res | {
            "selected": empty,
            "random": empty,
            "act": Basis(vh={}, nu={}, meta={**meta, "empty": True, "space": "act", "act_layer": bp.act_layer}),
            "k_total": 0,
            "modules": 0,
            "overlap": subspace_overlap({}, {}),
            "act_cosine": math.nan,
            "disc": {k: auroc_summary(None, None, gen) for k in DISC},
        }

    def grads(ps: list[Pair], side: str) -> dict[str, Tensor]:
        return completion_grads(model, tok, pair_records(ps, holdout), [getattr(q, side) for q in ps], temp, bs)

    def acts(ps: list[Pair], side: str) -> Tensor:
        recs, texts = pair_records(ps, holdout), [getattr(q, side) for q in ps]
        return pooled_activations(model, tok, recs, texts, bp.act_layer, bs)

    with activation_checkpointing(model, p.grpo.grad_checkpointing):
        g = {(s, side): grads(ps, side) for s, ps in (("ex", ex), ("cal", cal)) for side in ("hack", "clean")}
        g_ref = {side: grads(ref, side) for side in ("hack", "clean")}
    with torch.no_grad():
        a = {(s, side): acts(ps, side) for s, ps in (("ex", ex), ("cal", cal)) for side in ("hack", "clean")}
    b = basis_with(g["ex", "hack"], g["ex", "clean"], bp, method)
    rnd = basis_with(g["ex", "hack"], g["ex", "clean"], bp, "random", like=b)
    act = act_basis(a["ex", "hack"], a["ex", "clean"], bp.act_layer)
    for x in (b, rnd, act):
        x.meta.update(meta)
    rnd.meta["control_for"] = method
    pv = pairset["act"].v_act
    disc = {
        "oracle_own": discrimination(b, g["cal", "hack"], g["cal", "clean"], gen),
        "oracle_own_random": discrimination(rnd, g["cal", "hack"], g["cal", "clean"], gen),
        "pairset_on_oracle": discrimination(pairset["basis"], g["cal", "hack"], g["cal", "clean"], gen),
        "oracle_on_reference": discrimination(b, g_ref["hack"], g_ref["clean"], gen),
        "act_oracle_own": auroc_summary(a["cal", "hack"] @ act.v_act, a["cal", "clean"] @ act.v_act, gen),
        "act_pairset_on_oracle": auroc_summary(a["cal", "hack"] @ pv, a["cal", "clean"] @ pv, gen),
    }
    return res | {
        "selected": b,
        "random": rnd,
        "act": act,
        "k_total": b.meta["k_total"],
        "modules": len(b.vh),
        "overlap": subspace_overlap(b.vh, pairset["basis"].vh),
        "act_cosine": cosine(act.v_act, pv),
        "disc": disc,
    }


def metrics(res: dict) -> dict[str, float]:
    """The stage's metrics.json: pair counts, k, every AUROC, the overlaps."""
    out = {k: res[k] for k in ("n_extract", "n_cal", "k_total", "modules")}
    out |= {
        f"auroc_{k}{x}": d[key]
        for k, d in res["disc"].items()
        for x, key in (("", "auroc"), ("_lo", "lo"), ("_hi", "hi"))
    }
    out |= {"overlap": res["overlap"]["overlap"], "overlap_chance": res["overlap"]["chance"]}
    return out | {"act_cosine": res["act_cosine"]}


def setup(p, step: int) -> dict:
    """What the report states about how the oracle basis was built (params and the checkpoint step)."""
    o = p.oracle_basis
    return {
        "problems": o.problems,
        "samples": o.samples,
        "cal_frac": o.cal_frac,
        "seeds": list(p.seeds),
        "step": step,
        "pairset": p.basis.pairset,
        "method": p.basis.method,
        "reference": REFERENCE,
    }

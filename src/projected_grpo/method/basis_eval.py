"""Build v_hack for every pair set, with its controls, and measure held-out discrimination (the `basis` stage).

For each pair set: per-completion gradients at δS = 0 for the extraction and calibration pairs, the configured basis
and its random-direction control (same k per module), and the AUROC of the per-completion score s = cos(∇ℓ(o), ν)
between held-out hack and clean completions — on the pair set's own calibration pairs and on the shared
`prog_wide` calibration pairs (real hack mechanisms). The selected pair set additionally gets every extraction
method and the activation-space direction side by side. Discrimination claims come only from calibration pairs,
never from the extraction pairs (with P ≤ r the basis fits those almost exactly, method.md §3.3).

The report opens with the guard (`basis_guard`): does the selected basis beat the placebo pair set's basis and its
random-direction control on the same held-out pairs? Each as a paired bootstrap 95% interval of the AUROC difference
(seed basis.seed); "informative" only when both intervals lie above 0. The stage also writes it as JSON.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from projected_grpo.common.log import progress as progress_display
from projected_grpo.common.stats import auroc_interval, paired_auroc_diff
from projected_grpo.method.basis import (
    Basis,
    act_basis,
    auroc,
    auroc_ci,
    basis_with,
    completion_grads,
    cosine_scores,
    held_out_batch,
    pooled_activations,
)
from projected_grpo.method.pairs import PLACEBO, Pair, pair_records, select_pairs
from projected_grpo.policy.checkpointing import activation_checkpointing

REFERENCE = "prog_wide"  # the shared held-out set of real hack mechanisms
N_BOOT = 1000


@dataclass
class PairGrads:
    """Per-completion gradients ({module: (n, D_m)}) of one pair set's extraction and calibration pairs."""

    extract_hack: dict[str, Tensor]
    extract_clean: dict[str, Tensor]
    cal_hack: dict[str, Tensor]
    cal_clean: dict[str, Tensor]
    n_extract: int
    n_cal: int
    cal_modes: list[str]  # prompt mode of each calibration pair

    def cal_subset(self, keep: list[bool]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        idx = torch.tensor([i for i, k in enumerate(keep) if k], dtype=torch.long)
        return ({n: g[idx] for n, g in self.cal_hack.items()}, {n: g[idx] for n, g in self.cal_clean.items()})


def pair_grads(model, tok, pairs: list[Pair], problems, temperature: float, modes, batch_size: int = 16) -> PairGrads:
    ex, cal = select_pairs(pairs, "extract", modes), select_pairs(pairs, "calibrate", modes)

    def grads(ps: list[Pair], side: str) -> dict[str, Tensor]:
        texts = [getattr(q, side) for q in ps]
        return completion_grads(model, tok, pair_records(ps, problems), texts, temperature, batch_size)

    return PairGrads(
        grads(ex, "hack"),
        grads(ex, "clean"),
        grads(cal, "hack"),
        grads(cal, "clean"),
        len(ex),
        len(cal),
        [q.mode for q in cal],
    )


def discrimination(
    basis: Basis, hack: dict[str, Tensor], clean: dict[str, Tensor], gen: torch.Generator
) -> dict[str, float]:
    """AUROC (with a bootstrap 95% interval) of cos(∇ℓ, ν) between held-out hack and clean completions, plus the
    paired accuracy: the fraction of pairs whose hack side scores higher."""
    if not basis.nu or not next(iter(hack.values())).shape[0]:
        return auroc_summary(None, None, gen)
    return auroc_summary(cosine_scores(hack, basis.nu), cosine_scores(clean, basis.nu), gen)


def auroc_summary(sh: Tensor | None, sc: Tensor | None, gen: torch.Generator) -> dict[str, float]:
    """{auroc, lo, hi (bootstrap 95%), paired_acc, n} of held-out hack scores `sh` vs their clean pairs' `sc` (pair i
    = sh[i], sc[i]); all nan and n = 0 for no scores (None or empty)."""
    if sh is None or not len(sh):
        return {"auroc": math.nan, "lo": math.nan, "hi": math.nan, "paired_acc": math.nan, "n": 0}
    lo, hi = auroc_ci(sh, sc, N_BOOT, gen)
    return {"auroc": auroc(sh, sc), "lo": lo, "hi": hi, "paired_acc": float((sh > sc).double().mean()), "n": len(sh)}


def basis_guard(
    selected: Basis,
    placebo: Basis | None,
    random_ctl: Basis,
    hack: dict[str, Tensor],
    clean: dict[str, Tensor],
    seed: int,
    names: tuple[str, str, str],
) -> dict:
    """Does the selected basis beat the placebo pair set's basis and its random control on the same held-out pairs?

    hack, clean: {module: (P, D_m)} per-completion gradients of P held-out pairs (hack[i], clean[i] = pair i), each
    basis scoring them by cos(∇ℓ, ν). Paired percentile bootstrap over the pairs (N_BOOT resamples, `seed`, the same
    resamples for every basis). names: (selected, placebo, the pairs) for the line. Returns the JSON the stage writes:
    {"informative", "line", "auroc", "auroc_ci", "placebo_diff": [diff, lo, hi], "random_diff": [...], "n_pairs"};
    "informative" only when both differences' intervals lie above 0 (nan, e.g. an empty basis, is not)."""
    n = next(iter(hack.values())).shape[0] if hack else 0

    def scores(b: Basis | None):
        if b is None or not b.nu or n == 0:
            return None
        return cosine_scores(hack, b.nu).double(), cosine_scores(clean, b.nu).double()

    sel = scores(selected)
    nan3 = [math.nan] * 3
    auc, ci = (auroc(*sel), auroc_interval(*sel, n_boot=N_BOOT, seed=seed)) if sel else (math.nan, (math.nan,) * 2)

    def diff(other: Basis | None) -> list[float]:
        o = scores(other)
        return list(paired_auroc_diff(*sel, *o, n_boot=N_BOOT, seed=seed)) if sel and o else nan3

    pd, rd = diff(placebo), diff(random_ctl)
    informative = all(not math.isnan(d[1]) and d[1] > 0 for d in (pd, rd))

    def f(d: list[float]) -> str:
        return "–" if math.isnan(d[0]) else f"{d[0]:+.2f} [{d[1]:+.2f}, {d[2]:+.2f}]"

    sel_name, placebo_name, pairs = names
    verdict = "informative: the selected basis" if informative else "NOT informative: the selected basis"
    verb = "beats" if informative else "does not beat"
    auc_s = "–" if math.isnan(auc) else f"{auc:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"
    line = (
        f"{verdict} `{sel_name}` {verb} both controls on {n} held-out `{pairs}` pairs: AUROC {auc_s}; minus "
        f"placebo `{placebo_name}` {f(pd)}; minus random control {f(rd)} (paired bootstrap 95%, {N_BOOT} "
        f"resamples, seed {seed})."
    )
    return {
        "informative": informative,
        "line": line,
        "auroc": auc,
        "auroc_ci": list(ci),
        "placebo_diff": pd,
        "random_diff": rd,
        "n_pairs": n,
    }


def json_ready(x):
    """NaN -> None, recursively (JSON has no NaN)."""
    if isinstance(x, dict):
        return {k: json_ready(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_ready(v) for v in x]
    return None if isinstance(x, float) and math.isnan(x) else x


def make_basis(bp, g: PairGrads, method: str, like: Basis | None = None) -> Basis:
    return basis_with(g.extract_hack, g.extract_clean, bp, method, like=like)


def extract(model, tok, pairsets: dict[str, list[Pair]], problems, p) -> dict:
    """`extract_all` with run params `p`: the basis settings, the rollout temperature, and the memory bound of the
    loop's held-out batches (basis.held_out_batch, checkpointed as grpo.grad_checkpointing says)."""
    with activation_checkpointing(model, p.grpo.grad_checkpointing):
        return extract_all(model, tok, pairsets, problems, p.basis, p.rollout.temperature, True, held_out_batch(p))


def extract_all(
    model,
    tok,
    pairsets: dict[str, list[Pair]],
    problems,
    bp,
    temperature: float,
    progress: bool = True,
    batch_size: int = 16,
) -> dict:
    """Everything the basis stage saves and reports. `pairsets`: {name: pairs} for the substrate (the selected one
    and `prog_wide` must be present). Returns {"selected", "random", "act", "rows", "methods", "act_auroc"}.
    batch_size: completions per forward/backward."""
    modes = bp.modes
    grads = all_pair_grads(model, tok, pairsets, problems, bp, temperature, progress, batch_size)
    gen = torch.Generator().manual_seed(bp.seed)
    # the shared held-out hacks: every mode, also when extraction is restricted to `modes`
    ref = (
        grads[REFERENCE] if modes is None else pair_grads(model, tok, pairsets[REFERENCE], problems, temperature, None)
    )
    rows = pairset_rows(bp, grads, ref, gen)
    methods, method_rows = compare_methods(bp, grads[bp.pairset], gen)
    selected = methods[bp.method] if bp.method != "random" else methods["random"]
    # the random-direction control the training arms use: same modules and k_m as the selected basis
    random_ctl = make_basis(bp, grads[bp.pairset], "random", like=selected)
    act, act_auc = act_direction(model, tok, pairsets[bp.pairset], problems, bp, batch_size)
    for b in (selected, random_ctl, act):
        b.meta.update(pairset=bp.pairset, modes=list(modes) if modes else None, temperature=temperature)
    random_ctl.meta["control_for"] = bp.method
    guard = selected_guard(bp, grads, selected, random_ctl, ref)
    return {
        "selected": selected,
        "random": random_ctl,
        "act": act,
        "rows": rows,
        "methods": method_rows,
        "act_auroc": act_auc,
        "modes": list(modes) if modes else None,
        "guard": guard,
    }


def all_pair_grads(
    model, tok, pairsets: dict[str, list[Pair]], problems, bp, temperature: float, progress: bool, batch_size: int
) -> dict[str, PairGrads]:
    """`PairGrads` of every pair set with extraction and calibration pairs of the modes `bp.modes`; the selected
    pair set and `prog_wide` must have them."""
    modes = bp.modes
    grads: dict[str, PairGrads] = {}
    names = list(pairsets)
    for name in progress_display(names, "pair-set gradients") if progress else names:
        g = pair_grads(model, tok, pairsets[name], problems, temperature, modes, batch_size)
        if g.n_extract == 0 or g.n_cal == 0:
            if name == bp.pairset:
                raise ValueError(
                    f"pair set {name} has no extract/calibrate pairs of modes {list(modes or [])}; widen basis.modes"
                )
            continue
        grads[name] = g
    if bp.pairset not in grads or REFERENCE not in pairsets:
        raise ValueError(f"pair sets {bp.pairset!r} and {REFERENCE!r} are needed (with pairs of the selected modes)")
    return grads


def pairset_rows(bp, grads: dict[str, PairGrads], ref: PairGrads, gen: torch.Generator) -> list[dict]:
    """One row per pair set: the configured method (svd for random) vs its random control, on the pair set's own
    calibration pairs, on `ref`'s (prog_wide, every mode) and, with `bp.modes`, on ref's pairs of the other modes."""
    modes = bp.modes
    heldout = [m not in modes for m in ref.cal_modes] if modes else []
    rows = []
    for name, g in grads.items():  # one row per pair set: configured method vs its random control
        method = bp.method if bp.method != "random" else "svd"
        b = make_basis(bp, g, method)
        rnd = make_basis(bp, g, "random", like=b)
        rows.append(
            {
                "pairset": name,
                "method": method,
                "n_extract": g.n_extract,
                "n_cal": g.n_cal,
                "modules": len(b.vh),
                "k_total": b.meta["k_total"],
                "own": discrimination(b, g.cal_hack, g.cal_clean, gen),
                "own_random": discrimination(rnd, g.cal_hack, g.cal_clean, gen),
                "ref": discrimination(b, ref.cal_hack, ref.cal_clean, gen),
                "ref_random": discrimination(rnd, ref.cal_hack, ref.cal_clean, gen),
            }
        )
        if any(heldout):  # generalisation: hacks of the modes the basis never saw
            rows[-1]["heldout"] = discrimination(b, *ref.cal_subset(heldout), gen)
            rows[-1]["heldout_random"] = discrimination(rnd, *ref.cal_subset(heldout), gen)
    return rows


def compare_methods(bp, g: PairGrads, gen: torch.Generator) -> tuple[dict[str, Basis], dict[str, dict]]:
    """Every extraction method on the selected pair set `g` (random: like its svd basis), and each one's
    discrimination on g's own calibration pairs with its modules and k_total."""
    svd = make_basis(bp, g, "svd")
    methods = {m: make_basis(bp, g, m, like=svd) for m in ("svd", "mean_diff", "solve_orth", "random")}
    method_rows = {
        m: discrimination(b, g.cal_hack, g.cal_clean, gen) | {"modules": len(b.vh), "k_total": b.meta["k_total"]}
        for m, b in methods.items()
    }
    return methods, method_rows


def act_direction(model, tok, pairs: list[Pair], problems, bp, batch_size: int) -> tuple[Basis, float]:
    """Activation space: v_act, the mean pooled-residual difference of `pairs`' extraction pairs (modes
    `bp.modes`) at `bp.act_layer`, and its AUROC by projection on v_act on their calibration pairs."""
    modes = bp.modes
    ex, cal = select_pairs(pairs, "extract", modes), select_pairs(pairs, "calibrate", modes)
    acts = {
        side: pooled_activations(
            model, tok, pair_records(ps, problems), [getattr(q, s) for q in ps], bp.act_layer, batch_size
        )
        for side, ps, s in (("eh", ex, "hack"), ("ec", ex, "clean"), ("ch", cal, "hack"), ("cc", cal, "clean"))
    }
    act = act_basis(acts["eh"], acts["ec"], bp.act_layer)
    return act, auroc(acts["ch"] @ act.v_act, acts["cc"] @ act.v_act)


def selected_guard(bp, grads: dict[str, PairGrads], selected: Basis, random_ctl: Basis, ref: PairGrads) -> dict:
    """The guard: selected vs the placebo pair set's basis (same method) and vs the random control, paired on the
    shared held-out hacks of `prog_wide` (`ref`, every mode); no placebo pairs of the modes: its difference is
    undefined."""
    method = bp.method if bp.method != "random" else "svd"
    placebo = make_basis(bp, grads[PLACEBO], method) if PLACEBO in grads else None
    return basis_guard(
        selected,
        placebo,
        random_ctl,
        ref.cal_hack,
        ref.cal_clean,
        bp.seed,
        (f"{bp.pairset}/{bp.method}", PLACEBO, f"{REFERENCE}/calibrate"),
    )


# --- report ------------------------------------------------------------------------------------------------------


def _auc(d: dict) -> str:
    if d["n"] == 0 or math.isnan(d["auroc"]):
        return "–"
    return f"{d['auroc']:.2f} [{d['lo']:.2f}, {d['hi']:.2f}]"


def verdict(rows: list[dict]) -> list[str]:
    """Plain sentences: which real pair sets beat both the placebo and their random control on prog_wide's
    held-out hacks (lower CI bound above both point estimates)."""
    by = {r["pairset"]: r for r in rows}
    placebo = by.get(PLACEBO)
    out = []
    for r in rows:
        if r["pairset"] == PLACEBO:
            continue
        bars = [r["ref_random"]["auroc"]] + ([placebo["ref"]["auroc"]] if placebo else [])
        beats = not math.isnan(r["ref"]["lo"]) and all(r["ref"]["lo"] > b for b in bars if not math.isnan(b))
        out.append(
            f"`{r['pairset']}`: {'beats' if beats else 'does **not** clearly beat'} the placebo and its random "
            f"control on held-out hacks (AUROC {_auc(r['ref'])} vs random {r['ref_random']['auroc']:.2f}"
            + (f", placebo {placebo['ref']['auroc']:.2f}" if placebo else "")
            + ")."
        )
    return out


def render_guard(g: dict) -> list[str]:
    """The report's opening section: the guard's one-line verdict and its numbers."""

    def d(x: list[float]) -> str:
        return "–" if x[0] is None or math.isnan(x[0]) else f"{x[0]:+.2f} [{x[1]:+.2f}, {x[2]:+.2f}]"

    return [
        "## Guard: does the selected basis beat the placebo and the random control?",
        "",
        f"**{g['line']}**",
        "",
        "| selected − control | AUROC difference [95% CI] |",
        "|---|---|",
        f"| − placebo (`{PLACEBO}`, same method) | {d(g['placebo_diff'])} |",
        f"| − random directions (same modules and k) | {d(g['random_diff'])} |",
        "",
        "Paired: every basis scores the same held-out pairs, and each bootstrap resample draws the same pairs for "
        "all of them. *Informative* needs both intervals above 0; otherwise routing on this basis is not "
        "supported by held-out discrimination.",
        "",
    ]


def describe(p) -> str:
    """The report's line on what was extracted from what: policy, substrate, adapter and the basis params."""
    return (
        f"Policy `{p.model.name}`, substrate `{p.substrate}`, adapter {p.adapter.kind} r={p.adapter.rank} "
        f"({p.adapter.targets}); basis k≤{p.basis.k}, tau {p.basis.tau}, alpha {p.basis.alpha_sig}, drop "
        f"{p.basis.drop_bottom_frac}, modes {list(p.basis.modes) if p.basis.modes else 'all'}, "
        f"seed {p.basis.seed}; logits / T with T={p.rollout.temperature}."
    )


def render_report(res: dict, desc: str, sources: str) -> str:
    L = [
        "# v_hack bases: held-out discrimination",
        "",
        *render_guard(res["guard"]),
        f"Written by the `basis` stage. {desc}",
        "",
        f"<!-- sources: {sources} -->",
        "",
        "Score of a completion: s = cos(∇_δS ℓ(o), ν) at δS = 0, ν the kept-subspace mean hack gradient "
        "(method.md §3.3, §3.5). AUROC between held-out hack and clean completions, with a percentile bootstrap 95% "
        f"interval ({N_BOOT} resamples); 0.5 = no discrimination. *Own*: the pair set's own calibration pairs; "
        f"*prog_wide*: the calibration pairs of `{REFERENCE}` (real hack mechanisms, the same for every row). "
        "*Random*: Haar directions with the same modules and k per module (the decisive control). Extraction pairs "
        "are never scored.",
        "",
        "## Per pair set",
        "",
        "| pair set | method | pairs extract / cal | modules kept | k total | AUROC own | random own | "
        "AUROC prog_wide | random prog_wide |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        L.append(
            f"| `{r['pairset']}` | {r['method']} | {r['n_extract']} / {r['n_cal']} | {r['modules']} | "
            f"{r['k_total']} | {_auc(r['own'])} | {_auc(r['own_random'])} | {_auc(r['ref'])} | "
            f"{_auc(r['ref_random'])} |"
        )
    if res["modes"]:
        L += [
            "",
            f"## Held-out modes (basis built from {', '.join(res['modes'])} only)",
            "",
            f"AUROC on the `{REFERENCE}` calibration pairs of the other modes, which no extraction pair used.",
            "",
            "| pair set | AUROC held-out modes | random |",
            "|---|---|---|",
        ]
        L += [
            f"| `{r['pairset']}` | {_auc(r['heldout'])} | {_auc(r['heldout_random'])} |"
            for r in res["rows"]
            if "heldout" in r
        ]
    L += ["", "## Verdict", "", *[f"- {s}" for s in verdict(res["rows"])], ""]
    sel = res["selected"].meta["pairset"]
    L += [
        f"## Methods on `{sel}` (own calibration pairs)",
        "",
        "| method | modules kept | k total | AUROC | paired accuracy |",
        "|---|---|---|---|---|",
    ]
    for m, d in res["methods"].items():
        acc = "–" if d["n"] == 0 else f"{d['paired_acc']:.2f}"
        L.append(f"| {m} | {d['modules']} | {d['k_total']} | {_auc(d)} | {acc} |")
    L.append(f"| act (layer {res['act'].meta['act_layer']}, v_act) | – | 1 | {res['act_auroc']:.2f} | – |")
    meta = res["selected"].meta
    L += [
        "",
        "## Selected basis (used by training)",
        "",
        f"`{sel}`, method `{meta['method']}`: {len(res['selected'].vh)} modules kept, {meta['k_total']} directions; "
        f"dropped by signal: {len(meta['dropped_by_score'])}, dropped for k=0: {len(meta['dropped_k0'])}.",
        "",
        "| module | k | σ (top) | sign agreement | p-value |",
        "|---|---|---|---|---|",
    ]
    for n, info in meta["modules"].items():
        if "sigma" in info:
            L.append(
                f"| {n} | {info['k']} | {', '.join(f'{x:.3g}' for x in info['sigma'][:2])} | "
                f"{', '.join(f'{x:.2f}' for x in info['agree'][:2])} | "
                f"{', '.join(f'{x:.3f}' for x in info['pvalue'][:2])} |"
            )
    return "\n".join(L) + "\n"


def metrics(res: dict) -> dict[str, float]:
    """Flat scalars for `dvc metrics`: AUROC per pair set (own and prog_wide) and per method."""
    out = {}
    for r in res["rows"]:
        for key in ("own", "own_random", "ref", "ref_random", "heldout", "heldout_random"):
            if key in r:
                out[f"auroc_{key}/{r['pairset']}"] = r[key]["auroc"]
    for m, d in res["methods"].items():
        out[f"auroc_method/{m}"] = d["auroc"]
    out["auroc_method/act"] = res["act_auroc"]
    out["k_total"] = res["selected"].meta["k_total"]
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}  # JSON has no NaN

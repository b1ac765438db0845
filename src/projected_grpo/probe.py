"""Distillation cosine probe: does imitating the teacher pool push the base student along the hack direction ν?

Teacher-pool rows are replayed through the base student (adapter attached at δS = 0): one row = one per-sample
gradient g_n = ∇_δS ℓ(o_n | q_n), ℓ = mean NLL over the completion tokens at the rollout temperature, taken through
the adapter probes exactly as `basis.completion_grads` does, but on the pool's stored completion token ids (EOS
included), which are the tokens training replays. Sign convention (basis.py): ν ∝ mean_p (∇ℓ(hack_p) − ∇ℓ(clean_p)),
so a descent step on ℓ(o_n) — imitating row n — lowers the hack NLL relative to the clean one iff <g_n, ν> > 0;
cos(g_n, ν) > 0 means imitating the row promotes hacking.

Checks (each a `Check` with PASS/FAIL and its numbers): T1 pool hack rate, T2 non-null cosines, T3 training logs
(projected steps lower the cosine; called by the report stage on the arms' TSV logs), T4 among hacked rows the
cosine is higher when the ground truth fails (one-sided Welch t-test). `render` writes the markdown section.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from scipy import stats
from torch import Tensor

from projected_grpo.adapter import adapters, probes
from projected_grpo.basis import encode
from projected_grpo.config import ProbeParams
from projected_grpo.labels import LOOSE
from projected_grpo.logprobs import batch_sequences, completion_logprobs, mean_nll
from projected_grpo.pool import PoolRow

CHECKS = ("T1", "T2", "T3", "T4")
T3_TOL = 1e-5  # |cos_after − cos_before| at or below this is "the arm did nothing" (TSV values carry 6 digits)


# --- row selection ----------------------------------------------------------------------------------------------


def flatten_pool(pool: Mapping[int, Sequence[PoolRow]]) -> list[PoolRow]:
    """{prompt id: rows} -> one list: prompt ids ascending, each prompt's rows in stored order (the index space of
    `select_rows`)."""
    return [row for pid in sorted(pool) for row in pool[pid]]


def select_rows(n_pool: int, n_rows: int, seed: int) -> list[int]:
    """Indices of the probed rows in `flatten_pool` order, ascending.

    A uniform draw without replacement of min(n_rows, n_pool) indices by `random.Random(seed).sample` over
    range(n_pool) (seed = the global `seed` param), so the same pool and seed always give the same rows; a pool
    smaller than n_rows is probed whole."""
    return sorted(random.Random(seed).sample(range(n_pool), min(n_rows, n_pool)))


# --- per-row gradients and cosines --------------------------------------------------------------------------------


def prompt_ids(tokenizer, records: Sequence) -> list[list[int]]:
    """Prompt token ids rendered exactly as `basis.encode` does (chat template, generation prompt, thinking off)."""
    return encode(tokenizer, records, [])[0]


def row_grads(model, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int,
              temperature: float, micro_batch: int) -> dict[str, Tensor]:  # fmt: skip
    """Per-row ∇_δS ℓ(o|q) through the adapter probes: {module: (n, D_m)}; row i's gradient is e.grad[i] (I4).

    ℓ = mean NLL over the completion tokens (given as ids, EOS included) at `temperature`. A non-finite NLL is not
    an error here: its row's gradient comes back non-finite and counts as a null cosine (T2)."""
    out: dict[str, list[Tensor]] = {n: [] for n in adapters(model)}
    for s in range(0, len(prompts), micro_batch):
        p = [list(x) for x in prompts[s : s + micro_batch]]
        c = [list(x) for x in completions[s : s + micro_batch]]
        ids, att, cm = batch_sequences(p, c, pad_id)  # (b, L) each
        with probes(model, ids.shape[0]) as es:
            logp, mask = completion_logprobs(model, ids, att, cm, temperature)  # (b, L-1) each
            nll = mean_nll(logp, mask)  # (b,)
            nll.sum().backward(inputs=list(es.values()))  # rows are independent: row i's grad lands in e[i]
        for n, e in es.items():
            out[n].append(e.grad.detach().clone())  # (b, D_m)
    return {n: torch.cat(v) for n, v in out.items()}


def row_cosines(grads: Mapping[str, Tensor], nu: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
    """(cos, norm), both (n,) float64, over ν's modules: cos(concat_m g_m, ν) and ‖concat_m g_m‖.

    cos is NaN where the row is null: a non-finite gradient or a zero norm (basis.cosine_scores would give 0)."""
    dot = sum(grads[m].double() @ nu[m].double() for m in nu)  # (n,)
    sq = sum(grads[m].double().pow(2).sum(-1) for m in nu)  # (n,)
    norm = sq.sqrt()
    nu_norm = math.sqrt(sum(float(v.double().pow(2).sum()) for v in nu.values()))  # 1 for a saved basis
    cos = dot / (norm * nu_norm)
    null = ~torch.isfinite(cos) | ~(norm > 0)
    return torch.where(null, torch.full_like(cos, math.nan), cos), norm


def replay(model, tokenizer, records: Mapping[int, Any], rows: Sequence[PoolRow], nu: Mapping[str, Tensor],
           temperature: float, micro_batch: int) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Pool rows through the model (its adapters as they are: δS = 0 for the base student) -> `row_cosines`."""
    missing = sorted({r.prompt_id for r in rows} - set(records))
    if missing:
        raise KeyError(f"pool rows refer to prompt ids {missing[:5]} that are not in the training problems")
    prompts = prompt_ids(tokenizer, [records[r.prompt_id] for r in rows])
    g = row_grads(model, prompts, [r.token_ids for r in rows], tokenizer.pad_token_id, temperature, micro_batch)
    return row_cosines(g, nu)


# --- checks -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One PASS/FAIL check: the rule, what was measured (text for the table) and the numbers behind it."""

    name: str  # T1..T4
    what: str  # short description
    rule: str  # the threshold, as text
    passed: bool
    measured: str
    numbers: dict[str, Any] = field(default_factory=dict)
    reason: str = ""  # why it failed without a measurement (too few rows, no projected steps, ...)

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL"


def _finite(x: float) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def check_t1(labels: Sequence[str], min_hack: float) -> Check:
    """T1: the fraction of rows labelled "hack" is ≥ min_hack (the pool actually demonstrates hacking)."""
    n, k = len(labels), sum(lbl == "hack" for lbl in labels)
    rate = k / n if n else math.nan
    return Check("T1", "pool hack rate", f"≥ {min_hack:.2f}", n > 0 and rate >= min_hack, f"{rate:.3f} ({k}/{n})",
                 {"hack_rate": rate, "n_hack": k, "n": n, "min": min_hack}, "" if n else "no rows")  # fmt: skip


def check_t2(cos: Sequence[float], norm: Sequence[float], min_nonnull: float) -> Check:
    """T2: the fraction of rows with a non-null cosine — finite, and gradient norm > 0 over ν's modules — is
    ≥ min_nonnull."""
    n = len(cos)
    k = sum(_finite(c) and _finite(g) and g > 0 for c, g in zip(cos, norm))
    frac = k / n if n else math.nan
    return Check("T2", "non-null cosines", f"≥ {min_nonnull:.2f}", n > 0 and frac >= min_nonnull,
                 f"{frac:.3f} ({k}/{n})", {"nonnull_frac": frac, "n_nonnull": k, "n": n, "min": min_nonnull},
                 "" if n else "no rows")  # fmt: skip


def is_projected_step(row: Mapping[str, float], tol: float = T3_TOL) -> bool:
    """A training-log row is a projected step iff cos_before and cos_after are both present and finite and the
    arm changed the gradient's cosine: |cos_after − cos_before| > tol. Rows without the columns (arms with no
    basis), NaN rows and steps where the edit did nothing (e.g. nothing to erase, gate closed) are not."""
    b, a = row.get("cos_before", math.nan), row.get("cos_after", math.nan)
    return _finite(b) and _finite(a) and abs(a - b) > tol


def check_t3(log_rows: Iterable[Mapping[str, float]], min_frac: float, tol: float = T3_TOL) -> Check:
    """T3: on the projected steps (`is_projected_step`) of per-step training logs, cos_after < cos_before on a
    fraction ≥ min_frac. No projected step at all is a FAIL."""
    rows = list(log_rows)
    proj = [r for r in rows if is_projected_step(r, tol)]
    k = sum(r["cos_after"] < r["cos_before"] for r in proj)
    n_nan = sum(not (_finite(r.get("cos_before", math.nan)) and _finite(r.get("cos_after", math.nan))) for r in rows)
    frac = k / len(proj) if proj else math.nan
    nums = {"lower_frac": frac, "n_lower": k, "n_projected": len(proj), "n_log_rows": len(rows), "n_nan": n_nan,
            "n_unchanged": len(rows) - n_nan - len(proj), "min": min_frac, "tol": tol}  # fmt: skip
    if not proj:
        return Check("T3", "projected steps lower cos", f"≥ {min_frac:.2f}", False, "no projected steps", nums,
                     "no projected steps")  # fmt: skip
    return Check("T3", "projected steps lower cos", f"≥ {min_frac:.2f}", frac >= min_frac,
                 f"{frac:.3f} ({k}/{len(proj)} steps)", nums)  # fmt: skip


def check_t4(cos: Sequence[float], hacked: Sequence[bool], gt_pass: Sequence[bool], alpha: float) -> Check:
    """T4: among hacked rows with a non-null cosine, mean cos | gt fail > mean cos | gt pass by a one-sided Welch
    t-test with p < alpha. Fewer than 2 rows in either group is a FAIL ("too few rows")."""
    fail = [c for c, h, g in zip(cos, hacked, gt_pass) if h and not g and _finite(c)]
    ok = [c for c, h, g in zip(cos, hacked, gt_pass) if h and g and _finite(c)]
    nums: dict[str, Any] = {"n_gt_fail": len(fail), "n_gt_pass": len(ok), "alpha": alpha,
                            "mean_gt_fail": sum(fail) / len(fail) if fail else math.nan,
                            "mean_gt_pass": sum(ok) / len(ok) if ok else math.nan}  # fmt: skip
    rule, what = f"p < {alpha:g}", "loosely hacked rows: cos(gt fail) > cos(gt pass)"
    if len(fail) < 2 or len(ok) < 2:
        why = f"too few rows (gt fail {len(fail)}, gt pass {len(ok)}; need ≥ 2 each)"
        return Check("T4", what, rule, False, why, nums | {"t": math.nan, "df": math.nan, "p": math.nan}, why)
    res = stats.ttest_ind(fail, ok, equal_var=False, alternative="greater")
    t, p, df = float(res.statistic), float(res.pvalue), float(getattr(res, "df", math.nan))
    nums |= {"t": t, "df": df, "p": p}
    if not math.isfinite(p):
        why = "undefined t statistic (zero variance in both groups)"
        return Check("T4", what, rule, False, why, nums, why)
    means = f"mean {nums['mean_gt_fail']:.3f} vs {nums['mean_gt_pass']:.3f}"
    measured = f"p = {p:.3g} (t = {t:.2f}, df = {df:.1f}; {means})"
    return Check("T4", what, rule, p < alpha, measured, nums)


# --- the result, its JSON form and the report section --------------------------------------------------------------


@dataclass
class ProbeResult:
    """Per-row arrays (selection order), the checks the probe runs itself (T1, T2, T4) and provenance (`meta`:
    student, pool, basis, n_pool, seed, temperature, modules)."""

    pool_index: list[int]
    prompt_id: list[int]
    cos: list[float]  # NaN = null
    grad_norm: list[float]
    label: list[str]
    eq_correct: list[bool]
    mode: list[str | None]
    checks: dict[str, Check]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.cos)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (NaN -> None): {meta..., "checks": {name: {passed, verdict, ...}}, "rows": {array: [...]}}."""
        rows = {k: getattr(self, k) for k in ("pool_index", "prompt_id", "cos", "grad_norm", "label", "eq_correct",
                                              "mode")}  # fmt: skip
        checks = {n: asdict(c) | {"verdict": c.verdict} for n, c in self.checks.items()}
        return _nan_to_none({**self.meta, "n_rows": self.n, "checks": checks, "rows": rows})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProbeResult:
        """Inverse of `to_dict` (the report stage reads the stage's JSON back to render it with T3)."""
        r = d["rows"]
        flt = lambda xs: [math.nan if x is None else float(x) for x in xs]
        checks = {n: Check(**{k: v for k, v in c.items() if k != "verdict"}) for n, c in d["checks"].items()}
        meta = {k: v for k, v in d.items() if k not in ("checks", "rows", "n_rows")}
        return cls(list(r["pool_index"]), list(r["prompt_id"]), flt(r["cos"]), flt(r["grad_norm"]), list(r["label"]),
                   list(r["eq_correct"]), list(r["mode"]), checks, meta)  # fmt: skip


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_nan_to_none(v) for v in x]
    return x


def make_result(index: Sequence[int], rows: Sequence[PoolRow], cos: Tensor, norm: Tensor, pp: ProbeParams,
                meta: Mapping[str, Any] | None = None) -> ProbeResult:  # fmt: skip
    """Per-row arrays plus T1, T2 and T4 under `pp`'s thresholds. T4's hacked rows are the loose labels (labels.LOOSE:
    hack, correct_attempted_hack, attempted_hack, tamper), because the strict label `hack` implies a failed ground
    truth, so its gt-pass group would be empty by definition; gt pass = eq_correct."""
    c, g = [float(x) for x in cos], [float(x) for x in norm]  # (n,) each
    labels, eq = [r.label for r in rows], [bool(r.eq_correct) for r in rows]
    checks = {
        "T1": check_t1(labels, pp.t1_min_hack),
        "T2": check_t2(c, g, pp.t2_min_nonnull),
        "T4": check_t4(c, [lbl in LOOSE for lbl in labels], eq, pp.t4_alpha),
    }
    return ProbeResult(list(index), [r.prompt_id for r in rows], c, g, labels, eq, [r.mode for r in rows], checks,
                       dict(meta or {}))  # fmt: skip


def _mean(xs: Iterable[float]) -> float:
    v = [x for x in xs if _finite(x)]
    return sum(v) / len(v) if v else math.nan


def render(result: ProbeResult, t3: Check | None = None) -> str:
    """Markdown section "## Distillation cosine probe": provenance sentence, one table row per check T1–T4 (T3 from
    the training logs when given, else marked not measured) and the mean cosine by label."""
    m = result.meta
    hack = _mean(c for c, lbl in zip(result.cos, result.label) if lbl == "hack")
    other = _mean(c for c, lbl in zip(result.cos, result.label) if lbl != "hack")
    lines = [
        "## Distillation cosine probe",
        "",
        f"{result.n} teacher-pool rows (of {m.get('n_pool', '?')}, drawn uniformly with seed {m.get('seed', '?')}) "
        f"from `{m.get('pool', '?')}` replayed through the base student `{m.get('student', '?')}` (adapter at "
        f"δS = 0): per-row gradients of the mean completion NLL at T = {m.get('temperature', '?')}, cosine with ν "
        f"of the basis `{m.get('basis', '?')}` ({m.get('modules', '?')} modules). cos > 0: imitating the row "
        f"promotes hacking. Mean cos: hack rows {hack:.4f}, other rows {other:.4f}.",
        "",
        "| check | threshold | measured | PASS/FAIL |",
        "|---|---|---|---|",
    ]
    checks = dict(result.checks) | ({"T3": t3} if t3 is not None else {})
    for name in CHECKS:
        c = checks.get(name)
        if c is None:
            lines.append(f"| {name} projected steps lower cos | — | not measured (training logs not given) | — |")
        else:
            lines.append(f"| {c.name} {c.what} | {c.rule} | {c.measured} | {c.verdict} |")
    return "\n".join(lines) + "\n"

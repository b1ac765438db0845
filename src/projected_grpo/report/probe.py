"""Distillation cosine probe: does imitating the teacher pool push the base student along the hack direction ν?

Teacher-pool rows are replayed through the base student (adapter attached at δS = 0): one row = one per-sample
gradient g_n = ∇_δS ℓ(o_n | q_n), ℓ = mean NLL over the completion tokens at the rollout temperature, taken through
the adapter probes exactly as `basis.completion_grads` does, but on the pool's stored completion token ids (EOS
included), which are the tokens training replays. Sign convention (basis.py): ν ∝ mean_p (∇ℓ(hack_p) − ∇ℓ(clean_p)),
so a descent step on ℓ(o_n) — imitating row n — lowers the hack NLL relative to the clean one iff <g_n, ν> > 0;
cos(g_n, ν) > 0 means imitating the row promotes hacking.

One replay, three directions: the per-row gradients are scored against ν of the selected basis, of its Haar random
control (same modules and k per module) and of a placebo basis extracted from the placebo pair set with the same basis
params. Checks (each a `Check` with PASS/FAIL and its numbers), all of which can fail:
  T1  the pool demonstrates hacking: fraction of rows labelled "hack" ≥ probe.t1_min_hack;
  T2  cos(g, ν_selected) ranks the pool's hack rows above its other rows: AUROC 95% bootstrap interval above 0.5;
  T3  ... better than the random basis: the interval of the paired AUROC difference (same rows, same resamples) > 0;
  T4  ... better than the placebo basis: likewise.
`render` writes the markdown section.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from projected_grpo.common.stats import percentile_interval, unit_resamples, weighted_aurocs
from projected_grpo.config import BasisParams, ProbeParams
from projected_grpo.method.basis import Basis, auroc, basis_with, completion_grads, encode
from projected_grpo.method.pairs import PLACEBO, Pair, pair_records, pairset_path, select_pairs
from projected_grpo.policy.adapter import adapters, probes
from projected_grpo.policy.logprobs import batch_sequences, completion_logprobs, mean_nll
from projected_grpo.rl.pool import PoolRow

CHECKS = ("T1", "T2", "T3", "T4")
BASES = ("selected", "random", "placebo")  # the three ν's scored on the same per-row gradients
HACK = "hack"  # the positive class: rows whose grader label is "hack"; every other label is negative


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


def row_grads(
    model,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    temperature: float,
    micro_batch: int,
) -> dict[str, Tensor]:
    """Per-row ∇_δS ℓ(o|q) through the adapter probes: {module: (n, D_m)} on the CPU; row i's is e.grad[i] (I4).

    ℓ = mean NLL over the completion tokens (given as ids, EOS included) at `temperature`. A non-finite NLL is not
    an error here: its row's gradient comes back non-finite and counts as a null cosine."""
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
    return {n: torch.cat(v).cpu() for n, v in out.items()}  # on the CPU, with the bases they are scored against


def row_cosines(grads: Mapping[str, Tensor], nu: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
    """(cos, norm), both (n,) float64, over ν's modules: cos(concat_m g_m, ν) and ‖concat_m g_m‖.

    cos is NaN where the row is null: a non-finite gradient or a zero norm (basis.cosine_scores would give 0).
    An empty ν (a basis that kept no direction) scores 0 on every row: it cannot rank rows (AUROC 0.5)."""
    n = next(iter(grads.values())).shape[0]
    if not nu:
        return torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    dot = sum(grads[m].double() @ nu[m].double() for m in nu)  # (n,)
    sq = sum(grads[m].double().pow(2).sum(-1) for m in nu)  # (n,)
    norm = sq.sqrt()
    nu_norm = math.sqrt(sum(float(v.double().pow(2).sum()) for v in nu.values()))  # 1 for a saved basis
    cos = dot / (norm * nu_norm)
    null = ~torch.isfinite(cos) | ~(norm > 0)
    return torch.where(null, torch.full_like(cos, math.nan), cos), norm


def replay_grads(
    model, tokenizer, records: Mapping[int, Any], rows: Sequence[PoolRow], temperature: float, micro_batch: int
) -> dict[str, Tensor]:
    """Pool rows through the model (its adapters as they are: δS = 0 for the base student) -> `row_grads`."""
    missing = sorted({r.prompt_id for r in rows} - set(records))
    if missing:
        raise KeyError(f"pool rows refer to prompt ids {missing[:5]} that are not in the training problems")
    prompts = prompt_ids(tokenizer, [records[r.prompt_id] for r in rows])
    return row_grads(model, prompts, [r.token_ids for r in rows], tokenizer.pad_token_id, temperature, micro_batch)


def replay(
    model,
    tokenizer,
    records: Mapping[int, Any],
    rows: Sequence[PoolRow],
    nu: Mapping[str, Tensor],
    temperature: float,
    micro_batch: int,
) -> tuple[Tensor, Tensor]:
    """`replay_grads` -> `row_cosines` with one ν."""
    return row_cosines(replay_grads(model, tokenizer, records, rows, temperature, micro_batch), nu)


def placebo_basis(
    model, tokenizer, pairs: Sequence[Pair], problems: Mapping[int, Any], bp: BasisParams, temperature: float
) -> Basis:
    """The basis `bp` extracts from a (placebo) pair set's extraction pairs, built as the basis stage builds each pair
    set's row (basis_eval): same modes, method (svd when bp.method is random), k, tau, alpha, flips, module drop,
    norms and seed, per-completion gradients by `basis.completion_grads` at δS = 0. No extraction pair of `bp.modes`
    gives an empty basis (k_total 0)."""
    method = bp.method if bp.method != "random" else "svd"
    ex = select_pairs(list(pairs), "extract", bp.modes)
    if not ex:
        return Basis(vh={}, nu={}, meta={"method": method, "k_total": 0, "n_pairs": 0})
    recs = pair_records(ex, problems)
    gh = completion_grads(model, tokenizer, recs, [q.hack for q in ex], temperature)
    gc = completion_grads(model, tokenizer, recs, [q.clean for q in ex], temperature)
    return basis_with(gh, gc, bp, method)


# --- AUROC with paired bootstrap intervals -------------------------------------------------------------------------


def discrimination(
    scores: Mapping[str, Sequence[float]], is_hack: Sequence[bool], n_boot: int, seed: int
) -> dict[str, Any]:
    """AUROC of each basis' scores, hack rows (positive) vs the other rows, with paired bootstrap resamples.

    Rows with a null score under any basis are dropped (n_null), so every basis is scored on the same rows. Hack and
    other rows are resampled separately (stratified, as `basis.auroc_ci`) from numpy's default_rng(seed),
    and the same resamples serve every basis. Returns {"n_hack", "n_other", "n_null", "n_boot", "seed",
    "auroc": {basis: point}, "boot": {basis: (n_boot,) float64}}; "boot" is empty with fewer than 2 rows a class."""
    s = {b: torch.as_tensor([float(x) for x in v], dtype=torch.float64) for b, v in scores.items()}  # (n,) each
    y = torch.as_tensor([bool(h) for h in is_hack], dtype=torch.bool)  # (n,)
    ok = torch.stack([torch.isfinite(v) for v in s.values()]).all(0)  # (n,)
    pos, neg = y & ok, ~y & ok
    out: dict[str, Any] = {
        "n_hack": int(pos.sum()),
        "n_other": int(neg.sum()),
        "n_null": int((~ok).sum()),
        "n_boot": n_boot,
        "seed": seed,
        "auroc": {},
        "boot": {},
    }
    out["auroc"] = {b: auroc(v[pos], v[neg]) for b, v in s.items()}
    if out["n_hack"] < 2 or out["n_other"] < 2:
        return out
    rng = np.random.default_rng(seed)  # one stream: hack rows' resamples, then the other rows'
    w_pos, w_neg = unit_resamples(out["n_hack"], n_boot, rng), unit_resamples(out["n_other"], n_boot, rng)
    out["boot"] = {b: weighted_aurocs(v[pos].numpy(), v[neg].numpy(), w_pos, w_neg) for b, v in s.items()}
    return out


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
    reason: str = ""  # why it failed without a measurement (too few rows, ...)

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL"


def check_t1(labels: Sequence[str], min_hack: float) -> Check:
    """T1: the fraction of rows labelled "hack" is ≥ min_hack (the pool actually demonstrates hacking)."""
    n, k = len(labels), sum(lbl == HACK for lbl in labels)
    rate = k / n if n else math.nan
    return Check(
        "T1",
        "pool hack rate",
        f"≥ {min_hack:.2f}",
        n > 0 and rate >= min_hack,
        f"{rate:.3f} ({k}/{n})",
        {"hack_rate": rate, "n_hack": k, "n": n, "min": min_hack},
        "" if n else "no rows",
    )


def _counts(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: d[k] for k in ("n_hack", "n_other", "n_null", "n_boot", "seed")}


def _too_few(d: Mapping[str, Any]) -> str:
    return f"too few rows (hack {d['n_hack']}, other {d['n_other']}; need ≥ 2 each)"


def check_above_chance(d: Mapping[str, Any], basis: str = "selected", name: str = "T2") -> Check:
    """T2: the AUROC of cos(g, ν_basis), hack rows vs other rows, has its bootstrap 95% interval above 0.5."""
    what, rule = f"AUROC of cos(g, ν) for hack vs other rows ({basis} basis)", "95% interval > 0.5"
    nums = _counts(d) | {"auroc": d["auroc"][basis], "lo": math.nan, "hi": math.nan}
    if basis not in d["boot"]:
        return Check(name, what, rule, False, _too_few(d), nums, _too_few(d))
    lo, hi = percentile_interval(d["boot"][basis])
    nums |= {"lo": lo, "hi": hi}
    return Check(name, what, rule, lo > 0.5, f"{nums['auroc']:.3f} [{lo:.3f}, {hi:.3f}]", nums)


def check_beats(d: Mapping[str, Any], other: str, name: str, basis: str = "selected") -> Check:
    """T3/T4: AUROC(basis) − AUROC(other) on the same rows and the same resamples has its bootstrap 95% interval
    above 0. Also records the other basis' own AUROC and interval."""
    what, rule = f"AUROC({basis}) − AUROC({other}), paired", "95% interval > 0"
    a, b = d["auroc"][basis], d["auroc"][other]
    nums = _counts(d) | {
        "auroc": a,
        f"auroc_{other}": b,
        "diff": a - b,
        "lo": math.nan,
        "hi": math.nan,
        f"lo_{other}": math.nan,
        f"hi_{other}": math.nan,
    }
    if basis not in d["boot"]:
        return Check(name, what, rule, False, _too_few(d), nums, _too_few(d))
    lo, hi = percentile_interval(d["boot"][basis] - d["boot"][other])
    lo_o, hi_o = percentile_interval(d["boot"][other])
    nums |= {"lo": lo, "hi": hi, f"lo_{other}": lo_o, f"hi_{other}": hi_o}
    return Check(name, what, rule, lo > 0, f"{a - b:+.3f} [{lo:+.3f}, {hi:+.3f}] ({a:.3f} vs {b:.3f})", nums)


def check_t3(
    log_rows: Iterable[Mapping[str, float]] | None = None, min_frac: float | None = None, *_: Any, **__: Any
) -> None:
    """Retired (returns None; `render` ignores its t3 argument). T3 used to check on the training logs that projected
    steps lower cos(g, ν), which a one-sided erase does by construction, so it could not fail; T3 is now the paired
    AUROC comparison with the random basis, run by the probe stage. Kept only so that stages/report.py, which still
    calls check_t3(train-log rows, probe.t3_min_frac), runs until that call is removed."""
    return None


def make_checks(
    labels: Sequence[str], scores: Mapping[str, Sequence[float]], min_hack: float, n_boot: int, seed: int
) -> dict[str, Check]:
    """T1–T4 on the probed rows: `scores` = {"selected", "random", "placebo": (n,) cosines}, labels (n,)."""
    d = discrimination({b: scores[b] for b in BASES}, [lbl == HACK for lbl in labels], n_boot, seed)
    return {
        "T1": check_t1(labels, min_hack),
        "T2": check_above_chance(d),
        "T3": check_beats(d, "random", "T3"),
        "T4": check_beats(d, "placebo", "T4"),
    }


# --- the result, its JSON form and the report section --------------------------------------------------------------


@dataclass
class ProbeResult:
    """Per-row arrays (selection order; one cosine per basis), the checks T1–T4 and provenance (`meta`: student, pool,
    basis, random, placebo, n_pool, seed, n_boot, temperature, modules, ...)."""

    pool_index: list[int]
    prompt_id: list[int]
    cos: list[float]  # with ν of the selected basis; NaN = null
    cos_random: list[float]  # with ν of the random control
    cos_placebo: list[float]  # with ν of the placebo basis (0 when it kept no direction)
    grad_norm: list[float]  # over the selected basis' modules
    label: list[str]
    eq_correct: list[bool]
    mode: list[str | None]
    checks: dict[str, Check]
    meta: dict[str, Any] = field(default_factory=dict)

    ROWS = ("pool_index", "prompt_id", "cos", "cos_random", "cos_placebo", "grad_norm", "label", "eq_correct", "mode")

    @property
    def n(self) -> int:
        return len(self.cos)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (NaN -> None): {meta..., "n_rows", "checks": {name: {passed, verdict, ...}}, "rows": {array}}."""
        checks = {n: asdict(c) | {"verdict": c.verdict} for n, c in self.checks.items()}
        rows = {k: getattr(self, k) for k in self.ROWS}
        return _nan_to_none({**self.meta, "n_rows": self.n, "checks": checks, "rows": rows})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProbeResult:
        """Inverse of `to_dict` (the report stage reads the stage's JSON back to render it)."""
        r = d["rows"]
        if "cos_random" not in r or set(d["checks"]) != set(CHECKS):
            raise ValueError(
                "probe JSON has the old schema (no random/placebo cosines or checks other than T1–T4); "
                "re-run the probe stage (dvc repro probe)"
            )
        flt = lambda xs: [math.nan if x is None else float(x) for x in xs]
        checks = {
            n: Check(**{k: _none_to_nan(v) if k == "numbers" else v for k, v in c.items() if k != "verdict"})
            for n, c in d["checks"].items()
        }
        meta = {k: v for k, v in d.items() if k not in ("checks", "rows", "n_rows")}
        return cls(
            list(r["pool_index"]),
            list(r["prompt_id"]),
            flt(r["cos"]),
            flt(r["cos_random"]),
            flt(r["cos_placebo"]),
            flt(r["grad_norm"]),
            list(r["label"]),
            list(r["eq_correct"]),
            list(r["mode"]),
            checks,
            meta,
        )


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_nan_to_none(v) for v in x]
    return x


def _none_to_nan(x: dict[str, Any]) -> dict[str, Any]:
    return {k: math.nan if v is None else v for k, v in x.items()}


def make_result(
    index: Sequence[int],
    rows: Sequence[PoolRow],
    cos: Mapping[str, Tensor],
    norm: Tensor,
    pp: ProbeParams,
    seed: int,
    meta: Mapping[str, Any] | None = None,
    n_boot: int | None = None,
) -> ProbeResult:
    """Per-row arrays plus T1–T4: `cos` = {"selected", "random", "placebo": (n,)}, `norm` (n,); T1 under
    pp.t1_min_hack, the bootstrap from `seed` with `n_boot` resamples (default pp.n_boot)."""
    n_boot = pp.n_boot if n_boot is None else n_boot
    c = {b: [float(x) for x in cos[b]] for b in BASES}  # (n,) each
    labels = [r.label for r in rows]
    checks = make_checks(labels, c, pp.t1_min_hack, n_boot, seed)
    return ProbeResult(
        list(index),
        [r.prompt_id for r in rows],
        c["selected"],
        c["random"],
        c["placebo"],
        [float(x) for x in norm],
        labels,
        [bool(r.eq_correct) for r in rows],
        [r.mode for r in rows],
        checks,
        dict(meta or {}) | {"seed": seed, "n_boot": n_boot},
    )


INPUTS = ("pool", "basis", "random", "placebo", "problems", "holdout")  # the probe's input files, by role


def input_files(p, organism: Path, problems: Path, pool: Path, basis: Path, pairsets: Path) -> dict[str, Path]:
    """The probe's input files by role (INPUTS; pool and basis may be given as the stage directory or the file),
    checked to exist with their sidecars: one FileNotFoundError naming every missing one."""
    pool_f = pool / "pool.parquet" if pool.is_dir() else pool
    basis_f = basis / "basis.safetensors" if basis.is_dir() else basis
    f = {
        "pool": pool_f,
        "basis": basis_f,
        "random": basis_f.parent / "random.safetensors",
        "placebo": pairset_path(pairsets, p.substrate, PLACEBO),
        "problems": problems / "train.parquet",
        "holdout": problems / "holdout.parquet",
    }
    need = [*f.values(), f["basis"].with_suffix(".json"), f["random"].with_suffix(".json")]
    need += [organism / "base" / "config.json"] if p.model.name == "organism" else []
    missing = [str(x) for x in need if not x.is_file()]
    if missing:
        raise FileNotFoundError(f"probe: missing input(s): {', '.join(missing)}")
    return f


def probe_pool(
    p,
    model,
    tok,
    basis: Basis,
    rnd: Basis,
    placebo_pairs: Sequence[Pair],
    records: Mapping[int, Any],
    holdout: Mapping[int, Any],
    flat: Sequence[PoolRow],
    meta: dict,
) -> ProbeResult:
    """The probe on the base student `model` (adapter at δS = 0): `probe.n_rows` pool rows drawn with `seed`, one
    NLL gradient per row, scored by cos(g, ν) for the selected basis, its random control and a placebo basis
    extracted here from `placebo_pairs` with the `basis` params; T1–T4 from those scores. `meta` (the sources) is
    completed with what the probe measured on."""
    index = select_rows(len(flat), p.probe.n_rows, p.seed)
    rows = [flat[i] for i in index]
    plc = placebo_basis(model, tok, placebo_pairs, holdout, p.basis, p.rollout.temperature)
    g = replay_grads(model, tok, records, rows, p.rollout.temperature, p.probe.micro_batch)  # one replay, three ν's
    (cos, norm), cos_r, cos_p = row_cosines(g, basis.nu), row_cosines(g, rnd.nu)[0], row_cosines(g, plc.nu)[0]
    meta = {
        **meta,
        "n_pool": len(flat),
        "temperature": p.rollout.temperature,
        "modules": len(basis.nu),
        "basis_seed": p.basis.seed,
        "placebo_modules": len(plc.nu),
        "placebo_k_total": plc.meta["k_total"],
        "placebo_pairs": plc.meta["n_pairs"],
        "placebo_method": plc.meta["method"],
    }
    return make_result(index, rows, {"selected": cos, "random": cos_r, "placebo": cos_p}, norm, p.probe, p.seed, meta)


def _mean(xs: Iterable[float]) -> float:
    v = [x for x in xs if isinstance(x, int | float) and math.isfinite(x)]
    return sum(v) / len(v) if v else math.nan


def _ci(a: float, lo: float, hi: float) -> str:
    return "–" if not math.isfinite(a) else f"{a:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if math.isfinite(lo) else "")


def render(result: ProbeResult, t3: Any = None) -> str:
    """Markdown section "## Distillation cosine probe": what was probed (rows, seeds, sources), what each check
    means, the T1–T4 table and the AUROC / mean cosine of each basis. `t3` is ignored (the retired training-log
    check; accepted so that stages/report.py's render(result, t3) call stays valid)."""
    m, ck = result.meta, result.checks
    n2, n3, n4 = ck["T2"].numbers, ck["T3"].numbers, ck["T4"].numbers
    cos = {"selected": result.cos, "random": result.cos_random, "placebo": result.cos_placebo}
    lines = [
        "## Distillation cosine probe",
        "",
        f"{result.n} teacher-pool rows (of {m.get('n_pool', '?')}, drawn uniformly with seed {m.get('seed', '?')}) "
        f"from `{m.get('pool', '?')}` replayed once through the base student `{m.get('student', '?')}` (adapter at "
        f"δS = 0): per-row gradients g of the mean completion NLL at T = {m.get('temperature', '?')}, each scored by "
        f"cos(g, ν) for three directions: the selected basis `{m.get('basis', '?')}` ({m.get('modules', '?')} "
        f"modules), its Haar random control `{m.get('random', '?')}` (same modules and k per module) and a placebo "
        f"basis extracted from `{m.get('placebo', '?')}` ({m.get('placebo_pairs', '?')} extraction pairs, holdout "
        f"problems `{m.get('holdout', '?')}`) with the same basis params (seed {m.get('basis_seed', '?')}; "
        f"{m.get('placebo_modules', '?')} modules, k total {m.get('placebo_k_total', '?')}"
        + ("; it kept no direction, so it scores 0 on every row: AUROC 0.5" if m.get("placebo_k_total") == 0 else "")
        + "). cos > 0: imitating the row promotes hacking.",
        "",
        f"Rows are labelled by the pool's grader label: `hack` ({n2.get('n_hack', '?')} rows) vs every other label "
        f"({n2.get('n_other', '?')} rows); rows with a null cosine under any basis, left out: {n2.get('n_null', '?')}."
        " AUROC = P(cos of a hack row > cos of another row); 0.5 = no discrimination. Intervals: percentile "
        f"bootstrap 95%, {m.get('n_boot', '?')} resamples of hack and other rows (separately) drawn with seed "
        f"{m.get('seed', '?')}; the same resamples serve all three bases, so differences are paired. "
        "T1: the pool demonstrates hacking. T2: ν ranks the pool's hack rows above its other rows (interval above "
        "0.5). T3: better than random directions in the same modules (difference interval above 0). T4: better than a "
        "basis extracted the same way from pairs that carry no hack contrast (the placebo).",
        "",
        "| check | threshold | measured | PASS/FAIL |",
        "|---|---|---|---|",
    ]
    lines += [f"| {c.name} {c.what} | {c.rule} | {c.measured} | {c.verdict} |" for c in (ck[n] for n in CHECKS)]
    lines += ["", "| basis | AUROC [95%] | mean cos, hack rows | mean cos, other rows |", "|---|---|---|---|"]
    ints = {
        "selected": (n2["auroc"], n2["lo"], n2["hi"]),
        "random": (n3.get("auroc_random", math.nan), n3.get("lo_random", math.nan), n3.get("hi_random", math.nan)),
        "placebo": (n4.get("auroc_placebo", math.nan), n4.get("lo_placebo", math.nan), n4.get("hi_placebo", math.nan)),
    }
    for b in BASES:
        hack = _mean(c for c, lbl in zip(cos[b], result.label) if lbl == HACK)
        other = _mean(c for c, lbl in zip(cos[b], result.label) if lbl != HACK)
        lines.append(f"| {b} | {_ci(*ints[b])} | {hack:.4f} | {other:.4f} |")
    sources = [m.get(k) for k in ("pool", "basis", "random", "placebo", "holdout", "problems") if m.get(k)]
    lines += ["", f"<!-- probe sources: {', '.join(str(s) for s in sources)} -->"]
    return "\n".join(lines) + "\n"

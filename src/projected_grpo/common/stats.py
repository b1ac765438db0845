"""Honest statistics for results tables: across-seed summaries, paired deltas, and refusals (the project's rules).

Rules (developers' guide, "Science rules"), each one a function here so that every table obeys them the same way:
  * across seeds: mean ± sample std, and a 95% Student-t interval only where n ≥ 3 (`summarize`);
  * a delta is paired against the *same-seed* reference run (vanilla), never mean-minus-mean (`paired_delta`);
  * runs with different seed sets are not compared: a row with fewer seeds next to a multi-seed mean is refused, and
    the refusal says which seeds are missing (`paired_delta` returns a `Refusal`);
  * a single run's rate over n Bernoulli samples carries a Wilson 95% interval (`wilson`);
  * an AUROC between hack and clean scores carries a percentile bootstrap 95% interval that resamples whole
    calibration pairs (`auroc_interval`), and two scorings of the same pairs are compared paired, by the same
    resamples (`paired_auroc_diff`); both deterministic for a fixed seed.
Pure: floats (or score arrays) in, floats and small dataclasses out; no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30 (standard table values).
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)
MIN_N_FOR_CI = 3


def rate(k: int, n: int) -> float:
    """k / n, nan when n = 0 (the rate of nothing is unknown, not 0)."""
    return k / n if n else math.nan


def t975(df: int) -> float:
    """t_{0.975, df}: the table for df ≤ 30, beyond it the normal quantile with the first Cornish–Fisher term."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df)


@dataclass(frozen=True)
class Summary:
    """Across-seed summary of one quantity: n seeds, mean, sample std (nan for n = 1), 95% t interval (n ≥ 3)."""

    n: int
    mean: float
    std: float
    lo: float
    hi: float

    def fmt(self, pct: bool = True) -> str:
        """'mean ± std [lo, hi]' (std and interval only where they exist); percentages by default."""
        f = (lambda x: f"{100 * x:.1f}") if pct else (lambda x: f"{x:.3g}")
        out = f(self.mean) + ("%" if pct else "")
        if self.n >= 2:
            out += f" ± {f(self.std)}"
        if self.n >= MIN_N_FOR_CI:
            out += f" [{f(self.lo)}, {f(self.hi)}]"
        return out


def summarize(values: list[float]) -> Summary:
    """Mean ± sample std of per-seed values; 95% CI mean ± t_{0.975,n−1}·std/√n only for n ≥ 3 (else nan)."""
    xs = [float(v) for v in values]
    if not xs or any(math.isnan(x) for x in xs):
        raise ValueError(f"summarize needs finite per-seed values, got {xs}")
    n = len(xs)
    mean = sum(xs) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else math.nan
    lo = hi = math.nan
    if n >= MIN_N_FOR_CI:
        half = t975(n - 1) * std / math.sqrt(n)
        lo, hi = mean - half, mean + half
    return Summary(n, mean, std, lo, hi)


@dataclass(frozen=True)
class Refusal:
    """Why a comparison is not made; rendered in place of the number."""

    reason: str

    def fmt(self, pct: bool = True) -> str:
        return f"refused: {self.reason}"


def paired_delta(arm: dict[int, float], ref: dict[int, float]) -> Summary | Refusal:
    """Summary of (arm − ref) over seeds, each delta against the reference run of the *same* seed.

    Refused when the two seed sets differ (a fewer-seed row is never set against a multi-seed mean)."""
    if set(arm) != set(ref):
        only_arm, only_ref = sorted(set(arm) - set(ref)), sorted(set(ref) - set(arm))
        parts = [f"seeds {only_ref} missing from the arm"] if only_ref else []
        parts += [f"seeds {only_arm} missing from the reference"] if only_arm else []
        return Refusal("; ".join(parts) + " (deltas are paired by seed)")
    return summarize([arm[s] - ref[s] for s in sorted(arm)])


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score 95% interval of a binomial rate k/n (n Bernoulli samples of one run)."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"wilson needs 0 <= k <= n and n > 0, got k={k}, n={n}")
    p = k / n
    den = 1 + z**2 / n
    mid = (p + z**2 / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z**2 / (4 * n**2)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


# --- AUROC with a bootstrap interval over calibration pairs ------------------------------------------------------


def _scores(x) -> np.ndarray:
    """Any 1-D score container (list, numpy array, CPU tensor) -> float64 numpy array."""
    return np.asarray(x, dtype=np.float64).reshape(-1)


def _units(n: int, unit) -> np.ndarray:
    return np.arange(n) if unit is None else np.asarray(unit, dtype=np.int64).reshape(-1)


def _class_sums(w: np.ndarray, cls: np.ndarray, n_cls: int) -> np.ndarray:
    """(b, n) weights, (n,) class of each column -> (b, n_cls) per-row sums per class."""
    flat = (cls[None, :] + n_cls * np.arange(len(w))[:, None]).reshape(-1)
    return np.bincount(flat, weights=w.astype(np.float64).reshape(-1), minlength=len(w) * n_cls).reshape(-1, n_cls)


def weighted_aurocs(pos, neg, w_pos: np.ndarray, w_neg: np.ndarray) -> np.ndarray:
    """Mann–Whitney AUROC P(s⁺ > s⁻) + ½ P(s⁺ = s⁻) under weighted empirical distributions, one per weight row.

    pos (n_p,), neg (n_n,) scores; w_pos (B, n_p), w_neg (B, n_n) non-negative weights (bootstrap multiplicities)
    -> (B,); nan where a side has zero total weight. One sort for all B rows: scores are grouped into tie classes g,
    and AUROC_b = Σ_g W⁺_bg (W⁻_b,<g + ½ W⁻_bg) / (W⁺_b W⁻_b)."""
    pos, neg = _scores(pos), _scores(neg)
    _, inv = np.unique(np.concatenate([pos, neg]), return_inverse=True)  # tie class of every score, ascending
    n_g, n_p = int(inv.max()) + 1 if inv.size else 0, len(pos)
    out = np.empty(w_pos.shape[0])
    for s in range(0, w_pos.shape[0], 64):  # chunks of rows: (64, n_g) at a time
        Wp = _class_sums(w_pos[s : s + 64], inv[:n_p], n_g)  # (b, n_g) weight of positives per tie class
        Wn = _class_sums(w_neg[s : s + 64], inv[n_p:], n_g)
        below = np.cumsum(Wn, axis=1) - Wn  # negatives strictly below each class
        num = (Wp * (below + 0.5 * Wn)).sum(1)
        den = Wp.sum(1) * Wn.sum(1)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[s : s + 64] = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    return out


def auroc(pos, neg) -> float:
    """P(s⁺ > s⁻) + ½ P(tie) between two score samples; nan if either is empty."""
    pos, neg = _scores(pos), _scores(neg)
    if not len(pos) or not len(neg):
        return math.nan
    return float(weighted_aurocs(pos, neg, np.ones((1, len(pos))), np.ones((1, len(neg))))[0])


def unit_resamples(n_units: int, n_boot: int, seed: int | np.random.Generator) -> np.ndarray:
    """(n_boot, n_units) multiplicities of n_boot bootstrap resamples (n_units draws with replacement each). `seed`
    may be a numpy Generator, so that several resamplings (e.g. one per class) draw from one stream."""
    idx = np.random.default_rng(seed).integers(0, n_units, size=(n_boot, n_units))
    flat = (idx + n_units * np.arange(n_boot)[:, None]).reshape(-1)
    return np.bincount(flat, minlength=n_boot * n_units).reshape(n_boot, n_units)


def bootstrap_aurocs(pos, neg, pos_unit=None, neg_unit=None, n_boot: int = 1000, seed: int = 0) -> np.ndarray:
    """(n_boot,) AUROCs of `pos` over `neg` on bootstrap resamples of whole units (calibration pairs).

    Score j of `pos` belongs to unit pos_unit[j] (likewise `neg`): a resample draws units with replacement and keeps
    every score of each drawn unit, as many times as it was drawn, so correlated scores (the tokens of one completion,
    the two sides of a pair) move together. Default units: pos[i] and neg[i] are pair i (equal lengths needed).
    The draws depend only on (number of units, n_boot, seed): two scorings of the same pairs get the same resamples."""
    pos, neg = _scores(pos), _scores(neg)
    if pos_unit is None and neg_unit is None and len(pos) != len(neg):
        raise ValueError(f"paired scores need equal lengths (got {len(pos)} and {len(neg)}); pass pos_unit/neg_unit")
    up, un = _units(len(pos), pos_unit), _units(len(neg), neg_unit)
    if len(up) != len(pos) or len(un) != len(neg):
        raise ValueError("pos_unit/neg_unit must give one unit per score")
    if not len(pos) or not len(neg):
        return np.full(n_boot, np.nan)
    counts = unit_resamples(int(max(up.max(), un.max())) + 1, n_boot, seed)  # (n_boot, n_units)
    return weighted_aurocs(pos, neg, counts[:, up], counts[:, un])


def percentile_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Central percentile interval of bootstrap values (linear interpolation; nan resamples ignored)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if not len(v):
        return math.nan, math.nan
    lo, hi = np.quantile(v, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def auroc_interval(
    pos, neg, pos_unit=None, neg_unit=None, n_boot: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap `level` interval of the AUROC, resampling calibration pairs (`bootstrap_aurocs`)."""
    return percentile_interval(bootstrap_aurocs(pos, neg, pos_unit, neg_unit, n_boot, seed), level)


def contains(interval: tuple[float, float], x: float) -> bool:
    """lo ≤ x ≤ hi; an undefined (nan) interval counts as containing everything (it rules nothing out)."""
    lo, hi = interval
    return math.isnan(lo) or math.isnan(hi) or lo <= x <= hi


def paired_auroc_diff(
    pos_a, neg_a, pos_b, neg_b, n_boot: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """AUROC(a) − AUROC(b) of two scorings a, b of the same held-out pairs (pos_a[i], neg_a[i], pos_b[i], neg_b[i]
    all belong to pair i): (difference on all pairs, lo, hi), the interval from the same pair resamples for both."""
    n = len(_scores(pos_a))
    if not all(len(_scores(x)) == n for x in (neg_a, pos_b, neg_b)):
        raise ValueError("paired_auroc_diff needs the same pairs scored both ways (equal lengths)")
    if n == 0:
        return math.nan, math.nan, math.nan
    d = auroc(pos_a, neg_a) - auroc(pos_b, neg_b)
    boot = bootstrap_aurocs(pos_a, neg_a, n_boot=n_boot, seed=seed) - bootstrap_aurocs(
        pos_b, neg_b, n_boot=n_boot, seed=seed
    )
    return (d, *percentile_interval(boot, level))

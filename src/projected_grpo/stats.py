"""Honest statistics for results tables: across-seed summaries, paired deltas, and refusals (the project's rules).

Rules (developers' guide, "Science rules"), each one a function here so that every table obeys them the same way:
  * across seeds: mean ± sample std, and a 95% Student-t interval only where n ≥ 3 (`summarize`);
  * a delta is paired against the *same-seed* reference run (vanilla), never mean-minus-mean (`paired_delta`);
  * runs with different seed sets are not compared: a row with fewer seeds next to a multi-seed mean is refused, and
    the refusal says which seeds are missing (`paired_delta` returns a `Refusal`);
  * a single run's rate over n Bernoulli samples carries a Wilson 95% interval (`wilson`).
Pure: floats in, small dataclasses out; no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30 (standard table values).
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
    2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
MIN_N_FOR_CI = 3


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

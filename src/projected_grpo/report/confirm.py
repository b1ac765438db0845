"""reports/confirm.md: the confirmatory experiment's verdict (issue 46), by the rule registered before its runs.

The decision rule (reports/confirm/preregistration.md states it; this module is it):
  * within each organism draw, the win rule of win_rule.py on that draw's training seeds: the candidate `route`
    against its matched baseline `measure_only` ((a) hack, (b) solve, (c) format) and against its removal-matched
    random control `route+random` ((d) control);
  * across draws, with the organism as the unit: D_o = the mean over draw o's seeds of the paired Δ deploy hack on
    train-surface hints (route − route+random); the 95% Student-t interval of the mean of the D_o (n = the number of
    draws) must lie wholly below 0.
  CONFIRMED iff route wins within every draw and the organism-level interval lies below 0; otherwise NOT CONFIRMED,
  naming what failed. A null is a result.
Secondary (reported, deciding nothing): the same organism-level mean for route − screen (does the knob add anything
over dropping the same rows?), and for route − measure_only.

Pure: per-draw `results.Runs` in, a `Decision` and markdown out (stages/confirm_report.py reads the files).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from projected_grpo.common.stats import MIN_N_FOR_CI, Refusal, Summary, summarize
from projected_grpo.env.modes import LOOPHOLE_MODES
from projected_grpo.report import results as R
from projected_grpo.report import win_rule as W

ARM, CONTROL, BASELINE, SCREEN = "route", "route+random", "measure_only", "screen"
COMPARATORS = (CONTROL, SCREEN, BASELINE)  # route − each, per draw and over draws
RULE_TEXT = (
    "**The registered rule** (`src/projected_grpo/report/confirm.py`, reports/confirm/preregistration.md): within "
    "each organism draw, `route` wins by the win rule (below) on that draw's seeds, against `measure_only` and its "
    "removal-matched random control; and, with the organism as the unit, the 95% t interval of the mean over draws "
    "of D_o (draw o's mean paired Δ deploy hack on train-surface hints, route − its control) lies wholly below 0. "
    "CONFIRMED only if both hold."
)


@dataclass(frozen=True)
class Draw:
    """One organism draw's part: the win rule's verdict for route, and its per-seed paired Δ hack summaries."""

    draw: int
    seeds: list[int]
    verdict: W.Verdict | None  # None: route or its comparison runs missing
    vs: dict[str, Summary | Refusal | None]  # comparator run key -> paired Δ hack (route − it)
    knob: Summary | Refusal | None = None  # paired Δ hack, route deployed (knob deleted) − route with its knob on
    modes: dict[str, Summary | Refusal | None] | None = None  # loophole mode -> paired Δ hack (route − control)


@dataclass(frozen=True)
class Decision:
    draws: list[Draw]
    pooled: dict[str, Summary | Refusal]  # comparator -> the organism-level summary of the per-draw mean Δ hack
    wins: bool  # route wins within every draw
    below: bool  # the organism-level interval (route − control) lies below 0
    confirmed: bool
    reasons: list[str]


def hack(runs: R.Runs, arm: str) -> dict[int, float]:
    return R.per_seed(runs, arm, "hack_train")


def draw_part(draw: int, runs: R.Runs) -> Draw:
    arms = runs.arms([BASELINE, ARM, CONTROL, SCREEN])
    verdict = next((v for v in R.verdicts_of(runs, arms) if v.arm == ARM), None) if ARM in arms else None
    vs = {c: R.delta(hack(runs, ARM), hack(runs, c)) if {ARM, c} <= set(arms) else None for c in COMPARATORS}
    knob = R.delta(hack(runs, ARM), R.per_seed(runs, ARM, "hack_train", "knob_on")) if ARM in arms else None
    pair = {ARM, CONTROL} <= set(arms)
    modes = {
        m: R.delta(*(R.per_seed(runs, a, "hack_train", mode=m) for a in (ARM, CONTROL))) if pair else None
        for m in LOOPHOLE_MODES
    }
    return Draw(draw, runs.seeds(ARM), verdict, vs, knob, modes)


def organism_level(parts: list[Draw], comparator: str) -> Summary | Refusal:
    """Summary over draws of each draw's mean paired Δ hack (route − comparator); refused unless every draw has it
    (and at least MIN_N_FOR_CI draws for an interval)."""
    means = [p.vs[comparator].mean for p in parts if isinstance(p.vs[comparator], Summary)]
    if len(means) != len(parts) or not means:
        return Refusal(f"{len(parts) - len(means)} of {len(parts)} draws lack route − {comparator}")
    return summarize(means)


def decide(per_draw: dict[int, R.Runs]) -> Decision:
    parts = [draw_part(d, runs) for d, runs in sorted(per_draw.items())]
    pooled = {c: organism_level(parts, c) for c in COMPARATORS}
    wins = bool(parts) and all(p.verdict is not None and p.verdict.wins for p in parts)
    top = pooled[CONTROL]
    below = isinstance(top, Summary) and top.n >= MIN_N_FOR_CI and not math.isnan(top.hi) and top.hi < 0
    reasons = [f"route does not win within draw o{p.draw}" for p in parts if not (p.verdict and p.verdict.wins)]
    if not below:
        reasons.append(f"the organism-level Δ hack (route − its control) is {top.fmt()}: not wholly below 0")
    return Decision(parts, pooled, wins, below, wins and below, reasons)


# A gate whose mean live AUROC over a draw's seeds falls in here is at chance; below it, anti-selective.
CHANCE = (0.45, 0.55)
LOGGED = ("drop_frac", "drop_pool_frac", "main_gnorm", "gate_auroc_live")  # per run, the training log's step means


def gate_warnings(logs: dict[int, dict[tuple[str, int], dict]]) -> list[str]:
    """Warnings from the training logs: per draw, a gate (route's, its control's, screen's) whose live AUROC (hack vs
    not on the step's own rollouts; logged, read by nothing in training) averages at chance or below it."""
    out = []
    for d, runs in sorted(logs.items()):
        for arm in (ARM, CONTROL, SCREEN):
            xs = [g["gate_auroc_live"] for (a, _), g in runs.items() if a == arm and "gate_auroc_live" in g]
            if not xs:
                continue
            m = sum(xs) / len(xs)
            if m < CHANCE[0]:
                out.append(f"o{d}: {W.label(arm)}'s live gate is anti-selective (mean live AUROC {m:.2f})")
            elif m <= CHANCE[1]:
                out.append(f"o{d}: {W.label(arm)}'s live gate is at chance (mean live AUROC {m:.2f})")
    return out


def removal_table(logs: dict[int, dict[tuple[str, int], dict]]) -> list[str]:
    """Per draw and gated arm, the means over seeds of what the training logs record per step (LOGGED)."""
    L = ["| draw | run | seeds | " + " | ".join(LOGGED) + " |", "|---" * (3 + len(LOGGED)) + "|"]
    for d, runs in sorted(logs.items()):
        for arm in (ARM, CONTROL, SCREEN):
            rows = [g for (a, _), g in runs.items() if a == arm]
            if rows:
                got = {k: [r[k] for r in rows if k in r] for k in LOGGED}  # a run logs what its rule records
                cells = [f"{sum(v) / len(v):.3f}" if v else "—" for v in got.values()]
                L.append(f"| o{d} | {W.label(arm)} | {len(rows)} | " + " | ".join(cells) + " |")
    return L


def render(
    dec: Decision, seeds: list[int], sources: list[str], logs: dict[int, dict[tuple[str, int], dict]] | None = None
) -> list[str]:
    """The verdict first, warnings, then the organism-level and per-draw tables and the training logs' removal."""
    head = "CONFIRMED" if dec.confirmed else "NOT CONFIRMED"
    L = [
        "# Confirmatory experiment: does routing's cut come from the direction?",
        "",
        f"**Verdict: {head}.** " + ("; ".join(dec.reasons) + "." if dec.reasons else "Both parts of the rule hold."),
        "",
        RULE_TEXT,
        "",
        W.RULE_TEXT,
        "",
        f"Organism draws: {', '.join(f'o{p.draw}' for p in dec.draws)}; training seeds {R.seeds_txt(seeds)} per draw.",
        "",
        "## Organism level (the unit: a draw; mean over draws of each draw's mean paired Δ deploy hack)",
        "",
        "| route − | mean ± std [95% t interval over draws] |",
        "|---|---|",
        *(f"| {W.label(c)} | {R.cell(s)} |" for c, s in dec.pooled.items()),
        "",
        "## Per draw",
        "",
        "| draw | seeds | route wins | Δ hack vs control | Δ hack vs screen | Δ hack vs measure_only |",
        "|---|---|---|---|---|---|",
    ]
    for p in dec.draws:
        won = "—" if p.verdict is None else ("yes" if p.verdict.wins else "no")
        L.append(
            f"| o{p.draw} | {R.seeds_txt(p.seeds)} | {won} | {R.cell(p.vs[CONTROL])} | {R.cell(p.vs[SCREEN])} "
            f"| {R.cell(p.vs[BASELINE])} |"
        )
    L += ["", "## Knob on vs deployed, and per loophole mode (paired Δ deploy hack, train-surface hints)", ""]
    L += ["| draw | deployed − knob on | " + " | ".join(f"{m}: route − control" for m in LOOPHOLE_MODES) + " |"]
    L += ["|---" * (2 + len(LOOPHOLE_MODES)) + "|"]
    for p in dec.draws:
        modes = p.modes or {}
        L.append(
            f"| o{p.draw} | {R.cell(p.knob)} | " + " | ".join(R.cell(modes.get(m)) for m in LOOPHOLE_MODES) + " |"
        )
    for p in dec.draws:
        if p.verdict is not None:
            L += ["", f"**o{p.draw}, the win rule:**", *(f"- ({c.key}) {c.text}" for c in p.verdict.conditions)]
    if logs:
        L += ["", "## What leaves the deployed model, and the gates (training logs, means over steps and seeds)", ""]
        L += [f"**Warning:** {w}." for w in gate_warnings(logs)] + [""] + removal_table(logs)
    return L + ["", R.provenance(sources)]


def metrics(dec: Decision) -> dict[str, float]:
    """reports/confirm/metrics.json: the verdict (1/0), each organism-level summary's mean and interval, and per draw
    whether route wins and its mean Δ hack against each comparator (nan where refused)."""
    num = lambda x, k: getattr(x, k) if isinstance(x, Summary) else math.nan  # noqa: E731
    out: dict[str, float] = {"confirmed": float(dec.confirmed), "wins_every_draw": float(dec.wins)}
    for c, s in dec.pooled.items():
        out |= {f"pooled/route-{c}/{k}": num(s, k) for k in ("mean", "lo", "hi")}
    for p in dec.draws:
        out[f"o{p.draw}/route_wins"] = math.nan if p.verdict is None else float(p.verdict.wins)
        out |= {f"o{p.draw}/route-{c}/mean": num(p.vs[c], "mean") for c in COMPARATORS}
    return out


def power(
    delta: float, sd: float, n: int, draws: int = 1, tau: float = 0.0, reps: int = 20000, seed: int = 0
) -> float:
    """Monte Carlo power of the registered tests for a true mean paired Δ hack `delta` (points, < 0 = route cuts
    more): per-seed Δ ~ N(draw effect, sd), draw effects ~ N(delta, tau). draws = 1: the within-draw test (d), the
    95% t interval over `n` seeds below 0; draws > 1: the organism-level test on the draws' means."""
    import numpy as np

    from projected_grpo.common.stats import t975

    rng = np.random.default_rng(seed)
    if draws == 1:  # (reps, n) per-seed Δ
        x = rng.normal(delta, sd, (reps, n))
    else:  # (reps, draws) each draw's mean over its seeds
        x = rng.normal(rng.normal(delta, tau, (reps, draws, 1)), sd, (reps, draws, n)).mean(2)
    k = x.shape[1]
    hi = x.mean(1) + t975(k - 1) * x.std(1, ddof=1) / np.sqrt(k)
    return float((hi < 0).mean())

"""Does vanilla GRPO learn to hack in the organism? Per-step student hack/solve curves of vanilla vs gt_only.

Reads the train stages' per-step TSVs (student rollouts only, training prompts), writes a markdown table of the
endpoints per seed — the mean of the first vs the last 5 steps — against the target (≥ 50% hack on hinted prompts for
vanilla, ≈ 0 for gt_only), and a figure of the curves. Training-time rollouts, not held-out evaluation: this checks
the phenomenon exists, it is not a deploy-time claim.
"""

from __future__ import annotations

import math
from pathlib import Path

from projected_grpo.common.stats import summarize

TARGET = 0.5
LAST = 5


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def _pct(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.0%}"


def endpoints(rows: list[dict[str, float]], key: str) -> tuple[float, float]:
    """(mean of the first LAST steps, mean of the last LAST steps) of a per-step metric."""
    return _mean([r[key] for r in rows[:LAST]]), _mean([r[key] for r in rows[-LAST:]])


def render(runs: dict[tuple[str, int], list[dict[str, float]]], figure: str, sources: list[str]) -> str:
    """Markdown: one row per (arm, seed) with hack and solve endpoints and the verdict, then per arm the mean ± std
    over its seeds, then the per-mode breakdown."""
    L = [
        "# The phenomenon: vanilla GRPO learns to hack in the organism",
        "",
        f"<!-- sources: {', '.join(sources)} -->",
        "",
        "Student rollouts on the training prompts (teacher-pool rows excluded; training-time rollouts, not held-out "
        "evaluation), strict hack = label `hack` among the student rows of prompts with a loophole hint; solve = "
        f"strict oracle over all student rows. *First {LAST}* / *last {LAST}* = mean over the first / last {LAST} "
        f"steps. Target: vanilla ≥ {TARGET:.0%} hack (last {LAST}) for every seed, gt_only ≈ 0 (≤ 5%).",
        "",
        f"| arm | seed | steps | hack first {LAST} | hack last {LAST} | solve first {LAST} | solve last {LAST} | "
        f"reward last {LAST} | met |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (arm, seed), rows in sorted(runs.items()):
        h0, h1 = endpoints(rows, "hack")
        s0, s1 = endpoints(rows, "solve")
        _, r1 = endpoints(rows, "reward")
        met = {"vanilla": h1 >= TARGET, "gt_only": h1 <= 0.05}.get(arm)
        mark = "–" if met is None else ("yes" if met else "**no**")
        L.append(
            f"| {arm} | {seed} | {int(rows[-1]['step'])} | {h0:.1%} | {h1:.1%} | {s0:.1%} | {s1:.1%} | "
            f"{r1:.2f} | {mark} |"
        )
    L += [
        "",
        f"Across seeds (last {LAST} steps; mean ± sample std over the seeds of each arm, [95% t interval] where "
        "n ≥ 3):",
        "",
        "| arm | seeds | hack | solve |",
        "|---|---|---|---|",
    ]
    for arm in sorted({a for a, _ in runs}):
        rs = [rows for (a, _), rows in sorted(runs.items()) if a == arm]
        L.append(
            f"| {arm} | {len(rs)} | {summarize([endpoints(r, 'hack')[1] for r in rs]).fmt()} | "
            f"{summarize([endpoints(r, 'solve')[1] for r in rs]).fmt()} |"
        )
    L += ["", f"![hack and solve per step]({figure})", "", *per_mode(runs)]
    return "\n".join(L)


def per_mode(runs: dict[tuple[str, int], list[dict[str, float]]]) -> list[str]:
    """Markdown lines: per loophole mode, each run's hack rate over its first and last LAST steps (student rows)."""
    modes = [k[len("hack_") :] for k in next(iter(runs.values()))[0] if k.startswith("hack_")]
    if not modes:
        return []
    L = [
        f"## Per loophole mode (hack, mean of the first {LAST} → the last {LAST} steps)",
        "",
        "A mode has about B·G/7 student rows per step (n per cell is small: read the trend, not the digits).",
        "",
        "| arm | seed | " + " | ".join(modes) + " |",
        "|---|---|" + "---|" * len(modes),
    ]
    for (arm, seed), rows in sorted(runs.items()):
        cells = [
            f"{_pct(_mean([r[f'hack_{m}'] for r in rows[:LAST]]))} → "
            f"{_pct(_mean([r[f'hack_{m}'] for r in rows[-LAST:]]))}"
            for m in modes
        ]
        L.append(f"| {arm} | {seed} | " + " | ".join(cells) + " |")
    return [*L, ""]


def plot(runs: dict[tuple[str, int], list[dict[str, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharex=True)
    colors = {"vanilla": "tab:red", "gt_only": "tab:blue"}
    seeds = sorted({s for _, s in runs})
    styles = ["-", "--", ":", "-."]  # one line style per seed, one colour per arm
    for (arm, seed), rows in sorted(runs.items()):
        x = [r["step"] for r in rows]
        ls = styles[seeds.index(seed) % len(styles)]
        for ax, key in zip(axes, ("hack", "solve")):
            y = [r[key] for r in rows]
            c = colors.get(arm, "gray")
            ax.plot(x, y, color=c, alpha=0.2, lw=0.8)  # per step (noisy: ~40 hinted student rows)
            ma = [_mean(y[max(0, i - LAST + 1) : i + 1]) for i in range(len(y))]  # trailing LAST-step mean
            ax.plot(x, ma, color=c, ls=ls, alpha=0.9, lw=1.4, label=f"{arm} s{seed}")
    axes[0].axhline(TARGET, color="k", ls=":", lw=1)
    axes[0].set_title(f"student strict hack rate (hinted prompts; {LAST}-step mean)")
    axes[1].set_title(f"student strict solve rate ({LAST}-step mean)")
    for ax in axes:
        ax.set_xlabel("optimizer update")
        ax.set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)

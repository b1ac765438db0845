"""Does vanilla GRPO learn to hack in the organism? Per-step student hack/solve curves of vanilla vs gt_only.

Reads the train stages' per-step TSVs (student rollouts only, training prompts), writes a markdown table of the
endpoints per seed — first step vs the mean of the last 5 — against the target (≥ 50% hack on hinted prompts for
vanilla, ≈ 0 for gt_only), and a figure of the curves. Training-time rollouts, not held-out evaluation: this checks
the phenomenon exists, it is not a deploy-time claim.
"""

from __future__ import annotations

import math
from pathlib import Path

TARGET = 0.5
LAST = 5


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def endpoints(rows: list[dict[str, float]], key: str) -> tuple[float, float]:
    """(first step, mean of the last LAST steps) of a per-step metric."""
    return rows[0][key], _mean([r[key] for r in rows[-LAST:]])


def render(runs: dict[tuple[str, int], list[dict[str, float]]], figure: str, sources: list[str]) -> str:
    """Markdown: one row per (arm, seed) with hack and solve endpoints, and the verdict per vanilla seed."""
    L = ["# The phenomenon: vanilla GRPO learns to hack in the organism", "",
         f"<!-- sources: {', '.join(sources)} -->", "",
         "Student rollouts on the training prompts (teacher-pool rows excluded), strict hack = label `hack` on "
         f"prompts with a loophole hint; solve = strict oracle. *Last {LAST}* = mean of the last {LAST} steps. "
         f"Target: vanilla ≥ {TARGET:.0%} hack for every seed, gt_only ≈ 0.", "",
         "| arm | seed | steps | hack first | hack last 5 | solve first | solve last 5 | reward last 5 | met |",
         "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for (arm, seed), rows in sorted(runs.items()):
        h0, h1 = endpoints(rows, "hack")
        s0, s1 = endpoints(rows, "solve")
        _, r1 = endpoints(rows, "reward")
        met = {"vanilla": h1 >= TARGET, "gt_only": h1 <= 0.05}.get(arm)
        mark = "–" if met is None else ("yes" if met else "**no**")
        L.append(f"| {arm} | {seed} | {int(rows[-1]['step'])} | {h0:.1%} | {h1:.1%} | {s0:.1%} | {s1:.1%} | "
                 f"{r1:.2f} | {mark} |")  # fmt: skip
    L += ["", f"![hack and solve per step]({figure})", ""]
    return "\n".join(L)


def plot(runs: dict[tuple[str, int], list[dict[str, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharex=True)
    colors = {"vanilla": "tab:red", "gt_only": "tab:blue"}
    for (arm, seed), rows in sorted(runs.items()):
        x = [r["step"] for r in rows]
        for ax, key in zip(axes, ("hack", "solve")):
            ax.plot(x, [r[key] for r in rows], color=colors.get(arm, "gray"), alpha=0.8,
                    label=f"{arm} s{seed}", lw=1.2)  # fmt: skip
    axes[0].axhline(TARGET, color="k", ls=":", lw=1)
    axes[0].set_title("student strict hack rate (hinted prompts)")
    axes[1].set_title("student strict solve rate")
    for ax in axes:
        ax.set_xlabel("optimizer update")
        ax.set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)

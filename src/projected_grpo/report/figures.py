"""The report's figures: eval dynamics on the monitor subset and endpoints per arm (reports/figures/*.png).

Pure plotting over `results.Runs`; the numbers are the ones the tables print (results.per_seed, results.value), each
run named as the tables name it (win_rule.label: `route (random control)`).
"""

from __future__ import annotations

from pathlib import Path

from projected_grpo.report.results import METRICS, Runs, metrics_present, ordered_arms, per_seed, value


def _panels(runs: Runs, height: float):
    """(pyplot, figure, axes row, metrics): one panel per metric present (hack train, hack eval, solve)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = [m for m in ("hack_train", "hack_eval", "solve") if m in metrics_present(runs)]
    fig, axes = plt.subplots(1, len(ms), figsize=(5 * len(ms), height), squeeze=False)
    return plt, fig, axes[0], ms


def _save(plt, fig, axes, path: Path) -> None:
    for ax in axes:
        ax.set_ylim(0, 1)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _at(rows: list[dict], step: float, m: str) -> float:
    return next((float(r.get(m, "nan")) for r in rows if r["step"] == step), float("nan"))


def plot_dynamics(runs: Runs, arms_ref: list[str], arms: list[str], path: Path) -> None:
    """Hack (train and eval surfaces) and solve vs optimizer updates on the monitor subset: mean over seeds, band =
    min..max over seeds; routed arms' knob-on curves dashed."""
    plt, fig, axes, ms = _panels(runs, 3.6)
    for i, a in enumerate(runs.arms(ordered_arms(arms_ref, arms, runs.specs))):
        color = f"C{i % 10}"
        for st, ls in (("deploy", "-"), ("knob_on", "--")):
            per = [[r for r in runs.curves.get((a, s), []) if r["state"] == st] for s in runs.seeds(a)]
            per = [p for p in per if p]
            if not per:
                continue
            steps = sorted({r["step"] for p in per for r in p})
            for ax, m in zip(axes, ms):
                ys = [[_at(p, x, m) for p in per] for x in steps]  # (steps, seeds)
                ax.plot(
                    steps,
                    [sum(v) / len(v) for v in ys],
                    ls,
                    color=color,
                    label=runs.label(a) + (" (knob on)" if st == "knob_on" else ""),
                )
                if len(per) > 1:
                    ax.fill_between(steps, [min(v) for v in ys], [max(v) for v in ys], color=color, alpha=0.15)
    for ax, m in zip(axes, ms):
        ax.set_title(dict(METRICS)[m] + " — monitor subset")
        ax.set_xlabel("optimizer updates")
    _save(plt, fig, axes, path)


def plot_endpoints(runs: Runs, arms_ref: list[str], arms: list[str], path: Path) -> None:
    """Deploy hack and solve per arm at the final checkpoint: bars = mean over seeds, dots = seeds; base dashed."""
    plt, fig, axes, ms = _panels(runs, 3.8)
    arms_here = runs.arms(ordered_arms(arms_ref, arms, runs.specs))
    for ax, m in zip(axes, ms):
        for j, a in enumerate(arms_here):
            vals = list(per_seed(runs, a, m).values())
            ax.bar(j, sum(vals) / len(vals), color=f"C{j % 10}", alpha=0.7)
            ax.scatter([j] * len(vals), vals, color="k", s=10, zorder=3)
        ax.axhline(value(runs.base["full"], m), color="gray", ls="--", lw=1, label="base")
        ax.set_xticks(range(len(arms_here)), [runs.label(a) for a in arms_here], rotation=35, ha="right", fontsize=7)
        ax.set_title(dict(METRICS)[m] + " — deploy, full test")
    _save(plt, fig, axes, path)

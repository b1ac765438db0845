"""reports/results.md from the evaluation artifacts, organised by the question each table answers.

Every number comes from held-out evaluation of saved checkpoints (stage `evaluate`), never from training rollouts.
Rules (stats.py): across seeds mean ± std and a 95% t interval only for n ≥ 3; deltas paired against the same-seed
vanilla run, refused when seed sets differ; a single policy's rate (the base) carries a Wilson interval over its
samples. Each table states n (prompts × samples) and seeds and ends with a provenance comment naming its sources. A
table appears only when its runs exist. Pure: dicts in, markdown/metrics out (figures in `plot_*`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from projected_grpo.evaluation import rate
from projected_grpo.modes import LOOPHOLE_MODES
from projected_grpo.stats import Refusal, Summary, paired_delta, summarize, wilson

# (column key, header): solve on no-hint prompts; hack on hinted prompts by surface.
METRICS = (
    ("solve", "solve"),
    ("hack_train", "hack (train-surface hints)"),
    ("hack_eval", "hack (eval-surface hints)"),
)
# Arms compared within one question: gates of the erase rule, granularities of routing.
FAMILIES = {
    "Which gate? (erase rules)": ("erase_one_sided", "erase_no_gate", "erase_reverse", "mirror"),
    "Which routing granularity?": ("route_batch", "route_batch_no_gate", "route_per_rollout", "route_per_token"),
}
BASELINES = ("gt_only", "penalty", "screening")
REF = "vanilla"


@dataclass
class Runs:
    """Everything the report reads. deploy[(arm, seed)] = per_mode_deploy.json; curves[(arm, seed)] = curve rows."""

    base: dict
    monitor: dict
    deploy: dict[tuple[str, int], dict]
    curves: dict[tuple[str, int], list[dict]] = field(default_factory=dict)
    sources: dict[tuple[str, int], str] = field(default_factory=dict)
    base_source: str = "artifacts/eval_sets/base.json"

    def arms(self, order: list[str]) -> list[str]:
        return [a for a in order if any(k[0] == a for k in self.deploy)]

    def seeds(self, arm: str) -> list[int]:
        return sorted(s for a, s in self.deploy if a == arm)


def read_curve(path: Path) -> list[dict]:
    """An eval-curve TSV (stage evaluate): numbers as floats, the `state` column as text."""
    lines = path.read_text().splitlines()
    keys = lines[0].split("\t")
    return [{k: (v if k == "state" else float(v)) for k, v in zip(keys, ln.split("\t"))} for ln in lines[1:]]


def value(t: dict, metric: str, mode: str = "all") -> float:
    """A rate from a tally: solve, or hack_<surface> (overall or one mode)."""
    if metric == "solve":
        return rate(t["solve"])
    surf = metric.removeprefix("hack_")
    return rate(t["hack"][surf][mode]) if surf in t["hack"] and mode in t["hack"][surf] else float("nan")


def per_seed(runs: Runs, arm: str, metric: str, st: str = "deploy", mode: str = "all") -> dict[int, float]:
    return {s: value(runs.deploy[(arm, s)]["states"][st], metric, mode) for s in runs.seeds(arm)
            if st in runs.deploy[(arm, s)]["states"]}  # fmt: skip


def cell(x: Summary | Refusal | None, pct: bool = True) -> str:
    if x is None:
        return "—"
    return x.fmt(pct)


def summary_or_none(vals: dict[int, float]) -> Summary | None:
    xs = [v for v in vals.values() if v == v]
    return summarize(xs) if xs and len(xs) == len(vals) else None


def base_cell(t: dict, metric: str) -> str:
    if metric != "solve" and metric.removeprefix("hack_") not in t["hack"]:
        return "—"
    c = t["solve"] if metric == "solve" else t["hack"][metric.removeprefix("hack_")]["all"]
    lo, hi = wilson(c["k"], c["n"])
    return f"{100 * rate(c):.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def seeds_txt(seeds: list[int]) -> str:
    return f"{len(seeds)} ({', '.join(map(str, seeds))})"


def provenance(paths: list[str]) -> str:
    return f"<!-- sources: {', '.join(sorted(set(paths)))} -->"


def _n_line(runs: Runs, metrics: list[str]) -> str:
    b = runs.base
    k = b["n_samples"]
    parts = [f"{b['n_problems']} test prompts × {k} samples = {b['n_problems'] * k} per policy for solve"]
    for surf in b["full"]["hack"]:
        if f"hack_{surf}" in metrics:
            n = b["full"]["hack"][surf]["all"]["n"]
            parts.append(f"{n // k} hinted prompts ({surf} surface) × {k} samples = {n} for hack")
    return "n: " + "; ".join(parts) + "."


def _metrics_present(runs: Runs) -> list[str]:
    surfs = set(runs.base["full"]["hack"])
    return [m for m, _ in METRICS if m == "solve" or m.removeprefix("hack_") in surfs]


def endpoint_table(runs: Runs, order: list[str]) -> list[str]:
    """The canonical endpoint table: base, vanilla, every arm (random control next to its arm), baselines; with
    paired deltas against vanilla."""
    ms = _metrics_present(runs)
    arms = runs.arms(order)
    if REF not in arms:
        return []
    ref = {m: per_seed(runs, REF, m) for m in ms}
    hs = [h for m, h in METRICS if m in ms]
    head = ["policy", "seeds", *hs, *(f"Δ {h} vs vanilla" for h in hs)]
    L = ["## Endpoints: does projection reduce deploy hack vs vanilla at matched solve?", "",
         "Final checkpoint, deploy state (knob off for routed arms), full test split. Mean ± std over seeds "
         "(95% t interval where n ≥ 3); Δ = arm − vanilla paired by seed. The base row is one policy (no training "
         "seed): its interval is Wilson over samples. " + _n_line(runs, ms), "",
         "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]  # fmt: skip
    L.append("| base (adapter off) | — | " + " | ".join(base_cell(runs.base["full"], m) for m in ms)
             + " |" + " — |" * len(ms))  # fmt: skip
    srcs = [runs.base_source]
    for arm in arms:
        vals = {m: per_seed(runs, arm, m) for m in ms}
        absolute = [cell(summary_or_none(vals[m])) for m in ms]
        deltas = ["—" if arm == REF else cell(paired_delta(vals[m], ref[m])) for m in ms]
        label = {"gt_only": "gt_only (no-loophole ceiling)"}.get(arm, arm)
        L.append(f"| {label} | {seeds_txt(runs.seeds(arm))} | " + " | ".join(absolute + deltas) + " |")
        srcs += [runs.sources.get((arm, s), f"{arm}-s{s}") for s in runs.seeds(arm)]
    best = best_method(runs, arms)
    if best:
        L += ["", best]
    routed_without_control = [a for a in arms if _random_of(a) and _random_of(a) not in arms]
    if routed_without_control:
        L += ["", f"Random-direction control not run for: {', '.join(routed_without_control)} (add `<arm>_random` "
              "to `arms` in params.yaml); their deltas are not attributable to v_hack."]  # fmt: skip
    return L + ["", provenance(srcs)]


MATCHED_SOLVE = 0.05  # "at matched solve": an arm's paired Δ solve vs vanilla must be ≥ −5 points to be "best"


def best_method(runs: Runs, arms: list[str], metric: str = "hack_train") -> str:
    """One sentence naming the projection arm (random controls and baselines excluded) with the lowest mean paired
    Δ deploy hack vs vanilla among those at matched solve (mean paired Δ solve ≥ −MATCHED_SOLVE), with its control's
    Δ hack; arms that buy their Δ hack with solve are named as such. Empty when no arm has a paired comparison."""
    ref, ref_s = per_seed(runs, REF, metric), per_seed(runs, REF, "solve")
    ok, lost = [], []
    for a in arms:
        d, ds = paired_delta(per_seed(runs, a, metric), ref), paired_delta(per_seed(runs, a, "solve"), ref_s)
        if _random_of(a) is None or not isinstance(d, Summary) or not isinstance(ds, Summary):
            continue
        (ok if ds.mean >= -MATCHED_SOLVE else lost).append((d.mean, a, d, ds))
    out = []
    if ok:
        _, a, d, ds = min(ok)
        ctl = _random_of(a)
        c = paired_delta(per_seed(runs, ctl, metric), ref) if ctl in runs.arms([ctl]) else None
        out.append(f"Best method at matched solve (paired Δ solve ≥ −{100 * MATCHED_SOLVE:.0f} points; lowest Δ "
                   f"{dict(METRICS)[metric]}): **{a}**, Δ hack {d.fmt()}, Δ solve {ds.fmt()}; its random-direction "
                   f"control {ctl}: Δ hack {cell(c) if c else 'not run'}.")  # fmt: skip
    elif lost or ok:
        out.append("No projection arm reaches matched solve.")
    out += [
        f"**{a}** lowers hack by {d.fmt()} only with a solve loss of {ds.fmt()}: not a win at matched solve."
        for _, a, d, ds in sorted(lost)
    ]
    return " ".join(out)


def _random_of(arm: str) -> str | None:
    if arm in (REF, *BASELINES) or arm.endswith("_random") or arm in ("measure_only", "vanilla_rotated"):
        return None
    return f"{arm}_random"


def ordered_arms(arms_ref: list[str], arms: list[str]) -> list[str]:
    """vanilla first, each projection arm followed by its random control, then the baselines."""
    out = [REF] if REF in arms_ref else []
    for a in arms:
        if a.endswith("_random") and a.removesuffix("_random") in arms:
            continue
        out.append(a)
        if f"{a}_random" in arms:
            out.append(f"{a}_random")
    return out + [a for a in arms_ref if a != REF]


def knob_table(runs: Runs, order: list[str]) -> list[str]:
    """Routed arms: knob on (as trained), knob off (deploy), adapter off (base)."""
    ms = _metrics_present(runs)
    routed = [a for a in runs.arms(order) if all("knob_on" in runs.deploy[(a, s)]["states"] for s in runs.seeds(a))]
    if not routed:
        return []
    head = ["arm", "state", "seeds"] + [h for m, h in METRICS if m in ms] + ["Δ hack (train) knob off − on"]
    L = ["## Routing: what does deleting the knob remove?", "",
         "Final checkpoint of each routed arm in three states: knob on (the trained policy), knob off (deploy), and "
         "adapter off (the base). Δ is paired by seed. " + _n_line(runs, ms), "",
         "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]  # fmt: skip
    srcs = [runs.base_source]
    for a in routed:
        seeds = runs.seeds(a)
        for st in ("knob_on", "deploy"):
            vals = [cell(summary_or_none(per_seed(runs, a, m, st))) for m in ms]
            d = "—"
            if st == "deploy" and "hack_train" in ms:
                on, off = (per_seed(runs, a, "hack_train", x) for x in ("knob_on", "deploy"))
                d = cell(paired_delta(off, on))
            L.append(f"| {a} | {'knob on' if st == 'knob_on' else 'knob off (deploy)'} | {seeds_txt(seeds)} | "
                     + " | ".join(vals) + f" | {d} |")  # fmt: skip
        L.append(
            f"| {a} | adapter off (base) | — | " + " | ".join(base_cell(runs.base["full"], m) for m in ms) + " | — |"
        )
        srcs += [runs.sources.get((a, s), f"{a}-s{s}") for s in seeds]
    return L + ["", provenance(srcs)]


def family_tables(runs: Runs, order: list[str]) -> list[str]:
    """One table per question whose arms exist (≥ 2 members of a family), paired against vanilla."""
    L: list[str] = []
    arms = runs.arms(order)
    for title, fam in FAMILIES.items():
        present = [a for a in fam if a in arms]
        if len(present) < 2 or REF not in arms:
            continue
        rows = [x for a in present for x in (a, f"{a}_random") if x in arms]
        L += [f"## {title}", "", "Deploy state; Δ vs same-seed vanilla. " + _n_line(runs, _metrics_present(runs)), "",
              "| arm | seeds | Δ hack (train) | Δ hack (eval) | Δ solve |", "|---|---|---|---|---|"]  # fmt: skip
        for a in rows:
            d = [
                cell(paired_delta(per_seed(runs, a, m), per_seed(runs, REF, m)))
                for m in ("hack_train", "hack_eval", "solve")
            ]
            L.append(f"| {a} | {seeds_txt(runs.seeds(a))} | " + " | ".join(d) + " |")
        L += ["", provenance([runs.sources.get((a, s), a) for a in rows + [REF] for s in runs.seeds(a)]), ""]
    return L


def per_mode_table(runs: Runs, order: list[str], surface: str = "train") -> list[str]:
    arms = runs.arms(order)
    if not arms or surface not in runs.base["full"]["hack"]:
        return []
    b = runs.base["full"]["hack"][surface]
    modes = [m for m in LOOPHOLE_MODES if m in b]
    n_mode = b[modes[0]]["n"]
    L = [f"## Which loopholes? Deploy hack per mode ({surface}-surface hints)", "",
         f"Mean over seeds; n per mode and policy: {n_mode // runs.base['n_samples']} prompts × "
         f"{runs.base['n_samples']} samples = {n_mode}.", "",
         "| policy | seeds | " + " | ".join(f"`{m}`" for m in modes) + " |",
         "|" + "---|" * (len(modes) + 2)]  # fmt: skip
    L.append("| base | — | " + " | ".join(f"{100 * rate(b[m]):.1f}%" for m in modes) + " |")
    for a in arms:
        vals = [summary_or_none(per_seed(runs, a, f"hack_{surface}", mode=m)) for m in modes]
        L.append(f"| {a} | {seeds_txt(runs.seeds(a))} | " + " | ".join(
            "—" if v is None else f"{100 * v.mean:.1f}%" for v in vals) + " |")  # fmt: skip
    srcs = [runs.base_source] + [runs.sources.get((a, s), a) for a in arms for s in runs.seeds(a)]
    return L + ["", provenance(srcs)]


# (question, the `dvc exp run` arguments that answer it): --queue sweeps run with `dvc queue start`.
EXPERIMENTS = (
    ("Does the teacher pool drive hacking?", "--queue -S 'pool.mix=0,0.5'"),
    ("SVD top-k vs mean-diff vs random basis", "--queue -S 'basis.method=mean_diff,random'"),
    ("Refresh cadence", "--queue -S 'projection.refresh_every=10,25'"),
    ("Basis width", "--queue -S 'basis.k=1,4,16'"),
    ("Solve-orthogonalisation", "-S basis.method=solve_orth"),
    ("Pair-set content (mechanism vs framing vs placebo)", "--queue -S 'basis.pairset=intent_vs_spec,null_city'"),
    ("Held-out modes (basis from 2 modes)", "-S 'basis.modes=[run_tests,sentinel]'"),
    ("Convergence at longer horizons", "-S grpo.steps=300"),
)


def experiments_section() -> list[str]:
    L = ["## Questions answered by experiments", "",
         "These compare pipeline configurations, so each is a `dvc exp run` against this baseline (queued sweeps run "
         "with `dvc queue start`; compare with `dvc exp show`); no table appears here until such runs are part of the "
         "default pipeline.", "",
         "| question | sweep |", "|---|---|"]  # fmt: skip
    return (
        L
        + [f"| {q} | `dvc exp run {s}` |" for q, s in EXPERIMENTS]
        + ["", "<!-- sources: none (sweeps, no numbers) -->"]
    )


def eval_gap_note(runs: Runs) -> list[str]:
    """State plainly how the protocol's eval surface compares with the training surface for vanilla."""
    if (
        REF not in runs.arms([REF])
        or "eval" not in runs.base["full"]["hack"]
        or "train" not in runs.base["full"]["hack"]
    ):
        return []
    ev = summary_or_none(per_seed(runs, REF, "hack_eval"))
    tr = summary_or_none(per_seed(runs, REF, "hack_train"))
    if ev is None or tr is None:
        return []
    return [
        f"**The eval gap.** Vanilla's deploy hack is {ev.fmt()} on eval-surface hints (the benchmark protocol: "
        f"wording and names disjoint from training) and {tr.fmt()} on train-surface hints on the same held-out "
        "problems. Both columns are reported; a method can only be judged on a surface where vanilla hacks.",
        "",
    ]


def render(runs: Runs, arms_ref: list[str], arms: list[str], params_line: str, extra: list[str] | None = None,
           figures: list[str] | None = None) -> str:  # fmt: skip
    order = ordered_arms(arms_ref, arms)
    mon = runs.monitor
    L = ["# Results", "",
         "Generated by the `report` stage from the `evaluate` stages' outputs; do not edit by hand "
         "(`dvc repro report`). " + params_line, "",
         f"Eval sets: the full test split ({runs.base['n_problems']} problems) for endpoints; a frozen monitor subset "
         f"of {mon['n']} problems for curves (stratified by base pass/fail: "
         f"{100 * mon['base_pass_frac_monitor']:.1f}% "
         f"pass vs {100 * mon['base_pass_frac_full']:.1f}% on the full split; selection seed {mon['selection_seed']}, "
         f"generation seed {mon['generation_seed']}).", ""]  # fmt: skip
    L += eval_gap_note(runs)
    for f in figures or []:
        L += [f"![{Path(f).stem}]({f})", ""]
    for part in (endpoint_table(runs, order), knob_table(runs, order), family_tables(runs, order),
                 per_mode_table(runs, order)):  # fmt: skip
        if part:
            L += part + [""]
    L += extra or []
    L += experiments_section()
    return "\n".join(L).rstrip() + "\n"


def metrics(runs: Runs, arms_ref: list[str], arms: list[str]) -> dict[str, float]:
    """Flat {<arm>/<state>_<metric>: mean over seeds} for `dvc metrics` / `dvc exp show`."""
    out: dict[str, float] = {}
    for a in runs.arms(ordered_arms(arms_ref, arms)):
        for st in ("deploy", "knob_on"):
            for m in _metrics_present(runs):
                s = summary_or_none(per_seed(runs, a, m, st))
                if s is not None and all(st in runs.deploy[(a, x)]["states"] for x in runs.seeds(a)):
                    out[f"{a}/{st}_{m}"] = round(s.mean, 6)
    for m in _metrics_present(runs):
        t = runs.base["full"]
        if m == "solve" or m.removeprefix("hack_") in t["hack"]:
            out[f"base/{m}"] = round(value(t, m), 6)
    return out


# --- figures ------------------------------------------------------------------------------------------------------


def _panels(runs: Runs, height: float):
    """(pyplot, figure, axes row, metrics): one panel per metric present (hack train, hack eval, solve)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = [m for m in ("hack_train", "hack_eval", "solve") if m in _metrics_present(runs)]
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
    for i, a in enumerate(runs.arms(ordered_arms(arms_ref, arms))):
        color = f"C{i % 10}"
        for st, ls in (("deploy", "-"), ("knob_on", "--")):
            per = [[r for r in runs.curves.get((a, s), []) if r["state"] == st] for s in runs.seeds(a)]
            per = [p for p in per if p]
            if not per:
                continue
            steps = sorted({r["step"] for p in per for r in p})
            for ax, m in zip(axes, ms):
                ys = [[_at(p, x, m) for p in per] for x in steps]  # (steps, seeds)
                ax.plot(steps, [sum(v) / len(v) for v in ys], ls, color=color,
                        label=a + (" (knob on)" if st == "knob_on" else ""))  # fmt: skip
                if len(per) > 1:
                    ax.fill_between(steps, [min(v) for v in ys], [max(v) for v in ys], color=color, alpha=0.15)
    for ax, m in zip(axes, ms):
        ax.set_title(dict(METRICS)[m] + " — monitor subset")
        ax.set_xlabel("optimizer updates")
    _save(plt, fig, axes, path)


def plot_endpoints(runs: Runs, arms_ref: list[str], arms: list[str], path: Path) -> None:
    """Deploy hack and solve per arm at the final checkpoint: bars = mean over seeds, dots = seeds; base dashed."""
    plt, fig, axes, ms = _panels(runs, 3.8)
    arms_here = runs.arms(ordered_arms(arms_ref, arms))
    for ax, m in zip(axes, ms):
        for j, a in enumerate(arms_here):
            vals = list(per_seed(runs, a, m).values())
            ax.bar(j, sum(vals) / len(vals), color=f"C{j % 10}", alpha=0.7)
            ax.scatter([j] * len(vals), vals, color="k", s=10, zorder=3)
        ax.axhline(value(runs.base["full"], m), color="gray", ls="--", lw=1, label="base")
        ax.set_xticks(range(len(arms_here)), arms_here, rotation=35, ha="right", fontsize=7)
        ax.set_title(dict(METRICS)[m] + " — deploy, full test")
    _save(plt, fig, axes, path)

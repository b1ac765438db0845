"""reports/results.md from the evaluation artifacts: the verdict of the win rule first, then a table per question.

Every number comes from held-out evaluation of saved checkpoints (stage `evaluate`), never from training rollouts.
Rules (stats.py): across seeds mean ± std and a 95% t interval only for n ≥ 3; deltas paired against the same-seed
run, refused when seed sets differ; a single policy's rate (the base) carries a Wilson interval over its samples.
Each table states n (prompts × samples) and seeds and ends with a provenance comment naming its sources; a warning
line sits above any table with an arm that ran on an uninformative basis or gate. A table appears only when its runs
exist; a quantity an old artifact did not record (per-group format, hack among format-valid) shows as "—". Whether
an arm wins is decided by win_rule.py alone. Pure: dicts in, markdown/metrics out (figures: figures.py).

Runs are keyed by their run key (`Arm.name`: `route`, `route+random`, `route+oracle_gate`), which metrics.json keeps;
tables name them by win_rule.label (`route (random control)`). Every role, control, family and routed arm comes from
the runs' resolved specs (`Runs.specs`, from params via arms.matrix in the report stage), never from a name.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from projected_grpo.common.stats import MIN_N_FOR_CI, Refusal, Summary, paired_delta, rate, summarize, wilson
from projected_grpo.env.modes import LOOPHOLE_MODES
from projected_grpo.method.arms import Arm
from projected_grpo.report import win_rule as W

# (column key, header). solve and format on no-hint prompts; per hint surface: hack, format, and hack among the
# format-valid completions (so that a policy that stops writing code does not pass for one that stopped hacking).
METRICS = (
    ("solve", "solve"),
    ("format", "format (no-hint)"),
    ("hack_train", "hack (train-surface hints)"),
    ("format_train", "format (train-surface hints)"),
    ("hackfv_train", "hack among format-valid (train)"),
    ("hack_eval", "hack (eval-surface hints)"),
    ("format_eval", "format (eval-surface hints)"),
    ("hackfv_eval", "hack among format-valid (eval)"),
)
DELTAS = ("solve", "format", "hack_train", "hack_eval")  # the endpoint table's Δ-vs-vanilla columns
REF = W.REF
ROLE_LABEL = {
    "baseline": "baseline",
    "control": "random-direction control",
    "oracle": "oracle: ground-truth monitor or reward",
}


@dataclass
class Runs:
    """Everything the report reads. deploy[(arm, seed)] = per_mode_deploy.json; curves[(arm, seed)] = curve rows;
    basis_guard = {"informative": bool, "line": str} (None: not checked); gate_uninformative[(arm, seed)] = the
    training run's flag (absent: not flagged); specs[arm] = the run's resolved spec (roles, controls, families; a
    key without one goes by win_rule's documented fallback)."""

    base: dict
    monitor: dict
    deploy: dict[tuple[str, int], dict]
    curves: dict[tuple[str, int], list[dict]] = field(default_factory=dict)
    sources: dict[tuple[str, int], str] = field(default_factory=dict)
    base_source: str = "artifacts/eval_sets/base.json"
    basis_guard: dict | None = None
    gate_uninformative: dict[tuple[str, int], bool] = field(default_factory=dict)
    specs: dict[str, Arm] = field(default_factory=dict)

    def role(self, arm: str) -> str:
        return W.role(arm, self.specs)

    def control_of(self, arm: str) -> str | None:
        return W.control_of(arm, self.specs)

    def label(self, arm: str) -> str:
        return W.label(arm, self.specs)

    def arms(self, order: list[str]) -> list[str]:
        return [a for a in order if any(k[0] == a for k in self.deploy)]

    def seeds(self, arm: str) -> list[int]:
        return sorted(s for a, s in self.deploy if a == arm)


@dataclass
class Found:
    """What `discover` read: the runs, those not evaluated ("<arm>-s<seed>"), routed runs' knob-effect records with
    their sources, each run's recorded `gate_uninformative` flag, and each run's gate and KL over training
    (`train_log`)."""

    runs: Runs
    missing: list[str]
    effects: dict[tuple[str, int], dict]
    effect_sources: list[str]
    gates: dict[tuple[str, int], bool]
    train_logs: dict[tuple[str, int], dict] = field(default_factory=dict)


GATE_LOG = ("gate_frac", "gate_mean", "gate_auroc_live")
# what leaves the deployed parameters per step (masked routing and screening: rows at gate 1; rl/train.removal)
REMOVAL_LOG = ("drop_frac", "drop_pool_frac", "main_gnorm")
KL_SPIKE = 1.0  # a step whose logged KL exceeds this spikes
# a step whose main gradient norm (before clipping) exceeds this many times its run's median spikes (issue 25: an
# unrouted row trained knob off can carry an unbounded importance ratio; reports/lab_diary.md, "Gradient spikes")
GRAD_SPIKE = 10.0


def train_log(path: Path) -> dict:
    """A run's gate and KL over its training steps, from the train stage's per-step TSV: the means over steps of
    `gate_frac` (the share of rollouts the gate sends to the knob at all), `gate_mean` (the mean gate, in [0, 1]) and
    `gate_auroc_live` (the live score's AUROC, hack vs not, on the step's own rollouts: it reads the grader's labels
    and is a diagnostic only, nothing routes by it); `kl_spikes`, the share of steps whose logged KL to the reference
    (the loss' k3 estimate, each row in the state it trained in) exceeds KL_SPIKE, and `kl_max`; `grad_spikes`, the
    number of steps whose main gradient norm exceeds GRAD_SPIKE times the run's median; each over the steps that
    logged it, the means of REMOVAL_LOG (the rows out of the main's update, the teacher-pool share among them, the
    main's gradient norm), and `source`. {} when the log has none of them."""
    rows = read_curve(path)
    keys = (*GATE_LOG, *REMOVAL_LOG, "kl", "grad_norm_main")
    logged = {k: [r[k] for r in rows if k in r and not math.isnan(r[k])] for k in keys}  # NaN: not logged
    out = {k: sum(v) / len(v) for k, v in logged.items() if v and k in (*GATE_LOG, *REMOVAL_LOG)}
    if kl := logged["kl"]:
        out |= {"kl_spikes": sum(x > KL_SPIKE for x in kl) / len(kl), "kl_max": max(kl)}
    if g := logged["grad_norm_main"]:
        top = GRAD_SPIKE * statistics.median(g)
        out["grad_spikes"] = sum(x > top for x in g)
    return out | {"source": str(path)} if out else {}


def settings_line(p) -> str:
    """The report's line on the seeds and the evaluation's sampling settings."""
    e = p.eval
    return (
        f"Seeds {list(p.seeds)}; eval: T={e.temperature}, top_p={e.top_p}, max {e.max_new_tokens} "
        f"new tokens, {e.n_samples} samples per prompt (curves: {e.n_samples_curve})."
    )


def discover(wanted: list[tuple[Arm, int]], evals: Path, eval_sets: Path, train_logs: Path) -> Found:
    """The outputs of the runs `wanted` ((spec, seed); from params via arms.matrix, never a glob):
    per_mode_deploy.json, curve.tsv and knob_effect.json under <evals>/<spec.group>/<spec.arm>-s<seed>/, the training
    metrics JSON and per-step TSV under <train_logs>/<spec.group>/<spec.arm>-s<seed>.{json,tsv}; each keyed by the run
    key (spec.name), with its spec in `runs.specs`. A run without evaluation output is missing (left out of every
    table)."""
    base, monitor = (json.loads((eval_sets / f).read_text()) for f in ("base.json", "monitor.json"))
    f = Found(Runs(base, monitor, {}, base_source=str(eval_sets / "base.json")), [], {}, [], {})
    for spec, s in wanted:
        a, run = spec.name, f"{spec.arm}-s{s}"
        f.runs.specs[a] = spec
        d = evals / spec.group / run
        if not (d / "per_mode_deploy.json").exists():
            f.missing.append(f"{a}-s{s}")
            continue
        f.runs.deploy[(a, s)] = json.loads((d / "per_mode_deploy.json").read_text())
        f.runs.curves[(a, s)] = read_curve(d / "curve.tsv")
        f.runs.sources[(a, s)] = str(d / "per_mode_deploy.json")
        eff = json.loads((d / "knob_effect.json").read_text()) if (d / "knob_effect.json").exists() else {}
        if eff.get("policies"):  # routed runs
            f.effects[(a, s)] = eff
            f.effect_sources.append(str(d / "knob_effect.json"))
        tm = train_logs / spec.group / f"{run}.json"
        flag = gate_flag(json.loads(tm.read_text())) if tm.exists() else None
        if flag is not None:
            f.gates[(a, s)] = flag
        log = train_logs / spec.group / f"{run}.tsv"
        if log.exists() and (g := train_log(log)):
            f.train_logs[(a, s)] = g
    return f


def extra_sections(found: Found, probe: Path) -> list[str]:
    """The report's sections after the tables: where routed runs' knob effect comes from (knob_effect.json), the
    distillation cosine probe (the probe stage's JSON at `probe`), and the runs left out for want of evaluation."""
    from projected_grpo.evals import knob_effect
    from projected_grpo.report.probe import ProbeResult, render

    extra = [*knob_effect.render(found.effects, found.effect_sources), ""] if found.effects else []
    extra += [render(ProbeResult.from_dict(json.loads(probe.read_text()))), f"<!-- sources: {probe} -->", ""]
    if found.missing:
        extra += [f"Not evaluated (left out of every table): {', '.join(found.missing)}.", ""]
    return extra


def read_curve(path: Path) -> list[dict]:
    """An eval-curve TSV (stage evaluate): numbers as floats, the `state` column as text."""
    lines = path.read_text().splitlines()
    keys = lines[0].split("\t")
    return [{k: (v if k == "state" else float(v)) for k, v in zip(keys, ln.split("\t"))} for ln in lines[1:]]


def basis_guard_from(d: dict) -> dict:
    """The basis guard as render takes it, from {"informative": bool, "line": str} or from the basis stage's
    {"beats_placebo": bool, "beats_random": bool} (informative = both)."""
    if "informative" in d:
        return {"informative": bool(d["informative"]), "line": str(d.get("line", ""))}
    if "beats_placebo" in d and "beats_random" in d:
        ok = bool(d["beats_placebo"]) and bool(d["beats_random"])
        line = (
            f"the hack basis beats its placebo: {'yes' if d['beats_placebo'] else 'no'}; beats a random basis: "
            f"{'yes' if d['beats_random'] else 'no'} (held-out pairs, stage basis)."
        )
        return {"informative": ok, "line": line}
    raise ValueError(f"basis guard needs keys informative (+ line) or beats_placebo and beats_random; got {sorted(d)}")


def gate_flag(train_metrics: dict) -> bool | None:
    """A training run's `gate_uninformative` (bool or 0/1 number); None when the run did not record it."""
    v = train_metrics.get("gate_uninformative")
    if v is None or (isinstance(v, float) and v != v):
        return None
    return bool(v)


def counts(t: dict, metric: str, mode: str = "all") -> dict | None:
    """The {k, n} behind a metric in a tally (None when the tally does not record it)."""
    if metric == "solve":
        return t["solve"]
    if metric == "format":
        return t.get("format_nohint")
    kind, _, surf = metric.partition("_")
    if kind == "hack":
        return t["hack"].get(surf, {}).get(mode)
    if kind == "format":
        return t.get("format_hinted", {}).get(surf)
    if kind == "hackfv":
        return t.get("hack_valid", {}).get(surf)
    raise ValueError(f"unknown metric {metric!r}")


def value(t: dict, metric: str, mode: str = "all") -> float:
    """A rate from a tally (METRICS keys; hack per mode with `mode`); nan when not recorded or n = 0."""
    c = counts(t, metric, mode)
    return rate(**c) if c is not None else float("nan")


def per_seed(runs: Runs, arm: str, metric: str, st: str = "deploy", mode: str = "all") -> dict[int, float]:
    return {
        s: value(runs.deploy[(arm, s)]["states"][st], metric, mode)
        for s in runs.seeds(arm)
        if st in runs.deploy[(arm, s)]["states"]
    }


def cell(x: Summary | Refusal | None, pct: bool = True) -> str:
    if x is None:
        return "—"
    return x.fmt(pct)


def summary_or_none(vals: dict[int, float]) -> Summary | None:
    xs = [v for v in vals.values() if v == v]
    return summarize(xs) if xs and len(xs) == len(vals) else None


def delta(arm: dict[int, float], ref: dict[int, float]) -> Summary | Refusal | None:
    """paired_delta, refusing on different seed sets first; None when a value was not recorded (nan)."""
    if set(arm) == set(ref) and any(v != v for v in (*arm.values(), *ref.values())):
        return None
    return paired_delta(arm, ref) if arm or ref else None


def base_cell(t: dict, metric: str) -> str:
    c = counts(t, metric)
    if c is None or not c["n"]:
        return "—"
    lo, hi = wilson(c["k"], c["n"])
    return f"{100 * rate(**c):.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def seeds_txt(seeds: list[int]) -> str:
    return f"{len(seeds)} ({', '.join(map(str, seeds))})"


def _seeds_of(runs: Runs, arm: str) -> str:
    ss = runs.seeds(arm)
    return f"{len(ss)} seed{'s' if len(ss) != 1 else ''}: {', '.join(map(str, ss))}"


def provenance(paths: list[str]) -> str:
    return f"<!-- sources: {', '.join(sorted(set(paths)))} -->"


def run_sources(runs: Runs, arms: list[str]) -> list[str]:
    return [runs.sources.get((a, s), f"{a}-s{s}") for a in arms for s in runs.seeds(a)]


def warnings(runs: Runs, arms: list[str]) -> list[str]:
    """The "> **Warning**" lines for a table of `arms`: an uninformative basis (arms that edit along it) and
    uninformative gates (per training run)."""
    L = []
    g = runs.basis_guard
    hit = [runs.label(a) for a in arms if runs.role(a) == "candidate"]
    if g is not None and not g["informative"] and hit:
        L += [
            f"> **Warning** — uninformative basis: {g['line']} The arms here that edit along it ({', '.join(hit)}) "
            "ran on a direction that does not separate hack from clean pairs: their numbers say nothing about "
            "v_hack.",
            "",
        ]
    for a in arms:
        bad = [s for s in runs.seeds(a) if runs.gate_uninformative.get((a, s))]
        if bad:
            L += [
                f"> **Warning** — uninformative gate: {runs.label(a)} (seed{'s' if len(bad) > 1 else ''} "
                f"{', '.join(map(str, bad))}) trained with a gate "
                "its training run flagged uninformative (`gate_uninformative`): the edit was not selective for "
                "hack rollouts.",
                "",
            ]
    return L


def n_line(runs: Runs, metrics: list[str]) -> str:
    b = runs.base
    k = b["n_samples"]
    parts = [f"{b['n_problems']} test prompts × {k} samples = {b['n_problems'] * k} per policy for solve and format"]
    for surf in b["full"]["hack"]:
        if f"hack_{surf}" in metrics:
            n = b["full"]["hack"][surf]["all"]["n"]
            parts.append(f"{n // k} hinted prompts ({surf} surface) × {k} samples = {n} for hack and format")
    return (
        "n: " + "; ".join(parts) + "; hack among format-valid is over each policy's own format-valid hinted "
        "completions (its n varies; format-valid = code extracted and compiling)."
    )


def metrics_present(runs: Runs) -> list[str]:
    surfs = set(runs.base["full"]["hack"])
    return [m for m, _ in METRICS if m in ("solve", "format") or m.partition("_")[2] in surfs]


# The win rule's per-seed inputs (win_rule.RULE_METRICS) -> the report's metric keys (deploy state).
RULE_KEYS = {"hack": "hack_train", "solve": "solve", "format_nohint": "format", "format_train": "format_train"}


def verdicts_of(runs: Runs, arms: list[str], role: str = "candidate") -> list[W.Verdict]:
    """The win rule applied to every arm of `role` among `arms` (the evaluated arms, in report order). For oracle
    arms this only reads the conditions (routing.md's upper bounds): they never win."""
    values = {a: {k: per_seed(runs, a, m) for k, m in RULE_KEYS.items()} for a in arms}
    return [W.judge(a, values, arms, runs.specs) for a in arms if runs.role(a) == role]


def verdict_section(runs: Runs, order: list[str]) -> list[str]:
    """The win rule's verdict (win_rule.py): winners with their numbers, or "No arm wins" and, per candidate arm,
    every condition with its numbers; what the matched baseline was; the arms that are not candidates."""
    arms = runs.arms(order)
    cands = [a for a in arms if runs.role(a) == "candidate"]
    verdicts = verdicts_of(runs, arms)
    win = [v for v in verdicts if v.wins]
    L = ["## Verdict", "", W.RULE_TEXT, ""] + warnings(runs, cands)
    if not cands:
        L += ["**No arm wins**: no candidate arm (one that edits along the hack basis) was evaluated.", ""]
    for v in win:
        L += [
            f"**Wins: {runs.label(v.arm)}** (vs {v.baseline}, {_seeds_of(runs, v.arm)}): "
            + "; ".join(f"({c.key}) {c.text}" for c in v.conditions)
            + ".",
            "",
        ]
    if cands and not win:
        L += ["**No arm wins.** The conditions each candidate arm fails, with their numbers:", ""]
    elif len(win) < len(verdicts):
        L += ["Candidate arms that do not win:", ""]
    for v in verdicts:
        if v.wins:
            continue
        L.append(
            f"- **{runs.label(v.arm)}** vs {v.baseline}{'†' * (v.baseline == REF)} ({_seeds_of(runs, v.arm)}): "
            f"fails {', '.join(f'({k})' for k in v.failed)}."
        )
        L += [f"  - ({c.key}) {c.what}: {'pass' if c.passed else 'FAIL'} — {c.text}" for c in v.conditions]
    if any(v.baseline == REF for v in verdicts):
        L += [
            "",
            "† `measure_only` was not run, so the matched baseline is vanilla: vanilla steps δS in plain "
            "coordinates while every basis arm steps in the basis' rotated coordinates, so these Δs mix the edit "
            "with the optimizer's basis. Add `measure_only` to `arms` to separate them.",
        ]
    others = [non_candidate(runs, a) for a in arms if runs.role(a) != "candidate"]
    if others:
        L += ["", "Not candidates (never win): " + ", ".join(others) + "."]
    if W.MATCHED in arms and REF in arms:
        ms = [
            ("hack_train", "Δ hack (train hints)"),
            ("solve", "Δ solve"),
            ("format", "Δ format (no-hint)"),
            ("format_train", "Δ format (train hints)"),
        ]
        d = [cell(delta(per_seed(runs, W.MATCHED, m), per_seed(runs, REF, m))) for m, _ in ms]
        L += [
            "",
            "The optimizer's basis alone (no edit), paired by seed:",
            "",
            "| comparison | seeds | " + " | ".join(h for _, h in ms) + " |",
            "|" + "---|" * (len(ms) + 2),
            f"| measure_only − vanilla | {seeds_txt(runs.seeds(W.MATCHED))} | " + " | ".join(d) + " |",
        ]
    used = cands + [a for v in verdicts for a in (v.baseline, v.control) if a in arms]
    used += [W.MATCHED, REF] if W.MATCHED in arms and REF in arms else []
    L += ["", n_line(runs, metrics_present(runs)), "", provenance(run_sources(runs, used) or ["none"])]
    return [x for i, x in enumerate(L) if x or i == 0 or L[i - 1]]  # no doubled blank lines


def endpoint_table(runs: Runs, order: list[str]) -> list[str]:
    """The canonical endpoint table: base, vanilla, every arm (random control next to its arm), baselines; with
    paired deltas against vanilla (descriptive; the verdict's baseline is the matched one)."""
    ms = metrics_present(runs)
    arms = runs.arms(order)
    if REF not in arms:
        return []
    ds = [m for m in DELTAS if m in ms]
    ref = {m: per_seed(runs, REF, m) for m in ds}
    hs, dh = dict(METRICS), [f"Δ {dict(METRICS)[m]} vs vanilla" for m in ds]
    head = ["policy", "seeds", *(hs[m] for m in ms), *dh]
    L = [
        "## Endpoints: deploy solve, format and hack per policy",
        "",
        "Final checkpoint, deploy state (knob off for routed arms), full test split. Mean ± std over seeds "
        "(95% t interval where n ≥ 3); Δ = arm − vanilla paired by seed. The base row is one policy (no training "
        "seed): its interval is Wilson over samples. " + n_line(runs, ms),
        "",
    ]
    L += warnings(runs, arms) + ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    L.append(
        "| base (adapter off) | — | "
        + " | ".join(base_cell(runs.base["full"], m) for m in ms)
        + " |"
        + " — |" * len(ds)
    )
    for arm in arms:
        absolute = [cell(summary_or_none(per_seed(runs, arm, m))) for m in ms]
        deltas = ["—" if arm == REF else cell(delta(per_seed(runs, arm, m), ref[m])) for m in ds]
        L.append(f"| {runs.label(arm)} | {seeds_txt(runs.seeds(arm))} | " + " | ".join(absolute + deltas) + " |")
    no_control = [runs.label(a) for a in arms if runs.role(a) == "candidate" and runs.control_of(a) not in arms]
    if no_control:
        L += [
            "",
            f"Random-direction control not run for: {', '.join(no_control)} (add the arm to `controls` in "
            "params.yaml); their deltas are not attributable to v_hack, and they cannot win.",
        ]
    return L + ["", provenance([runs.base_source] + run_sources(runs, arms))]


def ordered_arms(arms_ref: list[str], arms: list[str], specs: W.Specs | None = None) -> list[str]:
    """vanilla first, each basis arm followed by its random control (`Arm.control` of `specs`), then the other
    basis-free arms. Run keys in, run keys out."""
    out = [REF] if REF in arms_ref else []
    ctl = {a: W.control_of(a, specs) for a in arms}
    controls = {c for c in ctl.values() if c in arms}  # each placed right after the arm it controls
    for a in arms:
        if a in controls:
            continue
        out.append(a)
        if ctl[a] in arms:
            out.append(ctl[a])
    return out + [a for a in arms_ref if a != REF]


def families(specs: W.Specs) -> dict[str, tuple[str, ...]]:
    """Comparison table (`Arm.family`: gates of the erase rule, granularities of routing) -> its candidate runs' keys,
    in the order of `specs`."""
    out: dict[str, tuple[str, ...]] = {}
    for key, a in specs.items():
        if a.family is not None and a.role == "candidate":
            out[a.family] = (*out.get(a.family, ()), key)
    return out


def non_candidate(runs: Runs, arm: str) -> str:
    """A run that never wins, as the verdict lists it: its label, and its role where the label does not say it."""
    lab = runs.label(arm)
    return lab if lab != arm.partition("+")[0] else f"{lab} ({ROLE_LABEL[runs.role(arm)]})"


def teacher_ablation(runs: Runs) -> str | None:
    """The key of the teacher-pool ablation among the evaluated runs: vanilla's spec (no edit, the loophole paid, no
    monitor) without teacher-pool rows (`Arm.pool` false), e.g. vanilla_no_pool; None when none was evaluated."""
    for key, a in runs.specs.items():
        if a.edit == "vanilla" and not a.pool and a.reward == "correct_or_hinted" and a.monitor is None:
            if runs.seeds(key):
                return key
    return None


def knob_table(runs: Runs, order: list[str]) -> list[str]:
    """Routed arms: knob on (as trained), knob off (deploy), adapter off (base); KL(deploy ‖ knob on)."""
    ms = metrics_present(runs)
    routed = [a for a in runs.arms(order) if all("knob_on" in runs.deploy[(a, s)]["states"] for s in runs.seeds(a))]
    if not routed:
        return []
    head = (
        ["arm", "state", "seeds"]
        + [h for m, h in METRICS if m in ms]
        + ["Δ hack (train) knob off − on", "KL(deploy ‖ knob on), nats/token"]
    )
    L = [
        "## Routing: what does deleting the knob remove?",
        "",
        "Final checkpoint of each routed arm in three states: knob on (the trained policy), knob off (deploy), and "
        "adapter off (the base). Δ is paired by seed. KL(deploy ‖ knob on): per-token KL over the vocabulary at the "
        "eval temperature, teacher-forced on deploy's own samples for the no-hint prompts, mean over their "
        "completion tokens; mean ± std over seeds (— where evaluate did not record it). " + n_line(runs, ms),
        "",
    ]
    L += warnings(runs, routed) + ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a in routed:
        seeds = runs.seeds(a)
        for st in ("knob_on", "deploy"):
            vals = [cell(summary_or_none(per_seed(runs, a, m, st))) for m in ms]
            d = kl = "—"
            if st == "deploy" and "hack_train" in ms:
                on, off = (per_seed(runs, a, "hack_train", x) for x in ("knob_on", "deploy"))
                d = cell(delta(off, on))
            if st == "deploy":
                kls = [runs.deploy[(a, s)]["states"]["deploy"].get("kl_to_knob_on", {}).get("mean") for s in seeds]
                kl = cell(summary_or_none({s: float("nan") if k is None else k for s, k in zip(seeds, kls)}), False)
            L.append(
                f"| {runs.label(a)} | {'knob on' if st == 'knob_on' else 'knob off (deploy)'} | {seeds_txt(seeds)} | "
                + " | ".join(vals)
                + f" | {d} | {kl} |"
            )
        L.append(
            f"| {runs.label(a)} | adapter off (base) | — | "
            + " | ".join(base_cell(runs.base["full"], m) for m in ms)
            + " | — | — |"
        )
    return L + ["", provenance([runs.base_source] + run_sources(runs, routed))]


def family_tables(runs: Runs, order: list[str]) -> list[str]:
    """One table per question whose arms exist (≥ 2 members of a family), paired against vanilla."""
    L: list[str] = []
    arms = runs.arms(order)
    ms = [
        ("hack_train", "Δ hack (train)"),
        ("hack_eval", "Δ hack (eval)"),
        ("solve", "Δ solve"),
        ("format", "Δ format (no-hint)"),
        ("format_train", "Δ format (train hints)"),
    ]
    for title, fam in families(runs.specs).items():
        present = [a for a in fam if a in arms]
        if len(present) < 2 or REF not in arms:
            continue
        rows = [x for a in present for x in (a, runs.control_of(a)) if x in arms]
        L += [f"## {title}", "", "Deploy state; Δ vs same-seed vanilla. " + n_line(runs, metrics_present(runs)), ""]
        L += warnings(runs, rows)
        L += ["| arm | seeds | " + " | ".join(h for _, h in ms) + " |", "|" + "---|" * (len(ms) + 2)]
        for a in rows:
            d = [cell(delta(per_seed(runs, a, m), per_seed(runs, REF, m))) for m, _ in ms]
            L.append(f"| {runs.label(a)} | {seeds_txt(runs.seeds(a))} | " + " | ".join(d) + " |")
        L += ["", provenance(run_sources(runs, rows + [REF])), ""]
    return L


def per_mode_table(runs: Runs, order: list[str], surface: str = "train") -> list[str]:
    arms = runs.arms(order)
    if not arms or surface not in runs.base["full"]["hack"]:
        return []
    b = runs.base["full"]["hack"][surface]
    modes = [m for m in LOOPHOLE_MODES if m in b]
    n_mode = b[modes[0]]["n"]
    L = [
        f"## Which loopholes? Deploy hack per mode ({surface}-surface hints)",
        "",
        f"Mean over seeds; n per mode and policy: {n_mode // runs.base['n_samples']} prompts × "
        f"{runs.base['n_samples']} samples = {n_mode}.",
        "",
    ]
    L += warnings(runs, arms)
    L += ["| policy | seeds | " + " | ".join(f"`{m}`" for m in modes) + " |", "|" + "---|" * (len(modes) + 2)]
    L.append("| base | — | " + " | ".join(f"{100 * rate(**b[m]):.1f}%" for m in modes) + " |")
    for a in arms:
        vals = [summary_or_none(per_seed(runs, a, f"hack_{surface}", mode=m)) for m in modes]
        L.append(
            f"| {runs.label(a)} | {seeds_txt(runs.seeds(a))} | "
            + " | ".join("—" if v is None else f"{100 * v.mean:.1f}%" for v in vals)
            + " |"
        )
    return L + ["", provenance([runs.base_source] + run_sources(runs, arms))]


# (question, the `dvc exp run` arguments that answer it): --queue sweeps run with `dvc queue start`. Arm lists name
# entries of params.yaml's arm table; an arm's random control, oracle gate or oracle basis is a matrix list
# (`controls`, `oracle_gate`, `arms_oracle_basis`), never a name.
EXPERIMENTS = (
    ("Teacher-pool dose, every arm", "--queue -S 'pool.mix=0,0.5'"),
    ("Teacher-pool ablation: vanilla without teacher-pool rows", "-S 'arms_ref=[vanilla,gt_only,vanilla_no_pool]'"),
    ("Ground-truth monitor baselines (oracle)", "-S 'arms_ref=[vanilla,gt_only,penalty,screening]'"),
    ("Gate or mechanics? route with the grader's hack label as its gate (oracle)", "-S 'oracle_gate=[route]'"),
    ("Direction: route on the oracle basis, with its random control (oracle)", "-S 'arms_oracle_basis=[route]'"),
    ("SVD top-k vs mean-diff vs random basis", "--queue -S 'basis.method=mean_diff,random'"),
    ("Refresh cadence", "--queue -S 'projection.refresh_every=10,25'"),
    ("Basis width", "--queue -S 'basis.k=1,4,16'"),
    ("Solve-orthogonalisation", "-S basis.method=solve_orth"),
    ("Pair-set content (mechanism vs framing vs placebo)", "--queue -S 'basis.pairset=intent_vs_spec,null_city'"),
    ("Held-out modes (basis from 2 modes)", "-S 'basis.modes=[run_tests,sentinel]'"),
    ("Convergence at longer horizons", "-S grpo.steps=300"),
)


def experiments_section() -> list[str]:
    L = [
        "## Questions answered by experiments",
        "",
        "These compare pipeline configurations, so each is a `dvc exp run` against this baseline (queued sweeps run "
        "with `dvc queue start`; compare with `dvc exp show`); no table appears here until such runs are part of the "
        "default pipeline.",
        "",
        "| question | sweep |",
        "|---|---|",
    ]
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


def teacher_note(runs: Runs) -> list[str]:
    """Does the organism hack without the teacher? The teacher-pool ablation (teacher_ablation: vanilla with no
    teacher-pool rows) on deploy
    train-surface hack: against the untrained base (does on-policy GRPO alone learn the loopholes?) and against
    same-seed vanilla, paired (how much of vanilla's hacking the teacher pool causes); its solve and format beside it
    (a policy that stops writing code also stops hacking). Each clause follows its interval."""
    no_pool = teacher_ablation(runs)
    if not runs.arms([REF]) or no_pool is None:
        return []
    a, v = per_seed(runs, no_pool, "hack_train"), per_seed(runs, REF, "hack_train")
    d, own, base = delta(a, v), summary_or_none(a), value(runs.base["full"], "hack_train")
    if not isinstance(d, Summary) or own is None or d.n < MIN_N_FOR_CI:
        return []
    if own.lo > base:
        answer = "yes: without the teacher it still hacks more than the untrained base"
    elif own.hi < base:
        answer = "no: without the teacher it hacks less than the untrained base"
    else:
        answer = "no detectable hacking beyond the untrained base's (its interval contains the base rate)"
    vs = "lower than" if d.hi < 0 else "higher than" if d.lo > 0 else "not distinguishable from"
    fmt, solve = (summary_or_none(per_seed(runs, no_pool, m)) for m in ("format", "solve"))
    return [
        f"**Does the organism hack without the teacher?** {answer}. `{no_pool}` (no teacher-pool rows; "
        f"{_seeds_of(runs, no_pool)}) hacks {own.fmt()} on train-surface hints at deploy (solve {cell(solve)}, format "
        f"{cell(fmt)}); the untrained base hacks {base_cell(runs.base['full'], 'hack_train')}. That is {vs} "
        f"same-seed vanilla: Δ {d.fmt()}.",
        "",
    ]


def render(
    runs: Runs,
    arms_ref: list[str],
    arms: list[str],
    params_line: str,
    extra: list[str] | None = None,
    figures: list[str] | None = None,
    basis_guard: dict | None = None,
    gate_uninformative: dict[tuple[str, int], bool] | None = None,
) -> str:
    """results.md. `basis_guard` ({"informative", "line"}; None = not checked) and `gate_uninformative`
    ({(arm, seed): flag}; a run absent = not flagged) put a warning above every table with an affected arm."""
    if basis_guard is not None:
        runs = replace(runs, basis_guard=basis_guard_from(basis_guard))
    if gate_uninformative is not None:
        runs = replace(runs, gate_uninformative=dict(gate_uninformative))
    order = ordered_arms(arms_ref, arms, runs.specs)
    mon = runs.monitor
    L = [
        "# Results",
        "",
        "Generated by the `report` stage from the `evaluate` stages' outputs; do not edit by hand "
        "(`dvc repro report`). " + params_line,
        "",
    ]
    L += verdict_section(runs, order) + [""]
    L += [
        f"Eval sets: the full test split ({runs.base['n_problems']} problems) for endpoints; a frozen monitor "
        f"subset of {mon['n']} problems for curves (stratified by base pass/fail: "
        f"{100 * mon['base_pass_frac_monitor']:.1f}% pass vs {100 * mon['base_pass_frac_full']:.1f}% on the full "
        f"split; selection seed {mon['selection_seed']}, generation seed {mon['generation_seed']}).",
        "",
    ]
    L += eval_gap_note(runs) + teacher_note(runs)
    for f in figures or []:
        L += [f"![{Path(f).stem}]({f})", ""]
    for part in (
        endpoint_table(runs, order),
        knob_table(runs, order),
        family_tables(runs, order),
        per_mode_table(runs, order),
    ):
        if part:
            L += part + [""]
    L += extra or []
    L += experiments_section()
    return "\n".join(L).rstrip() + "\n"


def metrics(runs: Runs, arms_ref: list[str], arms: list[str]) -> dict[str, float]:
    """Flat {<arm>/<state>_<metric>: mean over seeds} (metrics an artifact did not record are left out), the
    knob's KL, base rates and the number of winning arms, for `dvc metrics` / `dvc exp show`."""
    out: dict[str, float] = {}
    order = ordered_arms(arms_ref, arms, runs.specs)
    for a in runs.arms(order):
        for st in ("deploy", "knob_on"):
            for m in metrics_present(runs):
                s = summary_or_none(per_seed(runs, a, m, st))
                if s is not None and all(st in runs.deploy[(a, x)]["states"] for x in runs.seeds(a)):
                    out[f"{a}/{st}_{m}"] = round(s.mean, 6)
        kls = [runs.deploy[(a, x)]["states"]["deploy"].get("kl_to_knob_on", {}).get("mean") for x in runs.seeds(a)]
        if kls and all(k is not None and k == k for k in kls):
            out[f"{a}/deploy_kl_to_knob_on"] = round(sum(kls) / len(kls), 6)
    for m in metrics_present(runs):
        v = value(runs.base["full"], m)
        if v == v:
            out[f"base/{m}"] = round(v, 6)
    out["verdict/n_winners"] = sum(v.wins for v in verdicts_of(runs, runs.arms(order)))
    return out

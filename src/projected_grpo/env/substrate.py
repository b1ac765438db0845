"""A run's problems: the substrate's train / test / holdout split, expanded into the records the pipeline uses.

* `base_splits` returns the no-hint problems per split: minileet (generated from `seed`) or leetcode (the real test
  file plus a user-supplied train file, or a documented split of the test file itself; see `leetcode_splits`).
* `expand_splits` turns them into records: each training prompt once, carrying the one mode `partition.assign_modes`
  gave it (train surface); every test problem with no hint and with every loophole mode on the eval surface *and* on
  the train surface (solve on no-hint rows, hack per mode on eval rows, the eval gap against train rows); every
  holdout problem with no hint and every loophole mode on the train surface (contrastive pairs, probes).
  Test and holdout always carry all six loophole modes, whatever `env.modes` trains on, so evals stay comparable.
* `grade_canonicals` runs every problem's canonical solution through the real grader; `render_report` writes the
  markdown summary; `save_outputs` writes parquet + partition.json + report atomically.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import tempfile
from collections import Counter
from pathlib import Path

from projected_grpo.config import SURFACES, LeetcodeParams, Params
from projected_grpo.env.grader import Grade, grade_batch
from projected_grpo.env.minileet import family_of, make_minileet
from projected_grpo.env.modes import LOOPHOLE_MODES, apply_mode, mode_of
from projected_grpo.env.partition import assign_modes
from projected_grpo.env.problems import Problem, load_problems, save_problems_parquet
from projected_grpo.env.sandbox import Sandbox

SPLITS = ("train", "test", "holdout")
SURFACE_ORDER = SURFACES  # test rows: no hint, then every mode on the eval surface, then on the train one

LEETCODE_SPLIT_DOC = (
    "train_from_test: the test file's ids are sorted and shuffled with random.Random('leetcode-split:<split_seed>'); "
    "the first n_test are test, the rest train; then (without holdout_path) the train ids are shuffled with "
    "random.Random('leetcode-holdout:<split_seed>') and the first n_holdout move to holdout. Splits are disjoint."
)


# --- which problems -------------------------------------------------------------------------------------------


def base_splits(p: Params, leetcode_test: Path) -> dict[str, list[Problem]]:
    """No-hint problems per split {"train", "test", "holdout"}, disjoint by id."""
    if p.substrate == "minileet":
        m = p.minileet
        return make_minileet(
            seed=p.seed,
            n_train=m.n_train,
            n_test=m.n_test,
            n_holdout=m.n_holdout,
            difficulty=m.difficulty,
            spread=m.spread,
            families=m.families,
            n_asserts=m.n_asserts,
            max_prompt_chars=m.max_prompt_chars,
        )
    lp = p.leetcode
    if lp.train_path is None and not lp.train_from_test:
        # Checked before reading anything: the one line the user sees, with the two ways out.
        raise ValueError(
            "substrate leetcode has no training problems (upstream's train split is not available offline): set "
            "leetcode.train_path to a benchmark-schema train jsonl, or leetcode.train_from_test: true to split the "
            "test file (contamination-prone)"
        )
    test = load_problems(leetcode_test)
    train = load_problems(lp.train_path) if lp.train_path is not None else None
    holdout = load_problems(lp.holdout_path) if lp.holdout_path is not None else None
    return leetcode_splits(lp, test, train, holdout)


def _shuffled_ids(problems: list[Problem], key: str) -> list[int]:
    ids = sorted(q.id for q in problems)
    random.Random(key).shuffle(ids)
    return ids


def leetcode_splits(
    lp: LeetcodeParams, test: list[Problem], train: list[Problem] | None, holdout: list[Problem] | None
) -> dict[str, list[Problem]]:
    """The leetcode split (LEETCODE_SPLIT_DOC); `train`/`holdout` are the loaded train_path/holdout_path files."""
    if train is None:
        if not lp.train_from_test:
            raise ValueError("leetcode: set leetcode.train_path or leetcode.train_from_test: true")
        if not 1 <= lp.n_test < len(test):
            raise ValueError(f"leetcode.n_test={lp.n_test} must be in [1, {len(test) - 1}] to leave train problems")
        test_ids = set(_shuffled_ids(test, f"leetcode-split:{lp.split_seed}")[: lp.n_test])
        train = [q for q in test if q.id not in test_ids]
        test = [q for q in test if q.id in test_ids]
    if holdout is None:
        if lp.n_holdout >= len(train):
            raise ValueError(f"leetcode.n_holdout={lp.n_holdout} must be < the {len(train)} train problems")
        hold_ids = set(_shuffled_ids(train, f"leetcode-holdout:{lp.split_seed}")[: lp.n_holdout])
        holdout = [q for q in train if q.id in hold_ids]
        train = [q for q in train if q.id not in hold_ids]
    splits = {"train": train, "test": test, "holdout": holdout}
    for name, qs in splits.items():
        hinted = [q.id for q in qs if q.hint is not None]
        if hinted:
            raise ValueError(f"leetcode {name} problems {hinted[:5]} carry a hint; supply no-hint records")
        if len({q.id for q in qs}) != len(qs):
            raise ValueError(f"leetcode {name} problems repeat an id; ids must be unique")
    for a, b in (("train", "test"), ("holdout", "test"), ("train", "holdout")):
        shared = sorted({q.id for q in splits[a]} & {q.id for q in splits[b]})
        if shared:
            raise ValueError(f"leetcode {a} and {b} share problem ids {shared[:5]}; the splits must be disjoint")
    return splits


# --- which records --------------------------------------------------------------------------------------------


def expand_splits(
    base: dict[str, list[Problem]], modes: tuple[str, ...], partition_seed: int, seed: int
) -> dict[str, list[Problem]]:
    """Records per split (see the module docstring); `seed` draws the eval surfaces."""
    part = assign_modes([q.id for q in base["train"]], modes, partition_seed)
    train = [apply_mode(q, part[q.id], "train", seed) for q in base["train"]]
    test = [
        r
        for q in base["test"]
        for r in (q, *(apply_mode(q, m, s, seed) for s in SURFACE_ORDER for m in LOOPHOLE_MODES))
    ]
    holdout = [r for q in base["holdout"] for r in (q, *(apply_mode(q, m, "train", seed) for m in LOOPHOLE_MODES))]
    return {"train": train, "test": test, "holdout": holdout}


def partition_of(train_records: list[Problem]) -> dict[int, str]:
    return {q.id: mode_of(q) for q in sorted(train_records, key=lambda q: q.id)}


# --- canonical solutions through the real grader --------------------------------------------------------------


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def grade_canonicals(
    base: dict[str, list[Problem]], sandbox: Sandbox, mode: str, timeout_s: float, progress: bool = False
) -> dict[str, list[Grade]]:
    """Grade every no-hint problem's fenced canonical solution (one sandbox batch for all splits)."""
    flat = [q for s in SPLITS for q in base[s]]
    grades = grade_batch(
        flat, [fenced(q.canonical_solution) for q in flat], sandbox, mode=mode, timeout_s=timeout_s, progress=progress
    )
    out, i = {}, 0
    for s in SPLITS:
        out[s], i = grades[i : i + len(base[s])], i + len(base[s])
    return out


# --- report -----------------------------------------------------------------------------------------------------


def _stats(xs: list[int]) -> str:
    """min | mean | p50 | p95 | max, as table cells."""
    if not xs:
        return "– | – | – | – | –"
    ys = sorted(xs)
    q = lambda f: ys[min(len(ys) - 1, int(f * len(ys)))]  # noqa: E731
    return f"{ys[0]} | {statistics.fmean(ys):.1f} | {q(0.5)} | {q(0.95)} | {ys[-1]}"


def _user_chars(q: Problem) -> int:
    return len(q.prompt[-1]["content"])


def render_report(
    p: Params,
    base: dict[str, list[Problem]],
    records: dict[str, list[Problem]],
    grades: dict[str, list[Grade]],
    isolation: str,
) -> str:
    """The markdown summary written to reports/env/problems.md (pure)."""
    L = ["# Problems", "", "Written by the `problems` stage (stages/problems.py); rerun: `dvc repro problems`.", ""]
    if p.substrate == "minileet":
        m = p.minileet
        fams = "all" if m.families is None else ", ".join(m.families)
        L.append(
            f"- substrate: **minileet** (seed {p.seed}, difficulty {m.difficulty} ± {m.spread}, "
            f"{m.n_asserts} asserts, families: {fams})"
        )
    else:
        lp = p.leetcode
        src = f"train_path {lp.train_path}" if lp.train_path else f"train_from_test (split_seed {lp.split_seed})"
        hold = f"holdout_path {lp.holdout_path}" if lp.holdout_path else f"holdout carved from train ({lp.n_holdout})"
        L.append(f"- substrate: **leetcode**, {src}, {hold}")
        if lp.train_from_test:
            L.append(f"- split rule: {LEETCODE_SPLIT_DOC} Train comes from the test file: contamination-prone.")
    L.append(f"- training modes (`env.modes`, partition_seed {p.env.partition_seed}): {', '.join(p.env.modes)}")
    L.append(
        f"- test and holdout carry all loophole modes: {', '.join(LOOPHOLE_MODES)}; hint surfaces seeded by "
        f"seed {p.seed}"
    )
    L += ["", "## Split sizes", "", "| split | problems | rows | rows per problem |", "|---|---|---|---|"]
    per = {
        "train": "1: its partition mode, train surface",
        "test": f"{1 + 2 * len(LOOPHOLE_MODES)}: no hint + each loophole mode × (eval, train) surface",
        "holdout": f"{1 + len(LOOPHOLE_MODES)}: no hint + each loophole mode, train surface",
    }
    L += [f"| {s} | {len(base[s])} | {len(records[s])} | {per[s]} |" for s in SPLITS]

    L += [
        "",
        "## Canonical solutions through the grader",
        "",
        f"Fenced canonical solution of every no-hint problem, `grade_batch` in `{p.grader.mode}` mode, timeout "
        f"{p.grader.timeout_s:g} s, `Sandbox(concurrency={p.grader.concurrency})`, isolation `{isolation}`.",
        "",
        "| split | graded | correct | pass rate |",
        "|---|---|---|---|",
    ]
    n_all = c_all = 0
    for s in SPLITS:
        n, c = len(grades[s]), sum(g.eq_correct for g in grades[s])
        n_all, c_all = n_all + n, c_all + c
        L.append(f"| {s} | {n} | {c} | {c / n:.3f} |" if n else f"| {s} | 0 | 0 | – |")
    L.append(f"| all | {n_all} | {c_all} | {c_all / max(n_all, 1):.3f} |")
    fails = [(q.id, g.label) for s in SPLITS for q, g in zip(base[s], grades[s]) if not g.eq_correct]
    if fails:
        shown = ", ".join(f"{i} ({lb})" for i, lb in fails[:20])
        L += ["", f"Failing canonicals (first 20 of {len(fails)}): {shown}"]

    L += ["", "## Asserts per problem", "", "| split | min | mean | p50 | p95 | max |", "|---|---|---|---|---|---|"]
    L += [f"| {s} | {_stats([len(q.gt_answer) for q in base[s]])} |" for s in SPLITS]
    order = ("easy", "medium", "hard")
    rank = lambda lv: (order.index(lv) if lv in order else 3, lv)  # noqa: E731
    levels = sorted({q.difficulty for s in SPLITS for q in base[s]}, key=rank)
    L += ["", "## Difficulty", "", "| split | " + " | ".join(levels) + " |", "|---" * (len(levels) + 1) + "|"]
    L += [
        f"| {s} | " + " | ".join(str(Counter(q.difficulty for q in base[s])[lv]) for lv in levels) + " |"
        for s in SPLITS
    ]
    if p.substrate == "minileet":
        fam = {s: Counter(family_of(q) for q in base[s]) for s in SPLITS}
        names = sorted(set().union(*fam.values()))
        L += ["", f"## Families ({len(names)})", "", "| family | train | test | holdout |", "|---|---|---|---|"]
        L += [f"| {f} | {fam['train'][f]} | {fam['test'][f]} | {fam['holdout'][f]} |" for f in names]

    counts = Counter(mode_of(q) for q in records["train"])
    L += ["", "## Training prompts per mode", "", "| mode | prompts |", "|---|---|"]
    L += [f"| {m} | {counts[m]} |" for m in p.env.modes]

    sys_chars = sorted({len(q.prompt[0]["content"]) for s in SPLITS for q in records[s] if len(q.prompt) > 1})
    L += [
        "",
        "## Prompt length (characters of the user message; tokens come later)",
        "",
        f"The system message adds {', '.join(map(str, sys_chars))} characters to every prompt.",
        "",
        "| rows | n | min | mean | p50 | p95 | max |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in SPLITS:
        L.append(f"| {s} (all rows) | {len(records[s])} | {_stats([_user_chars(q) for q in records[s]])} |")
    L.append(
        f"| no hint (all problems) | {sum(map(len, base.values()))} | "
        f"{_stats([_user_chars(q) for s in SPLITS for q in base[s]])} |"
    )
    for surface in SURFACE_ORDER:
        for m in LOOPHOLE_MODES:
            rows = [q for q in records["test"] if mode_of(q) == m and q.prompt_metadata["surface"] == surface]
            xs = [_user_chars(q) for q in rows]
            L.append(f"| test, {m}, {surface} surface | {len(xs)} | {_stats(xs)} |")
    return "\n".join(L) + "\n"


# --- outputs ------------------------------------------------------------------------------------------------------


def save_outputs(out_dir: Path, report_path: Path, records: dict[str, list[Problem]], report: str) -> None:
    """<out_dir>/{train,test,holdout}.parquet + partition.json, and the report; all or nothing."""
    out_dir, report_path = Path(out_dir), Path(report_path)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    tmp_report = report_path.with_name(f".{report_path.name}.tmp")
    try:
        for s in SPLITS:
            save_problems_parquet(tmp / f"{s}.parquet", records[s])
        part = {str(k): v for k, v in partition_of(records["train"]).items()}
        (tmp / "partition.json").write_text(json.dumps(part, indent=0) + "\n")
        tmp_report.write_text(report)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        if out_dir.exists():  # swap: the old directory disappears only once the new one is complete
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old.", dir=out_dir.parent))
            os.replace(out_dir, old / out_dir.name)
            os.replace(tmp, out_dir)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out_dir)
        os.replace(tmp_report, report_path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp_report.unlink(missing_ok=True)

"""Guard rails against an uninformative hack direction: the bootstrap AUROC intervals (stats.py) that the train gate
and the basis report use, and the basis report's guard (selected basis vs placebo pair set vs random control, paired
on the same held-out pairs), down to the stage's JSON.

The train side (warning, `gate_uninformative`, resume) is in tests/test_train.py.

`pytest tests/test_guard_rails.py`
"""

import json
import math

import numpy as np
import pytest
import torch

from projected_grpo.common.stats import (
    auroc,
    auroc_interval,
    bootstrap_aurocs,
    contains,
    paired_auroc_diff,
    weighted_aurocs,
)
from projected_grpo.method.basis import Basis
from projected_grpo.method.basis_eval import N_BOOT, basis_guard, json_ready, render_guard
from tests.conftest import ROOT, stage_cli

# --- stats: AUROC and its bootstrap interval -------------------------------------------------------------------------


def naive_auroc(pos, neg) -> float:
    return float(np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg]))


def test_auroc_is_the_pairwise_definition_with_ties():
    rng = np.random.default_rng(1)
    pos, neg = rng.integers(0, 6, 17).astype(float), rng.integers(0, 6, 11).astype(float)  # many ties
    assert auroc(pos, neg) == pytest.approx(naive_auroc(pos, neg), abs=1e-12)
    assert auroc([2.0, 3.0], [1.0]) == 1.0 and auroc([1.0], [2.0, 3.0]) == 0.0 and auroc([1.0], [1.0]) == 0.5
    assert math.isnan(auroc([], [1.0]))
    # integer weights = repeated samples
    w_pos, w_neg = rng.integers(0, 4, (3, 17)), rng.integers(1, 4, (3, 11))
    got = weighted_aurocs(pos, neg, w_pos, w_neg)
    for b in range(3):
        assert got[b] == pytest.approx(naive_auroc(np.repeat(pos, w_pos[b]), np.repeat(neg, w_neg[b])), abs=1e-12)


def test_bootstrap_equals_a_reference_loop():
    """The vectorised resampling equals the textbook loop: draw n pair indices with replacement (the same generator
    draws), score AUROC on pos[idx], neg[idx], take the 2.5 / 97.5 percentiles."""
    rng = np.random.default_rng(2)
    n = 13
    pos, neg = rng.normal(0.5, 1, n), rng.normal(0, 1, n)
    idx = np.random.default_rng(7).integers(0, n, size=(200, n))
    ref = np.array([naive_auroc(pos[i], neg[i]) for i in idx])
    np.testing.assert_allclose(bootstrap_aurocs(pos, neg, n_boot=200, seed=7), ref, atol=1e-12)
    lo, hi = auroc_interval(pos, neg, n_boot=200, seed=7)
    assert (lo, hi) == pytest.approx(tuple(np.quantile(ref, [0.025, 0.975])), abs=1e-12)
    assert auroc_interval(pos, neg, n_boot=200, seed=7) == (lo, hi)  # deterministic
    assert auroc_interval(pos, neg, n_boot=200, seed=8) != (lo, hi)


def test_resampling_units_moves_a_completions_tokens_together():
    """Per-token calibration: every token of completion i belongs to unit i. Twenty identical token copies per
    completion carry no more evidence than one score per completion, so the interval is the per-pair one; counting the
    tokens as independent draws would make it far narrower (overconfident)."""
    rng = np.random.default_rng(3)
    n, L = 12, 20
    pos, neg = rng.normal(0.3, 1, n), rng.normal(0, 1, n)
    unit = np.repeat(np.arange(n), L)
    per_pair = auroc_interval(pos, neg, seed=0)
    per_token = auroc_interval(np.repeat(pos, L), np.repeat(neg, L), unit, unit, seed=0)
    assert per_token == pytest.approx(per_pair, abs=1e-12)
    independent = auroc_interval(np.repeat(pos, L), np.repeat(neg, L), seed=0)
    assert independent[1] - independent[0] < 0.5 * (per_pair[1] - per_pair[0])


def test_interval_separates_signal_from_noise():
    rng = np.random.default_rng(4)
    neg = rng.normal(0, 1, 28)
    lo, hi = auroc_interval(neg + 3.0 + rng.normal(0, 0.3, 28), neg, seed=0)  # a clean separation
    assert lo > 0.5 and not contains((lo, hi), 0.5)
    noise = auroc_interval(rng.normal(0, 1, 28), rng.normal(0, 1, 28), seed=0)
    assert contains(noise, 0.5)
    assert contains((math.nan, math.nan), 0.5) and not contains((0.51, 0.9), 0.5) and contains((0.5, 0.5), 0.5)
    with pytest.raises(ValueError, match="equal lengths"):
        auroc_interval([1.0, 2.0], [0.0])


def test_paired_difference_uses_the_same_resamples():
    """A monotone rescoring of the same pairs has the same AUROC on every resample: the paired difference is exactly
    0 with interval [0, 0] (independent resamples would spread it). A real gap is found with lo > 0."""
    rng = np.random.default_rng(5)
    pos, neg = rng.normal(0.4, 1, 20), rng.normal(0, 1, 20)
    assert paired_auroc_diff(pos, neg, 3 * pos - 1, 3 * neg - 1, seed=0) == (0.0, 0.0, 0.0)
    good = (neg + 2.0, neg)  # perfectly separating
    d, lo, hi = paired_auroc_diff(*good, rng.normal(0, 1, 20), rng.normal(0, 1, 20), seed=0)
    assert lo > 0 and lo <= d <= hi
    with pytest.raises(ValueError, match="same pairs"):
        paired_auroc_diff(pos, neg, pos[:3], neg[:3])


# --- basis guard -----------------------------------------------------------------------------------------------------


def synthetic(P: int = 24, D: int = 6, seed: int = 0):
    """Held-out pair gradients for two modules: hack = clean + a push along e_0 of module "a" (+ noise)."""
    g = torch.Generator().manual_seed(seed)
    clean = {"a": torch.randn(P, D, generator=g), "b": torch.randn(P, D, generator=g)}
    push = torch.zeros(D)
    push[0] = 3.0
    hack = {
        "a": clean["a"] + push + 0.3 * torch.randn(P, D, generator=g),
        "b": clean["b"] + 0.3 * torch.randn(P, D, generator=g),
    }
    return hack, clean


def along(module: str, i: int, D: int = 6) -> Basis:
    v = torch.zeros(D)
    v[i] = 1.0
    return Basis(vh={module: v[None]}, nu={module: v})


def test_basis_guard_informative_only_when_both_controls_are_beaten():
    hack, clean = synthetic()
    names = ("prog_wide/svd", "null_city", "prog_wide/calibrate")
    g = basis_guard(along("a", 0), along("a", 3), along("b", 1), hack, clean, 0, names)
    assert g["informative"] is True and g["line"].startswith("informative: ")
    assert g["auroc"] > 0.9 and g["auroc_ci"][0] > 0.5 and g["n_pairs"] == 24
    assert g["placebo_diff"][1] > 0 and g["random_diff"][1] > 0
    assert "`null_city`" in g["line"] and f"{N_BOOT} resamples, seed 0" in g["line"]
    # a placebo as good as the selected basis: the difference is 0 on every resample -> not informative
    same = basis_guard(along("a", 0), along("a", 0), along("b", 1), hack, clean, 0, names)
    assert same["informative"] is False and same["placebo_diff"] == [0.0, 0.0, 0.0]
    assert same["line"].startswith("NOT informative: ") and same["random_diff"][1] > 0
    # no placebo pairs, or an empty selected basis: undefined, never "informative"; the JSON has no NaN
    none = basis_guard(along("a", 0), None, along("b", 1), hack, clean, 0, names)
    assert none["informative"] is False and all(math.isnan(x) for x in none["placebo_diff"])
    empty = basis_guard(Basis({}, {}), along("a", 3), along("b", 1), hack, clean, 0, names)
    assert empty["informative"] is False and math.isnan(empty["auroc"])
    text = json.dumps(json_ready(empty), allow_nan=False)
    assert json.loads(text)["placebo_diff"] == [None, None, None]
    # deterministic for a fixed seed
    assert basis_guard(along("a", 0), along("a", 3), along("b", 1), hack, clean, 0, names) == g
    assert g["line"] in "\n".join(render_guard(g))


def test_basis_stage_report_opens_with_the_guard_and_writes_its_json(tmp_path):
    """The basis stage on the tiny model and a slice of the committed pair sets: reports/basis.md opens (after its
    title) with the guard's section, and --guard holds the same verdict as JSON with the keys the report stage
    reads."""
    import yaml
    from typer.testing import CliRunner

    from projected_grpo.env.minileet import make_minileet
    from projected_grpo.env.problems import save_problems_parquet
    from stages.basis import main

    probs = tmp_path / "problems"
    probs.mkdir()
    save_problems_parquet(probs / "holdout.parquet", make_minileet(seed=0, n_train=1)["holdout"])
    pairsets = tmp_path / "pairsets" / "minileet"  # one pair per split and mode of every committed pair set
    pairsets.mkdir(parents=True)
    for f in sorted((ROOT / "data" / "pairsets" / "minileet").glob("*.jsonl")):
        rows, keep, seen = [json.loads(x) for x in f.read_text().splitlines()], [], set()
        for r in rows:
            if (r["split"], r["mode"]) not in seen:
                seen.add((r["split"], r["mode"]))
                keep.append(r)
        (pairsets / f.name).write_text("".join(json.dumps(r) + "\n" for r in keep))
    d = yaml.safe_load((ROOT / "params.yaml").read_text())
    d["model"]["name"], d["adapter"]["rank"] = "tiny-random", 4
    d["basis"] |= {"k": 2, "n_flips": 100, "modes": None}
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(d))
    report, guard = tmp_path / "reports" / "basis.md", tmp_path / "reports" / "basis" / "guard.json"
    args = [
        "--organism",
        str(tmp_path / "none"),
        "--problems",
        str(probs),
        "--pairsets",
        str(pairsets.parent),
        "--svd-cache",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "basis"),
        "--report",
        str(report),
        "--metrics",
        str(tmp_path / "m.json"),
        "--guard",
        str(guard),
        "--params",
        str(params),
    ]
    res = CliRunner().invoke(stage_cli(main), args)
    assert res.exit_code == 0, res.output
    g = json.loads(guard.read_text())
    assert {"informative", "line", "auroc", "placebo_diff", "random_diff"} <= g.keys()
    assert isinstance(g["informative"], bool) and len(g["placebo_diff"]) == len(g["random_diff"]) == 3
    lines = report.read_text().splitlines()
    assert lines[0] == "# v_hack bases: held-out discrimination" and lines[2].startswith("## Guard")
    assert f"**{g['line']}**" in lines[:6]
    assert ("guard: informative" if g["informative"] else "guard: NOT informative") in res.output

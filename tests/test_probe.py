"""Distillation cosine probe: per-row gradients on the tiny model (batched = alone = basis.completion_grads), the sign
convention, the placebo basis (= the basis stage's), the paired-bootstrap AUROC checks T1–T4 on synthetic scores
(they PASS when hack rows are separable and FAIL when they are not), row selection, the report section and the stage
end to end.

`python -m pytest -q tests/test_probe.py`
"""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from projected_grpo.config import BasisParams, ProbeParams
from projected_grpo.method.basis import Basis, BasisSettings, auroc, build_basis, completion_grads
from projected_grpo.policy.adapter import adapters, attach_adapters
from projected_grpo.policy.tiny import tiny_model, tiny_tokenizer
from projected_grpo.report.probe import (
    BASES,
    CHECKS,
    ProbeResult,
    check_above_chance,
    check_beats,
    check_t1,
    check_t3,
    discrimination,
    flatten_pool,
    make_checks,
    make_result,
    placebo_basis,
    render,
    replay,
    replay_grads,
    row_cosines,
    row_grads,
    select_rows,
)
from projected_grpo.rl.pool import PoolRow
from tests.conftest import ROOT, stage_cli

TEXTS = [
    "```python\nclass Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]\n```",
    "def run_tests():\n    pass",
    "x",
    "```python\nseen = {}\nfor i, x in enumerate(nums):\n    seen[x] = i\n```",
    "return []",
]


def _record(i: int):
    return SimpleNamespace(
        prompt=(
            {"role": "system", "content": "You write Python."},
            {"role": "user", "content": f"Problem {i}: add up to target."},
        )
    )


@pytest.fixture(scope="module")
def setup():
    """fp64 tiny Qwen3 with SVD adapters at δS = 0, five pool rows on three prompts (stored ids end with EOS)."""
    tok = tiny_tokenizer()
    m = tiny_model(len(tok)).double()
    attach_adapters(m, "all", 6, param_dtype=torch.float64)
    records = {10 + i: _record(i) for i in range(3)}
    rows = [
        PoolRow(
            10 + i % 3,
            "run_tests",
            t,
            tuple(tok(t + tok.eos_token, add_special_tokens=False)["input_ids"]),
            0.0,
            "hack",
            False,
        )
        for i, t in enumerate(TEXTS)
    ]
    return tok, m, records, rows


def _unit(d: dict) -> dict:
    n = math.sqrt(sum(float(v.pow(2).sum()) for v in d.values()))
    return {k: v / n for k, v in d.items()}


def _alone(m, tok, records, rows):
    """Reference per-row gradients: each row on its own (batch of one), from re-tokenised text (basis.py's path)."""
    gs = [completion_grads(m, tok, [records[r.prompt_id]], [r.completion], 0.7, batch_size=1) for r in rows]
    return {n: torch.cat([g[n] for g in gs]) for n in gs[0]}


# --- (a) batched per-row gradients = each row alone -----------------------------------------------------------------


def test_stored_ids_end_with_eos_and_match_text(setup):
    tok, _, _, rows = setup
    assert all(r.token_ids[-1] == tok.eos_token_id for r in rows)
    assert len({len(r.token_ids) for r in rows}) > 1, "rows of different lengths exercise padding"


@pytest.mark.parametrize("micro_batch", [2, 5])
def test_batched_cosines_equal_single_row(setup, micro_batch):
    tok, m, records, rows = setup
    ref = _alone(m, tok, records, rows)  # {m: (5, D_m)}
    g = torch.Generator().manual_seed(0)
    nu = _unit({n: torch.randn(v.shape[1], generator=g, dtype=torch.float64) for n, v in list(ref.items())[::3]})
    cos, norm = replay(m, tok, records, rows, nu, 0.7, micro_batch)
    ref_dot = sum(ref[n] @ nu[n] for n in nu)
    ref_norm = sum(ref[n].pow(2).sum(-1) for n in nu).sqrt()
    torch.testing.assert_close(norm, ref_norm, rtol=1e-9, atol=0)
    torch.testing.assert_close(cos, ref_dot / ref_norm, rtol=1e-9, atol=1e-12)
    assert (norm > 0).all() and cos.abs().max() < 1 and len({round(float(c), 6) for c in cos}) == len(rows)


def test_row_grads_sum_to_the_full_batch_gradient(setup):
    """Σ_n e.grad[n] = ∇ Σ_n ℓ_n on δS (the probes carry the exact per-row split)."""
    tok, m, records, rows = setup
    from projected_grpo.report.probe import prompt_ids

    pr = prompt_ids(tok, [records[r.prompt_id] for r in rows])
    g = row_grads(m, pr, [r.token_ids for r in rows], tok.pad_token_id, 0.7, 5)
    from projected_grpo.policy.logprobs import batch_sequences, completion_logprobs, mean_nll

    ids, att, cm = batch_sequences(pr, [list(r.token_ids) for r in rows], tok.pad_token_id)
    ads = adapters(m)
    m.zero_grad(set_to_none=True)
    mean_nll(*completion_logprobs(m, ids, att, cm, 0.7)).sum().backward()
    for n, a in ads.items():
        torch.testing.assert_close(g[n].sum(0), a.delta.grad, rtol=1e-9, atol=1e-14)
    m.zero_grad(set_to_none=True)


# --- (b) sign convention ------------------------------------------------------------------------------------------


def test_planted_row_gradient_gives_cos_one(setup):
    tok, m, records, rows = setup
    ref = _alone(m, tok, records, rows[:1])
    nu = _unit({n: v[0] for n, v in ref.items()})  # ν planted along row 0's NLL gradient
    cos, _ = replay(m, tok, records, rows[:2], nu, 0.7, 2)
    assert abs(float(cos[0]) - 1) < 1e-9 and float(cos[1]) < 1 - 1e-6
    cos_neg, _ = replay(m, tok, records, rows[:1], {n: -v for n, v in nu.items()}, 0.7, 1)
    assert abs(float(cos_neg[0]) + 1) < 1e-9


def test_hack_side_scores_above_clean_side_under_build_basis_orientation(setup):
    """ν from build_basis (D = ∇ℓ(hack) − ∇ℓ(clean)): cos(∇ℓ(hack), ν) − cos(∇ℓ(clean), ν) = (‖g_h‖+‖g_c‖)(1 − cos θ)
    / ‖D‖ > 0, so imitating the hack completion scores positive relative to the clean one."""
    tok, m, records, rows = setup
    hack, clean = rows[0], rows[3]
    g = _alone(m, tok, records, [hack, clean])
    gh, gc = {n: v[:1] for n, v in g.items()}, {n: v[1:] for n, v in g.items()}
    s = BasisSettings("mean_diff", k_max=1, tau_rel=0.1, alpha_sig=0.05, n_flips=20, drop_frac=0.0, seed=0)
    b = build_basis(gh, gc, s)
    cos, norm = replay(m, tok, records, [hack, clean], b.nu, 0.7, 2)
    ch, cc = float(cos[0]), float(cos[1])
    assert ch > 0 and ch > cc
    gh_cat, gc_cat = torch.cat([gh[n][0] for n in b.nu]), torch.cat([gc[n][0] for n in b.nu])
    d = gh_cat - gc_cat
    expect = (gh_cat.norm() + gc_cat.norm()) * (1 - gh_cat @ gc_cat / (gh_cat.norm() * gc_cat.norm())) / d.norm()
    assert abs((ch - cc) - float(expect)) < 1e-9


def test_null_rows_are_nan():
    grads = {"a": torch.tensor([[1.0, 0.0], [0.0, 0.0], [math.nan, 1.0]], dtype=torch.float64)}
    cos, norm = row_cosines(grads, {"a": torch.tensor([1.0, 0.0])})
    assert float(cos[0]) == 1.0 and math.isnan(cos[1]) and math.isnan(cos[2]) and float(norm[1]) == 0


def test_empty_nu_scores_zero_and_ranks_nothing():
    """A basis that kept no direction (a placebo with k_total 0) scores 0 on every row: AUROC exactly 0.5."""
    grads = {"a": torch.randn(4, 3, dtype=torch.float64)}
    cos, norm = row_cosines(grads, {})
    zero = torch.zeros(4, dtype=torch.float64)
    assert torch.equal(cos, zero) and torch.equal(norm, zero)
    d = discrimination({"selected": [0.9, 0.8, 0.1, 0.2], "placebo": cos.tolist()}, [True, True, False, False], 200, 0)
    assert d["auroc"]["placebo"] == 0.5 and (d["boot"]["placebo"] == 0.5).all()


# --- (c) the placebo basis is the one the basis stage builds from the same pairs -----------------------------------


@pytest.fixture(scope="module")
def null_city():
    """Minileet holdout problems and a slice of the committed placebo pair set (4 extract + 1 calibrate pairs)."""
    from projected_grpo.env.minileet import make_minileet
    from projected_grpo.method.pairs import load_pairset

    holdout = {q.id: q for q in make_minileet(seed=0, n_train=1)["holdout"] if q.hint is None}  # as test_stages
    pairs = load_pairset(ROOT / "data" / "pairsets" / "minileet" / "null_city.jsonl")
    return holdout, [q for q in pairs if q.split == "extract"][:4] + [q for q in pairs if q.split == "calibrate"][:1]


@pytest.mark.parametrize("method,alpha", [("mean_diff", 0.05), ("svd", 0.5), ("random", 0.5)])
def test_placebo_basis_equals_the_basis_stage_construction(setup, null_city, method, alpha):
    from projected_grpo.method.basis_eval import make_basis, pair_grads

    tok, m, _, _ = setup
    holdout, pairs = null_city
    bp = BasisParams(pairset="null_city", method=method, k=2, alpha_sig=alpha, n_flips=100, drop_bottom_frac=0.25)
    got = placebo_basis(m, tok, pairs, holdout, bp, 0.7)
    built = method if method != "random" else "svd"  # as basis_eval builds each pair set's row
    want = make_basis(bp, pair_grads(m, tok, pairs, holdout, 0.7, bp.modes), built)
    assert got.meta["method"] == built and got.meta["n_pairs"] == 4 and got.meta["k_total"] == want.meta["k_total"]
    assert got.nu.keys() == want.nu.keys() and got.nu, "the placebo kept no direction: the test would be vacuous"
    for n in want.nu:
        torch.testing.assert_close(got.nu[n], want.nu[n], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(got.vh[n], want.vh[n], rtol=1e-9, atol=1e-12)


def test_placebo_without_pairs_of_the_modes_is_empty(setup, null_city):
    tok, m, _, _ = setup
    holdout, pairs = null_city
    bp = BasisParams(pairset="null_city", k=2, n_flips=100, modes=("sentinel",))
    ex = [q for q in pairs if q.mode != "sentinel"]
    b = placebo_basis(m, tok, ex, holdout, bp, 0.7)
    assert not b.nu and b.meta["k_total"] == 0 and b.meta["n_pairs"] == 0


# --- (d) AUROC, paired bootstrap and the checks T1–T4 ---------------------------------------------------------------


def test_t1_hack_rate_threshold_inclusive():
    labels = ["hack"] * 3 + ["correct"] * 5 + ["incorrect"] * 2
    c = check_t1(labels, 0.30)
    assert c.passed and c.verdict == "PASS" and c.numbers["hack_rate"] == 0.3 and c.numbers["n_hack"] == 3
    c = check_t1(labels[1:] + ["correct"], 0.30)
    assert not c.passed and c.verdict == "FAIL" and c.numbers["hack_rate"] == 0.2
    assert not check_t1([], 0.3).passed


def _synthetic(seed: int, n: int = 120, shift: float = 1.5, labels: str = "true") -> tuple[list[str], dict]:
    """n rows, half labelled hack; the selected basis' cosine is shifted up by `shift` on hack rows, the random and
    placebo cosines are noise. labels="random": labels drawn independently of every score."""
    g = torch.Generator().manual_seed(seed)
    hack = torch.arange(n) % 2 == 0
    noise = lambda: torch.randn(n, generator=g, dtype=torch.float64)
    scores = {"selected": noise() + shift * hack.double(), "random": noise(), "placebo": noise()}
    if labels == "random":
        hack = hack[torch.randperm(n, generator=g)]
    return ["hack" if h else "incorrect" for h in hack.tolist()], scores


def test_checks_pass_when_hack_rows_are_separable():
    for seed in range(10):
        labels, s = _synthetic(seed)
        ck = make_checks(labels, s, 0.3, 1000, seed)
        assert [ck[n].verdict for n in CHECKS] == ["PASS"] * 4, (seed, {n: ck[n].measured for n in CHECKS})
        assert 0.5 < ck["T2"].numbers["lo"] < ck["T2"].numbers["auroc"] < ck["T2"].numbers["hi"]


def test_checks_fail_when_labels_carry_no_signal():
    """Labels independent of the scores: the intervals cover 0.5 (T2) and 0 (T3, T4) on nearly every draw. A 95%
    interval clears them by chance about 2.5% of the time (≈ 0.5 passes in 20 draws; ≥ 3 has probability ≈ 1%)."""
    passes = {n: 0 for n in ("T2", "T3", "T4")}
    for seed in range(20):
        labels, s = _synthetic(seed, labels="random")
        ck = make_checks(labels, s, 0.3, 1000, seed)
        assert ck["T1"].passed  # the pool still hacks: only the ranking is missing
        for n in passes:
            passes[n] += ck[n].passed
    assert all(v <= 2 for v in passes.values()), passes


def test_selected_no_better_than_a_control_fails():
    labels, s = _synthetic(0)
    same = make_checks(labels, s | {"random": s["selected"]}, 0.3, 500, 0)  # the control is the selected basis
    n3 = same["T3"].numbers
    assert same["T2"].passed and not same["T3"].passed and n3["lo"] == n3["hi"] == n3["diff"] == 0.0
    better = make_checks(labels, s | {"placebo": 2 * s["selected"] + 0.5}, 0.3, 500, 0)  # same ranking: ties
    assert not better["T4"].passed and better["T4"].numbers["diff"] == 0.0
    worse = make_checks(labels, s | {"placebo": s["selected"] * 3, "selected": s["placebo"]}, 0.3, 500, 0)
    assert not worse["T2"].passed and not worse["T4"].passed and worse["T4"].numbers["hi"] < 0


def test_paired_interval_is_narrower_than_either_auroc_interval():
    """Same rows, same resamples: a control that tracks the selected score except on a few rows gives a difference
    interval much tighter than the two AUROC intervals, which an unpaired comparison could not resolve."""
    labels, s = _synthetic(1, shift=0.4)
    ctl = s["selected"].clone()
    ctl[:20:2] -= 3.0  # rows 0, 2, ..., 18 are hack rows: the control ranks ten hack rows near the bottom
    c = make_checks(labels, s | {"random": ctl}, 0.3, 1000, 0)["T3"]
    n = c.numbers
    assert c.passed and n["lo"] > 0 and n["hi"] - n["lo"] < 0.75 * (n["hi_random"] - n["lo_random"])
    assert n["lo_random"] < n["auroc"] < n["hi_random"], "unpaired: the intervals overlap"


def test_intervals_are_deterministic_and_seeded():
    labels, s = _synthetic(0, shift=0.3)
    a = discrimination(s, [x == "hack" for x in labels], 300, 7)
    b = discrimination(s, [x == "hack" for x in labels], 300, 7)
    c = discrimination(s, [x == "hack" for x in labels], 300, 8)
    assert all(np.array_equal(a["boot"][k], b["boot"][k]) for k in BASES)
    assert not np.array_equal(a["boot"]["selected"], c["boot"]["selected"]) and a["auroc"] == c["auroc"]
    assert make_checks(labels, s, 0.3, 300, 7) == make_checks(labels, s, 0.3, 300, 7)


def test_null_rows_are_dropped_for_every_basis():
    labels, s = _synthetic(0)
    s = {k: v.clone() for k, v in s.items()}
    s["placebo"][[0, 1]] = math.nan  # row 0 hack, row 1 other
    d = discrimination(s, [x == "hack" for x in labels], 100, 0)
    assert (d["n_null"], d["n_hack"], d["n_other"]) == (2, 59, 59)
    keep = torch.arange(2, 120)
    pos, neg = keep[keep % 2 == 0], keep[keep % 2 == 1]
    assert d["auroc"]["selected"] == pytest.approx(auroc(s["selected"][pos], s["selected"][neg]), abs=1e-15)


def test_too_few_rows_fail_with_a_reason():
    s = {b: [0.3, 0.1, 0.2] for b in BASES}
    ck = make_checks(["hack", "incorrect", "correct"], s, 0.3, 100, 0)
    for n in ("T2", "T3", "T4"):
        assert not ck[n].passed and ck[n].reason.startswith("too few rows") and ck[n].measured == ck[n].reason
    d = discrimination(s, [True, False, False], 100, 0)
    assert check_above_chance(d).numbers["n_hack"] == 1 and math.isnan(check_beats(d, "random", "T3").numbers["lo"])


def test_retired_t3_shim_is_ignored():
    """stages/report.py still calls check_t3(train-log rows, probe.t3_min_frac) and render(result, t3)."""
    assert check_t3([{"cos_before": 0.5, "cos_after": 0.1}], 0.8) is None
    r = _result()
    assert render(r, check_t3([], 0.8)) == render(r) == render(r, "anything")


# --- (e) selection --------------------------------------------------------------------------------------------------


def test_selection_deterministic_sized_and_seeded():
    a = select_rows(1000, 256, 0)
    assert a == select_rows(1000, 256, 0) and len(a) == 256 == len(set(a))
    assert a == sorted(a) and 0 <= a[0] and a[-1] < 1000
    assert a != select_rows(1000, 256, 1)
    assert select_rows(10, 256, 0) == list(range(10))  # a small pool is probed whole


def test_flatten_pool_orders_by_prompt_then_stored_order():
    mk = lambda pid, j: PoolRow(pid, None, f"{pid}-{j}", (0,), 0.0, "hack", False)
    pool = {7: [mk(7, 0), mk(7, 1)], 3: [mk(3, 0)], 5: [mk(5, 0), mk(5, 1)]}
    assert [r.completion for r in flatten_pool(pool)] == ["3-0", "5-0", "5-1", "7-0", "7-1"]


# --- (f) result, JSON and render --------------------------------------------------------------------------------


def _result() -> ProbeResult:
    labels, s = _synthetic(2, n=40)
    rows = [PoolRow(i, "run_tests", "", (0,), 0.0, lbl, lbl == "correct") for i, lbl in enumerate(labels)]
    s["placebo"][3] = math.nan
    norm = torch.ones(40, dtype=torch.float64)
    meta = {
        "student": "artifacts/organism/base",
        "pool": "artifacts/pool/pool.parquet",
        "n_pool": 4000,
        "basis": "artifacts/basis/basis.safetensors",
        "random": "artifacts/basis/random.safetensors",
        "placebo": "data/pairsets/minileet/null_city.jsonl",
        "holdout": "artifacts/problems/holdout.parquet",
        "temperature": 0.7,
        "modules": 21,
        "basis_seed": 0,
        "placebo_modules": 9,
        "placebo_k_total": 11,
        "placebo_pairs": 30,
    }
    return make_result(list(range(100, 140)), rows, s, norm, ProbeParams(), 5, meta, n_boot=400)


def test_make_result_runs_t1_to_t4_with_the_seed():
    r = _result()
    assert list(r.checks) == list(CHECKS) and r.meta["seed"] == 5 and r.meta["n_boot"] == 400
    assert r.checks["T2"].numbers["n_null"] == 1 and r.checks["T2"].numbers["seed"] == 5
    labels, s = _synthetic(2, n=40)
    s["placebo"][3] = math.nan
    assert r.checks == make_checks(labels, s, ProbeParams().t1_min_hack, 400, 5)
    assert r.cos_placebo[3] != r.cos_placebo[3] and r.cos_random == s["random"].tolist()


def test_json_roundtrip_is_standard_json():
    r = _result()
    d = r.to_dict()
    s = json.dumps(d, allow_nan=False)  # NaN became null
    assert set(d["rows"]) == set(ProbeResult.ROWS) and d["rows"]["cos_placebo"][3] is None
    assert d["checks"]["T2"]["numbers"]["auroc"] == r.checks["T2"].numbers["auroc"] and d["n_rows"] == 40
    back = ProbeResult.from_dict(json.loads(s))
    assert math.isnan(back.cos_placebo[3]) and back.cos == r.cos and back.checks == r.checks
    assert render(back) == render(r)
    old = json.loads(s)
    del old["rows"]["cos_random"]
    with pytest.raises(ValueError, match="old schema"):
        ProbeResult.from_dict(old)


def test_render_states_checks_rows_seeds_and_sources():
    r = _result()
    md = render(r)
    assert md.startswith("## Distillation cosine probe\n")
    table = [ln for ln in md.splitlines() if ln.startswith("| T")]
    assert [ln.split()[1] for ln in table] == list(CHECKS)
    assert [ln.rstrip(" |").rsplit("| ", 1)[1] for ln in table] == [r.checks[n].verdict for n in CHECKS]
    n2 = r.checks["T2"].numbers
    assert f"{n2['auroc']:.3f} [{n2['lo']:.3f}, {n2['hi']:.3f}]" in md
    assert "40 teacher-pool rows" in md and "seed 5" in md and "400 resamples" in md and "(19 rows)" in md
    srcs = (
        "artifacts/organism/base",
        "artifacts/pool/pool.parquet",
        "artifacts/basis/basis.safetensors",
        "artifacts/basis/random.safetensors",
        "null_city.jsonl",
        "artifacts/problems/holdout.parquet",
    )
    assert all(src in md for src in srcs)
    basis_rows = [
        ln.split("|")[1].strip() for ln in md.splitlines() if ln.startswith(("| selected", "| random", "| placebo"))
    ]
    assert basis_rows == list(BASES)


# --- the stage, end to end on the tiny model ---------------------------------------------------------------------


def test_stage_writes_json_and_fails_cleanly(tmp_path, setup, null_city):
    from projected_grpo.env.minileet import make_minileet
    from projected_grpo.env.problems import save_problems_parquet
    from projected_grpo.rl.pool import save_pool
    from stages.probe import main

    d = yaml.safe_load((ROOT / "params.yaml").read_text())
    d["model"]["name"], d["adapter"]["rank"], d["probe"]["n_rows"], d["eval"]["threads"] = "tiny-random", 8, 5, 1
    d["substrate"], d["basis"]["method"] = "minileet", "mean_diff"  # mean_diff: the placebo keeps directions
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(d))
    recs = make_minileet(seed=0, n_train=3, n_test=1, n_holdout=1)["train"]
    holdout, pairs = null_city
    (tmp_path / "problems").mkdir()
    save_problems_parquet(tmp_path / "problems" / "train.parquet", recs)
    save_problems_parquet(tmp_path / "problems" / "holdout.parquet", list(holdout.values()))
    (tmp_path / "pairsets" / "minileet").mkdir(parents=True)
    keys = ("id", "substrate", "problem_id", "method", "mode", "mechanism", "split", "hack", "clean")
    lines = [json.dumps({k: getattr(q, k) for k in keys}) + "\n" for q in pairs]
    (tmp_path / "pairsets" / "minileet" / "null_city.jsonl").write_text("".join(lines))
    tok = setup[0]  # the same deterministic tiny tokenizer the stage builds for model.name=tiny-random
    ids = lambda t: tuple(tok(t + tok.eos_token, add_special_tokens=False)["input_ids"])
    rows = [
        PoolRow(q.id, None, t, ids(t), 0.0, lbl, lbl == "correct")
        for q in recs
        for t, lbl in zip(TEXTS[:2], ["hack", "correct"])
    ]
    (tmp_path / "pool").mkdir()
    save_pool(tmp_path / "pool" / "pool.parquet", rows)
    m = tiny_model(len(tok))
    attach_adapters(m, "all", 8)
    names = list(adapters(m))
    g = torch.Generator().manual_seed(1)
    for f, mods in (("basis", names[:3]), ("random", names[:3])):
        nu = _unit({n: torch.randn(adapters(m)[n].dim, generator=g) for n in mods})
        vh = {n: v[None].clone() for n, v in nu.items()}  # (1, D_m); safetensors refuses shared storage
        Basis(vh=vh, nu=nu, meta={}).save(tmp_path / "basis" / f"{f}.safetensors")

    app = stage_cli(main)
    out = tmp_path / "reports" / "probe" / "probe.json"
    opts = {
        "organism": tmp_path / "org",
        "problems": tmp_path / "problems",
        "pool": tmp_path / "pool",
        "basis": tmp_path / "basis",
        "pairsets": tmp_path / "pairsets",
        "out": out,
        "params": params,
    }
    argv = lambda o: [x for k, v in o.items() for x in (f"--{k}", str(v))]
    res = CliRunner().invoke(app, argv(opts))
    assert res.exit_code == 0, res.output
    j = json.loads(out.read_text())
    assert j["n_rows"] == 5 and j["n_pool"] == 6 and list(j["checks"]) == list(CHECKS)
    assert set(j["rows"]) == set(ProbeResult.ROWS) and j["seed"] == d["seed"] and j["n_boot"] == 1000
    assert j["placebo"].endswith("null_city.jsonl") and j["random"].endswith("random.safetensors")
    assert j["placebo_pairs"] == 4 and j["placebo_method"] == "mean_diff" and j["placebo_k_total"] > 0
    assert j["rows"]["pool_index"] == select_rows(6, 5, d["seed"])
    flat = flatten_pool({q.id: [r for r in rows if r.prompt_id == q.id] for q in recs})
    sel = [flat[i] for i in j["rows"]["pool_index"]]
    assert j["rows"]["label"] == [r.label for r in sel]
    # one replay, three ν's: each cosine column equals a replay with that basis' ν on an identically built student
    recmap = {q.id: q for q in recs}
    plc = placebo_basis(m, tok, pairs, holdout, BasisParams(**{**d["basis"], "modes": None}), 0.7)
    grads = replay_grads(m, tok, recmap, sel, d["rollout"]["temperature"], 2)
    for col, f in (("cos", "basis"), ("cos_random", "random")):
        want = row_cosines(grads, Basis.load(tmp_path / "basis" / f"{f}.safetensors").nu)[0]
        assert j["rows"][col] == pytest.approx(want.tolist(), abs=1e-5)
    assert j["rows"]["cos_placebo"] == pytest.approx(row_cosines(grads, plc.nu)[0].tolist(), abs=1e-5)
    back = ProbeResult.from_dict(j)
    assert back.checks == make_checks(
        back.label,
        {"selected": back.cos, "random": back.cos_random, "placebo": back.cos_placebo},
        d["probe"]["t1_min_hack"],
        1000,
        d["seed"],
    )
    assert list(out.parent.iterdir()) == [out], "no temporary file left behind"
    assert json.dumps(j, allow_nan=False)  # standard JSON: null, never NaN

    out.unlink()
    bad = CliRunner().invoke(app, argv(opts | {"pool": tmp_path / "nope"}))
    assert bad.exit_code != 0 and "missing input" in bad.output and "nope" in bad.output and not out.exists()
    (tmp_path / "basis" / "random.safetensors").unlink()
    bad = CliRunner().invoke(app, argv(opts))
    assert bad.exit_code != 0 and "random.safetensors" in bad.output and not out.exists()

"""Distillation cosine probe: per-row gradients on the tiny model (batched = alone = basis.completion_grads), the sign
convention, the checks T1–T4 on synthetic inputs, row selection, the report section and the stage end to end.

`pytest tests/test_probe.py`
"""

import json
import math
from types import SimpleNamespace

import pytest
import torch
import yaml
from scipy import stats
from typer.testing import CliRunner

from projected_grpo.adapter import adapters, attach_adapters
from projected_grpo.basis import Basis, build_basis, completion_grads
from projected_grpo.config import ProbeParams
from projected_grpo.log import StepLog, read_tsv
from projected_grpo.pool import PoolRow
from projected_grpo.probe import (
    CHECKS,
    ProbeResult,
    check_t1,
    check_t2,
    check_t3,
    check_t4,
    flatten_pool,
    is_projected_step,
    make_result,
    render,
    replay,
    row_cosines,
    row_grads,
    select_rows,
)  # fmt: skip
from projected_grpo.tiny import tiny_model, tiny_tokenizer
from tests.conftest import ROOT, stage_cli

TEXTS = [
    "```python\nclass Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]\n```",
    "def run_tests():\n    pass",
    "x",
    "```python\nseen = {}\nfor i, x in enumerate(nums):\n    seen[x] = i\n```",
    "return []",
]


def _record(i: int):
    return SimpleNamespace(prompt=({"role": "system", "content": "You write Python."},
                                   {"role": "user", "content": f"Problem {i}: add up to target."}))  # fmt: skip


@pytest.fixture(scope="module")
def setup():
    """fp64 tiny Qwen3 with SVD adapters at δS = 0, five pool rows on three prompts (stored ids end with EOS)."""
    tok = tiny_tokenizer()
    m = tiny_model(len(tok)).double()
    attach_adapters(m, "all", 6, param_dtype=torch.float64)
    records = {10 + i: _record(i) for i in range(3)}
    rows = [PoolRow(10 + i % 3, "run_tests", t, tuple(tok(t + tok.eos_token, add_special_tokens=False)["input_ids"]),
                    0.0, "hack", False) for i, t in enumerate(TEXTS)]  # fmt: skip
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
    from projected_grpo.probe import prompt_ids

    pr = prompt_ids(tok, [records[r.prompt_id] for r in rows])
    g = row_grads(m, pr, [r.token_ids for r in rows], tok.pad_token_id, 0.7, 5)
    from projected_grpo.logprobs import batch_sequences, completion_logprobs, mean_nll

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
    b = build_basis(gh, gc, "mean_diff", k_max=1, tau_rel=0.1, alpha_sig=0.05, n_flips=20, drop_frac=0.0, seed=0)
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


# --- (c) T1, T2, T4 ------------------------------------------------------------------------------------------------


def test_t1_hack_rate_threshold_inclusive():
    labels = ["hack"] * 3 + ["correct"] * 5 + ["incorrect"] * 2
    c = check_t1(labels, 0.30)
    assert c.passed and c.verdict == "PASS" and c.numbers["hack_rate"] == 0.3 and c.numbers["n_hack"] == 3
    c = check_t1(labels[1:] + ["correct"], 0.30)
    assert not c.passed and c.verdict == "FAIL" and c.numbers["hack_rate"] == 0.2
    assert not check_t1([], 0.3).passed


def test_t2_counts_nan_and_zero_norm_as_null():
    cos = [0.1, -0.2, math.nan, 0.0, 0.3, 0.05, 0.2, -0.1, 0.4, 0.0]
    norm = [1.0, 2.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, math.inf, 1.0]  # nan cos, zero norm, inf norm: 3 null
    c = check_t2(cos, norm, 0.7)
    assert c.passed and c.numbers["n_nonnull"] == 7 and c.numbers["nonnull_frac"] == pytest.approx(0.7)
    assert not check_t2(cos, norm, 0.71).passed


def _welch_by_hand(a: list[float], b: list[float]) -> tuple[float, float, float]:
    na, nb = len(a), len(b)
    ma, mb = sum(a) / na, sum(b) / nb
    va = sum((x - ma) ** 2 for x in a) / (na - 1)
    vb = sum((x - mb) ** 2 for x in b) / (nb - 1)
    se2 = va / na + vb / nb
    t = (ma - mb) / math.sqrt(se2)
    df = se2**2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
    return t, df, float(stats.t.sf(t, df))  # one-sided: P(T_df ≥ t)


def test_t4_welch_pvalue_matches_hand_computation():
    fail, ok = [0.3, 0.5, 0.4, 0.6], [0.1, 0.0, 0.2]
    t, df, p = _welch_by_hand(fail, ok)
    assert t == pytest.approx(0.35 / math.sqrt(0.05 / 3 / 4 + 0.01 / 3)) and df == pytest.approx(4.959, abs=1e-3)
    # non-hacked rows and null hacked rows are ignored
    cos = fail + ok + [9.0, -9.0, math.nan, math.nan]
    hacked = [True] * 7 + [False, False, True, True]
    gt_pass = [False] * 4 + [True] * 3 + [True, False, True, False]
    c = check_t4(cos, hacked, gt_pass, 0.05)
    assert c.numbers["n_gt_fail"] == 4 and c.numbers["n_gt_pass"] == 3
    assert c.numbers["t"] == pytest.approx(t, rel=1e-12) and c.numbers["df"] == pytest.approx(df, rel=1e-12)
    assert c.numbers["p"] == pytest.approx(p, rel=1e-9) and 0.001 < p < 0.05 and c.passed
    assert c.numbers["mean_gt_fail"] == pytest.approx(0.45) and c.numbers["mean_gt_pass"] == pytest.approx(0.1)
    # the wrong direction: one-sided p = 1 − p
    r = check_t4(ok + fail, [True] * 7, [False] * 3 + [True] * 4, 0.05)
    assert not r.passed and r.numbers["p"] == pytest.approx(1 - p, rel=1e-9)


def test_t4_too_few_rows():
    c = check_t4([0.5, 0.6, 0.7, 0.1], [True] * 4, [False, False, False, True], 0.05)
    assert not c.passed and c.reason.startswith("too few rows") and "too few rows" in c.measured
    assert c.numbers["n_gt_pass"] == 1 and math.isnan(c.numbers["p"])
    c = check_t4([0.5, 0.6, 0.1, 0.2], [True, True, False, False], [False, False, True, True], 0.05)
    assert not c.passed and "too few rows" in c.reason  # the gt-pass rows are not hacked
    c = check_t4([0.5, 0.6, math.nan, 0.2], [True] * 4, [False, False, True, True], 0.05)
    assert not c.passed and "too few rows" in c.reason  # a null cosine does not count


# --- (d) T3 on training-log rows ------------------------------------------------------------------------------------


T3_ROWS = [
    {"cos_before": 0.5, "cos_after": 0.1},  # projected, lower
    {"cos_before": 0.2, "cos_after": 0.3},  # projected, higher
    {"cos_before": math.nan, "cos_after": math.nan},  # NaN: not a step
    {"cos_before": 0.4, "cos_after": math.nan},  # NaN: not a step
    {"cos_before": -0.3, "cos_after": -0.3},  # the arm did nothing
    {"cos_before": 0.1, "cos_after": 0.1 + 1e-7},  # round-off only: nothing
    {"reward": 1.0},  # an arm without a basis: no columns
    {"cos_before": -0.2, "cos_after": -0.4},  # projected, lower (one-sided erase with negative total cos)
]


def test_t3_fraction_over_projected_steps():
    assert [is_projected_step(r) for r in T3_ROWS] == [True, True, False, False, False, False, False, True]
    c = check_t3(T3_ROWS, 0.6)
    assert c.passed and c.numbers["n_projected"] == 3 and c.numbers["n_lower"] == 2
    assert c.numbers["lower_frac"] == pytest.approx(2 / 3) and c.numbers["n_nan"] == 3
    assert c.numbers["n_unchanged"] == 2 and c.numbers["n_log_rows"] == 8
    assert not check_t3(T3_ROWS, 0.8).passed
    none = check_t3(T3_ROWS[2:7], 0.5)
    assert not none.passed and none.reason == "no projected steps"


def test_t3_reads_training_tsv(tmp_path):
    log = StepLog(tmp_path / "arm.tsv")
    for i, r in enumerate(T3_ROWS[:6] + T3_ROWS[7:]):
        log(i + 1, 7, reward=1.0, cos_before=r["cos_before"], cos_after=r["cos_after"])
    rows = read_tsv(tmp_path / "arm.tsv")
    c = check_t3(rows, 0.6)
    assert c.numbers["n_projected"] == 3 and c.numbers["n_lower"] == 2 and c.numbers["n_nan"] == 2


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
    kinds = [("hack", False)] * 3 + [("correct", True)] * 2 + [("hack", True)]
    rows = [PoolRow(i, "run_tests", "", (0,), 0.0, lbl, eq) for i, (lbl, eq) in enumerate(kinds)]
    cos = torch.tensor([0.4, 0.5, math.nan, -0.1, 0.0, 0.3], dtype=torch.float64)
    norm = torch.tensor([1.0, 1.0, 0.0, 2.0, 1.0, 1.0], dtype=torch.float64)
    meta = {"student": "artifacts/organism/base", "pool": "artifacts/pool/pool.parquet", "n_pool": 4000, "seed": 0,
            "basis": "artifacts/basis/basis.safetensors", "temperature": 0.7, "modules": 21}  # fmt: skip
    return make_result([2, 5, 9, 11, 40, 41], rows, cos, norm, ProbeParams(), meta)


def test_make_result_runs_t1_t2_t4():
    r = _result()
    assert set(r.checks) == {"T1", "T2", "T4"}
    assert r.checks["T1"].numbers["n_hack"] == 4 and r.checks["T1"].passed
    assert r.checks["T2"].numbers["n_nonnull"] == 5 and not r.checks["T2"].passed  # 5/6 < 0.90
    assert not r.checks["T4"].passed and "too few rows" in r.checks["T4"].reason  # 2 null-free fail rows, 1 pass


def test_make_result_t4_counts_loose_hacks_so_the_gt_pass_group_can_exist():
    """Strict `hack` implies a failed ground truth; T4 compares within loosely hacked rows (labels.LOOSE), where
    `correct_attempted_hack` rows are the gt-pass group and `incorrect`/`correct` rows are not hacked at all."""
    kinds = [("hack", False)] * 3 + [("correct_attempted_hack", True)] * 3 + [("correct", True), ("incorrect", False)]
    rows = [PoolRow(i, "run_tests", "", (0,), 0.0, lbl, eq) for i, (lbl, eq) in enumerate(kinds)]
    cos = torch.tensor([0.5, 0.6, 0.7, 0.1, 0.0, 0.2, 0.9, -0.9], dtype=torch.float64)
    r = make_result(list(range(8)), rows, cos, torch.ones(8, dtype=torch.float64), ProbeParams())
    n = r.checks["T4"].numbers
    assert (n["n_gt_fail"], n["n_gt_pass"]) == (3, 3)
    assert abs(n["mean_gt_fail"] - 0.6) < 1e-12 and abs(n["mean_gt_pass"] - 0.1) < 1e-12
    assert r.checks["T4"].passed  # t = 0.5 / sqrt(0.01/3 + 0.01/3) ≈ 6.1 on ~4 df: p < 0.05


def test_json_roundtrip_is_standard_json():
    r = _result()
    d = r.to_dict()
    s = json.dumps(d, allow_nan=False)  # NaN became null
    back = ProbeResult.from_dict(json.loads(s))
    assert d["rows"]["cos"][2] is None and math.isnan(back.cos[2]) and back.cos[:2] == [0.4, 0.5]
    assert d["checks"]["T1"]["verdict"] == "PASS" and d["n_rows"] == 6 and d["student"] == r.meta["student"]
    assert render(back) == render(r)


def test_render_has_every_check_and_verdicts():
    r = _result()
    t3 = check_t3(T3_ROWS, 0.6)
    md = render(r, t3)
    assert md.startswith("## Distillation cosine probe\n")
    table = [ln for ln in md.splitlines() if ln.startswith("| T")]
    assert [ln.split()[1] for ln in table] == list(CHECKS)
    assert [ln.rstrip(" |").rsplit("| ", 1)[1] for ln in table] == ["PASS", "FAIL", "PASS", "FAIL"]
    assert "6 teacher-pool rows" in md and "artifacts/organism/base" in md and "artifacts/pool/pool.parquet" in md
    assert "artifacts/basis/basis.safetensors" in md and "0.667 (2/3 steps)" in md and "too few rows" in md
    no_t3 = render(r)
    assert "| T3 " in no_t3 and "not measured" in no_t3


# --- the stage, end to end on the tiny model ---------------------------------------------------------------------


def test_stage_writes_json_and_fails_cleanly(tmp_path, setup):
    from projected_grpo.minileet import make_minileet
    from projected_grpo.pool import save_pool
    from projected_grpo.problems import save_problems_parquet
    from stages.probe import main

    d = yaml.safe_load((ROOT / "params.yaml").read_text())
    d["model"]["name"], d["adapter"]["rank"], d["probe"]["n_rows"], d["eval"]["threads"] = "tiny-random", 8, 5, 1
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(d))
    recs = make_minileet(seed=0, n_train=3, n_test=1, n_holdout=1)["train"]
    (tmp_path / "problems").mkdir()
    save_problems_parquet(tmp_path / "problems" / "train.parquet", recs)
    tok = setup[0]  # the same deterministic tiny tokenizer the stage builds for model.name=tiny-random
    ids = lambda t: tuple(tok(t + tok.eos_token, add_special_tokens=False)["input_ids"])
    rows = [PoolRow(q.id, None, t, ids(t), 0.0, lbl, lbl == "correct") for q in recs
            for t, lbl in zip(TEXTS[:2], ["hack", "correct"])]  # fmt: skip
    (tmp_path / "pool").mkdir()
    save_pool(tmp_path / "pool" / "pool.parquet", rows)
    m = tiny_model(len(tok))
    attach_adapters(m, "all", 8)
    names = list(adapters(m))[:3]
    g = torch.Generator().manual_seed(1)
    nu = _unit({n: torch.randn(adapters(m)[n].dim, generator=g) for n in names})
    vh = {n: v[None].clone() for n, v in nu.items()}  # (1, D_m); safetensors refuses shared storage
    Basis(vh=vh, nu=nu, meta={}).save(tmp_path / "basis" / "basis.safetensors")

    app = stage_cli(main)
    out = tmp_path / "reports" / "probe" / "probe.json"
    opts = {"organism": tmp_path / "org", "problems": tmp_path / "problems", "pool": tmp_path / "pool",
            "basis": tmp_path / "basis", "out": out, "params": params}  # fmt: skip
    argv = lambda o: [x for k, v in o.items() for x in (f"--{k}", str(v))]
    res = CliRunner().invoke(app, argv(opts))
    assert res.exit_code == 0, res.output
    j = json.loads(out.read_text())
    assert j["n_rows"] == 5 and j["n_pool"] == 6 and set(j["checks"]) == {"T1", "T2", "T4"}
    assert set(j["rows"]) >= {"cos", "label", "eq_correct", "mode", "prompt_id", "pool_index"}
    assert j["rows"]["pool_index"] == select_rows(6, 5, d["seed"]) and j["checks"]["T2"]["verdict"] == "PASS"
    flat = flatten_pool({q.id: [r for r in rows if r.prompt_id == q.id] for q in recs})
    sel = [flat[i] for i in j["rows"]["pool_index"]]
    assert j["rows"]["label"] == [r.label for r in sel]
    cos, _ = replay(m, tok, {q.id: q for q in recs}, sel, nu, d["rollout"]["temperature"], 2)
    assert j["rows"]["cos"] == pytest.approx(cos.tolist(), abs=1e-5)
    assert list(out.parent.iterdir()) == [out], "no temporary file left behind"
    assert json.dumps(j, allow_nan=False)  # standard JSON: null, never NaN

    out.unlink()
    bad = CliRunner().invoke(app, argv(opts | {"pool": tmp_path / "nope"}))
    assert bad.exit_code != 0 and "missing input" in bad.output and "nope" in bad.output and not out.exists()

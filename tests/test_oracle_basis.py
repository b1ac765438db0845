"""The oracle basis (method/oracle_basis.py, stage oracle_basis): problems, pairing, split, overlap, extraction, and
the arms that read it (direction.load_run_basis / check_run_basis)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from projected_grpo.config import Params, with_overrides
from projected_grpo.env.minileet import make_minileet
from projected_grpo.env.modes import LOOPHOLE_MODES, apply_mode, mode_of
from projected_grpo.env.problems import save_problems_parquet
from projected_grpo.method import oracle_basis as O
from projected_grpo.method.arms import VARIANTS, make
from projected_grpo.method.basis import Basis, random_directions
from projected_grpo.method.direction import RunBasis, check_run_basis, load_run_basis
from projected_grpo.method.pairs import ORACLE_PAIRS, load_pairset
from projected_grpo.policy.adapter import attach_adapters
from projected_grpo.policy.tiny import tiny_model, tiny_tokenizer
from projected_grpo.sft.sft_corpus import fence, named_exploit_styles, wrong_variants


@pytest.fixture(scope="module")
def holdout():
    return make_minileet(seed=0, n_train=1, n_test=1, n_holdout=14)["holdout"]


def test_problems_are_distinct_holdout_records_under_every_loophole_in_turn(holdout):
    recs = O.oracle_problems(holdout, 12, seed=3)
    assert len({q.id for q in recs}) == 12 and {q.id for q in recs} <= {q.id for q in holdout}
    assert [mode_of(q) for q in recs] == [LOOPHOLE_MODES[i % 6] for i in range(12)]
    assert all(q.hint is not None and q.prompt_metadata["surface"] == "train" for q in recs)
    assert [q.id for q in O.oracle_problems(reversed(holdout), 12, seed=3)] == [q.id for q in recs]  # order-free
    assert [q.id for q in O.oracle_problems(holdout, 12, seed=4)] != [q.id for q in recs]
    with pytest.raises(ValueError, match="oracle_basis.problems=15 but the holdout split has 14"):
        O.oracle_problems(holdout, 15, seed=3)


def test_held_out_problems_are_a_seeded_share():
    ids = list(range(100, 130))
    cal = O.held_out_problems(ids, 0.34, seed=1)
    assert len(cal) == round(0.34 * 30) and cal <= set(ids)
    assert cal == O.held_out_problems(reversed(ids), 0.34, seed=1) != O.held_out_problems(ids, 0.34, seed=2)


def _sample(seed, rec, text, label):
    return O.Sample(seed, rec, text, label)


def test_pairs_join_a_hack_with_the_same_policys_clean_attempt_at_the_same_prompt(holdout, tmp_path):
    a, b = (apply_mode(q, m, "train") for q, m in zip(holdout[:2], ("run_tests", "sentinel")))
    samples = [
        _sample(41, a, "H1", "hack"),
        _sample(41, a, "H1", "hack"),  # a repeat is one completion
        _sample(41, a, "H2", "hack"),
        _sample(41, a, "I1", "incorrect"),
        _sample(41, a, "C1", "correct"),  # correct is preferred over incorrect
        _sample(41, a, "X1", "attempted_hack"),  # a loose hack label is never the clean side
        _sample(42, a, "H3", "hack"),  # seed 42 has no clean attempt at a: no pair across seeds
        _sample(42, b, "H4", "hack"),
        _sample(42, b, "I2", "incorrect"),
        _sample(43, b, "C2", "correct"),  # no hack of seed 43
    ]
    pairs = O.rollout_pairs(samples, cal={b.id}, substrate="minileet")
    got = [(q.id, q.hack, q.clean, q.split, q.mode) for q in pairs]
    assert got == [
        (f"oracle-s41-{a.id}-run_tests-0", "H1", "C1", "extract", "run_tests"),
        (f"oracle-s41-{a.id}-run_tests-1", "H2", "I1", "extract", "run_tests"),
        (f"oracle-s42-{b.id}-sentinel-0", "H4", "I2", "calibrate", "sentinel"),
    ]
    assert all(q.method == a.method for q in pairs[:2]) and pairs[2].method == b.method
    O.save_pairs(tmp_path / "p.jsonl", pairs)
    assert load_pairset(tmp_path / "p.jsonl") == pairs  # the pair-set format: the loaders read it


def test_subspace_overlap_is_one_for_the_same_span_and_zero_for_orthogonal_ones():
    g = torch.Generator().manual_seed(0)
    Q = torch.linalg.qr(torch.randn(40, 40, generator=g, dtype=torch.float64))[0].T  # orthonormal rows
    rot = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=torch.float64))[0]
    a = {"m": Q[:3], "only_a": Q[:1]}
    same = O.subspace_overlap(a, {"m": rot @ Q[:3], "only_b": Q[:2]})  # another basis of the same span
    assert same["overlap"] == pytest.approx(1.0) and same["chance"] == pytest.approx(3 * 3 / 40 / 3)
    assert (same["shared"], same["only_oracle"], same["only_pairset"]) == (1, 1, 1)
    assert O.subspace_overlap(a, {"m": Q[3:5]})["overlap"] == pytest.approx(0.0, abs=1e-12)
    half = O.subspace_overlap({"m": Q[:2]}, {"m": Q[1:3]})
    assert half["overlap"] == pytest.approx(0.5)
    assert math.isnan(O.subspace_overlap({}, {})["overlap"])
    r = random_directions(3, 40, g, torch.float64)
    assert O.subspace_overlap({"m": Q[:3]}, {"m": r})["overlap"] < 0.3  # a random span overlaps about 3/40


def _params() -> Params:
    p = Params()
    return dataclasses.replace(
        p,
        model=dataclasses.replace(p.model, name="tiny-random"),
        basis=dataclasses.replace(p.basis, k=2, tau=0.0, alpha_sig=0.99, n_flips=50, drop_bottom_frac=0.0),
    )


def _exploit_pairs(holdout, n_ex: int, n_cal: int):
    """Oracle-style pairs on the holdout problems: a run_tests exploit (hack) vs the canonical solution (clean)."""
    samples = []
    for q in holdout[: n_ex + n_cal]:
        r = apply_mode(q, "run_tests", "train")
        wrong = wrong_variants(q.canonical_solution, 0, 1)[0]
        hack = fence(named_exploit_styles("run_tests", q.method, "run_tests", wrong)["pass"])
        samples += [_sample(41, r, hack, "hack"), _sample(41, r, fence(q.canonical_solution), "correct")]
    cal = {q.id for q in holdout[n_ex : n_ex + n_cal]}
    return O.rollout_pairs(samples, cal, "minileet")


@pytest.fixture(scope="module")
def tiny():
    tok = tiny_tokenizer()
    m = tiny_model(len(tok))
    attach_adapters(m, "all", 4)
    return m, tok


def _pairset_basis(m):
    from projected_grpo.policy.adapter import adapters

    g = torch.Generator().manual_seed(1)
    vh = {n: random_directions(1, a.delta.shape[0], g) for n, a in list(adapters(m).items())[:3]}
    nu = {n: v[0] / math.sqrt(len(vh)) for n, v in vh.items()}  # a unit scoring direction over the modules
    return {"basis": Basis(vh=vh, nu=nu, meta={"k_total": 3}), "act": Basis({}, {}, {}, v_act=torch.ones(32))}


def test_extraction_writes_an_oracle_basis_and_its_table(holdout, tiny, tmp_path):
    m, tok = tiny
    p = _params()
    pairs = _exploit_pairs(holdout, 6, 4)
    hold = {q.id: q for q in holdout}
    res = O.extract_oracle(m, tok, pairs, pairs, hold, _pairset_basis(m), p)
    assert (res["n_extract"], res["n_cal"]) == (6, 4)
    b, rnd, act = res["selected"], res["random"], res["act"]
    assert b.vh and b.meta["oracle"] and rnd.meta["oracle"] and act.meta["oracle"] and act.v_act is not None
    assert rnd.k == b.k and rnd.meta["control_for"] == "svd"  # the control: same modules, same k
    assert res["k_total"] == sum(b.k.values()) and res["modules"] == len(b.vh)
    assert set(res["disc"]) == set(O.DISC)
    for key, d in res["disc"].items():
        assert 0 <= d["auroc"] <= 1 and d["n"] == 4, key
    res |= {"labels": {41: {"hack": 10, "correct": 10}}, "setup": O.setup(p, 200)}
    md = O.render_report(res, "src")
    assert "hack rate s41 50.0%" in md and "Pairs: 6 extraction, 4 held out" in md and "oracle" in md
    assert O.metrics(res)["n_cal"] == 4
    assert set(O.metrics(res)) >= {
        "auroc_oracle_own",
        "auroc_oracle_own_lo",
        "auroc_oracle_own_hi",
        "overlap",
        "act_cosine",
    }


def test_too_few_pairs_give_an_empty_basis_that_the_arms_refuse(holdout, tiny, tmp_path):
    m, tok = tiny
    p = _params()
    pairs = _exploit_pairs(holdout, 3, 1)  # one held-out pair: too few to calibrate on
    res = O.extract_oracle(m, tok, pairs, pairs, {q.id: q for q in holdout}, _pairset_basis(m), p)
    assert res["selected"].meta["empty"] and not res["selected"].vh and res["k_total"] == 0
    assert set(res["disc"]) == set(O.DISC) and all(math.isnan(d["auroc"]) for d in res["disc"].values())
    out = tmp_path / "oracle"
    for name, b in (("basis", res["selected"]), ("random", res["random"]), ("act", res["act"])):
        b.save(out / f"{name}.safetensors")
    O.save_pairs(out / ORACLE_PAIRS, pairs)
    with pytest.raises(ValueError, match="the oracle basis is empty"):
        load_run_basis(p, make("route", "route_masked", "oracle_basis"), out, None, tmp_path)


def _oracle_stage_dir(holdout, tiny, tmp_path, p):
    """What the oracle_basis stage writes (basis, random and act safetensors, pairs.jsonl; 6 extraction and 4
    calibration pairs) and a problems dir with the holdout split -> (pairs, extraction result, out dir, problems)."""
    m, tok = tiny
    pairs = _exploit_pairs(holdout, 6, 4)
    res = O.extract_oracle(m, tok, pairs, pairs, {q.id: q for q in holdout}, _pairset_basis(m), p)
    out = tmp_path / "oracle"
    for name, b in (("basis", res["selected"]), ("random", res["random"]), ("act", res["act"])):
        b.save(out / f"{name}.safetensors")
    O.save_pairs(out / ORACLE_PAIRS, pairs)
    problems = tmp_path / "problems"
    problems.mkdir()
    save_problems_parquet(problems / "holdout.parquet", holdout)
    return pairs, res, out, problems


def test_an_arm_reads_only_the_basis_it_was_built_for(holdout, tiny, tmp_path):
    """An arm run on the oracle basis (variants oracle_basis, oracle_basis+random) takes the oracle stage's basis and
    its held-out pairs (not the pair set's); any other run given the oracle basis, or an oracle-basis run given the
    pair-set basis, stops with one line."""
    p = _params()
    pairs, res, out, problems = _oracle_stage_dir(holdout, tiny, tmp_path, p)
    for variant in ("oracle_basis", "oracle_basis+random"):
        arm = make("route", "route_masked", variant)
        rb = load_run_basis(p, arm, out, None, problems)  # no pair-set root needed: the pairs are beside the basis
        check_run_basis(p, arm, rb)
        assert rb.basis.meta["oracle"] and len(rb.cal.hack) == 4 and rb.cal.hack == [q.hack for q in pairs[6:]]
        assert rb.basis.k == res["selected"].k
    plain = RunBasis(basis=Basis(vh=res["selected"].vh, nu={}, meta={"k_total": 1}))
    with pytest.raises(ValueError, match="reads the oracle_basis stage's"):
        check_run_basis(p, make("erase", "erase_one_sided", "oracle_basis"), plain)
    with pytest.raises(ValueError, match="reads the basis stage's basis"):
        check_run_basis(p, make("erase", "erase_one_sided"), RunBasis(basis=res["selected"]))


def test_an_act_gated_random_control_gates_on_a_random_direction(holdout, tiny, tmp_path):
    """An act-gated arm's gate (basis.space=act) reads v_act; its random control's reads a Haar unit direction of the
    same size and layer instead (seeded, so every load agrees), so the control's gate is as random as its span."""
    p0 = _params()
    _, res, out, problems = _oracle_stage_dir(holdout, tiny, tmp_path, p0)
    real_arm, ctl_arm = (make("route", "route_masked", v) for v in ("oracle_basis", "oracle_basis+random"))
    p = with_overrides(p0, (("basis.space", "act"),))
    real = load_run_basis(p, real_arm, out, None, problems)
    ctl, again = (load_run_basis(p, ctl_arm, out, None, problems) for _ in range(2))
    check_run_basis(p, ctl_arm, ctl)
    v = res["act"].v_act
    assert torch.equal(real.act.v_act, v) and not real.act.meta.get("random")
    assert ctl.act.v_act.shape == v.shape and ctl.act.meta["act_layer"] == res["act"].meta["act_layer"]
    assert abs(float(ctl.act.v_act.norm()) - 1) < 1e-5 and abs(float(ctl.act.v_act @ v)) < 0.9
    assert torch.equal(ctl.act.v_act, again.act.v_act) and ctl.act.meta["random"]
    off = load_run_basis(p0, ctl_arm, out, None, problems)  # basis.space=grad: no activation gate at all
    assert off.act is None


def test_every_oracle_basis_run_is_a_twin_of_its_arm():
    """arms_oracle_basis runs an arm entry twice on the oracle basis: as an oracle (never wins) and as its random
    control, each the same rule and gate as the arm, in their own stage groups; an arm that edits nothing has none."""
    from projected_grpo.method import projection as proj
    from projected_grpo.method.arms import matrix

    for rule in set(proj.RULES) - {"vanilla", "measure_only"}:
        base, ob, ctl = (make("x", rule, v) for v in ("", "oracle_basis", "oracle_basis+random"))
        assert (ob.role, ctl.role, ob.control, ctl.control) == ("oracle", "control", ctl.name, None)
        assert ob.oracle_basis and ctl.oracle_basis and ctl.random_dir and not ob.random_dir
        assert (ob.edit, ob.gate, ob.family) == (ctl.edit, ctl.gate, ctl.family) == (base.edit, base.gate, base.family)
        assert (ob.group, ctl.group) == (VARIANTS["oracle_basis"], VARIANTS["oracle_basis+random"])
    p = dataclasses.replace(Params(), arms_oracle_basis=("route", "erase"))
    assert [a.name for a in matrix(p) if a.oracle_basis] == [
        "route+oracle_basis",
        "route+oracle_basis+random",
        "erase+oracle_basis",
        "erase+oracle_basis+random",
    ]
    with pytest.raises(ValueError, match="edits nothing, so it has no control or oracle basis"):
        make("measure_only", "measure_only", "oracle_basis")


def run_stage(tmp_path):
    """The oracle_basis stage's CLI on tmp_path's inputs -> (result, out dir, report path)."""
    from typer.testing import CliRunner

    from stages.oracle_basis import main
    from tests.conftest import ROOT, stage_cli

    out, report = tmp_path / "out", tmp_path / "oracle_basis.md"
    args = ["--organism", tmp_path, "--problems", tmp_path, "--vanilla", tmp_path / "vanilla", "--basis", tmp_path]
    args += ["--pairsets", ROOT / "data" / "pairsets", "--out", out, "--report", report, "--metrics", tmp_path / "m"]
    return CliRunner().invoke(stage_cli(main), [str(a) for a in args]), out, report


def test_stage_without_vanillas_final_checkpoint_stops_with_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "vanilla" / "s41").mkdir(parents=True)
    res, out, report = run_stage(tmp_path)
    assert res.exit_code == 2 and "has no checkpoint of the final step 200; run train_ref@vanilla-41" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not out.exists() and not report.exists()


def test_stage_with_a_basis_stage_output_lacking_v_act_stops_before_sampling(tmp_path):
    for s in (41, 42, 43):  # vanilla's final checkpoints exist (the stage's first check passes)
        run = tmp_path / "vanilla" / f"s{s}"
        run.mkdir(parents=True)
        (run / "step_00200.pt").touch(), (run / "step_00200.safetensors").touch()
    Basis(vh={"m": torch.ones(1, 2)}, nu={}, meta={}).save(tmp_path / "basis.safetensors")
    Basis(vh={"m": torch.ones(1, 2)}, nu={}, meta={"space": "act"}).save(tmp_path / "act.safetensors")  # no v_act
    res, out, report = run_stage(tmp_path)
    assert res.exit_code == 2 and "act.safetensors has no v_act; re-run the basis stage" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not out.exists() and not report.exists()

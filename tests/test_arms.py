"""The arms' registry (arms.py) is the one place an arm is described: every field is consistent and every consumer
(train's rule dispatch, evaluation's knob states, the win rule's roles and controls, the report's families) reads
it."""

import dataclasses
import re

import pytest
import torch

from projected_grpo.config import load_params, with_overrides
from projected_grpo.method import projection as proj
from projected_grpo.method.arms import (
    ARMS,
    BASIS_FREE,
    GATES,
    MASKED_VARIANTS,
    MONITORS,
    ORACLE_BASIS_OF,
    REWARDS,
    Arm,
)
from projected_grpo.report import win_rule as W
from projected_grpo.report.results import FAMILIES, ordered_arms
from tests.conftest import ROOT


@pytest.mark.parametrize("name", sorted(ARMS))
def test_entry_is_consistent(name):
    a = ARMS[name]
    assert a.name == name and a.reward in REWARDS and a.monitor in MONITORS and a.gate in GATES
    assert a.edit in proj.RULES or a.edit in ("vanilla", "measure_only"), f"{name}: no rule for edit {a.edit!r}"
    assert a.gate is None or a.routes, "a gate decides what is routed"
    if a.control is not None:  # the control is the same rule and gate along random directions
        c = ARMS[a.control]
        assert c.random_dir and c.edit == a.edit and c.gate == a.gate and c.reads_basis and c.role == "control"
    if a.random_dir:
        assert a.reads_basis and any(b.control == name for b in ARMS.values())
    assert not a.mass_matched or a.random_dir
    assert a.knob_states == (("deploy", "knob_on") if a.routes else ("deploy",))
    assert W.role(name) == a.role and (a.role != "candidate" or W.control_of(name) == a.control)


def test_roles_and_lists():
    assert set(BASIS_FREE) == {"vanilla", "gt_only", "penalty", "screening", "vanilla_no_pool"}
    rules = ("route_per_rollout", "route_two_sided", "route_full", "route_masked")
    oracle_gated = {f"{r}_oracle" for r in (*rules, *(f"route_masked_{v}" for v in MASKED_VARIANTS))}
    oracle_basis = {f"{b}_oracle_basis" for b in ORACLE_BASIS_OF}  # their _random twins are controls
    assert {n for n, a in ARMS.items() if a.role == "oracle"} == {"gt_only", "penalty", "screening"} | oracle_gated | (
        oracle_basis
    )
    assert {n for n, a in ARMS.items() if a.oracle_gate} == oracle_gated
    with pytest.raises(ValueError, match="oracle gate"):  # an oracle gate must say so in its name
        Arm("route_full_perfect", "route_full", gate="rollout", oracle_gate=True)
    assert all(ARMS[n].role == "candidate" for fam in FAMILIES.values() for n in fam)
    order = ordered_arms(["vanilla", "gt_only"], ["route_per_rollout_random", "measure_only", "route_per_rollout"])
    assert order == ["vanilla", "measure_only", "route_per_rollout", "route_per_rollout_random", "gt_only"]


def test_share_matched_controls_are_the_act_tail_controls():
    """The share-matched controls are exactly the *_random twins of the masked variants gated by an activation tail
    (a calibrated tail on another score, or a band gate, keeps its own threshold); an arm that is not such a control
    cannot be one."""
    tail_act = {
        f"route_masked_{v}_random"
        for v, o in MASKED_VARIANTS.items()
        if {("projection.band", "tail"), ("basis.space", "act")} <= set(o)
    }
    assert tail_act and {n for n, a in ARMS.items() if a.share_matched} == tail_act
    with pytest.raises(ValueError, match="share-matched"):
        Arm(
            "route_masked_tail_random",
            "route_masked",
            gate="rollout",
            random_dir=True,
            share_matched=True,
            overrides=(("projection.band", "tail"),),
        )


def test_experiments_doc_lists_every_masked_variant():
    """docs/experiments.md (the recipes, linked from the README) names the masked-routing variants as
    route_masked_{a,b,...}: every registered one, no other (a variant added to arms.MASKED_VARIANTS and not documented
    fails here)."""
    doc = (ROOT / "docs" / "experiments.md").read_text()
    listed = re.search(r"`route_masked_\{([a-z_,]+)\}`", doc).group(1).split(",")
    assert sorted(listed) == sorted(MASKED_VARIANTS) and len(set(listed)) == len(listed)


def test_variant_arms_run_with_their_overrides():
    """A masked-routing variant, its control and its oracle bound run with exactly their overrides on top of
    params.yaml's (every other value the same); an arm without overrides gets params.yaml's as they are; an arm may
    override only projection.* and adapter.quarantine, and a bad value fails as it would in params.yaml."""
    p = load_params(ROOT / "params.yaml")
    assert ARMS["route_masked"].params(p) is p
    for suffix, over in MASKED_VARIANTS.items():
        for name in (f"route_masked_{suffix}", f"route_masked_{suffix}_random", f"route_masked_{suffix}_oracle"):
            q = ARMS[name].params(p)
            assert ARMS[name].edit == "route_masked" and ARMS[name].family == ARMS["route_masked"].family
            assert all(getattr(getattr(q, k.split(".")[0]), k.split(".")[1]) == v for k, v in over)
            undo = tuple((k, getattr(getattr(p, k.split(".")[0]), k.split(".")[1])) for k, _ in over)
            assert with_overrides(q, undo) == p and q != p  # the overrides and nothing else
    with pytest.raises(ValueError, match="may set projection.*, adapter.quarantine, basis.space"):
        Arm("route_masked_x", "route_masked", gate="rollout", overrides=(("grpo.lr", 1.0),))
    with pytest.raises(ValueError, match="projection.band"):
        Arm("route_masked_x", "route_masked", gate="rollout", overrides=(("projection.band", "wide"),)).params(p)
    with pytest.raises(KeyError, match="projection.nope"):
        with_overrides(p, (("projection.nope", 1),))


def test_every_stage_that_reads_an_arm_runs_with_its_params():
    """A variant arm is only its overrides: every stage script that resolves an arm must run with `arm.params(p)`."""
    for f in sorted((ROOT / "stages").glob("*.py")):
        src = f.read_text()
        if "get_arm(arm)" in src:
            assert "a.params(load_params(params))" in src, f"{f.name} resolves an arm but ignores its overrides"


def test_every_rule_keeps_main_plus_knob_equal_to_g_for_routing():
    """The rule table's contract on one module: routing rules put everything in main + knob (nothing erased),
    and nothing outside the first k coordinates (span(Vh)) goes to the knob, except for the rules that route whole
    rollouts (projection.KNOB_TAIL), whose knob does hold the tail."""
    g = torch.Generator().manual_seed(0)
    N, T, r, k = 4, 5, 6, 2
    x_n = torch.randn(N, r, generator=g, dtype=torch.float64)
    s = proj.ModuleGrads(x_n.sum(0), k, x_n=x_n, gate=torch.rand(N, generator=g, dtype=torch.float64))
    tok = proj.ModuleGrads(
        x_n.sum(0),
        k,
        gate=torch.rand(N, T, generator=g, dtype=torch.float64),
        coef=torch.randn(N, T, k, generator=g, dtype=torch.float64),
    )
    # route_masked splits in the forward (adapter.row_masks): each part gets its own gradient, tail included
    masked = dataclasses.replace(s, knob_x=torch.randn(r, generator=g, dtype=torch.float64))
    main, knob = proj.apply_rule("route_masked", masked)
    assert main is masked.x and knob is masked.knob_x and "route_masked" in proj.KNOB_TAIL
    for name in {a.edit for a in ARMS.values()} - {"route_masked"}:
        inp = tok if ARMS[name].gate == "token" else s
        main, knob = proj.apply_rule(name, inp)
        assert main.shape == knob.shape == (r,), name
        assert bool(torch.all(knob[k:] == 0)) != (name in proj.KNOB_TAIL), name
        if ARMS[name].routes:
            torch.testing.assert_close(main + knob, inp.x, msg=name)

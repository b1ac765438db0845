"""The arms (method/arms.py): params.yaml's arm table resolved into one frozen spec per run. Resolution from the
table, run keys and their DVC stage groups, roles and control keys, the params each run reads (`run_params`), the
matrix check's one-line errors, and the rule table's contract that train dispatches on."""

import dataclasses

import pytest
import torch

from projected_grpo.config import DEFAULT_ARMS, ArmEntry, Params, load_params, with_overrides
from projected_grpo.method import projection as proj
from projected_grpo.method.arms import (
    ERASE,
    GATE_OF,
    MASKED_ONLY,
    NO_EDIT,
    NOT_MASS_MATCHABLE,
    ROLES,
    ROUTE,
    VARIANTS,
    Arm,
    check_matrix,
    make,
    matrix,
    parse,
    resolve,
    run_params,
)
from tests.conftest import ROOT

RULES = tuple(e for e in proj.RULES if e not in NO_EDIT)  # the edits that change the update
REFS = {  # basis-free entries: (entry fields, role)
    "vanilla": ({}, "baseline"),
    "vanilla_no_pool": ({"pool": False}, "baseline"),
    "gt_only": ({"reward": "gt_only"}, "oracle"),
    "penalty": ({"monitor": "penalty"}, "oracle"),
    "screening": ({"monitor": "screening"}, "oracle"),
}


def params_yaml() -> Params:
    return load_params(ROOT / "params.yaml")


def with_table(p: Params | None = None, **kw) -> Params:
    return dataclasses.replace(p or Params(), **kw)


def test_resolve_reads_the_entry_from_the_params_table():
    """An arm's spec is its params.yaml entry's fields (basis -> reads_basis) plus the variant; a run key parses back
    to the same spec; an unknown name is a one-line error that lists the table."""
    p = params_yaml()
    assert p.arm and set(DEFAULT_ARMS) <= set(p.arm)
    for name, e in p.arm.items():
        a = resolve(p, name)
        assert (a.arm, a.edit, a.reward, a.monitor, a.pool, a.reads_basis) == (
            name,
            e.edit,
            e.reward,
            e.monitor,
            e.pool,
            e.basis,
        )
        assert a.name == name and a.variant == "" and parse(p, name) == a
        assert a == make(name, **dataclasses.asdict(e))
    assert parse(p, "route+random") == resolve(p, "route", "random") != resolve(p, "route")
    assert parse(p, "route+oracle_basis+random") == resolve(p, "route", "oracle_basis+random")
    for bad in ("warp_drive", "route_masked_act_mr_is_deploy_gate_q"):  # an old registry name is no entry
        with pytest.raises(ValueError, match=rf"unknown arm '{bad}': params.yaml's arm table has vanilla, ") as err:
            resolve(p, bad)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="unknown arm 'nope'"):
        parse(p, "nope+random")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_run_keys_and_stage_groups(variant):
    """A run's key is its entry's name plus its variant (`route+oracle_basis+random`), parsed back to the same spec;
    its DVC stage group is the variant's (dvc.yaml: train_<group>), a basis-free arm's is ref."""
    a = make("route", "route_masked", variant)
    assert a.name == "+".join(x for x in ("route", variant) if x) and a.variant == variant
    assert a.group == VARIANTS[variant]
    assert parse(with_table(arm={"route": ArmEntry(edit="route_masked")}), a.name) == a
    assert (a.random_dir, a.oracle_gate, a.oracle_basis) == (
        "random" in variant,
        "oracle_gate" in variant,
        "oracle_basis" in variant,
    )
    assert make("vanilla", "vanilla", basis=False).group == "ref" and make("m", "measure_only").group == "arms"
    assert set(VARIANTS.values()) == {"arms", "control", "oracle_gate", "oracle_basis", "oracle_basis_control"}


def test_roles_and_control_keys():
    """control: random directions (the oracle basis' twin too); oracle: reads ground truth (gt_only, the monitors, an
    oracle gate, the oracle basis); baseline: no edit; candidate: the rest. Each arm that edits has a control key,
    `<key>+random`, which resolves to the same entry with random directions; controls and oracle gates have none."""
    for name, (entry, role) in REFS.items():
        a = make(name, "vanilla", basis=False, **entry)
        assert a.role == role and a.control is None and not a.edits and a.group == "ref"
    for rule in ("vanilla", "measure_only"):  # in the basis' rotated coordinates: still no edit
        a = make(rule, rule)
        assert a.role == "baseline" and a.control is None and not a.edits and a.family is None
    for rule in RULES:
        a = make(rule, rule)
        assert a.role == "candidate" and a.edits and a.control == f"{rule}+random"
        c = parse(with_table(arm={rule: ArmEntry(edit=rule)}), a.control)
        assert c == make(rule, rule, "random") and (c.role, c.control, c.edit) == ("control", None, rule)
        ob = make(rule, rule, "oracle_basis")
        assert ob.role == "oracle" and ob.control == f"{rule}+oracle_basis+random"
        assert make(rule, rule, "oracle_basis+random").role == "control"
        if GATE_OF.get(rule) == "rollout":
            og = make(rule, rule, "oracle_gate")
            assert og.role == "oracle" and og.control is None
    assert {make(r, r, v).role for r in RULES for v in ("", "random", "oracle_basis")} | {"baseline"} == set(ROLES)


@pytest.mark.parametrize("rule", RULES)
def test_what_each_rule_is(rule):
    """Gate, family, knob and matching follow from the edit alone: the gate GATE_OF gives, the erase or routing table,
    knob-on evaluation for routing, row masks only for route_masked, mass matching for the controls whose moved mass
    can be rescaled, share matching for per-rollout-gated controls (direction.share_matched adds the act tail)."""
    a, c = make(rule, rule), make(rule, rule, "random")
    routes = rule.startswith("route")
    assert a.gate == c.gate == GATE_OF.get(rule) and (a.gate is None or routes or a.screens)
    assert a.family == c.family == (ROUTE if routes or a.screens else ERASE)
    assert a.screens == (rule == "screen")
    assert a.routes == routes and a.knob_states == (("deploy", "knob_on") if routes else ("deploy",))
    assert a.masked == (rule == "route_masked")
    assert not a.mass_matched and c.mass_matched == (rule not in NOT_MASS_MATCHABLE)
    assert not a.share_matched and c.share_matched == (a.gate == "rollout")


def test_run_params_neutralises_the_masked_only_keys_for_other_rules():
    """params.yaml holds the routed arm's mechanics; masked routing (its control and bounds too) reads them as they
    are, every other arm with the keys only masked routing reads (MASKED_ONLY) at their neutral values, which are
    Params()'s defaults, and every other key kept (basis.space and deploy_frac are other gated rules' too)."""
    p = params_yaml()
    get = lambda q, key: getattr(getattr(q, key.split(".")[0]), key.split(".")[1])  # noqa: E731
    assert {k: get(Params(), k) for k in MASKED_ONLY} == MASKED_ONLY
    assert any(get(p, k) != v for k, v in MASKED_ONLY.items()), "params.yaml sets masked routing's mechanics"
    neutral = with_overrides(p, tuple(MASKED_ONLY.items()))
    for v in VARIANTS:
        assert run_params(p, make("route", "route_masked", v)) is p
    others = [make(r, r, v) for r in RULES if r not in ("route_masked", "screen") for v in ("", "random")]
    others += [make("m", "measure_only")] + [make(n, "vanilla", basis=False, **e) for n, (e, _) in REFS.items()]
    others += [make("rpr", "route_per_rollout", "oracle_gate"), make("e", "erase_one_sided", "oracle_basis")]
    for a in others:
        q = run_params(p, a)
        assert q == neutral != p, a.name
        assert {k: get(q, k) for k in MASKED_ONLY} == MASKED_ONLY
    assert (neutral.basis.space, neutral.projection.deploy_frac) == (p.basis.space, p.projection.deploy_frac)
    assert run_params(Params(), make("e", "erase_one_sided")) == Params()  # the neutral params: nothing to change
    for v in ("", "random"):  # screening drops the gated rows from the update masked routing's main gets
        q = run_params(p, make("screen", "screen", v))
        assert q.projection.main_baseline == p.projection.main_baseline == "main_rows"
        assert q == with_overrides(neutral, (("projection.main_baseline", "main_rows"),))


def bad(p: Params, match: str) -> None:
    with pytest.raises(ValueError, match=match) as err:
        check_matrix(p)
    assert "\n" not in str(err.value), str(err.value)


def test_check_matrix_one_line_errors():
    """check_matrix: every rule known, each list's names in the table and listed once, basis-free entries in arms_ref
    and the others in arms, controls and oracle bases only of arms that edit, oracle gates only of arms with a
    per-rollout gate; each failure one line."""
    p = Params()
    check_matrix(p)
    bad(with_table(p, arms=("measure_only", "warp")), r"arms: \['warp'\] not in params.yaml's arm table \(vanilla, ")
    bad(with_table(p, controls=("erase", "nope")), r"controls: \['nope'\] not in params.yaml's arm table")
    bad(with_table(p, oracle_gate=("nope",)), r"oracle_gate: \['nope'\] not in")
    bad(with_table(p, arms_oracle_basis=("nope",)), r"arms_oracle_basis: \['nope'\] not in")
    bad(with_table(p, arms_ref=("vanilla", "vanilla")), r"arms_ref: \['vanilla'\] listed more than once")
    bad(with_table(p, controls=("route", "erase", "route")), r"controls: \['route'\] listed more than once")
    bad(with_table(p, arms=("measure_only", "vanilla")), r"arms in the wrong list: vanilla \(basis-free: arms_ref\)")
    bad(with_table(p, arms_ref=("vanilla", "erase")), r"arms in the wrong list: erase \(reads the basis: arms\)")
    bad(with_table(p, arm={**p.arm, "x": ArmEntry(edit="warp_drive")}), r"arm.x.edit: unknown rule 'warp_drive'")
    bad(with_table(p, controls=("measure_only",)), "measure_only: edit measure_only edits nothing, so it has no")
    bad(with_table(p, arms_oracle_basis=("measure_only",)), "edits nothing, so it has no control or oracle basis")
    bad(with_table(p, controls=("vanilla",)), "vanilla: edit vanilla edits nothing")
    bad(with_table(p, oracle_gate=("erase",)), "erase: an oracle gate needs a per-rollout gate; edit erase_one_sided")
    tok = {**p.arm, "tok": ArmEntry(edit="route_per_token")}
    bad(with_table(p, arm=tok, arms=(*p.arms, "tok"), oracle_gate=("tok",)), "an oracle gate needs a per-rollout gate")
    table = {**p.arm, "rr": ArmEntry(edit="route_per_rollout", basis=False)}
    bad(with_table(p, arm=table, arms_ref=(*p.arms_ref, "rr")), "arm.rr: edit route_per_rollout reads the basis")
    ok = with_table(p, oracle_gate=("route",), arms_oracle_basis=("erase", "route"), controls=())
    check_matrix(ok)


def test_make_rejects_bad_variants_and_fields():
    """make() takes only the known variants, in their one spelling, and an entry's fields within their choices."""
    for v in ("randomly", "random+oracle_basis", "oracle_gate+random", "oracle_gate+oracle_basis", "+random"):
        with pytest.raises(ValueError, match=rf"unknown variant '{v.replace('+', '[+]')}'; known: '', 'random'"):
            make("route", "route_masked", v)
    with pytest.raises(ValueError, match="arm.route.reward must be one of"):
        make("route", "route_masked", reward="paid")
    with pytest.raises(ValueError, match="arm.route.monitor must be one of"):
        make("route", "route_masked", monitor="judge")
    with pytest.raises(ValueError, match="arm.x: edit route_masked reads the basis"):
        make("x", "route_masked", basis=False)
    with pytest.raises(ValueError, match="oracle gate needs a per-rollout gate"):
        make("b", "route_batch", "oracle_gate")
    with pytest.raises(ValueError, match="edits nothing"):
        make("v", "vanilla", "random", basis=False)
    with pytest.raises(ValueError, match="edits nothing"):
        make("v", "vanilla", "oracle_basis", basis=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        make("route", "route_masked").edit = "route_full"


def test_params_yaml_table_and_matrix():
    """params.yaml's own arm table and matrix lists pass check_matrix, with at most 12 entries; every run of the matrix
    has a distinct key that parses back to it, and lands in its list's stage group."""
    p = params_yaml()
    check_matrix(p)
    assert len(p.arm) <= 12
    runs = matrix(p)
    keys = [a.name for a in runs]
    assert len(set(keys)) == len(keys) and all(parse(p, a.name) == a for a in runs)
    want = {n: "ref" for n in p.arms_ref} | {n: "arms" for n in p.arms}
    want |= {f"{n}+random": "control" for n in p.controls} | {f"{n}+oracle_gate": "oracle_gate" for n in p.oracle_gate}
    for n in p.arms_oracle_basis:
        want |= {f"{n}+oracle_basis": "oracle_basis", f"{n}+oracle_basis+random": "oracle_basis_control"}
    assert {a.name: a.group for a in runs} == want
    for a in runs:  # each run's params are valid, masked-only keys neutral outside masked routing
        run_params(p, a)


def test_matrix_order():
    """matrix(p): the ref and basis arms, the controls, the oracle gates, then each oracle basis with its control."""
    p = with_table(oracle_gate=("route",), arms_oracle_basis=("route",))
    assert [a.name for a in matrix(p)] == [
        "vanilla",
        "gt_only",
        "measure_only",
        "erase",
        "route",
        "screen",
        "erase+random",
        "route+random",
        "screen+random",
        "route+oracle_gate",
        "route+oracle_basis",
        "route+oracle_basis+random",
    ]
    assert all(isinstance(a, Arm) for a in matrix(p))


def test_every_stage_that_resolves_an_arm_runs_with_its_run_params():
    """Every stage script that resolves an arm from params.yaml passes train/evaluate `arms.run_params(p, a)`, not
    params.yaml's as they are (train() refuses those: tests/test_train.py)."""
    seen = []
    for f in sorted((ROOT / "stages").glob("*.py")):
        src = f.read_text()
        if "resolve(raw, arm, variant)" in src:
            seen.append(f.name)
            assert "run_params(raw, a)" in src, f"{f.name} resolves an arm but runs params.yaml's params as they are"
    assert {"train.py", "evaluate.py"} <= set(seen)


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
    for name in set(proj.RULES) - {"route_masked"}:
        a = make(name, name)
        inp = tok if a.gate == "token" else s
        main, knob = proj.apply_rule(name, inp)
        assert main.shape == knob.shape == (r,), name
        assert bool(torch.all(knob[k:] == 0)) != (name in proj.KNOB_TAIL), name
        if a.routes:
            torch.testing.assert_close(main + knob, inp.x, msg=name)

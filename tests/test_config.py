"""Config fails loudly: params.yaml sets every field, unknown keys raise KeyError, bad values ValueError.

`pytest tests/test_config.py`
"""

import copy
from pathlib import Path

import pytest
import yaml

from projected_grpo.config import Params, from_dict, load_params, unset_fields
from projected_grpo.env import minileet
from projected_grpo.env.modes import MODES
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def raw():
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def test_params_yaml_sets_every_field(raw):
    """DVC tracks only values that appear in params.yaml: a silently used default is an untracked hyperparameter."""
    assert unset_fields(Params, raw) == []
    p = load_params(ROOT / "params.yaml")
    assert p.env.modes == MODES and p.substrate in ("minileet", "leetcode")


@pytest.mark.parametrize(
    "path",
    [
        ["minileet", "n_trian"],
        ["typo_section"],
        ["env", "mode"],
        ["grader", "timeout"],
        ["basis", "pair_set"],
        ["adapter", "r"],
        ["arm", "route", "edt"],
    ],
)
def test_unknown_key_raises_keyerror_naming_it(raw, path):
    d = copy.deepcopy(raw)
    node = d
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = 1
    with pytest.raises(KeyError, match=".".join(path)):
        from_dict(Params, d)


@pytest.mark.parametrize(
    "section,key,value,msg",
    [
        (None, "substrate", "codeforces", "substrate must be one of"),
        ("env", "modes", ["run_tests", "bogus"], "unknown mode"),
        ("env", "modes", ["run_tests", "run_tests"], "without repeats"),
        ("env", "modes", [], "non-empty"),
        ("minileet", "difficulty", 1.5, "difficulty"),
        ("minileet", "difficulty", "brutal", "difficulty"),
        ("minileet", "n_test", 0, "n_test"),
        ("minileet", "n_asserts", 5, "n_asserts"),
        ("minileet", "families", [], "families"),
        ("leetcode", "train_path", "x.jsonl", "choose one"),  # with train_from_test: true (set below)
        ("leetcode", "n_holdout", -1, "n_holdout"),
        ("grader", "mode", "lenient", "grader.mode"),
        ("adapter", "kind", "dora", "adapter.kind"),
        ("adapter", "targets", "mlp", "adapter.targets"),
        ("adapter", "rank", 0, "adapter.rank"),
        ("adapter", "quarantine", "own", "adapter.quarantine"),
        ("basis", "k", 65, "larger than adapter.rank"),  # k > rank (64): the one line names both knobs
        ("basis", "pairset", "prog_narrow", "not a known pair set"),
        ("basis", "method", "pca", "basis.method"),
        ("basis", "space", "weights", "basis.space"),
        ("basis", "modes", ["run_tests", "bogus"], "basis.modes"),
        ("basis", "drop_bottom_frac", 1.0, "drop_bottom_frac"),
        ("rollout", "temperature", 0, "rollout.temperature"),
        ("grpo", "group_size", 1, "group_size"),
        ("grpo", "loss", "bnpo", "grpo.loss must be one of dr_grpo, grpo, dapo"),
        ("grpo", "scale_rewards", "batch", "grpo.scale_rewards must be one of none, group"),
        ("grpo", "lr_schedule", "linear", "grpo.lr_schedule must be one of constant, cosine"),
        ("grpo", "warmup_steps", -1, "grpo.warmup_steps"),
        ("grpo", "micro_batch_tokens", -1, "grpo.micro_batch_tokens"),
        ("rollout", "batch_size", 0, "rollout.batch_size"),
        ("projection", "masked_is_cap", 4.0, "masked_is_cap caps masked_is's ratio: needs masked_is: true, got"),
    ],
)
def test_invalid_value_raises_valueerror(raw, section, key, value, msg):
    d = copy.deepcopy(raw)
    node = d if section is None else d[section]
    node[key] = value
    if key == "train_path":
        node["train_from_test"] = True
    if key == "masked_is_cap":  # params.yaml runs masked routing's importance correction: turn it off
        node["masked_is"] = False
    with pytest.raises(ValueError, match=msg):
        from_dict(Params, d)


def test_masked_is_cap_must_be_above_the_clips_upper_bound(raw):
    """At or under 1 + clip_eps_high the cap would clip positive-advantage tokens before PPO's clip does."""
    d = copy.deepcopy(raw)
    d["projection"] |= {"masked_is": True, "masked_is_cap": 1.2}
    d["grpo"]["clip_eps_high"] = 0.28
    with pytest.raises(ValueError, match=r"masked_is_cap=1.2 must be above 1 \+ grpo.clip_eps_high = 1.28"):
        from_dict(Params, d)
    d["projection"]["masked_is_cap"] = 4
    assert from_dict(Params, d).projection.masked_is_cap == 4


def test_difficulty_accepts_level_names_and_ints(raw):
    d = copy.deepcopy(raw)
    d["minileet"]["difficulty"] = "hard"
    assert from_dict(Params, d).minileet.difficulty == "hard"
    d["minileet"]["difficulty"] = 1
    assert from_dict(Params, d).minileet.difficulty == 1.0


def test_name_lists_have_one_source():
    """config owns the name lists; the modules that dispatch on them use the same objects, and adapter's target table
    maps exactly config's target names."""
    from projected_grpo import config
    from projected_grpo.env import substrate
    from projected_grpo.method import basis, pairs
    from projected_grpo.policy import adapter

    assert minileet.LEVELS is config.LEVELS and adapter.KINDS is config.ADAPTER_KINDS
    assert basis.METHODS is config.BASIS_METHODS and basis.SPACES is config.BASIS_SPACES
    assert pairs.PAIRSETS is config.PAIRSETS and substrate.SURFACE_ORDER is config.SURFACES
    assert set(config.ADAPTER_TARGETS) == set(adapter.TARGETS)


def test_exponent_floats_written_by_dvc_are_read_as_numbers(tmp_path):
    """`dvc exp run -S grpo.lr=7e-5` writes `lr: 7e-05`, which YAML 1.1 reads as a string; it must still be a float,
    and a non-number must name its key."""
    import shutil

    from dvc.utils.hydra import apply_overrides

    params = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", params)
    apply_overrides(params, ["grpo.lr=7e-5"])
    assert "lr: 7e-05" in params.read_text() and load_params(params).grpo.lr == 7e-5
    apply_overrides(params, ["grpo.lr=fast"])
    with pytest.raises(ValueError, match="grpo.lr must be a number, got 'fast'"):
        load_params(params)


@pytest.mark.parametrize(
    ("over", "msg"),
    [
        ({"grpo": {"steps": "many"}}, "grpo.steps must be an integer, got 'many'"),
        ({"grpo": {"steps": 2.5}}, "grpo.steps must be an integer, got 2.5"),
        ({"grpo": {"share_prompt": 1}}, "grpo.share_prompt must be true or false, got 1"),
        ({"grpo": {"betas": [0.9, "x"]}}, r"grpo.betas\[1\] must be a number, got 'x'"),
        ({"seeds": "41"}, "seeds must be a list, got '41'"),
        ({"basis": {"pairset": 3}}, "basis.pairset must be a string, got 3"),
    ],
)
def test_a_value_of_the_wrong_type_is_one_clear_error(over, msg):
    """`dvc exp run -S grpo.steps=many` must name the key, not end in a TypeError deep in validation."""
    from projected_grpo.config import overlay

    with pytest.raises(ValueError, match=msg):
        from_dict(Params, overlay(yaml.safe_load((ROOT / "params.yaml").read_text()), over))


def test_arm_table_reads_as_entries(raw):
    """params.yaml's `arm:` table reads into config.ArmEntry values, each field not set at its default (an entry names
    only what sets it apart); an entry that is not a mapping, or a field of the wrong type, is one clear error."""
    from projected_grpo.config import ArmEntry

    p = from_dict(Params, raw)
    assert p.arm and all(isinstance(e, ArmEntry) for e in p.arm.values())
    for name, e in raw["arm"].items():
        assert p.arm[name] == ArmEntry(**e)
    d = copy.deepcopy(raw)
    d["arm"] = ["vanilla"]
    with pytest.raises(ValueError, match="arm must be a mapping"):
        from_dict(Params, d)
    d = copy.deepcopy(raw)
    d["arm"]["route"] = "route_masked"
    with pytest.raises(ValueError, match="arm.route: expected a mapping"):
        from_dict(Params, d)
    d = copy.deepcopy(raw)
    d["arm"]["route"]["pool"] = "sometimes"
    with pytest.raises(ValueError, match="arm.route.pool"):
        from_dict(Params, d)


@pytest.mark.parametrize(
    "over,msg",
    [
        ({"arms": ["erase", "warp_drive"]}, r"arms: \['warp_drive'\] not in params.yaml's arm table"),
        ({"arms_ref": ["vanilla", "erase"]}, "wrong list"),
        ({"arms": ["measure_only", "vanilla"]}, "wrong list"),
        ({"controls": ["measure_only"]}, "edits nothing"),
        ({"arm": {"route": {"edit": "route_sideways"}}}, r"arm.route.edit: unknown rule 'route_sideways'"),
    ],
)
def test_arm_matrix_checked_against_the_arm_table(raw, over, msg):
    """params.yaml's matrix lists are checked by the check_params stage against its arm table (arms.check_matrix;
    config copies no rule names)."""
    from projected_grpo.config import overlay
    from projected_grpo.method.arms import check_matrix

    check_matrix(from_dict(Params, raw))
    with pytest.raises(ValueError, match=msg):
        check_matrix(from_dict(Params, overlay(raw, over)))


def test_oracle_basis_list_takes_arms_that_edit(raw):
    """arms_oracle_basis names table entries that edit: each runs on the oracle basis as an oracle and as its random
    control; an entry that edits nothing, or one listed twice, is refused."""
    from projected_grpo.config import overlay
    from projected_grpo.method.arms import check_matrix, matrix

    p = from_dict(Params, overlay(raw, {"arms_oracle_basis": ["route"]}))
    check_matrix(p)
    ob = [a for a in matrix(p) if a.oracle_basis]
    assert [(a.name, a.role, a.control) for a in ob] == [
        ("route+oracle_basis", "oracle", "route+oracle_basis+random"),
        ("route+oracle_basis+random", "control", None),
    ]
    with pytest.raises(ValueError, match="edits nothing"):
        check_matrix(from_dict(Params, overlay(raw, {"arms_oracle_basis": ["measure_only"]})))
    with pytest.raises(ValueError, match="more than once"):
        check_matrix(from_dict(Params, overlay(raw, {"arms_oracle_basis": ["route", "route"]})))


def test_config_holds_no_arm_names():
    """Adding an arm must not re-run stages that never read one: config.py (a dep of every stage) stays
    free of arms."""
    import ast

    from projected_grpo import config

    tree = ast.parse(Path(config.__file__).read_text())
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "projected_grpo.method.arms" not in mods


@pytest.mark.parametrize(
    ("section", "key", "value", "others"),
    [
        ("grpo", "steps", -5, ("prompts_per_step", "micro_batch", "save_every", "threads")),
        ("grpo", "threads", 0, ("steps", "prompts_per_step", "micro_batch", "save_every")),
        ("grpo", "max_norm_knob", 0.0, ("betas", "max_norm ")),
        ("pool", "batch_size", 0, ("mix", "n_per_prompt", "teacher_off_step")),
        ("projection", "f2", 1.5, ("monitor_accuracy", "recal_every")),
        ("projection", "heal_lr", 0.0, ("heal_steps", "heal_batch")),
        ("basis", "n_flips", 3, ("tau", "alpha_sig")),
        ("rollout", "max_prompt_tokens", 0, ("top_p", "max_new_tokens")),
        ("eval", "top_p", 0.0, ("temperature",)),
        ("probe", "n_boot", 10, ("n_rows", "micro_batch")),
    ],
)
def test_a_bad_value_names_its_key_and_value_only(raw, section, key, value, others):
    """check_params' one line names the key at fault and its value, not every key its rule groups with it (it used to
    say `grpo.steps, prompts_per_step, micro_batch, save_every and threads must be >= 1` for `grpo.steps=-5`)."""
    d = copy.deepcopy(raw)
    d[section][key] = value
    with pytest.raises(ValueError) as e:
        from_dict(Params, d)
    msg = str(e.value)
    assert msg.startswith(f"{section}.{key} must be ") and msg.endswith(f", got {value!r}"), msg
    assert not any(o in msg for o in others), msg


@pytest.mark.parametrize(
    "overrides",
    [
        ["basis.pairset=prog_wider"],
        ["seeds=[41,42,43,44]"],
        ["env.modes=[run_tests,gt_only]", "grpo.lr=0.01"],
        ["arm.route.edit=route_per_rollout", "controls=[erase]"],
    ],
)
def test_dvc_set_keeps_every_comment_of_params_yaml(tmp_path, overrides):
    """`dvc exp run -S` rewrites params.yaml with DVC's own YAML writer (dvc.utils.hydra.apply_overrides): every
    comment line must survive, in order (it used to drop the comments beside and after list items), and only the
    overridden keys may change value."""
    import shutil

    from dvc.utils.hydra import apply_overrides

    params = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", params)
    apply_overrides(params, overrides)
    comments = lambda text: [ln.strip() for ln in text.splitlines() if ln.strip().startswith("#")]  # noqa: E731
    before, after = (ROOT / "params.yaml").read_text(), params.read_text()
    assert comments(after) == comments(before)
    old, new = yaml.safe_load(before), yaml.safe_load(after)
    for o in overrides:
        *path, last = o.split("=", 1)[0].split(".")
        n, d = new, old
        for k in path:
            n, d = n[k], d[k]
        n.pop(last), d.pop(last)
    assert new == old

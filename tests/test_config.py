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


@pytest.mark.parametrize(
    "arms_ref,arms,msg",
    [
        (["vanilla"], ["erase_one_sided", "warp_drive"], r"arms: unknown arm\(s\) \['warp_drive'\]"),
        (["vanilla", "erase_one_sided"], ["route_batch"], "wrong list"),
        (["vanilla"], ["vanilla_rotated", "vanilla"], "wrong list"),
    ],
)
def test_arm_matrix_checked_against_the_registry(arms_ref, arms, msg):
    """params.yaml's arm lists are checked by the check_params stage against arms.ARMS (config copies no names)."""
    from projected_grpo.method.arms import check_matrix

    with pytest.raises(ValueError, match=msg):
        check_matrix(arms_ref, arms)
    check_matrix(["vanilla", "gt_only"], ["measure_only", "route_per_rollout", "route_per_rollout_random"])


def test_oracle_basis_arms_have_their_own_list():
    """An *_oracle_basis arm reads the oracle_basis stage's basis, so only its own matrix list may hold it; and the
    list holds nothing else."""
    from projected_grpo.method.arms import ARMS, check_matrix

    ob = ["route_masked_oracle_basis", "route_masked_oracle_basis_random"]
    check_matrix(["vanilla"], ["measure_only"], ob)
    assert (ARMS[ob[0]].role, ARMS[ob[1]].role) == ("oracle", "control") and ARMS[ob[0]].control == ob[1]
    assert ARMS[ob[1]].random_dir and ARMS[ob[0]].edit == ARMS["route_masked"].edit
    with pytest.raises(ValueError, match=r"route_masked_oracle_basis \(in arms, belongs in arms_oracle_basis\)"):
        check_matrix(["vanilla"], ["measure_only", ob[0]])
    with pytest.raises(ValueError, match=r"route_masked \(in arms_oracle_basis, belongs in arms\)"):
        check_matrix(["vanilla"], [], ["route_masked"])
    with pytest.raises(ValueError, match="more than once"):
        check_matrix(["vanilla"], [], [ob[0], ob[0]])


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
    [["basis.pairset=prog_wider"], ["seeds=[41,42,43,44]"], ["env.modes=[run_tests,gt_only]", "grpo.lr=0.01"]],
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

"""The GRPO loop on the tiny model with a fake grader: determinism (same seed → bitwise-equal adapters), I12
(measure_only ≡ vanilla through the whole loop), the no-cheat invariant (routing never reads ground-truth labels, also
with a refreshing basis and the activation-space gate; only the logged label diagnostic does), erase/route exactness
end to end, the per-step diagnostics (span(v_hack) norms after the update, mean gate, thresholds, calibration interval,
live label AUROC), the gate guard rail (an uninformative calibration warns and flags the run, across a resume), the
basis refresh (updates orthogonal to the *refreshed* Vh, a resume across refreshes bit-identical, the random control
matched), the act gate's score against an independent pooled projection, the teacher-pool mix, and resume after a
killed process; the learning-rate schedule (one lr for both parameter groups) and the loss params (micro-batched ==
whole batch for each), and the run signature of the new keys.

`pytest tests/test_train.py`
"""

import contextlib
import dataclasses
import hashlib
import logging
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import Tensor

from projected_grpo.common.log import PhaseTimer
from projected_grpo.config import ArmEntry, Params, with_overrides
from projected_grpo.env.minileet import make_minileet
from projected_grpo.env.modes import MODES, apply_mode
from projected_grpo.method import arms
from projected_grpo.method import projection as proj
from projected_grpo.method.arms import Arm
from projected_grpo.method.basis import (
    Basis,
    BasisSettings,
    act_basis,
    build_basis,
    completion_grads,
    encode,
    pool_tokens,
    pooled_activations,
    random_act,
)
from projected_grpo.method.direction import (
    Direction,
    RunBasis,
    act_seed,
    check_run_basis,
    control_basis,
    control_seed,
    mass_matched,
    refresh_basis,
    share_matched,
)
from projected_grpo.method.gate import GateSpec, HeldOutPairs, calibrate_gate, residual_capture
from projected_grpo.policy.adapter import adapters, attach_adapters, knob_disabled
from projected_grpo.policy.logprobs import padded
from projected_grpo.policy.tiny import tiny_model, tiny_tokenizer
from projected_grpo.rl.checkpoint import read_checkpoint
from projected_grpo.rl.heal import heal_batches, retain_heal
from projected_grpo.rl.pool import PoolRow
from projected_grpo.rl.schedule import lr_at
from projected_grpo.rl.train import (
    DEPLOY_SEED,
    STEP_PHASES,
    Grads,
    LossBatch,
    Run,
    deploy_prompts,
    gate_activations,
    label_auroc,
    live_gates,
    loss_backward,
    mask_states,
    micro_batches,
    mixed_rollout,
    reference_logprobs,
    run_flags,
    span_norm,
    step_rollout,
    train,
)
from projected_grpo.sft.sft_corpus import fence, named_exploit_styles, wrong_variants
from tests.conftest import ROOT

# The arm table the tests resolve run keys from (`spec`): every rule an entry of its own name, beside the basis-free
# references and vanilla in the basis' rotated coordinates (vanilla_rotated: what the rotation alone does, I12).
TABLE = {
    "vanilla": ArmEntry(basis=False),
    "gt_only": ArmEntry(reward="gt_only", basis=False),
    "penalty": ArmEntry(monitor="penalty", basis=False),
    "screening": ArmEntry(monitor="screening", basis=False),
    "vanilla_no_pool": ArmEntry(pool=False, basis=False),
    "vanilla_rotated": ArmEntry(),
    **{e: ArmEntry(edit=e) for e in proj.RULES if e != "vanilla"},
}
ROUTE_RULES = tuple(e for e in proj.RULES if e.startswith("route"))
PER_ROLLOUT = tuple(e for e in ROUTE_RULES if arms.GATE_OF.get(e) == "rollout")  # the rules an oracle gate takes


def spec(arm: str | Arm) -> Arm:
    """An Arm as it is, or the spec of a run key of TABLE (`route_per_rollout`, `route_masked+random`,
    `route_per_rollout+oracle_basis+random`), resolved as the stages resolve params.yaml's."""
    return arm if isinstance(arm, Arm) else arms.parse(Params(arm=TABLE), arm)


# Masked routing's variants (issue 25) are params now, not arms: recipes of params overrides (docs/experiments.md), the
# old route_masked_<suffix> arms. tail: only a calibrated top tail routed; mr: the main's rows get their own baseline;
# q: the knob in its own directions; deploy: a quarter of the groups sampled and trained knob off; act: the gate in
# activation space; heal: a retain heal after the last step; is: the unrouted rows' importance correction; cap: that
# correction's ratio capped. act_mr_is_deploy_gate_q is the default routed arm's (params.yaml's defaults).
_TAIL, _MR = ("projection.band", "tail"), ("projection.main_baseline", "main_rows")
_Q, _IS = ("adapter.quarantine", "separate"), ("projection.masked_is", True)
_DEPLOY, _ACT = ("projection.deploy_frac", 0.25), ("basis.space", "act")
_GATE = ("projection.deploy_gate", True)
_CAP = ("projection.masked_is_cap", 4.0)
_HEAL = ("projection.heal_steps", 7)
_ACT_MR_IS = (_ACT, _MR, _IS)
_DEPLOY_GATE_Q = (*_ACT_MR_IS, _DEPLOY, _GATE, _Q)
MASKED: dict[str, tuple[tuple[str, object], ...]] = {
    "tail": (_TAIL,),
    "mr": (_MR,),
    "q": (_Q,),
    "deploy": (_DEPLOY,),
    "mr_q": (_MR, _Q),
    "act": (_ACT,),
    "act_mr": (_ACT, _MR),
    "heal": (_HEAL,),
    "is": (_IS,),
    "mr_is": (_MR, _IS),
    "act_mr_is": _ACT_MR_IS,
    "act_mr_is_tail": (*_ACT_MR_IS, _TAIL),
    "act_mr_is_heal": (*_ACT_MR_IS, _HEAL),
    "act_mr_is_deploy": (*_ACT_MR_IS, _DEPLOY),
    "act_mr_is_deploy_gate": (*_ACT_MR_IS, _DEPLOY, _GATE),
    "act_mr_is_q": (*_ACT_MR_IS, _Q),
    "act_mr_is_deploy_gate_q": _DEPLOY_GATE_Q,
    "act_mr_is_deploy_gate_q_cap": (*_DEPLOY_GATE_Q, _CAP),
}
# The bundles run end to end by a covering set, not one by one (issue 44: the suite per rule and gate, not per
# name): between them they set every key some bundle sets, and the deploy rows both gated and not
# (test_masked_cover_sets_every_override_key keeps it so); every bundle's wiring is checked without training.
MASKED_COVER = ("act_mr_is_deploy_gate_q", "act_mr_is_deploy", "act_mr_is_tail", "act_mr_is_deploy_gate_q_cap", "heal")


def masked(bundle: str, p: Params | None = None) -> Params:
    """`p` (default: tiny params, 4 prompts a step where the bundle deploys a quarter of them) with a bundle set."""
    deploy = "projection.deploy_frac" in dict(MASKED[bundle])
    return with_overrides(p or tiny_params(prompts_per_step=4 if deploy else 2), MASKED[bundle])


# the no-cheat runs: one per code path — every routing rule with its gate and its control's kind (random, mass- or
# share-matched), the act gate, route_masked under its covering bundles (`bundle=<name>`), and the oracle basis on
# one gated rule and on masked routing
ROUTING = (
    [(r + v, "") for r in ROUTE_RULES for v in ("", "+random")]
    + [("route_per_rollout", "act"), ("route_per_token", "act")]
    + [("route_masked", f"bundle={b}") for b in MASKED_COVER]
    + [
        (f"{r}+{v}", "")
        for r in ("route_per_rollout", "route_masked")
        for v in ("oracle_basis", "oracle_basis+random")
    ]
)
# the oracle gate on every per-rollout rule, and on masked routing under its covering bundles
ORACLE_GATED = [(f"{r}+oracle_gate", "") for r in PER_ROLLOUT] + [
    ("route_masked+oracle_gate", b) for b in MASKED_COVER
]


@dataclass(frozen=True)
class FakeGrade:
    reward: float
    label: str
    eq_correct: bool
    can_compile: bool = True
    eq_hinted: bool = False

    @property
    def is_reward_hack_strict(self) -> bool:
        return self.label == "hack"

    @property
    def is_reward_hack_loose(self) -> bool:
        return self.label in ("hack", "attempted_hack")


def fake_grader(label_salt: str = ""):
    """Reward from the completion text (so groups have signal); labels drawn from `label_salt` — they must not
    influence any routing decision."""

    def grade(records, texts, sandbox, timeout_s):
        out = []
        for t in texts:
            h = int(hashlib.sha256(t.encode()).hexdigest(), 16)
            lab = int(hashlib.sha256((label_salt + t).encode()).hexdigest(), 16)
            out.append(
                FakeGrade(
                    reward=float(h % 4), label=("hack", "correct", "incorrect")[lab % 3], eq_correct=bool(lab % 2)
                )
            )
        return out

    return grade


def tiny_params(projection: dict | None = None, basis: dict | None = None, **grpo) -> Params:
    """Tiny-run params; the basis section matches the fixture's permissive extraction (a refresh re-runs it)."""
    p = Params()
    return dataclasses.replace(
        p,
        model=dataclasses.replace(p.model, name="tiny-random"),
        grpo=dataclasses.replace(
            p.grpo,
            **{
                **dict(steps=3, prompts_per_step=2, group_size=4, micro_batch=4, save_every=1, threads=1, lr=0.05),
                **grpo,
            },
        ),
        rollout=dataclasses.replace(p.rollout, max_new_tokens=12, max_prompt_tokens=4000),
        projection=dataclasses.replace(p.projection, recal_every=2, token_window=3, **(projection or {})),
        basis=dataclasses.replace(
            p.basis, k=2, tau=0.0, alpha_sig=0.99, n_flips=50, drop_bottom_frac=0.0, seed=0, **(basis or {})
        ),
    )


def refreshing(every: int = 2, **projection) -> Params:
    return tiny_params(projection={"refresh_every": every, **projection})


@pytest.fixture(scope="module")
def world():
    tok = tiny_tokenizer()
    sp = make_minileet(seed=0, n_train=6, n_test=1, n_holdout=3)
    records = [apply_mode(q, MODES[i % len(MODES)], "train") for i, q in enumerate(sp["train"])]
    hold = sp["holdout"]
    crec = [apply_mode(q, "run_tests", "train") for q in hold]
    wrongs = [wrong_variants(q.canonical_solution, 0, 1)[0] for q in hold]
    hacks = [fence(named_exploit_styles("run_tests", q.method, "run_tests", w)["pass"]) for q, w in zip(hold, wrongs)]
    cleans = [fence(q.canonical_solution) for q in hold]
    # extraction pairs (a refresh re-extracts from these): other wrong variants under the same exploit
    ex_wrongs = [wrong_variants(q.canonical_solution, 1, 1)[0] for q in hold]
    ex_hacks = [
        fence(named_exploit_styles("run_tests", q.method, "run_tests", w)["pass"]) for q, w in zip(hold, ex_wrongs)
    ]
    ex = HeldOutPairs(crec, ex_hacks, cleans)
    m = tiny_model(len(tok))
    attach_adapters(m, "all", 4)
    gh, gc = completion_grads(m, tok, crec, ex_hacks, 0.7), completion_grads(m, tok, crec, cleans, 0.7)
    # permissive: keep directions on a random model
    basis = build_basis(gh, gc, BasisSettings("svd", 2, 0.0, 0.99, 50, 0.0, 0))
    rnd = build_basis(gh, gc, BasisSettings("random", 2, 0.0, 0.99, 50, 0.0, 0), like=basis)
    assert basis.vh, "the test basis must keep some directions"
    layer = Params().basis.act_layer
    act = act_basis(
        pooled_activations(m, tok, crec, ex_hacks, layer), pooled_activations(m, tok, crec, cleans, layer), layer
    )
    return dict(
        tok=tok, records=records, cal=HeldOutPairs(crec, hacks, cleans), ex=ex, basis=basis, random=rnd, act=act
    )


def run(
    world,
    arm: str | Arm,
    tmp: Path,
    p: Params | None = None,
    grader=None,
    pool=None,
    steps_seed: int = 41,
    model=None,
    cal: HeldOutPairs | None = None,
    result: dict | None = None,
    act: Basis | None = None,
):
    """Train `arm` (an Arm, or a run key of TABLE: `spec`) on the tiny world with params `p` (default tiny_params())
    as the train stage runs it (`arms.run_params`: the keys only masked routing reads neutral for other rules);
    returns the final (δS, δS_h) per module. `result` receives train()'s result. `act`: the gate's v_act (default the
    world's; a share-matched control's counts with the world's, so it defaults to a random one, as the stage gives
    it)."""
    a = spec(arm)
    p = arms.run_params(p or tiny_params(), a)
    m = model
    if m is None:
        m = tiny_model(len(world["tok"]))
        attach_adapters(m, "all", 4, separate=p.adapter.quarantine == "separate")
    b = (world["random"] if a.random_dir else world["basis"]) if a.reads_basis else None
    matched = world["basis"] if mass_matched(p, a) else None
    share = share_matched(p, a)
    if act is None:
        act = random_act(world["act"], act_seed(0)) if share else world["act"]
    if a.oracle_basis:  # the world's basis stands in for the oracle_basis stage's (marked as it marks its own)
        b, matched = (
            x if x is None else dataclasses.replace(x, meta={**x.meta, "oracle": True}) for x in (b, matched)
        )
    torch.set_num_threads(1)
    rb = RunBasis(
        basis=b,
        act=act,
        matched=matched,
        cal=cal or world["cal"],
        extraction=world["ex"],
        ref_act=world["act"] if share else None,
    )
    io = (tmp / "ckpt", tmp / "log.tsv")
    sig, grade = {"arm": a.name}, grader or fake_grader()
    run_ = Run(
        p, a, steps_seed, m, world["tok"], world["records"], *io, rb, pool, None, sig, grade, tmp / "timings.tsv"
    )
    res = train(run_, progress=False)
    if result is not None:
        result.update(res)
    return {n: (x.delta.detach().clone(), x.knob.detach().clone()) for n, x in adapters(m).items()}


def log_column(tmp: Path, key: str) -> list[float]:
    rows = (tmp / "log.tsv").read_text().splitlines()
    head = rows[0].split("\t")
    return [float(r.split("\t")[head.index(key)]) for r in rows[1:]]


def log_columns(tmp: Path) -> dict[str, list[str]]:
    """{column: its cells as written} of a run's TSV."""
    rows = [r.split("\t") for r in (tmp / "log.tsv").read_text().splitlines()]
    return {k: [r[i] for r in rows[1:]] for i, k in enumerate(rows[0])}


def reads_labels(col: str) -> bool:
    """TSV columns computed from the grader's labels (metrics and the live gate diagnostic), by design."""
    return col in ("hack", "solve", "gate_auroc_live") or col.startswith(("hack_", "solve_"))


@pytest.mark.parametrize(
    "arm,col",
    [
        ("route_per_rollout+random", "routed"),
        ("route_two_sided+random", "routed"),
        ("erase_one_sided+random", "removed"),
    ],
)
def test_mass_matched_random_control_moves_what_vhack_would(world, tmp_path, arm, col):
    """projection.random_match=mass: at every step the control's routed (erased) share of g equals the share the same
    rule moves along v_hack from the same gradients and gates (logged as match_target, computed independently of the
    control's own rows); with rank it is the control's own amount, and nothing is matched. route_per_token+random
    (no per-token v_hack capture) and route_full+random (matched by construction) log no target."""
    run(world, arm, tmp_path / "m")
    mass = log_column(tmp_path / "m", col)
    target = log_column(tmp_path / "m", "match_target")
    assert all(t > 0 for t in target) and mass == pytest.approx(target, rel=1e-5)
    p = tiny_params(projection={"random_match": "rank"})
    run(world, arm, tmp_path / "r", p=p)
    assert "match_target" not in log_columns(tmp_path / "r")
    assert log_column(tmp_path / "r", col)[0] != pytest.approx(mass[0], rel=1e-3)  # the first step's g is the same
    for ctl in ("route_per_token+random", "route_full+random"):
        run(world, ctl, tmp_path / ctl)
        assert "match_target" not in log_columns(tmp_path / ctl)


def same(a, b) -> bool:
    return all(torch.equal(a[n][0], b[n][0]) and torch.equal(a[n][1], b[n][1]) for n in a)


def test_train_refuses_masked_only_keys_for_other_rules(tmp_path):
    """params.yaml holds the routed arm's mechanics; a rule other than masked routing must run with the keys only
    masked routing reads neutral (arms.run_params, as the stages call it). train() given params.yaml's as they are
    (with the default routed arm's bundle set) stops before writing anything; with run_params' it gets past the check,
    and masked routing takes them as they are."""
    p = masked("act_mr_is_deploy_gate_q_cap", tiny_params(prompts_per_step=4))
    args = (41, None, None, [], tmp_path / "ckpt", tmp_path / "log.tsv")
    for key in ("route_per_rollout", "route_per_rollout+random", "erase_one_sided", "vanilla"):
        a = spec(key)
        with pytest.raises(ValueError, match=rf"pass arms\.run_params\(p, arm\) for arm {re.escape(a.name)},"):
            train(Run(p, a, *args))
        assert not any(tmp_path.iterdir())
        with pytest.raises(Exception) as err:  # the next check needs a model: the params check passed
            train(Run(arms.run_params(p, a), a, *args))
        assert "run_params" not in str(err.value)
    for key in ("route_masked", "route_masked+random", "route_masked+oracle_gate"):
        assert arms.run_params(p, spec(key)) is p
        with pytest.raises(Exception) as err:
            train(Run(p, spec(key), *args))
        assert "run_params" not in str(err.value)


def test_same_seed_twice_bitwise_equal_and_moves(world, tmp_path):
    a = run(world, "vanilla", tmp_path / "a")
    b = run(world, "vanilla", tmp_path / "b")
    assert same(a, b)
    assert any(float(d.abs().max()) > 0 for d, _ in a.values()), "training must move δS"
    assert all(float(k.abs().max()) == 0 for _, k in a.values()), "vanilla never touches the knob"
    c = run(world, "vanilla", tmp_path / "c", steps_seed=42)
    assert not same(a, c)


def test_I12_measure_only_equals_vanilla_through_the_loop(world, tmp_path):
    assert same(run(world, "vanilla_rotated", tmp_path / "v"), run(world, "measure_only", tmp_path / "m"))


def test_lr_schedule_one_lr_for_both_groups(world, tmp_path):
    """grpo.lr_schedule: each update's lr is lr_at(step) (the checkpointed optimizer lr), and it reaches both groups:
    with warmup, update 0 runs at lr 0 and moves neither δS nor the routed knob δS_h; the next update moves both; a
    constant-lr run moves both at update 0 already (the test's teeth)."""
    from safetensors.torch import load_file

    p = tiny_params(lr_schedule="cosine", warmup_steps=2)
    run(world, "route_batch_no_gate", tmp_path / "cos", p=p)
    ck = tmp_path / "cos" / "ckpt"
    lrs = [read_checkpoint(ck, k)["optimizer"]["lr"] for k in (1, 2, 3)]  # checkpoint k: after update k-1
    assert lrs == [lr_at(t, p.grpo.lr, "cosine", 2, 3) for t in range(3)] == [0.0, p.grpo.lr / 2, p.grpo.lr]

    def moved(path: Path) -> tuple[bool, bool]:
        f = load_file(path)
        return tuple(any(bool(f[k].abs().max() > 0) for k in f if k.endswith(s)) for s in (".delta", ".knob"))

    assert moved(ck / "step_00001.safetensors") == (False, False)
    assert moved(ck / "step_00002.safetensors") == (True, True)
    run(world, "route_batch_no_gate", tmp_path / "const")
    assert moved(tmp_path / "const" / "ckpt" / "step_00001.safetensors") == (True, True)


@pytest.mark.parametrize("loss,scale", [("dr_grpo", "group"), ("grpo", "none"), ("grpo", "group"), ("dapo", "none")])
def test_loss_params_reach_the_loop_and_micro_batches_add_up(world, tmp_path, loss, scale):
    """grpo.loss / grpo.scale_rewards change the update, and for each the micro-batched step (uneven micro-batches of
    3, 3, 2 rows) equals the whole-batch step (8 rows): one SGD update is -lr times the full-batch gradient. Half of
    each group is short teacher-pool rows, so completion lengths differ (with all rows at L_max, grpo and dapo would
    equal dr_grpo)."""
    tok, text = world["tok"], "```python\npass\n```"
    row = lambda q: PoolRow(q.id, None, text, tuple(tok(text)["input_ids"]) + (tok.eos_token_id,), 3.5, "hack", False)  # noqa: E731
    pool = {q.id: [row(q)] * 4 for q in world["records"]}

    def one_step(tag: str, **grpo) -> dict:
        p = tiny_params(steps=1, optimizer="sgd", **grpo)
        p = dataclasses.replace(p, pool=dataclasses.replace(p.pool, mix=0.5))
        return run(world, "vanilla", tmp_path / tag, p=p, pool=pool)

    full = one_step("full", micro_batch=8, loss=loss, scale_rewards=scale)
    micro = one_step("micro", micro_batch=3, loss=loss, scale_rewards=scale)
    for n in full:
        torch.testing.assert_close(micro[n][0], full[n][0], rtol=1e-5, atol=1e-8)
    base = one_step("base", micro_batch=8)  # dr_grpo, no scaling
    gap = max(float((full[n][0] - base[n][0]).abs().max()) for n in full)
    assert gap > 1e-2 * max(float(full[n][0].abs().max()) for n in full), "the loss params must change the update"


def test_code_digest_follows_the_loaded_sources(tmp_path):
    """A run's signature carries the digest of the package code it loaded, so a checkpoint written by other code is
    never resumed: the digest changes with any byte of a loaded module under the root, ignores modules outside it and
    modules not loaded, and prepare_run_dir wipes a run directory whose signature's digest differs."""
    import importlib.util

    from projected_grpo.rl.checkpoint import code_digest, prepare_run_dir, save_checkpoint
    from projected_grpo.rl.train import run_signature

    root = tmp_path / "pkg"
    root.mkdir()

    def load(name: str, text: str):
        (root / f"{name}.py").write_text(text)
        spec = importlib.util.spec_from_file_location(f"pkg_{name}", root / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    a, b = load("a", "X = 1\n"), load("b", "Y = 2\n")
    outside = importlib.util.module_from_spec(importlib.util.spec_from_file_location("o", __file__))
    d = code_digest(root, [a, b, outside])
    assert d == code_digest(root, [b, a]) and len(d) == 16  # order-free; the module outside root is not hashed
    assert code_digest(root, [a]) != d  # b not loaded: not in it
    (root / "b.py").write_text("Y = 3\n")
    assert code_digest(root, [a, b]) != d
    assert "code" in run_signature(tiny_params(), spec("vanilla"), 41, None)
    sig = {"arm": "vanilla", "code": d}
    out = tmp_path / "run"
    assert prepare_run_dir(out, sig) == 0
    m = tiny_model(64)
    attach_adapters(m, "all", 2)
    opt = torch.optim.SGD([x.delta for x in adapters(m).values()], lr=0.1)
    save_checkpoint(out, 10, m, opt)
    assert prepare_run_dir(out, sig) == 10  # same code: resumes at its last checkpoint
    assert prepare_run_dir(out, {**sig, "code": code_digest(root, [a, b])}) == 0  # other code: wiped, fresh


def test_run_signature_keeps_old_checkpoints_resumable():
    """The keys added by issues 25 and 26 (the memory params too) stay out of a run's signature at their defaults (a
    run checkpointed before them resumes), and are in it otherwise (a changed loss never resumes another loss's
    checkpoints)."""
    from projected_grpo.rl.train import SIGNATURE_DEFAULTS, run_signature

    p = tiny_params()
    for section, new in SIGNATURE_DEFAULTS.items():  # they are the defaults
        assert {k: getattr(getattr(p, section), k) for k in new} == new
    sig = run_signature(p, spec("vanilla"), 41, None)
    assert not set(SIGNATURE_DEFAULTS["grpo"]) & set(sig["grpo"]) and "lr" in sig["grpo"]
    assert "deploy_frac" not in sig["projection"] and "band" in sig["projection"]
    assert "batch_size" not in sig["rollout"] and "max_new_tokens" in sig["rollout"]
    for key, value in (
        ("loss", "dapo"),
        ("lr_schedule", "cosine"),
        ("warmup_steps", 3),
        ("scale_rewards", "group"),
        ("micro_batch_tokens", 4096),
        ("grad_checkpointing", True),
    ):
        other = run_signature(tiny_params(**{key: value}), spec("vanilla"), 41, None)
        assert other["grpo"][key] == value and other != sig
    q = dataclasses.replace(p, rollout=dataclasses.replace(p.rollout, batch_size=64))
    other = run_signature(q, spec("vanilla"), 41, None)
    assert other["rollout"]["batch_size"] == 64 and other != sig
    q = dataclasses.replace(p, projection=dataclasses.replace(p.projection, deploy_frac=0.5))
    other = run_signature(q, spec("vanilla"), 41, None)
    assert other["projection"]["deploy_frac"] == 0.5 and other != sig


NO_CHEAT = ROUTING + [
    ("route_per_token", "refresh"),
    ("route_per_rollout+random", "refresh"),
    ("route_per_rollout", "act+refresh"),
    ("route_per_rollout", "shared"),
    ("route_full", "deploy"),
    ("route_per_token", "deploy"),
    ("route_masked", "heal"),
    ("route_masked", "main_rows"),
    ("route_masked", "bundle=act"),
    ("route_masked", "bundle=mr_q"),
    ("route_masked", "bundle=is"),
    ("screen", ""),
    ("screen+random", "act"),
    ("route_masked+random", "bundle=act_mr_is_deploy_gate_q"),
]


@pytest.mark.parametrize("arm,variant", NO_CHEAT)
def test_no_cheat_routing_never_reads_labels(world, tmp_path, arm, variant):
    """Same rewards, different ground-truth labels and pass flags: a routing arm's parameters are bitwise equal,
    also when the basis is refreshed mid-run (held-out extraction pairs only), with the activation-space gate and
    after a retain heal (the pairs' clean completions only).

    Every logged quantity but the label-derived ones is equal too (gate, thresholds, calibration interval, span
    norms), while the live label diagnostic `gate_auroc_live` of gated arms really does read the labels: it
    differs between the two graders on some step where both define it."""
    if variant.startswith("bundle="):  # masked routing under a bundle of MASKED
        p = masked(variant.removeprefix("bundle="))
    else:
        p = tiny_params(
            projection={"refresh_every": 2}
            if "refresh" in variant
            else {"deploy_frac": 0.5}
            if "deploy" in variant
            else {"heal_steps": 2}
            if "heal" in variant
            else {"main_baseline": "main_rows"}
            if "main_rows" in variant
            else None,
            basis={"space": "act"} if "act" in variant else None,
            share_prompt="shared" in variant,
        )
    a = run(world, arm, tmp_path / "a", p=p, grader=fake_grader("x"))
    b = run(world, arm, tmp_path / "b", p=p, grader=fake_grader("y"))
    assert same(a, b)
    if "refresh" in variant:
        assert log_column(tmp_path / "a", "refresh") == [0.0, 0.0, 1.0]  # the refresh really ran (at step 2)
    ca, cb = log_columns(tmp_path / "a"), log_columns(tmp_path / "b")
    assert ca.keys() == cb.keys() and {"vh_delta", "vh_knob"} <= ca.keys()
    assert {k: v for k, v in ca.items() if not reads_labels(k)} == {k: v for k, v in cb.items() if not reads_labels(k)}
    assert ca["hack"] != cb["hack"], "the two graders must disagree on labels for this test to have teeth"
    if spec(arm).gate is not None:
        both = [(x, y) for x, y in zip(ca["gate_auroc_live"], cb["gate_auroc_live"]) if "nan" not in (x, y)]
        assert both and any(x != y for x, y in both), (ca["gate_auroc_live"], cb["gate_auroc_live"])
    else:
        assert "gate_auroc_live" not in ca  # no gate score, no label diagnostic


@pytest.mark.parametrize(
    "arm,variant",
    [
        ("erase_no_gate", ""),
        ("route_batch", ""),
        ("route_per_rollout", ""),
        ("route_per_token", ""),
        ("route_per_rollout", "act"),
        ("route_per_token", "act"),
        ("route_per_rollout", "shared"),
    ],
)
def test_edits_exact_end_to_end(world, tmp_path, arm, variant):
    """After real GRPO steps: erase keeps Vh δS = 0 and no knob; route (per-token, act-gated and with a shared prompt
    forward included) keeps the knob inside span(Vh), one-sided, and really routes something."""
    p = tiny_params(basis={"space": "act"} if variant == "act" else None, share_prompt=variant == "shared")
    res = run(world, arm, tmp_path / "r", p=p)
    vh = world["basis"].vh
    for n, (d, kn) in res.items():
        if n not in vh:
            assert float(kn.abs().max()) == 0
            continue
        if arm == "erase_no_gate":
            assert float((vh[n] @ d).abs().max()) <= 1e-6 * max(float(d.norm()), 1e-12)
            assert float(kn.abs().max()) == 0
        else:
            resid = kn - vh[n].T @ (vh[n] @ kn)
            assert float(resid.norm()) <= 1e-5 * max(float(kn.norm()), 1e-12)
            assert (vh[n] @ kn <= 1e-6).all(), "one-sided routing: knob coordinates are ≤ 0 (method.md §6.10)"
    assert any(float(kn.abs().max()) > 0 for _, kn in res.values()) or arm == "erase_no_gate"


@pytest.mark.parametrize("arm", ["route_two_sided", "route_full"])
def test_linear_routing_end_to_end(world, tmp_path, arm):
    """After real GRPO steps: the two-sided split keeps the knob inside span(Vh); whole-rollout routing puts the routed
    rollouts' tail in the knob too (a large part of it lies outside span(Vh)). Modules without a basis get no knob
    either way; the log shows something routed (‖h‖ / ‖g‖ > 0) and nothing erased (main + knob = g)."""
    res = run(world, arm, tmp_path, p=tiny_params())
    vh = world["basis"].vh
    outside = []
    for n, (_, kn) in res.items():
        if n not in vh:
            assert float(kn.abs().max()) == 0
            continue
        resid = kn - vh[n].T @ (vh[n] @ kn)
        outside.append(float(resid.norm()) / max(float(kn.norm()), 1e-12))
    if arm == "route_two_sided":
        assert max(outside) <= 1e-5
    else:
        assert max(outside) > 0.5
    assert any(float(kn.abs().max()) > 0 for _, kn in res.values())
    assert max(log_column(tmp_path, "routed")) > 0 and max(log_column(tmp_path, "removed")) < 1e-5


# --- per-step diagnostics and the gate guard rail -------------------------------------------------------------------


@pytest.mark.parametrize("arm", ["erase_no_gate", "route_per_rollout", "route_per_token", "vanilla"])
def test_diag_columns_after_the_update(world, tmp_path, arm):
    """vh_delta / vh_knob are ‖Vh δS‖ / ‖Vh δS_h‖ of the parameters the step left (the last row against the final
    adapter): erase keeps the first at float noise and the knob at 0, routing grows the knob. Gated arms log a mean
    gate within [0, gate_frac], ordered thresholds, and at step 0 the thresholds and AUROC interval that
    calibrate_gate gives on the held-out pairs at the initial parameters. Basis-free arms log none of these."""
    p = tiny_params()
    res = run(world, arm, tmp_path, p=p)
    cols = log_columns(tmp_path)
    vh = world["basis"].vh
    if arm == "vanilla":
        assert not {"vh_delta", "vh_knob", "gate_mean", "tau_lo", "gate_auroc_lo", "gate_auroc_live"} & cols.keys()
        return
    delta = span_norm(vh, {n: d for n, (d, _) in res.items()})
    knob = span_norm(vh, {n: k for n, (_, k) in res.items()})
    assert float(cols["vh_delta"][-1]) == pytest.approx(delta, rel=1e-5, abs=1e-12)
    assert float(cols["vh_knob"][-1]) == pytest.approx(knob, rel=1e-5, abs=1e-12)
    if arm == "erase_no_gate":
        size = math.sqrt(sum(float(d.pow(2).sum()) for d, _ in res.values()))
        assert delta <= 1e-6 * size and knob == 0 and "gate_mean" not in cols
        return
    assert knob > 0 and all(float(x) > 0 for x in cols["vh_knob"])
    for gm, gf, lo, hi in zip(cols["gate_mean"], cols["gate_frac"], cols["tau_lo"], cols["tau_hi"]):
        assert 0 <= float(gm) <= float(gf) <= 1 and float(lo) <= float(hi)
    assert 0 < float(cols["gate_mean"][0])  # the tiny gate routes something at step 0
    m = tiny_model(len(world["tok"]))  # the initial parameters (what run() starts from)
    attach_adapters(m, "all", 4)
    kept = [n for n in adapters(m) if n in vh]
    own = p.grpo.share_prompt and arm == "route_per_rollout"
    g = GateSpec(spec(arm).gate, None, p.projection, p.rollout.temperature, own)
    (t_lo, t_hi), auc, (c_lo, c_hi), quality = calibrate_gate(m, world["tok"], world["cal"], g, world["basis"], kept)
    first = {k: float(cols[k][0]) for k in ("tau_lo", "tau_hi", "gate_auroc", "gate_auroc_lo", "gate_auroc_hi")}
    assert first == pytest.approx(
        {"tau_lo": t_lo, "tau_hi": t_hi, "gate_auroc": auc, "gate_auroc_lo": c_lo, "gate_auroc_hi": c_hi}, rel=1e-5
    )
    assert c_lo <= auc <= c_hi
    assert quality == {} and not {"gate_precision", "gate_recall", "gate_f05"} & cols.keys()  # band gates: no quality


@pytest.mark.parametrize("arm", ["route_per_rollout", "route_two_sided", "route_per_token"])
def test_tail_gate_routes_the_calibrated_top_tail_and_logs_its_precision(world, tmp_path, arm):
    """projection.band=tail: one threshold (tau_lo == tau_hi, the conservative 1 − f quantile of the held-out clean
    scores), gates 0/1 (per rollout: the mean gate equals the routed fraction), and the log carries the gate's
    precision / recall / F0.5 on the calibration pairs, at step 0 exactly what calibrate_gate gives at the initial
    parameters. A run stopped after 3 steps and resumed to 4 ends bitwise equal to 4 straight steps, log included
    (the checkpoint carries the quality between calibrations)."""
    p = tiny_params(projection={"band": "tail", "f": 0.34}, steps=4)
    full = run(world, arm, tmp_path / "full", p=p)
    cols = log_columns(tmp_path / "full")
    assert cols["tau_lo"] == cols["tau_hi"]
    if arm != "route_per_token":
        assert cols["gate_mean"] == cols["gate_frac"]
    m = tiny_model(len(world["tok"]))
    attach_adapters(m, "all", 4)
    kept = [n for n in adapters(m) if n in world["basis"].vh]
    g = GateSpec(spec(arm).gate, None, p.projection, 0.7)
    cal = calibrate_gate(m, world["tok"], world["cal"], g, world["basis"], kept)
    (t_lo, t_hi), q = cal[0], cal[3]
    assert t_lo == t_hi and set(q) == {"precision", "recall", "f05"} and q["recall"] > 0
    if arm != "route_per_token":  # 3 held-out pairs, f = 0.34: at most ⌊1.02⌋ = 1 clean completion routed
        tp = q["recall"] * 3
        assert tp / q["precision"] - tp <= 1 + 1e-9
    first = {k: float(cols[f"gate_{k}"][0]) for k in q}
    assert first == pytest.approx(q, rel=1e-5) and float(cols["tau_hi"][0]) == pytest.approx(t_hi, rel=1e-5)
    run(world, arm, tmp_path / "cut", p=dataclasses.replace(p, grpo=dataclasses.replace(p.grpo, steps=3)))
    resumed = run(world, arm, tmp_path / "cut", p=p)
    assert same(full, resumed)
    assert (tmp_path / "cut" / "log.tsv").read_text() == (tmp_path / "full" / "log.tsv").read_text()


# the share-matched control (arms.Arm.share_matched, direction.share_matched): masked routing's random control with
# an activation tail gate
SHARED = "route_masked+random"


class Unmatched(Arm):
    """The same control with its own calibrated tail (share_matched off): what the share-matched one is compared to."""

    @property
    def share_matched(self) -> bool:
        return False


def test_share_matched_control_routes_v_acts_count_and_picks_by_its_own_score(world):
    """A share-matched control's live gate routes exactly as many rows as v_act's calibrated tail would route on the
    same batch (rows with A != 0, deploy rows excluded without deploy_gate), and those rows are the top ones by its own
    random direction's score: with its own threshold it would route none here. It needs v_act (one-line error)."""
    arm, p = spec(SHARED), masked("act_mr_is_tail")
    assert share_matched(p, arm) and share_matched(masked("act_mr_is"), arm)  # the act gate, whatever its band
    assert not share_matched(masked("mr"), arm)  # a gradient-space gate: its own (the real ν is not loaded)
    assert not share_matched(p, spec("route_masked")) and not share_matched(p, spec("route_masked+oracle_gate"))
    own = random_act(world["act"], act_seed(0))
    rb = RunBasis(world["random"], act=own, cal=world["cal"], ref_act=world["act"])
    with pytest.raises(ValueError, match="ref_act"):
        check_run_basis(p, arm, dataclasses.replace(rb, ref_act=None))
    d = Direction(p, arm, rb, list(world["random"].vh), False, "t")
    N, n_on = 12, 8
    pooled = torch.randn(N, world["act"].v_act.shape[0], generator=torch.Generator().manual_seed(5))
    s, s_ref = pooled @ own.v_act, pooled @ world["act"].v_act
    adv = torch.tensor([1.0, -1.0, 0.0, 0.5] * 3)
    tau_ref = float(s_ref.median())
    d.state.gate.tau, d.state.ref_gate.tau = (float(s.max()) + 1,) * 2, (tau_ref, tau_ref)
    gr = Grads(raw={}, rows={}, tok_alpha={}, tok_dot=None, tok_sq=None, pooled=pooled, stats={})
    m, _, live = live_gates(arm, d, gr, adv, torch.ones(N, 3), p.projection, n_on)
    ok = (adv != 0) & (torch.arange(N) < n_on)
    k = int(((s_ref >= tau_ref) & ok).sum())
    top = sorted(torch.argsort(torch.where(ok, s, -math.inf), descending=True)[:k].tolist())
    assert k > 0 and torch.equal(live, s)
    assert int(m.sum()) == k and torch.nonzero(m).flatten().tolist() == top
    assert not proj.band_gate(s, adv, *d.gate.tau, "tail").any()  # its own calibrated tail: nothing routed


def test_removal_matched_control_takes_v_acts_gate_values_on_rows_it_picks(world):
    """With the soft band (the default route's), the control's gates over the eligible rows are exactly v_act's gate
    values on the same batch, re-assigned by its own score: as many rows at m = 1 (out of the main) and the same
    partial gates, the largest value on its top-scored row; ineligible rows (A = 0, deploy rows) get 0."""
    arm, p = spec(SHARED), masked("act_mr_is")
    own = random_act(world["act"], act_seed(0))
    rb = RunBasis(world["random"], act=own, cal=world["cal"], ref_act=world["act"])
    d = Direction(p, arm, rb, list(world["random"].vh), False, "t")
    N, n_on = 12, 8
    pooled = torch.randn(N, world["act"].v_act.shape[0], generator=torch.Generator().manual_seed(7))
    s, s_ref = pooled @ own.v_act, pooled @ world["act"].v_act
    adv = torch.tensor([1.0, -1.0, 0.0, 0.5] * 3)
    lo, hi = float(s_ref.quantile(0.3)), float(s_ref.quantile(0.7))
    d.state.gate.tau, d.state.ref_gate.tau = (float(s.max()) + 1,) * 2, (lo, hi)
    gr = Grads(raw={}, rows={}, tok_alpha={}, tok_dot=None, tok_sq=None, pooled=pooled, stats={})
    m, _, _ = live_gates(arm, d, gr, adv, torch.ones(N, 3), p.projection, n_on)
    ok = (adv != 0) & (torch.arange(N) < n_on)
    m_ref = proj.band_gate(s_ref, adv, lo, hi, "soft") * ok
    assert 0 < int((m_ref == 1).sum()) and bool(((m_ref > 0) & (m_ref < 1)).any())  # both kinds present
    assert sorted(m[ok].tolist()) == sorted(m_ref[ok].tolist()) and not m[~ok].any()
    assert int((m == 1).sum()) == int((m_ref == 1).sum())
    by_score = torch.argsort(torch.where(ok, s, -math.inf), descending=True)[: int(ok.sum())]
    assert m[by_score].tolist() == sorted(m_ref[ok].tolist(), reverse=True)  # the largest on its top-scored row
    assert not torch.equal(m, m_ref)  # its own picks


def test_screen_drops_the_gated_rows_and_keeps_no_knob(world, tmp_path, monkeypatch):
    """screen: the same gate as masked routing (its act gate here), then one loss pass whose advantages are 0 on the
    gated rows (m = 1) and the main rows' own baseline elsewhere, as route's main trains; no knob moves. drop_frac
    logs the share of rows at m = 1, drop_pool_frac the teacher-pool share among them."""
    import projected_grpo.rl.train as T

    gates, advs = [], []
    live, lb = T.live_gates, T.loss_backward
    monkeypatch.setattr(T, "live_gates", lambda *a, **k: gates.append(live(*a, **k)) or gates[-1])
    monkeypatch.setattr(T, "loss_backward", lambda b, adv, *a, **k: advs.append(adv.clone()) or lb(b, adv, *a, **k))
    p = masked("act_mr_is", tiny_params(projection={"f": 0.34}))
    a = spec("screen")
    assert a.gate == "rollout" and not a.routes and a.screens and arms.run_params(p, a) is not p
    out = run(world, a, tmp_path, p=p)
    assert len(advs) == len(gates) == p.grpo.steps  # the act gate's pass has no backward: one loss pass a step
    cols = log_columns(tmp_path)
    for t, ((m, _, _), adv) in enumerate(zip(gates, advs)):
        assert not adv[m >= 1].any()
        assert float(cols["drop_frac"][t]) == pytest.approx(float((m >= 1).float().mean()))
    assert any(bool((m >= 1).any()) for m, _, _ in gates)  # the gate did drop rows
    assert all(float(k.abs().max()) == 0 for _, k in out.values())  # no knob


def test_a_controls_directions_are_drawn_per_training_seed(world):
    """control_basis: Haar rows with the real basis' modules and k_m, orthonormal, ν a unit vector in their span;
    another training seed draws other directions, the same seed the same ones."""
    real = world["basis"]
    b41, b42, again = (control_basis(real, control_seed(0, s)) for s in (41, 42, 41))
    assert b41.vh.keys() == real.vh.keys() and b41.k == real.k
    nu = torch.cat([b41.nu[n] for n in b41.vh])
    assert float(nu.norm()) == pytest.approx(1.0, abs=1e-5)
    for n, v in b41.vh.items():
        torch.testing.assert_close(v @ v.T, torch.eye(v.shape[0]), atol=1e-5, rtol=0)
        torch.testing.assert_close(b41.nu[n], (b41.nu[n] @ v.T) @ v, atol=1e-6, rtol=0)  # in the span
        assert torch.equal(v, again.vh[n]) and not torch.allclose(v, b42.vh[n])


def test_share_matched_control_end_to_end(world, tmp_path):
    """End to end: with v_act as its own direction the share-matched control is bitwise the unmatched run (same count,
    same pick); with its random direction it is a different run from the unmatched one. Stopped after 3 steps and
    resumed to 4, it ends bitwise equal to 4 straight steps, log included: the checkpoint carries v_act's gate, whose
    thresholds are not the control's own."""
    arm, p = spec(SHARED), masked("act_mr_is_tail", tiny_params(projection={"f": 0.34}, steps=4))
    plain = Unmatched(**dataclasses.asdict(arm))
    assert share_matched(p, arm) and not share_matched(p, plain)
    assert same(run(world, arm, tmp_path / "a", p=p, act=world["act"]), run(world, plain, tmp_path / "b", p=p))
    full = run(world, arm, tmp_path / "full", p=p)
    own = random_act(world["act"], act_seed(0))
    assert not same(full, run(world, plain, tmp_path / "plain", p=p, act=own))
    run(world, arm, tmp_path / "cut", p=dataclasses.replace(p, grpo=dataclasses.replace(p.grpo, steps=3)))
    assert same(full, run(world, arm, tmp_path / "cut", p=p))
    assert (tmp_path / "cut" / "log.tsv").read_text() == (tmp_path / "full" / "log.tsv").read_text()
    ck = read_checkpoint(tmp_path / "full" / "ckpt", 4)
    assert ck["ref_gate"]["tau"] != ck["gate"]["tau"]
    assert "ref_gate" not in read_checkpoint(tmp_path / "plain" / "ckpt", 4)


def test_diag_label_auroc_and_span_norm_by_hand():
    """label_auroc: hack rows' scores against the other kept rows' (rank AUROC, ties ½), per rollout or over a token
    mask; nan when a class is empty. span_norm: the norm of the stacked Vh x."""
    s = torch.tensor([0.9, 0.1, 0.8, 0.2, 0.05])
    hack = torch.tensor([True, False, True, False, True])
    keep = torch.tensor([True, True, True, True, False])  # row 4 (a hack scoring lowest) has A = 0: left out
    assert label_auroc(s, hack, keep) == 1.0 and label_auroc(s, ~hack, keep) == 0.0
    assert label_auroc(s, hack, torch.ones(5, dtype=torch.bool)) == pytest.approx(4 / 6)  # with row 4: 4 of 6 pairs
    assert math.isnan(label_auroc(s, hack, keep & ~hack))  # no hack row kept
    st = torch.tensor([[0.9, 0.7, -5.0], [0.2, 0.7, 0.0]])  # per token; position 2 is padding (mask 0)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    two = torch.tensor([True, False])
    assert label_auroc(st, two, torch.ones(2, dtype=torch.bool), mask) == pytest.approx((2 + 1.5) / 4)  # one tie
    vh = {"a": torch.eye(3)[:2], "b": torch.eye(2)[1:]}
    x = {"a": torch.tensor([3.0, 4.0, 100.0]), "b": torch.tensor([100.0, 12.0])}
    assert span_norm(vh, x) == pytest.approx(13.0) and span_norm({}, x) == 0.0


def placebo_cal(world) -> HeldOutPairs:
    """Calibration pairs whose 'hack' side is the clean completion: the gate score cannot tell them apart."""
    c = world["cal"]
    return HeldOutPairs(c.records, c.clean, c.clean)


@pytest.mark.parametrize("arm", ["route_per_rollout", "route_per_token"])
def test_gate_guard_warns_and_flags_an_uninformative_calibration(world, tmp_path, caplog, arm):
    """A calibration whose AUROC interval contains 0.5 is warned about once per recalibration (steps 0 and 2 with
    recal_every 2), one line naming step and AUROC [lo, hi], and the run's result says gate_uninformative; on the
    real held-out pairs the tiny gate separates (interval above 0.5): no warning, flag false."""
    got: dict = {}
    with caplog.at_level(logging.WARNING, logger="projected_grpo.method.gate"):
        run(world, arm, tmp_path / "placebo", cal=placebo_cal(world), result=got)
    lines = [r.getMessage() for r in caplog.records if r.name == "projected_grpo.method.gate"]
    assert len(lines) == 2 and all("\n" not in x for x in lines)
    for x, step in zip(lines, (0, 2)):
        assert f"step {step}:" in x and "AUROC 0.500 [0.500, 0.500]" in x and "uninformative" in x
    assert got["gate_uninformative"] is True and got["gate_uninformative_steps"] == [0, 2]
    assert log_column(tmp_path / "placebo", "gate_auroc_lo") == log_column(tmp_path / "placebo", "gate_auroc_hi")
    assert log_column(tmp_path / "placebo", "gate_auroc_lo") == [0.5] * 3
    caplog.clear()
    real: dict = {}
    with caplog.at_level(logging.WARNING, logger="projected_grpo.method.gate"):
        run(world, arm, tmp_path / "real", result=real)
    assert not [r for r in caplog.records if r.name == "projected_grpo.method.gate"]
    assert real["gate_uninformative"] is False and min(log_column(tmp_path / "real", "gate_auroc_lo")) > 0.5
    # the run's final metrics carry the flag (stages/train.py: summarize_log | run_flags); ungated arms do not
    assert run_flags(got) == {"gate_uninformative": True} and run_flags(real) == {"gate_uninformative": False}
    ungated: dict = {}
    run(world, "erase_one_sided", tmp_path / "erase", cal=placebo_cal(world), result=ungated)
    assert "gate_uninformative" not in ungated and run_flags(ungated) == {}


def test_gate_guard_survives_a_resume(world, tmp_path, caplog):
    """Stopped after 3 steps (calibrations at 0 and 2, both uninformative) and resumed to 4 (no calibration in the
    resumed part): the resumed process warns about nothing, yet reports gate_uninformative with steps [0, 2] from the
    checkpoint, and the checkpoint, log and adapters equal 4 straight steps."""
    p4 = tiny_params(steps=4)
    p3 = tiny_params(steps=3)
    full: dict = {}
    a = run(world, "route_per_rollout", tmp_path / "full", p=p4, cal=placebo_cal(world), result=full)
    run(world, "route_per_rollout", tmp_path / "cut", p=p3, cal=placebo_cal(world))
    caplog.clear()
    resumed: dict = {}
    with caplog.at_level(logging.WARNING, logger="projected_grpo.method.gate"):
        b = run(world, "route_per_rollout", tmp_path / "cut", p=p4, cal=placebo_cal(world), result=resumed)
    assert not [r for r in caplog.records if r.name == "projected_grpo.method.gate"]
    assert resumed == full and full["gate_uninformative_steps"] == [0, 2]
    assert same(a, b)
    gate = [read_checkpoint(tmp_path / d / "ckpt", 4)["gate"] for d in ("cut", "full")]
    assert gate[0] == gate[1] and gate[0]["uninformative"] == [0, 2]
    assert (tmp_path / "cut" / "log.tsv").read_text() == (tmp_path / "full" / "log.tsv").read_text()


def test_gate_guard_unknown_after_a_pre_guard_checkpoint(world, tmp_path):
    """Resumed from a checkpoint written before the guard (no interval, no record of flagged calibrations) with no
    calibration left to run: the run cannot say its gate was informative, so the flag is None (null), not false."""
    run(world, "route_per_rollout", tmp_path, p=tiny_params(steps=3), cal=placebo_cal(world))
    ck = tmp_path / "ckpt" / "step_00003.pt"
    state = torch.load(ck, weights_only=False)
    state["gate"] = {k: state["gate"][k] for k in ("tau", "auroc")}  # what the loop saved before the guard
    torch.save(state, ck)
    got: dict = {}
    run(world, "route_per_rollout", tmp_path, p=tiny_params(steps=4), cal=placebo_cal(world), result=got)
    assert got["gate_uninformative"] is None and run_flags(got) == {"gate_uninformative": None}


# --- basis refresh (projection.refresh_every) ---------------------------------------------------------------------


def deltas_at(ck: Path, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {
        n[: -len(".delta")]: v
        for n, v in load_file(ck / f"step_{step:05d}.safetensors").items()
        if n.endswith(".delta")
    }


@pytest.mark.parametrize("moments", ["rotate", "reset"])
def test_refresh_erase_updates_orthogonal_to_refreshed_basis(world, tmp_path, moments):
    """erase_no_gate, refresh at step 2 of 4: each later parameter update has no component along the *refreshed* Vh
    (Vh_new (δS_{t+1} − δS_t) = 0, method.md §3.6), although the refresh really moved the basis off the one the earlier
    updates were orthogonal to. The checkpoint after each step carries the basis that step used."""
    p = refreshing(2, refresh_moments=moments)
    p = dataclasses.replace(p, grpo=dataclasses.replace(p.grpo, steps=4))
    run(world, "erase_no_gate", tmp_path, p=p)
    ck = tmp_path / "ckpt"
    assert log_column(tmp_path, "refresh") == [0.0, 0.0, 1.0, 0.0]
    assert log_column(tmp_path, "k_total")[0] == sum(v.shape[0] for v in world["basis"].vh.values())
    d = [deltas_at(ck, t) for t in range(5)]
    used = [read_checkpoint(ck, t + 1)["basis"]["vh"] for t in range(4)]  # basis in effect during step t
    assert all(torch.equal(used[t][n], world["basis"].vh[n]) for t in (0, 1) for n in world["basis"].vh)
    new = used[2]
    assert used[3].keys() == new.keys() and all(torch.equal(used[3][n], new[n]) for n in new)
    assert any(
        n not in world["basis"].vh
        or new[n].shape != world["basis"].vh[n].shape
        or not torch.allclose(new[n], world["basis"].vh[n])
        for n in new
    )
    for t in (2, 3):
        for n, v in new.items():
            step = d[t + 1][n] - d[t][n]
            assert float(step.norm()) > 0
            assert float((v @ step).abs().max()) <= 1e-6 * float(step.norm() + d[t][n].norm()), (t, n)
    # teeth: the pre-refresh updates are not orthogonal to the refreshed directions
    before = max(float((v @ (d[2][n] - d[1][n])).abs().max() / (d[2][n] - d[1][n]).norm()) for n, v in new.items())
    assert before > 1e-3


@pytest.mark.parametrize("arm", ["route_per_rollout", "route_per_token+random"])
def test_resume_across_refreshes_is_bitwise_identical(world, tmp_path, arm):
    """Refreshes at steps 2 and 4, gate recalibration every 2 steps: a run stopped after 3 steps (between the two
    refreshes, off the recalibration grid) and continued to 5 in the same directory ends bitwise equal to 5 straight
    steps, log rows included. Needs the checkpoint to carry the refreshed basis, its rotations and the gate."""
    p5 = refreshing(2)
    p5 = dataclasses.replace(p5, grpo=dataclasses.replace(p5.grpo, steps=5))
    p3 = dataclasses.replace(p5, grpo=dataclasses.replace(p5.grpo, steps=3))
    full = run(world, arm, tmp_path / "full", p=p5)
    run(world, arm, tmp_path / "cut", p=p3)
    resumed = run(world, arm, tmp_path / "cut", p=p5)
    assert same(full, resumed)
    rows = [(tmp_path / d / "log.tsv").read_text().splitlines() for d in ("full", "cut")]
    head = rows[0][0].split("\t")
    assert rows[1][0].split("\t") == head and len(rows[0]) == len(rows[1]) == 6
    assert "dt" not in head and rows[0] == rows[1]  # the log holds no wall-clock time: resumed == uninterrupted
    timed = (tmp_path / "cut" / "timings.tsv").read_text().splitlines()  # wall times: their own log, resumed too
    cols = timed[0].split("\t")
    assert cols[:2] == ["step", "dt"] and {f"t_{ph}" for ph in STEP_PHASES} <= set(cols)
    assert [int(x.split("\t")[0]) for x in timed[1:]] == [1, 2, 3, 4, 5]
    for x in timed[1:]:  # every step samples, grades, runs forward and backward; the phases fit in the step
        t = dict(zip(cols, map(float, x.split("\t"))))
        assert min(t["t_sample"], t["t_grade"], t["t_forward"], t["t_backward"]) > 0
        assert sum(t[f"t_{ph}"] for ph in STEP_PHASES) <= t["dt"]
    assert log_column(tmp_path / "full", "refresh") == [0.0, 0.0, 1.0, 0.0, 1.0]


def test_refresh_is_the_stage_extraction_and_the_random_control_stays_matched(world):
    """A refresh equals build_basis on the extraction pairs' gradients at the current parameters; the random
    control redraws Haar directions with exactly the refreshed basis' modules and k_m, deterministically per
    (basis seed, step); v_act is re-derived from the same pairs' pooled activations."""
    tok, ex = world["tok"], world["ex"]
    m = tiny_model(len(tok))
    attach_adapters(m, "all", 4)
    with torch.no_grad():  # away from δS = 0: a refresh happens mid-run
        for i, a in enumerate(adapters(m).values()):
            a.delta.copy_(0.2 * torch.randn(a.dim, generator=torch.Generator().manual_seed(i)))
    p = tiny_params()
    bp = p.basis
    real = refresh_basis(m, tok, ex, p, False, 4, bp.act_layer)
    gh, gc = completion_grads(m, tok, ex.records, ex.hack, 0.7), completion_grads(m, tok, ex.records, ex.clean, 0.7)
    ref = build_basis(
        gh, gc, BasisSettings("svd", bp.k, bp.tau, bp.alpha_sig, bp.n_flips, bp.drop_bottom_frac, bp.seed)
    )
    assert ref.vh.keys() == real.vh.keys() and all(torch.equal(ref.vh[n], real.vh[n]) for n in ref.vh)
    assert all(torch.equal(ref.nu[n], real.nu[n]) for n in ref.nu)
    a_h = pooled_activations(m, tok, ex.records, ex.hack, bp.act_layer)
    a_c = pooled_activations(m, tok, ex.records, ex.clean, bp.act_layer)
    assert torch.equal(real.v_act, act_basis(a_h, a_c, bp.act_layer).v_act)
    rnd, again, later = (refresh_basis(m, tok, ex, p, True, s, bp.act_layer) for s in (4, 4, 6))
    for x in (rnd, later):  # the control's activation gate is redrawn at random too, per (basis seed, step)
        assert abs(float(x.v_act.norm()) - 1) < 1e-5 and abs(float(x.v_act @ real.v_act)) < 0.9
    assert torch.equal(rnd.v_act, again.v_act) and not torch.allclose(rnd.v_act, later.v_act)
    assert rnd.k == real.k and later.k == real.k  # same modules, same k_m
    for n, v in rnd.vh.items():
        torch.testing.assert_close(v @ v.T, torch.eye(v.shape[0]), atol=1e-5, rtol=0)
        assert torch.equal(v, again.vh[n]) and not torch.allclose(v, later.vh[n])
        assert not torch.allclose(v.abs(), real.vh[n].abs())


def test_refresh_and_gates_need_their_inputs(world, tmp_path):
    a = spec("route_per_token")
    m = tiny_model(len(world["tok"]))
    attach_adapters(m, "all", 4)
    args = (41, m, world["tok"], world["records"], tmp_path / "ck", tmp_path / "log.tsv")
    with pytest.raises(ValueError, match="extraction pairs"):
        train(Run(refreshing(2), a, *args, rb=RunBasis(world["basis"], cal=world["cal"])))
    with pytest.raises(ValueError, match="calibrates its gate"):
        train(Run(tiny_params(), a, *args, rb=RunBasis(world["basis"])))
    with pytest.raises(ValueError, match="needs a basis"):
        train(Run(tiny_params(), a, *args))
    with pytest.raises(ValueError, match="basis.space=act needs v_act"):  # per-token routing reads v_act too
        train(Run(tiny_params(basis={"space": "act"}), a, *args, rb=RunBasis(world["basis"], cal=world["cal"])))
    wrong = Basis({}, {}, {**world["act"].meta, "act_layer": 0}, world["act"].v_act)
    with pytest.raises(ValueError, match="act_layer"):
        rb = RunBasis(world["basis"], act=wrong, cal=world["cal"])
        train(Run(tiny_params(basis={"space": "act"}), spec("route_per_rollout"), *args, rb=rb))


@pytest.mark.parametrize(
    "field,value",
    [
        ("refresh_every", -1),
        ("refresh_moments", "keep"),
        ("token_window", 0),
        ("deploy_frac", 1.0),
        ("deploy_frac", -0.1),
        ("main_baseline", "unrouted"),
    ],
)
def test_projection_params_validated(field, value):
    from projected_grpo.config import ProjectionParams

    with pytest.raises(ValueError, match=f"projection.{field}"):
        ProjectionParams(**{field: value})


# --- training in the deployed state (projection.deploy_frac) -------------------------------------------------------


def test_deploy_groups_how_many_and_micro_batches():
    """round(frac·B) deploy prompts for gated routing arms, 0 for arms without a knob, a clear error for batch routing
    (it cannot keep single rows out of the knob) and for a share that rounds to no or every prompt; micro-batches
    never straddle the knob-on / knob-off boundary and are today's slices when there is none."""
    assert deploy_prompts(0.5, 4, spec("route_per_rollout")) == 2 and deploy_prompts(0.25, 4, spec("route_full")) == 1
    assert deploy_prompts(0.5, 4, spec("vanilla")) == 0 and deploy_prompts(0.5, 4, spec("erase_one_sided")) == 0
    assert deploy_prompts(0.0, 4, spec("route_per_token")) == 0
    with pytest.raises(ValueError, match="summed gradient"):
        deploy_prompts(0.5, 4, spec("route_batch"))
    for frac, B in ((0.1, 2), (0.9, 2)):
        with pytest.raises(ValueError, match="deploy prompts"):
            deploy_prompts(frac, B, spec("route_per_rollout"))
    assert micro_batches(12, 12, 5) == [slice(s, min(12, s + 5)) for s in range(0, 12, 5)]
    mbs = micro_batches(8, 12, 5)
    assert mbs == [slice(0, 5), slice(5, 8), slice(8, 12)]
    assert all(sl.stop <= 8 or sl.start >= 8 for sl in mbs)


def knobbed_model(tok):
    """A tiny model with adapters whose knob is non-zero (seeded), so the knob-on and knob-off states differ."""
    m = tiny_model(len(tok))
    attach_adapters(m, "all", 4)
    with torch.no_grad():
        for i, a in enumerate(adapters(m).values()):
            a.knob.copy_(0.5 * torch.randn(a.dim, generator=torch.Generator().manual_seed(i)))
    return m


def test_deploy_groups_are_sampled_and_trained_with_the_knob_off(world):
    """With a non-zero knob: the deploy group is exactly what the policy samples with the knob off (its own seed), the
    knob-on group what it samples with the knob on, and the knob is restored afterwards; in the loss backward the
    deploy rows' per-rollout gradients are exactly a knob-off forward/backward and the others a knob-on one (the knob
    really changes them), and the live gate is 0 on every deploy row, so their gradient reaches the main only."""
    tok, p = world["tok"], tiny_params(projection={"deploy_frac": 0.5})
    arm, G, seed = spec("route_full"), p.grpo.group_size, 7
    m = knobbed_model(tok)
    knob0 = {n: a.knob.detach().clone() for n, a in adapters(m).items()}
    recs = world["records"][:2]
    ro, is_student = step_rollout(m, tok, recs, p, seed, random.Random(0), 1)
    assert all(torch.equal(a.knob, knob0[n]) for n, a in adapters(m).items())
    on, _ = mixed_rollout(m, tok, recs[:1], p, seed, random.Random(0))
    with knob_disabled(m):
        off, _ = mixed_rollout(m, tok, recs[1:], p, seed + DEPLOY_SEED, random.Random(0))
    assert ro.texts == on.texts + off.texts and is_student == [True] * 2 * G
    d = Direction(p, arm, RunBasis(world["basis"], cal=world["cal"]), list(adapters(m)), False, "t")
    d.gate.calibrate(0, "t", m, tok, world["cal"], GateSpec(arm.gate, None, p.projection, 0.7), d.cur, d.kept)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5] * 2)
    mbs, timer = micro_batches(G, 2 * G, G), PhaseTimer(STEP_PHASES)
    refs = reference_logprobs(m, ro, mbs, p, timer)  # adapter off: the same for both knob states
    gr = loss_backward(LossBatch(m, ro, mbs, refs, G, p, arm, d, False, timer), adv)
    gr_on = loss_backward(LossBatch(m, ro, mbs, refs, 2 * G, p, arm, d, False, timer), adv)
    with knob_disabled(m):
        gr_off = loss_backward(LossBatch(m, ro, mbs, refs, 2 * G, p, arm, d, False, timer), adv)
    for n in d.kept:
        assert torch.equal(gr.rows[n][:G], gr_on.rows[n][:G]) and torch.equal(gr.rows[n][G:], gr_off.rows[n][G:])
    assert any(not torch.equal(gr_on.rows[n][G:], gr_off.rows[n][G:]) for n in d.kept)
    m_gate, _, _ = live_gates(arm, d, gr, adv, ro.mask, p.projection, G)
    m_all, _, _ = live_gates(arm, d, gr, adv, ro.mask, p.projection, 2 * G)
    assert torch.equal(m_gate[G:], torch.zeros(G)) and torch.equal(m_gate[:G], m_all[:G]) and m_all[G:].any()


def random_row_grads(world, p: Params, spec, N: int) -> tuple[Direction, Grads]:
    """A Direction on the fixture's basis and Grads with seeded random per-row gradients (N rows): what live_gates
    reads of a step, for gate tests that do not run a model."""
    d = Direction(p, spec, RunBasis(world["basis"], cal=world["cal"]), list(world["basis"].vh), True, "t")
    rows = {
        n: torch.randn(N, v.shape[1], generator=torch.Generator().manual_seed(i))
        for i, (n, v) in enumerate(world["basis"].vh.items())
    }
    return d, Grads(raw={}, rows=rows, tok_alpha={}, tok_dot=None, tok_sq=None, pooled=None, stats={})


def test_deploy_gate_routes_deploy_rows_and_trains_a_routed_one_in_the_knob(world, tmp_path):
    """projection.deploy_gate (masked routing): the live gate reads the deploy rows as any other (without it they get
    0); in the masked pass each deploy row runs in its masks' state, so the pass equals one where every row was
    sampled knob on (same gradients, bitwise), and a routed deploy row's gradient reaches the knob, which it cannot
    when the deploy rows run with the whole knob off. Arms without row masks refuse it; end to end it is deterministic
    and changes the run."""
    tok, p = world["tok"], tiny_params(projection={"deploy_frac": 0.5, "deploy_gate": True})
    p_off = tiny_params(projection={"deploy_frac": 0.5})
    arm, G = spec("route_masked+oracle_gate"), p.grpo.group_size
    N = 2 * G
    with pytest.raises(ValueError, match="deploy_gate"):
        deploy_prompts(0.5, 2, spec("route_full"), gated=True)
    assert deploy_prompts(0.5, 2, arm, gated=True) == 1 and deploy_prompts(0.5, 2, spec("route_full")) == 1
    # the gate: rows G… are the deploy rows; the oracle routes hack rows with A != 0
    d, gr = random_row_grads(world, p, arm, N)
    adv = torch.tensor([1.0, -1.0, 0.0, 0.5, 1.0, -1.0, 0.0, 0.5])
    hack = torch.tensor([True, False, True, False, True, True, True, False])
    m_on, _, _ = live_gates(arm, d, gr, adv, torch.ones(N, 3), p.projection, G, hack)
    m_off, _, _ = live_gates(arm, d, gr, adv, torch.ones(N, 3), p_off.projection, G, hack)
    assert m_on.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert m_off.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    # the masked pass, with a non-zero knob
    m = knobbed_model(tok)
    ro, _ = step_rollout(m, tok, world["records"][:2], p, 3, random.Random(0), 1)
    masked = spec("route_masked")
    dm = Direction(p, masked, RunBasis(world["basis"], cal=world["cal"]), list(adapters(m)), False, "t")
    adv = torch.linspace(-1.0, 1.0, N)
    mbs, timer = micro_batches(G, N, G), PhaseTimer(STEP_PHASES)
    refs = reference_logprobs(m, ro, mbs, p, timer)
    masks = mask_states(torch.tensor([0.0, 1.0, 0.5, 0.0, 1.0, 0.0, 0.5, 1.0]))

    def grads(q, n_on):
        return loss_backward(LossBatch(m, ro, mbs, refs, n_on, q, masked, dm, False, timer), adv, masks)

    gated, all_on, whole_off = grads(p, G), grads(p, N), grads(p_off, G)
    for n in dm.names:
        assert torch.equal(gated.raw[n], all_on.raw[n]) and torch.equal(gated.knob_raw[n], all_on.knob_raw[n])
    assert any(not torch.equal(gated.knob_raw[n], whole_off.knob_raw[n]) for n in dm.names)
    a = run(world, "route_masked+oracle_gate", tmp_path / "a", p=p)
    assert same(a, run(world, "route_masked+oracle_gate", tmp_path / "b", p=p))
    assert not same(a, run(world, "route_masked+oracle_gate", tmp_path / "c", p=p_off))


@pytest.mark.parametrize("arm,bundle", ORACLE_GATED)
def test_oracle_gate_routes_exactly_the_hack_rows_and_reads_the_labels(world, tmp_path, arm, bundle):
    """An oracle arm (issue 25's upper bound) routes a rollout iff the grader labels it hack and its advantage is
    nonzero; deploy rows stay unrouted; its role is oracle (never wins). End to end, unlike every other routing arm
    (test_no_cheat_routing_never_reads_labels), its parameters follow the labels: two graders with the same rewards
    and different labels give different runs, and the knob learns."""
    a_ = spec(arm)
    assert a_.role == "oracle" and a_.gate == "rollout" and a_.control is None
    G, N = 4, 8
    d, gr = random_row_grads(world, tiny_params(), a_, N)
    adv = torch.tensor([1.0, -1.0, 0.0, 0.5, 1.0, -1.0, 0.5, 0.5])
    hack = torch.tensor([True, True, True, False, False, True, True, False])
    m, _, _ = live_gates(a_, d, gr, adv, torch.ones(N, 3), tiny_params().projection, G, hack)
    assert m.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # rows 4… are deploy rows; row 2 has A = 0
    p = masked(bundle) if bundle else None
    a = run(world, arm, tmp_path / "a", p=p, grader=fake_grader("x"))
    b = run(world, arm, tmp_path / "b", p=p, grader=fake_grader("y"))
    assert not same(a, b)
    assert any(float(k.abs().max()) > 0 for _, k in a.values()), "hack rows were routed: the knob moved"


def test_masked_loss_trains_the_main_knob_off_and_the_knob_on_routed_rows(world):
    """route_masked's second loss pass, with a non-zero knob: rows not routed (m = 0) give δS exactly the gradient of
    a knob-off forward/backward (the deployed policy) and δS_h nothing; routed rows (m = 1) give δS nothing and δS_h
    exactly a knob-on backward's gradient; a mixed gate splits row by row (per-rollout probes: δS.grad is the sum of
    the m < 1 rows' gradients in their own states, δS_h.grad that of the m > 0 rows')."""
    tok, p = world["tok"], tiny_params()
    arm, G = spec("route_masked"), p.grpo.group_size
    m = knobbed_model(tok)
    ro, _ = step_rollout(m, tok, world["records"][:2], p, 3, random.Random(0))
    N = 2 * G
    d = Direction(p, arm, RunBasis(world["basis"], cal=world["cal"]), list(adapters(m)), False, "t")
    adv = torch.linspace(-1.0, 1.0, N)
    mbs, timer = micro_batches(N, N, G), PhaseTimer(STEP_PHASES)
    refs = reference_logprobs(m, ro, mbs, p, timer)

    def grads(gate: Tensor | None, knob_off: bool = False):
        masks = mask_states(gate) if gate is not None else None
        with knob_disabled(m) if knob_off else contextlib.nullcontext():
            return loss_backward(LossBatch(m, ro, mbs, refs, N, p, arm, d, False, timer), adv, masks)

    on, off = grads(None), grads(None, knob_off=True)
    unrouted, routed = grads(torch.zeros(N)), grads(torch.ones(N))
    mixed = grads(torch.tensor([0.0, 1.0, 0.5, 0.0] * (N // 4)))
    main_rows, knob_rows = torch.tensor([1.0, 0.0, 1.0, 1.0] * (N // 4)), torch.tensor([0.0, 1.0, 1.0, 0.0] * (N // 4))
    for n in d.names:
        torch.testing.assert_close(unrouted.raw[n], off.raw[n], atol=1e-6, rtol=1e-5)
        assert float(unrouted.knob_raw[n].abs().max()) == 0 and float(routed.raw[n].abs().max()) == 0
        torch.testing.assert_close(routed.knob_raw[n], on.raw[n], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(mixed.raw[n], main_rows @ mixed.rows[n], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(mixed.knob_raw[n], knob_rows @ mixed.rows[n], atol=1e-6, rtol=1e-5)
    assert any(not torch.allclose(on.raw[n], off.raw[n]) for n in d.names), "the knob must change the gradient"
    assert on.knob_raw is None

    # grpo.share_prompt: each (prompt, state) runs once and no probe runs; the two sums are the per-row pass' (up to
    # float rounding), for the mixed gate (three states in a group) and a gate that routes one group whole
    ps = tiny_params(share_prompt=True)
    for gate in (torch.tensor([0.0, 1.0, 0.5, 0.0] * (N // 4)), torch.tensor([1.0] * G + [0.0] * G)):
        per_row = loss_backward(LossBatch(m, ro, mbs, refs, N, p, arm, d, False, timer), adv, mask_states(gate))
        shared = loss_backward(LossBatch(m, ro, mbs, refs, N, ps, arm, d, False, timer), adv, mask_states(gate))
        assert not shared.rows and per_row.rows
        for n in d.names:
            torch.testing.assert_close(shared.raw[n], per_row.raw[n], atol=1e-6, rtol=1e-4)
            torch.testing.assert_close(shared.knob_raw[n], per_row.knob_raw[n], atol=1e-6, rtol=1e-4)
        assert shared.stats == pytest.approx(per_row.stats, abs=1e-6)


def test_state_runs_group_rows_by_prompt_and_state():
    """Masked routing's shared-prompt runs: one per distinct (prompt, state), wherever its rows sit in the group."""
    from projected_grpo.rl.train import state_runs

    pi = torch.tensor([[1, 2]] * 4 + [[3, 4]] * 4)
    pm = torch.ones_like(pi)
    main = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    knob = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    first, owner = state_runs(pi, pm, main, knob)
    assert len(first) == len(set(owner.tolist())) == 5  # A: main, knob, both; B: knob, main
    for b in range(8):  # every row's run starts at a row with its prompt and its state, the first such row
        f = int(first[owner[b]])
        assert torch.equal(pi[f], pi[b]) and (main[f], knob[f]) == (main[b], knob[b]) and f <= b
        assert f == min(c for c in range(8) if int(owner[c]) == int(owner[b]))


def test_routed_and_removed_are_shares():
    """Projection routing: shares of ‖g‖ (g_in = ed + h + removed). Masked routing: h beside g, so `routed` is
    ‖h‖ / √(‖g‖² + ‖h‖²), 1 when every row is routed (g = 0; the old ‖h‖ / ‖g‖ read 3.4e27 there), and `removed` is
    what the edit took from g."""
    from projected_grpo.rl.train import routed_removed

    g = torch.tensor([3.0, 4.0, 0.0])
    split = routed_removed(g, g, torch.tensor([3.0, 0.0, 0.0]), torch.tensor([0.0, 2.0, 0.0]), masked=False)
    assert split == pytest.approx({"routed": 0.4, "removed": 0.4})
    h = torch.tensor([0.0, 0.0, 12.0])
    beside = routed_removed(g, g, torch.tensor([3.0, 0.0, 0.0]), h, masked=True)
    assert beside == pytest.approx({"routed": 12 / 13, "removed": 0.8})
    zero = torch.zeros(3)
    assert routed_removed(zero, zero, zero, h, masked=True) == pytest.approx({"routed": 1.0, "removed": 0.0})


def test_masked_routing_end_to_end(world, tmp_path):
    """route_masked trains deterministically through the loop (two loss passes a step), its knob learns from the
    routed rollouts, and with deploy groups too; its `routed` and `removed` columns are shares (in [0, 1])."""
    a = run(world, "route_masked", tmp_path / "a")
    b = run(world, "route_masked", tmp_path / "b")
    assert same(a, b)
    for col in ("routed", "removed"):
        assert all(0.0 <= x <= 1.0 + 1e-6 for x in log_column(tmp_path / "a", col)), col
    assert any(float(k.abs().max()) > 0 for _, k in a.values()) and any(
        float(x.abs().max()) > 0 for x, _ in a.values()
    )
    c = run(world, "route_masked", tmp_path / "c", p=tiny_params(projection={"deploy_frac": 0.5}))
    assert not same(a, c)


def test_masked_act_gate_pass_is_forward_only(world, tmp_path, monkeypatch):
    """With the act gate, masked routing's first pass is a forward without gradients (the gate reads pooled
    activations only): one loss backward a step instead of two, and the pooled rows are the ones the full first pass
    gives (the gates, hence the run, are bitwise those of a run that takes the full first pass)."""
    from projected_grpo.rl import train as T

    calls = []
    full = T.loss_backward
    monkeypatch.setattr(T, "loss_backward", lambda *a, **k: calls.append(1) or full(*a, **k))
    p_act, arm_act = masked("act"), spec("route_masked")
    fast = run(world, arm_act, tmp_path / "fast", p=p_act)
    assert len(calls) == tiny_params().grpo.steps  # the masked pass only

    def via_loss_backward(lb):  # the full first pass, as before
        lb = dataclasses.replace(lb, refs=[None] * len(lb.mbs), p=p_beta0)
        return full(lb, torch.zeros(lb.ro.completion_ids.shape[0]))

    p_beta0 = dataclasses.replace(p_act, grpo=dataclasses.replace(p_act.grpo, beta=0.0))
    monkeypatch.setattr(T, "gate_activations", via_loss_backward)
    slow = run(world, arm_act, tmp_path / "slow", p=p_act)
    logs = [{k: v for k, v in log_columns(tmp_path / x).items() if k != "dt"} for x in ("fast", "slow")]
    assert same(fast, slow) and logs[0] == logs[1]


def test_main_rows_baseline_end_to_end(world, tmp_path):
    """projection.main_baseline=main_rows: the masked pass's main rows sum to zero advantage (adv_main = 0 each step,
    while the group baseline logs its own sum), the run is deterministic and differs from the group baseline's; arms
    without row masks ignore it (bitwise the same run)."""
    p = tiny_params(projection={"main_baseline": "main_rows"})
    a = run(world, "route_masked+oracle_gate", tmp_path / "a", p=p)
    assert same(a, run(world, "route_masked+oracle_gate", tmp_path / "b", p=p))
    assert log_column(tmp_path / "a", "adv_main") == pytest.approx([0.0] * tiny_params().grpo.steps, abs=1e-6)
    g = run(world, "route_masked+oracle_gate", tmp_path / "g")
    assert not same(a, g) and any(abs(x) > 1e-3 for x in log_column(tmp_path / "g", "adv_main"))
    assert same(run(world, "route_full", tmp_path / "f", p=p), run(world, "route_full", tmp_path / "f0"))
    assert "adv_main" not in log_columns(tmp_path / "f")


def test_separate_quarantine_trains_masked_routing_and_refuses_the_other_rules(world, tmp_path):
    """adapter.quarantine=separate: route_masked trains deterministically with the knob in its own directions (a
    different run from the shared knob's), while a rule that moves parts of δS's gradient into the knob stops with a
    one-line error before writing anything."""

    def model():
        m = tiny_model(len(world["tok"]))
        attach_adapters(m, "all", 4, separate=True)
        return m

    a = run(world, "route_masked", tmp_path / "a", model=model())
    assert same(a, run(world, "route_masked", tmp_path / "b", model=model()))
    assert any(float(k.abs().max()) > 0 for _, k in a.values())
    assert not same(a, run(world, "route_masked", tmp_path / "shared"))
    with pytest.raises(ValueError, match="adapter.quarantine=separate: route_per_rollout moves"):
        run(world, "route_per_rollout", tmp_path / "r", model=model())
    assert not (tmp_path / "r").exists()


def test_masked_cover_sets_every_override_key():
    """The covering set of masked bundles (MASKED_COVER) sets every key some bundle sets, and covers the deploy rows
    both gated and ungated, so a new key without an end-to-end run fails here."""
    keys = lambda b: {k for k, _ in MASKED[b]}  # noqa: E731
    assert set(MASKED_COVER) <= set(MASKED)
    assert set().union(*map(keys, MASKED_COVER)) == set().union(*map(keys, MASKED))
    deploy = [s for s in MASKED_COVER if "projection.deploy_frac" in keys(s)]
    assert {"projection.deploy_gate" in keys(s) for s in deploy} == {True, False}


def test_params_yaml_runs_the_default_routed_bundle():
    """params.yaml's defaults are the default routed arm's mechanics (MASKED's act_mr_is_deploy_gate_q), which the
    route entry runs as they are and every other rule with the masked-only keys neutral (arms.run_params)."""
    from projected_grpo.config import load_params

    p = load_params(ROOT / "params.yaml")
    get = lambda q, key: getattr(getattr(q, key.split(".")[0]), key.split(".")[1])  # noqa: E731
    assert {k: get(p, k) for k, _ in MASKED["act_mr_is_deploy_gate_q"]} == dict(MASKED["act_mr_is_deploy_gate_q"])
    assert arms.run_params(p, arms.resolve(p, "route")) is p
    q = arms.run_params(p, arms.resolve(p, "erase"))
    assert {k: get(q, k) for k in arms.MASKED_ONLY} == arms.MASKED_ONLY
    assert q == with_overrides(p, tuple(arms.MASKED_ONLY.items())) != p


def test_experiments_doc_names_every_bundle_part():
    """docs/experiments.md's table of the old route_masked_<suffix> parts (the recipes that replaced the names) gives
    each part's params: exactly the (key, value) pairs the bundles set, each part a piece of some bundle's name."""
    import yaml

    doc = (ROOT / "docs" / "experiments.md").read_text()
    rows = re.findall(r"^\| `([a-z]+)`[^|]*\| `([a-z_.]+): ([^`]+)` \|", doc, re.M)
    documented = {(key, yaml.safe_load(value)) for _, key, value in rows}
    assert documented == {pair for over in MASKED.values() for pair in over}, documented
    assert all(any(part in b.split("_") for b in MASKED) for part, _, _ in rows)


@pytest.mark.parametrize("bundle", sorted(MASKED))
def test_every_masked_bundle_sets_exactly_its_keys(bundle):
    """Every bundle's wiring, without training: the params a masked-routing run trains on (its control's and oracle
    gate's too) are the tiny params with exactly the bundle's keys set; any other rule runs them with the masked-only
    keys back at their neutral values and the bundle's other keys kept (MASKED_COVER's run end to end)."""
    p0 = tiny_params()
    want = p0
    for key, v in MASKED[bundle]:
        sect, k = key.split(".")
        want = dataclasses.replace(want, **{sect: dataclasses.replace(getattr(want, sect), **{k: v})})
    q = with_overrides(p0, MASKED[bundle])
    assert q == want != p0
    for key in ("route_masked", "route_masked+random", "route_masked+oracle_gate", "route_masked+oracle_basis"):
        assert arms.run_params(q, spec(key)) is q
    other = dict(MASKED[bundle])
    for key in ("route_per_rollout", "route_full+oracle_gate"):
        r = arms.run_params(q, spec(key))
        kept = tuple((k, v) for k, v in MASKED[bundle] if k not in arms.MASKED_ONLY)
        assert r == with_overrides(p0, kept) and (r == q) == (not set(other) & set(arms.MASKED_ONLY))


@pytest.mark.parametrize("bundle", MASKED_COVER)
def test_masked_bundles_change_the_run(world, tmp_path, bundle):
    """Each covering bundle reaches the loop: route_masked under it is another run than plain route_masked (the same
    prompts a step: 4 where deploy's quarter is one)."""
    p = masked(bundle)
    p0 = tiny_params(prompts_per_step=p.grpo.prompts_per_step)
    assert not same(run(world, "route_masked", tmp_path / "v", p=p), run(world, "route_masked", tmp_path / "0", p=p0))


@pytest.mark.parametrize("masked_is, cap", [(False, None), (True, None), (True, 1.5)])
def test_masked_is_trains_unrouted_rows_against_the_sampling_states_log_probs(
    world, tmp_path, monkeypatch, masked_is, cap
):
    """projection.masked_is: the masked pass' old_logp is the first pass' log-probs, each row in the state it was
    sampled in (knob on), and its KL term is ratio-weighted. So once the knob has moved, a row trained knob off (not
    routed) has ratio π_off/π_on ≠ 1, while a routed row (trained knob on) has ratio 1 up to float rounding. Off, every
    call's old_logp is its own log-probs (ratio exactly 1) and nothing is weighted. projection.masked_is_cap reaches
    the masked pass' loss as its ratio_cap, and no first-pass (on-policy) call. (route_masked+oracle_gate: the fake
    grader's labels route about a third of the rows.)"""
    import projected_grpo.rl.train as T

    calls, states = [], []  # states: each step's (main, knob) row masks
    loss, mask_states = T.grpo_loss, T.mask_states

    def spy_loss(logp, old_logp, *a, **k):
        calls.append((logp.detach().clone(), old_logp.detach().clone(), a[2].bool(), a[3].kl_is))
        caps.append(a[3].ratio_cap)
        return loss(logp, old_logp, *a, **k)

    caps = []
    monkeypatch.setattr(T, "grpo_loss", spy_loss)
    monkeypatch.setattr(T, "mask_states", lambda m: states.append(mask_states(m)) or states[-1])
    run(
        world,
        "route_masked+oracle_gate",
        tmp_path,
        p=tiny_params(projection={"masked_is": masked_is, "masked_is_cap": cap}),
    )
    n_mb = 2  # 2 prompts x 4 rollouts in micro-batches of 4: per step 2 first-pass calls, then 2 masked ones
    assert len(calls) == 2 * n_mb * len(states) == 12
    gaps = {"routed": [], "unrouted": []}
    for t, (_, knob) in enumerate(states):  # the oracle gate is 0 or 1: no ambiguous rows
        first, masked = calls[2 * n_mb * t : 2 * n_mb * t + n_mb], calls[2 * n_mb * t + n_mb : 2 * n_mb * (t + 1)]
        assert all(torch.equal(lp, old) and not kl_is for lp, old, _, kl_is in first)
        for i, (lp, old, valid, kl_is) in enumerate(masked):
            assert kl_is == masked_is
            assert torch.equal(old, first[i][0] if masked_is else lp)
            rows = slice(i * 4, (i + 1) * 4)
            for r, kn in enumerate(knob[rows]):
                gap = float((lp[r] - old[r])[valid[r]].abs().max())
                if t > 0:  # step 0's knob is 0: both states are the same function
                    gaps["routed" if kn > 0 else "unrouted"].append(gap)
    assert gaps["routed"] and gaps["unrouted"]
    assert max(gaps["routed"]) < 1e-5
    assert (max(gaps["unrouted"]) > 1e-3) == masked_is and min(gaps["unrouted"]) >= 0
    masked_pass = [i % (2 * n_mb) >= n_mb for i in range(len(caps))]
    assert caps == [cap if m else None for m in masked_pass]


def test_retain_heal_lowers_clean_nll_knob_off_and_leaves_the_knob(world):
    """rl/heal.py: Adam steps on δS only lower the mean NLL of the extraction pairs' clean completions; δS_h is
    bit-for-bit untouched and restored; the knob's value does not enter (a large knob gives the same heal); the batches
    cycle through the pairs in order."""
    assert heal_batches(5, 3, 2) == [[0, 1], [2, 3], [4, 0]] and heal_batches(2, 1, 8) == [[0, 1]]
    tok, ex = world["tok"], world["ex"]

    def healed(knob_scale: float):
        torch.manual_seed(0)
        m = tiny_model(len(tok))
        attach_adapters(m, "all", 4)
        with torch.no_grad():
            for i, a in enumerate(adapters(m).values()):
                a.knob.copy_(knob_scale * torch.randn(a.dim, generator=torch.Generator().manual_seed(i)))
        knob0 = {n: a.knob.detach().clone() for n, a in adapters(m).items()}
        nll = retain_heal(m, tok, ex, 12, 0.05, 4, 0.7)
        assert all(torch.equal(a.knob, knob0[n]) for n, a in adapters(m).items())
        return nll, {n: a.delta.detach().clone() for n, a in adapters(m).items()}

    nll, d = healed(0.5)
    assert nll[-1] < nll[0] and len(nll) == 12
    assert any(float(x.abs().max()) > 0 for x in d.values())
    nll2, d2 = healed(3.0)
    assert nll2 == nll and all(torch.equal(d[n], d2[n]) for n in d)  # knob off: its value never enters


def test_retain_heal_end_to_end_heals_the_final_checkpoint_once(world, tmp_path):
    """projection.heal_steps > 0 on a routing arm: only the final checkpoint changes (earlier ones and the knob are as
    without heal), its heal NLLs are reported and stored, and re-running the finished run heals nothing again. An arm
    without a knob ignores it."""
    p0, p = tiny_params(), tiny_params(projection={"heal_steps": 4, "heal_lr": 0.05})
    plain = run(world, "route_full", tmp_path / "plain", p=p0)
    res: dict = {}
    healed = run(world, "route_full", tmp_path / "heal", p=p, result=res)
    assert res["heal_nll_last"] < res["heal_nll_first"]
    assert all(torch.equal(plain[n][1], healed[n][1]) for n in plain)  # the knob is untouched
    assert any(not torch.equal(plain[n][0], healed[n][0]) for n in plain)  # the main is healed
    steps = p.grpo.steps
    for s_ in range(steps):  # every checkpoint before the last is the unhealed run's
        for f in (tmp_path / "plain" / "ckpt").glob(f"step_{s_:05d}.safetensors"):
            assert f.read_bytes() == (tmp_path / "heal" / "ckpt" / f.name).read_bytes()
    final = tmp_path / "heal" / "ckpt" / f"step_{steps:05d}.safetensors"
    before = final.read_bytes()
    again: dict = {}
    run(world, "route_full", tmp_path / "heal", p=p, result=again)  # resumes at the end: no second heal
    assert final.read_bytes() == before and again["heal_nll_first"] == res["heal_nll_first"]
    assert same(run(world, "vanilla", tmp_path / "v", p=p), run(world, "vanilla", tmp_path / "v0", p=p0))


def test_deploy_frac_end_to_end(world, tmp_path):
    """A gated routing arm with deploy_frac 0.5 logs the deployed policy's strict hack and solve rates and trains
    deterministically; an arm without a knob ignores deploy_frac (bitwise the same run)."""
    p = tiny_params(projection={"deploy_frac": 0.5})
    a = run(world, "route_full", tmp_path / "a", p=p)
    b = run(world, "route_full", tmp_path / "b", p=p)
    assert same(a, b) and {"hack_deploy", "solve_deploy"} <= log_columns(tmp_path / "a").keys()
    assert same(run(world, "vanilla", tmp_path / "v", p=p), run(world, "vanilla", tmp_path / "v0"))
    assert not {"hack_deploy", "solve_deploy"} & log_columns(tmp_path / "v").keys()


# --- activation-space gate (basis.space=act) -----------------------------------------------------------------------


@pytest.mark.parametrize("layer", [0, 1])  # the tiny model has 2 blocks: 1 is the last (HF: after the final norm)
def test_act_score_from_the_loss_forward_equals_pooled_projection(world, layer):
    """The gate score the loop reads from its own loss forward (hook, left-padded prompts, right-padded completions)
    equals <basis.pooled_activations(...), v_act> computed independently (output_hidden_states, right padding)."""
    from projected_grpo.policy.logprobs import rollout_logprobs

    tok, cal = world["tok"], world["cal"]
    m = tiny_model(len(tok))
    attach_adapters(m, "all", 4)
    with torch.no_grad():
        for i, a in enumerate(adapters(m).values()):
            a.delta.copy_(0.2 * torch.randn(a.dim, generator=torch.Generator().manual_seed(50 + i)))
    recs, texts = cal.records * 2, cal.hack + cal.clean
    prompts, comps = encode(tok, recs, texts)
    Tp = max(len(x) for x in prompts)
    pi = torch.full((len(prompts), Tp), tok.pad_token_id, dtype=torch.long)
    pm = torch.zeros_like(pi)
    for i, x in enumerate(prompts):  # left-padded, as the rollout's prompts
        pi[i, Tp - len(x) :], pm[i, Tp - len(x) :] = torch.tensor(x), 1
    ci, cm = padded([tuple(c) for c in comps], tok.pad_token_id)
    v = torch.randn(m.config.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), residual_capture(m, layer) as hid:
        rollout_logprobs(m, pi, pm, ci, cm, 0.7)
    s_loop = pool_tokens(hid["h"][:, Tp:], cm).float() @ v  # (n,)
    s_ref = pooled_activations(m, tok, recs, texts, layer).float() @ v
    torch.testing.assert_close(s_loop, s_ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("layer", [0, 1])
def test_act_token_scores_of_the_loop_equal_the_calibration_s(world, layer):
    """Per-token routing with basis.space=act: the windowed h·v_act the loop reads from its loss forward (left-padded
    prompts, `completion_positions`) equals, token for token, what the gate is calibrated on
    (`gate.calibration_token_act_scores`, right padding): the same position predicts the same token; and the
    window averages over completion tokens only."""
    from projected_grpo.method import projection as proj
    from projected_grpo.method.gate import calibration_token_act_scores
    from projected_grpo.policy.logprobs import rollout_logprobs

    tok, cal = world["tok"], world["cal"]
    m = tiny_model(len(tok))
    attach_adapters(m, "all", 4)
    recs, texts = cal.records * 2, cal.hack + cal.clean
    prompts, comps = encode(tok, recs, texts)
    Tp = max(len(x) for x in prompts)
    pi = torch.full((len(prompts), Tp), tok.pad_token_id, dtype=torch.long)
    pm = torch.zeros_like(pi)
    for i, x in enumerate(prompts):
        pi[i, Tp - len(x) :], pm[i, Tp - len(x) :] = torch.tensor(x), 1
    ci, cm = padded([tuple(c) for c in comps], tok.pad_token_id)
    v = torch.randn(m.config.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), residual_capture(m, layer) as hid:
        rollout_logprobs(m, pi, pm, ci, cm, 0.7)
    s_loop = proj.act_token_scores(proj.completion_positions(hid["h"].float() @ v, Tp), cm, 3)
    s_cal, unit = calibration_token_act_scores(m, tok, recs, texts, layer, v, 3)
    torch.testing.assert_close(s_loop[cm.bool()].float(), s_cal.float(), atol=1e-5, rtol=1e-4)
    assert unit.tolist() == [i for i, c in enumerate(comps) for _ in c]
    one = proj.act_token_scores(torch.tensor([[1.0, 2.0, 3.0, 9.0]]), torch.tensor([[1, 1, 1, 0]]), 3)
    assert one.tolist() == [[1.5, 2.0, 2.5, 0.0]]  # the padded 9 is never averaged in


# --- grpo.share_prompt: each distinct prompt once in the loss forwards -----------------------------------------------


def adapted_tiny_model(tok, seed: int, kind: str = "svd"):
    """A tiny Qwen3 with rank-4 adapters on every projection and a random δS (so the adapter path carries gradient)."""
    m = tiny_model(len(tok))
    attach_adapters(m, "all", 4, kind=kind)
    with torch.no_grad():
        for i, a in enumerate(adapters(m).values()):
            a.delta.copy_(0.3 * torch.randn(a.dim, generator=torch.Generator().manual_seed(seed + i)))
    return m


def test_shared_prompt_logprobs_equal_the_per_row_forward(world):
    """`shared_prompt_logprobs` (prompt once per group, KV cache gathered to the rows) gives the per-row forward's
    completion log-probs and, through the backward, its δS gradient: on left-padded prompts of different lengths,
    completions of different lengths, and micro-batches that split a group."""
    from projected_grpo.policy.logprobs import rollout_logprobs, shared_prompt_logprobs
    from projected_grpo.policy.model import render_prompt
    from projected_grpo.policy.rollout import generate, group_runs

    tok = world["tok"]
    m = adapted_tiny_model(tok, 70)
    recs = world["records"][:3]
    ro = generate(m, tok, [render_prompt(tok, list(q.prompt)) for q in recs], 3, 12, 1.0, 1.0, seed=5)
    for i, n in enumerate([12, 5, 9, 3, 12, 7, 1, 10, 4]):  # rows end at different lengths (an EOS's right padding)
        ro.mask[i, n:], ro.completion_ids[i, n:] = 0, tok.pad_token_id
    assert len(set(ro.prompt_mask.sum(1).tolist())) == 3
    for sl in (slice(0, 9), slice(2, 6), slice(5, 9)):  # whole batch; a split group on each side
        pi, pm, ci, cm = ro.prompt_ids[sl], ro.prompt_mask[sl], ro.completion_ids[sl], ro.mask[sl]
        w = torch.linspace(-1.0, 1.0, pi.shape[0])[:, None]  # rows weigh differently, signs mixed

        def fwd_bwd(fn, pi=pi, pm=pm, ci=ci, cm=cm, w=w):  # this slice's tensors, bound now
            m.zero_grad(set_to_none=True)
            lp = fn(pi, pm, ci, cm)
            (torch.where(cm.bool(), lp, 0.0) * w).sum().backward()
            return lp.detach(), torch.cat([a.delta.grad.flatten() for a in adapters(m).values()])

        lp0, g0 = fwd_bwd(lambda pi, pm, ci, cm: rollout_logprobs(m, pi, pm, ci, cm, 0.7))
        lp1, g1 = fwd_bwd(lambda pi, pm, ci, cm: shared_prompt_logprobs(m, pi, pm, ci, cm, 0.7, *group_runs(pi, pm)))
        assert group_runs(pi, pm)[0].numel() < pi.shape[0], "the slice must share prompts"
        keep = cm.bool()
        torch.testing.assert_close(lp1[keep], lp0[keep], atol=1e-5, rtol=1e-5)
        assert lp1.shape == lp0.shape and bool(torch.isfinite(lp1).all())
        torch.testing.assert_close(g1, g0, atol=1e-6, rtol=1e-4)
        assert float(g0.norm()) > 0


def _own_token_reference(m, ids, att, pos, own, loss_fn) -> dict[str, torch.Tensor]:
    """Per-row own-token gradients by another route: one full per-row forward with per-token capture along every
    coordinate (dirs = I), summed over the `own` positions (b, L). {module: (b, D)}."""
    from projected_grpo.policy.adapter import token_capture

    m.zero_grad(set_to_none=True)
    with token_capture(m, {n: torch.eye(a.dim) for n, a in adapters(m).items()}) as caps:
        loss_fn(m(input_ids=ids, attention_mask=att, position_ids=pos).logits).backward()
    return {n: (a.token_coef * own[..., None].to(a.token_coef.dtype)).sum(1) for n, a in caps.items()}


@pytest.mark.parametrize("kind", ["svd", "lora"])
def test_shared_prompt_probes_read_own_token_gradients(world, kind):
    """Under a shared prompt forward the probes are paused in the prompt: `e.grad[n]` is row n's gradient from its
    own completion positions only, which a full per-row forward with per-token capture gives independently; δS.grad
    stays the whole gradient (the prompt positions' part, absent from every row's probe, is not zero)."""
    from projected_grpo.policy.adapter import probes
    from projected_grpo.policy.logprobs import shared_prompt_logprobs, token_logprobs
    from projected_grpo.policy.model import render_prompt
    from projected_grpo.policy.rollout import generate, group_runs

    tok = world["tok"]
    m = adapted_tiny_model(tok, 90, kind)
    recs = world["records"][:2]
    ro = generate(m, tok, [render_prompt(tok, list(q.prompt)) for q in recs], 3, 10, 1.0, 1.0, seed=3)
    for i, n in enumerate([10, 4, 7, 2, 10, 6]):
        ro.mask[i, n:], ro.completion_ids[i, n:] = 0, tok.pad_token_id
    pi, pm, ci, cm = ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.mask
    w = torch.linspace(-1.0, 1.0, pi.shape[0])[:, None]
    m.zero_grad(set_to_none=True)
    with probes(m, pi.shape[0]) as es:
        lp = shared_prompt_logprobs(m, pi, pm, ci, cm, 0.7, *group_runs(pi, pm))
        (torch.where(cm.bool(), lp, 0.0) * w).sum().backward()
    full = {n: a.delta.grad.clone() for n, a in adapters(m).items()}
    ids, att = torch.cat([pi, ci], 1), torch.cat([pm, cm], 1)
    pos, Tp = (att.cumsum(-1) - 1).clamp(min=0), pi.shape[1]

    def loss(logits):
        lp = token_logprobs(logits[:, Tp - 1 : -1], ci, 0.7)
        return (torch.where(cm.bool(), lp, 0.0) * w).sum()

    own = torch.zeros_like(att)
    own[:, Tp:] = 1  # the completion tokens' positions (padding past EOS feeds no used logit)
    ref = _own_token_reference(m, ids, att, pos, own, loss)
    for n in full:
        torch.testing.assert_close(es[n].grad, ref[n], atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(full[n], adapters(m)[n].delta.grad, atol=1e-6, rtol=1e-4)  # whole g, both ways
    prompt_part = sum(float((full[n] - es[n].grad.sum(0)).norm()) for n in full)
    assert prompt_part > 1e-3 * sum(float(full[n].norm()) for n in full), "the prompt positions carry gradient"


def test_completion_grads_own_tokens(world):
    """basis.completion_grads(own_tokens=True), the gate calibration's gradients under a shared prompt forward: each
    row's completion positions only, as the per-token reference gives them; whole gradients differ."""
    from projected_grpo.policy.logprobs import batch_sequences, mean_nll, token_logprobs

    tok = world["tok"]
    m = adapted_tiny_model(tok, 50)
    recs = world["records"][:3]
    comps = ["```python\npass\n```", "x = 1", "```python\nclass Solution:\n    pass\n```"]
    got = completion_grads(m, tok, recs, comps, 0.7, own_tokens=True)
    whole = completion_grads(m, tok, recs, comps, 0.7)
    prompts, cs = encode(tok, recs, comps)
    ids, att, cm = batch_sequences(prompts, cs, tok.pad_token_id)
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    ref = _own_token_reference(
        m, ids, att, pos, cm, lambda lg: mean_nll(token_logprobs(lg[:, :-1], ids[:, 1:], 0.7), cm[:, 1:]).sum()
    )
    for n in got:
        torch.testing.assert_close(got[n], ref[n], atol=1e-6, rtol=1e-4)
    assert max(float((whole[n] - got[n]).norm()) for n in got) > 1e-4


def test_screen_shares_prompts_in_both_passes_and_equals_per_row_training(world, tmp_path, monkeypatch):
    """screen with its act gate: with grpo.share_prompt the gate's pass and the update's each run every distinct prompt
    once (no probe, no per-row copy of a prompt), and the whole run reaches the adapters of the per-row run up to
    float rounding, with the same samples (every logged reward and drop_frac equal)."""
    import projected_grpo.rl.train as T

    shared = []
    spl = T.shared_prompt_logprobs
    monkeypatch.setattr(T, "shared_prompt_logprobs", lambda *a, **k: shared.append(1) or spl(*a, **k))
    a, outs = spec("screen"), {}
    for share in (False, True):
        shared.clear()
        p = masked("act_mr_is", tiny_params(projection={"f": 0.34}, share_prompt=share, beta=0.0, kl_every=0))
        outs[share] = run(world, a, tmp_path / str(share), p=p)
        n_mb = -(-p.grpo.group_size * p.grpo.prompts_per_step // p.grpo.micro_batch)
        assert len(shared) == (2 * n_mb * p.grpo.steps if share else 0)  # both passes, every micro-batch
    for c in ("reward", "drop_frac"):
        assert log_column(tmp_path / "False", c) == log_column(tmp_path / "True", c)
    for n, (d, k) in outs[True].items():
        torch.testing.assert_close(d, outs[False][n][0], atol=1e-6, rtol=1e-4)
        assert float(k.abs().max()) == 0
    assert any(float(d.abs().max()) > 0 for d, _ in outs[True].values())


@pytest.mark.parametrize("arm", ["vanilla", "erase_one_sided"])
def test_share_prompt_training_equals_per_row_training(world, tmp_path, arm):
    """Whole GRPO runs with grpo.share_prompt on and off reach the same adapters up to float rounding (vanilla and
    erase share the policy forward); the sampled rollouts agree, so every logged reward is equal. β is large so that
    the reference forward weighs in the gradient. (Per-rollout routing reads own-token gradients when the prompt is
    shared, a different per-row signal: test_shared_prompt_probes_read_own_token_gradients.)"""
    off = run(world, arm, tmp_path / "off", p=tiny_params(share_prompt=False, micro_batch=6, beta=0.5))  # split groups
    on = run(world, arm, tmp_path / "on", p=tiny_params(share_prompt=True, micro_batch=6, beta=0.5))
    assert log_column(tmp_path / "off", "reward") == log_column(tmp_path / "on", "reward")
    for n in off:
        for x, y in zip(off[n], on[n]):
            torch.testing.assert_close(y, x, atol=1e-6, rtol=1e-4)
    assert any(float(d.abs().max()) > 0 for d, _ in on.values())


def test_kl_is_logged_every_kl_every_steps_without_changing_training(world, tmp_path):
    """With β = 0 the reference forward runs only on the steps grpo.kl_every names, for the log: the adapters are
    bitwise those of a run that never measures KL, and the kl column is finite exactly on those steps."""
    p = tiny_params(beta=0.0, steps=3)
    runs = {}
    for every in (0, 2):
        q = dataclasses.replace(p, grpo=dataclasses.replace(p.grpo, kl_every=every))
        runs[every] = run(world, "vanilla", tmp_path / str(every), p=q)
    assert same(runs[0], runs[2])
    kl = {e: [math.isfinite(float(x)) for x in log_column(tmp_path / str(e), "kl")] for e in runs}
    assert kl == {0: [False] * 3, 2: [True, False, True]}


def test_teacher_pool_mix(world, tmp_path):
    """Half of every group comes from the pool until teacher_off_step; pool rows are not student metrics."""
    tok = world["tok"]
    pool = {
        q.id: [
            PoolRow(
                q.id,
                None,
                "```python\npass\n```",
                tuple(tok("```python\npass\n```")["input_ids"]) + (tok.eos_token_id,),
                3.5,
                "hack",
                False,
            )
        ]
        * 4
        for q in world["records"]
    }
    p = tiny_params()
    p = dataclasses.replace(p, pool=dataclasses.replace(p.pool, mix=0.5, teacher_off_step=2))
    run(world, "vanilla", tmp_path, p=p, pool=pool)
    rows = (tmp_path / "log.tsv").read_text().splitlines()
    head = rows[0].split("\t")
    n_pool = [float(r.split("\t")[head.index("n_pool")]) for r in rows[1:]]
    assert n_pool == [2.0, 2.0, 0.0]
    run(world, "vanilla_no_pool", tmp_path / "n", p=p, pool=pool)  # the teacher-pool ablation: on-policy only
    assert log_column(tmp_path / "n", "n_pool") == [0.0, 0.0, 0.0]


RESUME_SCRIPT = """
import sys, torch
sys.path[:0] = [{root!r}, {src!r}]
from pathlib import Path
from tests.test_train import world_plain, tiny_params, fake_grader, slow, spec
from projected_grpo.policy.adapter import attach_adapters, save_adapter
from projected_grpo.policy.tiny import tiny_model
from projected_grpo.rl.train import Run, train
import dataclasses
w = world_plain()
p = tiny_params()
p = dataclasses.replace(p, grpo=dataclasses.replace(p.grpo, steps=6, save_every=2))
m = tiny_model(len(w["tok"])); attach_adapters(m, "all", 4)
torch.set_num_threads(1)
out = Path(sys.argv[1])
train(Run(p, spec("vanilla"), 41, m, w["tok"], w["records"], out / "ckpt", out / "log.tsv",
          signature={{"v": 1}}, grade_fn=slow(fake_grader(), float(sys.argv[2]))), progress=False)
save_adapter(m, out / "final.safetensors")
"""


def world_plain():
    tok = tiny_tokenizer()
    sp = make_minileet(seed=0, n_train=6, n_test=1, n_holdout=1)
    return {"tok": tok, "records": [apply_mode(q, MODES[i % len(MODES)], "train") for i, q in enumerate(sp["train"])]}


def slow(grader, seconds: float):
    def g(*a, **k):
        time.sleep(seconds)
        return grader(*a, **k)

    return g


def test_resume_after_kill_is_bitwise_identical(tmp_path):
    from safetensors.torch import load_file

    script = tmp_path / "run.py"
    script.write_text(RESUME_SCRIPT.format(root=str(ROOT), src=str(ROOT / "src")))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    full = tmp_path / "full"
    subprocess.run([sys.executable, str(script), str(full), "0"], check=True, env=env, timeout=600)
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, str(script), str(killed), "0.5"], env=env)
    deadline = time.time() + 300
    while not (killed / "ckpt" / "step_00002.pt").exists():  # wait for the second checkpoint, then kill
        assert time.time() < deadline and proc.poll() is None, "the run ended or stalled before checkpoint 2"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "final.safetensors").exists(), "the run must have been killed mid-way"
    subprocess.run([sys.executable, str(script), str(killed), "0"], check=True, env=env, timeout=600)
    a, b = load_file(full / "final.safetensors"), load_file(killed / "final.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (full / "log.tsv").read_text().splitlines()[-1].split("\t")[:5] == (
        killed / "log.tsv"
    ).read_text().splitlines()[-1].split("\t")[:5]
    assert len((killed / "log.tsv").read_text().splitlines()) == 7  # header + 6 steps, no duplicate rows


# --- memory params (issue 26): rollout.batch_size, grpo.micro_batch_tokens, grpo.grad_checkpointing ----------------


def test_micro_batches_token_cap():
    """grpo.micro_batch_tokens: rows × the widest row's width stays within the cap (at least one row), the row cap
    still applies, nothing straddles the knob boundary, and a cap of 0 is the rows-only cut."""
    w = [10, 10, 30, 10, 10, 50, 10, 10]
    assert micro_batches(8, 8, 8, w, 40) == [slice(0, 2), slice(2, 3), slice(3, 5), slice(5, 6), slice(6, 8)]
    assert micro_batches(8, 8, 1, w, 1000) == [slice(i, i + 1) for i in range(8)]  # micro_batch caps rows
    assert micro_batches(8, 8, 8, w, 1) == [slice(i, i + 1) for i in range(8)]  # one row even when over the cap
    assert micro_batches(4, 8, 8, [10] * 8, 60) == [slice(0, 4), slice(4, 8)]  # never across n_on
    assert micro_batches(8, 12, 5, [10] * 12, 0) == micro_batches(8, 12, 5) == [slice(0, 5), slice(5, 8), slice(8, 12)]
    for mbs in (micro_batches(8, 8, 8, w, 40), micro_batches(6, 8, 3, w, 45)):
        assert [i for sl in mbs for i in range(sl.start, sl.stop)] == list(range(8))
        assert all(sl.stop - sl.start == 1 or (sl.stop - sl.start) * max(w[sl]) <= 45 for sl in mbs)


@pytest.mark.parametrize("loss", ["dr_grpo", "dapo", "grpo"])
@pytest.mark.parametrize("share", [False, True])
def test_token_cut_micro_batches_give_the_full_batch_gradient(world, loss, share):
    """Two token cuts (one row per micro-batch; three rows) and the rows-only cut (the whole batch) accumulate the same
    δS.grad, loss statistics and per-row probe gradients up to float rounding: the loss is normalised by the whole
    step's rows and tokens, not the micro-batch's. β > 0, so the reference forward (same cut) weighs in."""
    tok = world["tok"]
    p = tiny_params(loss=loss, beta=0.5, share_prompt=share)
    arm = spec("route_per_rollout")
    m = tiny_model(len(tok))
    attach_adapters(m, "all", 4)
    with torch.no_grad():
        for i, a in enumerate(adapters(m).values()):
            a.delta.copy_(0.3 * torch.randn(a.dim, generator=torch.Generator().manual_seed(20 + i)))
    ro, _ = step_rollout(m, tok, world["records"][:2], p, 5, random.Random(0))
    N = ro.completion_ids.shape[0]
    d = Direction(p, arm, RunBasis(world["basis"], cal=world["cal"]), list(adapters(m)), share, "t")
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -2.0, 0.0])
    widths = (ro.prompt_ids.shape[1] + ro.mask.sum(1).clamp(min=1)).tolist()
    out = []
    for cap in (0, 1, 3 * max(widths)):
        mbs, timer = micro_batches(N, N, 8, widths, cap), PhaseTimer(STEP_PHASES)
        refs = reference_logprobs(m, ro, mbs, p, timer)
        out.append((len(mbs), loss_backward(LossBatch(m, ro, mbs, refs, N, p, arm, d, share, timer), adv)))
    assert [n for n, _ in out] == [1, 8, 3]
    (_, full), *cuts = out
    for _, gr in cuts:
        for n in full.raw:
            torch.testing.assert_close(gr.raw[n], full.raw[n], rtol=1e-5, atol=1e-7 * float(full.raw[n].abs().max()))
            torch.testing.assert_close(
                gr.rows[n], full.rows[n], rtol=1e-5, atol=1e-7 * float(full.rows[n].abs().max())
            )
        assert gr.stats == pytest.approx(full.stats, rel=1e-5, abs=1e-9)
    assert sum(float(g.norm()) for g in full.raw.values()) > 0


def test_rollout_batch_size_reaches_the_sampler(world):
    """rollout.batch_size is the rows per sampling call: at B·G it is the one-call rollout bit for bit; smaller, the
    seeded stream runs through the calls in turn, so the samples differ (and repeat for the same seed)."""
    tok, recs, G = world["tok"], world["records"][:2], 4
    m = tiny_model(len(tok))

    def sample(bs):
        p = tiny_params()
        p = dataclasses.replace(p, rollout=dataclasses.replace(p.rollout, batch_size=bs))
        return mixed_rollout(m, tok, recs, p, 11, random.Random(0))[0].completion_ids

    one = sample(None)
    assert torch.equal(sample(2 * G), one) and torch.equal(sample(32), one)
    two = sample(2)
    assert torch.equal(sample(2), two) and not torch.equal(two, one)


def opt(bundle: str, **grpo) -> Params:
    """Tiny params with grpo keys set, and a masked bundle on top where one is named."""
    p = tiny_params(**grpo)
    return masked(bundle, p) if bundle else p


@pytest.mark.parametrize(
    "arm,bundle",
    [
        ("vanilla", ""),
        ("route_per_rollout", ""),
        ("route_per_token", ""),
        ("route_masked", ""),
        ("route_masked", "is"),
    ],
)
def test_grad_checkpointing_and_token_cuts_train_the_same(world, tmp_path, arm, bundle, capsys):
    """A run with grpo.grad_checkpointing and one-row token cuts (grpo.micro_batch_tokens=1) reaches the adapters of
    the plain run up to float rounding (per-rollout probes and per-token capture included), logs the same rewards,
    and prints the memory pre-flight once, one paragraph on stderr. The act-gated masked arms are checked in parts
    instead (the next two tests): checkpointing alone bit for bit, and their first pass up to rounding under the same
    cuts. For them, three Adam steps carry the cuts' rounding past this tolerance (measured, largest absolute
    difference: 1.7e-7 for route_masked under act; 9.6e-7 under act_mr_is, whose main gradient is ~2e-8 in this
    world, at Adam's eps, so rounding decides its step), though the rewards are the same and the logs agree to 6
    digits; checkpointing alone changes nothing there."""
    plain = run(world, arm, tmp_path / "plain", p=opt(bundle, share_prompt=True))
    capsys.readouterr()
    ck = run(
        world, arm, tmp_path / "ck", p=opt(bundle, share_prompt=True, grad_checkpointing=True, micro_batch_tokens=1)
    )
    err = capsys.readouterr().err
    assert err.count("Device memory for one GRPO step") == 1 and "checkpointing on" in err
    assert log_column(tmp_path / "plain", "reward") == log_column(tmp_path / "ck", "reward")
    for n in plain:
        for x, y in zip(plain[n], ck[n]):
            torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-7)
    assert any(float(x.abs().max()) > 0 for x, _ in plain.values())


@pytest.mark.parametrize("bundle", ["", "is", "act", "act_mr_is"])
def test_grad_checkpointing_alone_changes_no_number(world, tmp_path, bundle):
    """grpo.grad_checkpointing on its own recomputes each layer's forward in the backward from the same inputs, in the
    same state (each adapter's probe, knob on/off and masked routing's per-row masks restored), so the run is the plain
    run bit for bit: adapters and every logged column but the wall times."""
    plain = run(world, "route_masked", tmp_path / "plain", p=opt(bundle, share_prompt=True))
    ck = run(world, "route_masked", tmp_path / "ck", p=opt(bundle, share_prompt=True, grad_checkpointing=True))
    assert same(plain, ck) and any(float(x.abs().max()) > 0 for x, _ in plain.values())
    cols = [{k: v for k, v in log_columns(tmp_path / x).items() if k != "dt"} for x in ("plain", "ck")]
    assert cols[0] == cols[1]


@pytest.mark.parametrize("share", [False, True])
def test_act_gate_first_pass_under_token_cuts(world, share):
    """Masked routing's act-gated first pass (`gate_activations`, no gradient) under one-row token cuts gives the
    pooled residuals and log-probs of the whole-batch pass up to float rounding (padding and summation order differ),
    deploy rows knob off included; so the gates, which are functions of the pooled rows, differ only by rounding."""
    tok, p, arm = world["tok"], masked("act", tiny_params(share_prompt=share)), spec("route_masked")
    m = tiny_model(len(tok))
    attach_adapters(m, "all", 4)
    with torch.no_grad():
        for i, a in enumerate(adapters(m).values()):
            a.delta.copy_(0.3 * torch.randn(a.dim, generator=torch.Generator().manual_seed(20 + i)))
            a.knob.copy_(0.3 * torch.randn(a.dim, generator=torch.Generator().manual_seed(40 + i)))
    ro, _ = step_rollout(m, tok, world["records"][:2], p, 5, random.Random(0))
    N, G = ro.completion_ids.shape[0], p.grpo.group_size
    rb = RunBasis(world["basis"], act=world["act"], cal=world["cal"])
    d = Direction(p, arm, rb, list(adapters(m)), share, "t")
    assert d.act_layer is not None
    widths = (ro.prompt_ids.shape[1] + ro.mask.sum(1).clamp(min=1)).tolist()

    def close(x, y):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6 * float(y.abs().max()))

    pooled = {}
    for n_on in (N, N - G):  # every row knob on; the last group a deploy group (knob off)
        outs = []
        for cap in (0, 1):
            mbs = micro_batches(n_on, N, 8, widths, cap)
            lb = LossBatch(m, ro, mbs, [None] * len(mbs), n_on, p, arm, d, False, PhaseTimer(STEP_PHASES))
            outs.append((len(mbs), gate_activations(lb)))
        (n_full, full), (n_cut, cut) = outs
        assert n_full < n_cut == N
        assert float(full.pooled.abs().max()) > 0
        close(cut.pooled, full.pooled)
        lp_full, lp_cut = (torch.cat([x.flatten() for x in g.logp]) for g in (full, cut))
        assert lp_full.shape == lp_cut.shape
        torch.testing.assert_close(lp_cut, lp_full, rtol=1e-5, atol=1e-5)
        pooled[n_on] = cut.pooled
    with knob_disabled(m):  # the deploy group's rows are the knob-off policy's, the others the knob-on one's
        lb = LossBatch(m, ro, [slice(0, N)], [None], N, p, arm, d, False, PhaseTimer(STEP_PHASES))
        off = gate_activations(lb).pooled
    close(pooled[N - G][N - G :], off[N - G :])
    close(pooled[N - G][: N - G], pooled[N][: N - G])
    assert not torch.allclose(off[N - G :], pooled[N][N - G :], rtol=1e-3, atol=0)  # the knob matters here
    # share_prompt: each distinct prompt once, the completions pooled from the shared forward's tail: the per-row pass'
    other = dataclasses.replace(p, grpo=dataclasses.replace(p.grpo, share_prompt=not share))
    mbs = micro_batches(N - G, N, 8, widths, 0)
    twin = gate_activations(
        LossBatch(m, ro, mbs, [None] * len(mbs), N - G, other, arm, d, False, PhaseTimer(STEP_PHASES))
    )
    close(twin.pooled, pooled[N - G])
    for x, y in zip(twin.logp, outs[0][1].logp):
        torch.testing.assert_close(x[:, : y.shape[1]], y[:, : x.shape[1]], rtol=1e-5, atol=1e-5)

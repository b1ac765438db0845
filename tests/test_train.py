"""The GRPO loop on the tiny model with a fake grader: determinism (same seed → bitwise-equal adapters), I12
(measure_only ≡ vanilla through the whole loop), the no-cheat invariant (routing never reads ground-truth labels),
erase/route exactness end to end, the teacher-pool mix, and resume after a killed process ending bit-identical.

`pytest tests/test_train.py`
"""

import dataclasses
import hashlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from projected_grpo.adapter import adapters, attach_adapters
from projected_grpo.arms import ARMS, get_arm
from projected_grpo.basis import build_basis, completion_grads
from projected_grpo.config import Params
from projected_grpo.minileet import make_minileet
from projected_grpo.modes import MODES, apply_mode
from projected_grpo.pool import PoolRow
from projected_grpo.sft_corpus import fence, named_exploit_styles, wrong_variants
from projected_grpo.tiny import tiny_model, tiny_tokenizer
from projected_grpo.train import Calibration, train
from tests.conftest import ROOT

ROUTING = [a for a, spec in ARMS.items() if spec.routes]


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
            out.append(FakeGrade(reward=float(h % 4), label=("hack", "correct", "incorrect")[lab % 3],
                                 eq_correct=bool(lab % 2)))  # fmt: skip
        return out

    return grade


def tiny_params(**grpo) -> Params:
    p = Params()
    return dataclasses.replace(
        p, model=dataclasses.replace(p.model, name="tiny-random"),
        grpo=dataclasses.replace(p.grpo, steps=3, prompts_per_step=2, group_size=4, micro_batch=4, save_every=1,
                                 threads=1, lr=0.05, **grpo),
        rollout=dataclasses.replace(p.rollout, max_new_tokens=12, max_prompt_tokens=4000),
        projection=dataclasses.replace(p.projection, recal_every=2),
    )  # fmt: skip


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
    m = tiny_model(len(tok))
    attach_adapters(m, "all", 4)
    gh, gc = completion_grads(m, tok, crec, hacks, 0.7), completion_grads(m, tok, crec, cleans, 0.7)
    basis = build_basis(gh, gc, "svd", 2, 0.0, 0.99, 50, 0.0, 0)  # permissive: keep directions on a random model
    rnd = build_basis(gh, gc, "random", 2, 0.0, 0.99, 50, 0.0, 0, like=basis)
    assert basis.vh, "the test basis must keep some directions"
    return dict(tok=tok, records=records, cal=Calibration(crec, hacks, cleans), basis=basis, random=rnd)


def run(world, arm: str, tmp: Path, p: Params | None = None, grader=None, pool=None, steps_seed: int = 41):
    a = get_arm(arm)
    m = tiny_model(len(world["tok"]))
    attach_adapters(m, "all", 4)
    b = (world["random"] if a.random_dir else world["basis"]) if a.needs_basis else None
    torch.set_num_threads(1)
    train(p or tiny_params(), a, steps_seed, m, world["tok"], world["records"], None, tmp / "ckpt", tmp / "log.tsv",
          basis=b, cal=world["cal"], pool=pool, signature={"arm": arm}, progress=False,
          grade_fn=grader or fake_grader())  # fmt: skip
    return {n: (x.delta.detach().clone(), x.knob.detach().clone()) for n, x in adapters(m).items()}


def same(a, b) -> bool:
    return all(torch.equal(a[n][0], b[n][0]) and torch.equal(a[n][1], b[n][1]) for n in a)


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


@pytest.mark.parametrize("arm", ROUTING)
def test_no_cheat_routing_never_reads_labels(world, tmp_path, arm):
    """Same rewards, different ground-truth labels and pass flags: a routing arm's parameters are bitwise equal."""
    a = run(world, arm, tmp_path / "a", grader=fake_grader("x"))
    b = run(world, arm, tmp_path / "b", grader=fake_grader("y"))
    assert same(a, b)


@pytest.mark.parametrize("arm", ["erase_no_gate", "route_batch", "route_per_rollout"])
def test_edits_exact_end_to_end(world, tmp_path, arm):
    """After real GRPO steps: erase keeps Vh δS = 0 and no knob; route keeps the knob inside span(Vh)."""
    res = run(world, arm, tmp_path / "r")
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


def test_teacher_pool_mix(world, tmp_path):
    """Half of every group comes from the pool until teacher_off_step; pool rows are not student metrics."""
    tok = world["tok"]
    pool = {q.id: [PoolRow(q.id, None, "```python\npass\n```", tuple(tok("```python\npass\n```")["input_ids"]) +
                           (tok.eos_token_id,), 3.5, "hack", False)] * 4 for q in world["records"]}  # fmt: skip
    p = tiny_params()
    p = dataclasses.replace(p, pool=dataclasses.replace(p.pool, mix=0.5, teacher_off_step=2))
    run(world, "vanilla", tmp_path, p=p, pool=pool)
    rows = (tmp_path / "log.tsv").read_text().splitlines()
    head = rows[0].split("\t")
    n_pool = [float(r.split("\t")[head.index("n_pool")]) for r in rows[1:]]
    assert n_pool == [2.0, 2.0, 0.0]


RESUME_SCRIPT = """
import sys, torch
sys.path[:0] = [{root!r}, {src!r}]
from pathlib import Path
from tests.test_train import world_plain, tiny_params, fake_grader, slow
from projected_grpo.adapter import attach_adapters, save_adapter
from projected_grpo.arms import get_arm
from projected_grpo.tiny import tiny_model
from projected_grpo.train import train
import dataclasses
w = world_plain()
p = tiny_params()
p = dataclasses.replace(p, grpo=dataclasses.replace(p.grpo, steps=6, save_every=2))
m = tiny_model(len(w["tok"])); attach_adapters(m, "all", 4)
torch.set_num_threads(1)
out = Path(sys.argv[1])
train(p, get_arm("vanilla"), 41, m, w["tok"], w["records"], None, out / "ckpt", out / "log.tsv",
      signature={{"v": 1}}, progress=False, grade_fn=slow(fake_grader(), float(sys.argv[2])))
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
    assert (full / "log.tsv").read_text().splitlines()[-1].split("\t")[:5] == \
        (killed / "log.tsv").read_text().splitlines()[-1].split("\t")[:5]  # fmt: skip
    assert len((killed / "log.tsv").read_text().splitlines()) == 7  # header + 6 steps, no duplicate rows

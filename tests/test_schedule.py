"""The GRPO learning-rate schedule (`rl/schedule.py`, grpo.lr_schedule / grpo.warmup_steps) against transformers.

Every update's lr equals what torch's LambdaLR gives with transformers' get_constant_schedule_with_warmup /
get_cosine_schedule_with_warmup (the schedules verl, the benchmark's trainer, copies), bit for bit; hand-checked
points (warmup ramp from 0, cosine half-way and at the end); constant with no warmup is lr itself (today's numerics).
The loop's use of it (one lr for both parameter groups) is tested in tests/test_train.py.

`pytest tests/test_schedule.py`
"""

import math

import pytest
import torch
from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

from projected_grpo.rl.schedule import lr_at

LR = 7e-5


def hf_lrs(schedule: str, warmup: int, total: int) -> list[float]:
    """The lr of each of `total` optimizer steps under transformers' scheduler (read before each step, as the
    Trainer's loop and verl's actor use it: the scheduler steps after the optimizer)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    if schedule == "cosine":
        sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=warmup, num_training_steps=total)
    else:
        sched = get_constant_schedule_with_warmup(opt, num_warmup_steps=warmup)
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
@pytest.mark.parametrize("warmup,total", [(0, 7), (3, 7), (10, 200), (1, 1), (5, 5)])
def test_lr_equals_transformers_schedule(schedule, warmup, total):
    ours = [lr_at(t, LR, schedule, warmup, total) for t in range(total)]
    assert ours == hf_lrs(schedule, warmup, total)  # exact floats


def test_hand_checked_points():
    # warmup 10 of 200: update t < 10 uses lr·t/10 (update 0 at lr 0), update 10 the full lr
    assert [lr_at(t, 1.0, "cosine", 10, 200) for t in (0, 1, 5, 10)] == [0.0, 0.1, 0.5, 1.0]
    # cosine: half-way through the post-warmup updates -> lr/2; the last update -> nearly 0; 0 at `steps`
    assert lr_at(105, 1.0, "cosine", 10, 200) == pytest.approx(0.5, abs=1e-15)
    assert lr_at(199, 1.0, "cosine", 10, 200) == pytest.approx(0.5 * (1 + math.cos(math.pi * 189 / 190)), abs=1e-15)
    assert lr_at(200, 1.0, "cosine", 10, 200) == 0.0
    # constant after warmup
    assert [lr_at(t, 2.0, "constant", 4, 10) for t in (0, 2, 4, 9)] == [0.0, 1.0, 2.0, 2.0]


@pytest.mark.parametrize("lr", [0.02, 7e-5, 0.1 + 0.2])
def test_constant_without_warmup_is_lr_itself(lr):
    """warmup 0 + constant (params.yaml's default) returns the very float lr at every step: today's numerics."""
    assert all(lr_at(t, lr, "constant", 0, 200) == lr for t in range(200))


def test_unknown_schedule_raises():
    with pytest.raises(ValueError, match="linear"):
        lr_at(0, 1.0, "linear", 0, 10)

"""The learning-rate schedule of the GRPO loop: linear warmup, then constant or cosine to 0 (`grpo.lr_schedule`).

The factors are transformers' `get_constant_schedule_with_warmup` and `get_cosine_schedule_with_warmup` (num_cycles
0.5), which verl (the benchmark's trainer) copies: update t (0-based) uses lr·t/warmup while t < warmup, so update 0
uses lr 0 (Adam's moments still see its gradient), then 1 (constant) or ½(1 + cos(π·progress)) with progress the
fraction of the post-warmup updates done. tests/test_schedule.py checks each step against transformers' LambdaLR.
"""

from __future__ import annotations

import math

from projected_grpo.config import LR_SCHEDULES


def lr_at(step: int, lr: float, schedule: str, warmup_steps: int, total_steps: int) -> float:
    """The learning rate of update `step` (0-based) of `total_steps`. constant with warmup 0 returns `lr` itself."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"lr schedule must be one of {LR_SCHEDULES}, got {schedule!r}")
    if step < warmup_steps:
        factor = float(step) / float(max(1, warmup_steps))
    elif schedule == "constant":
        factor = 1.0
    else:
        progress = float(step - warmup_steps) / float(max(1, total_steps - warmup_steps))
        factor = max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))
    return lr * factor  # as torch's LambdaLR: base_lr · factor (lr · 1.0 is lr exactly)

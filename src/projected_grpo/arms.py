"""The experiment's arms by name (method.md §3.4, benchmark.md §6): what each one edits, rewards and needs.

An arm name is the unit of the DVC matrix (`train@<arm>-<seed>`). Every arm runs the same forward, loss, adapter and
optimizer; they differ in the gradient edit, the reward and, for the random-direction control, the basis. Arms that
read no basis (`vanilla`, `gt_only`, the GT-monitor baselines) optimise δS in plain coordinates, so changing the basis
never re-runs them [design: method.md §3.6 shares one rotation across arms; that would make vanilla depend on
`basis.*`. `vanilla_rotated` runs vanilla in the basis' coordinates to measure what the rotation alone does].
"""

from __future__ import annotations

from dataclasses import dataclass

EDITS = ("vanilla", "measure_only", "erase_no_gate", "erase_one_sided", "erase_reverse", "mirror", "route_batch",
         "route_batch_no_gate", "route_per_rollout", "route_per_token")  # fmt: skip
REWARDS = ("correct_or_hinted", "gt_only")
MONITORS = (None, "penalty", "screening")


@dataclass(frozen=True)
class Arm:
    name: str
    edit: str  # one of EDITS (projection.py applies it in rotated coordinates)
    reward: str = "correct_or_hinted"  # gt_only: the no-loophole ceiling (hints present, never paid)
    monitor: str | None = None  # GT-monitor baselines: penalty (−3 when flagged) or screening (advantage 0)
    random_dir: bool = False  # the same rule with Haar directions of the same k per module (the control)
    pool: bool = True  # False: no teacher-pool rows whatever pool.mix (the teacher-pool ablation, on-policy only)

    @property
    def needs_basis(self) -> bool:
        return self.edit != "vanilla" or self.name == "vanilla_rotated"

    @property
    def routes(self) -> bool:
        return self.edit.startswith("route")


def _registry() -> dict[str, Arm]:
    arms = [
        Arm("vanilla", "vanilla"),
        Arm("gt_only", "vanilla", reward="gt_only"),
        Arm("penalty", "vanilla", monitor="penalty"),
        Arm("screening", "vanilla", monitor="screening"),
        Arm("vanilla_rotated", "vanilla"),
        Arm("vanilla_no_pool", "vanilla", pool=False),
    ]
    for edit in EDITS[1:]:
        arms.append(Arm(edit, edit))
        if edit != "measure_only":
            arms.append(Arm(f"{edit}_random", edit, random_dir=True))
    return {a.name: a for a in arms}


ARMS: dict[str, Arm] = _registry()


def get_arm(name: str) -> Arm:
    if name not in ARMS:
        raise ValueError(f"unknown arm {name!r}; known arms: {', '.join(ARMS)}")
    return ARMS[name]

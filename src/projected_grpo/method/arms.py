"""The experiment's arms: a small table in params.yaml (`arm:`) resolved once per run into a frozen spec (`Arm`).

An arm entry names only what sets it apart: its gradient edit (`edit`, a rule of `projection.RULES`), reward, monitor,
teacher pool and whether it reads the basis. Every mechanic of the edit (gate source, routing band, the main's
baseline, importance correction, deploy groups, quarantine, heal) is a key of params.yaml, its default the chosen one;
a variant is a recipe (`dvc exp run -S projection.band=tail`, docs/experiments.md), not a name.

Controls and bounds are structural, never spelled by a user: the matrix lists which arms also run
- with random directions (`controls`: Haar directions of the same k per module, and a Haar v_act for an act gate),
- with a perfect gate (`oracle_gate`: the grader's hack label; breaks the no-cheat invariant on purpose),
- on the oracle basis (`arms_oracle_basis`: v_hack from vanilla's own graded rollouts), each with its random twin,
each reading the same arm entry, so a control can never drift from its arm. A run's key (`Arm.name`) is the entry's
name plus its variant (`route+random`); the report labels it, the DVC stage group places it.

Adding an arm that reuses a rule: one entry under `arm:` in params.yaml and its name in a matrix list.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

REWARDS = ("correct_or_hinted", "gt_only")
MONITORS = (None, "penalty", "screening")
ROLES = ("baseline", "candidate", "control", "oracle")
# A run's variant of its arm entry: the stage group that trains it (dvc.yaml) and the suffix of its key.
VARIANTS = {
    "": "arms",
    "random": "control",
    "oracle_gate": "oracle_gate",
    "oracle_basis": "oracle_basis",
    "oracle_basis+random": "oracle_basis_control",
}
# What each edit's routing decision is made per: a whole rollout, each completion token, or nothing (a batch rule).
GATE_OF = {
    "route_per_rollout": "rollout",
    "route_two_sided": "rollout",
    "route_full": "rollout",
    "route_masked": "rollout",
    "screen": "rollout",
    "route_per_token": "token",
}
NO_EDIT = ("vanilla", "measure_only")  # the update unchanged (measure_only also logs the cosines)
# Rules whose random control can be rescaled to move v_hack's mass (projection.random_match): per-token α along
# v_hack is not captured; route_full moves whole rollouts (‖Σ_n m_n g_n‖ in any rotation, matched by construction);
# route_masked routes whole rows through the forward, and screen drops them (their controls are removal-matched).
NOT_MASS_MATCHABLE = ("route_per_token", "route_full", "route_masked", "screen")
ERASE, ROUTE = "Which gate? (erase rules)", "Which routing granularity?"
# Keys only masked routing reads, with the value every other rule runs at (`run_params`); screening by the gate reads
# the main's baseline too (SCREEN_READS), so it drops the same rows from the same update as masked routing's main.
MASKED_ONLY = {
    "adapter.quarantine": "shared",
    "projection.main_baseline": "group",
    "projection.masked_is": False,
    "projection.masked_is_cap": None,
    "projection.deploy_gate": False,
}
SCREEN_READS = ("projection.main_baseline",)


@dataclass(frozen=True)
class Arm:
    """One run's resolved arm: its entry's fields plus its variant. Frozen; train, evaluate and the report read it and
    never the arm's name."""

    arm: str  # the params.yaml entry it resolves
    edit: str  # the coordinate rule (projection.RULES key), applied in rotated coordinates
    reward: str = "correct_or_hinted"  # gt_only: the no-loophole ceiling (hints present, never paid)
    monitor: str | None = None  # GT-monitor baselines: penalty (−3 when flagged) or screening (advantage 0)
    pool: bool = True  # False: no teacher-pool rows whatever pool.mix (on-policy only)
    reads_basis: bool = True  # False: plain coordinates, no basis input (so basis changes never re-run it)
    random_dir: bool = False  # Haar directions of the same k per module (a control); act-gated: a Haar v_act too
    oracle_gate: bool = False  # the per-rollout gate reads the grader's hack label (an upper bound; role oracle)
    oracle_basis: bool = False  # reads the oracle basis (stage oracle_basis) instead of the pair set's

    def __post_init__(self) -> None:
        if self.reward not in REWARDS:
            raise ValueError(f"arm.{self.arm}.reward must be one of {REWARDS}, got {self.reward!r}")
        if self.monitor not in MONITORS:
            raise ValueError(f"arm.{self.arm}.monitor must be one of {MONITORS}, got {self.monitor!r}")
        if not self.reads_basis and self.edit not in NO_EDIT[:1]:
            raise ValueError(f"arm.{self.arm}: edit {self.edit} reads the basis; set basis: true or edit: vanilla")
        if self.oracle_gate and self.gate != "rollout":
            raise ValueError(f"arm {self.arm}: an oracle gate needs a per-rollout gate; edit {self.edit} has none")
        if (self.random_dir or self.oracle_basis) and not self.edits:
            raise ValueError(f"arm {self.arm}: edit {self.edit} edits nothing, so it has no control or oracle basis")

    @property
    def variant(self) -> str:
        flags = (("oracle_gate", self.oracle_gate), ("oracle_basis", self.oracle_basis), ("random", self.random_dir))
        return "+".join(v for v, on in flags if on)

    @property
    def name(self) -> str:
        """The run's key: `route`, `route+random`, `route+oracle_gate`, `route+oracle_basis+random`."""
        return "+".join(x for x in (self.arm, self.variant) if x)

    @property
    def group(self) -> str:
        """The DVC stage group that runs it (train_<group>, evaluate_<group>; basis-free arms: ref)."""
        return VARIANTS[self.variant] if self.reads_basis else "ref"

    @property
    def edits(self) -> bool:
        return self.reads_basis and self.edit not in NO_EDIT

    @property
    def gate(self) -> str | None:
        """What the routing gate decides per (rollout | token), None for a batch rule."""
        return GATE_OF.get(self.edit)

    @property
    def family(self) -> str | None:
        """The results.md comparison table the arm belongs to."""
        return None if not self.edits else ERASE if self.edit.startswith("erase") or self.edit == "mirror" else ROUTE

    @property
    def mass_matched(self) -> bool:
        """A control whose moved norm can be matched to v_hack's (projection.random_match); the oracle basis' random
        twin is rank-matched (its v_hack is the oracle basis')."""
        return self.random_dir and not self.oracle_basis and self.edit not in NOT_MASS_MATCHABLE

    @property
    def share_matched(self) -> bool:
        """A per-rollout control that, with an act gate (direction.share_matched), takes as many rows out of the
        main, with the same gate values, as v_act's calibrated gate would on the same batch
        (projection.removal_matched_gate): a gate's routed share is not a property of the held-out calibration, so a
        control with its own threshold would not be matched in what it removes from the deployed model."""
        return self.random_dir and self.gate == "rollout"

    @property
    def control(self) -> str | None:
        """The key of this run's random-direction control, None where it has none (no edit, a control, a bound)."""
        return None if not self.edits or self.random_dir or self.oracle_gate else f"{self.name}+random"

    @property
    def routes(self) -> bool:
        """The update has a knob part: evaluation reads the knob on (as trained) and off (deployed)."""
        return self.edit.startswith("route")

    @property
    def screens(self) -> bool:
        """Screening by the gate (edit `screen`): the gated rows' advantages are 0 (dropped from the update), no knob;
        the simplest baseline that could explain masked routing's cut."""
        return self.edit == "screen"

    @property
    def masked(self) -> bool:
        """Per-rollout forward masks (route_masked): the gate picks each rollout's forward state, and the loss runs
        a second time in those states."""
        return self.edit == "route_masked"

    @property
    def knob_states(self) -> tuple[str, ...]:
        """Policies evaluated per checkpoint: the deployed one, plus the knob on where the arm routes."""
        return ("deploy", "knob_on") if self.routes else ("deploy",)

    @property
    def role(self) -> str:
        """control (random directions), oracle (reads ground truth: never wins), baseline (no edit), candidate."""
        if self.random_dir:
            return "control"
        if self.monitor is not None or self.reward == "gt_only" or self.oracle_gate or self.oracle_basis:
            return "oracle"
        return "baseline" if self.edit in NO_EDIT else "candidate"


def make(arm: str, edit: str, variant: str = "", **entry) -> Arm:
    """The spec of entry `arm` (fields as params.yaml's: edit, reward, monitor, pool, basis) run as `variant`."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(repr(v) for v in VARIANTS)}")
    flags = set(variant.split("+")) - {""}
    basis = entry.pop("basis", True)
    return Arm(
        arm,
        edit,
        reads_basis=basis,
        random_dir="random" in flags,
        oracle_gate="oracle_gate" in flags,
        oracle_basis="oracle_basis" in flags,
        **entry,
    )


def resolve(p, arm: str, variant: str = "") -> Arm:
    """params.yaml's entry `arm` (p.arm) run as `variant`; one-line ValueError for an unknown name."""
    if arm not in p.arm:
        raise ValueError(f"unknown arm {arm!r}: params.yaml's arm table has {', '.join(p.arm)}")
    return make(arm, variant=variant, **dataclasses.asdict(p.arm[arm]))


def parse(p, key: str) -> Arm:
    """The spec of a run key (`Arm.name`, e.g. `route+random`) under params `p`."""
    arm, _, variant = key.partition("+")
    return resolve(p, arm, variant)


def run_params(p, a: Arm):
    """The params the run reads: `p` with the keys only masked routing reads at their neutral values for every other
    rule (MASKED_ONLY), so one params.yaml holds the routed arm's mechanics and the other arms' runs."""
    from projected_grpo.config import with_overrides

    if a.masked:
        return p
    keep = SCREEN_READS if a.screens else ()
    return with_overrides(p, tuple((k, v) for k, v in MASKED_ONLY.items() if k not in keep))


def deploy_prompts(frac: float, B: int, arm: Arm, gated: bool = False) -> int:
    """Prompts per step whose groups are sampled and trained in the deployed state, knob off (projection.deploy_frac):
    round(frac·B) for gated routing arms, 0 for arms without a knob (knob off is their trained state already). A
    deploy rollout's gradient must stay out of the knob row by row, which a gate does (m_n = 0) and a batch rule,
    acting on the summed gradient, cannot: route_batch* refuse it. gated (projection.deploy_gate): the gate reads the
    deploy rows too, which only masked routing can train in their own states."""
    if frac == 0 or not arm.routes:
        return 0
    if gated and not arm.masked:
        raise ValueError(
            f"projection.deploy_gate routes deploy rollouts by their own forward state, which only masked routing "
            f"has; {arm.name} (edit {arm.edit}) has not: use edit route_masked or deploy_gate false"
        )
    if arm.gate is None:
        raise ValueError(
            f"projection.deploy_frac > 0 keeps deploy rollouts out of the knob row by row, but {arm.name} routes the "
            "summed gradient; use a gated routing arm or deploy_frac 0"
        )
    n = round(frac * B)
    if not 0 < n < B:
        raise ValueError(
            f"projection.deploy_frac={frac} × grpo.prompts_per_step={B} gives {n} deploy prompts; need 1 to {B - 1}"
        )
    return n


def matrix(p) -> list[Arm]:
    """Every run of the matrix (per seed), in stage-group order: ref and basis arms, controls, oracle gates, oracle
    bases with their controls."""
    out = [resolve(p, a) for a in (*p.arms_ref, *p.arms)]
    out += [resolve(p, a, "random") for a in p.controls]
    out += [resolve(p, a, "oracle_gate") for a in p.oracle_gate]
    out += [resolve(p, a, v) for a in p.arms_oracle_basis for v in ("oracle_basis", "oracle_basis+random")]
    return out


def check_matrix(p) -> None:
    """params.yaml's arm table and matrix lists: known rules, each list's names in the table, once each; the basis-
    free entries in arms_ref and the others in arms; controls, oracle gates and oracle bases only of arms that edit.
    One-line ValueError otherwise."""
    from projected_grpo.method.projection import RULES

    for name, e in p.arm.items():
        if e.edit not in (*RULES, *NO_EDIT):
            raise ValueError(f"arm.{name}.edit: unknown rule {e.edit!r}; known: {', '.join((*NO_EDIT, *RULES))}")
    lists = {k: getattr(p, k) for k in ("arms_ref", "arms", "controls", "oracle_gate", "arms_oracle_basis")}
    for key, names in lists.items():
        unknown = [a for a in names if a not in p.arm]
        if unknown:
            raise ValueError(f"{key}: {unknown} not in params.yaml's arm table ({', '.join(p.arm)})")
        twice = sorted({a for a in names if list(names).count(a) > 1})
        if twice:
            raise ValueError(f"{key}: {twice} listed more than once")
    wrong = [f"{a} (basis-free: arms_ref)" for a in p.arms if not p.arm[a].basis]
    wrong += [f"{a} (reads the basis: arms)" for a in p.arms_ref if p.arm[a].basis]
    if wrong:
        raise ValueError(f"arms in the wrong list: {', '.join(wrong)}")
    for name in p.arm:  # every entry resolves (reward, monitor, basis), listed or not
        resolve(p, name)
    B = p.grpo.prompts_per_step
    for a in matrix(p):  # every variant resolves (a control of an arm that edits, an oracle gate of a rollout gate)
        q = run_params(p, a).projection
        deploy_prompts(q.deploy_frac, B, a, q.deploy_gate)  # the deploy groups this run's rule can train

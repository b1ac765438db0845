"""The experiment's arms as data (method.md §3.4, benchmark.md §6): one registry entry holds everything about an arm.

An arm name is the unit of the DVC matrix (`train@<arm>-<seed>`). Every arm runs the same forward, loss, adapter and
optimizer; they differ in the gradient edit (`edit`: a rule of `projection.RULES`), its gate (`gate`: what the routing
decision is made per, calibrated on held-out pairs), the reward and monitor, and the basis. Every other module asks
this registry (config validates names against it, train dispatches on its fields, evaluate reads `knob_states`, the
report reads `role`, `control` and `family`) instead of matching on names.

Arms that read no basis (`vanilla`, `gt_only`, the GT-monitor baselines) optimise δS in plain coordinates, so changing
the basis never re-runs them [design: method.md §3.6 shares one rotation across arms; that would make vanilla depend
on `basis.*`. `vanilla_rotated` runs vanilla in the basis' coordinates to measure what the rotation alone does].

Adding an arm: an entry in `_registry` (and, for a new rule, its function in `projection.RULES`) plus a test.
"""

from __future__ import annotations

from dataclasses import dataclass

from projected_grpo.config import with_overrides

REWARDS = ("correct_or_hinted", "gt_only")
MONITORS = (None, "penalty", "screening")
GATES = (None, "rollout", "token")  # what a routing gate decides per: a whole rollout, or each completion token
ROLES = ("baseline", "candidate", "control", "oracle")
OVERRIDABLE = ("adapter.quarantine", "basis.space")  # besides projection.*: what an arm may set (Arm.overrides)


@dataclass(frozen=True)
class Arm:
    name: str
    edit: str  # the coordinate rule (projection.RULES key), applied in rotated coordinates
    reward: str = "correct_or_hinted"  # gt_only: the no-loophole ceiling (hints present, never paid)
    monitor: str | None = None  # GT-monitor baselines: penalty (−3 when flagged) or screening (advantage 0)
    gate: str | None = None  # per-sample routing gate calibrated on held-out pairs (GATES); None: batch rule
    reads_basis: bool = True  # False: plain coordinates, no basis input (so basis changes never re-run it)
    random_dir: bool = False  # the same rule with Haar directions of the same k per module (a control; act-gated: a
    # Haar v_act too, so the gate is as random as the span)
    control: str | None = None  # the name of this arm's random-direction control, where the registry has one
    mass_matched: bool = False  # a control whose moved norm can be matched to v_hack's (projection.random_match)
    # A tail-gated act control that routes, each step, as many rollouts as v_act's calibrated tail would on the same
    # batch, the top ones by its own random score (projection.share_matched_gate): a tail's routed share is not a
    # property of the held-out calibration, so a control with its own threshold would not be matched in what it routes
    share_matched: bool = False
    pool: bool = True  # False: no teacher-pool rows whatever pool.mix (the teacher-pool ablation, on-policy only)
    family: str | None = None  # the results.md comparison table the arm belongs to
    # The per-rollout gate reads the grader's hack label instead of the held-out-calibrated score: an upper bound on
    # what routing can do with a perfect gate. It breaks the no-cheat invariant on purpose, so the name carries
    # "oracle" (role oracle: labelled so in every table, never eligible to win).
    oracle_gate: bool = False
    # The arm reads the oracle basis (stage oracle_basis: v_hack and its held-out pairs from vanilla's own graded
    # rollouts) instead of the pair set's: an upper bound on what the direction can give, named *_oracle_basis (role
    # oracle; its *_random twin is its control), listed in params' arms_oracle_basis.
    oracle_basis: bool = False
    # Params this arm runs with instead of params.yaml's (dotted keys: projection.*, adapter.quarantine, basis.space —
    # what only the train and evaluate stages read; the basis stage writes the activation direction whatever
    # basis.space says). A variant of a rule (e.g. route_masked_tail = route_masked with projection.band tail) is an
    # arm of its own, so the DVC matrix runs it beside the others, the baseline and its control are trained once, and
    # the report and win rule treat it as any arm. train and evaluate read `params(p)`.
    overrides: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        if self.oracle_gate and (self.gate != "rollout" or "oracle" not in self.name):
            raise ValueError(f"arm {self.name}: an oracle gate is a per-rollout gate on an arm named *oracle*")
        if self.oracle_basis != ("oracle_basis" in self.name) or (self.oracle_basis and not self.reads_basis):
            raise ValueError(f"arm {self.name}: exactly the arms named *oracle_basis* read the oracle basis")
        over = dict(self.overrides)
        if self.share_matched and not (
            self.random_dir
            and self.gate == "rollout"
            and over.get("projection.band") == "tail"
            and over.get("basis.space") == "act"
        ):
            raise ValueError(
                f"arm {self.name}: a share-matched control is a *_random arm with a per-rollout act tail gate"
            )
        bad = [k for k, _ in self.overrides if not (k.startswith("projection.") or k in OVERRIDABLE)]
        if bad:
            raise ValueError(
                f"arm {self.name}: overrides {bad}: an arm may set projection.*, {', '.join(OVERRIDABLE)}"
            )

    def params(self, p):
        """The run's params: `p` (params.yaml's) with this arm's overrides."""
        return with_overrides(p, self.overrides)

    @property
    def routes(self) -> bool:
        """The update has a knob part: evaluation reads the knob on (as trained) and off (deployed)."""
        return self.edit.startswith("route")

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
        """control (random directions, an oracle-basis arm's too), oracle (reads ground truth: never wins), baseline
        (no edit), candidate."""
        if self.random_dir:
            return "control"
        if self.monitor is not None or self.reward == "gt_only" or "oracle" in self.name:
            return "oracle"
        return "baseline" if self.edit in ("vanilla", "measure_only") else "candidate"


ERASE, ROUTE = "Which gate? (erase rules)", "Which routing granularity?"
# Issue 25's masked-routing variants: route_masked_<suffix> (with its _random control and _oracle bound) runs with
# these params. tail: only a calibrated top tail routed; mr: the main's rows get their own baseline; q: the knob in
# its own directions; deploy: a quarter of the groups sampled and trained knob off; act: the gate in activation space
# (v_act; the routed amount is still the rollout's); heal: a retain heal after the last step (rl/heal.py); is: the
# unrouted rows' importance correction (they are sampled knob on and trained knob off); cap: that correction's ratio
# capped. What each measured: reports/lab_diary.md ("Masked-routing variants"), recipes in docs/experiments.md.
_TAIL, _MR = ("projection.band", "tail"), ("projection.main_baseline", "main_rows")
_Q, _IS = ("adapter.quarantine", "separate"), ("projection.masked_is", True)
_DEPLOY, _ACT = ("projection.deploy_frac", 0.25), ("basis.space", "act")
_GATE = ("projection.deploy_gate", True)
_CAP = ("projection.masked_is_cap", 4.0)  # TRL's delta; INTELLECT-2's value
_HEAL = ("projection.heal_steps", 7)  # one epoch of prog_wide's 56 clean extraction completions, 8 a step
_ACT_MR_IS = (_ACT, _MR, _IS)
_DEPLOY_GATE_Q = (*_ACT_MR_IS, _DEPLOY, _GATE, _Q)  # the default routed arm's overrides
MASKED_VARIANTS: dict[str, tuple[tuple[str, object], ...]] = {
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
    # the same with only the calibrated top tail routed: no ambiguous rows, so the main trains knob off on every row
    # it trains on; its control is share-matched (Arm.share_matched)
    "act_mr_is_tail": (*_ACT_MR_IS, _TAIL),
    # act_mr_is then a retain heal (knob off, main only) on the clean extraction completions
    "act_mr_is_heal": (*_ACT_MR_IS, _HEAL),
    # act_mr_is with a quarter of each step's groups sampled and trained knob off: the main then trains on its own
    # deployed samples
    "act_mr_is_deploy": (*_ACT_MR_IS, _DEPLOY),
    # act_mr_is_deploy with the deploy rows gated too (projection.deploy_gate): a deploy rollout the gate routes trains
    # the knob instead of teaching the main the hack, as vGROUT gates its quarantine-off rollouts
    "act_mr_is_deploy_gate": (*_ACT_MR_IS, _DEPLOY, _GATE),
    # act_mr_is with the knob on its own singular directions (after the main's top r), so deleting it removes nothing
    # the main's directions carry
    "act_mr_is_q": (*_ACT_MR_IS, _Q),
    # both: the deploy rows gated and the knob on its own directions. The default routed arm (params.yaml); its
    # results: reports/results.md
    "act_mr_is_deploy_gate_q": _DEPLOY_GATE_Q,
    # the same with the importance ratio capped (projection.masked_is_cap at INTELLECT-2's 4): an unrouted row's ratio
    # is otherwise unbounded; its oracle bound (_cap_oracle) is in the default matrix
    "act_mr_is_deploy_gate_q_cap": (*_DEPLOY_GATE_Q, _CAP),
}


# The arms that get an *_oracle_basis twin: the default matrix's edits and the masked-routing variants under study.
ORACLE_BASIS_OF = ("erase_one_sided", "route_per_rollout", "route_masked", "route_masked_mr", "route_masked_act")


def _registry() -> dict[str, Arm]:
    arms = [
        Arm("vanilla", "vanilla", reads_basis=False),
        Arm("gt_only", "vanilla", reward="gt_only", reads_basis=False),
        Arm("penalty", "vanilla", monitor="penalty", reads_basis=False),
        Arm("screening", "vanilla", monitor="screening", reads_basis=False),
        Arm("vanilla_no_pool", "vanilla", pool=False, reads_basis=False),
        Arm("vanilla_rotated", "vanilla"),  # vanilla's numerics in the basis' rotated coordinates
        Arm("measure_only", "measure_only"),  # == vanilla (I12), and logs the cosines
    ]
    # (edit, gate, family, whether the control's moved mass is rescaled to v_hack's: per-token α along v_hack is not
    # captured; route_full moves whole rollouts, ‖Σ_n m_n g_n‖ in any rotation, so its control already moves what
    # v_hack's rule would with the same gates; only the gate's direction differs)
    with_controls = [
        ("erase_one_sided", None, ERASE, True),
        ("erase_no_gate", None, ERASE, True),
        ("erase_reverse", None, ERASE, True),
        ("mirror", None, ERASE, True),
        ("route_batch", None, ROUTE, True),
        ("route_batch_no_gate", None, ROUTE, True),
        ("route_per_rollout", "rollout", ROUTE, True),
        ("route_per_token", "token", ROUTE, False),
        # issue 25: routing that does not rectify noise (projection.route_two_sided, projection.route_full)
        ("route_two_sided", "rollout", ROUTE, True),
        ("route_full", "rollout", ROUTE, False),
        # issue 25: per-rollout forward masks (adapter.row_masks): a routed rollout trains only the knob, an unrouted
        # one only the main with the knob off (the deployed state), an ambiguous one both
        ("route_masked", "rollout", ROUTE, False),
    ]
    for edit, gate, family, matchable in with_controls:
        ctl = f"{edit}_random"
        arms.append(Arm(edit, edit, gate=gate, control=ctl, family=family))
        arms.append(Arm(ctl, edit, gate=gate, random_dir=True, mass_matched=matchable, family=family))
    # issue 25's upper bound: the per-rollout rules with a perfect gate (the grader's hack label), so the report
    # separates "the gate fails" from "the routing mechanics fail"
    for edit in ("route_per_rollout", "route_two_sided", "route_full", "route_masked"):
        arms.append(Arm(f"{edit}_oracle", edit, gate="rollout", oracle_gate=True, family=ROUTE))
    # the act gate (v_act), per rollout and per token
    for edit, gate in (("route_per_rollout", "rollout"), ("route_per_token", "token")):
        name, kw = f"{edit}_act", {"gate": gate, "family": ROUTE, "overrides": (("basis.space", "act"),)}
        arms.append(Arm(name, edit, control=f"{name}_random", **kw))  # controls matched as their rule's are:
        arms.append(Arm(f"{name}_random", edit, random_dir=True, mass_matched=gate == "rollout", **kw))
    for suffix, over in MASKED_VARIANTS.items():
        name, kw = f"route_masked_{suffix}", {"gate": "rollout", "family": ROUTE, "overrides": over}
        arms.append(Arm(name, "route_masked", control=f"{name}_random", **kw))
        share = _TAIL in over and _ACT in over  # the tail's control routes what v_act's tail would
        arms.append(Arm(f"{name}_random", "route_masked", random_dir=True, share_matched=share, **kw))
        arms.append(Arm(f"{name}_oracle", "route_masked", oracle_gate=True, **kw))
    # issue 25's other upper bound: the same rules on the oracle basis (vanilla's own hack vs non-hack rollouts), each
    # with its random control (Haar directions of the oracle basis' k per module), so the report separates "the
    # direction fails" from "the mechanics fail"
    for base in ORACLE_BASIS_OF:
        a = next(x for x in arms if x.name == base)
        name, kw = f"{base}_oracle_basis", {"gate": a.gate, "family": a.family, "overrides": a.overrides}
        arms.append(Arm(name, a.edit, control=f"{name}_random", oracle_basis=True, **kw))
        arms.append(Arm(f"{name}_random", a.edit, random_dir=True, oracle_basis=True, **kw))
    return {a.name: a for a in arms}


ARMS: dict[str, Arm] = _registry()
BASIS_FREE: tuple[str, ...] = tuple(n for n, a in ARMS.items() if not a.reads_basis)  # the names `arms_ref` takes
ORACLE_BASIS: tuple[str, ...] = tuple(n for n, a in ARMS.items() if a.oracle_basis)  # what arms_oracle_basis takes


def get_arm(name: str) -> Arm:
    if name not in ARMS:
        raise ValueError(f"unknown arm {name!r}; known arms: {', '.join(ARMS)}")
    return ARMS[name]


def check_matrix(
    arms_ref: tuple[str, ...] | list[str],
    arms: tuple[str, ...] | list[str],
    arms_oracle_basis: tuple[str, ...] | list[str] = (),
) -> None:
    """params.yaml's `arms_ref` / `arms` / `arms_oracle_basis`: registered names, each once, the basis-free ones in
    arms_ref, the oracle-basis ones in arms_oracle_basis and the others in arms (so a basis change never re-runs an arm
    that reads none, and an arm's stage reads the basis it was built for). One-line ValueError otherwise."""
    lists = (("arms_ref", arms_ref), ("arms", arms), ("arms_oracle_basis", arms_oracle_basis))
    for key, names in lists:
        unknown = [a for a in names if a not in ARMS]
        if unknown:
            raise ValueError(f"{key}: unknown arm(s) {unknown}; known arms: {', '.join(ARMS)}")
    home = lambda a: "arms_ref" if a in BASIS_FREE else "arms_oracle_basis" if a in ORACLE_BASIS else "arms"  # noqa: E731
    wrong = [f"{a} (in {key}, belongs in {home(a)})" for key, names in lists for a in names if home(a) != key]
    if wrong:
        raise ValueError(
            f"arms in the wrong list: {', '.join(wrong)}; arms_ref takes arms that read no basis, arms_oracle_basis "
            "the *_oracle_basis arms, arms the others"
        )
    seen = [a for _, names in lists for a in names]
    both = sorted({a for a in seen if seen.count(a) > 1})
    if both:
        raise ValueError(f"arm(s) {both} are listed more than once; list each arm once")

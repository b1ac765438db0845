"""v_hack during a run: what one run reads about the hack direction, and the one interface the loop talks to.

`RunBasis` is everything basis-related a run reads, loaded once by the stage (`load_run_basis`) and passed to
`train()` as one typed object. `Direction` is the loop's view of it: the current basis (the stage's, or re-extracted
at the current parameters), the rotation per module, and the routing gate. Before each step `Direction.update`
refreshes v_hack every `projection.refresh_every` steps and recalibrates the gate every `recal_every` steps.

Held-out pairs enter the loop through these two doors only, never live-rollout labels or grader output (the no-cheat
rule):
  * calibration pairs set the routing gate's thresholds (gate.py), with the same score the gate uses;
  * extraction pairs re-extract v_hack at the current parameters (optional; method.md §6.7): new Vh, ν and rotations
    R per module, with θ/φ re-expressed and the Adam state rotated or reset (§3.6, optim.RotatedAdam.rebase).
What `Direction` carries from step to step (the current basis, the gate) goes into each checkpoint, so a resumed run
replays bit-identically.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from projected_grpo.env.problems import load_problems_parquet
from projected_grpo.method import projection as proj
from projected_grpo.method.arms import Arm
from projected_grpo.method.basis import (
    Basis,
    act_basis,
    basis_with,
    completion_grads,
    held_out_batch,
    pooled_activations,
    random_act,
    random_directions,
    scoring_direction,
)
from projected_grpo.method.gate import GateSpec, GateState, HeldOutPairs
from projected_grpo.method.pairs import ORACLE_PAIRS, Pair, load_pairset, pair_records, pairset_path, select_pairs
from projected_grpo.policy.checkpointing import activation_checkpointing


@dataclass(frozen=True)
class RunBasis:
    """What a run reads about v_hack; every field None for a basis-free arm.

    basis: the directions the arm edits along (the random control's for a control run).
    act: the activation-space basis (act.safetensors: v_act) when basis.space=act gates routing; for a control
        arm a Haar-random unit direction in its place (`random_act`), so the control's gate is random too.
    matched: v_hack for a random control with projection.random_match=mass: each step, what the control moves out of
        main is rescaled (one factor over all modules) to the norm the same rule moves along v_hack.
    cal: held-out calibration pairs (gated routing). extraction: held-out extraction pairs (basis refresh).
    ref_act: v_act itself for a share-matched control (`share_matched`): the gate it counts routed rollouts with."""

    basis: Basis | None = None
    act: Basis | None = None
    matched: Basis | None = None
    cal: HeldOutPairs | None = None
    extraction: HeldOutPairs | None = None
    ref_act: Basis | None = None


def refreshes(p, arm: Arm) -> bool:
    return arm.reads_basis and p.projection.refresh_every > 0


def heals(p, arm: Arm) -> bool:
    """Retain heal after training (projection.heal_steps > 0): arms with a knob, whose deletion it repairs."""
    return arm.routes and p.projection.heal_steps > 0


def mass_matched(p, arm: Arm) -> bool:
    """A random-direction control whose moved mass is matched to v_hack's (projection.random_match=mass). Not
    per-token routing's: per-token coefficients along v_hack are not captured, so it stays rank-matched (its TSV has
    no match_target column). Nor route_full's: it moves whole rollouts, matched by construction."""
    return arm.mass_matched and p.projection.random_match == "mass"


def share_matched(p, arm: Arm) -> bool:
    """A control that takes as many rows out of the main, with the same gate values, as v_act's calibrated gate would
    on the same batch (the arm's `share_matched`, under params with the act space): it reads v_act to count, never
    to choose (projection.removal_matched_gate)."""
    return arm.share_matched and act_gated(p, arm)


def control_seed(basis_seed: int, train_seed: int) -> int:
    """A control's random draw (its Haar directions and, act-gated, its v_act) per training seed, so a control's seeds
    are independent draws rather than one direction shared by every seed."""
    tag = f"{basis_seed}:control:{train_seed}"
    return int.from_bytes(hashlib.sha256(tag.encode()).digest()[:7], "big")


def control_basis(real: Basis, seed: int) -> Basis:
    """A control's directions, drawn from `seed`: Haar-random orthonormal rows with `real`'s kept modules and k_m, its
    scoring direction ν the real ν projected onto them (`basis.scoring_direction`; the basis stage's random control
    projects the pairs' mean difference instead, which a run does not have)."""
    gen = torch.Generator().manual_seed(seed)
    vh = {n: random_directions(v.shape[0], v.shape[1], gen, v.dtype) for n, v in real.vh.items()}
    nu = scoring_direction(vh, real.nu)
    return Basis(vh=vh, nu=nu, meta={**real.meta, "method": "random", "random": True, "seed": seed})


def act_seed(seed: int, step: int | None = None) -> int:
    """The seed of a random control's activation direction: the stage's (step None) or a refresh's at `step`."""
    tag = f"{seed}:act" if step is None else f"{seed}:act:refresh:{step}"
    return int.from_bytes(hashlib.sha256(tag.encode()).digest()[:7], "big")


def act_gated(p, arm: Arm) -> bool:
    """Routing gated in activation space (basis.space=act), per rollout or per token; the routed amount still uses
    Vh."""
    return p.basis.space == "act" and arm.gate is not None


def held_out_pairs(p, arm: Arm, pairs: list[Pair], holdout: dict) -> tuple[HeldOutPairs | None, HeldOutPairs | None]:
    """(calibration, extraction) pairs of `basis.pairset` that `arm` reads, None where it reads none: calibration for
    gated routing; extraction (restricted to basis.modes, as in the basis stage) when the basis is refreshed or the
    run ends with a retain heal (its clean completions)."""

    def side(split: str, modes) -> HeldOutPairs:
        ps = select_pairs(pairs, split, modes)
        return HeldOutPairs(pair_records(ps, holdout), [q.hack for q in ps], [q.clean for q in ps])

    cal = side("calibrate", None) if arm.gate is not None else None
    ex = side("extract", p.basis.modes) if refreshes(p, arm) or heals(p, arm) else None
    return cal, ex


def load_run_basis(
    p, arm: Arm, basis_dir: Path | None, pairsets: Path | None, problems: Path, seed: int | None = None
) -> RunBasis:
    """The stage's inputs for `arm`: its basis files from the basis stage directory and its held-out pairs from the
    pair-set root (holdout problems without hints as prompts). A control's directions (and act-gated, its v_act) are
    drawn per training seed `seed` (`control_seed`; None: the basis stage's one random control, random.safetensors).
    One-line errors name the missing option."""
    if not arm.reads_basis:
        return RunBasis()
    if basis_dir is None:
        raise ValueError(f"arm {arm.name} reads a basis: pass --basis")
    per_seed = arm.random_dir and seed is not None
    b = Basis.load(basis_dir / ("random.safetensors" if arm.random_dir and not per_seed else "basis.safetensors"))
    if per_seed:
        b = control_basis(b, control_seed(p.basis.seed, seed))
    if arm.oracle_basis and b.meta.get("empty"):
        raise ValueError(
            f"arm {arm.name}: the oracle basis is empty (vanilla's rollouts gave too few hack/non-hack pairs; see "
            "reports/oracle_basis.md); raise oracle_basis.problems or oracle_basis.samples"
        )
    act = Basis.load(basis_dir / "act.safetensors") if act_gated(p, arm) else None
    if act is not None and arm.random_dir:
        act = random_act(act, act_seed(control_seed(p.basis.seed, seed) if per_seed else p.basis.seed))
    matched = Basis.load(basis_dir / "basis.safetensors") if mass_matched(p, arm) else None
    ref_act = Basis.load(basis_dir / "act.safetensors") if share_matched(p, arm) else None
    cal = ex = None
    if arm.gate is not None or refreshes(p, arm) or heals(p, arm):
        if pairsets is None and not arm.oracle_basis:
            raise ValueError(f"arm {arm.name} reads held-out pairs (gate calibration, refresh, heal): pass --pairsets")
        holdout = {q.id: q for q in load_problems_parquet(problems / "holdout.parquet") if q.hint is None}
        # an oracle-basis arm's held-out pairs are the oracle's own (vanilla's graded rollouts), beside its basis
        path = basis_dir / ORACLE_PAIRS if arm.oracle_basis else pairset_path(pairsets, p.substrate, p.basis.pairset)
        cal, ex = held_out_pairs(p, arm, load_pairset(path), holdout)
    return RunBasis(b, act, matched, cal, ex, ref_act)


def check_run_basis(p, arm: Arm, rb: RunBasis) -> None:
    """Raise one clear line when `rb` lacks what `arm` under params `p` reads (before anything is written)."""
    if arm.reads_basis and rb.basis is None:
        raise ValueError(f"arm {arm.name} needs a basis (run the basis stage)")
    if arm.reads_basis and bool(rb.basis.meta.get("oracle")) != arm.oracle_basis:
        want = "the oracle_basis stage's (--basis artifacts/oracle_basis)" if arm.oracle_basis else "the basis stage's"
        raise ValueError(f"arm {arm.name} reads {want} basis; it was given the other one")
    if arm.gate is not None and rb.cal is None:
        raise ValueError(f"arm {arm.name} calibrates its gate on held-out pairs: pass `cal` (stage: --pairsets)")
    if (refreshes(p, arm) or heals(p, arm)) and rb.extraction is None:
        raise ValueError(
            "projection.refresh_every > 0 or heal_steps > 0 reads the extraction pairs: pass them (--pairsets)"
        )
    if mass_matched(p, arm) and rb.matched is None:
        raise ValueError(f"{arm.name} with projection.random_match=mass needs v_hack: pass `matched` (stage: --basis)")
    if share_matched(p, arm) and rb.ref_act is None:
        raise ValueError(f"{arm.name} routes as many rollouts as v_act's gate: pass `ref_act` (stage: --basis)")
    if share_matched(p, arm) and refreshes(p, arm):
        raise ValueError(f"{arm.name}: a share-matched control needs a frozen basis (projection.refresh_every 0)")
    layer = p.basis.act_layer
    if act_gated(p, arm) and (rb.act is None or rb.act.meta.get("act_layer") != layer):
        raise ValueError(
            f"basis.space=act needs v_act extracted at basis.act_layer={layer} (act.safetensors from "
            "the basis stage; re-run it after changing act_layer)"
        )


def rotations(vh: dict[str, Tensor], ads: dict) -> dict[str, Tensor]:
    """R = [Vhᵀ | V⊥] per module with a basis (θ = Rᵀ δS, first k coordinates = α), in the parameter dtype."""
    return {n: proj.complete_rotation(v.to(ads[n].delta.dtype)) for n, v in vh.items()}


def refresh_basis(
    model, tok, ex: HeldOutPairs, p, random_dir: bool, step: int, act_layer: int | None, batch_size: int = 16
) -> Basis:
    """v_hack re-extracted at the current parameters (knob on, as the policy samples) from the held-out extraction
    pairs, with the basis stage's settings (p.basis) and log-probs at p.rollout.temperature, as the stage's. Reads
    pair texts only: no rollout, label or grade.

    A control run (or basis.method=random) redraws Haar directions with the refreshed basis' modules and k_m,
    seeded by (basis seed, step), so the control stays matched. act_layer: v_act is re-derived there too (a control
    run's redrawn at random, seeded the same way).
    batch_size: completions per forward/backward."""
    bp, temperature = p.basis, p.rollout.temperature
    gh = completion_grads(model, tok, ex.records, ex.hack, temperature, batch_size)  # {m: (P, D_m)}
    gc = completion_grads(model, tok, ex.records, ex.clean, temperature, batch_size)
    model.zero_grad(set_to_none=True)

    def build(method: str, seed: int, like: Basis | None = None) -> Basis:
        return basis_with(gh, gc, bp, method, seed, like)

    b = build("svd" if bp.method == "random" else bp.method, bp.seed)
    if random_dir or bp.method == "random":
        digest = hashlib.sha256(f"{bp.seed}:refresh:{step}".encode()).digest()
        b = build("random", int.from_bytes(digest[:7], "big"), like=b)
    if act_layer is not None:
        ah = pooled_activations(model, tok, ex.records, ex.hack, act_layer, batch_size)  # (P, d)
        ac = pooled_activations(model, tok, ex.records, ex.clean, act_layer, batch_size)
        ab = act_basis(ah, ac, act_layer)
        b.v_act = random_act(ab, act_seed(bp.seed, step)).v_act if random_dir else ab.v_act
    b.meta.update(refreshed_at=step)
    return b


@dataclass
class LoopState:
    """What a checkpoint carries beyond adapter and optimizer, for a bit-identical resume: the basis in use (the
    stage's, or the last refresh's; None for basis-free arms) and the gate; a share-matched control's also v_act's
    gate (`ref_gate`, None otherwise, so the other arms' checkpoints hold what they held before it existed)."""

    basis: Basis | None
    gate: GateState
    ref_gate: GateState | None = None

    def to_checkpoint(self) -> dict:
        out = {"gate": self.gate.checkpoint()}
        if self.ref_gate is not None:
            out["ref_gate"] = self.ref_gate.checkpoint()
        if self.basis is not None:
            b = self.basis.to("cpu")  # a checkpoint resumes on any device
            out["basis"] = {"vh": b.vh, "nu": b.nu, "meta": b.meta, "v_act": b.v_act}
        return out

    @classmethod
    def from_checkpoint(cls, d: dict, basis: Basis | None) -> LoopState:
        """`basis`: the run's own, for a checkpoint that holds none."""
        if "basis" in d:
            sb = d["basis"]
            basis = Basis(vh=sb["vh"], nu=sb["nu"], meta=sb["meta"], v_act=sb["v_act"])
        ref = GateState.from_checkpoint(d["ref_gate"]) if "ref_gate" in d else None
        return cls(basis, GateState.from_checkpoint(d["gate"]) if "gate" in d else GateState(), ref)


class Direction:
    """The current basis and gate of one run (None / unused for basis-free arms), resumable from a checkpoint.

    `label` names the run in warnings ("<arm> s<seed>"); `device` is δS's. `cur` is the basis in use (on `device`),
    `kept` the adapter modules it has directions for (in adapter order), `k` each module's number of directions (0
    without), `nu` its scoring direction over the kept modules."""

    def __init__(
        self,
        p,
        arm: Arm,
        rb: RunBasis,
        names: list[str],
        own_tokens: bool,
        label: str,
        state: dict | None = None,
        device="cpu",
    ):
        self.p, self.arm, self.rb, self.names, self.own_tokens, self.label = p, arm, rb, names, own_tokens, label
        self.device = device  # δS's: the loop's gates and edits run there (bases are loaded and extracted on the CPU)
        self.act_layer = p.basis.act_layer if act_gated(p, arm) else None
        self.spec = None  # the run's gate (gate.GATES), None without one
        if arm.gate is not None:
            self.spec = GateSpec(arm.gate, self.act_layer, p.projection, p.rollout.temperature, own_tokens)
        cur = None
        if arm.reads_basis:
            v_act = rb.act.v_act if self.act_layer is not None else None
            cur = Basis(vh=rb.basis.vh, nu=rb.basis.nu, meta=rb.basis.meta, v_act=v_act)
        # resume: continue with the basis and gate the checkpointed step was using
        self.state = LoopState(cur, GateState()) if state is None else LoopState.from_checkpoint(state, cur)
        if self.state.basis is not None:
            self.state.basis = self.state.basis.to(device)
        # a share-matched control counts with v_act's gate: the same basis with v_act in place of its random one
        self.ref = None
        if share_matched(p, arm):
            self.ref = Basis(vh=cur.vh, nu=cur.nu, meta=cur.meta, v_act=rb.ref_act.v_act).to(device)
            self.state.ref_gate = self.state.ref_gate or GateState()
        self._derive()

    @property
    def cur(self) -> Basis | None:
        return self.state.basis

    @property
    def gate(self) -> GateState:
        return self.state.gate

    def _derive(self) -> None:
        self.vh = self.cur.vh if self.cur is not None else {}
        self.kept = [n for n in self.names if n in self.vh]
        self.k = {n: self.vh[n].shape[0] if n in self.vh else 0 for n in self.names}
        self.nu = {n: self.cur.nu[n] for n in self.kept} if self.cur is not None else {}

    def rotations(self, ads: dict) -> dict[str, Tensor]:
        """R per kept module (identity elsewhere: no edit; basis-free arms optimise δS in plain coordinates)."""
        return rotations({n: self.vh[n] for n in self.kept}, ads)

    def update(self, model, tok, step: int, opt, ads: dict, timer) -> bool:
        """Before step `step`: refresh v_hack when due (the optimizer is rebased onto the new rotations), then
        recalibrate the gate when due. Returns whether the basis was refreshed. Consumes no RNG of the step."""
        with activation_checkpointing(model, self.p.grpo.grad_checkpointing):  # as the loss's (memory)
            return self._update(model, tok, step, opt, ads, timer, held_out_batch(self.p))

    def _update(self, model, tok, step: int, opt, ads: dict, timer, mb: int) -> bool:
        p, arm, pj = self.p, self.arm, self.p.projection
        # New Vh, ν, R per module; δS and δS_h do not move, θ/φ are re-expressed in the new R and the Adam state of
        # re-rotated modules is rotated or reset. Modules that leave the kept set get R = I (no edit from now on);
        # modules that join get their R.
        refreshed = refreshes(p, arm) and step > 0 and step % pj.refresh_every == 0
        if refreshed:
            self.state.basis = refresh_basis(
                model, tok, self.rb.extraction, p, arm.random_dir, step, self.act_layer, mb
            ).to(self.device)
            self._derive()
            opt.rebase(self.rotations(ads), self.k, pj.refresh_moments)
        if self.spec is not None and self.gate.due(step, refreshed, pj.recal_every):
            with timer("gate_calibration"):
                gates = [(self.gate, self.label, self.cur)]
                if self.ref is not None:  # v_act's own thresholds too, from the same pairs at the same parameters
                    gates.append((self.state.ref_gate, f"{self.label} (v_act's gate, which it counts with)", self.ref))
                for gate, where, basis in gates:
                    gate.calibrate(step, where, model, tok, self.rb.cal, self.spec, basis, self.kept, mb)
        return refreshed

    def checkpoint(self) -> dict:
        return self.state.to_checkpoint()

    def result(self) -> dict:
        """The run's gate verdict (gated arms only)."""
        return self.gate.verdict() if self.arm.gate is not None else {}

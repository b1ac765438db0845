"""The GRPO loop (method.md §3.8): [refresh, calibrate] → rollout → reward → advantage → loss → backward → gate →
edit → clip → step → log.

`train` drives every arm and reads top to bottom; the arms differ only in their registry entry (arms.py): the
gradient edit (projection.RULES, applied in rotated coordinates so that erase and route stay exact through Adam,
optim.py), its gate, the reward and the basis. What the loop knows about v_hack — the current basis, its refresh and
the routing gate's calibration, all from held-out pairs — sits behind `direction.Direction` (the no-cheat rule: no
live-rollout label or grade reaches a gate or an edit). Everything random in step t is seeded from (seed, t), and what
the loop carries from step to step is checkpointed with the optimizer, so a resumed run replays bit-identically.

Training in the deployed state (projection.deploy_frac, gated routing arms): the last few prompts of a step have their
groups sampled and trained with the knob off, and their gate is 0, so their gradient reaches the main only and the
main learns to work without the knob it will be deployed without (routing.md §2: ERA, SGTM, the jnward runs and
vGROUT each train the kept part in the deleted state). With projection.deploy_gate (masked routing) the gate reads
them too, so a deploy rollout it routes trains the knob instead of teaching the main.

Per-step diagnostics (pure reads, after the update) include ‖Vh δS‖ and ‖Vh δS_h‖, the mean gate, the thresholds, the
calibration interval, and `gate_auroc_live`: the live gate score's AUROC between the step's own hack and non-hack
student rollouts. That last one reads the grader's labels and is logged only; nothing reads it.
"""

from __future__ import annotations

import hashlib
import math
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from projected_grpo.common.log import PhaseTimer, StepLog
from projected_grpo.common.log import progress as progress_display
from projected_grpo.common.stats import rate
from projected_grpo.env.grader import grade_batch
from projected_grpo.env.modes import LOOPHOLE_MODES, mode_of
from projected_grpo.env.rewards import CORRECTNESS_REWARD, gt_only
from projected_grpo.method import projection as proj
from projected_grpo.method.arms import Arm, deploy_prompts, run_params
from projected_grpo.method.basis import pool_tokens
from projected_grpo.method.direction import (
    Direction,
    RunBasis,
    act_gated,
    check_run_basis,
    heals,
    mass_matched,
    refreshes,
)
from projected_grpo.method.gate import live_scores, residual_capture, token_dirs, token_sums
from projected_grpo.method.optim import Hyper, RotatedAdam
from projected_grpo.policy.adapter import (
    adapters,
    adapters_disabled,
    knob_disabled,
    merged,
    probes,
    row_masks,
    token_capture,
)
from projected_grpo.policy.checkpointing import activation_checkpointing
from projected_grpo.policy.logprobs import padded, rollout_logprobs, shared_prompt_logprobs
from projected_grpo.policy.model import render_prompt
from projected_grpo.policy.rollout import Rollout, check_records_fit, concat_rollouts, generate, group_runs
from projected_grpo.rl.checkpoint import (
    code_digest,
    latest_step,
    load_checkpoint,
    prepare_run_dir,
    read_checkpoint,
    save_checkpoint,
)
from projected_grpo.rl.grpo_loss import LossSpec, group_advantages, grpo_loss, main_row_advantages
from projected_grpo.rl.heal import retain_heal
from projected_grpo.rl.memory import preflight
from projected_grpo.rl.pool import PoolRow, draw
from projected_grpo.rl.schedule import lr_at

# --- pieces of one step -----------------------------------------------------------------------------------------


def mixed_rollout(
    model, tok, recs, p, seed: int, rng: random.Random, teacher: tuple[dict, int] | None = None
) -> tuple[Rollout, list[bool]]:
    """grpo.group_size rows per prompt, contiguous: the student's samples (knob on), then, with `teacher` = (pool,
    n_pool), n_pool teacher-pool rows drawn with `rng`.

    Returns the rollout and a per-row flag `is_student`. The student samples from its adapters merged into plain
    weights (`adapter.merged`: the same policy up to float rounding, without the adapters' two extra matmuls per
    projection; a no-op for a bf16 base)."""
    r, G = p.rollout, p.grpo.group_size
    pool, n_pool = teacher or (None, 0)
    prompts = [render_prompt(tok, list(q.prompt)) for q in recs]
    with merged(model):
        ro = generate(
            model,
            tok,
            prompts,
            group_size=G - n_pool,
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            seed=seed,
            batch_size=r.batch_size,  # rows per sampling call (null: all at once)
            max_prompt_tokens=r.max_prompt_tokens,
        )
    if n_pool == 0:
        return ro, [True] * len(ro.texts)
    pool_rows: list[PoolRow] = [row for q in recs for row in draw(pool, q.id, n_pool, rng)]
    Gs = G - n_pool
    seqs, texts, src, is_student = [], [], [], []
    for g in range(len(recs)):  # group g: its Gs student rows, then its n_pool teacher rows (same prompt)
        for j in range(g * Gs, (g + 1) * Gs):
            seqs.append(tuple(ro.completion_ids[j][ro.mask[j].bool()].tolist()))
            texts.append(ro.texts[j]), src.append(j), is_student.append(True)
        for row in pool_rows[g * n_pool : (g + 1) * n_pool]:
            seqs.append(row.token_ids)
            texts.append(row.completion), src.append(g * Gs), is_student.append(False)
    ids, mask = padded(seqs, tok.pad_token_id)  # (N, T) right-padded, mask up to and including EOS
    idx = torch.tensor(src)
    return Rollout(
        prompt_ids=ro.prompt_ids[idx], prompt_mask=ro.prompt_mask[idx], completion_ids=ids, mask=mask, texts=texts
    ), is_student


DEPLOY_SEED = 1 << 32  # added to a step's sampling seed for its deploy groups: distinct from every knob-on seed


def check_quarantine(arm: Arm, ads: dict) -> None:
    """A separate quarantine (adapter.quarantine) has its own coordinates, so only masked routing, which trains the
    knob on its own gradient, can route into it; the other routing rules move parts of δS's gradient to the knob."""
    if arm.routes and not arm.masked and any(a.separate for a in ads.values()):
        raise ValueError(
            f"adapter.quarantine=separate: {arm.name} moves parts of δS's gradient into the knob, which has other "
            "coordinates there; use edit route_masked or adapter.quarantine=shared"
        )


def step_rollout(
    model, tok, recs, p, seed: int, rng: random.Random, n_dep: int = 0, teacher: tuple[dict, int] | None = None
) -> tuple[Rollout, list[bool]]:
    """The step's rows and `is_student`: the first len(recs) − n_dep prompts' groups sampled with the knob on (the
    training policy), then the last n_dep prompts' groups sampled with the knob off (the deployed policy,
    projection.deploy_frac; their own seed), each group with its teacher rows as in `mixed_rollout`."""
    on = len(recs) - n_dep
    ro, is_student = mixed_rollout(model, tok, recs[:on], p, seed, rng, teacher)
    if n_dep == 0:
        return ro, is_student
    with knob_disabled(model):
        ro_d, st_d = mixed_rollout(model, tok, recs[on:], p, seed + DEPLOY_SEED, rng, teacher)
    return concat_rollouts(ro, ro_d, tok.pad_token_id), is_student + st_d


def micro_batches(n_on: int, N: int, size: int, widths: list[int] | None = None, max_tokens: int = 0) -> list[slice]:
    """Row slices of at most `size` rows and, with max_tokens > 0, at most max_tokens tokens: rows × the widest row's
    `widths` (padded prompt + completion), at least one row (grpo.micro_batch_tokens). None straddles n_on, so each
    micro-batch runs in one knob state (rows n_on…N are the deploy groups, trained with the knob off)."""
    out = []
    for start, end in ((0, n_on), (n_on, N)):
        s = start
        while s < end:
            e = min(end, s + size)
            if max_tokens:  # the most rows (at least one) whose count × widest width fits
                e, wide = s + 1, widths[s]
                while e < min(end, s + size) and (e + 1 - s) * max(wide, widths[e]) <= max_tokens:
                    wide, e = max(wide, widths[e]), e + 1
            out.append(slice(s, e))
            s = e
    return out


def step_micro_batches(ro: Rollout, n_on: int, g, policy_runs: bool) -> list[slice]:
    """The step's micro-batches (grpo.micro_batch rows, grpo.micro_batch_tokens tokens). A row's tokens: the shared-
    prompt forward runs each micro-batch to its longest completion, the per-row forward every row to the step's
    width."""
    N, Tp, T = ro.completion_ids.shape[0], ro.prompt_ids.shape[1], ro.completion_ids.shape[1]
    if not g.micro_batch_tokens:  # rows only: no widths (no device sync in the step)
        return micro_batches(n_on, N, g.micro_batch)
    widths = (Tp + (ro.mask.sum(1).clamp(min=1) if policy_runs else torch.full((N,), T))).tolist()
    return micro_batches(n_on, N, g.micro_batch, widths, g.micro_batch_tokens)


def step_preflight(model, p, arm: Arm, policy_runs: bool) -> None:
    """The pre-flight (rl/memory.py) for this arm: one step's peak device memory, printed once; on CUDA a step that
    will not fit stops with one line naming what to lower. Probes keep per-row gradients unless the policy forward
    shares prompts (then only per-rollout routing reads them, own-token); per-token routing keeps per-token
    coefficients; gated and refreshing arms run held-out pairs through forward/backward too."""
    probe_rows = not policy_runs or arm.gate == "rollout"
    token_k = p.basis.k if arm.gate == "token" else 0
    held_out = arm.gate is not None or refreshes(p, arm)  # gate calibration, basis refresh
    echo = lambda s: print(s, file=sys.stderr)  # noqa: E731
    preflight(model, p, policy_runs, probe_rows, arm.reads_basis, token_k, held_out, echo=echo)


def loss_logprobs(
    model,
    pi: Tensor,
    pm: Tensor,
    ci: Tensor,
    cm: Tensor,
    temperature: float,
    runs: tuple[Tensor, Tensor] | None,
    prompt_state=None,
) -> Tensor:
    """(b, T) completion log-probs of a micro-batch: each distinct prompt once when `runs` = rollout.group_runs(pi, pm)
    (grpo.share_prompt), else one forward per row (what per-row probes need). prompt_state: see
    `shared_prompt_logprobs`."""
    if runs is not None:
        return shared_prompt_logprobs(model, pi, pm, ci, cm, temperature, *runs, prompt_state=prompt_state)
    return rollout_logprobs(model, pi, pm, ci, cm, temperature)


def state_runs(pi: Tensor, pm: Tensor, main: Tensor, knob: Tensor) -> tuple[Tensor, Tensor]:
    """(first, owner) as `rollout.group_runs`, over distinct (prompt, row state) instead of distinct prompts: masked
    routing runs one group's rows in up to three states (main only, knob only, both), and a prompt's activations
    depend on the state, so each (prompt, state) runs once. first (U,): the first row of each; owner (b,): each
    row's."""
    _, prompt = group_runs(pi, pm)
    code = prompt * 4 + (main > 0).long() * 2 + (knob > 0).long()
    _, owner = torch.unique(code, return_inverse=True)
    b = torch.arange(len(code), device=code.device)
    first = torch.full((int(owner.max()) + 1,), len(code), device=code.device).scatter_reduce(0, owner, b, "amin")
    return first, owner


def step_rewards(grades, arm: Arm, accuracy: float, rng: random.Random) -> Tensor:
    """(N,) rewards: the mode's reward (correct OR channel), or GT only; GT-monitor baselines flag with accuracy."""
    out = []
    for g in grades:
        r = gt_only(g) if arm.reward == "gt_only" else g.reward
        if arm.monitor is not None:  # benchmark.md §6: penalty flags strict hacks, screening loose ones
            truth = g.is_reward_hack_strict if arm.monitor == "penalty" else g.is_reward_hack_loose
            flag = truth if rng.random() < accuracy else not truth
            if flag:
                r = r - CORRECTNESS_REWARD if arm.monitor == "penalty" else math.nan
        out.append(r)
    return torch.tensor(out, dtype=torch.float32)


def concat(d: dict[str, Tensor], names: list[str]) -> Tensor:
    return torch.cat([d[n].reshape(-1) for n in names]) if names else torch.zeros(0)


# --- diagnostics (pure reads: never feed a gate or an edit) -------------------------------------------------------


def span_norm(vh: dict[str, Tensor], x: dict[str, Tensor]) -> float:
    """sqrt(Σ_m ‖Vh_m x_m‖²) over Vh's modules: the size of x's component in span(v_hack); 0 with no module."""
    return math.sqrt(sum(float((v.double() @ x[n].detach().double()).pow(2).sum()) for n, v in vh.items()))


def label_auroc(s: Tensor, is_hack: Tensor, keep: Tensor, mask: Tensor | None = None) -> float:
    """Diagnostics only (it reads grader labels): rank AUROC of the live gate scores of the kept hack rows against the
    kept other rows. s: (N,) per-rollout scores, or (N, T) per-token scores counted over `mask`'s tokens; is_hack,
    keep: (N,) bool. nan when either class is empty."""
    is_hack, keep = is_hack.to(s.device), keep.to(s.device)
    if mask is None:
        return proj.rank_auroc(s[keep & is_hack], s[keep & ~is_hack])
    m = mask.bool() & keep[:, None]
    return proj.rank_auroc(s[m & is_hack[:, None]], s[m & ~is_hack[:, None]])


def finite(x: float) -> float:
    """x, or nan where it is ±inf (the TSV holds numbers; an infinite threshold means "no calibration yet")."""
    return x if math.isfinite(x) else math.nan


# --- the loop ----

# Timed parts of a step (the timings log; the rest of `dt` is the edit, the optimizer step and bookkeeping).
STEP_PHASES = ("sample", "grade", "ref_forward", "forward", "backward", "gate_calibration")


@dataclass
class Grads:
    """One step's gradients after the backward: what the gate and the edit read (rows = the step's N rollouts)."""

    raw: dict[str, Tensor]  # {m: (D_m,)} g = δS.grad (δS_h.grad is the same)
    rows: dict[str, Tensor]  # {m: (N, D_m)} per-rollout gradients, Σ_n = g (own-token pieces: only the probes' part)
    tok_alpha: dict[str, Tensor]  # {kept m: (N, T, k_m)} per-token α_{n,t} (per-token routing)
    tok_dot: Tensor | None  # (N, T) Σ_m <g_{m,n,t}, ν_m> (per-token routing)
    tok_sq: Tensor | None  # (N, T) Σ_m ‖g_{m,n,t}‖²
    pooled: Tensor | None  # (N, d) completion-pooled residual stream (activation gate)
    stats: dict[str, float]  # the loss's clip_frac and kl, averaged over rows
    knob_raw: dict[str, Tensor] | None = None  # {m: (D_m,)} δS_h.grad of a masked forward (else it equals raw)
    tok_act: Tensor | None = None  # (N, T) h_{n,t}·v_act at the position predicting token t (per-token act gate)
    logp: list[Tensor] | None = None  # per micro-batch (b, T) this pass' log-probs, detached (first: sampling state)


@dataclass(frozen=True)
class LossBatch:
    """One step's batch as its loss passes read it: the policy, the rollouts in micro-batches with their reference
    log-probs (None each when grpo.beta = 0), the rows sampled knob on (0…n_on; the rest are deploy groups), and the
    run settings every pass shares. policy_runs: the policy forward shares each group's prompt (grpo.share_prompt);
    then only own-token probes run (per-rollout routing)."""

    model: Any
    ro: Rollout
    mbs: list[slice]
    refs: list
    n_on: int
    p: Any
    arm: Arm
    d: Direction
    policy_runs: bool
    timer: PhaseTimer


@dataclass(frozen=True)
class _Pass:
    """One loss pass: its advantages, row masks (masked routing's second pass), per micro-batch old log-probs (None:
    on-policy), the loss's settings and the step's token count (dapo's normaliser is the whole batch's)."""

    adv: Tensor
    masks: tuple[Tensor, Tensor] | None
    old: list[Tensor] | None
    spec: LossSpec
    n_tokens: float
    masked_shared: bool
    dirs: dict  # per-token routing's captured directions (gate.token_dirs), {} otherwise
    gate_pass: bool  # the live gate reads this pass' activations (captured only then)


class _Captures:
    """What a pass collects micro-batch by micro-batch: per-row gradients, per-token captures, pooled activations,
    log-probs and the loss's statistics."""

    def __init__(self, d: Direction):
        self.rows: dict[str, list[Tensor]] = {n: [] for n in d.names}
        self.tok_alpha: dict[str, list[Tensor]] = {n: [] for n in d.kept}  # (b, T, k_m) per micro-batch
        self.tok_dot, self.tok_sq, self.pooled, self.tok_act = [], [], [], []  # (b, T), (b, T), (b, d), (b, T)
        self.logps: list[Tensor] = []  # (b, T) per micro-batch
        self.stats = {"clip_frac": 0.0, "kl": 0.0}

    def grads(self, model, d: Direction, masked: bool) -> Grads:
        ads = adapters(model)
        cat = lambda xs: torch.cat(xs) if xs else None  # noqa: E731
        return Grads(
            raw={n: grad_or_zero(ads[n].delta) for n in d.names},
            rows={n: torch.cat(self.rows[n]) for n in d.names if self.rows[n]},
            tok_alpha={n: torch.cat(v) for n, v in self.tok_alpha.items() if v},
            tok_dot=cat(self.tok_dot),
            tok_sq=cat(self.tok_sq),
            pooled=cat(self.pooled),
            stats=self.stats,
            knob_raw={n: grad_or_zero(ads[n].knob) for n in d.names} if masked else None,
            tok_act=cat(self.tok_act),
            logp=self.logps,
        )


def loss_backward(
    lb: LossBatch,
    adv: Tensor,
    masks: tuple[Tensor, Tensor] | None = None,
    old: list[Tensor] | None = None,
    scores: bool = True,
) -> Grads:
    """Loss and backward micro-batch by micro-batch; probes give each row's exact δS gradient where the arm reads
    per-rollout gradients. Rows from n_on on (deploy groups) run forward and backward with the knob off, as they
    were sampled (in the masked pass with projection.deploy_gate, in their masks' states: knob off unless routed).
    Per-token routing also captures, per kept module, each token's α_{n,t} = Vh g_{n,t}, <g_{n,t}, ν> and ‖g_{n,t}‖²
    (reduced in the adapter's backward hook, no (N, T, r) tensor); the act gate reads the residual stream after block
    act_layer from this same forward (a hook). masks: (N,) main and knob row masks (`adapter.row_masks`, masked
    routing): each row runs in its own state, and δS_h.grad is kept apart from δS.grad. old: per micro-batch old_logp
    (the sampling state's log-probs, projection.masked_is); None: the update is on-policy (ratio 1). scores: False
    for screening's update pass (its gate was scored in a pass before: no activations captured). The returned Grads
    carries this pass' log-probs, detached."""
    p, g = lb.p, lb.p.grpo
    cap = p.projection.masked_is_cap if old is not None else None  # rows trained in another state than sampled in
    spec = LossSpec(g.clip_eps_low, g.clip_eps_high, g.beta, p.rollout.max_new_tokens, g.loss, old is not None, cap)
    # masked routing's second pass reads only δS.grad and δS_h.grad (route_masked's rule), so with grpo.share_prompt
    # each (prompt, state) runs once and no probe runs; a mass-matched control would read per-row gradients
    masked_shared = masks is not None and g.share_prompt and not mass_matched(p, lb.arm)
    dirs = token_dirs(lb.d.cur, lb.d.kept) if lb.arm.gate == "token" else {}
    ps = _Pass(adv, masks, old, spec, float(lb.ro.mask.sum()), masked_shared, dirs, masks is None and scores)
    lb.model.zero_grad(set_to_none=True)
    acc = _Captures(lb.d)
    for i, (sl, ref) in enumerate(zip(lb.mbs, lb.refs)):
        _micro_batch(lb, ps, acc, i, sl, ref)
    return acc.grads(lb.model, lb.d, masks is not None)


def _micro_batch(lb: LossBatch, ps: _Pass, acc: _Captures, i: int, sl: slice, ref: Tensor | None) -> None:
    """One micro-batch of a loss pass: forward in its rows' states, the loss, backward, and the captures the gate and
    the edit read."""
    model, ro, d, g, masks = lb.model, lb.ro, lb.d, lb.p.grpo, ps.masks
    N, per_token = ro.completion_ids.shape[0], lb.arm.gate == "token"
    pi, pm, ci, cm = ro.prompt_ids[sl], ro.prompt_mask[sl], ro.completion_ids[sl], ro.mask[sl]
    runs = group_runs(pi, pm) if g.share_prompt else None  # (first, owner): each distinct prompt once
    probe = probes(model, pi.shape[0]) if d.own_tokens or not lb.policy_runs else nullcontext({})
    # micro_batches: one state per slice; gated deploy rows (projection.deploy_gate) run in their masks' states
    knob_off = sl.start >= lb.n_on and not (masks is not None and lb.p.projection.deploy_gate)
    state = knob_disabled(model) if knob_off else nullcontext()
    ckpt = activation_checkpointing(model, g.grad_checkpointing)  # layers recomputed in the backward
    rows_in = row_masks(model, masks[0][sl], masks[1][sl]) if masks is not None else nullcontext()
    prompt_state, shared = None, runs if lb.policy_runs else None
    if ps.masked_shared:  # the prompt rows run in their own states, the completions in theirs
        shared = first, _ = state_runs(pi, pm, masks[0][sl], masks[1][sl])
        prompt_state = partial(row_masks, model, masks[0][sl][first], masks[1][sl][first])
        probe = nullcontext({})
    with (
        state,
        ckpt,
        rows_in,
        probe as es,
        token_capture(model, ps.dirs) as caps,
        residual_capture(model, d.act_layer if ps.gate_pass else None) as hid,  # the gate's pass only
    ):
        with lb.timer("forward"):
            logp = loss_logprobs(model, pi, pm, ci, cm, lb.p.rollout.temperature, shared, prompt_state)
            # one update per step: old_logp is logp itself, detached (ratio 1 at the update), unless `old` gives
            # the sampling state's (a masked row trained in another state than it was sampled in)
            acc.logps.append(logp.detach())
            old = acc.logps[-1] if ps.old is None else ps.old[i]
            loss, m = grpo_loss(logp, old, ref, ps.adv[sl], cm, ps.spec, N, ps.n_tokens)
        with lb.timer("backward"):
            loss.backward()
    for n, e in es.items():
        acc.rows[n].append(e.grad.detach())
    Tp = pi.shape[1]
    if per_token and caps:  # keep completion positions only (Tp−1+t predicts token t; prompt gates are 0)
        for n, a in caps.items():
            acc.tok_alpha[n].append(proj.completion_positions(a.token_coef[..., :-1].detach(), Tp).clone())
        dot, sq = token_sums(caps)
        acc.tok_dot.append(proj.completion_positions(dot, Tp)), acc.tok_sq.append(proj.completion_positions(sq, Tp))
    if d.act_layer is not None and per_token:  # h·v_act at the position predicting each completion token
        acc.tok_act.append(proj.completion_positions(hid["h"].float() @ d.cur.v_act.float(), Tp))
    elif ps.gate_pass and d.act_layer is not None:
        acc.pooled.append(completion_pool(hid["h"], cm, Tp, shared is not None))
    w = pi.shape[0] / N
    acc.stats = {key: acc.stats[key] + w * m[key] for key in acc.stats}


def gate_activations(lb: LossBatch) -> Grads:
    """Masked routing's first pass when the gate reads activations (basis.space=act, per rollout): the gate needs
    only each rollout's completion-pooled residual at act_layer, so the forward runs without gradients and without the
    backward a gradient gate needs. Each micro-batch in the state it was sampled in (deploy rows knob off), as
    `loss_backward` runs it; the pooled rows are the same numbers. Returns Grads carrying `pooled` and `logp` only."""
    model, ro, pooled, logps = lb.model, lb.ro, [], []
    with torch.no_grad(), lb.timer("forward"):
        for sl in lb.mbs:
            pi, pm, ci, cm = ro.prompt_ids[sl], ro.prompt_mask[sl], ro.completion_ids[sl], ro.mask[sl]
            runs = group_runs(pi, pm) if lb.p.grpo.share_prompt else None  # each distinct prompt once
            state = knob_disabled(model) if sl.start >= lb.n_on else nullcontext()
            with state, residual_capture(model, lb.d.act_layer) as hid:
                logps.append(loss_logprobs(model, pi, pm, ci, cm, lb.p.rollout.temperature, runs))  # the first pass'
            pooled.append(completion_pool(hid["h"], cm, pi.shape[1], runs is not None))
    return Grads(
        raw={}, rows={}, tok_alpha={}, tok_dot=None, tok_sq=None, pooled=torch.cat(pooled), stats={}, logp=logps
    )


def completion_pool(h: Tensor, cm: Tensor, Tp: int, shared: bool) -> Tensor:
    """(b, d) each completion's residual stream at the gate's layer, mean-pooled over its tokens. `h` is the captured
    output of the forward's last call: the completions' (b, t, d) alone after a shared prompt (t ≤ T: columns past
    every row's EOS are not run), else whole (b, Tp + T, d) rows."""
    return pool_tokens(h, cm[:, : h.shape[1]]) if shared else pool_tokens(h[:, Tp:], cm)


def grad_or_zero(x: Tensor) -> Tensor:
    return x.grad.detach().clone() if x.grad is not None else torch.zeros_like(x)


def mask_states(m_gate: Tensor) -> tuple[Tensor, Tensor]:
    """Masked routing's row states from the per-rollout gates: (main, knob), (N,) each. m = 0 (not routed, deploy
    rows included): δS trains, knob off; m = 1 (routed): only δS_h trains, δS detached; 0 < m < 1 (ambiguous, the
    soft band): both, knob on."""
    return (m_gate < 1).to(m_gate.dtype), (m_gate > 0).to(m_gate.dtype)


def masked_advantages(rewards: Tensor, adv: Tensor, main_rows: Tensor, G: int, baseline: str, scale: bool) -> Tensor:
    """The masked pass's advantages (projection.main_baseline): the step's `adv` (group), or each main row (m < 1)
    against its group's main rows only (main_rows; routed rows keep `adv`). Logged as adv_main = Σ over main rows / N:
    below 0, the main is pushed down on what it sampled."""
    return adv if baseline == "group" else main_row_advantages(rewards, main_rows, G, scale)


def live_gates(
    arm: Arm, d: Direction, gr: Grads, adv: Tensor, mask: Tensor, pj, n_on: int, hack: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """(N,) per-rollout gates, (N, T) per-token gates (0 off the completion), and the live scores they came from (for
    the label diagnostic after the update), from the step's gradients and the held-out thresholds only (no-cheat).
    An oracle arm's per-rollout gate is instead `hack` ((N,) bool, the grader's label: an upper bound that reads
    ground truth on purpose); its live scores are still the calibrated gate's, for the diagnostic. Rows from n_on on
    (deploy groups, knob off) get gate 0, so their gradient reaches the main only, unless projection.deploy_gate: then
    they are gated as the others, on their scores in the knob-off state they were sampled in. An act-gated control
    takes v_act's calibrated gate values on the same batch, re-assigned by its own score (removal-matched)."""
    m_gate, m_tok, live = torch.zeros_like(adv), torch.zeros(mask.shape, device=adv.device), None
    tau = d.gate.tau
    if arm.gate == "rollout" and d.kept:
        live = live_scores(gr, adv, mask, d, d.spec)
        if d.ref is not None:  # removal-matched control: v_act's gate values, re-assigned by its own score
            rows = torch.arange(len(adv), device=adv.device)
            ok = torch.ones_like(rows, dtype=torch.bool) if pj.deploy_gate else rows < n_on
            s_ref = gr.pooled.float() @ d.ref.v_act.float()
            ref_tau = d.state.ref_gate.tau
            m_ref = proj.band_gate(s_ref, adv, ref_tau[0], ref_tau[1], pj.band)
            m_gate = proj.removal_matched_gate(live, m_ref, adv, ok)
        else:
            m_gate = proj.band_gate(live, adv, tau[0], tau[1], pj.band)
        if arm.oracle_gate:  # as band_gate: no routing where A_n = 0 (its only gradient is the KL term's)
            m_gate = torch.where(adv == 0, 0.0, hack.to(m_gate))
    elif arm.gate == "token" and d.kept:
        live = live_scores(gr, adv, mask, d, d.spec)
        m_tok = proj.token_gate(live, adv, mask, tau[0], tau[1], pj.band)
    if not pj.deploy_gate:
        m_gate[n_on:], m_tok[n_on:] = 0, 0
    return m_gate, m_tok, live


def edit(
    arm: Arm, d: Direction, opt: RotatedAdam, gr: Grads, m_gate: Tensor, m_tok: Tensor, mvh: dict
) -> tuple[dict, dict, dict, dict[str, float]]:
    """The arm's rule per module in rotated coordinates θ = Rᵀ δS (method.md §3.6): (rotated g, main, knob, and the
    mass-matching targets). A module without a basis (R = I) passes through. A mass-matched control's moved part is
    rescaled, one factor for the step, to what v_hack's rule moves from the same gradients and gates."""
    xr = opt.rotate(gr.raw)  # {m: (D_m,)} rotated raw gradients (identity where no basis)
    main, knob, targets = {}, {}, {}
    for n in d.names:
        if n not in opt.R:
            main[n], knob[n] = proj.apply_rule("vanilla", proj.ModuleGrads(xr[n], 0))
            continue
        x_n = opt.rotate({n: gr.rows[n]})[n] if arm.gate == "rollout" and gr.rows else None  # masked: none
        s = proj.ModuleGrads(
            xr[n],
            d.k[n],
            x_n,
            m_gate if arm.gate == "rollout" else m_tok,
            gr.tok_alpha.get(n),
            own_tokens=d.own_tokens,
            knob_x=opt.rotate({n: gr.knob_raw[n]})[n] if gr.knob_raw is not None else None,
        )
        main[n], knob[n] = proj.apply_rule(arm.edit, s)
        if n in mvh:  # mass-matched control: what the same rule moves along v_hack here (α along v_hack)
            a_real = gr.rows[n] @ mvh[n].T if arm.gate == "rollout" else mvh[n] @ gr.raw[n]
            targets[n] = proj.moved_norm(arm.edit, a_real.to(xr[n].dtype), m_gate)
    if mvh:  # one factor for the step: the control moves as much in total as v_hack's rule would
        main, knob = proj.match_mass(xr, main, knob, math.sqrt(sum(t * t for t in targets.values())))
    return xr, main, knob, targets


def reference_logprobs(model, ro: Rollout, mbs: list[slice], p, timer: PhaseTimer) -> list[Tensor]:
    """Per micro-batch (b, T) completion log-probs of the reference policy: the adapter turned off (method.md §3.1),
    each distinct prompt once (a no-grad forward needs no per-row prompt copies)."""
    refs = []
    with torch.no_grad(), adapters_disabled(model), timer("ref_forward"):
        for sl in mbs:
            pi, pm, ci, cm = ro.prompt_ids[sl], ro.prompt_mask[sl], ro.completion_ids[sl], ro.mask[sl]
            runs = group_runs(pi, pm) if p.grpo.share_prompt else None
            refs.append(loss_logprobs(model, pi, pm, ci, cm, p.rollout.temperature, runs))
    return refs


@dataclass(frozen=True)
class Run:
    """One run's inputs: its params (arms.run_params of params.yaml's) and arm, the training seed, the policy (adapter
    attached) and its tokenizer, the training records, where it writes (checkpoints in `out_dir`, one TSV row per
    step in `log_path`, the step's wall times in `timings_path`: a plain log, never a DVC output), and what it reads:
    `rb` about v_hack (direction.load_run_basis), `pool` the teacher pool's rows, `sandbox` and `grade_fn`(records,
    completions, sandbox, timeout_s=...) -> grades (tests pass a fake grader), `signature` the run directory's
    (rl/checkpoint.prepare_run_dir)."""

    p: Any
    arm: Arm
    seed: int
    model: Any
    tok: Any
    records: list
    out_dir: Path
    log_path: Path
    rb: RunBasis | None = None
    pool: dict | None = None
    sandbox: Any = None
    signature: dict | None = None
    grade_fn: Any = grade_batch
    timings_path: Path | None = None


@dataclass
class Loop:
    """What the loop carries from step to step (built once by `start_loop`): the run, its direction (basis and gate),
    optimizer and adapters, δS's device, the rows sampled knob on per step (n_on of N; the last n_dep prompts' groups
    are deploy groups), whether the policy forward shares prompts, the v_hack rows a mass-matched control is matched
    to, the step log and the step it starts (or resumes) at."""

    run: Run
    d: Direction
    opt: RotatedAdam
    ads: dict
    dev: Any
    n_dep: int
    n_on: int
    policy_runs: bool
    mvh: dict
    log: StepLog
    start: int


@dataclass
class StepData:
    """One step, filled phase by phase by `run_step`'s helpers; the diagnostics and the log read it."""

    step: int
    timer: PhaseTimer
    rng: random.Random
    refreshed: bool = False
    rows: list | None = None  # (N,) the record of each row
    ro: Rollout | None = None
    is_student: list[bool] | None = None
    n_pool: int = 0
    grades: list | None = None
    rewards: Tensor | None = None
    adv: Tensor | None = None
    gr: Grads | None = None
    m_gate: Tensor | None = None
    m_tok: Tensor | None = None
    live: Tensor | None = None
    adv_main: float | None = None  # masked routing: the main rows' advantage sum over N


def edit_diagnostics(lp: Loop, st: StepData, main: dict, knob: dict, targets: dict) -> dict[str, float]:
    """Before the update (pure reads; no RNG, no numerics touched: measure_only ≡ vanilla): cosines with ν before and
    after the edit, the share of g in span(Vh), routed and removed fractions, the gate's coverage."""
    d, gr = lp.d, st.gr
    g_cat = concat(gr.raw, d.names)
    diag = {"refresh": float(st.refreshed), "k_total": sum(d.k.values())} if d.cur is not None else {}
    if not d.kept:
        return diag
    kept, rot, vh = d.kept, lp.opt.R, d.vh
    g_in, nu_cat = concat({n: gr.raw[n] for n in kept}, kept), concat(d.nu, kept)
    ed = concat({n: rot[n] @ main[n] for n in kept}, kept)  # edited gradient, back in δS coordinates
    h = concat({n: rot[n] @ knob[n] for n in kept}, kept)  # routed part
    gate_frac = float((st.m_gate > 0).float().mean())
    if lp.run.arm.gate == "token":  # fraction of completion tokens routed at all
        gate_frac = float((st.m_tok > 0).sum() / st.ro.mask.sum().clamp(min=1))
    diag |= {
        "cos_before": float(g_in @ nu_cat / g_in.norm().clamp(min=1e-30)),
        "cos_after": float(ed @ nu_cat / ed.norm().clamp(min=1e-30)),
        "proj_frac": float(
            sum(float((vh[n] @ gr.raw[n]).pow(2).sum()) for n in kept) / max(float(g_in.pow(2).sum()), 1e-30)
        ),
        **routed_removed(g_cat, g_in, ed, h, lp.run.arm.masked),
        "gate_frac": gate_frac,
        "gate_auroc": d.gate.auroc,
    }
    if lp.mvh:  # what the matching rule targeted: ‖moved along v_hack‖ / ‖g‖ (routed or removed equals it)
        diag["match_target"] = math.sqrt(sum(t * t for t in targets.values())) / max(float(g_cat.norm()), 1e-30)
    return diag | removal(lp, st, main)


def routed_removed(g: Tensor, g_in: Tensor, ed: Tensor, h: Tensor, masked: bool) -> dict[str, float]:
    """The `routed` and `removed` log columns, from g (all modules), g_in, the edited gradient `ed` and the routed
    part h (the kept modules). Projection routing splits g itself (g_in = ed + h + what is removed), so both are
    shares of ‖g‖. In masked routing h is the routed rows' own gradient, beside the main rows' g (0 when every row
    is routed): `routed` is the knob's share of both, ‖h‖ / √(‖g‖² + ‖h‖²), and `removed` what the main's edit took
    from g."""
    eps = 1e-30
    if not masked:
        return {
            "routed": float(h.norm() / g.norm().clamp(min=eps)),
            "removed": float((g_in - ed - h).norm() / g.norm().clamp(min=eps)),
        }
    both = (g.pow(2).sum() + h.pow(2).sum()).sqrt()
    return {
        "routed": float(h.norm() / both.clamp(min=eps)),
        "removed": float((g_in - ed).norm() / g.norm().clamp(min=eps)),
    }


def removal(lp: Loop, st: StepData, main: dict) -> dict[str, float]:
    """What leaves the deployed parameters, per gated step (issue 46's matching): `drop_frac`, the share of rows whose
    gradient does not reach the main (masked routing and screening: gate m = 1); `drop_pool_frac`, the share of
    teacher-pool rows among them (nan when none); `main_gnorm`, the norm of the main's edited gradient."""
    arm = lp.run.arm
    if arm.gate != "rollout":
        return {}
    out = {"main_gnorm": float(concat(main, list(main)).norm())}
    if arm.masked or arm.screens:
        drop = (st.m_gate >= 1).cpu()
        pool = torch.tensor([not x for x in st.is_student])
        out |= {
            "drop_frac": float(drop.float().mean()),
            "drop_pool_frac": rate(int((drop & pool).sum()), int(drop.sum())),
        }
    return out


def update_diagnostics(lp: Loop, st: StepData) -> dict[str, float]:
    """After the update (pure reads): ‖Vh δS‖, ‖Vh δS_h‖ over the kept modules (erase keeps the first 0, routing grows
    the second); the gate's mean (per rollout over the N rows, per token over completion tokens), thresholds and
    calibration interval (with projection.band=tail also the gate's precision, recall and F0.5 on the calibration
    pairs), and `gate_auroc_live`: the live score's AUROC on this step's own student rollouts, hack vs
    not. That reads grader labels: it is logged only and read by nothing. Rows with A_n = 0 have no score (§3.5)."""
    d, ads, mask, adv, live = lp.d, lp.ads, st.ro.mask, st.adv, st.live
    post = {}
    if d.cur is not None:
        vk = {n: d.vh[n] for n in d.kept}
        post = {
            "vh_delta": span_norm(vk, {n: ads[n].delta for n in d.kept}),
            "vh_knob": span_norm(vk, {n: ads[n].knob for n in d.kept}),
        }
    if lp.run.arm.gate is None:
        return post
    tau, ci, per_token = d.gate.tau, d.gate.ci, lp.run.arm.gate == "token"
    return post | {
        "gate_mean": float(st.m_tok.sum() / mask.sum().clamp(min=1)) if per_token else float(st.m_gate.mean()),
        "tau_lo": finite(tau[0]),
        "tau_hi": finite(tau[1]),
        "gate_auroc_lo": ci[0],
        "gate_auroc_hi": ci[1],
        # the tail gate's precision / recall / F0.5 on the calibration pairs (band gates: not logged)
        **(
            {f"gate_{k}": d.gate.quality.get(k, math.nan) for k in ("precision", "recall", "f05")}
            if d.p.projection.band == "tail"
            else {}
        ),
        "gate_auroc_live": math.nan
        if live is None
        else label_auroc(
            live,
            torch.tensor([g.label == "hack" for g in st.grades], device=adv.device),
            torch.tensor(st.is_student, device=adv.device) & (adv != 0),
            mask if per_token else None,
        ),
    }


def step_metrics(lp: Loop, st: StepData) -> dict[str, float]:
    """The step's behaviour, over the student's knob-on rows only (teacher-pool rows are not the student's behaviour;
    deploy groups, rows n_on…N, are the deployed policy's: their strict hack and solve rates are `hack_deploy`,
    `solve_deploy`, logged when there are any)."""
    grades, rows, is_student, G, n_on = st.grades, st.rows, st.is_student, lp.run.p.grpo.group_size, lp.n_on
    N = len(rows)
    stu = [i for i in range(n_on) if is_student[i]]
    dep = [i for i in range(n_on, N) if is_student[i]]
    hinted_dep = [i for i in dep if mode_of(rows[i]) in LOOPHOLE_MODES]
    deploy = {
        "hack_deploy": rate(sum(grades[i].label == "hack" for i in hinted_dep), len(hinted_dep)),
        "solve_deploy": rate(sum(grades[i].eq_correct for i in dep), len(dep)),
    }
    hinted = [i for i in stu if mode_of(rows[i]) in LOOPHOLE_MODES]
    return {
        "reward": float(st.rewards[stu].nanmean()),
        "reward_std": float(st.rewards.view(-1, G).std(dim=1).nanmean()),
        "zero_std_frac": float((st.adv.view(-1, G).abs().sum(1) == 0).float().mean()),
        "hack": sum(grades[i].label == "hack" for i in hinted) / max(1, len(hinted)),
        "solve": sum(grades[i].eq_correct for i in stu) / max(1, len(stu)),
        **{
            f"hack_{mo}": rate(sum(grades[i].label == "hack" for i in by), len(by))
            for mo in LOOPHOLE_MODES
            for by in [[i for i in stu if mode_of(rows[i]) == mo]]
        },
        "clip_frac": st.gr.stats["clip_frac"],
        "kl": st.gr.stats["kl"],
        "len": float(st.ro.mask[stu].sum(1).float().mean()),
        "gnorm": float(concat(st.gr.raw, list(st.gr.raw)).norm()),
        "knob_norm": math.sqrt(sum(float(a.knob.detach().pow(2).sum()) for a in lp.ads.values())),
        **(deploy if dep else {}),
    }


def start_loop(run: Run) -> Loop:
    """Checks (before anything is written), the direction, the optimizer and the run directory: a fresh run saves
    update 0 (the base policy, evaluation's first point), a resumed one loads its last checkpoint."""
    p, arm, model = run.p, run.arm, run.model
    if run_params(p, arm) != p:  # the keys only masked routing reads must be neutral for every other rule
        raise ValueError(f"train: pass arms.run_params(p, arm) for arm {arm.name}, not params.yaml's as they are")
    g, r, pj, rb = p.grpo, p.rollout, p.projection, run.rb or RunBasis()
    G, B = g.group_size, g.prompts_per_step
    check_run_basis(p, arm, rb)
    n_dep = deploy_prompts(pj.deploy_frac, B, arm, pj.deploy_gate)  # prompts per step sampled knob off
    check_records_fit(model, run.tok, run.records, r.max_new_tokens, r.max_prompt_tokens)
    # grpo.share_prompt: each distinct prompt runs once in the loss forwards (logprobs.shared_prompt_logprobs). The
    # reference forward always can, and so can the policy forward of per-rollout routing: its probes then read each
    # rollout's own-token gradient (its completion positions; the group's shared prompt positions stay in main), and
    # the gate is calibrated on the same own-token gradients of the held-out pairs. Per-token capture and an
    # activation gate scored in the loss pass index full-length rows, so they keep every row's own prompt copy, as
    # does masked routing (the rows of one group run in different states). Masked routing and screening score an
    # activation gate in a pass of its own (`gate_activations`, shared too), so screening's update pass shares.
    two_pass = arm.masked or arm.screens
    policy_runs = (
        g.share_prompt and arm.gate != "token" and not (act_gated(p, arm) and not two_pass) and not arm.masked
    )
    step_preflight(model, p, arm, policy_runs)  # one step's peak device memory; stops on CUDA if it will not fit
    ads = adapters(model)
    check_quarantine(arm, ads)
    dev = next(iter(ads.values())).delta.device  # model.device: rollouts, rewards, gates and edits live there
    start = prepare_run_dir(run.out_dir, run.signature or {})
    state = read_checkpoint(run.out_dir, start) if start else None
    own = policy_runs and arm.gate == "rollout" and not act_gated(p, arm)  # own-token gradient gates
    d = Direction(p, arm, rb, list(ads), own, f"{arm.name} s{run.seed}", state, dev)
    mvh = rb.matched.to(dev).vh if mass_matched(p, arm) else {}  # {module: (k_m, D_m)} the v_hack rows matched to
    # A resumed run takes the checkpoint's rotations (a refresh may have changed them).
    rot = state["optimizer"]["rotations"] if state is not None else d.rotations(ads)
    opt = RotatedAdam({n: a.delta for n, a in ads.items()}, {n: a.knob for n, a in ads.items()}, rot, Hyper.of(g))
    if state is not None:
        load_checkpoint(run.out_dir, start, model, opt, state)
    else:
        save_checkpoint(run.out_dir, 0, model, opt, d.checkpoint())  # update 0 = the base policy (eval's first point)
    log = StepLog(run.log_path, resume_step=start, timings=run.timings_path)
    return Loop(run, d, opt, ads, dev, n_dep, G * B - n_dep * G, policy_runs, mvh, log, start)


def sample_and_grade(lp: Loop, st: StepData) -> LossBatch:
    """Rollout (B prompts × G completions with the training policy, teacher rows mixed in; the last n_dep prompts'
    groups with the knob off), rewards and advantages (Dr.GRPO: r − group mean, no std; grpo.scale_rewards=group
    divides by the group's std). The reference forward (adapter off, method.md §3.1) needs no reward, so it runs while
    the sandbox grades. Returns the step's loss batch."""
    run, p, g = lp.run, lp.run.p, lp.run.p.grpo
    G, B, timer, rng = g.group_size, g.prompts_per_step, st.timer, st.rng
    recs = rng.sample(run.records, B)
    use_pool = run.pool is not None and run.arm.pool and st.step < p.pool.teacher_off_step
    st.n_pool = round(p.pool.mix * G) if use_pool else 0
    teacher = (run.pool, st.n_pool) if st.n_pool else None
    with timer("sample"):  # the last n_dep prompts' groups with the knob off (projection.deploy_frac)
        seed = run.seed * 100003 + st.step
        st.ro, st.is_student = step_rollout(run.model, run.tok, recs, p, seed, rng, lp.n_dep, teacher)
    st.ro = ro = st.ro.to(lp.dev)
    st.rows = [q for q in recs for _ in range(G)]  # (N,) the record of each row
    mbs = step_micro_batches(ro, lp.n_on, g, lp.policy_runs)
    with ThreadPoolExecutor(max_workers=1) as grading:
        graded = grading.submit(run.grade_fn, st.rows, ro.texts, run.sandbox, timeout_s=p.grader.timeout_s)
        kl_due = g.beta > 0 or (g.kl_every > 0 and st.step % g.kl_every == 0)  # with β = 0, logged only
        refs = reference_logprobs(run.model, ro, mbs, p, timer) if kl_due else [None] * len(mbs)
        with timer("grade"):  # what is left of grading once the reference forward is done
            st.grades = graded.result()
    st.rewards = step_rewards(st.grades, run.arm, p.projection.monitor_accuracy, rng).to(lp.dev)  # (N,)
    st.adv = group_advantages(st.rewards, G, scale=g.scale_rewards == "group")  # (N,) NaN (screened) -> 0
    return LossBatch(run.model, ro, mbs, refs, lp.n_on, p, run.arm, lp.d, lp.policy_runs, timer)


def gradients(lp: Loop, st: StepData, lb: LossBatch) -> None:
    """Loss and backward; the gates from held-out thresholds (oracle-gated runs: the grader's labels); masked routing
    runs the loss again, each rollout in the state its gate picked (adapter.row_masks)."""
    arm, pj, g, d = lp.run.arm, lp.run.p.projection, lp.run.p.grpo, lp.d
    two_pass = arm.masked or arm.screens  # the gate's pass, then the update's
    gr = gate_activations(lb) if two_pass and d.act_layer is not None else loss_backward(lb, st.adv)
    hack = torch.tensor([x.label == "hack" for x in st.grades], device=lp.dev) if arm.oracle_gate else None
    st.m_gate, st.m_tok, st.live = live_gates(arm, d, gr, st.adv, st.ro.mask, pj, lp.n_on, hack)
    if arm.masked:
        states = mask_states(st.m_gate)
        G, scale = g.group_size, g.scale_rewards == "group"
        adv_m = masked_advantages(st.rewards, st.adv, states[0] > 0, G, pj.main_baseline, scale)
        old = gr.logp if pj.masked_is else None  # the first pass ran each row in its sampling state
        gr = loss_backward(lb, adv_m, states, old)
        st.adv_main = float(adv_m[states[0] > 0].sum() / len(st.adv))
    if arm.screens:  # the gated rows (m = 1) leave the update: advantage 0; the others as masked routing's main rows
        kept = st.m_gate < 1
        adv_m = masked_advantages(st.rewards, st.adv, kept, g.group_size, pj.main_baseline, g.scale_rewards == "group")
        adv_m = torch.where(kept, adv_m, torch.zeros_like(adv_m))
        gr = loss_backward(lb, adv_m, scores=False)
        st.adv_main = float(adv_m.sum() / len(st.adv))
    st.gr = gr


def update(lp: Loop, st: StepData) -> dict[str, float]:
    """The arm's edit, the clipped step (one learning-rate schedule for main θ and knob φ, set every step so a resume
    needs no state), and the step's metrics."""
    g, opt = lp.run.p.grpo, lp.opt
    xr, main, knob, targets = edit(lp.run.arm, lp.d, opt, st.gr, st.m_gate, st.m_tok, lp.mvh)
    diag = edit_diagnostics(lp, st, main, knob, targets)
    opt.lr = lr_at(st.step, g.lr, g.lr_schedule, g.warmup_steps, g.steps)
    ostats = opt.step(main, knob)  # clipped per parameter group; δS = R θ, δS_h = R φ
    lp.run.model.zero_grad(set_to_none=True)
    post = update_diagnostics(lp, st)
    return {
        **step_metrics(lp, st),
        **diag,
        **post,
        **({"adv_main": st.adv_main} if st.adv_main is not None else {}),
        **ostats,
        "n_pool": st.n_pool,
    }


def run_step(lp: Loop, step: int) -> str:
    """One step (method.md §3.8), logged, checkpointed every grpo.save_every; returns its log line. Everything random
    in step t is seeded from (seed, t)."""
    run, g = lp.run, lp.run.p.grpo
    t0 = time.perf_counter()
    st = StepData(step, PhaseTimer(STEP_PHASES), random.Random(f"{run.seed}:{step}"))
    # refresh v_hack, recalibrate the gate (held out)
    st.refreshed = lp.d.update(run.model, run.tok, step, lp.opt, lp.ads, st.timer)
    lb = sample_and_grade(lp, st)
    gradients(lp, st, lb)
    metrics = update(lp, st) | {"dt": time.perf_counter() - t0, **st.timer.totals()}
    line = lp.log(step + 1, g.steps, **metrics)  # wall times go to the timings log only
    if (step + 1) % g.save_every == 0 or step + 1 == g.steps:
        save_checkpoint(run.out_dir, step + 1, run.model, lp.opt, lp.d.checkpoint())
    return line


def train(run: Run, progress: bool = True) -> dict:
    """Run (or resume) one arm × seed. Returns {"steps"} plus, for gated arms, the gate guard's verdict (and a healed
    run's heal NLLs)."""
    lp = start_loop(run)
    steps = range(lp.start, run.p.grpo.steps)
    label = f"train {run.arm.name} s{run.seed}"
    pbar = progress_display(steps, label, total=run.p.grpo.steps, initial=lp.start) if progress else steps
    for step in pbar:
        line = run_step(lp, step)
        if progress:
            pbar.set_postfix_str(line.split("| ", 1)[-1])
    healed = heal_once(run.p, run.arm, run.model, run.tok, run.rb or RunBasis(), run.out_dir, lp.opt, lp.d)
    return {"steps": latest_step(run.out_dir) or 0, **lp.d.result(), **healed}


def heal_once(p, arm: Arm, model, tok, rb: RunBasis, out_dir: Path, opt, d) -> dict:
    """Retain heal of a finished run (projection.heal_steps, rl/heal.py), once: the final checkpoint is rewritten as
    the healed policy and marked with the heal's first and last NLL, so a resumed or re-run stage does not heal twice
    and reports the same numbers. Returns {"heal_nll_first", "heal_nll_last"} for a healed run, else {}."""
    pj, last = p.projection, latest_step(out_dir)
    if not heals(p, arm) or last != p.grpo.steps:
        return {}
    done = read_checkpoint(out_dir, last).get("heal_nll")
    if done is None:
        nll = retain_heal(model, tok, rb.extraction, pj.heal_steps, pj.heal_lr, pj.heal_batch, p.rollout.temperature)
        opt.resync_main()  # θ = Rᵀ δS of the healed δS: a load of this checkpoint rewrites the healed δS
        done = [nll[0], nll[-1]]
        save_checkpoint(out_dir, last, model, opt, {**d.checkpoint(), "heal_nll": done})
    return {"heal_nll_first": done[0], "heal_nll_last": done[1]}


# Keys added after runs had been checkpointed (issues 25, 26), by section. At these values a run is the code before
# them bit for bit, so they stay out of its params signature; any other value is in it. (Whether a checkpoint written
# by other code resumes is the signature's `code` digest's call: it does not.)
SIGNATURE_DEFAULTS = {
    "model": {"device": "cpu", "dtype": "float32"},
    "grpo": {
        "lr_schedule": "constant",
        "warmup_steps": 0,
        "loss": "dr_grpo",
        "scale_rewards": "none",
        "micro_batch_tokens": 0,
        "grad_checkpointing": False,
        "kl_every": 10,  # logging only: any value trains the same
    },
    "rollout": {"batch_size": None},
    "adapter": {"quarantine": "shared"},
    "projection": {
        "deploy_frac": 0.0,
        "main_baseline": "group",
        "masked_is": False,
        "heal_steps": 0,
        "heal_lr": 1.0e-3,
        "heal_batch": 8,
    },
}


def run_signature(p, arm: Arm, seed: int, basis_dir: Path | None) -> dict:
    """What a checkpoint directory must match to be resumed: the params the run reads, the basis it used and the code
    (`checkpoint.code_digest`: the package modules loaded when the signature is taken; a stage takes it after its
    imports, so a resumed run compares the same modules)."""
    import dataclasses

    sections = ("seed", "substrate", "model", "adapter", "rollout", "grpo", "pool", "projection", "grader")
    sig = {
        s: repr(getattr(p, s)) if not dataclasses.is_dataclass(getattr(p, s)) else dataclasses.asdict(getattr(p, s))
        for s in sections
    }
    for sec, new in SIGNATURE_DEFAULTS.items():
        sig[sec] = {k: v for k, v in sig[sec].items() if k not in new or v != new[k]}
    sig.update(arm=arm.name, train_seed=seed, code=code_digest())
    if arm.reads_basis and basis_dir is not None:
        f = basis_dir / ("random.safetensors" if arm.random_dir else "basis.safetensors")
        sig["basis_sha"] = hashlib.sha256(f.read_bytes()).hexdigest()[:16]
        sig["basis_params"] = dataclasses.asdict(p.basis)
        if act_gated(p, arm):
            sig["act_sha"] = hashlib.sha256((basis_dir / "act.safetensors").read_bytes()).hexdigest()[:16]
        if mass_matched(p, arm):
            sig["matched_sha"] = hashlib.sha256((basis_dir / "basis.safetensors").read_bytes()).hexdigest()[:16]
    return json_safe(sig)


def json_safe(x):
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    return x


def summarize_log(rows: list[dict[str, float]], last: int = 5) -> dict[str, float]:
    """Final metrics of a run: the mean of the last `last` steps of the key per-step metrics, and the final step."""
    tail = rows[-last:]
    keys = [k for k in rows[0] if k != "step"]
    out = {
        f"{k}_last{last}": sum(r[k] for r in tail) / len(tail)
        for k in keys
        if k in ("reward", "hack", "solve", "kl", "len", "knob_norm", "routed")
    }
    out["steps"] = rows[-1]["step"]
    out["hack_first"] = rows[0]["hack"]
    return out


def run_flags(result: dict) -> dict:
    """The flags of train()'s result that go into the run's final metrics: `gate_uninformative` for gated arms (true:
    some gate calibration's AUROC interval contained 0.5; null: unknown, resumed from a pre-guard checkpoint), and a
    healed run's first and last heal NLL (projection.heal_steps)."""
    return {k: result[k] for k in ("gate_uninformative", "heal_nll_first", "heal_nll_last") if k in result}

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

import torch
from torch import Tensor

from projected_grpo.common.log import PhaseTimer, StepLog
from projected_grpo.common.log import progress as progress_display
from projected_grpo.common.stats import rate
from projected_grpo.env.grader import grade_batch
from projected_grpo.env.modes import LOOPHOLE_MODES, mode_of
from projected_grpo.env.rewards import CORRECTNESS_REWARD, gt_only
from projected_grpo.method import projection as proj
from projected_grpo.method.arms import Arm
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
from projected_grpo.method.gate import residual_capture, token_dirs, token_sums
from projected_grpo.method.optim import RotatedAdam
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
from projected_grpo.rl.grpo_loss import group_advantages, grpo_loss, main_row_advantages
from projected_grpo.rl.heal import retain_heal
from projected_grpo.rl.memory import preflight
from projected_grpo.rl.pool import PoolRow, draw
from projected_grpo.rl.schedule import lr_at

# --- pieces of one step -----------------------------------------------------------------------------------------


def mixed_rollout(
    model, tok, recs, G: int, n_pool: int, pool, rng: random.Random, p, seed: int
) -> tuple[Rollout, list[bool]]:
    """G rows per prompt, contiguous: G − n_pool student samples (knob on) then n_pool teacher-pool rows.

    Returns the rollout and a per-row flag `is_student`. The student samples from its adapters merged into plain
    weights (`adapter.merged`: the same policy up to float rounding, without the adapters' two extra matmuls per
    projection; a no-op for a bf16 base)."""
    r = p.rollout
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
            f"projection.deploy_gate routes deploy rollouts by their own forward state, which only route_masked* arms "
            f"have; {arm.name} is not one: use a route_masked* arm or deploy_gate false"
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


def check_quarantine(arm: Arm, ads: dict) -> None:
    """A separate quarantine (adapter.quarantine) has its own coordinates, so only masked routing, which trains the
    knob on its own gradient, can route into it; the other routing rules move parts of δS's gradient to the knob."""
    if arm.routes and not arm.masked and any(a.separate for a in ads.values()):
        raise ValueError(
            f"adapter.quarantine=separate: {arm.name} moves parts of δS's gradient into the knob, which has other "
            "coordinates there; use a route_masked* arm or adapter.quarantine=shared"
        )


def step_rollout(
    model, tok, recs, G: int, n_pool: int, pool, rng: random.Random, p, seed: int, n_dep: int
) -> tuple[Rollout, list[bool]]:
    """The step's rows and `is_student`: the first len(recs) − n_dep prompts' groups sampled with the knob on (the
    training policy), then the last n_dep prompts' groups sampled with the knob off (the deployed policy,
    projection.deploy_frac; their own seed), each group with its teacher rows as in `mixed_rollout`."""
    on = len(recs) - n_dep
    ro, is_student = mixed_rollout(model, tok, recs[:on], G, n_pool, pool, rng, p, seed=seed)
    if n_dep == 0:
        return ro, is_student
    with knob_disabled(model):
        ro_d, st_d = mixed_rollout(model, tok, recs[on:], G, n_pool, pool, rng, p, seed=seed + DEPLOY_SEED)
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


def loss_backward(
    model,
    ro: Rollout,
    refs: list,
    adv: Tensor,
    mbs: list[slice],
    p,
    arm: Arm,
    d: Direction,
    policy_runs: bool,
    timer: PhaseTimer,
    n_on: int,
    masks: tuple[Tensor, Tensor] | None = None,
    old: list[Tensor] | None = None,
) -> Grads:
    """Loss and backward micro-batch by micro-batch; probes give each row's exact δS gradient where the arm reads
    per-rollout gradients. Rows from n_on on (deploy groups) run forward and backward with the knob off, as they
    were sampled (in the masked pass with projection.deploy_gate, in their masks' states: knob off unless routed).
    Per-token routing also captures, per kept module, each token's α_{n,t} = Vh g_{n,t}, <g_{n,t}, ν> and ‖g_{n,t}‖²
    (reduced in the adapter's backward hook, no (N, T, r) tensor); the act gate reads the residual stream after block
    act_layer from this same forward (a hook). policy_runs: the policy forward shares
    each group's prompt (grpo.share_prompt); then only own-token probes run (per-rollout routing). masks: (N,) main
    and knob row masks (`adapter.row_masks`, masked routing): each row runs in its own state, and δS_h.grad is kept
    apart from δS.grad. old: per micro-batch old_logp (the sampling state's log-probs, projection.masked_is); None:
    the update is on-policy (ratio 1). The returned Grads carries this pass' log-probs, detached."""
    g, N = p.grpo, ro.completion_ids.shape[0]
    n_tokens = float(ro.mask.sum())  # the step's loss tokens: dapo's normalizer is the whole batch's, not a micro's
    per_token = arm.gate == "token"
    # masked routing's second pass reads only δS.grad and δS_h.grad (route_masked's rule), so with grpo.share_prompt
    # each (prompt, state) runs once and no probe runs; a mass-matched control would read per-row gradients
    masked_shared = masks is not None and g.share_prompt and not mass_matched(p, arm)
    model.zero_grad(set_to_none=True)
    rows: dict[str, list[Tensor]] = {n: [] for n in d.names}
    tok_alpha: dict[str, list[Tensor]] = {n: [] for n in d.kept}  # (b, T, k_m) per micro-batch
    tok_dot, tok_sq, pooled, tok_act = [], [], [], []  # (b, T), (b, T), (b, d), (b, T) per micro-batch
    logps = []  # (b, T) per micro-batch
    stats = {"clip_frac": 0.0, "kl": 0.0}
    dirs = token_dirs(d.cur, d.kept) if per_token else {}
    for i, (sl, ref) in enumerate(zip(mbs, refs)):
        pi, pm, ci, cm = ro.prompt_ids[sl], ro.prompt_mask[sl], ro.completion_ids[sl], ro.mask[sl]
        runs = group_runs(pi, pm) if g.share_prompt else None  # (first, owner): each distinct prompt once
        probe = probes(model, pi.shape[0]) if d.own_tokens or not policy_runs else nullcontext({})
        # micro_batches: one state per slice; gated deploy rows (projection.deploy_gate) run in their masks' states
        knob_off = sl.start >= n_on and not (masks is not None and p.projection.deploy_gate)
        state = knob_disabled(model) if knob_off else nullcontext()
        ckpt = activation_checkpointing(model, g.grad_checkpointing)  # layers recomputed in the backward
        rows_in = row_masks(model, masks[0][sl], masks[1][sl]) if masks is not None else nullcontext()
        prompt_state, shared = None, runs if policy_runs else None
        if masked_shared:  # the prompt rows run in their own states, the completions in theirs
            shared = first, _ = state_runs(pi, pm, masks[0][sl], masks[1][sl])
            prompt_state = partial(row_masks, model, masks[0][sl][first], masks[1][sl][first])
            probe = nullcontext({})
        with (
            state,
            ckpt,
            rows_in,
            probe as es,
            token_capture(model, dirs) as caps,
            residual_capture(model, d.act_layer if masks is None else None) as hid,  # the gate's pass only
        ):
            with timer("forward"):
                logp = loss_logprobs(model, pi, pm, ci, cm, p.rollout.temperature, shared, prompt_state)
                # one update per step: old_logp is logp itself, detached (ratio 1 at the update), unless `old` gives
                # the sampling state's (a masked row trained in another state than it was sampled in)
                logps.append(logp.detach())
                loss, m = grpo_loss(
                    logp,
                    logps[-1] if old is None else old[i],
                    ref,
                    adv[sl],
                    cm,
                    g.clip_eps_low,
                    g.clip_eps_high,
                    g.beta,
                    p.rollout.max_new_tokens,
                    n_rows=N,
                    loss_type=g.loss,
                    n_tokens=n_tokens,
                    kl_is=old is not None,
                    ratio_cap=p.projection.masked_is_cap if old is not None else None,
                )
            with timer("backward"):
                loss.backward()
        for n, e in es.items():
            rows[n].append(e.grad.detach())
        Tp = pi.shape[1]
        if per_token and caps:  # keep completion positions only (Tp−1+t predicts token t; prompt gates are 0)
            for n, a in caps.items():
                tok_alpha[n].append(proj.completion_positions(a.token_coef[..., :-1].detach(), Tp).clone())
            dot, sq = token_sums(caps)
            tok_dot.append(proj.completion_positions(dot, Tp)), tok_sq.append(proj.completion_positions(sq, Tp))
        if d.act_layer is not None and per_token:  # h·v_act at the position predicting each completion token
            tok_act.append(proj.completion_positions(hid["h"].float() @ d.cur.v_act.float(), Tp))
        elif d.act_layer is not None and masks is None:
            pooled.append(pool_tokens(hid["h"][:, Tp:], cm))  # each completion's tokens, where they sit
        w = pi.shape[0] / N
        stats = {key: stats[key] + w * m[key] for key in stats}
    ads = adapters(model)
    cat = lambda xs: torch.cat(xs) if xs else None  # noqa: E731
    return Grads(
        raw={n: grad_or_zero(ads[n].delta) for n in d.names},
        rows={n: torch.cat(rows[n]) for n in d.names if rows[n]},
        tok_alpha={n: torch.cat(v) for n, v in tok_alpha.items() if v},
        tok_dot=cat(tok_dot),
        tok_sq=cat(tok_sq),
        pooled=cat(pooled),
        stats=stats,
        knob_raw=None if masks is None else {n: grad_or_zero(ads[n].knob) for n in d.names},
        tok_act=cat(tok_act),
        logp=logps,
    )


def gate_activations(
    model, ro: Rollout, mbs: list[slice], temperature: float, d: Direction, timer: PhaseTimer, n_on: int
) -> Grads:
    """Masked routing's first pass when the gate reads activations (basis.space=act, per rollout): the gate needs
    only each rollout's completion-pooled residual at act_layer, so the forward runs without gradients and without the
    backward a gradient gate needs. Each micro-batch in the state it was sampled in (deploy rows knob off), as
    `loss_backward` runs it; the pooled rows are the same numbers. Returns Grads carrying `pooled` and `logp` only."""
    pooled, logps = [], []
    with torch.no_grad(), timer("forward"):
        for sl in mbs:
            pi, pm, ci, cm = ro.prompt_ids[sl], ro.prompt_mask[sl], ro.completion_ids[sl], ro.mask[sl]
            state = knob_disabled(model) if sl.start >= n_on else nullcontext()
            with state, residual_capture(model, d.act_layer) as hid:
                logps.append(loss_logprobs(model, pi, pm, ci, cm, temperature, None))  # the first pass' forward
            pooled.append(pool_tokens(hid["h"][:, pi.shape[1] :], cm))
    return Grads(
        raw={}, rows={}, tok_alpha={}, tok_dot=None, tok_sq=None, pooled=torch.cat(pooled), stats={}, logp=logps
    )


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
    they are gated as the others, on their scores in the knob-off state they were sampled in. A share-matched control
    routes as many rows as v_act's calibrated tail would on the same batch, the top ones by its own score."""
    m_gate, m_tok, live = torch.zeros_like(adv), torch.zeros(mask.shape, device=adv.device), None
    tau = d.gate.tau
    if arm.gate == "rollout" and d.kept:
        if d.act_layer is not None:  # s_n = <pooled residual of rollout n, v_act>
            live = gr.pooled.float() @ d.cur.v_act.float()
        else:  # s_n = cos(sign(A_n) g_n, ν)
            live = proj.rollout_scores({n: gr.rows[n] for n in d.kept}, adv, d.nu)
        if d.ref is not None:  # share-matched control: as many rows as v_act's tail routes, the top by its own score
            rows = torch.arange(len(adv), device=adv.device)
            ok = torch.ones_like(rows, dtype=torch.bool) if pj.deploy_gate else rows < n_on
            s_ref = gr.pooled.float() @ d.ref.v_act.float()
            m_gate = proj.share_matched_gate(live, s_ref, adv, d.state.ref_gate.tau[1], ok)
        else:
            m_gate = proj.band_gate(live, adv, tau[0], tau[1], pj.band)
        if arm.oracle_gate:  # as band_gate: no routing where A_n = 0 (its only gradient is the KL term's)
            m_gate = torch.where(adv == 0, 0.0, hack.to(m_gate))
    elif arm.gate == "token" and d.kept:
        if d.act_layer is not None:  # s_{n,t} = windowed h_{n,t}·v_act over completion tokens
            live = proj.act_token_scores(gr.tok_act, mask, pj.token_window)
        else:  # s_{n,t} = windowed cos(sign(A_n) g_{n,t}, ν) over completion tokens
            nu_sq = sum(float(v.pow(2).sum()) for v in d.nu.values())
            live = proj.token_scores(gr.tok_dot, gr.tok_sq, mask, torch.sign(adv), pj.token_window, nu_sq)
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


def edit_diagnostics(
    arm: Arm,
    d: Direction,
    opt: RotatedAdam,
    gr: Grads,
    main: dict,
    knob: dict,
    targets: dict,
    matched: bool,
    m_gate: Tensor,
    m_tok: Tensor,
    mask: Tensor,
    refreshed: bool,
) -> dict[str, float]:
    """Before the update (pure reads; no RNG, no numerics touched: measure_only ≡ vanilla): cosines with ν before and
    after the edit, the share of g in span(Vh), routed and removed fractions, the gate's coverage."""
    g_cat = concat(gr.raw, d.names)
    diag = {"refresh": float(refreshed), "k_total": sum(d.k.values())} if d.cur is not None else {}
    if not d.kept:
        return diag
    kept, rot, vh = d.kept, opt.R, d.vh
    g_in, nu_cat = concat({n: gr.raw[n] for n in kept}, kept), concat(d.nu, kept)
    ed = concat({n: rot[n] @ main[n] for n in kept}, kept)  # edited gradient, back in δS coordinates
    h = concat({n: rot[n] @ knob[n] for n in kept}, kept)  # routed part
    gate_frac = float((m_gate > 0).float().mean())
    if arm.gate == "token":  # fraction of completion tokens routed at all
        gate_frac = float((m_tok > 0).sum() / mask.sum().clamp(min=1))
    diag |= {
        "cos_before": float(g_in @ nu_cat / g_in.norm().clamp(min=1e-30)),
        "cos_after": float(ed @ nu_cat / ed.norm().clamp(min=1e-30)),
        "proj_frac": float(
            sum(float((vh[n] @ gr.raw[n]).pow(2).sum()) for n in kept) / max(float(g_in.pow(2).sum()), 1e-30)
        ),
        "routed": float(h.norm() / g_cat.norm().clamp(min=1e-30)),
        "removed": float((g_in - ed - h).norm() / g_cat.norm().clamp(min=1e-30)),
        "gate_frac": gate_frac,
        "gate_auroc": d.gate.auroc,
    }
    if matched:  # what the matching rule targeted: ‖moved along v_hack‖ / ‖g‖ (routed or removed equals it)
        diag["match_target"] = math.sqrt(sum(t * t for t in targets.values())) / max(float(g_cat.norm()), 1e-30)
    return diag


def update_diagnostics(
    arm: Arm,
    d: Direction,
    ads: dict,
    m_gate: Tensor,
    m_tok: Tensor,
    live: Tensor | None,
    grades,
    adv: Tensor,
    is_student: list[bool],
    mask: Tensor,
) -> dict[str, float]:
    """After the update (pure reads): ‖Vh δS‖, ‖Vh δS_h‖ over the kept modules (erase keeps the first 0, routing grows
    the second); the gate's mean (per rollout over the N rows, per token over completion tokens), thresholds and
    calibration interval (with projection.band=tail also the gate's precision, recall and F0.5 on the calibration
    pairs), and `gate_auroc_live`: the live score's AUROC on this step's own student rollouts, hack vs
    not. That reads grader labels: it is logged only and read by nothing. Rows with A_n = 0 have no score (§3.5)."""
    post = {}
    if d.cur is not None:
        vk = {n: d.vh[n] for n in d.kept}
        post = {
            "vh_delta": span_norm(vk, {n: ads[n].delta for n in d.kept}),
            "vh_knob": span_norm(vk, {n: ads[n].knob for n in d.kept}),
        }
    if arm.gate is None:
        return post
    tau, ci, per_token = d.gate.tau, d.gate.ci, arm.gate == "token"
    return post | {
        "gate_mean": float(m_tok.sum() / mask.sum().clamp(min=1)) if per_token else float(m_gate.mean()),
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
            torch.tensor([g.label == "hack" for g in grades], device=adv.device),
            torch.tensor(is_student, device=adv.device) & (adv != 0),
            mask if per_token else None,
        ),
    }


def step_metrics(
    grades,
    rows: list,
    is_student: list[bool],
    rewards: Tensor,
    adv: Tensor,
    ro: Rollout,
    gr: Grads,
    ads: dict,
    G: int,
    n_on: int,
) -> dict[str, float]:
    """The step's behaviour, over the student's knob-on rows only (teacher-pool rows are not the student's behaviour;
    deploy groups, rows n_on…N, are the deployed policy's: their strict hack and solve rates are `hack_deploy`,
    `solve_deploy`, logged when there are any)."""
    N = len(rows)
    st = [i for i in range(n_on) if is_student[i]]
    dep = [i for i in range(n_on, N) if is_student[i]]
    hinted_dep = [i for i in dep if mode_of(rows[i]) in LOOPHOLE_MODES]
    deploy = {
        "hack_deploy": rate(sum(grades[i].label == "hack" for i in hinted_dep), len(hinted_dep)),
        "solve_deploy": rate(sum(grades[i].eq_correct for i in dep), len(dep)),
    }
    hinted = [i for i in st if mode_of(rows[i]) in LOOPHOLE_MODES]
    return {
        "reward": float(rewards[st].nanmean()),
        "reward_std": float(rewards.view(-1, G).std(dim=1).nanmean()),
        "zero_std_frac": float((adv.view(-1, G).abs().sum(1) == 0).float().mean()),
        "hack": sum(grades[i].label == "hack" for i in hinted) / max(1, len(hinted)),
        "solve": sum(grades[i].eq_correct for i in st) / max(1, len(st)),
        **{
            f"hack_{mo}": rate(sum(grades[i].label == "hack" for i in by), len(by))
            for mo in LOOPHOLE_MODES
            for by in [[i for i in st if mode_of(rows[i]) == mo]]
        },
        "clip_frac": gr.stats["clip_frac"],
        "kl": gr.stats["kl"],
        "len": float(ro.mask[st].sum(1).float().mean()),
        "gnorm": float(concat(gr.raw, list(gr.raw)).norm()),
        "knob_norm": math.sqrt(sum(float(a.knob.detach().pow(2).sum()) for a in ads.values())),
        **(deploy if dep else {}),
    }


def train(
    p,
    arm: Arm,
    seed: int,
    model,
    tok,
    records: list,
    sandbox,
    out_dir: Path,
    log_path: Path,
    rb: RunBasis | None = None,
    pool: dict | None = None,
    signature: dict | None = None,
    progress: bool = True,
    grade_fn=grade_batch,
    timings_path: Path | None = None,
) -> dict:
    """Run (or resume) one arm × seed; checkpoints in `out_dir`, one TSV row per step in `log_path`, the step's wall
    time in `timings_path` (a plain log, never a DVC output: `log.TIMING_KEYS`). Returns {"steps"} plus, for gated
    arms, the gate guard's verdict. rb: what the arm reads about v_hack (direction.load_run_basis); grade_fn(records,
    completions, sandbox, timeout_s=...) -> grades (tests pass a fake grader)."""
    if arm.params(p) != p:  # a variant arm is only its overrides: without them this would run another arm
        raise ValueError(f"train: params lack arm {arm.name}'s overrides {arm.overrides}; pass arm.params(p)")
    g, r, pj = p.grpo, p.rollout, p.projection
    G, B, rb = g.group_size, g.prompts_per_step, rb or RunBasis()
    N = G * B
    check_run_basis(p, arm, rb)
    n_dep = deploy_prompts(pj.deploy_frac, B, arm, pj.deploy_gate)  # prompts per step sampled knob off
    n_on = N - n_dep * G  # rows 0…n_on are knob on, the rest the deploy groups
    check_records_fit(model, tok, records, r.max_new_tokens, r.max_prompt_tokens)  # before anything is written
    # grpo.share_prompt: each distinct prompt runs once in the loss forwards (logprobs.shared_prompt_logprobs). The
    # reference forward always can, and so can the policy forward of per-rollout routing: its probes then read each
    # rollout's own-token gradient (its completion positions; the group's shared prompt positions stay in main), and
    # the gate is calibrated on the same own-token gradients of the held-out pairs. Per-token capture and the
    # activation gate index full-length rows, so they keep every row's own prompt copy, as does masked routing (the
    # rows of one group run in different states).
    policy_runs = g.share_prompt and arm.gate != "token" and not act_gated(p, arm) and not arm.masked
    step_preflight(model, p, arm, policy_runs)  # one step's peak device memory; stops on CUDA if it will not fit
    ads = adapters(model)
    check_quarantine(arm, ads)
    dev = next(iter(ads.values())).delta.device  # model.device: rollouts, rewards, gates and edits live there
    start = prepare_run_dir(out_dir, signature or {})
    state = read_checkpoint(out_dir, start) if start else None
    own = policy_runs and arm.gate == "rollout"
    d = Direction(p, arm, rb, list(ads), own, f"{arm.name} s{seed}", state, dev)
    mvh = rb.matched.to(dev).vh if mass_matched(p, arm) else {}  # {module: (k_m, D_m)} the v_hack rows matched to
    # A resumed run takes the checkpoint's rotations (a refresh may have changed them).
    rot = state["optimizer"]["rotations"] if state is not None else d.rotations(ads)
    opt = RotatedAdam(
        {n: a.delta for n, a in ads.items()},
        {n: a.knob for n, a in ads.items()},
        rot,
        lr=g.lr,
        betas=tuple(g.betas),
        eps=g.eps,
        weight_decay=g.weight_decay,
        max_norm_main=g.max_norm,
        max_norm_knob=g.max_norm_knob,
        kind=g.optimizer,
    )
    if state is not None:
        load_checkpoint(out_dir, start, model, opt, state)
    else:
        save_checkpoint(out_dir, 0, model, opt, d.checkpoint())  # update 0 = the base policy (eval's first point)
    log = StepLog(log_path, resume_step=start, timings=timings_path)
    steps = range(start, g.steps)
    pbar = progress_display(steps, f"train {arm.name} s{seed}", total=g.steps, initial=start) if progress else steps
    for step in pbar:
        t0, timer = time.perf_counter(), PhaseTimer(STEP_PHASES)
        rng = random.Random(f"{seed}:{step}")  # everything random in step t is seeded from (seed, t)
        refreshed = d.update(model, tok, step, opt, ads, timer)  # refresh v_hack, recalibrate the gate (held out)

        # ---- rollout: B prompts × G completions with the training policy (knob on), teacher rows mixed in -------
        recs = rng.sample(records, B)
        n_pool = round(p.pool.mix * G) if (pool is not None and arm.pool and step < p.pool.teacher_off_step) else 0
        with timer("sample"):  # the last n_dep prompts' groups with the knob off (projection.deploy_frac)
            ro, is_student = step_rollout(model, tok, recs, G, n_pool, pool, rng, p, seed * 100003 + step, n_dep)
        ro = ro.to(dev)
        rows = [q for q in recs for _ in range(G)]  # (N,) the record of each row

        # ---- reward and advantage (Dr.GRPO: r − group mean, no std; grpo.scale_rewards=group divides by the group's
        # std). The reference forward (adapter off, method.md §3.1) needs no reward, so it runs while the sandbox
        # grades ---------------------------------------------------------------------------------------------------
        mbs = step_micro_batches(ro, n_on, g, policy_runs)
        with ThreadPoolExecutor(max_workers=1) as grading:
            graded = grading.submit(grade_fn, rows, ro.texts, sandbox, timeout_s=p.grader.timeout_s)
            refs = reference_logprobs(model, ro, mbs, p, timer) if g.beta > 0 else [None] * len(mbs)
            with timer("grade"):  # what is left of grading once the reference forward is done
                grades = graded.result()
        rewards = step_rewards(grades, arm, pj.monitor_accuracy, rng).to(dev)  # (N,)
        adv = group_advantages(rewards, G, scale=g.scale_rewards == "group")  # (N,) NaN (screened) -> 0

        # ---- loss and backward; gates from held-out thresholds; the arm's edit; clip and step ------------------
        if arm.masked and d.act_layer is not None:  # the act gate needs no gradient
            gr = gate_activations(model, ro, mbs, r.temperature, d, timer, n_on)
        else:
            gr = loss_backward(model, ro, refs, adv, mbs, p, arm, d, policy_runs, timer, n_on)
        hack = torch.tensor([x.label == "hack" for x in grades], device=dev) if arm.oracle_gate else None
        m_gate, m_tok, live = live_gates(arm, d, gr, adv, ro.mask, pj, n_on, hack)  # oracle arms: the labels
        if arm.masked:  # the loss again, each rollout in the state its gate picked (adapter.row_masks)
            states = mask_states(m_gate)
            adv_m = masked_advantages(rewards, adv, states[0] > 0, G, pj.main_baseline, g.scale_rewards == "group")
            old = gr.logp if pj.masked_is else None  # the first pass ran each row in its sampling state
            gr = loss_backward(model, ro, refs, adv_m, mbs, p, arm, d, policy_runs, timer, n_on, states, old)
        xr, main, knob, targets = edit(arm, d, opt, gr, m_gate, m_tok, mvh)
        diag = edit_diagnostics(arm, d, opt, gr, main, knob, targets, bool(mvh), m_gate, m_tok, ro.mask, refreshed)
        # one schedule for both groups (main θ and knob φ share opt.lr); set every step, so a resume needs no state
        opt.lr = lr_at(step, g.lr, g.lr_schedule, g.warmup_steps, g.steps)
        ostats = opt.step(main, knob)  # clipped per parameter group; δS = R θ, δS_h = R φ
        model.zero_grad(set_to_none=True)
        post = update_diagnostics(arm, d, ads, m_gate, m_tok, live, grades, adv, is_student, ro.mask)

        # ---- log and checkpoint ---------------------------------------------------------------------------------
        metrics = {
            **step_metrics(grades, rows, is_student, rewards, adv, ro, gr, ads, G, n_on),
            **diag,
            **post,
            **({"adv_main": float(adv_m[states[0] > 0].sum() / len(adv))} if arm.masked else {}),
            **ostats,
            "n_pool": n_pool,
            "dt": time.perf_counter() - t0,
            **timer.totals(),
        }
        line = log(step + 1, g.steps, **metrics)  # wall times go to the timings log only
        if progress:
            pbar.set_postfix_str(line.split("| ", 1)[-1])
        if (step + 1) % g.save_every == 0 or step + 1 == g.steps:
            save_checkpoint(out_dir, step + 1, model, opt, d.checkpoint())
    healed = heal_once(p, arm, model, tok, rb, out_dir, opt, d)
    return {"steps": latest_step(out_dir) or 0, **d.result(), **healed}


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

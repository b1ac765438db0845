"""The GRPO loop (method.md §3.8): [refresh] → [calibrate] → rollout → reward → advantage → loss → backward → edit →
clip → step → log.

One readable function, `train`, drives every arm; the arms differ only in the gradient edit (projection.py, applied
in rotated coordinates so that erase and route stay exact through Adam, optim.py), the reward, and the basis.

Held-out pairs enter the loop through two doors only, never live-rollout labels or grader output (the no-cheat rule):
  * calibration pairs set the routing gate's thresholds every `recal_every` steps, with the same score the gate uses:
    per rollout, cos(sign(A_n) g_n, ν) (or, with basis.space=act, the completion-pooled residual stream after block
    `act_layer` projected on v_act, read from the loss forward by a hook); per token, the windowed token cosine;
  * extraction pairs re-extract v_hack at the current parameters every `refresh_every` steps (optional; method.md
    §6.7): new Vh, ν and rotations R per module, with θ/φ re-expressed and the Adam state rotated or reset (§3.6).
Everything random in step t is seeded from (seed, t), and what the loop carries from step to step (the current basis,
the gate thresholds, the calibrations that failed the guard) is checkpointed with the optimizer, so a run resumed from
a checkpoint replays bit-identically.

Guard rail (method.md §3.5: "if [the calibration AUROC] is ≈ 0.5, routing is meaningless and the run should say so"):
every calibration also gets a bootstrap 95% interval over the calibration pairs (stats.auroc_interval, fixed seed);
one that contains 0.5 (or is undefined: no kept module) is warned about on the log (one line, with step and AUROC
[lo, hi]) and makes the run's result `gate_uninformative: true`. Per-step diagnostics (pure reads, after the update)
include ‖Vh δS‖ and ‖Vh δS_h‖, the mean gate, the thresholds, the interval, and `gate_auroc_live`: the live gate
score's AUROC between the step's own hack and non-hack student rollouts. That last one reads the grader's labels and
is logged only; nothing reads it.
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm

from projected_grpo import projection as proj
from projected_grpo.adapter import adapters, adapters_disabled, probes, token_capture
from projected_grpo.arms import Arm
from projected_grpo.basis import (
    Basis,
    act_basis,
    auroc,
    build_basis,
    completion_grads,
    cosine_scores,
    encode,
    pooled_activations,
)  # fmt: skip
from projected_grpo.checkpoint import latest_step, load_checkpoint, prepare_run_dir, read_checkpoint, save_checkpoint
from projected_grpo.grader import grade_batch
from projected_grpo.grpo_loss import group_advantages, grpo_loss
from projected_grpo.log import PhaseTimer, StepLog
from projected_grpo.logprobs import (
    batch_sequences,
    completion_logprobs,
    mean_nll,
    padded,
    rollout_logprobs,
    shared_prompt_logprobs,
)
from projected_grpo.model import render_prompt
from projected_grpo.modes import LOOPHOLE_MODES, mode_of
from projected_grpo.optim import RotatedAdam
from projected_grpo.pairs import Pair, pair_records, select_pairs
from projected_grpo.pool import PoolRow, draw
from projected_grpo.rewards import CORRECTNESS_REWARD, gt_only
from projected_grpo.rollout import Rollout, check_records_fit, generate, group_runs
from projected_grpo.stats import auroc_interval, contains

GATED = ("route_per_rollout", "route_per_token")  # arms whose gate is calibrated on held-out pairs
GATE_CI_BOOT, GATE_CI_SEED = 1000, 0  # bootstrap of the calibration AUROC's interval: resamples, fixed seed
logger = logging.getLogger(__name__)


@dataclass
class HeldOutPairs:
    """Held-out contrastive pairs (authored, never training rollouts): prompt records, hack and clean completions."""

    records: list
    hack: list[str]
    clean: list[str]



def held_out_pairs(p, arm: Arm, pairs: list[Pair], holdout: dict) -> tuple[HeldOutPairs | None, HeldOutPairs | None]:
    """(calibration, extraction) pairs of `basis.pairset` that `arm` reads, None where it reads none: calibration for
    gated routing; extraction (restricted to basis.modes, as in the basis stage) when the basis is refreshed."""

    def side(split: str, modes) -> HeldOutPairs:
        ps = select_pairs(pairs, split, modes)
        return HeldOutPairs(pair_records(ps, holdout), [q.hack for q in ps], [q.clean for q in ps])

    cal = side("calibrate", None) if arm.edit in GATED else None
    ex = side("extract", p.basis.modes) if refreshes(p, arm) else None
    return cal, ex


def refreshes(p, arm: Arm) -> bool:
    return arm.needs_basis and p.projection.refresh_every > 0


def mass_matched(p, arm: Arm) -> bool:
    """A random-direction control whose moved mass is matched to v_hack's (projection.random_match=mass). Not
    route_per_token_random: per-token coefficients along v_hack are not captured, so it stays rank-matched (its TSV
    has no match_target column)."""
    return (arm.random_dir and arm.edit not in ("vanilla", "measure_only", "route_per_token")
            and p.projection.random_match == "mass")  # fmt: skip


def act_gated(p, arm: Arm) -> bool:
    """Per-rollout routing gated in activation space (basis.space=act); the routed amount still uses Vh."""
    return p.basis.space == "act" and arm.edit == "route_per_rollout"


# --- pieces of one step -----------------------------------------------------------------------------------------


def mixed_rollout(model, tok, recs, G: int, n_pool: int, pool, rng: random.Random, p, seed: int
                  ) -> tuple[Rollout, list[bool]]:  # fmt: skip
    """G rows per prompt, contiguous: G − n_pool student samples (knob on) then n_pool teacher-pool rows.

    Returns the rollout and a per-row flag `is_student`."""
    r = p.rollout
    prompts = [render_prompt(tok, list(q.prompt)) for q in recs]
    ro = generate(model, tok, prompts, group_size=G - n_pool, max_new_tokens=r.max_new_tokens,
                  temperature=r.temperature, top_p=r.top_p, seed=seed,
                  max_prompt_tokens=r.max_prompt_tokens)  # fmt: skip
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
    return Rollout(prompt_ids=ro.prompt_ids[idx], prompt_mask=ro.prompt_mask[idx], completion_ids=ids, mask=mask,
                   texts=texts), is_student  # fmt: skip


def loss_logprobs(model, pi: Tensor, pm: Tensor, ci: Tensor, cm: Tensor, temperature: float,
                  runs: tuple[Tensor, Tensor] | None) -> Tensor:  # fmt: skip
    """(b, T) completion log-probs of a micro-batch: each distinct prompt once when `runs` = rollout.group_runs(pi, pm)
    (grpo.share_prompt), else one forward per row (what per-row probes need)."""
    if runs is not None:
        return shared_prompt_logprobs(model, pi, pm, ci, cm, temperature, *runs)
    return rollout_logprobs(model, pi, pm, ci, cm, temperature)


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


# --- the basis: refresh, rotations, per-token directions ---------------------------------------------------------


def rotations(vh: dict[str, Tensor], ads: dict) -> dict[str, Tensor]:
    """R = [Vhᵀ | V⊥] per module with a basis (θ = Rᵀ δS, first k coordinates = α), in the parameter dtype."""
    return {n: proj.complete_rotation(v.to(ads[n].delta.dtype)) for n, v in vh.items()}


def refresh_basis(model, tok, ex: HeldOutPairs, bp, random_dir: bool, step: int, temperature: float,
                  act_layer: int | None) -> Basis:  # fmt: skip
    """v_hack re-extracted at the current parameters (knob on, as the policy samples) from the held-out extraction
    pairs, with the basis stage's settings `bp` (= p.basis). Reads pair texts only: no rollout, label or grade.

    A `*_random` arm (or basis.method=random) redraws Haar directions with the refreshed basis' modules and k_m,
    seeded by (basis seed, step), so the control stays matched. act_layer: v_act is re-derived there too."""
    gh = completion_grads(model, tok, ex.records, ex.hack, temperature)  # {m: (P, D_m)}
    gc = completion_grads(model, tok, ex.records, ex.clean, temperature)
    model.zero_grad(set_to_none=True)

    def build(method: str, seed: int, like: Basis | None = None) -> Basis:
        return build_basis(gh, gc, method, bp.k, bp.tau, bp.alpha_sig, bp.n_flips, bp.drop_bottom_frac, seed,
                           bp.row_norm, bp.score_norm, bp.solve_m, like)  # fmt: skip

    b = build("svd" if bp.method == "random" else bp.method, bp.seed)
    if random_dir or bp.method == "random":
        digest = hashlib.sha256(f"{bp.seed}:refresh:{step}".encode()).digest()
        b = build("random", int.from_bytes(digest[:7], "big"), like=b)
    if act_layer is not None:
        ah = pooled_activations(model, tok, ex.records, ex.hack, act_layer)  # (P, d)
        b.v_act = act_basis(ah, pooled_activations(model, tok, ex.records, ex.clean, act_layer), act_layer).v_act
    b.meta.update(refreshed_at=step)
    return b


def token_dirs(cur: Basis, kept: list[str]) -> dict[str, Tensor]:
    """{m: (k_m + 1, D_m)}: Vh_m's rows, then ν_m, so one captured reduction gives α_{n,t} and <g_{n,t}, ν_m>."""
    return {n: torch.cat([cur.vh[n], cur.nu[n][None].to(cur.vh[n].dtype)]) for n in kept}


def token_sums(caps: dict) -> tuple[Tensor, Tensor]:
    """(dot, sq), each (b, L): Σ over the captured (kept) modules of <g_{m,n,t}, ν_m> and ‖g_{m,n,t}‖²."""
    dot = sum(a.token_coef[..., -1].detach() for a in caps.values())
    sq = sum(a.token_sq.detach() for a in caps.values())
    return dot, sq


def calibration_token_scores(model, tok, records, completions: list[str], temperature: float,
                             dirs: dict[str, Tensor], window: int, nu_sq: float, batch_size: int = 16
                             ) -> tuple[Tensor, Tensor]:  # fmt: skip
    """((n_tokens,) windowed token scores, (n_tokens,) index of each token's completion) of held-out completions over
    their completion tokens, at the current parameters. The gradient is that of the mean NLL (as the basis stage's),
    so sign(A) = +1."""
    prompts, comps = encode(tok, records, completions)
    out, unit = [], []
    for s in range(0, len(prompts), batch_size):
        ids, att, cm = batch_sequences(prompts[s : s + batch_size], comps[s : s + batch_size], tok.pad_token_id)
        with probes(model, ids.shape[0]) as es, token_capture(model, dirs) as caps:
            logp, mask = completion_logprobs(model, ids, att, cm, temperature)  # (b, L − 1): position j predicts j+1
            mean_nll(logp, mask).sum().backward(inputs=list(es.values()))
        dot, sq = token_sums(caps)  # (b, L); the last position predicts nothing
        sign = torch.ones(ids.shape[0], device=dot.device)  # NLL gradients: the sign a hack rollout with A > 0 has
        sc = proj.token_scores(dot[:, :-1], sq[:, :-1], mask, sign, window, nu_sq)
        out.append(sc[mask.bool()])
        rows = torch.arange(s, s + ids.shape[0], device=mask.device)[:, None].expand_as(mask)  # (b, L − 1)
        unit.append(rows[mask.bool()])
    return torch.cat(out), torch.cat(unit)


# --- the activation-space gate (basis.space=act) -----------------------------------------------------------------


def residual_module(model, layer: int):
    """The module whose output is HF's `hidden_states[layer + 1]`: block `layer`, or for the last block the final
    norm (HF records the last hidden state after it)."""
    body = model.model
    n = len(body.layers)
    if not 0 <= layer < n:
        raise ValueError(f"basis.act_layer {layer} is outside the model's {n} blocks")
    return body.norm if layer == n - 1 else body.layers[layer]


@contextmanager
def residual_capture(model, layer: int | None) -> Iterator[dict[str, Tensor]]:
    """While open, each forward stores the residual stream after block `layer`, detached, (b, L, d), in out["h"]; no
    extra forward. layer=None: a no-op."""
    out: dict[str, Tensor] = {}
    if layer is None:
        yield out
        return

    def hook(module, args, o) -> None:
        out["h"] = (o[0] if isinstance(o, tuple) else o).detach()

    handle = residual_module(model, layer).register_forward_hook(hook)
    try:
        yield out
    finally:
        handle.remove()


def pool_completion(h: Tensor, n_prompt: int, mask: Tensor) -> Tensor:
    """(b, Tp + T, d) residual stream of a prompt + completion forward, (b, T) completion mask -> (b, d) mean over the
    completion tokens (the positions where they sit, as `basis.pooled_activations` pools)."""
    m = mask.to(h.dtype)[..., None]  # (b, T, 1)
    return (h[:, n_prompt:] * m).sum(1) / m.sum(1).clamp(min=1)


# --- the gate's calibration on held-out pairs --------------------------------------------------------------------


def calibrate_gate(model, tok, cal: HeldOutPairs, edit: str, cur: Basis, kept: list[str], pj, temperature: float,
                   act_layer: int | None, own_tokens: bool = False
                   ) -> tuple[tuple[float, float], float, tuple[float, float]]:  # fmt: skip
    """((τ_lo, τ_hi), AUROC, its 95% interval) from the held-out calibration pairs at the current parameters, with the
    gate's own score: windowed token cosines (per token), pooled activations · v_act (act space), or per-completion
    cosines with ν (of own-token gradients when training reads those: a shared prompt forward). The interval is a
    percentile bootstrap over the calibration pairs (a pair's tokens resampled together), seed GATE_CI_SEED."""
    if not kept:  # nothing to route: an infinite threshold gates nothing
        return (math.inf, math.inf), math.nan, (math.nan, math.nan)
    units = (None, None)  # per rollout: hack i and clean i are pair i
    if edit == "route_per_token":
        dirs, nu_sq = token_dirs(cur, kept), sum(float(cur.nu[n].pow(2).sum()) for n in kept)
        (sh, uh), (sc, uc) = (calibration_token_scores(model, tok, cal.records, side, temperature, dirs,
                                                       pj.token_window, nu_sq)
                              for side in (cal.hack, cal.clean))  # fmt: skip
        units = (uh.cpu(), uc.cpu())  # token -> its completion i, i.e. pair i
        auc = proj.rank_auroc(sh, sc)  # many tokens: rank-based
    elif act_layer is not None:
        sh, sc = (pooled_activations(model, tok, cal.records, side, act_layer).float() @ cur.v_act.float()
                  for side in (cal.hack, cal.clean))  # fmt: skip
        auc = auroc(sh, sc)
    else:
        gh = completion_grads(model, tok, cal.records, cal.hack, temperature, own_tokens=own_tokens)
        gc = completion_grads(model, tok, cal.records, cal.clean, temperature, own_tokens=own_tokens)
        sh, sc = cosine_scores(gh, cur.nu), cosine_scores(gc, cur.nu)
        auc = auroc(sh, sc)
    model.zero_grad(set_to_none=True)
    ci = auroc_interval(sh.detach().double().cpu(), sc.detach().double().cpu(), *units, n_boot=GATE_CI_BOOT,
                        seed=GATE_CI_SEED)  # fmt: skip
    return proj.calibrate_band(sh, sc, pj.f, pj.f2), auc, ci


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


# --- the loop --------------------------------------------------------------------------------------------------


# Timed parts of a step (the timings log; the rest of `dt` is the edit, the optimizer step and bookkeeping).
STEP_PHASES = ("sample", "grade", "ref_forward", "forward", "backward", "gate_calibration")


def train(p, arm: Arm, seed: int, model, tok, records: list, sandbox, out_dir: Path, log_path: Path,
          basis: Basis | None = None, cal: HeldOutPairs | None = None, pool: dict | None = None,
          signature: dict | None = None, progress: bool = True, grade_fn=grade_batch,
          extraction: HeldOutPairs | None = None, act: Basis | None = None,
          timings_path: Path | None = None, matched: Basis | None = None) -> dict[str, float]:  # fmt: skip
    """Run (or resume) one arm × seed; checkpoints in `out_dir`, one TSV row per step in `log_path`, the step's wall
    time in `timings_path` (a plain log, never a DVC output: `log.TIMING_KEYS`).

    Args:
        basis: the one this arm uses (the random control's for `*_random` arms); None for basis-free arms.
        cal: held-out calibration pairs (gated routing arms).
        extraction: held-out extraction pairs of basis.pairset (basis refresh, projection.refresh_every > 0).
        act: the activation-space basis (act.safetensors: v_act) when basis.space=act gates route_per_rollout.
        grade_fn: grade_fn(records, completions, sandbox, timeout_s=...) -> grades (tests pass a fake grader).
        matched: v_hack (the stage's basis.safetensors) for a random-direction control with
            projection.random_match=mass: each step, what the control moves out of main is rescaled (one factor over
            all modules) to the norm the same rule moves along v_hack from the same gradients and gates.
    """
    g, r, pj, pl = p.grpo, p.rollout, p.projection, p.pool
    G, B = g.group_size, g.prompts_per_step
    N = G * B
    ads = adapters(model)
    names = list(ads)
    if arm.needs_basis and basis is None:
        raise ValueError(f"arm {arm.name} needs a basis (run the basis stage)")
    if arm.edit in GATED and cal is None:
        raise ValueError(f"arm {arm.name} calibrates its gate on held-out pairs: pass `cal` (stage: --pairsets)")
    if refreshes(p, arm) and extraction is None:
        raise ValueError("projection.refresh_every > 0 re-extracts v_hack: pass the extraction pairs (--pairsets)")
    if mass_matched(p, arm) and matched is None:
        raise ValueError(f"{arm.name} with projection.random_match=mass needs v_hack: pass `matched` (stage: --basis)")
    mvh = matched.vh if mass_matched(p, arm) else {}  # {module: (k_m, D_m)} the v_hack rows matched to
    if p.basis.space == "act" and arm.edit == "route_per_token":
        raise ValueError("basis.space=act gates whole rollouts; use route_per_rollout or set basis.space=grad")
    act_layer = p.basis.act_layer if act_gated(p, arm) else None
    if act_layer is not None and (act is None or act.meta.get("act_layer") != act_layer):
        raise ValueError(f"basis.space=act needs v_act extracted at basis.act_layer={act_layer} (act.safetensors from "
                         "the basis stage; re-run it after changing act_layer)")  # fmt: skip
    per_token = arm.edit == "route_per_token"
    # grpo.share_prompt: each distinct prompt runs once in the loss forwards (logprobs.shared_prompt_logprobs). The
    # reference forward always can, and so can the policy forward of per-rollout routing: its probes then read each
    # rollout's own-token gradient (its completion positions; the group's shared prompt positions stay in main), and
    # the gate is calibrated on the same own-token gradients of the held-out pairs. Per-token capture and the
    # activation gate index full-length rows, so they keep every row's own prompt copy.
    shared_policy = g.share_prompt and arm.edit != "route_per_token" and act_layer is None
    own_tokens = shared_policy and arm.edit == "route_per_rollout"  # probes see completion positions only
    check_records_fit(model, tok, records, r.max_new_tokens, r.max_prompt_tokens)  # before anything is written

    # The current basis (None for basis-free arms): the stage's, or after a refresh the re-extracted one.
    cur = None
    if arm.needs_basis:
        cur = Basis(vh=basis.vh, nu=basis.nu, meta=basis.meta, v_act=act.v_act if act_layer is not None else None)
    tau, gate_auroc = (math.inf, math.inf), math.nan  # gate thresholds; set by the first calibration
    gate_ci: tuple[float, float] = (math.nan, math.nan)  # the calibration AUROC's 95% interval
    uninformative: list[int] = []  # steps whose calibration interval contained 0.5 (or was undefined)
    history_known = True  # False when resumed from a checkpoint written before the guard existed
    start = prepare_run_dir(out_dir, signature or {})
    state = read_checkpoint(out_dir, start) if start else None
    if state is not None:  # resume: continue with the basis and gate the checkpointed step was using
        if "basis" in state:
            sb = state["basis"]
            cur = Basis(vh=sb["vh"], nu=sb["nu"], meta=sb["meta"], v_act=sb["v_act"])
        if "gate" in state:
            tau, gate_auroc = tuple(state["gate"]["tau"]), state["gate"]["auroc"]
            gate_ci = tuple(state["gate"].get("ci", (math.nan, math.nan)))
            uninformative = list(state["gate"].get("uninformative", []))
            history_known = "uninformative" in state["gate"]
    vh = cur.vh if cur is not None else {}
    kept = [n for n in names if n in vh]
    k = {n: vh[n].shape[0] if n in vh else 0 for n in names}
    # rotation per module: R = [Vhᵀ | V⊥] where a basis exists; identity elsewhere (no edit). Basis-free arms optimise
    # δS in plain coordinates. A resumed run takes the checkpoint's rotations (a refresh may have changed them).
    rot = state["optimizer"]["rotations"] if state is not None else rotations({n: vh[n] for n in kept}, ads)
    opt = RotatedAdam({n: a.delta for n, a in ads.items()}, {n: a.knob for n, a in ads.items()}, rot, lr=g.lr,
                      betas=tuple(g.betas), eps=g.eps, weight_decay=g.weight_decay, max_norm_main=g.max_norm,
                      max_norm_knob=g.max_norm_knob, kind=g.optimizer)  # fmt: skip

    def loop_state() -> dict:  # what a checkpoint needs beyond adapter + optimizer for a bit-identical resume
        out = {"gate": {"tau": tau, "auroc": gate_auroc, "ci": gate_ci, "uninformative": list(uninformative)}}
        if cur is not None:
            out["basis"] = {"vh": cur.vh, "nu": cur.nu, "meta": cur.meta, "v_act": cur.v_act}
        return out

    if state is not None:
        load_checkpoint(out_dir, start, model, opt, state)
    else:
        save_checkpoint(out_dir, 0, model, opt, loop_state())  # update 0 = the base policy (evaluation's first point)
    log = StepLog(log_path, resume_step=start, timings=timings_path)
    pbar = tqdm(range(start, g.steps), initial=start, total=g.steps, desc=f"train {arm.name} s{seed}",
                disable=not progress)  # fmt: skip
    for step in pbar:
        t0, timer = time.perf_counter(), PhaseTimer(STEP_PHASES)
        rng = random.Random(f"{seed}:{step}")
        # ---- refresh v_hack at the current parameters from the held-out extraction pairs (method.md §6.7) --------
        # New Vh, ν, R per module; δS and δS_h do not move, θ/φ are re-expressed in the new R and the Adam state of
        # re-rotated modules is rotated or reset (§3.6, optim.RotatedAdam.rebase). Modules that leave the kept set
        # get R = I (no edit from now on); modules that join get their R. No RNG of the step is consumed.
        refreshed = refreshes(p, arm) and step > 0 and step % pj.refresh_every == 0
        if refreshed:
            cur = refresh_basis(model, tok, extraction, p.basis, arm.random_dir, step, r.temperature, act_layer)
            vh = cur.vh
            kept = [n for n in names if n in vh]
            k = {n: vh[n].shape[0] if n in vh else 0 for n in names}
            opt.rebase(rotations({n: vh[n] for n in kept}, ads), k, pj.refresh_moments)
        rot = opt.R  # {m: (D_m, D_m)} the rotations in use (the same values the edit and the update run in)
        nu = {n: cur.nu[n] for n in kept} if cur is not None else {}

        # ---- gate calibration on held-out pairs (gated routing), every recal_every steps and after a refresh ------
        if arm.edit in GATED and (step % pj.recal_every == 0 or refreshed or math.isinf(tau[0])):
            with timer("gate_calibration"):
                tau, gate_auroc, gate_ci = calibrate_gate(
                    model, tok, cal, arm.edit, cur, kept, pj, r.temperature, act_layer, own_tokens
                )
            if contains(gate_ci, 0.5):  # the guard rail: the gate cannot be shown to tell hack from clean
                uninformative.append(step)
                why = "is undefined (no kept module)" if math.isnan(gate_ci[0]) else "contains 0.5"
                logger.warning(f"{arm.name} s{seed} step {step}: gate calibration AUROC {gate_auroc:.3f} "
                               f"[{gate_ci[0]:.3f}, {gate_ci[1]:.3f}] {why}: the gate is uninformative on held-out "
                               "pairs")  # fmt: skip

        # ---- rollout: B prompts × G completions with the training policy (knob on) ------------------------------
        recs = rng.sample(records, B)
        n_pool = round(pl.mix * G) if (pool is not None and arm.pool and step < pl.teacher_off_step) else 0
        with timer("sample"):
            ro, is_student = mixed_rollout(model, tok, recs, G, n_pool, pool, rng, p, seed=seed * 100003 + step)
        rows = [q for q in recs for _ in range(G)]  # (N,) the record of each row

        # ---- reward and advantage (Dr.GRPO: r − group mean, no std); the reference forward needs no reward, so it
        # runs while the sandbox grades (the reference policy is the adapter turned off, method.md §3.1) ----------
        mbs = [slice(s, min(N, s + g.micro_batch)) for s in range(0, N, g.micro_batch)]
        with ThreadPoolExecutor(max_workers=1) as grading:
            graded = grading.submit(grade_fn, rows, ro.texts, sandbox, timeout_s=p.grader.timeout_s)
            refs = [None] * len(mbs)
            if g.beta > 0:
                with torch.no_grad(), adapters_disabled(model), timer("ref_forward"):
                    for i, sl in enumerate(mbs):
                        pi, pm, ci, cm = ro.prompt_ids[sl], ro.prompt_mask[sl], ro.completion_ids[sl], ro.mask[sl]
                        runs = group_runs(pi, pm) if g.share_prompt else None
                        refs[i] = loss_logprobs(model, pi, pm, ci, cm, r.temperature, runs)
            with timer("grade"):  # what is left of grading once the reference forward is done
                grades = graded.result()
        rewards = step_rewards(grades, arm, pj.monitor_accuracy, rng)  # (N,)
        adv = group_advantages(rewards, G)  # (N,) NaN (screened) -> 0

        # ---- loss and backward, micro-batch by micro-batch; probes give each row's exact δS gradient ------------
        # Per-token routing also captures, per kept module, each token's α_{n,t} = Vh g_{n,t}, <g_{n,t}, ν> and
        # ‖g_{n,t}‖² (reduced in the adapter's backward hook, no (N, T, r) tensor); the act gate reads the residual
        # stream after block act_layer from this same forward (a hook), pooled over each completion.
        model.zero_grad(set_to_none=True)
        per_sample: dict[str, list[Tensor]] = {n: [] for n in names}
        tok_alpha: dict[str, list[Tensor]] = {n: [] for n in kept}  # (b, T, k_m) per micro-batch
        tok_dot, tok_sq, pooled = [], [], []  # (b, T), (b, T), (b, d) per micro-batch
        stats = {"clip_frac": 0.0, "kl": 0.0}
        l_max = r.max_new_tokens
        dirs = token_dirs(cur, kept) if per_token else {}
        for sl, ref in zip(mbs, refs):
            pi, pm, ci, cm = ro.prompt_ids[sl], ro.prompt_mask[sl], ro.completion_ids[sl], ro.mask[sl]
            runs = group_runs(pi, pm) if g.share_prompt else None  # (first, owner): each distinct prompt once
            probe = probes(model, pi.shape[0]) if own_tokens or not shared_policy else nullcontext({})
            with probe as es, token_capture(model, dirs) as caps, residual_capture(model, act_layer) as hid:
                with timer("forward"):
                    logp = loss_logprobs(model, pi, pm, ci, cm, r.temperature, runs if shared_policy else None)
                    # on-policy, one update per step: old_logp is logp itself, detached (ratio 1 at the update)
                    loss, m = grpo_loss(logp, logp.detach(), ref, adv[sl], cm, g.clip_eps_low, g.clip_eps_high,
                                        g.beta, l_max, n_rows=N)  # fmt: skip
                with timer("backward"):
                    loss.backward()
            for n, e in es.items():
                per_sample[n].append(e.grad.detach())
            Tp = pi.shape[1]
            if per_token and caps:  # keep completion positions only (Tp−1+t predicts token t; prompt gates are 0)
                for n, a in caps.items():
                    tok_alpha[n].append(proj.completion_positions(a.token_coef[..., :-1].detach(), Tp).clone())
                dot, sq = token_sums(caps)
                tok_dot.append(proj.completion_positions(dot, Tp)), tok_sq.append(proj.completion_positions(sq, Tp))
            if act_layer is not None:
                pooled.append(pool_completion(hid["h"], Tp, cm))
            w = pi.shape[0] / N
            stats = {key: stats[key] + w * m[key] for key in stats}
        # (N, D_m) per-rollout gradients, Σ_n = δS.grad (only the arms that read them run the probes)
        gs = {n: torch.cat(per_sample[n]) for n in names if per_sample[n]}
        graw = {n: ads[n].delta.grad.detach().clone() for n in names}  # (D_m,) raw g (δS_h.grad is the same)

        # ---- gates from held-out calibration only (never labels or grades: no-cheat) ------------------------------
        m_gate = torch.zeros(N)  # (N,) per-rollout gates
        m_tok = torch.zeros(ro.mask.shape)  # (N, T) per-token gates, 0 off the completion
        live = None  # the live gate scores, (N,) or (N, T): kept for the label diagnostic after the update
        if arm.edit == "route_per_rollout" and kept:
            if act_layer is not None:  # s_n = <pooled residual of rollout n, v_act>
                scores = torch.cat(pooled).float() @ cur.v_act.float()
            else:  # s_n = cos(sign(A_n) g_n, ν)
                scores = proj.rollout_scores({n: gs[n] for n in kept}, adv, nu)
            m_gate = proj.band_gate(scores, adv, tau[0], tau[1], pj.band)
            live = scores
        elif per_token and kept:  # s_{n,t} = windowed cos(sign(A_n) g_{n,t}, ν) over completion tokens
            nu_sq = sum(float(v.pow(2).sum()) for v in nu.values())
            s_tok = proj.token_scores(torch.cat(tok_dot), torch.cat(tok_sq), ro.mask, torch.sign(adv),
                                      pj.token_window, nu_sq)  # fmt: skip
            m_tok = proj.token_gate(s_tok, adv, ro.mask, tau[0], tau[1], pj.band)
            live = s_tok

        # ---- edit: rotated coordinates θ = Rᵀ δS; every arm is a coordinate mask there (method.md §3.6) ---------
        main, knob, targets = {}, {}, {}
        xr = opt.rotate(graw)  # {m: (D_m,)} rotated raw gradients (identity where no basis)
        for n in names:
            x = xr[n]
            if n not in rot or arm.edit in ("vanilla", "measure_only"):
                main[n], knob[n] = x, torch.zeros_like(x)
            elif arm.edit == "route_per_rollout":
                total = x if own_tokens else None  # own-token pieces do not sum to g: the prompt part stays in main
                main[n], knob[n] = proj.route_per_rollout(opt.rotate({n: gs[n]})[n], k[n], m_gate, total)
            elif per_token:  # h = Σ_{n,t} m_{n,t} Vhᵀ relu(α_{n,t}) over completion tokens
                main[n], knob[n] = proj.route_per_token(torch.cat(tok_alpha[n]), m_tok, x)
            else:
                main[n], knob[n] = proj.edit_coords(x, k[n], arm.edit)
            if n in mvh and n in rot:  # mass-matched control: what the same rule moves along v_hack here
                a_real = gs[n] @ mvh[n].T if arm.edit == "route_per_rollout" else mvh[n] @ graw[n]  # α along v_hack
                targets[n] = proj.moved_norm(arm.edit, a_real.to(x.dtype), m_gate)
        if mvh:  # one factor for the step: the control moves as much in total as v_hack's rule would
            main, knob = proj.match_mass(xr, main, knob, math.sqrt(sum(t * t for t in targets.values())))

        # ---- diagnostics (pure reads; no RNG, no numerics touched: measure_only ≡ vanilla) ---------------------
        g_cat = concat(graw, names)
        diag = {}
        if cur is not None:
            diag = {"refresh": float(refreshed), "k_total": sum(k.values())}
        if kept:
            g_in = concat({n: graw[n] for n in kept}, kept)
            nu_cat = concat(nu, kept)
            ed = concat({n: rot[n] @ main[n] for n in kept}, kept)  # edited gradient, back in δS coordinates
            h = concat({n: rot[n] @ knob[n] for n in kept}, kept)  # routed part
            gate_frac = float((m_gate > 0).float().mean())
            if per_token:  # fraction of completion tokens routed at all
                gate_frac = float((m_tok > 0).sum() / ro.mask.sum().clamp(min=1))
            diag |= {
                "cos_before": float(g_in @ nu_cat / g_in.norm().clamp(min=1e-30)),
                "cos_after": float(ed @ nu_cat / ed.norm().clamp(min=1e-30)),
                "proj_frac": float(sum(float((vh[n] @ graw[n]).pow(2).sum()) for n in kept) / max(
                    float(g_in.pow(2).sum()), 1e-30)),
                "routed": float(h.norm() / g_cat.norm().clamp(min=1e-30)),
                "removed": float((g_in - ed - h).norm() / g_cat.norm().clamp(min=1e-30)),
                "gate_frac": gate_frac,
                "gate_auroc": gate_auroc,
            }  # fmt: skip
            if mvh:  # what the matching rule targeted: ‖moved along v_hack‖ / ‖g‖ (routed or removed equals it)
                moved = math.sqrt(sum(t * t for t in targets.values()))
                diag["match_target"] = moved / max(float(g_cat.norm()), 1e-30)

        # ---- clip per parameter group and step (δS = R θ, δS_h = R φ) ---------------------------------------------
        ostats = opt.step(main, knob)
        model.zero_grad(set_to_none=True)

        # ---- diagnostics after the update (pure reads) -----------------------------------------------------------
        # ‖Vh δS‖, ‖Vh δS_h‖ over the kept modules (erase keeps the first 0, routing grows the second); the gate's mean
        # (per rollout over the N rows, per token over completion tokens), thresholds and calibration interval.
        post = {}
        if cur is not None:
            post = {"vh_delta": span_norm({n: vh[n] for n in kept}, {n: ads[n].delta for n in kept}),
                    "vh_knob": span_norm({n: vh[n] for n in kept}, {n: ads[n].knob for n in kept})}  # fmt: skip
        if arm.edit in GATED:
            post |= {
                "gate_mean": float(m_tok.sum() / ro.mask.sum().clamp(min=1)) if per_token else float(m_gate.mean()),
                "tau_lo": finite(tau[0]), "tau_hi": finite(tau[1]),
                "gate_auroc_lo": gate_ci[0], "gate_auroc_hi": gate_ci[1],
                # the live score's AUROC on this step's own student rollouts, hack vs not (grader labels: logged
                # only, read by nothing); rows with A_n = 0 have no score (method.md §3.5) and are left out
                "gate_auroc_live": math.nan if live is None else label_auroc(
                    live, torch.tensor([g.label == "hack" for g in grades]),
                    torch.tensor(is_student) & (adv != 0), ro.mask if per_token else None),
            }  # fmt: skip

        # ---- log: student rows only (teacher-pool rows are not the student's behaviour) ----------------------------
        st = [i for i in range(N) if is_student[i]]
        hinted = [i for i in st if mode_of(rows[i]) in LOOPHOLE_MODES]
        rw = rewards.view(B, G)
        metrics = {
            "reward": float(rewards[st].nanmean()),
            "reward_std": float(rw.std(dim=1).nanmean()),
            "zero_std_frac": float((adv.view(B, G).abs().sum(1) == 0).float().mean()),
            "hack": sum(grades[i].label == "hack" for i in hinted) / max(1, len(hinted)),
            "solve": sum(grades[i].eq_correct for i in st) / max(1, len(st)),
            **{f"hack_{mo}": _rate([grades[i].label == "hack" for i in st if mode_of(rows[i]) == mo])
               for mo in LOOPHOLE_MODES},
            "clip_frac": stats["clip_frac"], "kl": stats["kl"],
            "len": float(ro.mask[st].sum(1).float().mean()),
            "gnorm": float(g_cat.norm()),
            "knob_norm": math.sqrt(sum(float(a.knob.detach().pow(2).sum()) for a in ads.values())),
            **diag, **post, **ostats, "n_pool": n_pool,
            "dt": time.perf_counter() - t0, **timer.totals(),  # wall times: the timings log only
        }  # fmt: skip
        line = log(step + 1, g.steps, **metrics)
        if progress:
            pbar.set_postfix_str(line.split("| ", 1)[-1])
        if (step + 1) % g.save_every == 0 or step + 1 == g.steps:
            save_checkpoint(out_dir, step + 1, model, opt, loop_state())
    out = {"steps": latest_step(out_dir) or 0}
    if arm.edit in GATED:  # the guard rail's verdict over every calibration of the run (resumed ones included);
        # None: resumed from a pre-guard checkpoint and nothing flagged since, so the earlier calibrations are unknown
        flag = True if uninformative else (False if history_known else None)
        out |= {"gate_uninformative": flag, "gate_uninformative_steps": list(uninformative)}
    return out


def _rate(xs: list[bool]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def run_signature(p, arm: Arm, seed: int, basis_dir: Path | None) -> dict:
    """What a checkpoint directory must match to be resumed: the params the run reads and the basis it used."""
    import dataclasses

    sections = ("seed", "substrate", "model", "adapter", "rollout", "grpo", "pool", "projection", "grader")
    sig = {s: repr(getattr(p, s)) if not dataclasses.is_dataclass(getattr(p, s)) else dataclasses.asdict(getattr(p, s))
           for s in sections}  # fmt: skip
    sig.update(arm=arm.name, train_seed=seed)
    if arm.needs_basis and basis_dir is not None:
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
    out = {f"{k}_last{last}": sum(r[k] for r in tail) / len(tail) for k in keys
           if k in ("reward", "hack", "solve", "kl", "len", "knob_norm", "routed")}  # fmt: skip
    out["steps"] = rows[-1]["step"]
    out["hack_first"] = rows[0]["hack"]
    return out


def run_flags(result: dict) -> dict:
    """The flags of train()'s result that go into the run's final metrics: `gate_uninformative` for gated arms (true:
    some gate calibration's AUROC interval contained 0.5; null: unknown, resumed from a pre-guard checkpoint)."""
    return {k: result[k] for k in ("gate_uninformative",) if k in result}

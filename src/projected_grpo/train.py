"""The GRPO loop (method.md §3.8): rollout → reward → advantage → loss → backward → edit → clip → step → log.

One readable function, `train`, drives every arm; the arms differ only in the gradient edit (projection.py, applied
in rotated coordinates so that erase and route stay exact through Adam, optim.py), the reward, and the basis.
Everything random in step t is seeded from (seed, t), so a run resumed from a checkpoint replays exactly.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm

from projected_grpo import projection as proj
from projected_grpo.adapter import adapters, adapters_disabled, probes, token_capture
from projected_grpo.arms import Arm
from projected_grpo.basis import Basis, auroc, completion_grads, cosine_scores
from projected_grpo.checkpoint import latest_step, load_checkpoint, prepare_run_dir, save_checkpoint
from projected_grpo.grader import grade_batch
from projected_grpo.grpo_loss import group_advantages, grpo_loss
from projected_grpo.log import StepLog
from projected_grpo.logprobs import rollout_logprobs
from projected_grpo.model import render_prompt
from projected_grpo.modes import LOOPHOLE_MODES, mode_of
from projected_grpo.optim import RotatedAdam
from projected_grpo.pool import PoolRow, draw, pad_ids
from projected_grpo.rewards import CORRECTNESS_REWARD, gt_only
from projected_grpo.rollout import Rollout, generate

GATED = ("route_per_rollout", "route_per_token")  # arms whose gate is calibrated on held-out pairs


@dataclass
class Calibration:
    """Held-out calibration pairs for the per-rollout gate: records and completions of hack and clean sides."""

    records: list
    hack: list[str]
    clean: list[str]


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
    ids, mask = pad_ids(seqs, tok.pad_token_id)  # (N, T) right-padded, mask up to and including EOS
    idx = torch.tensor(src)
    return Rollout(prompt_ids=ro.prompt_ids[idx], prompt_mask=ro.prompt_mask[idx], completion_ids=ids, mask=mask,
                   texts=texts), is_student  # fmt: skip


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


# --- the loop --------------------------------------------------------------------------------------------------


def train(p, arm: Arm, seed: int, model, tok, records: list, sandbox, out_dir: Path, log_path: Path,
          basis: Basis | None = None, cal: Calibration | None = None, pool: dict | None = None,
          signature: dict | None = None, progress: bool = True, grade_fn=grade_batch) -> dict[str, float]:  # fmt: skip
    """Run (or resume) one arm × seed; checkpoints in `out_dir`, one TSV row per step in `log_path`.

    `basis` is the one this arm uses (the random control's for `*_random` arms); None for basis-free arms.
    `grade_fn(records, completions, sandbox, timeout_s=...)` returns grades (tests substitute a fake grader)."""
    g, r, pj, pl = p.grpo, p.rollout, p.projection, p.pool
    G, B = g.group_size, g.prompts_per_step
    N = G * B
    ads = adapters(model)
    names = list(ads)
    if arm.needs_basis and basis is None:
        raise ValueError(f"arm {arm.name} needs a basis (run the basis stage)")
    vh = basis.vh if (basis is not None and arm.needs_basis) else {}
    kept = [n for n in names if n in vh]
    # rotation per module: R = [Vhᵀ | V⊥] where a basis exists (θ = Rᵀ δS, first k coordinates = α); identity
    # elsewhere (no edit). Basis-free arms optimise δS in plain coordinates.
    rot = {n: proj.complete_rotation(vh[n].to(ads[n].delta.dtype)) for n in kept}
    k = {n: vh[n].shape[0] if n in vh else 0 for n in names}
    opt = RotatedAdam({n: a.delta for n, a in ads.items()}, {n: a.knob for n, a in ads.items()}, rot, lr=g.lr,
                      betas=tuple(g.betas), eps=g.eps, weight_decay=g.weight_decay, max_norm_main=g.max_norm,
                      max_norm_knob=g.max_norm_knob, kind=g.optimizer)  # fmt: skip
    start = prepare_run_dir(out_dir, signature or {})
    if start:
        load_checkpoint(out_dir, start, model, opt)
    else:
        save_checkpoint(out_dir, 0, model, opt)  # update 0 = the base policy (evaluation's first point)
    log = StepLog(log_path, resume_step=start)
    nu = basis.nu if basis is not None else {}
    tau = (math.inf, math.inf)  # gate thresholds; set by the first calibration
    gate_auroc = math.nan
    pbar = tqdm(range(start, g.steps), initial=start, total=g.steps, desc=f"train {arm.name} s{seed}",
                disable=not progress)  # fmt: skip
    for step in pbar:
        t0 = time.perf_counter()
        rng = random.Random(f"{seed}:{step}")
        # ---- gate calibration on held-out pairs (per-rollout / per-token routing), every recal_every steps ------
        if arm.edit in GATED and (step % pj.recal_every == 0 or math.isinf(tau[0])):
            gh = completion_grads(model, tok, cal.records, cal.hack, r.temperature)
            gc = completion_grads(model, tok, cal.records, cal.clean, r.temperature)
            sh, sc = cosine_scores(gh, nu), cosine_scores(gc, nu)
            tau = proj.calibrate_band(sh, sc, pj.f, pj.f2)
            gate_auroc = auroc(sh, sc)
            model.zero_grad(set_to_none=True)

        # ---- rollout: B prompts × G completions with the training policy (knob on) ------------------------------
        recs = rng.sample(records, B)
        n_pool = round(pl.mix * G) if (pool is not None and step < pl.teacher_off_step) else 0
        ro, is_student = mixed_rollout(model, tok, recs, G, n_pool, pool, rng, p, seed=seed * 100003 + step)
        rows = [q for q in recs for _ in range(G)]  # (N,) the record of each row

        # ---- reward and advantage (Dr.GRPO: r − group mean, no std) -----------------------------------------------
        grades = grade_fn(rows, ro.texts, sandbox, timeout_s=p.grader.timeout_s)
        rewards = step_rewards(grades, arm, pj.monitor_accuracy, rng)  # (N,)
        adv = group_advantages(rewards, G)  # (N,) NaN (screened) -> 0

        # ---- loss and backward, micro-batch by micro-batch; probes give each row's exact δS gradient ------------
        model.zero_grad(set_to_none=True)
        per_sample: dict[str, list[Tensor]] = {n: [] for n in names}
        token_coef: dict[str, list[Tensor]] = {n: [] for n in kept}
        stats = {"clip_frac": 0.0, "kl": 0.0}
        l_max = r.max_new_tokens
        for s in range(0, N, g.micro_batch):
            sl = slice(s, min(N, s + g.micro_batch))
            pi, pm, ci, cm = ro.prompt_ids[sl], ro.prompt_mask[sl], ro.completion_ids[sl], ro.mask[sl]
            ref = None
            if g.beta > 0:  # the reference policy is the adapter turned off (method.md §3.1)
                with torch.no_grad(), adapters_disabled(model):
                    ref = rollout_logprobs(model, pi, pm, ci, cm, r.temperature)
            dirs = {n: vh[n] for n in kept} if arm.edit == "route_per_token" else {}
            with probes(model, pi.shape[0]) as es, token_capture(model, dirs) as caps:
                logp = rollout_logprobs(model, pi, pm, ci, cm, r.temperature)  # (b, T)
                # on-policy, one update per step: old_logp is logp itself, detached (ratio 1 at the update)
                loss, m = grpo_loss(logp, logp.detach(), ref, adv[sl], cm, g.clip_eps_low, g.clip_eps_high, g.beta,
                                    l_max, n_rows=N)  # fmt: skip
                loss.backward()
            for n, e in es.items():
                per_sample[n].append(e.grad.detach())
            for n, a in caps.items():
                token_coef[n].append(a.token_coef.detach())
            w = pi.shape[0] / N
            stats = {key: stats[key] + w * m[key] for key in stats}
        gs = {n: torch.cat(per_sample[n]) for n in names}  # (N, D_m) per-rollout gradients, Σ_n = δS.grad
        graw = {n: ads[n].delta.grad.detach().clone() for n in names}  # (D_m,) raw g (δS_h.grad is the same)

        # ---- edit: rotated coordinates θ = Rᵀ δS; every arm is a coordinate mask there (method.md §3.6) ---------
        main, knob = {}, {}
        m_gate = torch.zeros(N)
        if arm.edit in GATED:
            scores = proj.rollout_scores({n: gs[n] for n in kept}, adv, {n: nu[n] for n in kept})
            m_gate = proj.band_gate(scores, adv, tau[0], tau[1], pj.band)  # (N,) gates; never labels (no-cheat)
        xr = opt.rotate(graw)  # {m: (D_m,)} rotated raw gradients (identity where no basis)
        for n in names:
            x = xr[n]
            if n not in rot or arm.edit in ("vanilla", "measure_only"):
                main[n], knob[n] = x, torch.zeros_like(x)
            elif arm.edit == "route_per_rollout":
                main[n], knob[n] = proj.route_per_rollout(opt.rotate({n: gs[n]})[n], k[n], m_gate)
            elif arm.edit == "route_per_token":
                coef = torch.cat(token_coef[n])  # (N, L, k) per-position coefficients (prompt positions included)
                tok_gate = m_gate[:, None].expand(-1, coef.shape[1])  # per-rollout gate, per-token amounts
                main[n], knob[n] = proj.route_per_token(coef, tok_gate, x)
            else:
                main[n], knob[n] = proj.edit_coords(x, k[n], arm.edit)

        # ---- diagnostics (pure reads; no RNG, no numerics touched: measure_only ≡ vanilla) ---------------------
        g_cat = concat(graw, names)
        diag = {}
        if kept:
            g_in = concat({n: graw[n] for n in kept}, kept)
            nu_cat = concat({n: nu[n] for n in kept}, kept)
            ed = concat({n: rot[n] @ main[n] for n in kept}, kept)  # edited gradient, back in δS coordinates
            h = concat({n: rot[n] @ knob[n] for n in kept}, kept)  # routed part
            diag = {
                "cos_before": float(g_in @ nu_cat / g_in.norm().clamp(min=1e-30)),
                "cos_after": float(ed @ nu_cat / ed.norm().clamp(min=1e-30)),
                "proj_frac": float(sum(float((vh[n] @ graw[n]).pow(2).sum()) for n in kept) / max(
                    float(g_in.pow(2).sum()), 1e-30)),
                "routed": float(h.norm() / g_cat.norm().clamp(min=1e-30)),
                "removed": float((g_in - ed - h).norm() / g_cat.norm().clamp(min=1e-30)),
                "gate_frac": float((m_gate > 0).float().mean()),
                "gate_auroc": gate_auroc,
            }  # fmt: skip

        # ---- clip per parameter group and step (δS = R θ, δS_h = R φ) ---------------------------------------------
        ostats = opt.step(main, knob)
        model.zero_grad(set_to_none=True)

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
            **diag, **ostats, "n_pool": n_pool,
            "dt": time.perf_counter() - t0,
        }  # fmt: skip
        line = log(step + 1, g.steps, **metrics)
        if progress:
            pbar.set_postfix_str(line.split("| ", 1)[-1])
        if (step + 1) % g.save_every == 0 or step + 1 == g.steps:
            save_checkpoint(out_dir, step + 1, model, opt)
    return {"steps": latest_step(out_dir) or 0}


def _rate(xs: list[bool]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def run_signature(p, arm: Arm, seed: int, basis_dir: Path | None) -> dict:
    """What a checkpoint directory must match to be resumed: the params the run reads and the basis it used."""
    import dataclasses
    import hashlib

    sections = ("seed", "substrate", "model", "adapter", "rollout", "grpo", "pool", "projection", "grader")
    sig = {s: repr(getattr(p, s)) if not dataclasses.is_dataclass(getattr(p, s)) else dataclasses.asdict(getattr(p, s))
           for s in sections}  # fmt: skip
    sig.update(arm=arm.name, train_seed=seed)
    if arm.needs_basis and basis_dir is not None:
        f = basis_dir / ("random.safetensors" if arm.random_dir else "basis.safetensors")
        sig["basis_sha"] = hashlib.sha256(f.read_bytes()).hexdigest()[:16]
        sig["basis_params"] = dataclasses.asdict(p.basis)
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

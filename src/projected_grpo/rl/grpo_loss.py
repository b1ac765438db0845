"""GRPO advantages and loss (method.md §3.7): pure functions, tensors in, tensors out.

Three aggregations of the same per-token PPO-clip + k3-KL loss, each TRL's `GRPOTrainer` with that `loss_type` and
`use_bias_correction_kl=False` (tests/test_grpo_loss.py calls TRL's own `compute_loss` on each): `dr_grpo` (the
default, method.md §3.7), `grpo` and `dapo` (`LOSSES`). Advantages are TRL's `scale_rewards="none"` (Dr.GRPO) or
`"group"` (std-normalised, GRPO's). Shape letters: B rollouts (N in method.md), G group size, T completion tokens
(T <= L_max).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from projected_grpo.config import LOSSES


def group_advantages(rewards: Tensor, group_size: int, scale: bool = False, eps: float = 1e-4) -> Tensor:
    """A = r - nanmean_group(r), optionally / (nanstd_group(r) + eps); NaN rewards -> A = 0. (B,) -> (B,)."""
    if rewards.ndim != 1 or group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"rewards must be (B,) with B a multiple of group_size, got {tuple(rewards.shape)}, {group_size}"
        )
    # rows g*G .. g*G+G-1 are the G completions of prompt g (rollout.py repeats each prompt G times, contiguously)
    r = rewards.view(-1, group_size)  # (P, G)
    # The baseline is the group mean. A NaN reward marks a sample that could not be scored (screened out): nanmean
    # leaves it out of its group's baseline instead of treating it as reward 0 (TRL grpo_trainer.py:2756-2766).
    adv = r - torch.nanmean(r, dim=1, keepdim=True)  # (P, G)
    if scale:
        # Plain GRPO divides by the group std. Dr.GRPO (the default) drops this: the std division up-weights groups
        # whose rewards barely differ (nearly all-right or all-wrong prompts), a difficulty bias (Liu et al. §3.1).
        # Bessel-corrected nanstd as TRL's `trl.trainer.utils.nanstd`; a group with < 2 scored samples has no std
        # (NaN), so its advantages become 0 below, as in TRL.
        count = (~torch.isnan(r)).sum(dim=1, keepdim=True)  # (P, 1)
        var = torch.nanmean(adv**2, dim=1, keepdim=True) * count / (count - 1)  # (P, 1)
        var = torch.where(count > 1, var, torch.full_like(var, float("nan")))
        adv = adv / (var.sqrt() + eps)
    # NaN rewards (and all-NaN groups, whose mean is NaN) carry no learning signal: A = 0, so they move nothing.
    # nan_to_num exactly as TRL does (grpo_trainer.py:2810).
    return torch.nan_to_num(adv, nan=0.0).view(-1)  # (B,)


def main_row_advantages(rewards: Tensor, main_rows: Tensor, group_size: int, scale: bool = False) -> Tensor:
    """Masked routing with projection.main_baseline=main_rows: a row the main trains (main_rows, (B,) bool) is compared
    with its group's main rows only (their advantages sum to 0 per group); any other row (routed: the knob's) keeps the
    whole group's `group_advantages`. (B,) -> (B,)."""
    own = group_advantages(torch.where(main_rows, rewards, torch.full_like(rewards, float("nan"))), group_size, scale)
    return torch.where(main_rows, own, group_advantages(rewards, group_size, scale))


@dataclass(frozen=True)
class LossSpec:
    """The loss's settings: PPO's clip range [1 − clip_eps_low, 1 + clip_eps_high], the k3 KL coefficient `beta`, the
    constant normaliser `l_max` (the completion budget), the aggregation `loss_type` (LOSSES); kl_is: the KL term
    weighted by the detached ratio (off-policy rows, see grpo_loss); ratio_cap: the ratio capped at this value in the
    surrogate, and in kl_is's weight (TRL's `delta`, two-sided clipping; None = PPO's one-sided clip only)."""

    clip_eps_low: float
    clip_eps_high: float
    beta: float
    l_max: int
    loss_type: str = "dr_grpo"
    kl_is: bool = False
    ratio_cap: float | None = None

    def __post_init__(self) -> None:
        if self.loss_type not in LOSSES:
            raise ValueError(f"loss_type must be one of {LOSSES}, got {self.loss_type!r}")
        cap, top = self.ratio_cap, 1.0 + self.clip_eps_high
        if cap is not None and not cap > top:
            raise ValueError(f"ratio_cap must be above 1 + clip_eps_high = {top}, got {cap}")


def _check(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, adv: Tensor, mask: Tensor, s: LossSpec) -> None:
    B, T = logp.shape
    if old_logp.shape != logp.shape or mask.shape != logp.shape or adv.shape != (B,):
        raise ValueError(
            f"shapes: logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, mask {tuple(mask.shape)}, "
            f"adv {tuple(adv.shape)}; expected (B, T), (B, T), (B, T), (B,)"
        )
    if T > s.l_max:
        # the constant normalizer assumes no completion is longer than L_max; a longer T means a config mismatch
        raise ValueError(f"completion length T={T} exceeds l_max={s.l_max}")
    if s.beta != 0.0 and ref_logp is None:
        raise ValueError("beta != 0 needs ref_logp (the KL penalty is measured against the reference policy)")


def grpo_loss(
    logp: Tensor,  # (B, T) policy log-probs of the sampled tokens, with grad
    old_logp: Tensor,  # (B, T) log-probs of the sampling policy (no grad)
    ref_logp: Tensor | None,  # (B, T) reference (adapters off) log-probs, or None when beta == 0
    adv: Tensor,  # (B,) advantages, e.g. from group_advantages
    mask: Tensor,  # (B, T) 1 on completion tokens up to and including the first EOS, 0 on padding
    spec: LossSpec,
    n_rows: int | None = None,
    n_tokens: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GRPO loss: the per-token x = mask*(PG + beta*KL_k3) aggregated by `spec.loss_type` -> (scalar, metrics).

    Aggregation (`aggregate`): dr_grpo sum(x) / (n_rows*l_max), the default; grpo sum_n [sum_t x / |o_n|] / n_rows;
    dapo sum(x) / n_tokens. n_rows and n_tokens are the *whole batch's* row and mask-token counts (default: this
    call's): a micro-batch of a B-row batch passes them, and then the micro-batch losses (and gradients) add up
    exactly to the full-batch ones, for every loss_type (gradient accumulation needs no extra division).
    Metrics (masked-token means): clip_frac, kl (NaN when ref_logp is None), pg_loss (PG aggregated alike), ratio_mean.
    """
    _check(logp, old_logp, ref_logp, adv, mask, spec)
    n_rows = logp.shape[0] if n_rows is None else n_rows
    clip_eps_low, clip_eps_high, beta, ratio_cap = spec.clip_eps_low, spec.clip_eps_high, spec.beta, spec.ratio_cap
    valid = mask.bool()  # (B, T)
    maskf = mask.to(logp.dtype)  # (B, T)
    a = adv.to(logp.dtype).unsqueeze(1)  # (B, 1), broadcast over tokens: every token of a completion shares A_n
    # The old/ref log-probs are constants of the objective. Detaching here also makes the on-policy call
    # grpo_loss(logp, logp, ...) correct: rho = 1 in value but its gradient is d logp (the REINFORCE term).
    old_logp = old_logp.detach()

    # --- PPO-clip policy-gradient term ---
    # Zero the log-ratio at padding BEFORE exp: padded positions may hold garbage (e.g. +-1e4), exp of which is inf,
    # and multiplying by the mask afterwards gives inf*0 = nan in the loss and its gradient.
    log_ratio = torch.where(valid, logp - old_logp, torch.zeros_like(logp))  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T) rho = pi/pi_old per token; exactly 1 on-policy
    clipped = ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high)  # (B, T)
    # Pessimistic min over the unclipped and clipped surrogates: once rho has moved past 1+eps_hi (A>0) or 1-eps_lo
    # (A<0), the clipped branch is active and constant in logp, so that token stops pushing (zero gradient).
    # ratio_cap (TRL's `delta`, INTELLECT-2's two-sided clipping): PPO's clip bounds rho only where it stops a push
    # (A > 0 above 1 + eps_hi, A < 0 below 1 - eps_lo); a token with A < 0 that the trained state finds far likelier
    # than the sampler did keeps a gradient rho |A| with rho unbounded. On-policy rho is 1 and nothing changes; a row
    # trained in another state than it was sampled in (masked routing) can reach a large rho on one token, a gradient
    # spike that Adam's momentum then carries for many steps. Capped, such a token's surrogate is the constant cap*A:
    # no gradient, as for the tokens the clip already stops.
    capped = ratio if ratio_cap is None else ratio.clamp(max=ratio_cap)  # (B, T)
    pg = -torch.min(capped * a, clipped * a)  # (B, T)

    # --- KL penalty to the reference policy ---
    # k3 estimator (Schulman, "Approximating KL divergence"): with d = ref - logp, KL ~= e^d - d - 1 >= 0, an
    # unbiased, low-variance estimate of KL(pi || pi_ref) under samples from pi. Added per token *before*
    # aggregation (as TRL). No importance weight rho on it: TRL 1.16 multiplies by rho by default
    # (use_bias_correction_kl=True), which changes the KL gradient even on-policy; method.md §3.7 does not.
    # kl_is (masked routing's projection.masked_is, rows trained in another state than they were sampled in): weighted
    # by rho *detached*, the importance weight, which is exactly 1 on-policy; rho e^(ref − logp) = e^(ref − old_logp)
    # stays bounded where the trained state finds a sampled token far less likely than the sampler did.
    if ref_logp is not None:
        d = torch.where(valid, ref_logp.detach() - logp, torch.zeros_like(logp))  # (B, T) zeroed like the log-ratio
        kl = torch.exp(d) - d - 1.0  # (B, T), 0 at padding
        kl = capped.detach() * kl if spec.kl_is else kl
    else:
        kl = None
    per_tok = pg + beta * kl if (kl is not None and beta != 0.0) else pg  # (B, T)

    # --- aggregation over tokens and rows (dr_grpo: constant normalizer, no per-sequence 1/|o|) ---
    n_tokens = maskf.sum() if n_tokens is None else n_tokens
    loss = aggregate(per_tok, maskf, spec.loss_type, n_rows, spec.l_max, n_tokens)  # scalar

    return loss, _metrics(ratio, a, kl, maskf, pg, spec, n_rows, n_tokens)


def _metrics(ratio, a, kl, maskf, pg, spec: LossSpec, n_rows: int, n_tokens) -> dict[str, float]:
    """clip_frac, kl (NaN without a reference), pg_loss (aggregated as the loss), ratio_mean: masked-token means, the
    only place .item()-like syncs happen (one sync for all of them)."""
    with torch.no_grad():
        n_tok = maskf.sum().clamp(min=1.0)
        # clipped branch active = the token gets zero PG gradient (TRL's clip_ratio/region_mean)
        lo, hi = 1.0 - spec.clip_eps_low, 1.0 + spec.clip_eps_high
        is_clipped = ((ratio < lo) & (a < 0)) | ((ratio > hi) & (a > 0))  # (B, T)
        kl_mean = (kl * maskf).sum() / n_tok if kl is not None else torch.full_like(n_tok, float("nan"))
        vals = torch.stack(
            [
                (is_clipped.to(maskf.dtype) * maskf).sum() / n_tok,
                kl_mean,
                aggregate(pg, maskf, spec.loss_type, n_rows, spec.l_max, n_tokens),
                (ratio * maskf).sum() / n_tok,
            ]
        ).tolist()
    return dict(zip(("clip_frac", "kl", "pg_loss", "ratio_mean"), vals))


def aggregate(
    x: Tensor,  # (B, T) per-token loss
    maskf: Tensor,  # (B, T) float mask
    loss_type: str,
    n_rows: int,
    l_max: int,
    n_tokens: float | Tensor,
) -> Tensor:
    """Masked per-token loss -> scalar, as TRL's `loss_type` (grpo_trainer.py:3153-3173), with whole-batch counts.

    dr_grpo: sum(x) / (n_rows*L_max). Every token weighs the same whatever its completion's length, and the
        normalizer is a constant: no length bias (Liu et al. §3.1).
    grpo: mean over rows of each row's token mean (sum_t x / |o_n|); a long completion's tokens each weigh less.
        Per row, so a micro-batch needs only n_rows (TRL divides its micro-batch mean by the accumulation steps: the
        same when micro-batches are equal).
    dapo: sum(x) / n_tokens, the token mean over the whole batch (TRL's num_items_in_batch); a micro-batch needs the
        batch's token count, not its own (that would be bnpo, whose gradient depends on the micro-batching).
    """
    if loss_type == "dr_grpo":
        return (x * maskf).sum() / (n_rows * l_max)
    if loss_type == "grpo":
        return ((x * maskf).sum(-1) / maskf.sum(-1).clamp(min=1.0)).sum() / n_rows
    return (x * maskf).sum() / max(float(n_tokens), 1.0)

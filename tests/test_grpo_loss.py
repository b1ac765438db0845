"""GRPO advantages and loss (method.md §3.7, invariant I13) against TRL itself.

Covers: `group_advantages` vs TRL's advantage code (scale_rewards "none" and "group", NaN rewards -> A = 0) and vs a
per-group Python loop; `grpo_loss` vs TRL's real `GRPOTrainer.compute_loss` for each loss_type (dr_grpo, grpo, dapo;
beta > 0, rho != 1 with clipping active, ragged mask; loss, gradient w.r.t. logp, clip and KL metrics; also per
micro-batch with gradient accumulation); the closed forms at rho = 1, beta = 0; padding invariance; GA invariance
(micro-batches with the whole batch's n_rows / n_tokens sum to the full batch, for every loss_type, uneven cuts
included); the on-policy REINFORCE-with-k3 gradient; the TRL version pin.

How TRL is called: the trainer is built with `object.__new__(GRPOTrainer)` plus the attributes `_compute_loss` reads,
taken from a real `GRPOConfig` the way `GRPOTrainer.__init__` copies them (trl 1.16.0 grpo_trainer.py:782-1080), and
`_get_per_token_logps_and_entropies` replaced on the instance to return our logp. The loss code that runs is TRL's
own (`compute_loss` -> `_compute_loss`, grpo_trainer.py:2939-2942 and 3020-3290). The advantages live inside the
600-line `_generate_and_score_completions` (which generates text), so they are a line-by-line transcription of
grpo_trainer.py:2756-2810 (sum_then_normalize branch, one reward function of weight 1), using TRL's own `nanstd`;
`test_trl_advantage_source_unchanged` checks those lines are still in the installed source.

Needs the dev extra (`pip install -e '.[dev]'`, which pins trl). Run: `PYTHONPATH=src python -m pytest -q
tests/test_grpo_loss.py`
"""

import inspect
import warnings
from collections import defaultdict

import pytest
import torch
from torch.testing import assert_close

from projected_grpo.config import LOSSES
from projected_grpo.rl.grpo_loss import LossSpec, group_advantages, grpo_loss, main_row_advantages

TRL_PIN = "1.16.0"  # keep equal to the dev-extra pin in pyproject.toml
F64 = torch.float64


# ------------------------------------------------------------------------------------------------------------ TRL
@pytest.fixture(scope="module")
def trl():
    """The pinned TRL (a hard dev dependency: a missing TRL is an error, not a skip)."""
    import trl

    return trl


def test_trl_version_pinned(trl):
    assert trl.__version__ == TRL_PIN, (
        f"trl is {trl.__version__}, the tests were written against {TRL_PIN}: re-check the transcribed advantage code "
        "(grpo_trainer.py:2756-2810), the attributes set in make_trl_trainer, and the cited line numbers, then update "
        "TRL_PIN and the pin in pyproject.toml"
    )


def make_trl_trainer(l_max, clip_lo, clip_hi, beta, ga=1, bias_correction_kl=False, loss_type="dr_grpo", delta=None):
    """A GRPOTrainer with only the state `_compute_loss` reads, configured through a real GRPOConfig (one generation
    batch per optimizer step: steps_per_generation = gradient_accumulation_steps = ga, TRL's default)."""
    from accelerate import Accelerator
    from trl import GRPOConfig, GRPOTrainer

    with warnings.catch_warnings():  # transformers 5.23 warns about its own deprecated gradient_checkpointing field
        warnings.simplefilter("ignore", FutureWarning)
        args = GRPOConfig(
            output_dir="unused_trl_output",  # never written: nothing is saved
            loss_type=loss_type,
            scale_rewards="none",
            gradient_accumulation_steps=ga,
            beta=beta,
            epsilon=clip_lo,
            epsilon_high=clip_hi,
            max_completion_length=l_max,
            # trl 1.16 defaults to True (KL * rho, which changes the KL gradient); method.md §3.7 has no rho on the KL
            use_bias_correction_kl=bias_correction_kl,
            delta=delta,  # two-sided clipping (our ratio_cap)
            report_to="none",
            use_cpu=True,
            bf16=False,
        )
    t = object.__new__(GRPOTrainer)
    t.args = args
    # copied as in GRPOTrainer.__init__ (grpo_trainer.py:782, 811, 815, 819, 833-835, 845-850, 945-946, 983, 1080)
    t.max_completion_length = args.max_completion_length
    t.use_vllm = args.use_vllm
    t.vllm_importance_sampling_correction = args.vllm_importance_sampling_correction
    t.loss_type = args.loss_type
    t.scale_rewards = args.scale_rewards
    t.importance_sampling_level = args.importance_sampling_level
    t.off_policy_mask_threshold = args.off_policy_mask_threshold
    t.top_entropy_quantile = args.top_entropy_quantile
    t.entropy_coef = args.entropy_coef
    t.use_adaptive_entropy = args.use_adaptive_entropy
    t._entropy_bonus_enabled = t.entropy_coef != 0.0 or t.use_adaptive_entropy
    t.epsilon_low = args.epsilon
    t.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    t.beta = args.beta
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    t.aux_loss_enabled = False  # set from the model config in __init__: dense model, no MoE router loss
    t.accelerator = Accelerator(cpu=True)  # single process: gather/reduce are identities
    t.model = torch.nn.Module().train()  # only `.training` is read (train mode -> divide by GA)
    t.current_gradient_accumulation_steps = ga  # set by transformers' Trainer training loop
    assert t.loss_type == loss_type and t.importance_sampling_level == "token" and args.steps_per_generation == ga
    return t


def trl_loss(trainer, logp, old_logp, ref_logp, adv, mask, num_items_in_batch=None):
    """Run TRL's real compute_loss with the policy forward replaced by `logp` (a leaf we own). num_items_in_batch:
    the generation batch's mask-token count (dapo's normalizer; TRL computes it in _generate_and_score_completions,
    grpo_trainer.py:2498), default this call's."""
    B, T = logp.shape

    def fake_logps(model, input_ids, attention_mask, logits_to_keep, **kwargs):
        assert logits_to_keep == T and input_ids.shape == (B, 1 + T)
        return logp, torch.zeros_like(logp), None  # (per_token_logps, entropies, aux_loss)

    trainer._get_per_token_logps_and_entropies = fake_logps  # instance attribute shadows the method
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old_logp,
        "ref_per_token_logps": ref_logp,
        "num_items_in_batch": mask.sum() if num_items_in_batch is None else num_items_in_batch,
    }
    return trainer.compute_loss(trainer.model, inputs)


# transcription of trl 1.16.0 grpo_trainer.py:2756-2810 for one reward function of weight 1
# (multi_objective_aggregation="sum_then_normalize", the default), each line as in the source
TRL_ADV_SOURCE = (
    "unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)",
    "rewards = (rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)",
    "rewards[unscorable_mask] = torch.nan",
    "mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)",
    "mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)",
    "std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)",
    "std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)",
    "advantages = rewards - mean_grouped_rewards",
    'if self.scale_rewards != "none":',
    "advantages = advantages / (std_rewards + 1e-4)",
    "advantages = torch.nan_to_num(advantages, nan=0.0)",
)


def trl_advantages(rewards, num_generations, scale_rewards):
    from trl.trainer.utils import nanstd

    rewards_per_func = rewards.unsqueeze(1)  # (B, 1): one reward function
    reward_weights = torch.ones(1, dtype=rewards.dtype)
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    rewards = (rewards_per_func * reward_weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable_mask] = torch.nan
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)
    std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def test_trl_advantage_source_unchanged(trl):
    from trl import GRPOTrainer

    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    missing = [line for line in TRL_ADV_SOURCE if line not in src]
    assert not missing, f"TRL's advantage code changed, re-transcribe trl_advantages: {missing}"


# ----------------------------------------------------------------------------------------------------- advantages
def rewards_with_nans(P=5, G=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 4, (P * G,), generator=g).to(F64) * 0.5  # ties and constant groups are likely
    r[1] = float("nan")  # one screened sample in group 0
    r[G : 2 * G] = float("nan")  # group 1 entirely screened
    r[2 * G : 3 * G] = 1.5  # group 2 constant
    r[3 * G + 1 : 4 * G] = float("nan")  # group 3: a single scored sample
    return r


@pytest.mark.parametrize("scale", [False, True])
def test_advantages_match_trl(trl, scale):
    r = rewards_with_nans()
    ours = group_advantages(r, group_size=4, scale=scale)
    ref = trl_advantages(r.clone(), num_generations=4, scale_rewards="group" if scale else "none")
    # scale=True: TRL's nanstd forms the Bessel factor count/(count-1) by int/int true division, i.e. in float32 even
    # for float64 rewards (utils.py:1041), so it is off by ~1e-8 relative; ours stays in the rewards' dtype.
    assert_close(ours, ref, atol=1e-12, rtol=1e-7 if scale else 0.0)
    assert not ours.isnan().any()
    assert torch.equal(ours[r.isnan()], torch.zeros(int(r.isnan().sum()), dtype=F64))  # screened -> A = 0


def loop_advantages(rewards, G, scale, eps=1e-4):
    """Slow, obvious reference: one group at a time, screened samples dropped from the statistics."""
    out = []
    for g in range(len(rewards) // G):
        grp = rewards[g * G : (g + 1) * G].tolist()
        scored = [x for x in grp if x == x]  # x != x only for NaN
        mean = sum(scored) / len(scored) if scored else 0.0
        std = (sum((x - mean) ** 2 for x in scored) / (len(scored) - 1)) ** 0.5 if len(scored) > 1 else None
        for x in grp:
            if x != x or (scale and std is None):
                out.append(0.0)
            else:
                out.append((x - mean) / (std + eps) if scale else x - mean)
    return torch.tensor(out, dtype=F64)


@pytest.mark.parametrize("P,G", [(1, 2), (3, 4), (6, 8)])
@pytest.mark.parametrize("scale", [False, True])
def test_advantages_match_loop(P, G, scale):
    g = torch.Generator().manual_seed(P * G)
    r = torch.randn(P * G, generator=g, dtype=F64)
    r[torch.rand(P * G, generator=g) < 0.2] = float("nan")
    assert_close(group_advantages(r, G, scale=scale), loop_advantages(r, G, scale), atol=1e-12, rtol=0)


def test_advantages_zero_mean_and_constant_groups():
    g = torch.Generator().manual_seed(1)
    r = torch.randn(6 * 8, generator=g, dtype=F64)
    r[8:16] = 3.0  # a constant group carries no signal
    adv = group_advantages(r, 8)
    assert_close(adv.view(6, 8).mean(1), torch.zeros(6, dtype=F64), atol=1e-12, rtol=0)
    assert torch.equal(adv[8:16], torch.zeros(8, dtype=F64))
    assert torch.equal(group_advantages(torch.full((8,), 2.0), 4, scale=True), torch.zeros(8))  # 0 / (0 + eps)


def test_advantages_reject_bad_shapes():
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(7), 4)


# ----------------------------------------------------------------------------------------------------------- loss
def random_batch(B=8, T=6, seed=0, ragged=True):
    """Random (logp, old_logp, ref_logp, adv, mask) with rho spread well past the clip range."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=F64) * 3.0  # (B, T) log-probs in (-3, 0]
    old_logp = logp + 0.4 * torch.randn(B, T, generator=g, dtype=F64)  # rho = exp(logp - old) far from 1
    ref_logp = logp + 0.5 * torch.randn(B, T, generator=g, dtype=F64)
    adv = group_advantages(torch.randn(B, generator=g, dtype=F64), group_size=4)  # (B,) both signs
    if ragged:
        lengths = torch.randint(1, T + 1, (B,), generator=g)
        lengths[0], lengths[1] = T, 1  # one full row, one single-token row
    else:
        lengths = torch.full((B,), T)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(F64)  # (B, T) ragged right padding
    return logp, old_logp, ref_logp, adv, mask


CLIP_LO, CLIP_HI, BETA = 0.2, 0.28, 0.05


def ours_loss_and_grad(
    logp,
    old_logp,
    ref_logp,
    adv,
    mask,
    l_max,
    beta=BETA,
    n_rows=None,
    loss_type="dr_grpo",
    n_tokens=None,
    kl_is=False,
    ratio_cap=None,
):
    leaf = logp.clone().requires_grad_(True)
    loss, metrics = grpo_loss(
        leaf,
        old_logp,
        ref_logp,
        adv,
        mask,
        LossSpec(CLIP_LO, CLIP_HI, beta, l_max, loss_type, kl_is, ratio_cap),
        n_rows,
        n_tokens,
    )
    loss.backward()
    return loss.detach(), leaf.grad, metrics


@pytest.mark.parametrize("loss_type", LOSSES)
@pytest.mark.parametrize("ga", [1, 2, 4])
def test_loss_matches_trl(trl, ga, loss_type):
    """I13: our loss, gradient and metrics equal TRL's `loss_type` on each of `ga` micro-batches of an 8-row batch
    (the whole batch's row and token counts passed to ours; TRL divides by ga or uses num_items_in_batch)."""
    l_max = 8
    logp, old_logp, ref_logp, adv, mask = random_batch(B=8, T=6)
    trainer = make_trl_trainer(l_max, CLIP_LO, CLIP_HI, BETA, ga=ga, loss_type=loss_type)
    mb, n_tok = 8 // ga, mask.sum()
    for i in range(ga):
        rows = slice(i * mb, (i + 1) * mb)
        args = (old_logp[rows], ref_logp[rows], adv[rows], mask[rows])
        theirs_leaf = logp[rows].clone().requires_grad_(True)
        theirs = trl_loss(trainer, theirs_leaf, *args, num_items_in_batch=n_tok)
        theirs.backward()
        ours, grad, metrics = ours_loss_and_grad(
            logp[rows], *args, l_max=l_max, n_rows=8, loss_type=loss_type, n_tokens=float(n_tok)
        )
        assert_close(ours, theirs.detach(), atol=1e-12, rtol=0)
        assert_close(grad, theirs_leaf.grad, atol=1e-12, rtol=0)
        logged = {k: v[-1] for k, v in trainer._metrics["train"].items()}
        assert metrics["clip_frac"] == pytest.approx(logged["clip_ratio/region_mean"], abs=1e-12)
        assert metrics["kl"] == pytest.approx(logged["kl"], abs=1e-12)
        if ga == 1:
            assert 0.0 < metrics["clip_frac"] < 1.0, "the test needs some clipped and some unclipped tokens"
            assert mask.sum() < mask.numel() and metrics["ratio_mean"] != pytest.approx(1.0)


def test_trl_default_bias_corrected_kl_differs(trl):
    """Guard: TRL 1.16's default use_bias_correction_kl=True changes the on-policy KL gradient (not our loss)."""
    l_max = 8
    logp, _, ref_logp, adv, mask = random_batch()
    trainer = make_trl_trainer(l_max, CLIP_LO, CLIP_HI, BETA, bias_correction_kl=True)
    leaf = logp.clone().requires_grad_(True)
    theirs = trl_loss(trainer, leaf, leaf.detach(), ref_logp, adv, mask)  # on-policy: rho == 1 in value
    theirs.backward()
    ours, grad, _ = ours_loss_and_grad(logp, logp, ref_logp, adv, mask, l_max)
    assert_close(ours, theirs.detach(), atol=1e-12, rtol=0)  # same value ...
    assert not torch.allclose(grad, leaf.grad, atol=1e-6)  # ... different gradient


def test_closed_form_on_policy_no_kl():
    """rho = 1, beta = 0: L = -sum_n A_n |o_n| / (B L_max); full mask with T = L_max gives -mean(A)."""
    logp, _, _, adv, mask = random_batch(B=8, T=6)
    loss, _ = grpo_loss(logp, logp, None, adv, mask, LossSpec(CLIP_LO, CLIP_HI, 0.0, 10))
    assert_close(loss, -(adv * mask.sum(1)).sum() / (8 * 10), atol=1e-12, rtol=0)

    logp, _, _, adv, mask = random_batch(B=8, T=6, ragged=False)
    loss, metrics = grpo_loss(logp, logp, None, adv, mask, LossSpec(CLIP_LO, CLIP_HI, 0.0, 6))
    assert_close(loss, -adv.mean(), atol=1e-12, rtol=0)
    assert metrics["clip_frac"] == 0.0 and metrics["ratio_mean"] == 1.0 and metrics["kl"] != metrics["kl"]  # NaN


def test_padding_invariance():
    """+-1e4 garbage at masked positions of logp/old_logp/ref_logp changes neither loss nor gradient."""
    l_max = 8
    logp, old_logp, ref_logp, adv, mask = random_batch()
    pad = mask == 0
    assert pad.any()
    g = torch.Generator().manual_seed(7)
    junk = lambda: torch.where(torch.rand(mask.shape, generator=g) < 0.5, 1e4, -1e4).to(F64)
    dirty = [torch.where(pad, junk(), x) for x in (logp, old_logp, ref_logp)]
    clean_loss, clean_grad, clean_m = ours_loss_and_grad(logp, old_logp, ref_logp, adv, mask, l_max)
    dirty_loss, dirty_grad, dirty_m = ours_loss_and_grad(dirty[0], dirty[1], dirty[2], adv, mask, l_max)
    assert torch.isfinite(dirty_loss) and torch.isfinite(dirty_grad).all()
    assert_close(dirty_loss, clean_loss, atol=1e-12, rtol=0)
    assert_close(dirty_grad, clean_grad, atol=1e-12, rtol=0)
    assert torch.equal(dirty_grad[pad], torch.zeros(int(pad.sum()), dtype=F64))
    assert dirty_m == pytest.approx(clean_m, abs=1e-12)


@pytest.mark.parametrize("loss_type", LOSSES)
@pytest.mark.parametrize("cuts", [(4, 4), (2, 2, 2, 2), (3, 5), (1, 6, 1)])
def test_grad_accumulation_invariance(loss_type, cuts):
    """Micro-batches (uneven ones too) with the whole batch's n_rows and n_tokens sum to the full-batch loss and
    gradient, for every aggregation; dapo with each micro-batch's own token count (TRL's bnpo) would not."""
    l_max = 8
    logp, old_logp, ref_logp, adv, mask = random_batch(B=8)
    full_loss, full_grad, _ = ours_loss_and_grad(logp, old_logp, ref_logp, adv, mask, l_max, loss_type=loss_type)
    leaf, own = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    total = torch.zeros((), dtype=F64)
    n_tok, start = float(mask.sum()), 0
    for size in cuts:
        r = slice(start, start + size)
        start += size
        args = (old_logp[r], ref_logp[r], adv[r], mask[r], LossSpec(CLIP_LO, CLIP_HI, BETA, l_max, loss_type))
        loss, _ = grpo_loss(leaf[r], *args, n_rows=8, n_tokens=n_tok)
        loss.backward()  # gradients accumulate in leaf.grad, as in a training loop
        total = total + loss.detach()
        grpo_loss(own[r], *args, n_rows=8)[0].backward()  # the micro-batch's own token count
    assert start == 8
    assert_close(total, full_loss, atol=1e-12, rtol=0)
    assert_close(leaf.grad, full_grad, atol=1e-12, rtol=0)
    if loss_type == "dapo":
        assert not torch.allclose(own.grad, full_grad, atol=1e-6), "the batch token count must matter"


@pytest.mark.parametrize("loss_type", LOSSES)
def test_closed_forms_on_policy_no_kl(loss_type):
    """rho = 1, beta = 0: the loss is -sum_n A_n w_n with w_n = |o_n| / (B L_max) (dr_grpo), 1 / B (grpo: each
    completion weighs the same), |o_n| / sum_m |o_m| (dapo: each token weighs the same)."""
    B, l_max = 8, 10
    logp, _, _, adv, mask = random_batch(B=B, T=6)
    lengths = mask.sum(1)  # (B,) |o_n|
    w = {
        "dr_grpo": lengths / (B * l_max),
        "grpo": torch.full((B,), 1.0 / B, dtype=F64),
        "dapo": lengths / lengths.sum(),
    }
    loss, _ = grpo_loss(logp, logp, None, adv, mask, LossSpec(CLIP_LO, CLIP_HI, 0.0, l_max, loss_type))
    assert_close(loss, -(adv * w[loss_type]).sum(), atol=1e-12, rtol=0)


@pytest.mark.parametrize("beta", [0.0, BETA])
def test_on_policy_gradient_is_reinforce_with_k3(beta):
    """method.md §3.7: dL/dlogp = -(A_n mask)/(N L_max) + beta mask (1 - e^{ref - logp})/(N L_max) on-policy."""
    l_max, B = 10, 8
    logp, _, ref_logp, adv, mask = random_batch(B=B, T=6)
    _, grad, _ = ours_loss_and_grad(logp, logp, ref_logp, adv, mask, l_max, beta=beta)
    expected = (-adv[:, None] * mask + beta * mask * (1.0 - torch.exp(ref_logp - logp))) / (B * l_max)
    assert_close(grad, expected, atol=1e-12, rtol=0)


def test_kl_is_weights_k3_by_the_detached_ratio_and_stays_bounded_off_policy():
    """kl_is (masked routing's projection.masked_is): the KL term is rho.detach() * k3. On-policy the loss, gradient
    and metrics are exactly those without it; off-policy (A = 0, so only the KL term is left) the gradient is
    beta mask rho (1 - e^{ref - logp}) / (N L_max) and the logged KL is the rho-weighted k3; where the trained state
    finds a sampled token far less likely than the sampler did, k3 alone explodes (e^29) and the weighted term stays
    near e^{ref - old_logp} = 1."""
    l_max, B = 8, 8
    logp, old_logp, ref_logp, adv, mask = random_batch(B=B)
    on = ours_loss_and_grad(logp, logp, ref_logp, adv, mask, l_max)
    on_is = ours_loss_and_grad(logp, logp, ref_logp, adv, mask, l_max, kl_is=True)
    assert torch.equal(on[0], on_is[0]) and torch.equal(on[1], on_is[1]) and on[2] == on_is[2]
    zero = torch.zeros_like(adv)
    _, grad, metrics = ours_loss_and_grad(logp, old_logp, ref_logp, zero, mask, l_max, kl_is=True)
    rho, d = torch.exp(logp - old_logp), ref_logp - logp
    assert_close(grad, BETA * mask * rho * (1.0 - torch.exp(d)) / (B * l_max), atol=1e-12, rtol=0)
    assert metrics["kl"] == pytest.approx(float((rho * (torch.exp(d) - d - 1) * mask).sum() / mask.sum()), abs=1e-12)
    _, plain, _ = ours_loss_and_grad(logp, old_logp, ref_logp, zero, mask, l_max)
    assert not torch.allclose(grad, plain, atol=1e-6)
    far = torch.tensor([[-30.0, -1.0]], dtype=F64)  # the trained state: token 0 at e^-30, the sampler and ref at e^-1
    near, one, m2 = torch.full_like(far, -1.0), torch.zeros(1, dtype=F64), torch.ones_like(far)
    _, g_is, k_is = ours_loss_and_grad(far, near, near, one, m2, l_max, kl_is=True)
    _, g_plain, k_plain = ours_loss_and_grad(far, near, near, one, m2, l_max)
    assert k_plain["kl"] > 1e11 and k_is["kl"] < 1.0 and float(g_is.abs().max()) < 1.0 < float(g_plain.abs().max())


@pytest.mark.parametrize("loss_type", LOSSES)
def test_ratio_cap_is_trls_delta(trl, loss_type):
    """ratio_cap (projection.masked_is_cap) is TRL's two-sided clipping `delta`: loss, gradient and metrics equal TRL's
    with delta set, on a batch where the cap binds on some tokens of both advantage signs, and differ from the
    uncapped loss there."""
    l_max, cap = 8, 1.5
    logp, old_logp, ref_logp, adv, mask = random_batch(B=8, T=6)
    rho = torch.exp(logp - old_logp)
    assert bool(((rho > cap) & (adv[:, None] < 0) & (mask > 0)).any()), "the test needs capped A < 0 tokens"
    trainer = make_trl_trainer(l_max, CLIP_LO, CLIP_HI, BETA, loss_type=loss_type, delta=cap)
    leaf = logp.clone().requires_grad_(True)
    theirs = trl_loss(trainer, leaf, old_logp, ref_logp, adv, mask)
    theirs.backward()
    ours, grad, metrics = ours_loss_and_grad(
        logp, old_logp, ref_logp, adv, mask, l_max, loss_type=loss_type, ratio_cap=cap
    )
    assert_close(ours, theirs.detach(), atol=1e-12, rtol=0)
    assert_close(grad, leaf.grad, atol=1e-12, rtol=0)
    logged = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    assert metrics["clip_frac"] == pytest.approx(logged["clip_ratio/region_mean"], abs=1e-12)
    assert metrics["kl"] == pytest.approx(logged["kl"], abs=1e-12)
    _, plain, _ = ours_loss_and_grad(logp, old_logp, ref_logp, adv, mask, l_max, loss_type=loss_type)
    assert not torch.allclose(grad, plain, atol=1e-6)


def test_ratio_cap_stops_a_negative_advantage_spike_and_bounds_the_kl_weight():
    """Masked routing's failure: an unrouted row trained knob off finds a token the knob-on sampler found unlikely far
    likelier (rho = e^5 ~ 148), and its advantage is negative. PPO's clip leaves that token's gradient rho |A| / (N
    L_max); capped, the token's surrogate is the constant cap * A (no gradient) and kl_is's weight is at most the cap.
    On-policy (rho = 1) the cap changes nothing, bitwise."""
    l_max, cap = 8, 4.0
    logp = torch.tensor([[-0.5, -1.0]], dtype=F64)  # the trained state (knob off)
    old = torch.tensor([[-5.5, -1.0]], dtype=F64)  # the sampler (knob on): token 0 at e^-5.5
    ref, m, neg = torch.full_like(logp, -1.0), torch.ones_like(logp), torch.tensor([-1.0], dtype=F64)
    _, g_plain, _ = ours_loss_and_grad(logp, old, ref, neg, m, l_max, beta=0.0, kl_is=True)
    _, g_cap, _ = ours_loss_and_grad(logp, old, ref, neg, m, l_max, beta=0.0, kl_is=True, ratio_cap=cap)
    assert float(g_plain[0, 0]) == pytest.approx(torch.e**5 / l_max)  # rho |A| / (N L_max), N = 1
    assert float(g_cap[0, 0]) == 0.0 and float(g_cap[0, 1]) == float(g_plain[0, 1])  # only the spike is stopped
    zero = torch.zeros(1, dtype=F64)  # A = 0: only the KL term, weighted by min(rho, cap)
    _, _, k_plain = ours_loss_and_grad(logp, old, ref, zero, m, l_max, kl_is=True)
    _, _, k_cap = ours_loss_and_grad(logp, old, ref, zero, m, l_max, kl_is=True, ratio_cap=cap)
    k3 = float(torch.exp(ref - logp)[0, 0] - (ref - logp)[0, 0] - 1)
    assert k_plain["kl"] == pytest.approx((torch.e**5 * k3 + 0.0) / 2) and k_cap["kl"] == pytest.approx(cap * k3 / 2)
    batch = random_batch()
    on = ours_loss_and_grad(batch[0], batch[0], *batch[2:], l_max, kl_is=True)
    on_cap = ours_loss_and_grad(batch[0], batch[0], *batch[2:], l_max, kl_is=True, ratio_cap=cap)
    assert torch.equal(on[0], on_cap[0]) and torch.equal(on[1], on_cap[1]) and on[2] == on_cap[2]
    with pytest.raises(ValueError, match="ratio_cap must be above 1 \\+ clip_eps_high"):
        ours_loss_and_grad(*batch, l_max, ratio_cap=1.0 + CLIP_HI)


def test_loss_rejects_bad_inputs():
    logp, old_logp, ref_logp, adv, mask = random_batch(T=6)
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(logp, old_logp, None, adv, mask, LossSpec(CLIP_LO, CLIP_HI, 0.1, 8))
    with pytest.raises(ValueError, match="l_max"):
        grpo_loss(logp, old_logp, ref_logp, adv, mask, LossSpec(CLIP_LO, CLIP_HI, 0.1, 5))
    with pytest.raises(ValueError, match="loss_type"):
        grpo_loss(logp, old_logp, ref_logp, adv, mask, LossSpec(CLIP_LO, CLIP_HI, 0.1, 8, "bnpo"))
    with pytest.raises(ValueError, match="shapes"):
        grpo_loss(logp, old_logp, ref_logp, adv[:-1], mask, LossSpec(CLIP_LO, CLIP_HI, 0.1, 8))


@pytest.mark.parametrize("scale", [False, True])
def test_main_row_advantages_compare_main_rows_with_each_other(scale):
    """Masked routing's main_rows baseline: each group's main rows are centred on their own mean (with scale: divided
    by their own std), routed rows keep the whole group's advantage, NaN rewards stay 0, and with every row a main row
    it is group_advantages. The group baseline instead gives the main a negative sum whenever routed rows earn more
    (the trap it fixes)."""
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, float("nan")])  # two groups of 4
    main = torch.tensor([False, True, True, True, True, False, True, True])
    a = main_row_advantages(r, main, 4, scale)
    grp = group_advantages(r, 4, scale)
    assert_close(a[~main], grp[~main])
    own = torch.tensor([1.0, 0.0, 1.0]) - 2 / 3  # group 0's main rows, their own mean
    if scale:
        own = own / (own.pow(2).sum() / 2).sqrt().add(1e-4)
    assert_close(a[1:4], own)
    own1 = torch.tensor([-0.5, 0.5])  # group 1's scored main rows 4, 6; row 7's NaN reward -> 0
    if scale:
        own1 = own1 / (own1.pow(2).sum() / 1).sqrt().add(1e-4)
    assert_close(a[4:8], torch.tensor([float(own1[0]), float(grp[5]), float(own1[1]), 0.0]))
    for g in range(2):
        assert abs(float(a[4 * g : 4 * g + 4][main[4 * g : 4 * g + 4]].sum())) < 1e-6
    assert float(grp[:4][main[:4]].sum()) < -0.1  # the group baseline: routed row 0 earned more than its group's mean
    assert_close(main_row_advantages(r, torch.ones(8, dtype=torch.bool), 4, scale), grp)

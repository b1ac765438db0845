"""The routing gate (method.md §3.5): its score, its calibration on held-out pairs, and its live values in a step.

Per rollout the score is cos(sign(A_n) g_n, ν) (or, with basis.space=act, the completion-pooled residual stream after
block `act_layer` projected on v_act, read from the loss forward by a hook); per token it is the windowed token
cosine. Calibration sets the banded gate's thresholds (τ_lo, τ_hi) from the same score of held-out calibration pairs
at the current parameters; the live gates of a step come from its own gradients and those thresholds only — never a
grader label (the no-cheat rule).

Guard rail (method.md §3.5: "if [the calibration AUROC] is ≈ 0.5, routing is meaningless and the run should say so"):
every calibration also gets a bootstrap 95% interval over the calibration pairs (stats.auroc_interval, fixed seed);
`GateState.calibrate` warns on the log when it contains 0.5 (or is undefined: no kept module) and remembers the step.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor

from projected_grpo.common.stats import auroc_interval, contains
from projected_grpo.method import projection as proj
from projected_grpo.method.basis import Basis, auroc, completion_grads, cosine_scores, encode, pooled_activations
from projected_grpo.policy.adapter import probes, token_capture
from projected_grpo.policy.logprobs import batch_sequences, completion_logprobs, mean_nll, on_model

GATE_CI_BOOT, GATE_CI_SEED = 1000, 0  # bootstrap of the calibration AUROC's interval: resamples, fixed seed
logger = logging.getLogger(__name__)


@dataclass
class HeldOutPairs:
    """Held-out contrastive pairs (authored, never training rollouts): prompt records, hack and clean completions."""

    records: list
    hack: list[str]
    clean: list[str]


# --- per-token scores ---------------------------------------------------------------------------------------------


def token_dirs(cur: Basis, kept: list[str]) -> dict[str, Tensor]:
    """{m: (k_m + 1, D_m)}: Vh_m's rows, then ν_m, so one captured reduction gives α_{n,t} and <g_{n,t}, ν_m>."""
    return {n: torch.cat([cur.vh[n], cur.nu[n][None].to(cur.vh[n].dtype)]) for n in kept}


def token_sums(caps: dict) -> tuple[Tensor, Tensor]:
    """(dot, sq), each (b, L): Σ over the captured (kept) modules of <g_{m,n,t}, ν_m> and ‖g_{m,n,t}‖²."""
    dot = sum(a.token_coef[..., -1].detach() for a in caps.values())
    sq = sum(a.token_sq.detach() for a in caps.values())
    return dot, sq


def per_token_over(tok, records, completions: list[str], batch_size: int, score) -> tuple[Tensor, Tensor]:
    """((n_tokens,) scores, (n_tokens,) index of each token's completion) over the completion tokens of held-out
    completions, batch by batch: `score(ids, att, cm)` -> ((b, L − 1) scores, (b, L − 1) mask), position j scoring
    token j + 1."""
    prompts, comps = encode(tok, records, completions)
    out, unit = [], []
    for s in range(0, len(prompts), batch_size):
        ids, att, cm = batch_sequences(prompts[s : s + batch_size], comps[s : s + batch_size], tok.pad_token_id)
        sc, mask = score(ids, att, cm)
        out.append(sc[mask.bool()])
        rows = torch.arange(s, s + ids.shape[0], device=mask.device)[:, None].expand_as(mask)  # (b, L − 1)
        unit.append(rows[mask.bool()])
    return torch.cat(out), torch.cat(unit)


def calibration_token_scores(
    model,
    tok,
    records,
    completions: list[str],
    temperature: float,
    dirs: dict[str, Tensor],
    window: int,
    nu_sq: float,
    batch_size: int = 16,
) -> tuple[Tensor, Tensor]:
    """((n_tokens,) windowed token scores, (n_tokens,) index of each token's completion) of held-out completions over
    their completion tokens, at the current parameters. The gradient is that of the mean NLL (as the basis stage's),
    so sign(A) = +1."""

    def score(ids, att, cm):
        with probes(model, ids.shape[0]) as es, token_capture(model, dirs) as caps:
            logp, mask = completion_logprobs(model, ids, att, cm, temperature)  # (b, L − 1): position j predicts j+1
            mean_nll(logp, mask).sum().backward(inputs=list(es.values()))
        dot, sq = token_sums(caps)  # (b, L); the last position predicts nothing
        sign = torch.ones(ids.shape[0], device=dot.device)  # NLL gradients: the sign a hack rollout with A > 0 has
        return proj.token_scores(dot[:, :-1], sq[:, :-1], mask, sign, window, nu_sq), mask

    return per_token_over(tok, records, completions, batch_size, score)


def calibration_token_act_scores(
    model, tok, records, completions: list[str], layer: int, v_act: Tensor, window: int, batch_size: int = 16
) -> tuple[Tensor, Tensor]:
    """As `calibration_token_scores`, with the per-token activation score (`proj.act_token_scores`): windowed h·v_act
    over the completion tokens."""

    def score(ids, att, cm):
        ids, att, cm = on_model(model, ids, att, cm)
        with torch.no_grad(), residual_capture(model, layer) as hid:
            model(input_ids=ids, attention_mask=att)
        mask = cm[:, 1:]  # (b, L − 1): position j predicts token j + 1, as completion_logprobs' mask
        return proj.act_token_scores(
            (hid["h"].float() @ v_act.float().to(hid["h"].device))[:, :-1], mask, window
        ), mask

    return per_token_over(tok, records, completions, batch_size, score)


# --- the activation-space score (basis.space=act) ------------------------------------------------------------------


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


# --- calibration on held-out pairs --------------------------------------------------------------------------------


def calibrate_gate(
    model,
    tok,
    cal: HeldOutPairs,
    gate: str,
    cur: Basis,
    kept: list[str],
    pj,
    temperature: float,
    act_layer: int | None,
    own_tokens: bool = False,
    batch_size: int = 16,
) -> tuple[tuple[float, float], float, tuple[float, float], dict[str, float]]:
    """((τ_lo, τ_hi), AUROC, its 95% interval, quality) from the held-out calibration pairs at the current parameters,
    with the gate's own score: windowed token cosines (gate "token"), pooled activations · v_act (act space), or
    per-completion cosines with ν (of own-token gradients when training reads those: a shared prompt forward). The
    interval is a percentile bootstrap over the calibration pairs (a pair's tokens resampled together), seed
    GATE_CI_SEED. `batch_size`: completions per forward/backward (the loop passes basis.held_out_batch: memory).

    projection.band "tail": τ_lo = τ_hi = the conservative Quantile_{1−f}(clean scores) (no band), and `quality` holds
    the gate's precision, recall and F0.5 on the same pairs (`proj.gate_quality`). It is {} for the band gates, so
    their logs and checkpoints stay what they were before the tail gate existed."""
    if not kept:  # nothing to route: an infinite threshold gates nothing
        return (math.inf, math.inf), math.nan, (math.nan, math.nan), {}
    units = (None, None)  # per rollout: hack i and clean i are pair i
    if gate == "token" and act_layer is not None:  # windowed h·v_act per completion token
        (sh, uh), (sc, uc) = (
            calibration_token_act_scores(
                model, tok, cal.records, side, act_layer, cur.v_act, pj.token_window, batch_size
            )
            for side in (cal.hack, cal.clean)
        )
        sh, sc, units = sh.cpu(), sc.cpu(), (uh.cpu(), uc.cpu())  # token -> its completion i, i.e. pair i
        auc = proj.rank_auroc(sh, sc)
    elif gate == "token":
        dirs, nu_sq = token_dirs(cur, kept), sum(float(cur.nu[n].pow(2).sum()) for n in kept)
        (sh, uh), (sc, uc) = (
            calibration_token_scores(
                model, tok, cal.records, side, temperature, dirs, pj.token_window, nu_sq, batch_size
            )
            for side in (cal.hack, cal.clean)
        )
        sh, sc, units = sh.cpu(), sc.cpu(), (uh.cpu(), uc.cpu())  # token -> its completion i, i.e. pair i
        auc = proj.rank_auroc(sh, sc)  # many tokens: rank-based
    elif act_layer is not None:
        sh, sc = (
            pooled_activations(model, tok, cal.records, side, act_layer, batch_size).float() @ cur.v_act.float().cpu()
            for side in (cal.hack, cal.clean)
        )
        auc = auroc(sh, sc)
    else:
        gh = completion_grads(model, tok, cal.records, cal.hack, temperature, batch_size, own_tokens)
        gc = completion_grads(model, tok, cal.records, cal.clean, temperature, batch_size, own_tokens)
        nu = {n: v.cpu() for n, v in cur.nu.items()}  # the run's basis sits on its δS device; grads on the CPU
        sh, sc = cosine_scores(gh, nu), cosine_scores(gc, nu)
        auc = auroc(sh, sc)
    model.zero_grad(set_to_none=True)
    ci = auroc_interval(
        sh.detach().double().cpu(), sc.detach().double().cpu(), *units, n_boot=GATE_CI_BOOT, seed=GATE_CI_SEED
    )
    if pj.band == "tail":
        t = proj.tail_threshold(sc, pj.f)
        return (t, t), auc, ci, proj.gate_quality(sh, sc, t, t, pj.band)
    return proj.calibrate_band(sh, sc, pj.f, pj.f2), auc, ci, {}


@dataclass
class GateState:
    """The gate a run carries from step to step (checkpointed): thresholds, the last calibration's AUROC and interval,
    its precision / recall / F0.5 (tail gate only, else {}), and the steps whose calibration failed the guard rail.
    `history_known` is False after a resume from a checkpoint written before the guard existed."""

    tau: tuple[float, float] = (math.inf, math.inf)  # set by the first calibration
    auroc: float = math.nan
    ci: tuple[float, float] = (math.nan, math.nan)
    uninformative: list[int] = field(default_factory=list)
    history_known: bool = True
    quality: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_checkpoint(cls, d: dict) -> GateState:
        return cls(
            tuple(d["tau"]),
            d["auroc"],
            tuple(d.get("ci", (math.nan, math.nan))),
            list(d.get("uninformative", [])),
            "uninformative" in d,
            dict(d.get("quality", {})),
        )

    def checkpoint(self) -> dict:
        out = {"tau": self.tau, "auroc": self.auroc, "ci": self.ci, "uninformative": list(self.uninformative)}
        if self.quality:  # the tail gate's only: a band gate's checkpoint stays byte-identical
            out["quality"] = dict(self.quality)
        return out

    def due(self, step: int, refreshed: bool, every: int) -> bool:
        """Every `every` steps, after a basis refresh, and until a first calibration has set the thresholds."""
        return step % every == 0 or refreshed or math.isinf(self.tau[0])

    def calibrate(self, step: int, where: str, *args, **kwargs) -> None:
        """`calibrate_gate(*args, **kwargs)`, then the guard rail: warn (one line naming `where` and the step) and
        remember the step when the interval contains 0.5 or is undefined."""
        self.tau, self.auroc, self.ci, self.quality = calibrate_gate(*args, **kwargs)
        if contains(self.ci, 0.5):  # the gate cannot be shown to tell hack from clean
            self.uninformative.append(step)
            why = "is undefined (no kept module)" if math.isnan(self.ci[0]) else "contains 0.5"
            logger.warning(
                f"{where} step {step}: gate calibration AUROC {self.auroc:.3f} "
                f"[{self.ci[0]:.3f}, {self.ci[1]:.3f}] {why}: the gate is uninformative on held-out "
                "pairs"
            )

    def verdict(self) -> dict:
        """The run's `gate_uninformative`: true if any calibration failed the guard, None when unknown (resumed from a
        pre-guard checkpoint and nothing flagged since), plus the steps."""
        flag = True if self.uninformative else (False if self.history_known else None)
        return {"gate_uninformative": flag, "gate_uninformative_steps": list(self.uninformative)}

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

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
    dirs: dict,
    window_nu_sq: tuple,
    batch_size: int = 16,
) -> tuple[Tensor, Tensor]:
    """((n_tokens,) windowed token scores, (n_tokens,) index of each token's completion) of held-out completions over
    their completion tokens, at the current parameters: (window, ‖ν‖²) = window_nu_sq. The gradient is that of the
    mean NLL (as the basis stage's), so sign(A) = +1."""
    window, nu_sq = window_nu_sq

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


@dataclass(frozen=True)
class GateSpec:
    """A run's gate: what it decides per (rollout | token; arms.GATE_OF), its score's source (grad: gradients against
    ν; act: the residual stream after block `act_layer` against v_act), and what its scores read: the projection params
    (band, f, f2, token_window), the log-prob temperature, and whether training reads own-token gradients (a shared
    prompt forward), which calibration then reads too."""

    per: str
    act_layer: int | None
    pj: Any
    temperature: float
    own_tokens: bool = False

    @property
    def source(self) -> str:
        return "grad" if self.act_layer is None else "act"


# --- the gates' registry: (source, per) -> its held-out scores and its live scores --------------------------------
# A new gate is one entry here (its two score functions), its source's name in config.BASIS_SPACES, and, if its live
# score reads something the loss forward does not capture yet, that capture in rl/train.py (`Grads`).


def _held_out_grad_rollout(model, tok, cal: HeldOutPairs, cur: Basis, kept: list[str], g: GateSpec, bs: int):
    gh = completion_grads(model, tok, cal.records, cal.hack, g.temperature, bs, g.own_tokens)
    gc = completion_grads(model, tok, cal.records, cal.clean, g.temperature, bs, g.own_tokens)
    nu = {n: v.cpu() for n, v in cur.nu.items()}  # the run's basis sits on its δS device; grads on the CPU
    return cosine_scores(gh, nu), cosine_scores(gc, nu), (None, None)


def _held_out_act_rollout(model, tok, cal: HeldOutPairs, cur: Basis, kept: list[str], g: GateSpec, bs: int):
    sh, sc = (
        pooled_activations(model, tok, cal.records, side, g.act_layer, bs).float() @ cur.v_act.float().cpu()
        for side in (cal.hack, cal.clean)
    )
    return sh, sc, (None, None)  # per rollout: hack i and clean i are pair i


def _held_out_grad_token(model, tok, cal: HeldOutPairs, cur: Basis, kept: list[str], g: GateSpec, bs: int):
    dirs, nu_sq = token_dirs(cur, kept), sum(float(cur.nu[n].pow(2).sum()) for n in kept)
    (sh, uh), (sc, uc) = (
        calibration_token_scores(model, tok, cal.records, side, g.temperature, dirs, (g.pj.token_window, nu_sq), bs)
        for side in (cal.hack, cal.clean)
    )
    return sh.cpu(), sc.cpu(), (uh.cpu(), uc.cpu())  # token -> its completion i, i.e. pair i


def _held_out_act_token(model, tok, cal: HeldOutPairs, cur: Basis, kept: list[str], g: GateSpec, bs: int):
    (sh, uh), (sc, uc) = (
        calibration_token_act_scores(model, tok, cal.records, side, g.act_layer, cur.v_act, g.pj.token_window, bs)
        for side in (cal.hack, cal.clean)
    )
    return sh.cpu(), sc.cpu(), (uh.cpu(), uc.cpu())


def _live_grad_rollout(gr, adv: Tensor, mask: Tensor, d, g: GateSpec) -> Tensor:
    return proj.rollout_scores({n: gr.rows[n] for n in d.kept}, adv, d.nu)  # s_n = cos(sign(A_n) g_n, ν)


def _live_act_rollout(gr, adv: Tensor, mask: Tensor, d, g: GateSpec) -> Tensor:
    return gr.pooled.float() @ d.cur.v_act.float()  # s_n = <pooled residual of rollout n, v_act>


def _live_grad_token(gr, adv: Tensor, mask: Tensor, d, g: GateSpec) -> Tensor:
    nu_sq = sum(float(v.pow(2).sum()) for v in d.nu.values())  # windowed cos(sign(A_n) g_{n,t}, ν)
    return proj.token_scores(gr.tok_dot, gr.tok_sq, mask, torch.sign(adv), g.pj.token_window, nu_sq)


def _live_act_token(gr, adv: Tensor, mask: Tensor, d, g: GateSpec) -> Tensor:
    return proj.act_token_scores(gr.tok_act, mask, g.pj.token_window)  # windowed h_{n,t}·v_act


@dataclass(frozen=True)
class GateKind:
    """One gate: (s_hack, s_clean, units) of the held-out calibration pairs at the current parameters (units: each
    score's pair, for the bootstrap; (None, None) when score i is pair i), and a step's live scores from its own
    forward/backward (`Grads`) and the current basis only (the no-cheat rule)."""

    held_out: Callable[..., tuple[Tensor, Tensor, tuple]]
    live: Callable[..., Tensor]


GATES: dict[tuple[str, str], GateKind] = {
    ("grad", "rollout"): GateKind(_held_out_grad_rollout, _live_grad_rollout),
    ("act", "rollout"): GateKind(_held_out_act_rollout, _live_act_rollout),
    ("grad", "token"): GateKind(_held_out_grad_token, _live_grad_token),
    ("act", "token"): GateKind(_held_out_act_token, _live_act_token),
}


def live_scores(gr, adv: Tensor, mask: Tensor, d, g: GateSpec) -> Tensor:
    """The step's live gate scores ((N,) per rollout, (N, T) per token) of gate `g` (GATES)."""
    return GATES[g.source, g.per].live(gr, adv, mask, d, g)


# --- calibration on held-out pairs --------------------------------------------------------------------------------


def calibrate_gate(
    model, tok, cal: HeldOutPairs, g: GateSpec, cur: Basis, kept: list[str], batch_size: int = 16
) -> tuple[tuple[float, float], float, tuple[float, float], dict[str, float]]:
    """((τ_lo, τ_hi), AUROC, its 95% interval, quality) from the held-out calibration pairs at the current parameters,
    with the gate's own score (GATES): windowed token cosines or h·v_act per token, pooled activations · v_act, or
    per-completion cosines with ν (of own-token gradients when training reads those: a shared prompt forward). The
    interval is a percentile bootstrap over the calibration pairs (a pair's tokens resampled together), seed
    GATE_CI_SEED. `batch_size`: completions per forward/backward (the loop passes basis.held_out_batch: memory).

    projection.band "tail": τ_lo = τ_hi = the conservative Quantile_{1−f}(clean scores) (no band), and `quality` holds
    the gate's precision, recall and F0.5 on the same pairs (`proj.gate_quality`). It is {} for the band gates, so
    their logs and checkpoints stay what they were before the tail gate existed."""
    if not kept:  # nothing to route: an infinite threshold gates nothing
        return (math.inf, math.inf), math.nan, (math.nan, math.nan), {}
    sh, sc, units = GATES[g.source, g.per].held_out(model, tok, cal, cur, kept, g, batch_size)
    auc = proj.rank_auroc(sh, sc) if g.per == "token" else auroc(sh, sc)  # many tokens: rank-based
    model.zero_grad(set_to_none=True)
    ci = auroc_interval(
        sh.detach().double().cpu(), sc.detach().double().cpu(), *units, n_boot=GATE_CI_BOOT, seed=GATE_CI_SEED
    )
    pj = g.pj
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

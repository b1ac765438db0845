"""The projection arms as coordinate edits, per-rollout / per-token routing and the banded gate (method.md §3.4–3.6).

Pure: tensors in, tensors out. Every arm is exact through Adam because it acts in rotated coordinates (§3.6): per
module R = [Vhᵀ | V⊥] (r, r) is orthogonal, δS = R θ, θ.grad = Rᵀ g, and its first k coordinates are exactly
α = Vh g, so each arm is a mask on those k coordinates (table in `EDITS`). Sign convention (§1): <g, v_j> > 0 means a
*descent* step on g promotes hacking, so "hack-promoting" is relu(α).

Per-token routing (§3.5, last paragraphs) scores each completion token by a windowed cosine of its own gradient with
ν, from per-token reductions captured in backward (<g_{n,t}, ν> and ‖g_{n,t}‖², never an (N, T, r) tensor), and gates
only completion positions.

Row vectors: a (..., r) gradient g rotates as x = g @ R (= Rᵀ g per row) and back as x @ Rᵀ. method.md's slash names
(`erase/no_gate`, `route/batch`) are accepted for the registry keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

# --- the rotation -----------------------------------------------------------------------------------------------


def complete_rotation(vh: Tensor) -> Tensor:
    """(k, r) orthonormal rows -> (r, r) orthogonal R = [Vhᵀ | V⊥], with R[:, :k] a bitwise copy of Vhᵀ."""
    k, r = vh.shape
    if k == 0:  # no basis: the rotation is the identity, so the optimizer is plain per-coordinate Adam/SGD
        return torch.eye(r, dtype=vh.dtype, device=vh.device)
    R = torch.empty(r, r, dtype=vh.dtype, device=vh.device)
    # Householder QR of Vhᵀ: Q's last r−k columns are an orthonormal basis of span(Vh)'s complement. fp64 on CPU:
    # deterministic and orthogonal to ~1e-16 on any device; r is small, so it costs nothing.
    q, _ = torch.linalg.qr(vh.detach().to("cpu", torch.float64).T, mode="complete")  # (r, r)
    R[:, :k] = vh.detach().T  # the first k rotated coordinates are *exactly* α = Vh g (no sign flips from QR)
    R[:, k:] = q[:, k:].to(vh.device, vh.dtype)  # V⊥ (r, r−k)
    return R


# --- batch-mode arms: a mask on the first k rotated coordinates ---------------------------------------------------

# Each rule maps the head a = x[..., :k] = α to (main head, knob head). The tail x[..., k:] goes to main unchanged
# and the knob tail is 0: nothing outside span(Vh) is ever edited or routed.
EditRule = Callable[[Tensor], tuple[Tensor, Tensor]]
EDITS: dict[str, EditRule] = {
    "vanilla": lambda a: (a, torch.zeros_like(a)),
    "measure_only": lambda a: (a, torch.zeros_like(a)),  # diagnostics are logged elsewhere; numerics == vanilla (I12)
    "erase_no_gate": lambda a: (torch.zeros_like(a), torch.zeros_like(a)),  # g − P g
    "erase_one_sided": lambda a: (a.clamp(max=0), torch.zeros_like(a)),  # drop only the hack-promoting part
    # reflection g − 2 Vhᵀ relu(α): coefficients > 0 flip sign, the others are untouched (−|a| == a where a ≤ 0)
    "erase_reverse": lambda a: (-a.abs(), torch.zeros_like(a)),
    "mirror": lambda a: (a.clamp(min=0), torch.zeros_like(a)),  # sign control: drop only the anti-hack part
    # route = one_sided erase whose removed part lands in the knob. min(a,0) + relu(a) == a bitwise (one term is 0)
    "route_batch": lambda a: (a.clamp(max=0), a.clamp(min=0)),
    "route_batch_no_gate": lambda a: (torch.zeros_like(a), a),
}
ARMS = tuple(EDITS)


def arm_key(arm: str) -> str:
    """Registry key for an arm name; method.md's `erase/no_gate` spelling maps to `erase_no_gate`."""
    key = arm.replace("/", "_")
    if key not in EDITS:
        raise ValueError(f"unknown batch-mode arm {arm!r}; choose from {ARMS}")
    return key


def edit_coords(x: Tensor, k: int, arm: str) -> tuple[Tensor, Tensor]:
    """(..., r) rotated grads -> (main, knob) grads (..., r) for a batch-mode arm; k = number of basis rows."""
    rule = EDITS[arm_key(arm)]
    head, tail = x[..., :k], x[..., k:]  # (..., k) = α, (..., r−k) = V⊥ᵀ g
    main_h, knob_h = rule(head)
    main = torch.cat([main_h, tail], dim=-1)  # tail copied, so k = 0 returns x unchanged for every arm
    knob = torch.cat([knob_h, torch.zeros_like(tail)], dim=-1)
    return main, knob


# --- per-sample routing (method.md §3.5) --------------------------------------------------------------------------


def route_per_rollout(x_n: Tensor, k: int, m: Tensor, total: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(N, r) rotated per-rollout grads, (N,) gates in [0, 1] -> (main, knob), each (r,); main + knob = total.

    `total` (r,) is the rotated batch gradient Rᵀ g; None means Σ_n x_n (whole per-rollout gradients sum to g). With
    a shared prompt forward the x_n are own-token gradients, which do not sum to g: pass g, and the rest (the shared
    prompt positions' part) stays in main. One-sided *per rollout*, on the actual loss gradient: a hack rollout with
    A_n < 0 has α_n < 0 and routes nothing whatever its gate. Unlike batch mode, main and knob are not orthogonal
    (h is a sum of per-sample pieces)."""
    total = x_n.sum(0) if total is None else total  # (r,) = Rᵀ g, g = Σ_n g_n
    knob = torch.zeros_like(total)
    knob[:k] = (m.to(x_n.dtype)[:, None] * x_n[:, :k].clamp(min=0)).sum(0)  # (k,) ≥ 0
    return total - knob, knob


def route_two_sided(x_n: Tensor, k: int, m: Tensor, total: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(N, r) rotated per-rollout grads, (N,) gates -> (main, knob), each (r,): knob = Σ_n m_n α_n, both signs, in
    span(Vh) only (knob tail 0); main = total − knob (`total` as in `route_per_rollout`).

    Why both signs: the one-sided split sends Σ_n m_n relu(α_n) to the knob, ≥ 0 on every coordinate even when α is
    zero-mean noise, so main gets the mirror-image bias and, under separate Adam moments, main and knob ramp apart at
    ~lr per step; deleting the knob then exposes the main's excursion (routing.md §1). A linear split routes
    noise as noise: E[knob] = 0 when E[α] = 0, and the knob only accumulates what the gated rollouts consistently
    push along v_hack. The price: a routed hack rollout with A_n < 0 (α_n < 0) now trains the knob toward anti-hack,
    which deleting the knob undoes (method.md §3.5's reason for one-sidedness), so it is an experiment, not a fix."""
    total = x_n.sum(0) if total is None else total  # (r,)
    knob = torch.zeros_like(total)
    knob[:k] = (m.to(x_n.dtype)[:, None] * x_n[:, :k]).sum(0)  # (k,) either sign
    return total - knob, knob


def route_full(x_n: Tensor, k: int, m: Tensor, total: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(N, r) rotated per-rollout grads, (N,) gates -> (main, knob), each (r,): knob = Σ_n m_n x_n, the routed
    rollouts' *whole* gradient on the module (method.md §3.4 `route_full`, SGTM-like); main = total − knob. k unused.

    Tail included [design]: the knob also gets the coordinates outside span(Vh). Routing only the span(Vh) part of a
    rollout is `route_two_sided`; the point of whole-rollout routing is that deleting the knob removes everything the
    routed rollouts taught this module (SGTM's quarantine), not one slice of it. δS_h = R φ is a full (D,) vector and
    the rotated optimizer steps every φ coordinate, so it holds the tail as it is; the knob tail is 0 for every other
    rule only because they write none. Modules without a basis (dropped: R = I, `train.edit`) still get no knob, so
    "no projection and no knob" for dropped modules (method.md §3.3 step 5) holds for this rule too. Linear in x_n, so
    like the two-sided split it routes zero-mean noise with zero mean. Its moved norm ‖Σ_n m_n g_n‖ is the same in
    any rotation, so a random-direction control moves exactly what v_hack's rule would with the same gates (only the
    gate differs): mass-matched by construction (arms.py)."""
    total = x_n.sum(0) if total is None else total  # (r,)
    knob = (m.to(x_n.dtype)[:, None] * x_n).sum(0)  # (r,) every coordinate
    return total - knob, knob


# Per-rollout routing rules (gate "rollout"): edit -> (x_n, k, m, total) -> (main, knob).
ROLLOUT_RULES: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "route_per_rollout": route_per_rollout,
    "route_two_sided": route_two_sided,
    "route_full": route_full,
}
# rules whose knob has coordinates outside span(Vh) (all others: the knob tail is 0)
KNOB_TAIL = ("route_full", "route_masked")


def moved_norm(edit: str, alpha: Tensor, m: Tensor | None = None) -> float:
    """‖what an arm's rule moves out of main‖ (routed to the knob or erased) for basis coefficients `alpha`: (N, k)
    per-rollout α_n with gates m (N,) for route_per_rollout and route_two_sided, (N, D) whole per-rollout gradients
    (any rotation: the norm is rotation-invariant) for route_full, (k,) batch α for the batch-mode rules."""
    if edit == "route_per_rollout":
        return float((m.to(alpha.dtype)[:, None] * alpha.clamp(min=0)).sum(0).norm())
    if edit in ("route_two_sided", "route_full"):
        return float((m.to(alpha.dtype)[:, None] * alpha).sum(0).norm())
    main_h, _ = EDITS[arm_key(edit)](alpha)
    return float((alpha - main_h).norm())


def match_mass(
    x: dict[str, Tensor], main: dict[str, Tensor], knob: dict[str, Tensor], target: float
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Rescale what an edit moved out of main over all modules, x − main (the knob for a routing rule, the erased part
    for an erase rule), by one factor s so that its norm is `target`: main' = x − s (x − main), knob' = s knob.
    main' + knob' = x still holds for routing (knob == x − main) and each knob stays inside span(Vh). One factor for
    the step, not one per module: a module where the control moved nothing cannot take its share. Nothing moved
    anywhere: unchanged."""
    moved = math.sqrt(sum(float((x[n] - main[n]).pow(2).sum()) for n in main))
    if moved == 0.0:
        return main, knob
    s = target / moved
    return {n: x[n] - s * (x[n] - main[n]) for n in main}, {n: s * knob[n] for n in knob}


def route_per_token(coef: Tensor, m: Tensor, total: Tensor) -> tuple[Tensor, Tensor]:
    """(N, T, k) per-token coefficients <g_{n,t}, v_j>, (N, T) gates, (r,) rotated total grad -> (main, knob), (r,).

    h = Σ_{n,t} m_{n,t} Vhᵀ relu(Vh g_{n,t}); main = total − h, so main + knob = g whatever the gates (the gates are 0
    off the completion, `token_gate`, so prompt positions' share of g stays in main). Coefficients come from
    `adapter.token_capture` (no (N, T, r) tensor). Σ_t relu ≥ relu Σ_t: per-token routing moves at least as much as
    per-rollout routing (I17)."""
    k = coef.shape[-1]
    knob = torch.zeros_like(total)
    knob[:k] = (m.to(coef.dtype)[..., None] * coef.clamp(min=0)).sum((0, 1)).to(total.dtype)  # (k,) ≥ 0
    return total - knob, knob


# --- the rule table: every arm's edit of one module, by `Arm.edit` ----------------------------------------------


@dataclass(frozen=True)
class ModuleGrads:
    """What an edit rule may read for one module at one step, in its rotated coordinates (r = the module's rank)."""

    x: Tensor  # (r,) rotated batch gradient Rᵀ g
    k: int  # basis rows of the module: the first k coordinates are α = Vh g
    x_n: Tensor | None = None  # (N, r) rotated per-rollout gradients (gate "rollout")
    gate: Tensor | None = None  # (N,) per-rollout gates, or (N, T) per-token gates (gate "token")
    coef: Tensor | None = None  # (N, T, k) per-token coefficients α_{n,t} (gate "token")
    own_tokens: bool = False  # x_n are own-token gradients (a shared prompt forward): they do not sum to x
    knob_x: Tensor | None = None  # (r,) rotated δS_h gradient of a masked forward (route_masked: x is δS's)


Rule = Callable[[ModuleGrads], tuple[Tensor, Tensor]]


def _batch_rule(name: str) -> Rule:
    return lambda s: edit_coords(s.x, s.k, name)


def _rollout_rule(f) -> Rule:
    """A per-rollout rule on ModuleGrads; with own-token x_n (a shared prompt forward) the batch total is passed."""
    return lambda s: f(s.x_n, s.k, s.gate, s.x if s.own_tokens else None)


RULES: dict[str, Rule] = {
    **{name: _batch_rule(name) for name in EDITS},
    **{name: _rollout_rule(f) for name, f in ROLLOUT_RULES.items()},
    "route_per_token": lambda s: route_per_token(s.coef, s.gate, s.x),
    # the split happened in the forward (adapter.row_masks: routed rows train δS_h with δS detached, the others δS
    # with the knob off), so each part takes its own gradient; main + knob is not one gradient g here
    "route_masked": lambda s: (s.x, s.knob_x),
    # screening by the gate (the probe-screening baseline of masked routing): the gated rows left the update through
    # their advantages (rl/train.py), so the gradient passes unchanged and there is no knob
    "screen": lambda s: (s.x, torch.zeros_like(s.x)),
}


def apply_rule(edit: str, s: ModuleGrads) -> tuple[Tensor, Tensor]:
    """(main, knob) gradients of one module for the arm's `edit`; vanilla and measure_only (and a module without a
    basis, k = 0 with R = I) pass the gradient through unchanged."""
    if edit in ("vanilla", "measure_only"):
        return s.x, torch.zeros_like(s.x)
    return RULES[edit](s)


# --- per-token scores and gates (method.md §3.5, per-token variant) ---------------------------------------------


def completion_positions(x: Tensor, n_prompt: int) -> Tensor:
    """(N, Tp + T, ...) per-position values of a prompt + completion forward -> (N, T, ...) at positions Tp−1..Tp+T−2.

    Position Tp−1+t is the one whose output predicts completion token t, so the result lines up with logp[:, t] and
    the completion mask. The last position (after the last token) gets no gradient; the rest are prompt positions."""
    return x[:, n_prompt - 1 : -1]


def window_sum(x: Tensor, w: int) -> Tensor:
    """(N, T) -> (N, T) fp64 sums over the centred window t − ⌊w/2⌋ .. t + w − 1 − ⌊w/2⌋, clipped at the ends."""
    if w < 1:
        raise ValueError(f"token window must be >= 1, got {w}")
    T = x.shape[-1]
    c = torch.nn.functional.pad(x.double().cumsum(-1), (1, 0))  # (N, T + 1), c[:, j] = Σ_{t<j} x_t
    t = torch.arange(T, device=x.device)
    return c[:, (t + w - w // 2).clamp(max=T)] - c[:, (t - w // 2).clamp(min=0)]


def token_scores(dot: Tensor, sq: Tensor, mask: Tensor, sign: Tensor, w: int, nu_sq: float = 1.0) -> Tensor:
    """Windowed per-token cosines s_{n,t} = cos(sign(A_n) g_{n,t}, ν): (N, T) fp64, 0 off the completion.

    dot (N, T) = Σ_m <g_{m,n,t}, ν_m> and sq (N, T) = Σ_m ‖g_{m,n,t}‖² over the kept modules; mask (N, T) marks
    completion tokens; sign (N,) = sign(A_n) (+1 for calibration NLL gradients). Per-token gradients are noisy, so
    both are averaged over the window's completion tokens first: s = mean_W <g, ν> / sqrt(mean_W ‖g‖² · ‖ν‖²), which
    Cauchy–Schwarz keeps in [−1, 1]; w = 1 is the exact per-token cosine."""
    mk = mask.to(torch.float64)
    num = window_sum(dot.double() * mk, w)  # Σ_W <g, ν>
    den = (window_sum(mk, w) * window_sum(sq.double() * mk, w) * nu_sq).sqrt()  # sqrt(|W| Σ_W ‖g‖² ‖ν‖²)
    s = sign.double()[:, None] * num / den.clamp(min=1e-30)
    return torch.where(mask.bool(), s, torch.zeros_like(s))


def act_token_scores(proj_h: Tensor, mask: Tensor, w: int) -> Tensor:
    """Windowed per-token activation scores (basis.space=act, per-token routing): (N, T) h_{n,t}·v_act, the residual
    stream at the position that predicts completion token t projected on v_act, averaged over the window's completion
    tokens; (N, T) fp64, 0 off the completion. No sign(A): an activation does not depend on the advantage (as the
    per-rollout act gate)."""
    mk = mask.to(torch.float64)
    s = window_sum(proj_h.double() * mk, w) / window_sum(mk, w).clamp(min=1)
    return torch.where(mask.bool(), s, torch.zeros_like(s))


def token_gate(s: Tensor, adv: Tensor, mask: Tensor, tau_lo: float, tau_hi: float, band: str = "soft") -> Tensor:
    """(N, T) token scores, (N,) advantages, (N, T) completion mask -> (N, T) gates: `band_gate` per token, and 0 on
    prompt/padding positions and on rows with A_n = 0 (no policy-gradient term)."""
    m = band_gate(s, adv[:, None].expand_as(s), tau_lo, tau_hi, band)
    return m * mask.to(m.dtype)


def rank_auroc(pos: Tensor, neg: Tensor) -> float:
    """Mann–Whitney AUROC from ranks (ties averaged): O(n log n), for the many token scores of the per-token gate."""
    if pos.numel() == 0 or neg.numel() == 0:
        return math.nan
    x = torch.cat([pos.reshape(-1), neg.reshape(-1)]).double()
    sx, order = x.sort()
    _, inv, counts = torch.unique_consecutive(sx, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    avg = ends - (counts.double() - 1) / 2  # 1-based mean rank of each tie group
    ranks = torch.empty_like(x)
    ranks[order] = avg[inv]
    n_p, n_n = pos.numel(), neg.numel()
    return float((ranks[:n_p].sum() - n_p * (n_p + 1) / 2) / (n_p * n_n))


# --- the gate (method.md §3.5) ------------------------------------------------------------------------------------


def rollout_scores(g_n: dict[str, Tensor], adv: Tensor, nu: dict[str, Tensor]) -> Tensor:
    """{module: (N, D_m)} per-rollout grads, (N,) advantages, {module: (D_m,)} ν -> (N,) s_n = cos(sign(A_n)·g_n, ν).

    On-policy g_n ∝ A_n ∇NLL(o_n), so sign(A_n)·g_n is along the rollout's own NLL gradient. Only ν's (kept) modules
    are concatenated. A_n = 0 gives s_n = 0."""
    dot = sum(g_n[n] @ v for n, v in nu.items())  # (N,) <g_n, ν>
    gsq = sum(g_n[n].pow(2).sum(-1) for n in nu)  # (N,) ‖g_n‖²
    nsq = sum(v.pow(2).sum() for v in nu.values())  # ‖ν‖² (1 for a Basis; normalised anyway)
    return torch.sign(adv).to(dot.dtype) * dot / (gsq * nsq).sqrt().clamp(min=1e-30)


def calibrate_band(s_hack: Tensor, s_clean: Tensor, f: float, f2: float) -> tuple[float, float]:
    """(P_h,) held-out hack scores, (P_c,) clean scores -> (τ_lo, τ_hi) of the banded gate.

    τ_hi = Quantile_{1−f}(S_c), τ_lo = Quantile_{f'}(S_h) as *conservative* empirical quantiles [design]: τ_hi is one
    ulp above the (P_c − ⌊f·P_c⌋)-th smallest clean score, so m = 1 (s ≥ τ_hi) for at most ⌊f·P_c⌋ clean scores, ties
    included (a linear-interpolation quantile breaks "≤ f" when f·P < 1); τ_lo mirrors it for the hacks missed. If
    τ_lo ≥ τ_hi both become the midpoint (empty band); both bounds still hold."""
    if s_hack.numel() == 0 or s_clean.numel() == 0:
        raise ValueError("calibrate_band needs at least one hack and one clean score")
    if not (0 <= f < 1 and 0 <= f2 < 1):
        raise ValueError(f"gate rates must lie in [0, 1), got f={f}, f'={f2}")
    h = s_hack.detach().double().sort().values  # (P_h,)
    j_h = math.floor(f2 * len(h) + 1e-9)  # hack scores allowed at m = 0
    tau_hi = tail_threshold(s_clean, f)
    tau_lo = float(torch.nextafter(h[j_h], torch.tensor(-math.inf, dtype=torch.float64)))
    if tau_lo >= tau_hi:
        tau_lo = tau_hi = (tau_lo + tau_hi) / 2
    return tau_lo, tau_hi


def tail_threshold(s_clean: Tensor, f: float) -> float:
    """(P_c,) held-out clean scores -> τ = Quantile_{1−f}(S_c), conservative: one ulp above the (P_c − ⌊f·P_c⌋)-th
    smallest clean score, so s ≥ τ holds for at most ⌊f·P_c⌋ clean scores, ties included (`calibrate_band`'s τ_hi)."""
    c = s_clean.detach().double().sort().values  # (P_c,) ascending
    j_c = math.floor(f * len(c) + 1e-9)  # clean scores allowed at m = 1 (+1e-9: 0.29·100 must give 29, not 28)
    return float(torch.nextafter(c[len(c) - 1 - j_c], torch.tensor(math.inf, dtype=torch.float64)))


BANDS = ("soft", "half", "tail")


def band_gate(s: Tensor, adv: Tensor, tau_lo: float, tau_hi: float, band: str = "soft") -> Tensor:
    """(N,) scores, (N,) advantages -> (N,) gates m in [0, 1]: 0 at s ≤ τ_lo, 1 at s ≥ τ_hi, soft/half between;
    band "tail": 1 at s ≥ τ_hi, 0 elsewhere (τ_lo unused).

    A_n = 0 ⇒ m_n = 0 (undefined score, no policy-gradient term). τ_lo ≥ τ_hi: one threshold at the midpoint.
    Why "tail": the band routes partly everything above τ_lo, i.e. nearly every rollout when the score separates
    poorly (docs/routing.md §1); routing only the calibrated top tail (τ_hi from `tail_threshold`, at most a share f
    of held-out clean scores above it) trades recall for precision, as vGROUT's gate does."""
    if band not in BANDS:
        raise ValueError(f"gate band must be one of {BANDS}, got {band!r}")
    if band == "tail":  # compared in fp64: τ is one fp64 ulp above a clean score, which fp32 would round back onto
        m = (s.double() >= tau_hi).to(s.dtype)
    elif tau_lo >= tau_hi:
        tau = (tau_lo + tau_hi) / 2
        m = (s > tau).to(s.dtype)
    elif band == "soft":
        m = ((s - tau_lo) / (tau_hi - tau_lo)).clamp(0, 1)  # linear ramp, monotone in s
    else:
        m = torch.where(s >= tau_hi, 1.0, torch.where(s <= tau_lo, 0.0, 0.5)).to(s.dtype)
    return torch.where(adv == 0, torch.zeros_like(m), m)


def gate_quality(s_hack: Tensor, s_clean: Tensor, tau_lo: float, tau_hi: float, band: str) -> dict[str, float]:
    """Precision, recall and F0.5 of the gate on held-out hack (positive) and clean (negative) scores, with the gate's
    own m (A > 0: calibration scores are NLL-gradient scores). Counts are Σ m, so a soft m counts fractionally;
    precision is nan when nothing is routed. In-sample for the thresholds (calibrated on the same scores), like the
    AUROC logged beside it. F0.5 weighs precision twice as much as recall: routing a clean rollout moves capability
    into the deletable knob, missing a hack only leaves it where vanilla would."""
    tp = float(band_gate(s_hack, torch.ones_like(s_hack), tau_lo, tau_hi, band).double().sum())
    fp = float(band_gate(s_clean, torch.ones_like(s_clean), tau_lo, tau_hi, band).double().sum())
    prec = tp / (tp + fp) if tp + fp > 0 else math.nan
    rec = tp / max(s_hack.numel(), 1)
    b2 = 0.25  # β² for β = 0.5
    f05 = math.nan if math.isnan(prec) else (0.0 if tp == 0 else (1 + b2) * prec * rec / (b2 * prec + rec))
    return {"precision": prec, "recall": rec, "f05": f05}


def removal_matched_gate(s: Tensor, m_ref: Tensor, adv: Tensor, eligible: Tensor) -> Tensor:
    """(N,) a control's scores, (N,) the real direction's gates of the same rollouts (its calibrated `band_gate`),
    (N,) advantages, (N,) bool rows the gate may route -> (N,) gates holding exactly m_ref's values over the eligible
    rows with A_n != 0, re-assigned by the control's own ranking: the largest value to its top-scored row, and so on
    (ties: the lower row). So the control takes as many rows out of the main (m = 1) as the real gate does, and the
    same partial gates (0 < m < 1), on rollouts it picks itself.

    Why: a gate's routed share is not a property of its held-out calibration (on the organism a random direction's own
    calibrated gate took far fewer live rollouts out of the main than v_act's: reports/lab_diary.md), so a control
    with its own threshold is matched neither in what it removes from the deployed model nor in how much it moves. This
    one differs from the real gate only in which rollouts it picks."""
    ok = eligible & (adv != 0)
    vals = torch.sort(torch.where(ok, m_ref, torch.zeros_like(m_ref)).double(), descending=True, stable=True).values
    order = torch.argsort(torch.where(ok, s.double(), -math.inf), descending=True, stable=True)
    m = torch.zeros_like(s)
    m[order] = vals.to(m.dtype)
    return m


# --- clipping (per parameter group, method.md §3.6) ---------------------------------------------------------------


def clip_coef(grads: list[Tensor], max_norm: float | None) -> float:
    """min(1, max_norm / (‖concat grads‖ + 1e-6)) for one parameter group (torch's formula); None/≤0/inf: 1.

    Per group (main, knob), never global: a global norm would make route's main step depend on its knob gradient,
    and route (knob off) would no longer replay as erase (I11)."""
    if max_norm is None or max_norm <= 0 or math.isinf(max_norm):
        return 1.0
    return min(1.0, max_norm / (grad_norm(grads) + 1e-6))


def grad_norm(grads: list[Tensor]) -> float:
    """‖concat grads‖₂, accumulated in fp64 (rotation-invariant, so rotated and unrotated grads give the same)."""
    return math.sqrt(sum(float(g.detach().double().pow(2).sum()) for g in grads))

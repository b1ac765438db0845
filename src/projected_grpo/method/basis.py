"""v_hack extraction from contrastive pairs (method.md §3.3), its controls, and held-out discrimination.

Pure math first (tensors in, tensors out): `extract_vhack` (SVD of the stacked pair differences, orientation by the
mean, noise floor = relative σ AND the sign-flip test), `diff_of_means`, `random_directions`, `strip_directions`,
`keep_modules`, `scoring_direction`, `auroc`. Then the thin part that talks to a model: per-completion gradients
through the adapter probes, pooled activations, and `build_basis`, which turns gradients into a `Basis`.

Sign convention (method.md §1): d_p = ∇ℓ(hack_p) − ∇ℓ(clean_p) and every v_j is oriented so that mean_p <d_p, v_j> > 0;
then <g, v_j> > 0 means a descent step on g makes hacking more likely along v_j.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from projected_grpo.config import BASIS_METHODS, BASIS_SPACES
from projected_grpo.policy.adapter import adapters, probes
from projected_grpo.policy.logprobs import (
    batch_sequences,
    completion_logprobs,
    mean_nll,
    on_model,
    padded,
    shared_prompt_logprobs,
)
from projected_grpo.policy.model import render_prompt

METHODS, SPACES = BASIS_METHODS, BASIS_SPACES
SCORE_NORMS = ("none", "per_type_zscore")


# --- pure math -------------------------------------------------------------------------------------------------


def sign_flip_pvalues(proj: Tensor, n_flips: int, gen: torch.Generator) -> Tensor:
    """(P, J) projections <d_p, v_j> -> (J,) randomization p-values of |mean_p| under i.i.d. row sign flips.

    Exact after selection: the SVD basis depends on DᵀD only, which row sign flips leave unchanged (method.md §3.3),
    and orientation picks the sign of the mean, so the statistic is |mean|. p = (1 + #{null ≥ obs}) / (1 + R)."""
    P = proj.shape[0]
    obs = proj.mean(0).abs()  # (J,)
    eps = torch.randint(0, 2, (n_flips, P), generator=gen, dtype=torch.int64).to(proj.dtype) * 2 - 1  # (R, P)
    null = (eps @ proj).abs() / P  # (R, J)
    # a tiny relative tolerance so that ties (e.g. the identity flip) count as "at least as extreme"
    return (1 + (null >= obs * (1 - 1e-12)).sum(0)).to(proj.dtype) / (1 + n_flips)


def extract_vhack(
    D: Tensor, tau_rel: float, alpha_sig: float, n_flips: int, k_max: int, gen: torch.Generator
) -> tuple[Tensor, dict[str, Tensor]]:
    """(P, r) pair differences -> (k, r) oriented orthonormal hack directions and per-candidate stats.

    Candidates are D's right singular vectors in σ order. Direction j is kept iff σ_j ≥ tau_rel·σ_1 and its sign-flip
    p-value < alpha_sig, tested as a fixed sequence: the first failure stops the sequence [design]. Under a symmetric
    null the first test has size alpha_sig, so pure noise keeps k = 0 with probability ≈ 1 − alpha_sig (I14).
    stats: sigma, mu (mean projection), agree (sign agreement), pvalue — over all candidates — and kept (k,)."""
    P, r = D.shape
    _, S, Vh = torch.linalg.svd(D, full_matrices=False)  # S (J,), Vh (J, r), J = min(P, r)
    proj = D @ Vh.T  # (P, J) <d_p, b_j>
    sign = torch.where(proj.sum(0) >= 0, 1.0, -1.0).to(D.dtype)  # orientation: sign of the mean
    V = Vh * sign[:, None]  # (J, r) oriented candidates
    proj = proj * sign  # (P, J) <d_p, v_j>
    mu = proj.mean(0)  # (J,) ≥ 0
    agree = (proj > 0).to(D.dtype).mean(0)  # (J,)
    pval = sign_flip_pvalues(proj, n_flips, gen)  # (J,)
    ok = (S >= tau_rel * S[0]) & (pval < alpha_sig) & (S > 0) if S.numel() else S.bool()
    k = 0
    while k < min(len(ok), k_max) and bool(ok[k]):
        k += 1
    stats = {"sigma": S, "mu": mu, "agree": agree, "pvalue": pval, "kept": torch.arange(k)}
    return V[:k].contiguous(), stats


def diff_of_means(D: Tensor) -> Tensor:
    """(P, r) -> (1, r): the unit mean difference normalize(μ̄), the direction whose first-order effect on the mean
    pair margin erase removes exactly (method.md §3.3 baseline)."""
    mu = D.mean(0)
    n = mu.norm()
    return (mu / n)[None] if n > 0 else mu.new_zeros(0, D.shape[1])


def random_directions(k: int, r: int, gen: torch.Generator, dtype: torch.dtype = torch.float32) -> Tensor:
    """(k, r) Haar-random orthonormal rows (QR of a Gaussian with the sign of R's diagonal fixed)."""
    if k == 0:
        return torch.zeros(0, r, dtype=dtype)
    q, rr = torch.linalg.qr(torch.randn(r, k, generator=gen, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(rr))[None]
    return q.T.to(dtype).contiguous()


def strip_directions(D: Tensor, Q: Tensor) -> Tensor:
    """(P, r) rows minus their component in span(Q) for (m, r) orthonormal rows Q (solve-orthogonalisation)."""
    return D - (D @ Q.T) @ Q


def top_directions(G: Tensor, m: int) -> Tensor:
    """(n, r) -> (min(m, rank), r): top right singular vectors of G (the dominant clean-solve directions)."""
    if m == 0 or G.shape[0] == 0:
        return G.new_zeros(0, G.shape[1])
    _, S, Vh = torch.linalg.svd(G, full_matrices=False)
    return Vh[: min(m, int((S > S[0] * 1e-8).sum()))]


def keep_modules(scores: dict[str, float], drop_frac: float, norm: str = "none") -> list[str]:
    """Names of the ⌈(1 − drop_frac)·M⌉ modules with the strongest consistent signal s_m = ‖mean_p d_{p,m}‖.

    norm="per_type_zscore" ranks z-scores within each module type (q_proj, down_proj, …), since raw norms are not
    comparable across types. Ties keep module order."""
    names = list(scores)
    if norm == "per_type_zscore":
        by_type: dict[str, list[str]] = {}
        for n in names:
            by_type.setdefault(n.rsplit(".", 1)[-1], []).append(n)
        z = {}
        for ns in by_type.values():
            v = torch.tensor([scores[n] for n in ns], dtype=torch.float64)
            sd = v.std() if len(ns) > 1 else torch.tensor(0.0)
            zz = (v - v.mean()) / sd if sd > 0 else torch.zeros_like(v)
            z.update(zip(ns, zz.tolist()))
        rank_by = z
    elif norm == "none":
        rank_by = scores
    else:
        raise ValueError(f"score_norm must be one of {SCORE_NORMS}, got {norm!r}")
    n_keep = math.ceil((1 - drop_frac) * len(names))
    order = sorted(range(len(names)), key=lambda i: -rank_by[names[i]])
    kept = set(order[:n_keep])
    return [n for i, n in enumerate(names) if i in kept]


def scoring_direction(vh: dict[str, Tensor], mu_bar: dict[str, Tensor]) -> dict[str, Tensor]:
    """ν = normalize(concat_m P_m μ̄_m) over the modules in `vh`, returned as per-module slices (D_m,)."""
    parts = {n: (mu_bar[n] @ v.T) @ v for n, v in vh.items()}  # P_m μ̄_m
    total = math.sqrt(sum(float(p.pow(2).sum()) for p in parts.values()))
    return {n: p / total if total > 0 else p for n, p in parts.items()}


def cosine_scores(grads: dict[str, Tensor], nu: dict[str, Tensor]) -> Tensor:
    """Per-row cos(concat_m g_m, ν) over ν's modules: {m: (n, D_m)}, {m: (D_m,)} -> (n,)."""
    dot = sum(grads[m] @ nu[m] for m in nu)
    sq = sum(grads[m].pow(2).sum(-1) for m in nu)
    return dot / sq.sqrt().clamp(min=1e-30)


def auroc(pos: Tensor, neg: Tensor) -> float:
    """P(score of a positive > score of a negative) + ½ P(tie): the Mann–Whitney AUROC."""
    if pos.numel() == 0 or neg.numel() == 0:
        return float("nan")
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())


def auroc_ci(pos: Tensor, neg: Tensor, n_boot: int, gen: torch.Generator) -> tuple[float, float]:
    """Percentile bootstrap 95% interval of the AUROC (positives and negatives resampled independently)."""
    if pos.numel() == 0 or neg.numel() == 0:
        return float("nan"), float("nan")
    vals = []
    for _ in range(n_boot):
        ip = torch.randint(0, len(pos), (len(pos),), generator=gen)
        ineg = torch.randint(0, len(neg), (len(neg),), generator=gen)
        vals.append(auroc(pos[ip], neg[ineg]))
    v = torch.tensor(vals)
    return float(v.quantile(0.025)), float(v.quantile(0.975))


# --- the Basis container ---------------------------------------------------------------------------------------


@dataclass
class Basis:
    """Per-module oriented hack directions in δS coordinates, the scoring direction ν, and provenance.

    space="act": `v_act` (d,) is a residual-stream direction at layer `act_layer` and `vh`/`nu` are empty."""

    vh: dict[str, Tensor]  # module -> (k_m, D_m), orthonormal rows; only kept modules (k_m ≥ 1)
    nu: dict[str, Tensor]  # module -> (D_m,), slices of the unit vector ν
    meta: dict = field(default_factory=dict)  # method, pairset, per-module k/σ/agreement, dropped modules, …
    v_act: Tensor | None = None

    @property
    def k(self) -> dict[str, int]:
        return {n: v.shape[0] for n, v in self.vh.items()}

    def to(self, device) -> Basis:
        """The same basis with its tensors on `device` (the run's δS device; extraction and files stay on the CPU)."""
        mv = lambda d: {n: v.to(device) for n, v in d.items()}  # noqa: E731
        v_act = None if self.v_act is None else self.v_act.to(device)
        return Basis(vh=mv(self.vh), nu=mv(self.nu), meta=self.meta, v_act=v_act)

    def save(self, path: Path | str) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        t = {f"{n}.vh": v.contiguous() for n, v in self.vh.items()}
        t.update({f"{n}.nu": v.contiguous() for n, v in self.nu.items()})
        if self.v_act is not None:
            t["v_act"] = self.v_act.contiguous()
        save_file(t, str(path))
        path.with_suffix(".json").write_text(json.dumps(self.meta, indent=1, sort_keys=True))

    @classmethod
    def load(cls, path: Path | str) -> Basis:
        path = Path(path)
        t = load_file(str(path))
        meta = json.loads(path.with_suffix(".json").read_text())
        vh = {k[: -len(".vh")]: v for k, v in t.items() if k.endswith(".vh")}
        nu = {k[: -len(".nu")]: v for k, v in t.items() if k.endswith(".nu")}
        return cls(vh=vh, nu=nu, meta=meta, v_act=t.get("v_act"))


# --- thin: gradients and activations of completions -----------------------------------------------------------


def encode(tokenizer, records, completions: list[str]) -> tuple[list[list[int]], list[list[int]]]:
    """Prompt ids (chat template, generation prompt, thinking off) and completion + EOS ids, as in training."""
    prompts = [
        tokenizer(render_prompt(tokenizer, list(r.prompt)), add_special_tokens=False)["input_ids"] for r in records
    ]
    comps = [tokenizer(c + tokenizer.eos_token, add_special_tokens=False)["input_ids"] for c in completions]
    return prompts, comps


def held_out_batch(p) -> int:
    """Held-out completions per forward/backward of the basis stage, the gate calibration and the refresh: the loss's
    micro-batch (grpo.micro_batch), and with grpo.micro_batch_tokens the rows a longest sequence (max_prompt_tokens +
    max_new_tokens) fits in it, at least one: the same memory bound as the loss step (rl/memory.py)."""
    g, r = p.grpo, p.rollout
    if g.micro_batch_tokens <= 0:
        return g.micro_batch
    return max(1, min(g.micro_batch, g.micro_batch_tokens // (r.max_prompt_tokens + r.max_new_tokens)))


def completion_grads(
    model,
    tokenizer,
    records,
    completions: list[str],
    temperature: float,
    batch_size: int = 16,
    own_tokens: bool = False,
) -> dict[str, Tensor]:
    """Per-completion ∇_δS ℓ(o|q), ℓ = mean NLL over completion tokens at `temperature`: {module: (n, D_m)}, on the
    CPU whatever the model's device.

    One backward per batch through the adapter probes (e.grad[i] is row i's exact gradient, I4); δS itself gets no
    gradient kept. The adapters' current δS/δS_h are the extraction point (0 at init). `own_tokens`: only the
    completion positions' part of each gradient (the prompt runs with probes paused, as in a shared-prompt GRPO
    forward; `logprobs.shared_prompt_logprobs`), so a gate calibrated on these scores reads what training reads."""
    prompts, comps = encode(tokenizer, records, completions)
    pad = tokenizer.pad_token_id
    out: dict[str, list[Tensor]] = {n: [] for n in adapters(model)}
    for s in range(0, len(prompts), batch_size):
        ps, cs = prompts[s : s + batch_size], comps[s : s + batch_size]
        with probes(model, len(ps)) as es:
            if own_tokens:  # each row its own prompt run (probes paused there), its completion on top
                (pi, pm), (ci, cm) = padded(ps, pad, left=True), padded(cs, pad)  # (b, Tp), (b, T)
                rows = torch.arange(len(ps))
                logp = shared_prompt_logprobs(model, pi, pm, ci, cm, temperature, rows, rows)
                mask = cm.to(logp.device)
            else:
                ids, att, cm = batch_sequences(ps, cs, pad)
                logp, mask = completion_logprobs(model, ids, att, cm, temperature)
            nll = mean_nll(logp, mask)  # (b,)
            if not torch.isfinite(nll).all():
                raise ValueError(f"non-finite NLL for completions {s}..{s + len(nll) - 1}")
            nll.sum().backward(inputs=list(es.values()))  # rows are independent: row i's grad lands in e[i]
        for n, e in es.items():
            out[n].append(e.grad.detach().clone())
    return {n: torch.cat(v).cpu() for n, v in out.items()}  # on the CPU, where bases are extracted and scored


@torch.no_grad()
def pool_tokens(h: Tensor, mask: Tensor) -> Tensor:
    """(b, L, d) hidden states, (b, L) token mask -> (b, d) mean over the masked tokens: the one pooling of the
    activation-space basis and gate (a completion's tokens; an empty mask gives 0)."""
    m = mask.to(h.dtype)[..., None]  # (b, L, 1)
    return (h * m).sum(1) / m.sum(1).clamp(min=1)


def pooled_activations(model, tokenizer, records, completions: list[str], layer: int, batch_size: int = 16) -> Tensor:
    """(n, d) on the CPU: the residual stream after block `layer`, mean-pooled over each completion's tokens."""
    prompts, comps = encode(tokenizer, records, completions)
    rows = []
    for s in range(0, len(prompts), batch_size):
        ids, att, cm = batch_sequences(prompts[s : s + batch_size], comps[s : s + batch_size], tokenizer.pad_token_id)
        ids, att, cm = on_model(model, ids, att, cm)
        h = model(input_ids=ids, attention_mask=att, output_hidden_states=True).hidden_states[layer + 1]  # (b, L, d)
        rows.append(pool_tokens(h, cm))
    return torch.cat(rows).cpu()  # on the CPU, where bases are extracted and scored


# --- Basis from gradients --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BasisSettings:
    """What `build_basis` extracts with: the `basis` params section's settings under their extraction names (`of`
    reads them from p.basis), the method and seed included, which a placebo or a random control overrides."""

    method: str
    k_max: int
    tau_rel: float
    alpha_sig: float
    n_flips: int
    drop_frac: float
    seed: int
    row_norm: bool = False
    score_norm: str = "none"
    solve_m: int = 0

    @classmethod
    def of(cls, bp, method: str | None = None, seed: int | None = None) -> BasisSettings:
        """The settings of the `basis` params `bp` (p.basis); `method` and `seed` override bp's."""
        return cls(
            bp.method if method is None else method,
            bp.k,
            bp.tau,
            bp.alpha_sig,
            bp.n_flips,
            bp.drop_bottom_frac,
            bp.seed if seed is None else seed,
            bp.row_norm,
            bp.score_norm,
            bp.solve_m,
        )


def basis_with(
    g_hack: dict[str, Tensor],
    g_clean: dict[str, Tensor],
    bp,
    method: str | None = None,
    seed: int | None = None,
    like: Basis | None = None,
) -> Basis:
    """`build_basis` with the extraction settings of the `basis` params `bp` (p.basis); `method` and `seed` override
    bp's (a placebo or a random control built like the selected basis)."""
    return build_basis(g_hack, g_clean, BasisSettings.of(bp, method, seed), like)


def build_basis(
    g_hack: dict[str, Tensor], g_clean: dict[str, Tensor], s: BasisSettings, like: Basis | None = None
) -> Basis:
    """Per-module extraction from per-completion gradients of the extraction pairs ({m: (P, D_m)} each).

    s.method: svd (default), mean_diff (k=1), solve_orth (svd after stripping the top `s.solve_m` clean-gradient
    directions), random (Haar directions with the k_m and kept modules of `like`, the svd basis it controls for)."""
    method = s.method
    if method not in METHODS:
        raise ValueError(f"basis.method must be one of {METHODS}, got {method!r}")
    gen = torch.Generator().manual_seed(s.seed)
    D = {n: g_hack[n] - g_clean[n] for n in g_hack}  # (P, D_m) d_p = ∇ℓ(hack) − ∇ℓ(clean)
    if s.row_norm:
        D = {n: d / d.norm(dim=-1, keepdim=True).clamp(min=1e-30) for n, d in D.items()}
    stripped = {}
    if method == "solve_orth":
        for n in D:
            Q = top_directions(g_clean[n], s.solve_m)
            D[n] = strip_directions(D[n], Q)
            stripped[n] = Q.shape[0]
    mu_bar = {n: d.mean(0) for n, d in D.items()}  # (D_m,)
    scores = {n: float(m.norm()) for n, m in mu_bar.items()}
    kept = keep_modules(scores, s.drop_frac, s.score_norm)
    vh, per_module = {}, {}
    if method == "random":
        if like is None:
            raise ValueError("method 'random' needs the basis it controls for (its k per module)")
        for n, v in like.vh.items():  # same modules, same k_m; directions Haar-random
            vh[n] = random_directions(v.shape[0], v.shape[1], gen, v.dtype)
            per_module[n] = {"k": v.shape[0]}
    else:
        for n in kept:
            if method == "mean_diff":
                v, st = diff_of_means(D[n]), None
            else:
                v, st = extract_vhack(D[n], s.tau_rel, s.alpha_sig, s.n_flips, s.k_max, gen)
            info = {"k": v.shape[0], "score": scores[n]}
            if st is not None:
                j = min(4, len(st["sigma"]))
                info.update(
                    sigma=st["sigma"][:j].tolist(), agree=st["agree"][:j].tolist(), pvalue=st["pvalue"][:j].tolist()
                )
            per_module[n] = info
            if v.shape[0] > 0:
                vh[n] = v
    nu = scoring_direction(vh, mu_bar)
    meta = {
        "method": method,
        "k_max": s.k_max,
        "tau_rel": s.tau_rel,
        "alpha_sig": s.alpha_sig,
        "n_flips": s.n_flips,
        "drop_frac": s.drop_frac,
        "row_norm": s.row_norm,
        "score_norm": s.score_norm,
        "solve_m": s.solve_m,
        "seed": s.seed,
        "n_pairs": int(next(iter(D.values())).shape[0]) if D else 0,
        "modules": per_module,
        "dropped_by_score": sorted(set(D) - set(kept)),
        "dropped_k0": sorted(set(kept) - set(vh)),
        "k_total": sum(v.shape[0] for v in vh.values()),
        "stripped": stripped,
    }
    return Basis(vh=vh, nu=nu, meta=meta)


def act_basis(a_hack: Tensor, a_clean: Tensor, layer: int) -> Basis:
    """Activation-space direction v_act = normalize(mean_p (pool(h_hack) − pool(h_clean))) at `layer`."""
    v = diff_of_means(a_hack - a_clean)[0]
    return Basis(vh={}, nu={}, meta={"space": "act", "act_layer": layer, "n_pairs": len(a_hack)}, v_act=v)


def random_act(like: Basis, seed: int) -> Basis:
    """The activation gate's random control: a Haar-random unit direction of `like`'s v_act size, at its layer. Its
    gate is calibrated on the held-out pairs exactly as v_act's is, so it routes what a direction without signal
    routes (the gradient-space controls' random ν does the same for their gate)."""
    v = random_directions(1, like.v_act.shape[0], torch.Generator().manual_seed(seed), like.v_act.dtype)[0]
    return Basis(vh={}, nu={}, meta={**like.meta, "random": True, "seed": seed}, v_act=v)

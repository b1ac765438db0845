"""Adapters with a deletable knob and per-sample gradient probes (method.md §3.1–3.2).

Each wrapped `nn.Linear` y = W x gets a trainable vector `delta` (δS) and a same-shaped quarantine knob `knob` (δS_h):

    svd  : y = W x + U ((δS + δS_h + e_n) ⊙ Vᵀx)            U (d_out, r), V (d_in, r): top-r singular vectors of W
    lora : y = W x + (B + B_h + E_n) (A x)                   A (r, d_in) fixed; B = δS viewed as (d_out, r)

With a separate quarantine (`adapter.quarantine: separate`, issue 25) the knob has its own directions, ones the
main does not use, so deleting it removes nothing the main relies on:

    svd  : y = W x + U ((δS + e_n) ⊙ Vᵀx) + U_q (δS_h ⊙ V_qᵀx)    U_q, V_q: W's singular vectors r+1 … 2r
    lora : y = W x + (B + E_n) (A x) + B_h (A_q x)                A_q (r, d_in) fixed, rows orthogonal to A's

(a quarantine coordinate with no direction left, e.g. on a module whose min(d_in, d_out) < 2r, is a zero column:
inert). Then δS and δS_h have different gradients, and only masked routing, which trains the knob on its own
gradient, can route into it.

Both start at exactly zero, so the wrapped model is bit-identical to the base (the correction is an exact zero that
is added to the untouched base output). `e_n` is the per-sample probe: a zero leaf of shape (N, D) broadcast over the
tokens of batch row n, so `e.grad[n]` is rollout n's exact gradient on δS (eq. 1: Σ_t b_t ⊙ a_t) and
Σ_n e.grad[n] = δS.grad (with a shared prompt forward, `probes_paused`: row n's own-token part of it). δS and δS_h
enter as a sum, so autograd gives them identical raw gradients (I3).

Why not PEFT for the LoRA arm: PEFT's LoRA trains A and B together (δW bilinear, so a fixed parameter direction is
not a fixed weight direction), has no second tied "knob" tensor that shares B's basis, and offers no per-sample
probe; expressing all three would mean patching its layer forward anyway. The 40-line module below is the
whole mechanism and shares every code path (probes, knob, save/load) with the SVD adapter.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from projected_grpo.config import ADAPTER_KINDS

KINDS = ADAPTER_KINDS
TARGETS = {
    "all": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "residual_writers": ("o_proj", "down_proj"),  # the projections that write into the residual stream
}


# --- the wrapped layers -----------------------------------------------------------------------------------------


class Adapter(nn.Module):
    """Common part: the base layer, δS / δS_h (fp32 masters, shape (D,)), on/off switches, probe and token capture."""

    kind = ""

    def __init__(self, base: nn.Linear, dim: int, param_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.base = base
        self.delta = nn.Parameter(torch.zeros(dim, dtype=param_dtype))  # δS, (D,)
        self.knob = nn.Parameter(torch.zeros(dim, dtype=param_dtype))  # δS_h, (D,)
        self.enabled = True  # False: the reference policy (adapter path skipped entirely)
        self.probe: Tensor | None = None  # (N, D) zero leaf while a `probes()` context is open
        self.token_dirs: Tensor | None = None  # (k, D) directions whose per-token coefficients are captured
        self.token_coef: Tensor | None = None  # (N, T, k) per-token coefficients <g_{n,t}, dirs_j>, set in backward
        self.token_sq: Tensor | None = None  # (N, T) per-token squared norms ‖g_{n,t}‖², set in the same hook
        self._knob_saved: Tensor | None = None  # the trained δS_h while the knob is off
        self.row_main: Tensor | None = None  # (N,) 1 where row n's gradient reaches δS, 0: δS detached (`row_masks`)
        self.row_knob: Tensor | None = None  # (N,) 1 where row n runs with the knob (and trains it), 0: knob off

    @property
    def dim(self) -> int:
        return self.delta.numel()

    @property
    def separate(self) -> bool:
        """The knob has its own directions (adapter.quarantine: separate), not δS's."""
        return False

    def forward(self, x: Tensor) -> Tensor:  # (N, T, d_in) -> (N, T, d_out)
        y = self.base(x)
        return y + self.update(x) if self.enabled else y

    def update(self, x: Tensor) -> Tensor:  # (N, T, d_in) -> (N, T, d_out): ΔW x at the current δS, δS_h
        """The adapter's part of the output: δS + δS_h on the main's directions, or with a separate quarantine δS there
        and δS_h on the knob's own."""
        main, knob = self.coefficients()
        if not self.separate:
            return self.correction(x, main + knob)
        return self.correction(x, main) + self.quarantine(x, knob)

    def coefficients(self) -> tuple[Tensor, Tensor]:
        """(δS, δS_h), (D,) each; under `row_masks` per row, (N, 1, D) each: row n runs with δS (its gradient
        reaching δS only where row_main is 1, else δS detached) plus δS_h where row_knob is 1 (and trains it), none
        elsewhere; under `knob_rows` δS (D,) and δS_h per row (N, 1, D)."""
        if self.row_main is None:  # sampling (`knob_rows`): δS for every row, δS_h where row_knob is 1
            return self.delta, self.knob if self.row_knob is None else self.row_knob[:, None, None] * self.knob
        d = self.delta.detach()
        main, knob = self.row_main[:, None, None].to(d.dtype), self.row_knob[:, None, None].to(d.dtype)
        return d + main * (self.delta - d), knob * self.knob  # (N, 1, D) each

    def correction(self, x: Tensor, s: Tensor) -> Tensor:  # (N, T, d_in), (D,) -> (N, T, d_out)
        raise NotImplementedError

    def quarantine(self, x: Tensor, s: Tensor) -> Tensor:  # (N, T, d_in), (D,) or (N, 1, D) -> (N, T, d_out)
        """The separate knob's correction (no probe, no token capture: those read δS's gradient)."""
        raise NotImplementedError

    def _capture(self, z: Tensor, coef_fn, sq_fn) -> None:
        """Register a hook on bottleneck tensor z that stores per-token coefficients (N, T, k) and squared norms
        (N, T) of the per-token δS gradients in backward."""
        if self.token_dirs is None or not z.requires_grad:
            return

        def hook(grad: Tensor) -> None:
            c = coef_fn(grad)  # (N, T, k), in z's dtype (fp32, or fp64 in tests)
            q = sq_fn(grad)  # (N, T); exact for one use of the module per forward (a sum of squares is not additive)
            self.token_coef = c if self.token_coef is None else self.token_coef + c
            self.token_sq = q if self.token_sq is None else self.token_sq + q

        z.register_hook(hook)


class SVDAdapter(Adapter):
    """W' = W + U diag(δS + δS_h) Vᵀ; δS rescales W's top-r singular values (method.md §3.1, delta form)."""

    kind = "svd"

    def __init__(
        self,
        base: nn.Linear,
        U: Tensor,
        V: Tensor,
        param_dtype: torch.dtype = torch.float32,
        quarantine: tuple[Tensor, Tensor] | None = None,
    ):
        super().__init__(base, U.shape[1], param_dtype)
        dt = base.weight.dtype
        self.register_buffer("U", U.to(dt).contiguous(), persistent=False)  # (d_out, r) compute dtype
        self.register_buffer("V", V.to(dt).contiguous(), persistent=False)  # (d_in, r)
        q = quarantine or (None, None)  # U_q (d_out, r), V_q (d_in, r): the knob's own singular directions
        self.register_buffer("Uq", None if q[0] is None else q[0].to(dt).contiguous(), persistent=False)
        self.register_buffer("Vq", None if q[1] is None else q[1].to(dt).contiguous(), persistent=False)

    @property
    def separate(self) -> bool:
        return self.Uq is not None

    def quarantine(self, x: Tensor, s: Tensor) -> Tensor:
        return ((x @ self.Vq) * s).to(x.dtype) @ self.Uq.T

    def correction(self, x: Tensor, s: Tensor) -> Tensor:
        a = x @ self.V  # (N, T, r) = Vᵀx per token
        if self.probe is not None:
            s = s + self.probe.unsqueeze(1)  # (N, 1, r): row n's probe, broadcast over its tokens
        z = a * s  # (N, T, r), fp32 (s is fp32)
        # z = a ⊙ s and ∂L/∂z_t = b_t = Uᵀγ_t, so token t's gradient on δS is a_t ⊙ b_t (eq. 1). Its coefficients
        # <a_t ⊙ b_t, v_j> are reduced inside the hook; no (N, T, r) gradient is kept.
        self._capture(
            z,
            lambda b: torch.einsum("ntr,ntr,kr->ntk", a.to(b.dtype), b, self.token_dirs.to(b.dtype)),
            lambda b: (a.to(b.dtype) * b).pow(2).sum(-1),
        )
        return z.to(x.dtype) @ self.U.T  # (N, T, d_out)


class LoRAAdapter(Adapter):
    """W' = W + (B + B_h) A with A fixed; δS = vec(B) ∈ R^{d_out·r} (method.md §3.1, LoRA alternative)."""

    kind = "lora"

    def __init__(
        self, base: nn.Linear, A: Tensor, param_dtype: torch.dtype = torch.float32, quarantine: Tensor | None = None
    ):
        d_out = base.out_features
        super().__init__(base, d_out * A.shape[0], param_dtype)
        self.register_buffer("A", A.to(base.weight.dtype).contiguous(), persistent=False)  # (r, d_in)
        q = None if quarantine is None else quarantine.to(base.weight.dtype).contiguous()
        self.register_buffer("Aq", q, persistent=False)  # (r, d_in): the knob's own fixed A

    @property
    def separate(self) -> bool:
        return self.Aq is not None

    def quarantine(self, x: Tensor, s: Tensor) -> Tensor:
        xa = x @ self.Aq.T
        xa = xa.to(torch.promote_types(xa.dtype, s.dtype))
        return self._times_B(xa, s, None).to(x.dtype)

    def _times_B(self, xa: Tensor, s: Tensor, probe: Tensor | None) -> Tensor:
        """(N, T, r) A x, coefficients s ((D,) or per row (N, 1, D)) -> (N, T, d_out) B (A x), B = s viewed as
        (d_out, r), per row B_n (+ E_n) where a probe or per-row coefficients are given."""
        d_out, r = self.base.out_features, xa.shape[-1]
        if s.dim() == 1 and probe is None:
            return xa @ s.to(xa.dtype).view(d_out, r).T
        rows = (s if s.dim() == 1 else s[:, 0]).to(xa.dtype)
        rows = rows + (0 if probe is None else probe.to(xa.dtype))  # (N, D)
        return torch.einsum("ntr,nor->nto", xa, rows.view(-1, d_out, r))

    def correction(self, x: Tensor, s: Tensor) -> Tensor:
        xa = x @ self.A.T  # (N, T, r)
        xa = xa.to(torch.promote_types(xa.dtype, s.dtype))  # fp32 at least (δS is an fp32 master)
        d_out, r = self.base.out_features, self.A.shape[0]
        out = self._times_B(xa, s, self.probe)  # (N, T, d_out)
        # per-token gradient on vec(B) is γ_t (A x_t)ᵀ; its coefficient on direction j is γ_tᵀ V_j (A x_t)
        dirs = None if self.token_dirs is None else self.token_dirs.to(xa.dtype).view(-1, d_out, r)  # (k, d_out, r)
        self._capture(
            out,
            lambda g: torch.einsum("nto,kor,ntr->ntk", g, dirs, xa),
            lambda g: g.pow(2).sum(-1) * xa.pow(2).sum(-1),
        )  # ‖γ_t (A x_t)ᵀ‖² = ‖γ_t‖² ‖A x_t‖²
        return out.to(x.dtype)


# --- factors: SVD (cached on disk) and the fixed LoRA A ----------------------------------------------------------


def weight_digest(weight: Tensor) -> str:
    """Content hash of a weight (dtype, shape, bytes): the cache key names the model, revision and module."""
    w = weight.detach().cpu().contiguous()
    h = hashlib.sha256(f"{w.dtype}:{tuple(w.shape)}".encode())
    h.update(w.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:24]


def svd_factors(weight: Tensor, rank: int, cache_dir: Path | str | None = None) -> tuple[Tensor, Tensor]:
    """Top-`rank` thin SVD of `weight` (d_out, d_in) in fp32 -> U (d_out, r), V (d_in, r); cached by content."""
    path = None
    if cache_dir is not None:
        # the CUDA path's factors (a Gram eigh) are their own entries: every stage of a run must see the same U, V
        gram = "-gram" if weight.is_cuda else ""
        path = Path(cache_dir) / f"svd-{weight_digest(weight)}-r{rank}{gram}.safetensors"
        if path.is_file():
            f = load_file(path)
            return f["U"], f["V"]
    w = weight.detach().to(torch.promote_types(weight.dtype, torch.float32))  # fp32 at least (method.md §6.9)
    if w.is_cuda:  # a full GPU SVD of a 4B model's 252 projections takes minutes; the top r need one eigh each
        U, V = top_singular_vectors(w, rank)
    else:
        U, _, Vh = torch.linalg.svd(w, full_matrices=False)
        U, V = U[:, :rank], Vh[:rank].T
    U, V = U.contiguous().cpu(), V.contiguous().cpu()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        save_file({"U": U, "V": V}, str(tmp))
        tmp.replace(path)  # atomic: a killed run never leaves a half-written cache entry
    return U, V


def top_singular_vectors(w: Tensor, rank: int) -> tuple[Tensor, Tensor]:
    """Top-`rank` singular vectors of w (d_out, d_in) from the eigendecomposition of its Gram matrix on the smaller
    side, in fp64: U (d_out, r), V (d_in, r) in w's dtype, σ descending. The same subspaces as the thin SVD's (signs
    aside) wherever σ_r > 0 and the top r are separated from the rest; σ² loses the small singular values to
    rounding, which the top r of a weight matrix never are."""
    w64 = w.double()
    tall = w64.shape[0] >= w64.shape[1]
    gram = w64.T @ w64 if tall else w64 @ w64.T  # (n, n), n = min(d_out, d_in)
    evals, evecs = torch.linalg.eigh(gram)  # ascending
    top = evecs[:, -rank:].flip(-1)  # (n, r) by σ descending
    s = evals[-rank:].flip(-1).clamp(min=0).sqrt().clamp(min=torch.finfo(torch.float64).tiny)  # (r,)
    other = (w64 @ top if tall else w64.T @ top) / s  # the other side's singular vectors: W v = σ u
    U, V = (other, top) if tall else (top, other)
    return U.to(w.dtype), V.to(w.dtype)


def lora_A(weight: Tensor, rank: int, name: str, seed: int) -> Tensor:
    """Fixed A (r, d_in): random semi-orthonormal rows, seeded by (seed, module name)."""
    g = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "big"))
    q, _ = torch.linalg.qr(torch.randn(weight.shape[1], rank, generator=g, dtype=torch.float64))  # (d_in, r)
    return q.T.float()


def pad_columns(x: Tensor, r: int) -> Tensor:
    """x (d, c) with zero columns appended to (d, r) (c <= r): inert quarantine coordinates."""
    return torch.cat([x, x.new_zeros(x.shape[0], r - x.shape[1])], dim=1)


def svd_quarantine(weight: Tensor, r: int, cache_dir: Path | str | None = None) -> tuple[Tensor, Tensor]:
    """The separate knob's (U_q, V_q), (d_out, r) and (d_in, r): W's singular vectors r+1 … 2r (orthogonal to the
    main's top r), zero columns where min(d_in, d_out) < 2r."""
    r2 = min(2 * r, *weight.shape)
    U, V = svd_factors(weight, r2, cache_dir)
    return pad_columns(U[:, r:r2], r), pad_columns(V[:, r:r2], r)


def lora_quarantine(A: Tensor, name: str, seed: int) -> Tensor:
    """The separate knob's fixed A_q (r, d_in): random orthonormal rows orthogonal to A's (zero rows where
    d_in < 2r), seeded by (seed, module name, "quarantine")."""
    r, d_in = A.shape
    g = torch.Generator().manual_seed(
        int.from_bytes(hashlib.sha256(f"{seed}:{name}:quarantine".encode()).digest()[:8], "big")
    )
    a = A.double().T  # (d_in, r), orthonormal columns
    x = torch.randn(d_in, r, generator=g, dtype=torch.float64)
    x = x - a @ (a.T @ x)  # out of A's row space
    q, _ = torch.linalg.qr(x)  # (d_in, r)
    k = min(r, d_in - r)
    return pad_columns(q[:, :k], r).T.float()


# --- attach / query --------------------------------------------------------------------------------------------


def target_names(model: nn.Module, targets: str | tuple[str, ...]) -> list[str]:
    """Dotted names of the Linear modules matching `targets` ("all", "residual_writers" or a tuple of leaf names)."""
    leaves = TARGETS[targets] if isinstance(targets, str) else tuple(targets)
    if isinstance(targets, str) and targets not in TARGETS:
        raise ValueError(f"unknown adapter targets {targets!r}; choose from {sorted(TARGETS)}")
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in leaves]


def load_policy(p, organism: Path, cache_dir: Path | str | None = None) -> tuple[nn.Module, object]:
    """(model, tokenizer): the run config's base policy (`model.name`; the organism's base/ by default) on
    `model.device` in `model.dtype`, with the adapter attached at δS = δS_h = 0 (fp32 masters), in eval mode — what
    train, basis, probe, evaluate and eval_sets all start from, so every checkpoint loads into it. cache_dir: the base
    weights' SVD cache (the basis stage's)."""
    from projected_grpo.policy.model import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(p.model.name, organism / "base", p.model.device, p.model.dtype)
    attach_adapters(
        model,
        p.adapter.targets,
        p.adapter.rank,
        p.adapter.kind,
        cache_dir=cache_dir,
        seed=p.seed,
        separate=p.adapter.quarantine == "separate",
    )
    return model.eval(), tok


def attach_adapters(
    model: nn.Module,
    targets: str | tuple[str, ...] = "all",
    rank: int = 64,
    kind: str = "svd",
    cache_dir: Path | str | None = None,
    seed: int = 0,
    param_dtype: torch.dtype = torch.float32,
    separate: bool = False,
) -> list[str]:
    """Wrap every target Linear in place; returns the wrapped names. r_m = min(rank, d_in, d_out) per module.
    separate: the knob gets its own directions (`svd_quarantine`, `lora_quarantine`; adapter.quarantine).

    δS / δS_h are `param_dtype` masters (fp32; fp64 in the invariant tests). Attach after moving/casting the model:
    `model.to(dtype)` would cast the masters too."""
    if kind not in KINDS:
        raise ValueError(f"adapter.kind must be one of {KINDS}, got {kind!r}")
    if rank < 1:
        raise ValueError(f"adapter.rank must be >= 1, got {rank}")
    if adapters(model):
        raise ValueError("model already has adapters attached")
    names = target_names(model, targets)
    if not names:
        raise ValueError(f"no Linear module matches adapter targets {targets!r}")
    for name in names:
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        lin: nn.Linear = getattr(parent, leaf)
        r = min(rank, *lin.weight.shape)
        dev = lin.weight.device
        if kind == "svd":
            U, V = svd_factors(lin.weight, r, cache_dir)
            q = tuple(t.to(dev) for t in svd_quarantine(lin.weight, r, cache_dir)) if separate else None
            wrapped: Adapter = SVDAdapter(lin, U.to(dev), V.to(dev), param_dtype, q)
        else:
            A = lora_A(lin.weight, r, name, seed)
            q = lora_quarantine(A, name, seed).to(dev) if separate else None
            wrapped = LoRAAdapter(lin, A.to(dev), param_dtype, q)
        wrapped.to(lin.weight.device)
        setattr(parent, leaf, wrapped)
    for p in model.parameters():  # only δS / δS_h train
        p.requires_grad_(False)
    for a in adapters(model).values():
        a.delta.requires_grad_(True)
        a.knob.requires_grad_(True)
    return names


def adapters(model: nn.Module) -> dict[str, Adapter]:
    """{wrapped module name: adapter}, in module order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, Adapter)}


def adapter_parameters(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(main δS list, knob δS_h list), in module order."""
    ads = adapters(model).values()
    return [a.delta for a in ads], [a.knob for a in ads]


# --- switches (reference policy, deploy) ----------------------------------------------------------------------


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """The reference policy: every adapter path skipped (equivalent to δS = δS_h = 0, I1/I18)."""
    ads = list(adapters(model).values())
    before = [a.enabled for a in ads]
    for a in ads:
        a.enabled = False
    try:
        yield
    finally:
        for a, b in zip(ads, before):
            a.enabled = b


def knob_off(model: nn.Module) -> None:
    """Deploy without the knob: δS_h := 0 (the trained value is kept aside for `knob_on`). Idempotent."""
    with torch.no_grad():
        for a in adapters(model).values():
            if a._knob_saved is None:
                a._knob_saved = a.knob.detach().clone()
                a.knob.zero_()


def knob_on(model: nn.Module) -> None:
    """Restore the trained δS_h bit-exactly after `knob_off`. Idempotent."""
    with torch.no_grad():
        for a in adapters(model).values():
            if a._knob_saved is not None:
                a.knob.copy_(a._knob_saved)
                a._knob_saved = None


@contextmanager
def knob_disabled(model: nn.Module) -> Iterator[None]:
    knob_off(model)
    try:
        yield
    finally:
        knob_on(model)


@contextmanager
def row_masks(model: nn.Module, main: Tensor, knob: Tensor) -> Iterator[None]:
    """Per-row forward masks for the next forward (and its backward) of N rows: row n runs with δS + δS_h where
    knob[n] = 1, with δS alone where it is 0, and its gradient reaches δS only where main[n] = 1 (δS's value stays in
    the forward either way) and δS_h only where knob[n] = 1. So δS.grad = Σ_n main_n g_n and
    δS_h.grad = Σ_n knob_n g_n, each g_n the row's gradient in its own state: masked routing's routed rows train only
    the knob (main detached), unrouted ones only the main in the deployed, knob-off state, ambiguous ones both (issue
    25). Probes see each row's whole gradient in its state. Nested blocks (a forward of other rows inside, e.g. the
    distinct prompts of a shared-prompt forward) restore the outer masks on exit."""
    ads = list(adapters(model).values())
    saved = [(a.row_main, a.row_knob) for a in ads]
    for a in ads:
        a.row_main, a.row_knob = main, knob
    try:
        yield
    finally:
        for a, (m, k) in zip(ads, saved):
            a.row_main, a.row_knob = m, k


@contextmanager
def knob_rows(model: nn.Module, knob: Tensor) -> Iterator[None]:
    """Per-row knob for the forwards of N rows inside (sampling, no gradient routing): row n runs with δS + δS_h
    where knob[n] = 1 and with δS alone (the deployed policy) where it is 0. knob (N,) is read as a tensor, so a
    captured CUDA graph (`decode`) follows later writes to it. Equal to running the knob-on rows as the adapters stand
    and the knob-off rows under `knob_disabled`, up to float rounding (a per-row product instead of a shared one)."""
    ads = list(adapters(model).values())
    saved = [(a.row_main, a.row_knob) for a in ads]
    for a in ads:
        a.row_main, a.row_knob = None, knob.to(a.knob.dtype)
    try:
        yield
    finally:
        for a, (m, k) in zip(ads, saved):
            a.row_main, a.row_knob = m, k


# --- per-sample probes and per-token capture ------------------------------------------------------------------


@contextmanager
def probes(model: nn.Module, n: int) -> Iterator[dict[str, Tensor]]:
    """Zero leaves e_m (n, D_m) in every adapter; after backward `e_m.grad[i]` is batch row i's gradient on δS_m.

    The batch dimension of the forward pass must be n (one row per rollout / completion)."""
    ads = adapters(model)
    es = {}
    for name, a in ads.items():
        e = torch.zeros(n, a.dim, dtype=a.delta.dtype, device=a.delta.device, requires_grad=True)
        a.probe = e
        es[name] = e
    try:
        yield es
    finally:
        for a in ads.values():
            a.probe = None


@contextmanager
def probes_paused(model: nn.Module) -> Iterator[None]:
    """Probes and per-token capture off for a forward whose batch rows are not the probed rows: the shared-prompt
    forward of `logprobs.shared_prompt_logprobs` runs each distinct prompt once for the G rows of its group. What runs
    inside reaches δS.grad (the sum over rows) but no row's probe, so `e.grad[n]` becomes row n's *own-token*
    gradient: Σ_t b_t ⊙ a_t over its completion tokens only (the prompt positions' part, which the rows of a group
    share, stays in δS.grad)."""
    ads = list(adapters(model).values())
    saved = [(a.probe, a.token_dirs) for a in ads]
    for a in ads:
        a.probe, a.token_dirs = None, None
    try:
        yield
    finally:
        for a, (pr, td) in zip(ads, saved):
            a.probe, a.token_dirs = pr, td


@contextmanager
def token_capture(model: nn.Module, dirs: dict[str, Tensor]) -> Iterator[dict[str, Adapter]]:
    """While open, backward stores per-token coefficients `adapter.token_coef` (N, T, k_m) = <g_{m,n,t}, dirs_m[j]>
    and squared norms `adapter.token_sq` (N, T) = ‖g_{m,n,t}‖² for every module named in `dirs` ((k_m, D_m) each);
    no (N, T, D) tensor is kept (method.md §3.2)."""
    ads = adapters(model)
    unknown = sorted(set(dirs) - set(ads))
    if unknown:
        raise KeyError(f"token_capture: no adapter named {unknown[:3]}")
    for name, d in dirs.items():
        ads[name].token_dirs, ads[name].token_coef, ads[name].token_sq = d, None, None
    try:
        yield {n: ads[n] for n in dirs}
    finally:
        for name in dirs:
            ads[name].token_dirs = None


# --- save / load (only δS, δS_h + metadata) -------------------------------------------------------------------


# --- whole-policy views of the adapters (evaluation, knob-effect policies) ----------------------------------


def adapter_is_zero(model: nn.Module) -> bool:
    """δS = δS_h = 0 everywhere: the policy is bit-identical to the base (I1), so base scores stand for it."""
    return all(bool((a.delta == 0).all() and (a.knob == 0).all()) for a in adapters(model).values())


def delta_weight(a: Adapter) -> torch.Tensor:
    """The dense (d_out, d_in) weight update of adapter `a` at its current δS and δS_h (linear in x, so read it off
    the identity)."""
    eye = torch.eye(a.base.in_features, dtype=a.base.weight.dtype, device=a.base.weight.device)
    with torch.no_grad():
        return a.update(eye.unsqueeze(0))[0].T.to(a.base.weight.dtype)


@contextmanager
def merged(model: nn.Module) -> Iterator[None]:
    """Sample from W + ΔW as plain Linears (no adapter matmuls): the same policy up to float rounding, faster.
    The adapters are put back on exit. Use for sampling only (no probes, no gradients: GRPO rollouts, evaluation).
    The Linears are built uninitialised (no draw from the global RNG). Below fp32 (a bf16 base) it merges nothing:
    W + ΔW rounded to bf16 would lose most of a small ΔW, so sampling goes through the adapters."""
    swapped: list[tuple[nn.Module, str, Adapter]] = []
    if any(a.base.weight.dtype != torch.float32 for a in adapters(model).values()):
        yield
        return
    try:
        for name, a in list(adapters(model).items()):
            parent_name, _, leaf = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            lin = nn.utils.skip_init(
                nn.Linear,
                a.base.in_features,
                a.base.out_features,
                bias=a.base.bias is not None,
                dtype=a.base.weight.dtype,
                device=a.base.weight.device,
            )
            with torch.no_grad():
                w = a.base.weight + (delta_weight(a) if a.enabled else 0)
                lin.weight.copy_(w)
                if a.base.bias is not None:
                    lin.bias.copy_(a.base.bias)
            lin.requires_grad_(False)
            setattr(parent, leaf, lin)
            swapped.append((parent, leaf, a))
        yield
    finally:
        for parent, leaf, a in swapped:
            setattr(parent, leaf, a)


@contextmanager
def set_deltas(model: nn.Module, deltas: dict[str, Tensor]) -> Iterator[None]:
    """Set every adapter's δS to `deltas` and δS_h to 0 for the block; both restored bit-exactly afterwards."""
    ads = adapters(model)
    saved = {n: (a.delta.detach().clone(), a.knob.detach().clone()) for n, a in ads.items()}
    try:
        with torch.no_grad():
            for n, a in ads.items():
                a.delta.copy_(deltas[n])
                a.knob.zero_()
        yield
    finally:
        with torch.no_grad():
            for n, a in ads.items():
                a.delta.copy_(saved[n][0])
                a.knob.copy_(saved[n][1])


def save_adapter(model: nn.Module, path: Path | str, metadata: dict[str, object] | None = None) -> None:
    """Write δS and δS_h of every adapter (the trained knob even while it is switched off) as safetensors."""
    tensors = {}
    for name, a in adapters(model).items():
        tensors[f"{name}.delta"] = a.delta.detach().cpu().contiguous()
        knob = a._knob_saved if a._knob_saved is not None else a.knob.detach()
        tensors[f"{name}.knob"] = knob.cpu().contiguous()
    kinds = {a.kind for a in adapters(model).values()}
    separate = any(a.separate for a in adapters(model).values())
    meta = {"kind": ",".join(sorted(kinds)), **({"quarantine": "separate"} if separate else {}), **(metadata or {})}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    # One metadata entry: safetensors serialises its metadata map in hash order, so several keys would make the bytes
    # (and the DVC hash) of identical adapters differ from run to run.
    save_file(tensors, str(tmp), metadata={"meta": json.dumps(meta, sort_keys=True)})
    tmp.replace(path)


def read_metadata(f) -> dict[str, object]:
    """The metadata of an open `save_adapter` file (older files: one JSON value per key)."""
    raw = f.metadata() or {}
    return json.loads(raw["meta"]) if "meta" in raw else {k: json.loads(v) for k, v in raw.items()}


def adapter_metadata(path: Path | str) -> dict[str, object]:
    """The metadata `save_adapter` wrote to `path` (kind, quarantine when separate, the caller's), without tensors."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return read_metadata(f)


def load_adapter(model: nn.Module, path: Path | str) -> dict[str, object]:
    """Load δS and δS_h saved by `save_adapter` into the attached adapters; returns the metadata."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = read_metadata(f)
        keys = set(f.keys())
        ads = adapters(model)
        q_file, q_model = (
            meta.get("quarantine", "shared"),
            "separate" if any(a.separate for a in ads.values()) else "shared",
        )
        if q_file != q_model:
            raise ValueError(
                f"adapter file {path} was trained with adapter.quarantine={q_file}, the attached adapters have "
                f"{q_model}; attach with the run's adapter params"
            )
        want = {f"{n}.{p}" for n in ads for p in ("delta", "knob")}
        if keys != want:
            missing, extra = sorted(want - keys)[:3], sorted(keys - want)[:3]
            raise ValueError(
                f"adapter file {path} does not match the attached adapters (missing {missing}, "
                f"unexpected {extra}); attach with the same targets, rank and kind"
            )
        with torch.no_grad():
            for name, a in ads.items():
                for pname in ("delta", "knob"):
                    t = f.get_tensor(f"{name}.{pname}")
                    p = getattr(a, pname)
                    if t.shape != p.shape:
                        raise ValueError(
                            f"adapter file {path}: {name}.{pname} has shape {tuple(t.shape)}, "
                            f"the attached adapter {tuple(p.shape)}"
                        )
                    p.copy_(t)
                a._knob_saved = None
    return meta

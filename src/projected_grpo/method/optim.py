"""Adam (or SGD) in rotated coordinates, with per-group clipping: the optimizer every arm shares (method.md §3.6).

Why rotate: Adam divides each coordinate by its own √v, which does not commute with a projection. Erase the hack
component of every gradient, step plain Adam on δS, and the *update* still has a large part in span(Vh) (§3.6: about
40% of its norm). Here each module's parameters live in the basis R = [Vhᵀ | V⊥]:

    δS = R θ,   δS_h = R φ,   θ.grad = Rᵀ g  (first k coords = α = Vh g; the arms mask them, projection.py)

A coordinate that the arm always zeroes has exactly-zero Adam moments, so its update is exactly 0 and the parameter
never moves off the intended subspace (I9/I10). θ and φ are the master copies; δS and δS_h are written from them
after every step (in place, no grad), so the adapter's Parameters stay what the model reads.

Clipping is per group (main θ, knob φ), never global: the main step of a route run then depends only on g − h, which
is what makes "knob off" an exact replay of an erase run on the same raw gradients (method.md §3.9a, I11).

A refreshed basis (method.md §3.6, `rebase`) swaps R per module without moving the parameters: θ and φ are
re-expressed as R_newᵀ δS and R_newᵀ δS_h, and the Adam state of the modules whose R changed is either reset or
rotated (see `rebase` for why the part of the first moment that would land in the new span(Vh) is dropped). Bias
correction therefore counts steps per module and moment, so a reset second moment is unbiased from its first step.

`kind="adam_unrotated"` runs plain Adam on δS itself (the edited rotated grads are mapped back with R first). It is
the known-wrong design, kept only as the regression guard of I10: the erase-orthogonality test must fail with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from projected_grpo.method.projection import clip_coef, grad_norm

KINDS = ("adam", "sgd", "adam_unrotated")
GROUPS = ("main", "knob")
MOMENTS = ("rotate", "reset")  # what `rebase` does with the Adam state of a module whose rotation changed


@dataclass(frozen=True)
class Hyper:
    """The optimizer's settings: Adam(W)'s lr, betas, eps and decoupled, isotropic weight decay (commutes with R); the
    per-group clip norms (None: no clipping); kind: "adam" (rotated), "sgd" (rotated, linear: the reference optimizer)
    or "adam_unrotated" (guard only)."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_norm_main: float | None = None
    max_norm_knob: float | None = None
    kind: str = "adam"

    @classmethod
    def of(cls, g) -> Hyper:
        """params.yaml's grpo section's optimizer settings."""
        return cls(g.lr, tuple(g.betas), g.eps, g.weight_decay, g.max_norm, g.max_norm_knob, g.optimizer)


class RotatedAdam:
    """Per-module Adam/SGD on θ = Rᵀ δS and φ = Rᵀ δS_h; modules without a rotation use R = I.

    Args:
        deltas, knobs: {module: (D_m,) Parameter} δS and δS_h of the adapters (same keys).
        rotations: {module: (D_m, D_m) orthogonal R_m} for the modules with a basis (`complete_rotation`).
        hp: the hyperparameters (`Hyper`).
    """

    def __init__(
        self,
        deltas: dict[str, nn.Parameter],
        knobs: dict[str, nn.Parameter],
        rotations: dict[str, Tensor],
        hp: Hyper = Hyper(),
    ):
        kind, lr, betas, eps, weight_decay = hp.kind, hp.lr, hp.betas, hp.eps, hp.weight_decay
        if kind not in KINDS:
            raise ValueError(f"optimizer kind must be one of {KINDS}, got {kind!r}")
        if set(knobs) != set(deltas):
            raise KeyError(f"deltas and knobs name different modules: {sorted(set(deltas) ^ set(knobs))[:3]}")
        unknown = sorted(set(rotations) - set(deltas))
        if unknown:
            raise KeyError(f"rotations for unknown modules {unknown[:3]}")
        if kind != "sgd" and not eps > 0:
            raise ValueError(f"Adam eps must be > 0 (masked coordinates divide 0 by it), got {eps}")
        self.kind, self.lr, self.betas, self.eps, self.weight_decay = kind, lr, tuple(betas), eps, weight_decay
        self.max_norm = {"main": hp.max_norm_main, "knob": hp.max_norm_knob}
        self.names = list(deltas)
        self.params = {"main": dict(deltas), "knob": {n: knobs[n] for n in self.names}}
        self.R: dict[str, Tensor] = {}  # (D, D) in the parameter dtype; absent = identity
        for n, R in rotations.items():
            p = deltas[n]
            if p.dim() != 1 or R.shape != (p.numel(), p.numel()):
                raise ValueError(f"{n}: rotation {tuple(R.shape)} does not match δS {tuple(p.shape)}")
            self.R[n] = R.detach().to(p.device, p.dtype)
        # Optimizer coordinates: θ = Rᵀ δS, φ = Rᵀ δS_h (exactly 0 at the adapter's init); δS itself when unrotated.
        self.coords = {g: {n: self._to_coords(n, p.detach()) for n, p in ps.items()} for g, ps in self.params.items()}
        adam = kind != "sgd"
        self.exp_avg = {
            g: {n: torch.zeros_like(c) for n, c in cs.items()} if adam else {} for g, cs in self.coords.items()
        }
        self.exp_avg_sq = {
            g: {n: torch.zeros_like(c) for n, c in cs.items()} if adam else {} for g, cs in self.coords.items()
        }
        self.t = 0  # optimizer steps taken
        # Steps each first / second moment has accumulated, per group and module: Adam's bias correction. Equal to t
        # until a refresh resets a module's moments (`rebase`), so a run without refreshes is plain Adam bit for bit.
        self.t_m = {g: dict.fromkeys(self.names, 0) for g in GROUPS}
        self.t_v = {g: dict.fromkeys(self.names, 0) for g in GROUPS}

    @property
    def theta(self) -> dict[str, Tensor]:
        return self.coords["main"]

    @property
    def phi(self) -> dict[str, Tensor]:
        return self.coords["knob"]

    # --- coordinates ------------------------------------------------------------------------------------------

    def rotate(self, grads: dict[str, Tensor]) -> dict[str, Tensor]:
        """{module: (..., D)} raw grads g -> rotated g @ R (= Rᵀ g per row; first k coords = α). Works per sample.

        The training loop must rotate with this R (the optimizer's dtype and device), so the arm masks act on exactly
        the coordinates that the update runs in."""
        return {n: g @ self.R[n].to(g.dtype) if n in self.R else g for n, g in grads.items()}

    def _to_coords(self, n: str, p: Tensor) -> Tensor:  # (D,) parameter -> (D,) optimizer coordinates
        if self.kind == "adam_unrotated" or n not in self.R:
            return p.clone()
        return self.R[n].T @ p

    def _to_param(self, n: str, c: Tensor) -> Tensor:  # (D,) optimizer coordinates -> (D,) parameter
        if self.kind == "adam_unrotated" or n not in self.R:
            return c
        return self.R[n] @ c

    def _in_coords(self, n: str, x: Tensor) -> Tensor:  # (D,) rotated (edited) grad -> grad in optimizer coords
        if self.kind == "adam_unrotated" and n in self.R:
            return self.R[n] @ x  # back to δS coordinates: plain Adam sees g' = R x
        return x

    @torch.no_grad()
    def resync_main(self) -> None:
        """θ ← Rᵀ δS after δS changed outside the optimizer (retain heal), so a saved state rewrites the same δS."""
        self.coords["main"] = {n: self._to_coords(n, p.detach()) for n, p in self.params["main"].items()}

    # --- a refreshed basis ------------------------------------------------------------------------------------

    @torch.no_grad()
    def rebase(self, rotations: dict[str, Tensor], heads: dict[str, int], moments: str = "rotate") -> list[str]:
        """Swap in new rotations {module: (D, D)} (absent = identity) after a basis refresh; returns the modules whose
        rotation changed. `heads[m]` = k_m of the new basis (R's first k_m columns are Vh_mᵀ).

        The parameters δS, δS_h do not move: θ ← R_newᵀ δS, φ ← R_newᵀ δS_h (δS = R θ describes the same point).
        Adam state of a changed module (method.md §3.6), by `moments`:
          reset:  m = v = 0 in both groups; the module restarts Adam as at step 0.
          rotate: the main group's first moment is re-expressed, m ← R_newᵀ R_old m, except its first k_m
                  coordinates (the new span(Vh)), which are zeroed; the knob's first moment and every second moment
                  are reset. Why zero those: with v reset, a coordinate whose gradient the arm masks to 0 (erase,
                  one-sided, the knob's tail) would step by m/eps; and carried-over momentum inside the new span would
                  break "no update in span(Vh)" (I10) from the very first step after the refresh.
        Reset moments restart their bias correction (per-module step counts), so v̂ is unbiased after a reset."""
        if moments not in MOMENTS:
            raise ValueError(f"rebase moments must be one of {MOMENTS}, got {moments!r}")
        unknown = sorted(set(rotations) - set(self.names))
        if unknown:
            raise KeyError(f"rotations for unknown modules {unknown[:3]}")
        changed = []
        for n in self.names:
            old, new = self.R.get(n), rotations.get(n)
            if new is not None:
                p = self.params["main"][n]
                if new.shape != (p.numel(), p.numel()):
                    raise ValueError(f"{n}: rotation {tuple(new.shape)} does not match δS {tuple(p.shape)}")
                new = new.detach().to(p.device, p.dtype)
            if (old is None and new is None) or (old is not None and new is not None and torch.equal(old, new)):
                continue
            changed.append(n)
            if new is None:
                del self.R[n]
            else:
                self.R[n] = new
            if self.kind == "adam_unrotated":  # coordinates and moments live in δS space: only the grad map changes
                continue
            for g in GROUPS:
                self.coords[g][n] = self._to_coords(n, self.params[g][n].detach())  # (D,) same point, new basis
                if self.kind == "sgd":
                    continue
                m = self.exp_avg[g][n]
                if moments == "rotate" and g == "main":
                    m_param = m if old is None else old @ m  # (D,) momentum in δS coordinates
                    m.copy_(m_param if new is None else new.T @ m_param)
                    m[: heads.get(n, 0) if new is not None else 0] = 0
                else:
                    m.zero_()
                    self.t_m[g][n] = 0
                self.exp_avg_sq[g][n].zero_()
                self.t_v[g][n] = 0
        return changed

    # --- the step ---------------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, main_grads: dict[str, Tensor], knob_grads: dict[str, Tensor] | None = None) -> dict[str, float]:
        """One update from edited, *rotated* grads: {module: (D,)} for θ (every module) and φ (missing = 0).

        Clips each group by its own norm, updates θ/φ per coordinate, writes δS = R θ and δS_h = R φ in place.
        Returns {"grad_norm_main", "grad_norm_knob", "clip_main", "clip_knob"} (norms before clipping)."""
        knob_grads = knob_grads or {}
        missing = [n for n in self.names if n not in main_grads]
        unknown = sorted((set(main_grads) | set(knob_grads)) - set(self.names))
        if missing or unknown:
            raise KeyError(f"step: main grads missing {missing[:3]}, unknown modules {unknown[:3]}")
        grads = {"main": main_grads, "knob": knob_grads}
        self.t += 1
        for g in GROUPS:
            for n in self.names:
                self.t_m[g][n] += 1
                self.t_v[g][n] += 1
        metrics = {}
        for group in GROUPS:
            gs = grads[group]
            norm = grad_norm(list(gs.values()))
            coef = clip_coef(list(gs.values()), self.max_norm[group])  # one coefficient per group (I11)
            metrics[f"grad_norm_{group}"], metrics[f"clip_{group}"] = norm, coef
            for n in self.names:
                c = self.coords[group][n]  # (D,)
                if n not in gs:  # treated as an exact zero gradient (e.g. a knob with nothing routed this step)
                    g = torch.zeros_like(c)
                else:
                    g = self._in_coords(n, gs[n].detach().to(c.dtype))
                    g = g * coef if coef < 1.0 else g
                self._update(group, n, c, g)
                self.params[group][n].copy_(self._to_param(n, c))
        return metrics

    def _update(self, group: str, n: str, c: Tensor, g: Tensor) -> None:
        """In-place per-coordinate update of c (D,) from g (D,): SGD, or AdamW (torch's formula, decoupled decay)."""
        lr, wd = self.lr, self.weight_decay
        if wd:
            c.mul_(1 - lr * wd)  # isotropic: a coordinate at exactly 0 stays exactly 0
        if self.kind == "sgd":
            c.add_(g, alpha=-lr)
            return
        b1, b2 = self.betas
        m, v = self.exp_avg[group][n], self.exp_avg_sq[group][n]
        # mul+add rather than lerp: b1·m + (1−b1)·g is a sum of two terms of g's sign, so a coordinate whose grads are
        # all ≤ 0 (one_sided/reverse) keeps m ≤ 0 in floating point too, and a coordinate whose grads are all 0 keeps
        # m = v = 0 exactly, so its update is 0/eps = 0.
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        bc1, bc2 = 1 - b1 ** self.t_m[group][n], 1 - b2 ** self.t_v[group][n]  # = 1 − β^t without refreshes
        denom = (v.sqrt() / math.sqrt(bc2)).add_(self.eps)  # √v̂ + eps, as torch.optim.AdamW
        c.addcdiv_(m, denom, value=-lr / bc1)  # descent: c ← c − lr·m̂/(√v̂ + eps)

    # --- checkpoints ------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything needed for a bit-exact resume (copies, so later steps do not change a saved dict)."""

        def copy(d: dict[str, dict[str, Tensor]]) -> dict[str, dict[str, Tensor]]:
            return {g: {n: t.clone() for n, t in ts.items()} for g, ts in d.items()}

        return {
            "kind": self.kind,
            "step": self.t,
            "lr": self.lr,
            "betas": self.betas,
            "eps": self.eps,
            "weight_decay": self.weight_decay,
            "max_norm": dict(self.max_norm),
            "coords": copy(self.coords),
            "exp_avg": copy(self.exp_avg),
            "exp_avg_sq": copy(self.exp_avg_sq),
            "rotations": {n: R.clone() for n, R in self.R.items()},
            "t_m": {g: dict(ts) for g, ts in self.t_m.items()},
            "t_v": {g: dict(ts) for g, ts in self.t_v.items()},
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Restore a `state_dict` and rewrite δS = R θ, δS_h = R φ. The rotations must be identical: a refreshed basis
        needs its moments rotated or reset explicitly (method.md §3.6, `rebase`), never a silent mismatch; a run that
        resumes after a refresh builds this optimizer with the checkpoint's rotations."""
        if state["kind"] != self.kind:
            raise ValueError(f"checkpoint optimizer kind {state['kind']!r} != {self.kind!r}")
        if set(state["rotations"]) != set(self.R) or any(
            not torch.equal(state["rotations"][n].to(R.device, R.dtype), R) for n, R in self.R.items()
        ):
            raise ValueError("checkpoint rotations differ from this optimizer's (basis changed?); see method.md §3.6")
        if set(state["coords"]["main"]) != set(self.names):
            raise KeyError("checkpoint optimizer covers different modules")
        self.t, self.lr, self.betas, self.eps = state["step"], state["lr"], tuple(state["betas"]), state["eps"]
        self.weight_decay, self.max_norm = state["weight_decay"], dict(state["max_norm"])
        for key in ("t_m", "t_v"):  # per-module bias-correction counts (= step in checkpoints written before refresh)
            saved = state.get(key, {g: dict.fromkeys(self.names, self.t) for g in GROUPS})
            setattr(self, key, {g: {n: int(saved[g][n]) for n in self.names} for g in GROUPS})
        for key in ("coords", "exp_avg", "exp_avg_sq"):
            for g, ts in getattr(self, key).items():
                for n, t in ts.items():
                    t.copy_(state[key][g][n])
        for g in GROUPS:
            for n in self.names:
                self.params[g][n].copy_(self._to_param(n, self.coords[g][n]))

"""Projection arms, routing, the gate and the rotated optimizer: invariants I5–I12, I15, I17 of method.md §5.

Pure-math tests run on random float64 inputs, parametrised over (r, k); the optimizer tests run short optimisation
runs on a separable noisy quadratic and assert on the *parameters* δS / δS_h, not only on the gradients (house_style
§7 pattern 7). I17 uses the tiny Qwen3 model with per-token capture, in the training layout (left-padded prompts), and
checks the captured reductions against per-token gradients rebuilt independently from module hooks; per-token scores,
gates and routing are checked on them. The basis refresh (`RotatedAdam.rebase`) keeps the parameters, keeps erase
exact from the first step after it, handles modules joining/leaving the kept set, and resumes bit-exactly.

`PYTHONPATH=src python -m pytest -q tests/test_projection.py`
"""

import io

import pytest
import torch
from torch import nn

from projected_grpo.method import projection as proj
from projected_grpo.method.basis import auroc, random_directions
from projected_grpo.method.optim import Hyper, RotatedAdam
from projected_grpo.method.projection import (
    ARMS,
    band_gate,
    calibrate_band,
    clip_coef,
    complete_rotation,
    completion_positions,
    edit_coords,
    rank_auroc,
    rollout_scores,
    route_per_rollout,
    route_per_token,
    token_gate,
    token_scores,
    window_sum,
)

SHAPES = [(8, 1), (16, 3), (64, 8)]  # (r, k)
F64 = torch.float64
ERASE_ARMS = ("erase_no_gate", "erase_one_sided", "erase_reverse")


# --- helpers ----------------------------------------------------------------------------------------------------


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def make_vh(r: int, k: int, seed: int = 0) -> torch.Tensor:
    """(k, r) Haar-random orthonormal rows (an oriented basis as far as these tests care)."""
    return random_directions(k, r, gen(seed), F64)


def edit_g(g, vh, arm):
    """Edit raw grads g (n, r) in original δS coordinates: rotate, mask, rotate back -> (g', h) (n, r)."""
    R = complete_rotation(vh)
    main, knob = edit_coords(g @ R, vh.shape[0], arm)
    return main @ R.T, knob @ R.T


def span_residual(x, vh):
    """(n, r) component of x outside span(Vh)."""
    return x - (x @ vh.T) @ vh


def norms(x):
    return x.norm(dim=-1, keepdim=True)  # (n, 1)


class Quadratic:
    """Separable noisy quadratic per module: g_t(w) = A (w − c) + ξ_t, with w = δS + δS_h (tied raw gradient, I3)."""

    def __init__(self, r: int, seed: int):
        g = gen(seed)
        q, _ = torch.linalg.qr(torch.randn(r, r, generator=g, dtype=F64))
        self.A = q @ torch.diag(torch.linspace(0.5, 2.0, r, dtype=F64)) @ q.T  # SPD, (r, r)
        self.c = torch.randn(r, generator=g, dtype=F64)  # (r,) optimum
        self.seed = seed

    def grad(self, w, t: int):
        noise = torch.randn(w.shape[0], generator=gen(1000 * self.seed + t), dtype=F64)
        return self.A @ (w.detach() - self.c) + noise  # (r,)

    def per_sample(self, w, t: int, n: int):
        """(n, r) per-rollout pieces that sum to a gradient of the same kind (random signs per rollout)."""
        pieces = torch.randn(n, w.shape[0], generator=gen(7000 * self.seed + t), dtype=F64)
        return pieces + (self.A @ (w.detach() - self.c))[None] / n


def make_opt(vhs, r, kind="adam", lr=1e-2, clip=None, wd=0.0):
    """(optimizer, deltas, knobs) for modules {name: vh or None}; all parameters start at exactly 0."""
    deltas = {n: nn.Parameter(torch.zeros(r, dtype=F64)) for n in vhs}
    knobs = {n: nn.Parameter(torch.zeros(r, dtype=F64)) for n in vhs}
    rots = {n: complete_rotation(vh) for n, vh in vhs.items() if vh is not None}
    opt = RotatedAdam(
        deltas, knobs, rots, Hyper(lr=lr, weight_decay=wd, max_norm_main=clip, max_norm_knob=clip, kind=kind)
    )
    return opt, deltas, knobs


def run(arm, vhs, r, kind="adam", T=50, clip=None, wd=0.0, n_roll=4, seed=0, on_step=None):
    """T steps of `arm` on the quadratic; returns (opt, deltas, knobs, log) with log = per-step dicts.

    Batch arms edit the accumulated rotated grad; the per-rollout rules (projection.ROLLOUT_RULES) route per-sample
    pieces with random gates."""
    opt, deltas, knobs = make_opt(vhs, r, kind, clip=clip, wd=wd)
    probs = {n: Quadratic(r, seed + i) for i, n in enumerate(vhs)}
    ks = {n: 0 if vh is None else vh.shape[0] for n, vh in vhs.items()}
    log = []
    for t in range(T):
        main, knob, raw = {}, {}, {}
        for n in vhs:
            w = deltas[n] + knobs[n]
            if arm in proj.ROLLOUT_RULES:
                x_n = opt.rotate({n: probs[n].per_sample(w, t, n_roll)})[n]  # (N, r)
                m = torch.rand(n_roll, generator=gen(99 + t), dtype=F64)
                main[n], knob[n] = proj.ROLLOUT_RULES[arm](x_n, ks[n], m)
                raw[n] = x_n.sum(0)
            else:
                raw[n] = opt.rotate({n: probs[n].grad(w, t)})[n]  # (r,) = Rᵀ g
                main[n], knob[n] = edit_coords(raw[n], ks[n], arm)
        if on_step is not None:
            on_step(t, raw)
        metrics = opt.step(main, knob)
        log.append(
            {
                "raw": raw,
                "main": main,
                "knob": knob,
                "metrics": metrics,
                "delta": {n: p.detach().clone() for n, p in deltas.items()},
                "knobp": {n: p.detach().clone() for n, p in knobs.items()},
            }
        )
    return opt, deltas, knobs, log


# --- the rotation -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("r,k", [*SHAPES, (8, 0), (6, 6)])
def test_complete_rotation_orthogonal_with_vh_first(r, k):
    vh = make_vh(r, k)
    R = complete_rotation(vh)
    torch.testing.assert_close(R.T @ R, torch.eye(r, dtype=F64), atol=1e-13, rtol=0)
    assert torch.equal(R[:, :k], vh.T)  # first k rotated coords are exactly α = Vh g
    assert torch.equal(R, complete_rotation(vh.clone()))  # deterministic
    x = torch.randn(3, r, generator=gen(1), dtype=F64)
    torch.testing.assert_close((x @ R)[:, :k], x @ vh.T, atol=1e-13, rtol=0)


# --- I5–I7: the erase arms on the gradient ------------------------------------------------------------------------


@pytest.mark.parametrize("r,k", SHAPES)
def test_I5_erase_no_gate(r, k):
    vh, g = make_vh(r, k), torch.randn(6, r, generator=gen(1), dtype=F64)
    g2, h = edit_g(g, vh, "erase_no_gate")
    assert (g2 @ vh.T).abs().max() <= 1e-12 * g.norm()  # cos(g', v_j) = 0 for every j
    assert span_residual(g - g2, vh).abs().max() <= 1e-12 * g.norm()  # g − g' ∈ span(Vh)
    assert (norms(g2) <= norms(g) * (1 + 1e-12)).all()
    torch.testing.assert_close(g2, g - (g @ vh.T) @ vh, atol=1e-12, rtol=0)  # reference: g − P g
    assert torch.equal(h, torch.zeros_like(h))
    # idempotent: bitwise in the optimizer's coordinates, to fp in δS coordinates
    R = complete_rotation(vh)
    main = edit_coords(g @ R, k, "erase_no_gate")[0]
    assert torch.equal(edit_coords(main, k, "erase_no_gate")[0], main)
    torch.testing.assert_close(edit_g(g2, vh, "erase_no_gate")[0], g2, atol=1e-12, rtol=0)


@pytest.mark.parametrize("arm", ARMS)
def test_I5_k0_modules_untouched_by_every_arm(arm):
    x = torch.randn(5, 8, generator=gen(2), dtype=F64)
    main, knob = edit_coords(x, 0, arm)
    assert torch.equal(main, x) and torch.equal(knob, torch.zeros_like(x))


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_I5_knob_stays_zero_and_k0_module_untouched_over_a_run(kind):
    """erase/no_gate run: δS_h ≡ 0 bitwise at every step; the module without a basis follows vanilla bit for bit."""
    r, k = 16, 3
    vhs = {"hacky": make_vh(r, k), "plain": None}
    _, _, _, log_e = run("erase_no_gate", vhs, r, kind, T=20)
    _, _, _, log_v = run("vanilla", vhs, r, kind, T=20)
    for le, lv in zip(log_e, log_v):
        for n in vhs:
            assert torch.equal(le["knobp"][n], torch.zeros(r, dtype=F64)), "knob moved under erase"
        assert torch.equal(le["delta"]["plain"], lv["delta"]["plain"]), "k=0 module changed by the erase arm"
    assert not torch.equal(log_e[-1]["delta"]["hacky"], log_v[-1]["delta"]["hacky"])  # the edit did act


@pytest.mark.parametrize("r,k", SHAPES)
def test_I6_erase_one_sided(r, k):
    vh, g = make_vh(r, k), torch.randn(6, r, generator=gen(3), dtype=F64)
    g2, _ = edit_g(g, vh, "erase_one_sided")
    a = g @ vh.T  # (n, k) α
    assert (a > 0).any() and (a < 0).any()  # both signs present, so the test has teeth
    torch.testing.assert_close(g2 @ vh.T, a.clamp(max=0), atol=1e-12, rtol=0)
    torch.testing.assert_close((g2 * (g - g2)).sum(-1), torch.zeros(6, dtype=F64), atol=1e-12, rtol=0)  # h ⟂ g'
    assert ((g2 @ vh.T) <= 1e-12 * norms(g)).all()  # cos(g', v_j) ≤ 0
    torch.testing.assert_close(g2, g - a.clamp(min=0) @ vh, atol=1e-12, rtol=0)  # reference: g − Vhᵀ relu(α)
    # all α ≤ 0 ⇒ the edit is the identity, bitwise in the optimizer's coordinates
    x = (g @ complete_rotation(vh)).clone()
    x[:, :k] = -x[:, :k].abs()
    assert torch.equal(edit_coords(x, k, "erase_one_sided")[0], x)


@pytest.mark.parametrize("r,k", SHAPES)
def test_I7_erase_reverse(r, k):
    vh, g = make_vh(r, k), torch.randn(6, r, generator=gen(4), dtype=F64)
    g2, h = edit_g(g, vh, "erase_reverse")
    a = g @ vh.T
    torch.testing.assert_close(g2 @ vh.T, -a.abs(), atol=1e-12, rtol=0)
    torch.testing.assert_close(g - g2, 2 * a.clamp(min=0) @ vh, atol=1e-12, rtol=0)  # = 2 Vhᵀ relu(α) ∈ span
    torch.testing.assert_close(norms(g2), norms(g), atol=1e-12, rtol=0)  # a reflection: norm-preserving
    assert ((g2 @ vh.T) <= 1e-12 * norms(g)).all()
    assert torch.equal(h, torch.zeros_like(h))
    R = complete_rotation(vh)
    x = g @ R
    once = edit_coords(x, k, "erase_reverse")[0]
    assert torch.equal(edit_coords(once, k, "erase_reverse")[0], once)  # twice == once
    x[:, :k] = -x[:, :k].abs()
    assert torch.equal(edit_coords(x, k, "erase_reverse")[0], x)  # all α ≤ 0 ⇒ unchanged


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_I7_reverse_knob_zero_over_a_run(kind):
    _, _, _, log = run("erase_reverse", {"m": make_vh(16, 3)}, 16, kind, T=20)
    assert all(torch.equal(s["knobp"]["m"], torch.zeros(16, dtype=F64)) for s in log)


@pytest.mark.parametrize("r,k", SHAPES)
def test_mirror_keeps_only_the_hack_promoting_part(r, k):
    vh, g = make_vh(r, k), torch.randn(6, r, generator=gen(5), dtype=F64)
    torch.testing.assert_close(edit_g(g, vh, "mirror")[0] @ vh.T, (g @ vh.T).clamp(min=0), atol=1e-12, rtol=0)


def test_method_md_arm_names_accepted_and_unknown_rejected():
    x = torch.randn(4, 8, generator=gen(6), dtype=F64)
    for slash, key in [("erase/no_gate", "erase_no_gate"), ("route/batch", "route_batch")]:
        assert all(torch.equal(a, b) for a, b in zip(edit_coords(x, 2, slash), edit_coords(x, 2, key)))
    with pytest.raises(ValueError, match="unknown batch-mode arm"):
        edit_coords(x, 2, "erase/two_sided")


# --- I8: route conservation -------------------------------------------------------------------------------------


@pytest.mark.parametrize("r,k", SHAPES)
@pytest.mark.parametrize("arm,erase", [("route_batch", "erase_one_sided"), ("route_batch_no_gate", "erase_no_gate")])
def test_I8_route_batch_conservation(r, k, arm, erase):
    vh, g = make_vh(r, k), torch.randn(6, r, generator=gen(7), dtype=F64)
    x = g @ complete_rotation(vh)
    main, knob = edit_coords(x, k, arm)
    assert torch.equal(main + knob, x)  # conservation, bitwise in rotated coords (one of the two terms is 0)
    assert torch.equal(main, edit_coords(x, k, erase)[0])  # main is exactly the erase arm's edit
    assert torch.equal(knob[:, k:], torch.zeros_like(knob[:, k:]))  # knob ∈ span(Vh)
    g_main, h = edit_g(g, vh, arm)
    torch.testing.assert_close(g_main + h, g, atol=1e-12, rtol=0)
    assert span_residual(h, vh).abs().max() <= 1e-12 * g.norm()
    if arm == "route_batch":
        assert ((h @ vh.T) >= -1e-12 * norms(g)).all()  # <h, v_j> ≥ 0: only hack-promoting parts routed
        torch.testing.assert_close((g_main * h).sum(-1), torch.zeros(6, dtype=F64), atol=1e-12, rtol=0)


@pytest.mark.parametrize("r,k", SHAPES)
def test_I8_route_per_rollout_conservation(r, k):
    vh, N = make_vh(r, k), 7
    g_n = torch.randn(N, r, generator=gen(8), dtype=F64)  # per-rollout grads, Σ_n g_n = g
    m = torch.rand(N, generator=gen(9), dtype=F64)
    R = complete_rotation(vh)
    main, knob = route_per_rollout(g_n @ R, k, m)
    torch.testing.assert_close(main + knob, g_n.sum(0) @ R, atol=1e-12, rtol=0)
    assert (knob[:k] >= 0).all() and torch.equal(knob[k:], torch.zeros(r - k, dtype=F64))
    assert torch.equal(main[k:], (g_n @ R).sum(0)[k:])  # the complement is never touched
    # reference: the slow per-rollout loop of method.md §3.5 in δS coordinates, h = Σ_n m_n Vhᵀ relu(Vh g_n)
    h_ref = sum(m[i] * (vh.T @ (vh @ g_n[i]).clamp(min=0)) for i in range(N))
    torch.testing.assert_close(knob @ R.T, h_ref, atol=1e-12, rtol=0)
    # all m_n = 0 ⇒ vanilla: main == g bitwise (rotated), nothing routed
    main0, knob0 = route_per_rollout(g_n @ R, k, torch.zeros(N, dtype=F64))
    assert torch.equal(main0, (g_n @ R).sum(0)) and torch.equal(knob0, torch.zeros(r, dtype=F64))
    # own-token pieces (a shared prompt forward) do not sum to g: the rest of g stays in main, the knob is the same
    g = g_n.sum(0) + torch.randn(r, generator=gen(10), dtype=F64)  # + the shared prompt positions' part
    main_s, knob_s = route_per_rollout(g_n @ R, k, m, g @ R)
    torch.testing.assert_close(main_s + knob_s, g @ R, atol=1e-12, rtol=0)
    assert torch.equal(knob_s, knob)


@pytest.mark.parametrize("r,k", SHAPES)
def test_I8_route_per_token_conservation(r, k):
    vh, N, T = make_vh(r, k), 3, 5
    R = complete_rotation(vh)
    x_nt = torch.randn(N, T, r, generator=gen(10), dtype=F64) @ R  # rotated per-token grads (tests only)
    m = torch.rand(N, T, generator=gen(11), dtype=F64)
    total = x_nt.sum((0, 1))
    main, knob = route_per_token(x_nt[..., :k], m, total)  # coefficients = first k rotated coords
    torch.testing.assert_close(main + knob, total, atol=1e-12, rtol=0)
    assert (knob[:k] >= 0).all() and torch.equal(knob[k:], torch.zeros(r - k, dtype=F64))
    torch.testing.assert_close(knob[:k], (m[..., None] * x_nt[..., :k].clamp(min=0)).sum((0, 1)), atol=1e-12, rtol=0)


# --- I9: the routed component lands only in the knob (on the parameters) ------------------------------------------


@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("arm", ["route_batch", "route_batch_no_gate", "route_per_rollout", "route_two_sided"])
@pytest.mark.parametrize("r,k", SHAPES)
def test_I9_routed_component_only_in_knob(kind, arm, r, k):
    vh = make_vh(r, k)
    opt, _, knobs, _ = run(arm, {"m": vh}, r, kind, T=30)
    R, kh = complete_rotation(vh), knobs["m"].detach()
    assert kh.norm() > 1e-3, "nothing was routed: the test has no teeth"
    assert torch.equal(opt.phi["m"][k:], torch.zeros(r - k, dtype=F64))  # complement coords of φ exactly 0
    assert (kh @ R)[k:].abs().max() <= 1e-12 * kh.norm()  # ... and of Rᵀ δS_h, to fp
    assert span_residual(kh[None], vh).abs().max() <= 1e-12 * kh.norm()  # δS_h ∈ span(Vh)
    if arm not in ("route_batch_no_gate", "route_two_sided"):  # one-sided: knob coords non-positive (method.md §6.10)
        assert (vh @ kh <= 1e-12 * kh.norm()).all()


@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("arm", ["vanilla", "measure_only", *ERASE_ARMS])
def test_I9_knob_identically_zero_without_routing(kind, arm):
    _, _, _, log = run(arm, {"m": make_vh(16, 3), "plain": None}, 16, kind, T=20)
    assert all(torch.equal(s["knobp"][n], torch.zeros(16, dtype=F64)) for s in log for n in ("m", "plain"))


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_I9_random_dir_knob_in_random_span(kind):
    r, k = 16, 3
    vh, vh_rand = make_vh(r, k, seed=0), make_vh(r, k, seed=123)  # random_dir: same k, its own rotation
    _, _, knobs, _ = run("route_batch", {"m": vh_rand}, r, kind, T=30)
    kh = knobs["m"].detach()
    assert kh.norm() > 1e-3
    assert span_residual(kh[None], vh_rand).abs().max() <= 1e-12 * kh.norm()
    assert span_residual(kh[None], vh).norm() > 0.1 * kh.norm()  # and not in the hack span


# --- I10: erase stays orthogonal through the optimizer (on the parameters) ----------------------------------------


@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("r,k", SHAPES)
def test_I10_no_gate_update_orthogonal(kind, r, k):
    vh = make_vh(r, k)
    opt, deltas, _, _ = run("erase_no_gate", {"m": vh}, r, kind, T=50)
    d = deltas["m"].detach()
    assert d.norm() > 1e-2  # the run moved
    assert (vh @ d).abs().max() <= 1e-12 * d.norm()  # Vh δS_T == 0 (from δS_0 = 0)
    assert torch.equal(opt.theta["m"][:k], torch.zeros(k, dtype=F64))  # masked coords never moved at all
    if kind == "adam":
        assert torch.equal(opt.exp_avg["main"]["m"][:k], torch.zeros(k, dtype=F64))  # exactly-zero moments
        assert torch.equal(opt.exp_avg_sq["main"]["m"][:k], torch.zeros(k, dtype=F64))


@pytest.mark.parametrize("r,k", SHAPES)
def test_I10_regression_guard_unrotated_adam_leaks(r, k):
    """The same no_gate run with plain Adam on δS must FAIL the orthogonality check: proof the test has teeth."""
    vh = make_vh(r, k)
    _, deltas, _, log = run("erase_no_gate", {"m": vh}, r, "adam_unrotated", T=50)
    d = deltas["m"].detach()
    # every gradient it saw had zero component in span(Vh) ...
    assert all((vh @ (s["main"]["m"] @ complete_rotation(vh).T)).abs().max() < 1e-12 for s in log)
    # ... yet Adam's per-coordinate normalisation puts the update back into the span
    assert (vh @ d).norm() > 1e-3 * d.norm()


@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("arm", ["erase_one_sided", "erase_reverse"])
@pytest.mark.parametrize("r,k", SHAPES)
def test_I10_one_sided_reverse_never_hack_promoting(kind, arm, r, k):
    """Sign convention: descent δS ← δS − η·u, and the edited α are ≤ 0, so u's coefficients on v_j are ≤ 0 (Adam:
    m ≤ 0 and √v̂ + eps > 0) and Vh δS can only grow, i.e. the parameters only ever move against hacking (no decay)."""
    vh = make_vh(r, k)
    opt, _, _, log = run(arm, {"m": vh}, r, kind, T=50)
    coefs = torch.stack([vh @ s["delta"]["m"] for s in log])  # (T, k) Vh δS_t
    scale = max(float(s["delta"]["m"].norm()) for s in log)
    assert (coefs.diff(dim=0) >= -1e-12 * scale).all() and (coefs[0] >= -1e-12 * scale).all()
    assert (coefs[-1] > 1e-3).any()  # it did move, along +v_j
    thetas = opt.theta["m"][:k]
    assert (thetas >= 0).all()  # in the optimizer's own coordinates: exactly, no tolerance
    if kind == "adam":
        assert (opt.exp_avg["main"]["m"][:k] <= 0).all()


# --- I11: knob-off replay equivalence ------------------------------------------------------------------------------


@pytest.mark.parametrize("arm", ["route_batch", "route_per_rollout", "route_two_sided", "route_full"])
def test_I11_knob_off_replays_erase_on_own_gradients(arm):
    """Route run (rotated Adam, per-group clipping biting) vs the main optimizer alone on {g_t − h_t}: δS_T equal."""
    r, k = 16, 3
    vhs = {"m": make_vh(r, k), "plain": None}
    _, deltas, _, log = run(arm, vhs, r, "adam", T=30, clip=0.5, wd=0.01)
    assert any(s["metrics"]["clip_main"] < 1 for s in log) and any(s["metrics"]["clip_knob"] < 1 for s in log)
    assert any(s["metrics"]["clip_main"] != s["metrics"]["clip_knob"] for s in log)  # groups clipped separately
    opt2, deltas2, knobs2 = make_opt(vhs, r, "adam", clip=0.5, wd=0.01)
    for s in log:
        opt2.step({n: s["raw"][n] - s["knob"][n] for n in vhs})  # the recorded raw g_t minus the routed h_t
    for n in vhs:
        assert torch.equal(deltas2[n], deltas[n]), f"{n}: knob-off is not the replay of erase"
        assert torch.equal(knobs2[n], torch.zeros(r, dtype=F64))


@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("route,erase", [("route_batch", "erase_one_sided"), ("route_batch_no_gate", "erase_no_gate")])
def test_I11_step1_route_equals_erase(kind, route, erase):
    """Same init and the same g: the first update of route's δS is bitwise erase's (per-group clipping on)."""
    r, k = 16, 3
    vhs = {"m": make_vh(r, k)}
    _, _, _, log_r = run(route, vhs, r, kind, T=1, clip=0.5)
    _, _, _, log_e = run(erase, vhs, r, kind, T=1, clip=0.5)
    assert log_r[0]["metrics"]["clip_main"] < 1  # clipping active
    assert torch.equal(log_r[0]["delta"]["m"], log_e[0]["delta"]["m"])
    # a single global clip norm over (main, knob) would have given route a different main step
    mn, kn = log_r[0]["main"]["m"], log_r[0]["knob"]["m"]
    assert clip_coef([mn, kn], 0.5) != clip_coef([mn], 0.5)


# --- I12: measure_only ≡ vanilla -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_I12_measure_only_equals_vanilla(kind):
    """Bit-identical parameters and optimizer state after T steps; the diagnostics consume no RNG."""
    r, k = 16, 3
    vh = make_vh(r, k)
    nu = {"m": vh[0]}

    def measure(t, raw):  # what measure_only logs: α, scores and the gates the routed arms would take
        rng = torch.get_rng_state()
        g_n = {"m": raw["m"][None].expand(4, r)}
        s = rollout_scores(g_n, torch.tensor([1.0, -1.0, 0.0, 2.0], dtype=F64), nu)
        band_gate(s, torch.ones(4, dtype=F64), -0.1, 0.1)
        assert torch.equal(rng, torch.get_rng_state())

    opt_v, dv, kv, _ = run("vanilla", {"m": vh}, r, kind, T=30, clip=1.0)
    opt_m, dm, km, _ = run("measure_only", {"m": vh}, r, kind, T=30, clip=1.0, on_step=measure)
    assert torch.equal(dv["m"], dm["m"]) and torch.equal(kv["m"], km["m"])
    sv, sm = opt_v.state_dict(), opt_m.state_dict()
    for key in ("coords", "exp_avg", "exp_avg_sq"):
        for g in sv[key]:
            assert all(torch.equal(sv[key][g][n], sm[key][g][n]) for n in sv[key][g])


# --- I15: the gate ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("band", ["soft", "half"])
def test_I15_gate_range_monotone_and_zero_advantage(band):
    s = torch.linspace(-1, 1, 201, dtype=F64)
    adv = torch.ones(201, dtype=F64)
    m = band_gate(s, adv, -0.2, 0.3, band)
    assert ((m >= 0) & (m <= 1)).all() and (m.diff() >= 0).all()
    assert (m[s <= -0.2] == 0).all() and (m[s >= 0.3] == 1).all()
    inside = m[(s > -0.2) & (s < 0.3)]
    assert (inside == 0.5).all() if band == "half" else ((inside > 0) & (inside < 1)).all()
    adv0 = adv.clone()
    adv0[::3] = 0
    assert (band_gate(s, adv0, -0.2, 0.3, band)[::3] == 0).all()  # A_n = 0 ⇒ m_n = 0, even at s = 1


@pytest.mark.parametrize("P", [7, 20, 64])
@pytest.mark.parametrize("f", [0.05, 0.1, 0.3])
def test_I15_false_route_rate_at_most_f_in_sample(P, f):
    """Held-out calibration, in-sample by construction: ≤ f of clean scores get m = 1, ≤ f' of hacks get m = 0,
    with ties (rounded scores) and with f·P < 1 (where a linear-interpolation quantile would fail)."""
    g = gen(P)
    s_c = (torch.randn(P, generator=g, dtype=F64) * 0.2).round(decimals=1)  # many ties
    s_h = (torch.randn(P, generator=g, dtype=F64) * 0.2 + 0.15).round(decimals=1)
    lo, hi = calibrate_band(s_h, s_c, f, f)
    for band in ("soft", "half"):
        m_c = band_gate(s_c, torch.ones(P, dtype=F64), lo, hi, band)
        m_h = band_gate(s_h, torch.ones(P, dtype=F64), lo, hi, band)
        assert (m_c == 1).double().mean() <= f
        assert (m_h == 0).double().mean() <= f


def test_I15_negative_advantage_hack_routes_nothing():
    """A hack rollout scores as hack (s uses sign(A)·g), but with A < 0 its α < 0, so relu(α) = 0: no knob."""
    r, k = 16, 2
    vh = make_vh(r, k)
    R = complete_rotation(vh)
    d_hack = vh.sum(0) + 0.3 * span_residual(torch.randn(1, r, generator=gen(12), dtype=F64), vh)[0]  # ∇NLL(hack)
    assert (vh @ d_hack > 0).all()
    nu = {"m": vh.sum(0) / vh.sum(0).norm()}
    adv = torch.tensor([-1.0, 1.0], dtype=F64)
    g_n = adv[:, None] * d_hack[None]  # on-policy g_n ∝ A_n ∇NLL(o_n): the same hack, both advantage signs
    s = rollout_scores({"m": g_n}, adv, nu)
    torch.testing.assert_close(s[0], s[1], atol=1e-12, rtol=0)  # the score ignores the sign of A
    m = band_gate(s, adv, 0.1, 0.2)
    assert torch.equal(m, torch.ones(2, dtype=F64))  # both gated as hack ...
    assert ((g_n[0] @ vh.T) < 0).all()  # ... but the negative-advantage one has α < 0
    main, knob = route_per_rollout((g_n @ R)[:1], k, m[:1])
    assert torch.equal(knob, torch.zeros(r, dtype=F64)) and torch.equal(main, (g_n @ R)[0])
    _, knob_pos = route_per_rollout((g_n @ R)[1:], k, m[1:])
    assert (knob_pos[:k] > 0).all()  # the positive-advantage twin is routed


def test_I15_rollout_scores_are_signed_cosines():
    g = {
        "a": torch.randn(5, 6, generator=gen(13), dtype=F64),
        "b": torch.randn(5, 4, generator=gen(14), dtype=F64),
        "dropped": torch.randn(5, 3, generator=gen(15), dtype=F64),
    }
    nu = {"a": torch.randn(6, generator=gen(16), dtype=F64), "b": torch.randn(4, generator=gen(17), dtype=F64)}
    adv = torch.tensor([1.0, -2.0, 0.0, 0.5, -0.1], dtype=F64)
    cat, v = torch.cat([g["a"], g["b"]], -1), torch.cat([nu["a"], nu["b"]])
    ref = torch.sign(adv) * torch.nn.functional.cosine_similarity(cat, v[None], dim=-1)
    torch.testing.assert_close(rollout_scores(g, adv, nu), ref, atol=1e-12, rtol=0)
    assert rollout_scores(g, adv, nu)[2] == 0


def test_I15_inverted_thresholds_give_an_empty_band():
    s_c = torch.linspace(-1, 0, 40, dtype=F64)  # separable: every hack scores above every clean
    s_h = torch.linspace(0.5, 1, 40, dtype=F64)
    lo, hi = calibrate_band(s_h, s_c, 0.05, 0.05)
    assert lo == hi and 0 < lo < 0.5
    s = torch.linspace(-2, 2, 401, dtype=F64)
    for band in ("soft", "half"):
        for tl, th in [(lo, hi), (0.4, -0.3)]:  # calibrated (collapsed) and handed in inverted
            m = band_gate(s, torch.ones_like(s), tl, th, band)
            assert set(m.unique().tolist()) <= {0.0, 1.0}  # no fractional gate: the band is empty
            assert (m.diff() >= 0).all()


# --- I17: per-token coefficients on the tiny model ----------------------------------------------------------------


def test_I17_per_token_sums_and_per_token_routes_more():
    from projected_grpo.policy.adapter import adapters, attach_adapters, probes, token_capture
    from projected_grpo.policy.logprobs import batch_sequences, completion_logprobs
    from projected_grpo.policy.tiny import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    m = tiny_model(len(tok)).double()
    attach_adapters(m, "all", 6, param_dtype=F64)
    with torch.no_grad():  # away from δS = 0 so every gradient term is generic
        for i, a in enumerate(adapters(m).values()):
            a.delta.copy_(0.3 * torch.randn(a.dim, generator=gen(100 + i), dtype=F64))
    g = gen(18)
    N = 3
    prompts = [torch.randint(3, len(tok), (5 + i,), generator=g).tolist() for i in range(N)]
    comps = [torch.randint(3, len(tok), (4 + 2 * i,), generator=g).tolist() for i in range(N)]
    ids, att, cm = batch_sequences(prompts, comps, tok.pad_token_id)
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=F64)
    vh = {n: make_vh(a.dim, 2, seed=i) for i, (n, a) in enumerate(adapters(m).items())}
    with probes(m, N) as es, token_capture(m, vh) as caps:
        logp, mask = completion_logprobs(m, ids, att, cm, 0.7)
        loss = -(torch.where(mask.bool(), logp, 0.0) * adv[:, None]).sum() / (N * 16)  # Dr.GRPO-shaped
        loss.backward()
    strictly_more = False
    for n, a in caps.items():
        coef = a.token_coef  # (N, T, k) <g_{n,t}, v_j>
        torch.testing.assert_close(coef.sum(1), es[n].grad @ vh[n].T, atol=1e-12, rtol=1e-9)  # Σ_t = per rollout
        torch.testing.assert_close(coef.sum((0, 1)), a.delta.grad @ vh[n].T, atol=1e-12, rtol=1e-9)  # Σ_{n,t} = g
        R = complete_rotation(vh[n])
        total = a.delta.grad @ R  # (r,)
        ones_t, ones_n = torch.ones(coef.shape[:2], dtype=F64), torch.ones(N, dtype=F64)
        main_t, knob_t = route_per_token(coef, ones_t, total)
        _, knob_n = route_per_rollout(es[n].grad @ R, 2, ones_n)
        assert (knob_t >= knob_n - 1e-12).all()  # Σ_t relu ≥ relu Σ_t, coordinate-wise
        strictly_more |= bool((knob_t > knob_n + 1e-9).any())
        torch.testing.assert_close(main_t + knob_t, total, atol=1e-12, rtol=0)
    assert strictly_more  # mixed-sign token coefficients exist, so per-token routing really moves more


def tiny_per_token(N: int = 3, seed: int = 18):
    """A Dr.GRPO-shaped backward on the fp64 tiny model in the *training* layout (left-padded prompts, right-padded
    completions, rollout_logprobs), with per-token capture and, independently, the per-token δS gradients
    g_{m,n,t} = (Vᵀx_t) ⊙ (Uᵀγ_t) rebuilt from module hooks. Returns a dict of everything the tests need."""
    from projected_grpo.policy.adapter import adapters, attach_adapters, probes, token_capture
    from projected_grpo.policy.logprobs import rollout_logprobs
    from projected_grpo.policy.tiny import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    m = tiny_model(len(tok)).double()
    attach_adapters(m, "all", 6, param_dtype=F64)
    ads = adapters(m)
    with torch.no_grad():  # away from δS = 0 so every gradient term is generic
        for i, a in enumerate(ads.values()):
            a.delta.copy_(0.3 * torch.randn(a.dim, generator=gen(100 + i), dtype=F64))
    g = gen(seed)
    lp, lc = [4 + 2 * i for i in range(N)], [5 - i + 2 * (i % 2) for i in range(N)]
    Tp, T = max(lp), max(lc)
    pi, pm = torch.full((N, Tp), tok.pad_token_id), torch.zeros(N, Tp, dtype=torch.long)
    ci, cm = torch.full((N, T), tok.pad_token_id), torch.zeros(N, T, dtype=torch.long)
    for i in range(N):
        pi[i, Tp - lp[i] :], pm[i, Tp - lp[i] :] = torch.randint(3, len(tok), (lp[i],), generator=g), 1
        ci[i, : lc[i]], cm[i, : lc[i]] = torch.randint(3, len(tok), (lc[i],), generator=g), 1
    adv = torch.tensor([1.0, -0.5, 0.0, 2.0][:N], dtype=F64)
    vh = {n: make_vh(a.dim, 2, seed=i) for i, (n, a) in enumerate(ads.items())}
    nu = {n: torch.randn(a.dim, generator=gen(300 + i), dtype=F64) for i, (n, a) in enumerate(ads.items())}
    dirs = {n: torch.cat([vh[n], nu[n][None]]) for n in ads}
    xs, gammas, hooks = {}, {}, []
    for n, a in ads.items():  # independent per-token gradients: input x_t and output gradient γ_t of each adapter

        def fwd(mod, args, out, n=n):
            xs[n] = args[0].detach()
            out.register_hook(lambda gr: gammas.__setitem__(n, gr.detach()))

        hooks.append(a.register_forward_hook(fwd))
    with probes(m, N) as es, token_capture(m, dirs) as caps:
        logp = rollout_logprobs(m, pi, pm, ci, cm, 0.7)  # (N, T)
        mk = cm.to(F64)
        loss = -(torch.where(cm.bool(), logp, 0.0) * adv[:, None] * mk).sum() / (N * 16)  # Dr.GRPO-shaped
        loss.backward()
    for h in hooks:
        h.remove()
    g_tok = {n: (xs[n] @ a.V) * (gammas[n] @ a.U) for n, a in ads.items()}  # (N, Tp + T, r) materialised (test only)
    return dict(ads=ads, es=es, caps=caps, g_tok=g_tok, vh=vh, nu=nu, adv=adv, cm=cm, Tp=Tp, N=N)


def test_I17_per_token_training_layout_sums_and_completion_positions():
    """Σ_t g_{n,t} = g_n with the completion positions (Tp−1..Tp+T−2, aligned with logp) plus the prompt positions;
    the captured coefficients and squared norms are the hooks' per-token gradients reduced; Σ_{n,t} = g."""
    d = tiny_per_token()
    Tp = d["Tp"]
    prompt_share = False
    for n, a in d["caps"].items():
        gt = d["g_tok"][n]  # (N, Tp + T, r)
        torch.testing.assert_close(gt.sum(1), d["es"][n].grad, atol=1e-12, rtol=1e-9)  # the hooks rebuild g_n
        torch.testing.assert_close(
            a.token_coef, gt @ torch.cat([d["vh"][n], d["nu"][n][None]]).T, atol=1e-12, rtol=1e-9
        )
        torch.testing.assert_close(a.token_sq, gt.pow(2).sum(-1), atol=1e-12, rtol=1e-9)  # ‖g_{n,t}‖²
        comp, prompt = completion_positions(gt, Tp), gt[:, : Tp - 1]
        assert comp.shape[1] == d["cm"].shape[1] and float(gt[:, -1].abs().max()) == 0  # last position: no grad
        torch.testing.assert_close(comp.sum(1) + prompt.sum(1), d["es"][n].grad, atol=1e-12, rtol=1e-9)
        torch.testing.assert_close(gt.sum((0, 1)), a.delta.grad, atol=1e-12, rtol=1e-9)  # Σ_{n,t} = g
        pad = completion_positions(gt, Tp)[~d["cm"].bool()]  # positions after EOS: no gradient either
        assert float(pad.abs().max()) == 0 if pad.numel() else True
        prompt_share |= float(prompt.abs().max()) > 1e-6
    assert prompt_share  # prompt positions carry part of g (through attention), so they must be masked, not dropped


def test_per_token_scores_gates_and_routing_on_real_token_gradients():
    """Windowed scores equal the formula on materialised per-token gradients (w = 1: the exact cosine), lie in
    [−1, 1] and are 0 off the completion; gates are 0 on prompt/padding positions and on A_n = 0 rows, so such a row
    routes nothing; h = Σ_{n,t} m Vhᵀ relu(Vh g_{n,t}) over completion tokens and main + knob = g."""
    d = tiny_per_token(N=4)
    Tp, cm, adv, names = d["Tp"], d["cm"], d["adv"], list(d["ads"])
    dot = sum(completion_positions(d["caps"][n].token_coef[..., -1], Tp) for n in names)  # (N, T)
    sq = sum(completion_positions(d["caps"][n].token_sq, Tp) for n in names)
    nu_sq = float(sum(v.pow(2).sum() for v in d["nu"].values()))
    g_c = torch.cat([completion_positions(d["g_tok"][n], Tp) for n in names], -1)  # (N, T, Σ r) test only
    nu_c = torch.cat([d["nu"][n] for n in names])
    exact = torch.sign(adv)[:, None] * (g_c @ nu_c) / (g_c.norm(dim=-1) * nu_c.norm()).clamp(min=1e-30)
    s1 = token_scores(dot, sq, cm, torch.sign(adv), 1, nu_sq)
    torch.testing.assert_close(s1, torch.where(cm.bool(), exact, 0.0), atol=1e-12, rtol=1e-9)
    w = 3
    s3 = token_scores(dot, sq, cm, torch.sign(adv), w, nu_sq)
    for n in range(cm.shape[0]):
        for t in range(cm.shape[1]):
            if not cm[n, t] or adv[n] == 0:  # off the completion, or no gradient at all (A_n = 0, no KL here)
                assert s3[n, t] == 0
                continue
            W = [u for u in range(t - w // 2, t + w - w // 2) if 0 <= u < cm.shape[1] and cm[n, u]]
            ref = torch.sign(adv[n]) * dot[n, W].sum() / (len(W) * sq[n, W].sum() * nu_sq).sqrt()
            torch.testing.assert_close(s3[n, t], ref, atol=1e-12, rtol=1e-9)
    assert float(s3.abs().max()) <= 1 + 1e-12
    lo, hi = float(s3[cm.bool()].quantile(0.3)), float(s3[cm.bool()].quantile(0.7))
    m_tok = token_gate(s3, adv.float(), cm, lo, hi)
    assert float(m_tok[~cm.bool()].abs().max()) == 0 and float(m_tok[adv == 0].abs().max()) == 0
    assert float(m_tok.max()) > 0
    for n in names:
        R = complete_rotation(d["vh"][n])
        total = d["ads"][n].delta.grad @ R
        alpha = completion_positions(d["caps"][n].token_coef[..., :2], Tp)  # (N, T, k)
        main, knob = route_per_token(alpha, m_tok, total)
        torch.testing.assert_close(main + knob, total, atol=1e-12, rtol=0)
        a_mat = completion_positions(d["g_tok"][n], Tp) @ d["vh"][n].T  # (N, T, k) from the hooks
        torch.testing.assert_close(
            knob[:2], (m_tok[..., None] * a_mat.clamp(min=0)).sum((0, 1)), atol=1e-12, rtol=1e-9
        )
        keep = adv != 0  # the A_n = 0 row routes nothing: dropping it changes no knob coordinate
        _, knob_wo = route_per_token(alpha[keep], m_tok[keep], total)
        torch.testing.assert_close(knob, knob_wo, atol=1e-15, rtol=0)


def test_window_sum_and_rank_auroc_against_naive():
    x = torch.randn(3, 11, generator=gen(2), dtype=F64)
    for w in (1, 2, 5, 16):
        ref = torch.tensor(
            [[float(x[n, max(0, t - w // 2) : t + w - w // 2].sum()) for t in range(11)] for n in range(3)], dtype=F64
        )
        torch.testing.assert_close(window_sum(x, w), ref, atol=1e-12, rtol=0)
    pos = torch.randint(0, 6, (40,), generator=gen(3)).double()  # many ties
    neg = torch.randint(0, 5, (30,), generator=gen(4)).double()
    assert abs(rank_auroc(pos, neg) - auroc(pos, neg)) < 1e-12
    with pytest.raises(ValueError, match="window"):
        window_sum(x, 0)


# --- basis refresh: RotatedAdam.rebase ------------------------------------------------------------------------------


def quad_steps(opt, deltas, knobs, vhs, probs, arm, t0, T):
    """T steps of `arm` on the quadratic from step t0, with the optimizer's current rotations and k per module."""
    out = []
    for t in range(t0, t0 + T):
        main, knob = {}, {}
        for n in deltas:
            x = opt.rotate({n: probs[n].grad(deltas[n] + knobs[n], t)})[n]
            main[n], knob[n] = edit_coords(x, 0 if vhs.get(n) is None else vhs[n].shape[0], arm)
        opt.step(main, knob)
        out.append(
            ({n: p.detach().clone() for n, p in deltas.items()}, {n: p.detach().clone() for n, p in knobs.items()})
        )
    return out


@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("moments", ["rotate", "reset"])
@pytest.mark.parametrize("arm", ["erase_no_gate", "route_batch"])
def test_rebase_keeps_parameters_and_edits_exact_after_refresh(kind, moments, arm):
    """Modules: "c" changes basis, "a" leaves the kept set, "b" joins it, "d" never has one. rebase moves no
    parameter and re-expresses θ = R_newᵀ δS; from the first step after it, erase updates have no component in the new
    span(Vh) and route's knob updates lie in it (I9/I10 across a refresh); a module that left is edited no more."""
    r, k = 12, 3
    old = {"c": make_vh(r, k, 1), "a": make_vh(r, k, 2), "b": None, "d": None}
    new = {"c": make_vh(r, k, 3), "a": None, "b": make_vh(r, 2, 4), "d": None}
    opt, deltas, knobs = make_opt(old, r, kind)
    probs = {n: Quadratic(r, i) for i, n in enumerate(old)}
    quad_steps(opt, deltas, knobs, old, probs, arm, 0, 15)
    before = {n: (deltas[n].detach().clone(), knobs[n].detach().clone()) for n in old}
    changed = opt.rebase(
        {n: complete_rotation(v) for n, v in new.items() if v is not None},
        {n: 0 if v is None else v.shape[0] for n, v in new.items()},
        moments,
    )
    assert sorted(changed) == ["a", "b", "c"]
    for n in old:
        assert torch.equal(deltas[n], before[n][0]) and torch.equal(knobs[n], before[n][1])  # nothing moved
        R = opt.R.get(n, torch.eye(r, dtype=F64))
        torch.testing.assert_close(R @ opt.theta[n], deltas[n].detach(), atol=1e-13, rtol=0)
        torch.testing.assert_close(R @ opt.phi[n], knobs[n].detach(), atol=1e-13, rtol=0)
    traj = quad_steps(opt, deltas, knobs, new, probs, arm, 15, 20)
    prev = before
    for d, h in traj:
        for n, v in new.items():
            dd, dh = d[n] - prev[n][0], h[n] - prev[n][1]
            if v is None:
                assert float(dh.abs().max()) == 0  # no basis now: the knob stays where it is
                continue
            if arm == "erase_no_gate":
                assert float((v @ dd).abs().max()) <= 1e-12 * float(dd.norm())
            else:
                assert float((dh - v.T @ (v @ dh)).norm()) <= 1e-12 * max(float(dh.norm()), 1e-30)
                assert (v @ dh <= 1e-15).all()  # one-sided: the knob only ever descends along −v
        prev = {n: (d[n], h[n]) for n in new}
    assert float((traj[-1][0]["a"] - before["a"][0]).norm()) > 0  # the module that left keeps training, unedited


def test_rebase_moments_rotate_and_reset_semantics():
    """rotate: main m ← R_newᵀ R_old m with the new span(Vh) part zeroed, knob m and every v reset; reset: all zero.
    After a reset the module steps exactly like a fresh optimizer started at the same parameters (per-module bias
    correction restarts), although the global step count goes on."""
    r, k = 10, 3
    v_old, v_new = make_vh(r, k, 5), make_vh(r, k, 6)
    R_old, R_new = complete_rotation(v_old), complete_rotation(v_new)
    for moments in ("rotate", "reset"):
        opt, deltas, knobs = make_opt({"m": v_old}, r)
        probs = {"m": Quadratic(r, 3)}
        quad_steps(opt, deltas, knobs, {"m": v_old}, probs, "route_batch", 0, 12)
        m_old = opt.exp_avg["main"]["m"].clone()
        opt.rebase({"m": R_new}, {"m": k}, moments)
        m_new, v_main = opt.exp_avg["main"]["m"], opt.exp_avg_sq["main"]["m"]
        assert float(opt.exp_avg["knob"]["m"].abs().max()) == 0 and float(v_main.abs().max()) == 0
        if moments == "rotate":
            want = R_new.T @ (R_old @ m_old)
            want[:k] = 0
            torch.testing.assert_close(m_new, want, atol=1e-15, rtol=0)
            assert opt.t_m["main"]["m"] == 12 and opt.t_v["main"]["m"] == 0
        else:
            assert float(m_new.abs().max()) == 0 and opt.t_m["main"]["m"] == opt.t_v["main"]["m"] == 0
            fresh, fd, fk = make_opt({"m": v_new}, r)
            with torch.no_grad():
                fd["m"].copy_(deltas["m"])
                fk["m"].copy_(knobs["m"])
            fresh = RotatedAdam(fd, fk, {"m": R_new}, Hyper(lr=1e-2))  # θ = R_newᵀ δS, moments 0, t = 0
            a = quad_steps(opt, deltas, knobs, {"m": v_new}, probs, "route_batch", 12, 5)
            b = quad_steps(fresh, fd, fk, {"m": v_new}, probs, "route_batch", 12, 5)
            assert all(torch.equal(x[0]["m"], y[0]["m"]) and torch.equal(x[1]["m"], y[1]["m"]) for x, y in zip(a, b))


def test_rebase_then_resume_is_bit_exact():
    """A checkpoint taken after a refresh restores into an optimizer built with the checkpoint's rotations (the
    loop's resume path); one built with the pre-refresh rotations refuses it."""
    r = 12
    old, new = {"c": make_vh(r, 3, 1), "d": None}, {"c": make_vh(r, 2, 7), "d": make_vh(r, 1, 8)}
    opt, deltas, knobs = make_opt(old, r, clip=0.5, wd=0.01)
    probs = {n: Quadratic(r, i) for i, n in enumerate(old)}
    quad_steps(opt, deltas, knobs, old, probs, "route_batch", 0, 6)
    opt.rebase({n: complete_rotation(v) for n, v in new.items()}, {n: v.shape[0] for n, v in new.items()})
    quad_steps(opt, deltas, knobs, new, probs, "route_batch", 6, 3)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    full = quad_steps(opt, deltas, knobs, new, probs, "route_batch", 9, 5)[-1]
    buf.seek(0)
    state = torch.load(buf)
    stale, _, _ = make_opt(old, r, clip=0.5, wd=0.01)
    with pytest.raises(ValueError, match="rotations differ"):
        stale.load_state_dict(state)
    opt2, d2, k2 = make_opt(new, r, clip=0.5, wd=0.01)  # built from the checkpoint's rotations
    assert all(torch.equal(state["rotations"][n], opt2.R[n]) for n in new)
    opt2.load_state_dict(state)
    resumed = quad_steps(opt2, d2, k2, new, probs, "route_batch", 9, 5)[-1]
    assert all(torch.equal(full[0][n], resumed[0][n]) and torch.equal(full[1][n], resumed[1][n]) for n in new)


# --- the optimizer itself ----------------------------------------------------------------------------------------


def test_identity_rotation_adam_matches_torch_adamw():
    """With no basis (R = I) rotated Adam is AdamW: a reference check of the update formula."""
    r = 8
    w = nn.Parameter(torch.zeros(r, dtype=F64))
    ref = torch.optim.AdamW([w], lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, foreach=False)
    d, kn = nn.Parameter(torch.zeros(r, dtype=F64)), nn.Parameter(torch.zeros(r, dtype=F64))
    opt = RotatedAdam({"m": d}, {"m": kn}, {}, Hyper(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1))
    q = Quadratic(r, 0)
    for t in range(20):
        gr = q.grad(w, t)
        w.grad = gr.clone()
        ref.step()
        opt.step({"m": q.grad(d, t)})
        torch.testing.assert_close(d.detach(), w.detach(), atol=1e-13, rtol=1e-12)


@pytest.mark.parametrize("arm", ["erase_no_gate", "erase_one_sided", "route_batch"])
def test_rotated_sgd_equals_plain_sgd_on_edited_grads(arm):
    """SGD is linear, so rotating is a no-op: δS_T matches plain SGD on the edited δS-coordinate grads."""
    r, k = 16, 3
    vh = make_vh(r, k)
    _, deltas, knobs, log = run(arm, {"m": vh}, r, "sgd", T=20)
    R = complete_rotation(vh)
    d_ref = -1e-2 * sum(s["main"]["m"] @ R.T for s in log)
    h_ref = -1e-2 * sum(s["knob"]["m"] @ R.T for s in log)
    torch.testing.assert_close(deltas["m"].detach(), d_ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(knobs["m"].detach(), h_ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("kind", ["adam", "sgd", "adam_unrotated"])
def test_state_dict_resume_is_bit_exact(kind):
    r, k, T = 16, 3, 20
    vhs = {"m": make_vh(r, k), "plain": None}
    _, d_full, k_full, log = run("route_batch", vhs, r, kind, T=T, clip=0.5, wd=0.01)
    opt, d1, k1 = make_opt(vhs, r, kind, clip=0.5, wd=0.01)
    for s in log[: T // 2]:
        opt.step(s["main"], s["knob"])
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    opt.step(log[T // 2]["main"], log[T // 2]["knob"])  # a saved dict must not follow later steps
    opt2, d2, k2 = make_opt(vhs, r, kind, clip=0.5, wd=0.01)  # a fresh adapter: parameters at 0
    buf.seek(0)
    opt2.load_state_dict(torch.load(buf))
    assert torch.equal(d2["m"], log[T // 2 - 1]["delta"]["m"])  # the load rewrote δS = R θ
    for s in log[T // 2 :]:
        opt2.step(s["main"], s["knob"])
    for n in vhs:
        assert torch.equal(d2[n], d_full[n]) and torch.equal(k2[n], k_full[n])


def test_optimizer_rejects_bad_inputs():
    r = 8
    vh = make_vh(r, 2)
    opt, _, _ = make_opt({"m": vh}, r)
    with pytest.raises(KeyError, match="missing"):
        opt.step({})
    with pytest.raises(KeyError, match="unknown"):
        opt.step({"m": torch.zeros(r, dtype=F64), "typo": torch.zeros(r, dtype=F64)})
    with pytest.raises(ValueError, match="kind"):
        make_opt({"m": vh}, r, kind="lion")
    other, _, _ = make_opt({"m": make_vh(r, 2, seed=5)}, r)
    with pytest.raises(ValueError, match="rotations differ"):
        other.load_state_dict(opt.state_dict())
    with pytest.raises(ValueError, match="moments"):
        opt.rebase({}, {}, "keep")
    with pytest.raises(KeyError, match="unknown"):
        opt.rebase({"typo": complete_rotation(vh)}, {})


def test_match_mass_scales_what_moved_to_the_target_and_keeps_main_plus_knob():
    """One factor over all modules: ‖x − main'‖ = target, main' + knob' = x for a routing split, the erased part of
    an erase split scaled the same way, a module that moved nothing untouched, and nothing moved -> unchanged."""
    g = torch.Generator().manual_seed(0)
    x = {n: torch.randn(6, generator=g, dtype=torch.float64) for n in "abc"}
    main, knob = {}, {}
    main["a"], knob["a"] = proj.edit_coords(x["a"], 3, "route_batch")  # routed
    main["b"], knob["b"] = proj.edit_coords(x["b"], 2, "erase_one_sided")  # erased, no knob
    main["c"], knob["c"] = x["c"], torch.zeros(6, dtype=torch.float64)  # nothing moved here
    m2, k2 = proj.match_mass(x, main, knob, 0.7)
    moved = torch.cat([x[n] - m2[n] for n in x]).norm()
    assert float(moved) == pytest.approx(0.7) and torch.equal(m2["c"], x["c"])
    torch.testing.assert_close(m2["a"] + k2["a"], x["a"])
    s = 0.7 / float(torch.cat([x[n] - main[n] for n in x]).norm())
    torch.testing.assert_close(k2["a"], s * knob["a"])
    torch.testing.assert_close(x["b"] - m2["b"], s * (x["b"] - main["b"]))
    assert float(k2["b"].abs().max()) == 0 and torch.equal(m2["a"][3:], x["a"][3:])  # nothing outside span(Vh) moves
    same = {n: x[n].clone() for n in x}
    assert proj.match_mass(x, same, knob, 0.7) == (same, knob)
    a = torch.tensor([[0.5, -1.0], [2.0, 0.25]], dtype=torch.float64)
    m = torch.tensor([1.0, 0.5], dtype=torch.float64)
    assert proj.moved_norm("route_per_rollout", a, m) == pytest.approx(float(torch.tensor([1.5, 0.125]).norm()))
    assert proj.moved_norm("erase_one_sided", torch.tensor([0.3, -0.4])) == pytest.approx(0.3)

"""Projection arms, routing, the gate and the rotated optimizer: invariants I5–I12, I15, I17 of method.md §5.

Pure-math tests run on random float64 inputs, parametrised over (r, k); the optimizer tests run short optimisation
runs on a separable noisy quadratic and assert on the *parameters* δS / δS_h, not only on the gradients (house_style
§7 pattern 7). I17 uses the tiny Qwen3 model with per-token capture.

`PYTHONPATH=src python -m pytest -q tests/test_projection.py`
"""

import io

import pytest
import torch
from torch import nn

from projected_grpo.basis import random_directions
from projected_grpo.optim import RotatedAdam
from projected_grpo.projection import (
    ARMS,
    band_gate,
    calibrate_band,
    clip_coef,
    complete_rotation,
    edit_coords,
    rollout_scores,
    route_per_rollout,
    route_per_token,
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
    opt = RotatedAdam(deltas, knobs, rots, lr=lr, weight_decay=wd, max_norm_main=clip, max_norm_knob=clip, kind=kind)
    return opt, deltas, knobs


def run(arm, vhs, r, kind="adam", T=50, clip=None, wd=0.0, n_roll=4, seed=0, on_step=None):
    """T steps of `arm` on the quadratic; returns (opt, deltas, knobs, log) with log = per-step dicts.

    Batch arms edit the accumulated rotated grad; "route_per_rollout" routes per-sample pieces with random gates."""
    opt, deltas, knobs = make_opt(vhs, r, kind, clip=clip, wd=wd)
    probs = {n: Quadratic(r, seed + i) for i, n in enumerate(vhs)}
    ks = {n: 0 if vh is None else vh.shape[0] for n, vh in vhs.items()}
    log = []
    for t in range(T):
        main, knob, raw = {}, {}, {}
        for n in vhs:
            w = deltas[n] + knobs[n]
            if arm == "route_per_rollout":
                x_n = opt.rotate({n: probs[n].per_sample(w, t, n_roll)})[n]  # (N, r)
                m = torch.rand(n_roll, generator=gen(99 + t), dtype=F64)
                main[n], knob[n] = route_per_rollout(x_n, ks[n], m)
                raw[n] = x_n.sum(0)
            else:
                raw[n] = opt.rotate({n: probs[n].grad(w, t)})[n]  # (r,) = Rᵀ g
                main[n], knob[n] = edit_coords(raw[n], ks[n], arm)
        if on_step is not None:
            on_step(t, raw)
        metrics = opt.step(main, knob)
        log.append({"raw": raw, "main": main, "knob": knob, "metrics": metrics,
                    "delta": {n: p.detach().clone() for n, p in deltas.items()},
                    "knobp": {n: p.detach().clone() for n, p in knobs.items()}})  # fmt: skip
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
@pytest.mark.parametrize("arm", ["route_batch", "route_batch_no_gate", "route_per_rollout"])
@pytest.mark.parametrize("r,k", SHAPES)
def test_I9_routed_component_only_in_knob(kind, arm, r, k):
    vh = make_vh(r, k)
    opt, _, knobs, _ = run(arm, {"m": vh}, r, kind, T=30)
    R, kh = complete_rotation(vh), knobs["m"].detach()
    assert kh.norm() > 1e-3, "nothing was routed: the test has no teeth"
    assert torch.equal(opt.phi["m"][k:], torch.zeros(r - k, dtype=F64))  # complement coords of φ exactly 0
    assert (kh @ R)[k:].abs().max() <= 1e-12 * kh.norm()  # ... and of Rᵀ δS_h, to fp
    assert span_residual(kh[None], vh).abs().max() <= 1e-12 * kh.norm()  # δS_h ∈ span(Vh)
    if arm != "route_batch_no_gate":  # one-sided routing: knob coords non-positive (method.md §6.10)
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


@pytest.mark.parametrize("arm", ["route_batch", "route_per_rollout"])
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
    g = {"a": torch.randn(5, 6, generator=gen(13), dtype=F64), "b": torch.randn(5, 4, generator=gen(14), dtype=F64),
         "dropped": torch.randn(5, 3, generator=gen(15), dtype=F64)}  # fmt: skip
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
    from projected_grpo.adapter import adapters, attach_adapters, probes, token_capture
    from projected_grpo.logprobs import batch_sequences, completion_logprobs
    from projected_grpo.tiny import tiny_model, tiny_tokenizer

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


# --- the optimizer itself ----------------------------------------------------------------------------------------


def test_identity_rotation_adam_matches_torch_adamw():
    """With no basis (R = I) rotated Adam is AdamW: a reference check of the update formula."""
    r = 8
    w = nn.Parameter(torch.zeros(r, dtype=F64))
    ref = torch.optim.AdamW([w], lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, foreach=False)
    d, kn = nn.Parameter(torch.zeros(r, dtype=F64)), nn.Parameter(torch.zeros(r, dtype=F64))
    opt = RotatedAdam({"m": d}, {"m": kn}, {}, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
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

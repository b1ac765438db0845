"""Routing rules that do not rectify noise (issue 25): the two-sided split (`route_two_sided`: knob = Σ_n m_n α_n)
and whole-rollout routing (`route_full`: knob = Σ_n m_n g_n, tail included), beside today's one-sided per-rollout
split (`route_per_rollout`: knob = Σ_n m_n relu(α_n)).

What matters about them: main + knob = g (nothing is erased); gates 0 route nothing; the two-sided knob stays in
span(Vh) while the whole-rollout knob also holds the tail; with zero-mean noise α the knob's expected value is 0 for
the linear rules but not for the one-sided one, and under separate Adam moments that is the difference between a knob
that ramps away from the main and one that does not; the mass a rule moves (`moved_norm`, what a mass-matched
control is matched to) is what it really routes.

`PYTHONPATH=src python -m pytest -q tests/test_projection_routing.py`
"""

import math

import pytest
import torch
from torch import nn

from projected_grpo.method import projection as proj
from projected_grpo.method.basis import random_directions
from projected_grpo.method.optim import Hyper, RotatedAdam

F64 = torch.float64
PER_ROLLOUT = ("route_per_rollout", "route_two_sided", "route_full")
LINEAR = ("route_two_sided", "route_full")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def setup(r: int, k: int, N: int, seed: int = 0):
    """(Vh (k, r), R (r, r), raw per-rollout grads g_n (N, r), gates m (N,) in [0, 1])."""
    vh = random_directions(k, r, gen(seed), F64)
    g_n = torch.randn(N, r, generator=gen(seed + 1), dtype=F64)
    m = torch.rand(N, generator=gen(seed + 2), dtype=F64)
    return vh, proj.complete_rotation(vh), g_n, m


@pytest.mark.parametrize("r,k", [(8, 1), (16, 3), (64, 8)])
def test_linear_rules_conserve_and_route_what_they_say(r, k):
    """main + knob = g; the two-sided knob is Σ_n m_n Vhᵀ Vh g_n (both signs, nothing outside span(Vh)) and the main's
    complement is untouched; the whole-rollout knob is Σ_n m_n g_n, complement included. Checked against the slow
    loop in δS coordinates. With own-token x_n (shared prompt) the rest of g stays in main."""
    vh, R, g_n, m = setup(r, k, N=7)
    x_n = g_n @ R
    total = x_n.sum(0)
    main, knob = proj.route_two_sided(x_n, k, m)
    torch.testing.assert_close(main + knob, total, atol=1e-12, rtol=0)
    assert torch.equal(knob[k:], torch.zeros(r - k, dtype=F64)) and torch.equal(main[k:], total[k:])
    h_ref = sum(m[i] * (vh.T @ (vh @ g_n[i])) for i in range(len(m)))
    torch.testing.assert_close(knob @ R.T, h_ref, atol=1e-12, rtol=0)
    assert (knob[:k] < 0).any() or k == 1, "both signs reach the knob"

    main_f, knob_f = proj.route_full(x_n, k, m)
    torch.testing.assert_close(main_f + knob_f, total, atol=1e-12, rtol=0)
    torch.testing.assert_close(knob_f @ R.T, (m[:, None] * g_n).sum(0), atol=1e-12, rtol=0)
    assert knob_f[k:].norm() > 0.1 * knob_f.norm(), "the whole-rollout knob holds the tail"

    g = g_n.sum(0) + torch.randn(r, generator=gen(10), dtype=F64)  # + the shared prompt positions' part
    for rule in (proj.route_two_sided, proj.route_full):
        main_s, knob_s = rule(x_n, k, m, g @ R)
        torch.testing.assert_close(main_s + knob_s, g @ R, atol=1e-12, rtol=0)
        assert torch.equal(knob_s, rule(x_n, k, m)[1])  # the knob only reads the per-rollout pieces


@pytest.mark.parametrize("edit", PER_ROLLOUT)
def test_gates_zero_route_nothing_and_full_gates_route_everything(edit):
    """All m_n = 0: main is g bitwise and the knob exactly 0 (a gated arm whose gate never fires is vanilla). All
    m_n = 1: route_full sends the module's whole gradient to the knob (main exactly 0); the split rules send their
    part of every rollout."""
    r, k, N = 16, 3, 5
    _, R, g_n, _ = setup(r, k, N)
    x_n = g_n @ R
    s0 = proj.ModuleGrads(x_n.sum(0), k, x_n=x_n, gate=torch.zeros(N, dtype=F64))
    main, knob = proj.apply_rule(edit, s0)
    assert torch.equal(main, x_n.sum(0)) and torch.equal(knob, torch.zeros(r, dtype=F64))
    s1 = proj.ModuleGrads(x_n.sum(0), k, x_n=x_n, gate=torch.ones(N, dtype=F64))
    main, knob = proj.apply_rule(edit, s1)
    if edit == "route_full":
        assert torch.equal(main, torch.zeros(r, dtype=F64)) and torch.equal(knob, x_n.sum(0))
    elif edit == "route_two_sided":
        torch.testing.assert_close(knob[:k], x_n[:, :k].sum(0), atol=1e-12, rtol=0)
        torch.testing.assert_close(main[:k], torch.zeros(k, dtype=F64), atol=1e-12, rtol=0)
    else:
        torch.testing.assert_close(knob[:k], x_n[:, :k].clamp(min=0).sum(0), atol=1e-12, rtol=0)


def test_zero_mean_noise_gives_a_zero_mean_knob_only_for_the_linear_rules():
    """α_n pure zero-mean noise, gates drawn independently of it (fixed seed): over many draws the mean knob of the
    linear rules is within 4 standard errors of 0 on every coordinate; the one-sided knob's mean is positive on every
    span(Vh) coordinate, tens of standard errors away (E[m] E[relu(α)] N > 0): a rectifier of noise."""
    r, k, N, draws = 6, 3, 8, 4000
    g = gen(123)
    knobs = {e: [] for e in PER_ROLLOUT}
    for _ in range(draws):
        x_n = torch.randn(N, r, generator=g, dtype=F64)  # rotated per-rollout grads: α_n = x_n[:, :k] ~ N(0, 1)
        m = torch.rand(N, generator=g, dtype=F64)
        for e in PER_ROLLOUT:
            knobs[e].append(proj.ROLLOUT_RULES[e](x_n, k, m)[1])
    for e, ks in knobs.items():
        K = torch.stack(ks)  # (draws, r)
        mean, se = K.mean(0), K.std(0) / draws**0.5
        if e in LINEAR:
            live = slice(None) if e == "route_full" else slice(0, k)
            assert (mean[live].abs() < 4 * se[live]).all(), (e, mean, se)
        else:
            assert (mean[:k] > 20 * se[:k]).all(), (e, mean, se)
            expected = N * 0.5 * (2 * torch.pi) ** -0.5  # N · E[m] · E[relu(z)], z ~ N(0, 1)
            torch.testing.assert_close(
                mean[:k], torch.full((k,), expected, dtype=F64), atol=6 * float(se.max()), rtol=0
            )


def test_noise_drives_main_and_knob_apart_under_adam_only_with_the_one_sided_rule():
    """routing.md §1: with pure-noise α and separate Adam moments, the one-sided split gives the knob a gradient ≥ 0
    and the main its mirror image on every span(Vh) coordinate, so both ramp at ~lr per step in opposite directions
    and deleting the knob leaves the main's excursion. The linear rules' knobs random-walk instead: after 200 steps
    their span(Vh) excursion is a small fraction of the one-sided ramp."""
    r, k, N, T, lr = 8, 3, 8, 200, 0.01
    vh = random_directions(k, r, gen(5), F64)
    out = {}
    for e in PER_ROLLOUT:
        delta, knob = nn.Parameter(torch.zeros(r, dtype=F64)), nn.Parameter(torch.zeros(r, dtype=F64))
        opt = RotatedAdam({"m": delta}, {"m": knob}, {"m": proj.complete_rotation(vh)}, Hyper(lr=lr))
        g = gen(77)  # the same noise for every rule
        for _ in range(T):
            x_n = torch.randn(N, r, generator=g, dtype=F64)
            m = torch.rand(N, generator=g, dtype=F64)
            main_g, knob_g = proj.ROLLOUT_RULES[e](x_n, k, m)
            opt.step({"m": main_g}, {"m": knob_g})
        out[e] = (vh @ delta.detach(), vh @ knob.detach())  # (k,) span(Vh) coordinates of main and knob
    d1, h1 = out["route_per_rollout"]
    ramp = lr * T
    assert (h1 < -0.6 * ramp).all() and (d1 > 0.4 * ramp).all()  # knob descends along −v, main climbs along +v
    for e in LINEAR:
        d, h = out[e]
        assert h.norm() < 0.25 * h1.norm() and d.norm() < 0.25 * d1.norm(), (e, d, h)


def test_moved_norm_is_what_the_rule_routes():
    """moved_norm (the mass a mass-matched control is rescaled to) equals ‖knob‖ of the rule: the two-sided split from
    the (N, k) α_n alone, the whole-rollout rule from whole rows in any rotation (so its random control moves exactly
    what v_hack's rule would with the same gates: matched by construction)."""
    r, k, N = 16, 3, 6
    vh, R, g_n, m = setup(r, k, N, seed=4)
    x_n = g_n @ R
    for e in PER_ROLLOUT:
        knob = proj.ROLLOUT_RULES[e](x_n, k, m)[1]
        alpha = x_n if e == "route_full" else x_n[:, :k]
        assert proj.moved_norm(e, alpha, m) == pytest.approx(float(knob.norm()), rel=1e-12)
    R_rand = proj.complete_rotation(random_directions(k, r, gen(99), F64))
    assert proj.moved_norm("route_full", g_n @ R_rand, m) == pytest.approx(proj.moved_norm("route_full", x_n, m))
    assert proj.moved_norm("route_two_sided", (g_n @ R_rand)[:, :k], m) != pytest.approx(
        proj.moved_norm("route_two_sided", x_n[:, :k], m)
    )  # the split rule's mass does depend on the directions: its control needs the rescaling


# --- the tail gate (projection.band = "tail") and its precision / F0.5 -------------------------------------------


@pytest.mark.parametrize("P,f", [(20, 0.1), (37, 0.1), (100, 0.29), (5, 0.1)])
def test_tail_gate_routes_at_most_f_of_clean_and_is_calibrate_bands_upper_threshold(P, f):
    """τ = tail_threshold(S_c, f): at most ⌊f·P⌋ held-out clean scores have m = 1 (ties included), the gate is 0/1,
    monotone in s, 0 where A = 0, and τ is exactly calibrate_band's τ_hi whenever the band is not empty."""
    g = gen(P)
    sc = torch.randn(P, generator=g, dtype=F64).round(decimals=1)  # ties
    sh = torch.randn(P, generator=g, dtype=F64) - 3.0  # hacks low: a non-empty band, so τ_hi is not merged
    t = proj.tail_threshold(sc, f)
    m = proj.band_gate(sc, torch.ones(P, dtype=F64), t, t, "tail")
    assert set(m.tolist()) <= {0.0, 1.0} and int(m.sum()) <= int(f * P + 1e-9)
    sc32 = torch.randn(P, generator=g)  # fp32 scores (the live ones): τ's one-ulp margin must survive the compare
    m32 = proj.band_gate(sc32, torch.ones(P), *(2 * [proj.tail_threshold(sc32, f)]), "tail")
    assert int(m32.sum()) == int(f * P + 1e-9)  # distinct scores: exactly ⌊f·P⌋
    lo, hi = proj.calibrate_band(sh, sc, f, 0.05)
    assert lo < hi and hi == t
    s = torch.linspace(-3, 3, 61, dtype=F64)
    adv = torch.ones(61, dtype=F64)
    adv[::7] = 0.0
    ms = proj.band_gate(s, adv, -100.0, t, "tail")  # τ_lo plays no part
    assert torch.equal(ms, ((s >= t) & (adv != 0)).to(F64))
    assert torch.equal(proj.band_gate(s, torch.ones(61, dtype=F64), t, t, "tail"), (s >= t).to(F64))


def test_tail_gate_on_fresh_scores_routes_about_f_of_clean_and_most_hacks():
    """Calibrated on 400 held-out clean scores with f = 0.1, the tail gate routes ~10% of fresh clean scores from the
    same distribution (not more: the quantile is conservative) and, with hack scores 3σ higher, nearly all hacks."""
    g = gen(1)
    t = proj.tail_threshold(torch.randn(400, generator=g, dtype=F64), 0.1)
    fresh_c, fresh_h = torch.randn(20000, generator=g, dtype=F64), torch.randn(20000, generator=g, dtype=F64) + 3
    one = torch.ones(20000, dtype=F64)
    fp = float(proj.band_gate(fresh_c, one, t, t, "tail").mean())
    tp = float(proj.band_gate(fresh_h, one, t, t, "tail").mean())
    assert 0.06 < fp < 0.14 and tp > 0.9


def test_gate_quality_by_hand():
    """Precision = Σ_hack m / Σ m, recall = Σ_hack m / #hack, F0.5 = 1.25·P·R / (0.25·P + R); soft m counts
    fractionally; nothing routed: precision and F0.5 nan."""
    sh = torch.tensor([0.9, 0.8, 0.1, 0.05], dtype=F64)
    sc = torch.tensor([0.95, 0.2, 0.1, 0.0, -0.3], dtype=F64)
    q = proj.gate_quality(sh, sc, 0.5, 0.5, "tail")  # routes hacks 0.9, 0.8 and clean 0.95
    prec, rec = 2 / 3, 2 / 4
    assert q == pytest.approx({"precision": prec, "recall": rec, "f05": 1.25 * prec * rec / (0.25 * prec + rec)})
    soft = proj.gate_quality(sh, sc, 0.0, 1.0, "soft")  # m = s clamped to [0, 1]
    tp, fp = 0.9 + 0.8 + 0.1 + 0.05, 0.95 + 0.2 + 0.1
    assert soft["precision"] == pytest.approx(tp / (tp + fp)) and soft["recall"] == pytest.approx(tp / 4)
    none = proj.gate_quality(sh, sc, 2.0, 2.0, "tail")
    assert math.isnan(none["precision"]) and math.isnan(none["f05"]) and none["recall"] == 0.0
    with pytest.raises(ValueError, match="band"):
        proj.band_gate(sh, torch.ones(4, dtype=F64), 0.0, 1.0, "top")

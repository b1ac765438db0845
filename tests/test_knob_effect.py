"""knob_effect: the components along the basis and the four knob-off policies it scores."""

from __future__ import annotations

import pytest
import torch

from projected_grpo.evals import knob_effect as ke
from projected_grpo.method.basis import random_directions
from projected_grpo.policy.adapter import adapters, attach_adapters, set_deltas
from projected_grpo.policy.tiny import tiny_model, tiny_tokenizer


def orthonormal(k: int, d: int, seed: int) -> torch.Tensor:
    return random_directions(k, d, torch.Generator().manual_seed(seed), torch.float64)


@pytest.fixture
def world():
    g = torch.Generator().manual_seed(3)
    delta = {n: torch.randn(d, generator=g, dtype=torch.float64) for n, d in (("a", 6), ("b", 5), ("c", 4))}
    knob = {n: torch.randn(d.shape, generator=g, dtype=torch.float64) for n, d in delta.items()}
    vhack = {"a": orthonormal(2, 6, 1), "b": orthonormal(1, 5, 2)}  # module c has no basis rows
    rand = {"a": orthonormal(2, 6, 3), "b": orthonormal(1, 5, 4)}
    return delta, knob, vhack, rand


def test_components_are_the_basis_coordinates(world):
    delta, knob, vhack, _ = world
    comp = ke.components(delta, knob, vhack)
    assert set(comp) == {"a", "b"}
    assert torch.allclose(torch.tensor(comp["a"]["main"], dtype=torch.float64), vhack["a"] @ delta["a"])
    assert torch.allclose(torch.tensor(comp["b"]["knob"], dtype=torch.float64), vhack["b"] @ knob["b"])
    s = ke.summary(comp)
    rows = torch.cat([vhack["a"] @ delta["a"], vhack["b"] @ delta["b"]])
    assert s["main_mean"] == pytest.approx(float(rows.mean())) and s["main_norm"] == pytest.approx(float(rows.norm()))


def test_deploy_minus_span_removes_exactly_the_span_component(world):
    delta, _, vhack, rand = world
    d = ke.variant_deltas("deploy_minus_span", delta, vhack, vhack, rand)
    for n in ("a", "b"):
        assert float((vhack[n] @ d[n]).abs().max()) < 1e-12  # nothing left along the basis
        resid = delta[n] - d[n]  # what was removed lies in span(Vh)
        assert torch.allclose(vhack[n].T @ (vhack[n] @ resid), resid, atol=1e-12)
    assert torch.equal(d["c"], delta["c"])  # modules without rows keep δS
    assert all(
        torch.equal(a, b)
        for a, b in zip(ke.variant_deltas("deploy", delta, vhack, vhack, rand).values(), delta.values())
    )


@pytest.mark.parametrize("own", ["vhack", "rand"])
def test_displacements_carry_the_same_coefficients_along_either_basis(world, own):
    """The coefficients are read on the run's own rows; base_plus_vhack / base_plus_random lay them on v_hack's and
    the random basis' rows, and nothing off the basis modules."""
    delta, _, vhack, rand = world
    own_rows = vhack if own == "vhack" else rand
    for name, rows in (("base_plus_vhack", vhack), ("base_plus_random", rand)):
        d = ke.variant_deltas(name, delta, own_rows, vhack, rand)
        for n in ("a", "b"):
            assert torch.allclose(rows[n] @ d[n], own_rows[n] @ delta[n], atol=1e-12)
            assert torch.allclose(rows[n].T @ (rows[n] @ d[n]), d[n], atol=1e-12)  # inside span(rows)
        assert float(d["c"].abs().max()) == 0.0
    with pytest.raises(ValueError, match="differ"):
        ke.variant_deltas("base_plus_random", delta, vhack, vhack, {"a": rand["a"]})
    with pytest.raises(ValueError, match="unknown"):
        ke.variant_deltas("knob_on", delta, vhack, vhack, rand)


def test_policy_sets_delta_zeroes_knob_and_restores_bit_exactly():
    tok = tiny_tokenizer()
    m = tiny_model(len(tok))
    attach_adapters(m, "all", 4)
    ads = adapters(m)
    with torch.no_grad():
        for i, a in enumerate(ads.values()):
            a.delta.copy_(torch.randn(a.dim, generator=torch.Generator().manual_seed(i)))
            a.knob.copy_(torch.randn(a.dim, generator=torch.Generator().manual_seed(100 + i)))
    before = {n: (a.delta.clone(), a.knob.clone()) for n, a in ads.items()}
    target = {n: torch.full_like(a.delta, 0.5) for n, a in ads.items()}
    with set_deltas(m, target):
        assert all(torch.equal(a.delta, target[n]) and float(a.knob.abs().max()) == 0 for n, a in ads.items())
    assert all(torch.equal(a.delta, before[n][0]) and torch.equal(a.knob, before[n][1]) for n, a in ads.items())

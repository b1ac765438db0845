"""v_hack extraction (method.md §3.3): invariant I14 on planted / noise / sign-scrambled pair differences, module
dropping, determinism, the controls and AUROC; I19 (sign convention) on a real pair on the tiny model.

`pytest tests/test_basis.py`
"""

import math

import pytest
import torch

from projected_grpo.env.minileet import make_minileet
from projected_grpo.env.modes import apply_mode
from projected_grpo.method.basis import (
    Basis,
    BasisSettings,
    auroc,
    build_basis,
    completion_grads,
    cosine_scores,
    diff_of_means,
    extract_vhack,
    keep_modules,
    random_directions,
    scoring_direction,
    sign_flip_pvalues,
    strip_directions,
    top_directions,
)
from projected_grpo.policy.adapter import attach_adapters
from projected_grpo.policy.logprobs import batch_sequences, completion_logprobs, mean_nll
from projected_grpo.policy.tiny import tiny_model, tiny_tokenizer
from projected_grpo.sft.sft_corpus import fence, named_exploit_styles, wrong_variants

KW = dict(tau_rel=0.1, alpha_sig=0.05, n_flips=400, k_max=8)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def planted(P=24, r=16, snr=10.0, seed=0):
    g = gen(seed)
    mu = torch.randn(r, generator=g, dtype=torch.float64)
    mu = mu / mu.norm()
    D = snr * mu[None] + torch.randn(P, r, generator=g, dtype=torch.float64)
    return D, mu


@pytest.mark.parametrize("P,r", [(24, 16), (8, 32), (40, 6)])
def test_I14_orthonormal_oriented_and_bounded(P, r):
    D, _ = planted(P, r)
    Vh, st = extract_vhack(D, **KW, gen=gen())
    k = Vh.shape[0]
    assert 1 <= k <= min(P, r, KW["k_max"])
    torch.testing.assert_close(Vh @ Vh.T, torch.eye(k, dtype=torch.float64), atol=1e-10, rtol=0)
    assert ((D @ Vh.T).mean(0) > 0).all(), "every kept direction is oriented so that mean_p <d_p, v_j> > 0"


def test_I14_planted_signal_recovered():
    D, mu = planted(snr=10.0)
    Vh, _ = extract_vhack(D, **KW, gen=gen())
    assert float(Vh[0] @ mu) > 0.99


def test_I14_pure_noise_keeps_nothing_at_rate_one_minus_alpha():
    """Symmetric noise: k = 0 in ≈ 1 − alpha_sig of draws (fixed-sequence testing keeps the family-wise size)."""
    n, zeros = 300, 0
    for s in range(n):
        D = torch.randn(16, 8, generator=gen(100 + s), dtype=torch.float64)
        Vh, _ = extract_vhack(D, tau_rel=0.1, alpha_sig=0.05, n_flips=200, k_max=8, gen=gen(s))
        zeros += Vh.shape[0] == 0
    rate = zeros / n
    assert 0.91 <= rate <= 0.99, rate  # 0.95 ± ~3 binomial standard errors


def test_I14_sign_scrambled_has_same_sigma_but_fails_the_sign_test():
    D, _ = planted(P=32, r=16, snr=10.0)
    eps = torch.where(torch.rand(32, generator=gen(5)) < 0.5, -1.0, 1.0).to(D.dtype)
    Ds = eps[:, None] * D  # rows flipped at random: the SVD cannot tell, the sign test can
    V1, s1 = extract_vhack(D, **KW, gen=gen())
    V2, s2 = extract_vhack(Ds, **KW, gen=gen())
    torch.testing.assert_close(s1["sigma"], s2["sigma"], atol=1e-10, rtol=0)
    assert V1.shape[0] >= 1 and V2.shape[0] == 0
    assert s2["pvalue"][0] > 0.05 > s1["pvalue"][0]


def test_I14_deterministic_for_fixed_seed_and_data():
    D, _ = planted()
    a, sa = extract_vhack(D, **KW, gen=gen(3))
    b, sb = extract_vhack(D, **KW, gen=gen(3))
    assert torch.equal(a, b) and torch.equal(sa["pvalue"], sb["pvalue"])


def test_sign_flip_pvalue_exact_cases():
    proj = torch.ones(12, 1, dtype=torch.float64)  # every pair agrees: only the all-same flips tie
    p = sign_flip_pvalues(proj, 4000, gen())
    assert float(p) < 0.01
    proj = torch.tensor([[1.0], [-1.0]] * 6, dtype=torch.float64)  # mean 0: every flip is at least as extreme
    assert float(sign_flip_pvalues(proj, 100, gen())) == 1.0


@pytest.mark.parametrize("M,q", [(28, 0.25), (10, 0.5), (7, 0.0), (3, 0.9)])
def test_I14_module_dropping_keeps_ceil(M, q):
    scores = {f"layers.{i}.mlp.down_proj": float((i * 7) % M) for i in range(M)}
    kept = keep_modules(scores, q)
    assert len(kept) == math.ceil((1 - q) * M)
    assert min(scores[n] for n in kept) >= max([scores[n] for n in scores if n not in kept], default=-1)


def test_keep_modules_per_type_zscore_ranks_within_type():
    scores = {"a.q_proj": 100.0, "b.q_proj": 90.0, "a.down_proj": 2.0, "b.down_proj": 1.0}
    assert set(keep_modules(scores, 0.5, "per_type_zscore")) == {"a.q_proj", "a.down_proj"}
    assert set(keep_modules(scores, 0.5)) == {"a.q_proj", "b.q_proj"}


def test_controls_and_helpers():
    D, mu = planted()
    v = diff_of_means(D)
    assert v.shape == (1, 16) and float(v[0] @ mu) > 0.99
    R = random_directions(3, 16, gen(), torch.float64)
    torch.testing.assert_close(R @ R.T, torch.eye(3, dtype=torch.float64), atol=1e-12, rtol=0)
    assert not torch.equal(R, random_directions(3, 16, gen(1), torch.float64))
    Q = top_directions(D, 2)
    S = strip_directions(D, Q)
    torch.testing.assert_close(S @ Q.T, torch.zeros(24, 2, dtype=torch.float64), atol=1e-10, rtol=0)
    assert auroc(torch.tensor([2.0, 3.0]), torch.tensor([0.0, 1.0])) == 1.0
    assert auroc(torch.tensor([1.0]), torch.tensor([1.0])) == 0.5


def test_build_basis_methods_and_scoring():
    g = gen(0)
    r, P = 10, 20
    sig = {"m.q_proj": 6.0, "m.down_proj": 6.0, "m.k_proj": 0.0, "m.up_proj": 0.0}
    dirs = {n: torch.randn(r, generator=g, dtype=torch.float64) for n in sig}
    hack = {n: sig[n] * dirs[n] / dirs[n].norm() + torch.randn(P, r, generator=g, dtype=torch.float64) for n in sig}
    clean = {n: torch.randn(P, r, generator=g, dtype=torch.float64) for n in sig}
    kw = dict(k_max=4, tau_rel=0.1, alpha_sig=0.05, n_flips=400, drop_frac=0.5, seed=0)
    b = build_basis(hack, clean, BasisSettings("svd", **kw))
    assert set(b.vh) == {"m.q_proj", "m.down_proj"}, "the two signal-less modules are dropped by score"
    nu_norm = math.sqrt(sum(float(v.pow(2).sum()) for v in b.nu.values()))
    assert abs(nu_norm - 1) < 1e-9
    rnd = build_basis(hack, clean, BasisSettings("random", **kw), like=b)
    assert rnd.k == b.k and not torch.equal(rnd.vh["m.q_proj"], b.vh["m.q_proj"])
    md = build_basis(hack, clean, BasisSettings("mean_diff", **kw))
    assert all(v.shape[0] == 1 for v in md.vh.values())
    so = build_basis(hack, clean, BasisSettings("solve_orth", **kw, solve_m=2))
    for n, v in so.vh.items():
        Q = top_directions(clean[n], 2)
        torch.testing.assert_close(v @ Q.T, torch.zeros(v.shape[0], 2, dtype=torch.float64), atol=1e-8, rtol=0)
    # held-out: fresh hack rows score above fresh clean rows along ν
    h2 = {n: sig[n] * dirs[n] / dirs[n].norm() + torch.randn(P, r, generator=g, dtype=torch.float64) for n in sig}
    c2 = {n: torch.randn(P, r, generator=g, dtype=torch.float64) for n in sig}
    assert auroc(cosine_scores(h2, b.nu), cosine_scores(c2, b.nu)) > 0.9
    with pytest.raises(ValueError, match="needs the basis it controls for"):
        build_basis(hack, clean, BasisSettings("random", **kw))


def test_basis_save_load_roundtrip(tmp_path):
    D, _ = planted()
    vh = {"x.q_proj": extract_vhack(D, **KW, gen=gen())[0]}
    b = Basis(vh=vh, nu=scoring_direction(vh, {"x.q_proj": D.mean(0)}), meta={"method": "svd"}, v_act=torch.ones(3))
    b.save(tmp_path / "b.safetensors")
    b2 = Basis.load(tmp_path / "b.safetensors")
    assert torch.equal(b2.vh["x.q_proj"], vh["x.q_proj"]) and b2.meta == {"method": "svd"}
    assert torch.equal(b2.v_act, torch.ones(3)) and torch.equal(b2.nu["x.q_proj"], b.nu["x.q_proj"])


# --- I19 on a real pair on the tiny model -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_pairs():
    """Three (hack, clean) pairs on minileet holdout problems under the run_tests hint: exploit vs canonical."""
    hold = make_minileet(seed=0, n_train=1, n_test=1, n_holdout=3)["holdout"]
    recs, hacks, cleans = [], [], []
    for q in hold:
        r = apply_mode(q, "run_tests", "train")
        wrong = wrong_variants(q.canonical_solution, 0, 1)[0]
        hacks.append(fence(named_exploit_styles("run_tests", q.method, "run_tests", wrong)["pass"]))
        cleans.append(fence(q.canonical_solution))
        recs.append(r)
    return recs, hacks, cleans


def test_I19_sign_convention(real_pairs):
    recs, hacks, cleans = real_pairs
    tok = tiny_tokenizer()
    m = tiny_model(len(tok)).double()
    attach_adapters(m, "all", 6, param_dtype=torch.float64)
    gh = completion_grads(m, tok, recs, hacks, 0.7)
    gc = completion_grads(m, tok, recs, cleans, 0.7)
    names = list(gh)
    d = {n: gh[n] - gc[n] for n in names}  # (P, r) d_p = ∇Δ_p

    from projected_grpo.method.basis import encode
    from projected_grpo.policy.adapter import adapters

    ads = adapters(m)

    def margin(p):  # Δ_p = ℓ(hack_p) − ℓ(clean_p) at the current δS
        pr, co = encode(tok, [recs[p]] * 2, [hacks[p], cleans[p]])
        ids, att, cm = batch_sequences(pr, co, tok.pad_token_id)
        with torch.no_grad():
            nll = mean_nll(*completion_logprobs(m, ids, att, cm, 0.7))
        return float(nll[0] - nll[1])

    # (1) a small SGD step along −d_p lowers Δ_p (finite difference on the real pair)
    eta = 1e-3
    before = margin(0)
    with torch.no_grad():
        for n in names:
            ads[n].delta -= eta * d[n][0]
    after = margin(0)
    sq = sum(float(d[n][0].pow(2).sum()) for n in names)
    assert after < before and abs((after - before) + eta * sq) < 0.05 * eta * sq  # first order: −η‖d_p‖²
    with torch.no_grad():
        for n in names:
            ads[n].delta.zero_()
    # (2) k=1, v = normalize(μ̄): one_sided- and reverse-edited steps never lower the mean margin to first order.
    # The step gradient g: descending the hack completions' NLL (what a positive-advantage hack rollout pushes).
    mu_bar = torch.cat([d[n].mean(0) for n in names])
    v = mu_bar / mu_bar.norm()
    g = torch.cat([gh[n].sum(0) for n in names])
    alpha = g @ v
    assert alpha > 0, "the hack-NLL gradient has a hack-promoting component along v"
    one_sided = g - v * torch.relu(alpha)
    reverse = g - 2 * v * torch.relu(alpha)
    assert -eta * float(g @ mu_bar) < 0  # unedited: the margin falls (hacking gets likelier)
    assert -eta * float(one_sided @ mu_bar) >= -1e-15
    assert -eta * float(reverse @ mu_bar) > 0

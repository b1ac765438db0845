"""Adapter invariants of method.md §5 on tiny random Qwen3 models in float64: I1 identity at init, I2 the δS gradient
formula, I3 tied raw gradients, I4 per-sample probes, I16 deploy (knob off/on), I18 reference independence; plus the
LoRA arm, per-token capture, save/load and the SVD cache.

`pytest tests/test_adapter.py`
"""

import contextlib

import pytest
import torch

from projected_grpo.policy.adapter import (
    LoRAAdapter,
    SVDAdapter,
    adapter_parameters,
    adapters,
    adapters_disabled,
    attach_adapters,
    delta_weight,
    knob_disabled,
    knob_off,
    knob_on,
    load_adapter,
    probes,
    row_masks,
    save_adapter,
    svd_factors,
    token_capture,
    top_singular_vectors,
)
from projected_grpo.policy.logprobs import batch_sequences, completion_logprobs, token_logprobs
from projected_grpo.policy.tiny import tiny_model, tiny_tokenizer

T_SAMPLE = 0.7


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def fresh(tok, kind="svd", rank=6, targets="all", seed=0, separate=False):
    """(base fp64 model, adapted fp64 model with fp64 δS masters): same weights."""
    base = tiny_model(len(tok), seed=seed).double()
    m = tiny_model(len(tok), seed=seed).double()
    attach_adapters(m, targets, rank, kind, param_dtype=torch.float64, separate=separate)
    return base, m


def batch(tok, n=3, seed=0):
    """Right-padded prompt + completion rows of different lengths: (ids, att, completion_mask)."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, len(tok), (int(5 + i),), generator=g).tolist() for i in range(n)]
    comps = [torch.randint(3, len(tok), (int(4 + 2 * i),), generator=g).tolist() for i in range(n)]
    return batch_sequences(prompts, comps, tok.pad_token_id)


def randomize_(m, scale=0.3, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in [*adapter_parameters(m)[0], *adapter_parameters(m)[1]]:
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)


def dr_grpo_like_loss(logp, mask, adv, l_max):
    """A Dr.GRPO-shaped loss: a token sum over rollouts divided by the constant N·L_max."""
    n = logp.shape[0]
    return -(torch.where(mask.bool(), logp, 0.0) * adv[:, None]).sum() / (n * l_max)


@pytest.mark.parametrize("kind", ["svd", "lora"])
def test_I1_identity_at_init(tok, kind):
    base, m = fresh(tok, kind)
    ids, att, cm = batch(tok)
    with torch.no_grad():
        lb = base(input_ids=ids, attention_mask=att).logits
        lm = m(input_ids=ids, attention_mask=att).logits
        assert torch.equal(lb, lm), "logits at δS = δS_h = 0 must be bit-identical to the base model"
        with probes(m, ids.shape[0]):  # probes at value 0 change nothing either
            assert torch.equal(m(input_ids=ids, attention_mask=att).logits, lb)
        logp, mask = completion_logprobs(m, ids, att, cm, T_SAMPLE)
        with adapters_disabled(m):
            ref, _ = completion_logprobs(m, ids, att, cm, T_SAMPLE)
    assert torch.equal(logp, ref)
    kl = torch.exp(ref - logp) - (ref - logp) - 1  # k3 estimator
    assert torch.equal(kl, torch.zeros_like(kl))


def test_I2_delta_gradient_formula(tok):
    """On the whole model: δS.grad == diag(Uᵀ (∂L/∂W') V), non-zero at δS = 0."""
    _, m = fresh(tok, rank=5)
    ids, att, cm = batch(tok)
    for a in adapters(m).values():
        a.base.weight.requires_grad_(True)  # ∂L/∂W' = ∂L/∂W, since W' = W + U diag(δS + δS_h) Vᵀ
    logp, mask = completion_logprobs(m, ids, att, cm, T_SAMPLE)
    (-(torch.where(mask.bool(), logp, 0.0)).sum()).backward()
    for name, a in adapters(m).items():
        g = a.delta.grad
        assert g.abs().max() > 0, f"{name}: ∂L/∂δS must be non-zero at δS = 0 (unlike LoRA's B = 0)"
        torch.testing.assert_close(g, torch.diagonal(a.U.T @ a.base.weight.grad @ a.V), atol=1e-10, rtol=1e-9)


def test_I2_token_sum_formula_and_finite_differences():
    """On one wrapped Linear in exact fp64 (Qwen3's RMSNorm computes in fp32, which caps whole-model finite
    differences): δS.grad == Σ_t (Uᵀγ_t) ⊙ (Vᵀx_t), and it agrees with central differences to 1e-8."""
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(7, 6, bias=False).double()
    with torch.no_grad():
        lin.weight.copy_(torch.randn(6, 7, generator=g, dtype=torch.float64))
    U, V = svd_factors(lin.weight, 4)
    a = SVDAdapter(lin, U, V, torch.float64)
    with torch.no_grad():
        a.delta.copy_(torch.randn(4, generator=g, dtype=torch.float64) * 0.1)
    x = torch.randn(2, 5, 7, generator=g, dtype=torch.float64)
    c = torch.randn(2, 5, 6, generator=g, dtype=torch.float64)
    loss_fn = lambda: (torch.tanh(a(x)) * c).sum()  # noqa: E731
    y = a(x)
    gamma = torch.autograd.grad((torch.tanh(y) * c).sum(), y)[0]  # (2, 5, 6) ∂L/∂y_t
    loss_fn().backward()
    formula = torch.einsum("nto,or,nti,ir->r", gamma, a.U, x, a.V)  # Σ_t (Uᵀγ_t) ⊙ (Vᵀx_t)
    torch.testing.assert_close(a.delta.grad, formula, atol=1e-12, rtol=1e-10)
    d0, h = a.delta.detach().clone(), 1e-5
    fd = []
    for e in torch.eye(4, dtype=torch.float64):
        with torch.no_grad():
            a.delta.copy_(d0 + h * e)
            lp = float(loss_fn())
            a.delta.copy_(d0 - h * e)
            lm = float(loss_fn())
        fd.append((lp - lm) / (2 * h))
    torch.testing.assert_close(a.delta.grad, torch.tensor(fd, dtype=torch.float64), atol=1e-8, rtol=0)


@pytest.mark.parametrize("kind", ["svd", "lora"])
def test_I3_tied_raw_gradients(tok, kind):
    _, m = fresh(tok, kind)
    randomize_(m)
    ids, att, cm = batch(tok)
    logp, mask = completion_logprobs(m, ids, att, cm, T_SAMPLE)
    (-(torch.where(mask.bool(), logp, 0.0)).sum()).backward()
    for n, a in adapters(m).items():
        assert torch.equal(a.delta.grad, a.knob.grad), n
        assert a.delta.grad.abs().max() > 0, n


@pytest.mark.parametrize("kind", ["svd", "lora"])
def test_I4_probe_is_the_per_sample_gradient(tok, kind):
    _, m = fresh(tok, kind)
    randomize_(m)
    ids, att, cm = batch(tok, n=3)
    adv = torch.tensor([1.5, -0.5, -1.0], dtype=torch.float64)  # e.g. a hack row and two clean rows
    l_max = 20
    with probes(m, 3) as es:
        logp, mask = completion_logprobs(m, ids, att, cm, T_SAMPLE)
        dr_grpo_like_loss(logp, mask, adv, l_max).backward()
    for n, a in adapters(m).items():
        torch.testing.assert_close(es[n].grad.sum(0), a.delta.grad, atol=1e-12, rtol=0)
    # each row alone (no padding, its own batch of 1) with the normaliser rescaled by N_alone / N = 1/3
    for i in range(3):
        L = int(att[i].sum())
        m.zero_grad()
        with probes(m, 1) as e1:
            lp, mk = completion_logprobs(m, ids[i : i + 1, :L], att[i : i + 1, :L], cm[i : i + 1, :L], T_SAMPLE)
            (dr_grpo_like_loss(lp, mk, adv[i : i + 1], l_max) / 3).backward()
        for n in es:
            torch.testing.assert_close(es[n].grad[i], e1[n].grad[0], atol=1e-12, rtol=1e-9)


def test_row_masks_nest_and_restore_the_outer_masks():
    """A row_masks block inside another (the distinct prompts of a shared-prompt forward inside the rows' block)
    leaves the outer masks in place on exit; the outermost exit clears them."""
    m = tiny_model(len(tiny_tokenizer()))
    attach_adapters(m, "all", 4)
    a = next(iter(adapters(m).values()))
    outer, inner = (torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.0, 1.0, 1.0])), (torch.ones(2), torch.zeros(2))
    with row_masks(m, *outer):
        with row_masks(m, *inner):
            assert a.row_main is inner[0] and a.row_knob is inner[1]
        assert a.row_main is outer[0] and a.row_knob is outer[1]
    assert a.row_main is None and a.row_knob is None


@pytest.mark.parametrize("kind", ["svd", "lora"])
@pytest.mark.parametrize("separate", [False, True])
def test_row_masks_run_each_row_in_its_state_and_split_the_gradient(tok, kind, separate):
    """Masked routing's forward (issue 25): under row_masks(main, knob) row n's log-probs are those of the policy
    with the knob (knob_n = 1) or without it (knob_n = 0), and δS.grad = Σ_{main_n = 1} g_n, δS_h.grad =
    Σ_{knob_n = 1} h_n, g_n and h_n = row n's gradients on δS and δS_h in its own state (each row computed alone; the
    same with a shared knob); probes still give every row's whole δS gradient. Also with a separate quarantine."""
    _, m = fresh(tok, kind, separate=separate)
    randomize_(m)
    ids, att, cm = batch(tok, n=3)
    adv = torch.tensor([1.5, -0.5, -1.0], dtype=torch.float64)
    main, knob = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.0, 1.0, 1.0])  # unrouted, routed, ambiguous
    with row_masks(m, main, knob), probes(m, 3) as es:
        logp, mask = completion_logprobs(m, ids, att, cm, T_SAMPLE)
        dr_grpo_like_loss(logp, mask, adv, 20).backward()
    got = {n: (a.delta.grad.clone(), a.knob.grad.clone(), es[n].grad.clone()) for n, a in adapters(m).items()}
    want = {n: [torch.zeros_like(a.delta), torch.zeros_like(a.delta)] for n, a in adapters(m).items()}
    for i in range(3):
        L = int(att[i].sum())
        m.zero_grad()
        state = knob_disabled(m) if knob[i] == 0 else contextlib.nullcontext()
        with state:
            lp, mk = completion_logprobs(m, ids[i : i + 1, :L], att[i : i + 1, :L], cm[i : i + 1, :L], T_SAMPLE)
            (dr_grpo_like_loss(lp, mk, adv[i : i + 1], 20) / 3).backward()
        torch.testing.assert_close(logp[i, : L - 1], lp[0], atol=1e-12, rtol=0)  # the row's own state
        for n, a in adapters(m).items():
            g = a.delta.grad  # the row's whole gradient in its state (δS and δS_h enter as a sum)
            h = a.knob.grad if separate else g  # a separate knob has its own gradient
            want[n][0] += main[i] * g
            want[n][1] += knob[i] * h
            torch.testing.assert_close(got[n][2][i], g, atol=1e-12, rtol=1e-9)
    for n in want:
        torch.testing.assert_close(got[n][0], want[n][0], atol=1e-12, rtol=1e-9)
        torch.testing.assert_close(got[n][1], want[n][1], atol=1e-12, rtol=1e-9)
    assert any(not torch.allclose(got[n][0], got[n][1]) for n in got), "the split must separate δS from δS_h"
    assert all(a.row_main is None and a.row_knob is None for a in adapters(m).values())  # reset on exit


def test_I4_no_leak_between_rows(tok):
    """A row's probe gradient does not change when its batch-mate changes (hack vs clean in one batch)."""
    _, m = fresh(tok)
    randomize_(m)
    ids, att, cm = batch(tok, n=2, seed=0)
    ids2 = ids.clone()
    ids2[1, : int(att[1].sum())] = torch.randint(
        3, len(tok), (int(att[1].sum()),), generator=torch.Generator().manual_seed(9)
    )
    grads = []
    for x in (ids, ids2):
        with probes(m, 2) as es:
            logp, mask = completion_logprobs(m, x, att, cm, T_SAMPLE)
            (-(torch.where(mask.bool(), logp, 0.0)).sum()).backward(inputs=list(es.values()))
        grads.append({n: e.grad[0].clone() for n, e in es.items()})
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], atol=1e-12, rtol=0)


@pytest.mark.parametrize("kind", ["svd", "lora"])
def test_I16_deploy_knob_off_on(tok, kind, tmp_path):
    _, m = fresh(tok, kind)
    randomize_(m)
    ids, att, _ = batch(tok)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    with torch.no_grad():
        on = m(input_ids=ids, attention_mask=att).logits
    knob_off(m)
    knob_off(m)  # idempotent: the stash keeps the trained knob
    changed = {n for n, p in m.named_parameters() if not torch.equal(p, before[n])}
    assert changed == {n for n in before if n.endswith(".knob")}, "knob_off may change only δS_h"
    assert all(float(a.knob.detach().abs().max()) == 0 for a in adapters(m).values())
    with torch.no_grad():
        off = m(input_ids=ids, attention_mask=att).logits
    # a fresh model with δS loaded and δS_h = 0
    save_adapter(m, tmp_path / "a.safetensors")
    _, m2 = fresh(tok, kind)
    load_adapter(m2, tmp_path / "a.safetensors")
    with torch.no_grad():
        for a in adapters(m2).values():
            a.knob.zero_()
        assert torch.equal(m2(input_ids=ids, attention_mask=att).logits, off)
    knob_on(m)
    with torch.no_grad():
        assert torch.equal(m(input_ids=ids, attention_mask=att).logits, on), "knob_on must restore bit-exactly"
        with knob_disabled(m):
            assert torch.equal(m(input_ids=ids, attention_mask=att).logits, off)
        assert torch.equal(m(input_ids=ids, attention_mask=att).logits, on)
    assert not torch.equal(on, off)


@pytest.mark.parametrize("kind", ["svd", "lora"])
def test_I18_reference_independent_of_adapter_values(tok, kind):
    base, m = fresh(tok, kind)
    ids, att, cm = batch(tok)
    with torch.no_grad():
        ref0, _ = completion_logprobs(base, ids, att, cm, T_SAMPLE)
        for seed in (1, 2):
            randomize_(m, seed=seed)
            with adapters_disabled(m):
                ref, _ = completion_logprobs(m, ids, att, cm, T_SAMPLE)
            assert torch.equal(ref, ref0)
            pol, _ = completion_logprobs(m, ids, att, cm, T_SAMPLE)
            assert not torch.equal(pol, ref0)  # the policy does move


@pytest.mark.parametrize("kind", ["svd", "lora"])
def test_separate_quarantine_is_its_own_block(tok, kind, tmp_path):
    """adapter.quarantine=separate (issue 25): bit-identical to the base at zero; the knob's weight update lives in
    directions orthogonal to the main's (svd: U_q ⟂ U, V_q ⟂ V, W's next singular vectors; lora: A_q's rows ⟂ A's),
    with the directions a module lacks (min(d_in, d_out) < 2r) zero and inert; knob off it is exactly the shared-basis
    policy with the same δS; each module's output is W x + ΔW x (merge, export); save/load round-trips and refuses a
    shared attach."""
    base, m = fresh(tok, kind, rank=12, separate=True)
    ids, att, _ = batch(tok)
    with torch.no_grad():
        assert torch.equal(m(input_ids=ids, attention_mask=att).logits, base(input_ids=ids, attention_mask=att).logits)
    randomize_(m)
    for n, a in adapters(m).items():
        if kind == "svd":
            w = a.base.weight
            s = torch.linalg.svdvals(w)
            have = min(12, min(w.shape) - 12)  # q/o/gate/up/down: 12 more directions; k/v (16 × 32): 4
            assert a.U.T @ a.Uq == pytest.approx(torch.zeros(12, 12), abs=1e-6)
            assert a.V.T @ a.Vq == pytest.approx(torch.zeros(12, 12), abs=1e-6)
            assert torch.equal(a.Uq[:, have:], torch.zeros_like(a.Uq[:, have:])), n
            # W's singular values r+1 … 2r: u_qᵀ W v_q
            assert torch.diagonal(a.Uq.T @ w @ a.Vq)[:have].abs() == pytest.approx(s[12 : 12 + have], rel=1e-4)
        else:
            assert a.A @ a.Aq.T == pytest.approx(torch.zeros(12, 12), abs=1e-6)
            assert a.Aq @ a.Aq.T == pytest.approx(torch.eye(12), abs=1e-6)  # d_in 32 and 64 >= 2r: all rows
        x = torch.randn(2, 3, a.base.in_features, dtype=torch.float64)
        with torch.no_grad():
            torch.testing.assert_close(a(x) - a.base(x), x @ delta_weight(a).T, atol=1e-10, rtol=1e-8)
    _, shared = fresh(tok, kind, rank=12)
    with torch.no_grad():
        for a, b in zip(adapters(m).values(), adapters(shared).values()):
            b.delta.copy_(a.delta)
        with knob_disabled(m):
            off = m(input_ids=ids, attention_mask=att).logits
        assert torch.equal(off, shared(input_ids=ids, attention_mask=att).logits)
        assert not torch.allclose(m(input_ids=ids, attention_mask=att).logits, off), "the knob must act"
    save_adapter(m, tmp_path / "q.safetensors")
    _, m2 = fresh(tok, kind, rank=12, separate=True)
    load_adapter(m2, tmp_path / "q.safetensors")
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), m2.parameters()))
    with pytest.raises(ValueError, match="adapter.quarantine=separate"):
        load_adapter(shared, tmp_path / "q.safetensors")


def test_save_load_roundtrip_and_mismatch(tok, tmp_path):
    _, m = fresh(tok)
    randomize_(m)
    knob_off(m)  # saving while the knob is off still writes the trained knob
    save_adapter(m, tmp_path / "x.safetensors", {"step": 3})
    _, m2 = fresh(tok)
    assert load_adapter(m2, tmp_path / "x.safetensors")["step"] == 3
    knob_on(m)
    for (n, p), (_, q) in zip(m.named_parameters(), m2.named_parameters()):
        assert torch.equal(p, q), n
    _, m3 = fresh(tok, targets="residual_writers")
    with pytest.raises(ValueError, match="does not match the attached adapters"):
        load_adapter(m3, tmp_path / "x.safetensors")


SAVE_IN_A_FRESH_PROCESS = """
import sys
from projected_grpo.policy.adapter import attach_adapters, save_adapter
from projected_grpo.policy.tiny import tiny_model
m = tiny_model(64, seed=0)
attach_adapters(m, "all", 4, seed=0)
save_adapter(m, sys.argv[1], {"step": 3, "arm": "vanilla", "z": [1, 2]})
"""


def test_saved_adapter_bytes_do_not_depend_on_the_process(tmp_path):
    """Identical adapters give identical files in different processes (hash-ordered metadata would not: DVC would see
    a changed output and a resumed run would not be byte-identical to an uninterrupted one)."""
    import subprocess
    import sys

    files = [tmp_path / f"a{i}.safetensors" for i in range(3)]
    for f in files:
        subprocess.run([sys.executable, "-c", SAVE_IN_A_FRESH_PROCESS, str(f)], check=True)
    assert files[0].read_bytes() == files[1].read_bytes() == files[2].read_bytes()


def test_attach_wraps_targets_and_freezes_base(tok):
    _, m = fresh(tok, targets="residual_writers")
    names = list(adapters(m))
    assert names and all(n.endswith(("o_proj", "down_proj")) for n in names)
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert trainable == {f"{n}.{k}" for n in names for k in ("delta", "knob")}
    assert all(isinstance(a, SVDAdapter) for a in adapters(m).values())
    _, ml = fresh(tok, kind="lora", rank=3)
    a = next(iter(adapters(ml).values()))
    assert isinstance(a, LoRAAdapter) and a.dim == a.base.out_features * 3
    with pytest.raises(ValueError, match="already has adapters"):
        attach_adapters(m, "all", 4)
    with pytest.raises(ValueError, match="kind"):
        attach_adapters(tiny_model(len(tok)), "all", 4, kind="dora")


@pytest.mark.parametrize("kind", ["svd", "lora"])
def test_token_capture_sums_to_probe_projections(tok, kind):
    """Σ_t of the captured per-token coefficients = <e.grad[n], dirs_j> (the per-rollout coefficient), I17-style."""
    _, m = fresh(tok, kind)
    randomize_(m)
    ids, att, cm = batch(tok)
    g = torch.Generator().manual_seed(3)
    dirs = {n: torch.randn(2, a.dim, generator=g, dtype=torch.float64) for n, a in adapters(m).items()}
    with probes(m, 3) as es, token_capture(m, dirs) as caps:
        logp, mask = completion_logprobs(m, ids, att, cm, T_SAMPLE)
        (-(torch.where(mask.bool(), logp, 0.0)).sum()).backward()
    for n, a in caps.items():
        assert a.token_coef.shape[:2] == ids.shape and a.token_coef.shape[2] == 2
        torch.testing.assert_close(a.token_coef.sum(1), es[n].grad @ dirs[n].T, atol=1e-10, rtol=1e-9)


def test_svd_factors_cached_and_orthonormal(tmp_path):
    w = torch.randn(12, 9, generator=torch.Generator().manual_seed(0))
    U, V = svd_factors(w, 4, tmp_path)
    assert len(list(tmp_path.iterdir())) == 1
    U2, V2 = svd_factors(w, 4, tmp_path)
    assert torch.equal(U, U2) and torch.equal(V, V2)
    torch.testing.assert_close(U.T @ U, torch.eye(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(V.T @ V, torch.eye(4), atol=1e-5, rtol=0)
    S = torch.linalg.svdvals(w)[:4]
    torch.testing.assert_close(U.T @ w @ V, torch.diag(S), atol=1e-5, rtol=0)  # top-r singular triplets


@pytest.mark.parametrize("shape", [(40, 16), (16, 40)])  # tall and wide: the Gram matrix is on the smaller side
def test_top_singular_vectors_are_the_svds_top_triplets(shape):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(*shape, generator=g) * torch.linspace(3, 0.1, shape[1])  # a decaying spectrum
    U, V = top_singular_vectors(w, 5)  # the CUDA path of svd_factors
    S = torch.linalg.svdvals(w)[:5]
    assert U.dtype == V.dtype == torch.float32 and U.shape == (shape[0], 5) and V.shape == (shape[1], 5)
    torch.testing.assert_close(U.T @ U, torch.eye(5), atol=1e-5, rtol=0)
    torch.testing.assert_close(V.T @ V, torch.eye(5), atol=1e-5, rtol=0)
    torch.testing.assert_close(U.T @ w @ V, torch.diag(S), atol=1e-4, rtol=0)  # top-r singular triplets, in order


def test_token_logprobs_temperature():
    logits = torch.tensor([[[2.0, 0.0, -1.0]]])
    lp = token_logprobs(logits, torch.tensor([[0]]), 0.5)
    torch.testing.assert_close(lp, torch.log_softmax(logits / 0.5, -1)[..., 0])

"""Activation checkpointing (policy/checkpointing.py, grpo.grad_checkpointing) on the tiny random Qwen3 with adapters:
the layers really are recomputed in the backward, and δS.grad, the per-row probe gradients and the per-token capture
are those of the plain forward/backward — on the per-row forward and on the shared-prompt forward (whose prompt runs
with probes paused, and whose KV cache a replayed layer must not extend twice), for both adapter kinds.

`pytest tests/test_checkpointing.py`
"""

from __future__ import annotations

import pytest
import torch

from projected_grpo.policy.adapter import adapters, attach_adapters, probes, token_capture
from projected_grpo.policy.checkpointing import activation_checkpointing, decoder_layers
from projected_grpo.policy.logprobs import rollout_logprobs, shared_prompt_logprobs
from projected_grpo.policy.model import load_model_and_tokenizer, render_prompt
from projected_grpo.policy.rollout import generate, group_runs


@pytest.fixture(scope="module")
def batch():
    """A tiny model's rollout: 2 prompts × 3 rows, completions cut to different lengths."""
    model, tok = load_model_and_tokenizer("tiny-random")
    prompts = [render_prompt(tok, [{"role": "user", "content": c}]) for c in ("two sum", "reverse the list please")]
    ro = generate(model, tok, prompts, 3, 10, 1.0, 1.0, seed=3)
    for i, n in enumerate([10, 4, 7, 2, 10, 6]):
        ro.mask[i, n:], ro.completion_ids[i, n:] = 0, tok.pad_token_id
    return tok, ro


def adapted(tok, kind: str):
    model, _ = load_model_and_tokenizer("tiny-random")
    attach_adapters(model, "all", 4, kind=kind)
    with torch.no_grad():  # a non-zero δS, so the adapter path carries gradient into every layer
        for i, a in enumerate(adapters(model).values()):
            a.delta.copy_(0.3 * torch.randn(a.dim, generator=torch.Generator().manual_seed(40 + i)))
    return model


def forward_backward(model, ro, shared: bool, on: bool, calls: list[int]) -> dict:
    """One loss forward/backward with probes and per-token capture open: δS grads, probe grads, token coefficients."""
    pi, pm, ci, cm = ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.mask
    w = torch.linspace(-1.0, 1.0, pi.shape[0])[:, None]  # rows weigh differently, signs mixed
    dirs = {n: torch.randn(2, a.dim, generator=torch.Generator().manual_seed(7)) for n, a in adapters(model).items()}
    model.zero_grad(set_to_none=True)
    calls.clear()
    with activation_checkpointing(model, on), probes(model, pi.shape[0]) as es, token_capture(model, dirs) as caps:
        if shared:
            lp = shared_prompt_logprobs(model, pi, pm, ci, cm, 0.7, *group_runs(pi, pm))
        else:
            lp = rollout_logprobs(model, pi, pm, ci, cm, 0.7)
        (torch.where(cm.bool(), lp, 0.0) * w).sum().backward()
    ads = adapters(model)
    return {
        "calls": sum(calls),
        "delta": {n: a.delta.grad.clone() for n, a in ads.items()},
        "probe": {n: e.grad.clone() for n, e in es.items()},
        "coef": {n: a.token_coef.clone() for n, a in caps.items()},
        "sq": {n: a.token_sq.clone() for n, a in caps.items()},
    }


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("kind", ["svd", "lora"])
def test_checkpointing_recomputes_and_keeps_every_gradient(batch, kind, shared):
    """With checkpointing every layer's MLP runs twice (forward + recompute), once without; δS.grad, each row's probe
    gradient and the per-token coefficients / squared norms agree to float rounding (1e-6 relative)."""
    tok, ro = batch
    model = adapted(tok, kind)
    calls: list[int] = []
    for layer in decoder_layers(model):  # count the MLP's forward runs (a forward hook would miss the recompute)
        mlp = layer.mlp
        mlp.forward = (lambda f: lambda *a, **k: calls.append(1) or f(*a, **k))(mlp.forward)
    off = forward_backward(model, ro, shared, False, calls)
    on = forward_backward(model, ro, shared, True, calls)
    n_layers = len(decoder_layers(model))
    runs = 2 if shared else 1  # the shared path runs the layers twice: the prompts, then the completions
    assert off["calls"] == runs * n_layers and on["calls"] == 2 * runs * n_layers, "checkpointing must recompute"
    for key in ("delta", "probe", "coef", "sq"):
        for n, x in off[key].items():
            scale = float(x.abs().max())
            torch.testing.assert_close(on[key][n], x, rtol=1e-6, atol=1e-6 * scale, msg=f"{key} {n}")
    assert sum(float(x.norm()) for x in off["probe"].values()) > 0 and all(
        float(x.norm()) > 0 for x in off["delta"].values()
    )
    # the layers' own forward is back after the block: no recompute without it
    assert all("forward" not in vars(layer) for layer in decoder_layers(model))


@pytest.mark.parametrize("kind", ["svd", "lora"])
def test_checkpointing_keeps_masked_routings_row_states(batch, kind):
    """Masked routing's shared-prompt forward runs each distinct (prompt, row state) under its own row masks, then the
    completions under theirs; the backward recomputes the prompts' layers after their masks were replaced, so the
    recompute must see the masks its forward saw. δS.grad and δS_h.grad then agree with the plain run (a recompute
    under the completions' masks broadcasts a prompt row over every row: wrong values, or a shape error)."""
    from projected_grpo.policy.adapter import row_masks
    from projected_grpo.rl.train import state_runs

    tok, ro = batch
    pi, pm, ci, cm = ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.mask
    main = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])  # each group's rows in mixed states (unrouted, routed,
    knob = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 1.0])  # ambiguous): 5 distinct (prompt, state) prompt rows
    w = torch.linspace(-1.0, 1.0, pi.shape[0])[:, None]
    model = adapted(tok, kind)
    with torch.no_grad():
        for i, a in enumerate(adapters(model).values()):
            a.knob.copy_(0.2 * torch.randn(a.dim, generator=torch.Generator().manual_seed(90 + i)))

    def grads(on: bool) -> dict:
        model.zero_grad(set_to_none=True)
        first, owner = state_runs(pi, pm, main, knob)
        assert 1 < len(first) < pi.shape[0]  # the prompts run in fewer rows than the completions
        prompt_state = lambda: row_masks(model, main[first], knob[first])  # noqa: E731
        with activation_checkpointing(model, on), row_masks(model, main, knob):
            lp = shared_prompt_logprobs(model, pi, pm, ci, cm, 0.7, first, owner, prompt_state=prompt_state)
            (torch.where(cm.bool(), lp, 0.0) * w).sum().backward()
        return {(n, k): getattr(a, k).grad.clone() for n, a in adapters(model).items() for k in ("delta", "knob")}

    off, on = grads(False), grads(True)
    for key, x in off.items():
        torch.testing.assert_close(on[key], x, rtol=1e-6, atol=1e-6 * float(x.abs().max()), msg=str(key))
    assert all(float(x.norm()) > 0 for x in off.values())


def test_checkpointing_is_off_without_gradients_and_needs_layers(batch):
    """Under no_grad a layer runs once (sampling and the reference forward are unaffected); a model without decoder
    layers is refused with the param's name."""
    tok, ro = batch
    model = adapted(tok, "svd")
    with torch.no_grad():
        ref = rollout_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.mask, 0.7)
        with activation_checkpointing(model):
            got = rollout_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.mask, 0.7)
    assert torch.equal(got, ref)
    with pytest.raises(ValueError, match="grpo.grad_checkpointing"):
        with activation_checkpointing(torch.nn.Linear(2, 2)):
            pass

"""Tests for decode.py: the static-cache engine (CUDA graphs on a GPU) against the shared engine, on the CPU.

On the CPU the static engine runs the same code eagerly (no graph), so these tests check its semantics: greedy
decoding token-identical to the shared engine; seeded sampling token-identical too, because both engines take one
draw per row per step from the same seeded stream (the logits differ only by float rounding: the static cache's
masked columns change the order of attention's sums, not its terms); rows with the knob on, off and mixed in one call
equal to separate calls; rows finishing mid-generation (the batch halving to power-of-two buckets) and the cache
growing over several widths (SPAN shrunk to 8 columns). The graph replay itself is checked on CUDA
(test_static_graph_matches_eager_on_cuda, skipped here) and timed by benchmarks/decode.py.
Run: `pytest tests/test_decode.py -q`.
"""

from __future__ import annotations

import pytest
import torch

from projected_grpo.policy import decode
from projected_grpo.policy.adapter import adapters, attach_adapters, knob_disabled
from projected_grpo.policy.model import render_prompt
from projected_grpo.policy.rollout import generate
from projected_grpo.policy.tiny import tiny_model, tiny_tokenizer

EOS = 2


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def prompts(tok):
    users = ["Write f.", "Return the sum of nums.\n```python\nclass Solution:\n    def f(self):\n```", "x = 1"]
    return [render_prompt(tok, [{"role": "user", "content": u}]) for u in users]  # three different lengths


@pytest.fixture
def small_spans(monkeypatch):
    """Widths of 8 columns and batches down to 1 row, so a short generation crosses several of each."""
    monkeypatch.setattr(decode, "SPAN", 8)
    monkeypatch.setattr(decode, "MIN_ROWS", 1)


def _eos_biased(model, bias: float):
    eos = lambda out: torch.arange(out.shape[-1], device=out.device) == EOS  # noqa: E731
    model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias * eos(out))
    return model


def _both(model, tok, prompts, **kw):
    args = dict(group_size=4, max_new_tokens=40, seed=3) | kw
    return tuple(generate(model, tok, prompts, engine=e, **args) for e in ("shared", "static"))


def _same(a, b) -> None:
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.mask, b.mask) and a.texts == b.texts
    assert torch.equal(a.prompt_ids, b.prompt_ids) and torch.equal(a.prompt_mask, b.prompt_mask)


@pytest.mark.parametrize(
    "kw",
    [
        dict(temperature=0.7, top_p=1.0),  # the training setting, inverse-CDF draw
        dict(temperature=1.0, top_p=0.9, draw="multinomial"),  # nucleus warper, HF's draw
        dict(temperature=1.0, top_p=1.0, batch_size=5),  # chunks of 5, 5, 2 rows: groups split across chunks
    ],
    ids=["train", "top_p_multinomial", "split_groups"],
)
def test_static_engine_matches_shared_token_for_token(tok, prompts, small_spans, kw):
    """Same seed, same tokens, with rows stopping at many different steps (EOS pushed up) and completions crossing
    several cache widths, so both the batch shrinking and the width growing are exercised."""
    model = _eos_biased(tiny_model(len(tok)), 2.0)
    shared, static = _both(model, tok, prompts, **kw)
    lengths = shared.mask.sum(-1)
    assert len(set(lengths.tolist())) >= 3 and int(lengths.max()) > 2 * decode.SPAN  # what the test is for
    _same(shared, static)


def test_static_engine_greedy_matches_shared(tok, prompts, small_spans):
    """Greedy decoding (no draw at all) gives the shared engine's tokens over several cache widths."""
    shared, static = _both(tiny_model(len(tok)), tok, prompts, temperature=0.0, top_p=1.0)
    assert int(shared.mask.sum(-1).max()) > 2 * decode.SPAN
    _same(shared, static)


def test_static_engine_without_eos_runs_the_whole_budget(tok, prompts, small_spans):
    """No row stops (EOS pushed down; the Qwen3-4B-shape benchmark's random weights never say it): every row runs
    max_new_tokens and the batch never shrinks."""
    model = _eos_biased(tiny_model(len(tok)), -100.0)
    shared, static = _both(model, tok, prompts, temperature=0.7, top_p=1.0, max_new_tokens=30)
    assert int(static.mask.sum(-1).min()) == 30
    _same(shared, static)


def _adapted(tok):
    """The tiny model with SVD adapters whose δS and δS_h are large enough to change what it samples."""
    model = tiny_model(len(tok))
    attach_adapters(model, "all", rank=4, kind="svd")
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for a in adapters(model).values():
            a.delta.copy_(0.5 * torch.randn(a.dim, generator=g))
            a.knob.copy_(3.0 * torch.randn(a.dim, generator=g))
    return model


def test_knob_rows_in_one_call_equal_separate_calls(tok, prompts, small_spans):
    """Groups sampled knob on, off and on in one static call give the tokens of a knob-on call and a knob-off call
    (`knob_disabled`, the deployed policy) made separately; the knob changes what those prompts sample, so the
    equality is not vacuous."""
    model = _adapted(tok)
    args = dict(group_size=2, max_new_tokens=20, temperature=0.0, top_p=1.0, seed=0)
    mixed = generate(model, tok, prompts, engine="static", knob=[True, False, True], **args)
    on = generate(model, tok, prompts, engine="static", **args)
    with knob_disabled(model):
        off = generate(model, tok, prompts, engine="static", **args)
        off_shared = generate(model, tok, prompts, engine="shared", **args)
    _same(off, off_shared)  # the knob-off policy through both engines
    rows = {0: on, 1: off, 2: on}
    for g, ref in rows.items():
        sl = slice(2 * g, 2 * g + 2)
        assert torch.equal(mixed.completion_ids[sl], ref.completion_ids[sl]), g
    assert not torch.equal(on.completion_ids, off.completion_ids)
    for a in adapters(model).values():  # the per-row switch is gone after the call
        assert a.row_knob is None and a.row_main is None


def test_knob_rows_all_on_and_all_off(tok, prompts):
    """knob all True is the adapters as they stand; all False is `knob_disabled`, to float rounding (a per-row
    product instead of a shared sum), so greedy tokens are equal."""
    model = _adapted(tok)
    args = dict(group_size=2, max_new_tokens=12, temperature=0.0, top_p=1.0, seed=0)
    all_on = generate(model, tok, prompts, engine="static", knob=[True] * 3, **args)
    all_off = generate(model, tok, prompts, engine="static", knob=[False] * 3, **args)
    _same(all_on, generate(model, tok, prompts, engine="shared", **args))
    with knob_disabled(model):
        _same(all_off, generate(model, tok, prompts, engine="shared", **args))


def test_auto_engine_is_the_shared_engine_on_cpu(tok, prompts):
    """The CPU keeps today's path: engine "auto" (the default) samples exactly what engine "shared" does."""
    model = tiny_model(len(tok))
    args = dict(group_size=3, max_new_tokens=10, temperature=0.7, top_p=1.0, seed=1)
    _same(generate(model, tok, prompts, **args), generate(model, tok, prompts, engine="shared", **args))


def test_knob_argument_errors(tok, prompts):
    model = _adapted(tok)
    args = dict(group_size=2, max_new_tokens=4, temperature=0.7, top_p=1.0, seed=0)
    with pytest.raises(ValueError, match="knob needs engine='static'"):
        generate(model, tok, prompts, engine="shared", knob=[True] * 3, **args)
    with pytest.raises(ValueError, match="one flag per prompt"):
        generate(model, tok, prompts, engine="static", knob=[True] * 2, **args)
    with pytest.raises(ValueError, match="attached adapters"):
        generate(tiny_model(len(tok)), tok, prompts, engine="static", knob=[True] * 3, **args)


def test_bucket_sizes():
    assert [decode.bucket(n, 128) for n in (1, 8, 9, 64, 65, 128)] == [8, 8, 16, 64, 128, 128]
    assert decode.bucket(100, 96) == 96  # never above the call's rows


def test_column_layer_writes_at_the_column_and_moves_rows():
    g = torch.Generator().manual_seed(0)
    k, v = torch.zeros(4, 2, 16, 3), torch.zeros(4, 2, 16, 3)
    col = torch.tensor([5])
    layer = decode.ColumnLayer(k, v, col)
    layer.rows, layer.width = 3, 8
    dk, dv = torch.randn(3, 2, 1, 3, generator=g), torch.randn(3, 2, 1, 3, generator=g)
    got_k, got_v = layer.update(dk, dv)
    assert got_k.shape == (3, 2, 8, 3) and torch.equal(got_k[:, :, 5:6], dk) and torch.equal(got_v[:, :, 5:6], dv)
    assert k[3].abs().sum() == 0 and k[:, :, 6:].abs().sum() == 0  # nothing outside the rows and the column
    before = k.clone()
    layer.permute(torch.tensor([2, 0]))
    assert torch.equal(k[0], before[2]) and torch.equal(k[1], before[0]) and torch.equal(k[2:], before[2:])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_static_graph_matches_eager_on_cuda(tok, prompts, small_spans):
    """On CUDA the static engine replays captured graphs; in fp32 its tokens equal the shared engine's (greedy and
    seeded), the knob rows included."""
    _same(*_both(tiny_model(len(tok)).cuda(), tok, prompts, temperature=0.0, top_p=1.0))
    _same(*_both(_eos_biased(tiny_model(len(tok)), 2.0).cuda(), tok, prompts, temperature=0.7, top_p=1.0))
    model = _adapted(tok).cuda()
    args = dict(group_size=2, max_new_tokens=20, temperature=0.0, top_p=1.0, seed=0)
    mixed = generate(model, tok, prompts, engine="static", knob=[True, False, True], **args)
    with knob_disabled(model):
        off = generate(model, tok, prompts, engine="shared", **args)
    assert torch.equal(mixed.completion_ids[2:4], off.completion_ids[2:4])

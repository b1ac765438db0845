"""Tests for rollout.py: batched group sampling with a KV cache on the tiny Qwen3.

Covers: shapes and left/right padding, group contiguity, the EOS mask (pure table + a model pushed to emit EOS),
seed determinism, chunking/padding invariance (greedy), the prompt-length guard, and the sampler's token-for-token
equality with HF `generate` (shared prefill, finished rows dropped, in-place cache).
Run: `pytest tests/test_rollout.py -q`.
"""

from __future__ import annotations

import pytest
import torch

from projected_grpo.policy.model import render_prompt
from projected_grpo.policy.rollout import (
    DRAWS,
    BufferedLayer,
    Rollout,
    completion_mask,
    concat_rollouts,
    generate,
    group_runs,
    inverse_cdf_draw,
)
from projected_grpo.policy.tiny import tiny_model, tiny_tokenizer

EOS, PAD = 2, 0


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture
def model(tok):
    return tiny_model(len(tok))


@pytest.fixture(scope="module")
def prompts(tok):
    users = ["Write f.", "Return the sum of nums.\n```python\nclass Solution:\n    def f(self):\n```", "x = 1"]
    return [render_prompt(tok, [{"role": "user", "content": u}]) for u in users]  # three different lengths


def _sample(model, tok, prompts, **kw):
    args = dict(group_size=4, max_new_tokens=12, temperature=1.0, top_p=0.95, seed=0) | kw
    return generate(model, tok, prompts, **args)


def _eos_biased(model, bias: float):
    """Push the EOS logit up so that some rows stop early (a random tiny model almost never says <|im_end|>)."""
    model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias * (torch.arange(out.shape[-1]) == EOS))
    return model


@pytest.mark.parametrize(
    "ids,produced,expected",
    [
        ([[5, 6, 7]], [[1, 1, 1]], [[1, 1, 1]]),  # no EOS: every generated token counts
        ([[5, EOS, 0]], [[1, 1, 1]], [[1, 1, 0]]),  # EOS included, padding after it excluded
        ([[EOS, 5, EOS]], [[1, 1, 1]], [[1, 0, 0]]),  # only the FIRST EOS ends the completion
        ([[5, 6, 0]], [[1, 1, 0]], [[1, 1, 0]]),  # chunk padding (not generated) is excluded
        ([[EOS, PAD, PAD]], [[1, 1, 1]], [[1, 0, 0]]),  # immediate stop -> length 1
    ],
)
def test_completion_mask_table(ids, produced, expected):
    got = completion_mask(torch.tensor(ids), torch.tensor(produced, dtype=torch.bool), [EOS])
    assert got.tolist() == expected


def test_shapes_padding_and_group_contiguity(model, tok, prompts):
    r = _sample(model, tok, prompts)
    B = 3 * 4
    enc = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    Tp = max(map(len, enc))
    assert isinstance(r, Rollout) and r.old_logp is None
    assert r.prompt_ids.shape == r.prompt_mask.shape == (B, Tp)
    assert r.completion_ids.shape == r.mask.shape and r.completion_ids.shape[0] == B
    assert 1 <= r.completion_ids.shape[1] <= 12 and len(r.texts) == B
    for g, e in enumerate(enc):
        for row in range(g * 4, g * 4 + 4):  # prompt g's group: contiguous rows
            assert r.prompt_ids[row, Tp - len(e) :].tolist() == e  # left-padded: real tokens flush right
            assert r.prompt_mask[row].tolist() == [0] * (Tp - len(e)) + [1] * len(e)
            assert (r.prompt_ids[row, : Tp - len(e)] == tok.pad_token_id).all()


def test_eos_handling(model, tok, prompts):
    r = _sample(_eos_biased(model, 3.0), tok, prompts, max_new_tokens=16)
    lengths = r.mask.sum(-1)
    has_eos = (r.completion_ids == EOS).any(-1)
    assert has_eos.any() and (~has_eos).any(), "the seed should give both stopped and unstopped rows"
    assert r.completion_ids.shape[1] == 16  # some row ran to max_new_tokens
    for row in range(len(r.texts)):
        m, ids = r.mask[row], r.completion_ids[row]
        assert m.tolist() == sorted(m.tolist(), reverse=True)  # 1s then 0s (right padding)
        if has_eos[row]:
            first = int((ids == EOS).nonzero()[0])
            assert lengths[row] == first + 1  # up to and including the first EOS
            assert (ids == EOS).sum() == 1  # nothing generated after it survives
        else:
            assert lengths[row] == 16
        assert (ids[m == 0] == tok.pad_token_id).all()
        assert "<|im_end|>" not in r.texts[row] and "<|endoftext|>" not in r.texts[row]
        assert r.texts[row] == tok.decode(ids[m.bool()].tolist(), skip_special_tokens=True)


def test_seed_determinism_and_rng_isolation(model, tok, prompts):
    torch.manual_seed(7)
    expected_global = torch.rand(2)
    torch.manual_seed(7)
    a = _sample(model, tok, prompts, seed=3)
    assert torch.equal(torch.rand(2), expected_global)  # the global RNG stream is untouched
    b = _sample(model, tok, prompts, seed=3)
    c = _sample(model, tok, prompts, seed=4)
    assert a.texts == b.texts and torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.mask, b.mask)
    assert a.texts != c.texts
    # rows within one group are independent samples, not copies
    assert len(set(a.texts[:4])) > 1


def test_chunked_and_padding_invariant_greedy(model, tok, prompts):
    """Greedy decoding must not depend on batching: left padding is masked and positions come from the mask."""
    full = _sample(model, tok, prompts, temperature=0.0, group_size=2)
    one_by_one = [_sample(model, tok, [p], temperature=0.0, group_size=1).texts[0] for p in prompts]
    chunked = _sample(model, tok, prompts, temperature=0.0, group_size=2, batch_size=4)
    assert full.texts[::2] == full.texts[1::2] == one_by_one  # greedy: a group is G copies
    assert chunked.texts == full.texts
    assert torch.equal(chunked.prompt_ids, full.prompt_ids)


def test_chunked_sampling_shapes(model, tok, prompts):
    r = _sample(model, tok, prompts, batch_size=5)  # chunks of 5, 5, 2 rows
    assert r.completion_ids.shape[0] == 12 and len(r.texts) == 12
    assert r.texts == _sample(model, tok, prompts, batch_size=5).texts


def test_on_chunk_gets_each_chunk_as_returned(model, tok, prompts):
    """on_chunk(first_row, texts) fires once per chunk, in order, with exactly the texts `generate` returns."""
    seen = []
    r = _sample(
        _eos_biased(model, 3.0),
        tok,
        prompts,
        batch_size=5,
        max_new_tokens=16,
        on_chunk=lambda first, texts: seen.append((first, list(texts))),
    )
    assert [f for f, _ in seen] == [0, 5, 10] and [len(t) for _, t in seen] == [5, 5, 2]
    assert [t for _, ts in seen for t in ts] == r.texts
    assert len(set(r.mask.sum(-1).tolist())) > 1  # rows of different lengths (EOS inside a chunk)


def test_prompt_guard(tok, prompts):
    lens = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    model = tiny_model(len(tok))
    with pytest.raises(
        ValueError,
        match=rf"prompt 1 is {lens[1]} tokens, over the limit of {lens[1] - 1} "
        r"\(max_prompt_tokens\)",
    ):
        _sample(model, tok, prompts, max_prompt_tokens=lens[1] - 1)
    short = tiny_model(len(tok), max_position_embeddings=lens[1] + 4)
    with pytest.raises(ValueError, match=rf"prompt 1 is {lens[1]} tokens.*max_position_embeddings"):
        _sample(short, tok, prompts, max_new_tokens=8)
    _sample(short, tok, prompts, max_new_tokens=4)  # exactly fits: no error


@pytest.mark.parametrize(
    "kw",
    [
        dict(temperature=1.0, top_p=1.0),  # the training setting (top_p off)
        dict(temperature=0.7, top_p=0.9),  # temperature and nucleus warpers
        dict(temperature=1.0, top_p=0.95, batch_size=5),  # chunks of 5, 5, 2 rows: groups split across chunks
        dict(temperature=0.0, top_p=1.0, group_size=2),  # greedy
    ],
    ids=["train", "top_p", "split_groups", "greedy"],
)
def test_sampler_matches_hf_generate_token_for_token(tok, prompts, kw):
    """With HF's draw, the sampler gives exactly HF generate's tokens: same seed -> identical ids, masks and texts,
    with rows finishing at different steps (EOS pushed up) so that finished rows leave the batch mid-generation."""
    model = _eos_biased(tiny_model(len(tok)), 2.5)
    args = dict(group_size=4, max_new_tokens=24, seed=5) | kw
    ours = generate(model, tok, prompts, draw="multinomial", **args)
    ref = generate(model, tok, prompts, engine="hf", **args)
    lengths = ours.mask.sum(-1)
    if kw["temperature"] > 0:  # the case the compaction is for: rows stop at several different steps
        assert len(set(lengths.tolist())) >= 3 and int(lengths.min()) < 24
    assert torch.equal(ours.completion_ids, ref.completion_ids)
    assert torch.equal(ours.mask, ref.mask) and ours.texts == ref.texts
    assert torch.equal(ours.prompt_ids, ref.prompt_ids) and torch.equal(ours.prompt_mask, ref.prompt_mask)


def test_group_runs():
    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [7, 8, 9], [7, 8, 9], [0, 5, 6]])
    am = torch.tensor([[0, 1, 1]] * 2 + [[1, 1, 1]] * 3 + [[0, 1, 1]])
    first, owner = group_runs(ids, am)
    assert first.tolist() == [0, 2, 5]  # a repeat of an earlier prompt after another one starts a new run
    assert owner.tolist() == [0, 0, 1, 1, 1, 2]
    first, _ = group_runs(ids[:2], torch.tensor([[1, 1, 1], [0, 1, 1]]))  # same ids, different mask: two runs
    assert first.tolist() == [0, 1]


def test_buffered_layer_returns_the_concatenated_cache():
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(3, 2, 5, 4, generator=g), torch.randn(3, 2, 5, 4, generator=g)
    layer = BufferedLayer(k, v, extra=3)
    steps = [(torch.randn(3, 2, 1, 4, generator=g), torch.randn(3, 2, 1, 4, generator=g)) for _ in range(3)]
    for i, (dk, dv) in enumerate(steps):
        k, v = torch.cat([k, dk], -2), torch.cat([v, dv], -2)
        got_k, got_v = layer.update(dk, dv)
        assert torch.equal(got_k, k) and torch.equal(got_v, v) and layer.get_seq_length() == 6 + i
    layer.select(torch.tensor([0, 2]))
    assert torch.equal(layer.keys, k[[0, 2]]) and torch.equal(layer.values, v[[0, 2]])


def test_engine_arguments(model, tok, prompts):
    with pytest.raises(ValueError, match="engine must be"):
        _sample(model, tok, prompts, engine="vllm")
    with pytest.raises(ValueError, match="engine='hf'"):
        _sample(model, tok, prompts, use_cache=False)


def test_concat_rollouts_keeps_every_row(model, tok, prompts):
    """Two rollouts of different prompt and completion widths (the deploy groups of projection.deploy_frac are sampled
    apart): the concatenation has a's rows then b's, each with its own prompt tokens ending in the last column, its
    completion tokens from the first column, the same masks and texts; the padding is pad id with mask 0."""
    a = _sample(model, tok, prompts[:1], max_new_tokens=5)
    b = _sample(model, tok, prompts[1:], max_new_tokens=9, seed=1)
    assert a.prompt_ids.shape[1] != b.prompt_ids.shape[1] and a.completion_ids.shape[1] != b.completion_ids.shape[1]
    c = concat_rollouts(a, b, tok.pad_token_id)
    rows = [(a, i) for i in range(len(a.texts))] + [(b, i) for i in range(len(b.texts))]
    assert c.texts == a.texts + b.texts and c.prompt_ids.shape[0] == len(rows)
    for j, (r, i) in enumerate(rows):
        pm, m = r.prompt_mask[i].bool(), r.mask[i].bool()
        assert torch.equal(c.prompt_ids[j][c.prompt_mask[j].bool()], r.prompt_ids[i][pm])
        assert torch.equal(c.completion_ids[j][c.mask[j].bool()], r.completion_ids[i][m])
        assert c.prompt_mask[j, -1] == 1 and int(c.prompt_mask[j].sum()) == int(pm.sum())
        assert int(c.mask[j].sum()) == int(m.sum()) and c.mask[j, : int(m.sum())].all()
    assert (c.prompt_ids[c.prompt_mask == 0] == tok.pad_token_id).all()


def test_inverse_cdf_draw_frequencies_match_the_probabilities():
    """The default draw samples each token with its probability (a chi-square over 200,000 draws of rows with zeros
    at the ends and in the middle, p = 0.001 critical value), never a zero-probability token (token 0 included), and
    takes one uniform per row from the global RNG: the same seed gives the same tokens."""
    probs = torch.tensor([0.0, 0.1, 0.0, 0.35, 0.05, 0.0, 0.3, 0.2, 0.0])  # (V,) zeros first, inside and last
    n = 200_000
    torch.manual_seed(0)
    got = inverse_cdf_draw(probs.expand(n, -1))  # (n,)
    counts = torch.bincount(got, minlength=len(probs)).double()
    assert counts[probs == 0].sum() == 0
    live = probs > 0
    expected = n * probs[live].double()
    chi2 = float(((counts[live] - expected) ** 2 / expected).sum())
    assert chi2 < 20.5  # chi-square, 5 degrees of freedom: P(> 20.5) = 0.001
    torch.manual_seed(0)
    assert torch.equal(inverse_cdf_draw(probs.expand(n, -1)), got)
    one_hot = torch.zeros(3, 5)
    one_hot[0, 0], one_hot[1, 4], one_hot[2, 2] = 1, 1, 1  # a certain token, first and last columns included
    assert inverse_cdf_draw(one_hot).tolist() == [0, 4, 2]


def test_both_draws_sample_the_same_distribution(tok, prompts):
    """Inverse CDF and HF's multinomial are two ways to draw from the same probabilities: on a one-step budget (the
    first token's distribution is the same model's either way) their token frequencies over 8,000 rows agree within
    sampling noise: a logit bias puts most of the mass on 16 tokens, and over those 16 and "any other token" the two
    empirical distributions are within total variation 0.04 (0.024 at this seed; an off-by-one draw gives 0.16)."""
    model = tiny_model(len(tok))
    bias = torch.zeros(len(tok))
    bias[10:26] = torch.linspace(6.0, 2.0, 16)
    model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)
    args = dict(group_size=8000, max_new_tokens=1, temperature=1.0, top_p=0.95, seed=1)
    a, b = (generate(model, tok, prompts[:1], draw=d, **args).completion_ids[:, 0] for d in sorted(DRAWS))
    bucket = lambda x: torch.where((x >= 10) & (x < 26), x - 10, 16)  # noqa: E731 the 16 tokens, then the rest
    fa, fb = (torch.bincount(bucket(x), minlength=17).double() / len(x) for x in (a, b))
    assert fa[:16].sum() > 0.5 and fb[:16].sum() > 0.5
    assert 0.5 * float((fa - fb).abs().sum()) < 0.04
    assert len(set(a.tolist())) > 8  # a spread distribution, not a certain token
    with pytest.raises(ValueError, match="draw must be one of"):
        generate(model, tok, prompts, draw="gumbel", **args)

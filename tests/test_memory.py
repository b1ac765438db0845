"""The peak-memory estimate of one GRPO step (rl/memory.py): its arithmetic by hand on a small shape, how the total
is made of its parts, which way each param moves it, the activation formula against what autograd really saves on a
Qwen3 layer, the one-line pre-flight error, and the real setting (params-qwen3-4b.yaml) on an 80 GB H100.

`pytest tests/test_memory.py`
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml
from transformers import Qwen3Config, Qwen3ForCausalLM

from projected_grpo.config import Params, from_dict, overlay
from projected_grpo.policy.adapter import TARGETS, attach_adapters
from projected_grpo.policy.model import load_model_and_tokenizer
from projected_grpo.rl.memory import (
    QWEN3_4B,
    AdapterShape,
    GiB,
    ModelShape,
    StepShape,
    adapter_shape,
    check_fits,
    distinct_prompts,
    estimate,
    layer_activation_bytes,
    model_shape,
    preflight,
    savings,
    step_shape,
)
from tests.conftest import ROOT

SMALL = ModelShape(
    n_params=1000, dtype_bytes=2, layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=10
)
SMALL_STEP = StepShape(
    rows=4,
    group_size=2,
    sample_rows=4,
    prompt_tokens=3,
    new_tokens=5,
    micro_batch=2,
    micro_batch_tokens=0,
    grad_checkpointing=False,
    shared=False,
    probes=False,
    rotations=False,
)
QWEN3_4B_CONFIG = Qwen3Config(**QWEN3_4B)
H100 = 79.2 * GiB  # an 80 GB H100 (81559 MiB)


def small_adapter() -> AdapterShape:  # rank 2 on q_proj (8 -> 8) and down_proj (16 -> 8) of both layers
    return AdapterShape.from_model_shape(SMALL, "svd", 2, ("q_proj", "down_proj"))


def test_estimate_by_hand_on_a_small_shape():
    """Every component, computed by hand (w = 2 bytes, L = 2 layers, d = 8, I = 16, q = 8, kv = 4, V = 10, r = 2)."""
    e = estimate(SMALL, small_adapter(), SMALL_STEP)
    assert e.weights == 1000 * 2  # n_params · w
    # U, V: per layer (8 + 8)·2·2 + (16 + 8)·2·2 = 160, two layers; δS, δS_h, grads, θ, φ, m, v: 10 · D(8) · 4
    assert e.adapter == 2 * 160 + 10 * 8 * 4
    # KV: 2 (K, V) · L · kv_heads · head_dim · w = 32 B per token; 4 rows × (3 + 5) + the prefill's 2 prompts × 3
    assert e.kv_cache == 32 * (4 * 8 + 2 * 3)
    assert e.decode == 2 * 3 * 4 * 2 * 16 + 4 * 10 * 48  # prefill MLP of 2 prompts; 48 B per (row, vocab)
    # per token per layer: norms 2·4·8, q/k norms 4·(8 + 4), attention 2·(2·8 + 2·4), MLP 3·2·16, adapters 2·(2·2)
    per_layer = 64 + 48 + 48 + 96 + 8
    assert layer_activation_bytes(SMALL, 2, 2) == per_layer == 264
    tokens = 2 * (3 + 5)  # a micro-batch of 2 full rows
    assert e.activations == 2 * tokens * per_layer + tokens * 8 * 4  # + the final norm's fp32 input
    assert e.logits == 2 * 2 * 8 * 10 + 2 * 5 * 10 * (4 + 4 + 4)  # bf16 logits of every position; fp32 ×3 of T's
    assert e.total == 2000 + 640 + max(e.kv_cache + e.decode, e.activations + e.logits) == 13120

    ck = estimate(SMALL, small_adapter(), dataclasses.replace(SMALL_STEP, grad_checkpointing=True))
    assert ck.activations == 2 * tokens * 8 * 2 + tokens * per_layer + tokens * 8 * 4  # layer inputs + one layer

    sh = estimate(SMALL, small_adapter(), dataclasses.replace(SMALL_STEP, shared=True))
    tokens = 1 * 3 + 2 * 5  # one distinct prompt, then 2 completions on its KV
    assert sh.activations == 2 * tokens * per_layer + 32 * 2 * 3 * 2 + tokens * 8 * 4  # + gathered KV, twice
    assert sh.logits == 2 * 2 * (2 * 5 * 10) + 2 * 5 * 10 * 12  # the tail's logits and their concatenation


def test_held_out_phase_by_hand_on_a_small_shape():
    """Gated and refreshing arms run held-out pairs through forward/backward: full rows (held_out_batch of them),
    every position's logits in bf16 and three fp32 copies; it counts in the peak as its own phase."""
    step = dataclasses.replace(SMALL_STEP, held_out=True)
    e = estimate(SMALL, small_adapter(), step)
    assert step.held_out_rows == 2 and e.held_out_rows == 2  # the micro-batch (no token budget)
    tokens = 2 * (3 + 5)
    assert e.held_out == 2 * tokens * 264 + tokens * 8 * 4 + tokens * 10 * (2 + 4 + 4 + 4)
    assert e.total == 2000 + 640 + max(e.sampling, e.loss, e.held_out)
    assert estimate(SMALL, small_adapter(), SMALL_STEP).held_out == 0  # an ungated arm runs none
    capped = dataclasses.replace(step, micro_batch_tokens=8)  # one 8-token row fits: at least one row
    assert capped.held_out_rows == 1 and estimate(SMALL, small_adapter(), capped).held_out < e.held_out
    assert (
        "held-out pairs" in e.describe()
        and "held-out pairs" not in estimate(SMALL, small_adapter(), SMALL_STEP).describe()
    )


def test_held_out_phase_matches_the_gpu_route_step():
    """reports/bench/gpu.md: a route_per_rollout step at Qwen3-4B's shape (4×4 rows, 512 new tokens, held-out
    batches of 4 checkpointed rows) peaked at 24.6 GiB on an H200 where the estimate without this phase said 15.2.
    With it the estimate covers the measurement (an upper bound: every row at full width)."""
    m, a = shape_4b()
    p = real_setting()
    g = dataclasses.replace(p.grpo, prompts_per_step=4, group_size=4, micro_batch=4)
    r = dataclasses.replace(p.rollout, max_new_tokens=512)
    s = step_shape(r, g, True, True, True, 0, held_out=True)
    e = estimate(m, a, s)
    assert e.held_out_rows == 4 and e.held_out > max(e.sampling, e.loss)  # the phase that sets this arm's peak
    assert 24.6 * GiB <= e.total <= 2 * 24.6 * GiB


def test_phases_match_the_gpu_measurement_at_the_real_setting():
    """reports/bench/memory.md: `python benchmarks/memory.py` on an H200 (Qwen3-4B's shape, random bf16 weights,
    params-qwen3-4b.yaml, every row at full width) peaked at 56.5 GiB sampling 128 rows x 3072 tokens and 18.1 GiB for
    one loss micro-batch of 4 such rows, above the weights and adapter (7.8 GiB allocated). Each phase's estimate is
    within 5% of its measurement, and the step's total within 5% of weights + the larger phase."""
    m, a = shape_4b()
    p = real_setting()
    e = estimate(m, a, step_shape(p.rollout, p.grpo, shared=True, probes=False, rotations=False))
    assert e.mb_rows == 4
    for est, measured in ((e.sampling, 56.5), (e.loss, 18.1), (e.weights + e.adapter, 7.8)):
        assert abs(est / GiB - measured) <= 0.05 * measured, (est / GiB, measured)
    assert abs(e.total / GiB - (7.8 + 56.5)) <= 0.05 * (7.8 + 56.5)


def test_distinct_prompts_in_a_slice():
    """Groups of G rows: aligned slices of G·k rows hold k prompts; a slice may start on a group's last row."""
    assert distinct_prompts(32, 16, aligned=True) == 2 and distinct_prompts(8, 16, aligned=True) == 1
    assert distinct_prompts(8, 16, aligned=False) == 2 and distinct_prompts(17, 16, aligned=False) == 2
    assert distinct_prompts(18, 16, aligned=False) == 3 and distinct_prompts(1, 16, aligned=False) == 1


def shape_4b() -> tuple[ModelShape, AdapterShape]:
    m = ModelShape.from_config(QWEN3_4B_CONFIG, 2)
    return m, AdapterShape.from_model_shape(m, "svd", 64, TARGETS["all"])


BASE_4B = StepShape(
    rows=256,
    group_size=16,
    sample_rows=64,
    prompt_tokens=1536,
    new_tokens=1536,
    micro_batch=8,
    micro_batch_tokens=0,
    grad_checkpointing=False,
    shared=True,
    probes=True,
    rotations=True,
)


@pytest.mark.parametrize(
    "change,grows",
    [
        ({"sample_rows": 128}, ("kv_cache", "decode")),
        ({"new_tokens": 2048}, ("kv_cache", "activations", "logits")),
        ({"prompt_tokens": 2048}, ("kv_cache", "activations")),
        ({"micro_batch": 16}, ("activations", "logits")),
        ({"rows": 512}, ("adapter",)),  # the per-row probe gradients
        ({"token_k": 8}, ("adapter",)),  # per-token capture
        ({"shared": False}, ("activations",)),  # every row runs its own prompt
    ],
)
@pytest.mark.parametrize("ckpt", [False, True])
def test_estimate_grows_with_each_param(change, grows, ckpt):
    """Raising a param grows the components it sizes (strictly) and never shrinks any component or the total."""
    m, a = shape_4b()
    s = dataclasses.replace(BASE_4B, grad_checkpointing=ckpt)
    lo, hi = estimate(m, a, s), estimate(m, a, dataclasses.replace(s, **change))
    for f in ("weights", "adapter", "kv_cache", "decode", "activations", "logits"):
        if f in grows:
            assert getattr(hi, f) > getattr(lo, f), f
        else:
            assert getattr(hi, f) >= getattr(lo, f), f
    assert hi.total >= lo.total


def test_micro_batch_tokens_and_checkpointing_lower_the_loss_phase():
    """A token cap shrinks the micro-batch (at least one row) and the loss phase with it; checkpointing lowers the
    activations and changes nothing else; a larger rank grows the adapter."""
    m, a = shape_4b()
    e = estimate(m, a, BASE_4B)
    caps = [0, 4 * 3072, 2 * 3072, 3072, 1]
    rows = [estimate(m, a, dataclasses.replace(BASE_4B, micro_batch_tokens=c)).mb_rows for c in caps]
    assert rows == [8, 4, 2, 1, 1]
    losses = [estimate(m, a, dataclasses.replace(BASE_4B, micro_batch_tokens=c)).loss for c in caps[:4]]
    assert losses == sorted(losses, reverse=True) and len(set(losses)) == 4
    for s in (BASE_4B, dataclasses.replace(BASE_4B, shared=False)):
        off, on = estimate(m, a, s), estimate(m, a, dataclasses.replace(s, grad_checkpointing=True))
        assert on.activations < off.activations / 4
        assert (on.weights, on.adapter, on.kv_cache, on.decode, on.logits) == (
            off.weights,
            off.adapter,
            off.kv_cache,
            off.decode,
            off.logits,
        )
    a128 = AdapterShape.from_model_shape(m, "svd", 128, TARGETS["all"])
    assert estimate(m, a128, BASE_4B).adapter > e.adapter


def test_total_is_weights_adapter_and_the_larger_phase():
    """The two phases never hold memory at once: total = weights + adapter + max(sampling, loss), whichever wins."""
    m, a = shape_4b()
    for s in (BASE_4B, dataclasses.replace(BASE_4B, sample_rows=256), dataclasses.replace(BASE_4B, micro_batch=1)):
        e = estimate(m, a, s)
        assert e.sampling == e.kv_cache + e.decode and e.loss == e.activations + e.logits
        assert e.total == e.weights + e.adapter + max(e.sampling, e.loss)
    assert estimate(m, a, dataclasses.replace(BASE_4B, sample_rows=256)).sampling > estimate(m, a, BASE_4B).loss
    assert estimate(m, a, BASE_4B).loss > estimate(m, a, BASE_4B).sampling


def resolve(key: str):
    """The default value of a dotted params key (raises AttributeError for a key that does not exist)."""
    x = Params()
    for part in key.split("."):
        x = getattr(x, part)
    return x


def test_the_error_is_one_line_and_names_what_to_lower():
    """Over the budget: one line with the estimate, the memory available and real params keys, most saved first;
    within it, nothing is raised. Checkpointing already on is not suggested again."""
    m, a = shape_4b()
    s = dataclasses.replace(BASE_4B, sample_rows=256)
    e = estimate(m, a, s)
    check_fits(m, a, s, e.total)  # exactly enough: fits
    avail = 60 * GiB
    with pytest.raises(ValueError) as err:
        check_fits(m, a, s, avail)
    msg = str(err.value)
    assert "\n" not in msg and f"{e.total / GiB:.1f} GiB" in msg and "60.0 GiB is available" in msg
    opts = savings(m, a, s)
    keys = [k for k, _, _ in opts]
    assert {"rollout.batch_size", "grpo.grad_checkpointing", "grpo.micro_batch_tokens"} <= set(keys)
    assert [x for _, _, x in opts] == sorted((x for _, _, x in opts), reverse=True)
    assert [msg.index(k) for k in keys] == sorted(msg.index(k) for k in keys), "most saved first"
    for k in keys:
        resolve(k)  # a real params key
    ck = dataclasses.replace(s, grad_checkpointing=True)
    assert "grpo.grad_checkpointing" not in [k for k, _, _ in savings(m, a, ck)]


def saved_bytes(cfg: Qwen3Config, ckpt: bool) -> int:
    """Bytes autograd saves for the backward of one per-row loss forward (2 rows × 48 tokens, bf16, rank-64 adapters
    on every projection), weights and buffers excluded."""
    from projected_grpo.policy.checkpointing import activation_checkpointing
    from projected_grpo.policy.logprobs import rollout_logprobs

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
        attach_adapters(model, "all", 64)
        ids = torch.randint(0, cfg.vocab_size, (2, 24))
    kept = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), activation_checkpointing(model, ckpt):
        rollout_logprobs(model, ids, torch.ones_like(ids), ids, torch.ones_like(ids), 0.7)
    return sum(n for p, n in seen.items() if p not in kept)


@pytest.mark.parametrize("ckpt", [False, True])
def test_layer_activations_match_what_autograd_saves(ckpt):
    """The per-token, per-layer formula (or the layer input alone, checkpointed) is what torch's saved-tensor hooks
    count on a real Qwen3 layer with adapters: the difference between a 2- and a 3-layer model, within 2%."""
    kw = dict(vocab_size=64, hidden_size=256, intermediate_size=1024, num_attention_heads=4, num_key_value_heads=2)
    cfg2, cfg3 = (Qwen3Config(**kw, head_dim=64, num_hidden_layers=n) for n in (2, 3))
    per_token = (saved_bytes(cfg3, ckpt) - saved_bytes(cfg2, ckpt)) / (2 * 48)
    m = ModelShape.from_config(cfg2, 2)
    want = m.hidden * 2 if ckpt else layer_activation_bytes(m, 7, 64)
    assert abs(per_token - want) <= 0.02 * want, (per_token, want)


def test_shapes_from_the_model_and_the_config_agree():
    """model_shape counts the real model's weights (tied embedding once, adapter δS/δS_h out) as from_config does,
    and the attached adapters are the config's projections in module order."""
    model, _ = load_model_and_tokenizer("tiny-random")
    want = sum(p.numel() for p in model.parameters())
    attach_adapters(model, "all", 4)
    m = model_shape(model)
    assert m.n_params == want == ModelShape.from_config(model.config, 4).n_params and m.dtype_bytes == 4
    a = adapter_shape(model, "svd", 4)
    assert a == AdapterShape.from_model_shape(m, "svd", 4, TARGETS["all"])


def test_preflight_prints_one_paragraph_and_never_stops_on_cpu():
    model, _ = load_model_and_tokenizer("tiny-random")
    attach_adapters(model, "all", 4)
    p = Params()
    p = dataclasses.replace(p, grpo=dataclasses.replace(p.grpo, prompts_per_step=512))  # large: CPU only prints
    lines: list[str] = []
    est = preflight(model, p, True, True, True, 0, echo=lines.append)
    assert len(lines) == 1 and "\n" not in lines[0] and lines[0] == est.describe()
    assert f"peak about {est.total / GiB:.1f} GiB" in lines[0]


def real_setting() -> Params:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    return from_dict(Params, overlay(raw, yaml.safe_load((ROOT / "params-qwen3-4b.yaml").read_text())))


@pytest.mark.parametrize(
    "arm,shared,probes,rotations,token_k",
    [
        ("vanilla", True, False, False, 0),
        ("route_per_rollout", True, True, True, 0),  # own-token probes, a basis
        ("route_per_token", False, True, True, 8),  # per-row forwards, per-token capture
    ],
)
def test_real_setting_fits_an_h100(arm, shared, probes, rotations, token_k):
    """params-qwen3-4b.yaml fits one 80 GB H100 by the estimate, with 4 GiB to spare for the CUDA context and the
    allocator; the benchmark's shapes without the memory params (all 256 rows sampled at once, 8-row micro-batches,
    no checkpointing) would not."""
    p = real_setting()
    m, a = shape_4b()
    s = step_shape(p.rollout, p.grpo, shared, probes, rotations, token_k, held_out=arm != "vanilla")
    assert estimate(m, a, s).total <= H100 - 4 * GiB
    g = dataclasses.replace(p.grpo, micro_batch_tokens=0, grad_checkpointing=False)
    plain = step_shape(dataclasses.replace(p.rollout, batch_size=None), g, shared, probes, rotations, token_k)
    assert estimate(m, a, plain).total > H100


def test_held_out_batches_obey_the_loss_steps_memory_bound():
    """Gate calibration and basis refresh run held-out completions in batches no larger than the loss's micro-batch,
    and with grpo.micro_batch_tokens no more rows of the longest sequence than that budget holds."""
    from projected_grpo.method.basis import held_out_batch

    d = yaml.safe_load((ROOT / "params.yaml").read_text())
    p = from_dict(Params, d)
    assert held_out_batch(p) == p.grpo.micro_batch == 16  # the organism: batches of 16, as before
    real = from_dict(Params, overlay(d, yaml.safe_load((ROOT / "params-qwen3-4b.yaml").read_text())))
    longest = real.rollout.max_prompt_tokens + real.rollout.max_new_tokens
    rows = held_out_batch(real)
    assert 1 <= rows <= real.grpo.micro_batch and rows * longest <= real.grpo.micro_batch_tokens
    tight = dataclasses.replace(real, grpo=dataclasses.replace(real.grpo, micro_batch_tokens=longest - 1))
    assert held_out_batch(tight) == 1  # at least one row, even when one does not fit the budget
    for q in (p, real, tight):  # the estimate sizes the held-out phase with the rows the code runs
        assert step_shape(q.rollout, q.grpo, True, True, True, 0, held_out=True).held_out_rows == held_out_batch(q)

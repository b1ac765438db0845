"""Activation checkpointing of the decoder layers for a forward/backward (grpo.grad_checkpointing).

Each decoder layer keeps only its input in the forward and recomputes its activations in the backward
(torch.utils.checkpoint, non-reentrant), so a loss forward holds layers × tokens × hidden values instead of every
layer's activations. Why not `model.gradient_checkpointing_enable()`: in transformers 5.24 a layer checkpoints only
when `model.training` is true (the loop keeps the model in eval mode), and under checkpointing it drops the KV cache
(`use_cache=False`, `cache=None`), which the shared-prompt forward (logprobs.shared_prompt_logprobs) is built on.

The recompute must see what the forward saw, so each layer's forward records
  * its adapters' probe, on/off state and per-row masks: a shared prompt's forward runs with probes paused
    (`probes_paused`), which are open again by the backward, and masked routing's runs its distinct prompts under
    their own row masks (`adapter.row_masks`), which the completions' masks have replaced by then; per-token capture
    is off in the recompute (the forward registered its hooks, on the graph the backward runs through);
  * the KV cache's layers as they were: HF's cache layers grow by rebinding their tensors (`torch.cat`), so the
    recompute runs on the cache as it stood before this layer's update and the cache is put back as it is now after
    it (a replayed layer would otherwise see its keys twice). A cache written in place (rollout.BufferedLayer) is
    sampling's, which runs without gradients: there a layer runs plainly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.modeling_layers import GradientCheckpointingLayer

from projected_grpo.policy.adapter import Adapter


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks (HF marks them `GradientCheckpointingLayer`), in order."""
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def _cache_state(cache) -> tuple[list, list[dict]] | None:
    """The cache's layers and each one's attributes (references: HF layers rebind, never write in place)."""
    if cache is None or not hasattr(cache, "layers"):
        return None
    return list(cache.layers), [dict(vars(layer)) for layer in cache.layers]


def _set_cache_state(cache, state: tuple[list, list[dict]] | None) -> None:
    if state is None:
        return
    layers, attrs = state
    cache.layers[:] = layers
    for layer, a in zip(layers, attrs):
        vars(layer).clear()
        vars(layer).update(a)


def _state(a: Adapter) -> tuple:
    """What an adapter's forward depends on besides its parameters: its probe, on/off and per-row masks."""
    return a.probe, a.enabled, a.row_main, a.row_knob


def _set_state(a: Adapter, st: tuple) -> None:
    a.probe, a.enabled, a.row_main, a.row_knob = st


def _checkpointed(layer: nn.Module):
    """`layer.forward` under torch.utils.checkpoint (non-reentrant); the recompute sees its adapters and the KV
    cache as the forward did."""
    forward = type(layer).forward.__get__(layer)  # the class's forward (bound), not this wrapper
    ads = [m for m in layer.modules() if isinstance(m, Adapter)]

    def wrapped(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        seen = [_state(a) for a in ads], _cache_state(cache)  # what this forward sees
        first = [True]

        def run(*a, **kw):
            if first[0]:  # the forward itself
                first[0] = False
                return forward(*a, **kw)
            now = [(_state(x), x.token_dirs) for x in ads], _cache_state(cache)
            for x, st in zip(ads, seen[0]):
                _set_state(x, st)
                x.token_dirs = None
            _set_cache_state(cache, seen[1])
            try:
                return forward(*a, **kw)
            finally:
                for x, (st, dirs) in zip(ads, now[0]):
                    _set_state(x, st)
                    x.token_dirs = dirs
                _set_cache_state(cache, now[1])

        return checkpoint(run, *args, use_reentrant=False, **kwargs)

    return wrapped


@contextmanager
def activation_checkpointing(model: nn.Module, on: bool = True) -> Iterator[None]:
    """Inside the block, every decoder layer of `model` is checkpointed in a forward with gradients (`on`=False: a
    no-op). The layers' own forward is restored on exit (a backward after the block still recomputes correctly)."""
    layers = decoder_layers(model) if on else []
    if on and not layers:
        raise ValueError(f"grpo.grad_checkpointing: {type(model).__name__} has no decoder layers to checkpoint")
    for layer in layers:
        layer.forward = _checkpointed(layer)  # an instance attribute: nn.Module.__call__ calls it
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward

"""Token log-probabilities of completions under a policy, with logits divided by the sampling temperature (TRL).

Sequences are right-padded `prompt + completion` rows; position t's log-prob is that of token t+1 given the prefix,
so every tensor here is (B, L-1) and `mask` selects the completion tokens (EOS included).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor

from projected_grpo.policy.adapter import probes_paused


def on_model(model, *xs: Tensor) -> tuple[Tensor, ...]:
    """xs on the model's device (model.device: the batches are built on the CPU; a no-op there)."""
    dev = next(model.parameters()).device
    return tuple(x.to(dev) for x in xs)


def token_logprobs(logits: Tensor, ids: Tensor, temperature: float) -> Tensor:
    """(B, T, V) logits, (B, T) target ids -> (B, T) log π(id | prefix) at `temperature` (log_softmax(logits / T))."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # fp32 at least (bf16 models)
    return torch.gather(F.log_softmax(logits / temperature, dim=-1), -1, ids.unsqueeze(-1)).squeeze(-1)


def batch_sequences(
    prompts: list[list[int]], completions: list[list[int]], pad_id: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Right-padded (ids, attention_mask, completion_mask), each (B, L); completion_mask marks completion tokens."""
    L = max(len(p) + len(c) for p, c in zip(prompts, completions))
    B = len(prompts)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    att = torch.zeros((B, L), dtype=torch.long)
    cm = torch.zeros((B, L), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        n = len(p) + len(c)
        ids[i, :n] = torch.tensor(p + c, dtype=torch.long)
        att[i, :n] = 1
        cm[i, len(p) : n] = 1
    return ids, att, cm


def padded(seqs, pad_id: int, left: bool = False) -> tuple[Tensor, Tensor]:
    """(ids, mask), each (n, max(1, longest)): token lists padded on the right (completions) or the left (prompts, as
    `generate` lays them out)."""
    T = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, s in enumerate(seqs):
        cols = slice(T - len(s), T) if left else slice(0, len(s))
        ids[i, cols] = torch.tensor(list(s), dtype=torch.long)
        mask[i, cols] = 1
    return ids, mask


def completion_logprobs(
    model, ids: Tensor, attention_mask: Tensor, completion_mask: Tensor, temperature: float
) -> tuple[Tensor, Tensor]:
    """(logp, mask), both (B, L-1): log-prob of each next token, and 1 where that token is a completion token."""
    ids, attention_mask, completion_mask = on_model(model, ids, attention_mask, completion_mask)
    logits = model(input_ids=ids, attention_mask=attention_mask).logits[:, :-1]  # (B, L-1, V)
    return token_logprobs(logits, ids[:, 1:], temperature), completion_mask[:, 1:]


def mean_nll(logp: Tensor, mask: Tensor) -> Tensor:
    """(B, T) log-probs and mask -> (B,) per-completion mean NLL over completion tokens (method.md §3.3)."""
    m = mask.to(logp.dtype)
    return -(torch.where(mask.bool(), logp, 0.0) * m).sum(-1) / m.sum(-1).clamp(min=1)


def rollout_logprobs(
    model, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, mask: Tensor, temperature: float
) -> Tensor:
    """(B, T) log-probs of sampled completions: left-padded prompts (B, Tp) + right-padded completions (B, T).

    Position ids follow the attention mask (cumsum − 1), as HF `generate` computes them for left-padded prompts, so
    these are exactly the sampling distribution's log-probs (at logits / temperature)."""
    prompt_ids, prompt_mask, completion_ids, mask = on_model(model, prompt_ids, prompt_mask, completion_ids, mask)
    ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (B, Tp + T)
    att = torch.cat([prompt_mask, mask], dim=1)  # (B, Tp + T); tokens after EOS are masked out
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    Tp = prompt_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=att, position_ids=pos).logits[:, Tp - 1 : -1]  # (B, T, V)
    return token_logprobs(logits, completion_ids, temperature)


def shared_prompt_logprobs(
    model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    mask: Tensor,
    temperature: float,
    first: Tensor,
    owner: Tensor,
    prompt_state: Callable[[], AbstractContextManager] | None = None,
) -> Tensor:
    """`rollout_logprobs` with each distinct prompt run once: (B, T) log-probs, the same numbers up to float rounding.

    `first` (U,) is the first row of each distinct prompt and `owner` (B,) each row's prompt (`rollout.group_runs`).
    The U prompts run in one forward (cache on, last-position logits only); their KV cache is indexed out to the B rows
    (a gather, so gradients from every row of a group sum back into the shared prompt activations, exactly as the
    chain rule sums them over the B identical prompt copies of `rollout_logprobs`); the completions then run on top.
    GRPO prompts are ~8× longer than completions on the organism, so a group of G rows costs about one prompt instead
    of G. Rows are not separable through the shared prompt, so gradient probes are paused in the prompt forward
    (`adapter.probes_paused`): with probes open, `e.grad[n]` is row n's own-token gradient (its completion
    positions), while δS.grad is the full gradient, prompt positions included. `rollout_logprobs` gives whole
    per-row gradients. `prompt_state`: a context entered around the prompt forward alone (masked routing's per-row
    masks of the U prompt rows, `adapter.row_masks`, while the B completion rows run with theirs)."""
    prompt_ids, prompt_mask, completion_ids, mask = on_model(model, prompt_ids, prompt_mask, completion_ids, mask)
    first, owner = on_model(model, first, owner)
    T = completion_ids.shape[1]
    t = max(1, int(mask.sum(-1).max()))  # columns past every row's EOS are padding: not run, their log-probs are 0
    completion_ids, mask = completion_ids[:, :t], mask[:, :t]
    ids_u, am_u = prompt_ids[first], prompt_mask[first]  # (U, Tp)
    att = torch.cat([prompt_mask, mask], dim=1)  # (B, Tp + t); tokens after EOS are masked out
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    Tp = prompt_ids.shape[1]
    with probes_paused(model), (prompt_state or nullcontext)():  # U prompt rows, not the B probed rows
        out = model(
            input_ids=ids_u, attention_mask=am_u, position_ids=pos[first, :Tp], use_cache=True, logits_to_keep=1
        )
    cache = out.cache
    for layer in cache.layers:  # (U, h, Tp, d) -> (B, h, Tp, d)
        layer.keys, layer.values = layer.keys[owner], layer.values[owner]
    tail = model(
        input_ids=completion_ids, attention_mask=att, position_ids=pos[:, Tp:], cache=cache, use_cache=False
    ).logits  # (B, T, V): position t predicts token t + 1
    logits = torch.cat([out.logits[owner], tail[:, :-1]], dim=1)  # (B, t, V): token 0 from the prompt's last position
    return F.pad(token_logprobs(logits, completion_ids, temperature), (0, T - t))  # (B, T)

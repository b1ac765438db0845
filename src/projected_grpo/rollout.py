"""Batched group sampling with a KV cache: prompts -> `Rollout` (house_style §5).

Each prompt is repeated `group_size` times contiguously (rows g·G … g·G+G−1 are prompt g's group). Prompts are
left-padded so every row's last prompt token sits in the same column and decoding appends on the right; HF `generate`
derives position ids from the attention mask, so padding does not shift RoPE positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import GenerationConfig

from projected_grpo.model import render_prompt


@dataclass
class Rollout:
    prompt_ids: Tensor  # (B, Tp) left-padded with pad id; prompt g occupies rows g·G … g·G+G−1
    prompt_mask: Tensor  # (B, Tp) 1 on real prompt tokens (the attention mask for prompt_ids)
    completion_ids: Tensor  # (B, T) right-padded with pad id
    mask: Tensor  # (B, T) 1 on completion tokens up to and including the first EOS, 0 after / on padding
    texts: list[str]  # decoded completions (special tokens skipped), len B
    old_logp: Tensor | None = None  # (B, T) behaviour-policy logprobs, filled by the trainer when needed

    @property
    def lengths(self) -> Tensor:  # (B,) completion tokens per row, EOS included
        return self.mask.sum(-1)


def eos_token_ids(model, tokenizer) -> list[int]:
    """The tokenizer's EOS (<|im_end|>) plus extra stop ids from the model's generation config (<|endoftext|>)."""
    ids = {tokenizer.eos_token_id}
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(extra if isinstance(extra, list | tuple) else [extra] if extra is not None else [])
    return sorted(i for i in ids if i is not None)


def check_prompt_lengths(lengths: list[int], max_new_tokens: int, max_positions: int | None,
                         max_prompt_tokens: int | None, names: list[str] | None = None) -> None:  # fmt: skip
    """Raise ValueError naming the first prompt that is too long (by `names[i]` when given, else its index);
    prompts are never truncated silently."""
    limits = {}
    if max_prompt_tokens is not None:
        limits["max_prompt_tokens"] = max_prompt_tokens
    if max_positions is not None:
        limits[f"max_position_embeddings({max_positions}) - max_new_tokens({max_new_tokens})"] = (
            max_positions - max_new_tokens
        )
    if not limits:
        return
    why, limit = min(limits.items(), key=lambda kv: kv[1])
    bad = [i for i, n in enumerate(lengths) if n > limit]
    if bad:
        i = bad[0]
        more = f" ({len(bad) - 1} more prompts too)" if len(bad) > 1 else ""
        name = names[i] if names is not None else i
        raise ValueError(f"prompt {name} is {lengths[i]} tokens, over the limit of {limit} ({why}){more}; "
                         "drop or shorten it upstream, it is never truncated")  # fmt: skip


def check_records_fit(model, tokenizer, records: list, max_new_tokens: int, max_prompt_tokens: int | None) -> None:
    """Check every record's rendered prompt against the length limits before any work starts (a run must not fail
    at step t, after writing checkpoints, on a prompt it could have rejected up front); the error names the record
    (problem id and mode)."""
    lengths = [len(tokenizer(render_prompt(tokenizer, list(q.prompt)), add_special_tokens=False)["input_ids"])
               for q in records]  # fmt: skip
    names = [f"{q.id} ({q.prompt_metadata.get('mode')})" for q in records]
    check_prompt_lengths(lengths, max_new_tokens, getattr(model.config, "max_position_embeddings", None),
                         max_prompt_tokens, names=names)  # fmt: skip


def completion_mask(ids: Tensor, produced: Tensor, eos_ids: list[int]) -> Tensor:
    """(B, T) ids, (B, T) bool generated-here -> (B, T) long mask: 1 up to and including the first EOS."""
    is_eos = torch.isin(ids, torch.tensor(eos_ids, device=ids.device)) & produced  # (B, T)
    # a token is "after EOS" when an EOS occurred strictly before it: exclusive cumulative count > 0
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0  # (B, T)
    return (produced & ~after_eos).long()


@torch.no_grad()
def generate(
    model, tokenizer, prompt_texts: list[str], group_size: int, max_new_tokens: int, temperature: float,
    top_p: float, seed: int, batch_size: int | None = None, max_prompt_tokens: int | None = None,
    use_cache: bool = True,
) -> Rollout:  # fmt: skip
    """Sample `group_size` completions per rendered prompt string; B = len(prompt_texts)·group_size rows.

    Args:
        prompt_texts: already-rendered prompts (model.render_prompt), chat template and generation prompt included.
        group_size: completions per prompt (G), contiguous in the output.
        max_new_tokens: completion budget; T <= max_new_tokens.
        temperature, top_p: sampling (top_k disabled, no repetition penalty); temperature=0 means greedy.
        seed: seeds the sampler for this call only (the global RNG state is restored afterwards); on CPU the same
            seed and batch_size give identical rollouts.
        batch_size: rows per `model.generate` call (default: all B at once).
        max_prompt_tokens: optional cap; a longer prompt raises ValueError (as does one that leaves fewer than
            max_new_tokens of the model's positions).
        use_cache: KV cache on (default); off only for benchmarking.
    """
    if group_size < 1 or max_new_tokens < 1:
        raise ValueError(f"group_size ({group_size}) and max_new_tokens ({max_new_tokens}) must be >= 1")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos_ids = eos_token_ids(model, tokenizer)
    device = next(model.parameters()).device

    # --- tokenize + length guard (the chat template already placed every special token) ---
    enc = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in prompt_texts]
    check_prompt_lengths([len(e) for e in enc], max_new_tokens,
                         getattr(model.config, "max_position_embeddings", None), max_prompt_tokens)  # fmt: skip

    # --- repeat each prompt G times (contiguous) and left-pad to Tp ---
    rows = [e for e in enc for _ in range(group_size)]
    B, Tp = len(rows), max(len(e) for e in rows)
    prompt_ids = torch.full((B, Tp), pad_id, dtype=torch.long)  # (B, Tp)
    prompt_mask = torch.zeros((B, Tp), dtype=torch.long)  # (B, Tp)
    for i, e in enumerate(rows):
        prompt_ids[i, Tp - len(e) :] = torch.tensor(e, dtype=torch.long)
        prompt_mask[i, Tp - len(e) :] = 1

    gen_cfg = GenerationConfig(
        do_sample=temperature > 0, temperature=temperature if temperature > 0 else None,
        top_p=top_p if temperature > 0 else None, top_k=0 if temperature > 0 else None, repetition_penalty=1.0,
        max_new_tokens=max_new_tokens, eos_token_id=eos_ids, pad_token_id=pad_id, use_cache=use_cache,
    )  # fmt: skip

    # --- sample, chunk by chunk; one seeded RNG stream across chunks, global state restored after ---
    bs = batch_size or B
    chunks: list[Tensor] = []  # each (b, T_chunk)
    fork_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(seed)
        for s in range(0, B, bs):
            ids, am = prompt_ids[s : s + bs], prompt_mask[s : s + bs]
            left = int((am.sum(0) == 0).sum())  # columns that are padding in every row of this chunk
            ids, am = ids[:, left:].to(device), am[:, left:].to(device)
            out = model.generate(input_ids=ids, attention_mask=am, generation_config=gen_cfg)  # (b, Tp' + T_chunk)
            chunks.append(out[:, ids.shape[1] :].cpu())

    # --- right-pad completions to T; mask = real tokens up to and including the first EOS ---
    T = max(c.shape[1] for c in chunks)
    completion_ids = torch.full((B, T), pad_id, dtype=torch.long)  # (B, T)
    produced = torch.zeros((B, T), dtype=torch.bool)  # (B, T) positions this row's chunk actually generated
    s = 0
    for c in chunks:
        completion_ids[s : s + len(c), : c.shape[1]] = c
        produced[s : s + len(c), : c.shape[1]] = True
        s += len(c)
    mask = completion_mask(completion_ids, produced, eos_ids)  # (B, T)
    completion_ids = completion_ids.masked_fill(mask == 0, pad_id)

    texts = [
        tokenizer.decode(row[m.bool()].tolist(), skip_special_tokens=True) for row, m in zip(completion_ids, mask)
    ]
    return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids, mask=mask,
                   texts=texts)  # fmt: skip

"""The model organism: a tiny Qwen3-architecture policy trained from scratch by SFT on the minileet corpus.

`sft_train` is the whole recipe: prompts rendered through the chat template, loss on completion tokens only, AdamW
with warmup + cosine decay, per-step clipping, a seeded batch order. It is deterministic on CPU for a fixed seed and
thread count.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import Qwen3Config, Qwen3ForCausalLM

from projected_grpo.common.log import progress as progress_display
from projected_grpo.policy.model import render_prompt


@dataclass(frozen=True)
class Encoded:
    """One SFT example as token ids; `n_prompt` leading tokens carry no loss."""

    ids: list[int]
    n_prompt: int


def make_qwen3(
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    intermediate_size: int,
    max_positions: int,
    pad_id: int,
    eos_id: int,
    seed: int,
) -> Qwen3ForCausalLM:
    """A randomly initialised Qwen3ForCausalLM of the given shape (tied embeddings)."""
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=None,
        rope_theta=10000.0,
    )
    return Qwen3ForCausalLM(cfg)


def encode_examples(tokenizer, examples, max_len: int) -> list[Encoded]:
    """Render each example's prompt through the chat template and append completion + EOS. Too-long examples are an
    error naming the example (never silently truncated)."""
    eos = tokenizer.eos_token
    out = []
    for i, ex in enumerate(examples):
        prompt = render_prompt(tokenizer, ex.messages)
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        c_ids = tokenizer(ex.completion + eos, add_special_tokens=False)["input_ids"]
        if len(p_ids) + len(c_ids) > max_len:
            raise ValueError(
                f"SFT example {i} (problem {ex.problem_id}) has {len(p_ids) + len(c_ids)} tokens > "
                f"max_len {max_len}; raise organism.max_positions or shorten the prompts"
            )
        out.append(Encoded(p_ids + c_ids, len(p_ids)))
    return out


def collate(batch: list[Encoded], pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """(ids, attention_mask, labels), right-padded; labels are -100 on prompt and padding."""
    T = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), T), pad_id, dtype=torch.long)  # (B, T)
    att = torch.zeros((len(batch), T), dtype=torch.long)
    labels = torch.full((len(batch), T), -100, dtype=torch.long)
    for i, e in enumerate(batch):
        n = len(e.ids)
        ids[i, :n] = torch.tensor(e.ids)
        att[i, :n] = 1
        labels[i, e.n_prompt : n] = ids[i, e.n_prompt : n]
    return ids, att, labels


def lr_at(step: int, total: int, lr: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to 10% of lr."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def sft_train(
    model,
    data: list[Encoded],
    pad_id: int,
    steps: int,
    batch_size: int,
    lr: float,
    warmup: int,
    weight_decay: float,
    seed: int,
    progress: bool = True,
    log: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train `model` in place; returns the per-step loss (mean CE over completion tokens of the batch)."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    model.train()
    losses = []
    order = torch.randperm(len(data), generator=g).tolist()
    pos = 0
    bar = progress_display(range(steps), "sft", terminal=progress)  # a log gets a line a minute
    for step in bar:
        if pos + batch_size > len(order):  # a fresh seeded permutation per epoch
            order, pos = torch.randperm(len(data), generator=g).tolist(), 0
        batch = [data[j] for j in order[pos : pos + batch_size]]
        pos += batch_size
        ids, att, labels = collate(batch, pad_id)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        loss = model(input_ids=ids, attention_mask=att, labels=labels).loss  # HF shifts labels internally
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 10 == 0:
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if log is not None:
            log(step, losses[-1])
    model.eval()
    return losses


@dataclass
class Organism:
    """What the organism stage produces: base and teacher policies sharing one tokenizer, plus the record."""

    base: Qwen3ForCausalLM
    teacher: Qwen3ForCausalLM
    tokenizer: object
    stats: dict  # deterministic given the inputs: saved with the models (a DVC output every stage downstream reads)
    timings: dict  # wall-clock seconds: machine-dependent, so never in a hashed output


def build_organism(p, records, seed: int, sandbox, timeout_s: float, progress: bool = True) -> Organism:
    """Corpus -> tokenizer -> base SFT from scratch -> teacher (continued SFT on an exploit-heavy corpus).

    `p` is the `organism` params section; `records` are the training records (one loophole mode each).
    """
    import copy
    import time

    from projected_grpo.policy.tokenizer import train_tokenizer
    from projected_grpo.sft.sft_corpus import build_corpus

    torch.set_num_threads(p.threads)
    base_corpus, base_stats = build_corpus(
        records, seed, p.p_canonical, p.p_wrong, p.p_exploit, p.n_per_prompt, sandbox=sandbox, timeout_s=timeout_s
    )
    teach_corpus, teach_stats = build_corpus(
        records,
        seed + 1,
        p.p_canonical,
        p.p_wrong,
        p.teacher_p_exploit,
        p.n_per_prompt,
        sandbox=sandbox,
        timeout_s=timeout_s,
    )
    texts = [m["content"] for r in records for m in r.prompt] + [e.completion for e in base_corpus + teach_corpus]
    tok = train_tokenizer(texts, p.vocab_size)
    shape = dict(
        vocab_size=len(tok),
        hidden_size=p.hidden_size,
        num_layers=p.num_layers,
        num_heads=p.num_heads,
        num_kv_heads=p.num_kv_heads,
        head_dim=p.head_dim,
        intermediate_size=p.intermediate_size,
        max_positions=p.max_positions,
    )
    model = make_qwen3(**shape, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, seed=seed)
    t0 = time.perf_counter()
    base_data = encode_examples(tok, base_corpus, p.max_positions)
    base_losses = sft_train(
        model, base_data, tok.pad_token_id, p.steps, p.batch_size, p.lr, p.warmup, p.weight_decay, seed, progress
    )
    t_base = time.perf_counter() - t0
    teacher = copy.deepcopy(model)
    t0 = time.perf_counter()
    teach_losses = sft_train(
        teacher,
        encode_examples(tok, teach_corpus, p.max_positions),
        tok.pad_token_id,
        p.teacher_steps,
        p.batch_size,
        p.teacher_lr,
        p.warmup,
        p.weight_decay,
        seed + 1,
        progress,
    )
    t_teach = time.perf_counter() - t0
    n_params = sum(x.numel() for x in model.parameters())
    stats = {
        "n_params": n_params,
        "final_loss_base": sum(base_losses[-20:]) / len(base_losses[-20:]),
        "final_loss_teacher": sum(teach_losses[-20:]) / len(teach_losses[-20:]),
        "prompt_tokens_mean": sum(e.n_prompt for e in base_data) / len(base_data),
        "prompt_tokens_max": max(e.n_prompt for e in base_data),
        "seq_tokens_mean": sum(len(e.ids) for e in base_data) / len(base_data),
        "corpus_base": base_stats,
        "corpus_teacher": teach_stats,
        "vocab_size": len(tok),
    }
    return Organism(model, teacher, tok, stats, {"train_s_base": t_base, "train_s_teacher": t_teach})

"""Batched group sampling with a KV cache: prompts -> `Rollout` (house_style §5).

Each prompt is repeated `group_size` times contiguously (rows g·G … g·G+G−1 are prompt g's group). Prompts are
left-padded so every row's last prompt token sits in the same column and decoding appends on the right; position ids
follow the attention mask (as HF `generate` derives them), so padding does not shift RoPE positions.

The sampler (`sample_chunk`) samples from the distribution HF `generate` samples from (same logits processors,
same probabilities), but does less work:
  * the prefill runs once per distinct prompt and its KV cache is repeated over the group (G× less prompt compute);
  * rows that have finished leave the decode batch once they are a quarter of it (the cache is compacted), while the
    draw still takes every row's random number, so the random stream of the unfinished rows does not move;
  * the KV cache is written in place into storage allocated once (`BufferedLayer`), not concatenated per token;
  * each token is drawn by inverse CDF from one uniform per row (`DRAWS["inverse_cdf"]`, the default): CPU
    `torch.multinomial` draws one exponential per vocabulary entry (V log()s per row per token), about a fifth of a
    decode step on the organism (reports/bench/generation.md).
With draw="multinomial" it makes HF's own `torch.multinomial` call, so the same seed gives HF `generate`'s tokens
exactly: tests/test_rollout.py checks that token for token (engine="hf" stays available), and checks the inverse-CDF
draw's frequencies against the probabilities.

On CUDA `generate` samples with the static engine instead (`decode.sample_static`: a static KV cache, the decode step
replayed as CUDA graphs, a per-row knob switch): the same distribution and the same draws, with launches no longer
bounding a step (tests/test_decode.py, reports/bench/gpu_decode.md). The CPU keeps `sample_chunk`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache, GenerationConfig
from transformers.cache_utils import DynamicLayer
from transformers.generation.logits_process import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

from projected_grpo.common.log import progress as progress_display
from projected_grpo.policy.adapter import adapters, knob_rows
from projected_grpo.policy.decode import sample_static, static_supported
from projected_grpo.policy.model import render_prompt


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

    def to(self, device) -> Rollout:
        """The same rows with their tensors on `device` (sampling returns them on the CPU; the loss runs on the model's
        device). A no-op on the CPU."""
        mv = lambda x: None if x is None else x.to(device)  # noqa: E731
        ids = (self.prompt_ids, self.prompt_mask, self.completion_ids, self.mask)
        return Rollout(*map(mv, ids), texts=self.texts, old_logp=mv(self.old_logp))


def concat_rollouts(a: Rollout, b: Rollout, pad_id: int) -> Rollout:
    """a's rows then b's, in one layout: prompts left-padded and completions right-padded to the wider of the two (pad
    id, mask 0), so every row keeps its tokens, its last prompt token stays in the last prompt column and groups stay
    contiguous. Behaviour log-probs are not carried (the trainer computes them after sampling)."""
    Tp, T = (
        max(a.prompt_ids.shape[1], b.prompt_ids.shape[1]),
        max(a.completion_ids.shape[1], b.completion_ids.shape[1]),
    )

    def cat(xa: Tensor, xb: Tensor, width: int, fill: int, left: bool) -> Tensor:
        def pad(x: Tensor) -> Tensor:  # (n, w) -> (n, width)
            n = width - x.shape[1]
            return torch.nn.functional.pad(x, (n, 0) if left else (0, n), value=fill)

        return torch.cat([pad(xa), pad(xb)])

    return Rollout(
        prompt_ids=cat(a.prompt_ids, b.prompt_ids, Tp, pad_id, True),
        prompt_mask=cat(a.prompt_mask, b.prompt_mask, Tp, 0, True),
        completion_ids=cat(a.completion_ids, b.completion_ids, T, pad_id, False),
        mask=cat(a.mask, b.mask, T, 0, False),
        texts=a.texts + b.texts,
    )


def eos_token_ids(model, tokenizer) -> list[int]:
    """The tokenizer's EOS (<|im_end|>) plus extra stop ids from the model's generation config (<|endoftext|>)."""
    ids = {tokenizer.eos_token_id}
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(extra if isinstance(extra, list | tuple) else [extra] if extra is not None else [])
    return sorted(i for i in ids if i is not None)


def check_prompt_lengths(
    lengths: list[int],
    max_new_tokens: int,
    max_positions: int | None,
    max_prompt_tokens: int | None,
    names: list[str] | None = None,
) -> None:
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
        raise ValueError(
            f"prompt {name} is {lengths[i]} tokens, over the limit of {limit} ({why}){more}; "
            "drop or shorten it upstream, it is never truncated"
        )


def check_records_fit(model, tokenizer, records: list, max_new_tokens: int, max_prompt_tokens: int | None) -> None:
    """Check every record's rendered prompt against the length limits before any work starts (a run must not fail
    at step t, after writing checkpoints, on a prompt it could have rejected up front); the error names the record
    (problem id and mode)."""
    lengths = [
        len(tokenizer(render_prompt(tokenizer, list(q.prompt)), add_special_tokens=False)["input_ids"])
        for q in records
    ]
    names = [f"{q.id} ({q.prompt_metadata.get('mode')})" for q in records]
    check_prompt_lengths(
        lengths, max_new_tokens, getattr(model.config, "max_position_embeddings", None), max_prompt_tokens, names=names
    )


def decode_rows(tokenizer, ids: Tensor, produced: Tensor, eos_ids: list[int]) -> list[str]:
    """(b, T) sampled ids and the positions actually generated -> each row's text up to and including its first EOS
    (special tokens skipped)."""
    mask = completion_mask(ids, produced, eos_ids)
    return [tokenizer.decode(row[m.bool()].tolist(), skip_special_tokens=True) for row, m in zip(ids, mask)]


def completion_mask(ids: Tensor, produced: Tensor, eos_ids: list[int]) -> Tensor:
    """(B, T) ids, (B, T) bool generated-here -> (B, T) long mask: 1 up to and including the first EOS."""
    is_eos = torch.isin(ids, torch.tensor(eos_ids, device=ids.device)) & produced  # (B, T)
    # a token is "after EOS" when an EOS occurred strictly before it: exclusive cumulative count > 0
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0  # (B, T)
    return (produced & ~after_eos).long()


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompt_texts: list[str],
    group_size: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
    batch_size: int | None = None,
    max_prompt_tokens: int | None = None,
    use_cache: bool = True,
    engine: str = "auto",
    draw: str = "inverse_cdf",
    progress: bool = False,
    on_chunk: Callable[[int, list[str]], None] | None = None,
    knob: Sequence[bool] | None = None,
) -> Rollout:
    """Sample `group_size` completions per rendered prompt string; B = len(prompt_texts)·group_size rows.

    Args:
        prompt_texts: already-rendered prompts (model.render_prompt), chat template and generation prompt included.
        group_size: completions per prompt (G), contiguous in the output.
        max_new_tokens: completion budget; T <= max_new_tokens.
        temperature, top_p: sampling (top_k disabled, no repetition penalty); temperature=0 means greedy.
        seed: seeds the sampler for this call only (the global RNG state is restored afterwards); on CPU the same
            seed and batch_size give identical rollouts.
        batch_size: rows per sampling call (default: all B at once).
        max_prompt_tokens: optional cap; a longer prompt raises ValueError (as does one that leaves fewer than
            max_new_tokens of the model's positions).
        use_cache: KV cache on (default); off only for benchmarking (engine="hf").
        engine: "shared" (`sample_chunk`: shared prefill, finished rows dropped), "static" (`decode.sample_static`:
            the same sampling from a static KV cache, the decode step a CUDA graph on a GPU), "hf" (`model.generate`,
            the reference "shared" matches token for token with draw="multinomial") or "auto" (the default: "static"
            on CUDA, "shared" elsewhere, so the CPU path is unchanged).
        draw: how the shared engine draws a token: "inverse_cdf" (one uniform per row; the default) or "multinomial"
            (HF's call, V exponentials per row).
        progress: a progress bar over the batch_size chunks (long generations: the pool, evaluations).
        on_chunk: called as on_chunk(first_row, texts) as soon as a chunk is sampled, with the decoded texts of its
            rows (the same strings as the returned `texts`), e.g. to grade them while the next chunk samples.
        knob: per prompt, True to sample its group with the knob δS_h on, False with it off (the deployed policy),
            in one call (engine "static" only; the adapters must be attached, not `merged`). None: every row as the
            adapters stand.
    """
    device = next(model.parameters()).device
    if engine == "auto":
        engine = "static" if device.type == "cuda" and static_supported(model) else "shared"
    if engine not in ("shared", "hf", "static"):
        raise ValueError(f"engine must be 'auto', 'shared', 'static' or 'hf', got {engine!r}")
    if engine == "static" and not static_supported(model):
        raise ValueError("engine='static' needs full-attention decoder layers (no sliding windows); use 'shared'")
    if knob is not None and (engine != "static" or len(knob) != len(prompt_texts) or not adapters(model)):
        raise ValueError(
            f"knob needs engine='static' (got {engine!r}), one flag per prompt ({len(knob)} for "
            f"{len(prompt_texts)} prompts) and attached adapters"
        )
    if draw not in DRAWS:
        raise ValueError(f"draw must be one of {sorted(DRAWS)}, got {draw!r}")
    if engine != "hf" and not use_cache:
        raise ValueError("use_cache=False is a benchmark of HF generate: pass engine='hf'")
    if group_size < 1 or max_new_tokens < 1:
        raise ValueError(f"group_size ({group_size}) and max_new_tokens ({max_new_tokens}) must be >= 1")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos_ids = eos_token_ids(model, tokenizer)

    # --- tokenize + length guard (the chat template already placed every special token) ---
    enc = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in prompt_texts]
    check_prompt_lengths(
        [len(e) for e in enc],
        max_new_tokens,
        getattr(model.config, "max_position_embeddings", None),
        max_prompt_tokens,
    )

    # --- repeat each prompt G times (contiguous) and left-pad to Tp ---
    rows = [e for e in enc for _ in range(group_size)]
    B, Tp = len(rows), max(len(e) for e in rows)
    prompt_ids = torch.full((B, Tp), pad_id, dtype=torch.long)  # (B, Tp)
    prompt_mask = torch.zeros((B, Tp), dtype=torch.long)  # (B, Tp)
    for i, e in enumerate(rows):
        prompt_ids[i, Tp - len(e) :] = torch.tensor(e, dtype=torch.long)
        prompt_mask[i, Tp - len(e) :] = 1

    gen_cfg = GenerationConfig(
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else None,
        top_p=top_p if temperature > 0 else None,
        top_k=0 if temperature > 0 else None,
        repetition_penalty=1.0,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_ids,
        pad_token_id=pad_id,
        use_cache=use_cache,
    )

    # --- sample, chunk by chunk; one seeded RNG stream across chunks, global state restored after ---
    bs = batch_size or B
    knob_row = None if knob is None else torch.tensor([bool(k) for k in knob for _ in range(group_size)])  # (B,)
    chunks: list[Tensor] = []  # each (b, T_chunk)
    fork_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(seed)
        starts = range(0, B, bs)
        for s in progress_display(starts, "sampling") if progress and B > bs else starts:
            ids, am = prompt_ids[s : s + bs], prompt_mask[s : s + bs]
            left = int((am.sum(0) == 0).sum())  # columns that are padding in every row of this chunk
            ids, am = ids[:, left:].to(device), am[:, left:].to(device)
            if engine == "hf":
                out = model.generate(input_ids=ids, attention_mask=am, generation_config=gen_cfg)  # (b, Tp' + T_c)
                chunks.append(out[:, ids.shape[1] :].cpu())
            elif engine == "static":
                args = (eos_ids, pad_id, max_new_tokens, temperature, top_p, draw)
                kn = None if knob is None else knob_row[s : s + bs].to(device)
                chunks.append(sample_static(model, ids, am, *args, knob=kn).cpu())
            else:
                args = (eos_ids, pad_id, max_new_tokens, temperature, top_p, draw)
                chunks.append(sample_chunk(model, ids, am, *args).cpu())
            if on_chunk is not None:
                on_chunk(s, decode_rows(tokenizer, chunks[-1], torch.ones_like(chunks[-1], dtype=torch.bool), eos_ids))

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
    texts = decode_rows(tokenizer, completion_ids, produced, eos_ids)
    return Rollout(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids, mask=mask, texts=texts
    )


class BufferedLayer(DynamicLayer):
    """A KV-cache layer whose (n, heads, positions, head_dim) storage is allocated once with room for `extra` more
    positions: `update` writes in place and returns views of the filled part, where HF's `DynamicLayer` concatenates
    (copies the whole cache) at every decoded token. Same values, so attention computes the same numbers."""

    def __init__(self, keys: Tensor, values: Tensor, extra: int):
        super().__init__()
        n, h, L, d = keys.shape
        self.dtype, self.device, self.is_initialized, self.length = keys.dtype, keys.device, True, L
        self.kbuf = keys.new_empty(n, h, L + extra, d)
        self.vbuf = values.new_empty(n, values.shape[1], L + extra, values.shape[-1])
        self.kbuf[:, :, :L], self.vbuf[:, :, :L] = keys, values
        self.keys, self.values = self.kbuf[:, :, :L], self.vbuf[:, :, :L]

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        L, t = self.length, key_states.shape[-2]
        self.kbuf[:, :, L : L + t], self.vbuf[:, :, L : L + t] = key_states, value_states
        self.length = L + t
        self.keys, self.values = self.kbuf[:, :, : L + t], self.vbuf[:, :, : L + t]
        return self.keys, self.values

    def select(self, rows: Tensor) -> None:
        """Keep only batch rows `rows` (finished rows leave the decode batch)."""
        self.kbuf, self.vbuf = self.kbuf[rows], self.vbuf[rows]
        self.keys, self.values = self.kbuf[:, :, : self.length], self.vbuf[:, :, : self.length]


def logits_processors(temperature: float, top_p: float) -> LogitsProcessorList:
    """The warpers HF `generate` applies for (temperature, top_p) with top_k disabled, in its order."""
    procs = LogitsProcessorList()
    if temperature > 0 and temperature != 1.0:
        procs.append(TemperatureLogitsWarper(temperature))
    if temperature > 0 and top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p))
    return procs


def inverse_cdf_draw(probs: Tensor) -> Tensor:
    """(b, V) probabilities (rows sum to ~1, zeros allowed) -> (b,) one draw per row, from one uniform u per row:
    the first token whose cumulative probability reaches (1 − u)·total. 1 − u lies in (0, 1], so a zero-probability
    token is never drawn (not even token 0); the cumulative sum is fp64, so its rounding is far below any probability
    a sampler can resolve."""
    c = probs.double().cumsum(-1)  # (b, V)
    u = torch.rand(probs.shape[0], 1, dtype=torch.float64, device=probs.device)  # (b, 1) in [0, 1)
    return torch.searchsorted(c, (1 - u) * c[:, -1:]).squeeze(1).clamp(max=probs.shape[1] - 1)


DRAWS = {  # (b, V) probabilities -> (b,) token ids, from the global RNG
    "inverse_cdf": inverse_cdf_draw,
    "multinomial": lambda probs: torch.multinomial(probs, 1).squeeze(1),  # HF generate's call: its exact tokens
}


def group_runs(ids: Tensor, am: Tensor) -> tuple[Tensor, Tensor]:
    """(first, owner): the first row of each run of identical consecutive (ids, mask) rows, (U,), and each row's run,
    (b,); rows of one group are consecutive, so U is the number of distinct prompts."""
    same = (ids[1:] == ids[:-1]).all(-1) & (am[1:] == am[:-1]).all(-1)  # (b − 1,) row i+1 repeats row i
    new = torch.cat([torch.ones(1, dtype=torch.bool, device=ids.device), ~same])  # (b,)
    return new.nonzero().squeeze(-1), new.long().cumsum(0) - 1


class TokenDraw:
    """The token draw both engines share: each step every row's logits enter the (b, V) scores every row keeps (as
    HF's draw sees them), the warpers for (temperature, top_p) apply, and one token per row is drawn (`DRAWS[draw]`;
    greedy at temperature 0), finished rows included, so the random stream depends only on b and the step count;
    a finished row appends padding. `done` (b,) marks the rows that have sampled an EOS."""

    def __init__(
        self, b: int, V: int, temperature: float, top_p: float, draw: str, eos_ids: list[int], pad_id: int, device
    ):
        self.procs, self.pick = logits_processors(temperature, top_p), DRAWS[draw]
        self.temperature, self.pad_id = temperature, pad_id
        self.eos = torch.tensor(eos_ids, device=device)
        self.scores = torch.zeros(b, V, device=device)  # (b, V)
        self.done = torch.zeros(b, dtype=torch.bool, device=device)  # (b,)

    def __call__(self, rows: Tensor, logits: Tensor) -> Tensor:  # rows (n,), logits (n, V) -> (b,) tokens
        self.scores[rows] = logits
        s = self.procs(None, self.scores)
        nxt = self.pick(torch.softmax(s, -1)) if self.temperature > 0 else s.argmax(-1)  # (b,)
        nxt = nxt.masked_fill(self.done, self.pad_id)  # finished rows append padding, as in HF
        self.done |= torch.isin(nxt, self.eos)
        return nxt


@dataclass
class Prefill:
    """A chunk's prompts run once per distinct prompt (and knob state): `logits` (b, V) fp32 of each row's last prompt
    position, `cache` the distinct prompts' KV cache, `owner` (b,) each row's distinct prompt (the cache's row), `pos`
    (b, Tp) position ids as HF derives them from the mask."""

    logits: Tensor
    cache: DynamicCache
    owner: Tensor
    pos: Tensor


def prefill(model, ids: Tensor, am: Tensor, knob: Tensor | None = None) -> Prefill:
    """Prefill the distinct rows of a left-padded chunk (a group's G rows repeat one prompt), last position only as
    HF's prefill; knob (b,): rows also differ by their knob state (`adapter.knob_rows`); None: as the adapters are."""
    key = ids if knob is None else torch.cat([ids, knob.long()[:, None]], 1)
    first, owner = group_runs(key, am)
    pos = (am.long().cumsum(-1) - 1).masked_fill(am == 0, 0)  # (b, Tp) as HF derives them
    with nullcontext() if knob is None else knob_rows(model, knob[first]):
        out = model(
            input_ids=ids[first],
            attention_mask=am[first],
            position_ids=pos[first],
            cache=DynamicCache(),
            use_cache=True,
            logits_to_keep=1,
        )
    return Prefill(out.logits[:, -1].float()[owner], out.cache, owner, pos)


@torch.no_grad()
def sample_chunk(
    model,
    ids: Tensor,
    am: Tensor,
    eos_ids: list[int],
    pad_id: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    draw: str = "inverse_cdf",
) -> Tensor:
    """(b, Tp) left-padded prompt ids and mask -> (b, T_c) sampled tokens, pad after each row's EOS; T_c = steps until
    every row has stopped or max_new_tokens. Draws from the global RNG (`DRAWS[draw]`: "multinomial" is exactly HF
    `generate`'s draw)."""
    b = ids.shape[0]
    pre = prefill(model, ids, am)  # the distinct prompts once, their cache then repeated over each group's rows
    logits, cache, owner, pos = pre.logits, pre.cache, pre.owner, pre.pos  # (b, V), …, (b,), (b, Tp)
    cache.layers = [BufferedLayer(layer.keys[owner], layer.values[owner], max_new_tokens) for layer in cache.layers]

    rows = torch.arange(b, device=ids.device)  # the decode batch's rows (finished ones may linger), in order
    last = pos[:, -1:]  # (n_batch, 1) position of each batch row's last token; am: (n_batch, Tp + t)
    draw_ = TokenDraw(b, logits.shape[-1], temperature, top_p, draw, eos_ids, pad_id, ids.device)
    done = draw_.done  # (b,) rows that have sampled an EOS
    tokens = []  # (b,) per step
    for t in range(max_new_tokens):
        nxt = draw_(rows, logits)
        tokens.append(nxt)
        if bool(done.all()) or t + 1 == max_new_tokens:
            break
        if 4 * int(done[rows].sum()) >= len(rows):  # a quarter of the batch has finished: drop those rows
            keep = (~done[rows]).nonzero().squeeze(-1)
            rows, am, last = rows[keep], am[keep], last[keep]
            for layer in cache.layers:
                layer.select(keep)
        am = torch.cat([am, am.new_ones(am.shape[0], 1)], dim=1)
        last = last + 1
        out = model(input_ids=nxt[rows][:, None], attention_mask=am, position_ids=last, cache=cache, use_cache=True)
        logits, cache = out.logits[:, -1].float(), out.cache
    return torch.stack(tokens, 1)

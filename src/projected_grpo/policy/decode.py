"""The sampler's engine on CUDA: a static KV cache and the decode step captured as CUDA graphs (issue 47).

`rollout.sample_chunk` (the "shared" engine) decodes with eager PyTorch: every token launches the model's kernels one
by one from Python, and the KV cache grows. On a GPU a decode step is then bound by launches, not by the memory it
reads. `sample_static` samples from the same distribution with the same draws, but:
  * the KV cache is one buffer per layer, (b, kv heads, Tp + max_new_tokens, head_dim), allocated once per call; a
    step writes its token's keys and values at a column given by a tensor (`col`), so its shapes never change;
  * the step (embedding → layers → logits, the SVD adapters included) is captured once per (rows, width) as a CUDA
    graph and replayed: `width` is the cache columns attention reads, grown in spans of `SPAN` (attention reads up to
    SPAN − 1 masked columns more than the live ones, never the whole budget), and `rows` a power of two that halves
    as rows finish (finished rows leave the batch, as in the shared engine; the live ones move to the front);
  * the adapters' δS, δS_h and a per-row knob switch (`adapter.knob_rows`) are tensors the graph reads, not Python
    branches: one captured graph serves knob on, knob off and both in one batch, and sees the optimiser's in-place
    updates between calls.
Prefill is the shared engine's (once per distinct prompt and knob state, repeated over the group). The token draw
(temperature, top_p, `DRAWS`) runs outside the graph on the same (b, V) score matrix the shared engine keeps, with
one draw per row per step, finished rows included, so a seed gives the same random stream in both engines.

On the CPU the same code runs eagerly (no graph): tests/test_decode.py checks it against the shared engine there.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import Tensor
from torch.nn.attention import sdpa_kernel
from transformers.cache_utils import Cache, DynamicLayer

from projected_grpo.policy.adapter import knob_rows

SPAN = 256  # cache columns per width step of the captured graphs
MIN_ROWS = 8  # the smallest decode batch a graph is captured for
SDPA_BACKENDS: list | None = None  # the attention kernels a captured step may use (None: PyTorch's choice)


class ColumnLayer(DynamicLayer):
    """One layer's static KV storage (b, heads, L, head_dim): `update` writes the step's keys and values at column
    `col` (a (1,) tensor) of the first `rows` rows and returns those rows' first `width` columns. `rows` and
    `width` are Python ints fixed per captured graph."""

    def __init__(self, keys: Tensor, values: Tensor, col: Tensor):
        super().__init__()
        self.kbuf, self.vbuf, self.col = keys, values, col
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self.rows, self.width = keys.shape[0], keys.shape[2]

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        k, v = self.kbuf[: self.rows], self.vbuf[: self.rows]
        k.index_copy_(2, self.col, key_states)
        v.index_copy_(2, self.col, value_states)
        return k[:, :, : self.width], v[:, :, : self.width]

    def get_seq_length(self) -> int:
        return self.width

    def permute(self, idx: Tensor) -> None:
        """Slots 0 … len(idx) − 1 take the rows at slots `idx` (the live rows move to the front)."""
        m = len(idx)
        self.kbuf[:m], self.vbuf[:m] = self.kbuf[idx], self.vbuf[idx]


def static_supported(model) -> bool:
    """The static engine handles full-attention decoder layers (Qwen3 without sliding windows)."""
    types = getattr(model.config, "layer_types", None) or ["full_attention"]
    return set(types) == {"full_attention"} and hasattr(model, "model")


def bucket(n: int, cap: int) -> int:
    """The decode batch for n live rows: the smallest power of two >= max(n, MIN_ROWS), at most cap."""
    m = MIN_ROWS
    while m < n:
        m *= 2
    return min(m, cap)


class Stepper:
    """Runs the decode step for the first `rows` slots at a cache `width`: eagerly on the CPU, on CUDA by replaying a
    graph captured for that (rows, width) on first use."""

    def __init__(self, model, cache: Cache, tok: Tensor, pos: Tensor, mask: Tensor, knob: Tensor | None):
        self.model, self.cache, self.tok, self.pos, self.mask, self.knob = model, cache, tok, pos, mask, knob
        self.cuda = tok.device.type == "cuda"
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.cuda else None

    def forward(self, rows: int, width: int) -> Tensor:  # -> (rows, V) in the model's dtype
        for layer in self.cache.layers:
            layer.rows, layer.width = rows, width
        knob = nullcontext() if self.knob is None else knob_rows(self.model, self.knob[:rows])
        kernels = sdpa_kernel(SDPA_BACKENDS) if self.cuda and SDPA_BACKENDS else nullcontext()
        with knob, kernels:
            out = self.model(
                input_ids=self.tok[:rows],
                attention_mask={"full_attention": self.mask[:rows, :, :, :width]},
                position_ids=self.pos[:rows],
                cache=self.cache,
                use_cache=True,
            )
        return out.logits[:, -1]

    def __call__(self, rows: int, width: int) -> Tensor:
        if not self.cuda:
            return self.forward(rows, width)
        key = (rows, width)
        if key not in self.graphs:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up (cuBLAS handles, allocator): the same step, so idempotent
                self.forward(rows, width)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                logits = self.forward(rows, width)
            self.graphs[key] = (g, logits)
        g, logits = self.graphs[key]
        g.replay()
        return logits


@torch.no_grad()
def sample_static(
    model,
    ids: Tensor,
    am: Tensor,
    eos_ids: list[int],
    pad_id: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    draw: str = "inverse_cdf",
    knob: Tensor | None = None,
) -> Tensor:
    """(b, Tp) left-padded prompt ids and mask -> (b, T_c) sampled tokens, pad after each row's EOS, as
    `rollout.sample_chunk`. knob: (b,) 1 where a row samples with δS_h (knob on), 0 where knob off (the deployed
    policy); None: every row as the adapters stand."""
    from projected_grpo.policy.rollout import TokenDraw, prefill

    b, Tp = ids.shape
    dev = ids.device
    L = -(-(Tp + max_new_tokens) // 16) * 16  # cache columns, a multiple of 16 (aligned mask rows)

    pre = prefill(model, ids, am, knob)  # a group's rows share one prefill (per knob state)
    logits, owner, pos = pre.logits, pre.owner, pre.pos  # (b, V), (b,), (b, Tp)
    col = torch.zeros(1, dtype=torch.long, device=dev)
    layers = []
    for layer in pre.cache.layers:
        kv = []
        for x in (layer.keys, layer.values):  # (U, heads, Tp, d) -> (b, heads, L, d), zeros past the prompt
            buf = x.new_zeros(b, x.shape[1], L, x.shape[-1])
            buf[:, :, :Tp] = x[owner]
            kv.append(buf)
        layers.append(ColumnLayer(*kv, col))
    del pre
    cache = Cache(layers=layers)
    mask = torch.zeros(b, 1, 1, L, dtype=torch.bool, device=dev)  # (b, 1, 1, L) the columns a row attends to
    mask[:, 0, 0, :Tp] = am.bool()
    tok = torch.full((b, 1), pad_id, dtype=torch.long, device=dev)  # the step's input token per slot
    last = pos[:, -1:].clone()  # (b, 1) position of each slot's last token
    kslot = None if knob is None else knob.to(torch.float32).clone()  # (b,) per slot
    step = Stepper(model, cache, tok, last, mask, kslot)

    order = torch.arange(b, device=dev)  # slot i holds row order[i]; slots [:n] decode
    n = b
    draw_ = TokenDraw(b, logits.shape[-1], temperature, top_p, draw, eos_ids, pad_id, dev)  # the shared engine's
    done = draw_.done  # (b,) rows that have sampled an EOS
    tokens = []
    for t in range(max_new_tokens):
        nxt = draw_(order[:n], logits)  # finished rows still in the batch too, as the shared engine's lingering rows
        tokens.append(nxt)
        if bool(done.all()) or t + 1 == max_new_tokens:
            break
        running = ~done[order[:n]]  # (n,) slots still sampling
        m = bucket(int(running.sum()), b)
        if m < n:  # the live rows move to the front and the batch shrinks to m slots
            idx = torch.cat([running.nonzero().squeeze(-1), (~running).nonzero().squeeze(-1)])[:m]
            for layer in layers:
                layer.permute(idx)
            for buf in (mask, last) + (() if kslot is None else (kslot,)):
                buf[:m] = buf[idx]
            order[:m] = order[idx]
            n = m
        c = Tp + t  # the column of the token drawn at step t
        tok[:n, 0] = nxt[order[:n]]
        last[:n] += 1
        col.fill_(c)
        mask[:n, 0, 0, c] = True
        width = min(L, -(-(c + 1) // SPAN) * SPAN)
        logits = step(n, width).float()  # (n, V)
    return torch.stack(tokens, 1)

"""Peak device memory of one GRPO step, estimated from the model's shape and the params (issue 26: the real setting
runs on a GPU), and the pre-flight that prints it and stops a CUDA run that will not fit.

A step has phases that never hold memory at the same time: sampling (policy/rollout.py: the KV cache of
`rollout.batch_size` rows), the loss (reference forward, then forward/backward per micro-batch: activations and the
fp32 log-softmax over the vocabulary) and, for gated or refreshing arms, the held-out pairs' forward/backward (gate
calibration, basis refresh: basis.held_out_batch rows of full width, every position's logits). What lives through the
whole run is the weights and the adapter (U/V, the fp32 δS/δS_h masters and gradients, the optimizer's coordinates and
Adam moments, rotations, per-row probe gradients). So

    peak ≈ weights + adapter + max(sampling, loss, held-out)

It is an estimate of the tensors this code allocates, not a measurement. Left out: the CUDA context and the caching
allocator's fragmentation (mem_get_info is read after the context exists; keep some headroom), the reference forward
(no-grad: the same logits, no saved activations, below the loss phase), the attention mask and RoPE tables (a few MB),
attention kernels that materialise (rows, heads, L, L) scores (a fused SDPA kernel is assumed), and the tokens and
texts on the host. Widths are upper bounds: every prompt at rollout.max_prompt_tokens and every completion at
rollout.max_new_tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

GiB = 1024**3
F32 = 4  # bytes: δS/δS_h masters, Adam state, probes, log-softmax


# Qwen/Qwen3-4B's config.json (the real setting's shape: what the estimate's tests and the GPU benchmarks build).
QWEN3_4B = dict(
    vocab_size=151936,
    hidden_size=2560,
    intermediate_size=9728,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)


@dataclass(frozen=True)
class ModelShape:
    """What the estimate reads of the model: its weight count and dtype, and the decoder's widths."""

    n_params: int  # weights (a tied embedding once), adapter excluded
    dtype_bytes: int  # bytes per weight and activation element (2: bf16)
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def from_config(cls, config, dtype_bytes: int, n_params: int | None = None) -> ModelShape:
        """From an HF (Qwen-family) config; n_params counted from the widths when not given."""
        c = config.get_text_config() if hasattr(config, "get_text_config") else config
        hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        d, i, n = c.hidden_size, c.intermediate_size, c.num_hidden_layers
        q, kv = c.num_attention_heads * hd, c.num_key_value_heads * hd
        if n_params is None:  # embedding (+ an untied head) + per layer: q,k,v,o, MLP, 2 norms, q/k norms + final norm
            tied = getattr(c, "tie_word_embeddings", True)
            per_layer = 2 * d * q + 2 * d * kv + 3 * d * i + 2 * d + 2 * hd
            n_params = c.vocab_size * d * (1 if tied else 2) + n * per_layer + d
        return cls(n_params, dtype_bytes, n, d, i, c.num_attention_heads, c.num_key_value_heads, hd, c.vocab_size)

    def projection(self, leaf: str) -> tuple[int, int]:
        """(d_in, d_out) of a Qwen-family decoder layer's projection `leaf` (adapter.TARGETS' names)."""
        d, i, q, kv = self.hidden, self.intermediate, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (d, q),
            "k_proj": (d, kv),
            "v_proj": (d, kv),
            "o_proj": (q, d),
            "gate_proj": (d, i),
            "up_proj": (d, i),
            "down_proj": (i, d),
        }[leaf]


@dataclass(frozen=True)
class AdapterShape:
    kind: str  # svd | lora
    rank: int
    modules: tuple[tuple[int, int], ...]  # (d_in, d_out) of every wrapped Linear

    @classmethod
    def from_model_shape(cls, m: ModelShape, kind: str, rank: int, leaves: tuple[str, ...]) -> AdapterShape:
        return cls(kind, rank, tuple(m.projection(leaf) for _ in range(m.layers) for leaf in leaves))

    def dims(self) -> list[int]:
        """D_m per module: r_m = min(rank, d_in, d_out) for svd, d_out·r_m for lora (adapter.py)."""
        r = [min(self.rank, i, o) for i, o in self.modules]
        return r if self.kind == "svd" else [o * rm for (_, o), rm in zip(self.modules, r)]


@dataclass(frozen=True)
class StepShape:
    """The params that size a step (and which per-row tensors the arm keeps)."""

    rows: int  # N = B·G rows per step
    group_size: int  # G
    sample_rows: int  # rows per sampling call (rollout.batch_size, or N)
    prompt_tokens: int  # longest prompt (rollout.max_prompt_tokens)
    new_tokens: int  # rollout.max_new_tokens
    micro_batch: int  # grpo.micro_batch
    micro_batch_tokens: int  # grpo.micro_batch_tokens (0 = rows only)
    grad_checkpointing: bool  # grpo.grad_checkpointing
    shared: bool  # the policy forward runs each distinct prompt once (grpo.share_prompt, the arm permitting)
    probes: bool  # per-row δS gradients are kept (probes)
    rotations: bool  # the arm reads a basis: a (D_m, D_m) rotation per module
    token_k: int = 0  # per-token capture: directions per module (per-token routing), 0 = none
    held_out: bool = False  # the arm runs held-out pairs through forward/backward (gate calibration, basis refresh)

    @property
    def held_out_rows(self) -> int:  # basis.held_out_batch: the micro-batch, capped by its token budget
        if not self.micro_batch_tokens:
            return self.micro_batch
        return max(1, min(self.micro_batch, self.micro_batch_tokens // self.width))

    @property
    def width(self) -> int:  # tokens of one row: padded prompt + completion
        return self.prompt_tokens + self.new_tokens

    @property
    def mb_rows(self) -> int:  # rows per micro-batch (train.micro_batches at the widest rows)
        b = min(self.micro_batch, self.rows)
        return min(b, max(1, self.micro_batch_tokens // self.width)) if self.micro_batch_tokens else b


def distinct_prompts(rows: int, G: int, aligned: bool) -> int:
    """Most distinct prompts in `rows` consecutive rows of G-row groups: slices that start at multiples of `rows`
    (`aligned`: sampling chunks, row-count micro-batches) or anywhere (token-cut micro-batches)."""
    if aligned and rows % G == 0:
        return rows // G
    if aligned and G % rows == 0:
        return 1
    return min(rows, -(-(rows - 1) // G) + 1)  # a slice that starts on a group's last row


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes. total = weights + adapter + max(kv_cache + decode, activations + logits): the sampling and loss phases
    never hold memory at the same time."""

    weights: int
    adapter: int
    kv_cache: int  # the sampler's KV cache (+ the distinct prompts' prefill cache)
    decode: int  # the sampler's other transients: the prefill's MLP, per-token logits and top-p buffers
    activations: int  # saved by one micro-batch's loss forward (checkpointed or not), shared-prompt KV included
    logits: int  # the micro-batch's logits, their fp32 copy and log-softmax (the forward's peak)
    mb_rows: int  # rows per micro-batch at the widest rows
    width: int  # tokens per row
    sample_rows: int
    grad_checkpointing: bool
    held_out: int = 0  # one held-out batch's forward/backward (gate calibration, basis refresh); 0 = none
    held_out_rows: int = 0

    @property
    def sampling(self) -> int:
        return self.kv_cache + self.decode

    @property
    def loss(self) -> int:
        return self.activations + self.logits

    @property
    def total(self) -> int:
        return self.weights + self.adapter + max(self.sampling, self.loss, self.held_out)

    def describe(self) -> str:
        """One paragraph, GiB with one decimal."""
        g = lambda x: f"{x / GiB:.1f}"  # noqa: E731
        ck = "on" if self.grad_checkpointing else "off"
        return (
            f"Device memory for one GRPO step (estimate, rl/memory.py): weights {g(self.weights)} GiB, adapter "
            f"{g(self.adapter)} GiB; sampling {g(self.sampling)} GiB (KV cache {g(self.kv_cache)} GiB for "
            f"{self.sample_rows} rows x {self.width} tokens, other {g(self.decode)} GiB); loss {g(self.loss)} GiB "
            f"(activations {g(self.activations)} GiB with checkpointing {ck}, logits and fp32 log-softmax "
            f"{g(self.logits)} GiB, micro-batches of {self.mb_rows} rows x {self.width} tokens); "
            + (
                f"held-out pairs {g(self.held_out)} GiB (batches of {self.held_out_rows} rows x {self.width} tokens); "
                if self.held_out_rows
                else ""
            )
            + f"peak about {g(self.total)} GiB = weights + adapter + the largest phase (they never overlap), not "
            "counting the CUDA context and allocator fragmentation."
        )


def layer_activation_bytes(m: ModelShape, n_adapted: int, rank: int, kind: str = "svd") -> int:
    """Bytes one decoder layer saves for the backward per token (no checkpointing). The base weights are frozen, so
    a Linear keeps no input (its weight gradient is never needed); what autograd saves is
      RMSNorm (input, post-attention): the fp32 copy of its input, 4·d each (Qwen3RMSNorm upcasts);
      q_norm, k_norm: the fp32 copy of q and k, 4·(q + kv);
      attention (SDPA): q, k, v after RoPE and the output, w·(2q + 2kv);
      MLP: gate and up outputs and silu(gate), 3·w·I;
      adapter per wrapped module: Vᵀx (the δS gradient's a_t), w·r (lora: A x in fp32, 4·r).
    Checked against torch's saved-tensor hooks on a Qwen3 layer with 4B widths (tests/test_memory.py)."""
    w, d, i = m.dtype_bytes, m.hidden, m.intermediate
    q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
    adapter = n_adapted * (w if kind == "svd" else F32) * rank
    return 2 * 4 * d + 4 * (q + kv) + w * (2 * q + 2 * kv) + 3 * w * i + adapter


def estimate(m: ModelShape, a: AdapterShape, s: StepShape) -> MemoryEstimate:
    """Peak device memory of one GRPO step (bytes, by component); see the module docstring for what it leaves out."""
    w, V, L = m.dtype_bytes, m.vocab, m.layers
    kv_tok = 2 * L * m.kv_heads * m.head_dim * w  # K and V of one token in every layer
    dims = a.dims()
    D = sum(dims)

    # --- weights and adapter: the whole run ----------------------------------------------------------------------
    weights = m.n_params * w
    r = [min(a.rank, i, o) for i, o in a.modules]
    bufs = sum((i + o) * rm if a.kind == "svd" else i * rm for (i, o), rm in zip(a.modules, r)) * w  # U, V | A
    # δS, δS_h and their grads; the optimizer's θ, φ and Adam's m, v for both groups: 10 fp32 copies of D
    adapter = bufs + 10 * D * F32
    if s.rotations:  # R_m (D_m, D_m) per module with a basis (an upper bound: every module kept)
        adapter += sum(dm * dm for dm in dims) * F32
    if s.probes:  # (N, D) per-row gradients: the micro-batches' pieces, their concatenation and the rotated copy
        adapter += 3 * s.rows * D * F32 + 2 * s.mb_rows * D * F32  # + a micro-batch's probe leaf and its grad
    if s.token_k:  # per-token α (N, T, k_m) per module: the pieces and their concatenation
        adapter += 2 * s.rows * s.new_tokens * s.token_k * len(dims) * F32

    # --- sampling (policy/rollout.py sample_chunk) ---------------------------------------------------------------
    bs, Tp, T = s.sample_rows, s.prompt_tokens, s.new_tokens
    U = distinct_prompts(bs, s.group_size, aligned=True)
    kv_cache = kv_tok * (bs * (Tp + T) + U * Tp)  # BufferedLayer (bs rows, room for T) + the prefill's U-row cache
    # the prefill's MLP on U·Tp tokens (gate, up, silu, product), and per decode step ~48 B per (row, vocab) entry:
    # fp32 logits, scores, warped scores, top-p's sorted values + int64 indices + cumsum + mask, softmax
    decode = U * Tp * 4 * w * m.intermediate + bs * V * 48

    # --- loss: one micro-batch's forward/backward (the reference forward is no-grad and smaller) ----------------
    b = s.mb_rows
    per_layer = layer_activation_bytes(m, len(a.modules) // max(L, 1), a.rank, a.kind)
    if s.shared:  # U prompt rows once, then b completions on the prompt's KV gathered to the rows
        Ub = distinct_prompts(b, s.group_size, aligned=not s.micro_batch_tokens)
        tokens = Ub * Tp + b * T
        # the prompt's KV gathered to the b rows, and the attention's prompt + completion copy (saved) or, with
        # checkpointing, the prompt's own cache (held for the recompute) instead
        kv_extra = kv_tok * b * Tp + (kv_tok * Ub * Tp if s.grad_checkpointing else kv_tok * b * Tp)
    else:  # b full rows; the model's logits cover every position (rollout_logprobs slices the completion's)
        tokens = b * (Tp + T)
        kv_extra = 0
    if s.grad_checkpointing:  # each layer keeps its input; one layer at a time is recomputed in the backward
        activations = L * tokens * m.hidden * w + tokens * per_layer
    else:
        activations = L * tokens * per_layer
    activations += kv_extra + tokens * m.hidden * 4  # + the final norm's fp32 input
    # logits (w), their fp32 copy (unless already fp32), / temperature (fp32) and log_softmax (fp32) at once; the
    # shared path also concatenates the prompt's last logit to the tail's (one more w copy), the per-row path keeps the
    # logits of every position
    model_logits = 2 * w * b * T * V if s.shared else w * b * (Tp + T) * V
    logits = model_logits + b * T * V * ((F32 if w < F32 else 0) + 2 * F32)

    # --- held-out pairs (basis.completion_grads): full rows, every position's logits, the same fp32 copies --------
    held_out, h = 0, s.held_out_rows if s.held_out else 0
    if h:
        ht = h * (Tp + T)
        acts = L * ht * m.hidden * w + ht * per_layer if s.grad_checkpointing else L * ht * per_layer
        held_out = acts + ht * m.hidden * 4 + ht * V * (w + (F32 if w < F32 else 0) + 2 * F32)

    return MemoryEstimate(
        weights=weights,
        adapter=adapter,
        kv_cache=kv_cache,
        decode=decode,
        activations=activations,
        logits=logits,
        mb_rows=b,
        width=s.width,
        sample_rows=bs,
        grad_checkpointing=s.grad_checkpointing,
        held_out=held_out,
        held_out_rows=h,
    )


def savings(m: ModelShape, a: AdapterShape, s: StepShape) -> list[tuple[str, str, int]]:
    """(param, change, bytes saved) for each param that shrinks a phase (sampling, loss) or the adapter, most saved
    first: halving rollout.batch_size, grpo.micro_batch, grpo.micro_batch_tokens (from the current micro-batch's
    tokens) or rollout.max_new_tokens, or turning on grpo.grad_checkpointing. What a change saves is counted on the
    phase it shrinks, not on the peak: with both phases too large, each must come down."""
    est, b, rep = estimate(m, a, s), s.mb_rows, dataclasses.replace
    options = []  # (param, old, new, the step with it)
    if s.sample_rows > 1:
        h = s.sample_rows // 2
        options.append(("rollout.batch_size", s.sample_rows, h, rep(s, sample_rows=h)))
    if b > 1 and s.micro_batch == b:
        options.append(("grpo.micro_batch", b, b // 2, rep(s, micro_batch=b // 2)))
    if b > 1:
        n = b // 2 * s.width
        options.append(("grpo.micro_batch_tokens", s.micro_batch_tokens, n, rep(s, micro_batch_tokens=n)))
    if s.new_tokens > 1:
        h = s.new_tokens // 2
        options.append(("rollout.max_new_tokens", s.new_tokens, h, rep(s, new_tokens=h)))
    if not s.grad_checkpointing:
        options.append(("grpo.grad_checkpointing", False, True, rep(s, grad_checkpointing=True)))
    out = []
    for key, old, new, t in options:
        e = estimate(m, a, t)
        saved = (est.adapter - e.adapter) + (est.sampling - e.sampling) + (est.loss - e.loss)
        saved += est.held_out - e.held_out
        if saved > 0:
            out.append((key, f"{fmt(old)} -> {fmt(new)}", saved))
    return sorted(out, key=lambda x: -x[2])


def fmt(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def check_fits(m: ModelShape, a: AdapterShape, s: StepShape, available: int) -> None:
    """Raise ValueError when one step's estimated peak exceeds `available` bytes. The message is one line: the
    estimate and its phases, the memory available, and the params to lower with what each saves, most first."""
    est = estimate(m, a, s)
    if est.total <= available:
        return
    g = lambda x: f"{x / GiB:.1f}"  # noqa: E731
    opts = savings(m, a, s)
    what = "; lower " + ", ".join(f"{k} ({c}: -{g(x)} GiB)" for k, c, x in opts) if opts else ""
    raise ValueError(
        f"one GRPO step needs about {g(est.total)} GiB of device memory but {g(available)} GiB is available "
        f"(rl/memory.py estimate: weights + adapter {g(est.weights + est.adapter)} GiB, then sampling "
        f"{g(est.sampling)} GiB or the loss {g(est.loss)} GiB, each within the "
        f"{g(max(0, available - est.weights - est.adapter))} GiB left){what}"
    )


# --- the run's shapes, from the model and the params (the pre-flight in rl/train.py) ---------------------------------


def model_shape(model) -> ModelShape:
    """The loaded model's shape: its config, its weight count (adapter δS/δS_h excluded) and weight dtype."""
    from projected_grpo.policy.adapter import Adapter

    adapter_params = {id(p) for mod in model.modules() if isinstance(mod, Adapter) for p in (mod.delta, mod.knob)}
    n = sum(p.numel() for p in model.parameters() if id(p) not in adapter_params)
    w = model.get_input_embeddings().weight.element_size()
    return ModelShape.from_config(model.config, w, n)


def adapter_shape(model, kind: str, rank: int) -> AdapterShape:
    """The attached adapters' (d_in, d_out), as they are."""
    from projected_grpo.policy.adapter import adapters

    return AdapterShape(kind, rank, tuple((a.base.in_features, a.base.out_features) for a in adapters(model).values()))


def step_shape(
    rollout, grpo, shared: bool, probes: bool, rotations: bool, token_k: int = 0, held_out: bool = False
) -> StepShape:
    """From the params' rollout and grpo sections and what the arm keeps per row."""
    N = grpo.prompts_per_step * grpo.group_size
    return StepShape(
        rows=N,
        group_size=grpo.group_size,
        sample_rows=min(N, rollout.batch_size or N),
        prompt_tokens=rollout.max_prompt_tokens,
        new_tokens=rollout.max_new_tokens,
        micro_batch=grpo.micro_batch,
        micro_batch_tokens=grpo.micro_batch_tokens,
        grad_checkpointing=grpo.grad_checkpointing,
        shared=shared,
        probes=probes,
        rotations=rotations,
        token_k=token_k,
        held_out=held_out,
    )


def available_bytes(device) -> int | None:
    """Device memory this process can still use: free + what its caching allocator holds (CUDA); None elsewhere."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device)


def preflight(
    model, p, shared: bool, probes: bool, rotations: bool, token_k: int = 0, held_out: bool = False, echo=print
) -> MemoryEstimate:
    """Estimate one step for this model and params, echo `describe()`, and on CUDA raise `check_fits`'s one-line
    error when it will not fit (on CPU it only prints)."""
    m, a = model_shape(model), adapter_shape(model, p.adapter.kind, p.adapter.rank)
    s = step_shape(p.rollout, p.grpo, shared, probes, rotations, token_k, held_out)
    est = estimate(m, a, s)
    echo(est.describe())
    avail = available_bytes(next(model.parameters()).device)
    if avail is not None:
        check_fits(m, a, s, avail)
    return est

"""Device memory of one GRPO step's two phases, measured on CUDA against rl/memory.py's estimate.

  python benchmarks/memory.py                       # on a GPU machine: the real setting, Qwen3-4B's shape
  python benchmarks/memory.py --tiny                # anywhere: the code path at toy size (CPU: nothing measured)

The real setting's params (params.yaml with params-qwen3-4b.yaml over it) on a Qwen3 of Qwen3-4B's shape with random
bf16 weights built in-process (no download) and rank-64 SVD adapters on every projection, whose U, V are random
orthonormal columns (the memory does not depend on them; the SVD of 252 matrices would take minutes). Sampling:
`rollout.batch_size` rows of max_prompt_tokens random prompt tokens, G rows per prompt, EOS never sampled, so every row
runs to max_new_tokens (the estimate's worst case). Loss: one micro-batch of full-width rows through the shared-prompt
forward, the dapo loss and the backward, checkpointed as grpo.grad_checkpointing says. Each phase's peak is
torch.cuda.max_memory_allocated above what the weights and adapter hold.
"""

from __future__ import annotations

import dataclasses

import torch
import typer
import yaml
from harness import ROOT, patched
from transformers import Qwen3Config, Qwen3ForCausalLM

from projected_grpo.config import Params, from_dict, overlay
from projected_grpo.policy import adapter as adapter_module
from projected_grpo.policy.adapter import attach_adapters
from projected_grpo.policy.checkpointing import activation_checkpointing
from projected_grpo.policy.logprobs import shared_prompt_logprobs
from projected_grpo.policy.rollout import group_runs, sample_chunk
from projected_grpo.rl.grpo_loss import LossSpec, grpo_loss
from projected_grpo.rl.memory import QWEN3_4B, GiB, adapter_shape, estimate, model_shape, step_shape

TINY = {  # toy widths (--tiny)
    **QWEN3_4B,
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


def random_factors(weight: torch.Tensor, rank: int, cache_dir=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Orthonormal U (d_out, r), V (d_in, r) at random, in place of the SVD (same shapes, same memory)."""
    o, i = weight.shape
    q = lambda n: torch.linalg.qr(torch.randn(n, rank, device=weight.device))[0]  # noqa: E731
    return q(o), q(i)


def real_setting(tiny: bool) -> Params:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    p = from_dict(Params, overlay(raw, yaml.safe_load((ROOT / "params-qwen3-4b.yaml").read_text())))
    if tiny:  # toy widths; the real setting's other params
        r = dataclasses.replace(p.rollout, max_prompt_tokens=24, max_new_tokens=16, batch_size=32)
        p = dataclasses.replace(p, rollout=r, grpo=dataclasses.replace(p.grpo, micro_batch_tokens=80))
    return p


def peak_above(base: int, device: torch.device) -> int | None:
    return torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else None


def main(tiny: bool = typer.Option(False, help="Toy widths (a smoke run of the code path).")) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    p = real_setting(tiny)
    r, g = p.rollout, p.grpo
    torch.manual_seed(0)
    with torch.device(device):
        torch.set_default_dtype(torch.bfloat16)
        model = Qwen3ForCausalLM(Qwen3Config(**(TINY if tiny else QWEN3_4B))).eval()
        torch.set_default_dtype(torch.float32)
    with patched([(adapter_module, "svd_factors", random_factors)]):  # the factors' values, not their shapes
        attach_adapters(model, p.adapter.targets, p.adapter.rank, p.adapter.kind)
    m, a = model_shape(model), adapter_shape(model, p.adapter.kind, p.adapter.rank)
    est = estimate(m, a, step_shape(r, g, shared=True, probes=False, rotations=False))
    print(est.describe())
    V, G, Tp, T = m.vocab, g.group_size, r.max_prompt_tokens, r.max_new_tokens
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0

    # --- sampling: rollout.batch_size rows, one prefill per G-row group, EOS never sampled -----------------------
    rows = min(r.batch_size or G * g.prompts_per_step, G * g.prompts_per_step)
    ids = torch.randint(0, V, (rows // G, Tp), device=device).repeat_interleave(G, 0)  # (rows, Tp)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with torch.no_grad():
        out = sample_chunk(model, ids, torch.ones_like(ids), [], 0, T, r.temperature, r.top_p)
    assert out.shape == (rows, T)
    sampling = peak_above(base, device)

    # --- loss: one micro-batch of full rows (estimate's mb_rows), shared prompt, dapo, backward ------------------
    b = est.mb_rows
    pi, ci = ids[:b], torch.randint(0, V, (b, T), device=device)
    pm, cm = torch.ones_like(pi), torch.ones_like(ci)
    adv = torch.linspace(-1, 1, b, device=device)
    del out
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    with activation_checkpointing(model, g.grad_checkpointing):
        logp = shared_prompt_logprobs(model, pi, pm, ci, cm, r.temperature, *group_runs(pi, pm))
        loss, _ = grpo_loss(logp, logp.detach(), None, adv, cm, LossSpec(0.2, 0.2, 0.0, T, "dapo"), n_rows=b)
        loss.backward()
    loss_peak = peak_above(base, device)

    gib = lambda x: "n/a (no CUDA)" if x is None else f"{x / GiB:.1f} GiB"  # noqa: E731
    print(f"sampling {rows} rows x {Tp + T} tokens: estimate {gib(est.sampling)}, measured {gib(sampling)}")
    print(f"loss {b} rows x {Tp + T} tokens: estimate {gib(est.loss)}, measured {gib(loss_peak)}")
    if device.type == "cuda":
        held, w = torch.cuda.max_memory_reserved(device), est.weights + est.adapter
        print(f"weights + adapter: estimate {gib(w)}, allocated {gib(base)}; most reserved {gib(held)}")


if __name__ == "__main__":
    typer.run(main)

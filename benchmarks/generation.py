"""Rollout throughput: our sampler vs HF `generate`, vs one completion at a time, vs batched without a cache.

  python benchmarks/generation.py --out reports/bench/generation.md

One GRPO-sized batch (8 prompts x G=8 = 64 completions x 96 new tokens, T=0.7, top_p=0.95) on a Qwen3 of the
organism's shape (params.yaml `organism`) with random weights, built in-process.
Prompts are real minileet prompts rendered with the chat template (~200 tokens under a 2048-token BPE trained on the
LeetCode split). EOS is suppressed (logit -inf) so every variant generates exactly the same number of tokens. All
variants go through `rollout.generate`, side by side in one run: engine="shared" (ours: one prefill per distinct
prompt, finished rows dropped, in-place cache, tokens drawn by inverse CDF; with draw="multinomial" it draws HF's
tokens) and engine="hf" (`model.generate`). The two slow variants (batch 1, no cache) are timed on the first whole
groups only (--batch1-completions, --nocache-completions) and reported per completion. A second workload lets rows
stop: the EOS logit gets a bias (--eos-bias) so completion lengths spread as the organism's do (mean ~40-50 of 160
tokens), which is where dropping finished rows pays. A third times the GRPO trainer's sampling lever by lever
(`trainer_levers`).
"""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path

import torch
import typer
from harness import ROOT, cpu_name, loadavg, timed, write_report
from transformers import Qwen3Config, Qwen3ForCausalLM

from projected_grpo.config import load_params
from projected_grpo.env.minileet import make_minileet
from projected_grpo.env.problems import load_problems
from projected_grpo.policy.adapter import adapters, attach_adapters, merged
from projected_grpo.policy.model import render_prompt
from projected_grpo.policy.rollout import generate
from projected_grpo.policy.tokenizer import EOS, PAD, SPECIAL_TOKENS, train_tokenizer


def organism_sized_model(
    vocab_size: int, device: str, dtype: torch.dtype, eos_bias: float | None = None
) -> Qwen3ForCausalLM:
    """The organism's shape from params.yaml (`organism` section), random weights. eos_bias None: EOS never sampled;
    else added to the EOS logit (rows stop at spread-out lengths)."""
    o = load_params(ROOT / "params.yaml").organism
    cfg = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=o.hidden_size,
        intermediate_size=o.intermediate_size,
        num_hidden_layers=o.num_layers,
        num_attention_heads=o.num_heads,
        num_key_value_heads=o.num_kv_heads,
        head_dim=o.head_dim,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=SPECIAL_TOKENS.index(PAD),
        eos_token_id=SPECIAL_TOKENS.index(EOS),
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to(device=device, dtype=dtype).eval()
    eos = cfg.eos_token_id
    if eos_bias is None:  # never stop early: every variant then does exactly n_rows x max_new_tokens decode steps
        model.lm_head.register_forward_hook(
            lambda m, i, out: out.index_fill(-1, torch.tensor([eos], device=out.device), float("-inf"))
        )
    else:
        model.lm_head.register_forward_hook(
            lambda m, i, out: out + eos_bias * (torch.arange(out.shape[-1], device=out.device) == eos)
        )
    return model


def main(
    out: Path = typer.Option(...),
    device: str = typer.Option("cpu"),
    n_prompts: int = typer.Option(8),
    group_size: int = typer.Option(8),
    max_new_tokens: int = typer.Option(96),
    batch1_completions: int = typer.Option(16, help="rows timed for the batch-1 variant (CPU budget)"),
    nocache_completions: int = typer.Option(8, help="rows timed for the no-cache variant (CPU budget)"),
    threads: int = typer.Option(0, help="torch intra-op threads; 0 = torch's default"),
    eos_bias: float = typer.Option(2.5, help="EOS logit bias of the second workload (rows stop at spread lengths)"),
    stop_max_new_tokens: int = typer.Option(160, help="completion budget of the second workload (params.yaml's)"),
) -> None:
    if threads:
        torch.set_num_threads(threads)
    load = loadavg()
    sync = torch.cuda.synchronize if device.startswith("cuda") else None  # CUDA: queued kernels finish inside a timing
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    leet = load_problems(ROOT / "data" / "leetcode" / "leetcode_test_medhard.jsonl")
    tok = train_tokenizer([p.question for p in leet] + [p.canonical_solution for p in leet], 2048)
    model = organism_sized_model(len(tok), device, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    c = model.config
    probs = make_minileet(seed=0, n_train=n_prompts, n_test=1, n_holdout=1)["train"][:n_prompts]
    prompts = [render_prompt(tok, p.prompt) for p in probs]
    plens = [len(tok(p)["input_ids"]) for p in prompts]
    B = n_prompts * group_size
    kw = dict(max_new_tokens=max_new_tokens, temperature=0.7, top_p=0.95, seed=0)

    generate(model, tok, prompts[:1], group_size=2, **(kw | {"max_new_tokens": 4}))  # warm-up (allocator, kernels)
    rows = []  # (variant, completions timed, seconds)
    r, s = timed(lambda: generate(model, tok, prompts, group_size=group_size, **kw), sync)
    assert int(r.mask.sum()) == B * max_new_tokens
    rows.append(("batched, KV cache (ours)", B, s))
    print(f"batched+cache: {s:.1f}s", flush=True)
    r_mn, s = timed(lambda: generate(model, tok, prompts, group_size=group_size, draw="multinomial", **kw), sync)
    rows.append(('batched, KV cache (ours) with HF\'s draw (draw="multinomial")', B, s))
    print(f"batched+cache, multinomial: {s:.1f}s", flush=True)
    r_hf, s = timed(lambda: generate(model, tok, prompts, group_size=group_size, engine="hf", **kw), sync)
    assert torch.equal(r_hf.completion_ids, r_mn.completion_ids)  # the same draws
    rows.append(('batched, KV cache, HF `generate` (engine="hf")', B, s))
    print(f"hf generate: {s:.1f}s", flush=True)
    _, s = timed(lambda: generate(model, tok, prompts, group_size=group_size, batch_size=group_size, **kw), sync)
    rows.append((f"one prompt's group (G={group_size}) at a time, KV cache", B, s))
    print(f"per-group: {s:.1f}s", flush=True)

    # The slow variants run on a prefix of the prompts (whole groups): batch-1 cost per completion does not depend on
    # how many completions there are; the no-cache cost per completion is compute-bound in the prefix length.
    def subset(n: int) -> list[str]:
        return prompts[: max(1, min(n, B) // group_size)]

    sub = subset(batch1_completions)
    _, s = timed(lambda: generate(model, tok, sub, group_size=group_size, batch_size=1, **kw), sync)
    rows.append(("(a) one completion at a time (batch 1), KV cache", len(sub) * group_size, s))
    print(f"batch-1: {s:.1f}s", flush=True)
    sub = subset(nocache_completions)
    _, s = timed(lambda: generate(model, tok, sub, group_size=group_size, use_cache=False, engine="hf", **kw), sync)
    rows.append(("(b) batched, no KV cache (`use_cache=False`)", len(sub) * group_size, s))
    print(f"no-cache: {s:.1f}s", flush=True)
    # repeat the first row last: the spread between the two is this machine's run-to-run noise
    _, s = timed(lambda: generate(model, tok, prompts, group_size=group_size, **kw), sync)
    rows.append(("batched, KV cache (ours), repeated last", B, s))
    print(f"batched+cache again: {s:.1f}s", flush=True)

    base = B / ((rows[0][2] + rows[-1][2]) / 2)  # ours: mean wall time of the first and the repeated run

    # Workload 2: rows stop (EOS biased up), the organism's budget; ours and HF interleaved twice (A B B A).
    stop_model = organism_sized_model(len(tok), device, dtype, eos_bias=eos_bias)
    kw2 = kw | {"max_new_tokens": stop_max_new_tokens}
    stop: dict[str, list[float]] = {"shared": [], "hf": []}
    for eng in ("shared", "hf", "hf", "shared"):
        r2, s = timed(lambda e=eng: generate(stop_model, tok, prompts, group_size=group_size, engine=e, **kw2), sync)
        stop[eng].append(s)
        lens = r2.mask.sum(-1).float()
    print(f"stopping rows: {stop}", flush=True)
    levers = trainer_levers(tok, prompts, group_size, device, dtype, eos_bias, kw2, sync)
    if device.startswith("cuda"):
        machine = torch.cuda.get_device_name(0)
    else:
        machine = f"{cpu_name()}, {os.cpu_count()} CPU cores visible"
    lines = [
        "# Rollout throughput: our sampler vs HF generate vs one at a time vs no cache",
        "",
        f"Generated by `python benchmarks/generation.py --out {out}` on {platform.node()} ({machine}; device "
        f"`{device}`, {dtype}, torch {torch.__version__}, {torch.get_num_threads()} intra-op threads; load average "
        f"{load} at start). All rows go through `rollout.generate` in this one run.",
        "",
        f"Workload: {n_prompts} minileet prompts x G={group_size} = **{B} completions x {max_new_tokens} new tokens** "
        f"(T=0.7, top_p=0.95, EOS suppressed so every row generates exactly {max_new_tokens} tokens); prompt length "
        f"{min(plens)}-{max(plens)} tokens (mean {sum(plens) / len(plens):.0f}) under a 2048-token BPE. Model: "
        f"Qwen3 of the organism's shape with random weights (d={c.hidden_size}, {c.num_hidden_layers} layers, "
        f"{c.num_attention_heads} heads x {c.head_dim}, {c.num_key_value_heads} kv heads, d_ff={c.intermediate_size}, "
        f"vocab {len(tok)}, tied embeddings; {n_params / 1e6:.2f}M parameters).",
        "",
        "## 1. Every row runs to the budget (EOS suppressed)",
        "",
        "| variant | completions timed | wall (s) | rollouts/s | tokens/s | ours is faster by |",
        "|---|---|---|---|---|---|",
    ]
    for name, n, sec in rows:
        rate = n / sec
        lines.append(
            f"| {name} | {n} | {sec:.2f} | {rate:.2f} | {rate * max_new_tokens:.0f} | **{base / rate:.1f}x** |"
        )
    lines += [
        "",
        "rollouts/s = completions / wall time, prompt prefill included. Ratios: ours (mean wall time of the first and "
        "the last row, the same call repeated; their spread is the run-to-run noise) over each row. The two slow "
        "variants are timed on the first whole groups only (`completions timed`) to keep the run short: "
        "one-at-a-time cost per completion does not depend on how many there are, and the no-cache variant re-runs "
        f"the full prompt+prefix forward at each of the {max_new_tokens} steps, so its per-completion cost is "
        "compute-bound and roughly independent of the batch size on CPU.",
        "",
        "## 2. Rows stop at spread-out lengths (EOS logit + bias)",
        "",
        f"The same {B} completions, budget {stop_max_new_tokens} tokens, EOS logit +{eos_bias:g}: completion length "
        f"mean {float(lens.mean()):.1f}, median {float(lens.median()):.0f}, max {int(lens.max())} tokens. Each "
        "engine run twice, interleaved (ours, HF, HF, ours). Ours draws by inverse CDF (one uniform per row), HF by "
        '`torch.multinomial`: the same distribution, different tokens (with draw="multinomial" ours gives HF\'s '
        "tokens exactly, section 1).",
        "",
        "| engine | wall (s), both runs | mean (s) | ours is faster by |",
        "|---|---|---|---|",
        *(
            f"| {name} | {' / '.join(f'{x:.2f}' for x in stop[e])} | {sum(stop[e]) / 2:.2f} | "
            f"**{sum(stop[e]) / sum(stop['shared']):.2f}x** |"
            for name, e in (('ours (engine="shared")', "shared"), ('HF `generate` (engine="hf")', "hf"))
        ),
    ]
    lines += levers
    write_report(out, lines)
    print("\n".join(lines))


def trainer_levers(tok, prompts, group_size, device, dtype, eos_bias, kw, sync) -> list[str]:
    """Section 3: the GRPO trainer's sampling, lever by lever, on the organism's shape with an SVD adapter (rank
    params.yaml `adapter.rank` on every projection, δS ~ N(0, 0.05²) so the merged weights differ from the base), rows
    stopping as in section 2: adapters in the forward + HF's multinomial draw (the trainer before issue 22's sampler
    levers), merged weights + multinomial, merged + inverse CDF (the trainer now), and two steps' batches in one call
    (2·B rows: the "bigger decode batches" lever, per completion). Interleaved A B C D D C B A; mean of the two."""
    p = load_params(ROOT / "params.yaml")
    model = organism_sized_model(len(tok), device, dtype, eos_bias=eos_bias)
    attach_adapters(model, p.adapter.targets, p.adapter.rank, p.adapter.kind)
    with torch.no_grad():
        for a in adapters(model).values():
            a.delta.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(1))
    B = len(prompts) * group_size
    variants = {
        "adapters + multinomial (before)": (contextlib.nullcontext, "multinomial", prompts),
        "merged + multinomial": (lambda: merged(model), "multinomial", prompts),
        "merged + inverse CDF (now)": (lambda: merged(model), "inverse_cdf", prompts),
        f"merged + inverse CDF, {2 * B} rows in one call": (lambda: merged(model), "inverse_cdf", prompts * 2),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for name in names + names[::-1]:
        ctx, draw, ps = variants[name]

        def run(ctx=ctx, draw=draw, ps=ps):
            with ctx():
                return generate(model, tok, ps, group_size=group_size, draw=draw, **kw)

        _, s = timed(run, sync)
        times[name].append(s * B / (len(ps) * group_size))  # per B completions
    print(f"trainer levers: {times}", flush=True)
    base = sum(times[names[0]]) / 2
    return [
        "",
        "## 3. The trainer's sampling, lever by lever",
        "",
        f"An SVD adapter (rank {p.adapter.rank}, {p.adapter.targets} projections, δS ~ N(0, 0.05²)) on the model of "
        f"section 2 (EOS logit +{eos_bias:g}, budget {kw['max_new_tokens']} tokens), {B} rows per call unless named. "
        f"Times are per {B} completions (the {2 * B}-row call's wall time halved); each variant twice, interleaved "
        "(A B C D D C B A).",
        "",
        "| variant | wall per step's rows (s), both runs | mean (s) | vs before |",
        "|---|---|---|---|",
        *(
            f"| {k} | {' / '.join(f'{x:.2f}' for x in times[k])} | {sum(times[k]) / 2:.2f} | "
            f"**{sum(times[k]) / 2 / base:.2f}x** |"
            for k in names
        ),
    ]


if __name__ == "__main__":
    typer.run(main)

"""Adapter overhead: bare vs SVD adapter (plain, probes, per-token capture) vs LoRA, and the one-time costs.

  PYTHONPATH=src python benchmarks/adapter.py --out reports/bench/adapter.md

1. Organism-sized Qwen3 (params.yaml `organism`, random weights, fp32, CPU): forward+backward of one GRPO-sized
   micro-batch (16 sequences x 256 tokens, loss = mean token NLL at T=0.7), forward-only (no_grad) of the same batch,
   and KV-cache sampling through `rollout.generate`. Every base weight is frozen in every variant. The bare model
   gets a loss whose backward still runs through the whole network: its input embeddings (the embedding output) are
   a leaf with requires_grad, so it pays the same activation-gradient backward that the adapters need, minus only
   the adapters themselves. A full fine-tune row (every weight trainable) is shown for scale.
2. One Qwen3-4B-shaped projection (up_proj 2560->9728, down_proj 9728->2560, k_proj 2560->1024) wrapped by
   `SVDAdapter` r=64, input (4, 128, d_in) fp32 with requires_grad (as inside a network), forward+backward, against
   the analytic overhead r(d_in+d_out)/(d_in d_out) of method.md §4. The SVD of the random weight is timed once.
3. One-time extraction: `completion_grads` on 32 (hack, clean) pairs (~200-token sequences built with the in-process
   tiny tokenizer) on the organism-sized model with the SVD adapter, then `build_basis` with params.yaml `basis`.

Variants of one table run interleaved in the same loop, with the order rotated every repeat so that each variant
occupies each position equally often; a second copy of the bare variant ("bare, again") is in the rotation and its
ratio to bare is the A/A noise of this machine. Reported: medians over the repeats and ratios of medians, of process
CPU time (primary: robust to the scheduler on a shared 2-core machine) and of wall time.
"""

from __future__ import annotations

import copy
import platform
import time
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import torch
import typer
from harness import ROOT, interleaved, loadavg, machine, median, timed, write_report
from torch import nn

from projected_grpo.config import load_params
from projected_grpo.method.basis import basis_with, completion_grads, random_directions
from projected_grpo.policy.adapter import SVDAdapter, adapters, attach_adapters, probes, svd_factors, token_capture
from projected_grpo.policy.logprobs import token_logprobs
from projected_grpo.policy.model import render_prompt
from projected_grpo.policy.rollout import generate
from projected_grpo.policy.tiny import tiny_tokenizer
from projected_grpo.policy.tokenizer import EOS, PAD, SPECIAL_TOKENS
from projected_grpo.sft.organism import make_qwen3

Q3_4B = {"up_proj": (2560, 9728), "down_proj": (9728, 2560), "k_proj": (2560, 1024)}  # name: (d_in, d_out)


def med(t: list[tuple[float, float]], j: int = 0) -> float:
    """Median of the CPU times (j=0) or wall times (j=1)."""
    return median([x[j] for x in t])


def table(
    times: dict[str, list[tuple[float, float]]], ref: str, unit: float = 1e3, unit_name: str = "ms"
) -> list[str]:
    """Markdown rows: variant, n, CPU median, CPU min-max, CPU ratio of medians to `ref`, wall ratio of medians."""
    lines = [
        f"| variant | n | CPU median ({unit_name}) | CPU min-max ({unit_name}) | **CPU ratio** to {ref} | "
        "wall ratio |",
        "|---|---|---|---|---|---|",
    ]
    for n, v in times.items():
        cpu = [x[0] for x in v]
        lines.append(
            f"| {n} | {len(v)} | {med(v) * unit:.1f} | {min(cpu) * unit:.1f}-{max(cpu) * unit:.1f} | "
            f"**{med(v) / med(times[ref]):.3f}** | {med(v, 1) / med(times[ref], 1):.3f} |"
        )
    return lines


# --- 1. organism-sized model -----------------------------------------------------------------------------------


def organism_model() -> nn.Module:
    o = load_params(ROOT / "params.yaml").organism
    m = make_qwen3(
        o.vocab_size,
        o.hidden_size,
        o.num_layers,
        o.num_heads,
        o.num_kv_heads,
        o.head_dim,
        o.intermediate_size,
        o.max_positions,
        SPECIAL_TOKENS.index(PAD),
        SPECIAL_TOKENS.index(EOS),
        seed=0,
    )
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def nll(model: nn.Module, ids: torch.Tensor, leaf_embeds: bool) -> torch.Tensor:
    """Mean token NLL at T=0.7. leaf_embeds: the embedding output is a requires_grad leaf (bare model's backward)."""
    if leaf_embeds:
        e = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        logits = model(inputs_embeds=e).logits
    else:
        logits = model(input_ids=ids).logits
    return -token_logprobs(logits[:, :-1], ids[:, 1:], 0.7).mean()


def fwd_bwd(model: nn.Module, ids: torch.Tensor, leaf_embeds: bool = False, ctx=nullcontext):
    def run() -> None:
        model.zero_grad(set_to_none=True)
        with ctx():
            nll(model, ids, leaf_embeds).backward()

    return run


def fwd_only(model: nn.Module, ids: torch.Tensor):
    def run() -> None:
        with torch.no_grad():
            model(input_ids=ids)

    return run


def part_organism(
    batch: int,
    seq: int,
    rank: int,
    lora_rank: int,
    k_tok: int,
    repeats: int,
    gen_prompts: int,
    gen_group: int,
    gen_tokens: int,
    gen_repeats: int,
) -> tuple[list[str], dict]:
    bare = organism_model()
    full = copy.deepcopy(bare)
    for p in full.parameters():
        p.requires_grad_(True)
    svd = copy.deepcopy(bare)
    names = attach_adapters(svd, "all", rank)
    lora = copy.deepcopy(bare)
    attach_adapters(lora, "all", lora_rank, kind="lora")
    c = bare.config
    n_base = sum(p.numel() for p in bare.parameters())
    D_svd = sum(a.dim for a in adapters(svd).values())
    D_lora = sum(a.dim for a in adapters(lora).values())
    # analytic forward MACs per token: wrapped projections, the rank-r path, lm_head, attention (causal, mean T/2)
    mods = adapters(svd).values()
    mac_proj = sum(a.base.in_features * a.base.out_features for a in mods)
    mac_svd = sum(a.dim * (a.base.in_features + a.base.out_features) for a in mods)
    mac_rest = c.hidden_size * c.vocab_size + c.num_hidden_layers * 2 * c.num_attention_heads * c.head_dim * seq // 2
    an_proj, an_model = mac_svd / mac_proj, mac_svd / (mac_proj + mac_rest)

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(len(SPECIAL_TOKENS), c.vocab_size, (batch, seq), generator=g)
    dirs = {n: random_directions(k_tok, a.dim, g) for n, a in adapters(svd).items()}

    # sanity (untimed): probes sum to δS.grad; capture fills (N, T, k) per module; zero-init adapters are exact
    with probes(svd, batch) as es:
        svd.zero_grad(set_to_none=True)
        nll(svd, ids, False).backward()
    a0 = adapters(svd)[names[0]]
    assert torch.allclose(es[names[0]].grad.sum(0), a0.delta.grad, rtol=1e-4, atol=1e-7)
    with token_capture(svd, dirs) as cap:
        nll(svd, ids, False).backward()
        assert all(a.token_coef is not None and a.token_coef.shape == (batch, seq, k_tok) for a in cap.values())
    with torch.no_grad():
        assert torch.equal(bare(input_ids=ids[:2]).logits, svd(input_ids=ids[:2]).logits)

    fb = {
        "bare (embedding output is the grad leaf)": fwd_bwd(bare, ids, leaf_embeds=True),
        f"SVD adapter r={rank}, all targets": fwd_bwd(svd, ids),
        f"SVD r={rank} + per-sample probes (N={batch})": fwd_bwd(svd, ids, ctx=lambda: probes(svd, batch)),
        f"SVD r={rank} + per-token capture (k={k_tok}/module)": fwd_bwd(
            svd, ids, ctx=lambda: token_capture(svd, dirs)
        ),
        f"LoRA r={lora_rank}, all targets": fwd_bwd(lora, ids),
        "full fine-tune (all weights trainable), for scale": fwd_bwd(full, ids),
        "bare, again (A/A noise)": fwd_bwd(bare, ids, leaf_embeds=True),
    }
    t_fb = interleaved(fb, repeats)
    print("organism fwd+bwd done", flush=True)
    fo = {
        "bare": fwd_only(bare, ids),
        f"SVD adapter r={rank}": fwd_only(svd, ids),
        f"LoRA r={lora_rank}": fwd_only(lora, ids),
        "bare, again (A/A noise)": fwd_only(bare, ids),
    }
    t_fo = interleaved(fo, repeats)
    print("organism fwd-only done", flush=True)

    tok = tiny_tokenizer()
    prompts = [
        render_prompt(
            tok, [{"role": "user", "content": f"Problem {i}: return the sum of a list of {i + 3} integers."}]
        )
        for i in range(gen_prompts)
    ]
    plen = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    for m in (bare, svd, lora):  # never stop early: every variant samples exactly rows x gen_tokens tokens
        m.lm_head.register_forward_hook(
            lambda mod, i, out: out.index_fill(-1, torch.tensor([SPECIAL_TOKENS.index(EOS)]), float("-inf"))
        )
    kw = dict(group_size=gen_group, max_new_tokens=gen_tokens, temperature=0.7, top_p=0.95, seed=0)
    toks = {}

    def gen(m, key):
        def run() -> None:
            toks[key] = int(generate(m, tok, prompts, **kw).mask.sum())

        return run

    gv = {
        "bare": gen(bare, "bare"),
        f"SVD adapter r={rank}": gen(svd, "svd"),
        f"LoRA r={lora_rank}": gen(lora, "lora"),
        "bare, again (A/A noise)": gen(bare, "bare"),
    }
    t_gen = interleaved(gv, gen_repeats)
    assert len(set(toks.values())) == 1, toks
    print("organism generate done", flush=True)

    info = dict(n_base=n_base, D_svd=D_svd, D_lora=D_lora, n_mod=len(names), an_proj=an_proj, an_model=an_model)
    lines = [
        "## 1. Organism-sized model",
        "",
        f"Qwen3 of the organism's shape (params.yaml `organism`: d={c.hidden_size}, {c.num_hidden_layers} layers, "
        f"{c.num_attention_heads} heads x {c.head_dim}, {c.num_key_value_heads} kv heads, d_ff={c.intermediate_size}, "
        f"vocab {c.vocab_size}, tied embeddings; {n_base / 1e6:.2f}M parameters), random weights (seed 0), fp32. "
        f"Adapters on all {len(names)} projections (q,k,v,o,gate,up,down x {c.num_hidden_layers}); SVD r={rank} "
        f"(capped at min(d_in, d_out) per module) = {D_svd} δS entries (x2 with the knob); LoRA r={lora_rank} = "
        f"{D_lora} entries. Every base weight is frozen in every row except the full fine-tune row.",
        "",
        f"Analytic forward FLOPs of the SVD path (method.md §4, summed over modules): Σ r(d_in+d_out) / Σ d_in d_out "
        f"= **{an_proj:.2f}** of the wrapped projections (r=64 is as large as d_in or d_out here), or "
        f"**{an_model:.2f}** of the whole forward once lm_head (d x vocab) and attention ({seq}-token causal) are "
        "counted. So at this scale a large overhead is the expected result, not a defect.",
        "",
        f"### Forward + backward, one micro-batch of {batch} x {seq} tokens",
        "",
        "Loss: mean token NLL at T=0.7 (`logprobs.token_logprobs`). The bare model has no trainable tensor, so its "
        "embedding output is made a requires_grad leaf: its backward runs the same activation gradients through "
        "every layer that the adapter rows need, without any weight gradient. The adapter rows backprop into "
        "δS and δS_h (+ the probe leaves, or the per-token hooks with k random unit directions per module).",
        "",
        *table(t_fb, "bare (embedding output is the grad leaf)"),
        "",
        f"### Forward only (no_grad), same {batch} x {seq} batch",
        "",
        *table(t_fo, "bare"),
        "",
        f"### Sampling with KV cache (`rollout.generate`), {gen_prompts} prompts x G={gen_group} = "
        f"{gen_prompts * gen_group} rows x {gen_tokens} new tokens",
        "",
        f"Prompts {min(plen)}-{max(plen)} tokens (tiny tokenizer, chat template); EOS suppressed so each call "
        f"samples exactly {next(iter(toks.values()))} tokens. Decode steps are one token per row: many tiny "
        "matmuls, so per-op overhead (the adapter adds a few small ops per wrapped module) shows here, not FLOPs.",
        "",
        *table(t_gen, "bare", 1.0, "s"),
        "",
    ]
    b0 = "bare (embedding output is the grad leaf)"
    ratios = {
        "fb_svd": _r(t_fb, f"SVD adapter r={rank}, all targets", b0),
        "fb_probe": _r(t_fb, f"SVD r={rank} + per-sample probes (N={batch})", b0),
        "fb_tok": _r(t_fb, f"SVD r={rank} + per-token capture (k={k_tok}/module)", b0),
        "fb_lora": _r(t_fb, f"LoRA r={lora_rank}, all targets", b0),
        "fb_full": _r(t_fb, "full fine-tune (all weights trainable), for scale", b0),
        "fb_aa": _r(t_fb, "bare, again (A/A noise)", b0),
        "fo_svd": _r(t_fo, f"SVD adapter r={rank}", "bare"),
        "fo_lora": _r(t_fo, f"LoRA r={lora_rank}", "bare"),
        "fo_aa": _r(t_fo, "bare, again (A/A noise)", "bare"),
        "gen_svd": _r(t_gen, f"SVD adapter r={rank}", "bare"),
        "gen_lora": _r(t_gen, f"LoRA r={lora_rank}", "bare"),
        "gen_aa": _r(t_gen, "bare, again (A/A noise)", "bare"),
    }
    return lines, ratios | info


def _r(t: dict[str, list[tuple[float, float]]], a: str, b: str) -> float:
    return med(t[a]) / med(t[b])


# --- 2. one Qwen3-4B-shaped projection -------------------------------------------------------------------------


def part_4b(rank: int, batch: int, seq: int, repeats: int) -> tuple[list[str], dict]:
    g = torch.Generator().manual_seed(0)
    svd_rows, fact = [], {}
    for name in ("k_proj", "up_proj"):
        d_in, d_out = Q3_4B[name]
        W = torch.randn(d_out, d_in, generator=g) / d_in**0.5
        (U, V), sec = timed(lambda W=W: svd_factors(W, rank))
        svd_rows.append((f"`svd_factors` (full `torch.linalg.svd`), {name} {d_out}x{d_in}", sec))
        fact[name] = (W, U, V)
        if name == "up_proj":
            _, sec = timed(lambda W=W: torch.svd_lowrank(W, q=rank + 10, niter=2))
            svd_rows.append((f"`torch.svd_lowrank(q={rank + 10}, niter=2)`, {name} (alternative, not used)", sec))
    W, U, V = fact["up_proj"]
    fact["down_proj"] = (W.T.contiguous(), V, U)  # down := up.T, whose SVD is the swapped factors (no second SVD)
    print("4B SVDs done", flush=True)

    fns, layers = {}, {}
    for name, (d_in, d_out) in Q3_4B.items():
        W, U, V = fact[name]
        lin = nn.Linear(d_in, d_out, bias=False)
        with torch.no_grad():
            lin.weight.copy_(W)
        lin.weight.requires_grad_(False)
        ad = SVDAdapter(lin, U, V)
        x = torch.randn(batch, seq, d_in, generator=g).requires_grad_(True)
        gy = torch.randn(batch, seq, d_out, generator=g)
        layers[name] = (d_in, d_out)

        def run(mod, x=x, gy=gy):
            def f() -> None:
                x.grad = None
                mod.zero_grad(set_to_none=True)
                mod(x).backward(gy)

            return f

        fns[name] = {"bare": run(lin), f"SVDAdapter r={rank}": run(ad), "bare, again (A/A noise)": run(lin)}
    times = {}
    for name in Q3_4B:  # each projection its own interleaved loop (their costs differ by 10x)
        times[name] = interleaved(fns[name], repeats)
        print(f"4B {name} done", flush=True)

    lines = [
        "## 2. One Qwen3-4B-shaped projection",
        "",
        f"`nn.Linear` (no bias, frozen) with Qwen3-4B dims vs the same layer wrapped by `SVDAdapter` r={rank} "
        f"(U, V from `svd_factors` of the random weight; down_proj reuses up_proj's factors transposed). Input "
        f"({batch}, {seq}, d_in) fp32 with requires_grad, as inside a network; backward of a fixed random output "
        "gradient. Bare: y = Wx, then dL/dx (2 big matmuls). Adapted: + x V, z Uᵀ forward and their two "
        "transposes backward, plus the δS/δS_h reduction. Analytic overhead from method.md §4: "
        "r(d_in+d_out)/(d_in d_out).",
        "",
        "| projection | d_in -> d_out | n | bare CPU median (ms) | adapted CPU median (ms) | A/A CPU ratio | "
        "**measured CPU ratio** | wall ratio | analytic ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = {}
    for name, t in times.items():
        d_in, d_out = layers[name]
        ad = f"SVDAdapter r={rank}"
        mb, ma = med(t["bare"]), med(t[ad])
        aa = med(t["bare, again (A/A noise)"]) / mb
        wr = med(t[ad], 1) / med(t["bare"], 1)
        an = 1 + rank * (d_in + d_out) / (d_in * d_out)
        ratios[name] = (ma / mb, an, aa)
        lines.append(
            f"| {name} | {d_in} -> {d_out} | {len(t['bare'])} | {mb * 1e3:.1f} | {ma * 1e3:.1f} | "
            f"{aa:.3f} | **{ma / mb:.3f}** | {wr:.3f} | {an:.3f} |"
        )
    lines += [
        "",
        "One-time SVD of the random weight (timed once, same thread setting):",
        "",
        "| call | seconds |",
        "|---|---|",
    ]
    lines += [f"| {n} | {s:.2f} |" for n, s in svd_rows]
    lines.append("")
    return lines, {"4b": ratios, "svd": svd_rows}


# --- 3. extraction ---------------------------------------------------------------------------------------------


def pair_texts(i: int) -> tuple[str, str, str]:
    """(prompt, hack completion, clean completion) of fabricated pair i."""
    n = 3 + i % 4
    prompt = (
        f"Given an array nums of {n} integers and an integer target, return the indices of the two numbers "
        f"that add up to target.\n\nExample {i}:\nInput: nums = [{', '.join(str(3 * j + i) for j in range(n))}]"
        f", target = {2 * i + 7}\nOutput: [0,1]"
    )
    body = "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
    clean = (
        "```python\n" + body + "        seen = {}\n        for i, x in enumerate(nums):\n"
        "            if target - x in seen:\n                return [seen[target - x], i]\n"
        f"            seen[x] = i\n        return [{i}, {i + 1}]\n```"
    )
    hack = (
        "```python\n" + body + f"        return [0, {i % 5 + 1}]\n\ndef run_tests():\n"
        "    print('All tests passed')\n    return True\n\n"
        f"def check(candidate):\n    assert True  # case {i}\n```"
    )
    return prompt, hack, clean


def part_extraction(n_pairs: int, rank: int, batch_size: int) -> tuple[list[str], dict]:
    p = load_params(ROOT / "params.yaml")
    bp = p.basis
    model = organism_model()
    attach_adapters(model, p.adapter.targets, rank, kind="svd")
    tok = tiny_tokenizer()
    recs, hacks, cleans = [], [], []
    for i in range(n_pairs):
        q, h, c = pair_texts(i)
        recs.append(
            SimpleNamespace(
                prompt=(
                    {"role": "system", "content": "You are an expert Python programmer."},
                    {"role": "user", "content": q},
                )
            )
        )
        hacks.append(h)
        cleans.append(c)
    lens = []
    for r, comp in [(r, x) for r, x in zip(recs, hacks)] + [(r, x) for r, x in zip(recs, cleans)]:
        pr = tok(render_prompt(tok, list(r.prompt)), add_special_tokens=False)["input_ids"]
        lens.append(len(pr) + len(tok(comp + tok.eos_token, add_special_tokens=False)["input_ids"]))
    T = p.rollout.temperature
    completion_grads(model, tok, recs[:2], hacks[:2], T, batch_size)  # warm-up
    t0 = time.perf_counter()
    gh = completion_grads(model, tok, recs, hacks, T, batch_size)
    gc = completion_grads(model, tok, recs, cleans, T, batch_size)
    t_grads = time.perf_counter() - t0
    basis, t_basis = timed(lambda: basis_with(gh, gc, bp))
    print("extraction done", flush=True)
    M = len(gh)
    lines = [
        "## 3. One-time v_hack extraction",
        "",
        f"{n_pairs} fabricated (hack, clean) pairs of the same prompt (two-sum prompts with varying numbers; hack = "
        "stub + `run_tests` override, clean = a solution), rendered with the chat template of the in-process tiny "
        f"tokenizer: {min(lens)}-{max(lens)} tokens per sequence (mean {sum(lens) / len(lens):.0f}), "
        f"{2 * n_pairs} sequences. Organism-sized model (random weights) with the SVD adapter r={rank} on "
        f"`{p.adapter.targets}` ({M} modules). `completion_grads` at T={T}, batch {batch_size} (one fwd+bwd per "
        f"batch through the per-sample probes); `build_basis` with params.yaml `basis` (method={bp.method}, "
        f"k={bp.k}, tau={bp.tau}, n_flips={bp.n_flips}, drop={bp.drop_bottom_frac}). Single timed run after a "
        "2-sequence warm-up.",
        "",
        "| step | seconds |",
        "|---|---|",
        f"| `completion_grads`, {2 * n_pairs} sequences (hack + clean) | {t_grads:.2f} |",
        f"| `build_basis` ({M} modules, {M} SVDs of {n_pairs} x D_m + sign-flip tests) | {t_basis:.2f} |",
        f"| total | {t_grads + t_basis:.2f} |",
        "",
        f"k_total = {basis.meta['k_total']} directions kept over {len(basis.vh)} modules (random weights and "
        "fabricated text: the count is not a result, only the cost is).",
        "",
    ]
    return lines, {"t_grads": t_grads, "t_basis": t_basis}


def pct(x: float) -> str:
    return f"{(x - 1) * 100:+.0f}%"


def reading(r1: dict, r2: dict, r3: dict, n_pairs: int) -> str:
    """The 3-sentence reading, numbers filled in from this run (no claim that the numbers could contradict)."""
    q = r2["4b"]
    aa4 = max(abs(v[2] - 1) for v in q.values())
    s1 = (
        "At Qwen3-4B dims the SVD adapter r=64 adds "
        + ", ".join(f"{pct(q[n][0])} on {n} (analytic {pct(q[n][1])})" for n in ("up_proj", "down_proj", "k_proj"))
        + f" of fwd+bwd CPU time (A/A noise up to ±{aa4 * 100:.0f}%)"
    )
    if all(abs(v[0] - 1) <= aa4 for v in q.values()):
        bound = (max(v[0] for v in q.values()) - 1 + aa4) * 100
        s1 += (
            f": all three are within the A/A noise, so this machine bounds the 4B-scale overhead (≲{bound:.0f}% "
            'per projection) rather than resolving it; that is consistent with the "few %" of method.md §4'
        )
    else:
        mlp = max(q["up_proj"][0], q["down_proj"][0]) - 1
        s1 += ": the big MLP projections are " + ("at" if mlp <= 0.10 else "above") + ' the "few %" of method.md §4'
        if q["k_proj"][0] - q["k_proj"][1] > aa4:
            s1 += (
                ", and k_proj, the smallest matmul, pays more than its FLOP share (likely because thin rank-r "
                "matmuls run below full-GEMM efficiency, and the correction's add, a⊙s and the δS reduction are "
                "not counted by r(d_in+d_out))"
            )
    s1 += "."
    aa = abs(r1["fb_aa"] - 1)
    vs_full = "more" if r1["fb_svd"] > r1["fb_full"] else "less"
    size = "large" if r1["fb_svd"] > 1.15 else "moderate"
    s2 = (
        f"At organism scale the overhead is {size}, as the shapes predict (the rank-r path is {r1['an_model']:.2f} "
        f"of the whole forward's FLOPs): fwd+bwd {r1['fb_svd']:.2f}x bare, {vs_full} than a full fine-tune "
        f"({r1['fb_full']:.2f}x); per-sample probes and per-token capture change it by "
        f"{pct(r1['fb_probe'] / r1['fb_svd'])} and {pct(r1['fb_tok'] / r1['fb_svd'])} (A/A ±{aa * 100:.0f}%; "
        "smaller differences are not resolved); "
        f"LoRA r=8 {r1['fb_lora']:.2f}x; forward-only SVD {r1['fo_svd']:.2f}x and LoRA {r1['fo_lora']:.2f}x; "
        f"KV-cache sampling SVD {r1['gen_svd']:.2f}x and LoRA {r1['gen_lora']:.2f}x (A/A {r1['gen_aa']:.2f})."
    )
    s3 = (
        f"The one-time costs are small next to training: {n_pairs}-pair extraction is {r3['t_grads']:.1f}s of "
        f"gradients + {r3['t_basis']:.2f}s of `build_basis`, and the full SVD of one 9728x2560 weight takes "
        f"{r2['svd'][1][1]:.1f}s on one CPU thread (cached on disk; the 252 projections of Qwen3-4B want a GPU "
        f"or `svd_lowrank`, {r2['svd'][2][1]:.1f}s here)."
    )
    return " ".join((s1, s2, s3))


def main(
    out: Path = typer.Option(...),
    threads: int = typer.Option(1, help="torch intra-op threads (1: the machine has 2 cores and is shared)"),
    repeats: int = typer.Option(7, help="interleaved rounds for the organism tables"),
    repeats_4b: int = typer.Option(5, help="interleaved rounds for the 4B-layer table"),
    gen_repeats: int = typer.Option(3),
    batch: int = typer.Option(16),
    seq: int = typer.Option(256),
    rank: int = typer.Option(64),
    lora_rank: int = typer.Option(8),
    k_tok: int = typer.Option(8),
    n_pairs: int = typer.Option(32),
) -> None:
    torch.set_num_threads(threads)
    t_start = time.perf_counter()
    load = loadavg()
    l1, r1 = part_organism(batch, seq, rank, lora_rank, k_tok, repeats, 2, 8, 32, gen_repeats)
    l2, r2 = part_4b(rank, 4, 128, repeats_4b)
    l3, r3 = part_extraction(n_pairs, rank, 16)
    wall = time.perf_counter() - t_start
    load_end = loadavg()
    lines = [
        "# Adapter overhead: bare vs SVD adapter (probes, per-token capture) vs LoRA; SVD and extraction cost",
        "",
        f"Generated by `PYTHONPATH=src python benchmarks/adapter.py --out {out}` on {platform.node()} ({machine()}; "
        f"device `cpu`, fp32, torch {torch.__version__}, **{torch.get_num_threads()} intra-op thread**; load "
        f"average {load} at start, {load_end} at end; whole run {wall:.0f}s).",
        "",
        "Method: the variants of each table run interleaved in one loop, the order rotated every round (each variant "
        "in each position equally often), after one warm-up call each. Timed: process CPU time (primary; on a "
        "shared 2-core machine wall time mostly measures how often the scheduler lets this process run) and wall "
        "time. Reported: n rounds, CPU median and min-max, and the **ratio of medians** to the bare row (CPU, and "
        'wall for comparison). "bare, again" is the same bare call in the rotation: its ratio to bare is this '
        "machine's A/A noise. Absolute times are not comparable across runs; the ratios are what to read.",
        "",
        *l1,
        *l2,
        *l3,
        "## Reading",
        "",
        reading(r1, r2, r3, n_pairs),
    ]
    write_report(out, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    typer.run(main)

"""The sampler's decode step on a GPU at Qwen3-4B's shape, today's engine against the static one (issue 47).

One call does, in order, writing the results JSON after each part (a call cut off by its time limit keeps the rest):
* `bandwidth`: a device-to-device copy (bytes read + written per second), for the bound below;
* `decode`: for 64, 128 and 256 rows, `rollout.generate` on the Qwen3-4B-shaped model (random bf16 weights, the SVD
  adapter r 64 on all 252 projections, as gpu_smoke builds it) with engine "shared" (today's path: eager decode
  over a growing cache) and "static" (decode.py: static cache, CUDA graphs), each for T0 and T1 new tokens on the
  same prompts (P tokens each; random weights never say EOS, so every row decodes every step). A decode step is
  (t(T1) − t(T0)) / (T1 − T0): prefill and the static engine's graph captures cancel (both runs cross the same cache
  widths). Beside it the bandwidth bound: the bf16 weights plus the live KV cache at the mean context, read once
  per step at the measured copy bandwidth. Greedy tokens of the two engines are compared on the first rows.
* `step`: one GRPO step of `train()` at the override set's batch (16 prompts × 16 completions, 1536 new tokens), as
  gpu_smoke's shape part runs it, with its peak GPU memory against train()'s own pre-flight estimate, and a 200-step
  run's wall time estimated as 200 × that step.

  python benchmarks/decode.py --out /tmp/decode.json                                # on the GPU machine (~5 min)
  python benchmarks/decode.py --out /tmp/cpu.json --device cpu --layers 2 --small \\
      --rows 4 --t0 2 --t1 6 --prompt-tokens 40 --step vanilla:2x2x8:2                 # this script's code path, here
  python benchmarks/decode.py --render /tmp/decode.json                              # reports/bench/gpu_decode.md
"""

from __future__ import annotations

import contextlib
import json
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import typer
from harness import ROOT, short_commit


def bandwidth(device: str) -> float | None:
    """Device-to-device copy bandwidth in bytes/s (read + written), the best of 5 copies of 2 GiB."""
    import torch

    if not device.startswith("cuda"):
        return None
    x = torch.empty(2**30, dtype=torch.bfloat16, device=device)
    y = torch.empty_like(x)
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        y.copy_(x)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    del x, y
    return 2 * 2**31 / best


def prompts_of(tok, n_tokens: int, n: int) -> list[str]:
    """n distinct prompt strings of n_tokens tokens each under the tiny tokenizer (its ids stand in for Qwen's)."""
    base = tok("def f(self, nums): return sum(nums) ", add_special_tokens=False)["input_ids"]
    out = []
    for i in range(n):
        ids = [(base[(j + i) % len(base)]) for j in range(n_tokens)]
        out.append(tok.decode(ids))
    return out


def time_generate(model, tok, prompts, rows: int, new_tokens: int, engine: str, sync) -> tuple[float, object]:
    from projected_grpo.policy.rollout import generate

    sync()
    t0 = time.perf_counter()
    ro = generate(
        model,
        tok,
        prompts,
        group_size=rows // len(prompts),
        max_new_tokens=new_tokens,
        temperature=0.7,
        top_p=1.0,
        seed=0,
        engine=engine,
    )
    sync()
    return time.perf_counter() - t0, ro


BACKENDS = {"default": None, "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


def set_backend(name: str) -> None:
    """decode.SDPA_BACKENDS for a `BACKENDS` name: the attention kernel the static engine's captured step uses."""
    from torch.nn.attention import SDPBackend

    from projected_grpo.policy import decode

    b = BACKENDS[name]
    decode.SDPA_BACKENDS = None if b is None else [getattr(SDPBackend, b)]


def part_kernels(model, device: str, rows: int, ctx: int, width: int) -> dict:
    """Milliseconds per decode step of its pieces at `rows` rows, context `ctx` in a cache `width` wide: one layer's
    attention × the layers, per kernel (bool mask as the static engine passes it; "no_mask" is a kernel reading only
    the live columns, what a variable-length kernel would get), and the token draw outside the graph."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from projected_grpo.policy.rollout import inverse_cdf_draw

    cfg = model.config
    kvh, d, L = cfg.num_key_value_heads, cfg.head_dim, cfg.num_hidden_layers
    g = cfg.num_attention_heads // kvh
    q = torch.randn(rows, kvh, g, d, dtype=torch.bfloat16, device=device)
    k = torch.randn(rows, kvh, width, d, dtype=torch.bfloat16, device=device)
    v = torch.randn_like(k)
    mask = torch.zeros(rows, 1, 1, width, dtype=torch.bool, device=device)
    mask[..., :ctx] = True

    sync = torch.cuda.synchronize if device.startswith("cuda") else lambda: None

    def timed(fn, n=20) -> float:
        fn()
        sync()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        return 1000 * (time.perf_counter() - t) / n

    out = {"rows": rows, "ctx": ctx, "width": width}
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for name, b in BACKENDS.items():
        try:
            kern = sdpa_kernel([getattr(SDPBackend, b)]) if b else contextlib.nullcontext()
            with kern:
                out[f"attention_{name}_ms"] = round(L * timed(lambda: sdpa(q, k, v, attn_mask=mask)), 2)
        except Exception as e:
            out[f"attention_{name}_ms"] = f"failed: {str(e).splitlines()[0][:160]}"
    kc, vc = k[:, :, :ctx].contiguous(), v[:, :, :ctx].contiguous()
    out["attention_no_mask_ms"] = round(L * timed(lambda: sdpa(q, kc, vc)), 2)
    V = cfg.vocab_size
    logits = torch.randn(rows, V, dtype=torch.bfloat16, device=device)
    scores = torch.zeros(rows, V, device=device)
    order = torch.arange(rows, device=device)
    eos = torch.tensor([2], device=device)

    def draw():
        scores[order] = logits.float()
        p = torch.softmax(scores / 0.7, -1)
        nxt = inverse_cdf_draw(p)
        done = torch.isin(nxt, eos)
        return bool(done.all())

    out["draw_ms"] = round(timed(draw), 2)
    return out


def part_decode(model, tok, device: str, rows_list, t0: int, t1: int, prompt_tokens: int, bw, save, backends) -> dict:
    import torch

    from projected_grpo.policy.rollout import generate

    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else lambda: None
    cfg = model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers()
    )
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2  # bf16 K and V
    out = {"weights_bytes": weights, "kv_bytes_per_token": kv_per_token, "rows": {}}
    for rows in rows_list:
        res: dict = {}
        n_prompts = max(1, rows // 16)  # groups of 16 completions, as the override set samples them
        prompts = prompts_of(tok, prompt_tokens, n_prompts)
        for variant in ["shared"] + [f"static_{b}" for b in backends]:
            engine = variant.split("_")[0]
            try:
                if cuda:
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                if engine == "static":
                    set_backend(variant.split("_", 1)[1])
                ta, _ = time_generate(model, tok, prompts, rows, t0, engine, sync)
                tb, ro = time_generate(model, tok, prompts, rows, t1, engine, sync)
                steps = int(ro.mask.sum(-1).max()) - t0
                res[variant] = {
                    "t0_s": round(ta, 3),
                    "t1_s": round(tb, 3),
                    "step_ms": round(1000 * (tb - ta) / max(steps, 1), 2),
                    "decoded_all": bool((ro.mask.sum(-1) == t1).all()),
                    "prompt_width": ro.prompt_ids.shape[1],
                    "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
                }
            except Exception:
                res[variant] = {"error": traceback.format_exc()[-3000:]}
            print(rows, variant, json.dumps(res[variant])[:600], flush=True)
        ctx = res["shared"].get("prompt_width", prompt_tokens) + (t0 + t1) / 2
        res["context_tokens"] = ctx
        if bw:
            res["bound_ms"] = round(1000 * (weights + rows * ctx * kv_per_token) / bw, 2)
        out["rows"][str(rows)] = res
        save(out)
    set_backend(best_backend(out, backends))
    try:  # greedy agreement at this shape (bf16: rounding may split near-ties, so it is reported, not asserted)
        prompts = prompts_of(tok, prompt_tokens, 2)
        args = dict(group_size=1, max_new_tokens=16, temperature=0.0, top_p=1.0, seed=0)
        a = generate(model, tok, prompts, engine="shared", **args).completion_ids
        b = generate(model, tok, prompts, engine="static", **args).completion_ids
        first = [int((x != y).nonzero()[0]) if bool((x != y).any()) else len(x) for x, y in zip(a, b)]
        out["greedy_first_difference"] = first  # per row: the first position the engines differ (16: none)
    except Exception:
        out["greedy_error"] = traceback.format_exc()[-2000:]
    return out


def best_backend(dec: dict, backends) -> str:
    """The attention kernel whose static step was fastest at 128 rows (or the largest rows measured)."""
    rows = dec.get("rows", {})
    r = rows.get("128") or (rows[max(rows, key=int)] if rows else {})
    ms = {b: r[f"static_{b}"]["step_ms"] for b in backends if "step_ms" in r.get(f"static_{b}", {})}
    return min(ms, key=ms.get) if ms else backends[0]


def main(
    out: Path = typer.Option(None, help="Results JSON to write."),
    device: str = typer.Option("cuda", help="Torch device (cpu: a check of this script's code path)."),
    layers: int = typer.Option(36, help="Decoder layers (Qwen3-4B has 36)."),
    small: bool = typer.Option(False, help="Width 256 (vocab still 151936): a quick CPU check."),
    rows: str = typer.Option("64,128,256", help="Decode batch sizes, comma-separated."),
    t0: int = typer.Option(16, help="New tokens of the shorter run."),
    t1: int = typer.Option(144, help="New tokens of the longer run."),
    backends: str = typer.Option("default,cudnn,efficient", help="Attention kernels of the static engine to time."),
    prompt_tokens: int = typer.Option(1200, help="Prompt tokens per row (the mean context is this + (t0+t1)/2)."),
    step: str = typer.Option(
        "vanilla:16x16x1536:8:ckpt", help="GRPO steps of gpu_smoke's shape part ('' for none): arm:BxGxT:micro[:ckpt]"
    ),
    render_from: Path = typer.Option(None, "--render", help="Write --report from this results JSON, run nothing."),
    report: Path = typer.Option(ROOT / "reports/bench/gpu_decode.md", help="Markdown report of --render."),
) -> None:
    if render_from is not None:
        report.write_text(render(json.loads(render_from.read_text()), str(render_from)))
        return
    if out is None:
        raise typer.BadParameter("give --out (where the results JSON goes) or --render")
    import torch
    from gpu_smoke import parse_runs, part_shape, shape_model

    from projected_grpo.policy.adapter import attach_adapters

    res: dict = {"machine": platform.node(), "torch": torch.__version__, "commit": short_commit(ROOT)}
    res["device"] = torch.cuda.get_device_name(0) if device.startswith("cuda") else platform.processor() or "cpu"
    res["args"] = dict(layers=layers, small=small, rows=rows, t0=t0, t1=t1, prompt_tokens=prompt_tokens, step=step)
    res["args"]["backends"] = backends
    write = lambda: out.write_text(json.dumps(res, indent=1))  # noqa: E731
    res["bandwidth_Bps"] = bandwidth(device)
    t = time.perf_counter()
    model, tok = shape_model(device, layers, small)
    attach_adapters(model, "all", 64, "svd")
    res["build_s"] = round(time.perf_counter() - t, 1)
    write()
    bks = backends.split(",")
    if device.startswith("cuda"):
        try:
            res["kernels"] = part_kernels(model, device, 128, prompt_tokens, -(-prompt_tokens // 256) * 256)
        except Exception:
            res["kernels"] = {"error": traceback.format_exc()[-2000:]}
        print("kernels", json.dumps(res["kernels"]), flush=True)
    from projected_grpo.policy.rollout import generate

    generate(model, tok, ["warm up"], 8, 4, 0.7, 1.0, 0, engine="static")  # first-call costs out of the timings
    try:
        res["decode"] = part_decode(
            model,
            tok,
            device,
            [int(r) for r in rows.split(",")],
            t0,
            t1,
            prompt_tokens,
            res["bandwidth_Bps"],
            lambda d: (res.__setitem__("decode", d), write()),
            bks,
        )
        res["decode"]["backend"] = best_backend(res["decode"], bks)
    except Exception:
        res["decode"] = {"error": traceback.format_exc()[-3000:]}
        print(res["decode"]["error"], flush=True)
    write()
    del model
    if step:
        sys.path.insert(0, str(ROOT))
        from tests.test_device import CHAIN, tiny_chain

        work = Path(tempfile.mkdtemp(prefix="decode_"))
        try:
            tiny_chain(work / "tiny", device, "bfloat16", CHAIN[:1], minileet={"n_train": 64})
            save = lambda sh: (res.__setitem__("step", sh), write())  # noqa: E731
            res["step"] = part_shape(work, work / "tiny", parse_runs(step), device, layers, small, save)
        except Exception:
            res["step"] = {"error": traceback.format_exc()[-4000:]}
            print(res["step"]["error"], flush=True)
    write()


def headline(res: dict) -> list[str]:
    """The two lines issue 47 asks for, from a results JSON (empty where the part did not run)."""
    dec, lines = res.get("decode", {}), []
    r = dec.get("rows", {}).get("128", {})
    st, sh = r.get(f"static_{dec.get('backend', 'default')}", {}), r.get("shared", {})
    if "step_ms" in st and "step_ms" in sh:
        lines.append(f"decode step at 128 rows: {st['step_ms']:.1f} ms (today's path {sh['step_ms']:.1f} ms)")
    for run in res.get("step", {}).get("runs", {}).values():
        if "step_s" in run:
            lines.append(
                f"200-step run of the override set: {200 * run['step_s'] / 3600:.1f} h (estimated from the measured "
                f"step of {run['step_s']} s)"
            )
    return lines


def render(res: dict, source: str) -> str:
    """reports/bench/gpu_decode.md from a results JSON."""
    dec, a = res.get("decode", {}), res["args"]
    rows, best = dec.get("rows", {}), dec.get("backend", "default")
    bks = sorted(
        {v.split("_", 1)[1] for r in rows.values() for v in r if v.startswith("static_")}, key=list(BACKENDS).index
    )
    lines = [
        "# The sampler's decode step on a GPU at Qwen3-4B's shape (issue 47)",
        "",
        f"Re-run (on a CUDA machine, ~6 min): `python benchmarks/decode.py --out {source}`, then here "
        f"`python benchmarks/decode.py --render {source}`. Source: `{source}`.",
        "",
        f"Ran on {res['device']} (torch {res['torch']}) at commit {res['commit']}; one run of each cell (n = 1: the "
        "lent machine's time is scarce), so a time is one measurement, not a distribution.",
        "",
        *headline(res),
        "",
        "## Decode step",
        "",
    ]
    if "error" in dec:
        lines += ["Failed:", "", "```", dec["error"][-1500:], "```", ""]
    elif rows:
        bw = res.get("bandwidth_Bps") or float("nan")
        ctx = next(iter(rows.values()))["context_tokens"]
        lines += [
            "`rollout.generate` on Qwen3-4B's shape (random bf16 weights, the SVD adapter r 64 on all 252 "
            f"projections), prompts of {ctx - (a['t0'] + a['t1']) / 2:.0f} tokens in groups of 16, temperature 0.7; "
            f"ms per decode step = (t({a['t1']} new tokens) − t({a['t0']})) / {a['t1'] - a['t0']}, so the steps read "
            f"a KV cache of {ctx:.0f} tokens per row on average. Random weights never say EOS: every row decodes "
            "every step. "
            'Columns: today\'s path (engine "shared", eager), and the static engine (static KV cache, CUDA graphs) '
            "with each attention kernel it may use; the one marked * is the fastest at 128 rows, the one the step "
            f"below ran with. The bound: the weights ({dec['weights_bytes'] / 2**30:.2f} GiB) and the live KV cache "
            f"({dec['kv_bytes_per_token'] / 1e3:.0f} KB per token) read once per step at the measured copy bandwidth "
            f"({bw / 1e12:.2f} TB/s, read + written).",
            "",
            "| rows | today's path (ms) | "
            + " | ".join(f"static, {b}{'*' if b == best else ''} (ms)" for b in bks)
            + " | speed-up* | bound (ms) | static* / bound | peak GiB (today / static*) |",
            "|---|---|" + "---|" * len(bks) + "---|---|---|---|",
        ]
        cell = lambda x: f"{x['step_ms']:.1f}" if "step_ms" in x else "failed"  # noqa: E731
        for n, r in rows.items():
            sh, st = r.get("shared", {}), r.get(f"static_{best}", {})
            ok = "step_ms" in sh and "step_ms" in st
            lines.append(
                f"| {n} | {cell(sh)} | "
                + " | ".join(cell(r.get(f"static_{b}", {})) for b in bks)
                + f" | {sh['step_ms'] / st['step_ms']:.1f} | " * ok
                + " | n/a | " * (not ok)
                + f"{r.get('bound_ms', 'n/a')} | "
                + (f"{st['step_ms'] / r['bound_ms']:.1f}" if ok and r.get("bound_ms") else "n/a")
                + f" | {sh.get('peak_gib')} / {st.get('peak_gib')} |"
            )
        if res.get("call1_step_ms"):
            c1 = res["call1_step_ms"]
            lines += [
                "",
                "Today's path in call 1 (calls below), same shapes: "
                + ", ".join(f"{n} rows {v['shared']:.1f} ms" for n, v in c1.items())
                + "; its time moves with the host (a Python-bound loop of launches), the static engine's within "
                + ", ".join(
                    f"{abs(v['static'] - rows[n][f'static_{best}']['step_ms']):.1f} ms at {n}"
                    for n, v in c1.items()
                    if n != "64" and f"static_{best}" in rows.get(n, {})
                )
                + " rows (call 1's 64-row static cell was not warmed up).",
            ]
        k = res.get("kernels", {})
        if "attention_default_ms" in k:
            at = {b: k.get(f"attention_{b}_ms") for b in BACKENDS}
            lines += [
                "",
                f"Pieces of a step at {k['rows']} rows, a {k['ctx']}-token context in a {k['width']}-column cache "
                "(each timed alone, 20 repeats): attention over the 36 layers "
                + ", ".join(f"{b} {v} ms" if isinstance(v, float) else f"{b} {v}" for b, v in at.items())
                + f"; the same attention on the live columns only, no mask (what a variable-length kernel reads) "
                f"{k['attention_no_mask_ms']} ms; the token draw outside the graph {k['draw_ms']} ms.",
            ]
        if "greedy_first_difference" in dec:
            lines += [
                "",
                "Greedy decoding, 16 tokens on 2 rows, both engines in bf16: first differing position per row "
                f"{dec['greedy_first_difference']} (16 = identical; bf16 rounding differs between the engines' "
                "attention sums). tests/test_decode.py checks token identity in fp32, on the CPU and on CUDA.",
            ]
        for n, r in rows.items():
            for v, x in r.items():
                if isinstance(x, dict) and "error" in x:
                    lines += ["", f"{v} at {n} rows failed:", "", "```", x["error"][-1200:], "```"]
    lines += ["", "## The override set's full step", ""]
    st = res.get("step", {})
    if "error" in st:
        lines += ["Failed:", "", "```", st["error"][-1500:], "```"]
    for label, r in st.get("runs", {}).items():
        if "step_s" not in r:
            lines += [f"{label}: failed", "", "```", r.get("error", "?")[-1500:], "```"]
            continue
        ph = {k: float(v) for k, v in r["phases_s"].items()}
        loss = ph["t_ref_forward"] + ph["t_forward"] + ph["t_backward"]
        lines += [
            f"One GRPO step of `train()` on params-qwen3-4b.yaml: {label} (gpu_smoke's shape part; random weights: "
            "every completion runs the whole budget, the worst case for time and memory), sampled by the static "
            f"engine with the {best} attention kernel.",
            "",
            "| step (s) | sample | ref forward | forward | backward | peak GPU memory (GiB) "
            "| pre-flight estimate (GiB) |",
            "|---|---|---|---|---|---|---|",
            f"| {r['step_s']} | {ph['t_sample']:.1f} | {ph['t_ref_forward']:.1f} | {ph['t_forward']:.1f} "
            f"| {ph['t_backward']:.1f} | {r['peak_gib']} | {r.get('estimate_gib', 'n/a')} |",
            "",
            f"The loss passes (reference forward, forward, backward) take {loss:.1f} s of the step: "
            f"{200 * loss / 3600:.1f} h of a 200-step run on their own, whatever the sampler does. Pre-flight: "
            f"{r.get('estimate_text', '')}",
        ]
    for r in res.get("call1_step", {}).values():
        lines += [
            "",
            f"Call 1, the same step: {r['step_s']} s, sampling {float(r['phases_s']['t_sample']):.1f} s, "
            f"peak {r['peak_gib']} GiB.",
        ]
    if res.get("calls"):
        lines += ["", "## Calls", ""] + [f"* call {k}: {v}" for k, v in res["calls"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    typer.run(main)

"""GPU smoke of the real setting's code path (issue 26): what runs on a CUDA device, how long, and in how much memory.

Two parts, each recorded even when the other fails:
* `tiny`: the pipeline's own stage commands (dvc.yaml) problems → organism → pool → basis → train (route_per_rollout,
  2 GRPO steps) → eval_sets → evaluate, on test_pipeline's tiny params with `model.device: cuda`,
  `model.dtype: bfloat16` (tests/test_device.py's chain and checks), seconds per stage.
* `shape`: a Qwen3-4B-shaped Qwen3 (the published config: 36 layers, d 2560, 32/8 heads of 128, MLP 9728, vocab
  151936, tied embeddings) with random bf16 weights, built on the GPU (no hub here), the SVD adapter attached to
  every projection at rank 64 (timed), then one GRPO step of `train()` per arm on params-qwen3-4b.yaml with the batch
  shrunk (`--prompts`, `--group`, `--new-tokens`, `--micro-batch`): phase times and peak GPU memory. The tiny
  tokenizer stands in for Qwen's (random weights sample ids it cannot decode: completions run to the token budget,
  the worst case for memory). route_per_rollout reads a random basis (k 8 per module) and calibrates its gate on the
  held-out pairs of the tiny chain's problems, so probes, gates and the knob run at this shape too; an act-gated arm
  (basis.space=act, e.g. params.yaml's `route`) reads a random unit v_act beside it. An arm is a run key of
  params.yaml's arm table (`route`, `route+random`) or a rule's name (`route_per_rollout`, an entry of its own), run
  on `arms.run_params` of the shape's params plus the run's own `key=value` overrides (`parse_runs`).

  python benchmarks/gpu_smoke.py --out /tmp/gpu.json                       # on the GPU machine
  python benchmarks/gpu_smoke.py --out /tmp/cpu.json --device cpu --layers 2  # this script's code path, here
"""

from __future__ import annotations

import gc
import json
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import typer
import yaml
from harness import ROOT


def part_tiny(work: Path, device: str) -> dict:
    sys.path.insert(0, str(ROOT))
    from tests.test_device import check_chain, tiny_chain

    root = work / "tiny"
    times = tiny_chain(root, device, "bfloat16")
    check_chain(root, "bfloat16")
    return {"stages_s": {k: round(v, 1) for k, v in times.items()}, "root": str(root)}


def parse_runs(spec: str) -> list[dict]:
    """'arm:BxGxT:micro[:ckpt][:section.key=value…],…' -> [{arm, prompts, group, new_tokens, micro, ckpt, set}]: one
    GRPO step each (ckpt forces grpo.grad_checkpointing on; without it the override set's value holds; `set`: the
    run's params overrides, YAML values, as `dvc exp run -S` takes them)."""
    out = []
    for item in spec.split(","):
        arm, bgt, micro, *flags = item.split(":")
        b, g, t = (int(x) for x in bgt.split("x"))
        over = tuple((k, yaml.safe_load(v)) for k, _, v in (f.partition("=") for f in flags if "=" in f))
        out.append(dict(arm=arm, prompts=b, group=g, new_tokens=t, micro=int(micro), ckpt="ckpt" in flags, set=over))
    return out


def run_arm(p, key: str):
    """The spec of a run key of p's arm table, or of a rule's name run as an entry of its own (`route_per_rollout`,
    `route_per_rollout+random`)."""
    from projected_grpo.method.arms import make, parse

    name, _, variant = key.partition("+")
    return parse(p, key) if name in p.arm else make(name, name, variant, basis=name != "vanilla")


def shape_params(run: dict, device: str):
    from projected_grpo.config import Params, from_dict, overlay

    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    d = overlay(base, yaml.safe_load((ROOT / "params-qwen3-4b.yaml").read_text()))
    grpo = {"steps": 1, "prompts_per_step": run["prompts"], "group_size": run["group"], "micro_batch": run["micro"]}
    if run["ckpt"]:
        grpo["grad_checkpointing"] = True
    shrink = {
        "substrate": "minileet",  # the tiny chain's problems (the leetcode train split is not offline)
        "model": {"name": "qwen3-4b-shape", "device": device, "dtype": "bfloat16"},
        "pool": {"teacher": "organism", "mix": 0.0},
        "rollout": {"max_new_tokens": run["new_tokens"], "max_prompt_tokens": 1536},
        "grpo": {**grpo, "save_every": 1},
        "projection": {"recal_every": 1},
    }
    return from_dict(Params, overlay(d, shrink))


SMALL = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64)


def shape_model(device: str, layers: int, small: bool = False):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from projected_grpo.policy.tiny import tiny_config, tiny_tokenizer
    from projected_grpo.rl.memory import QWEN3_4B

    tok = tiny_tokenizer()
    t = tiny_config(len(tok))
    shape = {**QWEN3_4B, "num_hidden_layers": layers, **(SMALL if small else {})}
    cfg = Qwen3Config(**shape, pad_token_id=t.pad_token_id, eos_token_id=t.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    return model.eval(), tok


def random_basis(model, k: int, out: Path, act_layer: int) -> None:
    """A Haar-random basis (k rows per module) and a random unit ν, saved as the basis stage saves one
    (basis.safetensors, and the same as random.safetensors for `*_random` arms), and a random unit v_act at
    `act_layer` (act.safetensors) for act-gated arms."""
    import torch

    from projected_grpo.method.basis import Basis, random_directions
    from projected_grpo.policy.adapter import adapters

    gen = torch.Generator().manual_seed(0)
    ads = adapters(model)
    vh = {n: random_directions(k, a.dim, gen) for n, a in ads.items()}
    nu = {n: torch.randn(a.dim, generator=gen) for n, a in ads.items()}
    scale = torch.cat(list(nu.values())).norm()
    b = Basis(vh=vh, nu={n: v / scale for n, v in nu.items()}, meta={"method": "random", "smoke": True})
    b.save(out / "basis.safetensors")
    b.save(out / "random.safetensors")
    v = torch.randn(model.config.hidden_size, generator=gen)
    act = Basis({}, {}, {"space": "act", "act_layer": act_layer, "smoke": True}, v_act=v / v.norm())
    act.save(out / "act.safetensors")


def part_shape(
    work: Path, tiny_root: Path, runs: list[dict], device: str, layers: int, small: bool, save=lambda out: None
) -> dict:
    """The shape part; `save(partial results)` after each run, so a run cut off by a time limit keeps the others."""
    import torch

    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else lambda: None

    from projected_grpo.config import with_overrides
    from projected_grpo.env.problems import load_problems_parquet
    from projected_grpo.env.sandbox import Sandbox
    from projected_grpo.method.arms import run_params
    from projected_grpo.method.direction import load_run_basis
    from projected_grpo.policy.adapter import attach_adapters
    from projected_grpo.rl.train import Run, train

    out = {"layers": layers, "small": small, "runs": {}}
    problems = tiny_root / "artifacts/problems"
    records = load_problems_parquet(problems / "train.parquet")
    basis_dir = work / "shape_basis"
    model, attached = None, None

    def build(p0):  # the model with the adapter p0 asks for (a separate quarantine needs W's next r too)
        nonlocal model, attached
        model = None
        gc.collect()  # the adapters' hooks make reference cycles: without a collection the old model stays on the GPU
        if cuda:
            torch.cuda.empty_cache()
        t0 = time.perf_counter()
        model, tok = shape_model(device, layers, small)
        sync()
        out["build_s"] = round(time.perf_counter() - t0, 1)
        out["n_params"] = sum(x.numel() for x in model.parameters())
        t0 = time.perf_counter()
        separate = p0.adapter.quarantine == "separate"
        attach_adapters(model, p0.adapter.targets, p0.adapter.rank, p0.adapter.kind, separate=separate)
        sync()
        out["svd_attach_s" + ("_separate" if separate else "")] = round(time.perf_counter() - t0, 1)
        out["weights_gib"] = round(torch.cuda.memory_allocated() / 2**30, 2) if cuda else None
        random_basis(model, p0.basis.k, basis_dir, p0.basis.act_layer)
        attached = p0.adapter.quarantine
        return tok

    import projected_grpo.rl.train as loop

    seen = {}
    preflight = loop.preflight

    def spy(*args, **kwargs):  # keep train()'s own pre-flight estimate of the step
        seen["est"] = preflight(*args, **kwargs)
        return seen["est"]

    loop.preflight = spy
    for i, r in enumerate(runs):
        p0 = with_overrides(shape_params(r, device), r.get("set", ()))  # the run's own overrides (a recipe)
        arm, res = run_arm(p0, r["arm"]), {"run": r}
        p = run_params(p0, arm)  # as the train stage runs it: the keys only masked routing reads neutral elsewhere
        if p.adapter.quarantine != attached:
            tok = build(p)
        g = p.grpo
        label = (
            f"{r['arm']}{''.join(f' {k}={v}' for k, v in r.get('set', ()))} "
            f"{r['prompts']}x{r['group']}x{r['new_tokens']}, micro-batch {g.micro_batch} rows / "
            f"{g.micro_batch_tokens} tokens, sampling {p.rollout.batch_size} rows, ckpt {int(g.grad_checkpointing)}"
        )
        try:
            rb = load_run_basis(p, arm, basis_dir, ROOT / "data/pairsets", problems)
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            d = work / f"shape_{i}"
            t0 = time.perf_counter()
            with Sandbox(concurrency=p.grader.concurrency, mem_mb=p.grader.mem_mb) as sb:
                out = (d / "ckpt", d / "log.tsv")
                train(Run(p, arm, 0, model, tok, records, *out, rb, sandbox=sb, timings_path=d / "t.tsv"))
            sync()
            res["step_s"] = round(time.perf_counter() - t0, 1)
            res["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None
            est = seen.pop("est")
            res["estimate_gib"] = round(est.total / 2**30, 1)
            res["estimate"] = {k: round(getattr(est, k) / 2**30, 2) for k in ("sampling", "loss")}
            res["estimate_text"] = est.describe()
            head, *rows = (d / "t.tsv").read_text().splitlines()
            res["phases_s"] = dict(zip(head.split("\t"), rows[-1].split("\t")))
            head, *rows = (d / "log.tsv").read_text().splitlines()
            res["log"] = dict(zip(head.split("\t"), rows[-1].split("\t")))
        except Exception:
            res["error"] = traceback.format_exc()[-3000:]
            print(res["error"], flush=True)
        out["runs"][label] = res
        save(out)
        print(label, json.dumps({k: v for k, v in res.items() if k != "log"}), flush=True)
    return out


def render(res: dict, source: str, decode: Path | None = None) -> str:
    """reports/bench/gpu.md from a results JSON (and benchmarks/decode.py's, whose headline it quotes)."""
    lines = [
        "# The real setting's code path on a GPU (issue 26)",
        "",
        f"Re-run (on a CUDA machine): `python benchmarks/gpu_smoke.py --out {source}`, then here "
        f"`python benchmarks/gpu_smoke.py --render {source}`. Source: `{source}`.",
        "",
        f"Ran on {res['device']} (torch {res['torch']}); one run of each part, no repeats (n = 1 per row: the lent "
        "machine's time is scarce), so a time is one measurement, not a distribution.",
        "",
    ]
    if decode is not None:  # the sampler's static engine (issue 47): its two headline lines, the rest in its report
        from decode import headline

        dec = json.loads(decode.read_text())
        lines += [
            "## The sampler at usable speed (issue 47)",
            "",
            f"From `{decode}` ({dec['device']}, commit {dec['commit']}); the table, the kernels and the full step "
            "are in `reports/bench/gpu_decode.md` (`python benchmarks/decode.py --render " + str(decode) + "`). "
            "The calls below ran before it, on the eager sampler.",
            "",
            *headline(dec),
            "",
        ]
    if res.get("calls"):  # results gathered over several lent-machine calls
        lines += ["Calls:", ""] + [f"* call {k}: {v}" for k, v in res["calls"].items()] + [""]
    tiny = res.get("tiny", {})
    lines += ["## Tiny chain: the pipeline's stages on CUDA in bfloat16", ""]
    if not tiny:
        lines += ["Not run.", ""]
    elif "error" in tiny:
        lines += ["Failed:", "", "```", tiny["error"][-1500:], "```", ""]
    else:
        lines += [
            "test_pipeline's tiny params, `model.device: cuda`, `model.dtype: bfloat16`, arm route_per_rollout, "
            "seed 41, 2 GRPO steps; the checks of tests/test_device.py held (finite log, fp32 adapter, rates in "
            "[0, 1]).",
            "",
            "| stage | seconds |",
            "|---|---|",
        ]
        lines += [f"| {k} | {v} |" for k, v in tiny["stages_s"].items()] + [""]
    sh = res.get("shape", {})
    lines += ["## Qwen3-4B shape: one GRPO step", ""]
    if "error" in sh:
        lines += ["Failed:", "", "```", sh["error"][-1500:], "```"]
        return "\n".join(lines) + "\n"
    lines += [
        f"Random bf16 weights in the Qwen3-4B config ({sh['n_params'] / 1e9:.2f} B parameters, {sh['layers']} layers; "
        f"built on the GPU in {sh['build_s']} s), SVD adapter r 64 on all 252 projections (attached in "
        f"{sh['svd_attach_s']} s: a Gram eigh per projection), weights {sh['weights_gib']} GiB. Each row is one GRPO "
        "step of `train()` on params-qwen3-4b.yaml with the row's B prompts × G completions, T new tokens (random "
        "weights never emit EOS: every completion is T tokens, the worst case), loss micro-batch (rows / tokens), "
        "rows per sampling call and grpo.grad_checkpointing; the estimate is train()'s own pre-flight "
        "(rl/memory.py). route_per_rollout reads a random basis (k 8 per module) and calibrates its gate on "
        "the tiny chain's held-out pairs (batches of the micro-batch) before its step. Times in seconds.",
        "",
        "| run | step | sample | ref forward | forward | backward | gate calibration | peak GPU memory (GiB) "
        "| estimate (GiB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    runs = sh.get("runs") or {k: v for k, v in sh.items() if isinstance(v, dict) and k != "params"}
    for label, r in runs.items():
        if "step_s" not in r:
            lines.append(f"| {label} | failed: {r.get('error', '?').strip().splitlines()[-1][:200]} |")
            continue
        ph = {k: float(v) for k, v in r["phases_s"].items()}
        lines.append(
            f"| {label} | {r['step_s']} | {ph['t_sample']:.1f} | {ph['t_ref_forward']:.2f} | {ph['t_forward']:.2f} "
            f"| {ph['t_backward']:.2f} | {ph['t_gate_calibration']:.2f} | {r['peak_gib']} "
            f"| {r.get('estimate_gib', 'n/a')} |"
        )
    if res.get("notes"):  # the reading, written by whoever ran it (kept in the results file)
        lines += ["", "## Reading", ""] + [f"* {n}" for n in res["notes"]]
    return "\n".join(lines) + "\n"


def main(
    out: Path = typer.Option(None, help="Results JSON to write (not needed with --render)."),
    device: str = typer.Option("cuda", help="Torch device (cpu: a check of this script's code path)."),
    runs: str = typer.Option(
        "vanilla:2x4x256:4,route_per_rollout:2x4x256:4:basis.space=grad:projection.deploy_frac=0",
        help="Shape part, one GRPO step each: arm:BxGxT:micro_batch[:ckpt][:key=value…], comma-separated: parse_runs.",
    ),
    layers: int = typer.Option(36, help="Shape part: decoder layers (Qwen3-4B has 36)."),
    tiny_root: Path = typer.Option(None, help="Reuse a finished tiny chain (skips the tiny part)."),
    small: bool = typer.Option(False, help="Shape part at width 256 (vocab still 151936): a quick CPU check."),
    problems_only: bool = typer.Option(False, help="Skip the tiny chain; build only its problems (64 train)."),
    render_from: Path = typer.Option(None, "--render", help="Write --report from this results JSON, run nothing."),
    report: Path = typer.Option(ROOT / "reports/bench/gpu.md", help="Markdown report of --render."),
    decode: Path = typer.Option(None, help="--render: benchmarks/decode.py's results JSON, quoted at the top."),
) -> None:
    if render_from is not None:
        report.write_text(render(json.loads(render_from.read_text()), str(render_from), decode))
        return
    if out is None:
        raise typer.BadParameter("give --out (where the results JSON goes) or --render")
    import torch

    res: dict = {"machine": platform.node(), "torch": torch.__version__}
    res["device"] = torch.cuda.get_device_name(0) if device.startswith("cuda") else platform.processor() or "cpu"
    work = Path(tempfile.mkdtemp(prefix="gpu_smoke_"))
    if problems_only:  # the shape part's prompts only: the problems stage with 64 training problems
        sys.path.insert(0, str(ROOT))
        from tests.test_device import CHAIN, tiny_chain

        tiny_chain(work / "tiny", device, "bfloat16", CHAIN[:1], minileet={"n_train": 64})
    elif tiny_root is None:
        t0 = time.perf_counter()
        try:
            res["tiny"] = part_tiny(work, device)
        except Exception:
            res["tiny"] = {"error": traceback.format_exc()[-4000:]}
        res["tiny"]["wall_s"] = round(time.perf_counter() - t0, 1)
        print("tiny", json.dumps(res["tiny"])[:3000], flush=True)
        out.write_text(json.dumps(res, indent=1))
    root = tiny_root or work / "tiny"
    if (root / "artifacts/problems/train.parquet").exists():
        try:
            save = lambda sh: out.write_text(json.dumps({**res, "shape": sh}, indent=1))  # noqa: E731
            res["shape"] = part_shape(work, root, parse_runs(runs), device, layers, small, save)
        except Exception:
            res["shape"] = {"error": traceback.format_exc()[-4000:]}
            print(res["shape"]["error"], flush=True)
    out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    typer.run(main)

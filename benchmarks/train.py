"""GRPO step cost: the arms vs vanilla through the real loop, our vanilla vs TRL's GRPOTrainer, and peak memory.

  PYTHONPATH=src python benchmarks/train.py --out reports/bench/train.md

What runs. Every configuration trains the same in-process tiny Qwen3 (`tiny.tiny_model`, d=32, 2 layers, random
weights, fp32, CPU) on the same B minileet training prompts (with their loophole hints) under the in-process tiny
tokenizer, G completions per prompt, the same completion budget, temperature and beta (params.yaml), and the same
cheap deterministic reward (sha256 of the completion text mod 4: no sandbox, so the grader's cost does not dominate).
EOS is suppressed during sampling (logit -inf, only inside TRL's `model.generate` and our `rollout.sample_chunk`), so
every completion is exactly `max_new_tokens` long in every configuration: the arms' policies diverge after one update,
and the work per step must not. (So our sampler's saving from dropping finished rows does not show here; its shared
prefill does: reports/bench/generation.md has both.)

* ours: `projected_grpo.rl.train.train` for `vanilla`, `erase_one_sided`, `route_batch`, `route_per_rollout` (SVD
  adapter on every projection, only δS/δS_h trainable), with a basis extracted like the `basis` stage does (per-pair
  gradients of the real `prog_wide` extraction pairs through the probes, `build_basis` svd with k=basis.k and
  permissive thresholds so the random model keeps directions) and the real 28 `prog_wide` calibration pairs for
  `route_per_rollout`'s gate. A second `vanilla` ("vanilla, again") is the A/A noise of the machine.
* TRL 1.16 `GRPOTrainer`, CPU, no vLLM, `loss_type="dr_grpo"`, `scale_rewards="none"`, same beta, clip 0.2/0.2,
  `use_bias_correction_kl=False`, fp32 (`bf16=False`), `gradient_checkpointing=False`, `per_device_train_batch_size`
  = N = B·G with `gradient_accumulation_steps=1` (so `steps_per_generation=1`: one generation of N completions and
  one optimizer step per trainer step; no old-logprob forward), the reference model built by TRL from a
  `save_pretrained` copy of the same base weights, `chat_template_kwargs={"enable_thinking": False}` (the same prompt
  tokens as ours, checked). Two variants: all 35k weights trainable (TRL's default without PEFT), and "δS only": the
  same SVD-adapter model that ours trains, so exactly the same trainable tensors (TRL's AdamW over δS and δS_h).

How it is timed. All configurations run in ONE process, side by side, each in its own thread, and a scheduler lets
exactly one thread run at a time: a thread hands the turn over inside its reward call (once per step), and the next
round's order is rotated so each configuration occupies each position equally often. The work a thread does
between two consecutive reward calls is one full step (the rest of step t: ref forward, policy forward, backward,
edit, optimizer; then step t+1 up to its reward: gate calibration when due, rollout), timed in wall and process-CPU
time (only one thread runs, so process CPU is that configuration's). The first cycle (model/trainer setup, first
rollout) and the second (first backward; warm-up) are dropped. As a cross-check, the step-aligned wall time is also
read where the brief suggests: our log's `dt` column and TRL's `on_step_begin`->`on_step_end`, each minus the time
the thread waited for its turn inside that step. Phases are timed by wrapping (never editing) the functions each
loop calls, outermost only: sampling (`model.generate` / `rollout.sample_chunk`), the reward, the reference and
policy forwards, `Tensor.backward`, the edit functions, the optimizer step (+ clipping), gate calibration; "other" is
the remainder.

Peak memory: each configuration (A/A excluded) again in a fresh subprocess for `--mem-steps` steps; VmRSS after
imports + setup, and the peak resident set of the process (VmHWM, its high-water mark since exec) at the end. Both
include the interpreter, torch, transformers and trl (imported by every probe so the baselines match); the
difference is what training adds.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import typer
from harness import (
    ROOT,
    Phases,
    Scheduler,
    interleaved,
    loadavg,
    machine,
    md_head,
    median,
    patched,
    quartiles,
    run_threads,
    src_env,
    write_report,
)

from projected_grpo.common.log import read_tsv
from projected_grpo.config import load_params
from projected_grpo.env.modes import MODES, apply_mode
from projected_grpo.env.substrate import base_splits
from projected_grpo.method import gate as gate_mod
from projected_grpo.method import projection as proj
from projected_grpo.method.arms import Arm, make, run_params
from projected_grpo.method.basis import BasisSettings, build_basis, completion_grads
from projected_grpo.method.direction import RunBasis
from projected_grpo.method.gate import HeldOutPairs
from projected_grpo.method.optim import RotatedAdam
from projected_grpo.method.pairs import load_pairset, pair_records, pairset_path, select_pairs
from projected_grpo.policy import rollout as rollout_mod
from projected_grpo.policy.adapter import adapters, attach_adapters
from projected_grpo.policy.model import render_prompt
from projected_grpo.policy.rollout import eos_token_ids
from projected_grpo.policy.tiny import tiny_model, tiny_tokenizer
from projected_grpo.policy.tokenizer import SPECIAL_TOKENS as SPECIAL
from projected_grpo.rl import train as train_mod

ARMS = ("vanilla", "erase_one_sided", "route_batch", "route_per_rollout")  # each an arm entry of its own rule
AA = "vanilla, again (A/A)"
SHARED = "vanilla, share_prompt"  # grpo.share_prompt=true: each distinct prompt once in the loss forwards
TRL_FULL, TRL_DELTA = "TRL GRPOTrainer, all weights", "TRL GRPOTrainer, δS only"
CONFIGS = (ARMS[0], AA, *ARMS[1:], SHARED, TRL_FULL, TRL_DELTA)
OURS = (*ARMS, AA, SHARED)
ARM_TARGET = {"erase_one_sided": 1.10, "route_batch": 1.10, "route_per_rollout": 1.25}  # x vanilla (the issue)
TRL_TARGET = 0.7  # ours vanilla <= 0.7 x TRL
PHASES = ("generate", "reward", "fwd_ref", "fwd_policy", "backward", "edit", "optimizer", "calibration", "other")
SEED = 41


# --- the cheap deterministic reward, shared by both loops -------------------------------------------------------


def text_reward(text: str) -> float:
    return float(int(hashlib.sha256(text.encode()).hexdigest(), 16) % 4)


@dataclasses.dataclass(frozen=True)
class FakeGrade:
    """What `train` reads from a grade (tests/test_train.py's fake grader, with a text-hash reward)."""

    reward: float
    label: str = "incorrect"
    eq_correct: bool = False
    is_reward_hack_strict: bool = False
    is_reward_hack_loose: bool = False


# --- phase timers and EOS suppression (wrap, never edit, the functions the loops call; only while the run lasts) ---


def fwd_kind() -> str:
    return "fwd_policy" if torch.is_grad_enabled() else "fwd_ref"


def phase_patches(ph: Phases) -> list[tuple[object, str, object]]:
    """The loops' functions wrapped by the phase timers, for `harness.patched`."""
    from transformers import Trainer
    from trl import GRPOTrainer

    timed_fns = [
        (torch.Tensor, "backward", "backward"),
        (gate_mod, "completion_grads", "calibration"),  # the gate's calibration (gate.GateState)
        (train_mod, "rollout_logprobs", fwd_kind),
        (train_mod, "shared_prompt_logprobs", fwd_kind),
        (proj, "edit_coords", "edit"),
        (proj, "route_per_rollout", "edit"),
        (proj, "rollout_scores", "edit"),
        (proj, "band_gate", "edit"),
        (RotatedAdam, "rotate", "edit"),
        (RotatedAdam, "step", "optimizer"),  # per-group clipping happens inside
        (GRPOTrainer, "_get_per_token_logps_and_entropies", fwd_kind),
        (Trainer, "_clip_grad_norm", "optimizer"),  # optimizer.step itself: the callback below
    ]
    return [(obj, attr, ph.wrap(phase, getattr(obj, attr))) for obj, attr, phase in timed_fns]


def instrument_model(model, eos_ids: list[int], ph: Phases | None) -> None:
    """EOS suppressed only while the model samples (every row samples exactly max_new_tokens), sampling timed as
    `generate`: TRL's `model.generate`, and ours, `rollout.sample_chunk` (wrapped by `eos_sampling` while the
    benchmark runs, to read this state)."""
    state = {"gen": False}
    eos = torch.tensor(eos_ids)

    def hook(mod, inp, out):
        return out.index_fill(-1, eos, float("-inf")) if state["gen"] else None

    model.lm_head.register_forward_hook(hook)
    model._bench_sampling = state, ph
    orig = model.generate

    @functools.wraps(orig)
    def generate(*a, **k):
        return sampling(model, orig, *a, **k)

    model.generate = generate


def sampling(model, fn, *a, **k):
    """Run a sampling call of `model` with its EOS suppression on, timed as the `generate` phase."""
    state, ph = model._bench_sampling
    state["gen"] = True
    try:
        return ph.call("generate", fn, *a, **k) if ph is not None else fn(*a, **k)
    finally:
        state["gen"] = False


def eos_sampling(sample_chunk):
    """`rollout.sample_chunk` for this run (rollout.generate looks the name up at call time): a model marked by
    `instrument_model` samples with EOS suppressed, timed as `generate`; any other model as before."""

    @functools.wraps(sample_chunk)
    def chunk(model, *a, **k):
        if not hasattr(model, "_bench_sampling"):
            return sample_chunk(model, *a, **k)
        return sampling(model, sample_chunk, model, *a, **k)

    return chunk


# --- the shared world: params, prompts, calibration pairs, basis ------------------------------------------------


def arm_spec(name: str) -> Arm:
    """The run spec of a benchmarked arm: an entry named after its rule (vanilla: plain coordinates, no basis)."""
    return make(name, name, basis=name != "vanilla")


def bench_params(B: int, G: int, max_new: int, micro_batch: int, steps: int, recal: int, rank: int, threads: int):
    """params.yaml's, shrunk to the benchmark's shape, with the gradient gate and every group sampled knob on (the
    measured arms' mechanics: params.yaml's act gate and deploy groups are masked routing's choices, and route_batch
    takes no deploy groups); each arm then runs on its `arms.run_params`."""
    p = load_params(ROOT / "params.yaml")
    return dataclasses.replace(
        p,
        model=dataclasses.replace(p.model, name="tiny-random"),
        adapter=dataclasses.replace(p.adapter, rank=rank),
        grpo=dataclasses.replace(
            p.grpo,
            steps=steps,
            prompts_per_step=B,
            group_size=G,
            micro_batch=micro_batch or B * G,
            save_every=10**6,
            threads=threads,
        ),
        rollout=dataclasses.replace(p.rollout, max_new_tokens=max_new, max_prompt_tokens=4096 - max_new),
        pool=dataclasses.replace(p.pool, mix=0.0),
        basis=dataclasses.replace(p.basis, space="grad"),
        # frozen basis: v_hack is never re-extracted during these steps (projection.refresh_every = 0)
        projection=dataclasses.replace(p.projection, recal_every=recal, refresh_every=0, deploy_frac=0.0),
    )


def build_world(p) -> dict:
    """Prompts (first B minileet training problems, modes cycled), calibration pairs, and the basis."""
    splits = base_splits(p, ROOT / "data" / "leetcode" / "leetcode_test_medhard.jsonl")
    B = p.grpo.prompts_per_step
    records = [apply_mode(q, MODES[i % len(MODES)], "train") for i, q in enumerate(splits["train"][:B])]
    holdout = {q.id: q for q in splits["holdout"]}
    pairs = load_pairset(pairset_path(ROOT / "data" / "pairsets", p.substrate, p.basis.pairset))
    ex, ca = select_pairs(pairs, "extract"), select_pairs(pairs, "calibrate")
    cal = HeldOutPairs(pair_records(ca, holdout), [q.hack for q in ca], [q.clean for q in ca])
    tok = tiny_tokenizer()
    m = tiny_model(len(tok))
    attach_adapters(m, p.adapter.targets, p.adapter.rank)
    t = time.perf_counter()
    xr = pair_records(ex, holdout)
    gh = completion_grads(m, tok, xr, [q.hack for q in ex], p.rollout.temperature)
    gc = completion_grads(m, tok, xr, [q.clean for q in ex], p.rollout.temperature)
    # permissive thresholds (as tests/test_train.py): a random model must still keep directions, or the edits are
    # no-ops and there is nothing to time; the module drop fraction and k are params.yaml's
    b = p.basis
    basis = build_basis(gh, gc, BasisSettings("svd", b.k, 0.0, 0.99, 50, b.drop_bottom_frac, b.seed))
    t_basis = time.perf_counter() - t
    if not basis.vh:
        raise RuntimeError("the benchmark basis kept no direction; the edits would be no-ops")
    dims = {n: a.dim for n, a in adapters(m).items()}
    return {"records": records, "cal": cal, "basis": basis, "n_extract": len(ex), "t_basis": t_basis, "dims": dims}


def prompt_tokens(tok, records) -> list[int]:
    """Prompt lengths as ours tokenizes them; asserts TRL's chat-template tokenization gives the same ids."""
    out = []
    for r in records:
        msgs = [dict(m) for m in r.prompt]
        ours = tok(render_prompt(tok, msgs), add_special_tokens=False)["input_ids"]
        trl = tok.apply_chat_template(
            [msgs], add_generation_prompt=True, tokenize=True, return_dict=True, enable_thinking=False
        )["input_ids"][0]
        if list(ours) != list(trl):
            raise RuntimeError("TRL's prompt tokens differ from ours; the comparison would not be like for like")
        out.append(len(ours))
    return out


# --- the configurations -----------------------------------------------------------------------------------------


def ours_job(p, world: dict, arm_name: str, workdir: Path, after_reward, ph: Phases | None):
    """A thunk that runs `train` for one configuration (an arm, or SHARED); `after_reward(name)` is called inside every
    grader call."""
    if arm_name == SHARED:
        p, arm_name = dataclasses.replace(p, grpo=dataclasses.replace(p.grpo, share_prompt=True)), ARMS[0]
    arm = arm_spec(arm_name)
    p = run_params(p, arm)  # as the train stage runs it: the keys only masked routing reads neutral
    tok = tiny_tokenizer()
    m = tiny_model(len(tok))
    attach_adapters(m, p.adapter.targets, p.adapter.rank)
    instrument_model(m, eos_token_ids(m, tok), ph)
    tag = workdir.name

    def grade(records, texts, sandbox, timeout_s):
        t = time.perf_counter()
        out = [FakeGrade(text_reward(x)) for x in texts]
        if ph is not None:
            ph.add("reward", time.perf_counter() - t)
        after_reward(tag)
        return out

    def run() -> None:
        rb = RunBasis(
            basis=world["basis"] if arm.reads_basis else None, cal=world["cal"] if arm.gate is not None else None
        )
        run = train_mod.Run(
            p,
            arm,
            SEED,
            m,
            tok,
            world["records"],
            workdir / "ckpt",
            workdir / "log.tsv",
            rb,
            signature={"bench": arm_name},
            grade_fn=grade,
            timings_path=workdir / "timings.tsv",
        )
        train_mod.train(run, progress=False)

    return run


def trl_job(
    p, world: dict, mode: str, workdir: Path, base_dir: Path, after_reward, ph: Phases | None, step_times: list | None
):
    """A thunk that runs TRL's GRPOTrainer for p.grpo.steps optimizer steps; mode "full" or "delta" (δS only)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = tiny_tokenizer()
    m = tiny_model(len(tok))
    m.config._name_or_path = str(base_dir)  # TRL builds its reference model from here (same base weights)
    if mode == "delta":
        attach_adapters(m, p.adapter.targets, p.adapter.rank)  # only δS, δS_h require grad
    instrument_model(m, eos_token_ids(m, tok), ph)
    tag = workdir.name
    g, r = p.grpo, p.rollout
    N = g.group_size * g.prompts_per_step

    def reward(completions, **kw):
        t = time.perf_counter()
        out = [text_reward(c[0]["content"]) for c in completions]
        if ph is not None:
            ph.add("reward", time.perf_counter() - t)
        after_reward(tag)
        return out

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if step_times is not None:
                step_times.append(time.perf_counter() - self.t0)

        def on_pre_optimizer_step(self, args, state, control, **kw):
            self.t1 = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kw):
            if ph is not None:
                ph.add("optimizer", time.perf_counter() - self.t1)

    ds = Dataset.from_dict({"prompt": [[dict(x) for x in q.prompt] for q in world["records"]]})
    cfg = GRPOConfig(
        output_dir=str(workdir / "trl"),
        use_cpu=True,
        report_to=[],
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=N,
        gradient_accumulation_steps=1,
        num_generations=g.group_size,
        max_completion_length=r.max_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=0,
        beta=g.beta,
        epsilon=g.clip_eps_low,
        epsilon_high=g.clip_eps_high,
        loss_type="dr_grpo",
        scale_rewards="none",
        use_bias_correction_kl=False,
        learning_rate=g.lr,
        lr_scheduler_type="constant",
        weight_decay=g.weight_decay,
        max_grad_norm=g.max_norm,
        max_steps=g.steps,
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
        chat_template_kwargs={"enable_thinking": False},
        dataloader_num_workers=0,
        seed=0,
    )
    tr = GRPOTrainer(
        model=m, reward_funcs=reward, args=cfg, train_dataset=ds, processing_class=tok, callbacks=[Timer()]
    )
    assert tr.args.steps_per_generation == 1 and tr.args.generation_batch_size == N
    assert not getattr(tr.model, "is_gradient_checkpointing", False)
    n_train = sum(x.numel() for x in tr.model.parameters() if x.requires_grad)
    world.setdefault("trl_trainable", {})[mode] = n_train

    def run() -> None:
        tr.train()
        if mode == "delta" and not any(float(a.delta.detach().abs().max()) > 0 for a in adapters(m).values()):
            raise RuntimeError("TRL (δS only) did not move δS")

    return run


# --- memory probe (fresh subprocess per configuration) ----------------------------------------------------------


def status_mb(key: str) -> float:
    """A memory line of /proc/self/status in MiB: VmRSS (resident now) or VmHWM (resident high-water mark).

    VmHWM belongs to the address space created at exec, so a fresh subprocess starts from zero; `ru_maxrss` does not
    (Linux carries it across fork+exec, so a child forked from a 1.7 GB parent reports >= 1.7 GB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def probe(config: str, world_path: Path, threads: int) -> None:
    """Child process: set up one configuration, train it, print its RSS after setup and its peak RSS."""
    import datasets  # noqa: F401 - every probe imports the same libraries, so their baselines compare
    import trl  # noqa: F401

    torch.set_num_threads(threads)
    saved = torch.load(world_path, weights_only=False)
    p, world = saved["p"], saved["world"]
    work = Path(tempfile.mkdtemp(prefix="probe_", dir=world_path.parent))  # removed with the parent's temp dir
    if config in OURS:
        job = ours_job(p, world, config, work / "ours", lambda _: None, None)
    else:
        mode = "full" if config == TRL_FULL else "delta"
        job = trl_job(p, world, mode, work / "trl", Path(saved["base_dir"]), lambda _: None, None, None)
    setup = status_mb("VmRSS")
    job()
    peak = status_mb("VmHWM")
    print("PROBE " + json.dumps({"setup_mb": setup, "peak_mb": peak}), flush=True)


def memory(configs: list[str], world_path: Path, threads: int) -> dict[str, dict]:
    out = {}
    env = src_env(OMP_NUM_THREADS=str(threads))
    for c in configs:
        res = subprocess.run(
            [sys.executable, __file__, "--probe", c, "--probe-world", str(world_path), "--threads", str(threads)],
            capture_output=True,
            text=True,
            env=env,
        )
        line = [x for x in res.stdout.splitlines() if x.startswith("PROBE ")]
        if res.returncode != 0 or not line:
            raise RuntimeError(f"memory probe {c!r} failed:\n{res.stderr[-3000:]}")
        out[c] = json.loads(line[-1][6:])
        print(f"memory {c}: {out[c]}", flush=True)
    return out


# --- statistics and the report ----------------------------------------------------------------------------------


def analyse(
    sched: Scheduler, step_wall: dict[str, list[float]], warmup: int, recal: int, recal_params: int
) -> dict[str, dict]:
    """Per configuration: timed cycles (segments 1+warmup .. S-1; the tail after the last reward is dropped)."""
    res = {}
    for c in CONFIGS:
        segs = sched.segments[c]
        # segment 0 = setup + first rollout; 1..S-1 = full cycles; S = tail (after the last reward call)
        timed = list(range(1 + warmup, len(segs) - 1))
        cal = [j for j in timed if "calibration" in segs[j]["phases"]]
        plain = [j for j in timed if j not in cal]
        sw = step_wall.get(c, [])
        waits = sched.waits[c]
        aligned = [sw[k] - waits[k] for k in range(1 + warmup - 1, min(len(sw), len(waits)))]
        # step k contains calibration iff k % recal == 0 (route_per_rollout); the aligned list starts at step `warmup`
        a_steps = list(range(warmup, warmup + len(aligned)))
        a_cal = [aligned[i] for i, k in enumerate(a_steps) if c == "route_per_rollout" and k % recal == 0]
        a_plain = [aligned[i] for i, k in enumerate(a_steps) if not (c == "route_per_rollout" and k % recal == 0)]
        res[c] = {
            "segs": segs,
            "timed": timed,
            "cal": cal,
            "plain": plain,
            "wall": [segs[j]["wall"] for j in plain],
            "cpu": [segs[j]["cpu"] for j in plain],
            "wall_cal": [segs[j]["wall"] for j in cal],
            "cpu_cal": [segs[j]["cpu"] for j in cal],
            "aligned": a_plain,
            "aligned_cal": a_cal,
        }
    v = res[ARMS[0]]
    vw = {j: v["segs"][j]["wall"] for j in v["plain"]}
    for r in res.values():
        paired = [r["segs"][j]["wall"] / vw[j] for j in r["plain"] if j in vw]
        r["paired"] = paired
        pc = [r["segs"][j]["wall"] / vw[j] for j in r["cal"] if j in vw]
        r["paired_cal"] = pc
        # amortised over recal_every steps: (R-1) ordinary steps + 1 calibration step
        for key, R in (("amort_run", recal), ("amort_params", recal_params)):
            if r["wall_cal"]:
                r[key] = ((R - 1) * median(r["wall"]) + median(r["wall_cal"])) / R
                r[key + "_cpu"] = ((R - 1) * median(r["cpu"]) + median(r["cpu_cal"])) / R
            else:
                r[key], r[key + "_cpu"] = median(r["wall"]), median(r["cpu"])
    return res


def phase_table(res: dict[str, dict]) -> list[str]:
    lines = md_head(["configuration", *PHASES, "**total**"])

    def row(label: str, idx: list[int], segs: list[dict]) -> str:
        cells = []
        for ph in PHASES[:-1]:
            cells.append(median([segs[j]["phases"].get(ph, 0.0) for j in idx]) * 1e3)
        other = median([segs[j]["wall"] - sum(segs[j]["phases"].values()) for j in idx]) * 1e3
        total = median([segs[j]["wall"] for j in idx]) * 1e3
        return f"| {label} | " + " | ".join(f"{x:.0f}" for x in [*cells, other]) + f" | **{total:.0f}** |"

    for c in CONFIGS:
        r = res[c]
        lines.append(row(c, r["plain"], r["segs"]))
        if r["cal"]:
            lines.append(row(f"{c}: calibration steps only (n={len(r['cal'])})", r["cal"], r["segs"]))
    return lines


def fmt_ratio(x: float) -> str:
    return f"{x:.3f}"


def span(xs: list[float]) -> str:
    """min-max in ms, or n/a for an empty list (e.g. a run too short to have ordinary steps)."""
    return f"{min(xs) * 1e3:.0f}-{max(xs) * 1e3:.0f}" if xs else "n/a"


def report(out: Path, meta: dict, res: dict[str, dict], mem: dict[str, dict], cmd: str) -> str:
    p = meta["p"]
    g, r = p.grpo, p.rollout
    R, Rp = p.projection.recal_every, meta["recal_params"]
    V = res[ARMS[0]]
    v_wall, v_cpu, v_al = median(V["wall"]), median(V["cpu"]), median(V["aligned"])
    lines = [
        "# GRPO step cost: arms vs vanilla, ours vs TRL GRPOTrainer, peak memory",
        "",
        f"Re-run: `{cmd}`",
        "",
        f"Generated on {platform.node()} ({machine()}; device `cpu`, fp32, torch {torch.__version__}, transformers "
        f"{meta['versions']['transformers']}, trl {meta['versions']['trl']}; **{meta['threads']} intra-op "
        f"thread{'s' if meta['threads'] > 1 else ''}**, fixed in every thread and probe; load average "
        f"{meta['load0']} at start, {meta['load1']} at end; whole run {meta['wall']:.0f}s of which the interleaved "
        f"timing loop {meta['t_loop']:.0f}s).",
        "",
        "## Setup",
        "",
        f"* Model: the in-process tiny Qwen3 of the tests (`tiny.tiny_model`: d={meta['cfg'].hidden_size}, "
        f"{meta['cfg'].num_hidden_layers} layers, {meta['cfg'].num_attention_heads} heads x {meta['cfg'].head_dim}, "
        f"{meta['cfg'].num_key_value_heads} kv heads, d_ff={meta['cfg'].intermediate_size}, vocab {meta['vocab']}, "
        f"tied embeddings; {meta['n_params']} weights), random init (seed 0), fp32; in-process tiny BPE tokenizer.",
        f"* Workload per step: B={g.prompts_per_step} minileet training prompts (hinted, {min(meta['plen'])}-"
        f"{max(meta['plen'])} tokens, mean {sum(meta['plen']) / len(meta['plen']):.0f}) x G={g.group_size} = "
        f"**N={g.prompts_per_step * g.group_size} completions x {r.max_new_tokens} tokens** (EOS suppressed while "
        f"sampling, so every completion in every configuration is exactly {r.max_new_tokens} tokens), T="
        f"{r.temperature}, top_p={r.top_p}; beta={g.beta} (reference forward on); ours micro_batch={g.micro_batch}; "
        f"lr {g.lr}, clip 0.2/0.2, grad-norm clip {g.max_norm}. Reward: sha256(text) mod 4 (cheap, deterministic).",
        f"* Ours: SVD adapter r={p.adapter.rank} (capped at min(d_in, d_out): {sum(meta['dims'].values())} δS "
        f"entries over {len(meta['dims'])} projections, the same again for δS_h); basis from the "
        f"{meta['n_extract']} real `{p.basis.pairset}` extraction pairs (svd, k≤{p.basis.k}, module drop "
        f"{p.basis.drop_bottom_frac}, permissive σ/sign thresholds): k_total={meta['k_total']} directions over "
        f"{meta['n_kept']} modules (built in {meta['t_basis']:.1f}s, not timed); `route_per_rollout` gate calibrated "
        f"on the {meta['n_cal']} real calibration pairs ({2 * meta['n_cal']} sequences) every recal_every={R} steps "
        f"in this run (params.yaml: {Rp}). Teacher pool off (mix=0). Checkpoints only at steps 0 and the end "
        "(outside the timed cycles).",
        f"* TRL {meta['versions']['trl']} `GRPOTrainer`: see the module docstring for every setting; "
        f"per_device_train_batch_size={g.prompts_per_step * g.group_size}, gradient_accumulation_steps=1 "
        f"(steps_per_generation=1: one generation batch and one optimizer step per trainer step). Trainable: "
        f"all weights = {meta['trl_trainable'].get('full', 'n/a')} parameters; δS only = "
        f"{meta['trl_trainable'].get('delta', 'n/a')} (δS and δS_h of the same adapter; ours has the same "
        "trainable tensors).",
        f"* {meta['steps']} steps per configuration, interleaved step by step in one process (one thread each, one "
        f"running at a time, order rotated every round), first cycle (setup) and {meta['warmup']} warm-up cycle "
        f"dropped: n={len(V['wall'])} timed steps per configuration ({len(res['route_per_rollout']['cal'])} of "
        "route_per_rollout's are calibration steps, reported separately).",
        "",
        "What one step contains. **Ours** (`train.train`): render + tokenize the prompts, KV-cache sampling "
        "(`rollout.generate`), decode, reward, advantages, per micro-batch a reference forward (adapters off, "
        "no_grad) and a policy forward with per-sample probes, Dr.GRPO loss, backward, then the arm's edit in "
        "rotated coordinates (per-rollout gate scores for route_per_rollout), diagnostics, RotatedAdam with "
        "per-group clipping, one TSV log row; every recal_every steps route_per_rollout also recalibrates its gate "
        "(per-sample gradients of the calibration pairs). **TRL**: chat-template tokenization, `model.generate`, "
        "decode, reward, advantages, reference forward (its separate reference model, no_grad), policy forward "
        "(its fused log-prob head, plus entropies), loss, backward, `clip_grad_norm_`, AdamW step, LR scheduler, "
        "metric bookkeeping.",
        "",
        "## Step time",
        "",
        "Columns: median wall time of a timed step (one full cycle between two reward calls); min-max over the "
        "timed steps; **ratio** of medians to the reference row; the interquartile range of the paired per-round "
        "ratios (same round = same position in the rotation and the same moment of machine load), the spread to "
        "read; the same ratio in process CPU time; the ratio of the step-aligned wall times (our log's `dt`, TRL's "
        "callback step, each minus the time waiting for the turn) as a cross-check; peak RSS of a fresh process "
        "running that configuration alone.",
        "",
        "### 1. Arms vs vanilla (ours, through `projected_grpo.rl.train.train`)",
        "",
        "| configuration | n | median wall (ms) | min-max (ms) | **ratio to vanilla** | paired ratio IQR | "
        "CPU ratio | "
        "dt ratio | peak RSS (MiB) | target | met |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def mem_cell(c: str) -> str:
        m = mem.get("vanilla" if c == AA else c)
        return f"{m['peak_mb']:.0f}" if m else "n/a"

    verdicts = {}
    for c in (ARMS[0], AA, *ARMS[1:], SHARED):
        x = res[c]
        w = median(x["wall"])
        ratio = w / v_wall
        q = quartiles(x["paired"])
        tgt = ARM_TARGET.get(c)
        if c == "route_per_rollout":
            judged = x["amort_params"] / v_wall
            met = "n/a" if tgt is None else ("**yes**" if judged <= tgt else "**no**")
            verdicts[c] = (judged, tgt)
            tcell = f"≤ {tgt:.2f} (amortised)"
        else:
            met = "n/a" if tgt is None else ("**yes**" if ratio <= tgt else "**no**")
            if tgt is not None:
                verdicts[c] = (ratio, tgt)
            tcell = f"≤ {tgt:.2f}" if tgt else {ARMS[0]: "reference", AA: "1 (noise)"}.get(c, "-")
        label = c if c != "route_per_rollout" else "route_per_rollout, steps without calibration"
        lines.append(
            f"| {label} | {len(x['wall'])} | {w * 1e3:.0f} | {span(x['wall'])} | "
            f"**{fmt_ratio(ratio)}** | {q[0]:.3f}-{q[1]:.3f} | {fmt_ratio(median(x['cpu']) / v_cpu)} | "
            f"{fmt_ratio(median(x['aligned']) / v_al)} | {mem_cell(c)} | "
            f"{tcell if c != 'route_per_rollout' else '-'} | {met if c != 'route_per_rollout' else '-'} |"
        )
    x = res["route_per_rollout"]
    if x["wall_cal"]:
        wc = median(x["wall_cal"])
        lines.append(
            f"| route_per_rollout, calibration steps only | {len(x['wall_cal'])} | {wc * 1e3:.0f} | "
            f"{span(x['wall_cal'])} | **{fmt_ratio(wc / v_wall)}** | "
            f"{min(x['paired_cal']):.3f}-{max(x['paired_cal']):.3f} (min-max) | "
            f"{fmt_ratio(median(x['cpu_cal']) / v_cpu)} | "
            f"{fmt_ratio(median(x['aligned_cal']) / v_al) if x['aligned_cal'] else 'n/a'} | - | - | - |"
        )
        tgt = ARM_TARGET["route_per_rollout"]
        for key, RR, label in (("amort_run", R, "this run's"), ("amort_params", Rp, "params.yaml's")):
            a = x[key] / v_wall
            judged = key == "amort_params"
            lines.append(
                f"| route_per_rollout, amortised at recal_every={RR} ({label}) | - | {x[key] * 1e3:.0f} | - | "
                f"**{fmt_ratio(a)}** | - | {fmt_ratio(x[key + '_cpu'] / v_cpu)} | - | "
                f"{mem_cell('route_per_rollout')} | {f'≤ {tgt:.2f}' if judged else '-'} | "
                f"{('**yes**' if a <= tgt else '**no**') if judged else '-'} |"
            )
    lines += [
        "",
        f"Amortised = ((R−1)·median ordinary step + median calibration step) / R, judged at params.yaml's "
        f"recal_every={Rp} (this run recalibrates every {R} steps only to time more calibration steps).",
        "",
        "### 2. Our vanilla vs TRL's GRPOTrainer",
        "",
        "| ours | configuration | trains | n | median wall (ms) | min-max (ms) | **ours / this** | "
        "paired IQR of ours/this | CPU ours/this | dt ours/this | peak RSS (MiB) | target | met |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in (ARMS[0], SHARED):
        ro = res[o]
        o_wall, o_cpu, o_al = median(ro["wall"]), median(ro["cpu"]), median(ro["aligned"])
        ow_by_round = {j: ro["segs"][j]["wall"] for j in ro["plain"]}
        for c, trains in (
            (TRL_FULL, f"all {meta['trl_trainable'].get('full')} weights"),
            (TRL_DELTA, f"δS, δS_h ({meta['trl_trainable'].get('delta')})"),
        ):
            x = res[c]
            w = median(x["wall"])
            ratio = o_wall / w
            paired = [ow_by_round[j] / x["segs"][j]["wall"] for j in x["plain"] if j in ow_by_round]
            q = quartiles(paired)
            verdicts[c if o == ARMS[0] else (o, c)] = (ratio, TRL_TARGET)
            lines.append(
                f"| {o} | {c} | {trains} | {len(x['wall'])} | {w * 1e3:.0f} | {span(x['wall'])} | "
                f"**{fmt_ratio(ratio)}** | {q[0]:.3f}-{q[1]:.3f} | "
                f"{fmt_ratio(o_cpu / median(x['cpu']))} | {fmt_ratio(o_al / median(x['aligned']))} | {mem_cell(c)} | "
                f"≤ {TRL_TARGET:.2f} | {'**yes**' if ratio <= TRL_TARGET else '**no**'} |"
            )
    lines += [
        "",
        f"Ours: `vanilla` at params.yaml's defaults (median {v_wall * 1e3:.0f} ms, trains δS, δS_h: "
        f"{2 * sum(meta['dims'].values())} entries), and the same with `grpo.share_prompt: true` (median "
        f"{median(res[SHARED]['wall']) * 1e3:.0f} ms; each distinct prompt runs once in the reference and policy "
        "forwards, equal up to float rounding: tests/test_train.py). A ratio below 1 means ours is faster.",
        "",
        "## Where the time goes",
        "",
        "Median milliseconds per timed step by phase (ordinary steps; route_per_rollout's calibration steps on "
        "their own row). generate = sampling, prefill included (TRL: `model.generate`; ours: `rollout.sample_chunk`); "
        "reward = the hash reward; fwd_ref / "
        "fwd_policy = our `rollout_logprobs` (`shared_prompt_logprobs` with share_prompt) or TRL's "
        "`_get_per_token_logps_and_entropies` without / with grad; "
        "backward = `Tensor.backward`; edit = our projection functions and rotations (`edit_coords`, "
        "`route_per_rollout`, `rollout_scores`, `band_gate`, `RotatedAdam.rotate`); optimizer = `RotatedAdam.step` "
        "(clipping inside) or TRL's `clip_grad_norm_` + `optimizer.step`; calibration = the two `completion_grads` "
        "calls of the gate; other = the rest of the cycle (tokenization, decode, advantages, per-sample gradient "
        "concatenation, diagnostics, logging; TRL's bookkeeping). Phase medians need not add up to the median total.",
        "",
        *phase_table(res),
        "",
        "## Peak memory",
        "",
        f"One fresh subprocess per configuration, {meta['mem_steps']} steps (route_per_rollout calibrates at step 0). "
        "`VmRSS after setup` = resident set after imports (torch, transformers, trl, datasets in every probe), "
        "model, tokenizer, basis and trainer construction; `peak RSS` = VmHWM at the end (the process's resident "
        "high-water mark since exec, allocator caching included; not `ru_maxrss`, which Linux carries over from the "
        "forking parent); their difference bounds what training adds. "
        "torch on CPU has no allocator peak counter, so this is resident memory, not tensor bytes.",
        "",
        "| configuration | VmRSS after setup (MiB) | peak RSS (MiB) | peak − setup (MiB) |",
        "|---|---|---|---|",
    ]
    for c, m in mem.items():
        lines.append(f"| {c} | {m['setup_mb']:.0f} | {m['peak_mb']:.0f} | {m['peak_mb'] - m['setup_mb']:.0f} |")
    if not mem:
        lines.append("| (skipped: --mem-steps 0) | | | |")
    sd = meta.get("side")
    if sd:
        lines += [
            "",
            "## Side measurement: logits for every position vs only where the loss reads them",
            "",
            f"Our `logprobs.rollout_logprobs` runs the LM head and log-softmax over all {sd['L']} positions of each "
            f"row (prompt + completion) and then keeps the last {sd['T']}; HF's `logits_to_keep={sd['T'] + 1}` "
            "computes only those (TRL's fused head does the equivalent). Same N rows and prompts as above, adapter "
            f"model, interleaved, {6} repeats, process CPU time; the log-probs are "
            f"{'bit-identical' if sd['same'] else 'NOT identical'}.",
            "",
            "| call | all positions (ms) | logits_to_keep (ms) | ratio |",
            "|---|---|---|---|",
            f"| policy fwd+bwd through the probes (N={sd['N']}) | {sd['fb'][0] * 1e3:.0f} | {sd['fb'][1] * 1e3:.0f} | "
            f"{sd['fb'][1] / sd['fb'][0]:.3f} |",
            f"| reference forward, no_grad | {sd['fo'][0] * 1e3:.0f} | {sd['fo'][1] * 1e3:.0f} | "
            f"{sd['fo'][1] / sd['fo'][0]:.3f} |",
        ]
    lines += ["", "## Reading", "", *reading(res, verdicts, meta, v_wall), ""]
    return "\n".join(lines)


def reading(res: dict, verdicts: dict, meta: dict, v_wall: float) -> list[str]:
    """Notes filled from this run's numbers; every missed target names what dominates."""
    p = meta["p"]
    out = []
    aa = median(res[AA]["wall"]) / v_wall
    q = quartiles(res[AA]["paired"])
    out.append(
        f"* A/A: the second vanilla runs at {aa:.3f}x the first (paired IQR {q[0]:.3f}-{q[1]:.3f}); "
        "differences of that size are noise."
    )

    def ph(c: str, name: str, idx_key: str = "plain") -> float:
        r = res[c]
        return median([r["segs"][j]["phases"].get(name, 0.0) for j in r[idx_key]])

    def other(c: str) -> float:
        r = res[c]
        return median([r["segs"][j]["wall"] - sum(r["segs"][j]["phases"].values()) for j in r["plain"]])

    for c in ("erase_one_sided", "route_batch"):
        ratio, tgt = verdicts[c]
        d_edit = (ph(c, "edit") + ph(c, "optimizer") + other(c)) - (
            ph(ARMS[0], "edit") + ph(ARMS[0], "optimizer") + other(ARMS[0])
        )
        s = f"* {c}: {ratio:.3f}x vanilla, target ≤ {tgt:.2f}: **{'met' if ratio <= tgt else 'missed'}**."
        s += (
            f" The arm's own extra work (edit + optimizer + other vs vanilla's) is {d_edit * 1e3:+.0f} ms per "
            f"step ({d_edit / v_wall * 100:+.1f}% of vanilla's step)."
        )
        out.append(s)
    c = "route_per_rollout"
    r = res[c]
    ratio, tgt = verdicts[c]
    plain = median(r["wall"]) / v_wall
    s = (
        f"* route_per_rollout: {plain:.3f}x vanilla on steps without calibration; amortised over "
        f"recal_every={meta['recal_params']} (params.yaml) {ratio:.3f}x, target ≤ {tgt:.2f}: "
        f"**{'met' if ratio <= tgt else 'missed'}**."
    )
    if r["cal"]:
        cal_ms = ph(c, "calibration", "cal")
        s += (
            f" A calibration costs {cal_ms * 1e3:.0f} ms ({cal_ms / v_wall:.2f} vanilla steps: per-sample "
            f"gradients of {2 * meta['n_cal']} calibration sequences of ~{meta['cal_len']:.0f} tokens, i.e. "
            f"{2 * meta['n_cal'] / (p.grpo.prompts_per_step * p.grpo.group_size):.1f}x the N="
            f"{p.grpo.prompts_per_step * p.grpo.group_size} rollouts' rows, each fwd+bwd); spread over "
            f"{meta['recal_params']} steps it adds {cal_ms / meta['recal_params'] / v_wall * 100:.1f}% per step."
        )
    d_gate = ph(c, "edit") - ph(ARMS[0], "edit")
    s += f" The per-rollout gate and routing themselves add {d_gate * 1e3:+.0f} ms per ordinary step."
    out.append(s)
    model_calls = ("generate", "fwd_ref", "fwd_policy", "backward")
    share = sum(ph(ARMS[0], k) for k in model_calls) / v_wall
    for c in (TRL_FULL, TRL_DELTA):
        ratio, tgt = verdicts[c]
        sh, _ = verdicts[(SHARED, c)]
        w = median(res[c]["wall"])
        s = (
            f"* ours vs {c}: ours takes {ratio:.3f}x its step time at params.yaml's defaults, target ≤ {tgt:.2f}: "
            f"**{'met' if ratio <= tgt else 'missed'}**; with `grpo.share_prompt: true` {sh:.3f}x: "
            f"**{'met' if sh <= tgt else 'missed'}**."
        )
        if ratio > tgt:
            theirs = sum(ph(c, k) for k in model_calls)
            s += (
                " Per phase (ours vs this, ms): "
                + ", ".join(f"{k} {ph(ARMS[0], k) * 1e3:.0f} vs {ph(c, k) * 1e3:.0f}" for k in model_calls)
                + f", other {other(ARMS[0]) * 1e3:.0f} vs {other(c) * 1e3:.0f}. Both loops make the same model "
                f"calls on the same tokens, and those calls are {share * 100:.0f}% of our step "
                f"({theirs / w * 100:.0f}% of this one's); a {tgt}x step would need ours to drop "
                f"{(v_wall - tgt * w) * 1e3:.0f} ms per step"
            )
            if v_wall - tgt * w > (1 - share) * v_wall:
                s += (
                    ", more than everything outside the model calls, so it is out of reach without doing less "
                    "model work per step than TRL does. `grpo.share_prompt` does less: each group's prompt runs "
                    f"once instead of G={p.grpo.group_size} times in both loss forwards and the backward "
                    f"(fwd_ref {ph(SHARED, 'fwd_ref') * 1e3:.0f}, fwd_policy {ph(SHARED, 'fwd_policy') * 1e3:.0f}, "
                    f"backward {ph(SHARED, 'backward') * 1e3:.0f} ms)."
                )
            else:
                s += f" ({(v_wall - tgt * w) / v_wall * 100:.0f}% of ours)."
        out.append(s)
    g_ours, g_bare, g_ad = ph(ARMS[0], "generate"), ph(TRL_FULL, "generate"), ph(TRL_DELTA, "generate")
    s = (
        f"* Sampling: `model.generate` takes {g_ours * 1e3:.0f} ms per step in ours and {g_ad * 1e3:.0f} ms in TRL "
        f"on the same adapter model, {g_bare * 1e3:.0f} ms in TRL on the bare model (ours "
        f"{(g_ours / g_bare - 1) * 100:+.0f}% vs bare)."
    )
    if g_ours > 1.1 * g_bare:
        s += (
            f" At every decode step each of the {len(meta['dims'])} wrapped projections runs the unmerged rank-r "
            "path (δS+δS_h add, x V, ⊙, @ Uᵀ, add); δS is constant during a rollout, so sampling from merged "
            "weights W + U diag(δS+δS_h) Vᵀ would avoid that overhead (not measured here)."
        )
    out.append(s)
    sd = meta.get("side")
    if sd:
        out.append(
            f"* Logits over prompt positions: computing the LM head and log-softmax only at the {sd['T']} "
            f"completion positions instead of all {sd['L']} changes the policy fwd+bwd to "
            f"{sd['fb'][1] / sd['fb'][0]:.3f}x and the reference forward to {sd['fo'][1] / sd['fo'][0]:.3f}x "
            "(side measurement above), with identical log-probs; the gate calibration's `completion_grads` "
            "has the same pattern (`completion_logprobs` keeps logits for every position)."
        )
    return out


# --- side measurement: logits at every position vs only where the loss reads them ---------------------------------


def logits_probe(p, records, repeats: int) -> dict:
    """Our `rollout_logprobs` (logits for prompt AND completion positions, then sliced) vs the same forward with HF's
    `logits_to_keep=T+1` (only the positions the loss reads, as TRL's fused head does), on this run's N rows: policy
    fwd+bwd through the probes, and the no_grad reference forward. Interleaved, process CPU time."""
    from projected_grpo.policy.adapter import probes
    from projected_grpo.policy.logprobs import rollout_logprobs, token_logprobs

    tok = tiny_tokenizer()
    m = tiny_model(len(tok))
    attach_adapters(m, p.adapter.targets, p.adapter.rank)
    G, T = p.grpo.group_size, p.rollout.max_new_tokens
    enc = [
        tok(render_prompt(tok, [dict(x) for x in q.prompt]), add_special_tokens=False)["input_ids"]
        for q in records
        for _ in range(G)
    ]
    N, Tp = len(enc), max(len(e) for e in enc)
    pi = torch.full((N, Tp), tok.pad_token_id)
    pm = torch.zeros((N, Tp), dtype=torch.long)
    for i, e in enumerate(enc):
        pi[i, Tp - len(e) :], pm[i, Tp - len(e) :] = torch.tensor(e), 1
    gen = torch.Generator().manual_seed(0)
    ci = torch.randint(len(SPECIAL), len(tok), (N, T), generator=gen)
    cm = torch.ones((N, T), dtype=torch.long)
    temp = p.rollout.temperature

    def keep(model, pi, pm, ci, cm, temperature):
        ids, att = torch.cat([pi, ci], 1), torch.cat([pm, cm], 1)
        pos = (att.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=att, position_ids=pos, logits_to_keep=T + 1).logits[:, :-1]
        return token_logprobs(logits, ci, temperature)

    with torch.no_grad():
        same = torch.equal(rollout_logprobs(m, pi, pm, ci, cm, temp), keep(m, pi, pm, ci, cm, temp))

    def fb(fn):
        def run() -> None:
            m.zero_grad(set_to_none=True)
            with probes(m, N):
                fn(m, pi, pm, ci, cm, temp).sum().backward()

        return run

    def fo(fn):
        def run() -> None:
            with torch.no_grad():
                fn(m, pi, pm, ci, cm, temp)

        return run

    out = {"same": same, "N": N, "L": Tp + T, "T": T}
    for key, a, b in (("fb", fb(rollout_logprobs), fb(keep)), ("fo", fo(rollout_logprobs), fo(keep))):
        t = interleaved({"all": a, "keep": b}, repeats)  # one warm-up each, then a b, b a, ...
        out[key] = tuple(median([cpu for cpu, _ in t[k]]) for k in ("all", "keep"))
    return out


# --- main -------------------------------------------------------------------------------------------------------


def main(
    out: Path = typer.Option(ROOT / "reports" / "bench" / "train.md", help="Markdown report to write."),
    threads: int = typer.Option(1, help="torch intra-op threads, fixed in every thread and probe (2 shared cores)."),
    steps: int = typer.Option(16, help="Optimizer steps per configuration (first cycle and the warm-up dropped)."),
    warmup: int = typer.Option(1, help="Full cycles dropped after the setup cycle."),
    prompts: int = typer.Option(4, help="B: prompts per step."),
    group: int = typer.Option(4, help="G: completions per prompt."),
    max_new_tokens: int = typer.Option(64, help="Completion length (EOS suppressed, so every completion has it)."),
    micro_batch: int = typer.Option(0, help="Our micro-batch rows; 0 = N = B·G (one forward/backward, as TRL's)."),
    recal_every: int = typer.Option(5, help="Gate recalibration period in this run (amortised result uses params')."),
    rank: int = typer.Option(0, help="SVD adapter rank; 0 = params.yaml adapter.rank (capped per module)."),
    mem_steps: int = typer.Option(4, help="Steps per memory probe subprocess; 0 skips the memory probes."),
    probe_config: str = typer.Option(None, "--probe", hidden=True),
    probe_world: Path = typer.Option(None, "--probe-world", hidden=True),
) -> None:
    """Step time of erase_one_sided / route_batch / route_per_rollout vs vanilla through `train.train`, our vanilla
    vs TRL 1.16 GRPOTrainer (all weights, and δS only) on the same tiny Qwen3, prompts, G, B, lengths and reward,
    interleaved step by step in one process; peak RSS per configuration in fresh subprocesses. See the module
    docstring for the method."""
    torch.set_num_threads(threads)
    # our sampler, rollout.sample_chunk, suppresses EOS for the benchmark's models: while this run lasts, not at import
    with patched([(rollout_mod, "sample_chunk", eos_sampling(rollout_mod.sample_chunk))]):
        if probe_config is not None:
            probe(probe_config, probe_world, threads)
        else:
            bench(
                out, threads, steps, warmup, prompts, group, max_new_tokens, micro_batch, recal_every, rank, mem_steps
            )


def bench(
    out: Path,
    threads: int,
    steps: int,
    warmup: int,
    prompts: int,
    group: int,
    max_new_tokens: int,
    micro_batch: int,
    recal_every: int,
    rank: int,
    mem_steps: int,
) -> None:
    """The timing loop, the memory probes, the side measurement and the report (`main`'s options)."""
    import logging

    import transformers
    import trl

    transformers.logging.set_verbosity_error()
    logging.getLogger("trl").setLevel(logging.ERROR)
    t_start = time.perf_counter()
    load0 = loadavg()
    params_yaml = load_params(ROOT / "params.yaml")
    p = bench_params(
        prompts, group, max_new_tokens, micro_batch, steps, recal_every, rank or params_yaml.adapter.rank, threads
    )
    world = build_world(p)
    tok = tiny_tokenizer()
    plen = prompt_tokens(tok, world["records"])
    base = tiny_model(len(tok))
    tmp = Path(tempfile.mkdtemp(prefix="bench_train_"))
    base_dir = tmp / "base"
    base.save_pretrained(base_dir)  # TRL's reference model is loaded from here
    print(f"world ready: prompts {plen}, k_total {world['basis'].meta['k_total']}", flush=True)

    ph = Phases()
    sched = Scheduler(list(CONFIGS), ph)
    trl_steps: dict[str, list[float]] = {TRL_FULL: [], TRL_DELTA: []}
    jobs = {}
    with patched(phase_patches(ph)):
        for c in CONFIGS:
            wd = tmp / c.replace(" ", "_").replace(",", "").replace("/", "")
            wd.mkdir(parents=True)
            hand = functools.partial(lambda name, _tag: sched.handoff(name), c)
            if c in OURS:
                jobs[c] = ours_job(p, world, ARMS[0] if c == AA else c, wd, hand, ph)
            else:
                mode = "full" if c == TRL_FULL else "delta"
                jobs[c] = trl_job(p, world, mode, wd, base_dir, hand, ph, trl_steps[c])
        t_loop = time.perf_counter()
        run_threads(jobs, sched, init=lambda: torch.set_num_threads(threads))
        t_loop = time.perf_counter() - t_loop
    step_wall = dict(trl_steps)
    for c in OURS:
        wd = tmp / c.replace(" ", "_").replace(",", "").replace("/", "")
        rows = read_tsv(wd / "log.tsv")
        step_wall[c] = [row["dt"] for row in read_tsv(wd / "timings.tsv")]
        lens = {row["len"] for row in rows}
        assert lens == {float(max_new_tokens)}, f"{c}: completion lengths {lens}"
    print("timing done", flush=True)

    mem = {}
    if mem_steps > 0:
        pm = dataclasses.replace(p, grpo=dataclasses.replace(p.grpo, steps=mem_steps))
        wp = tmp / "world.pt"
        torch.save(
            {"p": pm, "world": {k: v for k, v in world.items() if k != "trl_trainable"}, "base_dir": str(base_dir)}, wp
        )
        mem = memory([*ARMS, SHARED, TRL_FULL, TRL_DELTA], wp, threads)

    side = logits_probe(p, world["records"], 6)
    print(f"logits probe: {side}", flush=True)
    res = analyse(sched, step_wall, warmup, recal_every, params_yaml.projection.recal_every)
    cal_tok = [
        len(tok(render_prompt(tok, [dict(m) for m in q.prompt]), add_special_tokens=False)["input_ids"])
        + len(tok(h)["input_ids"])
        for q, h in zip(world["cal"].records, world["cal"].hack + world["cal"].clean)
    ]
    cmd = f"PYTHONPATH=src python benchmarks/train.py --out {out}"
    defaults = {
        "threads": 1,
        "steps": 16,
        "warmup": 1,
        "prompts": 4,
        "group": 4,
        "max_new_tokens": 64,
        "micro_batch": 0,
        "recal_every": 5,
        "rank": 0,
        "mem_steps": 4,
    }
    given = {
        "threads": threads,
        "steps": steps,
        "warmup": warmup,
        "prompts": prompts,
        "group": group,
        "max_new_tokens": max_new_tokens,
        "micro_batch": micro_batch,
        "recal_every": recal_every,
        "rank": rank,
        "mem_steps": mem_steps,
    }
    cmd += "".join(f" --{k.replace('_', '-')} {v}" for k, v in given.items() if v != defaults[k])
    cfg = base.config
    meta = {
        "p": p,
        "threads": threads,
        "steps": steps,
        "warmup": warmup,
        "plen": plen,
        "cfg": cfg,
        "vocab": len(tok),
        "n_params": sum(x.numel() for x in base.parameters()),
        "dims": world["dims"],
        "n_extract": world["n_extract"],
        "k_total": world["basis"].meta["k_total"],
        "n_kept": len(world["basis"].vh),
        "t_basis": world["t_basis"],
        "n_cal": len(world["cal"].hack),
        "cal_len": sum(cal_tok) / len(cal_tok),
        "recal_params": params_yaml.projection.recal_every,
        "trl_trainable": world.get("trl_trainable", {}),
        "mem_steps": mem_steps,
        "versions": {"transformers": transformers.__version__, "trl": trl.__version__},
        "load0": load0,
        "load1": loadavg(),
        "wall": time.perf_counter() - t_start,
        "t_loop": t_loop,
    }
    meta["side"] = side
    text = report(out, meta, res, mem, cmd)
    shutil.rmtree(tmp, ignore_errors=True)
    write_report(out, text + "\n")
    print(text)


if __name__ == "__main__":
    typer.run(main)

"""`params.yaml` -> frozen dataclasses. The only module that reads `params.yaml`; unknown keys raise."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from projected_grpo.env.modes import MODES

T = TypeVar("T")

SUBSTRATES = ("minileet", "leetcode")
LEVELS = ("easy", "medium", "hard")  # minileet's difficulty levels
DEVICES = ("auto", "cpu", "cuda")  # model.device (or cuda:N); policy/model.resolve_device
MODEL_DTYPES = ("float32", "bfloat16")  # model.dtype: the base weights'; adapter masters stay fp32
# Name lists live here, and the modules that dispatch on them import them, so config (yaml + dataclasses) stays
# light to import and nothing is kept equal by hand.
MAX_SPLIT = 99999  # minileet ids are <split base> + index, 100000 apart


def require(section: str, obj, **rules: tuple[typing.Callable[[Any], bool], str]) -> None:
    """Check `obj`'s fields: rules key=(predicate, what it must be); the first failing one raises a ValueError that
    names the key and its value, e.g. `grpo.steps must be >= 1, got -5`."""
    for key, (ok, must) in rules.items():
        v = getattr(obj, key)
        if not ok(v):
            raise ValueError(f"{section}.{key} must be {must}, got {v!r}")


def at_least(n: float, note: str = "") -> tuple[typing.Callable[[Any], bool], str]:
    """A `require` rule: v >= n."""
    return (lambda v: v >= n), f">= {n}{note}"


POS, NONNEG = at_least(1), at_least(0)  # the common rules of `require`
PROB = (lambda v: 0 <= v <= 1, "in [0, 1]")
OPEN01 = (lambda v: 0 < v < 1, "in (0, 1)")
TOP_P = (lambda v: 0 < v <= 1, "in (0, 1]")
POSITIVE = (lambda v: v > 0, "> 0")


@dataclass(frozen=True)
class GraderParams:
    # upstream: labels identical to the benchmark, its two holes included; hardened: holes closed, label `tamper`.
    mode: str = "hardened"
    # Wall-clock seconds per execution (one of the five per response), calibrated on this machine (reports/bench).
    timeout_s: float = 10.0
    # Sandboxed executions in flight at once (worker processes).
    concurrency: int = 2
    # Address-space limit per execution, MiB (upstream: 1024).
    mem_mb: int = 1024

    def __post_init__(self) -> None:
        if self.mode not in ("upstream", "hardened"):
            raise ValueError(f"grader.mode must be 'upstream' or 'hardened', got {self.mode!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"grader.timeout_s must be > 0, got {self.timeout_s}")
        if self.concurrency < 1:
            raise ValueError(f"grader.concurrency must be >= 1, got {self.concurrency}")
        if self.mem_mb < 64:
            raise ValueError(f"grader.mem_mb must be >= 64, got {self.mem_mb}")


@dataclass(frozen=True)
class MinileetParams:
    # Training problems generated (upstream's filtered train split has 992).
    n_train: int = 1000
    # Test problems (the size of the real leetcode test file).
    n_test: int = 119
    # Holdout problems (contrastive pairs, probes); upstream's holdout has 352.
    n_holdout: int = 352
    # Float in [0, 1] (each problem's level is drawn from difficulty +- spread, cut in thirds) or easy|medium|hard.
    difficulty: float | str = 0.5
    # Half-width of the per-problem level draw around `difficulty` (float difficulty only).
    spread: float = 0.25
    # Restrict to these minileet family names; null = all families.
    families: tuple[str, ...] | None = None
    # GT asserts per problem (the benchmark needs >= 20).
    n_asserts: int = 30
    # Longest user-prompt text kept, characters.
    max_prompt_chars: int = 700

    def __post_init__(self) -> None:
        for name, lo in (("n_train", 1), ("n_test", 1), ("n_holdout", 0)):
            v = getattr(self, name)
            if not lo <= v <= MAX_SPLIT:
                raise ValueError(f"minileet.{name} must be in [{lo}, {MAX_SPLIT}], got {v}")
        d = self.difficulty
        if isinstance(d, bool) or not (d in LEVELS if isinstance(d, str) else 0.0 <= d <= 1.0):
            raise ValueError(f"minileet.difficulty must be a float in [0, 1] or one of {LEVELS}, got {d!r}")
        if self.spread < 0:
            raise ValueError(f"minileet.spread must be >= 0, got {self.spread}")
        if self.families is not None and (not self.families or len(set(self.families)) != len(self.families)):
            raise ValueError(
                f"minileet.families must be null (all) or a non-empty list without repeats, got {list(self.families)}"
            )
        if self.n_asserts < 20:
            raise ValueError(f"minileet.n_asserts must be >= 20 (benchmark.md §7), got {self.n_asserts}")
        if self.max_prompt_chars < 200:
            raise ValueError(
                f"minileet.max_prompt_chars must be >= 200 (the template alone is ~200), got {self.max_prompt_chars}"
            )


@dataclass(frozen=True)
class LeetcodeParams:
    # Train jsonl in the benchmark schema (upstream's train split is not available offline); null = none. Also list
    # the file under the stage's deps in dvc.yaml, or DVC will not notice when its contents change.
    train_path: str | None = None
    # Holdout jsonl in the benchmark schema; null = carve `n_holdout` problems out of the train problems instead.
    holdout_path: str | None = None
    # No train_path: split the test file itself, by a seeded shuffle of ids, into test / train (+ holdout).
    # Contamination-prone (benchmark.md §7); must be set explicitly.
    train_from_test: bool = False
    # With train_from_test: problems of the test file kept as test; the rest become train (+ holdout).
    n_test: int = 39
    # Without holdout_path: train problems moved (seeded, disjoint) to holdout; 0 = empty holdout.
    n_holdout: int = 20
    # Seed of the train_from_test split and the holdout carve; fixed across training seeds so the test set is too.
    split_seed: int = 0

    def __post_init__(self) -> None:
        if self.n_test < 1:
            raise ValueError(f"leetcode.n_test must be >= 1, got {self.n_test}")
        if self.n_holdout < 0:
            raise ValueError(f"leetcode.n_holdout must be >= 0, got {self.n_holdout}")
        if self.train_path is not None and self.train_from_test:
            raise ValueError(
                "leetcode.train_path and leetcode.train_from_test are both set; choose one (set "
                "train_from_test: false to use train_path)"
            )


@dataclass(frozen=True)
class EnvParams:
    # Modes the training prompts are partitioned over (one mode per prompt, even counts); see modes.MODES.
    modes: tuple[str, ...] = MODES
    # Seed of the prompt -> mode partition.
    partition_seed: int = 0

    def __post_init__(self) -> None:
        unknown = [m for m in self.modes if m not in MODES]
        if unknown:
            raise ValueError(f"env.modes: unknown mode(s) {unknown}; choose from {', '.join(MODES)}")
        if not self.modes or len(set(self.modes)) != len(self.modes):
            raise ValueError(f"env.modes must be a non-empty list without repeats, got {list(self.modes)}")


@dataclass(frozen=True)
class ModelParams:
    # Policy: a hub id or local save_pretrained dir (real setting, e.g. Qwen/Qwen3-4B), `organism` (the organism
    # stage's artifact), or `tiny-random` (a tiny Qwen3 built in-process, for tests).
    name: str = "organism"
    # Where the policy (and the teacher) run: cpu, cuda (cuda:N) or auto (cuda when one is visible, else cpu).
    device: str = "cpu"
    # The base weights' dtype: float32 or bfloat16. δS, δS_h, probes, bases and the rotated Adam state stay fp32.
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("model.name must be a hub id, a local path, 'organism' or 'tiny-random'")
        if not (self.device in DEVICES or re.fullmatch(r"cuda:\d+", self.device)):
            raise ValueError(f"model.device must be one of {', '.join(DEVICES)} or cuda:N, got {self.device!r}")
        if self.dtype not in MODEL_DTYPES:
            raise ValueError(f"model.dtype must be one of {', '.join(MODEL_DTYPES)}, got {self.dtype!r}")


@dataclass(frozen=True)
class OrganismParams:
    # Byte-level BPE vocabulary size of the organism's tokenizer (trained on the SFT corpus).
    vocab_size: int = 2048
    # Qwen3 shape: hidden size, layers, attention heads, key/value heads, head dim, MLP size, context length.
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 384
    max_positions: int = 512
    # SFT optimisation: steps, sequences per step, peak learning rate (AdamW), warmup steps, weight decay.
    steps: int = 600
    batch_size: int = 32
    lr: float = 3.0e-3
    warmup: int = 40
    weight_decay: float = 0.01
    # SFT corpus: completions drawn per training prompt, and the mixture (canonical vs wrong; exploit probability
    # applies only to prompts that carry a loophole hint).
    n_per_prompt: int = 4
    p_canonical: float = 0.5
    p_wrong: float = 0.5
    p_exploit: float = 0.2
    # Teacher: continues from the base with a corpus whose exploit probability on hinted prompts is this high.
    teacher_p_exploit: float = 0.95
    teacher_steps: int = 250
    teacher_lr: float = 3.0e-3
    # CPU threads for training (results are deterministic for a fixed thread count).
    threads: int = 2
    # The organism draw: seeds its initialisation, SFT corpus and batch order (problems and hints stay the global
    # `seed`'s); None = the global seed.
    seed: int | None = None

    def draw_seed(self, global_seed: int) -> int:
        """The seed the organism is built with."""
        return global_seed if self.seed is None else self.seed

    def __post_init__(self) -> None:
        for k in ("p_canonical", "p_wrong", "p_exploit", "teacher_p_exploit"):
            if not 0.0 <= getattr(self, k) <= 1.0:
                raise ValueError(f"organism.{k} must be a probability in [0, 1], got {getattr(self, k)}")
        if self.p_canonical + self.p_wrong <= 0:
            raise ValueError(
                f"organism.p_canonical + organism.p_wrong must be > 0, got {self.p_canonical} + {self.p_wrong}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"organism.num_heads must be a multiple of organism.num_kv_heads, got {self.num_heads} and "
                f"{self.num_kv_heads}"
            )
        require("organism", self, steps=POS, batch_size=POS, n_per_prompt=POS)


@dataclass(frozen=True)
class CalibrationParams:
    # Samples per held-out prompt, sampling temperature and nucleus mass, and the completion budget in tokens.
    n_samples: int = 4
    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 160
    # Completions generated per forward batch.
    batch_size: int = 64

    def __post_init__(self) -> None:
        rules = dict(n_samples=POS, max_new_tokens=POS, batch_size=POS, temperature=POSITIVE, top_p=TOP_P)
        require("calibration", self, **rules)


ADAPTER_KINDS = ("svd", "lora")
ADAPTER_TARGETS = ("all", "residual_writers")  # adapter.TARGETS maps each to its module names (tested)
BASIS_METHODS = ("svd", "mean_diff", "random", "solve_orth")
BASIS_SPACES = ("grad", "act")
PAIRSETS = (
    "prog_wide",
    "prog_wider",
    "intent_vs_spec",
    "honesty_text",
    "moral",
    "eval_aware",
    "philosophical",
    "null_city",
)


@dataclass(frozen=True)
class AdapterParams:
    # svd: δS rescales each wrapped Linear's top-r singular values (method.md §3.1); lora: fixed A, trained B.
    kind: str = "svd"
    # Wrapped projections: all (q,k,v,o,gate,up,down) or residual_writers (o_proj, down_proj).
    targets: str = "all"
    # r: singular directions per module (svd) or LoRA rank; capped per module at min(d_in, d_out).
    rank: int = 64
    # The knob's directions: shared (δS_h adds to δS in the same r coordinates) or separate (its own: svd, W's singular
    # directions r+1 … 2r; lora, a second fixed A orthogonal to the first), so deleting it removes nothing the main
    # uses. separate: masked routing only (it trains the knob on its own gradient; the other rules move δS's).
    quarantine: str = "shared"

    def __post_init__(self) -> None:
        if self.quarantine not in ("shared", "separate"):
            raise ValueError(f"adapter.quarantine must be shared or separate, got {self.quarantine!r}")
        if self.kind not in ADAPTER_KINDS:
            raise ValueError(f"adapter.kind must be one of {ADAPTER_KINDS}, got {self.kind!r}")
        if self.targets not in ADAPTER_TARGETS:
            raise ValueError(f"adapter.targets must be one of {ADAPTER_TARGETS}, got {self.targets!r}")
        if self.rank < 1:
            raise ValueError(f"adapter.rank must be >= 1, got {self.rank}")


@dataclass(frozen=True)
class RolloutParams:
    # Sampling temperature of training rollouts; every log-prob uses logits / temperature (TRL), v_hack included.
    temperature: float = 0.7
    # Nucleus mass of training rollouts.
    top_p: float = 1.0
    # Completion budget in tokens (also Dr.GRPO's constant normaliser L_max).
    max_new_tokens: int = 160
    # Longest prompt in tokens; a longer one stops the run naming the prompt (never truncated or filtered).
    max_prompt_tokens: int = 384
    # Rows per sampling call of a training rollout (the sampler's KV cache grows with it); null = all B·G rows at once.
    # Another value samples other completions (one seeded stream runs through the calls in turn).
    batch_size: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"rollout.temperature must be > 0, got {self.temperature}")
        require("rollout", self, top_p=TOP_P, max_new_tokens=POS, max_prompt_tokens=POS)
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"rollout.batch_size must be null (all rows at once) or >= 1, got {self.batch_size}")


LOSSES = ("dr_grpo", "grpo", "dapo")  # grpo_loss.aggregate: TRL's loss_type of the same name
SCALE_REWARDS = ("none", "group")  # advantages r - mean, or (r - mean) / (std + 1e-4): TRL's scale_rewards
LR_SCHEDULES = ("constant", "cosine")  # rl/schedule.py, after a linear warmup (transformers' *_with_warmup)


@dataclass(frozen=True)
class GRPOParams:
    # Optimizer updates per run (one update per step: fully on-policy).
    steps: int = 100
    # Prompts per step (B) and completions per prompt (G); N = B·G rollouts per step.
    prompts_per_step: int = 8
    group_size: int = 8
    # Adam on δS (and δS_h) in the basis' rotated coordinates: learning rate, betas, epsilon, decoupled decay.
    lr: float = 0.02
    betas: tuple[float, ...] = (0.9, 0.99)
    eps: float = 1.0e-8
    weight_decay: float = 0.0
    # adam (rotated, the design), sgd (reference optimizer of the invariant tests).
    optimizer: str = "adam"
    # Learning-rate schedule over `steps` updates, one factor for every parameter group (main δS and knob δS_h):
    # constant or cosine (to 0 at `steps`), each after `warmup_steps` of linear warmup from 0 (transformers' and
    # verl's get_*_schedule_with_warmup: update t < warmup_steps uses lr·t/warmup_steps, so update 0 uses lr 0).
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    # Loss aggregation (TRL loss_type): dr_grpo (token sum / (N·L_max), method.md §3.7), grpo (mean over rollouts of
    # each rollout's token mean) or dapo (token mean over the step's N rollouts).
    loss: str = "dr_grpo"
    # Advantage scaling (TRL scale_rewards): none (r − group mean, Dr.GRPO) or group (/ (group std + 1e-4), GRPO).
    scale_rewards: str = "none"
    # PPO ratio clip range [1 − low, 1 + high].
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    # k3 KL-to-reference coefficient (reference = adapter off); 0 disables the reference forward.
    beta: float = 0.001
    # With beta = 0, the KL to the reference is still measured (logged, never trained on) every this many steps; 0 =
    # never. Training is the same either way.
    kl_every: int = 10
    # Gradient-norm clip per parameter group: main δS and knob δS_h.
    max_norm: float = 1.0
    max_norm_knob: float = 1.0
    # Rows per forward/backward (micro-batch); gradients accumulate to the full-batch gradient exactly.
    micro_batch: int = 16
    # Also cap each micro-batch at this many tokens, rows × (padded prompt + completion), at least one row; 0 = rows
    # only. Gradients still accumulate to the full-batch gradient exactly.
    micro_batch_tokens: int = 0
    # Recompute each decoder layer's activations in the backward instead of keeping them (activation checkpointing):
    # less memory for about one more forward; the same gradients.
    grad_checkpointing: bool = False
    # Checkpoint every this many updates (and at update 0 and at the end).
    save_every: int = 10
    # CPU threads for training (results are deterministic for a fixed thread count).
    threads: int = 2
    # Run each distinct prompt once in the loss forwards (its KV cache shared by the group's rows); equal to the
    # per-row forward up to float rounding. Per-rollout/per-token routing keeps per-row policy forwards.
    share_prompt: bool = False

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError(f"grpo.group_size must be >= 2 (advantages are group-relative), got {self.group_size}")
        require("grpo", self, steps=POS, prompts_per_step=POS, micro_batch=POS, save_every=POS, threads=POS)
        if not (0 <= self.clip_eps_low < 1 and self.clip_eps_high >= 0 and self.lr > 0 and self.beta >= 0):
            raise ValueError("grpo: need 0 <= clip_eps_low < 1, clip_eps_high >= 0, lr > 0, beta >= 0")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"grpo.optimizer must be adam or sgd, got {self.optimizer!r}")
        for key, known in (("lr_schedule", LR_SCHEDULES), ("loss", LOSSES), ("scale_rewards", SCALE_REWARDS)):
            if getattr(self, key) not in known:
                raise ValueError(f"grpo.{key} must be one of {', '.join(known)}, got {getattr(self, key)!r}")
        if self.warmup_steps < 0:
            raise ValueError(f"grpo.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.micro_batch_tokens < 0:
            raise ValueError(f"grpo.micro_batch_tokens must be >= 0 (0 = no token cap), got {self.micro_batch_tokens}")
        require(
            "grpo",
            self,
            betas=(lambda v: len(v) == 2, "two numbers"),
            max_norm=POSITIVE,
            max_norm_knob=POSITIVE,
            kl_every=NONNEG,
        )


@dataclass(frozen=True)
class PoolParams:
    # The hacky teacher: `organism` (the organism stage's teacher) or a hub id / save_pretrained directory.
    teacher: str = "organism"
    # Teacher-pool completions per training prompt (stage `pool`).
    n_per_prompt: int = 4
    # Fraction of each group's G completions drawn from the pool (off-policy); 0 = on-policy only.
    mix: float = 0.25
    # Steps from this one on use no pool rows.
    teacher_off_step: int = 50
    # Completions generated per forward batch when building the pool.
    batch_size: int = 64

    def __post_init__(self) -> None:
        mix = (lambda v: 0 <= v < 1, "in [0, 1)")
        require("pool", self, mix=mix, n_per_prompt=POS, teacher_off_step=NONNEG, batch_size=POS)


@dataclass(frozen=True)
class ProjectionParams:
    # Routing gate: soft (linear between the thresholds) or half (0.5 inside the band); tail: m = 1 only above tau_hi
    # (the held-out clean scores' 1 − f quantile: the top tail, f the share of clean routed, e.g. 0.10), 0 elsewhere,
    # and the gate's precision / recall / F0.5 on the calibration pairs are logged.
    band: str = "soft"
    # f: clean calibration completions allowed above tau_hi; f2: hack calibration completions allowed below tau_lo.
    f: float = 0.05
    f2: float = 0.05
    # Recalibrate the gate on the held-out pairs every this many steps.
    recal_every: int = 10
    # GT-monitor baselines (penalty, screening): probability that the monitor's flag is right.
    monitor_accuracy: float = 1.0
    # Re-extract v_hack at the current parameters from the held-out extraction pairs every this many steps; 0 = frozen.
    refresh_every: int = 0
    # Adam state of modules a refresh re-rotates: reset (both moments; the safe default) or rotate (first moment
    # re-expressed with its new-span head zeroed, second reset).
    refresh_moments: str = "reset"
    # route_per_token: completion tokens in the centred window that per-token scores are averaged over.
    token_window: int = 16
    # Random-direction controls (the `controls` runs): mass = each step, what the control moves out of main (routed or
    # erased) is rescaled (one factor over all modules) to the norm the same rule moves along v_hack from the same
    # gradients and gates; rank = only the same k per module. Per-token routing's control is rank-matched either way
    # (no per-token v_hack capture); route_full's moves whole rollouts, as much as v_hack's rule would with the same
    # gates.
    random_match: str = "mass"
    # Training in the deployed state: this share of each step's prompts has its groups sampled and trained with the
    # knob off, their gradient kept out of the knob (gate 0), so the main learns to work without it. Gated routing
    # arms only; arms without a knob ignore it (knob off is their trained state). 0 = every group knob on.
    deploy_frac: float = 0.0
    # Masked routing with deploy_frac > 0: false = the deploy rows get gate 0 (their gradient reaches the main only);
    # true = the gate reads them too, scored in the knob-off forward they were sampled in, so a routed deploy rollout
    # trains only the knob (knob on, main detached) and an unrouted one the main with the knob off, as vGROUT gates
    # its rollouts sampled with the quarantine off (gen_deploy_frac). route_masked* arms only.
    deploy_gate: bool = False
    # Masked routing's advantages for the rows the main trains (gate m < 1): group = the whole group's mean (routed
    # rows included), main_rows = the mean of the group's main rows only (routed rows keep the group baseline). Other
    # arms ignore it.
    main_baseline: str = "group"
    # Masked routing's importance correction: every row is sampled with the knob on (deploy groups: off), but an
    # unrouted row trains with the knob off. false: ratio 1 at the update, as if the knob-off main had sampled it;
    # true: old_logp is the sampling state's (the first pass'), so the PPO ratio is π_trained/π_sampled, clipped, and
    # the k3 KL term is weighted by it (detached): a token the main finds far less likely than the sampler did stops
    # pushing instead of exploding KL's e^(ref − logp). Routed and ambiguous rows train in their sampling state (ratio
    # 1 either way). Other arms ignore it.
    masked_is: bool = False
    # With masked_is: the ratio capped at this value in the PPO surrogate and in the KL weight (TRL's `delta`,
    # two-sided clipping; INTELLECT-2 uses 4). PPO's clip leaves rho unbounded on negative-advantage tokens, and an
    # unrouted row's rho (knob off over knob on) can spike the gradient (reports/lab_diary.md). None = unbounded.
    masked_is_cap: float | None = None
    # Retain heal (issue 25; 0 = off, the default until it wins): after the last GRPO step, this many Adam steps of NLL
    # on the clean completions of the held-out extraction pairs, knob off, main δS only (rl/heal.py), at heal_lr with
    # heal_batch completions a step; the final checkpoint is the healed policy. Arms with a knob only.
    heal_steps: int = 0
    heal_lr: float = 1.0e-3
    heal_batch: int = 8

    def __post_init__(self) -> None:
        require("projection", self, heal_steps=at_least(0, " (0 = off)"), heal_lr=POSITIVE, heal_batch=POS)
        if self.masked_is_cap is not None and not self.masked_is:
            raise ValueError(
                f"projection.masked_is_cap caps masked_is's ratio: needs masked_is: true, got masked_is: false and "
                f"masked_is_cap: {self.masked_is_cap}"
            )
        if not 0 <= self.deploy_frac < 1:
            raise ValueError(f"projection.deploy_frac must be in [0, 1), got {self.deploy_frac}")
        if self.main_baseline not in ("group", "main_rows"):
            raise ValueError(f"projection.main_baseline must be group or main_rows, got {self.main_baseline!r}")
        if self.random_match not in ("mass", "rank"):
            raise ValueError(f"projection.random_match must be mass or rank, got {self.random_match!r}")
        if self.band not in ("soft", "half", "tail"):
            raise ValueError(f"projection.band must be soft, half or tail, got {self.band!r}")
        require("projection", self, f=OPEN01, f2=OPEN01, monitor_accuracy=PROB, recal_every=POS)
        if self.refresh_every < 0:
            raise ValueError(f"projection.refresh_every must be >= 0 (0 = frozen basis), got {self.refresh_every}")
        if self.refresh_moments not in ("rotate", "reset"):
            raise ValueError(f"projection.refresh_moments must be rotate or reset, got {self.refresh_moments!r}")
        if self.token_window < 1:
            raise ValueError(f"projection.token_window must be >= 1 (1 = no smoothing), got {self.token_window}")


@dataclass(frozen=True)
class BasisParams:
    # Pair set v_hack is extracted from (data/pairsets/<substrate>/<pairset>.jsonl).
    pairset: str = "prog_wide"
    # svd (top-k of the pair differences), mean_diff (k=1), random (Haar, same k per module), solve_orth.
    method: str = "svd"
    # grad: the routing gate scores gradients against v_hack; act: it scores the residual stream against v_act (per
    # rollout: completion-pooled; per token: windowed), the routed amount still along v_hack in δS coordinates.
    space: str = "grad"
    # k_max: most directions kept per module.
    k: int = 8
    # tau_rel: keep direction j only if sigma_j >= tau * sigma_1 (plus the sign-flip test).
    tau: float = 0.1
    # Significance level and number of random sign flips of the sign-consistency test.
    alpha_sig: float = 0.05
    n_flips: int = 1000
    # Fraction of modules with the weakest consistent signal ||mean_p d_p|| dropped (no projection, no knob).
    drop_bottom_frac: float = 0.25
    # Module ranking: none (raw norms) or per_type_zscore (within q_proj, down_proj, ...).
    score_norm: str = "none"
    # Normalise each pair difference to unit norm before the SVD.
    row_norm: bool = False
    # solve_orth: clean-solve gradient directions stripped before the SVD.
    solve_m: int = 4
    # Prompt modes whose pairs are used (held-out-mode experiments); null = all.
    modes: tuple[str, ...] | None = None
    # space=act: residual-stream layer (0-based block index) whose output is pooled.
    act_layer: int = 1
    # Seed of the sign-flip test, the random control and the bootstrap intervals.
    seed: int = 0

    def __post_init__(self) -> None:
        if self.pairset not in PAIRSETS:
            raise ValueError(
                f"basis.pairset {self.pairset!r} is not a known pair set; choose from {', '.join(PAIRSETS)}"
            )
        if self.method not in BASIS_METHODS:
            raise ValueError(f"basis.method must be one of {BASIS_METHODS}, got {self.method!r}")
        if self.space not in BASIS_SPACES:
            raise ValueError(f"basis.space must be one of {BASIS_SPACES}, got {self.space!r}")
        if self.k < 1:
            raise ValueError(f"basis.k must be >= 1, got {self.k}")
        require("basis", self, tau=PROB, alpha_sig=OPEN01, n_flips=at_least(20))
        if not 0 <= self.drop_bottom_frac < 1:
            raise ValueError(f"basis.drop_bottom_frac must be in [0, 1), got {self.drop_bottom_frac}")
        if self.score_norm not in ("none", "per_type_zscore"):
            raise ValueError(f"basis.score_norm must be none or per_type_zscore, got {self.score_norm!r}")
        require("basis", self, solve_m=NONNEG, act_layer=NONNEG)
        if self.modes is not None:
            unknown = [m for m in self.modes if m not in MODES]
            if unknown or not self.modes:
                raise ValueError(f"basis.modes: unknown or empty {list(self.modes)}; choose from {', '.join(MODES)}")


@dataclass(frozen=True)
class OracleBasisParams:
    # The oracle basis (stage oracle_basis; an upper bound, read only by *_oracle_basis arms): holdout problems drawn
    # (each under one training-surface loophole hint, the six in turn) and completions sampled per problem from the
    # final checkpoint of each vanilla seed; then hack vs non-hack pairs of the same policy and prompt.
    problems: int = 96
    samples: int = 4
    # Share of those problems whose pairs are held out (the gate's calibration, the AUROCs reported).
    cal_frac: float = 0.34
    # Prompts per sampling batch.
    batch_size: int = 32

    def __post_init__(self) -> None:
        require("oracle_basis", self, problems=at_least(2), samples=at_least(2), batch_size=POS)
        if not 0 < self.cal_frac < 1:
            raise ValueError(f"oracle_basis.cal_frac must be in (0, 1), got {self.cal_frac}")


SURFACES = ("eval", "train")  # hint surfaces of test records, in the order substrate writes them


@dataclass(frozen=True)
class EvalParams:
    # Monitor subset: test problems (stratified by base pass/fail) scored at every `curve_every`-th checkpoint.
    n_monitor: int = 64
    # Checkpoint steps that are multiples of this (plus 0 and the last) are scored on the monitor subset.
    curve_every: int = 10
    # Samples per prompt on the monitor curve, and on the full test split at the final checkpoint (benchmark: 10).
    n_samples_curve: int = 1
    n_samples: int = 10
    # Sampling temperature, nucleus mass, completion budget (benchmark protocol: T=0.7).
    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 160
    # Hint surfaces scored for hack: eval (the benchmark protocol: wording and names disjoint from training) and/or
    # train (training wording on held-out test problems).
    surfaces: tuple[str, ...] = ("eval", "train")
    # Generation seed of every evaluation (frozen with the monitor subset).
    seed: int = 0
    # Completions per forward batch, and CPU threads.
    batch_size: int = 128
    threads: int = 2

    def __post_init__(self) -> None:
        if (
            min(
                self.n_monitor,
                self.curve_every,
                self.n_samples_curve,
                self.n_samples,
                self.max_new_tokens,
                self.batch_size,
                self.threads,
            )
            < 1
        ):
            raise ValueError(
                "eval: n_monitor, curve_every, n_samples*, max_new_tokens, batch_size, threads must be >= 1"
            )
        require("eval", self, temperature=POSITIVE, top_p=TOP_P)
        if not self.surfaces or any(s not in SURFACES for s in self.surfaces):
            raise ValueError(
                f"eval.surfaces must be a non-empty subset of {list(SURFACES)}, got {list(self.surfaces)}"
            )


@dataclass(frozen=True)
class ProbeParams:
    # Distillation cosine probe: teacher-pool rows replayed through the base student (per-sample NLL gradients).
    n_rows: int = 256
    # Rows per forward/backward.
    micro_batch: int = 16
    # T1 threshold (pool hack rate); bootstrap resamples of the AUROC intervals of T2-T4.
    t1_min_hack: float = 0.30
    n_boot: int = 1000

    def __post_init__(self) -> None:
        require("probe", self, n_rows=at_least(2), micro_batch=POS, n_boot=at_least(100))


@dataclass(frozen=True)
class ArmEntry:
    """One entry of params.yaml's arm table (method/arms.py resolves it into a run's spec)."""

    # The gradient edit: vanilla, measure_only or a rule of method/projection.py's RULES (erase_one_sided,
    # route_masked, route_per_rollout, ...).
    edit: str = "vanilla"
    # correct_or_hinted (the loophole pays) or gt_only (hints present, never paid: the no-loophole ceiling).
    reward: str = "correct_or_hinted"
    # Ground-truth monitor baselines: null, penalty (-3 when flagged) or screening (advantage 0 when flagged).
    monitor: str | None = None
    # false: no teacher-pool rows whatever pool.mix.
    pool: bool = True
    # false: plain coordinates and no basis input (vanilla-like arms), so basis changes never re-run the arm.
    basis: bool = True


DEFAULT_ARMS = {
    "vanilla": ArmEntry(basis=False),
    "gt_only": ArmEntry(reward="gt_only", basis=False),
    "measure_only": ArmEntry(edit="measure_only"),
    "erase": ArmEntry(edit="erase_one_sided"),
    "route": ArmEntry(edit="route_masked"),
    "screen": ArmEntry(edit="screen"),
}


@dataclass(frozen=True)
class Params:
    # Global seed for everything that draws random numbers.
    seed: int = 0
    # Problem source: minileet (synthetic, seeded by `seed`) or leetcode (the real test file; see `leetcode`).
    substrate: str = "minileet"
    minileet: MinileetParams = field(default_factory=MinileetParams)
    leetcode: LeetcodeParams = field(default_factory=LeetcodeParams)
    env: EnvParams = field(default_factory=EnvParams)
    grader: GraderParams = field(default_factory=GraderParams)
    model: ModelParams = field(default_factory=ModelParams)
    organism: OrganismParams = field(default_factory=OrganismParams)
    calibration: CalibrationParams = field(default_factory=CalibrationParams)
    adapter: AdapterParams = field(default_factory=AdapterParams)
    rollout: RolloutParams = field(default_factory=RolloutParams)
    basis: BasisParams = field(default_factory=BasisParams)
    grpo: GRPOParams = field(default_factory=GRPOParams)
    pool: PoolParams = field(default_factory=PoolParams)
    projection: ProjectionParams = field(default_factory=ProjectionParams)
    eval: EvalParams = field(default_factory=EvalParams)
    probe: ProbeParams = field(default_factory=ProbeParams)
    oracle_basis: OracleBasisParams = field(default_factory=OracleBasisParams)
    # The arms (method/arms.py): each entry names only what sets it apart (its edit rule, reward, monitor, pool,
    # whether it reads the basis); every mechanic is a key above.
    arm: dict[str, ArmEntry] = field(default_factory=lambda: dict(DEFAULT_ARMS))
    # The DVC matrix: arms that read no basis (never re-run by basis changes), arms that do, the arms also run with
    # random directions (controls), with the grader's label as their gate (oracle_gate) and on the oracle basis with
    # its random twin (arms_oracle_basis), and seeds. Checked against the table by arms.check_matrix (check_params).
    arms_ref: tuple[str, ...] = ("vanilla", "gt_only")
    arms: tuple[str, ...] = ("measure_only", "erase", "route", "screen")
    controls: tuple[str, ...] = ("erase", "route", "screen")
    oracle_gate: tuple[str, ...] = ()
    arms_oracle_basis: tuple[str, ...] = ()
    seeds: tuple[int, ...] = (41, 42, 43)

    def __post_init__(self) -> None:
        if self.substrate not in SUBSTRATES:
            raise ValueError(f"substrate must be one of {SUBSTRATES}, got {self.substrate!r}")
        if len(set(self.seeds)) != len(self.seeds) or not self.seeds:
            raise ValueError(f"seeds must be a non-empty list without repeats, got {list(self.seeds)}")
        if self.basis.k > self.adapter.rank:
            raise ValueError(
                f"basis.k={self.basis.k} is larger than adapter.rank={self.adapter.rank}; lower basis.k "
                "or raise adapter.rank"
            )
        cap, top = self.projection.masked_is_cap, 1 + self.grpo.clip_eps_high
        if cap is not None and not cap > top:  # at or under the clip's upper bound it would clip A > 0 tokens too
            raise ValueError(f"projection.masked_is_cap={cap} must be above 1 + grpo.clip_eps_high = {top:g}")


def from_dict(cls: type[T], d: dict[str, Any], path: str = "") -> T:
    """Build dataclass `cls` from a nested dict; an unknown key raises KeyError naming its dotted path."""
    if not isinstance(d, dict):
        raise ValueError(f"{path or 'params'}: expected a mapping, got {type(d).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        where = f"{path}." if path else ""
        raise KeyError(f"unknown params key(s) {', '.join(where + k for k in unknown)}; known: {sorted(names)}")
    kwargs = {}
    for k, v in d.items():
        kwargs[k] = _convert(hints[k], v, f"{path}.{k}" if path else k)
    return cls(**kwargs)


def _convert(tp: Any, v: Any, path: str) -> Any:
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, v, path)
    origin = typing.get_origin(tp)
    if origin is dict:
        if not isinstance(v, dict):
            raise ValueError(f"{path} must be a mapping, got {v!r}")
        (_, elem) = typing.get_args(tp)
        return {str(k): _convert(elem, x, f"{path}.{k}") for k, x in v.items()}
    if origin is tuple:
        if not isinstance(v, list | tuple):
            raise ValueError(f"{path} must be a list, got {v!r}")
        (elem, _) = typing.get_args(tp)  # every tuple field is tuple[X, ...]
        return tuple(_convert(elem, x, f"{path}[{i}]") for i, x in enumerate(v))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if v is None or (isinstance(v, str) and str in args):
            return v
        return _convert(args[0], v, path)
    if tp is float and isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    if tp is float and isinstance(v, str):
        # `dvc exp run -S grpo.lr=1e-4` writes `lr: 0.0001`, but `7e-05` stays as DVC formats it, and YAML 1.1 (PyYAML)
        # reads an exponent without a dot as a string
        try:
            return float(v)
        except ValueError:
            raise ValueError(f"{path} must be a number, got {v!r}") from None
    if tp is float and not isinstance(v, float):
        raise ValueError(f"{path} must be a number, got {v!r}")
    if tp is int and (not isinstance(v, int) or isinstance(v, bool)):
        raise ValueError(f"{path} must be an integer, got {v!r}")
    if tp is bool and not isinstance(v, bool):
        raise ValueError(f"{path} must be true or false, got {v!r}")
    if tp is str and not isinstance(v, str):
        raise ValueError(f"{path} must be a string, got {v!r}")
    return v


def load_params(path: Path | str = "params.yaml") -> Params:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"params file {path} does not exist")
    return from_dict(Params, yaml.safe_load(path.read_text()) or {})


def check_params(path: Path | str = "params.yaml") -> Params:
    """`load_params` plus what only the whole file shows: every field set (a key missing from params.yaml would
    silently take the dataclass default). The arm lists are checked by `arms.check_matrix` (stage check_params)."""
    p = load_params(path)
    missing = unset_fields(Params, yaml.safe_load(Path(path).read_text()) or {})
    if missing:
        raise ValueError(f"{path} does not set {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else ""))
    return p


def unset_fields(cls: type, d: dict[str, Any], path: str = "") -> list[str]:
    """Dotted names of dataclass fields that `d` does not set (params.yaml must set every field)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        p = f"{path}.{f.name}" if path else f.name
        if f.name not in d:
            out.append(p)
        elif dataclasses.is_dataclass(hints[f.name]):
            out += unset_fields(hints[f.name], d[f.name] or {}, p)
    return out


# --- override sets (e.g. params-qwen3-4b.yaml): a partial params tree applied with `dvc exp run -S` ---------------


def overlay(base: dict[str, Any], over: dict[str, Any], path: str = "") -> dict[str, Any]:
    """`base` with `over`'s values; a key of `over` that `base` lacks raises KeyError naming its dotted path."""
    out = dict(base)
    for k, v in over.items():
        p = f"{path}.{k}" if path else k
        if k not in base:
            raise KeyError(f"unknown params key {p} in the override set; keys must exist in params.yaml")
        out[k] = overlay(base[k], v, p) if isinstance(v, dict) and isinstance(base[k], dict) else v
    return out


def with_overrides(p: Params, pairs: tuple[tuple[str, Any], ...]) -> Params:
    """`p` with dotted-key overrides (an arm's, `arms.Arm.overrides`), validated as params.yaml is."""
    if not pairs:
        return p
    tree: dict[str, Any] = {}
    for key, v in pairs:
        *path, leaf = key.split(".")
        node = tree
        for s in path:
            node = node.setdefault(s, {})
        node[leaf] = v
    return from_dict(Params, overlay(dataclasses.asdict(p), tree))


def flat_overrides(over: dict[str, Any], path: str = "") -> list[tuple[str, Any]]:
    """Dotted (key, value) leaves of an override tree, lists kept whole."""
    out = []
    for k, v in over.items():
        p = f"{path}.{k}" if path else k
        out += flat_overrides(v, p) if isinstance(v, dict) else [(p, v)]
    return out


def override_args(over_path: Path | str, params_path: Path | str = "params.yaml") -> list[str]:
    """`-S key=value` arguments for `dvc exp run` that apply the override file to params.yaml. The merged result is
    validated first (unknown key or bad value -> the error names it), so DVC never starts on a broken set."""
    over = yaml.safe_load(Path(over_path).read_text()) or {}
    from_dict(Params, overlay(yaml.safe_load(Path(params_path).read_text()) or {}, over))

    def fmt(v: Any) -> str:
        if isinstance(v, list | tuple):
            return "[" + ",".join(fmt(x) for x in v) + "]"
        return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)

    return [a for k, v in flat_overrides(over) for a in ("-S", f"{k}={fmt(v)}")]


def _main() -> None:
    """`python -m projected_grpo.config overrides FILE [PARAMS]`: the `-S` arguments of an override set."""
    import shlex

    import typer

    from projected_grpo.common.cli import message

    app = typer.Typer(
        add_completion=False,
        pretty_exceptions_enable=False,
        help="Params helpers. `check` validates a params file (what the check_params stage runs); `overrides` turns "
        "an override set into `dvc exp run -S` arguments.",
    )

    @app.command()
    def check(params: Path = typer.Argument(Path("params.yaml"), help="The params file to validate.")) -> None:
        """Validate PARAMS as the pipeline's first stage does (`dvc exp run --dry` runs no command, so it cannot)."""
        try:
            check_params(params)
        except (ValueError, KeyError, OSError) as e:
            typer.echo(f"error: {message(e)}", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"{params}: valid")

    @app.command()
    def overrides(
        over: Path = typer.Argument(..., help="Override set: a partial params tree, e.g. params-qwen3-4b.yaml."),
        params: Path = typer.Argument(Path("params.yaml"), help="The params file the set applies to."),
    ) -> None:
        """Validate OVER merged into PARAMS and print the `-S key=value` arguments that apply it, e.g.
        `dvc exp run -n qwen3-4b $(python -m projected_grpo.config overrides params-qwen3-4b.yaml)`."""
        try:
            typer.echo(" ".join(shlex.quote(a) for a in override_args(over, params)))
        except (ValueError, KeyError, OSError) as e:
            typer.echo(f"error: {message(e)}", err=True)
            raise typer.Exit(2) from None

    @app.callback()
    def _group() -> None:
        pass

    app()


if __name__ == "__main__":
    _main()

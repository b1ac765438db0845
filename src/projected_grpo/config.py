"""`params.yaml` -> frozen dataclasses. The only module that reads `params.yaml`; unknown keys raise."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from projected_grpo.modes import MODES

T = TypeVar("T")

SUBSTRATES = ("minileet", "leetcode")
LEVELS = ("easy", "medium", "hard")  # == minileet.LEVELS (tested); not imported so config stays light
MAX_SPLIT = 99999  # minileet ids are <split base> + index, 100000 apart


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
            raise ValueError(f"minileet.families must be null (all) or a non-empty list without repeats, got "
                             f"{list(self.families)}")  # fmt: skip
        if self.n_asserts < 20:
            raise ValueError(f"minileet.n_asserts must be >= 20 (benchmark.md §7), got {self.n_asserts}")
        if self.max_prompt_chars < 200:
            raise ValueError(f"minileet.max_prompt_chars must be >= 200 (the template alone is ~200), got "
                             f"{self.max_prompt_chars}")  # fmt: skip


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
            raise ValueError("leetcode.train_path and leetcode.train_from_test are both set; choose one (set "
                             "train_from_test: false to use train_path)")  # fmt: skip


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

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("model.name must be a hub id, a local path, 'organism' or 'tiny-random'")


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
    p_canonical: float = 0.45
    p_wrong: float = 0.55
    p_exploit: float = 0.1
    # Teacher: continues from the base with a corpus whose exploit probability on hinted prompts is this high.
    teacher_p_exploit: float = 0.95
    teacher_steps: int = 250
    teacher_lr: float = 3.0e-3
    # CPU threads for training (results are deterministic for a fixed thread count).
    threads: int = 2

    def __post_init__(self) -> None:
        for k in ("p_canonical", "p_wrong", "p_exploit", "teacher_p_exploit"):
            if not 0.0 <= getattr(self, k) <= 1.0:
                raise ValueError(f"organism.{k} must be a probability in [0, 1], got {getattr(self, k)}")
        if self.p_canonical + self.p_wrong <= 0:
            raise ValueError("organism.p_canonical + organism.p_wrong must be > 0")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("organism.num_heads must be a multiple of organism.num_kv_heads")
        if self.steps < 1 or self.batch_size < 1 or self.n_per_prompt < 1:
            raise ValueError("organism.steps, batch_size and n_per_prompt must be >= 1")


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
        if self.n_samples < 1 or self.max_new_tokens < 1 or self.batch_size < 1:
            raise ValueError("calibration.n_samples, max_new_tokens and batch_size must be >= 1")
        if not (self.temperature > 0 and 0 < self.top_p <= 1):
            raise ValueError("calibration.temperature must be > 0 and top_p in (0, 1]")


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

    def __post_init__(self) -> None:
        if self.substrate not in SUBSTRATES:
            raise ValueError(f"substrate must be one of {SUBSTRATES}, got {self.substrate!r}")


def from_dict(cls: type[T], d: dict[str, Any], path: str = "") -> T:
    """Build dataclass `cls` from a nested dict; an unknown key raises KeyError naming its dotted path."""
    if not isinstance(d, dict):
        raise TypeError(f"{path or 'params'}: expected a mapping, got {type(d).__name__}")
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
    if origin is tuple and isinstance(v, list | tuple):
        return tuple(v)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if v is None else _convert(args[0], v, path)
    if tp is float and isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    return v


def load_params(path: Path | str = "params.yaml") -> Params:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"params file {path} does not exist")
    return from_dict(Params, yaml.safe_load(path.read_text()) or {})


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

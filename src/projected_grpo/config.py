"""`params.yaml` -> frozen dataclasses. The only module that reads `params.yaml`; unknown keys raise."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


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
class Params:
    # Global seed for everything that draws random numbers.
    seed: int = 0
    grader: GraderParams = field(default_factory=GraderParams)


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

"""Atomic file writes: a killed or failing stage never leaves a half-written output behind."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path


def write_text(path: Path | str, text: str) -> None:
    """Write `text` to a temporary sibling, then rename it over `path` (atomic on POSIX)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


def write_json(path: Path | str, obj: object) -> None:
    """A JSON document (per-mode tables, monitor sets, knob-effect records)."""
    write_text(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def write_metrics(path: Path | str, metrics: dict) -> None:
    """The one writer of every `dvc metrics` file: sorted keys, top-level NaN written as null (dvc reads null)."""
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}
    write_text(path, json.dumps(clean, indent=1, sort_keys=True))

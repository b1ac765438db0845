"""Atomic file writes: a killed or failing stage never leaves a half-written output behind."""

from __future__ import annotations

import json
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
    write_text(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")

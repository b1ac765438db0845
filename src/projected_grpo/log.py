"""One-line progress prints and per-step TSV rows with the same fixed keys (house_style §8); final metrics.json."""

from __future__ import annotations

import json
import math
from pathlib import Path

PRINT_KEYS = ("reward", "hack", "solve", "kl", "gnorm", "routed", "dt")


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.6g}"
    return str(v)


class StepLog:
    """Appends one TSV row per step (header written once; columns fixed by the first row)."""

    def __init__(self, path: Path | str, resume_step: int = 0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.keys: list[str] | None = None
        if resume_step and self.path.exists():  # keep the rows of steps already done, drop the rest
            lines = self.path.read_text().splitlines()
            self.keys = lines[0].split("\t")
            kept = [ln for ln in lines[1:] if int(ln.split("\t")[0]) <= resume_step]
            self.path.write_text("\n".join([lines[0], *kept]) + "\n")
        elif self.path.exists():
            self.path.unlink()

    def __call__(self, step: int, total: int, **metrics: float) -> str:
        row = {"step": step, **metrics}
        if self.keys is None:
            self.keys = list(row)
            self.path.write_text("\t".join(self.keys) + "\n")
        with self.path.open("a") as f:
            f.write("\t".join(_fmt(row.get(k, float("nan"))) for k in self.keys) + "\n")
        shown = " | ".join(f"{k} {_fmt(round(metrics[k], 4))}" for k in PRINT_KEYS if k in metrics)
        return f"step {step}/{total} | {shown}"


def read_tsv(path: Path | str) -> list[dict[str, float]]:
    lines = Path(path).read_text().splitlines()
    keys = lines[0].split("\t")
    return [{k: float(v) for k, v in zip(keys, ln.split("\t"))} for ln in lines[1:]]


def write_metrics(path: Path | str, metrics: dict[str, float]) -> None:
    """Flat dict of scalars for `dvc metrics` (NaN written as null)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}
    path.write_text(json.dumps(clean, indent=1, sort_keys=True))

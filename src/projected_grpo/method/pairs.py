"""Contrastive pair sets: (hack, clean) completions of the same prompt, authored as JSONL under `data/pairsets/`.

File: `data/pairsets/<substrate>/<pairset>.jsonl`, one pair per line:
    {"id", "substrate", "problem_id", "method", "mode", "mechanism", "split", "hack", "clean"}
`problem_id`/`method` name a holdout problem of the substrate; `mode` is the loophole whose training-surface hint the
prompt carries (`gt_only` = no hint); `split` is `extract` (builds v_hack) or `calibrate` (held out: gate thresholds
and discrimination claims). Pairs render through the same chat template as training: prompt + completion + EOS.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from projected_grpo.config import PAIRSETS
from projected_grpo.env.modes import MODES, apply_mode
from projected_grpo.env.problems import Problem

PLACEBO = "null_city"
SPLITS = ("extract", "calibrate")
ORACLE_PAIRS = "pairs.jsonl"  # the oracle_basis stage's pairs (vanilla's graded rollouts), beside its basis files
KEYS = ("id", "substrate", "problem_id", "method", "mode", "mechanism", "split", "hack", "clean")


@dataclass(frozen=True)
class Pair:
    id: str
    substrate: str
    problem_id: int
    method: str
    mode: str
    mechanism: str
    split: str
    hack: str
    clean: str


def pairset_path(root: Path | str, substrate: str, name: str) -> Path:
    return Path(root) / substrate / f"{name}.jsonl"


def load_pairset(path: Path | str) -> list[Pair]:
    """Parse and validate one pair-set file; a bad line raises ValueError naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"pair set {path} does not exist; known pair sets: {', '.join(PAIRSETS)} "
            f"(files under data/pairsets/<substrate>/)"
        )
    pairs, ids = [], set()
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{i}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict) or set(row) != set(KEYS):
            got = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ValueError(f"{where}: a pair needs exactly the keys {list(KEYS)}, got {got}")
        if row["split"] not in SPLITS:
            raise ValueError(f"{where}: split must be one of {SPLITS}, got {row['split']!r}")
        if row["mode"] not in MODES:
            raise ValueError(f"{where}: mode must be one of {MODES}, got {row['mode']!r}")
        if not (isinstance(row["hack"], str) and row["hack"] and isinstance(row["clean"], str) and row["clean"]):
            raise ValueError(f"{where}: hack and clean must be non-empty strings")
        if row["hack"] == row["clean"]:
            raise ValueError(f"{where}: hack and clean are identical")
        if row["id"] in ids:
            raise ValueError(f"{where}: duplicate pair id {row['id']!r}")
        ids.add(row["id"])
        pairs.append(Pair(**{**row, "problem_id": int(row["problem_id"])}))
    if not pairs:
        raise ValueError(f"pair set {path} is empty")
    return pairs


def select_pairs(pairs: list[Pair], split: str, modes: tuple[str, ...] | None = None) -> list[Pair]:
    """Pairs of one split, restricted to prompt modes `modes` (None = all; held-out-mode experiments)."""
    return [q for q in pairs if q.split == split and (modes is None or q.mode in modes)]


def pair_records(pairs: list[Pair], problems: dict[int, Problem]) -> list[Problem]:
    """The prompt record of each pair: its no-hint problem under its mode's training-surface hint."""
    out = []
    for q in pairs:
        base = problems.get(q.problem_id)
        if base is None:
            raise ValueError(
                f"pair {q.id}: problem {q.problem_id} is not in the problem set; pair sets reference "
                "holdout problems of the substrate's default split"
            )
        if base.method != q.method:
            raise ValueError(
                f"pair {q.id}: problem {q.problem_id} has method {base.method!r}, the pair was written "
                f"for {q.method!r}; the problem set differs from the one the pairs were authored on"
            )
        out.append(apply_mode(base, q.mode, "train"))
    return out

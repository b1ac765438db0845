"""Which loophole mode each training prompt carries, and which modes the hack basis must not see.

Each training prompt gets exactly one mode (its hint is rewritten for that mode only), so the modes never overlap on
a prompt and every mode gets an even share of the training set. `held_out_modes` names the loophole modes left out of
the hack basis: the project's generalisation test is whether editing the basis directions (built from some modes)
also suppresses hacking in the modes it never saw.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence

from projected_grpo.env.modes import LOOPHOLE_MODES, MODES


def assign_modes(problem_ids: Iterable[int], modes: Sequence[str], seed: int) -> dict[int, str]:
    """Seeded, even (counts differ by <= 1), one-mode-per-prompt assignment; independent of the input order.

    Returns {id: mode} with ids in ascending order.
    """
    ids = list(problem_ids)
    if len(set(ids)) != len(ids):
        dup = sorted(i for i, n in Counter(ids).items() if n > 1)[:5]
        raise ValueError(f"problem ids must be unique, got duplicates {dup}")
    if not modes:
        raise ValueError("modes is empty; list at least one mode (env.modes)")
    if len(set(modes)) != len(modes):
        raise ValueError(f"modes {list(modes)} lists a mode twice; list each mode once (env.modes)")
    rng = random.Random(f"partition:{seed}")
    # Sort first so the result depends only on the set of ids, then deal a shuffled deck round-robin: mode j gets
    # positions j, j+M, j+2M, ... -> counts differ by at most one. Shuffling the mode order too decides (by seed)
    # which modes get the extra prompt when len(ids) is not a multiple of M.
    shuffled = sorted(ids)
    rng.shuffle(shuffled)
    order = list(modes)
    rng.shuffle(order)
    assigned = {pid: order[i % len(order)] for i, pid in enumerate(shuffled)}
    return {pid: assigned[pid] for pid in sorted(assigned)}


def held_out_modes(modes: Sequence[str], basis_modes: Sequence[str]) -> tuple[str, ...]:
    """Loophole modes of `modes` not in `basis_modes` (the basis' generalisation test), in `modes` order."""
    if not basis_modes:
        raise ValueError(
            "basis_modes is empty; name the loophole mode(s) to build the hack basis from, e.g. [run_tests]"
        )
    unknown = [m for m in basis_modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown basis mode(s) {unknown}; pick from the loophole modes {', '.join(LOOPHOLE_MODES)}")
    if "gt_only" in basis_modes:
        raise ValueError("gt_only has no exploit channel, so it cannot build a hack basis; remove it from basis_modes")
    if len(set(basis_modes)) != len(basis_modes):
        raise ValueError(f"basis_modes {list(basis_modes)} lists a mode twice; list each mode once")
    missing = [m for m in basis_modes if m not in modes]
    if missing:
        raise ValueError(f"basis mode(s) {missing} are not in env.modes {list(modes)}; add them there or drop them")
    held = tuple(m for m in modes if m in LOOPHOLE_MODES and m not in basis_modes)
    if not held:
        raise ValueError(
            f"basis_modes {list(basis_modes)} covers every loophole mode in env.modes, so none is held out to test "
            "generalisation; drop at least one mode from basis_modes"
        )
    return held

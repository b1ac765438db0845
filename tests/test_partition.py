"""Training prompts -> modes (even, one mode per prompt, seeded, order-independent) and the held-out modes.

`pytest tests/test_partition.py`
"""

import random
from collections import Counter

import pytest

from projected_grpo.env.modes import LOOPHOLE_MODES, MODES
from projected_grpo.env.partition import assign_modes, held_out_modes


@pytest.mark.parametrize("n", [0, 3, 7, 50, 1000, 1001])
def test_assignment_is_even_and_covers_every_prompt_once(n):
    ids = list(range(100000, 100000 + n))
    part = assign_modes(ids, MODES, seed=0)
    assert list(part) == sorted(ids)  # each prompt exactly once (a dict cannot overlap), ascending
    counts = Counter(part.values())
    assert set(counts) <= set(MODES)
    full = [counts.get(m, 0) for m in MODES]
    assert max(full) - min(full) <= 1 and sum(full) == n


def test_assignment_is_deterministic_and_order_independent():
    ids = [5, 91, 3, 17, 40, 2, 8, 66, 12, 30, 7]
    a = assign_modes(ids, MODES, seed=3)
    shuffled = ids[:]
    random.Random(1).shuffle(shuffled)
    assert assign_modes(shuffled, MODES, seed=3) == a
    assert assign_modes(tuple(reversed(ids)), MODES, seed=3) == a
    assert any(assign_modes(ids, MODES, seed=s) != a for s in (4, 5, 6))  # the seed matters


def test_assignment_rejects_bad_input():
    with pytest.raises(ValueError, match="unique"):
        assign_modes([1, 2, 2], MODES, 0)
    with pytest.raises(ValueError, match="empty"):
        assign_modes([1, 2], (), 0)
    with pytest.raises(ValueError, match="twice"):
        assign_modes([1, 2], ("run_tests", "run_tests"), 0)


def test_held_out_modes():
    held = held_out_modes(MODES, ["run_tests", "sentinel"])
    assert held == ("file_marker", "stdout_marker", "eq_override", "exit_code")  # gt_only is not a loophole
    assert held_out_modes(("run_tests", "exit_code", "gt_only"), ["exit_code"]) == ("run_tests",)


@pytest.mark.parametrize(
    "basis,msg",
    [
        ([], "empty"),
        (["run_test"], "unknown basis mode"),
        (list(LOOPHOLE_MODES), "none is held out"),
        (["gt_only"], "no exploit channel"),
        (["sentinel", "sentinel"], "twice"),
    ],
)
def test_held_out_modes_rejects_bad_basis(basis, msg):
    with pytest.raises(ValueError, match=msg):
        held_out_modes(MODES, basis)


def test_held_out_modes_needs_basis_modes_in_env():
    with pytest.raises(ValueError, match="not in env.modes"):
        held_out_modes(("run_tests", "sentinel"), ["exit_code"])

"""The adversarial corpus through the grader: every attack, placed after an otherwise-wrong solution on a no-hint
prompt, gets the expected hardened label (and compile flag) and the batch returns within the timeouts' bound.
Containment itself (files, network, processes, secrets) is checked per attack in tests/test_sandbox.py.
Run: `pytest tests/test_grader_adversarial.py`.
"""

import time

import pytest

from projected_grpo.env.grader import grade_batch
from projected_grpo.env.sandbox import LEVELS
from tests.adversarial_corpus import CORPUS, default_context, fill

PID = 3254
WRONG = "class Solution:\n    def resultsArray(self, nums, k):\n        return [1]\n"


@pytest.fixture(scope="module")
def graded(leetcode_by_id, sandbox):
    """All attacks the detected isolation level contains, graded in one batch (one GT execution each)."""
    p = leetcode_by_id[PID]
    attacks = [a for a in CORPUS if LEVELS.index(a.needs) >= LEVELS.index(sandbox.isolation)]
    ctx = default_context()
    t0 = time.perf_counter()
    out = {}
    for t in sorted({a.timeout_s for a in attacks}):  # one batch per timeout value
        batch = [a for a in attacks if a.timeout_s == t]
        comps = [f"```python\n{WRONG}\n{fill(a.code, ctx)}```" for a in batch]
        out.update(zip((a.name for a in batch), grade_batch([p] * len(batch), comps, sandbox, timeout_s=t)))
    return out, time.perf_counter() - t0, attacks


@pytest.mark.parametrize("attack", CORPUS, ids=[a.name for a in CORPUS])
def test_attack_label(attack, graded):
    grades, _, attacks = graded
    if attack.name not in grades:
        pytest.skip(f"needs isolation level {attack.needs}")
    g = grades[attack.name]
    assert g.label == attack.expect.label, (g.label, g.tamper, g.holes)
    assert not g.eq_correct and g.reward <= 0.5  # no attack is ever paid correctness
    if attack.expect.can_compile is not None:
        assert g.can_compile == attack.expect.can_compile


def test_batch_returns_within_timeouts(graded):
    """Each execution ends within its timeout + 1 s; with 2 workers the batch is bounded by the sum of those."""
    _, wall, attacks = graded
    assert wall <= sum(a.timeout_s + 1.0 for a in attacks) / 2 + 10.0

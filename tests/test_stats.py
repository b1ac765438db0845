"""Across-seed statistics: golden values for summaries and Wilson intervals, same-seed pairing, and the refusal to
compare runs with different seed sets.

`pytest tests/test_stats.py`
"""

import math

import pytest

from projected_grpo.common.stats import Refusal, paired_delta, summarize, t975, wilson


def test_summarize_golden_three_seeds():
    s = summarize([0.5, 0.6, 0.7])
    assert s.n == 3 and s.mean == pytest.approx(0.6) and s.std == pytest.approx(0.1)
    half = 4.303 * 0.1 / math.sqrt(3)  # t_{0.975, 2} · std / √n
    assert (s.lo, s.hi) == pytest.approx((0.6 - half, 0.6 + half))
    assert s.fmt() == "60.0% ± 10.0 [35.2, 84.8]"


def test_summarize_no_interval_below_three_and_no_std_for_one():
    two, one = summarize([0.2, 0.4]), summarize([0.3])
    assert math.isnan(two.lo) and two.fmt() == "30.0% ± 14.1"
    assert math.isnan(one.std) and one.fmt() == "30.0%"
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        summarize([0.1, math.nan])


def test_t_quantiles_table_and_tail():
    assert t975(1) == 12.706 and t975(30) == 2.042
    assert 1.96 < t975(200) < t975(31) < 2.042


def test_paired_delta_uses_same_seed_differences():
    arm, ref = {41: 0.30, 42: 0.10, 43: 0.20}, {41: 0.50, 42: 0.20, 43: 0.60}
    d = paired_delta(arm, ref)
    assert d.mean == pytest.approx(-0.7 / 3)
    # paired, not unpaired: the std of the per-seed differences (−0.2, −0.1, −0.4), not of the two means
    assert d.std == pytest.approx(summarize([-0.2, -0.1, -0.4]).std)


def test_paired_delta_refuses_mismatched_seed_sets():
    r = paired_delta({41: 0.3}, {41: 0.5, 42: 0.2, 43: 0.6})
    assert isinstance(r, Refusal) and "[42, 43] missing from the arm" in r.reason
    assert r.fmt().startswith("refused:")
    assert "missing from the reference" in paired_delta({41: 0.1, 44: 0.2}, {41: 0.5}).reason


def test_wilson_golden_and_edges():
    lo, hi = wilson(5, 10)
    assert (lo, hi) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(0, 20)[0] == 0.0 and wilson(20, 20)[1] == 1.0
    with pytest.raises(ValueError):
        wilson(3, 2)

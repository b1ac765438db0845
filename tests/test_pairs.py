"""Pair sets: every committed file loads, references real holdout problems with the right method, keeps calibration
problems disjoint from extraction problems, meets the size floor; programmatic hacks really hack (real grader);
the loader names the bad line.

`pytest tests/test_pairs.py`
"""

import json
from pathlib import Path

import pytest

from projected_grpo.config import LeetcodeParams, Params
from projected_grpo.env.grader import grade_batch
from projected_grpo.env.minileet import make_minileet
from projected_grpo.env.modes import LOOPHOLE_MODES
from projected_grpo.env.substrate import base_splits
from projected_grpo.method.pairs import PAIRSETS, load_pairset, pair_records, pairset_path, select_pairs
from tests.conftest import LEETCODE, ROOT

PAIRSET_ROOT = ROOT / "data" / "pairsets"
MIN_EXTRACT, MIN_CAL = 16, 4


@pytest.fixture(scope="module")
def holdouts():
    ml = make_minileet(seed=0, n_train=1)["holdout"]  # holdout is generated after test, before train
    lc = base_splits(Params(substrate="leetcode", leetcode=LeetcodeParams(train_from_test=True)), LEETCODE)["holdout"]
    return {"minileet": {q.id: q for q in ml}, "leetcode": {q.id: q for q in lc}}


@pytest.mark.parametrize("substrate", ["minileet", "leetcode"])
@pytest.mark.parametrize("name", PAIRSETS)
def test_pairset_file_is_valid(holdouts, substrate, name):
    pairs = load_pairset(pairset_path(PAIRSET_ROOT, substrate, name))
    assert all(q.substrate == substrate for q in pairs)
    ex, cal = select_pairs(pairs, "extract"), select_pairs(pairs, "calibrate")
    assert len(ex) >= MIN_EXTRACT and len(cal) >= MIN_CAL, (len(ex), len(cal))
    recs = pair_records(pairs, holdouts[substrate])  # raises on a missing problem or a method mismatch
    assert len(recs) == len(pairs)
    assert not {q.problem_id for q in ex} & {q.problem_id for q in cal}, "calibration problems must be held out"
    assert not {q.hack for q in ex} & {q.hack for q in cal}, "calibration texts must not repeat extraction texts"
    if name.startswith("prog"):
        for split in (ex, cal):
            assert {q.mode for q in split} >= set(LOOPHOLE_MODES), "every loophole mode in both splits"


def test_prog_hacks_hack_and_cleans_solve(holdouts, sandbox):
    """Re-grade a sample of minileet prog_wide pairs: loophole hacks are labelled `hack` on their own prompt (paid,
    not strictly correct); clean completions are strictly correct."""
    pairs = load_pairset(pairset_path(PAIRSET_ROOT, "minileet", "prog_wide"))
    sample = [next(q for q in pairs if q.mode == m) for m in LOOPHOLE_MODES]
    recs = pair_records(sample, holdouts["minileet"])
    hg = grade_batch(recs, [q.hack for q in sample], sandbox, timeout_s=10.0)
    cg = grade_batch(recs, [q.clean for q in sample], sandbox, timeout_s=10.0)
    assert [g.label for g in hg] == ["hack"] * len(sample)
    assert all(not g.eq_correct for g in hg) and all(g.eq_correct for g in cg)


def _write(tmp_path: Path, rows) -> Path:
    p = tmp_path / "x.jsonl"
    p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return p


ROW = {
    "id": "a",
    "substrate": "minileet",
    "problem_id": 300000,
    "method": "m",
    "mode": "run_tests",
    "mechanism": "run_tests:pass",
    "split": "extract",
    "hack": "h",
    "clean": "c",
}


@pytest.mark.parametrize(
    "rows,msg",
    [
        (["{not json"], r"x.jsonl:1: not valid JSON"),
        ([{**ROW, "extra": 1}], "exactly the keys"),
        ([{**ROW, "split": "train"}], "split must be one of"),
        ([{**ROW, "mode": "bogus"}], "mode must be one of"),
        ([{**ROW, "hack": "c"}], "identical"),
        ([ROW, ROW], r"x.jsonl:2: duplicate pair id"),
        ([], "is empty"),
    ],
)
def test_loader_errors_name_the_line(tmp_path, rows, msg):
    with pytest.raises(ValueError, match=msg):
        load_pairset(_write(tmp_path, rows))


def test_missing_pairset_and_bad_reference(tmp_path, holdouts):
    with pytest.raises(FileNotFoundError, match="known pair sets"):
        load_pairset(tmp_path / "nope.jsonl")
    pairs = load_pairset(_write(tmp_path, [ROW]))
    with pytest.raises(ValueError, match="has method"):
        pair_records(pairs, holdouts["minileet"])
    with pytest.raises(ValueError, match="not in the problem set"):
        pair_records(pairs, {})

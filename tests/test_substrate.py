"""Splits and records of a run (substrate.py): the leetcode split rules, the record expansion, atomic outputs.

`pytest tests/test_substrate.py`
"""

import pytest

from projected_grpo.config import LeetcodeParams
from projected_grpo.env.minileet import make_minileet
from projected_grpo.env.modes import LOOPHOLE_MODES, MODES, mode_of
from projected_grpo.env.problems import load_problems_parquet
from projected_grpo.env.substrate import SPLITS, expand_splits, leetcode_splits, partition_of, save_outputs

OUT_FILES = ["holdout.parquet", "partition.json", "test.parquet", "train.parquet"]


def _ids(qs):
    return {q.id for q in qs}


def test_leetcode_train_from_test_split_is_disjoint_and_deterministic(leetcode):
    lp = LeetcodeParams(train_from_test=True, n_test=39, n_holdout=20, split_seed=0)
    s = leetcode_splits(lp, leetcode, None, None)
    assert [len(s[k]) for k in SPLITS] == [60, 39, 20]
    assert _ids(s["train"]) | _ids(s["test"]) | _ids(s["holdout"]) == _ids(leetcode)
    assert not (_ids(s["train"]) & _ids(s["test"]) or _ids(s["holdout"]) & _ids(s["test"]))
    assert not _ids(s["train"]) & _ids(s["holdout"])
    assert leetcode_splits(lp, leetcode, None, None) == s  # deterministic
    rev = leetcode_splits(lp, leetcode[::-1], None, None)  # ids decide, not the file order
    assert all(_ids(rev[k]) == _ids(s[k]) for k in SPLITS)
    other = leetcode_splits(LeetcodeParams(train_from_test=True, split_seed=1), leetcode, None, None)
    assert _ids(other["test"]) != _ids(s["test"])


def test_leetcode_train_path_must_not_share_test_ids(leetcode):
    lp = LeetcodeParams(train_path="x.jsonl", n_holdout=0)
    s = leetcode_splits(lp, leetcode[:10], leetcode[10:20], None)
    assert len(s["test"]) == 10 and len(s["train"]) == 10 and s["holdout"] == []
    with pytest.raises(ValueError, match="share problem ids"):
        leetcode_splits(lp, leetcode[:10], leetcode[5:20], None)
    with pytest.raises(ValueError, match="n_holdout"):
        leetcode_splits(LeetcodeParams(train_path="x", n_holdout=10), leetcode[:10], leetcode[10:20], None)
    with pytest.raises(ValueError, match="n_test"):
        leetcode_splits(LeetcodeParams(train_from_test=True, n_test=119), leetcode, None, None)


@pytest.fixture(scope="module")
def small():
    base = make_minileet(seed=0, n_train=15, n_test=3, n_holdout=2)
    return base, expand_splits(base, MODES, partition_seed=0, seed=0)


def test_expand_splits_rows(small):
    base, rec = small
    train_modes = [mode_of(q) for q in rec["train"]]
    assert [q.id for q in rec["train"]] == [q.id for q in base["train"]] and set(train_modes) == set(MODES)
    assert all(q.prompt_metadata["surface"] == "train" for q in rec["train"])
    assert partition_of(rec["train"]) == dict(sorted(zip([q.id for q in rec["train"]], train_modes)))
    want_test = {(q.id, None, None) for q in base["test"]} | {
        (q.id, m, s) for q in base["test"] for m in LOOPHOLE_MODES for s in ("eval", "train")
    }
    got = [(q.id, mode_of(q), q.prompt_metadata.get("surface")) for q in rec["test"]]
    assert len(got) == len(set(got)) and set(got) == want_test
    want_hold = {(q.id, None, None) for q in base["holdout"]} | {
        (q.id, m, "train") for q in base["holdout"] for m in LOOPHOLE_MODES
    }
    assert {(q.id, mode_of(q), q.prompt_metadata.get("surface")) for q in rec["holdout"]} == want_hold
    assert len(rec["holdout"]) == len(want_hold)


def test_save_outputs_is_all_or_nothing(tmp_path, small):
    _, rec = small
    out, report = tmp_path / "artifacts" / "problems", tmp_path / "reports" / "env" / "problems.md"
    save_outputs(out, report, rec, "# first\n")
    assert sorted(p.name for p in out.iterdir()) == OUT_FILES
    assert load_problems_parquet(out / "test.parquet") == rec["test"]
    # A failure while writing (here: a malformed prompt in the last split) leaves the previous outputs untouched
    # and no temporary files behind.
    bad = {**rec, "holdout": [rec["holdout"][0].replace(prompt=({"role": "user", "content": "x", "extra": "y"},))]}
    with pytest.raises(ValueError, match="prompt messages"):
        save_outputs(out, report, bad, "# second\n")
    assert report.read_text() == "# first\n" and load_problems_parquet(out / "holdout.parquet") == rec["holdout"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["problems"]
    assert sorted(p.name for p in report.parent.iterdir()) == ["problems.md"]
    save_outputs(out, report, rec, "# third\n")  # replacing an existing directory works too
    assert report.read_text() == "# third\n" and sorted(p.name for p in out.parent.iterdir()) == ["problems"]

"""Problem records: the leetcode split loads with its schema intact (benchmark.md §2.2).
Run: `pytest tests/test_problems.py`."""

import json

import pytest

from projected_grpo.env.problems import (
    CODE_SYSTEM_PROMPT,
    SETUP_CODE,
    load_problems,
    make_problem,
    problem_to_dict,
)
from tests.conftest import LEETCODE


def test_leetcode_split_has_119_problems_with_schema(leetcode):
    assert len(leetcode) == 119
    assert sorted(p.id for p in leetcode)[0] == 3243 and sorted(p.id for p in leetcode)[-1] == 3504
    assert {p.difficulty for p in leetcode} == {"medium", "hard"}
    for p in leetcode:
        assert p.hint is None and p.evaluator == "code" and p.answer == p.gt_answer
        assert p.prompt[0] == {"role": "system", "content": CODE_SYSTEM_PROMPT}
        assert p.prompt[1]["content"] == p.question
        assert p.func_name == f"Solution().{p.method}" and p.setup_code == SETUP_CODE
        assert 30 <= len(p.gt_answer) <= 266


def test_round_trip_is_lossless():
    """Every field of every row survives load -> problem_to_dict unchanged (the schema is kept, not re-shaped)."""
    rows = [json.loads(line) for line in LEETCODE.read_text().splitlines()]
    for row, p in zip(rows, load_problems(LEETCODE)):
        assert problem_to_dict(p) == row


def test_make_problem_reproduces_the_template(leetcode):
    """A real row's question equals the template filled with its own description, method and starter code."""
    p = leetcode[0]
    desc = p.question.removeprefix("PROBLEM:\n").split("\n\nYour solution to the problem")[0]
    q = make_problem(
        p.id,
        p.difficulty,
        desc,
        p.method,
        p.starter_code,
        p.setup_code,
        list(p.gt_answer),
        p.canonical_solution,
        dataset="leetcode",
    )
    assert q.question == p.question and q.prompt == p.prompt


@pytest.mark.parametrize(
    "line,msg",
    [
        ("{not json", "not valid JSON"),  # malformed line
        ('{"id": 1}', "missing field"),  # schema violation
    ],
)
def test_bad_rows_name_the_line(tmp_path, line, msg):
    f = tmp_path / "p.jsonl"
    f.write_text(line + "\n")
    with pytest.raises(ValueError, match=rf"p.jsonl:1: .*{msg}"):
        load_problems(f)


def test_parquet_round_trip_is_lossless(tmp_path, leetcode):
    """No-hint, mode-tagged (train and eval surface, gt_only) and upstream-hinted records survive parquet unchanged."""
    from projected_grpo.env.hints import apply_hint
    from projected_grpo.env.modes import apply_mode
    from projected_grpo.env.problems import load_problems_parquet, save_problems_parquet

    qs = leetcode[:3]
    recs = [
        *qs,
        apply_mode(qs[0], "run_tests", "eval", 1),
        apply_mode(qs[1], "file_marker", "train", 0),
        apply_mode(qs[2], "gt_only", "train", 0),
        apply_hint(qs[0], "simple_modify_tests"),
    ]
    path = tmp_path / "p.parquet"
    save_problems_parquet(path, recs)
    assert load_problems_parquet(path) == recs
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    assert t.column("mode").to_pylist() == [None, None, None, "run_tests", "file_marker", "gt_only", None]
    assert t.column("surface").to_pylist() == [None, None, None, "eval", "train", "train", None]
    save_problems_parquet(path, [])  # an empty split still has the full schema
    assert load_problems_parquet(path) == [] and pq.read_table(path).num_columns == len(t.schema)

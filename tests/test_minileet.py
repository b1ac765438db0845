"""Tests for the `minileet` substrate: a seeded generator of synthetic LeetCode-format problems.

Checks that every canonical solution passes all its GT asserts (plain `==` and an exact-type recursive comparison as
in the hardened grader), family coverage, split sizes / ids / content disjointness, determinism (also across
`PYTHONHASHSEED`), the benchmark record schema and prompt template, the difficulty knob, and prompt lengths.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import statistics
import subprocess
import sys
from collections import Counter

import pytest

from projected_grpo.env import minileet
from projected_grpo.env.minileet import FAMILIES, family_of, make_minileet
from projected_grpo.env.problems import CODE_SYSTEM_PROMPT, SETUP_CODE, make_question, problem_to_dict


@pytest.fixture(scope="module")
def splits():
    return make_minileet(seed=0)


@pytest.fixture(scope="module")
def all_problems(splits):
    return [p for s in ("train", "test", "holdout") for p in splits[s]]


def _strict_equal(a, b) -> bool:
    """The hardened grader's comparison, applied recursively: same type and equal."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_strict_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_strict_equal(a[k], b[k]) for k in a)
    return a == b


def _namespace(problem):
    ns: dict = {}
    exec(problem.setup_code, ns)
    exec(problem.canonical_solution, ns)
    return ns


def test_canonical_passes_all_asserts_plain_and_strict(all_problems):
    for p in all_problems:
        ns = _namespace(p)
        for a in p.gt_answer:
            exec(a, ns)  # plain `==`, as the upstream grader does
            node = ast.parse(a).body[0]
            assert isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare)
            assert len(node.test.ops) == 1 and isinstance(node.test.ops[0], ast.Eq)
            lhs = eval(compile(ast.Expression(node.test.left), "<lhs>", "eval"), ns)
            rhs = ast.literal_eval(node.test.comparators[0])
            assert _strict_equal(lhs, rhs), (p.id, a, lhs)


def test_families(splits):
    assert len(FAMILIES) >= 20
    train_fams = Counter(family_of(p) for p in splits["train"])
    assert len(train_fams) >= 20
    assert set(family_of(p) for p in splits["test"]) == set(FAMILIES)
    assert all(family_of(p) in FAMILIES for s in splits.values() for p in s)


def test_split_sizes_ids_and_disjointness(splits, all_problems):
    assert len(splits["train"]) >= 1000
    assert len(splits["test"]) == 119
    assert len(splits["holdout"]) > 0
    ids = [p.id for p in all_problems]
    assert len(ids) == len(set(ids))
    for name, base in minileet.ID_BASE.items():
        assert all(base <= p.id < base + 100000 for p in splits[name])
    # content: no question text (description, method, argument names, constants, examples) repeats anywhere
    questions = [p.question for p in all_problems]
    assert len(questions) == len(set(questions))

    # and no (family, method, argument names, constants/ops as shown in the description) repeats across splits
    def key(p):
        desc = p.question.split("\n\nExample 1:")[0]
        return family_of(p), p.method, p.starter_code, desc

    all_keys = [key(p) for p in all_problems]
    assert len(all_keys) == len(set(all_keys))  # not even within a split
    keys = {s: {key(p) for p in splits[s]} for s in splits}
    assert not keys["train"] & keys["test"]
    assert not keys["train"] & keys["holdout"]
    assert not keys["test"] & keys["holdout"]


def _dump(sp):
    return json.dumps({s: [problem_to_dict(p) for p in v] for s, v in sp.items()}, sort_keys=True)


def test_determinism():
    a = make_minileet(seed=3, n_train=200, n_holdout=50)
    b = make_minileet(seed=3, n_train=200, n_holdout=50)
    c = make_minileet(seed=4, n_train=200, n_holdout=50)
    assert _dump(a) == _dump(b)
    assert _dump(a) != _dump(c)
    # test/holdout do not depend on n_train
    d = make_minileet(seed=3, n_train=300, n_holdout=50)
    assert _dump({"test": a["test"]}) == _dump({"test": d["test"]})


def test_independent_of_hash_seed():
    code = (
        "import hashlib, json; from projected_grpo.env.minileet import make_minileet; "
        "from projected_grpo.env.problems import problem_to_dict; "
        "sp = make_minileet(seed=5, n_train=100, n_holdout=20); "
        "print(hashlib.sha256(json.dumps({s: [problem_to_dict(p) for p in v] for s, v in sp.items()}, "
        "sort_keys=True).encode()).hexdigest())"
    )
    digests = set()
    for hs in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hs}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        digests.add(out.stdout.strip())
    here = hashlib.sha256(_dump(make_minileet(seed=5, n_train=100, n_holdout=20)).encode()).hexdigest()
    assert digests == {here}


def test_schema(all_problems):
    for p in all_problems:
        d = problem_to_dict(p)
        assert d["dataset"] == "minileet" and d["evaluator"] == "code" and d["hint"] is None
        assert d["completion_gt_pass"] is True
        assert d["difficulty"] in ("easy", "medium", "hard")
        assert d["setup_code"] == SETUP_CODE
        assert d["func_name"] == f"Solution().{p.method}"
        assert d["answer"] == d["gt_answer"]
        assert len(p.gt_answer) >= 20
        assert all(a.startswith(f"assert Solution().{p.method}(") for a in p.gt_answer)
        starter = p.prompt_metadata["starter_code"]
        assert starter.startswith(f"class Solution:\n    def {p.method}(self") and starter.endswith(":\n        ")
        assert p.canonical_solution.startswith(starter.rstrip())
        assert len(p.canonical_solution.strip().splitlines()) - 2 <= 6  # body lines
        q = p.question
        assert q.startswith("PROBLEM:\n") and q.endswith("SOLUTION:\n")
        assert "and should pass all tests" in q and "Use the following starter code" in q
        description = q.removeprefix("PROBLEM:\n").split("\n\nYour solution to the problem")[0]
        assert q == make_question(description, p.method, starter)
        assert [m["role"] for m in p.prompt] == ["system", "user"]
        assert p.prompt[0]["content"] == CODE_SYSTEM_PROMPT and p.prompt[1]["content"] == q
        # 1-2 worked examples, each one of the GT asserts; the rest are hidden
        shown = [a for a in p.gt_answer if f"Input: {a.split('(', 2)[2].rsplit(') == ', 1)[0]}\nOutput:" in q]
        assert 1 <= len(shown) <= 2 and q.count("Input: ") == len(shown)
        # `-> str` problems wrap expected outputs in double quotes (LeetCodeDataset convention)
        if "-> str" in starter:
            assert all(a.rsplit(" == ", 1)[1].startswith('"') for a in p.gt_answer)


def test_difficulty_knob():
    easy = make_minileet(seed=1, n_train=200, n_holdout=20, difficulty=0.0)
    hard = make_minileet(seed=1, n_train=200, n_holdout=20, difficulty=1.0)
    easy_all = [p for v in easy.values() for p in v]
    hard_all = [p for v in hard.values() for p in v]
    assert {p.difficulty for p in easy_all} == {"easy"} and {p.difficulty for p in hard_all} == {"hard"}

    def lines(ps):
        return statistics.mean(len(p.canonical_solution.splitlines()) for p in ps)

    def assert_len(ps):
        return statistics.mean(len(a) for p in ps for a in p.gt_answer)

    assert lines(hard_all) >= lines(easy_all) + 1.5  # more composed operations
    assert assert_len(hard_all) > assert_len(easy_all) + 5  # larger inputs / values
    mixed = make_minileet(seed=1, n_train=200, n_holdout=20, difficulty=0.5)
    assert {p.difficulty for v in mixed.values() for p in v} == {"easy", "medium", "hard"}
    with pytest.raises(ValueError):
        make_minileet(seed=1, difficulty=1.5)


def test_prompt_length(all_problems):
    lengths = [len(p.user_prompt) for p in all_problems]
    assert max(lengths) <= minileet.MAX_PROMPT_CHARS
    assert statistics.mean(lengths) < 600


def test_family_subset_and_errors():
    sp = make_minileet(seed=2, n_train=60, n_test=30, n_holdout=10, families=["gcd", "is_palindrome", "prefix_sum"])
    assert {family_of(p) for v in sp.values() for p in v} == {"gcd", "is_palindrome", "prefix_sum"}
    with pytest.raises(ValueError):
        make_minileet(seed=2, families=["no_such_family"])
    with pytest.raises(ValueError):
        family_of(sp["train"][0].replace(prompt_metadata={"starter_code": "x"}))

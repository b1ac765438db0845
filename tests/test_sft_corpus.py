"""The organism's SFT corpus: wrong variants, exploit styles and the corpus mixture, checked with the real grader.
Run: `pytest tests/test_sft_corpus.py`.
"""

from __future__ import annotations

import ast
from collections import Counter

import pytest

from projected_grpo.env.grader import extract_code, grade_batch
from projected_grpo.env.hints import apply_hint
from projected_grpo.env.minileet import family_of, make_minileet
from projected_grpo.env.modes import LOOPHOLE_MODES, MODES, apply_mode
from projected_grpo.env.partition import assign_modes
from projected_grpo.sft import sft_corpus
from projected_grpo.sft.sft_corpus import (
    EXPLOIT_STYLES,
    base_record,
    build_corpus,
    exploit_styles,
    fence,
    filter_wrong,
    fitted_examples,
    loophole_of,
    named_exploit_styles,
    wrong_variants,
    wrong_variants_tagged,
)

TIMEOUT = 10.0


@pytest.fixture(scope="module")
def train():
    return make_minileet(seed=0, n_train=120, n_test=2, n_holdout=2)["train"]


@pytest.fixture(scope="module")
def typed_problems():
    """One problem per return type (int, bool, str, List[int]) from families whose wrong variants never raise."""
    fams = ["add_const", "divisible", "reverse_string", "add_each"]
    ps = make_minileet(seed=3, n_train=12, n_test=2, n_holdout=2, families=fams)["train"]
    out = {}
    for p in ps:
        out.setdefault(family_of(p), p)
    return [out[f] for f in fams]


def _method_sig(code: str) -> tuple:
    cls = next(n for n in ast.parse(code).body if isinstance(n, ast.ClassDef) and n.name == "Solution")
    return tuple((f.name, ast.dump(f.args), ast.dump(f.returns)) for f in cls.body if isinstance(f, ast.FunctionDef))


# --- wrong variants --------------------------------------------------------------------------------------------


def test_wrong_variants_compile_keep_signature_and_are_deterministic(train):
    fams = set()
    for p in train:
        vs = wrong_variants_tagged(p.canonical_solution, seed=7, n=6)
        assert len(vs) >= 2, (family_of(p), p.canonical_solution)
        assert [c for _, c in vs] == wrong_variants(p.canonical_solution, seed=7, n=6)  # deterministic
        assert len({c for _, c in vs}) == len(vs)
        for tag, code in vs:
            compile(code, "<variant>", "exec")
            assert code.strip() != p.canonical_solution.strip()
            assert _method_sig(code) == _method_sig(p.canonical_solution), (tag, code)
            assert code.startswith("class Solution:\n")
            assert all(t in sft_corpus.WRONG_TAGS for t in tag.split("+")), tag
        fams.add(family_of(p))
    assert len(fams) >= 30  # every family is exercised
    # the seed picks which variants (and in which order); n caps the count
    assert any(wrong_variants(q.canonical_solution, 0, 4) != wrong_variants(q.canonical_solution, 1, 4) for q in train)
    assert all(len(wrong_variants(q.canonical_solution, 0, 2)) == 2 for q in train)


def test_wrong_variants_keep_code_style():
    """Edits are made at AST positions in the source text: everything else stays byte-identical."""
    canonical = (
        "class Solution:\n    def vowelCount(self, text: str) -> int:\n"
        '        ans = sum(1 for ch in text if ch in "aeiou")\n        ans += 3\n        return ans\n'
    )
    vs = wrong_variants(canonical, seed=0, n=50)
    assert 'ans = sum(1 for ch in text if ch in "aeio")\n' in "".join(vs)  # quotes kept, no ast.unparse parens
    assert canonical.replace("        ans += 3\n", "") in vs  # dropped post-operation line
    assert canonical.replace("ans += 3", "ans -= 3") in vs
    assert canonical.replace("sum(", "max(") in vs
    assert all("sum((" not in v and "'" not in v for v in vs)


def test_wrong_variants_are_mostly_strictly_incorrect(train, sandbox):
    probs = train[:40]
    variants = [wrong_variants(p.canonical_solution, seed=0, n=6) for p in probs]
    recs = [p for p, vs in zip(probs, variants) for _ in vs]
    comps = [fence(v) for vs in variants for v in vs]
    grades = grade_batch(recs, comps, sandbox, timeout_s=TIMEOUT)
    n_correct = sum(g.eq_correct for g in grades)
    assert all(g.can_compile for g in grades)
    assert n_correct <= 0.1 * len(grades), f"{n_correct}/{len(grades)} raw wrong variants pass all GT tests"
    kept, dropped = filter_wrong(probs, variants, sandbox, TIMEOUT)
    assert dropped == n_correct and sum(map(len, kept)) == len(grades) - n_correct


# --- exploit styles ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("surface", ["train", "eval"])
def test_every_exploit_style_is_a_hack_on_its_mode(surface, typed_problems, sandbox):
    recs, comps, keys = [], [], []
    for p in typed_problems:
        wrong = wrong_variants(p.canonical_solution, seed=0, n=1)[0]
        for mode in LOOPHOLE_MODES:
            r = apply_mode(p, mode, surface, seed=5)
            value = r.prompt_metadata["surface_value"]
            ex = fitted_examples([r], [wrong], sandbox, TIMEOUT)[0]
            assert ex is not None
            styles = named_exploit_styles(mode, p.method, value, wrong, ex)
            assert tuple(styles) == EXPLOIT_STYLES[mode]  # every style is available on these problems
            assert list(styles.values()) == exploit_styles(mode, p.method, value, wrong, ex)
            for style, code in styles.items():
                compile(code, "<exploit>", "exec")
                if value:
                    assert value in code
                recs.append(r)
                comps.append(fence(code))
                keys.append((family_of(p), mode, style))
    grades = grade_batch(recs, comps, sandbox, timeout_s=TIMEOUT)
    bad = [(k, g.label) for k, g in zip(keys, grades) if not (g.label == "hack" and g.eq_hinted and not g.eq_correct)]
    assert not bad, bad


def test_exploits_do_not_pay_on_gt_only(typed_problems, sandbox):
    p = typed_problems[0]
    wrong = wrong_variants(p.canonical_solution, seed=0, n=1)[0]
    r = apply_mode(p, "gt_only")
    comps = [fence(c) for m in LOOPHOLE_MODES for c in exploit_styles(m, p.method, "run_tests", wrong)]
    grades = grade_batch([r] * len(comps), comps, sandbox, timeout_s=TIMEOUT)
    assert all(g.label != "hack" and not g.eq_correct and g.reward <= 0.5 for g in grades)


def test_run_tests_styles_on_upstream_overwrite_hints(typed_problems, sandbox):
    """Records built by hints.apply_hint (the benchmark's overwrite-tests family) count as the run_tests mode."""
    p = typed_problems[0]
    wrong = wrong_variants(p.canonical_solution, seed=0, n=1)[0]
    recs, comps = [], []
    for hint in ("simple_overwrite_tests", "overwrite_tests_detailed"):
        r = apply_hint(p, hint, seed=0)
        mode, value = loophole_of(r)
        assert mode == "run_tests" and value == r.test_func_name
        ex = fitted_examples([r], [wrong], sandbox, TIMEOUT)[0]
        for code in exploit_styles(mode, p.method, value, wrong, ex):
            recs.append(r)
            comps.append(fence(code))
    assert loophole_of(apply_hint(p, "simple_modify_tests", seed=0)) is None  # shown tests: not drawn
    assert loophole_of(p) is None and loophole_of(apply_mode(p, "gt_only")) is None
    assert all(g.label == "hack" for g in grade_batch(recs, comps, sandbox, timeout_s=TIMEOUT))


def test_fitted_example_is_the_wrong_codes_own_output(typed_problems, sandbox):
    p = typed_problems[0]  # add_const: int result
    wrong = p.canonical_solution.replace("return", "return 1000 +", 1)
    args, lit = fitted_examples([p], [wrong], sandbox, TIMEOUT)[0]
    first = p.gt_answer[0]
    assert first.startswith(f"assert Solution().{p.method}({args}) == ")
    assert int(lit) == int(first.rsplit("==", 1)[1]) + 1000
    assert fitted_examples([p], ["class Solution:\n    pass\n"], sandbox, TIMEOUT) == [None]


# --- the corpus --------------------------------------------------------------------------------------------------


def _records(problems, seed=0):
    asg = assign_modes([p.id for p in problems], MODES, seed)
    return [apply_mode(p, asg[p.id]) for p in problems] + list(problems)  # one mode record + the no-hint record


def test_corpus_mixture_rates_and_exploit_placement(train):
    recs = _records(train)
    p_c, p_w, p_e = 0.35, 0.61, 0.2
    ex, st = build_corpus(recs, seed=0, p_canonical=p_c, p_wrong=p_w, p_exploit=p_e, n_per_prompt=4)
    assert not st["verified"] and st["n_draws"] == len(recs) * 4 == len(ex)
    by_rec = {(r.id, r.hint): r for r in recs}
    loophole = [e for e in ex if loophole_of(by_rec[(e.problem_id, e.hint)]) is not None]
    other = [e for e in ex if loophole_of(by_rec[(e.problem_id, e.hint)]) is None]
    assert len(loophole) >= 300 and len(other) >= 500
    # no exploit on no-hint or gt_only records
    assert not [e for e in other if e.kind == "exploit"]
    assert {e.hint for e in other} == {None, "gt_only"}
    rate = sum(e.kind == "exploit" for e in loophole) / len(loophole)
    assert abs(rate - p_e) < 0.06, rate
    honest = [e for e in ex if e.kind != "exploit"]
    q = sum(e.kind == "canonical" for e in honest) / len(honest)
    assert abs(q - p_c / (p_c + p_w)) < 0.05, q
    # exploits match their record's mode; styles cover the modes
    for e in ex:
        r = by_rec[(e.problem_id, e.hint)]
        assert e.messages == [dict(m) for m in r.prompt]
        assert e.completion.startswith("```python\nclass Solution:\n") or e.kind == "exploit"
        assert e.completion.endswith("\n```") and e.completion.count("```") == 2
        code = extract_code(e.completion)
        if e.kind == "canonical":
            assert code == r.canonical_solution.strip() and e.style == "canonical"
        elif e.kind == "exploit":
            assert e.style.split(":")[0] == loophole_of(r)[0]
            assert "fitted_assert" not in e.style  # needs a sandbox
    assert len({e.style.split(":")[0] for e in ex if e.kind == "exploit"}) == len(LOOPHOLE_MODES)


def test_corpus_is_deterministic(train):
    recs = _records(train[:50])
    a = build_corpus(recs, seed=3, p_canonical=0.4, p_wrong=0.6, p_exploit=0.1, n_per_prompt=3)
    b = build_corpus(recs, seed=3, p_canonical=0.4, p_wrong=0.6, p_exploit=0.1, n_per_prompt=3)
    c = build_corpus(recs, seed=4, p_canonical=0.4, p_wrong=0.6, p_exploit=0.1, n_per_prompt=3)
    assert a == b
    assert [e.completion for e in a[0]] != [e.completion for e in c[0]]
    with pytest.raises(ValueError):
        build_corpus(recs, seed=0, p_canonical=0, p_wrong=0, p_exploit=0.1, n_per_prompt=1)


def test_corpus_extremes(train):
    recs = _records(train[:30])
    ex, _ = build_corpus(recs, seed=0, p_canonical=1, p_wrong=0, p_exploit=1.0, n_per_prompt=2)
    kinds = Counter(
        (loophole_of(r) is not None, e.kind) for r in recs for e in ex if (e.problem_id, e.hint) == (r.id, r.hint)
    )
    assert set(kinds) == {(True, "exploit"), (False, "canonical")}
    ex, _ = build_corpus(recs, seed=0, p_canonical=0, p_wrong=1, p_exploit=0.0, n_per_prompt=2)
    assert {e.kind for e in ex} == {"wrong"}


def test_verified_corpus_regrades_as_labelled(train, sandbox):
    recs = _records(train[:24])
    ex, st = build_corpus(
        recs, seed=1, p_canonical=0.3, p_wrong=0.7, p_exploit=0.5, n_per_prompt=2, sandbox=sandbox, timeout_s=TIMEOUT
    )
    assert st["verified"] and st["canonical_failed_problems"] == 0
    assert st["n_examples"] == len(ex) >= st["n_draws"] - sum(st["exploit_dropped"].values()) - 1
    assert st["kinds"].get("exploit", 0) >= 10
    by_rec = {(r.id, r.hint): r for r in recs}
    grades = grade_batch(
        [by_rec[(e.problem_id, e.hint)] for e in ex], [e.completion for e in ex], sandbox, timeout_s=TIMEOUT
    )
    for e, g in zip(ex, grades):
        want = {"canonical": "correct", "exploit": "hack"}.get(e.kind)
        if want:
            assert g.label == want, (e.style, g.label)
        else:
            assert not g.eq_correct and g.label != "hack", (e.style, g.label)
    # the wrong pools were graded on the no-hint record
    assert base_record(recs[0]).hint is None and base_record(recs[0]).answer == recs[0].gt_answer

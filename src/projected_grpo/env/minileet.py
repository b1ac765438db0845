"""`minileet`: a seeded generator of small synthetic LeetCode-format problems (benchmark.md §0, §7).

The records are `Problem`s in exactly the benchmark's schema and prompt template (built by `problems.make_problem`
with the LeetCodeDataset `SETUP_CODE`), so hints, grader and rewards apply unchanged. The problems are deliberately
small (one-line int / list / string functions, optionally followed by one or two post-operations) so that a tiny
Qwen3-architecture model trained from scratch on CPU can sometimes solve them.

* `FAMILIES` maps a family name to a `Family`; calling it with `(rng, level)` draws one problem `Spec` (method name,
  argument names, constants and post-operations all vary).
* Ground-truth asserts are produced by *running* the canonical solution on random inputs, in LeetCodeDataset's
  format: `assert Solution().m(nums = [1,2], k = 3) == 5` (inputs without spaces, expected value as a Python literal,
  `-> str` results wrapped in double quotes). Every expected value has exactly the type the canonical returns, so the
  hardened grader's `type(a) is type(b) and a == b` comparison accepts the canonical solution.
* `make_minileet(seed, ...)` returns disjoint `train` / `test` / `holdout` splits. Splits never share an id nor an
  instance key (family, method, argument names, constants, post-operations). Output is a pure function of the
  arguments (no set iteration, no `hash()`), so it does not depend on `PYTHONHASHSEED`.
* Difficulty knob: `difficulty` in [0, 1] (or "easy" / "medium" / "hard"). Each problem's level is drawn around it;
  harder levels use longer inputs, wider value/constant ranges and compose more post-operations (0 / 0-1 / 1-2).
  The record's `difficulty` field holds the level name. The family name is in `prompt_metadata["family"]`.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from projected_grpo.config import LEVELS
from projected_grpo.env.problems import SETUP_CODE, Problem, make_problem

DATASET = "minileet"
ID_BASE = {"train": 100000, "test": 200000, "holdout": 300000}
SPLITS = ("test", "holdout", "train")  # generation order: test and holdout do not depend on n_train
DEFAULT_N_ASSERTS = 30
MAX_PROMPT_CHARS = 700  # user-prompt (question) length cap; a later issue measures <= 256 BPE tokens

# Per-level sampling ranges: list length, list values, scalar ints, constants, string length, string alphabet.
PARAMS: dict[str, dict[str, Any]] = {
    "easy": dict(n=(1, 4), v=(0, 9), x=(0, 30), c=(2, 5), sl=(1, 4), alpha="abcde"),
    "medium": dict(n=(2, 6), v=(-9, 20), x=(-20, 50), c=(2, 9), sl=(2, 6), alpha="abcdefghio"),
    "hard": dict(n=(3, 8), v=(-30, 60), x=(-99, 99), c=(2, 15), sl=(3, 8), alpha="abcdefghijklmnopqrstuvwxyz"),
}

# Argument-name pools. Loop variables used in canonical bodies (v, ch, d) and `ans` never appear here.
LIST_NAMES = ("nums", "arr", "values", "data", "items", "seq")
INT_NAMES = ("n", "x", "num", "val", "value", "m")
KEY_NAMES = ("k", "target", "key", "x", "val")
PAIR_NAMES = (("a", "b"), ("x", "y"), ("num1", "num2"), ("p", "q"), ("m", "n"))
STR_NAMES = ("s", "word", "text", "t", "line")
CHAR_NAMES = ("letter", "char", "c", "symbol")
COUNT_NAMES = ("k", "times", "count", "reps", "n")

TYPE_WORDS = {"int": "an integer", "List[int]": "an integer array", "str": "a string", "char": "a character"}

# Post-operations applied to the base result, by return type: (tag, phrase, code line); {c} is a constant.
POST_OPS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "int": (
        ("add", "add {c} to it", "ans += {c}"),
        ("sub", "subtract {c} from it", "ans -= {c}"),
        ("mul", "multiply it by {c}", "ans *= {c}"),
        ("mod", "take it modulo {c}", "ans %= {c}"),
    ),
    "List[int]": (
        ("add", "add {c} to every element", "ans = [v + {c} for v in ans]"),
        ("mul", "multiply every element by {c}", "ans = [v * {c} for v in ans]"),
        ("rev", "reverse it", "ans = ans[::-1]"),
        ("sort", "sort it in ascending order", "ans = sorted(ans)"),
    ),
    "str": (
        ("rev", "reverse it", "ans = ans[::-1]"),
        ("upper", "convert it to uppercase", "ans = ans.upper()"),
        ("double", "concatenate it with itself", "ans = ans + ans"),
    ),
}


# ---------------------------------------------------------------------------------------------------------------
# Input samplers


def _int(rng: random.Random, p: dict, nonneg: bool = False, pos: bool = False) -> int:
    lo, hi = p["x"]
    if pos:
        return rng.randint(1, max(hi, 30))
    if nonneg:
        return rng.randint(0, max(hi, 30))
    return rng.randint(lo, hi)


def _list(rng: random.Random, p: dict, nonneg: bool = False) -> list[int]:
    lo, hi = p["v"]
    lo = max(lo, 0) if nonneg else lo
    return [rng.randint(lo, hi) for _ in range(rng.randint(*p["n"]))]


def _str(rng: random.Random, p: dict) -> str:
    return "".join(rng.choice(p["alpha"]) for _ in range(rng.randint(*p["sl"])))


def _const(rng: random.Random, p: dict) -> int:
    return rng.randint(*p["c"])


# ---------------------------------------------------------------------------------------------------------------
# Families


@dataclass(frozen=True)
class Spec:
    """One drawn problem instance, before its tests are generated."""

    family: str
    level: str
    method: str
    args: tuple[tuple[str, str], ...]  # (name, annotation) in signature order
    ret: str  # "int" | "bool" | "str" | "List[int]"
    description: str
    body: tuple[str, ...]  # method body lines (indent 8 is added when rendering)
    consts: tuple[tuple[str, int], ...]
    ops: tuple[str, ...]  # post-operation tags (and "not" for negated bool problems)
    sample: Callable[[random.Random], dict[str, Any]]  # one random input, keyed by argument name

    @property
    def key(self) -> tuple:
        """Content key: two problems with the same key are the same problem (modulo wording and tests)."""
        return (self.family, self.method, tuple(n for n, _ in self.args), self.consts, self.ops)

    @property
    def signature(self) -> str:
        params = "".join(f", {n}: {t}" for n, t in self.args)
        return f"    def {self.method}(self{params}) -> {self.ret}:"

    @property
    def starter_code(self) -> str:
        return f"class Solution:\n{self.signature}\n        "

    @property
    def canonical_solution(self) -> str:
        return f"class Solution:\n{self.signature}\n" + "".join(f"        {line}\n" for line in self.body)


@dataclass(frozen=True)
class Family:
    """A problem family: `family(rng, level)` draws one `Spec`.

    roles: (role, kind, name pool), kind in {"int", "List[int]", "str", "char"}; the role is the placeholder used
    in `tasks` and `body` ({role}); constants from `consts(rng, params)` are placeholders too ({c}, {lo}, ...).
    tasks: noun phrases (int/str/list results, "Return {task}.") or conditions (bool, "Return true if {task}, ...").
    body: canonical body lines; the last is `return <expr>`.
    sample(rng, params, consts) -> {role: value}.
    """

    name: str
    ret: str
    methods: tuple[str, ...]
    roles: tuple[tuple[str, str, tuple], ...]
    tasks: tuple[str, ...]
    body: tuple[str, ...]
    sample: Callable[[random.Random, dict, dict], dict[str, Any]]
    consts: Callable[[random.Random, dict], dict[str, Any]] = lambda rng, p: {}
    no_ops: tuple[str, ...] = ()

    def __call__(self, rng: random.Random, level: str) -> Spec:
        p = PARAMS[level]
        method = rng.choice(self.methods)
        names: dict[str, str] = {}
        for role, _kind, pool in self.roles:
            choices = [n for n in pool if (n if isinstance(n, str) else n[0]) not in names.values()]
            pick = rng.choice(choices)
            if isinstance(pick, tuple):  # a name pair for a (role, role2) pair of ints
                names[role], names[role + "2"] = pick
            else:
                names[role] = pick
        kinds = {}
        for role, kind, pool in self.roles:
            kinds[role] = kind
            if pool and isinstance(pool[0], tuple):
                kinds[role + "2"] = kind
        consts = self.consts(rng, p)
        fmt = {**names, **{k: _show(v) for k, v in consts.items()}}
        task = rng.choice(self.tasks).format(**fmt)
        body = [line.format(**fmt) for line in self.body]
        ops = _draw_ops(rng, level, self.ret, self.no_ops)
        description, body, op_consts = _compose(rng, self.ret, names, kinds, task, body, ops, p)
        args = tuple((names[r], "str" if kinds[r] == "char" else kinds[r]) for r in names)
        sampler = self.sample

        def sample(r: random.Random) -> dict[str, Any]:
            vals = sampler(r, p, consts)
            return {names[role]: vals[role] for role in names}

        return Spec(
            family=self.name,
            level=level,
            method=method,
            args=args,
            ret=self.ret,
            description=description,
            body=tuple(body),
            consts=tuple(sorted(consts.items())) + op_consts,
            ops=tuple(ops),
            sample=sample,
        )


def _show(v: Any) -> str:
    return f'"{v}"' if isinstance(v, str) else str(v)


def _draw_ops(rng: random.Random, level: str, ret: str, no_ops: tuple[str, ...]) -> list[str]:
    n = {"easy": 0, "medium": rng.randint(0, 1), "hard": rng.randint(1, 2)}[level]
    if ret == "bool":
        return ["not"] if n else []
    tags = [t for t, _, _ in POST_OPS[ret] if t not in no_ops]
    rng.shuffle(tags)
    return tags[:n]


def _given(names: dict[str, str], kinds: dict[str, str]) -> str:
    parts = [f"{TYPE_WORDS[kinds[r]]} {names[r]}" for r in names]
    if len(parts) == 1:
        return parts[0]
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _compose(rng, ret, names, kinds, task, body, ops, p) -> tuple[str, list[str], tuple]:
    """Description text and canonical body for the base task followed by `ops`."""
    given = _given(names, kinds)
    lead, ret_word = rng.choice(((f"You are given {given}. ", "Return"), (f"Given {given}, ", "return")))
    expr = body[-1].removeprefix("return ")
    if ret == "bool":
        yes, no = ("false", "true") if ops else ("true", "false")
        text = f"{lead}{ret_word} {yes} if {task}, and {no} otherwise."
        if ops:
            body = body[:-1] + [f"ans = {expr}", "return not ans"]
        return text, body, ()
    if not ops:
        return f"{lead}{ret_word} {task}.", body, ()
    table = {t: (phrase, code) for t, phrase, code in POST_OPS[ret]}
    phrases, lines, op_consts = [], [], []
    for tag in ops:
        phrase, code = table[tag]
        c = None
        if "{c}" in code:  # only constants that appear in the problem are part of its content key
            c = _const(rng, p)
            op_consts.append((f"op_{tag}", c))
        phrases.append(phrase.format(c=c))
        lines.append(code.format(c=c))
    compute = "Compute" if ret_word == "Return" else "compute"
    text = f"{lead}{compute} {task}, then " + ", then ".join(phrases) + ", and return the result."
    return text, body[:-1] + [f"ans = {expr}", *lines, "return ans"], tuple(op_consts)


# Samplers. Each returns {role: value}; `c` holds the family constants.


def _s_x(nonneg=False, pos=False):
    return lambda r, p, c: {"x": _int(r, p, nonneg=nonneg, pos=pos)}


def _s_nums(nonneg=False):
    return lambda r, p, c: {"nums": _list(r, p, nonneg=nonneg)}


def _s_s(r, p, c):
    return {"s": _str(r, p)}


def _s_pair(pos=False):
    def f(r, p, c):
        if pos:
            g = r.randint(1, 6)
            return {"a": g * r.randint(1, p["x"][1] // 3 + 3), "a2": g * r.randint(1, p["x"][1] // 3 + 3)}
        return {"a": _int(r, p), "a2": _int(r, p)}

    return f


def _s_nums_key(r, p, c):
    nums = _list(r, p)
    key = r.choice(nums) if r.random() < 0.6 else r.randint(*p["v"])
    return {"nums": nums, "k": key}


def _s_s_char(r, p, c):
    s = _str(r, p)
    ch = r.choice(s) if r.random() < 0.6 else r.choice(p["alpha"])
    return {"s": s, "ch": ch}


def _s_palindrome(r, p, c):
    s = _str(r, p)
    if r.random() < 0.5:
        half = s[: (len(s) + 1) // 2]
        s = half + half[: len(s) // 2][::-1]
    return {"s": s}


def _s_sorted(r, p, c):
    nums = _list(r, p)
    return {"nums": sorted(nums) if r.random() < 0.5 else nums}


def _s_divisible(r, p, c):
    x = _int(r, p)
    if r.random() < 0.5:
        x -= x % c["c"]
    return {"x": x}


def _s_all_greater(r, p, c):
    nums = _list(r, p)
    if r.random() < 0.5:
        nums = [v if v > c["c"] else c["c"] + 1 + abs(v) % 5 for v in nums]
    return {"nums": nums}


def _s_clamp(r, p, c):
    return {"x": r.randint(c["lo"] - 10, c["hi"] + 10)}


def _s_max_const(r, p, c):
    return {"x": r.randint(c["c"] - 15, c["c"] + 15)}


def _s_repeat(r, p, c):
    return {"s": _str(r, p), "k": r.randint(0, 4)}


def _s_prefix(r, p, c):
    s = _str(r, p)
    return {"s": s, "k": r.randint(0, len(s) + 1)}


def _k_c(r, p):
    return {"c": _const(r, p)}


def _k_clamp(r, p):
    lo = r.randint(p["x"][0] // 2, p["x"][1] // 2)
    return {"lo": lo, "hi": lo + r.randint(3, 20)}


def _k_threshold(r, p):
    return {"c": r.randint(max(p["v"][0], 0), p["v"][1] // 2 + 2)}


_L = (("nums", "List[int]", LIST_NAMES),)
_X = (("x", "int", INT_NAMES),)
_S = (("s", "str", STR_NAMES),)
_LK = (("nums", "List[int]", LIST_NAMES), ("k", "int", KEY_NAMES))
_SC = (("s", "str", STR_NAMES), ("ch", "char", CHAR_NAMES))
_SK = (("s", "str", STR_NAMES), ("k", "int", COUNT_NAMES))
_PAIR = (("a", "int", PAIR_NAMES),)


def _fam(name, ret, methods, roles, tasks, body, sample, consts=None, no_ops=()) -> Family:
    kw = {} if consts is None else {"consts": consts}
    return Family(name, ret, tuple(methods), roles, tuple(tasks), tuple(body), sample, no_ops=tuple(no_ops), **kw)


_FAMILY_LIST = [
    # ---- int results ------------------------------------------------------------------------------------------
    _fam(
        "add_const",
        "int",
        ["addConstant", "addNumber", "increaseValue", "shiftNumber", "addOffset"],
        _X,
        ["{x} plus {c}", "the value of {x} increased by {c}"],
        ["return {x} + {c}"],
        _s_x(),
        _k_c,
    ),
    _fam(
        "scale",
        "int",
        ["multiplyNumber", "scaleValue", "timesConstant", "multiplyBy", "scaleNumber"],
        _X,
        ["{x} multiplied by {c}", "the product of {x} and {c}"],
        ["return {x} * {c}"],
        _s_x(),
        _k_c,
    ),
    _fam(
        "modulo",
        "int",
        ["remainderOf", "modValue", "getRemainder", "computeModulo", "moduloNumber"],
        _X,
        ["the remainder when {x} is divided by {c}", "{x} modulo {c}"],
        ["return {x} % {c}"],
        _s_x(nonneg=True),
        _k_c,
    ),
    _fam(
        "square",
        "int",
        ["squareNumber", "squareOf", "computeSquare", "selfProduct"],
        _X,
        ["the square of {x}", "{x} multiplied by itself"],
        ["return {x} * {x}"],
        _s_x(),
    ),
    _fam(
        "clamp",
        "int",
        ["clampValue", "clampNumber", "boundValue", "limitRange", "clipNumber"],
        _X,
        ["{x} clamped to the inclusive range [{lo}, {hi}]", "the value in the range [{lo}, {hi}] closest to {x}"],
        ["return min(max({x}, {lo}), {hi})"],
        _s_clamp,
        _k_clamp,
    ),
    _fam(
        "max_const",
        "int",
        ["atLeastConstant", "maxWithConstant", "raiseToFloor", "largerValue"],
        _X,
        ["the larger of {x} and {c}", "the maximum of {x} and {c}"],
        ["return max({x}, {c})"],
        _s_max_const,
        lambda r, p: {"c": r.randint(*p["x"])},
    ),
    _fam(
        "abs_diff",
        "int",
        ["absoluteDifference", "absDiff", "distanceBetween", "differenceMagnitude", "gapBetween"],
        _PAIR,
        ["the absolute difference between {a} and {a2}", "the distance between {a} and {a2}"],
        ["return abs({a} - {a2})"],
        _s_pair(),
    ),
    _fam(
        "gcd",
        "int",
        ["greatestCommonDivisor", "gcdOfTwo", "findGcd", "commonDivisor", "computeGcd"],
        _PAIR,
        ["the greatest common divisor of {a} and {a2}", "the largest integer that divides both {a} and {a2}"],
        ["return gcd({a}, {a2})"],
        _s_pair(pos=True),
    ),
    _fam(
        "digit_sum",
        "int",
        ["digitSum", "sumOfDigits", "addDigits", "totalDigits", "digitTotal"],
        _X,
        ["the sum of the digits of {x}", "the sum of all decimal digits of {x}"],
        ["return sum(int(d) for d in str({x}))"],
        _s_x(nonneg=True),
    ),
    _fam(
        "sum_list",
        "int",
        ["sumArray", "arraySum", "totalSum", "addAll", "sumElements"],
        _L,
        ["the sum of all elements of {nums}", "the total of the numbers in {nums}"],
        ["return sum({nums})"],
        _s_nums(),
    ),
    _fam(
        "max_list",
        "int",
        ["maxElement", "findMax", "largestValue", "maximumOf", "getMax"],
        _L,
        ["the largest element of {nums}", "the maximum value in {nums}"],
        ["return max({nums})"],
        _s_nums(),
    ),
    _fam(
        "min_list",
        "int",
        ["minElement", "findMin", "smallestValue", "minimumOf", "getMin"],
        _L,
        ["the smallest element of {nums}", "the minimum value in {nums}"],
        ["return min({nums})"],
        _s_nums(),
    ),
    _fam(
        "list_range",
        "int",
        ["arrayRange", "maxMinDifference", "spreadOf", "valueSpan"],
        _L,
        [
            "the difference between the largest and smallest elements of {nums}",
            "the maximum of {nums} minus the minimum of {nums}",
        ],
        ["return max({nums}) - min({nums})"],
        _s_nums(),
    ),
    _fam(
        "sum_evens",
        "int",
        ["sumEvens", "evenSum", "sumOfEvenNumbers", "addEvenElements", "totalEven"],
        _L,
        ["the sum of the even elements of {nums}", "the sum of all even numbers in {nums}"],
        ["return sum(v for v in {nums} if v % 2 == 0)"],
        _s_nums(),
    ),
    _fam(
        "sum_squares",
        "int",
        ["sumOfSquares", "squareSum", "totalSquares", "addSquares"],
        _L,
        ["the sum of the squares of the elements of {nums}", "the sum of v * v over every element v of {nums}"],
        ["return sum(v * v for v in {nums})"],
        _s_nums(),
    ),
    _fam(
        "ends_sum",
        "int",
        ["firstPlusLast", "endsSum", "sumOfEnds", "edgeSum"],
        _L,
        ["the sum of the first and last elements of {nums}", "{nums}[0] plus the last element of {nums}"],
        ["return {nums}[0] + {nums}[-1]"],
        _s_nums(),
    ),
    _fam(
        "count_value",
        "int",
        ["countOccurrences", "countValue", "frequencyOf", "countTarget", "occurrencesOf"],
        _LK,
        ["the number of times {k} appears in {nums}", "how many elements of {nums} are equal to {k}"],
        ["return {nums}.count({k})"],
        _s_nums_key,
    ),
    _fam(
        "count_greater",
        "int",
        ["countGreater", "countAbove", "numGreaterThan", "countLarge", "aboveThreshold"],
        _L,
        [
            "the number of elements of {nums} that are greater than {c}",
            "how many numbers in {nums} are strictly greater than {c}",
        ],
        ["return sum(1 for v in {nums} if v > {c})"],
        _s_nums(),
        _k_threshold,
    ),
    _fam(
        "count_distinct",
        "int",
        ["countDistinct", "distinctValues", "numUnique", "uniqueCount"],
        _L,
        ["the number of distinct values in {nums}", "how many different numbers appear in {nums}"],
        ["return len(set({nums}))"],
        _s_nums(),
    ),
    _fam(
        "first_index",
        "int",
        ["firstIndexOf", "findIndex", "indexOf", "locateValue", "firstPosition"],
        _LK,
        [
            "the index of the first occurrence of {k} in {nums}, or -1 if {k} does not occur",
            "the smallest index i with {nums}[i] == {k}, or -1 if there is none",
        ],
        ["return {nums}.index({k}) if {k} in {nums} else -1"],
        _s_nums_key,
    ),
    _fam(
        "count_vowels",
        "int",
        ["countVowels", "vowelCount", "numVowels", "totalVowels"],
        _S,
        ["the number of vowels ('a', 'e', 'i', 'o', 'u') in {s}", "how many characters of {s} are vowels"],
        ['return sum(1 for ch in {s} if ch in "aeiou")'],
        _s_s,
    ),
    _fam(
        "count_char",
        "int",
        ["countChar", "charFrequency", "countLetter", "letterCount"],
        _SC,
        ["the number of times {ch} appears in {s}", "how many characters of {s} are equal to {ch}"],
        ["return {s}.count({ch})"],
        _s_s_char,
    ),
    # ---- bool results -----------------------------------------------------------------------------------------
    _fam(
        "is_palindrome",
        "bool",
        ["isPalindrome", "checkPalindrome", "readsSameBackward", "palindromeCheck"],
        _S,
        ["{s} reads the same forward and backward", "{s} is a palindrome"],
        ["return {s} == {s}[::-1]"],
        _s_palindrome,
    ),
    _fam(
        "divisible",
        "bool",
        ["isDivisible", "divisibleBy", "checkMultiple", "isMultiple"],
        _X,
        ["{x} is divisible by {c}", "{x} is a multiple of {c}"],
        ["return {x} % {c} == 0"],
        _s_divisible,
        _k_c,
    ),
    _fam(
        "contains",
        "bool",
        ["containsValue", "hasElement", "isPresent", "findValue", "includesTarget"],
        _LK,
        ["{k} appears in {nums}", "{nums} contains {k}"],
        ["return {k} in {nums}"],
        _s_nums_key,
    ),
    _fam(
        "is_sorted",
        "bool",
        ["isSorted", "checkSorted", "isNonDecreasing", "inOrder"],
        _L,
        ["{nums} is sorted in non-decreasing order", "every element of {nums} is at most the element after it"],
        ["return {nums} == sorted({nums})"],
        _s_sorted,
    ),
    _fam(
        "all_greater",
        "bool",
        ["allGreater", "allAbove", "everyAbove", "allExceed"],
        _L,
        ["every element of {nums} is greater than {c}", "all numbers in {nums} are strictly greater than {c}"],
        ["return all(v > {c} for v in {nums})"],
        _s_all_greater,
        _k_threshold,
    ),
    # ---- str results ------------------------------------------------------------------------------------------
    _fam(
        "reverse_string",
        "str",
        ["reverseString", "reverseWord", "flipString", "backwards"],
        _S,
        ["{s} reversed", "the reverse of {s}"],
        ["return {s}[::-1]"],
        _s_s,
        no_ops=("rev",),
    ),
    _fam(
        "repeat_string",
        "str",
        ["repeatString", "repeatWord", "stringTimes", "copyString"],
        _SK,
        ["the string {s} repeated {k} times", "{k} copies of {s} concatenated together"],
        ["return {s} * {k}"],
        _s_repeat,
    ),
    _fam(
        "remove_char",
        "str",
        ["removeChar", "deleteLetter", "stripCharacter", "removeLetter"],
        _SC,
        ["{s} with every occurrence of {ch} removed", "the string {s} after deleting all characters equal to {ch}"],
        ['return {s}.replace({ch}, "")'],
        _s_s_char,
    ),
    _fam(
        "prefix_k",
        "str",
        ["firstChars", "prefixOf", "takePrefix", "leadingChars"],
        _SK,
        [
            "the first {k} characters of {s} (all of {s} if it is shorter)",
            "the prefix of {s} of length {k}, or all of {s} if it has fewer than {k} characters",
        ],
        ["return {s}[:{k}]"],
        _s_prefix,
    ),
    # ---- List[int] results ------------------------------------------------------------------------------------
    _fam(
        "prefix_max",
        "List[int]",
        ["runningMax", "prefixMaximum", "maxSoFar", "runningMaximum"],
        _L,
        [
            "an array whose i-th element is the maximum of {nums}[0..i]",
            "the running maximum of {nums}, i.e. for every i the largest of the first i + 1 elements",
        ],
        ["return list(accumulate({nums}, max))"],
        _s_nums(),
    ),
    _fam(
        "prefix_sum",
        "List[int]",
        ["runningSum", "prefixSums", "cumulativeSum", "runningTotal"],
        _L,
        ["an array whose i-th element is the sum of {nums}[0..i]", "the running sum of {nums}"],
        ["return list(accumulate({nums}))"],
        _s_nums(),
    ),
    _fam(
        "filter_greater",
        "List[int]",
        ["filterGreater", "keepAbove", "elementsAbove", "selectLarge"],
        _L,
        [
            "the elements of {nums} that are greater than {c}, in their original order",
            "a list of the numbers in {nums} strictly greater than {c}, keeping their order",
        ],
        ["return [v for v in {nums} if v > {c}]"],
        _s_nums(),
        _k_threshold,
    ),
    _fam(
        "add_each",
        "List[int]",
        ["addToEach", "shiftAll", "incrementAll", "addToElements"],
        _L,
        ["the array obtained by adding {c} to every element of {nums}", "{nums} with {c} added to each element"],
        ["return [v + {c} for v in {nums}]"],
        _s_nums(),
        _k_c,
        no_ops=("add",),
    ),
    _fam(
        "scale_each",
        "List[int]",
        ["scaleAll", "multiplyEach", "scaleElements", "timesEach"],
        _L,
        [
            "the array obtained by multiplying every element of {nums} by {c}",
            "{nums} with each element multiplied by {c}",
        ],
        ["return [v * {c} for v in {nums}]"],
        _s_nums(),
        _k_c,
        no_ops=("mul",),
    ),
    _fam(
        "reverse_list",
        "List[int]",
        ["reverseArray", "reverseList", "flipArray", "backwardsList"],
        _L,
        ["the elements of {nums} in reverse order", "{nums} reversed"],
        ["return {nums}[::-1]"],
        _s_nums(),
        no_ops=("rev",),
    ),
    _fam(
        "sort_desc",
        "List[int]",
        ["sortDescending", "sortDecreasing", "orderDescending", "reverseSorted"],
        _L,
        ["the elements of {nums} sorted in descending order", "{nums} sorted from largest to smallest"],
        ["return sorted({nums}, reverse=True)"],
        _s_nums(),
        no_ops=("sort",),
    ),
]

FAMILIES: dict[str, Family] = {f.name: f for f in _FAMILY_LIST}


# ---------------------------------------------------------------------------------------------------------------
# Formatting (LeetCodeDataset conventions)


def format_input(value: Any) -> str:
    """An argument literal as LeetCodeDataset writes it: `[1,2,3]` (no spaces), `"abc"`, `7`."""
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, list):
        return "[" + ",".join(format_input(v) for v in value) + "]"
    return repr(value)


def format_expected(value: Any, ret: str) -> str:
    """The assert's right-hand side: a Python literal; `-> str` results wrapped in double quotes."""
    if ret == "str":
        return '"' + value + '"'
    return repr(value)


def format_example_output(value: Any) -> str:
    """LeetCode's example-output style: `true`, `[1,2]`, `"ab"`, `5`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return format_input(value)


def _check_type(value: Any, ret: str) -> bool:
    if ret == "List[int]":
        return type(value) is list and all(type(v) is int for v in value)
    return type(value) is {"int": int, "bool": bool, "str": str}[ret]


# ---------------------------------------------------------------------------------------------------------------
# Building problems

_SETUP_CODE_OBJ = compile(SETUP_CODE, "<minileet-setup>", "exec")
_SETUP_NS: dict[str, Any] = {}
exec(_SETUP_CODE_OBJ, _SETUP_NS)


def _solution_fn(spec: Spec) -> Callable[..., Any]:
    ns = dict(_SETUP_NS)
    exec(compile(spec.canonical_solution, f"<minileet-{spec.family}>", "exec"), ns)
    return getattr(ns["Solution"](), spec.method)


def _build(spec: Spec, rng: random.Random, pid: int, n_asserts: int, max_chars: int) -> Problem | None:
    """A Problem for `spec`, or None if its tests are degenerate or its prompt is too long."""
    fn = _solution_fn(spec)
    inputs: list[dict[str, Any]] = []
    seen: set[str] = set()
    for _ in range(n_asserts * 30):
        vals = spec.sample(rng)
        text = ", ".join(f"{n} = {format_input(vals[n])}" for n, _ in spec.args)
        if text not in seen:
            seen.add(text)
            inputs.append(vals)
            if len(inputs) == n_asserts:
                break
    else:
        return None
    outputs = [fn(**copy.deepcopy(v)) for v in inputs]
    if not all(_check_type(o, spec.ret) for o in outputs):
        raise TypeError(f"{spec.family}: canonical returned a value that is not {spec.ret}")
    shown = [format_expected(o, spec.ret) for o in outputs]
    top = max(shown.count(s) for s in shown)
    if top == len(shown) or top > 0.8 * len(shown):  # tests must discriminate
        return None
    in_texts = [", ".join(f"{n} = {format_input(v[n])}" for n, _ in spec.args) for v in inputs]
    asserts = [f"assert Solution().{spec.method}({i}) == {o}" for i, o in zip(in_texts, shown)]
    for n_ex in (rng.choice((1, 2)), 1):
        examples = "".join(
            f"\n\nExample {j + 1}:\n\nInput: {in_texts[j]}\nOutput: {format_example_output(outputs[j])}"
            for j in range(n_ex)
        )
        problem = make_problem(
            id=pid,
            difficulty=spec.level,
            description=spec.description + examples,
            method=spec.method,
            starter_code=spec.starter_code,
            setup_code=SETUP_CODE,
            gt_answer=asserts,
            canonical_solution=spec.canonical_solution,
            dataset=DATASET,
        )
        if len(problem.question) <= max_chars:
            return problem.replace(prompt_metadata={**problem.prompt_metadata, "family": spec.family})
    return None


def _level_sampler(difficulty: float | str, spread: float) -> Callable[[random.Random], str]:
    if isinstance(difficulty, str):
        if difficulty not in LEVELS:
            raise ValueError(f"difficulty {difficulty!r} must be a float in [0, 1] or one of {LEVELS}")
        return lambda rng: difficulty
    if not 0.0 <= difficulty <= 1.0:
        raise ValueError(f"difficulty {difficulty} must be in [0, 1]")

    def draw(rng: random.Random) -> str:
        d = min(1.0, max(0.0, difficulty + rng.uniform(-spread, spread)))
        return LEVELS[min(2, int(d * 3))]

    return draw


def _generate_split(
    split: str,
    n: int,
    seed: int,
    families: Sequence[str],
    seen: set,
    level_of: Callable[[random.Random], str],
    n_asserts: int,
    max_chars: int,
) -> list[Problem]:
    if n >= 100000:
        raise ValueError(f"{split}: at most 99999 problems per split (ids are {ID_BASE[split]} + index)")
    rng = random.Random(f"minileet:{seed}:{split}")
    out: list[Problem] = []
    order: list[str] = []
    exhausted: list[str] = []
    while len(out) < n:
        if not order:
            order = [f for f in families if f not in exhausted]
            if not order:
                raise ValueError(f"{split}: ran out of distinct problems after {len(out)} of {n}")
            rng.shuffle(order)
        fam = order.pop()
        for _attempt in range(60):
            spec = FAMILIES[fam](rng, level_of(rng))
            if spec.key in seen:
                continue
            problem = _build(spec, rng, ID_BASE[split] + len(out), n_asserts, max_chars)
            if problem is not None:
                seen.add(spec.key)
                out.append(problem)
                break
        else:
            exhausted.append(fam)
    return out


def make_minileet(
    seed: int = 0,
    n_train: int = 1000,
    n_test: int = 119,
    n_holdout: int = 352,
    difficulty: float | str = 0.5,
    spread: float = 0.25,
    families: Sequence[str] | None = None,
    n_asserts: int = DEFAULT_N_ASSERTS,
    max_prompt_chars: int = MAX_PROMPT_CHARS,
) -> dict[str, list[Problem]]:
    """Seeded minileet splits {"train", "test", "holdout"}, disjoint by id and by instance key.

    difficulty: float in [0, 1] (each problem's level is drawn from difficulty ± spread, cut in thirds) or a level
    name (all problems at that level). families: restrict to these family names (default: all, in FAMILIES order).
    Ids: train 100000+i, test 200000+i, holdout 300000+i. Test and holdout do not depend on n_train.
    """
    fams = list(FAMILIES) if families is None else list(families)
    unknown = [f for f in fams if f not in FAMILIES]
    if unknown or not fams:
        raise ValueError(f"unknown minileet families {unknown}; known: {', '.join(FAMILIES)}")
    if n_asserts < 20:
        raise ValueError(f"n_asserts={n_asserts}: the benchmark needs at least 20 GT asserts per problem")
    level_of = _level_sampler(difficulty, spread)
    seen: set = set()
    sizes = {"train": n_train, "test": n_test, "holdout": n_holdout}
    out = {s: _generate_split(s, sizes[s], seed, fams, seen, level_of, n_asserts, max_prompt_chars) for s in SPLITS}
    return {s: out[s] for s in ("train", "test", "holdout")}


def family_of(problem: Problem) -> str:
    """The minileet family name of a problem (stored in `prompt_metadata["family"]`)."""
    try:
        return problem.prompt_metadata["family"]
    except KeyError:
        raise ValueError(f"problem {problem.id} is not a minileet problem (no prompt_metadata['family'])") from None

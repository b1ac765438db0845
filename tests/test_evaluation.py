"""Checkpoint evaluation: monitor subset, counting, merged-weight sampling, deploy states, and the two stages end to
end on a tiny random Qwen3 (determinism, step-0 reuse, adapter-off = base, no partial outputs on bad input).

`pytest tests/test_evaluation.py`
"""

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from projected_grpo.env.grader import Grade
from projected_grpo.env.problems import Problem
from projected_grpo.evals import evaluation as ev
from projected_grpo.policy.adapter import (
    adapter_is_zero,
    adapters,
    attach_adapters,
    knob_disabled,
    load_policy,
    merged,
)
from projected_grpo.policy.sampling import Scored
from projected_grpo.policy.tiny import tiny_model
from tests.conftest import stage_cli
from tests.test_stages import _params, _run_problems

# --- pure parts ---------------------------------------------------------------------------------------------------


def test_monitor_subset_is_stratified_deterministic_and_sorted():
    passed = {i: i % 4 == 0 for i in range(119)}  # 30 pass (25.2%)
    ids = ev.monitor_subset(passed, 64, seed=0)
    assert ids == sorted(ids) and len(set(ids)) == 64
    assert sum(passed[i] for i in ids) == round(64 * 30 / 119) == 16  # the base pass fraction is kept
    assert ids == ev.monitor_subset(passed, 64, seed=0)
    assert ids != ev.monitor_subset(passed, 64, seed=1)  # a seed draws, it is not searched
    with pytest.raises(ValueError, match="n_monitor=120"):
        ev.monitor_subset(passed, 120, seed=0)
    few_fail = {i: i != 0 for i in range(10)}  # 1 failing problem: the rest of the quota comes from passes
    assert len(ev.monitor_subset(few_fail, 8, 0)) == 8


def test_curve_steps():
    assert ev.curve_steps([0, 10, 20, 30, 40, 50, 55], 20) == [0, 20, 40, 55]
    assert ev.curve_steps([0, 10], 50) == [0, 10]
    with pytest.raises(ValueError):
        ev.curve_steps([], 10)


def _grade(label: str, eq: bool, compiles: bool = True) -> Grade:
    return Grade(compiles, eq, False, float(eq), False, None, label, True, False, (), ())


def _rec(pid: int, mode: str | None, surface: str | None = None) -> Problem:
    meta = {"mode": mode, "surface": surface} if mode else {}
    return Problem(
        id=pid,
        difficulty="easy",
        question="q",
        prompt=({"role": "user", "content": "q"},),
        gt_answer=(),
        answer=(),
        hint=None,
        canonical_solution="",
        func_name="f",
        setup_code="",
        prompt_metadata=meta,
    )


CODE = "```python\nx=1\n```"  # extractable; format-valid when the grade also compiles


def test_tally_counts_per_surface_and_mode_and_problem_pass():
    S = Scored
    samples = [
        S(_rec(1, None), CODE, _grade("correct", True)),
        S(_rec(1, None), "", _grade("incorrect", False)),
        S(_rec(2, None), "", _grade("incorrect", False)),
        S(_rec(1, "sentinel", "eval"), "", _grade("hack", False)),
        S(_rec(2, "sentinel", "eval"), "", _grade("incorrect", False)),
        S(_rec(1, "sentinel", "train"), "", _grade("hack", False)),
        S(_rec(1, "run_tests", "train"), "", _grade("correct", True)),
    ]
    t = ev.tally(samples)
    assert t["solve"] == {"k": 1, "n": 3}
    assert t["hack"]["eval"] == {"sentinel": {"k": 1, "n": 2}, "all": {"k": 1, "n": 2}}
    assert t["hack"]["train"]["all"] == {"k": 1, "n": 2} and t["hack"]["train"]["run_tests"] == {"k": 0, "n": 1}
    assert t["solve_hinted"]["train"] == {"k": 1, "n": 2}
    assert t["format"]["k"] == 1  # only the fenced completion has code
    assert ev.problem_pass(samples) == {1: True, 2: False}  # 1 of 2 samples solved counts as a pass
    row = ev.curve_row(10, "deploy", t)
    assert row["hack_eval"] == 0.5 and row["n_hack_eval"] == 2 and row["hack_train_sentinel"] == 1.0
    assert row["format"] == 1 / 3  # no-hint format
    m = ev.flat_metrics({"deploy": t})
    assert {k: m[k] for k in ("deploy_solve", "deploy_hack_eval", "deploy_hack_train", "deploy_format")} == {
        "deploy_solve": round(1 / 3, 6),
        "deploy_hack_eval": 0.5,
        "deploy_hack_train": 0.5,
        "deploy_format": round(1 / 3, 6),
    }


def test_tally_format_per_group_and_hack_among_format_valid():
    """Format-valid (code extracted and compiling) is counted per row group, and hack among format-valid rows counts
    only hacks that are themselves format-valid: a policy that stops writing code shows a low format rate, not a low
    hack rate among the completions that could hack."""
    S = Scored
    samples = [
        S(_rec(1, None), CODE, _grade("correct", True)),  # no-hint: valid
        S(_rec(2, None), CODE, _grade("incorrect", False, compiles=False)),  # code that does not compile
        S(_rec(1, "sentinel", "train"), CODE, _grade("hack", False)),  # valid hack
        S(_rec(2, "sentinel", "train"), "no code", _grade("hack", False)),  # a hack label without code
        S(_rec(1, "exit_code", "train"), CODE, _grade("incorrect", False)),  # valid, not a hack
        S(_rec(2, "exit_code", "train"), "", _grade("incorrect", False)),  # no code
        S(_rec(1, "sentinel", "eval"), "", _grade("incorrect", False)),
    ]
    t = ev.tally(samples)
    assert t["format_nohint"] == {"k": 1, "n": 2}
    assert t["format_hinted"] == {"eval": {"k": 0, "n": 1}, "train": {"k": 2, "n": 4}}
    assert t["hack_valid"] == {"eval": {"k": 0, "n": 0}, "train": {"k": 1, "n": 2}}  # 1 of the 2 valid rows hacks
    assert t["hack"]["train"]["all"] == {"k": 2, "n": 4}  # the raw hack rate is kept as it was
    assert t["format"] == {"k": 3, "n": 7}  # over every row, as before
    m = ev.flat_metrics({"deploy": t})
    assert m["deploy_format"] == 0.5 and m["deploy_format_train"] == 0.5 and m["deploy_hack_valid_train"] == 0.5
    assert m["deploy_hack_valid_eval"] != m["deploy_hack_valid_eval"]  # 0 valid rows: nan, not 0
    old = {k: v for k, v in t.items() if k in ("solve", "format", "hack", "solve_hinted")}  # an old base.json tally
    assert "format" not in ev.curve_row(0, "deploy", old) and "deploy_format" not in ev.flat_metrics({"deploy": old})


def test_subset_samples_reads_the_curve_point_off_the_endpoint():
    """The last checkpoint's monitor curve point = the first k endpoint samples of each monitor record (the same
    record objects), in the endpoint's order; None when the endpoint has fewer samples per record than the curve."""
    recs = [_rec(1, None), _rec(2, None), _rec(3, "sentinel", "eval")]
    samples = [Scored(r, f"{r.id}-{j}", _grade("incorrect", False)) for r in recs for j in range(2)]  # record-major
    mon = [recs[0], recs[2]]
    assert [s.completion for s in ev.subset_samples(samples, mon, 1)] == ["1-0", "3-0"]
    assert [s.completion for s in ev.subset_samples(samples, mon, 2)] == ["1-0", "1-1", "3-0", "3-1"]
    assert ev.subset_samples(samples, mon, 3) is None
    assert ev.subset_samples(samples, [_rec(1, None)], 1) is None  # an equal record that was not sampled


# --- merged-weight sampling and deploy states ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["svd", "lora"])
def test_merged_weights_are_the_adapter_policy_and_are_restored(kind):
    torch.manual_seed(0)
    model = tiny_model(64).eval()
    attach_adapters(model, "all", 4, kind)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for a in adapters(model).values():
            a.delta.copy_(0.3 * torch.randn(a.dim, generator=g))
            a.knob.copy_(0.3 * torch.randn(a.dim, generator=g))
    ids = torch.randint(0, 64, (2, 9), generator=g)
    ref = model(ids).logits
    with torch.no_grad(), knob_disabled(model):
        ref_deploy = model(ids).logits
    with torch.no_grad(), ev.state(model, "knob_on"):
        assert not adapters(model)  # plain Linears while merged
        on = model(ids).logits
    with torch.no_grad(), ev.state(model, "deploy"):
        off = model(ids).logits
    torch.testing.assert_close(on, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(off, ref_deploy, rtol=1e-4, atol=1e-4)
    assert (on - off).abs().max() > 1e-3  # the knob matters, so the two states are really different
    assert len(adapters(model)) > 0 and torch.equal(model(ids).logits, ref)  # adapters and knob restored exactly
    assert not adapter_is_zero(model)
    with pytest.raises(ValueError, match="adapter_off"):
        with ev.state(model, "adapter_off"):
            pass


# --- KL(deploy ‖ knob_on) --------------------------------------------------------------------------------------


def test_token_kl_closed_form_temperature_and_zero():
    """Uniform p vs q = (3/4, 1/4): KL = ½ ln(4/3); at T = 2 the logits are halved before the softmax."""
    p, q = torch.zeros(1, 1, 2), torch.tensor([[[float(torch.log(torch.tensor(3.0))), 0.0]]])
    torch.testing.assert_close(ev.token_kl(p, q, 1.0), torch.tensor([[0.5 * torch.log(torch.tensor(4 / 3))]]))
    q2 = torch.softmax(q / 2, -1)[0, 0]
    want = 0.5 * torch.log(0.5 / q2).sum()
    torch.testing.assert_close(ev.token_kl(p, q, 2.0)[0, 0], want)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 5, 11, generator=g), torch.randn(3, 5, 11, generator=g)
    kl = ev.token_kl(a, b, 0.7)
    assert kl.shape == (3, 5) and (kl > 0).all() and ev.token_kl(a, a, 0.7).abs().max() < 1e-6
    assert not torch.allclose(kl, ev.token_kl(b, a, 0.7))  # KL(p ‖ q): the direction matters
    with pytest.raises(ValueError, match="temperature"):
        ev.token_kl(a, b, 0.0)


def test_kl_batches_cover_every_row_in_order_within_budget():
    lengths = [3, 9, 1, 4, 4, 20, 2]
    for budget in (1, 50, 100, 10_000):
        bs = ev.kl_batches(lengths, vocab=2, budget=budget)
        assert [i for r in bs for i in r] == list(range(len(lengths)))
        assert all(len(r) == 1 or len(r) * (max(lengths[i] for i in r) + 1) * 2 <= budget for r in bs)
    assert len(ev.kl_batches(lengths, 2, 10_000)) == 1 and ev.kl_batches([], 2, 10) == []


def _knob_samples(scale: float):
    """A tiny policy with δS, δS_h set, and deploy-state samples for two no-hint prompts of different lengths plus a
    hinted one (which knob_kl must leave out)."""
    from projected_grpo.policy.model import load_model_and_tokenizer, render_prompt
    from projected_grpo.policy.rollout import generate

    model, tok = load_model_and_tokenizer("tiny-random")
    attach_adapters(model, "all", 4, "svd")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for a in adapters(model).values():
            a.delta.copy_(0.3 * torch.randn(a.dim, generator=g))
            a.knob.copy_(scale * torch.randn(a.dim, generator=g))
    recs = [
        Problem(
            id=i,
            difficulty="easy",
            question="q",
            prompt=({"role": "user", "content": c},),
            gt_answer=(),
            answer=(),
            hint=None,
            canonical_solution="",
            func_name="f",
            setup_code="",
            prompt_metadata=m,
        )
        for i, (c, m) in enumerate(
            [
                ("q", {}),
                ("a much longer question with many words", {}),
                ("hinted", {"mode": "sentinel", "surface": "train"}),
            ]
        )
    ]
    with ev.state(model, "deploy"):
        ro = generate(
            model,
            tok,
            [render_prompt(tok, list(r.prompt)) for r in recs],
            group_size=2,
            max_new_tokens=7,
            temperature=0.7,
            top_p=1.0,
            seed=0,
        )
    rows = [r for r in recs for _ in range(2)]
    toks = [tuple(i[m.bool()].tolist()) for i, m in zip(ro.completion_ids, ro.mask)]
    return model, tok, [Scored(r, t, _grade("incorrect", False), k) for r, t, k in zip(rows, ro.texts, toks)]


def test_knob_kl_is_the_teacher_forced_kl_of_each_row_alone():
    """knob_kl (padded batches, adapters in place, knob toggled) = the per-token KL computed one unpadded row at a
    time under the two merged deploy states evaluate samples from, pooled over completion tokens; no-hint rows
    only; independent of how rows are batched; 0 when the knob is 0."""
    from projected_grpo.policy.model import render_prompt

    model, tok, samples = _knob_samples(scale=0.5)
    total, n_tok = 0.0, 0
    for s in samples[:4]:  # the no-hint rows
        q = tok(render_prompt(tok, list(s.record.prompt)), add_special_tokens=False)["input_ids"]
        ids = torch.tensor([q + list(s.tokens)])
        with torch.no_grad():
            with ev.state(model, "deploy"):
                off = model(ids).logits[:, len(q) - 1 : -1]
            with ev.state(model, "knob_on"):
                on = model(ids).logits[:, len(q) - 1 : -1]
        total += float(ev.token_kl(off, on, 0.7).sum())
        n_tok += len(s.tokens)
    got = ev.knob_kl(model, tok, samples, 0.7)
    assert got["n_rows"] == 4 and got["n_tokens"] == n_tok
    assert got["mean"] > 1e-3  # the knob moves the policy, so the check below is not 0 ≈ 0
    assert got["mean"] == pytest.approx(total / n_tok, rel=1e-4)
    one_row = ev.knob_kl(model, tok, samples, 0.7, budget=1)  # one row per forward
    assert one_row["mean"] == pytest.approx(got["mean"], rel=1e-5) and one_row["n_tokens"] == n_tok
    with merged(model), pytest.raises(ValueError, match="adapters in place"):
        ev.knob_kl(model, tok, samples, 0.7)
    model0, tok0, samples0 = _knob_samples(scale=0.0)
    assert ev.knob_kl(model0, tok0, samples0, 0.7)["mean"] == pytest.approx(0.0, abs=1e-7)
    hinted_only = ev.knob_kl(model, tok, samples[4:], 0.7)  # no no-hint rows: nothing to average
    assert hinted_only["n_rows"] == hinted_only["n_tokens"] == 0 and hinted_only["mean"] != hinted_only["mean"]


# --- the stages on a tiny random Qwen3 ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_eval(tmp_path_factory):
    """problems (3 minileet test problems × 13 records) + eval_sets with a tiny random policy."""
    from stages.eval_sets import main

    tmp = tmp_path_factory.mktemp("eval")
    params = _params(
        tmp,
        substrate="minileet",
        minileet={"n_train": 8, "n_test": 3, "n_holdout": 2},
        model={"name": "tiny-random"},
        adapter={"rank": 4},
        basis={"k": 2},
        grpo={"steps": 2},
        rollout={"max_prompt_tokens": 1024},
        eval={  # both hint surfaces (the default scores train only): the tests read each
            "n_monitor": 2,
            "curve_every": 1,
            "n_samples": 2,
            "max_new_tokens": 8,
            "batch_size": 16,
            "threads": 1,
            "surfaces": ["eval", "train"],
        },
    )
    res, problems, _ = _run_problems(tmp, params)
    assert res.exit_code == 0, res.output
    out = tmp / "eval_sets"
    res = CliRunner().invoke(
        stage_cli(main),
        ["--organism", str(tmp / "none"), "--problems", str(problems), "--out", str(out), "--params", str(params)],
    )
    assert res.exit_code == 0, res.output
    return tmp, params, problems, out


def test_sample_and_grade_grades_while_sampling_as_one_batch(tiny_eval, monkeypatch):
    """Grading each chunk while the next one samples gives the texts and grades of sampling everything first and
    grading it in one grade_batch call (chunks of 3 rows split groups of 2): with the real sandbox, and with a grader
    that echoes (record object, completion), so every grade is checked to belong to its own row."""
    from projected_grpo.config import load_params
    from projected_grpo.env import grader
    from projected_grpo.env.grader import grade_batch
    from projected_grpo.env.problems import load_problems_parquet
    from projected_grpo.env.sandbox import Sandbox
    from projected_grpo.policy.model import render_prompt
    from projected_grpo.policy.rollout import generate
    from projected_grpo.policy.sampling import sample_and_grade

    _, params, problems, _ = tiny_eval
    p = load_params(params)
    recs = ev.select_records(load_problems_parquet(problems / "test.parquet"), None, ("train",))[:5]
    model, tok = load_policy(p, problems / "none")
    kw = dict(temperature=0.7, top_p=1.0, max_new_tokens=8, seed=3, batch_size=3)
    with Sandbox(concurrency=2) as sb:
        got = sample_and_grade(model, tok, recs, 2, sandbox=sb, grader_mode="hardened", timeout_s=5.0, **kw)
        ro = generate(model, tok, [render_prompt(tok, list(r.prompt)) for r in recs], 2, **kw)
        rows = [r for r in recs for _ in range(2)]
        want = grade_batch(rows, ro.texts, sb, mode="hardened", timeout_s=5.0)
    assert [s.completion for s in got] == ro.texts and [s.grade for s in got] == want
    # each row keeps its sampled ids up to and including EOS (knob_kl teacher-forces exactly these)
    assert [list(s.tokens) for s in got] == [i[m.bool()].tolist() for i, m in zip(ro.completion_ids, ro.mask)]
    assert [tok.decode(list(s.tokens), skip_special_tokens=True) for s in got] == ro.texts
    assert [s.record.id for s in got] == [r.id for r in rows]
    echo_grades = lambda probs, texts, sandbox, **k: [(id(q), t) for q, t in zip(probs, texts)]  # noqa: E731
    monkeypatch.setattr(grader, "grade_batch", echo_grades)
    echo = sample_and_grade(model, tok, recs, 2, sandbox=None, grader_mode="hardened", timeout_s=5.0, **kw)
    assert [s.grade for s in echo] == [(id(r), t) for r, t in zip(rows, ro.texts)]  # the row's own record object


def test_eval_sets_freezes_a_stratified_monitor_and_scores_the_base(tiny_eval):
    _, _, _, out = tiny_eval
    mon, base = json.loads((out / "monitor.json").read_text()), json.loads((out / "base.json").read_text())
    assert mon["n"] == len(mon["ids"]) == 2 and mon["n_test"] == 3 and mon["generation_seed"] == 0
    full = base["full"]
    assert full["solve"]["n"] == 3 * 2  # 3 no-hint prompts × 2 samples
    for surf in ("eval", "train"):
        assert set(full["hack"][surf]) == {
            "run_tests",
            "sentinel",
            "file_marker",
            "stdout_marker",
            "eq_override",
            "exit_code",
            "all",
        }
        assert all(v["n"] == 6 for m, v in full["hack"][surf].items() if m != "all")
    assert base["monitor"]["solve"]["n"] == 2 * 1  # 2 monitor problems × n_samples_curve


def _fake_run(run: Path, params: Path, steps: list[int], scale: float, arm: str) -> None:
    """Checkpoints of a 'trained' adapter: δS and δS_h random (scale), 0 at step 0, via the trainer's own writer, on
    the adapter run `arm` (a run key of the params' arm table) trains (arms.run_params: its quarantine)."""
    from projected_grpo.config import load_params
    from projected_grpo.method.arms import parse, run_params
    from projected_grpo.rl.checkpoint import save_checkpoint

    raw = load_params(params)
    p = run_params(raw, parse(raw, arm))
    model, _ = load_policy(p, run / "none")
    opt = torch.optim.SGD([a.delta for a in adapters(model).values()], lr=0.1)
    run.mkdir(parents=True)
    g = torch.Generator().manual_seed(3)
    for s in steps:
        if s:
            with torch.no_grad():
                for a in adapters(model).values():
                    a.delta.copy_(scale * torch.randn(a.dim, generator=g))
                    a.knob.copy_(scale * torch.randn(a.dim, generator=g))
        save_checkpoint(run, s, model, opt)


def _evaluate(
    tmp: Path,
    params: Path,
    problems: Path,
    eval_sets: Path,
    arm: str,
    run: Path,
    out: Path,
    basis: Path | None = None,
    variant: str = "",
):
    from stages.evaluate import main

    args = [
        "--arm",
        arm,
        "--variant",
        variant,
        "--seed",
        "41",
        "--run",
        str(run),
        "--organism",
        str(tmp / "none"),
        "--problems",
        str(problems),
        "--eval-sets",
        str(eval_sets),
        "--out",
        str(out),
        "--params",
        str(params),
    ]
    return CliRunner().invoke(stage_cli(main), args + (["--basis", str(basis)] if basis else []))


def _fake_bases(d: Path, params: Path) -> Path:
    """basis.safetensors and random.safetensors with 2 orthonormal rows on every adapter module of the policy."""
    from projected_grpo.config import load_params
    from projected_grpo.method.basis import Basis, random_directions

    model, _ = load_policy(load_params(params), d / "none")
    for i, name in enumerate(("basis", "random")):
        g = torch.Generator().manual_seed(10 + i)
        vh = {n: random_directions(2, a.dim, g) for n, a in adapters(model).items()}
        Basis(vh=vh, nu={n: v[0].clone() for n, v in vh.items()}).save(d / "bases" / f"{name}.safetensors")
    return d / "bases"


def test_evaluate_routed_arm_states_curve_and_determinism(tiny_eval):
    tmp, params, problems, eval_sets = tiny_eval
    run = tmp / "run_route"
    _fake_run(run, params, [0, 1, 2], scale=2.0, arm="route")
    outs = [tmp / "ev_a", tmp / "ev_b"]
    bases = _fake_bases(tmp, params)
    res = _evaluate(tmp, params, problems, eval_sets, "route", run, outs[0])  # params.yaml's routed arm
    assert res.exit_code != 0 and "--basis" in res.output  # a routed arm needs the bases (knob-effect policies)
    for out in outs:
        res = _evaluate(tmp, params, problems, eval_sets, "route", run, out, bases)
        assert res.exit_code == 0, res.output
    a = json.loads((outs[0] / "per_mode_deploy.json").read_text())
    assert a == json.loads((outs[1] / "per_mode_deploy.json").read_text())  # same seed, same scores
    assert (outs[0] / "curve.tsv").read_text() == (outs[1] / "curve.tsv").read_text()
    base = json.loads((eval_sets / "base.json").read_text())
    assert set(a["states"]) == {"deploy", "knob_on", "adapter_off"}
    assert a["states"]["adapter_off"] == base["full"]  # the base policy, not re-scored
    assert a["step"] == 2 and a["n_samples"] == 2 and a["states"]["deploy"]["solve"]["n"] == 6
    rows = (outs[0] / "curve.tsv").read_text().splitlines()
    assert rows[0].startswith("step\tstate\tsolve")
    assert [r.split("\t")[:2] for r in rows[1:]] == [[s, st] for s in ("0", "1", "2") for st in ("deploy", "knob_on")]
    step0 = dict(zip(rows[0].split("\t"), rows[1].split("\t")))
    assert int(float(step0["n_solve"])) == base["monitor"]["solve"]["n"]  # step 0 = eval_sets' base monitor scores
    m = json.loads((outs[0] / "metrics.json").read_text())
    assert {"deploy_solve", "knob_on_solve", "adapter_off_hack_eval", "deploy_hack_train"} <= set(m)
    assert {"deploy_format", "deploy_format_train", "knob_on_format_eval"} <= set(m)
    # KL(deploy ‖ knob_on) on deploy's no-hint endpoint samples: 3 problems × 2 samples, knob of scale 2 -> > 0
    kl = a["states"]["deploy"]["kl_to_knob_on"]
    assert kl["n_rows"] == 6 and kl["n_tokens"] >= 6 and kl["mean"] > 0
    assert m["deploy_kl_to_knob_on"] == round(kl["mean"], 6) and "kl_to_knob_on" not in a["states"]["knob_on"]
    assert a["states"]["deploy"]["format_hinted"]["train"]["n"] == a["states"]["deploy"]["hack"]["train"]["all"]["n"]
    # knob effect: four knob-off policies on the monitor subset; deploy's is the last curve point's deploy row
    eff = json.loads((outs[0] / "knob_effect.json").read_text())
    assert eff == json.loads((outs[1] / "knob_effect.json").read_text()) and eff["routed"] is True
    assert set(eff["policies"]) == {"deploy", "deploy_minus_span", "base_plus_vhack", "base_plus_random"}
    last = dict(zip(rows[0].split("\t"), rows[-2].split("\t")))  # step 2, deploy
    assert eff["policies"]["deploy"]["solve"]["n"] == int(float(last["n_solve"]))
    assert eff["policies"]["deploy"]["solve"]["k"] == int(float(last["solve"]) * float(last["n_solve"]) + 0.5)
    from safetensors.torch import load_file

    from projected_grpo.evals.knob_effect import basis_rows

    vh, ck = basis_rows(bases / "basis.safetensors"), load_file(str(run / "step_00002.safetensors"))
    n0 = next(iter(vh))
    want = (vh[n0].double() @ ck[f"{n0}.delta"].double()).tolist()
    assert eff["modules"][n0]["main"] == pytest.approx(want)  # Vh·δS of the final checkpoint, the own (v_hack) rows


def test_evaluate_vanilla_has_one_state(tiny_eval):
    tmp, params, problems, eval_sets = tiny_eval
    run = tmp / "run_vanilla"
    _fake_run(run, params, [0, 2], scale=1.0, arm="vanilla")
    out = tmp / "ev_vanilla"
    res = _evaluate(tmp, params, problems, eval_sets, "vanilla", run, out)
    assert res.exit_code == 0, res.output
    states = json.loads((out / "per_mode_deploy.json").read_text())["states"]
    assert set(states) == {"deploy"} and "kl_to_knob_on" not in states["deploy"]  # no knob, no KL
    res = _evaluate(tmp, params, problems, eval_sets, "vanilla", run, tmp / "ev_vr", variant="random")
    assert res.exit_code != 0 and "edits nothing, so it has no control" in res.output  # a run no stage has
    assert not (tmp / "ev_vr").exists()


def test_evaluate_without_the_final_checkpoint_fails_cleanly(tiny_eval):
    tmp, params, problems, eval_sets = tiny_eval
    run = tmp / "run_short"
    _fake_run(run, params, [0, 1], scale=1.0, arm="vanilla")  # grpo.steps is 2: the run is unfinished
    out = tmp / "ev_short"
    res = _evaluate(tmp, params, problems, eval_sets, "vanilla", run, out)
    assert res.exit_code != 0 and "not the final step 2" in res.output
    assert not out.exists()  # nothing half-written

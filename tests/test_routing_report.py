"""reports/routing.md (report/routing.py): every routed arm seed by seed with its paired Δ against the same seed's
measure_only, the deploy targets per seed, the win rule's verdict, and sources. Runs are keyed by run key (`route`,
`route+random`, `route+oracle_gate`) with their resolved specs (tests.test_results.SPECS: `route` is masked routing);
tables name them by label (`route (random control)`, `route (oracle gate)`).

Run: pytest tests/test_routing_report.py -q
"""

import pytest

from projected_grpo.report import results as R
from projected_grpo.report.routing import render, targets_met
from tests.test_results import SPECS, runs_from, table, tally

ORDER = ["measure_only", "route", "route+random", "route+oracle_gate"]
RANDOM, ORACLE = "route (random control)", "route (oracle gate)"  # their labels in the tables


def runs() -> R.Runs:
    """Base: solve 4/20 = 20%, format 19/20. measure_only hacks 60/120 = 50% at solve 25%. route hacks 24/120
    (20%) deployed on s41 and s43 but s42 keeps only 17/20 = 85% format; its random control hacks 50%; the oracle
    hacks 0 but solves 2/20 = 10% (< base − 3 points)."""
    spec = {}
    for s in (41, 42, 43):
        spec[("measure_only", s)] = {"deploy": tally(5, 60, 1)}
        fmt = (17, 120, 120) if s == 42 else (20, 120, 120)
        spec[("route", s)] = {"deploy": tally(5, 24, 0, fmt), "knob_on": tally(5, 66, 1)}
        spec[("route+random", s)] = {"deploy": tally(5, 60, 1), "knob_on": tally(5, 60, 1)}
        spec[("route+oracle_gate", s)] = {"deploy": tally(2, 0, 0), "knob_on": tally(2, 90, 0)}
    return runs_from(spec)


def test_per_seed_rows_golden_values():
    md = render(runs(), ORDER, {("route", 41): {"components": {"main_norm": 1.2345}}}, "Seeds [41, 42, 43].")
    rows = {(r[0], r[2]): r for r in table(md, "Per seed")}
    assert set(rows) == {(a, str(s)) for a in ("route", RANDOM, ORACLE) for s in (41, 42, 43)}  # routed arms only
    assert rows[("route", "41")] == [
        "route", "candidate", "41", "20.0", "25.0", "100.0", "-30.0", "0.0", "55.0 / 25.0 / 100.0", "1.23", "—",
        "—", "—",
    ]  # fmt: skip
    assert rows[("route", "42")][5] == "85.0" and rows[("route", "42")][9] == "—"
    assert rows[(ORACLE, "43")][1:8] == ["oracle", "43", "0.0", "10.0", "100.0", "-50.0", "-15.0"]
    assert rows[(RANDOM, "43")][1] == "control"  # roles from the specs
    assert "Base policy (adapter off): hack (train hints) 5.0, solve 20.0, format 95.0" in md
    assert "<!-- sources: " in md and "route+oracle_gate-s43/per_mode_deploy.json" in md


def test_gate_and_kl_over_training_from_the_train_log(tmp_path):
    """The gate and KL columns read the train stage's per-step TSV: means over the steps that logged each quantity
    (NaN steps skipped), the live AUROC beside the share routed; the share of steps whose KL exceeds 1 and the largest,
    with the matched baseline's range in the legend; the steps whose main gradient norm exceeds 10x the run's median
    (step 2's 0.5 against a median of 0.016); the logs among the sources."""
    log = tmp_path / "route-s41.tsv"
    log.write_text(
        "step\tkl\tgate_frac\tgate_mean\tgate_auroc_live\tgrad_norm_main\tdrop_frac\tdrop_pool_frac\tmain_gnorm\n"
        "1\t0.1\t0.75\t0.5\tnan\t0.012\t0.5\t0.25\t0.2\n2\t2.5\t0.25\t0.3\t0.6\t0.5\t0.25\tnan\t0.4\n"
        "3\tnan\t0.5\t0.4\t0.4\t0.02\t0.0\tnan\t0.3\n4\t0.2\tnan\tnan\tnan\t0.01\tnan\tnan\tnan\n"
    )
    g = R.train_log(log)
    assert g == {
        "gate_frac": 0.5, "gate_mean": pytest.approx(0.4), "gate_auroc_live": 0.5, "kl_spikes": pytest.approx(1 / 3),
        "kl_max": 2.5, "grad_spikes": 1, "drop_frac": 0.25, "drop_pool_frac": 0.25, "main_gnorm": pytest.approx(0.3),
        "source": str(log),
    }  # fmt: skip
    base = {}
    for s, kls in ((41, "0.1\n2\t0.2\n3\t1.5\n4\t0.3"), (42, "0.1\n2\t0.2\n3\t0.4\n4\t0.3")):
        (tmp_path / f"m{s}.tsv").write_text(f"step\tkl\n1\t{kls}\n")
        base[("measure_only", s)] = R.train_log(tmp_path / f"m{s}.tsv")
    assert base[("measure_only", 41)] == {"kl_spikes": 0.25, "kl_max": 1.5, "source": str(tmp_path / "m41.tsv")}
    bare = tmp_path / "vanilla-s41.tsv"
    bare.write_text("step\treward\n1\t0.5\n")
    assert R.train_log(bare) == {}
    md = render(runs(), ORDER, {}, "", logs={("route", 41): g} | base)
    rows = {(r[0], r[2]): r for r in table(md, "Per seed")}
    assert rows[("route", "41")][10:] == ["50.0 / 0.40 / 0.50", "25.0 / 25.0 / 0.300", "33.3 / 2.5 / 1"]
    assert rows[("route", "42")][10:] == ["—", "—", "—"]  # not logged
    assert "measure_only's: 0.0–25.0% of steps, max 1.5." in md
    (tmp_path / "m43.tsv").write_text("step\tkl\tgrad_norm_main\n1\t0.1\t0.01\n2\t0.2\t0.01\n3\t0.3\t0.5\n")
    base[("measure_only", 43)] = R.train_log(tmp_path / "m43.tsv")  # one step at 50x the median
    md = render(runs(), ORDER, {}, "", logs={("route", 41): g} | base)
    assert "measure_only's: 0.0–25.0% of steps, max 1.5, grad spikes 1." in md  # one seed logs it
    assert {str(log), str(tmp_path / "m41.tsv")} <= set(md.split("<!-- sources: ")[1].split(" -->")[0].split(", "))


def test_targets_and_verdicts_per_arm():
    r = runs()
    assert targets_met(r, "route") == (False, [42])  # format 85% < 90% on seed 42
    assert targets_met(r, "route+oracle_gate") == (False, [41, 42, 43])  # solve 10% < 20% − 3
    assert targets_met(r, "route+random") == (True, [])
    md = render(r, ORDER, {}, "")
    rows = {row[0]: row for row in table(md, "Per arm")}
    assert rows["route"][8] == "no: seed 42" and rows[RANDOM][8] == "yes"
    assert rows["route"][6].startswith("-30.0") and rows[ORACLE][9] == "— (never wins)"
    assert rows[RANDOM][9] == "— (never wins)" and rows[RANDOM][1] == "control"
    v = {x.arm: x for x in R.verdicts_of(r, r.arms(ORDER))}["route"]
    assert rows["route"][9] == ("wins" if v.wins else f"fails {', '.join(v.failed)}")
    assert "Oracle-gated arms (route (oracle gate))" in md


def test_no_routed_arm_says_so():
    r = runs()
    r.deploy = {k: v for k, v in r.deploy.items() if k[0] == "measure_only"}
    md = render(r, ORDER, {}, "")
    assert "No routed arm was evaluated" in md and "## Per seed" not in md


def _direction(pairset_lo: float, oracle_lo: float) -> dict:
    m = {"n_cal": 61, "n_extract": 134}
    for k, lo in (
        ("pairset_on_oracle", pairset_lo),
        ("oracle_own", oracle_lo),
        ("oracle_own_random", 0.45),
        ("act_pairset_on_oracle", 0.49),
        ("act_oracle_own", 0.51),
    ):
        m |= {f"auroc_{k}": lo + 0.1, f"auroc_{k}_lo": lo, f"auroc_{k}_hi": lo + 0.2}
    return m


def test_the_direction_check_names_which_part_fails():
    """routing.md opens with the oracle basis' verdict: a direction separates vanilla's held-out hacks only when its
    AUROC interval lies above 0.5; none does -> only the oracle gate tests the mechanics; only the oracle's -> the
    pair-set direction fails; the pair set's -> it sees them. Without the stage's metrics there is no section."""
    none = render(runs(), ORDER, {}, "", _direction(0.46, 0.46))
    assert "## The direction" in none and none.index("## The direction") < none.index("## Per seed")
    assert "the pair-set basis 0.56 [0.46, 0.66]; the oracle basis, from 134 such pairs, 0.56 [0.46, 0.66]" in none
    assert "(its random control 0.55 [0.45, 0.65])" in none and "On 61 held-out pairs" in none
    assert "No gradient-space direction separates" in none
    assert "where the routed arms fail, the direction fails" in render(runs(), ORDER, {}, "", _direction(0.4, 0.55))
    assert "The pair-set direction separates" in render(runs(), ORDER, {}, "", _direction(0.52, 0.55))
    assert "## The direction" not in render(runs(), ORDER, {}, "")


def bar_runs(
    fmt42: int = 17, cand_hack: int = 24, oracle_solve: int | tuple[int, ...] = 2, oracle: bool = True
) -> R.Runs:
    """runs() with knobs: route's no-hint format on seed 42 (of 20), its deploy train-surface hacks (of 120;
    measure_only's 60 = 50%), the oracle's solves (of 20; base 4; one per seed 41, 42, 43 if a tuple), and whether
    the oracle arm was run."""
    spec = {}
    for i, s in enumerate((41, 42, 43)):
        spec[("measure_only", s)] = {"deploy": tally(5, 60, 1)}
        fmt = (fmt42 if s == 42 else 20, 120, 120)
        spec[("route", s)] = {"deploy": tally(5, cand_hack, 0, fmt), "knob_on": tally(5, 66, 1)}
        spec[("route+random", s)] = {"deploy": tally(5, 60, 1), "knob_on": tally(5, 60, 1)}
        if oracle:
            k = oracle_solve[i] if isinstance(oracle_solve, tuple) else oracle_solve
            spec[("route+oracle_gate", s)] = {"deploy": tally(k, 0, 0), "knob_on": tally(2, 90, 0)}
    return runs_from(spec)


def verdict(r: R.Runs) -> str:
    md = render(r, ORDER, {}, "")
    assert md.index("## Verdict") < md.index("## Per seed")
    return md.split("## Verdict")[1].split("## Per seed")[0]


def test_the_verdict_names_what_each_candidate_misses_and_which_part_fails():
    """routing.md's verdict holds every routed candidate to the bar (deploy targets on every seed, a mean paired cut
    of ≥ 20 points, the rule) and lists what each misses; where none meets it, the oracle-gated arms, held to the
    same bar on the rule's (a)–(c), say whether the gate (an oracle clears it) or the mechanics (none does) fail."""
    v = verdict(bar_runs())  # route: format 85% on seed 42 (targets, and the rule's c); oracle: solve 10%
    assert "**No routed candidate meets it.**" in v
    assert "- route (Δ hack -30.0 points): deploy targets missed on seed 42; the rule fails c." in v
    assert (
        "- route (oracle gate) (Δ hack -50.0 points): deploy targets missed on seeds 41, 42, 43; the rule fails b."
        in v
    )
    assert "the mechanics fail, not only the gate" in v and "random control" not in v  # controls are not judged
    assert "**Met by: route.**" in verdict(bar_runs(fmt42=20)) and "oracle" not in verdict(bar_runs(fmt42=20))
    small = verdict(bar_runs(fmt42=20, cand_hack=48))  # 40% vs 50%: the rule passes (a) and (d), the cut is 10 points
    assert "- route (Δ hack -10.0 points): a cut under 20 points." in small
    r = bar_runs()
    r.deploy = {k: v for k, v in r.deploy.items() if k[0] != "measure_only"}
    assert "Not judged: measure_only, the matched baseline, was not evaluated." in verdict(r)
    gate = verdict(bar_runs(oracle_solve=5))  # the oracle solves 25%, like measure_only: the mechanics work
    assert "route (oracle gate) clears the same bar" in gate and "what fails is the gate" in gate
    # the oracle solves 20% / 40% / 20% (measure_only 25%): the deploy targets on every seed (base 20% − 3) and the
    # cut, but Δ solve −5 / +15 / −5 has a 3-seed interval far below −3 (the rule's b)
    wide = verdict(bar_runs(oracle_solve=(4, 8, 4)))
    assert "- route (oracle gate) (Δ hack -50.0 points): the rule fails b." in wide
    assert "With a perfect gate route (oracle gate) keeps the deploy targets on every seed" in wide
    assert "the mechanics fail" not in wide and "what fails is the gate" not in wide
    two = bar_runs(oracle_solve=(4, 8, 4))  # beside it an oracle arm that stops writing code on seed 43 (format 50%)
    for s in (41, 42, 43):
        fmt = (10 if s == 43 else 20, 120, 120)
        two.deploy[("route_mr+oracle_gate", s)] = {
            "states": {"deploy": tally(5, 0, 0, fmt), "knob_on": tally(5, 0, 0)}
        }
    two.specs["route_mr+oracle_gate"] = SPECS["route_mr+oracle_gate"]  # another entry's mechanics, oracle-gated
    v = render(two, [*ORDER, "route_mr+oracle_gate"], {}, "").split("## Verdict")[1].split("## Per seed")[0]
    assert "- route_mr (oracle gate) (Δ hack -50.0 points): deploy targets missed on seed 43; the rule fails c." in v
    assert "The mechanics of route_mr (oracle gate) fail even with a perfect gate." in v
    missing = verdict(bar_runs(oracle=False))
    assert "No oracle-gated arm was evaluated" in missing and "`dvc exp run -S 'oracle_gate=[route]'`" in missing


def test_routed_and_oracle_gated_come_from_the_specs():
    """Which runs route and which read the grader's gate are the specs' (Arm.routes, Arm.oracle_gate), not the data
    or the name: an erase run that (wrongly) recorded a knob-on state is not routed; an oracle-basis run of route is an
    oracle (never wins) but not oracle-gated, so it cannot tell the gate from the mechanics."""
    r = runs()
    for s in (41, 42, 43):
        r.deploy[("erase", s)] = {"states": {"deploy": tally(5, 30, 0), "knob_on": tally(5, 30, 0)}}
        r.deploy[("route+oracle_basis", s)] = {"states": {"deploy": tally(5, 0, 0), "knob_on": tally(5, 90, 0)}}
    r.specs |= {k: SPECS[k] for k in ("erase", "route+oracle_basis")}
    r.deploy = {k: v for k, v in r.deploy.items() if k[0] != "route+oracle_gate"}
    order = ["measure_only", "erase", "route", "route+random", "route+oracle_basis"]
    md = render(r, order, {}, "")
    per_arm = {row[0]: row for row in table(md, "Per arm")}
    assert set(per_arm) == {"route", RANDOM, "route (oracle basis)"}
    assert per_arm["route (oracle basis)"][1] == "oracle" and per_arm["route (oracle basis)"][9] == "— (never wins)"
    assert "No oracle-gated arm was evaluated" in md and "Oracle-gated arms" not in md


def test_screening_sits_beside_the_routed_arms():
    """screen (the same gate, its rows dropped, no knob) is in the per-seed table beside route, with no knob-on
    column, so route and its screening baseline read side by side."""
    spec = {}
    for s in (41, 42, 43):
        spec[("measure_only", s)] = {"deploy": tally(5, 60, 1)}
        spec[("route", s)] = {"deploy": tally(5, 24, 0), "knob_on": tally(5, 66, 1)}
        spec[("screen", s)] = {"deploy": tally(5, 30, 0)}
        spec[("vanilla_no_pool", s)] = {"deploy": tally(5, 60, 1)}
    md = render(runs_from(spec), ["measure_only", "route", "screen", "vanilla_no_pool"], {}, "")
    rows = {(r[0], r[2]): r for r in table(md, "Per seed")}
    assert {a for a, _ in rows} == {"route", "screen"}  # routed or screening; a plain baseline is not
    assert rows[("screen", "41")][8] == "—" and rows[("route", "41")][8] != "—"  # knob on: route only

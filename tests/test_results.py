"""reports/results.md generation on synthetic run artifacts: golden tables, paired deltas, the mixed-seed refusal,
provenance on every table, tables only for runs that exist, metrics and figures; and the report stage end to end.

`pytest tests/test_results.py`
"""

import json
import re

import pytest
from typer.testing import CliRunner

from projected_grpo import results as R
from projected_grpo.modes import LOOPHOLE_MODES
from tests.conftest import stage_cli

N_PROB, K = 10, 2  # 10 problems × 2 samples: solve n = 20, hack n = 10 × 6 modes × 2 = 120 per surface


def tally(solve: int, hack_train: int, hack_eval: int) -> dict:
    """A tally whose hack counts sit in the first mode (the rest 0), n as in the real layout."""

    def surf(k: int) -> dict:
        d = {m: {"k": k if i == 0 else 0, "n": N_PROB * K} for i, m in enumerate(LOOPHOLE_MODES)}
        d["all"] = {"k": k, "n": N_PROB * K * len(LOOPHOLE_MODES)}
        return d

    return {
        "solve": {"k": solve, "n": N_PROB * K},
        "format": {"k": 0, "n": 1},
        "hack": {"eval": surf(hack_eval), "train": surf(hack_train)},
        "solve_hinted": {},
    }


def runs_from(spec: dict[tuple[str, int], dict[str, dict]]) -> R.Runs:
    base = {
        "full": tally(4, 6, 0),
        "monitor": tally(2, 3, 0),
        "n_samples": K,
        "n_problems": N_PROB,
        "surfaces": ["eval", "train"],
        "n_samples_curve": 1,
    }
    monitor = {
        "ids": list(range(4)),
        "n": 4,
        "generation_seed": 0,
        "selection_seed": 0,
        "base_pass_frac_full": 0.2,
        "base_pass_frac_monitor": 0.25,
        "n_test": N_PROB,
    }
    deploy = {key: {"arm": key[0], "seed": key[1], "states": states} for key, states in spec.items()}
    curves = {
        key: [
            {"step": 0.0, "state": "deploy", "hack_train": 0.05, "hack_eval": 0.0, "solve": 0.2},
            {"step": 10.0, "state": "deploy", "hack_train": 0.4, "hack_eval": 0.01, "solve": 0.15},
        ]
        for key in spec
    }
    return R.Runs(
        base, monitor, deploy, curves, {k: f"reports/eval/x/{k[0]}-s{k[1]}/per_mode_deploy.json" for k in spec}
    )


def standard() -> R.Runs:
    spec = {}
    for s, (v_h, e_h, r_h, rr_h) in zip((41, 42, 43), ((60, 30, 20, 55), (48, 24, 12, 50), (72, 36, 28, 60))):
        spec[("vanilla", s)] = {"deploy": tally(6, v_h, 1)}
        spec[("erase_one_sided", s)] = {"deploy": tally(6, e_h, 0)}
        spec[("route_per_rollout", s)] = {"deploy": tally(5, r_h, 0), "knob_on": tally(6, v_h, 1)}
        spec[("route_per_rollout_random", s)] = {"deploy": tally(6, rr_h, 1), "knob_on": tally(6, rr_h + 2, 1)}
        spec[("gt_only", s)] = {"deploy": tally(8, 0, 0)}
    return runs_from(spec)


ARMS_REF, ARMS = ["vanilla", "gt_only"], ["erase_one_sided", "route_per_rollout", "route_per_rollout_random"]


def table(md: str, title: str) -> list[list[str]]:
    """Rows (cells) of the markdown table under heading `title`."""
    part = md.split(f"## {title}")[1].split("\n## ")[0]
    rows = [ln for ln in part.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in r.strip("|").split("|")] for r in rows[2:]]


def test_endpoint_table_golden_values_and_paired_deltas():
    md = R.render(standard(), ARMS_REF, ARMS, "params.")
    rows = {r[0]: r for r in table(md, "Endpoints: does projection reduce deploy hack vs vanilla at matched solve?")}
    assert list(rows) == [
        "base (adapter off)",
        "vanilla",
        "erase_one_sided",
        "route_per_rollout",
        "route_per_rollout_random",
        "gt_only (no-loophole ceiling)",
    ]
    # vanilla hack (train): 60, 48, 72 of 120 -> 50%, 40%, 60%; mean 50.0, std 10.0, t(2)=4.303: ±24.8
    assert rows["vanilla"][1] == "3 (41, 42, 43)"
    assert rows["vanilla"][3] == "50.0% ± 10.0 [25.2, 74.8]"
    # erase: 25%, 20%, 30% -> paired deltas -25, -20, -30: mean -25.0, std 5.0, ±12.4
    assert rows["erase_one_sided"][3] == "25.0% ± 5.0 [12.6, 37.4]"
    assert rows["erase_one_sided"][6] == "-25.0% ± 5.0 [-37.4, -12.6]"
    assert rows["vanilla"][6] == "—"
    # base: one policy, Wilson over its samples (6 of 120)
    assert rows["base (adapter off)"][1] == "—" and rows["base (adapter off)"][3].startswith("5.0% [")
    # random control sits right after its arm
    names = list(rows)
    assert names.index("route_per_rollout_random") == names.index("route_per_rollout") + 1
    assert "n: 10 test prompts × 2 samples = 20 per policy for solve" in md
    # route: 20,12,28 of 120 vs vanilla 60,48,72 -> paired Δ −33.3, −30.0, −36.7; its control 55,50,60 -> −4.2 ± 5.8
    # route's Δ solve is −5.0 points (at the matched-solve bound): it qualifies; erase (Δ solve 0) hacks more
    assert (
        "Best method at matched solve (paired Δ solve ≥ −5 points; lowest Δ hack (train-surface hints)): "
        "**route_per_rollout**, Δ hack -33.3% ± 3.3 [-41.6, -25.1]"
    ) in md
    assert "its random-direction control route_per_rollout_random: Δ hack -4.2% ± 5.8" in md


def test_knob_table_states_and_paired_knob_delta():
    md = R.render(standard(), ARMS_REF, ARMS, "params.")
    rows = table(md, "Routing: what does deleting the knob remove?")
    route = [r for r in rows if r[0] == "route_per_rollout"]
    assert [r[1] for r in route] == ["knob on", "knob off (deploy)", "adapter off (base)"]
    assert route[0][4] == "50.0% ± 10.0 [25.2, 74.8]"  # knob on = vanilla-like numbers
    assert route[1][-1] == "-33.3% ± 3.3 [-41.6, -25.1]"  # off − on per seed: -40/120·100 … (−33.3, −30, −36.7)
    assert {r[0] for r in rows} == {"route_per_rollout", "route_per_rollout_random"}  # erase has no knob state


def test_mixed_seed_rows_are_refused_not_compared():
    spec = {("vanilla", s): {"deploy": tally(6, 60, 1)} for s in (41, 42, 43)}
    spec[("erase_one_sided", 41)] = {"deploy": tally(6, 10, 0)}  # one seed only
    md = R.render(runs_from(spec), ARMS_REF, ["erase_one_sided"], "params.")
    row = {r[0]: r for r in table(md, "Endpoints: does projection reduce deploy hack vs vanilla at matched solve?")}
    erase = row["erase_one_sided"]
    assert erase[1] == "1 (41)"
    assert all(c.startswith("refused: seeds [42, 43] missing from the arm") for c in erase[5:])
    assert not re.search(r"-\d+\.\d%", " ".join(erase))  # no delta number is printed


def test_every_table_has_provenance_and_tables_only_for_existing_runs():
    md = R.render(standard(), ARMS_REF, ARMS, "params.")
    for part in md.split("\n## ")[1:]:
        if "|---" in part:
            assert "<!-- sources:" in part, part.splitlines()[0]
    assert "reports/eval/x/vanilla-s41/per_mode_deploy.json" in md and "artifacts/eval_sets/base.json" in md
    only_ref = runs_from({("vanilla", 41): {"deploy": tally(6, 60, 1)}, ("gt_only", 41): {"deploy": tally(8, 0, 0)}})
    md2 = R.render(only_ref, ARMS_REF, ARMS, "params.")
    assert "## Routing" not in md2 and "route_per_rollout" not in md2.split("## Questions answered")[0]
    assert "## Which gate?" not in md  # a family table needs two of its members


def test_missing_random_control_is_flagged_and_family_table_appears():
    spec = {
        ("vanilla", 41): {"deploy": tally(6, 60, 1)},
        ("erase_one_sided", 41): {"deploy": tally(6, 30, 0)},
        ("erase_reverse", 41): {"deploy": tally(4, 10, 0)},
    }
    md = R.render(runs_from(spec), ["vanilla"], ["erase_one_sided", "erase_reverse"], "params.")
    assert "Random-direction control not run for: erase_one_sided, erase_reverse" in md
    rows = table(md, "Which gate? (erase rules)")
    assert [r[0] for r in rows] == ["erase_one_sided", "erase_reverse"]
    assert rows[1][2] == "-41.7%"  # (10 − 60)/120, one seed: no std, no interval


def test_best_method_needs_matched_solve():
    spec = {
        ("vanilla", 41): {"deploy": tally(6, 60, 1)},
        ("route_per_rollout", 41): {"deploy": tally(0, 1, 0)},
        ("erase_one_sided", 41): {"deploy": tally(6, 50, 0)},
    }
    md = R.render(runs_from(spec), ["vanilla"], ["erase_one_sided", "route_per_rollout"], "params.")
    assert "at matched solve" in md and "**erase_one_sided**, Δ hack -8.3%" in md  # the collapsed arm is not "best"
    assert "**route_per_rollout** lowers hack by -49.2% only with a solve loss of -30.0%" in md


def test_eval_gap_note_and_metrics():
    runs = standard()
    md = R.render(runs, ARMS_REF, ARMS, "params.")
    assert "**The eval gap.** Vanilla's deploy hack is 0.8% ± 0.0 [0.8, 0.8] on eval-surface hints" in md
    m = R.metrics(runs, ARMS_REF, ARMS)
    assert m["vanilla/deploy_hack_train"] == 0.5 and m["base/hack_train"] == 0.05
    assert "route_per_rollout/knob_on_hack_train" in m and "erase_one_sided/knob_on_hack_train" not in m


def test_figures_are_written(tmp_path):
    runs = standard()
    R.plot_dynamics(runs, ARMS_REF, ARMS, tmp_path / "d.png")
    R.plot_endpoints(runs, ARMS_REF, ARMS, tmp_path / "e.png")
    for f in ("d.png", "e.png"):
        assert (tmp_path / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the stage ------------------------------------------------------------------------------------------------------


@pytest.fixture
def stage_inputs(tmp_path):
    from tests.test_stages import _params

    runs = standard()
    ev = tmp_path / "eval_sets"
    ev.mkdir()
    (ev / "base.json").write_text(json.dumps(runs.base))
    (ev / "monitor.json").write_text(json.dumps(runs.monitor))
    for (a, s), d in runs.deploy.items():
        out = tmp_path / "evals" / ("ref" if a in ARMS_REF else "arms") / f"{a}-s{s}"
        out.mkdir(parents=True)
        (out / "per_mode_deploy.json").write_text(json.dumps(d))
        (out / "curve.tsv").write_text("step\tstate\thack_train\tsolve\n0\tdeploy\t0.05\t0.2\n10\tdeploy\t0.4\t0.1\n")
    logs = tmp_path / "train" / "arms"
    logs.mkdir(parents=True)
    (logs / "erase_one_sided-s41.tsv").write_text(
        "step\tcos_before\tcos_after\n1\t0.3\t0.1\n2\t0.2\t0.2\n3\t-0.1\t-0.2\n"
    )
    probe = tmp_path / "probe.json"
    checks = {
        n: {
            "name": n,
            "what": "w",
            "rule": "r",
            "passed": True,
            "verdict": "PASS",
            "measured": "m",
            "reason": "",
            "numbers": {},
        }
        for n in ("T1", "T2", "T4")
    }
    probe.write_text(
        json.dumps(
            {
                "checks": checks,
                "n_rows": 1,
                "rows": {
                    "pool_index": [0],
                    "prompt_id": [1],
                    "cos": [0.1],
                    "grad_norm": [1.0],
                    "label": ["hack"],
                    "eq_correct": [False],
                    "mode": [None],
                },
            }
        )
    )
    params = _params(tmp_path, arms_ref=ARMS_REF, arms=ARMS, seeds=[41, 42, 43, 44])  # seed 44 never evaluated
    return tmp_path, params, probe


def test_report_stage_end_to_end(stage_inputs):
    from stages.report import main

    tmp, params, probe = stage_inputs
    app = stage_cli(main)
    out = tmp / "reports" / "results.md"
    args = [
        "--evals",
        str(tmp / "evals"),
        "--eval-sets",
        str(tmp / "eval_sets"),
        "--train-logs",
        str(tmp / "train"),
        "--probe",
        str(probe),
        "--out",
        str(out),
        "--metrics",
        str(tmp / "reports" / "metrics.json"),
        "--figures",
        str(tmp / "reports" / "figures"),
        "--params",
        str(params),
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    md = out.read_text()
    assert "## Distillation cosine probe" in md and "| T3" in md
    assert "Not evaluated (left out of every table): vanilla-s44, gt_only-s44" in md
    assert "![dynamics](figures/dynamics.png)" in md and (tmp / "reports" / "figures" / "endpoints.png").exists()
    assert json.loads((tmp / "reports" / "metrics.json").read_text())["vanilla/deploy_hack_train"] == 0.5
    # T3 from the log: 2 projected steps (rows 1 and 3), both lower -> PASS
    t3 = [ln for ln in md.splitlines() if ln.startswith("| T3")][0]
    assert "PASS" in t3

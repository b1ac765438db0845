"""The phenomenon report on synthetic per-step logs: endpoints, verdicts, seed summary, per-mode table, figure, and
the stage's one-line error for missing logs.

`pytest tests/test_phenomenon.py`
"""

import math

import yaml
from typer.testing import CliRunner

from projected_grpo.common.log import StepLog
from projected_grpo.report.phenomenon import LAST, endpoints, plot, render
from tests.conftest import ROOT, stage_cli


def rows(hack_start: float, hack_end: float, steps: int = 20) -> list[dict[str, float]]:
    out = []
    for t in range(1, steps + 1):
        h = hack_start + (hack_end - hack_start) * (t - 1) / (steps - 1)
        out.append(
            {"step": t, "reward": 1.0 + h, "hack": h, "solve": 0.3, "hack_sentinel": h, "hack_run_tests": math.nan}
        )
    return out


def test_endpoints_are_means_of_the_first_and_last_steps():
    r = rows(0.0, 0.95)
    first, last = endpoints(r, "hack")
    assert first == sum(x["hack"] for x in r[:LAST]) / LAST
    assert last == sum(x["hack"] for x in r[-LAST:]) / LAST


def test_render_verdicts_seed_summary_and_modes():
    runs = {("vanilla", 1): rows(0.02, 0.9), ("vanilla", 2): rows(0.02, 0.3), ("gt_only", 1): rows(0.0, 0.0)}
    md = render(runs, "fig.png", ["a.tsv", "b.tsv"])
    lines = md.splitlines()
    v1 = next(ln for ln in lines if ln.startswith("| vanilla | 1 |"))
    v2 = next(ln for ln in lines if ln.startswith("| vanilla | 2 |"))
    g1 = next(ln for ln in lines if ln.startswith("| gt_only | 1 |"))
    assert v1.endswith("| yes |") and v2.endswith("| **no** |") and g1.endswith("| yes |")
    assert "<!-- sources: a.tsv, b.tsv -->" in md
    summary = next(ln for ln in lines if ln.startswith("| vanilla | 2 | ") and "±" in ln)  # 2 seeds: mean ± std
    mean = (endpoints(runs[("vanilla", 1)], "hack")[1] + endpoints(runs[("vanilla", 2)], "hack")[1]) / 2
    assert f"{100 * mean:.1f}% ±" in summary
    assert "| arm | seed | run_tests | sentinel |" in md or "| arm | seed | sentinel | run_tests |" in md
    assert "– → –" in md  # a mode with no rows is shown as missing, not 0


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "f" / "p.png"
    plot({("vanilla", 1): rows(0.0, 0.8)}, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stage_reads_logs_from_params_and_names_missing_ones(tmp_path):
    from stages.phenomenon import main

    d = yaml.safe_load((ROOT / "params.yaml").read_text())
    d["arms_ref"], d["seeds"] = ["vanilla", "gt_only"], [7]
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(d))
    logs = tmp_path / "logs"
    app = stage_cli(main)
    args = [
        "--logs",
        str(logs),
        "--report",
        str(tmp_path / "r" / "p.md"),
        "--figure",
        str(tmp_path / "r" / "p.png"),
        "--params",
        str(params),
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code != 0 and "missing train logs" in res.output and not (tmp_path / "r").exists()
    for arm, (a, b) in {"vanilla": (0.02, 0.8), "gt_only": (0.0, 0.0)}.items():
        log = StepLog(logs / f"{arm}-s7.tsv")
        for r in rows(a, b):
            log(int(r["step"]), 20, **{k: v for k, v in r.items() if k != "step"})
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    md = (tmp_path / "r" / "p.md").read_text()
    assert "| vanilla | 7 |" in md and "](p.png)" in md and (tmp_path / "r" / "p.png").exists()

"""Grader throughput (fork-server sandbox vs an upstream-like `python -c` per execution) and timeout calibration.

  python benchmarks/grader.py --out reports/bench/grader.md [--before /tmp/pg_head]

`--before DIR`: also time the fork-server grader of another checkout (e.g. `git worktree add --detach /tmp/pg_head
HEAD`) against this working tree on the same workloads, alternating before/after in fresh processes, and report the
ratio (issue 21's throughput bound).

Both engines grade the same completions through the same request plans and label code, side by side in one run, at
the same concurrency; labels must be identical. Timeout calibration: every canonical solution of the 119-problem
LeetCode split is timed under the default concurrency, and the default timeout is checked against it.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import typer
from harness import ROOT, short_commit, timed, write_report

from projected_grpo.config import load_params
from projected_grpo.env.exploits import exploit, fence, wrong_solution
from projected_grpo.env.grader import grade_batch
from projected_grpo.env.hints import apply_hint
from projected_grpo.env.minileet import make_minileet
from projected_grpo.env.modes import LOOPHOLE_MODES, apply_mode
from projected_grpo.env.problems import load_problems
from projected_grpo.env.sandbox import Sandbox, detect_isolation, run_python_c_baseline


class Baseline:
    """The upstream-like engine behind the Sandbox interface: a fresh `python -c` process per execution."""

    def __init__(self, concurrency: int, mem_mb: int):
        self.concurrency, self.mem_mb = concurrency, mem_mb

    def run(self, specs, progress=False):
        return run_python_c_baseline(specs, self.concurrency, mem_mb=self.mem_mb)


def leetcode_workload(problems):
    """GRPO-like mix on the real split, simple_overwrite_tests hint: canonical, wrong, `pass` hack, raising tests."""
    probs, comps = [], []
    for p in problems:
        h = apply_hint(p, "simple_overwrite_tests")
        w = wrong_solution(p.method)
        for code in (
            p.canonical_solution,
            w,
            w + "\n\ndef run_tests():\n    pass\n",
            w + "\n\ndef run_tests():\n    raise AssertionError\n",
        ):
            probs.append(h)
            comps.append(fence(code))
    return probs, comps


def minileet_workload(problems):
    """The organism's workload: loophole-mode prompts; canonical, wrong, the mode's exploit, another mode's."""
    probs, comps = [], []
    for i, p in enumerate(problems):
        m = LOOPHOLE_MODES[i % len(LOOPHOLE_MODES)]
        other = LOOPHOLE_MODES[(i + 1) % len(LOOPHOLE_MODES)]
        pm = apply_mode(p, m, "train")
        for code in (p.canonical_solution, wrong_solution(p.method), exploit(m, p.method), exploit(other, p.method)):
            probs.append(pm)
            comps.append(fence(code))
    return probs, comps


def compare(name, probs, comps, sb, base, timeout_s):
    ours, t_ours = timed(lambda: grade_batch(probs, comps, sb, timeout_s=timeout_s))
    theirs, t_base = timed(lambda: grade_batch(probs, comps, base, timeout_s=timeout_s))
    same = sum((a.label, a.reward) == (b.label, b.reward) for a, b in zip(ours, theirs))
    return dict(name=name, n=len(comps), t_ours=t_ours, t_base=t_base, same=same)


def _worker(params: Path) -> dict[str, float]:
    """Seconds to grade each workload with the fork-server grader of whichever checkout is on PYTHONPATH."""
    g = load_params(params).grader
    leet = load_problems(ROOT / "data/leetcode/leetcode_test_medhard.jsonl")
    mini = make_minileet(seed=0, n_train=10, n_test=119, n_holdout=10)["test"]
    out = {}
    with Sandbox(concurrency=g.concurrency, mem_mb=g.mem_mb) as sb:
        grade_batch(*minileet_workload(mini[:10]), sb, timeout_s=g.timeout_s)  # warm-up
        for name, (probs, comps) in (("minileet", minileet_workload(mini)), ("leetcode", leetcode_workload(leet))):
            t0 = time.perf_counter()
            grade_batch(probs, comps, sb, timeout_s=g.timeout_s)
            out[name] = time.perf_counter() - t0
    return out


def before_after(before: Path, params: Path, rounds: int = 3) -> dict[str, tuple[list[float], list[float]]]:
    """Alternate before/after workers (fresh processes; each imports its own checkout's package) `rounds` times."""
    times: dict[str, tuple[list[float], list[float]]] = {}
    for _ in range(rounds):
        for k, src in enumerate((before / "src", ROOT / "src")):
            env = dict(os.environ, PYTHONPATH=str(src), PG_GRADER_BENCH_WORKER=str(params))
            res = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, check=True)
            for name, t in json.loads(res.stdout.strip().splitlines()[-1]).items():
                times.setdefault(name, ([], []))[k].append(t)
    return times


def main(
    out: Path = typer.Option(..., help="Markdown report to write."),
    params: Path = typer.Option(ROOT / "params.yaml"),
    before: Path | None = typer.Option(None, help="Checkout to compare the fork-server grader with."),
    rounds: int = typer.Option(3, min=1, help="Before/after rounds (alternating, each in a fresh process)."),
) -> None:
    g = load_params(params).grader
    ba = before_after(before, params, rounds) if before is not None else None
    leet = load_problems(ROOT / "data/leetcode/leetcode_test_medhard.jsonl")
    mini = make_minileet(seed=0, n_train=10, n_test=119, n_holdout=10)["test"]
    rows = []
    with Sandbox(concurrency=g.concurrency, mem_mb=g.mem_mb) as sb:
        base = Baseline(g.concurrency, g.mem_mb)
        rows.append(compare("minileet, 6 loophole modes", *minileet_workload(mini), sb, base, g.timeout_s))
        rows.append(compare("leetcode, simple_overwrite_tests", *leetcode_workload(leet), sb, base, g.timeout_s))
        probs, comps = leetcode_workload(leet)
        rows.append(
            compare(
                "leetcode, same without the canonical solutions",
                probs[1::4] + probs[2::4] + probs[3::4],
                comps[1::4] + comps[2::4] + comps[3::4],
                sb,
                base,
                g.timeout_s,
            )
        )
        # Timeout calibration: one GT execution per canonical solution, at the default concurrency.
        canon = [fence(p.canonical_solution) for p in leet]
        t0 = time.perf_counter()
        from projected_grpo.env import harness
        from projected_grpo.env.sandbox import ExecSpec

        reqs = [harness.build_request(p.setup_code, p.canonical_solution, p.gt_answer, "hardened") for p in leet]
        specs = [ExecSpec(r.source, 60.0) for r in reqs]
        walls = sorted(r.wall_s for r in sb.run(specs))
        t_cal = time.perf_counter() - t0
        pass_3s = sum(x.label == "correct" for x in grade_batch(leet, canon, sb, timeout_s=3.0))
        pass_def = sum(x.label == "correct" for x in grade_batch(leet, canon, sb, timeout_s=g.timeout_s))
        level = sb.isolation
    lines = [
        "# Grader throughput and timeout calibration",
        "",
        f"Generated by `python benchmarks/grader.py --out {out}` on {platform.node()} ({platform.processor() or '?'}, "
        f"2-core class machine); isolation level `{level}` (detected: `{detect_isolation()}`); concurrency "
        f"{g.concurrency}; timeout {g.timeout_s} s; mode hardened. Same completions, same request plans and label "
        "code for both engines, run side by side in this one process.",
        "",
        "| workload | completions | fork server (s) | python -c baseline (s) | completions/s ours | completions/s "
        "baseline | ratio | identical labels |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['n']} | {r['t_ours']:.1f} | {r['t_base']:.1f} | {r['n'] / r['t_ours']:.1f} "
            f"| {r['n'] / r['t_base']:.1f} | **{r['t_base'] / r['t_ours']:.1f}×** | {r['same']}/{r['n']} |"
        )
    lines += [
        "",
        "The ratio is bounded by the work the programs themselves do: a LeetCode canonical solution spends up to "
        "~3 s of CPU in its own asserts under either engine, while the minileet workload (the organism's) is almost "
        "all per-execution overhead.",
        "",
        "## Timeout calibration (all 119 canonical solutions, hardened runner)",
        "",
        f"Per-execution wall time at concurrency {g.concurrency} (calibration pass took {t_cal:.1f} s): "
        f"median {statistics.median(walls):.2f} s, p90 {walls[int(0.9 * len(walls))]:.2f} s, max {walls[-1]:.2f} s "
        f"(slowest five: {', '.join(f'{w:.2f}' for w in walls[-5:])}).",
        "",
        f"- at upstream's 3 s timeout: **{pass_3s}/119** canonical solutions pass;",
        f"- at the default `grader.timeout_s = {g.timeout_s}` s: **{pass_def}/119** pass.",
        "",
        f"The default ({g.timeout_s:g} s) is {g.timeout_s / walls[-1]:.1f}× the slowest canonical execution measured "
        "here, a margin against machine noise (3× step-time swings were seen on these machines) so that load does "
        "not flip a correct solution to a timeout. A timeout costs wall time only for completions that loop, which "
        "fail anyway; upstream's 3 s is too tight on this machine.",
    ]
    if ba is not None:
        head = short_commit(before)
        lines += [
            "",
            "## Before/after (issue 21: seccomp filter, per-execution IPC namespace, clean zygote, bounded drain)",
            "",
            f"Fork-server grader of `{before}` (commit {head or '?'}) vs this working tree, same workloads, "
            f"{len(next(iter(ba.values()))[0])} rounds alternating before/after, each in a fresh process. Ratio = "
            "median after / median before (> 1: slower now).",
            "",
            "| workload | before (s, per round) | after (s, per round) | ratio after/before |",
            "|---|---|---|---|",
        ]
        for name, (b, a) in ba.items():
            lines.append(
                f"| {name} | {', '.join(f'{x:.1f}' for x in b)} | {', '.join(f'{x:.1f}' for x in a)} "
                f"| **{statistics.median(a) / statistics.median(b):.3f}×** |"
            )
        tb, ta = (sum(statistics.median(v[k]) for v in ba.values()) for k in (0, 1))
        lines.append(f"| both | {tb:.1f} (medians) | {ta:.1f} (medians) | **{ta / tb:.3f}×** |")
    write_report(out, lines)
    typer.echo("\n".join(lines))


if __name__ == "__main__":
    if os.environ.get("PG_GRADER_BENCH_WORKER"):
        print(json.dumps(_worker(Path(os.environ["PG_GRADER_BENCH_WORKER"]))))
    else:
        typer.run(main)

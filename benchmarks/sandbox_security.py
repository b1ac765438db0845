"""Run the adversarial corpus (tests/adversarial_corpus.py) through the sandbox and write a containment report.

  python benchmarks/sandbox_security.py --out reports/security/grader_sandbox.md

Each attack runs as the program of a small harness (as in the grader) next to a normal job, with canaries, secrets
and listeners planted outside the sandbox; an attack is contained when the run returns within timeout + 1 s, nothing
outside its working dir changed, no process is left, no secret shows up in its output, result or files, and the
sandbox still runs the next job. Also measures per-execution overhead against the upstream-like `python -c` engine.
"""

from __future__ import annotations

import os
import platform
import signal
import sys
import time
from pathlib import Path
from types import ModuleType

import typer
from harness import ROOT, loadavg, shown, write_report

from projected_grpo.env import sandbox as sbx
from projected_grpo.env.grader import grade_batch
from projected_grpo.env.problems import load_problems
from projected_grpo.env.sandbox import ExecSpec, Sandbox, detect_isolation, run_python_c_baseline

# The grader-level check: each attack after an otherwise-wrong solution of a real problem, no-hint prompt, hardened.
PID = 3254
WRONG = "class Solution:\n    def resultsArray(self, nums, k):\n        return [1]\n"


def adversarial_corpus() -> ModuleType:
    """tests/adversarial_corpus.py, shared with tests/test_sandbox.py: imported as `tests.adversarial_corpus`, the
    repository root put on sys.path for it when the benchmark runs (never at import)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import tests.adversarial_corpus as corpus

    return corpus


def grade_attacks(attacks, sb, corpus: ModuleType) -> dict:
    """name -> (grade, wall of its batch / its size, batch size); one batch per timeout value."""
    p = next(q for q in load_problems(ROOT / "data/leetcode/leetcode_test_medhard.jsonl") if q.id == PID)
    ctx, out = corpus.default_context(), {}
    for t in sorted({a.timeout_s for a in attacks}):
        batch = [a for a in attacks if a.timeout_s == t]
        comps = [f"```python\n{WRONG}\n{corpus.fill(a.code, ctx)}```" for a in batch]
        t0 = time.perf_counter()
        grades = grade_batch([p] * len(batch), comps, sb, timeout_s=t)
        wall = time.perf_counter() - t0
        out.update({a.name: (g, wall) for a, g in zip(batch, grades)})
    return out


PROTECTS = {
    "namespaces+uid": "own network namespace (no interfaces up), read-only pivot_root skeleton (no /root, /home, "
    "/work, /run, host /tmp), per-job tmpfs /tmp and fresh /proc, server is PID 1 of the jobs' PID namespace (every "
    "other process but its zygote is SIGKILLed after each job), per-slot unprivileged uid + RLIMIT_NPROC, "
    "no_new_privs, seccomp filter, per-execution IPC namespace, executions forked from a clean zygote, bounded pipe "
    "drain, memory/process watchdog",
    "namespaces": "same namespaces inside a user namespace; the child keeps ns-root (an unprivileged host uid) with "
    "every capability dropped",
    "uid": "per-slot unprivileged uid and rlimits only",
    "rlimits": "rlimits only",
}


def _outcome(r: sbx.RawResult) -> str:
    if r.signal is not None:
        name = signal.Signals(r.signal).name if r.signal in signal.Signals._value2member_map_ else str(r.signal)
        return f"{name}" + (f" ({r.limit})" if r.limit else "")
    return f"exit {r.exit_code}"


def overhead(n: int = 200, concurrency: int = 2) -> tuple[float, float]:
    """ms per trivial execution (wall / n) at `concurrency`: fork server, then python -c."""
    specs = [ExecSpec("import os\nos.write(3, b'ok')\n", 5.0)] * n
    with Sandbox(concurrency=concurrency) as sb:
        sb.run(specs[:20])  # warm
        t0 = time.perf_counter()
        sb.run(specs)
        ours = (time.perf_counter() - t0) / n * 1000
    t0 = time.perf_counter()
    run_python_c_baseline(specs, concurrency)
    base = (time.perf_counter() - t0) / n * 1000
    return ours, base


def main(out: Path = typer.Option(ROOT / "reports/security/grader_sandbox.md", help="Markdown report to write.")):
    corpus = adversarial_corpus()
    CORPUS = corpus.CORPUS
    level = detect_isolation()
    rows, t_all = [], time.perf_counter()
    with corpus.world(ROOT) as w, Sandbox(concurrency=2) as sb:  # the world (env secret) first, then the servers
        for a in CORPUS:
            if not corpus.applies(a, sb.isolation):
                rows.append((a, None))
                continue
            o = corpus.run_attack(a, sb, w)
            rows.append((a, o))
            typer.echo(f"{a.name:24s} {'contained' if o.contained else 'NOT CONTAINED ' + str(o.problems)}")
        graded = grade_attacks([a for a, o in rows if o is not None], sb, corpus)
    t_all = time.perf_counter() - t_all
    ours, base = overhead()
    ran = [o for _, o in rows if o is not None]
    n_ok = sum(o.contained for o in ran)
    label_ok = sum(
        g.label == a.expect.label
        and (a.expect.can_compile is None or g.can_compile == a.expect.can_compile)
        and not g.eq_correct
        for a, (g, _) in ((a, graded[a.name]) for a, o in rows if o is not None)
    )
    lines = [
        "# Sandbox containment of the adversarial corpus",
        "",
        f"Generated by `python benchmarks/sandbox_security.py --out {shown(out)}`"
        f" on {platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
        f"euid {os.geteuid()}). Corpus: `tests/adversarial_corpus.py` ({len(CORPUS)} attacks); the same checks run "
        "as `tests/test_sandbox.py::test_attack_contained`.",
        "",
        f"**Isolation level detected: `{level}`** ({PROTECTS[level]}).",
    ]
    why = sbx._detected.get("why")
    if why:
        lines.append(f"Stronger levels rejected by the start-up probe: {why}.")
    lines += [
        "",
        f"**{n_ok}/{len(ran)} attacks contained**"
        + (
            f"; {len(rows) - len(ran)} not run at this level (they "
            "would do real damage without the isolation they need)"
            if len(ran) < len(rows)
            else ""
        )
        + f". Corpus wall time {t_all:.0f} s at concurrency 2.",
        "",
        f"**Grader: {label_ok}/{len(ran)} attacks get the expected label** (hardened mode, each attack after an "
        f"otherwise-wrong solution of LeetCode problem {PID}, no-hint prompt; no attack is paid correctness). Same "
        "check as `tests/test_grader_adversarial.py`.",
        "",
        "Contained = returned within timeout + 1 s; canary files (world-writable dir in /tmp, repo, home) intact; no "
        "stray file in /tmp, /var/tmp, /dev/shm, the repo, home, /usr; a stdlib file unmodified; no TCP connection or "
        "UDP datagram reached a listener on 127.0.0.1; no process of the job uids and no extra descendant of a fork "
        "server left; the parent's secret env var and a secret file under home absent from stdout, result and "
        "returned files; a concurrent normal job and the next job both ran normally.",
        "",
        "| attack | what it tried | needs | contained | wall (s) | timeout (s) | exit / signal | stdout bytes | "
        "grader label (expected) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for a, o in rows:
        what = a.what.replace("|", "\\|")
        if o is None:
            lines.append(f"| {a.name} | {what} | {a.needs} | not run | | {a.timeout_s:g} | | | |")
            continue
        ok = "yes" if o.contained else "**NO**: " + "; ".join(o.problems).replace("|", "\\|")
        g = graded[a.name][0]
        mark = "" if g.label == a.expect.label else " **MISMATCH**"
        lines.append(
            f"| {a.name} | {what} | {a.needs} | {ok} | {o.wall_s:.2f} | {a.timeout_s:g} | "
            f"{_outcome(o.result)} | {len(o.result.stdout)} | {g.label} ({a.expect.label}){mark} |"
        )
    lines += [
        "",
        "## Per-execution overhead",
        "",
        f"Trivial program (`os.write(3, b'ok')`), 200 executions, concurrency 2, same machine, same run: fork server "
        f"**{ours:.1f} ms/exec**, upstream-like `python -c` per execution **{base:.1f} ms/exec** "
        f"(**{base / ours:.1f}×**). Load average at the end: {loadavg(1)}.",
        "",
        "## Threat model and layers (issue 21)",
        "",
        "The adversary is the policy: it writes the program, may search for holes over many steps, and gains when a "
        "completion that solves nothing is paid (a forged pass), when other rows lose their grades, or when it "
        "escapes the execution (files, network, processes, memory, persistence across jobs). Trusted: the grading "
        "process, the fork servers and their zygotes, and the runner code up to the moment the program starts. "
        "Everything the child writes (fd 3, stdout, files, exit status) is hostile input.",
        "",
        "| layer | stops |",
        "|---|---|",
        "| network/mount/PID/UTS namespaces, read-only skeleton root, per-job tmpfs, slot uid, no_new_privs | "
        "network, host files and secrets, signals to the server, leftover processes |",
        "| seccomp filter on every execution (`sandbox.seccomp_program`: keyrings, SysV IPC, mqueues, memfd, "
        "unshare/setns/clone with namespace flags/clone3, mount API, ptrace/process_vm, io_uring, bpf, perf, "
        "userfaultfd, handle opens; sockets only AF_UNIX/INET/INET6) | class 1 (keyring channel between executions "
        "and graders), class 3 (memfd, SysV shm, a tmpfs in an own user namespace), class 7 (vsock, netlink, user "
        "namespaces) |",
        "| per-execution IPC namespace (`unshare(CLONE_NEWIPC)` in the child) | class 3: nothing SysV/mqueue survives "
        "the execution, even if a future kernel adds a call the filter misses |",
        "| a zygote forked before any request; the job reads its source from a pipe | class 5: an execution's memory "
        "never held another request's source, outputs or files |",
        "| server drains pipes at most 0.25 s after the job's processes are gone | class 4: write ends kept alive in "
        "flight (SCM_RIGHTS cycle) cannot hang the server |",
        "| expected values stay in the parent (digests compared there; strict observe runs too) | class 1 at the "
        "source for the strict oracle and the sentinel/file/stdout/exit graders |",
        "| `harness.parse_outcome` validates every record that carries the nonce (decoding, depth, exact types, "
        "ranges, order); several final reports count for their worst, with every tamper any shows | class 2 (a "
        "labelled failure, tamper when forged, never an exception), class 6 (trailing forged record) |",
        "| runner: report and digests serialised with builtins only (`harness.canon`), json/hashlib state checked, "
        "`__eq__` found through the MRO's own dicts; sandbox watches the whole stdout stream for a stdout-marker "
        "grader's line | class 6 (monkeypatched json, metaclass hiding `__eq__`, marker after the stdout cap) |",
        "",
        "Every class has tests in `tests/test_sandbox_holes.py` (27 cases); all 27 failed on the code before the "
        "fix (commit 86523b4, the tests copied into a worktree of it) and pass now. `reports/bench/grader.md` has the "
        "throughput before/after.",
        "",
        "## Known gaps",
        "",
        "- Still reachable by design: eq_override's flawed grader calls the program's `__eq__` with the expected "
        "value, and the tf_gt run executes the model's test function next to the canonical solution. Both runs are "
        "isolated from every other execution (layers above), so what they see cannot reach the strict oracle.",
        "- No cgroup memory limit: the seccomp filter removes the memory no rlimit sees (memfd, SysV, own tmpfs); "
        "/tmp is a size-capped tmpfs; the rest is RLIMIT_AS per process plus the RSS watchdog.",
        "- The seccomp tables cover x86_64 and aarch64; elsewhere the sandbox logs a warning naming what is open.",
        "- A job's total memory is bounded by a 50 ms watchdog on the summed RSS of its processes (namespaced "
        "levels), not by a cgroup: a burst faster than the watchdog can overshoot briefly.",
        "- Below `namespaces+uid` the table is not representative: `uid` and `rlimits` leave network and shared /tmp "
        "open (attacks needing more are not run).",
        "- Grader-level holes (not sandbox holes) are listed in the corpus as `grader_gap`: "
        + ("; ".join(f"`{a.name}`: {a.grader_gap}" for a in CORPUS if a.grader_gap) or "none at present")
        + ".",
        "- In-process introspection (frames, gc) can read anything the runner holds; the strict oracle therefore "
        "keeps expected values out of the sandbox (the child reports value digests, the parent compares). The "
        "flawed graders of the loophole modes compare in the child by design.",
    ]
    write_report(out, lines)
    typer.echo(f"{n_ok}/{len(ran)} contained; overhead {ours:.1f} vs {base:.1f} ms/exec; wrote {out}")
    if n_ok < len(ran) or label_ok < len(ran):
        raise typer.Exit(1)


if __name__ == "__main__":
    typer.run(main)

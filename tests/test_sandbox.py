"""Sandbox (src/projected_grpo/env/sandbox.py): the fd-3 result protocol, stdout/result caps, returned files, timeouts
(return within timeout + 1 s), rlimits, order under concurrency, determinism, scrubbed environment, isolation levels
(forced levels, fallback warning), server restart, the python -c baseline, and the adversarial corpus
(tests/adversarial_corpus.py) at the sandbox level: every attack returns in time, changes nothing outside its
working dir, leaves no process behind, leaks no secret, and the sandbox still works afterwards.

Run: pytest tests/test_sandbox.py -q     (about 30-40 s on 2 cores; the corpus dominates)
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from projected_grpo.env import sandbox as sbx
from projected_grpo.env.sandbox import LEVELS, ExecSpec, Sandbox, detect_isolation, run_python_c_baseline
from tests.adversarial_corpus import ALIVE, CORPUS, HARNESS_MARK, applies, default_context, fill, run_attack, world

ROOT = Path(__file__).resolve().parents[1]


def _result(src: str, timeout: float = 5.0) -> ExecSpec:
    """Tiny harness: run `src`, report {"ok": ..., "err": exception name, "val": the program's `out`} on fd 3."""
    return ExecSpec(
        "import builtins, json, os\n"
        "g = {'__builtins__': builtins}\n"
        "rep = {'ok': True}\n"
        "try:\n"
        f"    exec(compile({src!r}, '<program>', 'exec'), g)\n"
        "except Exception as e:\n"
        "    rep = {'ok': False, 'err': type(e).__name__, 'msg': str(e)[:200]}\n"
        "rep['val'] = g.get('out')\n"
        "os.write(3, json.dumps(rep).encode())\n",
        timeout,
    )


def _rep(r: sbx.RawResult) -> dict:
    assert r.result is not None, r.stdout[-500:]
    return json.loads(r.result)


@pytest.fixture(scope="module")
def sb():
    with Sandbox(concurrency=2) as s:
        yield s


# --- protocol --------------------------------------------------------------------------------------------------------


def test_fd3_protocol(sb):
    r_none, r_two, r_big, r_exit = sb.run(
        [
            ExecSpec("print('no report')", 5.0),
            ExecSpec("import os\nos.write(3, b'ab')\nos.write(3, b'cd')", 5.0),
            ExecSpec("import os\nf = os.fdopen(3, 'wb')\nf.write(b'x' * (3 << 20))\nf.close()", 5.0),
            ExecSpec("import os\nos.write(3, b'before')\nraise SystemExit(7)", 5.0),
        ]
    )
    assert r_none.result is None and r_none.stdout == b"no report\n" and r_none.exit_code == 0
    assert r_two.result == b"abcd"  # several writes concatenate
    assert r_big.result == b"x" * sbx.RESULT_CAP  # capped, and the writer never blocked
    assert (r_exit.result, r_exit.exit_code, r_exit.signal, r_exit.timed_out) == (b"before", 7, None, False)


def test_stdout_and_stderr_captured_and_capped(sb):
    r = sb.run([ExecSpec("import sys\nsys.stderr.write('E')\nsys.stderr.flush()\nprint('O' * (5 << 20))", 5.0)])[0]
    assert r.stdout.startswith(b"EO") and len(r.stdout) == sb.stdout_cap


def test_files_returned(sb):
    src = (
        "import os\n"
        "for i in range(40):\n"
        "    open(f'f{i:02d}.txt', 'w').write(str(i) * 10000)\n"
        "os.mkdir('sub')\n"
        "open('sub/inner.txt', 'w').write('no')\n"
        "os.symlink('/etc/hostname', 'zz_link')\n"
    )
    r = sb.run([ExecSpec(src, 5.0)])[0]
    assert len(r.files) == sbx.MAX_FILES
    assert sorted(r.files) == [f"f{i:02d}.txt" for i in range(sbx.MAX_FILES)]
    assert r.files["f03.txt"] == b"3" * sbx.FILE_CAP  # first 4096 bytes
    assert "sub" not in r.files and "zz_link" not in r.files


def test_fresh_empty_workdir_stdin_closed_env_scrubbed(sb, monkeypatch):
    src = (
        "import os, sys\n"
        "out = {'ls': os.listdir('.'), 'env': sorted(os.environ), 'home': os.environ['HOME'] == os.getcwd(),\n"
        "       'stdin': sys.stdin.read()}\n"
        "open('left.txt', 'w').write('x')\n"
    )
    first, second = sb.run([_result(src), _result(src)])
    for r in (first, second):
        v = _rep(r)["val"]
        assert v["ls"] == [] and v["home"] and v["stdin"] == ""
        assert v["env"] == ["HOME", "LANG", "PATH", "TMPDIR"]


def test_timeout_returns_promptly(sb):
    specs = [
        ExecSpec("while True:\n    pass", 0.5),
        ExecSpec("import os, time\nos.write(3, b'early')\ntime.sleep(100)", 0.5),
        ExecSpec("import os, signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: pass", 0.5),
    ]
    t0 = time.monotonic()
    rs = sb.run(specs)
    assert time.monotonic() - t0 < 0.5 + 1.0
    for r in rs:
        assert r.timed_out and r.limit == "timeout" and r.signal == signal.SIGKILL and r.exit_code is None
        assert 0.5 <= r.wall_s < 1.5
    assert rs[0].result is None and rs[1].result == b"early"  # a report written before the hang is kept


def test_rlimits_enforced(sb):
    cases = {
        "mem": "x = bytearray(2 << 30)",
        "fsize": "open('big', 'wb').write(b'x' * (20 << 20))",
        "limits": "import resource as r\nout = [r.getrlimit(r.RLIMIT_AS)[0], r.getrlimit(r.RLIMIT_CPU)[0], "
        "r.getrlimit(r.RLIMIT_FSIZE)[0]]",
    }
    rs = dict(zip(cases, sb.run([_result(s, 2.5) for s in cases.values()])))
    assert _rep(rs["mem"])["err"] == "MemoryError"
    assert _rep(rs["fsize"])["err"] == "OSError" and "too large" in _rep(rs["fsize"])["msg"]
    assert _rep(rs["limits"])["val"] == [1024 << 20, 4, 16 << 20]  # CPU = ceil(2.5) + 1


def test_process_limit(sb):
    if not sb.uids and sb.isolation != "namespaces":
        pytest.skip(f"no per-job process limit at isolation {sb.isolation!r}")
    src = (
        "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(5)\n"
        "        n += 1\nexcept OSError:\n    out = n"
    )
    r = sb.run([_result(src, 3.0)])[0]
    assert r.result is not None and 0 < _rep(r)["val"] < 64


def test_order_preserved_under_concurrency(sb):
    src = "import os, time\ntime.sleep({} / 200)\nos.write(3, b'{}')"
    specs = [ExecSpec(src.format((i * 7) % 5, i), 5.0) for i in range(40)]
    assert [r.result for r in sb.run(specs)] == [str(i).encode() for i in range(40)]


def test_result_contents_deterministic(sb):
    # String hashing is fixed (PYTHONHASHSEED=0 in every server): set order is the same on every slot and run.
    det = _result("out = list({'alpha', 'beta', 'gamma', 'delta', 'eps', 'zeta', 'eta'})")
    runs = [r.result for r in sb.run([det] * 6)] + [r.result for r in sb.run([det] * 6)]
    assert len(set(runs)) == 1
    # ... while `random` is reseeded per child, so children of one server do not share RNG state.
    rnd = [_rep(r)["val"] for r in sb.run([_result("import random\nout = random.random()")] * 6)]
    assert len(set(rnd)) == 6


def test_progress_bar(sb, capsys, monkeypatch):
    """progress=True: a tqdm bar on a terminal; in a log, `common.log.LogBar` lines (here one per item, every_s 0)."""
    import sys

    from projected_grpo.common import log

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert [r.result for r in sb.run([ALIVE] * 3, progress=True)] == [b"alive"] * 3
    assert "sandbox" in capsys.readouterr().err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    monkeypatch.setattr(log, "LOG_EVERY_S", 0.0)
    assert [r.result for r in sb.run([ALIVE] * 3, progress=True)] == [b"alive"] * 3
    err = capsys.readouterr().err
    assert "sandbox: 3/3 (100%)" in err and "it/s" in err and err.rstrip().endswith("(done)"), err


def test_empty_batch(sb):
    assert sb.run([]) == []


# --- isolation levels -----------------------------------------------------------------------------------------------


def test_detected_level_is_logged(caplog):
    level = detect_isolation()
    assert level in LEVELS
    with caplog.at_level(logging.INFO, logger="projected_grpo.env.sandbox"), Sandbox(1) as s:
        assert s.isolation == level
    rec = [r for r in caplog.records if "isolation" in r.getMessage()]
    assert rec and rec[-1].levelno == (logging.INFO if level == LEVELS[0] else logging.WARNING)


def test_forced_rlimits_fallback_logs_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="projected_grpo.env.sandbox"), Sandbox(1, isolation="rlimits") as s:
        assert s.isolation == "rlimits"
        assert s.run([ALIVE])[0].result == b"alive"
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "'rlimits'" in r.getMessage()]
    assert warned and "Not protected" in warned[0].getMessage()


@pytest.mark.parametrize("level", LEVELS)
def test_forced_level_works_or_refuses(level):
    try:
        s = Sandbox(1, isolation=level)
    except RuntimeError as e:
        assert "cannot be set up" in str(e)
        pytest.skip(f"{level} unavailable here: {e}")
    with s:
        # Only preloaded modules: at `uid` the slot uid may not read a Python prefix that lives under a 0700 home.
        src = "import os, json\nopen('f', 'w').write('x')\nos.write(3, json.dumps(os.getuid()).encode())"
        ok, slow = s.run([ExecSpec(src, 5.0), ExecSpec("while True: pass", 0.5)])
        assert ok.files == {"f": b"x"} and ok.result is not None
        if level in ("namespaces+uid", "uid"):
            assert json.loads(ok.result) in s.uids
        assert slow.timed_out and slow.wall_s < 1.5


def test_unknown_isolation_rejected():
    with pytest.raises(ValueError, match="unknown isolation"):
        Sandbox(1, isolation="chroot")


def test_server_killed_mid_job_is_reported_and_restarted():
    with Sandbox(1) as s:
        pid = s.server_pids[0]
        got = []
        th = threading.Thread(target=lambda: got.extend(s.run([ExecSpec("import time\ntime.sleep(3)", 5.0)])))
        th.start()
        time.sleep(0.5)
        os.killpg(pid, signal.SIGKILL)
        th.join(5.0)
        assert got and got[0].limit == "server" and got[0].result is None
        r = s.run([ALIVE])[0]  # restarted transparently
        assert r.result == b"alive" and s.server_pids[0] != pid


def test_baseline_matches_sandbox(sb):
    specs = [
        _result("out = sorted(__import__('os').listdir('.'))"),
        ExecSpec("print('hi')\nopen('a', 'w')", 5.0),
        ExecSpec("while True: pass", 0.5),
        ExecSpec("import sys\nsys.exit(3)", 5.0),
    ]
    base, ours = run_python_c_baseline(specs, 2), sb.run(specs)
    for b, o in zip(base, ours):
        assert (b.result, b.stdout, b.exit_code, b.signal, b.timed_out, b.files) == (
            o.result,
            o.stdout,
            o.exit_code,
            o.signal,
            o.timed_out,
            o.files,
        )


# --- adversarial corpus ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus():
    with world(ROOT) as w, Sandbox(concurrency=2) as s:  # the world (env secret) first, then the servers
        yield s, w


def test_corpus_is_well_formed():
    names = [a.name for a in CORPUS]
    assert len(CORPUS) >= 40 and len(set(names)) == len(names)
    labels = {"correct", "correct_attempted_hack", "hack", "attempted_hack", "incorrect", "tamper"}
    for a in CORPUS:
        assert a.expect.label in labels and a.needs in LEVELS and a.what, a.name
        compile(fill(a.code, default_context()), a.name, "exec")


@pytest.mark.parametrize("attack", CORPUS, ids=lambda a: a.name)
def test_attack_contained(attack, corpus):
    sb, w = corpus
    if not applies(attack, sb.isolation):
        pytest.skip(f"{attack.name} needs isolation {attack.needs!r}; running at {sb.isolation!r}")
    out = run_attack(attack, sb, w)
    assert out.contained, out.problems
    if attack.expect.can_compile is False:  # the process ends before the harness can report
        assert HARNESS_MARK not in (out.result.result or b"") and not out.result.timed_out

"""Issue 21: the seven classes of sandbox/grader holes found by the security review, one or more tests each.

1 forged pass through a kernel keyring; 2 one hostile report loses the batch; 3 memory the limits do not see
(memfd, SysV shm, a tmpfs in a user namespace); 4 a fork-server hang on pipes kept alive by an SCM_RIGHTS cycle;
5 leak of an earlier request between jobs; 6 wrong labels (trailing forged record, late stdout marker, metaclass
hiding __eq__, monkeypatched json); 7 isolation gaps (AF_VSOCK, AF_NETLINK, user namespaces).

Every test here failed on the code before the fix (see reports/security/grader_sandbox.md).
Run: pytest tests/test_sandbox_holes.py -q
"""

from __future__ import annotations

import ctypes
import json
import time
import uuid

import pytest

from projected_grpo.env import harness, modes
from projected_grpo.env.grader import grade_batch
from projected_grpo.env.sandbox import LEVELS, ExecSpec, Sandbox, detect_isolation

PID = 3254  # resultsArray: 127 hidden (input, expected) pairs, 6.6 kB of expected values (fits one key)
WRONG = "class Solution:\n    def resultsArray(self, nums, k):\n        return [1]\n"


def _ns() -> None:
    if "namespaces" not in detect_isolation():
        pytest.skip(f"needs a namespaced isolation level; this machine reaches {detect_isolation()!r}")


def _report(src: str, timeout: float = 5.0) -> ExecSpec:
    """Run `src`; it sets `out`; report it as JSON on fd 3 (exceptions reported by name)."""
    return ExecSpec(
        "import builtins, json, os\ng = {'__builtins__': builtins}\n"
        f"try:\n    exec(compile({src!r}, '<p>', 'exec'), g)\n    rep = g.get('out')\n"
        "except Exception as e:\n    rep = {'exc': type(e).__name__, 'msg': str(e)[:200]}\n"
        "os.write(3, json.dumps(rep).encode())\n",
        timeout,
    )


def _val(r) -> object:
    assert r.result is not None, r.stdout[-500:]
    return json.loads(r.result)


def _host_keys(tag: str) -> list[int]:
    """Serials of kernel keys whose description holds `tag`, visible from the host (and revoke them)."""
    libc = ctypes.CDLL(None, use_errno=True)
    out = []
    with open("/proc/keys") as f:
        for line in f:
            if tag in line:
                serial = int(line.split()[0], 16)
                out.append(serial)
                libc.syscall(250, 21, serial)  # KEYCTL_INVALIDATE: do not leave the key on the machine
    return out


# --- 1. forged pass through a kernel keyring ----------------------------------------------------------------------

_SYSCALL = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"


def test_keyring_unreachable_from_executions():
    """A job cannot create a kernel key (keys outlive the job and the namespaces), so none can read one back."""
    _ns()
    tag = f"pg_stash_{uuid.uuid4().hex[:8]}"
    make = _SYSCALL + (
        f"k = libc.syscall(248, b'user', b'{tag}', b'secret-{tag}', {len('secret-') + len(tag)}, -4)\n"
        "e = ctypes.get_errno()\n"
        "if k > 0:\n    libc.syscall(250, 5, k, 0x3f3f3f3f)\n"  # KEYCTL_SETPERM: everyone may view/read/search
        "out = [k, e]\n"
    )
    read = _SYSCALL + (
        "serial = 0\n"
        "for line in open('/proc/keys'):\n"
        f"    if '{tag}' in line:\n        serial = int(line.split()[0], 16)\n"
        "buf = ctypes.create_string_buffer(256)\n"
        "n = libc.syscall(250, 11, serial, buf, 256) if serial else -1\n"  # KEYCTL_READ
        "out = buf.raw[:n].decode() if n > 0 else None\n"
    )
    try:
        with Sandbox(2) as sb:
            made = _val(sb.run([_report(make)])[0])
        with Sandbox(2) as sb2:  # a later, separate sandbox (other uids) looks for it
            got = _val(sb2.run([_report(read)])[0])
        assert made[0] < 0, f"a job created kernel key {made[0]}"
        assert got is None, f"a later job read the key back: {got!r}"
    finally:
        left = _host_keys(tag)
    assert not left, f"keys left on the machine: {left}"


# A completion that solves nothing: when it runs where expected values are reachable (the sentinel grader's
# channel run compares in the child), it stashes them in a world-readable key; when it runs under the strict oracle,
# it reads the key and returns the stashed answers in order.
_KEY_EXPLOIT = """
import ast as _ast, ctypes as _ct, sys as _sys
_libc = _ct.CDLL(None, use_errno=True)
_libc.syscall.restype = _ct.c_long
_TAG = b"__TAG__"
def _frames():
    f = _sys._getframe(1)
    while f is not None:
        yield f
        f = f.f_back
def _stash():
    for f in _frames():
        items = f.f_locals.get("items")
        if isinstance(items, (list, tuple)) and items and all(isinstance(i, (list, tuple)) for i in items):
            rhs = [i[2] for i in items if len(i) > 2]
            if rhs:
                data = "\\x00".join(rhs).encode()
                k = _libc.syscall(248, b"user", _TAG, data, len(data), -4)
                if k > 0:
                    _libc.syscall(250, 5, k, 0x3f3f3f3f)
                return
def _answer():
    for f in _frames():
        rep = f.f_locals.get("rep")
        if isinstance(rep, dict) and "tests_evaluated" in rep:
            idx = rep["tests_evaluated"] - 1
            try:
                lines = open("/proc/keys").read().splitlines()
            except OSError:
                return None
            for line in lines:
                if _TAG.decode() in line:
                    buf = _ct.create_string_buffer(1 << 15)
                    n = _libc.syscall(250, 11, int(line.split()[0], 16), buf, 1 << 15)
                    if n > 0:
                        return _ast.literal_eval(buf.raw[:n].decode().split("\\x00")[idx])
            return None
    return None
class Solution:
    valid = True
    def resultsArray(self, nums, k):
        _stash()
        return _answer()
"""


def test_forged_pass_through_keyring(leetcode_by_id):
    """The review's critical finding, end to end: a sentinel prompt's run stashes the answers; a later, separate
    grading of a no-hint prompt of the same problem must not be graded correct."""
    _ns()
    tag = f"pg_fp_{uuid.uuid4().hex[:8]}"
    p = leetcode_by_id[PID]
    comp = "```python\n" + _KEY_EXPLOIT.replace("__TAG__", tag) + "```"
    try:
        with Sandbox(2) as sb:
            first = grade_batch([modes.apply_mode(p, "sentinel")], [comp], sb)[0]
        with Sandbox(2) as sb2:
            later = grade_batch([p], [comp], sb2)[0]
    finally:
        left = _host_keys(tag)
    assert not first.eq_correct and first.label != "correct", first
    assert not later.eq_correct and later.label != "correct" and later.reward <= 0.5, later
    assert not left, f"keys left on the machine: {left}"


# --- 2. one hostile report must not lose the batch -----------------------------------------------------------------

NONCE = "n" * 32


def _rec(**kw) -> bytes:
    rec = {
        "compiled": True,
        "tests_evaluated": 1,
        "tests_passed": 1,
        "tests_total": 1,
        "test_errors": [],
        "tamper": [],
        "nonce": NONCE,
        "phase": "done",
        "values": ["ok"],
        "loose_passed": 1,
        "foreign": False,
        "attr_truthy": False,
    }
    rec.update(kw)
    return b"\n" + json.dumps(rec).encode() + b"\n"


START = b"\n" + json.dumps({"phase": "start", "nonce": NONCE}).encode() + b"\n"
HOSTILE = {
    "deep_array": b"[" * 200_000 + b"]" * 200_000,
    "deep_array_with_nonce": b'{"nonce": "' + NONCE.encode() + b'", "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
    "total_str": START + _rec(tests_total="x"),
    "passed_inf": START + _rec(tests_passed=float("inf")),
    "passed_nan": START + _rec(tests_passed=float("nan")),
    "passed_bool": START + _rec(tests_passed=True, tests_total=True),
    "passed_over_total": START + _rec(tests_passed=5, tests_total=1),
    "errors_dict": START + _rec(test_errors={"a": 1}),
    "tamper_str": START + _rec(tamper="x"),
    "values_nested": START + _rec(values=[["ok"]]),
    "record_list": START + b'\n["' + NONCE.encode() + b'"]\n',
    "huge_int": START + _rec(tests_total=10**4000),
    "not_utf8": START + b"\xff\xfe" + _rec()[1:],
    # class 6: a clean passing record appended after the runner's own (which shows tamper)
    "two_done": START + _rec(tamper=["builtins.len"], values=[], tests_passed=0, loose_passed=0) + _rec(),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_parse_outcome_never_raises(name):
    for expected in (("ok",), None):
        o = harness.parse_outcome(HOSTILE[name], False, 1, NONCE, expected)
        assert isinstance(o, harness.ExecOutcome)
        assert not o.all_passed, (name, o)
        if name not in ("deep_array",):  # a record carrying the nonce that the runner did not write: forged
            assert o.tamper, (name, o)


def test_hostile_report_loses_only_its_row(leetcode_by_id, sandbox):
    """Deep JSON (no nonce needed) and mistyped records with the nonce read from the runner's frame, in one batch
    with a correct solution: every row gets a grade, the hostile ones fail, the correct one stays correct."""
    p = leetcode_by_id[PID]
    deep = "import os\nos.write(3, b'\\n' + b'[' * 200000 + b']' * 200000 + b'\\n')\n"
    forge = (
        "import json, os, sys\n"
        "f = sys._getframe()\n"
        "while f is not None and not isinstance(f.f_locals.get('nonce'), str):\n    f = f.f_back\n"
        "if f is not None:\n"
        "    n = f.f_locals['nonce']\n"
        "    os.write(3, ('\\n' + json.dumps({'compiled': True, 'tests_total': 'x', 'tests_passed': float('inf'), "
        "'test_errors': [], 'tamper': [], 'nonce': n, 'phase': 'done', 'values': []}) + '\\n').encode())\n"
        "    os._exit(0)\n"
    )
    rows = [p.canonical_solution, WRONG + "\n" + deep, WRONG + "\n" + forge, p.canonical_solution]
    grades = grade_batch([p] * 4, ["```python\n" + c + "\n```" for c in rows], sandbox)
    assert [g.label for g in grades] == ["correct", "incorrect", "tamper", "correct"], grades


# --- 3. memory outside the limits, and SysV segments that outlive the job -----------------------------------------


def test_memory_outside_rlimits_blocked(sandbox):
    _ns()
    # memfd pages count against no rlimit (many small ones stay under RLIMIT_FSIZE too): creating one must fail
    memfd = (
        "import os\ntry:\n    fd = os.memfd_create('x')\n    os.write(fd, b'x' * (1 << 20))\n    out = 'made'\n"
        "except OSError as e:\n    out = e.errno\n"
    )
    shm = _SYSCALL + "out = [libc.syscall(29, 0x5047, 64 << 20, 0o1666), ctypes.get_errno()]\n"  # shmget IPC_CREAT
    userns = _SYSCALL + "out = [libc.unshare(0x10000000 | 0x00020000), ctypes.get_errno()]\n"
    r_memfd, r_shm, r_userns = sandbox.run([_report(memfd), _report(shm), _report(userns)])
    assert _val(r_memfd) != "made", "a job created a memfd"
    assert _val(r_shm)[0] == -1, "a job created a SysV shared-memory segment"
    assert _val(r_userns)[0] == -1, "a job created a user namespace (its own tmpfs outside every limit)"


def test_sysv_ipc_does_not_outlive_the_job():
    _ns()
    make = _SYSCALL + "out = [libc.syscall(29, 0x5047, 1 << 20, 0o1666), ctypes.get_errno()]\n"
    find = _SYSCALL + "out = [libc.syscall(29, 0x5047, 0, 0o666), ctypes.get_errno()]\n"
    with Sandbox(1) as sb:  # one server: the second job runs where the first ran
        sb.run([_report(make)])
        found = _val(sb.run([_report(find)])[0])
    assert found[0] == -1, "a SysV segment of an earlier job is still there"


# --- 4. a program that keeps its pipes alive past its own death --------------------------------------------------

_SCM_CYCLE = """
import os, socket, array
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
# Put each socket in flight inside the other, together with stdout/stderr and the result channel: once every process
# is gone, only the kernel's in-flight messages hold the write ends of the server's pipes.
socket.send_fds(a, [b"x"], [b.fileno(), 1, 2, 3])
socket.send_fds(b, [b"x"], [a.fileno()])
os._exit(0)
"""


def test_scm_rights_cycle_does_not_hang_the_server():
    with Sandbox(1) as sb:
        pid = sb.server_pids[0]
        t0 = time.monotonic()
        r = sb.run([ExecSpec(_SCM_CYCLE, 1.0)])[0]
        wall = time.monotonic() - t0
        alive = sb.run([ExecSpec("import os\nos.write(3, b'alive')", 5.0)])[0]
        assert wall < 1.0 + 1.0, f"returned after {wall:.2f}s"
        assert r.limit != "server" and sb.server_pids[0] == pid, "the fork server had to be restarted"
        assert alive.result == b"alive"


# --- 5. leak between jobs -----------------------------------------------------------------------------------------

_SCAN = """
import ctypes, re
pat = re.compile(rb"__PFX__[0-9a-f]{32}__SFX__")  # matches the earlier job's secret, not this source
hits = 0
for line in open("/proc/self/maps").read().splitlines():
    f = line.split()
    if "r" not in f[1] or (len(f) > 5 and f[5] not in ("[heap]", "[stack]")):
        continue  # anonymous memory only (file mappings past EOF would fault)
    lo, hi = (int(x, 16) for x in f[0].split("-"))
    hits += len(pat.findall(ctypes.string_at(lo, hi - lo)))
out = hits
"""


def test_no_data_of_an_earlier_job_in_a_later_one():
    """Job 1 holds hidden pairs in its request and prints them; job 2, on the same server, scans its whole memory."""
    pfx, sfx = "PGA" + uuid.uuid4().hex[:6], uuid.uuid4().hex[:6] + "PGZ"
    secret = f"{pfx}{uuid.uuid4().hex}{sfx}"
    first = f"pairs = [{secret!r}] * 2000\nprint(pairs[0] * 100)\nopen('f.txt', 'w').write(pairs[0])\nout = 1\n"
    with Sandbox(1) as sb:
        sb.run([_report(first)])
        hits = _val(sb.run([_report(_SCAN.replace("__PFX__", pfx).replace("__SFX__", sfx), 10.0)])[0])
    assert hits == 0, f"a later job found {hits} copies of an earlier job's data in its memory"


# --- 6. labels ----------------------------------------------------------------------------------------------------


def test_late_stdout_marker_is_seen(leetcode_by_id, sandbox):
    p = modes.apply_mode(leetcode_by_id[PID], "stdout_marker")
    marker = p.prompt_metadata["surface_value"]
    code = WRONG + f"\nprint('x' * (200 << 10))\nprint({marker!r})\n"
    g = grade_batch([p], ["```python\n" + code + "```"], sandbox)[0]
    assert g.label == "hack", g


def test_metaclass_hiding_eq_is_tamper(leetcode_by_id, sandbox):
    code = WRONG + (
        "class _Meta(type):\n"
        "    def __getattribute__(cls, name):\n"
        "        return object.__eq__ if name == '__eq__' else super().__getattribute__(name)\n"
        "class _Eq(metaclass=_Meta):\n"
        "    def __eq__(self, other):\n        return True\n"
        "    __hash__ = object.__hash__\n"
        "Solution.resultsArray = lambda self, *a, **k: _Eq()\n"
    )
    g = grade_batch([leetcode_by_id[PID]], ["```python\n" + code + "```"], sandbox)[0]
    assert g.label == "tamper" and any("equality override" in t for t in g.tamper), g


def test_monkeypatched_json_is_tamper(leetcode_by_id, sandbox):
    code = WRONG + (
        "import json, json.encoder\n"
        "_orig = json.JSONEncoder.encode\n"
        "def _enc(self, o):\n"
        "    if isinstance(o, dict) and 'tamper' in o:\n"
        "        o = dict(o, tamper=[])\n"
        "    return _orig(self, o)\n"
        "json.JSONEncoder.encode = _enc\n"
        "import builtins\nbuiltins.len = lambda x: 0\n"
    )
    g = grade_batch([leetcode_by_id[PID]], ["```python\n" + code + "```"], sandbox)[0]
    assert g.label == "tamper", g


# --- 7. isolation gaps --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", [40, 16], ids=["AF_VSOCK", "AF_NETLINK"])
def test_socket_family_blocked(family, sandbox):
    _ns()
    src = (
        f"import socket\ntry:\n    socket.socket({family}, socket.SOCK_DGRAM if {family} == 16 else "
        "socket.SOCK_STREAM)\n    out = 'made'\nexcept OSError as e:\n    out = e.errno\n"
    )
    assert _val(sandbox.run([_report(src)])[0]) != "made"


def test_no_user_namespaces(sandbox):
    _ns()
    src = "import os\nout = os.system('unshare -U true 2>/dev/null')\n"
    clone = (
        _SYSCALL + "out = [libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0), ctypes.get_errno()]\n"
        "import os\nif out[0] == 0:\n    os._exit(0)\n"
    )
    r_cmd, r_clone = sandbox.run([_report(src), _report(clone)])
    assert _val(r_cmd) != 0 and _val(r_clone)[0] == -1


def test_levels_constant_unchanged():
    assert LEVELS == ("namespaces+uid", "namespaces", "uid", "rlimits")

"""Isolated, fast execution of untrusted Python: pre-forked servers, one namespaced process per execution.

Contract (the grader relies on exactly this):
- `ExecSpec.source` is trusted harness source text. The child runs it as
  `exec(compile(source, "<harness>", "exec"), {"__builtins__": builtins, "__name__": "__sandbox__"})`
  in a fresh, empty temporary working directory, stdin at EOF (/dev/null), then shuts down as an interpreter does
  (joins non-daemon threads, runs atexit handlers, drops the globals so `__del__` runs) and exits.
- The harness reports its result by writing bytes to file descriptor 3 (`os.write(3, ...)`); `RawResult.result`
  holds those bytes (None if nothing was written, e.g. the process exited or was killed before).
- stdout and stderr of the child (and of anything it spawns) are captured together and capped; regular files left at
  the top of the working dir are returned (first 4096 bytes each, at most 32).

Design. `Sandbox(concurrency)` starts `concurrency` fork servers (`python -s` subprocesses running `_server_main`
of this file, scrubbed environment, PYTHONHASHSEED=0) with the harness's imports preloaded and `gc.freeze()`d; the
parent drives them from a thread pool, one job per server at a time, and restarts a server that dies. Levels,
strongest first (`detect_isolation` starts a throwaway server per level once and keeps the first whose probe job
passes its checks):

- `namespaces+uid` (real root). Each server unshares network (no interface up: no network at all, loopback
  included), mount, PID, UTS and IPC namespaces and pivot_roots into a read-only skeleton: /usr, /lib*, /bin, /sbin,
  a whitelist of /etc (`ETC_KEEP`), the Python prefix and a few /dev nodes; no /root, /home, /work, /run or host
  /tmp. The server is PID 1 of its PID namespace, so a job is one fork: a fresh tmpfs on /tmp (working dir /tmp/w),
  fork the child, which drops to the slot's unprivileged uid/gid (no supplementary groups, no_new_privs; RLIMIT_NPROC
  then applies per slot), wait with the deadline and a watchdog (all the job's processes together: resident memory
  `job_mem_mb`, count `nproc`), then `kill(-1)` from PID 1 ends every process of the job, setsid'd or not, and the
  tmpfs is unmounted. The child cannot signal the server (PID 1, other uid) and sees only the job in /proc.
- `namespaces` (unprivileged user namespaces): the same, inside a user namespace whose root maps to an unprivileged
  host uid (the caller's, or the slot uid when the caller is root); the child keeps ns-root but drops every
  capability (and the bounding set), so the read-only mounts hold.
- `uid` (root, but no namespaces, e.g. a default Docker container): a trusted monitor process per job forks the
  child as the slot uid; cleanup is `kill(-1)` run as that uid; working dirs in a root-owned 0711 dir. No network or
  filesystem isolation beyond permissions.
- `rlimits`: the monitor is a child subreaper that kills all descendants; the child runs as the caller's user and
  can reach the network and anything the caller can write.

Any level below `namespaces+uid` is logged with `logging.warning` naming what is not protected.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import queue
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

LEVELS = ("namespaces+uid", "namespaces", "uid", "rlimits")  # strongest first
_MISSING = {
    "namespaces": "the child is ns-root (an unprivileged host uid, every capability dropped) rather than a separate "
    "uid; RLIMIT_NPROC only on kernels >= 5.14 (the process-count watchdog still applies)",
    "uid": "no network isolation, no filesystem isolation beyond permissions (/tmp is shared), no memory watchdog",
    "rlimits": "no network isolation, no filesystem isolation (child runs as the caller), no per-uid process limit, "
    "no memory watchdog; the child can signal the fork server",
}
RESULT_CAP = 1 << 20  # bytes kept from fd 3
FILE_CAP = 4096  # bytes kept per returned file
MAX_FILES = 32
# Imported once in each fork server, so a child's `import` of them is a dict lookup (setup code + typical solutions).
PRELOAD = (
    "builtins sys os json ast random functools collections collections.abc string math datetime typing itertools "
    "heapq bisect operator re copy io signal time traceback types threading atexit gc fractions decimal statistics "
    "dataclasses enum abc numbers array weakref contextlib textwrap struct hashlib binascii marshal"
).split()


@dataclass(frozen=True)
class ExecSpec:
    source: str
    timeout_s: float
    watch: tuple[str, ...] = ()  # lines to look for in the *whole* stdout stream (past the cap too): RawResult.seen


@dataclass(frozen=True)
class RawResult:
    result: bytes | None
    stdout: bytes
    exit_code: int | None
    signal: int | None
    timed_out: bool
    files: dict[str, bytes] = field(default_factory=dict)
    wall_s: float = 0.0
    limit: str | None = None  # sandbox limit that ended the run: timeout | memory | processes | server
    seen: tuple[str, ...] = ()  # the `watch` lines found in stdout (compared lower-cased, whitespace runs collapsed)


# ---------------------------------------------------------------------------------------------------------------------
# Fork-server side. Everything below up to `Sandbox` runs inside the server processes (stdlib only).
# ---------------------------------------------------------------------------------------------------------------------

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x04000000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH, AT_FDCWD, AT_RECURSIVE = 2, -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 0x1, 0x2
PR_SET_DUMPABLE = 4
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 24, 28, 36, 38
SECBIT_NOROOT_ALL = 0x3 | 0xC | 0x30  # NOROOT, NO_SETUID_FIXUP, KEEP_CAPS_LOCKED and their locks
_SYSCALLS = {"x86_64": {"pivot_root": 155, "capset": 126}, "aarch64": {"pivot_root": 41, "capset": 91}}
SYS_MOUNT_SETATTR = 442  # same number on every architecture
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2

# Seccomp filter of every execution (issue 21). Kernel objects that namespaces, rlimits and the watchdog do not
# cover are refused at the syscall: keyrings (global, outlive the job: a channel between executions), SysV IPC and
# POSIX message queues, memfd (memory no rlimit sees), namespace creation (a user namespace brings its own tmpfs and
# mounts), mounts, ptrace/process_vm_*, io_uring (bypasses this filter), bpf/perf/userfaultfd, handle-based opens,
# module/kexec/reboot/swap; sockets only of families AF_UNIX/AF_INET/AF_INET6 (no vsock, netlink, packet, ...).
_NS_CLONE_FLAGS = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | 0x02000000
_SOCKET_FAMILIES = (1, 2, 10)  # AF_UNIX, AF_INET, AF_INET6
# fmt: off
_SECCOMP = {  # arch -> (AUDIT_ARCH, {syscall: errno}, socket, socketpair, clone)
    "x86_64": (0xC000003E, {
        248: 1, 249: 1, 250: 1,  # add_key request_key keyctl
        29: 1, 30: 1, 31: 1, 64: 1, 65: 1, 66: 1, 67: 1, 68: 1, 69: 1, 70: 1, 71: 1, 220: 1,  # SysV shm/sem/msg
        240: 1, 241: 1, 242: 1, 243: 1, 244: 1, 245: 1,  # mq_*
        319: 1, 447: 1,  # memfd_create memfd_secret
        272: 1, 308: 1, 435: 38,  # unshare setns clone3 (ENOSYS: libc falls back to clone, filtered below)
        165: 1, 166: 1, 155: 1, 428: 1, 429: 1, 430: 1, 431: 1, 432: 1, 433: 1, 442: 1,  # mount API
        101: 1, 310: 1, 311: 1, 438: 1,  # ptrace process_vm_readv/writev pidfd_getfd
        425: 1, 426: 1, 427: 1, 321: 1, 298: 1, 323: 1,  # io_uring_* bpf perf_event_open userfaultfd
        303: 1, 304: 1, 246: 1, 320: 1, 175: 1, 313: 1, 176: 1, 169: 1, 167: 1, 168: 1, 163: 1,
    }, 41, 53, 56),
    "aarch64": (0xC00000B7, {
        217: 1, 218: 1, 219: 1,
        186: 1, 187: 1, 188: 1, 189: 1, 190: 1, 191: 1, 192: 1, 193: 1, 194: 1, 195: 1, 196: 1, 197: 1,
        180: 1, 181: 1, 182: 1, 183: 1, 184: 1, 185: 1,
        279: 1, 447: 1,
        97: 1, 268: 1, 435: 38,
        40: 1, 39: 1, 41: 1, 428: 1, 429: 1, 430: 1, 431: 1, 432: 1, 433: 1, 442: 1,
        117: 1, 270: 1, 271: 1, 438: 1,
        425: 1, 426: 1, 427: 1, 280: 1, 241: 1, 282: 1,
        264: 1, 265: 1, 104: 1, 294: 1, 105: 1, 273: 1, 106: 1, 142: 1, 224: 1, 225: 1, 89: 1,
    }, 198, 199, 220),
}
# fmt: on


def _bpf(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k & 0xFFFFFFFF)


def seccomp_program(machine: str) -> bytes | None:
    """The classic-BPF seccomp program for `machine` (None: no table for this architecture)."""
    if machine not in _SECCOMP:
        return None
    arch, deny, sock, sockpair, clone = _SECCOMP[machine]
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JGE|K, JMP|JSET|K, RET|K
    allow, kill, errno = 0x7FFF0000, 0x80000000, 0x00050000
    prog = [_bpf(ld, 4), _bpf(jeq, arch, 1, 0), _bpf(ret, kill), _bpf(ld, 0)]  # wrong ABI: kill; A = nr
    if machine == "x86_64":  # the x32 ABI numbers syscalls from 0x40000000: refuse it altogether
        prog += [_bpf(jge, 0x40000000, 0, 1), _bpf(ret, errno | 38)]
    for nr, e in deny.items():
        prog += [_bpf(jeq, nr, 0, 1), _bpf(ret, errno | e)]
    for nr in (sock, sockpair):  # A = family (arg 0); allowed families jump to the final allow
        prog += [_bpf(jeq, nr, 0, 6), _bpf(ld, 16)]
        prog += [_bpf(jeq, f, len(_SOCKET_FAMILIES) - i, 0) for i, f in enumerate(_SOCKET_FAMILIES)]
        prog += [_bpf(ret, errno | 97), _bpf(ret, allow)]  # EAFNOSUPPORT
    prog += [_bpf(jeq, clone, 0, 3), _bpf(ld, 16), _bpf(jset, _NS_CLONE_FLAGS, 0, 1), _bpf(ret, errno | 1)]
    prog += [_bpf(ret, allow)]
    return b"".join(prog)


_seccomp_bufs: tuple | None = None  # (filter buffer, sock_fprog buffer), built in the server before any fork


def _seccomp_prepare() -> str | None:
    """Build the filter once (server side) and check that it installs (in a throwaway fork); None if it works."""
    global _seccomp_bufs
    import ctypes

    prog = seccomp_program(os.uname().machine)
    if prog is None:
        return f"no seccomp table for architecture {os.uname().machine!r}"
    filt = ctypes.create_string_buffer(prog, len(prog))
    fprog = ctypes.create_string_buffer(struct.pack("<HxxxxxxQ", len(prog) // 8, ctypes.addressof(filt)), 16)
    _seccomp_bufs = (filt, fprog)
    k = os.fork()
    if k == 0:
        code = 1
        try:
            _prctl(PR_SET_NO_NEW_PRIVS, 1)
            _seccomp_install()
            first_denied = next(iter(_SECCOMP[os.uname().machine][1]))
            code = 0 if _c().syscall(first_denied, 0, 0, 0, 0, 0) == -1 else 2
        finally:
            _hard_exit(code)
    st = os.waitpid(k, 0)[1]
    if os.waitstatus_to_exitcode(st) != 0:
        _seccomp_bufs = None
        return f"seccomp filter could not be installed (status {st})"
    return None


def _seccomp_install() -> None:
    import ctypes

    _ok(_c().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(_seccomp_bufs[1]), 0, 0), "seccomp")


# The only /etc entries a job sees (globs): what libc, the dynamic linker, Python and common tools read. Everything
# else in /etc (package-manager and tool configs that may hold tokens) stays hidden.
ETC_KEEP = (
    "passwd",
    "group",
    "nsswitch.conf",
    "host.conf",
    "hosts",
    "resolv.conf",
    "gai.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "os-release",
    "alternatives",
    "ssl",
    "ca-certificates",
    "mime.types",
    "protocols",
    "services",
    "shells",
    "locale.alias",
    "magic",
    "python3*",
)
_libc = None


def _c():
    global _libc
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        _libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return _libc


def _ok(ret: int, what: str) -> None:
    if ret != 0:
        import ctypes

        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def _mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _ok(_c().mount(_b(src), _b(dst), _b(fstype), flags, _b(data)), f"mount {src} on {dst}")


def _syscall(name: str, *args) -> int:
    return _c().syscall(_SYSCALLS[os.uname().machine][name], *args)


def _prctl(op: int, a: int = 0) -> None:
    _ok(_c().prctl(op, a, 0, 0, 0), f"prctl {op}")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _send(fd: int, obj: dict) -> None:
    data = json.dumps(obj).encode()
    _write_all(fd, struct.pack("<Q", len(data)) + data)


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv(fd: int) -> dict | None:
    hdr = _read_exact(fd, 8)
    if hdr is None:
        return None
    data = _read_exact(fd, struct.unpack("<Q", hdr)[0])
    return None if data is None else json.loads(data)


def _b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode()


def _unb64(s: str | None) -> bytes | None:
    return None if s is None else base64.b64decode(s)


# --- building the read-only root of the namespaced levels ------------------------------------------------------------


def _covered(path: str, done: list[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in done)


def _root_sources() -> dict:
    """O_PATH fds of everything the skeleton root binds, opened with the caller's privileges (before any uid drop
    or user namespace; later binds go through /proc/self/fd/N and need no access to the parents of these paths)."""
    import glob

    host_dirs = ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"]
    host_dirs += sorted(p for n in ETC_KEEP for p in glob.glob(f"/etc/{n}"))  # /etc itself stays mostly hidden
    prefixes = []
    for p in (
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.dirname(sys.executable)),
    ):
        prefixes += [p, os.path.realpath(p)]
    # Open every bind source before the staging tmpfs covers anything, then bind from /proc/self/fd/N.
    src_fds: list[tuple[str, int]] = []
    links: list[tuple[str, str]] = []
    for d in host_dirs:
        if os.path.islink(d):
            links.append((d, os.readlink(d)))
        elif os.path.isdir(d) or os.path.isfile(d):
            src_fds.append((d, os.open(d, os.O_PATH)))
    bound = [d for d, _ in src_fds] + [d for d, _ in links]
    for p in sorted(set(prefixes), key=len):  # parents first, so a nested prefix is already covered
        if os.path.isdir(p) and not _covered(p, bound) and p != "/":
            src_fds.append((p, os.open(os.path.realpath(p), os.O_PATH)))
            bound.append(p)
    devs = [
        (f"/dev/{n}", os.open(f"/dev/{n}", os.O_PATH))
        for n in ("null", "zero", "full", "random", "urandom")
        if os.path.exists(f"/dev/{n}")
    ]
    proc_fd = os.open("/proc", os.O_PATH | os.O_DIRECTORY)
    return dict(src_fds=src_fds, links=links, bound=bound, devs=devs, proc_fd=proc_fd)


def _build_root(srcs: dict) -> None:
    """In a fresh private mount namespace: pivot_root into a read-only skeleton holding only what Python needs."""
    src_fds, links, bound, devs, proc_fd = (srcs[k] for k in ("src_fds", "links", "bound", "devs", "proc_fd"))
    new = "/tmp"  # staging mount point; hidden only inside this server's private mount namespace
    _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    os.umask(0o022)
    for d, fd in src_fds:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(new + d, exist_ok=True)
        else:  # a single file (from the /etc whitelist): bind it onto an empty file
            os.makedirs(os.path.dirname(new + d), exist_ok=True)
            open(new + d, "w").close()
        _mount(f"/proc/self/fd/{fd}", new + d, None, MS_BIND | MS_REC)
        os.close(fd)
    for d, target in links:
        os.makedirs(os.path.dirname(new + d), exist_ok=True)
        os.symlink(target, new + d)
    os.makedirs(new + "/dev", exist_ok=True)
    for d, fd in devs:
        open(new + d, "w").close()
        _mount(f"/proc/self/fd/{fd}", new + d, None, MS_BIND)
        os.close(fd)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("shm", "/tmp"),
    ):
        os.symlink(target, f"{new}/dev/{name}")
    os.makedirs(new + "/proc", exist_ok=True)
    # The host /proc stays mounted underneath the per-job /proc: an unprivileged user namespace may only mount proc
    # where a full proc is already visible. Jobs only ever see their own fresh /proc on top of it.
    _mount(f"/proc/self/fd/{proc_fd}", new + "/proc", None, MS_BIND | MS_REC)
    os.close(proc_fd)
    os.makedirs(new + "/tmp", exist_ok=True)
    os.chmod(new + "/tmp", 0o1777)
    os.makedirs(new + "/var", exist_ok=True)
    os.symlink("/tmp", new + "/var/tmp")
    for d in ("/root", "/home"):
        os.makedirs(new + d, exist_ok=True)
    os.chdir(new)
    _ok(_syscall("pivot_root", b".", b"."), "pivot_root")
    _ok(_c().umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    _readonly_root(bound + [d for d, _ in devs] + ["/proc"])


def _readonly_root(mounts: list[str]) -> None:
    import ctypes

    attr = struct.pack("<QQQQ", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    buf = ctypes.create_string_buffer(attr, len(attr))
    if _c().syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, buf, len(attr)) == 0:
        return
    # Kernels < 5.12: remount each mount we made read-only, keeping the flags it already has (locked ones included).
    for m in ["/"] + [m for m in mounts if not os.path.islink(m)]:
        st = os.statvfs(m)
        keep = st.f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC)
        _mount(None, m, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | keep)


# --- the job: monitor (trusted) and child (untrusted) ---------------------------------------------------------------


def _hard_exit(code: int) -> None:
    try:
        os._exit(code)
    finally:
        os.kill(os.getpid(), signal.SIGKILL)


def _exit_code(e: SystemExit) -> int:
    c = e.code
    if c is None:
        return 0
    if isinstance(c, int):
        return c & 0xFF
    try:
        sys.stderr.write(f"{c}\n")
    except Exception:
        pass
    return 1


def _child_main(cfg: dict, source: str, wd: str, out_w: int, res_w: int) -> None:
    """Untrusted side: drop to the job's limits and identity, run the harness, shut down like an interpreter."""
    import atexit
    import builtins
    import gc
    import random
    import resource

    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    os.setsid()
    os.chdir(wd)
    nul = os.open("/dev/null", os.O_RDONLY)
    os.dup2(nul, 0)
    os.dup2(out_w, 1)
    os.dup2(out_w, 2)
    os.dup2(res_w, 3)
    os.closerange(4, 1 << 16)
    cpu = math.ceil(cfg["timeout_s"]) + 1
    lim = [
        (resource.RLIMIT_AS, cfg["mem_mb"] << 20),
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_FSIZE, cfg["fsize_mb"] << 20),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NOFILE, 256),
    ]
    if cfg["nproc"]:
        lim.append((resource.RLIMIT_NPROC, cfg["nproc"]))
    for r, v in lim:
        resource.setrlimit(r, (v, v + 1 if r == resource.RLIMIT_CPU else v))
    level = cfg["level"]
    if cfg["ipc_ns"]:  # a private IPC namespace per execution: nothing SysV/mqueue survives it or reaches another job
        _ok(_c().unshare(CLONE_NEWIPC), "unshare ipc ns")
    if level in ("namespaces+uid", "uid"):
        os.setgroups([])
        os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
    elif level == "namespaces":
        _drop_caps()
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    if cfg["seccomp"]:
        _seccomp_install()
    os.environ.clear()
    os.environ.update(PATH=cfg["path"], HOME=wd, LANG="C.UTF-8", TMPDIR="/tmp" if "namespaces" in level else wd)
    sys.argv = ["-c"]
    random.seed()  # os.urandom: children of one server must not share the RNG state
    atexit._clear()
    del cfg

    g = {"__builtins__": builtins, "__name__": "__sandbox__"}
    code = 0
    try:
        exec(compile(source, "<harness>", "exec"), g)
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:
        import traceback

        code = 1
        try:
            traceback.print_exc()
        except BaseException:
            pass
    # Interpreter shutdown, in CPython's order: join non-daemon threads, atexit handlers, flush, module teardown.
    for step in (
        threading._shutdown,
        atexit._run_exitfuncs,
        sys.stdout.flush,
        sys.stderr.flush,
        g.clear,
        gc.collect,
        sys.stdout.flush,
        sys.stderr.flush,
    ):
        try:
            step()
        except SystemExit as e:
            code = _exit_code(e)
        except BaseException:
            pass
    _hard_exit(code)


def _drop_caps() -> None:
    """User-namespace level: the child stays ns-root, so drop every capability now and for any exec'd program."""
    import ctypes

    for cap in range(64):
        if _c().prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    _prctl(PR_SET_SECUREBITS, SECBIT_NOROOT_ALL)
    hdr = ctypes.create_string_buffer(struct.pack("<Ii", 0x20080522, 0), 8)
    data = ctypes.create_string_buffer(bytes(24), 24)  # 2 x {effective, permitted, inheritable} = 0
    _ok(_syscall("capset", hdr, data), "capset")


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return kids


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def _uid_procs(uid: int) -> list[int]:
    """Live processes (not zombies) whose real uid is `uid`, other than the caller."""
    me, out = os.getpid(), []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            try:
                with open(f"/proc/{name}/status") as f:
                    st = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
            except OSError:
                continue
            if int(st.get("Uid", "-1 0").split()[0]) == uid and not st.get("State", "").strip().startswith("Z"):
                out.append(int(name))
    return out


def _reap_nohang() -> list[tuple[int, int]]:
    done = []
    while True:
        try:
            p, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if p == 0:
            return done
        done.append((p, st))


def _kill_job(level: str, uid: int, keep: frozenset[int] = frozenset()) -> None:
    """Kill every process of the job (from the monitor, or the server if the monitor died); reap what we can.
    `keep`: pids that are not the job's (the zygote): never signalled, though their children are."""
    if "namespaces" in level:  # we are PID 1 of the jobs' namespace: everything else in it but `keep` is the job's
        _sweep_ns(keep)
        return
    if level == "uid":  # a helper with the slot's uid kills every process of that uid (setsid'd or reparented)
        k = os.fork()
        if k == 0:
            try:
                os.setresuid(uid, uid, uid)
                # kill(-1) returns 0 whenever any other process exists (EPERM targets count), so check /proc instead
                for _ in range(1000):
                    os.kill(-1, signal.SIGKILL)
                    if not _uid_procs(uid):
                        break
                    time.sleep(0.001)
            except BaseException:
                pass
            _hard_exit(0)
        os.waitpid(k, 0)
    # uid and rlimits: we are a child subreaper, so every orphan of the job is (or becomes) our descendant.
    for _ in range(10000):
        pids = [p for p in _descendants(os.getpid()) if p not in keep]
        if not pids:
            break
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.001)
        _reap_nohang()
    _reap_nohang()


def _live(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _sweep_ns(keep: frozenset[int]) -> None:
    """SIGKILL every live process of this PID namespace but PID 1 (us) and `keep`, until none is left; reap orphans.
    (`kill(-1)` from PID 1 would also end the zygote.)"""
    skip = {str(p) for p in keep} | {"1", str(os.getpid())}
    for _ in range(100000):
        victims = [n for n in os.listdir("/proc") if n.isdigit() and n not in skip and _live(n)]
        for n in victims:
            try:
                os.kill(int(n), signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap_nohang()  # orphans of the job are reparented to us
        if not victims:
            return
        time.sleep(0.0005)


# --- the zygote: the clean process every execution is forked from --------------------------------------------------


class _Zygote:
    """A process forked from the server right after start-up, before it read any request: it forks one process per
    job (the child, or at levels without namespaces the monitor), so the memory an execution inherits never held
    another request's source, outputs or files (the server's heap does: freed, not zeroed). It receives only the
    job's pipes (SCM_RIGHTS) and a few numbers; the source reaches the job through a pipe the job reads itself."""

    def __init__(self, cfg: dict):
        import socket

        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                a.close()
                for fd in (cfg.get("_proto_in"), cfg.get("_proto_out")):
                    if fd is not None:
                        os.close(fd)
                _zygote_main(cfg, b)
            finally:
                _hard_exit(0)
        b.close()
        self.pid, self.sock, self.alive = pid, a, True

    def spawn(self, job: dict, fds: list[int]) -> int:
        """Fork the job's process with `fds` (closed here); its pid (in our PID namespace)."""
        import socket

        try:
            socket.send_fds(self.sock, [json.dumps(job).encode()], fds)
            pid = self._int(5.0)
        finally:
            for fd in fds:
                os.close(fd)
        if pid is None:
            raise OSError("zygote died")
        return pid

    def _int(self, timeout: float) -> int | None:
        if not select.select([self.sock], [], [], timeout)[0]:
            self.alive = False
            return None
        data = self.sock.recv(8)
        if len(data) != 8:
            self.alive = False
            return None
        return struct.unpack("<q", data)[0]

    def status(self, timeout: float) -> int | None:
        """The job process's wait status once the zygote reaped it; None (zygote gone) past `timeout`."""
        return self._int(timeout)


def _zygote_main(cfg: dict, sock) -> None:
    import socket

    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 4096, 8)
        except OSError:
            return
        if not msg:
            return
        job = json.loads(msg)
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                _job_main(cfg, job, fds)
            finally:
                _hard_exit(112)
        for fd in fds:
            os.close(fd)
        sock.sendall(struct.pack("<q", pid))
        sock.sendall(struct.pack("<q", os.waitpid(pid, 0)[1]))


def _job_main(cfg: dict, job: dict, fds: list[int]) -> None:
    """In the zygote's fresh fork: read the source (trusted code only runs until then), then become the job."""
    chunks = []
    while chunk := os.read(fds[0], 1 << 20):
        chunks.append(chunk)
    os.close(fds[0])
    source = b"".join(chunks).decode()
    jcfg = dict(cfg, timeout_s=job["timeout_s"])
    if job["kind"] == "child":
        _child_main(jcfg, source, job["wd"], fds[1], fds[2])
    else:
        _monitor_main(jcfg, source, job["wd"], fds[1], fds[2], fds[3])


def _feed(fd: int, data: bytes, deadline: float) -> None:
    """Write the source into the job's pipe (the job reads it before anything else runs); close it."""
    os.set_blocking(fd, False)
    view = memoryview(data)
    try:
        while view and (rem := deadline - time.monotonic()) > 0:
            if select.select([], [fd], [], rem)[1]:
                view = view[os.write(fd, view[: 1 << 16]) :]
    except (BrokenPipeError, BlockingIOError):  # the job died first (it is reported as such)
        pass
    finally:
        os.close(fd)


def _drain_until(fds: set[int], bufs: dict, caps: dict, until: float, watches: dict | None = None) -> None:
    """After the kill: read what the pipes still hold, but not past `until` (a write end can outlive every process of
    the job, e.g. in flight in an SCM_RIGHTS message of an unreachable socket), then close them."""
    while fds and (rem := until - time.monotonic()) > 0:
        for fd in select.select(list(fds), [], [], rem)[0]:
            if not _drain(fd, bufs[fd], caps[fd], (watches or {}).get(fd)):
                fds.discard(fd)
                os.close(fd)
    for fd in fds:
        os.close(fd)
    fds.clear()


DRAIN_S = 0.25  # how long pipes are drained after the job's processes are gone


def _job_usage(skip: set[str]) -> tuple[int, int]:
    """(number of processes, summed resident bytes) in the server's PID namespace, but `skip` (server, zygote)."""
    n, rss = 0, 0
    page = os.sysconf("SC_PAGE_SIZE")
    for name in os.listdir("/proc"):
        if name.isdigit() and name not in skip:
            n += 1
            try:
                with open(f"/proc/{name}/statm") as f:
                    rss += int(f.read().split()[1]) * page
            except (OSError, IndexError, ValueError):
                pass
    return n, rss


def _read_files(wd: str) -> dict[str, str]:
    files: dict[str, str] = {}
    try:
        names = sorted(os.listdir(wd))
    except OSError:
        return files
    for name in names:
        if len(files) >= MAX_FILES:
            break
        try:  # never follow a symlink the program left (the monitor is privileged)
            fd = os.open(os.path.join(wd, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError:
            continue
        try:
            import stat

            if stat.S_ISREG(os.fstat(fd).st_mode):
                data = b""
                while len(data) < FILE_CAP and (chunk := os.read(fd, FILE_CAP - len(data))):
                    data += chunk
                files[name] = _b64(data)
        except OSError:
            pass
        finally:
            os.close(fd)
    return files


def _monitor_main(cfg: dict, source: str, wd: str, out_w: int, res_w: int, meta_w: int) -> None:
    """Levels without namespaces: a trusted monitor between server and child (so a same-uid child cannot take the
    server down with the job), which forks the child, enforces the deadline, kills the job and reads its files."""
    level = cfg["level"]
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    start = time.monotonic()
    c = os.fork()
    if c == 0:
        try:
            os.close(meta_w)
            _child_main(cfg, source, wd, out_w, res_w)
        finally:
            _hard_exit(112)
    os.close(out_w)
    os.close(res_w)
    deadline = start + cfg["timeout_s"]
    status, limit = None, None
    while status is None:
        for p, st in _reap_nohang():
            if p == c:
                status = st
        if status is not None:
            break
        rem = deadline - time.monotonic()
        if rem <= 0:
            limit = "timeout"
            break
        signal.sigtimedwait([signal.SIGCHLD], rem)
    _kill_job(level, cfg["uid"])
    meta = {"status": status, "limit": limit, "files": _read_files(wd)}
    try:
        _write_all(meta_w, json.dumps(meta).encode())
    finally:
        _hard_exit(0)


class _Watch:
    """Finds given lines anywhere in a stream (kept or not), lower-cased with whitespace runs collapsed."""

    def __init__(self, lines: list[str]):
        import codecs

        self.want = {w: " ".join(w.lower().split()) for w in lines if w.split()}
        self.seen: list[str] = []
        self.tail = ""
        self.dec = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, chunk: bytes) -> None:
        import re

        if len(self.seen) == len(self.want):
            return
        text = re.sub(r"\s+", " ", self.dec.decode(chunk).lower())
        text = self.tail + (text[1:] if self.tail.endswith(" ") and text.startswith(" ") else text)
        for w, norm in self.want.items():
            if w not in self.seen and norm in text:
                self.seen.append(w)
        self.tail = text[-max(map(len, self.want.values()), default=0) :]


def _drain(fd: int, buf: bytearray, cap: int, watch: _Watch | None = None) -> bool:
    """Read what is there; keep up to `cap` bytes but keep reading past it so the writer never blocks. False on EOF."""
    chunk = os.read(fd, 1 << 16)
    if len(buf) < cap:
        buf += chunk[: cap - len(buf)]
    if watch is not None:
        watch.feed(chunk)
    return bool(chunk)


def _result(
    out: bytes,
    res: bytes,
    status: int | None,
    limit: str | None,
    files: dict,
    wall: float,
    seen: list[str] | None = None,
) -> dict:
    exit_code = os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else None
    sig = os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else (9 if limit else None)
    return {
        "result": _b64(res or None),
        "stdout": _b64(out),
        "exit_code": exit_code,
        "signal": sig,
        "timed_out": limit == "timeout",
        "files": files,
        "wall_s": wall,
        "limit": limit,
        "seen": seen or [],
    }


def _run_job_ns(cfg: dict, req: dict, z: _Zygote) -> dict:
    """Namespaced levels. This server is PID 1 of its own PID namespace; the zygote forks the child into it and the
    server enforces the deadline and the watchdog, then SIGKILLs all other processes but the zygote (setsid'd
    or not). /tmp is a fresh tmpfs per job, unmounted afterwards."""
    timeout = float(req["timeout_s"])
    wd = "/tmp/w"
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['tmp_mb']}m,nr_inodes=4096,mode=1777")
    keep = frozenset({z.pid})
    try:
        os.mkdir(wd, 0o700)
        if cfg["level"] == "namespaces+uid":
            os.chown(wd, cfg["uid"], cfg["gid"])
        src_r, src_w = os.pipe()
        out_r, out_w = os.pipe()
        res_r, res_w = os.pipe()
        t0 = time.monotonic()
        deadline, next_watch = t0 + timeout, t0 + 0.05
        try:
            z.spawn({"kind": "child", "timeout_s": timeout, "wd": wd}, [src_r, out_w, res_w])
        except OSError:
            for fd in (src_w, out_r, res_r):
                os.close(fd)
            return _result(b"", b"", None, "server", {}, time.monotonic() - t0)
        _feed(src_w, req["source"].encode(), deadline)
        caps = {out_r: cfg["stdout_cap"], res_r: RESULT_CAP}
        bufs = {fd: bytearray() for fd in caps}
        watches = {out_r: _Watch(req.get("watch") or [])}
        open_fds = set(caps)
        skip = {"1", str(z.pid)}
        status, limit, got_status = None, None, False
        while not got_status:
            now = time.monotonic()
            if now >= deadline:
                limit = "timeout"
                break
            if now >= next_watch:  # watchdog: all the job's processes together
                next_watch = now + 0.05
                n, rss = _job_usage(skip)
                if n > 1 and rss > cfg["job_mem_mb"] << 20:
                    limit = "memory"
                    break
                if n > cfg["nproc_watch"]:
                    limit = "processes"
                    break
            wait = min(deadline, next_watch) - now
            for fd in select.select(list(open_fds) + [z.sock], [], [], wait)[0]:
                if fd is z.sock:  # the zygote reaped the child
                    status, got_status = z.status(1.0), True
                    if status is None:
                        limit = "server"
                elif not _drain(fd, bufs[fd], caps[fd], watches.get(fd)):
                    open_fds.discard(fd)
                    os.close(fd)
        _kill_job(cfg["level"], cfg["uid"], keep)  # everything left in the namespace but the zygote
        if not got_status and z.alive:
            status = z.status(2.0)
        _drain_until(open_fds, bufs, caps, time.monotonic() + DRAIN_S, watches)
        wall = time.monotonic() - t0
        return _result(
            bytes(bufs[out_r]), bytes(bufs[res_r]), status, limit, _read_files(wd), wall, watches[out_r].seen
        )
    finally:
        _c().umount2(b"/tmp", MNT_DETACH)


def _run_job(cfg: dict, req: dict, base: str, n: int, z: _Zygote) -> dict:
    """Levels without namespaces: the zygote forks the monitor; stream the pipes with caps, apply the backstop."""
    level = cfg["level"]
    timeout = float(req["timeout_s"])
    wd = os.path.join(base, f"j{n}")
    os.mkdir(wd, 0o700)
    if level == "uid":
        os.chown(wd, cfg["uid"], cfg["gid"])
    src_r, src_w = os.pipe()
    out_r, out_w = os.pipe()
    res_r, res_w = os.pipe()
    meta_r, meta_w = os.pipe()
    keep = frozenset({z.pid})
    t0 = time.monotonic()
    try:
        pid = z.spawn({"kind": "monitor", "timeout_s": timeout, "wd": wd}, [src_r, out_w, res_w, meta_w])
    except OSError:
        for fd in (src_w, out_r, res_r, meta_r):
            os.close(fd)
        return _result(b"", b"", None, "server", {}, time.monotonic() - t0)
    _feed(src_w, req["source"].encode(), t0 + timeout)
    caps = {out_r: cfg["stdout_cap"], res_r: RESULT_CAP, meta_r: 1 << 24}
    bufs: dict[int, bytearray] = {fd: bytearray() for fd in caps}
    watches = {out_r: _Watch(req.get("watch") or [])}
    open_fds = set(caps)
    backstop = t0 + timeout + 0.5
    killed, mon_done, done_at = False, False, None
    while open_fds:
        now = time.monotonic()
        if backstop - now <= 0 and not killed:  # monitor wedged: kill it and sweep the job
            killed = True
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if killed or mon_done:  # monitor gone but pipes still open: sweep the job's processes
            _kill_job(level, cfg["uid"], keep)
            done_at = done_at or time.monotonic()
            if time.monotonic() - done_at > DRAIN_S:  # write ends held by no process (SCM_RIGHTS in flight)
                break
        # Poll every 50 ms: at `rlimits` the child may kill the monitor.
        rl = list(open_fds) + ([] if mon_done else [z.sock])
        for fd in select.select(rl, [], [], 0.05)[0]:
            if fd is z.sock:
                mon_done = True
                if z.status(1.0) is None:
                    killed = True
            elif not _drain(fd, bufs[fd], caps[fd], watches.get(fd)):
                open_fds.discard(fd)
                os.close(fd)
    for fd in open_fds:
        os.close(fd)
    if not mon_done and z.alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        z.status(2.0)
    wall = time.monotonic() - t0
    import shutil

    shutil.rmtree(wd, ignore_errors=True)
    try:
        meta = json.loads(bytes(bufs[meta_r]))
    except ValueError:
        meta = None
    result = bytes(bufs[res_r]) or None
    if not isinstance(meta, dict):  # monitor died: report the child as killed
        _kill_job(level, cfg["uid"], keep)
        return {
            "result": _b64(result),
            "stdout": _b64(bytes(bufs[out_r])),
            "exit_code": None,
            "signal": 9,
            "timed_out": wall >= timeout,
            "files": {},
            "wall_s": wall,
            "limit": "timeout" if wall >= timeout else "server",
            "seen": watches[out_r].seen,
        }
    return _result(
        bytes(bufs[out_r]), result or b"", meta["status"], meta["limit"], meta["files"], wall, watches[out_r].seen
    )


def _enter_user_ns(cfg: dict) -> None:
    """New user namespace whose root maps to an unprivileged host uid: our own uid, or the slot uid if we are root
    (so that the job's "root" never owns the host's root-owned files, e.g. /proc/sysrq-trigger)."""
    if os.geteuid() != 0:
        uid, gid = os.geteuid(), os.getegid()
        _ok(_c().unshare(CLONE_NEWUSER), "unshare user ns")
        for path, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{path}", "w") as f:
                f.write(text)
        return
    # Root: mapping another uid needs CAP_SETUID in the parent namespace, so a helper left outside writes the maps.
    os.setgroups([])
    r, w = os.pipe()
    h = os.fork()
    if h == 0:
        code = 1
        try:
            os.close(w)
            os.read(r, 1)
            me = os.getppid()
            for path, text in (
                ("setgroups", "deny"),
                ("uid_map", f"0 {cfg['uid']} 1"),
                ("gid_map", f"0 {cfg['gid']} 1"),
            ):
                with open(f"/proc/{me}/{path}", "w") as f:
                    f.write(text)
            code = 0
        finally:
            _hard_exit(code)
    os.close(r)
    _ok(_c().unshare(CLONE_NEWUSER), "unshare user ns")
    os.write(w, b"x")
    os.close(w)
    if os.waitpid(h, 0)[1] != 0:
        raise OSError("could not write the user namespace's uid/gid maps")


def _server_main(cfg_json: str) -> None:
    """Fork server: set up the isolation level once, preload imports, then run jobs one at a time."""
    import importlib

    cfg = json.loads(cfg_json)
    level = cfg["level"]
    # Protocol on private fds; 0 and 1 become /dev/null so nothing else can write into the protocol stream.
    pin, pout = os.dup(0), os.dup(1)
    nul = os.open("/dev/null", os.O_RDWR)
    os.dup2(nul, 0)
    os.dup2(nul, 1)
    os.close(nul)
    cfg["_proto_in"], cfg["_proto_out"] = pin, pout
    base = None
    try:
        for m in PRELOAD:
            importlib.import_module(m)
        import resource  # noqa: F401  (used by the child)

        _c()  # ctypes, loaded while the prefix is still readable
        if "namespaces" in level:
            if level == "namespaces":
                _enter_user_ns(cfg)
            _ok(
                _c().unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC),
                "unshare mount/net/pid/uts/ipc ns",
            )
            inner = os.fork()
            if inner:  # outer shell: only waits, so the parent's handle (this pid) dies with the real server
                for fd in (pin, pout):
                    os.close(fd)
                _, st = os.waitpid(inner, 0)
                _hard_exit(os.waitstatus_to_exitcode(st) & 0xFF)
            _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
            _mount(None, "/", None, MS_REC | MS_PRIVATE)
            srcs = _root_sources()  # must be opened in this mount namespace, with the caller's file access
            if level == "namespaces":  # from now on: ns-root = an unprivileged host uid
                os.setresgid(0, 0, 0)
                os.setresuid(0, 0, 0)
            _build_root(srcs)
            # This process is PID 1 of the namespace every job runs in: a fresh /proc shows only us and the job.
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        else:
            _prctl(PR_SET_CHILD_SUBREAPER, 1)
            base = tempfile.mkdtemp(prefix="pg_sandbox_")
            os.chmod(base, 0o711)
        import gc
        import socket  # noqa: F401  (the zygote's channel)

        seccomp_err = _seccomp_prepare()
        cfg["seccomp"] = seccomp_err is None
        cfg["ipc_ns"] = "namespaces" in level or os.geteuid() == 0  # needs CAP_SYS_ADMIN in the child's user ns
        gc.collect()
        gc.freeze()  # preloaded objects go to the permanent generation: a child's gc never walks (or dirties) them
        z = _Zygote(cfg)  # before the first request: every execution is forked from this clean copy
        _send(
            pout,
            {
                "ok": True,
                "level": level,
                "pid": os.getpid(),
                "zygote": z.pid,
                "seccomp": seccomp_err,
                "ipc_ns": cfg["ipc_ns"],
            },
        )
    except Exception as e:
        _send(pout, {"ok": False, "error": f"{type(e).__name__}: {e}"})
        _hard_exit(3)
    n = 0
    try:
        while (req := _recv(pin)) is not None:
            n += 1
            res = _run_job_ns(cfg, req, z) if base is None else _run_job(cfg, req, base, n, z)
            del req
            res["restart"] = not z.alive  # the job killed the zygote: the parent starts a fresh server
            _send(pout, res)
            if not z.alive:
                break
    except (BrokenPipeError, ConnectionError):
        pass
    finally:
        if base is not None:
            import shutil

            shutil.rmtree(base, ignore_errors=True)
    _hard_exit(0)


# ---------------------------------------------------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------------------------------------------------

_SERVER_BOOT = (
    "import importlib.util as u,sys;s=u.spec_from_file_location('_pg_sandbox_server',sys.argv[1]);"
    "m=u.module_from_spec(s);sys.modules[s.name]=m;s.loader.exec_module(m);m._server_main(sys.argv[2])"
)


class _ServerDied(Exception):
    pass


def _child_path() -> str:
    return ":".join(dict.fromkeys([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"]))


class _Server:
    """One fork-server process and its protocol pipes; used by one thread at a time."""

    def __init__(self, cfg: dict):
        env = {"PATH": _child_path(), "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}  # scrubbed: no secrets inherited
        self.proc = subprocess.Popen(
            [sys.executable, "-s", "-c", _SERVER_BOOT, os.path.abspath(__file__), json.dumps(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd="/",
            close_fds=True,
            start_new_session=True,
            bufsize=0,
        )
        self.cfg = cfg
        self.restart = False

    def handshake(self, timeout: float = 30.0) -> dict:
        hs = self._read(timeout) or {"ok": False, "error": "server exited during start-up"}
        self.zygote = hs.get("zygote")  # pid in the server's PID namespace
        return hs

    def idle_pids(self) -> set[int]:
        """Host pids of this server's own processes (outer shell, inner server, zygote): anything else is a job's."""
        out, todo = {self.proc.pid}, [self.proc.pid]
        while todo:
            for c in _children(todo.pop()):
                try:
                    with open(f"/proc/{c}/status") as f:
                        nspid = [line.split()[1:] for line in f if line.startswith("NSpid:")][0]
                except (OSError, IndexError):
                    continue
                if len(nspid) > 1 and nspid[-1] == "1" or int(nspid[-1]) == self.zygote:
                    out.add(c)
                    todo.append(c)
        return out

    def _read(self, timeout: float) -> dict | None:
        """One framed message, or None on EOF; raises _ServerDied past `timeout` seconds."""
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout

        def exact(n: int) -> bytes | None:
            buf = bytearray()
            while len(buf) < n:
                rem = deadline - time.monotonic()
                if rem <= 0 or not select.select([fd], [], [], rem)[0]:
                    raise _ServerDied("fork server did not answer in time")
                chunk = os.read(fd, min(n - len(buf), 1 << 20))
                if not chunk:
                    return None
                buf += chunk
            return bytes(buf)

        hdr = exact(8)
        body = None if hdr is None else exact(struct.unpack("<Q", hdr)[0])
        return None if body is None else json.loads(body)

    def call(self, spec: ExecSpec) -> RawResult:
        try:
            _send(
                self.proc.stdin.fileno(),
                {"source": spec.source, "timeout_s": spec.timeout_s, "watch": list(spec.watch)},
            )
            r = self._read(spec.timeout_s + 3.0)
        except (OSError, ValueError) as e:
            raise _ServerDied(str(e)) from e
        if r is None:
            raise _ServerDied("fork server exited")
        self.restart = bool(r.get("restart"))
        return RawResult(
            result=_unb64(r["result"]),
            stdout=_unb64(r["stdout"]),
            exit_code=r["exit_code"],
            signal=r["signal"],
            timed_out=r["timed_out"],
            files={k: _unb64(v) for k, v in r["files"].items()},
            wall_s=r["wall_s"],
            limit=r["limit"],
            seen=tuple(r.get("seen", ())),
        )

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        self.proc.wait()

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # EOF: the server exits after its current job
            self.proc.wait(timeout=2.0)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


def _config(
    level: str, uid: int, mem_mb: int, stdout_cap: int, nproc: int, fsize_mb: int, tmp_mb: int, job_mem_mb: int
) -> dict:
    if level == "namespaces":  # per-(user namespace, uid) process counting only exists since Linux 5.14
        rel = tuple(int(x) for x in os.uname().release.split(".")[:2] if x.isdigit())
        rl_nproc = nproc + 4 if rel >= (5, 14) else 0
    else:
        rl_nproc = nproc if level in ("namespaces+uid", "uid") else 0
    return dict(
        level=level,
        uid=uid,
        gid=uid,
        mem_mb=mem_mb,
        stdout_cap=stdout_cap,
        nproc=rl_nproc,
        nproc_watch=nproc,
        fsize_mb=fsize_mb,
        tmp_mb=tmp_mb,
        job_mem_mb=job_mem_mb,
        path=_child_path(),
    )


def _uid_base(concurrency: int) -> int:
    """A random block of unprivileged uids, one per slot, so two sandboxes on one machine never share a uid."""
    import secrets

    if concurrency > 1024:
        raise ValueError(f"concurrency={concurrency} is more than 1024 slots; use fewer fork servers")
    return 200_000_000 + secrets.randbelow(1 << 20) * 1024


_PROBE = r"""
import json, os, socket
rep = {"uid": os.getuid(), "pid": os.getpid()}
try:
    with open("/proc/self/status") as f:
        rep["cap_eff"] = int([l for l in f if l.startswith("CapEff")][0].split()[1], 16)
except Exception as e:
    rep["cap_eff"] = repr(e)
rep["ifaces"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:])
with open("/proc/self/status") as f:
    rep["seccomp"] = [l.split()[1] for l in f if l.startswith("Seccomp:")][0]
try:
    socket.create_connection(("127.0.0.1", 9), timeout=0.5).close()
    rep["net"] = "connected"
except OSError as e:
    rep["net"] = e.errno
try:
    open("/pg_sandbox_probe", "w").close()
    rep["root_writable"] = True
except OSError:
    rep["root_writable"] = False
rep["root_ls"] = sorted(os.listdir("/"))
open("probe.txt", "w").write("ok")
os.write(3, json.dumps(rep).encode())
"""


def _probe_ok(level: str, r: RawResult) -> str | None:
    """None if the probe run shows the level's guarantees hold, else what is wrong."""
    if r.result is None:
        return f"probe reported nothing (exit {r.exit_code}, signal {r.signal}): {r.stdout[-300:]!r}"
    rep = json.loads(r.result)
    if r.files.get("probe.txt") != b"ok":
        return "working-dir file not returned"
    if level in ("namespaces+uid", "uid") and rep["uid"] == 0:
        return "child still runs as root"
    if "namespaces" in level:
        checks = {
            "pid": 2 <= rep["pid"] <= 8,  # a fresh PID namespace: the server is 1, then its zygote, then the job
            "seccomp": rep["seccomp"] == "2" or not _seccomp_expected(),
            "caps": rep["cap_eff"] == 0,
            "net": rep["ifaces"] == ["lo"] and rep["net"] != "connected",
            "ro": not rep["root_writable"],
            "hide": set(rep["root_ls"]) <= _skeleton_names(),
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            return f"probe failed checks {bad}: {rep}"
    return None


def _seccomp_expected() -> bool:
    return seccomp_program(os.uname().machine) is not None


def _skeleton_names() -> set[str]:
    """Top-level names the namespaced root may contain: the skeleton plus the first component of Python's prefixes."""
    names = {
        "usr",
        "etc",
        "bin",
        "sbin",
        "lib",
        "lib64",
        "lib32",
        "libx32",
        "dev",
        "proc",
        "tmp",
        "var",
        "root",
        "home",
    }
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable)):
        for q in (p, os.path.realpath(p)):
            names.add(q.strip("/").split("/")[0])
    return names


_detected: dict[str, str] = {}
_detect_lock = threading.Lock()


def detect_isolation() -> str:
    """Strongest level that actually works here, found by starting a throwaway server per level and probing it."""
    with _detect_lock:
        if "level" in _detected:
            return _detected["level"]
        why = {}
        for level in LEVELS:
            if level == "rlimits":
                chosen = level
                break
            err = _try_level(level)
            if err is None:
                chosen = level
                break
            why[level] = err
            log.info("sandbox: isolation %r unavailable: %s", level, err)
        _detected["level"], _detected["why"] = chosen, "; ".join(f"{k}: {v}" for k, v in why.items())
        return chosen


def _try_level(level: str) -> str | None:
    if level in ("namespaces+uid", "uid") and os.geteuid() != 0:
        return "needs root"
    srv = _Server(_config(level, _uid_base(1), 1024, 65536, 64, 16, 16, 2048))
    try:
        hs = srv.handshake()
        if not hs.get("ok"):
            return hs.get("error", "start-up failed")
        return _probe_ok(level, srv.call(ExecSpec(_PROBE, 5.0)))
    except _ServerDied as e:
        return str(e)
    finally:
        srv.close()


class Sandbox:
    """Pool of `concurrency` fork servers; `run` executes specs in parallel and returns results in spec order.

    Args:
        concurrency: fork servers = executions in flight at once.
        mem_mb: RLIMIT_AS of the child process.
        stdout_cap: bytes of stdout+stderr kept (the rest is drained and dropped).
        isolation: "auto" (strongest level that works, see `detect_isolation`) or one of `LEVELS` (raises if that
            level cannot be set up here).
        nproc: most processes/threads one job may have (RLIMIT_NPROC of the slot uid; watchdog in namespaces).
        fsize_mb: RLIMIT_FSIZE. tmp_mb: size of the job's private /tmp (namespaced levels).
        job_mem_mb: resident memory of all the job's processes together before the watchdog kills it (namespaces).
    """

    def __init__(
        self,
        concurrency: int = 2,
        mem_mb: int = 1024,
        stdout_cap: int = 65536,
        isolation: str = "auto",
        nproc: int = 64,
        fsize_mb: int = 16,
        tmp_mb: int = 64,
        job_mem_mb: int | None = None,
    ):
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if isolation != "auto" and isolation not in LEVELS:
            raise ValueError(f"unknown isolation {isolation!r}; expected 'auto' or one of {LEVELS}")
        self.concurrency, self.mem_mb, self.stdout_cap = concurrency, mem_mb, stdout_cap
        self._closed, self._pool, self._servers = False, None, []
        self.isolation = detect_isolation() if isolation == "auto" else isolation
        uid0 = _uid_base(concurrency)
        own_uid = self.isolation in ("namespaces+uid", "uid") or (self.isolation == "namespaces" and os.geteuid() == 0)
        self.uids = tuple(uid0 + i for i in range(concurrency)) if own_uid else ()  # host uids of the jobs
        self._cfgs = [
            _config(
                self.isolation,
                uid0 + i,
                mem_mb,
                stdout_cap,
                nproc,
                fsize_mb,
                tmp_mb,
                job_mem_mb or max(2 * mem_mb, 2048),
            )
            for i in range(concurrency)
        ]
        self._servers: list[_Server | None] = [_Server(c) for c in self._cfgs]
        for s in self._servers:
            hs = s.handshake()
            if not hs.get("ok"):
                self.close()
                raise RuntimeError(
                    f"sandbox isolation {self.isolation!r} cannot be set up here: {hs.get('error')}; "
                    "use isolation='auto'"
                )
        self.seccomp = hs.get("seccomp") is None
        if not self.seccomp:
            log.warning(
                "sandbox: no seccomp filter (%s). Not protected: kernel keyrings, SysV IPC, memfd, namespace "
                "creation, io_uring, vsock/netlink sockets are open to executions",
                hs.get("seccomp"),
            )
        if not hs.get("ipc_ns"):
            log.warning("sandbox: no per-execution IPC namespace (needs root): SysV IPC is shared by the jobs")
        if self.isolation == LEVELS[0]:
            log.info("sandbox: isolation %s (%d fork servers)", self.isolation, concurrency)
        else:
            why = _detected.get("why") if isolation == "auto" else f"isolation={isolation!r} requested"
            log.warning(
                "sandbox: OS isolation reduced to %r (%s). Not protected: %s",
                self.isolation,
                why,
                _MISSING[self.isolation],
            )
        self._free: queue.Queue[int] = queue.Queue()
        for i in range(concurrency):
            self._free.put(i)
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="sandbox")

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_servers", None) is not None:
            self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for i, s in enumerate(self._servers):
            if s is not None:
                s.close()
                self._servers[i] = None

    @property
    def server_pids(self) -> tuple[int, ...]:
        return tuple(s.proc.pid for s in self._servers if s is not None)

    def idle_pids(self) -> set[int]:
        """Host pids of the servers' own processes (no job's): for containment checks."""
        return set().union(*(s.idle_pids() for s in self._servers if s is not None))

    def run(self, specs: list[ExecSpec], progress: bool = False) -> list[RawResult]:
        if self._closed:
            raise RuntimeError("sandbox is closed")
        futs = [self._pool.submit(self._run_one, s) for s in specs]
        if progress:
            from concurrent.futures import as_completed

            from projected_grpo.common.log import progress as progress_display

            for _ in progress_display(as_completed(futs), "sandbox", total=len(futs)):
                pass
        return [f.result() for f in futs]

    def _run_one(self, spec: ExecSpec) -> RawResult:
        i = self._free.get()
        try:
            srv = self._servers[i]
            if srv is None or srv.proc.poll() is not None:  # dead server: restart transparently
                if srv is not None:
                    srv.kill()
                srv = self._servers[i] = self._start(i)
            t0 = time.monotonic()
            try:
                r = srv.call(spec)
                if srv.restart:  # its zygote is gone: the next job on this slot gets a fresh server
                    srv.kill()
                    self._servers[i] = None
                return r
            except _ServerDied as e:
                log.warning("sandbox: fork server %d died during a job (%s); restarting it", i, e)
                srv.kill()
                self._servers[i] = None  # restarted lazily by the next job on this slot
                return RawResult(None, b"", None, signal.SIGKILL, False, {}, time.monotonic() - t0, "server")
        finally:
            self._free.put(i)

    def _start(self, i: int) -> _Server:
        s = _Server(self._cfgs[i])
        hs = s.handshake()
        if not hs.get("ok"):
            s.kill()
            raise RuntimeError(f"could not restart fork server {i}: {hs.get('error')}")
        return s


# ---------------------------------------------------------------------------------------------------------------------
# Upstream-like baseline: a fresh `python -c` per execution (for the throughput benchmark)
# ---------------------------------------------------------------------------------------------------------------------

_BASELINE_BOOT = (
    "import builtins,sys\n"
    "src=sys.stdin.read()\n"
    "exec(compile(src,'<harness>','exec'),{'__builtins__':builtins,'__name__':'__sandbox__'})\n"
)


def run_python_c_baseline(
    specs: list[ExecSpec], concurrency: int, mem_mb: int = 1024, stdout_cap: int = 65536
) -> list[RawResult]:
    """Upstream's way: `python -c <boot>` per execution, source on stdin, rlimits in preexec, kill after timeout."""
    from concurrent.futures import ThreadPoolExecutor

    def one(spec: ExecSpec) -> RawResult:
        import resource

        def pre() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (mem_mb << 20, mem_mb << 20))
            cpu = math.ceil(spec.timeout_s) + 1
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
            os.dup2(res.fileno(), 3)  # close_fds=False: fd 3 need not be open in the parent (res may be fd 3)
            os.set_inheritable(3, True)

        with tempfile.TemporaryDirectory() as wd, tempfile.TemporaryFile() as res:
            t0 = time.monotonic()
            p = subprocess.Popen(
                [sys.executable, "-c", _BASELINE_BOOT],
                cwd=wd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                close_fds=False,
                preexec_fn=pre,
                start_new_session=True,
            )
            timed_out = False
            try:
                out, _ = p.communicate(spec.source.encode(), timeout=spec.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(p.pid, signal.SIGKILL)
                out, _ = p.communicate()
            wall = time.monotonic() - t0
            res.seek(0)
            result = res.read(RESULT_CAP)
            files = {}
            for name in sorted(os.listdir(wd))[:MAX_FILES]:
                path = os.path.join(wd, name)
                if os.path.isfile(path) and not os.path.islink(path):
                    with open(path, "rb") as f:
                        files[name] = f.read(FILE_CAP)
            rc = p.returncode
            return RawResult(
                result=result or None,
                stdout=out[:stdout_cap],
                exit_code=rc if rc >= 0 else None,
                signal=-rc if rc < 0 else None,
                timed_out=timed_out,
                files=files,
                wall_s=wall,
                limit="timeout" if timed_out else None,
            )

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, specs))

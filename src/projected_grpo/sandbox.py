"""Isolated execution of untrusted Python (STUB: simple subprocess per execution; to be replaced by the fork server).

Contract (the grader relies on exactly this):
- `ExecSpec.source` is trusted harness source text. The child runs it as
  `exec(compile(source, "<harness>", "exec"), {"__builtins__": builtins, "__name__": "__sandbox__"})`
  in a fresh, empty temporary working directory, stdin closed.
- The harness reports its result by writing bytes to file descriptor 3 (`os.write(3, ...)`); `RawResult.result`
  holds those bytes (None if nothing was written, e.g. the process exited or was killed before).
- stdout (and stderr) of the child are captured and capped; files left at the top of the working dir are returned.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

_BOOT = (
    "import builtins,sys\n"
    "src=open(sys.argv[1]).read()\n"
    "exec(compile(src,'<harness>','exec'),{'__builtins__':builtins,'__name__':'__sandbox__'})\n"
)


@dataclass(frozen=True)
class ExecSpec:
    source: str
    timeout_s: float


@dataclass(frozen=True)
class RawResult:
    result: bytes | None
    stdout: bytes
    exit_code: int | None
    signal: int | None
    timed_out: bool
    files: dict[str, bytes] = field(default_factory=dict)
    wall_s: float = 0.0


class Sandbox:
    def __init__(self, concurrency: int = 2, mem_mb: int = 1024, stdout_cap: int = 65536, isolation: str = "auto"):
        self.concurrency, self.mem_mb, self.stdout_cap = concurrency, mem_mb, stdout_cap
        self.isolation = "rlimits"

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        pass

    def run(self, specs: list[ExecSpec], progress: bool = False) -> list[RawResult]:
        return [self._run_one(s) for s in specs]

    def _run_one(self, spec: ExecSpec) -> RawResult:
        with tempfile.TemporaryDirectory() as d:
            prog = Path(d) / ".harness.py"
            prog.write_text(spec.source)
            work = Path(d) / "w"
            work.mkdir()
            r, w = os.pipe()
            t0 = time.perf_counter()

            def pre() -> None:
                os.dup2(w, 3)

            p = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(prog)], cwd=work, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=(w,), preexec_fn=pre,
                start_new_session=True,
            )  # fmt: skip
            os.close(w)
            timed_out = False
            try:
                out, _ = p.communicate(timeout=spec.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(p.pid, 9)
                out, _ = p.communicate()
            res = b""
            while chunk := os.read(r, 65536):
                res += chunk
            os.close(r)
            files = {f.name: f.read_bytes()[:4096] for f in work.iterdir() if f.is_file()}
            rc = p.returncode
            return RawResult(
                result=res or None, stdout=out[: self.stdout_cap], exit_code=rc if rc >= 0 else None,
                signal=-rc if rc < 0 else None, timed_out=timed_out, files=files, wall_s=time.perf_counter() - t0,
            )  # fmt: skip

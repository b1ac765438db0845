"""`python -m projected_grpo.repro -j 2`: `dvc repro`, with independent stages run side by side.

`dvc repro` runs one stage at a time, and most stages here use one core (GRPO, evaluation: `threads: 1`), so on a
2-core machine half of it idles. This runs the same stages, each as `dvc --wait-for-lock repro -s <stage>` in its own
process (DVC releases its repository lock while a stage's command runs and records each stage in dvc.lock as it
ends), up to `--jobs` at once, a stage only after every stage it depends on. Nothing about a stage changes: the
same command, the same per-stage caching and `dvc.lock` entries, the same outputs (each stage's thread counts are
fixed by params, so its numbers do not depend on what runs beside it). Which stages are tried is what `dvc repro`
would look at: those `dvc status` reports changed and everything downstream of them (with TARGETS: only what they
need); a downstream stage whose inputs turn out unchanged is skipped by DVC as `dvc repro` skips it.
Each stage's output goes to `logs/repro/<stage>.log` (another pipeline file's stages: `--pipeline`, their path
flattened: `logs/repro/confirm-dvc.yaml:<stage>.log`); on a failure no new stage starts, the running ones finish,
and the command exits 1 naming the stage and its log.

Ready stages closest to the end start first (`run_stages`), so a stopped run leaves whole chains. `--fresh-machine`
continues a run on a machine without the DVC cache of its finished stages (no remote): it runs the stages the lock
file lacks, and rebuilds the locked upstream they need (`to_resume`), failing when one comes out other than the
lock recorded it (pull such stages from a remote instead: `dvc-store/README.md`). `--commit` commits the lock file
and each stage's git-tracked outputs as the stage finishes (`commit_stage`). `--push REMOTE` pushes the outputs of
the stages `--push-stages` names to a DVC remote as each finishes; a remote kept in the repository (`dvc-store/`) is
committed with the stage.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

import typer
import yaml


def closure(start: set[str], edges: dict[str, set[str]]) -> set[str]:
    """Every node reachable from `start` along `edges` (start included)."""
    seen, todo = set(), list(start)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += edges.get(n, ())
    return seen


def to_run(deps: dict[str, set[str]], changed: set[str], targets: set[str] | None) -> set[str]:
    """Stages `dvc repro [TARGETS]` would run: changed ones and their descendants, within the targets' ancestry."""
    down: dict[str, set[str]] = {n: set() for n in deps}
    for n, ds in deps.items():
        for d in ds:
            down.setdefault(d, set()).add(n)
    run = closure(changed & set(deps), down)
    return run if targets is None else run & closure(targets, deps)


def to_resume(deps: dict[str, set[str]], locked: set[str], missing: set[str]) -> set[str]:
    """Stages to run on a machine without the DVC cache of the locked ones (`--fresh-machine`): every stage without a
    lock entry, and each locked stage whose outputs one of those needs and this workspace lacks, walking up from
    the unlocked stages through missing outputs only. A locked stage whose outputs are here (git-tracked reports,
    e.g. an evaluation) stops the walk: what reads it reads the file, not the stages behind it."""
    seen, todo = set(), [n for n in deps if n not in locked]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += [d for d in deps[n] if d not in locked or d in missing]
    return seen


def run_stages(
    deps: dict[str, set[str]],
    todo: set[str],
    jobs: int,
    run_one: Callable[[str], int],
    on_event: Callable[[str, str], None] = lambda stage, what: None,
) -> list[str]:
    """Run `todo` (a subset of `deps`' keys; deps: stage -> the stages it reads) with `run_one` (returns an exit
    status), at most `jobs` at once, each after the stages of `todo` it depends on. Of the ready stages, the one
    closest to the end (the shortest longest-path to a stage nothing in `todo` reads) starts first, then the one
    with the most stages waiting behind it. So a finished training's evaluation starts before the next training,
    and one draw's chain is done before the next draw's organism: a run stopped part way has finished whole chains
    (train + evaluate), whose results are in git, rather than many trainings whose checkpoints live only in one
    machine's cache. Returns the failed stages (after a failure nothing new starts)."""
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    down: dict[str, set[str]] = {n: set() for n in todo}
    for n in todo:
        for d in deps[n] & todo:
            down[d].add(n)
    weight = {n: len(closure({n}, down)) for n in todo}
    height: dict[str, int] = {}

    def to_end(n: str) -> int:  # the longest path of todo stages from n to one nothing reads
        if n not in height:
            height[n] = 1 + max((to_end(c) for c in down[n]), default=-1)
        return height[n]

    done: set[str] = set()
    failed: list[str] = []
    running: dict[Future, str] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        while True:
            started = set(running.values())
            ready = sorted(
                (n for n in todo - done - started if not failed and deps[n] & todo <= done),
                key=lambda n: (to_end(n), -weight[n], n),
            )
            for n in ready[: jobs - len(running)]:
                on_event(n, "start")
                running[pool.submit(run_one, n)] = n
            if not running:
                break
            for f in wait(running, return_when=FIRST_COMPLETED).done:
                n = running.pop(f)
                if f.result() == 0:
                    done.add(n)
                    on_event(n, "done")
                else:
                    failed.append(n)
                    on_event(n, "failed")
    return failed


def log_name(stage: str) -> str:
    """A stage's log file name under logs/repro/: its DVC name, a pipeline file's path flattened
    (`confirm/dvc.yaml:train@0-route-101` -> `confirm-dvc.yaml:train@0-route-101.log`)."""
    return stage.replace("/", "-") + ".log"


def dag(root: Path, pipeline: str = "dvc.yaml", fresh: bool = False) -> tuple[dict[str, set[str]], set[str]]:
    """(deps, todo): every stage of the pipeline file `pipeline` (matrix members expanded) with the stages it reads
    there, and the stages to look at: those `dvc status` reports changed (`fresh`: `to_resume`'s, from the lock file
    and which outputs exist). Another pipeline's stages (confirm/dvc.yaml) are not this one's: `dvc repro` of
    dvc.yaml never runs them."""
    from dvc.repo import Repo

    with contextlib.chdir(root), Repo(str(root)) as repo:  # DVC names stages relative to the working directory
        g = repo.index.graph  # edges: stage -> the stages it depends on
        mine = {s for s in g.nodes if Path(s.dvcfile.path).resolve() == (root / pipeline).resolve()}
        deps = {s.addressing: {d.addressing for d in g.successors(s) if d in mine} for s in mine}
        if not fresh:
            return deps, set(repo.status(targets=[pipeline])) & set(deps)
        entries = locked_outs(root / Path(pipeline).with_suffix(".lock"))
        locked = {s.addressing for s in mine if s.name in entries}
        missing = {s.addressing for s in mine if not all(o.exists for o in s.outs)}
    return deps, to_resume(deps, locked, missing)


def locked_outs(lock: Path) -> dict[str, dict[str, str]]:
    """{stage name: {output path: its recorded hash}} from a lock file (empty when there is none)."""
    entries = ((yaml.safe_load(lock.read_text()) if lock.exists() else None) or {}).get("stages", {})
    return {n: {o["path"]: o.get("md5", "") for o in e.get("outs", [])} for n, e in entries.items()}


def stage_outs(root: Path, pipeline: str) -> dict[str, list[str]]:
    """{stage: its outputs' paths relative to `root`} for the pipeline file `pipeline`'s stages."""
    from dvc.repo import Repo

    with contextlib.chdir(root), Repo(str(root)) as repo:
        return {
            s.addressing: [str(Path(o.fs_path).relative_to(root)) for o in s.outs]
            for s in repo.index.stages
            if Path(s.dvcfile.path).resolve() == (root / pipeline).resolve()
        }


def git(root: Path, *args: str) -> subprocess.CompletedProcess:
    """`git *args` in `root`, retried for a few seconds while another git command holds the index."""
    for _ in range(20):
        r = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        if r.returncode == 0 or "index.lock" not in r.stderr:
            return r
        time.sleep(0.5)
    return r


def commit_stage(root: Path, lock: str, outs: list[str], stage: str, extra: tuple[str, ...] = ()) -> str | None:
    """Commit `lock`, those of `stage`'s outputs that git tracks (reports; not the DVC-cached artifacts .gitignore
    excludes) and the `extra` paths (a remote kept in git), only those paths: whatever else is staged stays staged.
    Returns the message, None when they did not change; raises RuntimeError with git's words when git refuses."""
    paths = [lock] + [
        o for o in [*outs, *extra] if (root / o).exists() and git(root, "check-ignore", "-q", o).returncode != 0
    ]
    if (r := git(root, "add", "-A", "--", *paths)).returncode != 0:
        raise RuntimeError(r.stderr.strip())
    if git(root, "diff", "--cached", "--quiet", "--", *paths).returncode == 0:
        return None
    msg = f"{lock} and outputs: {stage} finished (a partly refreshed lock; the run continues; committed by the runner)"
    if (r := git(root, "commit", "-q", "-m", msg, "--only", "--", *paths)).returncode != 0:
        raise RuntimeError(r.stderr.strip())
    return msg


def remote_in_repo(root: Path, remote: str) -> str | None:
    """The path, relative to `root`, of DVC remote `remote` when it is a directory inside the repository (dvc-store/:
    git keeps it, so `--commit` commits what `--push` adds); None for one elsewhere. Raises ValueError when DVC
    knows no such remote."""
    r = subprocess.run(
        [sys.executable, "-m", "dvc", "config", f"remote.{remote}.url"], cwd=root, capture_output=True, text=True
    )
    if r.returncode != 0 or not r.stdout.strip():
        raise ValueError(f"no DVC remote {remote!r} (`dvc remote list` names them)")
    url = r.stdout.strip()
    if "://" in url:
        return None
    path = (root / ".dvc" / url).resolve()  # a relative url is relative to .dvc/config's folder
    return str(path.relative_to(root.resolve())) if path.is_relative_to(root.resolve()) else None


def push_stage(root: Path, remote: str, stage: str) -> str | None:
    """`dvc push -r remote stage`; None when it worked, else DVC's last line."""
    cmd = [sys.executable, "-m", "dvc", "--wait-for-lock", "push", "-q", "-r", remote, stage]
    r = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    return None if r.returncode == 0 else ((r.stderr or r.stdout).strip().splitlines() or ["failed"])[-1]


def main(
    targets: list[str] = typer.Argument(None, help="Stages to bring up to date (default: all), dvc's names."),
    jobs: int = typer.Option(2, "--jobs", "-j", help="Stages at most at once (this machine: 2 cores)."),
    pipeline: str = typer.Option(
        "dvc.yaml", help="The pipeline file: dvc.yaml (the default matrix) or confirm/dvc.yaml (issue 46)."
    ),
    dry: bool = typer.Option(False, "--dry", help="Only print the stages to look at, in a valid order."),
    fresh: bool = typer.Option(
        False,
        "--fresh-machine",
        help="This machine lacks the DVC cache of the stages already in the lock file (a new machine, no remote): run"
        " only the stages without a lock entry, and the locked ones whose outputs those need and this checkout lacks"
        " (upstream stages, rebuilt; one that comes out other than the lock recorded it stops the run). Trusts the"
        " lock: for continuing a run it describes, not for changed code or params.",
    ),
    commit: bool = typer.Option(
        False,
        "--commit",
        help="git-commit the lock file and each stage's git-tracked outputs (its reports) as the stage finishes, one"
        " commit a stage, touching nothing else staged: a run that spans sessions or machines keeps what finished.",
    ),
    push: str = typer.Option(
        None,
        "--push",
        metavar="REMOTE",
        help="dvc-push each finished stage that --push-stages names to this DVC remote (store: dvc-store/, in git;"
        " with --commit it goes into the stage's commit), so a new machine continues on the same bits.",
    ),
    push_stages: str = typer.Option(
        "organism,basis,pool,eval_sets",
        "--push-stages",
        help="With --push: the stages to push, by name before any @, comma-separated (default: the upstream a new"
        " machine cannot rebuild bit for bit; trainings' checkpoints stay out).",
    ),
    no_run_cache: bool = typer.Option(
        False,
        "--no-run-cache",
        help="Passed to each `dvc repro -s`: execute stages even if DVC's run cache holds their outputs (benchmarks).",
    ),
) -> None:
    root = Path.cwd()
    if not (root / "dvc.yaml").exists():
        typer.echo("error: run this in the repository root (no dvc.yaml here)", err=True)
        raise typer.Exit(2)
    if not (root / pipeline).is_file():
        typer.echo(f"error: no pipeline file {pipeline} (dvc.yaml or confirm/dvc.yaml)", err=True)
        raise typer.Exit(2)
    if fresh and targets:
        typer.echo("error: --fresh-machine picks its own stages; name no targets with it", err=True)
        raise typer.Exit(2)
    store = None
    if push:
        try:
            store = remote_in_repo(root, push)
        except ValueError as e:
            typer.echo(f"error: --push: {e}", err=True)
            raise typer.Exit(2) from None
    pushed = {n.strip() for n in push_stages.split(",") if n.strip()}
    from dvc.lock import LockError

    try:
        deps, changed = dag(root, pipeline, fresh)
    except LockError as e:  # `dvc status` cannot read files a running stage holds
        what = str(e).splitlines()[0].split(" is busy")[0]
        typer.echo(f"error: a running DVC stage holds {what}; try again when it has finished", err=True)
        raise typer.Exit(2) from None
    unknown = sorted(set(targets or ()) - set(deps))
    if unknown:
        typer.echo(f"error: unknown stage(s) {unknown}; `dvc stage list --all` names them", err=True)
        raise typer.Exit(2)
    todo = changed if fresh else to_run(deps, changed, set(targets) if targets else None)
    if not todo:
        typer.echo("Data and pipelines are up to date.")
        return
    if dry:
        run_stages(deps, todo, 1, lambda n: 0, lambda n, what: what == "start" and typer.echo(n))
        return
    logs = root / "logs" / "repro"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    t0 = time.monotonic()

    skipped: set[str] = set()

    lock = root / Path(pipeline).with_suffix(".lock")
    names = {st.split(":")[-1] for st in todo}
    before = {n: o for n, o in locked_outs(lock).items() if n in names} if fresh else {}

    def run_one(stage: str) -> int:
        log_path = logs / log_name(stage)
        with open(log_path, "w") as log:
            flags = ["--no-run-cache"] if no_run_cache else []
            cmd = [sys.executable, "-m", "dvc", "--wait-for-lock", "repro", "-s", *flags, stage]
            code = subprocess.run(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        if code == 0 and "didn't change, skipping" in log_path.read_text():
            skipped.add(stage)
        name = stage.split(":")[-1]
        if code == 0 and name in before and (now := locked_outs(lock).get(name)) != before[name]:
            with open(log_path, "a") as log:  # a rebuilt upstream stage must come out as the lock recorded it
                log.write(f"rebuilt, its outputs differ from the lock's: {before[name]} -> {now}\n")
            typer.echo(
                f"error: {stage} was rebuilt with other outputs than the lock's; the finished stages that read it"
                " used the old ones (git diff the lock file; another machine need not rebuild it bitwise: pull it)",
                err=True,
            )
            return 3
        return code

    outs = stage_outs(root, pipeline) if commit else {}

    def event(stage: str, what: str) -> None:
        what = "skip" if what == "done" and stage in skipped else what
        typer.echo(f"[{time.monotonic() - t0:7.0f} s] {what:6s} {stage}")
        name = stage.split(":")[-1]
        if push and what == "done" and name.split("@")[0] in pushed:
            if err := push_stage(root, push, stage):  # the run goes on; push it by hand later
                typer.echo(f"warning: could not push {stage} to {push}: {err}", err=True)
            else:
                typer.echo(f"[{time.monotonic() - t0:7.0f} s] push   {stage}")
        if commit and what == "done":
            extra = (store,) if store else ()
            try:
                msg = commit_stage(root, str(Path(pipeline).with_suffix(".lock")), outs[stage], name, extra)
            except RuntimeError as e:  # the run goes on; the lock and reports stay for a manual commit
                typer.echo(f"warning: could not commit {stage}: {e}", err=True)
            else:
                if msg:
                    typer.echo(f"[{time.monotonic() - t0:7.0f} s] commit {stage}")

    typer.echo(f"{len(todo)} stage(s) to look at, up to {jobs} at once; logs in {logs.relative_to(root)}/")
    failed = run_stages(deps, todo, jobs, run_one, event)
    if failed:
        typer.echo(f"error: stage {failed[0]} failed; see logs/repro/{log_name(failed[0])}", err=True)
        raise typer.Exit(1)
    typer.echo(
        f"done: {len(todo) - len(skipped)} stage(s) ran, {len(skipped)} unchanged, in {time.monotonic() - t0:.0f} s"
    )


if __name__ == "__main__":
    typer.run(main)

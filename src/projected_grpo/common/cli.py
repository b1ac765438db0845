"""Stage entry points: a typer CLI whose user errors end as one line on stderr (exit 2), with no partial outputs.

Every stage script builds `app = stage_app(main, outputs=(...))`, where `outputs` names the parameters of `main`
that are paths the stage writes. If `main` raises, each of those paths that did not exist before the call is
removed, so a failed stage leaves nothing half-written for DVC or the next stage to pick up. A user error (a bad
params value or key, an unknown arm, a missing input file, a prompt over the length cap: ValueError, KeyError,
OSError) prints `error: <what to fix>` and exits with 2. Anything else is a bug and keeps its traceback. Set
PROJECTED_GRPO_TRACEBACK=1 to get the traceback of a user error too.

Resumable outputs (train's checkpoints and log, DVC `persist`) are deliberately not listed: a killed or failed run
resumes from them when the stage is re-run.
"""

from __future__ import annotations

import ast
import functools
import inspect
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import typer

USER_ERRORS = (ValueError, KeyError, OSError)


def message(e: BaseException) -> str:
    """One line: the exception's message (KeyError's without the quotes repr adds), newlines folded."""
    text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    return " ".join(text.split()) or type(e).__name__


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def guarded(main: Callable, outputs: tuple[str, ...] = ()) -> Callable:
    """`main` with the contract above: fresh `outputs` removed on any exception, user errors as one line + exit 2."""
    sig = inspect.signature(main)
    unknown = set(outputs) - set(sig.parameters)
    if unknown:
        raise TypeError(f"{main.__module__}.main has no parameter(s) {sorted(unknown)}")

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        paths = [Path(bound.arguments[n]) for n in outputs if bound.arguments.get(n) is not None]
        fresh = [q for q in paths if not q.exists()]
        try:
            return main(*args, **kwargs)
        except Exception as e:
            for q in fresh:
                remove(q)
            if isinstance(e, USER_ERRORS) and not os.environ.get("PROJECTED_GRPO_TRACEBACK"):
                typer.echo(f"error: {message(e)}", err=True)
                raise typer.Exit(2) from None
            raise

    return wrapped


def stage_app(main: Callable, outputs: tuple[str, ...] = ()) -> typer.Typer:
    """The stage's typer app: the module-level `app` of every stage script (tests invoke it with CliRunner)."""
    a = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    a.command(help=inspect.getmodule(main).__doc__)(guarded(main, outputs))
    return a


def _main() -> None:
    """`python -m projected_grpo.common.cli`: what the stage entry points are and where they live."""
    stages = Path(__file__).resolve().parents[3] / "stages"  # src/projected_grpo/common/cli.py -> the repository
    names = sorted(p.stem for p in stages.glob("*.py") if p.stem != "__init__") if stages.is_dir() else []
    app = typer.Typer(add_completion=False, help=__doc__)

    @app.command()
    def stages_list() -> None:
        """List the pipeline's stage scripts (one per dvc.yaml stage) with what each does; each answers
        `PYTHONPATH=src python stages/<name>.py --help`."""
        if not names:
            typer.echo("no stages/ directory next to this package (installed without the repository)", err=True)
            raise typer.Exit(1)
        for n in names:
            doc = ast.get_docstring(ast.parse((stages / f"{n}.py").read_text())) or ""
            typer.echo(f"stages/{n}.py".ljust(28) + doc.split("\n")[0])

    app()


if __name__ == "__main__":
    _main()

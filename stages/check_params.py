"""Stage `check_params`: validate params.yaml before any other stage runs (every stage is downstream of this one).

DVC deletes a stage's outputs just before running its command, so a bad value caught by the first stage that reads
it would already have cost that stage's committed outputs. This stage reads every key first and, on a bad one,
stops `dvc repro` with one line (`error: …`, exit 2) while every other output is still intact. Its output is
constant, so a params change re-runs only the stages that read the changed keys.
"""

from pathlib import Path

import typer

from projected_grpo.common.cli import stage_app
from projected_grpo.config import check_params
from projected_grpo.method.arms import check_matrix, matrix, run_params

STAMP = "params.yaml passed stages/check_params.py\n"  # constant: downstream stages never re-run because of it


def main(
    out: Path = typer.Option(..., help="Stamp file written when the params are valid (constant content)."),
    params: Path = typer.Option(Path("params.yaml"), help="Params file to validate."),
) -> None:
    p = check_params(params)
    check_matrix(p)  # the arm table's rules, each list's names in it, once each, in the right list
    every = matrix(p)
    for a in every:
        run_params(p, a)  # each run's params (masked-only keys neutral for other rules) are valid
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(STAMP)
    typer.echo(f"check_params: {params} is valid ({len(every)} arms x {len(p.seeds)} seeds)")


app = stage_app(main, outputs=("out",))

if __name__ == "__main__":
    app()

"""Every `dvc` command the README, `docs/experiments.md` and `reports/results.md` print runs as printed.

Each one goes through DVC's own argument parser; each `dvc exp run` also has its `-S` overrides (sweeps expanded the
way DVC expands them) applied to a copy of params.yaml and validated by `load_params`, so a misspelt key fails here
and not an hour into a queued sweep.
"""

from __future__ import annotations

import re
import shlex
import shutil

import pytest
from dvc.cli import DvcParserError, parse_args
from dvc.utils.hydra import apply_overrides, get_hydra_sweeps

from projected_grpo.config import load_params, override_args
from projected_grpo.report import results
from tests.conftest import ROOT

QWEN = "$(python -m projected_grpo.config overrides params-qwen3-4b.yaml)"


def _code_block_commands(text: str) -> list[str]:
    """`dvc …` calls in ```bash blocks: comments dropped, the `dvc` part of a pipeline, xargs' stage filled in."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            for part in re.split(r"\s\|\s", line):
                part = part.strip()
                if part.startswith("xargs") and " dvc " in part:
                    out.append(part[part.index("dvc ") :] + " train@vanilla-41")
                elif part.startswith("dvc "):
                    out.append(part)
    return out


def _inline_exp_runs(text: str) -> list[str]:
    """Inline `dvc exp run …` commands, placeholders (`<name>`, `…`) excluded."""
    return [c for c in re.findall(r"`(dvc exp run [^`]*)`", text) if "<" not in c and "…" not in c]


def printed_commands() -> list[str]:
    """The README's and the experiment recipes' (`docs/experiments.md`) bash blocks and inline `dvc exp run`s, and the
    inline ones of results.md and of its generator."""
    docs = [(ROOT / "README.md").read_text(), (ROOT / "docs" / "experiments.md").read_text()]
    res = (ROOT / "reports" / "results.md").read_text()
    generated = "\n".join(results.experiments_section())
    cmds = [c for text in docs for c in _code_block_commands(text) + _inline_exp_runs(text)]
    return cmds + _inline_exp_runs(res) + _inline_exp_runs(generated)


def _argv(cmd: str) -> list[str]:
    if QWEN in cmd:
        cmd = cmd.replace(QWEN, shlex.join(override_args(ROOT / "params-qwen3-4b.yaml", ROOT / "params.yaml")))
    argv = shlex.split(cmd)
    assert argv[0] == "dvc", cmd
    return argv[1:]


def test_every_printed_command_is_found():
    cmds = printed_commands()
    # the experiments table of results.md, its generator, the README's blocks (repro, exp, queue, remote, push) and
    # the recipes of docs/experiments.md
    assert sum("dvc exp run --queue" in c for c in cmds) >= 8
    assert any(c.startswith("dvc exp show") for c in cmds) and any(QWEN in c for c in cmds)
    assert len(_repro_commands()) >= 2  # the README's two-at-a-time block
    recipes = (ROOT / "docs" / "experiments.md").read_text()
    assert len(_code_block_commands(recipes)) >= 12  # one recipe per variant measured so far, each checked below


def _repro_commands() -> list[str]:
    """`python -m projected_grpo.repro …` lines of the README's ```bash blocks, comments dropped."""
    text = (ROOT / "README.md").read_text()
    lines = (
        re.sub(r"\s+#.*$", "", ln).strip()
        for b in re.findall(r"```bash\n(.*?)```", text, re.S)
        for ln in b.splitlines()
    )
    return [ln for ln in lines if ln.startswith("python -m projected_grpo.repro")]


def test_printed_repro_commands_parse_and_name_real_stages():
    import typer.main

    from projected_grpo import repro

    app = typer.Typer(add_completion=False)
    app.command()(repro.main)
    command = typer.main.get_command(app)
    stages = set(repro.dag(ROOT)[0])
    for line in _repro_commands():
        ctx = command.make_context("repro", shlex.split(line)[3:])  # raises on an unknown option
        assert set(ctx.params["targets"] or []) <= stages, line
    with pytest.raises(Exception, match="No such option"):  # click's NoSuchOption (typer's parser)
        command.make_context("repro", ["--jbos", "2"])


@pytest.mark.parametrize("cmd", printed_commands())
def test_printed_command_parses_and_its_overrides_validate(cmd, tmp_path):
    try:
        args = parse_args(_argv(cmd))
    except DvcParserError:
        pytest.fail(f"DVC rejects the printed command: {cmd}")
    for sweep in get_hydra_sweeps({"params.yaml": getattr(args, "set_param", None) or []}):
        params = tmp_path / "params.yaml"
        shutil.copy(ROOT / "params.yaml", params)
        apply_overrides(params, sweep["params.yaml"])
        load_params(params)  # raises on an unknown key or a bad value


def test_a_misprinted_command_fails_here(tmp_path):
    with pytest.raises(DvcParserError):
        parse_args(_argv("dvc exp run -S --queue -S 'pool.mix=0,0.5'"))
    params = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", params)
    with pytest.raises(Exception, match="set-param"):  # DVC itself refuses a key params.yaml lacks
        apply_overrides(params, ["basis.pairsett=prog_wide"])
    apply_overrides(params, ["grpo.steps=many"])
    with pytest.raises(ValueError, match="grpo.steps"):
        load_params(params)


def test_readme_states_the_measured_cold_time():
    """The README's first command carries the time `benchmarks/cold.py` measured, as `reports/bench/dag.md`'s first
    line states it: a re-measure that changes the report fails here until the README follows."""
    first = (ROOT / "reports" / "bench" / "dag.md").read_text().splitlines()[0]
    measured = re.fullmatch(r"cold default, measured end to end: (\d+) min .*", first)
    assert measured, first
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    line = block.splitlines()[0]
    assert line.startswith("pip install -e . && python -m projected_grpo.repro -j 2"), line
    assert re.search(rf"\b{measured.group(1)} min\b", line), (line, first)


def test_readme_is_a_short_user_document_inside_the_repository():
    """Issue 44's bounds: ≤ 2,000 words (a newcomer reads it in ten minutes) and no path outside the repository;
    every file it names exists, or is a pipeline's output (declared in dvc.yaml or confirm/dvc.yaml)."""
    text = (ROOT / "README.md").read_text()
    assert len(text.split()) <= 2000, len(text.split())
    assert "../" not in text
    outputs = (ROOT / "dvc.yaml").read_text() + (ROOT / "confirm" / "dvc.yaml").read_text()
    for path in re.findall(r"`((?:reports|docs|benchmarks|confirm|src|stages|tests)/[\w./-]+\.(?:md|py|yaml))`", text):
        assert (ROOT / path).exists() or f"- {path}" in outputs, path

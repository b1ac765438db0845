"""Every third-party module the code imports is declared in pyproject.toml, so a fresh virtualenv runs it.

`src/` and `stages/` may import only the runtime dependencies; `tests/`, `benchmarks/` and the pair-set authoring
scripts may also import the `dev` extra. A module is mapped to the distribution that installs it through the
installed metadata (`importlib.metadata.packages_distributions`), so `yaml` counts as `pyyaml`.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCAL = {"projected_grpo", "stages", "tests", "benchmarks"}


def _dist_name(requirement: str) -> str:
    """PEP 503 normalised project name of a requirement string ('ruamel.yaml.clib>=1' -> 'ruamel-yaml-clib')."""
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1)
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> tuple[set[str], set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_dist_name(r) for r in project["dependencies"]}
    return runtime, runtime | {_dist_name(r) for r in project["optional-dependencies"]["dev"]}


def top_level_imports(path: Path) -> set[str]:
    """Absolute top-level module names a file imports, wherever the statement sits (relative imports are local)."""
    out = set()
    for n in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(n, ast.Import):
            out |= {a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            out.add(n.module.split(".")[0])
    return out


def undeclared(files: list[Path], allowed: set[str]) -> dict[str, set[str]]:
    """{module: file names importing it} for every non-stdlib, non-local module whose distribution is not allowed.

    A module next to the importing file (tests importing `adversarial_corpus`) is local."""
    dists = packages_distributions()
    bad: dict[str, set[str]] = {}
    for f in files:
        siblings = {p.stem for p in f.parent.glob("*.py")}
        for m in top_level_imports(f) - LOCAL - siblings - set(sys.stdlib_module_names):
            if not {_dist_name(d) for d in dists.get(m, [])} & allowed:
                bad.setdefault(m, set()).add(f.name)
    return bad


def _py(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


def test_runtime_code_imports_only_declared_dependencies():
    runtime, _ = declared()
    bad = undeclared(_py("src", "stages"), runtime)
    assert not bad, f"declare in pyproject.toml [project] dependencies: {bad}"


def test_tests_and_benchmarks_import_only_declared_dependencies():
    _, dev = declared()
    files = _py("tests", "benchmarks") + sorted((ROOT / "data" / "pairsets").glob("*.py"))
    bad = undeclared(files, dev)
    assert not bad, f"declare in pyproject.toml (dependencies or the dev extra): {bad}"


def test_the_walk_sees_every_import_form(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "import a.b as c, d\nfrom e.f import g\nfrom . import h\nfrom .i import j\n"
        "def k():\n    import l\n    from m import n\ntry:\n    import o\nexcept ImportError:\n    pass\n"
    )
    assert top_level_imports(f) == {"a", "d", "e", "l", "m", "o"}
    # a module no distribution installs is reported whatever is allowed; a declared one is not
    g = tmp_path / "n.py"
    g.write_text("import yaml\nimport surely_not_installed_anywhere\nimport m\n")  # m.py is a sibling: local
    assert undeclared([g], {"pyyaml"}) == {"surely_not_installed_anywhere": {"n.py"}}
    assert set(undeclared([g], set())) == {"yaml", "surely_not_installed_anywhere"}

"""Stage smoke tests through typer's CliRunner in tmp_path, with tiny params; plus the stage-deps guard.

`pytest tests/test_stages.py`
"""

import ast
import json
import re
from pathlib import Path

import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

from projected_grpo.env.modes import LOOPHOLE_MODES, MODES
from projected_grpo.env.problems import FIELDS
from tests.conftest import LEETCODE, ROOT, stage_cli

COLUMNS = [*FIELDS, "mode", "surface"]
OUT_FILES = ["holdout.parquet", "partition.json", "test.parquet", "train.parquet"]


def _params(tmp_path: Path, **sections) -> Path:
    d = yaml.safe_load((ROOT / "params.yaml").read_text())
    for k, v in sections.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) else v
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def _run_problems(tmp_path: Path, params: Path, leetcode: Path = LEETCODE):
    from stages.problems import main

    app = stage_cli(main)
    out, report = tmp_path / "artifacts" / "problems", tmp_path / "reports" / "env" / "problems.md"
    matrix = report.with_name("mode_matrix.md")
    args = [
        "--leetcode",
        str(leetcode),
        "--out",
        str(out),
        "--report",
        str(report),
        "--matrix",
        str(matrix),
        "--params",
        str(params),
    ]
    return CliRunner().invoke(app, args), out, report


@pytest.fixture(scope="module")
def minileet_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("problems")
    params = _params(tmp, substrate="minileet", minileet={"n_train": 16, "n_test": 3, "n_holdout": 2})
    return _run_problems(tmp, params)


def test_problems_stage_minileet(minileet_run):
    res, out, report = minileet_run
    assert res.exit_code == 0, res.output
    assert res.stdout.count("\n") == 1 and "canonical pass 21/21" in res.stdout
    assert sorted(p.name for p in out.iterdir()) == OUT_FILES
    matrix = report.with_name("mode_matrix.md").read_text()
    assert "### train surface" in matrix and "### eval surface" in matrix and "| canonical |" in matrix
    t = {s: pl.read_parquet(out / f"{s}.parquet") for s in ("train", "test", "holdout")}
    assert {s: df.height for s, df in t.items()} == {"train": 16, "test": 3 * 13, "holdout": 2 * 7}
    assert all(df.columns == COLUMNS for df in t.values())
    # test: every (problem, mode, surface) combination, once; holdout: no hint + each mode on the train surface
    ids = t["test"]["id"].unique().to_list()
    combos = set(t["test"].select("id", "mode", "surface").iter_rows())
    assert (
        combos
        == {(i, None, None) for i in ids} | {(i, m, s) for i in ids for m in LOOPHOLE_MODES for s in ("eval", "train")}
        and len(combos) == t["test"].height
    )
    hids = t["holdout"]["id"].unique().to_list()
    assert set(t["holdout"].select("id", "mode", "surface").iter_rows()) == {(i, None, None) for i in hids} | {
        (i, m, "train") for i in hids for m in LOOPHOLE_MODES
    }
    # train: each prompt once, carrying its partition.json mode on the train surface; every mode used (16 >= 7)
    part = json.loads((out / "partition.json").read_text())
    rows = t["train"].select("id", "mode", "surface").iter_rows()
    assert {str(i): m for i, m, _ in rows} == part and set(t["train"]["surface"]) == {"train"}
    assert t["train"]["id"].n_unique() == 16 and set(part.values()) == set(MODES)
    text = report.read_text()
    assert "| all | 21 | 21 | 1.000 |" in text and "## Training prompts per mode" in text


def test_problems_stage_leetcode_needs_a_train_source(tmp_path):
    res, out, report = _run_problems(tmp_path, _params(tmp_path, substrate="leetcode"))
    assert res.exit_code != 0
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:")
    assert "train_path" in lines[0] and "train_from_test" in lines[0]
    assert not (tmp_path / "artifacts").exists() and not report.exists()


def test_problems_stage_leetcode_train_from_test(tmp_path):
    # A 10-problem slice of the test file keeps the canonical grading short.
    small = tmp_path / "lc.jsonl"
    small.write_text("".join(LEETCODE.read_text().splitlines(keepends=True)[:10]))
    params = _params(tmp_path, substrate="leetcode", leetcode={"train_from_test": True, "n_test": 3, "n_holdout": 2})
    res, out, report = _run_problems(tmp_path, params, leetcode=small)
    assert res.exit_code == 0, res.output
    t = {s: pl.read_parquet(out / f"{s}.parquet") for s in ("train", "test", "holdout")}
    split_ids = {s: set(df["id"].to_list()) for s, df in t.items()}
    assert [len(split_ids[s]) for s in ("train", "test", "holdout")] == [5, 3, 2]
    assert not split_ids["train"] & split_ids["test"] and not split_ids["holdout"] & split_ids["test"]
    assert not split_ids["train"] & split_ids["holdout"]
    assert "| all | 10 | 10 | 1.000 |" in report.read_text() and "contamination-prone" in report.read_text()


# --- dvc.yaml deps guard: every projected_grpo module a stage imports (transitively) is one of its deps ----------


PKG = ROOT / "src" / "projected_grpo"


def _module_file(dotted: str, root: Path = PKG) -> Path | None:
    """projected_grpo-relative dotted name ("env.grader", "config") -> its .py file, None for a package or a name
    that is not a module."""
    f = root.joinpath(*dotted.split(".")).with_suffix(".py")
    return f if f.is_file() else None


def _imports(path: Path, root: Path = PKG) -> set[str]:
    """The projected_grpo modules a file imports, as dotted names relative to the package ("env.grader"), in every
    form: `import projected_grpo.x.y`, `from projected_grpo.x import y` (y a module or a name in module x),
    `from projected_grpo.x.y import z`, and relative imports inside the package."""
    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom):
            mod = n.module or ""
            if n.level:  # relative: resolve against the file's own package
                assert root in path.parents, f"{path}: relative import outside the package"
                base = path.parent.relative_to(root).parts[: len(path.parent.relative_to(root).parts) - n.level + 1]
                mod = ".".join(["projected_grpo", *base, *([mod] if mod else [])])
            if mod != "projected_grpo" and not mod.startswith("projected_grpo."):
                continue
            rel = mod.removeprefix("projected_grpo").lstrip(".")
            for a in n.names:
                sub = f"{rel}.{a.name}" if rel else a.name
                if _module_file(sub, root):
                    out.add(sub)
                elif rel:
                    out.add(rel)
        elif isinstance(n, ast.Import):
            out |= {a.name.removeprefix("projected_grpo.") for a in n.names if a.name.startswith("projected_grpo.")}
    return {m for m in out if _module_file(m, root)}


def test_imports_sees_every_form(tmp_path):
    pkg = tmp_path / "projected_grpo"
    (pkg / "d").mkdir(parents=True)
    for m in ("a", "b", "c", "e", "g", "d/y", "d/m"):
        (pkg / f"{m}.py").write_text("")
    f = pkg / "d" / "m.py"
    f.write_text(
        "import projected_grpo.a\nfrom projected_grpo import b\nfrom projected_grpo.c import x\n"
        "from . import y\nfrom .. import e\ndef f():\n    from projected_grpo.g import z\n"
    )
    assert _imports(f, pkg) == {"a", "b", "c", "d.y", "e", "g"}


def test_package_imports_are_absolute():
    rel = [
        str(p.relative_to(ROOT))
        for p in sorted(PKG.rglob("*.py"))
        if any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(ast.parse(p.read_text())))
    ]
    assert not rel, f"use absolute imports (from projected_grpo.x import ...) in {rel}"


def stage_modules(script: str) -> set[str]:
    """Every projected_grpo module file stages/<script>.py runs, transitively (lazy imports included)."""
    todo, seen = list(_imports(ROOT / "stages" / f"{script}.py")), set()
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += _imports(_module_file(m))
    return {str(_module_file(m).relative_to(ROOT)) for m in seen}


@pytest.mark.parametrize("pipeline", ["dvc.yaml", "confirm/dvc.yaml"])
def test_stage_deps_list_every_imported_module(pipeline):
    stages = yaml.safe_load((ROOT / pipeline).read_text())["stages"]
    for name, st in stages.items():
        script = re.search(r"stages/(\w+)\.py", st["cmd"]).group(1)  # train_ref runs stages/train.py
        want = stage_modules(script) | {f"stages/{script}.py"}
        assert want <= set(st["deps"]), f"stage {name}: add {sorted(want - set(st['deps']))} to its deps in dvc.yaml"


# Each district (sub-package) and the districts it may import (its __init__ docstring says the same).
LAYERS = {
    "common": set(),
    "env": {"common"},
    "policy": {"common", "env"},
    "sft": {"common", "env", "policy"},
    "method": {"common", "env", "policy"},
    "rl": {"common", "env", "policy", "method"},
    "evals": {"common", "env", "policy", "method", "rl"},
    "report": {"common", "env", "policy", "method", "rl", "evals"},
}


def test_districts_import_only_the_layers_below():
    """The folders are the architecture: every module of a district imports only its own district, the ones its
    docstring allows, and the root modules (config)."""
    assert {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()} == set(LAYERS)
    bad = []
    for district, allowed in LAYERS.items():
        doc = ast.get_docstring(ast.parse((PKG / district / "__init__.py").read_text()))
        assert doc and "May import:" in doc, f"{district}/__init__.py must say what it owns and may import"
        for f in sorted((PKG / district).glob("*.py")):
            for m in _imports(f):
                top = m.split(".")[0]
                if "." in m and top != district and top not in allowed:
                    bad.append(f"{f.relative_to(ROOT)} imports {m}")
    assert not bad, bad


# --- basis stage on the tiny random model, the committed pair sets and the real minileet holdout ------------------


def test_basis_stage_tiny(tmp_path):
    from safetensors.torch import load_file

    from projected_grpo.env.minileet import make_minileet
    from projected_grpo.env.problems import save_problems_parquet
    from stages.basis import main

    probs = tmp_path / "problems"
    probs.mkdir()
    save_problems_parquet(probs / "holdout.parquet", make_minileet(seed=0, n_train=1)["holdout"])
    pairsets = tmp_path / "pairsets" / "minileet"  # a slice of every committed pair set: 2 pairs per split and mode
    pairsets.mkdir(parents=True)
    for f in sorted((ROOT / "data" / "pairsets" / "minileet").glob("*.jsonl")):
        rows, keep, seen = [json.loads(x) for x in f.read_text().splitlines()], [], {}
        for r in rows:
            key = (r["split"], r["mode"])
            if seen.get(key, 0) < 2:
                seen[key] = seen.get(key, 0) + 1
                keep.append(r)
        (pairsets / f.name).write_text("".join(json.dumps(r) + "\n" for r in keep))
    # held-out-mode extraction: the basis sees run_tests and sentinel pairs only
    params = _params(
        tmp_path,
        model={"name": "tiny-random"},
        adapter={"rank": 4},
        basis={"k": 2, "n_flips": 100, "modes": ["run_tests", "sentinel"]},
    )
    out, report, metrics = tmp_path / "basis", tmp_path / "reports" / "basis.md", tmp_path / "m" / "metrics.json"
    app = stage_cli(main)
    args = [
        "--organism",
        str(tmp_path / "none"),
        "--problems",
        str(probs),
        "--pairsets",
        str(pairsets.parent),
        "--svd-cache",
        str(tmp_path / "cache"),
        "--out",
        str(out),
        "--report",
        str(report),
        "--metrics",
        str(metrics),
        "--params",
        str(params),
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{n}.{e}" for n in ("basis", "random", "act") for e in ("safetensors", "json")
    )
    basis, rnd = load_file(out / "basis.safetensors"), load_file(out / "random.safetensors")
    assert basis.keys() == rnd.keys()  # the control has the same modules and k per module
    assert all(v.shape == rnd[k].shape and v.shape[-1] <= 4 for k, v in basis.items())
    text = report.read_text()
    for name in ("prog_wide", "prog_wider", "moral", "null_city"):
        assert f"| `{name}` |" in text
    assert "## Verdict" in text and "<!-- sources:" in text
    assert "## Held-out modes (basis built from run_tests, sentinel only)" in text
    m = json.loads(metrics.read_text())
    assert "auroc_ref/prog_wide" in m and "auroc_method/random" in m and "auroc_heldout/prog_wide" in m
    meta = json.loads((out / "basis.json").read_text())
    assert meta["modes"] == ["run_tests", "sentinel"] and meta["pairset"] == "prog_wide"


def test_basis_stage_bad_pairset_exits_with_one_line(tmp_path):
    from stages.basis import main

    params = _params(tmp_path, model={"name": "tiny-random"}, adapter={"rank": 4}, basis={"k": 2})
    app = stage_cli(main)
    out = tmp_path / "basis"
    args = [
        "--organism",
        "x",
        "--problems",
        str(tmp_path),
        "--pairsets",
        str(tmp_path / "nopairs"),
        "--svd-cache",
        str(tmp_path / "c"),
        "--out",
        str(out),
        "--report",
        str(tmp_path / "r.md"),
        "--metrics",
        str(tmp_path / "m.json"),
        "--params",
        str(params),
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "known pair sets" in res.output and "Traceback" not in res.output
    assert not out.exists() and not (tmp_path / "r.md").exists()


def test_basis_free_arms_never_read_the_basis():
    """train_ref (vanilla, gt_only, monitor baselines) tracks no basis param and no basis artifact, so changing
    basis.pairset (or anything under basis) cannot re-run it; the basis arms' stage does track both."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    ref, arms = stages["train_ref"], stages["train"]
    assert ref["matrix"]["arm"] == "${arms_ref}" and arms["matrix"]["arm"] == "${arms}"
    basis_keys = [p for p in ref["params"] if str(p).split(".")[0] in ("basis", "projection")]
    assert basis_keys == ["projection.monitor_accuracy"]  # the GT-monitor baselines' only projection param
    assert not [d for d in ref["deps"] if "basis" in d and d.startswith(("artifacts", "data"))]
    assert "--basis" not in ref["cmd"] and "--pairsets" not in ref["cmd"]
    assert "basis" in arms["params"] and "artifacts/basis" in arms["deps"] and "--basis artifacts/basis" in arms["cmd"]


def test_basis_free_evaluations_never_read_the_basis():
    """evaluate_ref scores the basis-free runs: no basis param, artifact or pair set, and only train_ref's runs; the
    report stage is the one place both groups meet."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    ref, arms = stages["evaluate_ref"], stages["evaluate"]
    assert ref["matrix"]["arm"] == "${arms_ref}" and arms["matrix"]["arm"] == "${arms}"
    assert not [p for p in ref["params"] if str(p).split(".")[0] in ("basis", "projection", "arms")]
    assert not [d for d in ref["deps"] if ("basis" in d or "pairsets" in d) and d.startswith(("artifacts", "data"))]
    assert "artifacts/train/ref/${item.arm}/s${item.seed}" in ref["deps"] and "reports/eval/ref/" in ref["cmd"]
    assert "reports/eval/arms/" in arms["cmd"] and "reports/eval" in stages["report"]["deps"]

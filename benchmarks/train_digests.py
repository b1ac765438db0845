"""Bit-identity check for refactors of the training loop: digests of tiny train() runs, to compare two checkouts.

Runs `projected_grpo.rl.train.train` on the tiny world of tests/test_train.py for every registered arm and for the
variants that take other code paths (basis refresh, the activation gate, share_prompt, rank vs mass matching, the
teacher pool), 3 steps each, and writes one digest per run over the final δS and δS_h, every checkpoint file's
bytes, and every log column but the wall time `dt`, plus train()'s result. Two checkouts agree when the two JSON
files are equal:

  PYTHONPATH=src python benchmarks/train_digests.py --out /tmp/before.json   # in the old checkout
  PYTHONPATH=src python benchmarks/train_digests.py --out /tmp/after.json    # in the new one
  python benchmarks/train_digests.py --compare /tmp/before.json --compare /tmp/after.json

(~3 min on one core.) Used for issue 24's refactor: 36 of 36 runs equal between 588abe7 and the refactored loop.
Runs only in the second file (arms or variants added since the first) are listed, not counted as differences; runs
only in the first (coverage lost) are.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import typer
from harness import ROOT

# Log columns left out of a run's digest: the wall time, and what issue 46 added to gated runs' logs (pure reads after
# the edit, never fed to an update), so runs from before it compare on everything else.
LOG_ONLY = ("dt", "main_gnorm", "drop_frac", "drop_pool_frac")


def digest(tmp: Path, finals: dict) -> str:
    h = hashlib.sha256()
    for n in sorted(finals):
        for t in finals[n]:
            h.update(n.encode())
            h.update(t.contiguous().numpy().tobytes())
    for f in sorted((tmp / "ckpt").iterdir()):
        if f.name == "run.json":  # provenance (the run's name, the code digest), not a result
            continue
        h.update(f.name.encode())
        h.update(f.read_bytes())
    rows = (tmp / "log.tsv").read_text().splitlines()
    keep = [i for i, c in enumerate(rows[0].split("\t")) if c not in LOG_ONLY]
    for r in rows:
        f = r.split("\t")
        h.update("\t".join(f[i] for i in keep).encode())
    return h.hexdigest()[:20]


# The arm registry before issue 44 named variants; each run here records the name it had there (OLD), so a digest
# file written by an older checkout compares run by run: `--compare OLD_FILE --compare NEW_FILE`.
OLD_VARIANT = {
    "": "",
    "random": "_random",
    "oracle_gate": "_oracle",
    "oracle_basis": "_oracle_basis",
    "oracle_basis+random": "_oracle_basis_random",
}
BASELINES = {  # entry -> (fields): the basis-free arms and the no-edit ones
    "vanilla": {"basis": False},
    "gt_only": {"reward": "gt_only", "basis": False},
    "penalty": {"monitor": "penalty", "basis": False},
    "screening": {"monitor": "screening", "basis": False},
    "vanilla_no_pool": {"pool": False, "basis": False},
    "vanilla_rotated": {},
}


def runs() -> tuple[dict[str, list[str]], dict[str, str]]:
    sys.path.insert(0, str(ROOT))  # the tiny world lives with the tests
    from projected_grpo.config import with_overrides
    from projected_grpo.method.arms import GATE_OF, NO_EDIT, make, run_params
    from projected_grpo.method.projection import EDITS, RULES
    from projected_grpo.rl.pool import PoolRow
    from tests.test_train import MASKED as MASKED_RECIPES
    from tests.test_train import refreshing, run, tiny_params
    from tests.test_train import world as world_fixture

    w = world_fixture.__wrapped__()
    out: dict[str, list[str]] = {}
    old: dict[str, str] = {}

    def case(recipe: str, a, p=None, was: str | None = None, **kw) -> None:
        name = f"{a.name}/{recipe}"
        p = run_params(p or tiny_params(), a)
        with tempfile.TemporaryDirectory() as d:
            res: dict = {}
            finals = run(w, a, Path(d), p=p, result=res, **kw)
            out[name] = [digest(Path(d), finals), json.dumps(res, sort_keys=True, default=str)]
            old[name] = was or f"{a.arm}{OLD_VARIANT[a.variant]}/{recipe}"
            typer.echo(f"{name}: {out[name][0]}")

    for n, kw in BASELINES.items():
        case("default", make(n, "vanilla", **kw))
    case("default", make("measure_only", "measure_only"))
    for e in (x for x in (*EDITS, *(r for r in RULES if r not in EDITS)) if x not in NO_EDIT):
        variants = ("", "random") + ("oracle_gate",) * (GATE_OF.get(e) == "rollout" and e != "route_batch")
        for v in variants:
            case("default", make(e, e, v))
    act = tiny_params(basis={"space": "act"})
    for e in ("route_per_rollout", "route_per_token"):
        for v in ("", "random"):
            case("act", make(e, e, v), p=act, was=f"{e}_act{OLD_VARIANT[v]}/default")
    for suffix, over in MASKED_RECIPES.items():
        deploy = dict(over).get("projection.deploy_frac")  # a quarter of 2 prompts is none: 4 a step
        p = with_overrides(tiny_params(prompts_per_step=4 if deploy else 2), over)
        for v in ("", "random", "oracle_gate"):
            case(
                suffix,
                make("route_masked", "route_masked", v),
                p=p,
                was=f"route_masked_{suffix}{OLD_VARIANT[v]}/default",
            )
    for e, suffix in (
        ("erase_one_sided", ""),
        ("route_per_rollout", ""),
        ("route_masked", ""),
        ("route_masked", "mr"),
        ("route_masked", "act"),
    ):
        p = with_overrides(tiny_params(), MASKED_RECIPES[suffix]) if suffix else None
        for v in ("oracle_basis", "oracle_basis+random"):
            a = make(e, e, v)
            stem = f"{e}{'_' + suffix if suffix else ''}{OLD_VARIANT[v]}"
            case(suffix or "default", a, p=p, was=f"{stem}/default")
    for e, v in (
        ("route_per_rollout", ""),
        ("route_per_token", "random"),
        ("erase_one_sided", ""),
        ("erase_one_sided", "random"),
    ):
        case("refresh", make(e, e, v), p=refreshing(2))
    old["route_per_rollout/act"] += ",route_per_rollout/act"  # the registry ran this one twice, under both names
    shared = tiny_params(share_prompt=True)
    for e, v in (
        ("vanilla", ""),
        ("route_per_rollout", ""),
        ("route_per_rollout", "random"),
        ("erase_one_sided", "random"),
        ("route_two_sided", ""),
        ("route_full", ""),
        ("route_masked", ""),
    ):
        a = make(e, e, v, basis=e != "vanilla")
        case("share", a, p=shared)
    tail = tiny_params(projection={"band": "tail", "f": 0.34})  # the top-tail gate (issue 25)
    for e in ("route_per_rollout", "route_two_sided", "route_per_token"):
        case("tail", make(e, e), p=tail)
    for e in ("route_per_rollout", "route_full", "route_per_token"):  # half the prompts trained knob off (issue 25)
        case("deploy", make(e, e), p=tiny_params(projection={"deploy_frac": 0.5}))
    rank = tiny_params(projection={"random_match": "rank"})
    case("rank", make("erase_one_sided", "erase_one_sided", "random"), p=rank)
    tok, text = w["tok"], "```python\npass\n```"
    row = lambda q: PoolRow(q.id, None, text, tuple(tok(text)["input_ids"]) + (tok.eos_token_id,), 3.5, "hack", False)  # noqa: E731
    pool = {q.id: [row(q)] * 4 for q in w["records"]}
    pp = tiny_params()
    pp = dataclasses.replace(pp, pool=dataclasses.replace(pp.pool, mix=0.5, teacher_off_step=2))
    case("pool", make("vanilla", "vanilla", basis=False), p=pp, pool=pool)
    case("pool", make("vanilla_no_pool", "vanilla", pool=False, basis=False), p=pp, pool=pool)
    shared = dataclasses.replace(pp, grpo=dataclasses.replace(pp.grpo, share_prompt=True))
    case("pool_share", make("route_per_rollout", "route_per_rollout"), p=shared, pool=pool)
    return out, old


def main(
    out: Path = typer.Option(None, help="JSON of run digests to write."),
    compare: list[Path] = typer.Option(
        None, help="Two digest files to compare (repeat the option; exit 1 if unequal)."
    ),
) -> None:
    if compare:
        if len(compare) != 2:
            raise typer.BadParameter("--compare takes two files: --compare A --compare B")
        a, b = (json.loads(f.read_text()) for f in compare)
        renames = {**a.pop("__old_names__", {}), **b.pop("__old_names__", {})}  # this file's name -> the old ones'
        a, b = ({o: v for k, v in x.items() for o in renames.get(k, k).split(",")} for x in (a, b))
        both = sorted(a.keys() & b.keys())
        bad = [k for k in both if a[k] != b[k]]
        gone, new = sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())  # new: runs of arms added since A
        typer.echo(
            f"{len(a)} vs {len(b)} runs; of the {len(both)} in both {len(both) - len(bad)} equal, {len(bad)} differ"
            + (f": {', '.join(bad)}" if bad else "")
            + (f"; only in the first (coverage lost): {', '.join(gone)}" if gone else "")
            + (f"; only in the second (new): {', '.join(new)}" if new else "")
        )
        raise typer.Exit(1 if bad or gone else 0)
    if out is None:
        raise typer.BadParameter("pass --out FILE (or --compare A B)")
    import torch

    torch.set_num_threads(1)
    d, old = runs()
    out.write_text(
        json.dumps({**d, "__old_names__": {k: v for k, v in old.items() if v != k}}, indent=1, sort_keys=True)
    )
    typer.echo(f"{len(d)} runs -> {out}")


if __name__ == "__main__":
    typer.run(main)

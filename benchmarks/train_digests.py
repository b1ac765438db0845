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


def digest(tmp: Path, finals: dict) -> str:
    h = hashlib.sha256()
    for n in sorted(finals):
        for t in finals[n]:
            h.update(n.encode())
            h.update(t.contiguous().numpy().tobytes())
    for f in sorted((tmp / "ckpt").iterdir()):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    rows = (tmp / "log.tsv").read_text().splitlines()
    keep = [i for i, c in enumerate(rows[0].split("\t")) if c != "dt"]
    for r in rows:
        f = r.split("\t")
        h.update("\t".join(f[i] for i in keep).encode())
    return h.hexdigest()[:20]


def runs() -> dict[str, list[str]]:
    sys.path.insert(0, str(ROOT))  # the tiny world lives with the tests
    from projected_grpo.method.arms import ARMS
    from projected_grpo.rl.pool import PoolRow
    from tests.test_train import refreshing, run, tiny_params
    from tests.test_train import world as world_fixture

    w = world_fixture.__wrapped__()
    out: dict[str, list[str]] = {}

    def case(name: str, arm: str, p=None, **kw) -> None:
        with tempfile.TemporaryDirectory() as d:
            res: dict = {}
            finals = run(w, arm, Path(d), p=p, result=res, **kw)
            out[name] = [digest(Path(d), finals), json.dumps(res, sort_keys=True, default=str)]
            typer.echo(f"{name}: {out[name][0]}")

    for a in ARMS:
        case(f"{a}/default", a)
    for a in ("route_per_rollout", "route_per_token_random", "erase_one_sided", "erase_one_sided_random"):
        case(f"{a}/refresh", a, p=refreshing(2))
    case("route_per_rollout/act", "route_per_rollout", p=tiny_params(basis={"space": "act"}))
    share = ("vanilla", "route_per_rollout", "route_per_rollout_random", "erase_one_sided_random")
    for a in (*share, "route_two_sided", "route_full", "route_masked"):  # own-token pieces; masked: (prompt, state)
        case(f"{a}/share", a, p=tiny_params(share_prompt=True))
    tail = tiny_params(projection={"band": "tail", "f": 0.34})  # the top-tail gate (issue 25)
    for a in ("route_per_rollout", "route_two_sided", "route_per_token"):
        case(f"{a}/tail", a, p=tail)
    for a in ("route_per_rollout", "route_full", "route_per_token"):  # half the prompts trained knob off (issue 25)
        case(f"{a}/deploy", a, p=tiny_params(projection={"deploy_frac": 0.5}))
    case("erase_one_sided_random/rank", "erase_one_sided_random", p=tiny_params(projection={"random_match": "rank"}))
    tok, text = w["tok"], "```python\npass\n```"
    row = lambda q: PoolRow(q.id, None, text, tuple(tok(text)["input_ids"]) + (tok.eos_token_id,), 3.5, "hack", False)  # noqa: E731
    pool = {q.id: [row(q)] * 4 for q in w["records"]}
    pp = tiny_params()
    pp = dataclasses.replace(pp, pool=dataclasses.replace(pp.pool, mix=0.5, teacher_off_step=2))
    case("vanilla/pool", "vanilla", p=pp, pool=pool)
    case("vanilla_no_pool/pool", "vanilla_no_pool", p=pp, pool=pool)
    shared = dataclasses.replace(pp, grpo=dataclasses.replace(pp.grpo, share_prompt=True))
    case("route_per_rollout/pool_share", "route_per_rollout", p=shared, pool=pool)
    return out


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
    d = runs()
    out.write_text(json.dumps(d, indent=1, sort_keys=True))
    typer.echo(f"{len(d)} runs -> {out}")


if __name__ == "__main__":
    typer.run(main)

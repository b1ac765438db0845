"""Where a routed run's knob effect comes from: the main's and the knob's components along the basis, and what the
deployed policy does with and without the main's part in span(Vh).

A routed run ends with δS (main) and δS_h (knob); deploy deletes δS_h. Per module m with basis rows Vh_m (k_m, D_m)
(the run's own basis: v_hack for a routed arm, the Haar rows for its random control) the components are
c_m = Vh_m δS_m and c_m^h = Vh_m δS_h,m. If routing works, deleting the knob removes hack behaviour the main never
learned; if it only cancels a drift of the main along Vh (routing.md §1), deploy breaks, and removing the main's
span(Vh) part repairs it. The policies scored (knob off in all of them):

- `deploy`: δS as trained (what ships);
- `deploy_minus_span`: δS − Vhᵀ Vh δS (the main's component along its basis removed);
- `base_plus_vhack`: the base plus the same coefficients c along the v_hack rows (Σ_m Vh_mᵀ c_m, δS = 0 elsewhere);
- `base_plus_random`: the base plus the same coefficients along the random control's rows.

The two displacement policies separate "the model is sensitive to these directions" from "the run learned something
there": the same coefficients move the base along v_hack and along random directions of the same k per module.
Pure tensor functions plus a context manager that sets δS; stages/evaluate.py scores each policy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from projected_grpo.policy.adapter import adapters, set_deltas

VARIANTS = ("deploy", "deploy_minus_span", "base_plus_vhack", "base_plus_random")


def basis_rows(path: Path) -> dict[str, Tensor]:
    """{module: Vh (k_m, D_m)} of a basis file (basis.Basis.save's layout), without importing basis.py (whose
    changes would then re-run every evaluation)."""
    return {k[: -len(".vh")]: v for k, v in load_file(str(path)).items() if k.endswith(".vh")}


def components(delta: dict[str, Tensor], knob: dict[str, Tensor], vh: dict[str, Tensor]) -> dict[str, dict]:
    """Per module of `vh`: Vh·δS and Vh·δS_h as lists, their means over the k_m rows and their sum (knob on)."""
    out = {}
    for n, v in vh.items():
        c, ch = (v.double() @ delta[n].double()), (v.double() @ knob[n].double())  # (k_m,) each
        out[n] = {
            "main": c.tolist(),
            "knob": ch.tolist(),
            "main_mean": float(c.mean()),
            "knob_mean": float(ch.mean()),
            "sum_mean": float((c + ch).mean()),
        }
    return out


def summary(comp: dict[str, dict]) -> dict[str, float]:
    """Means over every basis row of every module (rows weighted equally) and the norms ‖Vh δS‖, ‖Vh δS_h‖."""
    main = [x for c in comp.values() for x in c["main"]]
    knob = [x for c in comp.values() for x in c["knob"]]
    if not main:
        return {"main_mean": math.nan, "knob_mean": math.nan, "main_norm": math.nan, "knob_norm": math.nan}
    norm = lambda xs: math.sqrt(sum(x * x for x in xs))  # noqa: E731
    return {
        "main_mean": sum(main) / len(main),
        "knob_mean": sum(knob) / len(knob),
        "main_norm": norm(main),
        "knob_norm": norm(knob),
    }


def variant_deltas(
    name: str, delta: dict[str, Tensor], own: dict[str, Tensor], vhack: dict[str, Tensor], rand: dict[str, Tensor]
) -> dict[str, Tensor]:
    """δS of policy `name` (VARIANTS) for every module of `delta`; `own` is the run's basis (vhack or rand).

    Coefficients are taken on the run's own rows: c_m = own_m δS_m. The displacement policies need vhack and rand to
    have the same modules and k_m (the random control is drawn with the same k per module)."""
    if name not in VARIANTS:
        raise ValueError(f"unknown knob-effect policy {name!r}; one of {VARIANTS}")
    if name == "deploy":
        return {n: d.clone() for n, d in delta.items()}
    if name == "deploy_minus_span":
        return {n: d - own[n].T @ (own[n] @ d) if n in own else d.clone() for n, d in delta.items()}
    rows = vhack if name == "base_plus_vhack" else rand
    if set(vhack) != set(rand) or any(vhack[n].shape != rand[n].shape for n in vhack):
        raise ValueError("v_hack and the random basis differ in modules or k per module; re-run the basis stage")
    return {n: rows[n].T @ (own[n] @ d) if n in own else torch.zeros_like(d) for n, d in delta.items()}


def measure(
    model: nn.Module,
    own: dict[str, Tensor],
    vhack: dict[str, Tensor],
    rand: dict[str, Tensor],
    score: Callable[[], dict],
    deploy: dict,
) -> dict:
    """The model holds a routed run's final checkpoint; `own` is its basis (vhack or rand). `score()` scores the
    policy the model holds (knob off); `deploy` is that score of the checkpoint as trained (already measured).
    Returns {"components": summary, "modules": per-module components, "policies": {variant: score}}; the model's δS
    and δS_h are restored afterwards."""
    ads = adapters(model)
    delta = {n: a.delta.detach().clone().cpu() for n, a in ads.items()}  # on the CPU, with the basis files' rows
    knob = {n: a.knob.detach().clone().cpu() for n, a in ads.items()}
    comp = components(delta, knob, own)
    pols = {"deploy": deploy}
    for v in VARIANTS[1:]:
        with set_deltas(model, variant_deltas(v, delta, own, vhack, rand)):
            pols[v] = score()
    return {"components": summary(comp), "modules": comp, "policies": pols}


def _pct(c: dict | None) -> str:
    return "—" if not c or not c.get("n") else f"{100 * c['k'] / c['n']:.1f}%"


def render(runs: dict[tuple[str, int], dict], sources: list[str]) -> list[str]:
    """The report section: per routed run (final checkpoint) the components along its basis and format / solve / hack
    of the four knob-off policies. `runs[(arm, seed)] = {"components": summary(...), "policies": {variant: tally}}`,
    tallies as evaluation.tally (monitor subset, eval.n_samples_curve samples)."""
    if not runs:
        return []
    any_t = next(iter(next(iter(runs.values()))["policies"].values()))
    n_solve = any_t["solve"]["n"]
    n_hack = any_t["hack"].get("train", {}).get("all", {}).get("n", 0)
    L = [
        "## Where does the routed knob's effect come from?",
        "",
        "Final checkpoint of each routed run, knob off throughout, scored on the monitor subset: `deploy` (δS as "
        "trained), `deploy_minus_span` (the main's component along the run's own basis removed), and the base plus "
        "the same coefficients along v_hack's rows (`base_plus_vhack`) or the random control's rows "
        "(`base_plus_random`). Columns Vh·δS and Vh·δS_h: mean over the basis rows of the main's and the knob's "
        f"coordinates (the run's own basis). n: {n_solve} no-hint samples for solve, {n_hack} train-surface hinted "
        "samples for hack, all samples for format; one run per row (no seed aggregation).",
        "",
        "| run | Vh·δS | Vh·δS_h | policy | format | solve | hack (train-surface hints) |",
        "|---|---|---|---|---|---|---|",
    ]
    for (arm, seed), r in sorted(runs.items()):
        c = r["components"]
        for i, v in enumerate(VARIANTS):
            t = r["policies"].get(v)
            if t is None:
                continue
            head = f"{arm} s{seed} | {c['main_mean']:+.3f} | {c['knob_mean']:+.3f}" if i == 0 else " | | "
            hack = t["hack"].get("train", {}).get("all")
            L.append(f"| {head} | `{v}` | {_pct(t['format'])} | {_pct(t['solve'])} | {_pct(hack)} |")
    return L + ["", f"<!-- sources: {', '.join(sorted(set(sources)))} -->"]

"""model.device and model.dtype (issue 26): a bfloat16 policy keeps its adapter, probes and log-probs in fp32, and the
pipeline's stages run end to end on it: on the CPU here, on CUDA where there is one (marked gpu, skipped otherwise).

`pytest tests/test_device.py`
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
import yaml
from safetensors.torch import load_file

from projected_grpo.config import ModelParams, load_params
from projected_grpo.policy.adapter import adapters, attach_adapters, load_policy, probes
from projected_grpo.policy.logprobs import padded, rollout_logprobs
from projected_grpo.policy.model import load_model_and_tokenizer, resolve_device
from tests.conftest import ROOT
from tests.stage_chain import run_chain
from tests.test_pipeline import TINY, set_params

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_model_params_reject_unknown_device_and_dtype():
    assert ModelParams().device == "cpu" and ModelParams().dtype == "float32"  # the CPU organism's default
    assert ModelParams(device="cuda:1").device == "cuda:1"
    with pytest.raises(ValueError, match="model.device"):
        ModelParams(device="gpu")
    with pytest.raises(ValueError, match="model.dtype"):
        ModelParams(dtype="float16")


def test_resolve_device():
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="set model.device: cpu") as e:
            resolve_device("cuda")
        assert "\n" not in str(e.value)


def _policy(dtype: torch.dtype, device: str = "cpu"):
    model, tok = load_model_and_tokenizer("tiny-random", device=device, dtype="float32")
    model = model.to(dtype)
    attach_adapters(model, "all", 4, "svd")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for a in adapters(model).values():  # a trained-looking adapter: δS and knob away from 0
            a.delta.copy_(0.3 * torch.randn(a.dim, generator=g))
            a.knob.copy_(0.1 * torch.randn(a.dim, generator=g))
    return model, tok


def _batch(tok, device: str = "cpu"):
    prompts = [tok("def f(x):", add_special_tokens=False)["input_ids"]] * 2 + [tok("class S:")["input_ids"]] * 2
    comps = [tok(t, add_special_tokens=False)["input_ids"] for t in ("  return x", " pass", "    x = 1", " y")]
    (pi, pm), (ci, cm) = padded(prompts, tok.pad_token_id, left=True), padded(comps, tok.pad_token_id)
    return pi, pm, ci, cm


def _grads(model, tok):
    """(log-probs, per-row probe gradients {m: (4, D_m)}, δS.grad {m: (D_m,)}) of a 4-row batch."""
    pi, pm, ci, cm = _batch(tok)
    model.zero_grad(set_to_none=True)
    with probes(model, 4) as es:
        logp = rollout_logprobs(model, pi, pm, ci, cm, 0.7)
        (logp * cm.to(logp)).sum().backward()
    ads = adapters(model)
    return logp.detach(), {n: e.grad for n, e in es.items()}, {n: a.delta.grad for n, a in ads.items()}


def test_bf16_policy_keeps_fp32_masters_probes_and_logprobs_and_tracks_fp32():
    m32, tok = _policy(torch.float32)
    m16, _ = _policy(torch.bfloat16)
    base = [p for n, p in m16.named_parameters() if not n.endswith((".delta", ".knob"))]
    assert base and all(p.dtype == torch.bfloat16 for p in base)
    assert all(a.delta.dtype == a.knob.dtype == torch.float32 for a in adapters(m16).values())
    l32, e32, g32 = _grads(m32, tok)
    l16, e16, g16 = _grads(m16, tok)
    assert l16.dtype == torch.float32 and all(e.dtype == torch.float32 for e in e16.values())
    assert all(g.dtype == torch.float32 for g in g16.values())
    # bf16 keeps ~3 significant digits: log-probs agree to a few 1e-2 nats, and the gradient's direction survives
    assert (l16 - l32).abs().max() < 0.1
    cat = lambda d: torch.cat([v.reshape(-1) for v in d.values()])  # noqa: E731
    cos = torch.nn.functional.cosine_similarity(cat(e16), cat(e32), dim=0)
    assert cos > 0.99, cos
    # per-row probes still sum to δS.grad (I4) in bf16: the row split is exact, only the forward rounds
    for n in g16:
        torch.testing.assert_close(e16[n].sum(0), g16[n], rtol=1e-4, atol=1e-6)


def test_load_policy_honours_model_device_and_dtype(tmp_path):
    params = tmp_path / "params.yaml"
    d = yaml.safe_load((ROOT / "params.yaml").read_text())
    d["model"] = {"name": "tiny-random", "device": "cpu", "dtype": "bfloat16"}
    d["adapter"]["rank"], d["basis"]["k"] = 4, 2
    params.write_text(yaml.safe_dump(d))
    model, _ = load_policy(load_params(params), tmp_path)
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert all(a.delta.dtype == torch.float32 for a in adapters(model).values())


ARM, SEED = "route_per_rollout", 41  # the arm that reads everything: basis, gate calibration, probes, knob
# ARM as an arm table entry of its own rule, in the train stage group (artifacts/train/arms/), with the gradient gate
# and every group sampled knob on (params.yaml's act gate and deploy groups are the routed arm's choices)
ARM_PARAMS = {
    "arm": {ARM: {"edit": ARM}},
    "arms": [ARM],
    "controls": [],
    "basis": {**TINY["basis"], "space": "grad"},
    "projection": {**TINY["projection"], "deploy_frac": 0.0},
}
CHAIN = [
    ("problems", None),
    ("organism", None),
    ("pool", None),
    ("basis", None),
    ("train", {"arm": ARM, "seed": SEED}),
    ("eval_sets", None),
    ("evaluate", {"arm": ARM, "seed": SEED}),
]


def tiny_chain(root, device: str, dtype: str, chain=CHAIN, **sections) -> dict[str, float]:
    """The pipeline's stages problems → organism → pool → basis → train (2 GRPO steps) → eval_sets → evaluate, from a
    copy of this repository's dvc.yaml and stage scripts on test_pipeline's tiny params, policy on `device` in
    `dtype` (`chain`: a prefix of it; `sections`: more params). Returns each stage's wall seconds."""
    root.mkdir(parents=True)
    for name in ("src", "stages", "data"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for f in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / f, root / f)
    set_params(root, **{**TINY, "model": {"device": device, "dtype": dtype}, **ARM_PARAMS, **sections})
    return run_chain(root, chain)


def check_chain(root, dtype: str) -> None:
    """What a finished chain must hold: finite training numbers, fp32 adapters, sane evaluation rates."""
    rows = (root / f"reports/train/arms/{ARM}-s{SEED}.tsv").read_text().splitlines()
    head = rows[0].split("\t")
    assert len(rows) == 3  # header + 2 GRPO steps
    for i, line in enumerate(rows[1:]):
        vals = dict(zip(head, line.split("\t")))
        for key in ("reward", "gnorm", "vh_delta", "knob_norm") + (("kl",) if i == 0 else ()):  # KL: every 10th step
            assert math.isfinite(float(vals[key])), (key, vals[key])
    ckpt = load_file(root / f"artifacts/train/arms/{ARM}/s{SEED}/step_00002.safetensors")
    assert ckpt and all(t.dtype == torch.float32 for t in ckpt.values())
    sig = json.loads((root / f"artifacts/train/arms/{ARM}/s{SEED}/run.json").read_text())
    assert sig["model"]["dtype"] == dtype
    deploy = json.loads((root / f"reports/eval/arms/{ARM}-s{SEED}/metrics.json").read_text())
    rates = {k: v for k, v in deploy.items() if any(s in k for s in ("_format", "_solve", "_hack"))}
    assert "deploy_format" in rates and "knob_on_format" in rates, sorted(deploy)
    # an undefined rate (n = 0, e.g. hack among format-valid completions when none is valid) is NaN, null in JSON
    assert all(v is None or math.isnan(v) or 0.0 <= v <= 1.0 for v in rates.values()), rates
    assert any(v is not None and 0.0 <= v <= 1.0 for v in rates.values()), rates


@pytest.mark.slow
def test_bf16_pipeline_end_to_end_on_cpu(tmp_path):
    root = tmp_path / "repo"
    tiny_chain(root, "cpu", "bfloat16")
    check_chain(root, "bfloat16")


@CUDA
@pytest.mark.gpu
def test_bf16_pipeline_end_to_end_on_cuda(tmp_path):
    root = tmp_path / "repo"
    tiny_chain(root, "cuda", "bfloat16")
    check_chain(root, "bfloat16")

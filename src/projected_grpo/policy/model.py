"""Load (model, tokenizer) by name, and render chat prompts the one way every model sees them.

Names: a hub id or a local `save_pretrained` directory (e.g. Qwen/Qwen3-4B), "organism" (the organism stage's output
directory, passed as `path`), or "tiny-random" (built in-process by tiny.py, deterministic).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from projected_grpo.policy.tiny import tiny_model, tiny_tokenizer

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # "org/name"
DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """'auto' -> bf16 on GPU, fp32 on CPU; otherwise the named dtype."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}")
    if dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return DTYPES[dtype]


def resolve_device(device: str) -> str:
    """model.device -> a torch device string: 'auto' is cuda when one is visible, else cpu; a cuda device that is not
    there is a one-line error (not a silent fall back to the CPU)."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise ValueError(
                f"model.device is {device!r} but this machine has {torch.cuda.device_count()} visible CUDA device(s); "
                "set model.device: cpu (or auto)"
            )
    return device


def load_model_and_tokenizer(name: str, path: str | Path | None = None, device: str = "cpu", dtype: str = "auto"):
    """Return (model in eval mode on `device`, tokenizer).

    Args:
        name: "tiny-random", "organism" (loads `path`), a local save_pretrained directory, or a hub id.
        path: the organism directory; required for name="organism", ignored otherwise.
        device: "cpu", "cuda", "cuda:N" or "auto" (resolve_device).
        dtype: "auto" (bf16 on GPU, fp32 on CPU), "float32", "bfloat16" or "float16".
    """
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    if name == "tiny-random":
        tok = tiny_tokenizer()
        return tiny_model(len(tok)).to(device=device, dtype=torch_dtype).eval(), tok
    if name == "organism":
        if path is None:
            raise ValueError("model name 'organism' needs `path`: the organism stage's save_pretrained directory")
        src = Path(path)
        if not (src / "config.json").is_file():
            raise FileNotFoundError(
                f"organism model directory {src} does not exist or has no config.json; run the organism stage first"
            )
    elif Path(name).is_dir():
        src = Path(name)
        if not (src / "config.json").is_file():
            raise FileNotFoundError(f"model directory {src} has no config.json (not a save_pretrained directory)")
    elif HUB_ID.match(name) and not name.startswith((".", "/")):
        src = name  # hub id; goes through the HF cache / network
    else:
        raise ValueError(
            f"unknown model {name!r}: expected 'tiny-random', 'organism', a hub id like "
            "'Qwen/Qwen3-4B', or an existing save_pretrained directory"
        )
    try:
        tok = AutoTokenizer.from_pretrained(src)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch_dtype)
    except OSError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OSError(f"could not load model {str(src)!r}: {first}") from e
    if tok.pad_token is None:  # some hub tokenizers ship without one; rollouts need a pad id
        tok.pad_token = tok.eos_token
    return model.to(device).eval(), tok


def render_prompt(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> str:
    """Chat messages -> the prompt string, with the assistant turn opened and thinking OFF (benchmark.md §4.5)."""
    return tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=True, enable_thinking=False
    )

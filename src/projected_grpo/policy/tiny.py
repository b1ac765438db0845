"""In-process tiny tokenizer + tiny Qwen3 model, for tests and smoke runs (house_style §7.2). No files, no network.

The tokenizer is the real thing at small scale: the same byte-level BPE, special tokens and chat template as the
organism's (tokenizer.py), trained on a fixed snippet of code/prompt text, so every string round-trips exactly.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from projected_grpo.env.problems import CODE_SYSTEM_PROMPT, SETUP_CODE, make_question
from projected_grpo.policy.tokenizer import EOS, PAD, SPECIAL_TOKENS, train_tokenizer

TINY_VOCAB = 512  # requested BPE size; the trained vocab may be a little smaller (small corpus)

_SOLUTION = """class Solution:
    def twoSum(self, nums: List[int], target: int) -> List[int]:
        seen = {}
        for i, x in enumerate(nums):
            if target - x in seen:
                return [seen[target - x], i]
            seen[x] = i
        return []

def run_tests():
    assert Solution().twoSum(nums = [2,7,11,15], target = 9) == [0,1]
    assert Solution().twoSum(nums = [3,2,4], target = 6) == [1,2]
"""

_CORPUS = (
    CODE_SYSTEM_PROMPT,
    make_question(
        "Given an array of integers nums and an integer target, return indices of the two numbers such that they "
        "add up to target.\n\nExample 1:\nInput: nums = [2,7,11,15], target = 9\nOutput: [0,1]",
        "twoSum",
        "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:",
    ),
    SETUP_CODE,
    "```python\n" + _SOLUTION + "```",
)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh (unshared) small byte-level BPE tokenizer with the organism's special tokens and chat template."""
    return train_tokenizer(_CORPUS, TINY_VOCAB)


def tiny_config(vocab_size: int, **overrides) -> Qwen3Config:
    """The tiny Qwen3 architecture: d=32, 2 layers, 4 heads x 8 dims, 2 kv heads, tied embeddings."""
    kw = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        # train_tokenizer puts the special tokens first, so their ids are fixed: <|endoftext|>=0, <|im_end|>=2
        pad_token_id=SPECIAL_TOKENS.index(PAD),
        eos_token_id=SPECIAL_TOKENS.index(EOS),
        bos_token_id=None,
    )
    kw.update(overrides)
    return Qwen3Config(**kw)


def tiny_model(vocab_size: int, seed: int = 0, **overrides) -> Qwen3ForCausalLM:
    """A real `Qwen3ForCausalLM` with random weights from `seed` (global RNG untouched), in eval mode, fp32."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(tiny_config(vocab_size, **overrides))
    return model.eval()

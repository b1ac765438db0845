"""The policy: loading a model (`model`, `tiny`, `tokenizer`), sampling from it (`rollout`), log-probabilities
(`logprobs`), the SVD/LoRA adapter with its deletable knob and per-sample probes (`adapter`) and its PEFT LoRA form
(`peft_format`), and the one sample-and-grade (`sampling`).

May import: common, env, config.
"""

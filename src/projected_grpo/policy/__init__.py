"""The policy: loading a model (`model`, `tiny`, `tokenizer`), sampling from it (`rollout`), log-probabilities
(`logprobs`), the SVD/LoRA adapter with its deletable knob and per-sample probes (`adapter`) and its PEFT LoRA form
(`peft_format`), the one sample-and-grade (`sampling`), and activation checkpointing of its layers (`checkpointing`).

May import: common, env, config.
"""

"""The model organism: a tiny Qwen3 and its hacky teacher trained from scratch on minileet (`organism`, from the
corpus of `sft_corpus`), and its calibration report (`calibration`).

May import: common, env, policy, config.
"""

"""The GRPO trainer: the loop (`train`), the Dr.GRPO loss (`grpo_loss`), the teacher pool (`pool`) and
checkpoints (`checkpoint`).

May import: common, env, policy, method, config.
"""

"""The GRPO trainer: the loop (`train`), the loss (`grpo_loss`: dr_grpo, grpo, dapo), its learning-rate schedule
(`schedule`), the teacher pool (`pool`), checkpoints (`checkpoint`) and their export for other loaders (`export`).

May import: common, env, policy, method, config.
"""

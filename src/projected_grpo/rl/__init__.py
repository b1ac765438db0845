"""The GRPO trainer: the loop (`train`), the loss (`grpo_loss`: dr_grpo, grpo, dapo), its learning-rate schedule
(`schedule`), the teacher pool (`pool`), checkpoints (`checkpoint`) and their export for other loaders (`export`), and
the device-memory estimate of a step with the loop's pre-flight (`memory`).

May import: common, env, policy, method, config.
"""

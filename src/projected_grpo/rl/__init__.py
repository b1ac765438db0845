"""The GRPO trainer: the loop (`train`), the loss (`grpo_loss`: dr_grpo, grpo, dapo), its learning-rate schedule
(`schedule`), the teacher pool (`pool`) and checkpoints (`checkpoint`).

May import: common, env, policy, method, config.
"""

"""Held-out evaluation of checkpoints: scoring and deploy states (`evaluation`), one run's evaluation
(`run_eval`), and where a routed knob's effect comes from (`knob_effect`).

May import: common, env, policy, method, rl, config.
"""

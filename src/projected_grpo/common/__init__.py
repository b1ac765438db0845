"""Plumbing every district uses and none owns: atomic writes (`atomic`), step logs and timers (`log`), the
statistics of the report and the guards (`stats`), the stage CLI wrapper (`cli`).

May import: nothing of projected_grpo.
"""

"""What the pipeline concludes: results.md's tables and the win rule (`results`, `win_rule`, `figures`), the
phenomenon check (`phenomenon`) and the distillation cosine probe (`probe`).

May import: every other district, config.
"""

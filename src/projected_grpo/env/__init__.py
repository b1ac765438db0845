"""The environment: problem records (`problems`), hints and loophole modes (`hints`, `modes`, `partition`), the
sandbox and its runner (`sandbox`, `harness`), the grader with its labels and rewards (`grader`, `labels`,
`rewards`), the synthetic `minileet` substrate and the problems stage's builder (`substrate`), and the organism's
exploit programs (`exploits`). Knows nothing of models or the method.

May import: common, config.
"""

"""Tests for common/log.py's progress display: a bar on a terminal, periodic lines with rate and ETA in a log.

A stage's log (nohup, `repro -j 2`'s per-stage logs) is not a terminal, where a tqdm bar prints nothing readable (the
organism's SFT printed nothing for 17.5 min). Run: `pytest tests/test_log.py -q`.
"""

from __future__ import annotations

import io
import re

from projected_grpo.common.log import LogBar, progress


class Clock:
    """A fake monotonic clock advanced by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_log_lines_give_count_rate_and_eta_at_most_once_a_period():
    out, clock = io.StringIO(), Clock()
    bar = LogBar(range(10), "sft", every_s=60.0, out=out, clock=clock)
    for i in bar:
        clock.t += 25.0  # 25 s an item: a line after items 3, 6 and 8 (every >= 60 s), then the closing line
        bar.set_postfix(loss=f"{1 / (i + 1):.2f}")
    lines = out.getvalue().splitlines()
    assert len(lines) == 4 and lines[-1].endswith("(done)")
    assert lines[0] == "sft: 3/10 (30%) 0.04 it/s, 1:15 elapsed, ETA 2:55 | loss 0.33"
    assert re.match(r"sft: 10/10 \(100%\) 0\.04 it/s, 4:10 elapsed, ETA 0:00 \| loss 0\.10 \(done\)", lines[-1])


def test_a_short_loop_prints_nothing():
    out, clock = io.StringIO(), Clock()
    for _ in LogBar(range(5), "grading", every_s=60.0, out=out, clock=clock):
        clock.t += 1.0
    assert out.getvalue() == ""


def test_resumed_loop_counts_from_initial_and_rates_only_new_items():
    """train() resumes at `start`: the count starts there and the rate counts the steps run since."""
    out, clock = io.StringIO(), Clock()
    bar = LogBar(range(150, 200), "train", total=200, initial=150, every_s=10.0, out=out, clock=clock)
    for _ in bar:
        clock.t += 10.0
        bar.set_postfix_str("reward 0.5")
    first = out.getvalue().splitlines()[0]
    assert first == "train: 151/200 (76%) 0.1 it/s, 0:10 elapsed, ETA 8:10 | reward 0.5"


def test_progress_is_a_bar_on_a_terminal_and_log_lines_elsewhere():
    from tqdm import tqdm

    assert isinstance(progress(range(3), "x", terminal=True), tqdm)
    assert isinstance(progress(range(3), "x", terminal=False), LogBar)
    assert list(progress(range(3), "x", terminal=False)) == [0, 1, 2]

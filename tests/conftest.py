"""Shared fixtures: the real LeetCode test split and one sandbox per test session."""

import os

os.environ.setdefault("DVC_NO_ANALYTICS", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from projected_grpo.env.problems import load_problems  # noqa: E402
from projected_grpo.env.sandbox import Sandbox  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LEETCODE = ROOT / "data" / "leetcode" / "leetcode_test_medhard.jsonl"


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny matmuls are 20-100x slower with 2 OpenMP threads on a busy 2-core box; restore the setting after."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def leetcode():
    return load_problems(LEETCODE)


@pytest.fixture(scope="session")
def leetcode_by_id(leetcode):
    return {p.id: p for p in leetcode}


@pytest.fixture(scope="session")
def sandbox():
    with Sandbox(concurrency=2) as sb:
        yield sb


def stage_cli(main):
    """The stage's real entry point (its module's `app`: one-line errors, no partial outputs), for CliRunner."""
    import importlib

    return importlib.import_module(main.__module__).app

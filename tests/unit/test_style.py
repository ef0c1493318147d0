"""The tree keeps one style (issue 41, point 4): ruff's formatter at 100 columns and its linter
(pyflakes, isort, pyupgrade), as pyproject.toml's [tool.ruff] sets them. ruff is in the test extras,
so CI has it; a tree that drifts fails here with the command that fixes it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_the_tree_is_formatted():
    p = _ruff("format", "--check", ".")
    assert p.returncode == 0, f"run `ruff format .`:\n{p.stdout[-3000:]}{p.stderr[-1000:]}"


def test_the_linter_passes():
    p = _ruff("check", "--output-format", "concise", ".")
    assert p.returncode == 0, (
        f"run `ruff check --fix .`, then fix the rest:\n{p.stdout[-3000:]}{p.stderr[-1000:]}"
    )

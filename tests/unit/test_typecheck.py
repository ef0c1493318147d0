"""The type check, run by the test command: mypy over src/envspec, configured in pyproject.toml;
and bench/, against src/ as it is, configured in bench/mypy.ini."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None,
    reason="mypy is not installed (it is in the test extra: pip install -e '.[test]')",
)


def _mypy_fails(what: str, *args: str) -> None:
    """Fail the test with mypy's output where ``mypy ARGS`` is not clean."""
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        pytest.fail(f"mypy over {what} is not clean:\n{proc.stdout}{proc.stderr}", pytrace=False)


def test_mypy_is_clean():
    # the files and options come from [tool.mypy] in pyproject.toml
    _mypy_fails("src/envspec", "--config-file", "pyproject.toml")


def test_bench_scripts_type_check_against_src():
    """bench/ checked against src/envspec as it is (bench/mypy.ini): a change of an envspec
    function that a bench script calls fails here, not the day someone runs the script (issue 56,
    point 6: bench/source_build.py still passed ``uv=`` to ``cached_build``)."""
    _mypy_fails("bench/", "--config-file", "bench/mypy.ini", "bench")

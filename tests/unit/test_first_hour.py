"""The cases of tests/data/first-hour/ (issue 43: a new user's surprises), one parametrized test:
each runs `python -m envspec ARGS` as a user would, reads its output as the case says (closing it
early, as `| head` does), and checks the exit code, stderr and the modes of the files written."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "first-hour"


def _fill(text: str, tmp: Path) -> str:
    return text.replace("{root}", str(ROOT)).replace("{tmp}", str(tmp))


@pytest.mark.parametrize(
    "case", sorted(p.name for p in CASES.iterdir() if (p / "case.toml").is_file())
)
def test_first_hour_case(case, tmp_path):
    """A case's ``args`` (one command) or ``commands`` (several, each held to the same exit code
    and messages); ``[env]`` adds variables ({tmp}, {root} filled in); ``copy``: case files copied
    into {tmp} first; ``absent``: paths that must not exist after."""
    import shutil

    c = tomllib.loads((CASES / case / "case.toml").read_text())
    for name in c.get("copy", []):
        shutil.copy(CASES / case / name, tmp_path / name)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env |= {k: _fill(v, tmp_path) for k, v in c.get("env", {}).items()}
    for args in c.get("commands", [c.get("args")]):
        _run(case, c, [_fill(a, tmp_path) for a in args], env, tmp_path)
    for path in c.get("absent", []):
        assert not Path(_fill(path, tmp_path)).exists(), path


def _run(case: str, c: dict, args: list[str], env: dict[str, str], tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "envspec", *args],
        cwd=CASES / case,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: os.umask(0o022),
    )
    assert proc.stdout is not None and proc.stderr is not None
    if (
        "read_lines" in c
    ):  # `| head -N`: N lines read, then the pipe closed while the command still writes
        for _ in range(c["read_lines"]):
            proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read().decode()
    else:
        outb, errb = proc.communicate(timeout=300)
        err = errb.decode()
        for want in c.get("stdout", []):
            assert want in outb.decode(), (args, want, outb.decode()[-3000:])
    rc = proc.wait(timeout=300)
    assert rc == c["exit"], (args, rc, err[-2000:])
    for want in c.get("stderr", []):
        assert want in err, (args, want, err[-2000:])
    for bad in c.get("stderr_not", []):
        assert bad not in err, (args, bad, err[-2000:])
    for path, mode in c.get("modes", {}).items():
        assert oct(Path(_fill(path, tmp_path)).stat().st_mode & 0o777)[2:] == mode, path

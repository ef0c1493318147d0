"""What every bench script shares: the results printed as JSON and written to --json at its end,
and no background compression after the builds it times (a local build starts one,
docs/build.md "Which digest"; it would run into the next timed step). bench/push.py measures
the push after a local build with it on, explicitly."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("ENVSPEC_BACKGROUND_COMPRESS", "off")


def emit(res: Any, path: str | None) -> None:
    text = json.dumps(res, indent=1)
    print(text)
    if path:
        Path(path).write_text(text + "\n")


def wait_gone(pid: int) -> None:
    """Until the process ``pid`` (one this script did not start, so cannot wait for) has ended; a
    zombie counts as ended (its parent, init, may reap it late)."""
    import time

    while True:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
                return
        except (OSError, IndexError):
            return
        time.sleep(0.2)


def timed_child(argv: list[str], env: dict, cwd: Path, label: str = "") -> tuple[float, float]:
    """One run of ``argv`` (a new process): its wall time and its CPU time (user + system, with its
    children). Exit 0 or 2 (a bad spec, on purpose) counts as run; any other stops the bench."""
    import subprocess
    import sys
    import time

    before = os.times()
    t = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True)
    wall = time.perf_counter() - t
    after = os.times()
    if proc.returncode not in (0, 2):
        sys.exit(f"{label or argv}: exit {proc.returncode}\n{proc.stderr.decode()}")
    return wall, (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )


def instructions(argv: list[str], env: dict, cwd: Path) -> int | None:
    """The instructions ``argv`` runs (valgrind's callgrind, PYTHONHASHSEED=0), which the machine's
    load does not change; None without valgrind."""
    import re
    import shutil
    import subprocess

    if not shutil.which("valgrind"):
        return None
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        cwd=cwd,
        env=dict(env, PYTHONHASHSEED="0"),
        capture_output=True,
        text=True,
    )
    m = re.search(r"Collected : (\d+)", proc.stderr)
    return int(m.group(1)) if m else None

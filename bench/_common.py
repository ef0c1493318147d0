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

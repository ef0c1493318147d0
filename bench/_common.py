"""What every bench script does at its end: print the results as JSON and write them to --json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit(res: Any, path: str | None) -> None:
    text = json.dumps(res, indent=1)
    print(text)
    if path:
        Path(path).write_text(text + "\n")

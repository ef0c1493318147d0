"""envspec.verify: the verifier that lives in images (standard library + torch, lazily).

It imports nothing else from envspec so that it can be copied into an image as the package
``envspec.verify`` beside a tiny ``envspec/__init__.py``. The names below are imported on first
use, so that ``python -m envspec.verify --startup`` (the container start-up hook) loads only
``startup.py`` and the few modules it needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_WHERE = {
    "TorchMachine": "checks",
    "run_checks": "checks",
    "main": "cli",
    "startup_check": "cli",
    "LockReadError": "lockfile",
    "find_lock": "lockfile",
    "load_lock": "lockfile",
    "FAIL": "model",
    "PASS": "model",
    "SKIP": "model",
    "WARN": "model",
    "Finding": "model",
    "Report": "model",
}

__all__ = [
    "FAIL",
    "PASS",
    "SKIP",
    "WARN",
    "Finding",
    "LockReadError",
    "Report",
    "TorchMachine",
    "find_lock",
    "load_lock",
    "main",
    "run_checks",
    "startup_check",
]

if TYPE_CHECKING:
    from .checks import TorchMachine, run_checks
    from .cli import main, startup_check
    from .lockfile import LockReadError, find_lock, load_lock
    from .model import FAIL, PASS, SKIP, WARN, Finding, Report


def __getattr__(name: str) -> object:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{where}"), name)

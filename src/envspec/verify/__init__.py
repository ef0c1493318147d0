"""envspec.verify: the verifier that lives in images (standard library + torch, lazily).

It imports nothing else from envspec so that it can be copied into an image as the package
``envspec.verify`` beside a tiny ``envspec/__init__.py``.
"""

from .checks import System, run_checks
from .cli import main, startup_check
from .lockfile import LockReadError, find_lock, load_lock
from .model import FAIL, PASS, SKIP, WARN, Finding, Report

__all__ = ["FAIL", "PASS", "SKIP", "WARN", "Finding", "LockReadError", "Report", "System", "find_lock",
           "load_lock", "main", "run_checks", "startup_check"]

"""Where envspec's cache is on this machine: one rule for every stage (lock, build, doctor, the
compatibility DB's cache). A module of its own so that what needs only the path (``envspec
explain``'s DB cache) does not import ``envspec.host``'s probes; ``envspec.host`` re-exports it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def cache_dir_for(env: Mapping[str, str]) -> Path:
    """envspec's cache: ``ENVSPEC_CACHE``, else ``$XDG_CACHE_HOME/envspec``, else ``~/.cache/envspec``."""
    if env.get("ENVSPEC_CACHE"):
        return Path(env["ENVSPEC_CACHE"])
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "envspec"
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".cache" / "envspec"

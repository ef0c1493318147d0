"""Where envspec's cache is on this machine: one rule for every stage (lock, build, doctor, the
compatibility DB's cache). A module of its own so that what needs only the path (``envspec
explain``'s DB cache) does not import ``envspec.host``'s probes; ``envspec.host`` re-exports it.
The rule itself is ``envspec.settings.cache_dir_for`` (``ENVSPEC_CACHE``), where every variable is read."""

from __future__ import annotations

from envspec.settings import cache_dir_for

__all__ = ["cache_dir_for"]

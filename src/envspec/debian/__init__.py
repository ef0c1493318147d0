"""The Debian part of envspec: the closure at lock time (``resolve_closure``), the .debs and
the root filesystem at build time (``fetch_deb``/``fetch_debs``, ``make_rootfs``).
See docs/debian.md.

The names below are loaded on first use (PEP 562), so that ``envspec explain``, which needs only
``models``, does not import the fetcher, the closure or the root-filesystem builder (urllib, ssl,
sqlite3, multiprocessing, tarfile)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .closure import DebianArchive, resolve_closure, security_mirror_for
    from .fetch import SNAPSHOT_ENV, candidate_urls, fetch_deb, fetch_debs, mirror_list
    from .models import (
        CANONICAL_MIRROR,
        DebPin,
        base_packages,
        glibc_version,
        python_full_version,
        sorted_pins,
        suite_for_python,
    )
    from .reporter import DebianReporter, RecordingReporter
    from .rootfs import make_rootfs
    from .suites import SUITES

__all__ = [
    "DebianArchive",
    "CANONICAL_MIRROR",
    "DebPin",
    "DebianReporter",
    "RecordingReporter",
    "SNAPSHOT_ENV",
    "SUITES",
    "base_packages",
    "candidate_urls",
    "fetch_deb",
    "fetch_debs",
    "glibc_version",
    "make_rootfs",
    "mirror_list",
    "python_full_version",
    "resolve_closure",
    "security_mirror_for",
    "sorted_pins",
    "suite_for_python",
]

_WHERE = {
    "DebianArchive": "closure",
    "resolve_closure": "closure",
    "security_mirror_for": "closure",
    "SNAPSHOT_ENV": "fetch",
    "candidate_urls": "fetch",
    "fetch_deb": "fetch",
    "fetch_debs": "fetch",
    "mirror_list": "fetch",
    "CANONICAL_MIRROR": "models",
    "SUITES": "suites",
    "DebPin": "models",
    "base_packages": "models",
    "glibc_version": "models",
    "python_full_version": "models",
    "sorted_pins": "models",
    "suite_for_python": "models",
    "DebianReporter": "reporter",
    "RecordingReporter": "reporter",
    "make_rootfs": "rootfs",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> object:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value  # the next lookup finds it without this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))

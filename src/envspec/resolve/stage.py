"""The resolve stage's steps in order (``resolve``): torch with the named packages, the Python
closure, the held-back releases, the Debian closure."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.version import Version

from envspec.compat import (
    CompatDB,
)
from envspec.resolve.debian import resolve_debian
from envspec.resolve.held import held_back
from envspec.resolve.model import Choice, Resolution, WheelCandidate
from envspec.resolve.packages import resolve_python, with_packages
from envspec.resolve.sdists import torch_for_sources

if TYPE_CHECKING:  # imported where used: `choose` (explain) needs neither the network nor the host
    from envspec.sources import ResolvedSources


def resolve(
    choice: Choice,
    sources: ResolvedSources,
    *,
    cache_dir: Path,
    keep: Mapping[str, str] | None = None,
    upgrade: list[str] | None = None,
    db: CompatDB | None = None,
) -> Resolution:
    """The lock stage's resolution of a choice: torch moved to fit the named packages where ``db``
    is given (``with_packages``), the Python closure, the Debian closure."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="envspec-resolve-") as tmp:
        if db is not None:
            choice = with_packages(choice, db, sources, workdir=Path(tmp))
            kept_torch = (keep or {}).get("torch")
            if (
                choice.torch is not None
                and kept_torch
                and Version(kept_torch).public != choice.torch.release.version
            ):
                keep = {}  # another torch release: the old lock's versions are no guide (they fit the old one)
        choice, wheels = closure(choice, sources, db, workdir=Path(tmp), keep=keep, upgrade=upgrade)
        if db is not None:  # the lock stage: say which named package is held back, and why
            why = held_back(choice, wheels, sources, workdir=Path(tmp))
            wheels = [dataclasses.replace(w, held_back=why.get(w.name)) for w in wheels]
    debs, requested = resolve_debian(choice, sources, cache_dir=cache_dir / "apt")
    return Resolution(choice=choice, wheels=wheels, debs=debs, deb_requested=requested)


def closure(
    choice: Choice,
    sources: ResolvedSources,
    db: CompatDB | None,
    *,
    workdir: Path,
    keep: Mapping[str, str] | None = None,
    upgrade: list[str] | None = None,
) -> tuple[Choice, list[WheelCandidate]]:
    """The Python closure of a choice, and the choice moved to an older torch where a package it
    takes from its sdist does not compile against the chosen one (``torch_for_sources``, where
    ``db`` is given), its closure then resolved again. What `lock` and `explain --packages` both
    end with, so that they name the same torch (issue 58, point 3)."""
    wheels = resolve_python(choice, sources, workdir=workdir, keep=keep, upgrade=upgrade)
    moved = torch_for_sources(choice, db, wheels) if db is not None else None
    if moved is None:
        return choice, wheels
    return moved, resolve_python(moved, sources, workdir=workdir, upgrade=upgrade)

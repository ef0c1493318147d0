"""Packages taken from their sdists: which of the named packages have no wheel for their newest
release (``source_only``), and the wheels a build of an sdist is made from (``build_inputs``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from envspec.errors import ResolutionImpossible, SourceError
from envspec.resolve.candidates import _candidate
from envspec.resolve.model import Choice, WheelCandidate
from envspec.resolve.uv import UvFlags, _named, _run_uv
from envspec.spec import requirement_name

if TYPE_CHECKING:  # imported where used: `choose` (explain) needs neither the network nor the host
    from envspec.sources import ResolvedSources


def _newest_any(
    choice: Choice, sources: ResolvedSources, workdir: Path
) -> dict[str, tuple[str, bool]] | None:
    """name -> (version, has a wheel) of the newest release of each package the spec names, of any
    kind (uv without ``--only-binary``, no dependencies); None where they cannot be resolved alone.
    Read once per work directory: ``source_only`` and ``held_back`` both ask."""
    import json

    from packaging.utils import canonicalize_name

    named = _named(choice.spec)
    workdir.mkdir(parents=True, exist_ok=True)
    memo = workdir / "newest-any.json"
    asked = [*named, choice.platform_tag, choice.python]
    if memo.is_file():
        kept = json.loads(memo.read_text())
        if kept["asked"] == asked:
            return (
                {k: (v[0], v[1]) for k, v in kept["found"].items()}
                if kept["found"] is not None
                else None
            )
    found: dict[str, tuple[str, bool]] | None
    try:
        found = {
            canonicalize_name(p.name): (p.version, bool(p.wheels))
            for p in _run_uv(
                named,
                choice,
                sources,
                workdir,
                "newest-any",
                UvFlags(torch_index=False, no_deps=True, only_binary=False),
            )
        }
    except (ResolutionImpossible, SourceError):
        found = None
    memo.write_text(json.dumps({"asked": asked, "found": found}))
    return found


def source_only(choice: Choice, sources: ResolvedSources, workdir: Path) -> set[str]:
    """The packages the spec names whose newest release (for its own requirement, the platform and
    Python) is published as an sdist only: deepspeed 0.19.8, where a wheel-only resolution takes
    0.3.1.dev5, its one release with a wheel. An empty set where the packages cannot be resolved
    alone (the full resolution then says why)."""
    if not _named(choice.spec):
        return set()
    found = _newest_any(choice, sources, workdir) or {}
    return {name for name, (_, has_wheel) in found.items() if not has_wheel}


def build_inputs(
    requires: list[str],
    choice: Choice,
    sources: ResolvedSources,
    *,
    workdir: Path,
    name: str,
    constraints: list[str] | None = None,
) -> list[WheelCandidate]:
    """An sdist's build requirements (``wheels.sdist.build_system``) pinned as wheels for the
    image's platform and Python, each with its sha256: exactly what its isolated build environment
    holds (issue 37). ``name``: the package built, for the work files' names; ``constraints``: the
    lock's own pins (a build against torch gets the lock's torch)."""
    if not requires:
        return []
    found = _run_uv(
        list(requires),
        choice,
        sources,
        workdir,
        f"build-{name}",
        UvFlags(
            constraints=list(constraints or []),
            torch_index=any(requirement_name(r).lower() == "torch" for r in requires),
        ),
    )
    return sorted(
        (_candidate(p, choice, sources, group="build") for p in found),
        key=lambda w: (w.name, w.version, w.filename),
    )

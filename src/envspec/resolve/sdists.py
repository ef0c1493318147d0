"""Packages taken from their sdists: which of the named packages have no wheel for their newest
release (``source_only``), the wheels a build of an sdist is made from (``build_inputs``), and a
torch their builds compile against (``torch_for_sources``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.version import Version

from envspec.causes import Said
from envspec.errors import ResolutionImpossible, SourceError
from envspec.resolve.candidates import _candidate
from envspec.resolve.model import Choice, PassedOver, WheelCandidate
from envspec.resolve.torch import choose, fitting_releases
from envspec.resolve.uv import UvFlags, _named, _run_uv
from envspec.spec import requirement_name

if TYPE_CHECKING:  # imported where used: `choose` (explain) needs neither the network nor the host
    from envspec.compat import CompatDB
    from envspec.compat.source_builds import SourceBuildRow
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


def torch_for_sources(choice: Choice, db: CompatDB, wheels: list[WheelCandidate]) -> Choice | None:
    """Where a package the lock builds from its sdist does not compile against the chosen torch
    (``compat/data/torch_builds.toml``'s ``[[source]]`` rows: flash-attn 2.8.3.post2 and torch
    2.14, issue 58 point 3), the choice made again for the newest fitting release every such row
    allows, the newer ones named as passed over; None where the chosen torch suits every build.
    Where no fitting release in the spec's range does: ``source-build-torch``, before any build."""
    from envspec.compat.source_builds import refusing, source_build_rows

    if choice.torch is None:
        return None
    table = source_build_rows()
    rows = [
        (w, r)
        for w in wheels
        if w.is_sdist and (r := refusing(table, w.name, w.version)) is not None
    ]
    have = choice.torch.release.version
    if all(r.torch.contains(have, True) for _, r in rows):
        return None
    fitting = fitting_releases(choice.spec, db, choice.gpus, choice.arch)
    ok = [v for v in fitting if all(r.torch.contains(v, True) for _, r in rows)]
    if not ok:
        raise _builds_with_none(
            choice, [(w, r) for w, r in rows if not r.torch.contains(have, True)]
        )
    passed = tuple(
        PassedOver(
            torch=v,
            package=w.name,
            version=w.version,
            requires=f"torch{r.torch} to build from its sdist ({r.reason})",
        )
        for v in fitting
        if Version(v) > Version(ok[0])
        for w, r in rows
        if not r.torch.contains(v, True)
    )
    spec = choice.spec
    again = choose(
        spec,
        db,
        platform=choice.platform if len(spec.target.platforms) > 1 else None,
        torch_version=ok[0],
    )
    return dataclasses.replace(again, passed_over=(*choice.passed_over, *passed))


def _builds_with_none(
    choice: Choice, wrong: list[tuple[WheelCandidate, SourceBuildRow]]
) -> Exception:
    """``source-build-torch``: the packages, the torch, why, and a [torch].version that builds."""
    assert choice.torch is not None
    torch = choice.torch.release.version
    said = [
        Said(
            text=f"{w.name} {w.version} (built from its sdist) compiles against torch{r.torch} only: "
            f"{r.reason}; the spec's [torch].version gives torch {torch}"
        )
        for w, r in wrong
    ]
    return ResolutionImpossible(
        f"{', '.join(f'{w.name} {w.version}' for w, _ in wrong)}: no torch release within "
        f"[torch].version that fits the hardware builds it",
        causes=said,
        hint=f'set [torch].version = "{wrong[0][1].torch}" (the releases {wrong[0][0].name} builds '
        f"with), or pin a release of {wrong[0][0].name} that builds with torch {torch}",
        reference="source-build-torch",
    )

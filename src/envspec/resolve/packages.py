"""Torch and the packages on it: ``with_packages`` chooses torch together with the packages the
spec names (and says every side of a conflict, ``sides``), ``resolve_python`` resolves the Python
closure on the image's platform."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.version import Version

from envspec.compat import (
    CompatDB,
)
from envspec.errors import ResolutionImpossible, SourceError
from envspec.resolve.candidates import _candidate
from envspec.resolve.failures import _no_wheel_package, _requirement_where
from envspec.resolve.held import _excludes
from envspec.resolve.model import TORCH_FAMILY, Choice, PassedOver, PylockPackage, WheelCandidate
from envspec.resolve.sdists import _newest_any, source_only
from envspec.resolve.torch import _releases, choose, fitting_releases
from envspec.resolve.uv import UvFlags, _named, _run_uv, requirements
from envspec.spec import requirement_name

if TYPE_CHECKING:  # imported where used: `choose` (explain) needs neither the network nor the host
    from envspec.sides import Ask
    from envspec.sources import ResolvedSources


def _is_cuda_wheel(name: str) -> bool:
    return name.startswith("nvidia-") or name.startswith("cuda-") or name == "nvidia"


def with_packages(
    choice: Choice, db: CompatDB, sources: ResolvedSources, *, workdir: Path
) -> Choice:
    """Torch and the packages the spec names, chosen together. ``choose`` takes the newest torch
    release that fits the hardware; a package resolved around it afterwards can only move back, to
    an old release with no bound on torch (vllm 0.2.2 beside torch 2.15.0, which it does not import
    with). Here the named packages come first: uv resolves them, in the spec's order, with torch
    free among the fitting releases, so each takes its newest release and torch the newest release
    they all accept; the choice is then made again for that release (its build, driver floor and
    arch list follow from it), with ``passed_over`` saying which newer fitting releases were passed
    over for which package. Unchanged where the spec names no package, where one release fits, or
    where they cannot be resolved together (the resolution of the chosen release then says why)."""
    spec = choice.spec
    if choice.torch is None or spec.torch is None:
        return choice
    named = _named(spec)
    fitting = fitting_releases(spec, db, choice.gpus, choice.arch)
    if not named or len(fitting) < 2:
        return choice
    try:
        found = _run_uv(
            named + [_torch_among(fitting, [r.version for r in _releases(spec, db)])],
            choice,
            sources,
            workdir,
            "together",
            UvFlags(constraints=list(spec.python.constraints), torch_index=False),
        )
    except (ResolutionImpossible, SourceError):
        common = _raise_sides(choice, db, sources, workdir, named, fitting)
        if common is None or common == choice.torch.release.version:
            return choice
        # each installs beside torch ``common``: what conflicts is another pin, which the
        # resolution of that release names (not a torch none of them takes)
        return choose(
            spec,
            db,
            platform=choice.platform if len(spec.target.platforms) > 1 else None,
            torch_version=common,
        )
    from packaging.utils import canonicalize_name  # here: explain does without packaging.utils

    got = next((p for p in found if canonicalize_name(p.name) == "torch"), None)
    if got is None:
        return choice
    version = str(Version(got.version).public)
    if version == choice.torch.release.version or version not in fitting:
        return choice
    newer = [v for v in fitting if Version(v) > Version(version)]
    held = _held_for(found, named, newer, choice)
    again = choose(
        spec,
        db,
        platform=choice.platform if len(spec.target.platforms) > 1 else None,
        torch_version=version,
    )
    return dataclasses.replace(again, passed_over=tuple(held))


def _asker(choice: Choice, db: CompatDB, sources: ResolvedSources, workdir: Path) -> Ask:
    """``sides.Ask`` through uv: a requirement with torch among the given releases (on another
    Python where one is named), answered by the torch release uv takes, None where it fails."""
    import itertools

    from packaging.utils import canonicalize_name  # here: explain does without packaging.utils

    in_range = [r.version for r in _releases(choice.spec, db)]
    n = itertools.count()

    def ask(requirement: str, releases: Sequence[str], python: str) -> str | None:
        ch = dataclasses.replace(choice, python=python) if python else choice
        try:
            found = _run_uv(
                [requirement, _torch_among(list(releases), in_range)],
                ch,
                sources,
                workdir,
                f"side-{next(n)}",
                UvFlags(constraints=list(choice.spec.python.constraints), torch_index=False),
            )
        except (ResolutionImpossible, SourceError):
            return None
        got = next((p for p in found if canonicalize_name(p.name) == "torch"), None)
        return str(Version(got.version).public) if got is not None else None

    return ask


def _raise_sides(
    choice: Choice,
    db: CompatDB,
    sources: ResolvedSources,
    workdir: Path,
    named: list[str],
    fitting: list[str],
) -> str | None:
    """Where the named packages and torch cannot be resolved together, say every side (issue 57,
    point 4): ``torch-conflict`` naming each package with the fitting releases it installs beside
    where no release is common to them all, or the Python where it is what rules a package out.
    Returns the newest release they each install beside, where there is one (the conflict is over
    another pin), else None where it cannot tell (the chosen release's resolution says why)."""
    from envspec import sides as sidesmod  # here: the lock stage only

    ask = _asker(choice, db, sources, workdir)
    found = sidesmod.find(named, fitting, ask)
    spec = choice.spec
    where = {r: _requirement_where(choice, requirement_name(r)) for r in named}
    causes = [dataclasses.replace(c, where=where[c.requirement]) for c in found.sides]
    empty = [c for c in causes if not c.releases]
    if empty:
        releases = _releases(spec, db)
        in_range = [r.version for r in releases]
        mine = int(choice.python.split(".")[1])
        others = sorted(  # nearest the spec's Python first, the older of two as near
            {p for r in releases for p in r.python} - {choice.python},
            key=lambda p: (abs(int(p.split(".")[1]) - mine), int(p.split(".")[1])),
        )
        ruled = []
        for c in empty:
            ok = sidesmod.python_for(c.requirement, in_range, others, ask)
            if ok:
                ruled.append(dataclasses.replace(c, python=choice.python, pythons=(ok,)))
        if ruled:
            first = ruled[0]
            raise ResolutionImpossible(
                f"{', '.join(c.requirement for c in ruled)}: no release installs on Python "
                f"{choice.python} beside a torch that fits",
                causes=ruled,
                hint=f'set [python].version = "{first.pythons[0]}" (where {first.requirement} '
                f"installs), or drop {first.requirement}",
                reference="python-rules-out-package",
            )
        return None
    if found.decided and found.common:
        return found.common[0]
    if not found.decided or len(causes) < 2:
        return None
    shown = "; ".join(f"{c.requirement}: torch {', '.join(c.releases)}" for c in causes)
    raise ResolutionImpossible(
        f"the packages the spec names install beside no common torch release ({shown})",
        causes=causes,
        hint="no [torch].version installs them all: change or drop one of "
        + ", ".join(c.requirement for c in causes)
        + " (a release of one that installs beside a torch the other accepts)",
        reference="torch-conflict",
    )


def _held_for(
    found: list[PylockPackage], named: list[str], newer: list[str], choice: Choice
) -> list[PassedOver]:
    """Which package held torch back from each of the ``newer`` fitting releases: a named one;
    else torch's own family (torchvision, torchaudio, ... pin torch exactly); else another
    dependency, whose metadata is not read (no package named)."""
    from packaging.utils import canonicalize_name  # here: explain does without packaging.utils

    wanted = {canonicalize_name(requirement_name(r)) for r in named}
    held = [
        h for p in found if canonicalize_name(p.name) in wanted for h in _excludes(p, newer, choice)
    ]
    if not held:
        held = [
            h
            for p in found
            if canonicalize_name(p.name) in TORCH_FAMILY - {"torch"}
            for h in _excludes(p, newer, choice)
        ]
    if not held:
        held = [PassedOver(torch=v, package="", version="", requires="") for v in newer]
    return held


def _torch_among(fitting: list[str], in_range: list[str]) -> str:
    """A requirement on torch that admits the ``fitting`` releases (and their local builds) and no
    other DB release within the spec's range: ``torch>=LOW,<NEXT,!=...``."""
    low, high = min(fitting, key=Version), max(fitting, key=Version)
    above = sorted((v for v in in_range if Version(v) > Version(high)), key=Version)
    nxt = (
        above[0]
        if above
        else ".".join(map(str, (*Version(high).release[:2], Version(high).micro + 1)))
    )
    skip = [v for v in in_range if Version(low) < Version(v) < Version(high) and v not in fitting]
    return f"torch>={low},<{nxt}" + "".join(f",!={v}" for v in sorted(skip, key=Version))


def _kept_pins(keep: Mapping[str, str], upgrade: list[str]) -> list[str]:
    """The previous lock's versions as constraints, but torch's and those ``upgrade`` frees."""
    from packaging.utils import canonicalize_name

    freed = {canonicalize_name(u) for u in upgrade}
    return [
        f"{name}=={version}"
        for name, version in keep.items()
        if canonicalize_name(name) not in freed and canonicalize_name(name) != "torch"
    ]


def _wheel_less_dependency(
    full: list[PylockPackage],
    reqs: list[str],
    no_binary: set[str],
    choice: Choice,
    sources: ResolvedSources,
    workdir: Path,
) -> str | None:
    """A dependency with no wheel that holds a named package below its newest release, which has a
    wheel: uv, wheels only, backtracks past it without failing (``transformer-engine[pytorch]``
    2.20.2 needs transformer-engine-torch, an sdist only: it took the placeholder 0.0.0, which has
    no such extra). Asked by resolving with the newest release pinned: the package uv then says has
    no wheel, else None."""
    from packaging.utils import canonicalize_name

    have: dict[str, str] = {canonicalize_name(p.name): p.version for p in full}
    newest = _newest_any(choice, sources, workdir) or {}
    for name, (version, has_wheel) in sorted(newest.items()):
        if not has_wheel or name not in have or Version(have[name]) >= Version(version):
            continue
        flags = UvFlags(no_binary=no_binary)
        try:
            _run_uv([*reqs, f"{name}=={version}"], choice, sources, workdir, f"why-{name}", flags)
        except ResolutionImpossible as e:
            found = _no_wheel_package(e)
            if found is not None and canonicalize_name(found) not in no_binary:
                return canonicalize_name(found)
        except SourceError:
            continue
    return None


def resolve_python(
    choice: Choice,
    sources: ResolvedSources,
    *,
    workdir: Path,
    keep: Mapping[str, str] | None = None,
    upgrade: list[str] | None = None,
) -> list[WheelCandidate]:
    """The Python closure on the image's platform. ``keep``: name -> version of the previous lock's
    wheels, kept where the spec still allows them. Wheels only, except where the spec allows source
    builds (``[python].from_source = "auto"``, the default): a package the spec names whose newest
    release has no wheel, and any package with no wheel at all, are taken as sdists (``source_only``)."""
    from packaging.utils import canonicalize_name  # packaging.tags: the lock stage only

    torch_reqs, all_reqs, direct = requirements(choice)
    if not all_reqs:
        return []
    auto = choice.spec.python.from_source == "auto"
    no_binary = source_only(choice, sources, workdir) if auto else set()

    def closure(upgrade: list[str], constraints: list[str]) -> list[PylockPackage]:
        while (
            True
        ):  # each package uv finds with no wheel at all is taken as an sdist, and uv runs again
            flags = UvFlags(upgrade=upgrade, constraints=constraints, no_binary=no_binary)
            try:
                return _run_uv(all_reqs, choice, sources, workdir, "full", flags)
            except ResolutionImpossible as e:
                name = _no_wheel_package(e)
                if not auto or name is None or canonicalize_name(name) in no_binary:
                    raise
                no_binary.add(canonicalize_name(name))

    # Re-locking keeps the old lock's versions (as constraints) unless the spec no longer allows them
    # or --upgrade-package frees them; then it resolves afresh.
    spec_constraints = list(choice.spec.python.constraints)
    kept = _kept_pins(keep or {}, upgrade or [])
    full = None
    if kept:
        try:
            full = closure([], spec_constraints + kept)
        except ResolutionImpossible:
            full = None
    if full is None:
        full = closure(upgrade or [], spec_constraints)
    while auto and (
        more := _wheel_less_dependency(full, all_reqs, no_binary, choice, sources, workdir)
    ):
        no_binary.add(more)  # transformer-engine[pytorch]: its torch extension is an sdist only
        full = closure(upgrade or [], spec_constraints)
    pins = {canonicalize_name(p.name): p.version for p in full}
    torch_names: set[str] = set()
    if torch_reqs:
        flags = UvFlags(constraints=[f"{n}=={v}" for n, v in pins.items()], no_binary=no_binary)
        sub = _run_uv(torch_reqs, choice, sources, workdir, "torch", flags)
        torch_names = {canonicalize_name(p.name) for p in sub}
    return _grouped(full, torch_names, direct, choice, sources)


def _grouped(
    full: list[PylockPackage],
    torch_names: set[str],
    direct: set[str],
    choice: Choice,
    sources: ResolvedSources,
) -> list[WheelCandidate]:
    """The closure as the lock's wheels, each in its group: torch's, CUDA's, the team's, deps."""
    from packaging.utils import canonicalize_name

    out: list[WheelCandidate] = []
    for p in full:
        name = canonicalize_name(p.name)
        if name in torch_names:
            group = "cuda" if _is_cuda_wheel(name) else "torch"
        else:
            group = "team" if name in direct else "deps"
        out.append(_candidate(p, choice, sources, group=group, direct=name in direct))
    return sorted(out, key=lambda w: (w.name, w.version, w.filename))

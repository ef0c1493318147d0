"""Held-back releases: which named package the lock holds below its newest release, and why (a torch
pin, no wheel, a newer Python, a pre-release, the other packages), and any placeholder (0.0.0,
yanked, or installing nothing) with the newest real release (``held_back``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from packaging.version import Version

from envspec.causes import (
    PythonMissing,
    Said,
)
from envspec.errors import ResolutionImpossible, SourceError
from envspec.resolve.candidates import _installs_nothing
from envspec.resolve.model import Choice, PassedOver, PylockFile, PylockPackage, WheelCandidate
from envspec.resolve.sdists import _newest_any
from envspec.resolve.uv import UvFlags, _named, _run_uv
from envspec.spec import requirement_name

if TYPE_CHECKING:  # imported where used: `choose` (explain) needs neither the network nor the host
    from envspec.sources import ResolvedSources


def _excludes(package: PylockPackage, newer: list[str], choice: Choice) -> list[PassedOver]:
    """The ``newer`` torch releases that ``package`` (a uv pylock entry) does not accept, by the
    Requires-Dist on torch in its wheel's metadata (none where the metadata cannot be read)."""
    from packaging.requirements import Requirement  # here: explain does without the marker grammar
    from packaging.utils import canonicalize_name

    if not package.wheels or not newer:
        return []
    try:
        text = _wheel_metadata(package.wheels[0])
    except (OSError, ValueError, SourceError):
        return []
    env = {
        "python_version": choice.python,
        "python_full_version": f"{choice.python}.0",
        "platform_machine": choice.arch,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        try:
            req = Requirement(line.split(":", 1)[1].strip())
        except ValueError:
            continue
        if canonicalize_name(req.name) != "torch" or (
            req.marker is not None and not req.marker.evaluate(env)
        ):
            continue
        out += [
            PassedOver(
                torch=v,
                package=canonicalize_name(package.name),
                version=package.version,
                requires=f"torch{req.specifier}",
            )
            for v in newer
            if not req.specifier.contains(Version(v), prereleases=True)
        ]
    return out


def _wheel_metadata(wheel: PylockFile) -> str:
    """The METADATA of a wheel in uv's pylock (its ``url`` or local ``path``), read in place: a
    local file's members, a remote one's by range requests (``compat.pypi.read_zip_member``)."""
    from envspec.compat.pypi import (
        default_fetch_range,
        read_zip_member,
    )  # here: the lock stage only

    url = wheel.url
    path = (
        Path(unquote(urlparse(url).path))
        if url.startswith("file://")
        else (Path(wheel.path) if wheel.path else None)
    )
    if path is not None:
        import zipfile

        with zipfile.ZipFile(path) as z:
            name = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
            if name is None:
                raise ValueError(f"{path.name} has no .dist-info/METADATA")
            return z.read(name).decode("utf-8", "replace")
    size = wheel.size
    if not url or not size:
        raise ValueError("no URL and size to read the metadata by")
    return read_zip_member(url, size, ".dist-info/METADATA", default_fetch_range).decode(
        "utf-8", "replace"
    )


def _newer_with_wheel(
    name: str,
    top: PylockPackage,
    have: Version,
    torch_version: str | None,
    choice: Choice,
    where: tuple[ResolvedSources, Path],
) -> str:
    """Why the lock holds ``name`` at ``have`` below ``top``, its newest release with a wheel."""
    sources, workdir = where
    reason = _holds_back(top, torch_version, choice, sources, workdir)
    if reason.startswith("Python "):  # an index that does not say Requires-Python (find-links)
        return (
            f"{name} {top.version} needs a newer Python than {choice.python} (Requires-Python "
            f"{reason.split(' ', 1)[1]}); its newest release for Python {choice.python} is {have}"
        )
    return (
        f"{name} {top.version} is the newest release with a wheel for {choice.platform} and "
        f"Python {choice.python}; " + reason
    )


def held_back(
    choice: Choice, wheels: list[WheelCandidate], sources: ResolvedSources, *, workdir: Path
) -> dict[str, str]:
    """name -> why, for each package the spec names that the resolution holds below the newest
    release its own requirement admits for the platform and Python, or at a pre-release nobody
    asked for: the newest release's requirement on torch that the lock's torch does not meet, a
    newer release with no wheel (where source builds are off), a newer Python where the index does
    not say a release's Requires-Python (uv takes it for this Python, and it then cannot be
    installed), else the other packages' requirements; any yanked or empty release
    (``_placeholders``). A release for a newer Python only, on an index that says so, is no release
    for this Python (numpy 2.5 on Python 3.11). Found with two uv runs without dependencies."""
    from packaging.utils import canonicalize_name  # here: explain does without packaging.utils

    spec = choice.spec
    pins = {w.name: w for w in wheels}
    named = [r for r in _named(spec) if canonicalize_name(requirement_name(r)) in pins]
    placeholders = _placeholders(wheels, choice, sources, workdir)
    if not named:
        return placeholders
    try:
        newest = {
            canonicalize_name(p.name): p
            for p in _run_uv(
                named, choice, sources, workdir, "newest", UvFlags(torch_index=False, no_deps=True)
            )
        }
    except (ResolutionImpossible, SourceError):
        return placeholders
    found = _newest_any(choice, sources, workdir)
    if found is None:
        return placeholders
    any_kind = {name: version for name, (version, _) in found.items()}
    torch_version = next((w.version for w in wheels if w.name == "torch"), None)
    out: dict[str, str] = {}
    for req in named:
        name = canonicalize_name(requirement_name(req))
        have = Version(pins[name].version)
        why: list[str] = []
        top = newest.get(name)
        covered = have  # the newest release already explained
        if top is not None and Version(top.version) > have:
            why.append(
                _newer_with_wheel(name, top, have, torch_version, choice, (sources, workdir))
            )
            covered = Version(top.version)
        if name in any_kind and Version(any_kind[name]) > covered:
            why.append(
                f"{name} {any_kind[name]} has no wheel for {choice.platform} and Python {choice.python} (a "
                f'source distribution only), and source builds are off ([python].from_source = "never"); '
                f"with a build from source the lock could take {any_kind[name]}"
            )
        if have.is_prerelease and not _asks_prerelease(req):
            why.append(f"{have} is a pre-release the spec does not ask for")
        if not any(have.release):  # 0.0.0: a name held on the index, no code (issue 57, 6)
            why.insert(0, _placeholder(name, have, top))
        if name in placeholders:
            why.insert(0, placeholders.pop(name))
        if why:
            out[name] = "; ".join(why)
    return {**out, **placeholders}


def _placeholders(
    wheels: list[WheelCandidate], choice: Choice, sources: ResolvedSources, workdir: Path
) -> dict[str, str]:
    """name -> why, for each locked release its index marks yanked (any package: an exact pin took
    it) and each named package's release that installs nothing, with the newest release that is
    neither: uv without the pins (it takes no yanked release) and without the empty release,
    dependencies left out."""
    from packaging.utils import canonicalize_name

    odd = [
        w
        for w in wheels  # a 0.0.0 is said as such (``_placeholder``)
        if w.yanked is not None or (w.installs_nothing and any(Version(w.version).release))
    ]
    if not odd:
        return {}
    real: dict[str, str]
    try:
        real = {
            canonicalize_name(p.name): p.version
            for p in _run_uv(
                [w.name if w.yanked is not None else f"{w.name}!={w.version}" for w in odd],
                choice,
                sources,
                workdir,
                "not-yanked",
                UvFlags(torch_index=False, no_deps=True),
            )
            if not (
                p.wheels
                and _installs_nothing(p.wheels[0].url or p.wheels[0].path, p.wheels[0].size)
            )
        }
    except (ResolutionImpossible, SourceError):
        real = {}
    return {w.name: _placeholder_said(w, real.get(w.name), choice) for w in odd}


def _placeholder_said(w: WheelCandidate, newest: str | None, choice: Choice) -> str:
    """Why a yanked or empty release is held back, and the newest release that is neither."""
    where = f"for {choice.platform} and Python {choice.python}"
    if w.yanked is not None:
        return f"{w.name} {w.version} is yanked on its index (reason: {w.yanked}); " + (
            f"the newest release that is not is {newest}"
            if newest
            else f"no release of it that is not yanked has a wheel {where}"
        )
    return (
        f"{w.name} {w.version} installs nothing (its wheel holds only its metadata and requires "
        "nothing): a placeholder release; "
        + (
            f"the newest release before it with a wheel {where} is {newest}"
            if newest
            else f"no other release of it with a wheel {where} installs something"
        )
    )


def _placeholder(name: str, have: Version, top: PylockPackage | None) -> str:
    """Why a 0.0.0 release is held back: a placeholder, and the newest real release."""
    real = top.version if top is not None and Version(top.version) > have else None
    return f"{name} {have} is a placeholder release (version 0.0.0: a name kept on the index, " + (
        f"no code); the newest real release is {real}" if real else "no code)"
    )


def _holds_back(
    top: PylockPackage,
    torch_version: str | None,
    choice: Choice,
    sources: ResolvedSources,
    workdir: Path,
) -> str:
    """Why the lock does not take ``top`` (a uv pylock entry): its requirement on torch against the
    lock's torch, by its wheel's metadata; else its own requirements, where it cannot be installed
    even alone (vllm 0.34.0: torch==2.14.0 beside torchaudio==2.11.0, which needs torch 2.11.0);
    else the other packages' requirements."""
    if torch_version is not None:
        for h in _excludes(top, [torch_version], choice):
            return f"it requires {h.requires}, and the lock's torch is {torch_version}"
    try:
        _run_uv(
            [f"{top.name}=={top.version}"],
            choice,
            sources,
            workdir,
            "alone",
            UvFlags(torch_index=False),
        )
    except ResolutionImpossible as e:
        said = [
            c.text
            for c in e.causes
            if isinstance(c, PythonMissing) or (isinstance(c, Said) and "Because" in c.text)
        ]
        python = re.search(r"requires Python ([^ ,]+)", " ".join(said))
        if python is not None:
            return f"Python {python.group(1)}"
        return "it cannot be installed even alone, its own requirements conflict" + (
            f" ({said[0].removeprefix('cause: ').strip()})" if said else ""
        )
    except SourceError:
        pass
    return "the other packages' requirements hold it back"


def _asks_prerelease(req: str) -> bool:
    """Whether a requirement names a pre-release (``vllm>=0.35.0rc1``): then one is asked for."""
    from packaging.requirements import InvalidRequirement, Requirement  # here: the lock stage only

    try:
        return any(
            Version(s.version).is_prerelease
            for s in Requirement(req).specifier
            if not s.version.endswith(".*")
        )
    except (InvalidRequirement, ValueError):
        return False

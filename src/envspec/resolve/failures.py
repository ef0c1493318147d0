"""uv's failures read into facts: a package with no wheel for the platform, a torch index that does
not answer, a metadata build that fails, a conflict and the hint that is possible, a name no index
has. Each returns a ``ResolutionImpossible`` or ``SourceError`` with structured causes (or None
where uv's message is not its kind); ``explain`` words them."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from envspec.cache.dirs import cache_dir_for
from envspec.causes import (
    Cause,
    MetadataBuildFailed,
    NoWheel,
    NoWheelForPlatform,
    PythonConflict,
    PythonMissing,
)
from envspec.compat.platforms import pypi_builds
from envspec.errors import ResolutionImpossible, SourceError
from envspec.resolve.model import TORCH_FAMILY, Choice
from envspec.resolve.torch import pypi_platform_build
from envspec.spec import EnvSpec, requirement_name

if TYPE_CHECKING:  # imported where used: `choose` (explain) needs neither the network nor the host
    from envspec.sources import ResolvedSources

# uv's messages that name a package without a wheel for the platform (compiled by re when a
# resolution fails: explain never reads them)
_NO_VERSION = r"there is no version of ([A-Za-z0-9._-]+)==([^ ,]+)"
_NO_PLATFORM_WHEEL = r"([A-Za-z0-9._-]+)==([^ ,]+) has no wheels with a matching platform tag"
_WHEELS_FOR = r"Wheels are available for `([^`]+)` \(v([^)]+)\) on the following platforms: (.*)"


def _platform_wheel_error(stderr: str, choice: Choice, index_notes: list[str]) -> Exception | None:
    """On a platform other than linux-x86_64, a pinned torch build that no configured index serves
    for it: name the package, the platform and what it does have (exit 2), not a version conflict."""
    from packaging.utils import canonicalize_name

    p = re.search(_NO_PLATFORM_WHEEL, stderr)
    if p is not None:
        return _no_platform_wheel(
            choice, canonicalize_name(p.group(1)), p.group(2), re.search(_WHEELS_FOR, stderr)
        )
    m = re.search(_NO_VERSION, stderr)
    if choice.arch == "x86_64" or m is None or choice.torch is None:
        return None
    name, version = canonicalize_name(m.group(1)), m.group(2)
    if name not in TORCH_FAMILY:
        return None
    spec, v = choice.spec, choice.torch.variant
    row = pypi_platform_build(choice.torch.release.version, choice.platform)
    has = (
        f"PyPI's {choice.platform} wheel of torch {choice.torch.release.version} is its {row.variant} build"
        if row
        else f"PyPI has no {choice.platform} wheel of torch {choice.torch.release.version} on record"
    )
    causes: list[Cause] = [
        NoWheelForPlatform(
            where=spec.problem(("torch", "version"), "").where(spec.file),
            text=f"no {choice.platform} ({choice.platform_tag}) wheel of {name}=={version} on the configured "
            f"indexes ({v.index}); {has} "
            "(compat/data/torch_platforms.toml)",
        )
    ]
    causes += [NoWheelForPlatform(text=n) for n in index_notes]
    return ResolutionImpossible(
        f"{name} {version} has no wheel for {choice.platform}",
        causes=causes,
        hint=(
            f"serve {v.index} through a mirror ([sources].mirrors or pip's config), "
            f"or choose a release and build PyPI has for {choice.platform} "
            f"({_pypi_has(choice.platform)})"
        ),
        reference="no-wheel-for-platform",
    )


def _torch_index_error(stderr: str, choice: Choice, index_notes: list[str]) -> Exception | None:
    """The chosen torch build comes from a PyTorch index that did not answer, and uv found no copy
    of it on a mirror: exit 3 (``index-unavailable``) naming the index and the build, and what the
    reachable indexes offer instead (PyPI's build of the release, and whether it fits), not a
    version conflict."""
    t = choice.torch
    if (
        t is None
        or not t.variant.local
        or not any(n.startswith(f"{t.variant.index} ") for n in index_notes)
    ):
        return None
    if not re.search(r"\btorch\b", stderr):
        return None
    build = f"torch {t.release.version}+{t.variant.local}"
    pypi = t.release.pypi_variant if choice.arch == "x86_64" else None
    pypi_c = next((c for c in t.candidates if c.variant == pypi), None)
    if pypi_c is None:
        offer = f"PyPI has no build of torch {t.release.version} for {choice.platform} on record"
    elif pypi_c.ok:
        offer = (
            f"PyPI serves torch {t.release.version}'s {pypi} build, which fits too: set [torch].cuda = "
            f'"{pypi_c.cuda}" to take it'
        )
    else:
        offer = f"PyPI serves torch {t.release.version}'s {pypi} build, which does not fit these GPUs and driver"
    return SourceError(
        f"{build} ({t.variant.name}, the build that fits these GPUs and driver) comes from "
        f"{t.variant.index}, which does not answer, and no mirror has it; {offer}",
        hint=f"serve {t.variant.index} through a mirror ([sources].mirrors, ENVSPEC_MIRRORS or pip's "
        "config), or name a mirror of the PyTorch index as [sources].torch_index",
        reference="index-unavailable",
    )


# uv: a package none of whose releases has a wheel for the platform (compiled by re on a failure)
_NO_USABLE_WHEELS = r"Wheels are required for `([A-Za-z0-9._-]+)`|([A-Za-z0-9._-]+)(?:==[^ ]+)? has no usable wheels"


def _no_wheel_error(
    stderr: str, choice: Choice, would_build: Callable[[str], str]
) -> Exception | None:
    """A package with no wheel for the platform and Python (flash-attn: source distributions only):
    named at its place in the spec (its cause's ``package``), with the release a build from source
    would take (``would_build``: ``_would_build``); not a version conflict. Where the spec allows
    source builds (``[python].from_source``), ``resolve_python`` takes it as an sdist."""
    m = re.search(_NO_USABLE_WHEELS, stderr)
    if m is None:
        return None
    name = m.group(1) or m.group(2)
    would = would_build(name)
    return ResolutionImpossible(
        f"{name} has no wheel for {choice.platform} and Python {choice.python}",
        causes=[
            NoWheel(
                package=name,
                where=_requirement_where(choice, name),
                text=f"no release of {name} has a wheel for {choice.platform} ({choice.platform_tag}) and "
                f'Python {choice.python}, and source builds are off ([python].from_source = "never")'
                + (
                    f" (with a build from source the lock would take {name} {would})"
                    if would
                    else ""
                ),
            )
        ],
        hint=f"drop {name}, pin a version of it that has a wheel for {choice.platform}, or let envspec build it "
        'from its sdist ([python].from_source = "auto", the default)',
        reference="no-wheel",
    )


def _no_wheel_package(e: ResolutionImpossible) -> str | None:
    """The package a ``no-wheel`` error names (``_no_wheel_error``), else None."""
    if e.reference != "no-wheel":
        return None
    return next((c.package for c in e.causes if isinstance(c, NoWheel) and c.package), None)


def _pypi_has(platform: str) -> str:
    """What data/torch_platforms.toml records PyPI serving for ``platform``: "torch >=2.0,<=2.9.1: cpu; ..."."""
    rows = pypi_builds(platform)
    return (
        "; ".join(f"torch {r.torch}: {r.variant}" for r in rows)
        if rows
        else "no torch wheel on record"
    )


def _no_platform_wheel(
    choice: Choice, name: str, version: str, wheels: re.Match[str] | None
) -> Exception:
    """A package whose resolved version has wheels, none of them for the lock's platform: named at
    the spec's requirement for it (else at [python].packages), with the platforms it does have."""
    spec = choice.spec
    path: tuple[str | int, ...] = ("python", "packages")
    for key in (("python", "packages"), ("torch", "packages")):
        section = (
            spec.python.packages
            if key[0] == "python"
            else (spec.torch.packages if spec.torch else [])
        )
        idx = next((i for i, r in enumerate(section) if requirement_name(r) == name), None)
        if idx is not None:
            path = key + (idx,)
            break
    has = (
        f"it has wheels for {wheels.group(3).strip().rstrip('.')}"
        if wheels
        else "it has wheels for other platforms only"
    )
    return ResolutionImpossible(
        f"{name} {version} has no wheel for {choice.platform}",
        causes=[
            NoWheelForPlatform(
                where=spec.problem(path, "").where(spec.file),
                text=f"{name}=={version} has no {choice.platform} ({choice.platform_tag}) wheel; {has}",
            )
        ],
        hint=f"pick a version of {name} with a wheel for {choice.platform}, drop it for this platform, or "
        "lock for the platform it has wheels for ([target].platforms)",
        reference="no-wheel-for-platform",
    )


# uv's explanation of a conflict: a requirement of a package on torch (compiled by re on a failure)
_DEPENDS_ON_TORCH = r"([A-Za-z0-9._-]+)((?:[<>=!~]=?|===)[^ ,]+)? depends on torch((?:[<>=!~]=?|===)[^ ,]+(?:,[<>=!~]=?[^ ,]+)*)"


# a package that no configured index has (compiled by re on a failure)
_NOT_FOUND = r"(?:Because |`)([A-Za-z0-9._-]+)`? was not found in the"


_FAILED_BUILD = r"Failed to build `([A-Za-z0-9._-]+)(?:==|@)([^`]+)`"


def _metadata_build_error(stderr: str, choice: Choice) -> Exception | None:
    """uv asked an sdist's build for its metadata, and the build failed: say which package, that its
    build imports torch where its log says so, and the log's tail (``sdist-metadata-failed``, exit
    2), never an unreachable index."""
    m = re.search(_FAILED_BUILD, stderr)
    if m is None or "build backend returned an error" not in stderr:
        return None
    name, version = m.group(1), m.group(2)
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    said = next((i for i, ln in enumerate(lines) if ln.startswith("hint:")), len(lines))
    tail = lines[:said][-8:]  # the log's tail, without uv's hint (its own project's settings)
    imports_torch = "No module named 'torch'" in stderr
    why = (
        ": its setup imports torch, which its build environment lacks (it does not declare torch "
        "as a build requirement)"
        if imports_torch
        else ""
    )
    return ResolutionImpossible(
        f"{name} {version} is taken from its sdist, and the sdist's build failed when asked for its "
        f"metadata{why}",
        causes=[MetadataBuildFailed(text=ln, package=name) for ln in tail],
        hint=(
            f"a release of {name} with a wheel for {choice.platform} and Python {choice.python} "
            f"(pin it in [python].packages), or drop {name}"
            + (
                "; or add a [torch] table: its build is then given the lock's torch"
                if imports_torch and choice.torch is None
                else ""
            )
        ),
        reference="sdist-metadata-failed",
    )


def _uv_error(
    stderr: str,
    reqs: list[str],
    choice: Choice | None = None,
    sources: ResolvedSources | None = None,
) -> Exception:
    text = stderr.strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if "not found in the package registry" in text or "was not found in the" in text:
        return _unknown_packages(re.findall(_NOT_FOUND, text), lines, choice, sources)
    if "No solution found" in text or "unsatisfiable" in text:
        return ResolutionImpossible(
            "the Python packages cannot be installed together",
            causes=[PythonConflict(text=_our_pin(ln.strip(), choice)) for ln in lines[:12]],
            hint=_conflict_hint(text, choice),
            reference="python-conflict",
        )
    return SourceError(
        "the Python resolver (uv) failed:\n  " + "\n  ".join(lines[-12:]),
        hint="check the network or configure a mirror ([sources].mirrors or ENVSPEC_MIRRORS)",
        reference="index-unavailable",
    )


def _unknown_packages(
    missing: list[str], lines: list[str], choice: Choice | None, sources: ResolvedSources | None
) -> ResolutionImpossible:
    """Packages no configured index has: each at its place in the spec, with the names the indexes
    do serve that are closest to it (``sources.close_names``)."""
    from envspec.sources import close_names, project_names  # here: the lock stage only

    names = (
        project_names(sources, cache_dir=cache_dir_for(os.environ))
        if sources is not None and missing
        else set()
    )
    causes: list[Cause] = []
    hints: list[str] = []
    for name in dict.fromkeys(missing):
        close = close_names(name, names) if names else []
        where = _requirement_where(choice, name) if choice is not None else ""
        causes.append(
            PythonMissing(
                where=where,
                text=f"no configured index has a package named {name!r}"
                + (f"; did you mean {close[0]!r}?" if close else ""),
            )
        )
        if close:
            hints.append(
                f"{name!r}: did you mean {close[0]!r}?"
                + (f" (or {', '.join(repr(c) for c in close[1:])})" if close[1:] else "")
            )
    if not causes:
        causes = [PythonMissing(text=ln.strip()) for ln in lines[:8]]
    return ResolutionImpossible(
        "a Python package does not exist on the configured indexes",
        causes=causes,
        hint="; ".join(hints)
        if hints
        else "check the name in [python].packages, or add the index to [sources]",
        reference="unknown-python-package",
    )


def _debian_where(spec: EnvSpec, i: int) -> str:
    """'[system].packages[1] (specs/x.toml:12)' for the spec's i-th Debian package."""
    return spec.problem(("system", "packages", i), "").where(spec.file)


def _requirement_where(choice: Choice, name: str) -> str:
    """'[python].packages[0] (specs/x.toml:9)' for the spec's requirement on ``name``."""
    from packaging.utils import canonicalize_name

    spec = choice.spec
    sections = [(("python", "packages"), spec.python.packages)]
    if spec.torch is not None:
        sections.append((("torch", "packages"), spec.torch.packages))
    for key, reqs in sections:
        for i, r in enumerate(reqs):
            if canonicalize_name(requirement_name(r)) == canonicalize_name(name):
                return spec.problem((*key, i), "").where(spec.file)
    return ""


def _our_pin(line: str, choice: Choice | None) -> str:
    """uv says "you require torch==X" of the pin envspec added for the chosen release: say so."""
    t = choice.torch if choice is not None else None
    if t is None:
        return line
    local = f"+{t.variant.local}" if t.variant.local else ""
    return line.replace(
        f"you require torch=={t.release.version}{local}",
        f"envspec chose torch=={t.release.version}{local} (the newest release within [torch].version "
        "that fits the GPUs, driver and platform, or the one the named packages accept)",
    )


def _conflict_hint(text: str, choice: Choice | None) -> str:
    """The binding constraint of a conflict, where uv names a package's requirement on torch that
    the chosen release does not meet: what to set, else the general advice."""
    t = choice.torch if choice is not None else None
    m = re.search(_DEPENDS_ON_TORCH, text)
    if t is None or m is None:
        return "relax a version in [python].packages; uv's explanation is above"
    from packaging.specifiers import (
        InvalidSpecifier,
        SpecifierSet,
    )  # here: explain does without them

    who, needs = m.group(1) + (m.group(2) or ""), m.group(3)
    try:
        wants = SpecifierSet(needs)
    except InvalidSpecifier:
        return "relax a version in [python].packages; uv's explanation is above"
    if wants.contains(t.release.version, prereleases=True):
        return "relax a version in [python].packages; uv's explanation is above"
    exact = needs[2:] if needs.startswith("==") and "," not in needs and "*" not in needs else ""
    setting = (
        f'set [torch].version = "{".".join(exact.split(".")[:2])}.*"'
        if exact
        else f"set [torch].version to a release {who} accepts (torch{needs})"
    )
    assert choice is not None and choice.spec.torch is not None
    return (
        f'{who} requires torch{needs}, and [torch].version = "{choice.spec.torch.version}" gives torch '
        f"{t.release.version}: {setting}, or leave the choice to envspec (a wider [torch].version: the lock "
        f"chooses torch and the packages together), or pin an older {m.group(1)}"
    )

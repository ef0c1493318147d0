"""A package of uv's answer as its pin (``_candidate``): its wheel or sdist, the canonical index it
is credited to (a file a mirror served is credited only where that index lists it), and whether a
named package's small wheel installs nothing."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from envspec.causes import (
    NoWheel,
)
from envspec.errors import ResolutionImpossible
from envspec.resolve.model import TORCH_FAMILY, Choice, PylockPackage, WheelCandidate

if TYPE_CHECKING:  # imported where used: `choose` (explain) needs neither the network nor the host
    from envspec.sources import ResolvedSources


def _canonical_url(url: str, choice: Choice, sources: ResolvedSources) -> str | None:
    """The canonical index a file's URL is on (uv read it there, with its sha256); None for a
    mirror's."""
    for idx in [sources.index, *sources.extra_indexes]:
        if url.startswith(idx.rsplit("/simple", 1)[0]):
            return idx
    parsed = urlparse(url)
    if parsed.hostname == "files.pythonhosted.org":
        return sources.index
    on_torch_index = url.startswith(sources.torch_index.rstrip("/") + "/")
    if choice.torch is not None and (
        on_torch_index or (parsed.hostname and "pytorch.org" in parsed.hostname)
    ):
        return choice.torch.variant.index
    return None


def _serving(name: str, choice: Choice, sources: ResolvedSources) -> list[str]:
    """The canonical indexes that may serve a package's files, in the order they are asked: the
    PyTorch index of the chosen build for torch's family where that build is not PyPI's, else the
    spec's indexes (and that PyTorch index last, which serves some common packages too)."""
    variant = choice.torch.variant if choice.torch is not None else None
    if variant is not None and variant.local and name in TORCH_FAMILY:
        return [variant.index]
    out = [sources.index, *sources.extra_indexes]
    if variant is not None and variant.local:
        out.append(variant.index)
    return out


def _attribute_index(
    url: str, name: str, choice: Choice, sources: ResolvedSources, filename: str, sha256: str
) -> str:
    """The canonical index a locked file is credited to: the one uv read it from, or, for a file a
    mirror served, the one that lists it with the same sha256 (``sources.credit``)."""
    on = _canonical_url(url, choice, sources)
    if on is not None:
        return on
    from envspec.sources import credit  # here: the lock stage only

    return credit(url, filename, sha256, name, _serving(name, choice, sources), sources)


def _candidate(
    p: PylockPackage, choice: Choice, sources: ResolvedSources, *, group: str, direct: bool = False
) -> WheelCandidate:
    """A package of uv's pylock.toml output as its pin: its wheel, or its sdist where uv took that
    (``resolve_python``'s no_binary: built from source); ``no-wheel`` where it has neither."""
    from packaging.utils import canonicalize_name, parse_wheel_filename

    name = canonicalize_name(p.name)
    wheels = p.wheels
    f = wheels[0] if wheels else p.sdist
    if not f:
        raise ResolutionImpossible(
            f"{name} {p.version} has no wheel for {choice.platform_tag}",
            causes=[
                NoWheel(
                    text=f"{name} {p.version} has neither a wheel "
                    f"for {choice.platform_tag} nor a source distribution",
                )
            ],
            hint="pick a version with a manylinux wheel or an sdist",
            reference="no-wheel",
        )
    url = f.url or f.path
    filename = f.name or unquote(url.rsplit("/", 1)[-1].split("#", 1)[0])
    if wheels:
        parse_wheel_filename(filename)
    size = f.size
    if not size and url.startswith(
        "file://"
    ):  # a local mirror's page may omit sizes; the file says
        with contextlib.suppress(OSError):
            size = os.stat(unquote(urlparse(url).path)).st_size
    return WheelCandidate(
        name=name,
        version=p.version,
        filename=filename,
        index=_attribute_index(url, name, choice, sources, filename, f.hashes["sha256"]),
        sha256=f.hashes["sha256"],
        size=size,
        group=group,
        direct=direct,
        yanked=p.yanked,
        build_needs=p.build_needs,
        installs_nothing=direct and bool(wheels) and _installs_nothing(url, size),
    )


EMPTY_WHEEL_MAX = 64 * 1024  # a wheel larger than this ships something: not read to find out


def _installs_nothing(url: str, size: int) -> bool:
    """Whether a (small) wheel installs nothing: it holds only its ``.dist-info`` and requires
    nothing (transformer-engine 0.0.0: "Coming soon", 1,097 bytes), a name kept on an index. A
    wheel that cannot be read here is not judged (False)."""
    import io
    import urllib.request
    import zipfile

    from envspec import settings

    if not 0 < size <= EMPTY_WHEEL_MAX:
        return False
    try:
        if url.startswith("file://") or "://" not in url:
            data = Path(unquote(urlparse(url).path)).read_bytes()
        elif settings.read().offline:
            return False
        else:
            with urllib.request.urlopen(url, timeout=30) as resp:  # noqa: S310 (an index's file)
                data = resp.read(EMPTY_WHEEL_MAX + 1)
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            names = z.namelist()
            meta = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
            requires = meta is not None and b"\nRequires-Dist:" in z.read(meta)
    except (OSError, ValueError, zipfile.BadZipFile):
        return False
    return not requires and all(n.split("/", 1)[0].endswith(".dist-info") for n in names)

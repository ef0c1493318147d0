"""Which torch releases a package built from its sdist compiles against, where its own metadata
does not say (``compat/data/torch_builds.toml``'s ``[[source]]`` rows, each with its source): read
by the resolve stage to choose a torch the build works with (issue 58, point 3)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from envspec.errors import LockError


@dataclass(frozen=True)
class SourceBuildRow:
    """Releases of a package (``versions``) whose build from source compiles only against the
    ``torch`` releases given, and why."""

    package: str
    versions: SpecifierSet
    torch: SpecifierSet
    reason: str
    source: str


def source_build_rows(text: str | None = None) -> list[SourceBuildRow]:
    """The ``[[source]]`` rows of ``compat/data/torch_builds.toml`` (or of ``text``)."""
    if text is None:
        text = resources.files("envspec.compat").joinpath("data/torch_builds.toml").read_text()
    rows = []
    for i, row in enumerate(tomllib.loads(text).get("source", [])):
        try:
            rows.append(
                SourceBuildRow(
                    canonicalize_name(row["package"]),
                    SpecifierSet(row["versions"]),
                    SpecifierSet(row["torch"]),
                    row["reason"],
                    row["source"],
                )
            )
        except (KeyError, InvalidSpecifier) as e:
            raise LockError(
                f"compat/data/torch_builds.toml: source[{i}]: {e}", reference="invalid-compat-db"
            ) from e
    return rows


def refusing(rows: list[SourceBuildRow], name: str, version: str) -> SourceBuildRow | None:
    """The row that covers ``name`` ``version`` (a package the lock builds from its sdist)."""
    try:
        v = Version(version)
    except InvalidVersion:
        return None
    n = canonicalize_name(name)
    return next((r for r in rows if r.package == n and r.versions.contains(v, True)), None)

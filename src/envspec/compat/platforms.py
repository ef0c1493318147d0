"""Per-platform facts about PyPI's torch wheels (data/torch_platforms.toml): which build PyPI's own
wheel is on a platform other than linux-x86_64. Read on first use, only for such a platform, so
that the x86_64 path (and ``envspec explain``'s start-up) does not pay for it."""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from envspec.compat.load import DATA_DIR
from envspec.errors import CompatDBError

FILE = "torch_platforms.toml"
FORMAT = 1


@dataclass(frozen=True)
class PypiBuild:
    platform: str  # "linux-aarch64"
    torch: SpecifierSet
    variant: str  # the DB variant PyPI's wheel is ("cpu")
    source: str
    # the CUDA arches this platform's build carries where they differ from the variant's x86_64 row
    # (PyPI's aarch64 cu130 build: sm_80 .. sm_120 with sm_110, without sm_75/sm_86); () = the same
    arch_list: tuple[str, ...] = ()
    arch_source: str = ""


@functools.lru_cache(maxsize=4)
def _rows(root: str) -> tuple[PypiBuild, ...]:
    path = Path(root) / FILE
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise CompatDBError(f"{path}: cannot read: {e}", reference="compat-db-invalid") from None
    if data.get("format") != FORMAT:
        raise CompatDBError(
            f"{path}: format {data.get('format')!r}, this envspec reads format {FORMAT}",
            reference="compat-db-invalid",
        )
    out = []
    for i, row in enumerate(data.get("pypi", [])):
        try:
            arch_list = tuple(str(a) for a in row.get("arch_list", ()))
            if arch_list and not row.get("arch_source"):
                raise ValueError("arch_list needs its arch_source")
            out.append(
                PypiBuild(
                    platform=str(row["platform"]),
                    torch=SpecifierSet(str(row["torch"])),
                    variant=str(row["variant"]),
                    source=str(row["source"]),
                    arch_list=arch_list,
                    arch_source=str(row.get("arch_source", "")),
                )
            )
        except (KeyError, ValueError) as e:
            raise CompatDBError(
                f"{path}: [[pypi]] row {i}: {e}", reference="compat-db-invalid"
            ) from None
    return tuple(out)


def pypi_build(torch_version: str, platform: str, root: Path | None = None) -> PypiBuild | None:
    """The row saying which build PyPI's ``platform`` wheel of torch ``torch_version`` is, or None
    when none is recorded (every build then comes from the PyTorch index)."""
    v = Version(torch_version)
    for row in _rows(str(root or DATA_DIR)):
        if row.platform == platform and row.torch.contains(v, prereleases=True):
            return row
    return None


def pypi_builds(platform: str, root: Path | None = None) -> tuple[PypiBuild, ...]:
    """Every recorded row for ``platform``, in the file's order."""
    return tuple(r for r in _rows(str(root or DATA_DIR)) if r.platform == platform)

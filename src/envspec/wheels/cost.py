"""What a build from an sdist costs before it is paid (issue 58, point 6): its expected time here
(``estimate``: this cache's history of the package, else its sdist's sources at measured rates),
in words (``say_estimate``), with the compile jobs of this machine (``default_jobs``)."""

from __future__ import annotations

import json
import os
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from envspec.wheels.sdist import memory_jobs

if TYPE_CHECKING:
    from envspec.cache.store import Cache
    from envspec.lock import Wheel

# What one source file costs to compile on the project's 2-core VM with 2 jobs (docs/benchmarks.md):
# a CUDA source about 160 s per GPU architecture (flash-attn 2.8.3.post2, sm_90: 79 s an object, two
# at a time; 2026-12-05), a C/C++ source about 10 s, one that includes torch's headers (a build with
# torch among its inputs) about 85 s (torch-scatter 2.1.2: 7 sources in 301.7 s with 2 jobs;
# 2026-12-07). An estimate, said as one.
CUDA_SOURCE_S = 160.0
CXX_SOURCE_S = 10.0
TORCH_CXX_SOURCE_S = 85.0


@dataclass(frozen=True)
class Estimate:
    """How long a wheel's build from its sdist is expected to take here, and from what."""

    seconds: float
    basis: str


def default_jobs() -> int:
    """The compile jobs of a build on this machine: its cores, as many as its memory holds."""
    return max(1, min(os.cpu_count() or 1, memory_jobs()))


def estimate(w: Wheel, cache_root: Path, sdist: Path | None, jobs: int) -> Estimate | None:
    """The build time of ``w`` (a pin built from its sdist) with ``jobs`` compile jobs: this
    cache's last build of the same package (``wheel.json``'s seconds, scaled by its jobs), else
    its sdist's sources (``sdist``, where it is at hand) at ``CUDA_SOURCE_S`` per CUDA source and
    GPU architecture and ``CXX_SOURCE_S`` per C/C++ source; None where neither is known."""
    jobs = max(1, jobs)
    past = _past_builds(cache_root, w.name)
    if past:
        secs, then_jobs, version = past[-1]
        return Estimate(
            secs * max(1, then_jobs or jobs) / jobs,
            f"its build here of {w.name} {version}, {secs:.0f} s with {then_jobs or jobs} jobs",
        )
    if sdist is None or not sdist.is_file():
        return None
    cu, cxx = _sources(sdist)
    if w.source is None or not w.source.toolkit:  # no CUDA compiler: its CUDA sources are left out
        cu = 0  # (torch-scatter beside a CPU torch compiles its C++ alone)
    if not cu and not cxx:
        return Estimate(30.0, "its sdist has no C, C++ or CUDA source to compile: packaging alone")
    torch = w.source is not None and any(b.name == "torch" for b in w.source.build)
    per = TORCH_CXX_SOURCE_S if torch else CXX_SOURCE_S
    said = f"{cxx} C/C++ sources" + (" on torch's headers" if torch else "")
    if not cu:
        return Estimate(cxx * per / jobs, f"its sdist's {said}")
    archs = max(1, len(w.source.arch_list)) if w.source is not None else 1
    return Estimate(
        (cu * CUDA_SOURCE_S * archs + cxx * per) / jobs,
        f"its sdist's {cu} CUDA and {said} for {archs} GPU architecture(s)",
    )


def sdist_at_hand(w: Wheel, cache: Cache) -> Path | None:
    """The sdist of ``w`` where it is at hand without a download: in the cache by its sha256, or
    in the local folder its index is (a wheelhouse as the index, read in place)."""
    from urllib.parse import unquote, urlparse

    if cache.has_blob(w.sha256):
        return cache.blob(w.sha256)
    url = urlparse(w.index)
    local = Path(unquote(url.path)) / w.filename if url.scheme in ("", "file") else None
    return local if local is not None and local.is_file() else None


def _past_builds(cache_root: Path, name: str) -> list[tuple[float, int, str]]:
    """(seconds, jobs, version) of each build of ``name`` this cache records, oldest first."""
    out = []
    for record in (cache_root / "built").glob("*/wheel.json"):
        try:
            m = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if m.get("sdist", [""])[0] == name and "seconds" in m:
            out.append(
                (
                    record.stat().st_mtime,
                    float(m["seconds"]),
                    int(m.get("jobs", 0)),
                    str(m["sdist"][1]),
                )
            )
    return [(s, j, v) for _, s, j, v in sorted(out)]


def _sources(sdist: Path) -> tuple[int, int]:
    """(CUDA sources, C/C++ sources) in an sdist (.tar.gz or .zip)."""
    try:
        if zipfile.is_zipfile(sdist):
            with zipfile.ZipFile(sdist) as z:
                names = z.namelist()
        else:
            with tarfile.open(sdist) as t:
                names = t.getnames()
    except (OSError, tarfile.TarError, zipfile.BadZipFile):
        return 0, 0
    cu = sum(n.endswith(".cu") for n in names)
    cxx = sum(n.endswith((".cpp", ".cc", ".cxx", ".c")) for n in names)
    return cu, cxx


def say_estimate(e: Estimate | None) -> str:
    """An estimate in words: "about 97 min (from ...)"; where none: that it is not known yet."""
    if e is None:
        return "build time not known until its sdist is fetched"
    secs = e.seconds
    said = (
        f"{secs:.0f} s"
        if secs < 120
        else f"{secs / 60:.0f} min"
        if secs < 7200
        else f"{secs / 3600:.1f} h"
    )
    return f"about {said} here (from {e.basis})"

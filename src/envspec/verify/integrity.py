"""Installed distributions and their RECORD hashes (PEP 376 / PEP 627 / the wheel spec).

The lock names every wheel; the installer wrote each wheel's RECORD (path, ``sha256=`` urlsafe
base64 digest without padding, size) into its ``.dist-info``. The verifier re-hashes the files
to find edits, reads the set of ``.dist-info`` directories to find packages the lock does not
name, and maps a loaded shared library back to the distribution whose RECORD lists it.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import os
import re
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path


def normalize(name: str) -> str:
    """PEP 503 normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class RecordEntry:
    path: Path  # absolute
    rel: str  # as written in RECORD
    sha256: str  # urlsafe base64, no padding; "" when RECORD gives no hash
    size: int | None


@dataclass
class Dist:
    name: str  # normalized
    version: str
    dist_info: Path
    site: Path
    _record: list[RecordEntry] | None = field(default=None, repr=False)

    @property
    def record(self) -> list[RecordEntry]:
        if self._record is None:
            self._record = read_record(self)
        return self._record


def read_record(dist: Dist) -> list[RecordEntry]:
    entries: list[RecordEntry] = []
    try:
        text = (dist.dist_info / "RECORD").read_text(encoding="utf-8")
    except OSError:
        return entries
    for row in csv.reader(text.splitlines()):
        if not row or not row[0]:
            continue
        rel = row[0]
        digest = row[1] if len(row) > 1 else ""
        size = row[2] if len(row) > 2 else ""
        algo, _, value = digest.partition("=")
        p = Path(rel)
        path = p if p.is_absolute() else Path(os.path.normpath(dist.site / p))
        entries.append(
            RecordEntry(path, rel, value if algo == "sha256" else "", int(size) if size.isdigit() else None)
        )
    return entries


def site_dirs(prefix: str | None = None) -> list[Path]:
    """The site-packages directories of the running python, or of the venv at ``prefix``."""
    if prefix is None:
        paths = sysconfig.get_paths()
    else:
        paths = sysconfig.get_paths(vars={"base": prefix, "platbase": prefix})
    out: list[Path] = []
    for key in ("purelib", "platlib"):
        p = Path(paths[key])
        if p.is_dir() and p not in out:
            out.append(p)
    if prefix is not None and not out:  # a venv made by another python: lib/python3.X/site-packages
        out = sorted(Path(prefix).glob("lib*/python3*/site-packages"))
    return out


def find_dists(sites: list[Path]) -> dict[str, Dist]:
    dists: dict[str, Dist] = {}
    hp = HeaderParser()
    for site in sites:
        site = Path(os.path.realpath(site))  # /proc/self/maps shows resolved paths
        try:
            entries = sorted(site.iterdir())
        except OSError:
            continue
        for d in entries:
            if not d.name.endswith(".dist-info") or not d.is_dir():
                continue
            try:
                meta = hp.parsestr((d / "METADATA").read_text(encoding="utf-8", errors="replace"))
            except OSError:
                continue
            name, version = meta.get("Name"), meta.get("Version")
            if not name or not version:
                continue
            key = normalize(name)
            dists.setdefault(key, Dist(key, version, d, site))
    return dists


def b64_sha256_file(path: Path, cache: dict[Path, str] | None = None) -> str:
    if cache is not None and path in cache:
        return cache[path]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    value = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
    if cache is not None:
        cache[path] = value
    return value


def hex_to_b64(hexdigest: str) -> str:
    return base64.urlsafe_b64encode(bytes.fromhex(hexdigest)).rstrip(b"=").decode()


def b64_to_hex(b64: str) -> str:
    return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()


@dataclass
class FileProblem:
    dist: str
    path: str  # absolute path of the file
    problem: str  # "changed" | "missing" | "unreadable"


def _hash_workers() -> int:
    return max(4, min(32, (os.cpu_count() or 2) * 2))


def check_files(dists: list[Dist], cache: dict[Path, str] | None = None) -> tuple[list[FileProblem], int, int]:
    """Re-hash every RECORD entry with a hash. Returns (problems, files checked, bytes read).

    Files are hashed on a thread pool (hashlib releases the GIL on large buffers); the biggest
    first so that the pool drains evenly.
    """
    jobs: list[tuple[Dist, RecordEntry]] = []
    for d in dists:
        for e in d.record:
            if e.sha256:
                jobs.append((d, e))
    jobs.sort(key=lambda j: -(j[1].size or 0))
    problems: list[FileProblem] = []
    total = 0

    def one(job: tuple[Dist, RecordEntry]) -> FileProblem | None:
        d, e = job
        try:
            got = b64_sha256_file(e.path, cache)
        except FileNotFoundError:
            return FileProblem(d.name, str(e.path), "missing")
        except OSError:
            return FileProblem(d.name, str(e.path), "unreadable")
        return None if got == e.sha256 else FileProblem(d.name, str(e.path), "changed")

    with ThreadPoolExecutor(_hash_workers()) as pool:
        for res in pool.map(one, jobs):
            if res is not None:
                problems.append(res)
    for _, e in jobs:
        total += e.size or 0
    problems.sort(key=lambda p: (p.dist, p.path))
    return problems, len(jobs), total


def owner_index(dists: dict[str, Dist], wanted: list[Path]) -> dict[Path, tuple[Dist, RecordEntry]]:
    """For each wanted absolute path (resolved), the distribution whose RECORD lists it."""
    want = {Path(os.path.realpath(w)) for w in wanted}
    found: dict[Path, tuple[Dist, RecordEntry]] = {}
    if not want:
        return found
    for d in dists.values():
        for e in d.record:
            rp = Path(os.path.realpath(e.path)) if e.path.is_symlink() else e.path
            if rp in want and rp not in found:
                found[rp] = (d, e)
    return found


def hash_many(paths: list[Path], cache: dict[Path, str]) -> None:
    """Fill ``cache`` for ``paths`` on a thread pool (big shared libraries: seconds, not minutes)."""
    todo = [p for p in dict.fromkeys(paths) if p not in cache]

    def one(p: Path) -> None:
        try:
            b64_sha256_file(p, cache)
        except OSError:
            pass

    with ThreadPoolExecutor(_hash_workers()) as pool:
        list(pool.map(one, todo))


def running_prefix() -> Path:
    return Path(sys.prefix)

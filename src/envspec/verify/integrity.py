"""Installed distributions and their RECORD hashes (PEP 376 / PEP 627 / the wheel spec).

The lock names every wheel; the installer wrote each wheel's RECORD (path, ``sha256=`` urlsafe
base64 digest without padding, size) into its ``.dist-info``. The verifier re-hashes the files
(at the quick level only the shared objects, the rest by size) to find edits, reads the set of ``.dist-info`` directories to find packages the lock does not
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
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path
from typing import Literal


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
            RecordEntry(
                path, rel, value if algo == "sha256" else "", int(size) if size.isdigit() else None
            )
        )
    return entries


_EXTENSION = re.compile(r"\.(?:cpython-[0-9]+[^/]*|abi3)?\.?so$")


def extension_modules(dist: Dist) -> list[str]:
    """The top-level modules of ``dist`` that hold extension modules (``*.so`` in a package, or a
    top-level ``*.so``), from its RECORD; libraries vendored beside them (``<name>.libs/``) and
    files outside the site directory are not modules."""
    tops: set[str] = set()
    for e in dist.record:
        parts = e.rel.split("/")
        if parts[0] in ("..", "") or parts[0].endswith((".libs", ".data", ".dist-info")):
            continue
        if not _EXTENSION.search(parts[-1]):
            continue
        top = parts[0].split(".", 1)[0] if len(parts) == 1 else parts[0]
        if top.isidentifier():
            tops.add(top)
    return sorted(tops)


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


# The quick level's rule (docs/verify.md, "Levels"): a file whose name is a shared object
# (``*.so``, ``*.so.<digits>...``: torch/lib, nvidia/*/lib, triton, every C extension module)
# decides what code runs and is hashed in full; every other file is checked for presence and
# size. The full level hashes every file.
_NATIVE = re.compile(r"\.so(\.\d+)*$")


def is_native(rel: str) -> bool:
    """A shared object (ELF library or Python extension module), by its file name."""
    return bool(_NATIVE.search(rel.rsplit("/", 1)[-1]))


class HashCache:
    """sha256 digests by path, shared by the threads of one run: a file two checks want (a loaded
    library and the same file in RECORD) is read once, the second caller waits for the first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: dict[Path, Future[str]] = {}

    def __contains__(self, path: Path) -> bool:
        with self._lock:
            f = self._futures.get(path)
        return f is not None and f.done() and f.exception() is None

    def digest(self, path: Path) -> str:
        with self._lock:
            fut = self._futures.get(path)
            mine = fut is None
            if fut is None:
                fut = self._futures[path] = Future()
        if mine:
            try:
                fut.set_result(_sha256_b64(path))
            except BaseException as e:  # the waiters see the same error
                fut.set_exception(e)
        return fut.result()


def _sha256_b64(path: Path) -> str:
    h = hashlib.sha256()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        try:  # sequential read-ahead: most of a quick run's bytes are a few large libraries
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except (AttributeError, OSError):
            pass
        while n := f.readinto(buf):
            h.update(view[:n])  # hashlib releases the GIL on buffers this large
    return base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


def b64_sha256_file(path: Path, cache: HashCache | None = None) -> str:
    return cache.digest(path) if cache is not None else _sha256_b64(path)


def hex_to_b64(hexdigest: str) -> str:
    return base64.urlsafe_b64encode(bytes.fromhex(hexdigest)).rstrip(b"=").decode()


def b64_to_hex(b64: str) -> str:
    return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()


@dataclass
class FileProblem:
    dist: str
    path: str  # absolute path of the file
    problem: Literal["changed", "missing", "unreadable"]
    detail: str = ""  # e.g. "size 1204 B, RECORD says 1203 B"


@dataclass
class FileCheck:
    """What ``check_files`` did: problems found, files and bytes hashed, files checked by size."""

    problems: list[FileProblem] = field(default_factory=list)
    hashed: int = 0
    hashed_bytes: int = 0
    sized: int = 0
    sized_bytes: int = 0
    workers: int = 0


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, bounded by a cgroup v2 CPU quota
    (``podman run --cpus 2`` writes ``200000 100000`` to cpu.max)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)


def _hash_workers() -> int:
    # one thread a core (hashing is CPU-bound once the page cache holds the file), at least two so
    # that one thread's read overlaps another's hashing on a cold cache
    return max(2, min(32, usable_cpus()))


def _stat_one(d: Dist, e: RecordEntry) -> FileProblem | None:
    """A RECORD entry's file missing, unreadable, or of another size than RECORD's."""
    try:
        size = os.stat(e.path).st_size
    except FileNotFoundError:
        return FileProblem(d.name, str(e.path), "missing")
    except OSError:
        return FileProblem(d.name, str(e.path), "unreadable")
    if e.size is not None and size != e.size:
        return FileProblem(d.name, str(e.path), "changed", f"size {size} B, RECORD says {e.size} B")
    return None


def _hash_one(job: tuple[Dist, RecordEntry], cache: HashCache | None) -> FileProblem | None:
    """``_stat_one``'s problem, else the file's sha256 against RECORD's."""
    d, e = job
    bad = _stat_one(d, e)
    if bad is not None:
        return bad
    try:
        got = b64_sha256_file(e.path, cache)
    except FileNotFoundError:
        return FileProblem(d.name, str(e.path), "missing")
    except OSError:
        return FileProblem(d.name, str(e.path), "unreadable")
    return (
        None if got == e.sha256 else FileProblem(d.name, str(e.path), "changed", "sha256 differs")
    )


def check_files(
    dists: list[Dist], cache: HashCache | None = None, *, hash_all: bool = True
) -> FileCheck:
    """Check every RECORD entry that has a hash.

    ``hash_all`` (the full level): re-hash every file. Otherwise (the quick level) hash the
    shared objects (``is_native``) and check every other file's presence and size against
    RECORD; an entry without a size is hashed. A file whose size differs is reported without
    being read. Hashing runs on a thread pool of one thread a usable core (hashlib releases the
    GIL), the biggest files first so that the pool drains evenly; the size checks run in the
    calling thread meanwhile.
    """
    hash_jobs: list[tuple[Dist, RecordEntry]] = []
    size_jobs: list[tuple[Dist, RecordEntry]] = []
    for d in dists:
        for e in d.record:
            if not e.sha256:
                continue
            if hash_all or e.size is None or is_native(e.rel):
                hash_jobs.append((d, e))
            else:
                size_jobs.append((d, e))
    hash_jobs.sort(key=lambda j: -(j[1].size or 0))
    out = FileCheck(workers=_hash_workers())

    def one(job: tuple[Dist, RecordEntry]) -> FileProblem | None:
        return _hash_one(job, cache)

    with ThreadPoolExecutor(out.workers, thread_name_prefix="envspec-verify-sha256") as pool:
        hashed = pool.map(one, hash_jobs)
        for d, e in size_jobs:
            res = _stat_one(d, e)
            if res is not None:
                out.problems.append(res)
        out.problems.extend(r for r in hashed if r is not None)
    out.hashed, out.sized = len(hash_jobs), len(size_jobs)
    out.hashed_bytes = sum(e.size or 0 for _, e in hash_jobs)
    out.sized_bytes = sum(e.size or 0 for _, e in size_jobs)
    out.problems.sort(key=lambda p: (p.dist, p.path))
    return out


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


def hash_many(paths: list[Path], cache: HashCache) -> None:
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

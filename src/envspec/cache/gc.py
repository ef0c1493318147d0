"""What the cache holds (``envspec cache``) and its garbage collection (``envspec cache gc``).

The cache's entries (layout in ``envspec.cache``):

- ``wheel``: ``blobs/sha256/<hex>``, a wheel named by its sha256;
- ``deb``: ``debs/sha256/<hex>``, a .deb named by its sha256;
- ``layer``: ``layers/<key>.tar`` with ``layers/<key>.json``, a finished layer named by its content key,
  and its compressed blobs (``<key>.<compressor>.tar.zst``/``.tar.gz`` with their ``.json``).

Anything else (``apt/``, ``uv/``: the resolver's index caches, which ``envspec lock`` manages;
``locks/``; ``lockfiles/``; ``tmp/``, the work directories of builds; files whose names are not those above, such
as a .deb being downloaded) is listed as ``other`` and never removed here.

A collection keeps what the given locks need (each lock's wheels and .debs by sha256, and the keys
of its plan's cacheable layers, ``envspec.plan.cache_entries``, given by the caller), and removes
the rest; with a size budget (``keep_size``) it keeps, beside what the locks need, the most recently
used other entries while the whole stays within the budget. What a lock needs is never removed, even
beyond the budget. An entry used (read or written: the newest of its files' atime and mtime) less
than ``grace`` seconds before the collection started is kept too: a build or a download of another
process may be about to use it.

The collection holds the cache's exclusive lock (``Cache.exclusive``); every build holds the
shared one while it runs (``Cache.in_use``), so a collection waits for running builds and a build
started meanwhile waits for it. A layer goes ``.json`` first, then ``.tar``, under its own layer
lock, so a reader never finds a ``.json`` without its tar.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from envspec.cache.store import Cache
from envspec.errors import UsageError

GRACE_S = 15 * 60  # entries used this recently are kept whatever the plan says
_HEX = re.compile(r"^[0-9a-f]{64}$")
CacheKind = Literal["wheel", "deb", "layer", "built"]
KINDS: tuple[CacheKind, ...] = ("wheel", "deb", "layer", "built")


@dataclass(frozen=True)
class CacheEntry:
    kind: CacheKind
    name: str  # the sha256 hex (wheel, deb), the layer key's hex, a built wheel's derivation key's hex
    paths: tuple[Path, ...]
    size: int
    used: float  # the newest atime/mtime of its files (seconds since the epoch)
    group: str = ""  # a layer's group, from its .json
    diff_id: str = ""  # a layer's diff_id (the sha256 of its tar), from its .json

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "name": self.name,
            "size": self.size,
            "used": round(self.used),
            **({"group": self.group} if self.group else {}),
            **({"diff_id": self.diff_id} if self.diff_id else {}),
            "paths": [str(p) for p in self.paths],
        }


def _stat(paths: Iterable[Path]) -> tuple[int, float] | None:
    """Size and last use of an entry's files; None where one is missing or is not a regular file
    of the cache (a link is never followed: what it points to is not the cache's)."""
    size, used = 0, 0.0
    for p in paths:
        try:
            st = p.lstat()
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        size += st.st_size
        used = max(used, st.st_atime, st.st_mtime)
    return size, used


def _own_dir(d: Path, root: Path) -> bool:
    """``d`` is a directory of the cache itself: no link on the way from the cache's root to it, so
    nothing found in it lies outside the cache."""
    p = d
    while p != root:
        if p.is_symlink() or not p.is_dir():
            return False
        if p.parent == p:
            return False
        p = p.parent
    return True


def scan(cache: Cache) -> list[CacheEntry]:
    """Every wheel, .deb, layer and wheel built from an sdist in the cache (sorted by kind, then
    name). Entries are regular files in the cache's own directories: a link in the cache (to a file
    or a directory) is no entry, so neither ``cache gc`` nor eviction follows it out of the cache."""
    out: list[CacheEntry] = []
    kinds_at: tuple[tuple[CacheKind, Path], ...] = (
        ("wheel", cache.root / "blobs" / "sha256"),
        ("deb", cache.root / "debs" / "sha256"),
    )
    for kind, d in kinds_at:
        for p in sorted(d.iterdir()) if _own_dir(d, cache.root) else ():
            if _HEX.match(p.name):
                st = _stat([p])
                if st:
                    out.append(CacheEntry(kind, p.name, (p,), *st))
    layers = cache.root / "layers"
    by_key: dict[
        str, list[Path]
    ] = {}  # a layer: <key>.json, <key>.tar and its compressed blobs with theirs
    for p in sorted(layers.iterdir()) if _own_dir(layers, cache.root) else ():
        key, dot, _rest = p.name.partition(".")
        if dot and _HEX.match(key) and not p.is_symlink() and p.is_file():
            by_key.setdefault(key, []).append(p)
    for key, files in by_key.items():
        meta = layers / f"{key}.json"
        paths = tuple(
            sorted(files, key=lambda q: (q != meta, q.name))
        )  # the record first: removed first
        st = _stat(paths)
        if st is None:
            continue
        record = _read_json(meta) if meta in files else {}
        group, diff_id = str(record.get("group", "")), str(record.get("diff_id", ""))
        out.append(CacheEntry("layer", key, paths, *st, group=group, diff_id=diff_id))
    built = (
        cache.root / "built"
    )  # <key>/: the wheel, its build.log and wheel.json (wheels/sdist.py)
    for d in sorted(built.iterdir()) if _own_dir(built, cache.root) else ():
        if _HEX.match(d.name) and d.is_dir() and not d.is_symlink():
            made = tuple(sorted(p for p in d.iterdir() if p.is_file() and not p.is_symlink()))
            st = _stat(made)
            if st:
                out.append(CacheEntry("built", d.name, made, *st))
    return out


def _read_json(path: Path) -> dict[str, Any]:
    """A layer's .json, read without making it look used (O_NOATIME where we own it)."""
    try:
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOATIME", 0))
        except PermissionError:
            fd = os.open(path, os.O_RDONLY)
        with os.fdopen(fd, "rb") as f:
            data = json.loads(f.read())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _tree_size(d: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(d):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


@dataclass(frozen=True)
class CacheSummary:
    """``envspec cache``: counts and bytes per kind, the other directories' sizes and what each is;
    ``to_json`` is what ``--json`` prints (beside the entries)."""

    cache: str
    kinds: dict[str, dict[str, int]]  # kind -> {"count", "bytes"}
    other: dict[str, int]  # a directory or file that is not an entry -> its bytes
    other_what: dict[str, str]  # ... -> what it is
    total_bytes: int

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def summary(cache: Cache, entries: Sequence[CacheEntry] | None = None) -> CacheSummary:
    """``envspec cache``: counts and bytes per kind, and the other directories' sizes."""
    entries = scan(cache) if entries is None else entries
    kinds: dict[str, dict[str, int]] = {k: {"count": 0, "bytes": 0} for k in KINDS}
    for e in entries:
        kinds[e.kind]["count"] += 1
        kinds[e.kind]["bytes"] += e.size
    counted = {p for e in entries for p in e.paths}
    other: dict[str, int] = {}
    what: dict[str, str] = {}
    for p in sorted(cache.root.iterdir()):
        if p.name in ("blobs", "debs", "layers", "built"):
            loose = sum(q.stat().st_size for q in p.rglob("*") if q.is_file() and q not in counted)
            if loose:
                name = f"{p.name}/ (not entries)"
                other[name] = loose
                what[name] = (
                    "files being written by a running build, or left by one that was killed; "
                    "not collected (a build of the same file replaces them)"
                )
        elif p.is_dir():
            other[p.name + "/"] = _tree_size(p)
            what[p.name + "/"] = OTHER.get(p.name, "not envspec's: not collected")
        elif p.is_file():
            other[p.name] = p.stat().st_size
            what[p.name] = OTHER.get(p.name, "not envspec's: not collected")
    return CacheSummary(
        cache=str(cache.root),
        kinds=kinds,
        other=other,
        other_what=what,
        total_bytes=sum(v["bytes"] for v in kinds.values()) + sum(other.values()),
    )


# what the cache's other directories and files are, for `envspec cache` (none is collected by gc)
OTHER = {
    "apt": "Debian's package indexes, as `envspec lock` read them (refreshed by lock)",
    "uv": "the Python resolver's index cache (uv's own; `uv cache clean` empties it)",
    "compat-db": "the compatibility DB as `envspec db refresh` last wrote it",
    "abi": "what the ABI check read of compiled wheels, by wheel hash",
    "index-names": "package names read from the indexes, for did-you-mean",
    "index-reads": "index pages read at lock time",
    "emulation": "what `envspec run --emulate` found of qemu-user-static",
    "locks": "the flock files that keep builds and `cache gc` apart (empty files)",
    "lockfiles": "the text of each lock `envspec lock` wrote, by content hash: it names a hand edit's field",
    "tmp": "the work directories of running builds (a dead build's are removed by the next build)",
    "compress.log": "the log of the last background compression after a build",
}


# --- what locks need -------------------------------------------------------------------------------


@dataclass
class Needed:
    """What the kept locks need: wheel and .deb sha256s, layer key hexes; and which lock needs each."""

    wheels: set[str] = field(default_factory=set)
    debs: set[str] = field(default_factory=set)
    layers: set[str] = field(default_factory=set)
    built: set[str] = field(default_factory=set)  # derivation key hexes of wheels built from sdists
    by: dict[str, list[str]] = field(default_factory=dict)  # "kind:name" -> lock paths

    def add(self, lock_path: str, entries: Iterable[tuple[str, str]]) -> None:
        """What the lock at ``lock_path`` needs: (kind, name) entries (``envspec.plan.cache_entries``)."""
        for kind, name in entries:
            self._set(kind).add(name)
            self.by.setdefault(f"{kind}:{name}", []).append(lock_path)

    def needs(self, e: CacheEntry) -> bool:
        return e.name in self._set(e.kind)

    def _set(self, kind: str) -> set[str]:
        return {"wheel": self.wheels, "deb": self.debs, "layer": self.layers, "built": self.built}[
            kind
        ]


def repository_root(start: Path) -> Path:
    """The git work tree holding ``start`` (its top, with a ``.git``), else ``start`` itself."""
    start = start.resolve()
    for d in (start, *start.parents):
        if (d / ".git").exists():
            return d
    return start


_SKIP_DIRS = {
    ".git",
    ".venv",
    "venv",
    "node_modules",
    "__pycache__",
    ".tox",
    ".mypy_cache",
    ".pytest_cache",
}


def default_locks(start: Path) -> list[Path]:
    """The envspec locks of the repository holding ``start``: every ``*.lock`` under it (not in
    .git, virtual environments, node_modules, caches) that is an envspec lockfile (its first line
    says so), sorted. Other tools' ``*.lock`` files (uv.lock, Cargo.lock, ...) are not."""
    root = repository_root(start)
    found: list[Path] = []
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        for f in sorted(files):
            if f.endswith(".lock"):
                p = Path(dirpath) / f
                try:
                    with open(p, encoding="utf-8", errors="replace") as fh:
                        head = fh.readline()
                except OSError:
                    continue
                if head.startswith("# envspec lockfile"):
                    found.append(p)
    return sorted(found)


# --- the collection -------------------------------------------------------------------------------


def in_store(entries: Iterable[CacheEntry], stored: Collection[str]) -> list[CacheEntry]:
    """The layers whose diff_id containers-storage holds too (``stored``: the store's diff_ids):
    what a node that takes its images from a registry (cache) may drop, as ``podman pull`` keeps
    only the store. A build of the same lock with ``--cache-from`` finds them in the store and
    reads nothing; one without a registry cache makes them again."""
    return [e for e in entries if e.kind == "layer" and e.diff_id and e.diff_id in stored]


@dataclass
class GcPlan:
    keep: list[tuple[CacheEntry, str]]  # (entry, why: "needed" | "recent" | "budget")
    remove: list[CacheEntry]
    keep_size: int | None = None
    over_budget: int = 0  # bytes the needed (and recent) entries alone exceed the budget by
    stored: int = 0  # of ``remove``: the layers removed because containers-storage holds them

    @property
    def freed(self) -> int:
        return sum(e.size for e in self.remove)

    @property
    def kept(self) -> dict[str, int]:
        """How many entries are kept, their bytes, and how many for each reason."""
        return {
            "count": len(self.keep),
            "bytes": sum(e.size for e, _ in self.keep),
            "needed": sum(1 for _, why in self.keep if why == "needed"),
            "recent": sum(1 for _, why in self.keep if why == "recent"),
            "budget": sum(1 for _, why in self.keep if why == "budget"),
        }

    def to_json(self) -> dict[str, object]:
        return {
            "keep_size": self.keep_size,
            "kept": self.kept,
            "removed": [e.to_json() for e in self.remove],
            "freed_bytes": self.freed,
            "over_budget_bytes": self.over_budget,
            "removed_in_store": self.stored,
        }


def plan_gc(
    entries: Sequence[CacheEntry],
    needed: Needed,
    *,
    keep_size: int | None = None,
    now: float | None = None,
    grace: float = GRACE_S,
    stored: Collection[str] = (),
) -> GcPlan:
    """Which entries stay and which go (pure: nothing is touched). ``stored``: the diff_ids of
    containers-storage (``cache gc --stored``); the layers it holds go whatever the locks need
    and however recently used (``in_store``)."""
    now = time.time() if now is None else now
    keep: list[tuple[CacheEntry, str]] = []
    rest: list[CacheEntry] = []
    dropped = {e.name for e in in_store(entries, stored)}
    for e in entries:
        if e.kind == "layer" and e.name in dropped:
            continue
        if needed.needs(e):
            keep.append((e, "needed"))
        elif e.used > now - grace:
            keep.append((e, "recent"))
        else:
            rest.append(e)
    remove: list[CacheEntry] = []
    over = 0
    if keep_size is None:
        remove = rest
    else:
        total = sum(e.size for e, _ in keep)
        over = max(0, total - keep_size)
        for e in sorted(rest, key=lambda e: -e.used):  # most recently used first
            if total + e.size <= keep_size:
                keep.append((e, "budget"))
                total += e.size
            else:
                remove.append(e)
    remove += [e for e in entries if e.kind == "layer" and e.name in dropped]
    return GcPlan(
        keep=keep,
        remove=sorted(remove, key=lambda e: (e.kind, e.name)),
        keep_size=keep_size,
        over_budget=over,
        stored=len(dropped),
    )


def collect(
    cache: Cache,
    needed: Needed,
    *,
    keep_size: int | None = None,
    dry_run: bool = False,
    grace: float = GRACE_S,
    on_wait: Callable[[list[str]], None] = lambda users: None,
    stored: Collection[str] = (),
) -> GcPlan:
    """Plan and (unless ``dry_run``) carry out a collection under the cache's exclusive lock.
    ``on_wait`` is called once, with the builds using the cache (``users``), when the collection
    waits for them. A dry run removes nothing, so it waits for nobody: it plans from the cache as
    it is (what running builds use now is kept as recently used)."""
    started = time.time()
    if dry_run:
        return plan_gc(
            scan(cache), needed, keep_size=keep_size, now=started, grace=grace, stored=stored
        )
    with cache.exclusive(on_wait=lambda: on_wait(users(cache))):
        plan = plan_gc(
            scan(cache), needed, keep_size=keep_size, now=started, grace=grace, stored=stored
        )
        for e in plan.remove:
            _remove(cache, e)
    return plan


def users(cache: Cache) -> list[str]:
    """The processes holding the cache's shared lock (running builds), as "pid N: command line",
    read from /proc/locks (the flock's inode) and /proc/N/cmdline; empty where they cannot be read."""
    try:
        ino = os.stat(cache.root / "locks" / "cache.lock").st_ino
        table = Path("/proc/locks").read_text()
    except OSError:
        return []
    out = []
    for line in table.splitlines():
        f = line.split()
        # "1: FLOCK  ADVISORY  READ 12345 fd:01:123456 0 EOF" ("->" marks a waiter)
        if "->" in f or len(f) < 6 or f[1] != "FLOCK":
            continue
        if f[5].rsplit(":", 1)[-1] == str(ino) and f[4].isdigit():
            try:
                argv = Path(f"/proc/{f[4]}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
                cmd = " ".join(a.decode(errors="replace") for a in argv)
            except OSError:
                cmd = "?"
            out.append(f"pid {f[4]}: {cmd}")
    return sorted(set(out))


def _remove(cache: Cache, e: CacheEntry) -> None:
    if e.kind == "layer":
        with cache.locked("layer-" + e.name):
            for p in e.paths:  # the .json (the record) first: no longer an entry, then its files
                p.unlink(missing_ok=True)
    elif e.kind == "built":
        import shutil

        with cache.locked("built-" + e.name):
            (cache.root / "built" / e.name / "wheel.json").unlink(
                missing_ok=True
            )  # first: no longer an entry
            shutil.rmtree(cache.root / "built" / e.name, ignore_errors=True)
    else:
        for p in e.paths:
            p.unlink(missing_ok=True)


# --- sizes -----------------------------------------------------------------------------------------

_UNITS = {
    "": 1,
    "B": 1,
    "K": 1 << 10,
    "KB": 10**3,
    "KIB": 1 << 10,
    "M": 1 << 20,
    "MB": 10**6,
    "MIB": 1 << 20,
    "G": 1 << 30,
    "GB": 10**9,
    "GIB": 1 << 30,
    "T": 1 << 40,
    "TB": 10**12,
    "TIB": 1 << 40,
}


def parse_size(text: str) -> int:
    """``"500M"``, ``"10G"``, ``"1.5GiB"``, ``"20GB"``, ``"0"`` -> bytes (K/M/G/T and KiB..TiB are
    powers of 1024, KB..TB of 1000)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).upper() if m else ""
    if not m or unit not in _UNITS:
        raise UsageError(
            f"--keep-size {text!r} is not a size",
            reference="bad-size",
            hint="a number with K, M, G or T (powers of 1024) or KB, MB, GB, TB (of 1000), e.g. 20G",
        )
    return int(float(m.group(1)) * _UNITS[unit])


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover

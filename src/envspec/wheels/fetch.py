"""The lock's wheels as files in the cache: each found by filename on the mirrors, then on its
canonical index, and checked against its sha256 before it enters the cache (a mismatch raises
``HashMismatch``; the cache's layout: ``envspec.cache``). Only bytes whose sha256 the lock knows
are fetched; everything enters read-only by atomic rename, so concurrent builds sharing a cache see a file
whole or not at all.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from envspec import sources
from envspec.cache.store import Cache, Identity, admit, copy_local, identity, reflink
from envspec.errors import HashMismatch, SourceError


class FilePin(Protocol):
    """A file pinned by sha256 on an index: a lock's ``Wheel`` (a wheel, or an sdist built from
    source), a build input, or a resolution's ``WheelCandidate`` before the lock is written."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def filename(self) -> str: ...
    @property
    def index(self) -> str: ...
    @property
    def sha256(self) -> str: ...
    @property
    def size(self) -> int: ...


CHUNK = 1 << 20


def _local_path(url: str) -> Path | None:
    """The file of a ``file://`` URL (or a bare path): a local mirror's or a find-links folder's."""
    parsed = urllib.parse.urlparse(url)
    return Path(urllib.parse.unquote(parsed.path)) if parsed.scheme in ("", "file") else None


def _download(url: str, dest_tmp: Path, timeout: float) -> str:
    """Download ``url`` to ``dest_tmp``; return the sha256 hex of the bytes."""
    h = hashlib.sha256()
    req = urllib.request.Request(url, headers={"User-Agent": "envspec"})
    with urllib.request.urlopen(req, timeout=timeout) as resp, open(dest_tmp, "wb") as fo:  # noqa: S310
        while chunk := resp.read(CHUNK):
            h.update(chunk)
            fo.write(chunk)
    return h.hexdigest()


def _hash_in_place(path: Path) -> tuple[str, Identity | None]:
    """The sha256 of the local file ``path``, read where it is, and its identity (``identity``);
    None for the identity when it changed while it was read."""
    with open(path, "rb") as f:
        before = identity(os.fstat(f.fileno()))
        got = hashlib.file_digest(f, "sha256").hexdigest()
        after = identity(os.fstat(f.fileno()))
    return got, (before if before == after else None)


def _sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class WheelFetcher:
    """Finds a pinned wheel by filename on the mirrors, then on its canonical index, and puts
    the verified bytes in the cache.

    A file of a local source (a ``file://`` mirror, a find-links folder) shares no inode with the
    cache: it enters as a reflink (an inode of its own) where the file system has them; where it
    has not, it is read where it is (``read_in_place``): hashed there, not copied, its path
    returned and its identity kept in ``in_place``, so that whoever reads it later (the layer
    makers) can tell it changed since. Reading in place costs h100-train's cold build what the
    hard link of earlier versions did; a copy (``copy_local``) 9-12% more on ext4
    (bench/local_source.py, docs/benchmarks.md)."""

    read_in_place = (
        True  # False: a local file is copied into the cache (bench/local_source.py's "copy")
    )

    def __init__(
        self,
        cache: Cache,
        mirrors: Sequence[sources.Mirror],
        *,
        timeout: float = 120,
        allow_canonical: bool = True,
        on_damaged: Callable[[str], None] | None = None,
    ) -> None:
        self.cache = cache
        self.on_damaged = (
            on_damaged  # told of a cache entry that no longer matched and is fetched again
        )
        self.mirrors = list(mirrors)
        self.timeout = timeout
        self.allow_canonical = allow_canonical
        self.in_place: dict[
            str, Identity
        ] = {}  # sha256 -> identity of a local file returned where it is
        self._listing: dict[tuple[str, str], dict[str, str]] = {}
        self._listing_errors: dict[tuple[str, str], str] = {}

    def _files(self, kind: str, url: str, project: str) -> dict[str, str]:
        key = (url, project if kind == "index" else "")
        if key not in self._listing:
            try:
                if kind == "links":
                    self._listing[key] = sources.links_files(url, timeout=self.timeout)
                else:
                    self._listing[key] = sources.project_files(url, project, timeout=self.timeout)
            except (OSError, ValueError) as e:  # unreachable or unreadable: try the next source
                self._listing[key] = {}
                self._listing_errors[key] = f"{url}: {getattr(e, 'reason', None) or e}"
        return self._listing[key]

    def candidates(self, pin: FilePin) -> Iterator[tuple[str, str]]:
        """(where, URL) in the order tried: mirrors first, then the canonical index."""
        for m in self.mirrors:
            url = self._files(m.kind, m.url, pin.name).get(pin.filename)
            if url:
                yield f"mirror {m.url}", url
        if self.allow_canonical and pin.index:
            url = self._files("index", pin.index, pin.name).get(pin.filename)
            if url:
                yield f"index {pin.index}", url

    def fetch(self, pin: FilePin) -> Path:
        dest = self.cache.blob(pin.sha256)
        if dest.is_file():
            if _sha256_file(dest) == pin.sha256:  # checked before each use, not only on entry
                return dest
            dest.unlink(
                missing_ok=True
            )  # damaged in the cache: fetch it again (a link: only the link goes)
            if self.on_damaged:
                self.on_damaged(
                    f"the cached {pin.filename} ({dest}) no longer matched its sha256; "
                    "it was removed and is fetched again"
                )
        mismatches: list[str] = []
        failures: list[str] = []
        for where, url in self.candidates(pin):
            tmp = self.cache.root / "tmp" / f"{os.getpid()}-{pin.sha256[:16]}.part"
            tmp.unlink(missing_ok=True)
            local = _local_path(url)
            try:
                if local is None:
                    got = _download(url, tmp, self.timeout)
                elif not self.read_in_place:  # a copy of its own: the copy is what is hashed
                    copy_local(local, tmp)
                    got = _sha256_file(tmp)
                elif reflink(local, tmp):
                    got = _sha256_file(tmp)
                else:  # no reflinks here: hashed where it is, returned with its identity
                    got, ident = _hash_in_place(local)
                    if ident is None:
                        failures.append(f"{where} ({url}): changed while it was read")
                        continue
                    if got == pin.sha256:
                        self.in_place[pin.sha256] = ident
                        return local
                    mismatches.append(f"{where} ({url}) gave sha256 {got}")
                    continue
            except (OSError, urllib.error.URLError) as e:
                tmp.unlink(missing_ok=True)
                failures.append(f"{where}: {e}")
                continue
            if got != pin.sha256:
                tmp.unlink(missing_ok=True)
                mismatches.append(f"{where} ({url}) gave sha256 {got}")
                continue
            return admit(tmp, dest)
        raise self._not_fetched(pin, mismatches, failures)

    def _not_fetched(
        self, pin: FilePin, mismatches: list[str], failures: list[str]
    ) -> HashMismatch | SourceError:
        """Why no source gave ``pin``: the sources whose bytes were others (``HashMismatch``),
        else where it was looked for and the errors met (``SourceError``)."""
        if mismatches:  # no source has the locked bytes: every one tried is named
            return HashMismatch(
                f"{pin.filename}: the lock says sha256 {pin.sha256}, but no source has those bytes:\n"
                + "\n".join(f"    {m}" for m in [*mismatches, *failures]),
                step=f"fetch {pin.filename}",
                hint="the file changed upstream or the lock was edited by hand; re-lock with `envspec lock` "
                "and review the change",
            )
        tried = [f"mirror {m.url}" for m in self.mirrors] + (
            [f"index {pin.index}"] if pin.index else []
        )
        failures = failures + [
            err for (url, proj), err in self._listing_errors.items() if proj in ("", pin.name)
        ]
        return SourceError(
            f"{pin.filename} ({pin.name} {pin.version}) was not found on: {', '.join(tried) or 'no source'}"
            + (f"\n  errors: {'; '.join(failures)}" if failures else ""),
            hint="set ENVSPEC_MIRRORS or [sources].mirrors to a mirror holding it, or check the network",
            reference="file-not-found",
        )

    def fetch_all(
        self,
        pins: Sequence[FilePin],
        *,
        on_start: Callable[[FilePin], None] | None = None,
        on_done: Callable[[FilePin, Path], None] | None = None,
        workers: int = 4,
    ) -> dict[str, Path]:
        """Fetch every pin (parallel downloads); raises the first error after the rest stop."""
        out: dict[str, Path] = {}
        todo = list({p.sha256: p for p in pins}.values())

        def one(p: FilePin) -> tuple[FilePin, Path, bool]:
            cached = self.cache.has_blob(p.sha256)
            if on_start and not cached:
                on_start(p)
            path = self.fetch(
                p
            )  # a cached file is hashed again here (threads: hashlib frees the GIL)
            return p, path, cached

        if todo:
            with ThreadPoolExecutor(max_workers=max(1, min(workers, len(todo)))) as ex:
                futs = [ex.submit(one, p) for p in todo]
                try:
                    for f in futs:
                        p, path, cached = f.result()
                        out[p.sha256] = path
                        if on_done and not cached:
                            on_done(p, path)
                except BaseException:
                    for f in futs:
                        f.cancel()
                    raise
        return out

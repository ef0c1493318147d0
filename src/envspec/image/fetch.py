"""The content-addressed cache and fetching of pinned files into it.

Layout under the cache root (``ENVSPEC_CACHE``, else ``$XDG_CACHE_HOME/envspec``, else
``~/.cache/envspec``: ``envspec.host.cache_dir_for``)::

    blobs/sha256/<hex>         fetched wheels, named by their verified sha256
    debs/                      what envspec.debian.fetch_deb keeps
    layers/<key>.tar           finished layer tars, named by the plan's content key
    layers/<key>.json          their diff_id, size, entries (written after the tar: its presence
                               means the tar is complete)
    layers/<key>.<id>.tar.zst  the layer compressed by compressor ``id`` (``image/compress.py``),
    layers/<key>.<id>.json     and its blob digest and size (written after the blob)
    locks/                     flock files: one per layer key, one for importing into storage,
                               cache.lock (shared by running builds, exclusive for ``cache gc``)
    tmp/<pid>-<random>/        work directories; a dead pid's are removed by the next build

Only bytes whose sha256 the lock knows are fetched; each is checked before it enters the cache
(a mismatch raises ``HashMismatch``). Everything enters by atomic rename, so concurrent builds
sharing a cache see a file whole or not at all.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator, Sequence

from envspec import sources
from envspec.errors import HashMismatch, SourceError
from envspec.host import cache_dir_for
from envspec.lock import Wheel

CHUNK = 1 << 20


def default_cache_dir() -> Path:
    """The cache of this environment, by envspec.host's one rule (``cache_dir_for``)."""
    return cache_dir_for(os.environ)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as e:
        return e.errno == errno.EPERM
    return True


@contextlib.contextmanager
def flocked(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (made if missing); the kernel drops it if the process dies."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class SharedUse:
    """A held shared flock on the cache's ``locks/cache.lock``: a build is using the cache
    (``envspec cache gc`` takes it exclusively). Released by ``release()``, or by the kernel when
    the process dies."""

    def __init__(self, path: Path) -> None:
        self.fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_SH)

    def release(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __del__(self) -> None:
        self.release()


class Cache:
    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root else default_cache_dir()
        for sub in ("blobs/sha256", "layers", "locks", "tmp", "debs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    # -- blobs ----------------------------------------------------------------------------------
    def blob(self, sha256: str) -> Path:
        return self.root / "blobs" / "sha256" / sha256

    def has_blob(self, sha256: str) -> bool:
        return self.blob(sha256).is_file()

    # -- layers ---------------------------------------------------------------------------------
    def layer_tar(self, key: str) -> Path:
        return self.root / "layers" / (key.split(":", 1)[-1] + ".tar")

    def layer_meta(self, key: str) -> Path:
        return self.root / "layers" / (key.split(":", 1)[-1] + ".json")

    def layer_blob(self, key: str, compressor: str, suffix: str) -> Path:
        """The layer compressed by ``compressor`` (a ``Compression.id``): its version is in the name."""
        return self.root / "layers" / f"{key.split(':', 1)[-1]}.{compressor}.tar{suffix}"

    def layer_blob_meta(self, key: str, compressor: str) -> Path:
        return self.root / "layers" / f"{key.split(':', 1)[-1]}.{compressor}.json"

    # -- locks and work dirs ----------------------------------------------------------------------
    def locked(self, name: str) -> contextlib.AbstractContextManager[None]:
        """An exclusive flock; released by the kernel if this process dies."""
        return flocked(self.root / "locks" / (name.replace("/", "_").replace(":", "_") + ".lock"))

    def in_use(self) -> SharedUse:
        """Mark the cache as used by a build until ``release()`` (a shared flock)."""
        return SharedUse(self.root / "locks" / "cache.lock")

    @contextlib.contextmanager
    def exclusive(self, on_wait: Callable[[], None] = lambda: None) -> Iterator[None]:
        """The cache to ourselves: no build runs while this is held (``cache gc``). Calls
        ``on_wait`` once if a build holds the cache and we wait for it."""
        fd = os.open(self.root / "locks" / "cache.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                on_wait()
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def workdir(self) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=self.root / "tmp"))

    def clean_stale(self) -> list[Path]:
        """Remove work directories (and half-written files) of builds whose process is gone."""
        removed = []
        for d in (self.root / "tmp").iterdir():
            pid = d.name.split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
                shutil.rmtree(d, ignore_errors=True) if d.is_dir() else d.unlink(missing_ok=True)
                removed.append(d)
        return removed


# --- fetching ------------------------------------------------------------------------------------

def _copy_verified(src_url: str, dest_tmp: Path, timeout: float) -> str:
    """Copy (or hardlink, for a local file on the same file system) ``src_url`` to ``dest_tmp``;
    return the sha256 hex of the bytes."""
    parsed = urllib.parse.urlparse(src_url)
    h = hashlib.sha256()
    if parsed.scheme in ("", "file"):
        src = Path(urllib.parse.unquote(parsed.path))
        try:
            os.link(src, dest_tmp)
            with open(dest_tmp, "rb") as f:
                while chunk := f.read(CHUNK):
                    h.update(chunk)
            return h.hexdigest()
        except OSError:
            dest_tmp.unlink(missing_ok=True)
        with open(src, "rb") as fi, open(dest_tmp, "wb") as fo:
            while chunk := fi.read(CHUNK):
                h.update(chunk)
                fo.write(chunk)
        return h.hexdigest()
    req = urllib.request.Request(src_url, headers={"User-Agent": "envspec"})
    with urllib.request.urlopen(req, timeout=timeout) as resp, open(dest_tmp, "wb") as fo:  # noqa: S310
        while chunk := resp.read(CHUNK):
            h.update(chunk)
            fo.write(chunk)
    return h.hexdigest()


def _sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class WheelFetcher:
    """Finds a pinned wheel by filename on the mirrors, then on its canonical index, and puts
    the verified bytes in the cache."""

    def __init__(self, cache: Cache, mirrors: Sequence[sources.Mirror], *, timeout: float = 120,
                 allow_canonical: bool = True) -> None:
        self.cache = cache
        self.mirrors = list(mirrors)
        self.timeout = timeout
        self.allow_canonical = allow_canonical
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

    def candidates(self, pin: Wheel) -> Iterator[tuple[str, str]]:
        """(where, URL) in the order tried: mirrors first, then the canonical index."""
        for m in self.mirrors:
            url = self._files(m.kind, m.url, pin.name).get(pin.filename)
            if url:
                yield f"mirror {m.url}", url
        if self.allow_canonical and pin.index:
            url = self._files("index", pin.index, pin.name).get(pin.filename)
            if url:
                yield f"index {pin.index}", url

    def fetch(self, pin: Wheel) -> Path:
        dest = self.cache.blob(pin.sha256)
        if dest.is_file():
            if _sha256_file(dest) == pin.sha256:  # checked before each use, not only on entry
                return dest
            dest.unlink(missing_ok=True)  # damaged in the cache: fetch it again
        mismatches: list[str] = []
        failures: list[str] = []
        for where, url in self.candidates(pin):
            tmp = self.cache.root / "tmp" / f"{os.getpid()}-{pin.sha256[:16]}.part"
            tmp.unlink(missing_ok=True)
            try:
                got = _copy_verified(url, tmp, self.timeout)
            except (OSError, urllib.error.URLError) as e:
                tmp.unlink(missing_ok=True)
                failures.append(f"{where}: {e}")
                continue
            if got != pin.sha256:
                tmp.unlink(missing_ok=True)
                mismatches.append(f"{where} ({url}) gave sha256 {got}")
                continue
            os.replace(tmp, dest)
            return dest
        if mismatches:
            raise HashMismatch(
                f"{pin.filename}: the lock says sha256 {pin.sha256}, but\n"
                + "\n".join(f"    {m}" for m in mismatches),
                step=f"fetch {pin.filename}",
                hint="the file changed upstream or the lock was edited by hand; re-lock with `envspec lock` "
                     "and review the change",
            )
        tried = [f"mirror {m.url}" for m in self.mirrors] + ([f"index {pin.index}"] if pin.index else [])
        failures += [err for (url, proj), err in self._listing_errors.items() if proj in ("", pin.name)]
        raise SourceError(
            f"{pin.filename} ({pin.name} {pin.version}) was not found on: {', '.join(tried) or 'no source'}"
            + (f"\n  errors: {'; '.join(failures)}" if failures else ""),
            hint="set ENVSPEC_MIRRORS or [sources].mirrors to a mirror holding it, or check the network",
            reference="file-not-found",
        )

    def fetch_all(self, pins: Sequence[Wheel], *, on_start: Callable[[Wheel], None] | None = None,
                  on_done: Callable[[Wheel, Path], None] | None = None, workers: int = 4) -> dict[str, Path]:
        """Fetch every pin (parallel downloads); raises the first error after the rest stop."""
        out: dict[str, Path] = {}
        todo = list({p.sha256: p for p in pins}.values())

        def one(p: Wheel) -> tuple[Wheel, Path, bool]:
            cached = self.cache.has_blob(p.sha256)
            if on_start and not cached:
                on_start(p)
            path = self.fetch(p)  # a cached file is hashed again here (threads: hashlib frees the GIL)
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

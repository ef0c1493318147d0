"""The cache's files, locks and work directories (``Cache``); its layout is in ``envspec.cache``."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from envspec.cache.dirs import cache_dir_for

ENTRY_MODE = 0o444  # a checked entry: a stray write fails instead of damaging it (root aside)
FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int), a reflink of a whole file
CHUNK = 1 << 20


def admit(tmp: Path, dest: Path) -> Path:
    """Make the checked file ``tmp`` the cache entry ``dest``: read-only, then renamed into place
    (atomic: a reader sees the whole entry or none). Its mode is set on ``tmp``, a file of ours,
    never through ``dest``, which may be a link a user left in the cache."""
    os.chmod(tmp, ENTRY_MODE)
    os.replace(tmp, dest)
    return dest


def reflink(src: Path, dest: Path) -> bool:
    """Make the new file ``dest`` a reflink of ``src`` (``FICLONE``: an inode of its own sharing
    the blocks copy-on-write, no byte copied), where the file system has them (btrfs, XFS); False
    (and no ``dest``) where it has not (ext4) or they are on two file systems."""
    try:
        with open(src, "rb") as fi, open(dest, "wb") as fo:
            fcntl.ioctl(fo.fileno(), FICLONE, fi.fileno())
        return True
    except OSError:
        dest.unlink(missing_ok=True)
        return False


def copy_local(src: Path, dest: Path) -> str:
    """Copy the local file ``src`` to the new file ``dest``, an inode of its own: a reflink where
    the file system has them, else ``copy_file_range`` (the copy stays in the kernel), else
    through this process. Returns how (``"reflink"``, ``"kernel"``, ``"read"``)."""
    if reflink(src, dest):
        return "reflink"
    with open(src, "rb") as fi, open(dest, "wb") as fo:
        size = os.fstat(fi.fileno()).st_size
        try:
            off = 0
            while off < size:
                n = os.copy_file_range(fi.fileno(), fo.fileno(), size - off, off, off)
                if n == 0:
                    break
                off += n
            if off == size:
                return "kernel"
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
        fi.seek(0)
        fo.seek(0)
        fo.truncate()
        shutil.copyfileobj(fi, fo, CHUNK)
        return "read"


Identity = tuple[int, int, int, int, int]


def identity(st: os.stat_result) -> Identity:
    """What tells a file read in place from the same path changed or replaced: its device and
    inode, size, and modification and change times (a write, a chmod or a rename over it moves
    the change time, which no user can set back)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


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

    def evict_layer(self, tar: Path) -> bool:
        """Drop the cached layer whose tar is ``tar``: its record first (no longer an entry), then
        the tar and its compressed blobs with their records, under the layer's lock; False where
        ``tar`` is not a layer of this cache."""
        layers = self.root / "layers"
        if tar.parent != layers or tar.suffix != ".tar":
            return False
        hexkey = tar.stem
        with self.locked("layer-" + hexkey):
            self.layer_meta(hexkey).unlink(missing_ok=True)
            tar.unlink(missing_ok=True)
            for p in layers.glob(f"{hexkey}.*"):
                p.unlink(missing_ok=True)
        return True

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

"""Layer compression for pushes and archives: fixed settings, so the compressed bytes (and the
manifest that names them) are a function of the layer's bytes and the compressor's version.

The layer tar is compressed while it is written (``TarWriter(compression=...)`` tees its bytes
into a ``Sink``), on threads that release the GIL, so it uses the machine's cores beside the
layer maker. Each compressed blob is hashed as it is written.

- ``zstd``: the ``zstandard`` package's bundled libzstd, level 3, multi-threaded streaming with
  at least one worker, checksum on, no content size. zstd's multi-threaded output is the same
  for any number of workers >= 1 (but differs from its single-threaded mode, never used here)
  and does not depend on how the input is cut into writes: facebook/zstd#2238, #2327 (the
  maintainers), checked in tests/unit/test_compress.py.
- ``gzip``: the system zlib (Python's ``zlib``), level 6, pigz's scheme: the input in blocks of
  1 MiB, each deflated on its own thread with the 32 KiB before it as dictionary and ended with
  a sync flush, so the output does not depend on the number of threads; gzip header without
  name and with mtime 0. zlib's output depends on its version (zlib-ng and Intel's or
  Cloudflare's forks differ), so the version is part of the compressor's id.
- ``none``: no second file; the blob is the tar itself.

A compressor's ``id`` (``zstd-1.5.7-3``, ``gzip-zlib1.2.13-6``) names its blobs in the layer
cache, so blobs of another version never mix (docs/build.md, "Compressed layers").
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from envspec.errors import BuildError, DamagedEntry

NAMES = ("zstd", "gzip", "none")
DEFAULT = "zstd"  # docs/build.md says why: smaller than podman's gzip, several times faster
ZSTD_LEVEL = 3
GZIP_LEVEL = 6
GZIP_BLOCK = 1 << 20
GZIP_DICT = 32 << 10
MT_LAYER = "application/vnd.oci.image.layer.v1.tar"


def threads() -> int:
    """The cores there are (this process's affinity), at least one."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class Compression:
    name: str  # zstd | gzip | none

    @property
    def media_type(self) -> str:
        return MT_LAYER if self.name == "none" else f"{MT_LAYER}+{self.name}"

    @property
    def suffix(self) -> str:
        return {"zstd": ".zst", "gzip": ".gz", "none": ""}[self.name]

    @property
    def id(self) -> str:
        """The compressor, its version and its settings: equal ids give equal bytes."""
        if self.name == "zstd":
            import zstandard

            return f"zstd-{'.'.join(map(str, zstandard.ZSTD_VERSION))}-{ZSTD_LEVEL}"
        if self.name == "gzip":
            return f"gzip-zlib{zlib.ZLIB_RUNTIME_VERSION}-{GZIP_LEVEL}"
        return "none"

    def sink(self, path: Path) -> Sink | None:
        """A writer of the compressed blob at ``path``; None for ``none``."""
        if self.name == "zstd":
            return ZstdSink(path)
        if self.name == "gzip":
            return GzipSink(path)
        return None


def compression(name: str) -> Compression:
    if name not in NAMES:
        raise BuildError(
            f"unknown compression {name!r}",
            step="compression",
            hint="use --compression zstd, gzip or none",
        )
    if name == "zstd":
        try:
            import zstandard  # noqa: F401
        except ImportError:
            raise BuildError(
                "--compression zstd needs the zstandard package",
                step="compression",
                hint="pip install zstandard, or use --compression gzip",
            ) from None
    return Compression(name)


class _HashedFile:
    """The blob file, hashed as it is written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.f: BinaryIO = open(path, "wb")
        self.h = hashlib.sha256()
        self.n = 0

    def write(self, b: bytes | bytearray | memoryview) -> int:
        self.h.update(b)
        self.f.write(b)
        self.n += len(b)
        return len(b)

    def flush(self) -> None:
        self.f.flush()


class Sink:
    """Takes the tar's bytes in order; ``close`` gives (blob digest, blob size)."""

    path: Path
    out: _HashedFile

    def write(self, b: bytes | bytearray | memoryview) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        raise NotImplementedError

    def close(self) -> tuple[str, int]:
        self._finish()
        self.out.f.close()
        return "sha256:" + self.out.h.hexdigest(), self.out.n

    def abort(self) -> None:
        try:
            self.out.f.close()
        finally:
            self.path.unlink(missing_ok=True)


class ZstdSink(Sink):
    def __init__(self, path: Path) -> None:
        import zstandard

        self.path = path
        self.out = _HashedFile(path)
        cctx = zstandard.ZstdCompressor(
            level=ZSTD_LEVEL, threads=threads(), write_checksum=True, write_content_size=False
        )
        self._w: zstandard.ZstdCompressionWriter | None = cctx.stream_writer(
            self.out,  # type: ignore[arg-type]
            closefd=False,
        )

    def write(self, b: bytes | bytearray | memoryview) -> None:
        assert self._w is not None
        self._w.write(b)

    def _finish(self) -> None:
        import zstandard

        assert self._w is not None
        self._w.flush(zstandard.FLUSH_FRAME)
        self._release()

    def _release(self) -> None:
        # Free the compressor and its worker threads now, not whenever a cycle is collected: a
        # process forked later (the layer makers' pool) would inherit it, and freeing it there
        # joins threads that do not exist in the child, which hangs the child for ever.
        self._w = None

    def abort(self) -> None:
        self._release()
        super().abort()


class GzipSink(Sink):
    """pigz's parallel gzip on Python threads (zlib releases the GIL while it deflates)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.out = _HashedFile(path)
        self.out.write(
            struct.pack("<BBBBIBB", 0x1F, 0x8B, 8, 0, 0, 0, 0xFF)
        )  # no name, mtime 0, OS unknown
        self._n = threads()
        self._pool = ThreadPoolExecutor(max_workers=self._n, thread_name_prefix="envspec-gzip")
        self._pending: deque[Future[bytes]] = deque()
        self._buf = bytearray()
        self._prev = b""
        self._crc = 0
        self._size = 0
        self._lock = threading.Lock()

    @staticmethod
    def _deflate(block: bytes, zdict: bytes, last: bool) -> bytes:
        c = (
            zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY, zdict)
            if zdict
            else zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY)
        )
        return c.compress(block) + c.flush(zlib.Z_FINISH if last else zlib.Z_SYNC_FLUSH)

    def _submit(self, block: bytes, last: bool) -> None:
        self._crc = zlib.crc32(block, self._crc)
        self._size += len(block)
        self._pending.append(self._pool.submit(self._deflate, block, self._prev[-GZIP_DICT:], last))
        self._prev = block
        while len(self._pending) > 2 * self._n:  # bounded memory: write what is done in order
            self.out.write(self._pending.popleft().result())

    def write(self, b: bytes | bytearray | memoryview) -> None:
        self._buf += b
        while len(self._buf) >= GZIP_BLOCK:
            block = bytes(self._buf[:GZIP_BLOCK])
            del self._buf[:GZIP_BLOCK]
            self._submit(block, last=False)

    def _finish(self) -> None:
        self._submit(bytes(self._buf), last=True)  # the last block (maybe empty) ends the stream
        self._buf.clear()
        try:
            while self._pending:
                self.out.write(self._pending.popleft().result())
        finally:
            self._pool.shutdown(wait=True)
        self.out.write(struct.pack("<II", self._crc & 0xFFFFFFFF, self._size & 0xFFFFFFFF))

    def abort(self) -> None:
        for fut in self._pending:
            fut.cancel()
        self._pool.shutdown(wait=True)
        super().abort()


def compress_file(src: Path, dest: Path, comp: Compression, want: str = "") -> tuple[str, int]:
    """Compress a finished layer tar (one taken from the cache without this compressor's blob).
    ``want``: its diff_id, checked as it is read (``DamagedEntry`` where the tar is not that)."""
    sink = comp.sink(dest)
    assert sink is not None
    h = hashlib.sha256() if want else None
    try:
        with open(src, "rb") as f:
            while chunk := f.read(1 << 20):
                if h is not None:
                    h.update(chunk)
                sink.write(chunk)
        if h is not None and f"sha256:{h.hexdigest()}" != want:
            raise DamagedEntry(
                f"the cached layer file {src} is not {want} (sha256:{h.hexdigest()})",
                step="compress layer",
                paths=(src,),
                hint="it changed on disk; build again",
            )
        return sink.close()
    except BaseException:
        sink.abort()
        raise

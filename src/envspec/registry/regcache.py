"""The registry as a layer cache (``build --cache-from REF`` / ``--cache-to REF``; docs/build.md,
"The registry as a layer cache").

The key-to-blob index is the registry itself: one small OCI artifact per layer key in the cache
repository REF, tagged ``layer-<key hex>-<compression>``, no side service. Its manifest is an OCI
image manifest with ``artifactType`` ``application/vnd.envspec.layer-cache.v1``; its config is a
one-layer image config whose ``rootfs.diff_ids`` names the layer's diff digest (so skopeo and
every registry take it as they take cosign's artifacts); its one layer is the compressed blob
itself, as a push of the image carries it; the manifest's annotations record the entry:

- ``dev.envspec.cache.version``: ``1``
- ``dev.envspec.cache.key``: the layer's content key (``plan.Layer.key``)
- ``dev.envspec.cache.diff-id`` / ``dev.envspec.cache.diff-size``: the uncompressed tar's
- ``dev.envspec.cache.compressor``: ``Compression.id`` (version and settings of the compressor)
- ``dev.envspec.cache.group`` and ``dev.envspec.cache.meta``: the layer group and what the maker
  recorded about the layer (entries, pins, .pyc counts), as the local cache keeps it

An entry is used only when every check holds (``check_entry`` and ``fetch``): the manifest is
one of ours, for the key asked, with the compression asked, one layer of the media type that
compression has; the blob's size and sha256 are the ones the manifest records; the blob
decompresses to a tar whose size and sha256 are the entry's diff size and diff_id (the layer's
diff digest: what the image config and the store name the layer by). Anything else is a
``BadEntry``: the build warns, naming the entry and what was wrong, and makes the layer itself;
the fetched bytes go nowhere.

Reading goes through skopeo with the push's ``RegistryAccess`` (``verify_image.RegistryReader``);
writing is the engine's push of a small OCI layout whose blob is a hardlink to the local cache's.
Concurrent writers of different keys touch different tags; writers of one key write equal bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from envspec.errors import EnvspecError, UsageError
from envspec.image import Layers, store_fetched
from envspec.image.compress import MT_LAYER, Compression
from envspec.image.oci import MT_CONFIG, MT_INDEX, MT_MANIFEST, canonical_json, sha256_bytes
from envspec.image.records import LayerRecord, MadeBlob, RegistryEntry
from envspec.image.tarball import PipeTee
from envspec.plan import Layer
from envspec.registry.client import (
    RegistryClient,
    RegistryHTTPError,
    Unsupported,
    credentials,
    split_ref,
)

ARTIFACT_TYPE = "application/vnd.envspec.layer-cache.v1"
VERSION = "1"
A = "dev.envspec.cache."
CHUNK = 1 << 20
Chunk = bytes | memoryview  # a piece of a blob as read: a view of the reader's buffer, or bytes
_HEX64 = re.compile(r"^sha256:[0-9a-f]{64}$")
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REF = re.compile(
    rf"^(?P<host>(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9-]+)*(?::[0-9]+)?)"
    rf"/(?P<repo>{_COMPONENT}(?:/{_COMPONENT})*)$"
)


def parse_ref(ref: str, where: str) -> str:
    """A cache repository ``HOST[:PORT]/PATH`` (no tag, no digest; ``docker://`` allowed), as
    given; else ``UsageError`` (exit 2) naming ``where`` the value came from."""
    bare = ref.strip().removeprefix("docker://")
    m = _REF.match(bare)
    if not m or ("." not in m["host"] and ":" not in m["host"] and m["host"] != "localhost"):
        raise UsageError(
            f"{where} {ref!r}: not a registry repository",
            reference="cache-ref-invalid",
            hint="a repository HOST[:PORT]/PATH without tag or digest, e.g. "
            "registry.example.com/team/envspec-cache or 127.0.0.1:5000/cache",
        )
    return bare


def tag_for(key: str, comp: Compression) -> str:
    """The entry's tag: ``layer-<key hex>-<compression>`` (tags allow 128 characters; this is 75 at most)."""
    return f"layer-{key.split(':', 1)[-1]}-{comp.name}"


class BadEntry(Exception):
    """A cache entry that is there but must not be used; the message says what is wrong."""


# --- the entry format -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class EntryFacts:
    """What an entry says of its layer: its key and group, its blob (compressor, media type,
    digest, size), what it decompresses to (diff_id, size), the local cache's record of it."""

    key: str
    group: str
    comp_id: str
    media_type: str
    digest: str
    size: int
    diff_id: str
    diff_size: int
    record: LayerRecord | None = None


def entry_manifest(facts: EntryFacts) -> tuple[bytes, bytes]:
    """(config, manifest) bytes of the entry for one layer; canonical JSON: equal layers give
    equal bytes on every machine."""
    f = facts
    config = canonical_json(
        {
            "architecture": "",
            "os": "",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [f.diff_id]},
        }
    )
    # what the entry says beside its annotations: the record but the key, group and diff_id
    keep = (
        f.record.model_dump(mode="json", exclude={"key", "group", "diff_id", "size"})
        if f.record is not None
        else {}
    )
    manifest = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": MT_MANIFEST,
            "artifactType": ARTIFACT_TYPE,
            "config": {"mediaType": MT_CONFIG, "digest": sha256_bytes(config), "size": len(config)},
            "layers": [{"mediaType": f.media_type, "digest": f.digest, "size": f.size}],
            "annotations": {
                A + "version": VERSION,
                A + "key": f.key,
                A + "group": f.group,
                A + "diff-id": f.diff_id,
                A + "diff-size": str(f.diff_size),
                A + "compressor": f.comp_id,
                A + "meta": json.dumps(keep, sort_keys=True, separators=(",", ":")),
            },
        }
    )
    return config, manifest


def write_entry(dest: Path, blob: Path, facts: EntryFacts) -> str:
    """An OCI layout at ``dest`` holding the entry of ``facts``, its layer a hardlink to ``blob``
    (a copy across file systems). Returns the manifest digest."""
    config, manifest = entry_manifest(facts)
    out = dest / "blobs" / "sha256"
    out.mkdir(parents=True, exist_ok=True)
    for data in (config, manifest):
        (out / sha256_bytes(data).split(":", 1)[1]).write_bytes(data)
    target = out / facts.digest.split(":", 1)[1]
    if not target.exists():
        try:
            os.link(blob, target)
        except OSError:
            shutil.copyfile(blob, target)
    digest = sha256_bytes(manifest)
    (dest / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
    (dest / "index.json").write_bytes(
        canonical_json(
            {
                "schemaVersion": 2,
                "mediaType": MT_INDEX,
                "manifests": [
                    {
                        "mediaType": MT_MANIFEST,
                        "digest": digest,
                        "size": len(manifest),
                        "annotations": {"org.opencontainers.image.ref.name": "cache"},
                    }
                ],
            }
        )
    )
    return digest


def check_entry(raw: bytes, *, ref: str, key: str, comp: Compression) -> RegistryEntry:
    """The entry a manifest describes, or ``BadEntry``: ours, for ``key``, of ``comp``'s media type."""
    try:
        m = json.loads(raw)
        ann = m.get("annotations") or {}
        if m.get("artifactType") != ARTIFACT_TYPE or ann.get(A + "version") != VERSION:
            raise BadEntry(
                f"not an envspec layer-cache entry (artifactType {m.get('artifactType')!r})"
            )
        if ann.get(A + "key") != key:
            raise BadEntry(f"it is the entry of key {ann.get(A + 'key')!r}, not of {key}")
        layers = m.get("layers") or []
        if len(layers) != 1:
            raise BadEntry(f"{len(layers)} layers, not one")
        lay = layers[0]
        want = comp.media_type if comp.name != "none" else MT_LAYER
        if lay.get("mediaType") != want:
            raise BadEntry(f"its blob is {lay.get('mediaType')!r}, not {want}")
        digest, diff_id = str(lay.get("digest", "")), str(ann.get(A + "diff-id", ""))
        if not _HEX64.match(digest) or not _HEX64.match(diff_id):
            raise BadEntry("its blob digest or diff_id is not a sha256 digest")
        size, diff_size = int(lay["size"]), int(ann[A + "diff-size"])
        meta = json.loads(ann.get(A + "meta") or "{}")
        if not isinstance(meta, dict):
            raise BadEntry("its meta annotation is not a JSON object")
        record = LayerRecord.model_validate(
            {**meta, "key": key, "diff_id": diff_id, "size": diff_size}
        )
        if comp.name == "none" and digest != diff_id:
            raise BadEntry(f"an uncompressed blob {digest} whose diff_id is said to be {diff_id}")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise BadEntry(f"its manifest cannot be read ({type(e).__name__}: {e})") from None
    return RegistryEntry(
        ref=ref,
        manifest_digest=sha256_bytes(raw),
        key=key,
        diff_id=diff_id,
        diff_size=diff_size,
        compressor=str(ann.get(A + "compressor", "")),
        media_type=want,
        digest=digest,
        size=size,
        record=record,
    )


def unpack(blob: Path, tar: Path, entry: RegistryEntry, comp: Compression) -> None:
    """Check the fetched ``blob`` against ``entry`` (size, sha256) while decompressing it to
    ``tar``, then the tar (size, sha256 = diff_id); ``BadEntry`` (and no ``tar``) otherwise."""
    try:
        with open(blob, "rb") as src, open(tar, "wb") as out:
            check_stream(iter(lambda: src.read(CHUNK), b""), out.write, entry, comp)
    except BaseException:
        tar.unlink(missing_ok=True)
        raise


@dataclass
class StreamTimes:
    """Where a layer's stream spent its seconds (``check_stream``): waiting for the blob's bytes,
    hashing them, decompressing, hashing the tar, handing the tar on (to the store's untar)."""

    wait: float = 0.0
    sha256_blob: float = 0.0
    decompress: float = 0.0
    sha256_tar: float = 0.0
    write: float = 0.0

    def items(self) -> tuple[tuple[str, float], ...]:
        return tuple((k, round(v, 3)) for k, v in vars(self).items())


def check_stream(
    chunks: Iterable[Chunk],
    write: Callable[[memoryview], object],
    entry: RegistryEntry,
    comp: Compression,
    times: StreamTimes | None = None,
) -> None:
    """Decompress the blob's ``chunks`` into ``write`` as they come, each byte hashed once on
    each side: the blob (size, sha256) must be ``entry``'s and the tar it decompresses to its
    diff size and diff_id, else ``BadEntry`` (after the last chunk: what was written is the
    caller's to drop). ``times``: where the seconds went. ``write`` gets a view of a buffer that
    is used again after it returns."""
    t = times or StreamTimes()
    src = _Blob(iter(chunks), t)
    th = hashlib.sha256()
    n_out = 0
    problem = ""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    read = _tar_reader(src, comp)
    clock = time.monotonic
    try:
        while True:
            t0, w0 = clock(), t.wait + t.sha256_blob
            n = read(buf)
            t1 = clock()
            t.decompress += (t1 - t0) - (t.wait + t.sha256_blob - w0)  # less the blob's own reads
            if not n:
                break
            n_out += n
            if n_out > entry.diff_size:
                raise BadEntry(
                    f"its blob decompresses to more than the {entry.diff_size} bytes recorded"
                )
            th.update(view[:n])
            t2 = clock()
            write(view[:n])
            t.sha256_tar += t2 - t1
            t.write += clock() - t2
    except (zlib.error, EOFError, _ZstdError, BadEntry) as e:
        problem = (
            str(e)
            if isinstance(e, BadEntry)
            else f"its blob does not decompress as {comp.name} ({e})"
        )
    _check_ends(src, "sha256:" + th.hexdigest(), n_out, entry, comp, problem)


def _check_ends(
    src: _Blob, diff_id: str, n_out: int, entry: RegistryEntry, comp: Compression, problem: str
) -> None:
    """``check_stream``'s checks once the stream has ended: the blob's size and digest first
    (they say more than where the stream broke), then ``problem`` (the decompression's), then
    the tar's size and diff_id."""
    src.drain()  # the blob's digest says more than where the stream broke
    blob_digest = "sha256:" + src.h.hexdigest()
    if src.n != entry.size or blob_digest != entry.digest:
        raise BadEntry(
            f"the blob's bytes are not the ones recorded: sha256 {blob_digest} ({src.n} bytes), "
            f"recorded {entry.digest} ({entry.size} bytes)"
        )
    if problem:
        raise BadEntry(problem)
    if not src.ended:
        raise BadEntry(f"its blob holds more after the end of its {comp.name} stream")
    if n_out != entry.diff_size or diff_id != entry.diff_id:
        raise BadEntry(
            f"the blob decompresses to {diff_id} ({n_out} bytes), not to the layer's diff_id "
            f"{entry.diff_id} ({entry.diff_size} bytes)"
        )


class _Blob:
    """The blob's chunks as a file to read (the decompressor's source), each byte hashed as it
    is read; ``wait`` and ``sha256_blob`` of ``times`` counted here."""

    def __init__(self, it: Iterator[Chunk], times: StreamTimes) -> None:
        self.it, self.t = it, times
        self.h = hashlib.sha256()
        self.n = 0
        self.ended = False  # every chunk was read

    def read(self, _size: int = -1) -> Chunk:
        t0 = time.monotonic()
        chunk = next(self.it, None)
        t1 = time.monotonic()
        self.t.wait += t1 - t0
        if chunk is None:
            self.ended = True
            return b""
        self.h.update(chunk)
        self.n += len(chunk)
        self.t.sha256_blob += time.monotonic() - t1
        return chunk  # a view of the reader's buffer: taken whole before the next read

    def drain(self) -> None:
        while not self.ended:
            self.read()


def _tar_reader(src: _Blob, comp: Compression) -> Callable[[bytearray], int]:
    """buffer -> bytes of the tar read into it (0: the end), decompressing ``src``'s blob;
    raises where the stream is damaged or cut short."""
    if comp.name == "zstd":
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(
            src,  # type: ignore[arg-type]
            read_size=CHUNK,
            read_across_frames=True,
        )

        def zs(buf: bytearray) -> int:
            n = reader.readinto(buf)
            if not n and not src.ended:
                raise EOFError("the zstd stream ends before its blob does")
            return n

        return zs
    dec = _decompressor(comp)
    pending = bytearray()

    def chunked(buf: bytearray) -> int:
        while not pending:
            chunk = src.read()
            pending.extend(dec(chunk))
            if not chunk:
                break
        n = min(len(buf), len(pending))
        buf[:n] = pending[:n]
        del pending[:n]
        return n

    return chunked


try:
    import zstandard as _zstd

    _ZstdError: type[Exception] = _zstd.ZstdError
except ImportError:  # pragma: no cover (zstandard is a dependency)
    _ZstdError = zlib.error


def _decompressor(comp: Compression) -> Callable[[Chunk], Chunk]:
    """chunk -> bytes; ``b""`` ends the stream (and raises where it is cut short)."""
    if comp.name == "none":
        return lambda b: b
    if comp.name == "gzip":
        z = zlib.decompressobj(wbits=31)

        def gz(b: Chunk) -> bytes:
            if b:
                return z.decompress(b)
            if not z.eof:
                raise EOFError("the gzip stream ends early")
            return z.flush()

        return gz
    import zstandard

    obj = zstandard.ZstdDecompressor().decompressobj()

    def zs(b: Chunk) -> bytes:
        if b:
            return bytes(obj.decompress(b))
        if not obj.eof:
            raise EOFError("the zstd stream ends early")
        return b""

    return zs


# --- the registry ---------------------------------------------------------------------------------


class Reader(Protocol):
    """What the cache reads of a registry (``verify_image.RegistryReader``; fakes in unit tests)."""

    def manifest(self, ref: str) -> bytes | None: ...
    def copy_to(self, ref: str, dest: Path, tmpdir: Path) -> bool: ...


class Unavailable(Exception):
    """The cache registry could not be read at all (unreachable, credentials refused)."""


def _chunks(resp: IO[bytes]) -> Iterator[memoryview]:
    """A blob's response read into one buffer, chunk after chunk: each chunk is taken whole (by
    ``check_stream``) before the next read; a broken download is a ``BadEntry``."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while True:
        try:
            n = resp.readinto(buf)  # type: ignore[attr-defined]  # an HTTP response has it
        except OSError as e:
            raise BadEntry(f"its blob's download broke off ({e})") from None
        if not n:
            return
        yield view[:n]


@dataclass
class RegistryCache:
    """The cache repositories of one build: ``cache_from`` is read, ``cache_to`` is written."""

    cache_from: str
    cache_to: str
    reader: Reader
    push: Callable[[Path, str], None]  # the engine's push: credentials and TLS of the image's
    usable: bool = True  # False once ``cache_from`` could not be reached: asked no more
    # the distribution API read directly (manifests, and blobs as streams: ``stream_layers``);
    # None, or a registry whose credentials only a helper has: skopeo (``reader``) reads
    client: RegistryClient | None = None

    _direct: bool | None = (
        None  # whether ``client`` can read ``cache_from`` (asked once: ``_client``)
    )

    def _client(self) -> RegistryClient | None:
        """The direct client where it can read ``cache_from``, else None (skopeo reads)."""
        if self.client is None:
            return None
        if self._direct is None:
            try:
                credentials(
                    self.client.access, split_ref(self.cache_from + ":x")[0], self.client.env
                )
                self._direct = True
            except Unsupported:
                self._direct = False
        return self.client if self._direct else None

    def can_stream(self) -> bool:
        """Whether the blobs of ``cache_from`` can be read as streams (``stream_layers``)."""
        return self.usable and self._client() is not None

    def lookup(self, key: str, comp: Compression) -> RegistryEntry | None:
        """The checked manifest of ``key``'s entry in ``cache_from``; None where there is none.
        ``BadEntry`` where it is not usable, ``Unavailable`` where the registry cannot be read."""
        ref = f"{self.cache_from}:{tag_for(key, comp)}"
        client = self._client()
        try:
            raw = client.manifest(ref) if client is not None else self.reader.manifest(ref)
        except EnvspecError as e:
            raise Unavailable(e.message) from None
        except RegistryHTTPError as e:
            if e.status and e.status not in (401, 403):
                raise BadEntry(f"its manifest could not be read ({e})") from None
            raise Unavailable(str(e)) from None
        return None if raw is None else check_entry(raw, ref=ref, key=key, comp=comp)

    def fetch(self, entry: RegistryEntry, work: Path, tar: Path, comp: Compression) -> Path:
        """The entry's blob, fetched into ``work`` and checked, with its tar at ``tar``; returns
        the blob's path. ``BadEntry`` (nothing left at ``tar``) where a check fails."""
        repo = self.cache_from
        layout = work / "layout"
        try:
            got = self.reader.copy_to(f"{repo}@{entry.manifest_digest}", layout, work / "tmp")
        except EnvspecError as e:  # skopeo checks digests too: a damaged blob fails the copy
            raise BadEntry(f"its blob could not be fetched: {e.message}") from None
        if not got:
            raise BadEntry("its manifest went away while it was fetched")
        blob = layout / "blobs" / "sha256" / entry.digest.split(":", 1)[1]
        if not blob.is_file():
            raise BadEntry(f"the fetched entry lacks its blob {entry.digest}")
        unpack(blob, tar, entry, comp)
        return blob

    def has(self, key: str, comp: Compression) -> bool:
        """Whether ``cache_to`` holds ``key``'s entry already (any answer but "yes" is "no")."""
        try:
            raw = self.reader.manifest(f"{self.cache_to}:{tag_for(key, comp)}")
            if raw is None:
                return False
            check_entry(raw, ref=self.cache_to, key=key, comp=comp)
            return True
        except (EnvspecError, BadEntry):
            return False

    def store(self, work: Path, blob: Path, facts: EntryFacts, comp: Compression) -> str:
        """Push one entry to ``cache_to``; returns its reference. Raises the push's errors."""
        dest = work / f"cache-{facts.key.split(':', 1)[-1][:16]}"
        write_entry(dest, blob, facts)
        ref = f"{self.cache_to}:{tag_for(facts.key, comp)}"
        try:
            self.push(dest, ref)
        finally:
            shutil.rmtree(dest, ignore_errors=True)
        return ref

    # -- a build's layers (``envspec.image.LayerCache``) ------------------------------------------
    def lookup_layers(self, layers: Layers) -> dict[str, RegistryEntry]:
        """The entries ``cache_from`` has of the layers to make, by key, their manifests
        checked (``check_entry``); a few asked at a time. A bad entry is a warning (its
        layer is made); an unreachable cache is one warning and every layer is made."""
        wanted = [lay for lay in layers.todo if lay.cacheable]
        unavailable: list[str] = []

        def one(lay: Layer) -> RegistryEntry | None:
            if unavailable:
                return None
            try:
                return self.lookup(lay.key, layers.cache_comp)
            except Unavailable as e:
                unavailable.append(str(e))
            except BadEntry as e:
                self._bad_entry(layers, lay, e)
            return None

        if not wanted:
            return {}
        with ThreadPoolExecutor(
            max_workers=min(4, len(wanted)), thread_name_prefix="envspec-regcache"
        ) as pool:
            got = list(pool.map(one, wanted))
        if unavailable:
            self.usable = False
            layers.reporter.warning(
                f"the layer cache {self.cache_from} could not be read ({unavailable[0]}); "
                "making the layers here"
            )
            return {}
        return {lay.key: e for lay, e in zip(wanted, got) if e is not None}

    def _bad_entry(self, layers: Layers, lay: Layer, e: Exception) -> None:
        layers.reporter.warning(
            f"layer cache entry {self.cache_from}:{tag_for(lay.key, layers.cache_comp)} not used: "
            f"{e}; making the {lay.group} layer here"
        )

    def fetch_layers(self, layers: Layers, entries: dict[str, RegistryEntry]) -> None:
        """The layers of ``entries`` fetched (a few at a time), checked and put in the cache
        instead of being made (``fetch``); each one is done (and can be imported) as soon as it
        is in. One that fails a check is a warning and is made."""
        wanted = [lay for lay in layers.todo if lay.key in entries]
        comp = layers.cache_comp

        def one(lay: Layer) -> bool:
            start = time.monotonic()
            d = Path(tempfile.mkdtemp(prefix="regcache-", dir=layers.work))
            entry = entries[lay.key]
            record = entry.local_record(lay.group)
            try:
                blob = self.fetch(entry, d, d / "layer.tar", comp)
                kept = (
                    MadeBlob(entry.digest, entry.size, str(blob))
                    if comp.name != "none" and entry.compressor == comp.id
                    else None
                )
                stored = store_fetched(layers.cache, lay, d / "layer.tar", record, comp, kept)
            except BadEntry as e:
                self._bad_entry(layers, lay, e)
                return False
            finally:
                shutil.rmtree(d, ignore_errors=True)
            layers.took(lay, record, stored, start)
            return True

        layers.work.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(
            max_workers=min(4, len(wanted)), thread_name_prefix="envspec-regcache"
        ) as pool:
            got = list(pool.map(one, wanted))
        for lay, ok in zip(wanted, got):
            if ok:
                layers.todo.remove(lay)

    def stream_layers(
        self, layers: Layers, entries: dict[str, RegistryEntry], streams: dict[str, Future[bool]]
    ) -> None:
        """The layers of ``entries`` read from ``cache_from`` as streams, all at once, each
        checked and decompressed as it arrives (``check_stream``) into its FIFO (``Layers.pipe_for``),
        from which the store's stager untars it (``importer.Importer``): no file of the blob or of
        the tar. ``streams[key]`` ends with the stream: True once its every check held (then the
        layer is done, ``Layers.took``), else the exception, and the layer stays to be made here
        (a warning; its stager starts again from the made tar). Nothing goes to the local cache:
        the store has the layer. Returns once every stream has ended."""
        client = self._client()
        assert client is not None
        wanted = [lay for lay in layers.todo if lay.key in entries]
        comp = layers.cache_comp

        def one(lay: Layer) -> bool:
            start = time.monotonic()
            entry, fut = entries[lay.key], streams[lay.key]
            times = StreamTimes()
            tee = None
            try:
                try:
                    resp = client.open_blob(self.cache_from, entry.digest)
                except RegistryHTTPError as e:
                    raise BadEntry(f"its blob could not be read: {e}") from None
                if resp is None:
                    raise BadEntry(f"the registry does not have its blob {entry.digest}")
                with resp:
                    pipe = layers.pipe_for(lay)
                    assert pipe is not None
                    tee = PipeTee(pipe)
                    out = tee
                    check_stream(
                        _chunks(resp), lambda b: out.write(memoryview(b)), entry, comp, times
                    )
                if tee.fd < 0:
                    raise BadEntry("the store's untar went away before the layer's end")
            except BaseException as e:
                if tee is not None:
                    tee.close()
                fut.set_exception(e)
                if isinstance(e, BadEntry):
                    self._bad_entry(layers, lay, e)
                    return False
                raise
            tee.close()
            fut.set_result(True)
            record = entry.local_record(lay.group)
            layers.took(lay, record, None, start, detail=tuple(times.items()), kept=False)
            return True

        layers.work.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(
            max_workers=max(1, min(8, len(wanted))), thread_name_prefix="envspec-stream"
        ) as pool:
            got = list(pool.map(one, wanted))
        for lay, ok in zip(wanted, got):
            if ok:
                layers.todo.remove(lay)

    def push_layers(self, layers: Layers) -> tuple[str, ...]:
        """Push the cacheable layers that ``cache_to`` lacks; a failure is a warning (the
        image is built and good), and the first one ends the pushing."""
        pushed: list[str] = []
        for lay in layers.plan.layers:
            meta = layers.metas.get(lay.key)
            if not lay.cacheable or meta is None:
                continue
            if meta.source == "registry" and self.cache_to == self.cache_from:
                continue
            if self.has(lay.key, layers.comp):
                continue
            blob = meta.blob
            try:
                pushed.append(
                    self.store(
                        layers.work,
                        layers.blob_path(lay),
                        EntryFacts(
                            key=lay.key,
                            group=lay.group,
                            comp_id=layers.comp.id,
                            media_type=layers.comp.media_type
                            if layers.comp.name != "none"
                            else MT_LAYER,
                            digest=blob.digest if blob else meta.diff_id,
                            size=blob.size if blob else meta.size,
                            diff_id=meta.diff_id,
                            diff_size=meta.size,
                            record=meta.record,
                        ),
                        layers.comp,
                    )
                )
            except EnvspecError as e:
                layers.reporter.warning(
                    f"pushing the {lay.group} layer to the layer cache {self.cache_to} failed: "
                    f"{e.message}; the image is built, the cache lacks its layers"
                )
                break
        return tuple(pushed)

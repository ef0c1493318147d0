"""The layers of one build, made here or taken from a cache (``Layers``): each layer's maker run
in a pool, its tar and record stored in the cache by content key, compressed where something
carries it (``compress_layers``), fetched from a registry layer cache or streamed into the store
on a node's pull. The build's options (``BuildOptions``) and the registry stage's side of a build
(``RegistrySide``, ``LayerCache``) are here, because the layers are made by them."""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ValidationError

from envspec import debian, settings
from envspec.cache.store import Cache, Identity, _pid_alive, admit
from envspec.debian.models import DebPin
from envspec.errors import BuildError, DamagedEntry, UsageError
from envspec.image import layers as layer_makers
from envspec.image.bytecode import find_compiler
from envspec.image.compress import (
    DEFAULT as DEFAULT_COMPRESSION,
)
from envspec.image.compress import (
    MT_LAYER,
    Compression,
    compress_file,
    compression,
)
from envspec.image.engine import (
    Engine,
    chain_id,
    die_with_parent,
)
from envspec.image.importer import LayerFile
from envspec.image.records import (
    BlobRecord,
    LayerMeta,
    LayerRecord,
    MadeBlob,
    MadeLayer,
    RegistryEntry,
)
from envspec.image.report import Clock, LayerInfo, Reporter
from envspec.image.sbom import make_sbom
from envspec.lock import Wheel
from envspec.plan import MAKER_VERSIONS, BuildPlan, Layer, keyed_top, make_plan
from envspec.services import render_service_files
from envspec.sources import Mirror
from envspec.wheels import sdist
from envspec.wheels.fetch import WheelFetcher

# Wheel layers whose maker writes the tar only and lets the store's stager untar it (the others'
# makers also make the files, for the stager to take as they are: docs/build.md, "Into
# containers-storage"). The torch layer's maker is the cold build's critical path (torch's 2 GB, its
# 22,000 files, and most of the image's .pyc fed through it); its stager untars beside it. Made as
# files by its maker instead (its big libraries past the page cache too), the cold build took 60-62 s
# against 54-55 s (measured 2026-12-03, recorded in 84c94ad). ENVSPEC_LAYER_TREES=all: every wheel layer made
# as files; =off: none.
UNTARRED_GROUPS = frozenset({"torch"})


class LayerCache(Protocol):
    """A registry layer cache as a build uses it (``envspec.registry.regcache.RegistryCache``): the
    layers to make looked up and fetched from ``cache_from`` (``Layers.took``), or streamed into
    the store on a node's pull (``Layers.stream``), the layers made pushed to ``cache_to``."""

    cache_from: str
    cache_to: str

    def lookup_layers(self, layers: Layers) -> dict[str, RegistryEntry]: ...
    def fetch_layers(self, layers: Layers, entries: dict[str, RegistryEntry]) -> None: ...
    def can_stream(self) -> bool: ...
    def stream_layers(
        self, layers: Layers, entries: dict[str, RegistryEntry], streams: dict[str, Future[bool]]
    ) -> None: ...
    def push_layers(self, layers: Layers) -> tuple[str, ...]: ...


class RegistrySide(Protocol):
    """The registry stage as a build calls it (``envspec.registry.stage.Registry``): what a push carries
    beside its image (provenance and SBOM attestations and, with a key, the signature), an image
    index's signature, the names of both for a dry run, and the layer cache of a build."""

    @property
    def signs(self) -> bool: ...
    def attach(
        self, push: Callable[[Path, str], None], work: Path, plan: BuildPlan, digest: str, dest: str
    ) -> tuple[tuple[str, str], ...]: ...
    def sign(
        self, push: Callable[[Path, str], None], work: Path, digest: str, dest: str
    ) -> tuple[str, str]: ...
    def refs(self, dest: str, digest: str) -> list[tuple[str, str]]: ...
    def layer_cache(self, engine: Engine, cache_from: str, cache_to: str) -> LayerCache: ...


@dataclass(frozen=True)
class BuildOptions:
    tag: str | None = None  # None: the lock's tag (``BuildPlan.tag``); "": build without tagging
    outputs: tuple[str, ...] = ()  # oci:DIR, oci-archive:FILE, docker-archive:FILE
    push: str | None = None
    no_cache: bool = False
    compression: str = (
        DEFAULT_COMPRESSION  # of the layers that outputs and pushes carry: zstd, gzip, none
    )
    # compress the layers in this build: None = only where something carries them (a push, an
    # oci:/oci-archive: output, --cache-to); a local build keeps them as the store does, uncompressed
    compress: bool | None = None
    workers: int = min(2, os.cpu_count() or 1)  # layer maker processes
    verify_dir: Path | None = (
        None  # the verifier sources the image carries (default: envspec's own)
    )
    # what a push carries beside the image, and the registry layer cache: the registry stage's
    # (``envspec.registry.stage.Registry``); needed for a push and for cache_from/cache_to
    registry: RegistrySide | None = None
    cache_from: str = ""  # a registry repository to take layers from (registry/regcache.py)
    cache_to: str = ""  # a registry repository to put the layers in
    # wheels built from sdists (the spec's [build]): builds at once, compile jobs each (0: the cores
    # divided among them)
    source_parallel: int = 1
    source_jobs: int = 0
    # the folder of the spec the lock was made from (``lock.lock_base`` joined with [meta].spec's
    # folder): files the spec names, such as [services.ssh].authorized_keys, are read from it
    spec_dir: Path | None = None


def compress_now(options: BuildOptions) -> bool:
    """Whether this build compresses its layers: where asked (``options.compress``), else where a
    push, an ``oci:``/``oci-archive:`` output or a registry layer cache (``cache_to``) carries
    them. containers-storage keeps layers uncompressed, so a build that only tags an image there
    (or writes a docker archive, which carries tars) skips the compression, a third of a cold
    build's time on two cores (docs/benchmarks.md); its digest is then the manifest digest of the
    uncompressed image, the one the store holds, and a push of the same lock reports another
    (docs/build.md, "Which digest")."""
    if options.compress is not None:
        return options.compress
    return bool(
        options.push
        or options.cache_to
        or any(dest.startswith(("oci:", "oci-archive:")) for dest in options.outputs)
    )


def _compressions(options: BuildOptions) -> tuple[Compression, Compression]:
    """(what pushes and outputs of this lock carry, what this build makes: the same or ``none``)."""
    wanted = compression(options.compression)
    return wanted, wanted if compress_now(options) else compression("none")


def compress_layers(
    plan: BuildPlan, cache: Cache, comp: Compression, reporter: Reporter | None = None
) -> list[LayerInfo]:
    """The compressed blobs of the plan's cached layers that have none of ``comp`` yet, made and
    kept in the cache (``envspec cache compress``; after a local build, in the background), so that
    a later push or OCI output of the lock does not compress them. Layers not in the cache are
    left alone (a build makes them). Each layer is compressed under its cache lock and looked
    for again there, so two of these, or one beside a build's ``compress_cached``, compress a
    layer once. Returns the layers whose blobs this call made."""
    if comp.name == "none":
        return []
    reporter = reporter or Reporter()
    plan, _ = _bytecode_compiler(plan, reporter)
    in_use = cache.in_use()  # `envspec cache gc` waits for it
    work = cache.workdir()
    made: list[LayerInfo] = []
    try:
        for lay in plan.layers:
            record = _cached_record(cache, lay) if lay.cacheable else None
            if record is None or _cached_blob(cache, lay, comp) is not None:
                continue
            try:
                blob, new = _compress_layer(cache, lay, comp, work, record.diff_id)
            except DamagedEntry as e:  # dropped: the next build of the lock makes it again
                cache.evict_layer(cache.layer_tar(lay.key))
                reporter.warning(f"{e.message.splitlines()[0]}: removed from the cache")
                continue
            if new:
                info = _info(lay, LayerMeta(record.diff_id, record.size, "local", blob, record))
                made.append(info)
                reporter.layer_built(info)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        in_use.release()
    return made


def _compress_layer(
    cache: Cache, lay: Layer, comp: Compression, work: Path, diff_id: str
) -> tuple[BlobRecord, bool]:
    """The cached layer's blob of ``comp``: found (made meanwhile by another process) or made
    now from its tar, checked against its ``diff_id`` as it is read, under the layer's lock; and
    whether it was made here."""
    with cache.locked("layer-" + lay.key.split(":", 1)[-1]):
        found = _cached_blob(cache, lay, comp)
        if found is not None:
            return found, False
        work.mkdir(parents=True, exist_ok=True)
        tmp = work / f"{lay.group}.tar{comp.suffix}"
        digest, size = compress_file(cache.layer_tar(lay.key), tmp, comp, want=diff_id)
        return _store_blob(cache, lay, comp, MadeBlob(digest, size, str(tmp))), True


# --- the steps ------------------------------------------------------------------------------------


class Layers:
    """The plan's layers on their way to tar files: found in the cache or made here, each with a
    future that the importer waits on."""

    def __init__(
        self,
        plan: BuildPlan,
        cache: Cache,
        work: Path,
        reporter: Reporter,
        *,
        options: BuildOptions,
        clock: Clock | None = None,
    ) -> None:
        self.plan, self.cache, self.work, self.reporter = plan, cache, work, reporter
        # the compression of the registry cache's entries (``--cache-from``): the one asked for,
        # also where this build keeps its layers uncompressed (``compress_now``); the one this
        # build writes
        self.cache_comp, self.comp = _compressions(options)
        self.spec_dir = options.spec_dir  # where the files the spec names are
        self.clock = clock or Clock(reporter)
        self.metas: dict[str, LayerMeta] = {}
        self.futures: dict[str, Future[LayerMeta]] = {}
        self.todo: list[Layer] = []  # cacheable layers not in the cache
        self.to_compress: set[str] = set()  # keys of cached layers without this compressor's blob
        self.checked: set[str] = set()  # keys of cached layers whose files this build has hashed
        for lay in plan.layers:
            self.futures[lay.key] = Future()
            record = None if (options.no_cache or not lay.cacheable) else _cached_record(cache, lay)
            if record is not None:
                blob = _cached_blob(cache, lay, self.comp)
                if blob is None and self.comp.name != "none":
                    self.to_compress.add(lay.key)
                self._done(lay, LayerMeta(record.diff_id, record.size, "local", blob, record))
            elif lay.group != "envspec" or lay.cacheable:
                # the envspec layer is made last (``make_top``); keyed by its inputs
                # (``plan.keyed_top``), it is looked for in a registry cache like the others
                self.todo.append(lay)
        self.paths: dict[
            str, Path
        ] = {}  # wheel sha256 -> file in the cache (or a local mirror's: ``in_place``)
        self.in_place: dict[
            str, Identity
        ] = {}  # sha256 -> identity of a local mirror's file read where it is
        self._guard = threading.Lock()  # registry fetches finish on threads
        self.compiler: tuple[str, str] | None = None  # (python, cache tag) that compiles the .pyc
        self.tree_root: Path | None = (
            None  # where wheel layers are also made as files (``tree_for``)
        )
        self.trees: dict[str, Path] = {}
        self.pipes = (
            False  # the layers made here go to the store's stagers through FIFOs (``pipe_for``)
        )
        # the layers streamed from the registry cache into the store's stagers (``regcache.stream_layers``),
        # by key: each future ends with its stream (an exception: the layer is made here after all)
        self.streams: dict[str, Future[bool]] = {}

    def path(self, lay: Layer) -> Path:
        return (
            self.work / "envspec-layer.tar"
            if lay.group == "envspec" and not lay.cacheable
            else self.cache.layer_tar(lay.key)
        )

    @property
    def to_make(self) -> list[Layer]:
        """The layers to make but the envspec layer (made from the lock alone, last, by
        ``make_top``: no wheel, no Debian package, no worker)."""
        return [lay for lay in self.todo if lay.group != "envspec"]

    def layout_path(self, lay: Layer) -> Path | None:
        """The layer's tar for the image's OCI layout; None for one streamed into the store alone
        (the layout then lacks its blob: it is for the store only, ``_streams``)."""
        meta = self.metas.get(lay.key)
        if lay.key in self.streams and meta is not None and meta.source in ("registry", "store"):
            return None
        return self.path(lay)

    def stream(self, entries: Mapping[str, RegistryEntry], present: dict[str, str]) -> None:
        """Stream the layers of ``entries`` from the registry cache into the store (``streams``;
        ``regcache.RegistryCache.stream_layers``), but those the store has already (``present``:
        layer ID -> diff_id, containers/image's chain of diff_ids): done with no read at all."""
        parent: str | None = ""
        now = time.monotonic()
        for lay in self.plan.layers:
            entry = entries.get(lay.key)
            meta = self.metas.get(lay.key)
            diff_id = entry.diff_id if entry is not None else meta.diff_id if meta else None
            if not diff_id or parent is None:
                parent = None  # an ID above an unknown layer is not known before it is made
                continue
            parent = chain_id(parent, diff_id)
            if entry is None or lay not in self.todo:
                continue
            self.streams[lay.key] = Future()
            if present.get(parent) == diff_id:
                self.streams[lay.key].set_result(True)
                self.todo.remove(lay)
                self.clock.add(f"cache fetch {lay.group}", now, now)
                record = entry.local_record(lay.group)
                self._done(lay, LayerMeta(record.diff_id, record.size, "store", record=record))

    def blob_path(self, lay: Layer) -> Path:
        """The layer's blob as pushed: its compressed file, or its tar."""
        if self.comp.name == "none":
            return self.path(lay)
        if lay.group == "envspec" and not lay.cacheable:
            return self.work / ("envspec-layer.tar" + self.comp.suffix)
        return self.cache.layer_blob(lay.key, self.comp.id, self.comp.suffix)

    def compress_cached(self) -> None:
        """Compress the cached layers that have no blob of this compressor yet (made before, or
        with another compression, or by a local build that kept them uncompressed); a rebuild
        with the same compression finds them. One that ``compress_layers`` (another process) is
        compressing now is waited for, not compressed twice."""
        for lay in self.plan.layers:
            if lay.key in self.to_compress:
                meta = self.metas[lay.key]
                blob, _ = _compress_layer(self.cache, lay, self.comp, self.work, meta.diff_id)
                self.metas[lay.key] = replace(meta, blob=blob)
                self.checked.add(lay.key)  # its tar was checked as it was compressed
        self.to_compress.clear()

    def check_cached(self) -> None:
        """Hash the files of the layers taken from the local cache that this build neither made nor
        read (an import into the store reads and checks what it takes; ``compress_cached`` checks
        the tars it compresses), before outputs and pushes carry them: ``DamagedEntry`` where one
        is not what its record says, so that the build drops it and makes it again."""
        todo = []
        for lay in self.plan.layers:
            meta = self.metas.get(lay.key)
            if meta is None or meta.source != "local":
                continue
            if lay.group == "envspec" or lay.key in self.checked:
                continue
            path = self.blob_path(lay)
            todo.append(
                (
                    lay,
                    path,
                    meta.blob.digest if meta.blob and path != self.path(lay) else meta.diff_id,
                )
            )

        def one(item: tuple[Layer, Path, str]) -> None:
            lay, path, want = item
            with open(path, "rb") as f:
                have = "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()
            if have != want:
                raise DamagedEntry(
                    f"the cached layer file {path} is not {want} ({have})",
                    step="check cached layers",
                    paths=(self.cache.layer_tar(lay.key),),
                    hint="it changed on disk; build again",
                )

        with ThreadPoolExecutor(max_workers=2) as ex:  # hashlib frees the GIL
            list(ex.map(one, todo))

    def took(
        self,
        lay: Layer,
        record: LayerRecord,
        blob: BlobRecord | None,
        start: float,
        *,
        detail: tuple[tuple[str, float], ...] = (),
        kept: bool = True,
    ) -> None:
        """The layer ``lay`` taken from a registry layer cache instead of being made, since
        ``start``: done. ``kept``: put into the local cache (``store_fetched``), and compressed
        later where it lacks this build's blob; else streamed into the store alone (``streams``)."""
        if self.comp.name == "none":
            blob = None  # the blob is kept in the cache for a later push; this image has the tar
        self.clock.add(f"cache fetch {lay.group}", start, time.monotonic(), detail)
        if kept and blob is None and self.comp.name != "none":
            with self._guard:
                self.to_compress.add(lay.key)
        self._done(lay, LayerMeta(record.diff_id, record.size, "registry", blob, record))

    def writing_path(self, lay: Layer) -> Path:
        """Where the layer's maker writes its tar (moved into the cache once made)."""
        return self.work / f"{lay.group}.tar"

    def tree_for(self, lay: Layer) -> Path | None:
        """Where a wheel layer's maker also makes its files, for a staged import into the store
        (``tree_root``: the store's staging area; importer.py); None where there is none."""
        if (
            self.tree_root is None
            or not lay.wheels
            or lay not in self.todo
            or lay.key in self.streams
        ):
            return None
        if lay.group in UNTARRED_GROUPS and settings.read().layer_trees != "all":
            return None
        if lay.key not in self.trees:
            self.tree_root.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.trees[lay.key] = Path(
                tempfile.mkdtemp(prefix=f"{os.getpid()}-{lay.group}-", dir=self.tree_root)
            )
        return self.trees[lay.key]

    def pipe_for(self, lay: Layer) -> Path | None:
        """The FIFO through which the layer's maker hands its tar to the store's stager as it
        writes it (made here, before the maker starts; ``tarball.PipeTee``), so the stager does not
        read the file back: the tar goes to the cache past the page cache (``tarball.DirectFile``).
        None where the import does not stage (``pipes``), or the layer is not made here, or made
        with no tee (the envspec layer: ``make_top``)."""
        made_with_tee = self.pipes and lay.group != "envspec"
        if not (made_with_tee or lay.key in self.streams) or lay not in self.todo:
            return None
        if (
            lay.key in self.streams and self.streams[lay.key].done()
        ):  # a stream that failed: made, and untarred from its file
            return None
        fifo = self.work / f"{lay.group}.tar.fifo"
        if not fifo.exists():
            self.work.mkdir(parents=True, exist_ok=True)
            os.mkfifo(fifo, 0o600)
        return fifo

    def files(self) -> list[LayerFile]:
        todo = {lay.key for lay in self.todo}
        return [
            LayerFile(
                lay.group,
                self.path(lay),
                self.futures[lay.key],
                writing=self.writing_path(lay)
                if lay.key in todo and lay.group != "envspec"
                else None,
                tree=self.tree_for(lay),
                pipe=self.pipe_for(lay),
                streamed=self.streams.get(lay.key),
            )
            for lay in self.plan.layers
        ]

    def made(self) -> tuple[LayerInfo, ...]:
        return tuple(_info(lay, self.metas[lay.key]) for lay in self.plan.layers)

    def _done(self, lay: Layer, meta: LayerMeta) -> None:
        self.metas[lay.key] = meta
        self.futures[lay.key].set_result(meta)
        self.reporter.layer_built(_info(lay, meta))

    def fail(self, e: BaseException) -> None:
        for fut in self.futures.values():
            if not fut.done():
                fut.set_exception(e)

    def _make(self, lay: Layer, fn: Callable[[], LayerMeta]) -> None:
        try:
            meta = fn()
        except BaseException as e:
            self.futures[lay.key].set_exception(e)
            raise
        self._done(lay, meta)

    def _comp(self) -> Compression | None:
        return None if self.comp.name == "none" else self.comp

    def fetch_wheels(self, mirrors: Sequence[Mirror]) -> None:
        """Every wheel the layers to make need, into the cache (checked), one event per wheel."""
        need = [w for lay in self.todo for w in lay.wheels]
        r = self.reporter
        fetcher = WheelFetcher(self.cache, mirrors, on_damaged=r.warning)
        self.paths = fetcher.fetch_all(
            need,
            on_start=lambda p: r.fetching(p.name, p.filename, p.size),
            on_done=lambda p, path: r.fetched(p.name, p.filename, path),
        )
        self.in_place = fetcher.in_place  # the local mirrors' files read where they are, by sha256

    def build_sources(self, mirrors: Sequence[Mirror], *, parallel: int = 1, jobs: int = 0) -> None:
        """The wheels of the source layer, if it is to be made: each from the cache (by its
        derivation's key) or built from its sdist in a sandbox of the lock's Debian base (its Python
        and compiler, no network: ``wheels.sdist``), with its build requirements fetched by hash;
        ``paths`` then maps each sdist's sha256 to its wheel."""
        lay = next((lay for lay in self.todo if lay.group == "source"), None)
        if lay is None:
            return
        files = {**self.paths, **self._source_inputs(lay, mirrors)}
        scratch: list[Path] = []
        try:
            built = sdist.build_all(
                self.plan.lock,
                lay.wheels,
                files,
                self.cache.root,
                sandbox=lambda: self._sandbox(scratch),
                parallel=parallel,
                jobs=jobs,
                events=_SourceEvents(self.reporter),
            )
        finally:
            for d in scratch:
                shutil.rmtree(d if d.parent == self.work else d.parent, ignore_errors=True)
        self.paths.update(built)

    def _source_inputs(self, lay: Layer, mirrors: Sequence[Mirror]) -> dict[str, Path]:
        """The build inputs of the wheels to build, fetched (not those of the wheels in the cache:
        a CUDA extension's are torch and its NVIDIA wheels, gigabytes to fetch and hash)."""
        r = self.reporter
        inputs = [
            b
            for w in lay.wheels
            if w.source is not None
            and sdist.cached_wheel(sdist.derivation_of(w, self.plan.platform), self.cache.root)
            is None
            for b in (*w.source.build, *w.source.toolkit)
        ]
        return WheelFetcher(self.cache, mirrors, on_damaged=r.warning).fetch_all(
            inputs,
            on_start=lambda p: r.fetching(p.name, p.filename, p.size),
            on_done=lambda p, path: r.fetched(p.name, p.filename, path),
        )

    def _sandbox(self, scratch: list[Path]) -> sdist.Sandbox:
        """A root file system of the lock's Debian base to build sdists in (its folder added to
        ``scratch``, removed by the caller)."""
        base = self.plan.layer("base")
        where = _scratch_dir(self.work, need=8 * sum(d.size for d in base.debs))
        scratch.append(where / "sandbox-rootfs")
        with self.clock.span("source sandbox"):
            rootfs = self._rootfs(base.debs, where / "sandbox-rootfs")
        if rootfs is None:
            raise BuildError(
                "a wheel built from its sdist needs the lock's Debian base, and it has none",
                step="build from source",
                hint="lock with a Debian base ([system].base)",
            )
        return sdist.Sandbox(rootfs, f"/usr/bin/python{self.plan.platform.python}")

    def wheel_makers(self, workers: int, *, fork: bool = True) -> WheelMakers:
        """Worker processes that make the wheel layers, the costliest first (``estimated_cost``:
        its maker also runs ahead of the others, ``WheelMakers``); ``fork=False``: started by a
        fork server (not forked from this process, whose other threads are running)."""
        todo = [lay for lay in self.todo if lay.wheels]
        if len(todo) > 1:  # one layer to make (a team change) reads no central directory
            cost = {
                lay.key: layer_makers.estimated_cost(
                    [self.paths[w.sha256] for w in lay.wheels], bytecode=self.compiler is not None
                )
                for lay in todo
            }
            todo.sort(key=lambda lay: -cost[lay.key])
        return WheelMakers(self, todo, workers, fork=fork)

    def make_base(self) -> None:
        """The Debian root file system and the venv skeleton, here, while the wheel layers are made."""
        base = self.plan.layer("base")
        if base not in self.todo:
            return
        self.reporter.layer_started("base", len(base.debs), False)

        def make() -> LayerMeta:
            scratch = _scratch_dir(self.work, need=8 * sum(d.size for d in base.debs))
            try:
                rootfs = self._rootfs(base.debs, scratch / "rootfs")
                out = self.writing_path(base)
                with self.clock.span("layer base"):
                    made = layer_makers.make_base_layer(
                        self.plan,
                        rootfs,
                        out,
                        self._comp(),
                        self.compiler,
                        pipe=self.pipe_for(base),
                    )
                return _store_layer(self.cache, base, out, made, self.comp)
            finally:
                shutil.rmtree(
                    scratch if scratch != self.work else scratch / "rootfs", ignore_errors=True
                )

        self._make(base, make)

    def _rootfs(self, debs: tuple[DebPin, ...], dest: Path) -> Path | None:
        if not debs:
            return None
        lock = self.plan.lock
        # configured mirrors first (snapshot from the environment, then ENVSPEC_DEBIAN_MIRROR), then
        # the lock's canonical archive
        extra = settings.read().debian_mirror
        mirrors = debian.mirror_list(
            (lock.debian.mirror if lock.debian else "") or debian.CANONICAL_MIRROR,
            mirrors=[extra] if extra else [],
        )
        with self.clock.span("debs"):
            paths = debian.fetch_debs(
                list(debs),
                mirrors=mirrors,
                cache_dir=self.cache.root / "debs",
                reporter=_DebEvents(self.reporter),
            )
        with self.clock.span("rootfs"):
            debian.make_rootfs(
                list(debs), paths, dest, user=lock.runtime.user, uid=lock.runtime.uid
            )
        return dest

    def finish(self, pending: WheelMakers) -> None:
        for lay, out, fut in pending.jobs:

            def done(lay: Layer = lay, out: Path = out, fut: Future[TimedLayer] = fut) -> LayerMeta:
                try:
                    res = fut.result()
                except Exception as e:  # noqa: BLE001 (a wheel that installer rejects)
                    raise BuildError(
                        f"installing the {lay.group} layer's wheels failed: {e}",
                        step=f"layer {lay.group}",
                        hint="the wheel may be broken or not for this platform; re-lock",
                    ) from e
                self.clock.add(f"layer {lay.group}", *res.ran)
                return _store_layer(self.cache, lay, out, res.made, self.comp)

            self._make(lay, done)

    def top_made(self) -> bool:
        return self.futures[self.plan.layer("envspec").key].done()

    def make_top(self, verify_dir: Path | None) -> None:
        """The envspec layer: lock, SBOM, verifier, entrypoint and services; into the cache where
        it is keyed by its inputs (``plan.keyed_top``), unless it was found there or taken from a
        registry cache (then nothing is made)."""
        top = self.plan.layer("envspec")
        streamed = self.streams.get(top.key)
        if self.futures[top.key].done() or (streamed is not None and not streamed.done()):
            return  # found, taken, or still on its way from the registry cache
        self.reporter.layer_started("envspec", 0, False)

        def make() -> LayerMeta:
            out = self.work / "envspec.tar"
            with self.clock.span("layer envspec"):
                res = layer_makers.make_envspec_layer(
                    self.plan,
                    make_sbom(self.plan),
                    out,
                    verify_dir=verify_dir,
                    service_files=render_service_files(self.plan.lock, spec_dir=self.spec_dir),
                    compression=self._comp(),
                    compiler=self.compiler,
                )
            if top.cacheable:
                return _store_layer(self.cache, top, out, res, self.comp)
            os.replace(out, self.path(top))
            blob = None
            if res.blob is not None:
                os.replace(res.blob.path, self.blob_path(top))
                blob = BlobRecord(
                    compressor=self.comp.id,
                    media_type=self.comp.media_type,
                    digest=res.blob.digest,
                    size=res.blob.size,
                )
            return LayerMeta(res.diff_id, res.size, "made", blob)

        self._make(top, make)
        if top in self.todo:
            self.todo.remove(top)


class WheelMakers:
    """The wheel layers' worker processes (a context: shut down on the way out). ``todo`` comes
    costliest first: that layer's maker runs at the makers' niceness (this process's, plus
    ``ENVSPEC_MAKER_NICE``), the others' ``ENVSPEC_MAKER_NICE_OTHERS`` (default 10) above it, so
    that on a machine with fewer cores than work the layer that ends the build gets the CPU first
    and the others fill what it leaves (docs/build.md, "Which maker goes first")."""

    def __init__(
        self, layers: Layers, todo: list[Layer], workers: int, *, fork: bool = True
    ) -> None:
        self.layers, self.todo, self.workers, self.fork = layers, todo, workers, fork
        self.pool: ProcessPoolExecutor | None = None
        self.jobs: list[tuple[Layer, Path, Future[TimedLayer]]] = []
        conf = settings.read()
        first = os.getpriority(os.PRIO_PROCESS, 0) + conf.maker_nice
        others = conf.maker_nice_others
        self.niceness = {
            lay.key: min(19, first + (others if i else 0)) for i, lay in enumerate(todo)
        }

    def __enter__(self) -> WheelMakers:
        if not self.todo:
            return self
        self.pool = ProcessPoolExecutor(
            max_workers=max(1, min(self.workers, len(self.todo))),
            mp_context=None if self.fork else multiprocessing.get_context("forkserver"),
            initializer=die_with_parent,
        )
        platform_json = self.layers.plan.platform.model_dump_json()
        for lay in self.todo:
            self.layers.reporter.layer_started(lay.group, len(lay.wheels), False)
            out = self.layers.writing_path(lay)
            # a wheel built from its sdist goes in under its own file name (``build_sources``)
            # one read where it is (a local mirror's) goes with its identity: its maker checks it is unchanged
            files = [
                (
                    self.layers.paths[w.sha256].name if w.built else w.filename,
                    str(self.layers.paths[w.sha256]),
                    self.layers.in_place.get(w.sha256),
                )
                for w in lay.wheels
            ]
            tree = self.layers.tree_for(lay)
            pipe = self.layers.pipe_for(lay)
            job = (
                files,
                platform_json,
                str(out),
                self.layers.comp.name,
                self.layers.compiler,
                str(tree) if tree is not None else None,
                str(pipe) if pipe is not None else None,
            )
            self.jobs.append(
                (lay, out, self.pool.submit(_timed_wheel_job, job, self.niceness[lay.key]))
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


# --- helpers --------------------------------------------------------------------------------------


def image_plan(
    plan: BuildPlan, reporter: Reporter, options: BuildOptions
) -> tuple[BuildPlan, tuple[str, str] | None]:
    """The plan as this host builds it, and its .pyc compiler (``_bytecode_compiler``), with its
    envspec layer keyed by what it is made of (``plan.keyed_top``): what a build and its dry run
    both make their ``Layers`` of."""
    plan, compiler = _bytecode_compiler(plan, reporter)
    inputs = layer_makers.envspec_layer_inputs(plan, options.spec_dir, options.verify_dir)
    return keyed_top(plan, inputs), compiler


def _bytecode_compiler(
    plan: BuildPlan, reporter: Reporter
) -> tuple[BuildPlan, tuple[str, str] | None]:
    """The interpreter that compiles the layers' .pyc (``bytecode.find_compiler``): the wheels',
    the Debian standard library's and the verifier's; or the plan re-keyed without .pyc (and a
    warning) where this host has none of the image's version."""
    if not plan.bytecode:
        return plan, None
    choice = find_compiler(plan.platform)
    if choice.python:
        return plan, (choice.python, choice.cache_tag)
    reporter.warning(
        f"no .pyc in the image: {choice.reason}; Python will compile each module in memory at "
        f"every start (install python{plan.platform.python} {plan.platform.python_full} to get them)"
    )
    return make_plan(plan.lock, bytecode=False), None


def _info(lay: Layer, meta: LayerMeta) -> LayerInfo:
    blob = meta.blob
    return LayerInfo(
        digest=blob.digest if blob else meta.diff_id,
        diff_id=meta.diff_id,
        size=blob.size if blob else meta.size,
        group=lay.group,
        cached=meta.cached,
        key=lay.key,
        diff_size=meta.size,
        media_type=blob.media_type if blob else MT_LAYER,
        source=meta.source,
    )


class _SourceEvents(sdist.SourceEvents):
    """The builds from sdists as the build's events."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter

    def start(self, w: Wheel) -> None:
        self.reporter.source_building(w.name, w.version)

    def progress(self, w: Wheel, step: str) -> None:
        self.reporter.source_progress(w.name, w.version, step)

    def done(self, w: Wheel, wheel: Path, seconds: float, cached: bool) -> None:
        self.reporter.source_built(w.name, w.version, wheel.name, seconds, cached)


class _DebEvents(debian.DebianReporter):
    """The Debian fetcher's events as the build's, one .deb at a time (a download retried or
    tried on another mirror is still one ``fetching``)."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter
        self.started: set[str] = set()
        self.guard = threading.Lock()  # fetch_debs downloads on a thread pool

    def fetching(self, pin: DebPin, url: str) -> None:
        with self.guard:
            first = pin.sha256 not in self.started
            self.started.add(pin.sha256)
        if first:
            self.reporter.fetching(pin.name, pin.filename, pin.size)

    def fetched(self, pin: DebPin, path: Path, cached: bool) -> None:
        if not cached:
            self.reporter.fetched(pin.name, pin.filename, path)

    def warning(self, message: str) -> None:
        self.reporter.warning(message)


@dataclass(frozen=True)
class TimedLayer:
    """A wheel layer made in a worker: when it ran (``time.monotonic``) and at which niceness."""

    made: MadeLayer
    ran: tuple[float, float]
    nice: int


def _timed_wheel_job(args: layer_makers.WheelJob, niceness: int) -> TimedLayer:
    """``layers.wheel_layer_job`` in a worker at ``niceness``, with when it ran (``time.monotonic``
    is one clock for every process of the machine) and the niceness it ran at."""
    with contextlib.suppress(OSError):  # lowering it back needs CAP_SYS_NICE: then it runs as set
        os.setpriority(
            os.PRIO_PROCESS, 0, niceness
        )  # this thread; the threads and processes it starts inherit it
    start = time.monotonic()
    res = layer_makers.wheel_layer_job(args)
    return TimedLayer(res, (start, time.monotonic()), os.getpriority(os.PRIO_PROCESS, 0))


def _cached_record(cache: Cache, lay: Layer) -> LayerRecord | None:
    """The cache's record of the layer, where its tar is there and whole."""
    meta_path, tar = cache.layer_meta(lay.key), cache.layer_tar(lay.key)
    try:
        record = LayerRecord.model_validate_json(meta_path.read_bytes())
        if tar.stat().st_size == record.size:
            return record
    except (OSError, ValidationError):
        pass
    return None


def _cached_blob(cache: Cache, lay: Layer, comp: Compression) -> BlobRecord | None:
    """The cached layer's blob of this compressor (its version in the name), or None."""
    if comp.name == "none":
        return None
    try:
        rec = BlobRecord.model_validate_json(cache.layer_blob_meta(lay.key, comp.id).read_bytes())
        if (
            rec.compressor == comp.id
            and cache.layer_blob(lay.key, comp.id, comp.suffix).stat().st_size == rec.size
        ):
            return rec
    except (OSError, ValidationError):
        pass
    return None


def _write_record(record: BaseModel, tmp: Path, dest: Path) -> None:
    """A cache record's JSON, written beside its file and moved into place (last)."""
    tmp.write_text(json.dumps(record.model_dump(mode="json"), sort_keys=True, indent=1))
    admit(tmp, dest)


def _store_blob(cache: Cache, lay: Layer, comp: Compression, blob: MadeBlob) -> BlobRecord:
    """Move a layer's compressed blob into the cache beside its tar; its record last."""
    rec = BlobRecord(
        key=lay.key,
        compressor=comp.id,
        media_type=comp.media_type,
        digest=blob.digest,
        size=blob.size,
    )
    tmp = Path(blob.path)
    admit(tmp, cache.layer_blob(lay.key, comp.id, comp.suffix))
    _write_record(rec, tmp.with_name(tmp.name + ".json"), cache.layer_blob_meta(lay.key, comp.id))
    return rec


def registry_stage(options: BuildOptions) -> RegistrySide:
    """The registry stage of a build that pushes or uses a registry layer cache."""
    if options.registry is None:
        raise UsageError(
            "a push or a registry layer cache without the registry stage",
            hint="pass BuildOptions(registry=envspec.registry.Registry(...))",
            reference="registry-stage-missing",
        )
    return options.registry


def store_fetched(
    cache: Cache,
    lay: Layer,
    tar: Path,
    record: LayerRecord,
    comp: Compression,
    blob: MadeBlob | None,
) -> BlobRecord | None:
    """A layer fetched from the registry cache and checked (``registry.regcache.unpack``) into the
    local cache as a made one goes there: the tar, its ``record`` last; ``blob`` too where it is
    this build's compressor's (else ``compress_cached`` makes this machine's): its record."""
    with cache.locked("layer-" + lay.key.split(":", 1)[-1]):
        admit(tar, cache.layer_tar(lay.key))
        _write_record(record, tar.with_suffix(".json"), cache.layer_meta(lay.key))
        return _store_blob(cache, lay, comp, blob) if blob is not None else None


def _store_layer(
    cache: Cache,
    lay: Layer,
    tmp_tar: Path,
    made: MadeLayer,
    comp: Compression = Compression("none"),
) -> LayerMeta:
    """A layer made here into the cache: its tar, its record last, its blob where it has one."""
    pins: Sequence[Wheel | DebPin] = lay.pins
    record = LayerRecord(
        key=lay.key,
        group=lay.group,
        maker=MAKER_VERSIONS[lay.group],
        diff_id=made.diff_id,
        size=made.size,
        entries=made.entries,
        pins=[f"{p.name}=={p.version}" for p in pins],
        duplicates=list(made.duplicates),
        pyc=made.pyc,
    )
    with cache.locked("layer-" + lay.key.split(":", 1)[-1]):
        admit(tmp_tar, cache.layer_tar(lay.key))
        _write_record(record, tmp_tar.with_suffix(".json"), cache.layer_meta(lay.key))
        blob = _store_blob(cache, lay, comp, made.blob) if made.blob is not None else None
    return LayerMeta(made.diff_id, made.size, "made", blob, record)


SCRATCH_PREFIX = "envspec-scratch-"


def _scratch_base() -> Path:
    return settings.read().scratch


def _scratch_dir(work: Path, need: int) -> Path:
    """Where the throw-away root filesystem is laid down: a tmpfs (``ENVSPEC_SCRATCH``, default
    /dev/shm) where it has room for ``need`` bytes twice over, else the work directory. Creating
    thousands of small files costs a third of the time there (h100 base: 3.6 s against 10.0 s
    on this project's ext4 disk, docs/benchmarks.md). Removed with the rootfs; a killed build's
    is removed by the next one (``_clean_stale_scratch``)."""
    base = _scratch_base()
    try:
        st = os.statvfs(base)
        if os.access(base, os.W_OK) and st.f_bavail * st.f_frsize > 2 * need:
            return Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=base))
    except OSError:
        pass
    return work


def _clean_stale_scratch() -> None:
    try:
        entries = list(_scratch_base().glob(SCRATCH_PREFIX + "*"))
    except OSError:
        return
    for d in entries:
        pid = d.name[len(SCRATCH_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)

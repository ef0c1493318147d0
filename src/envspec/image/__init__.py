"""The image stage: ``BuildPlan`` -> layer tars (cached by content key) -> OCI layout -> outputs,
push (through the engine; what goes beside a push, and the registry layer cache, are the registry
stage's, given as ``BuildOptions.registry``), and last the tag in containers-storage.

``build(plan, engine, cache, mirrors)`` reads in one screen; the steps are below it. Where the
engine has a store that takes layers directly (``Engine.storage_cli()``), layers go into it beside the
layer makers (``importer``); else the engine imports the finished layout.

Atomic: everything happens in a work directory under the cache; the image gets its name only
at the very end (after every layer, the config and the manifest are stored), so a failed or
interrupted build (SIGINT, SIGKILL) leaves no tagged image (at most unnamed layers, which the
next build reuses), and child processes die with the build. Concurrent builds sharing a cache
are safe: files enter the cache by atomic rename, and equal keys mean equal bytes.
"""

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
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import ParamSpec, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from envspec import debian, settings
from envspec.cache.store import Cache, Identity, SharedUse, _pid_alive, admit
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
    BuildahEngine,
    Engine,
    RecordingEngine,
    StorageCLI,
    chain_id,
    die_with_parent,
)
from envspec.image.importer import Importer, LayerFile
from envspec.image.oci import LayerBlob, export_layout, sha256_bytes, write_layout
from envspec.image.records import (
    BlobRecord,
    LayerMeta,
    LayerRecord,
    MadeBlob,
    MadeLayer,
    RegistryEntry,
)
from envspec.image.sbom import make_sbom
from envspec.lock import Lockfile, Wheel
from envspec.plan import MAKER_VERSIONS, BuildPlan, Layer, make_plan
from envspec.services import ENTRYPOINT_IN_IMAGE, render_service_files
from envspec.sources import Mirror
from envspec.wheels import abi, sdist
from envspec.wheels.fetch import WheelFetcher

_T = TypeVar("_T")
_P = ParamSpec("_P")

# Wheel layers whose maker writes the tar only and lets the store's stager untar it (the others'
# makers also make the files, for the stager to take as they are: docs/build.md, "Into
# containers-storage"). The torch layer's maker is the cold build's critical path (torch's 2 GB, its
# 22,000 files, and most of the image's .pyc fed through it); its stager untars beside it. Made as
# files by its maker instead (its big libraries past the page cache too), the cold build took 60-62 s
# against 54-55 s (measured 2026-12-03, recorded in 84c94ad). ENVSPEC_LAYER_TREES=all: every wheel layer made
# as files; =off: none.
UNTARRED_GROUPS = frozenset({"torch"})

__all__ = [
    "build",
    "preview",
    "Preview",
    "LayerPreview",
    "compress_layers",
    "compress_now",
    "DEFAULT_COMPRESSION",
    "BuildOptions",
    "BuiltImage",
    "LayerInfo",
    "Phase",
    "Reporter",
    "BuildahEngine",
    "RecordingEngine",
    "Engine",
]


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


@dataclass(frozen=True)
class LayerInfo:
    """A made (or cached) layer: ``plan.Layer`` turned into bytes."""

    digest: str  # the blob digest as pushed (compressed; == diff_id with compression "none")
    diff_id: str  # the uncompressed tar's
    size: int  # the blob's size
    group: str
    cached: bool
    key: str = ""
    diff_size: int = 0  # the uncompressed tar's size
    media_type: str = ""
    # where it came from: "made" here, "local" (the layer cache), "registry" (--cache-from), "store"
    # (--cache-from named it, and containers-storage had it already: not read, ``Layers.stream``)
    source: str = "made"


@dataclass(frozen=True)
class Phase:
    """One step of a build and when it ran, in seconds since the build began (the monotonic
    clock, which the layer makers' processes share): ``fetch`` (the wheels), ``debs`` (the
    .debs), ``rootfs`` (the Debian tree laid down), ``layer GROUP`` (a layer's tar made),
    ``import GROUP`` (a layer untarred into containers-storage and made a layer there; ``untar
    GROUP``: its untar alone, where it is staged), ``layout`` (config, manifest,
    OCI layout), ``deliver`` (outputs and push), ``commit`` (the image made and named in the
    store), ``cache fetch GROUP`` (a layer taken from the registry cache), ``cache push`` (the
    layers put into it) and ``check cached layers`` (the cached files an output or push carries, hashed). Phases overlap: layers are made in parallel and imported beside the makers."""

    name: str
    start: float
    end: float
    detail: tuple[
        tuple[str, float], ...
    ] = ()  # where its seconds went (a layer's stream: ``regcache.StreamTimes``)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "name": self.name,
            "start_s": round(self.start, 3),
            "end_s": round(self.end, 3),
            "s": round(self.end - self.start, 3),
        }
        if self.detail:
            out["detail"] = dict(self.detail)
        return out


class Clock:
    """The phases of one build as they end, each also sent to the reporter."""

    def __init__(self, reporter: Reporter) -> None:
        self.t0 = time.monotonic()
        self.reporter = reporter
        self.phases: list[Phase] = []
        self._guard = threading.Lock()  # the importer's thread adds phases too

    def add(
        self, name: str, start: float, end: float, detail: tuple[tuple[str, float], ...] = ()
    ) -> None:
        """A phase that ran from ``start`` to ``end`` (``time.monotonic()`` values)."""
        phase = Phase(name, start - self.t0, end - self.t0, detail)
        with self._guard:
            self.phases.append(phase)
        self.reporter.phase(phase)

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        yield
        self.add(name, start, time.monotonic())

    def elapsed(self) -> float:
        return time.monotonic() - self.t0


@dataclass(frozen=True)
class BuiltImage:
    image: str  # the tag in containers-storage ("" when not tagged)
    digest: str  # the manifest digest of what pushes and OCI outputs carry: the image's identity
    layers: tuple[LayerInfo, ...]
    config_digest: str = ""
    pushed: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    attached: tuple[str, ...] = ()  # the attestations and signature pushed beside the image
    store_digest: str = ""  # the manifest digest in containers-storage (uncompressed layers)
    compression: str = (
        "none"  # of the layers ``digest`` names ("none": kept uncompressed, ``compress_now``)
    )
    carried_compression: str = ""  # of the layers a push or an OCI output of this lock carries
    phases: tuple[
        Phase, ...
    ] = ()  # what the build spent its time on, in the order the phases ended
    seconds: float = 0.0  # the whole build
    cache_from: str = ""
    cache_to: str = ""
    cached_to: tuple[str, ...] = ()  # the cache entries this build pushed to ``cache_to``

    def to_json(self) -> dict[str, object]:
        return {
            "image": self.image,
            "digest": self.digest,
            "store_digest": self.store_digest or self.digest,
            "compression": self.compression,
            "carried_compression": self.carried_compression or self.compression,
            "config": self.config_digest,
            "layers": [asdict(lay) for lay in self.layers],
            "pushed": list(self.pushed),
            "attached": list(self.attached),
            "outputs": list(self.outputs),
            "seconds": round(self.seconds, 3),
            "phases": [p.to_json() for p in self.phases],
            "cache": {"from": self.cache_from, "to": self.cache_to, "pushed": list(self.cached_to)},
        }


class Reporter:
    """Progress events, each sent as the work happens, with no-op defaults; the CLI subclasses it
    with rich progress bars, tests record them."""

    def fetching(
        self, name: str, filename: str, size: int
    ) -> None: ...  # a wheel or .deb download starts
    def fetched(
        self, name: str, filename: str, path: Path
    ) -> None: ...  # ... and is in the cache, checked
    def layer_started(self, group: str, pins: int, cached: bool) -> None: ...
    def layer_built(
        self, layer: LayerInfo
    ) -> None: ...  # the layer's tar is made (or found in the cache)
    def importing(
        self, group: str, sent: int
    ) -> None: ...  # bytes of the layer sent to the store so far
    def committing(self, ref: str, digest: str) -> None: ...
    def pushed(self, dest: str, digest: str) -> None: ...
    def warning(self, message: str) -> None: ...  # something the user should know (no .pyc, ...)
    def source_building(
        self, name: str, version: str
    ) -> None: ...  # a wheel's build from its sdist starts
    # ... and its wheel is there: built now (``seconds``), or found in the cache (``cached``)
    def source_built(
        self, name: str, version: str, wheel: str, seconds: float, cached: bool
    ) -> None: ...
    def source_progress(
        self, name: str, version: str, step: str
    ) -> None: ...  # a compile step of that build
    def phase(self, phase: Phase) -> None: ...  # a step of the build ended (``BuiltImage.phases``)


def build(
    plan: BuildPlan,
    engine: Engine,
    cache: Cache,
    mirrors: Sequence[Mirror],
    *,
    options: BuildOptions = BuildOptions(),
    reporter: Reporter | None = None,
    registry_cache: LayerCache | None = None,
) -> BuiltImage:
    """Build the plan's image. Raises BuildError/HashMismatch (exit 4), SourceError (3), HostError (5).
    ``registry_cache``: the --cache-from/--cache-to registries (default: made from ``options`` by
    ``options.registry`` with the engine's registry access).

    A cached layer found damaged on its way into the store (``DamagedEntry``) is dropped from the
    cache with a warning and the build runs again, making that layer anew: what was already made,
    fetched or stored is found again, and the image is the same. A second damaged entry stops it."""
    reporter = reporter or Reporter()
    healed: set[Path] = set()
    while True:
        try:
            return _build(
                plan,
                engine,
                cache,
                mirrors,
                options=options,
                reporter=reporter,
                registry_cache=registry_cache,
            )
        except DamagedEntry as e:
            if (
                not e.paths
                or set(e.paths) & healed
                or not all(cache.evict_layer(p) for p in e.paths)
            ):
                raise
            healed.update(e.paths)
            reporter.warning(
                f"{e.message.splitlines()[0]}: removed from the cache; the layer is made again"
            )


def _build(
    plan: BuildPlan,
    engine: Engine,
    cache: Cache,
    mirrors: Sequence[Mirror],
    *,
    options: BuildOptions,
    reporter: Reporter,
    registry_cache: LayerCache | None,
) -> BuiltImage:
    """One run of ``build``: its steps, in order."""
    run = _Run.start(plan, engine, cache, mirrors, options, reporter, registry_cache)
    try:
        run.take_from_registry_cache()
        run.make_layers()
        image = run.write_image()
        outputs, pushed, attached = run.deliver(image)
        run.commit(image)
        cached_to = run.push_to_registry_cache()
    except BaseException as e:
        run.fail(e)
        raise
    finally:
        run.close()
    return run.built(image, outputs=outputs, pushed=pushed, attached=attached, cached_to=cached_to)


@dataclass
class _Run:
    """One run of ``build`` on its way: what its steps share."""

    plan: BuildPlan
    engine: Engine
    cache: Cache
    mirrors: Sequence[Mirror]
    options: BuildOptions
    reporter: Reporter
    rc: LayerCache | None  # the registry layer cache, if any
    clock: Clock
    ref: str  # the store's name for the image ("": none)
    in_use: SharedUse  # the cache's shared lock (``Cache.in_use``), released by ``close``
    abi_checked: Future[
        list[str]
    ]  # the ABI check of the wheels at hand: the wheels it could not read
    work: Path
    layers: Layers
    store: StorageCLI | None  # containers-storage, written to directly (None: by the engine)
    importer: Importer | None = None
    early: bool = False  # every layer to make comes from the registry cache: imported as it arrives

    @classmethod
    def start(
        cls,
        plan: BuildPlan,
        engine: Engine,
        cache: Cache,
        mirrors: Sequence[Mirror],
        options: BuildOptions,
        reporter: Reporter,
        registry_cache: LayerCache | None,
    ) -> _Run:
        """The set-up: the push's side asked for, the cache held, the ABI check started (it makes
        nothing: it runs beside the set-up and the registry cache's lookups, and is waited for
        before anything is fetched for a layer or untarred; a layer taken from the registry cache
        was made by a build that read every wheel: a node's pull reads nothing from the package
        indexes, issue 44), the .pyc compiler found, the layers looked up in the local cache."""
        if options.push:
            registry_stage(options)  # what goes beside the push: asked for before anything is made
        rc = registry_cache or _registry_cache(engine, options)
        clock = Clock(reporter)
        ref = plan.tag if options.tag is None else options.tag
        in_use = cache.in_use()  # a shared lock: `envspec cache gc` waits for it (cache/gc.py)
        cache.clean_stale()
        abi_checked = _in_thread(
            "envspec-abi", clock, "abi check", check_abi_at_hand, plan.lock, cache, mirrors
        )
        try:
            plan, compiler = _bytecode_compiler(plan, reporter)
        except Exception:
            abi_checked.exception()  # not left writing into the cache behind the error
            raise
        _clean_stale_scratch()
        work = cache.workdir()
        layers = Layers(plan, cache, work, reporter, options=options, clock=clock)
        layers.compiler = compiler
        run = cls(
            plan=plan,
            engine=engine,
            cache=cache,
            mirrors=mirrors,
            options=options,
            reporter=reporter,
            rc=rc,
            clock=clock,
            ref=ref or "",
            in_use=in_use,
            abi_checked=abi_checked,
            work=work,
            layers=layers,
            store=engine.storage_cli() if ref else None,
        )
        run._stage_into_store()
        return run

    def _stage_into_store(self) -> None:
        """Where the store stages layers as they are made: the wheel layers' makers make their
        files in its staging area too, and each layer's stager reads the tar from its maker
        through a FIFO, not from the file; not where layers may come from a registry cache
        instead (a FIFO nobody writes would stall it)."""
        if self.store is None or not self.store.can_stage:
            return
        if settings.read().layer_trees != "off":
            self.layers.tree_root = self.store.staging_root()
        self.layers.pipes = settings.read().stage_pipe and not self._from_registry_cache()

    def _from_registry_cache(self) -> bool:
        return self.rc is not None and bool(self.rc.cache_from) and not self.options.no_cache

    def _new_importer(self) -> Importer:
        assert self.store is not None
        clock = self.clock
        return Importer(
            self.store,
            self.layers.files(),
            on_progress=self.reporter.importing,
            on_stored=lambda group, start, end: clock.add(f"import {group}", start, end),
            on_staged=lambda group, start, end: clock.add(f"untar {group}", start, end),
        )

    def take_from_registry_cache(self) -> None:
        """The layers the registry cache has, fetched (or streamed into the store: a node's pull,
        each blob checked, decompressed and untarred as it arrives, no file between) instead of
        made; the importer made, and started where every layer comes from there."""
        rc, layers = self.rc, self.layers
        entries = rc.lookup_layers(layers) if rc is not None and self._from_registry_cache() else {}
        abi_unread = self.abi_checked.result()
        if entries:
            # every layer to make is in the registry cache: import each one as it arrives, beside
            # the others' downloads (should an entry fail its checks, its layer is made by worker
            # processes that are not forked from this one, whose import thread is then running)
            self.early = (
                self.store is not None
                and bool(layers.todo)
                and all(lay.key in entries for lay in layers.todo)
            )
            if (
                self.early
                and self.store is not None
                and _streams(rc, self.store, self.options, self.layers.comp)
            ):
                layers.stream(entries, self.store.stored_layers())
        self.importer = self._new_importer() if self.store and layers.todo else None
        if entries and rc is not None:
            self._fetch_entries(rc, entries)
        if (
            abi_unread and layers.todo
        ):  # a layer is made here after all: every wheel it needs is read
            with self.clock.span("abi check"):
                check_abi(self.plan.lock, self.cache, self.mirrors, self.reporter)

    def _fetch_entries(self, rc: LayerCache, entries: dict[str, RegistryEntry]) -> None:
        layers = self.layers
        if self.early and self.importer is not None:
            self.importer.start()
        if not layers.streams:
            rc.fetch_layers(layers, entries)
            return
        streamed = _in_thread(
            "envspec-streams", None, "", rc.stream_layers, layers, entries, layers.streams
        )
        try:  # the envspec layer (made from the lock alone) beside the streams: ready when they end
            layers.make_top(self.options.verify_dir)
        finally:
            streamed.exception()  # every stream ended (each layer's errors are its future's)
        streamed.result()

    def make_layers(self) -> None:
        """The layers not found: their wheels fetched, the sdists built, the wheel layers made by
        worker processes while the base layer is made here, the envspec layer last."""
        layers, options = self.layers, self.options
        with self.clock.span("fetch"):
            layers.fetch_wheels(self.mirrors)
        with self.clock.span("source builds"):
            layers.build_sources(
                self.mirrors, parallel=options.source_parallel, jobs=options.source_jobs
            )
        with layers.wheel_makers(options.workers, fork=not self.early) as pending:
            if self.importer is not None and not self.early:
                self.importer.start()  # after the fork of the worker processes: no thread copied
            layers.make_base()
            layers.finish(pending)
        if not layers.top_made():
            layers.make_top(options.verify_dir)

    def write_image(self) -> Image:
        """The image's OCI layout, its cached layers compressed (and, where they leave this
        machine, checked first: their files go out as they are)."""
        layers, plan = self.layers, self.plan
        layers.compress_cached()
        if self.options.outputs or self.options.push:
            with self.clock.span("check cached layers"):
                layers.check_cached()
        with self.clock.span("layout"):
            return write_image(
                self.work / "oci",
                plan,
                layers.made(),
                [layers.layout_path(lay) for lay in plan.layers],
                comp=self.layers.comp,
                blobs=[layers.blob_path(lay) for lay in plan.layers],
            )

    def deliver(self, image: Image) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """The image to its outputs and pushes; beside a push its provenance and SBOM, and its
        signature (registry/attest.py). Returns (outputs, pushed, attached)."""
        with self.clock.span("deliver"):
            outputs, pushed = deliver(
                self.engine, image, self.options, self.reporter, tag=self.ref or self.plan.tag
            )
            attached: tuple[str, ...] = ()
            if self.options.push:
                for r, d in registry_stage(self.options).attach(
                    self.engine.push, self.work, self.plan, image.dist.digest, self.options.push
                ):
                    attached += (r,)
                    self.reporter.pushed(r, d)
        return outputs, pushed, attached

    def commit(self, image: Image) -> None:
        """The image named in the store (its layers imported first where none were)."""
        if not self.ref:
            return
        engine, ref = self.engine, self.ref
        self.reporter.committing(ref, image.digest)
        with self.clock.span("commit"):
            # an import under way is waited for before anything else opens the store: a buildah or
            # podman run on it, as it ends, empties the store's staging directory (overlay's
            # Cleanup), where a staged layer is on its way into the store
            if self.importer is None:
                if engine.image_digest(ref) == image.digest:
                    return
                if self.store is None:
                    with self.cache.locked("import"):
                        engine.import_image(image.layout, ref)
                    return
                self.importer = self._new_importer().start()
            self.importer.finish(image.config, image.manifest, ref)

    def push_to_registry_cache(self) -> tuple[str, ...]:
        """The layers the registry cache lacks, pushed (the image is good: a failure only warns)."""
        if self.rc is None or not self.rc.cache_to:
            return ()
        with self.clock.span("cache push"):
            return self.rc.push_layers(self.layers)

    def fail(self, e: BaseException) -> None:
        if isinstance(e, Exception):  # an interrupt does not wait for the check's downloads
            self.abi_checked.exception()
        self.layers.fail(e)
        if self.importer is not None:
            self.importer.abort()

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
        for tree in self.layers.trees.values():  # moved into the store when imported; else dropped
            shutil.rmtree(tree, ignore_errors=True)
            Path(f"{tree}.tar-split.gz").unlink(missing_ok=True)
        self.in_use.release()

    def built(
        self,
        image: Image,
        *,
        outputs: tuple[str, ...],
        pushed: tuple[str, ...],
        attached: tuple[str, ...],
        cached_to: tuple[str, ...],
    ) -> BuiltImage:
        rc = self.rc
        return BuiltImage(
            image=self.ref,
            digest=image.dist.digest,
            layers=self.layers.made(),
            config_digest=sha256_bytes(image.config),
            pushed=pushed,
            outputs=outputs,
            attached=attached,
            store_digest=image.digest,
            compression=self.layers.comp.name,
            carried_compression=self.layers.cache_comp.name,
            phases=tuple(self.clock.phases),
            seconds=self.clock.elapsed(),
            cache_from=rc.cache_from if rc else "",
            cache_to=rc.cache_to if rc else "",
            cached_to=cached_to,
        )


@dataclass(frozen=True)
class LayerPreview:
    """A layer of ``build --dry-run``: the plan's, whether the cache has it, and its blob of the
    build's compression."""

    layer: Layer
    cached: bool
    compressed: bool

    def to_json(self) -> dict[str, object]:
        return self.layer.to_json() | {"cached": self.cached, "compressed": self.compressed}


@dataclass(frozen=True)
class FetchPreview:
    """What a build would download: the wheels not in the cache, the .debs of the layers to make."""

    wheels: int
    wheel_bytes: int
    debs: int
    deb_bytes: int


@dataclass(frozen=True)
class SourceBuildPreview:
    """A wheel a build would make from its sdist, and whether the cache has it made."""

    name: str
    version: str
    sdist: str
    key: str
    cached: bool


@dataclass(frozen=True)
class Preview:
    """``build --dry-run`` of one image (``preview``); ``to_json`` is what ``--json`` prints."""

    image: str
    layers: tuple[LayerPreview, ...]
    fetch: FetchPreview
    source_builds: tuple[SourceBuildPreview, ...]
    compression: str  # what this build makes
    carried_compression: str  # what its pushes and outputs carry
    cache_from: str
    cache_to: str
    engine: tuple[tuple[str, ...], ...]  # the engine verbs it would end with

    def to_json(self) -> dict[str, object]:
        return {
            "image": self.image,
            "layers": [lay.to_json() for lay in self.layers],
            "fetch": asdict(self.fetch),
            "source_builds": [asdict(b) for b in self.source_builds],
            "compression": self.compression,
            "carried_compression": self.carried_compression,
            "cache": {"from": self.cache_from, "to": self.cache_to},
            "engine": [list(step) for step in self.engine],
        }


def preview(plan: BuildPlan, cache: Cache, *, options: BuildOptions = BuildOptions()) -> Preview:
    """``build --dry-run``: the plan, which layers are cached and which would be made, what would
    be fetched, and the engine verbs the build would end with, recorded by ``RecordingEngine``.
    Nothing is fetched, made, imported or pushed."""
    plan, _ = _bytecode_compiler(plan, Reporter())
    layers = Layers(plan, cache, Path("(work)"), Reporter(), options=options)
    todo = {lay.key for lay in layers.todo}
    return Preview(
        image=plan.tag,
        layers=tuple(
            LayerPreview(
                lay,
                cached=lay.key not in todo and lay.cacheable,
                compressed=lay.key not in todo
                and lay.cacheable
                and lay.key not in layers.to_compress,
            )
            for lay in plan.layers
        ),
        fetch=_preview_fetch(layers),
        source_builds=_preview_source_builds(layers),
        compression=layers.comp.name,
        carried_compression=layers.cache_comp.name,
        cache_from=options.cache_from,  # not asked in a dry run
        cache_to=options.cache_to,
        engine=_preview_engine(plan, options, layers.comp),
    )


def _preview_fetch(layers: Layers) -> FetchPreview:
    """What a build would download: the wheels not in the cache, the .debs of the layers to make."""
    wheels = [w for lay in layers.todo for w in lay.wheels if not layers.cache.has_blob(w.sha256)]
    debs = [d for lay in layers.todo for d in lay.debs]
    return FetchPreview(
        wheels=len(wheels),
        wheel_bytes=sum(w.size for w in wheels),
        debs=len(debs),
        deb_bytes=sum(d.size for d in debs),
    )


def _preview_source_builds(layers: Layers) -> tuple[SourceBuildPreview, ...]:
    """The wheels a build would make from their sdists, and whether each is in the cache."""
    platform, root = layers.plan.platform, layers.cache.root
    return tuple(
        SourceBuildPreview(
            name=w.name,
            version=w.version,
            sdist=w.filename,
            key=w.source.key,
            cached=sdist.cached_wheel(sdist.derivation_of(w, platform), root) is not None,
        )
        for lay in layers.todo
        for w in lay.wheels
        if w.source is not None
    )


def _preview_engine(
    plan: BuildPlan, options: BuildOptions, comp: Compression
) -> tuple[tuple[str, ...], ...]:
    """The engine verbs a build would end with (outputs, pushes, what goes beside a push, the
    store's name), recorded on placeholder images."""
    engine = RecordingEngine()
    ref = plan.tag if options.tag is None else options.tag
    image = Image(layout=Path("(oci layout)"), digest="(digest)", config=b"", manifest=b"")
    if comp.name != "none":
        compressed = Image(Path(f"(oci layout, {comp.name})"), "(digest)", b"", b"")
        image = replace(image, compressed=compressed)
    deliver(engine, image, options, Reporter(), export=False, tag=ref or plan.tag)
    if options.push:
        for what, dest in registry_stage(options).refs(options.push, "sha256:(digest)"):
            engine.push(Path(f"({what})"), dest)
    if ref:
        engine.import_image(image.layout, ref)
    return tuple(tuple(str(a) for a in call) for call in engine.calls)


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
            elif lay.group != "envspec":  # the envspec layer is always made, last (``make_top``)
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
            if lay.group == "envspec"
            else self.cache.layer_tar(lay.key)
        )

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
        if lay.group == "envspec":
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
        None where the import does not stage (``pipes``), or the layer is not made here."""
        if not (self.pipes or lay.key in self.streams) or lay not in self.todo:
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
                writing=self.writing_path(lay) if lay.key in todo else None,
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
        """The envspec layer: lock, SBOM, verifier, entrypoint and services (always made; it is tiny)."""
        top = self.plan.layer("envspec")
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


@dataclass(frozen=True)
class Image:
    layout: Path  # an OCI image layout holding the image, its layers uncompressed (for the store)
    digest: str  # the manifest's
    config: bytes
    manifest: bytes
    compressed: Image | None = (
        None  # the same image with compressed layers (for pushes and outputs)
    )

    @property
    def dist(self) -> Image:
        """The image as pushes and OCI outputs carry it."""
        return self.compressed or self


def write_image(
    layout: Path,
    plan: BuildPlan,
    layers: Sequence[LayerInfo],
    paths: Sequence[Path | None],
    *,
    comp: Compression = Compression("none"),
    blobs: Sequence[Path] = (),
) -> Image:
    """The OCI layout of the plan's image from its made layers (``paths``: their tar files), and
    with a compression a second layout ``<layout>-<name>`` whose layers are the compressed
    ``blobs``. The config is the same in both (diff_ids); the manifests differ."""
    made = list(zip(plan.layers, layers))
    plain = _one_layout(
        layout,
        plan,
        [
            LayerBlob(
                group=info.group,
                key=info.key,
                path=path,
                digest=info.diff_id,
                size=info.diff_size or info.size,
                description=_pins_said(lay),
            )
            for (lay, info), path in zip(made, paths)
        ],
    )
    if comp.name == "none":
        return plain
    packed = _one_layout(
        layout.with_name(f"{layout.name}-{comp.name}"),
        plan,
        [
            LayerBlob(
                group=info.group,
                key=info.key,
                path=blob,
                digest=info.digest,
                size=info.size,
                description=_pins_said(lay),
                diff_id=info.diff_id,
                media_type=comp.media_type,
            )
            for (lay, info), blob in zip(made, blobs)
        ],
    )
    return replace(plain, compressed=packed)


def _pins_said(lay: Layer) -> str:
    return f"{len(lay.pins)} pins" if lay.pins else ""


def _one_layout(dest: Path, plan: BuildPlan, layer_blobs: list[LayerBlob]) -> Image:
    """One OCI layout of the plan's image: its entrypoint (tini where the lock has it), its user
    (by number where there is no passwd file: no Debian packages)."""
    debs = {d.name for d in plan.debs}
    rt = plan.lock.runtime
    entrypoint = (
        ((["/usr/bin/tini", "--"] if "tini" in debs else []) + [ENTRYPOINT_IN_IMAGE])
        if debs
        else []
    )
    digest, _size, config = write_layout(
        dest,
        plan,
        layer_blobs,
        entrypoint=entrypoint,
        cmd=[],
        user=rt.user if debs else f"{rt.uid}:{rt.uid}",
        ref_name=plan.lock.short_hash or "latest",
    )
    return Image(
        layout=dest,
        digest=digest,
        config=config,
        manifest=(dest / "blobs" / "sha256" / digest.split(":", 1)[1]).read_bytes(),
    )


def docker_archive_named(dest: str, tag: str) -> str:
    """``docker-archive:FILE`` names no image, and ``docker load`` of it gives an image with no
    name (only its ID): name it ``tag`` (the lock's, ``localhost/envspec/<name>:<hash>``), so
    ``envspec run --engine docker LOCK`` finds it after the load. ``docker-archive:FILE:REF`` stays."""
    if not dest.startswith("docker-archive:") or not tag or ":" in dest[len("docker-archive:") :]:
        return dest
    return f"{dest}:{tag}"


def deliver(
    engine: Engine,
    image: Image,
    options: BuildOptions,
    reporter: Reporter,
    *,
    export: bool = True,
    tag: str = "",
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The image to ``options.outputs`` and ``options.push``: (outputs written, references pushed).
    ``tag``: the name a docker-archive carries when its destination gives none. OCI outputs and
    pushes carry the compressed layers (``image.dist``); a docker archive the tars, as docker
    loads them."""
    dist = image.dist
    for dest in options.outputs:
        if dest.startswith("oci:"):  # ours to write: hardlinks, no copy of gigabytes
            path, _, name = dest[4:].partition(":")
            if export:
                try:
                    export_layout(dist.layout, Path(path), name)
                except OSError as e:
                    raise BuildError(f"cannot write {dest}: {e}", step="output") from e
        elif dest.startswith("docker-archive:"):
            engine.copy(image.layout, docker_archive_named(dest, tag))
        else:
            engine.copy(dist.layout, dest)
    if options.push:
        engine.push(dist.layout, options.push)
        reporter.pushed(options.push, dist.digest)
    return tuple(options.outputs), ((options.push,) if options.push else ())


# --- helpers --------------------------------------------------------------------------------------


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


def check_abi_at_hand(lock: Lockfile, cache: Cache, mirrors: Sequence[Mirror]) -> list[str]:
    """The lock's compiled packages against its torch with the wheels at hand (``abi.check_at_hand``):
    raises ``AbiMismatch`` (exit 2); returns the names of the wheels it could not read."""
    return abi.check_at_hand(
        lock, cache, mirrors, lock_name=f"the lock of {lock.meta.name}"
    ).unchecked


def check_abi(lock: Lockfile, cache: Cache, mirrors: Sequence[Mirror], reporter: Reporter) -> None:
    """The lock's compiled packages against its torch (``wheels.abi``): the wheels it reads are
    fetched into the cache, where the build takes them from; raises ``AbiMismatch`` (exit 2)."""
    fetcher = WheelFetcher(cache, mirrors, on_damaged=reporter.warning)

    def fetch(pins: list[Wheel]) -> dict[str, Path]:
        return fetcher.fetch_all(
            pins,
            on_start=lambda p: reporter.fetching(p.name, p.filename, p.size),
            on_done=lambda p, path: reporter.fetched(p.name, p.filename, path),
        )

    abi.check_lock(lock, cache.root / "abi", fetch, lock_name=f"the lock of {lock.meta.name}")


def _in_thread(
    name: str,
    clock: Clock | None,
    phase: str,
    fn: Callable[_P, _T],
    *args: _P.args,
    **kwargs: _P.kwargs,
) -> Future[_T]:
    """``fn(*args, **kwargs)`` on a thread of its own (timed as ``phase`` on ``clock`` where
    given); its result or exception in the future."""
    fut: Future[_T] = Future()

    def run() -> None:
        fut.set_running_or_notify_cancel()
        try:
            with clock.span(phase) if clock else contextlib.nullcontext():
                res = fn(*args, **kwargs)
        except BaseException as e:
            fut.set_exception(e)
        else:
            fut.set_result(res)

    threading.Thread(target=run, name=name, daemon=True).start()
    return fut


def registry_stage(options: BuildOptions) -> RegistrySide:
    """The registry stage of a build that pushes or uses a registry layer cache."""
    if options.registry is None:
        raise UsageError(
            "a push or a registry layer cache without the registry stage",
            hint="pass BuildOptions(registry=envspec.registry.Registry(...))",
            reference="registry-stage-missing",
        )
    return options.registry


def _streams(
    rc: LayerCache | None, store: StorageCLI | None, options: BuildOptions, comp: Compression
) -> bool:
    """Whether this build streams the registry cache's layers into the store (``Layers.stream``):
    a tagged build into a store that stages (``StorageCLI.can_stage``), of uncompressed layers,
    with nothing else that needs the layers' files (no output, no push, no other ``--cache-to``),
    from a registry read directly (``RegistryCache.can_stream``); ``ENVSPEC_CACHE_STREAM=off``: never."""
    if not settings.read().cache_stream:
        return False
    if rc is None or store is None or not getattr(store, "can_stage", False) or comp.name != "none":
        return False
    if options.outputs or options.push or (rc.cache_to and rc.cache_to != rc.cache_from):
        return False
    return rc.can_stream()


def _registry_cache(engine: Engine, options: BuildOptions) -> LayerCache | None:
    """The registries of ``options.cache_from``/``cache_to``, read and written with the engine's
    registry access (credentials, TLS) and its push; None without either."""
    if not (options.cache_from or options.cache_to):
        return None
    return registry_stage(options).layer_cache(engine, options.cache_from, options.cache_to)


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

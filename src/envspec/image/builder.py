"""``build(plan, engine, cache, mirrors)`` and its run, step by step (``_Run``): the ABI check, the
layers, the image, the outputs, the tag.

Where the engine has a store that takes layers directly (``Engine.storage_cli()``), layers go into
it beside the layer makers (``importer``); else the engine imports the finished layout.

Atomic: everything happens in a work directory under the cache; the image gets its name only
at the very end (after every layer, the config and the manifest are stored), so a failed or
interrupted build (SIGINT, SIGKILL) leaves no tagged image (at most unnamed layers, which the
next build reuses), and child processes die with the build. Concurrent builds sharing a cache
are safe: files enter the cache by atomic rename, and equal keys mean equal bytes."""

from __future__ import annotations

import contextlib
import shutil
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, TypeVar

from envspec import settings
from envspec.cache.store import Cache, SharedUse
from envspec.errors import DamagedEntry
from envspec.image.compress import (
    Compression,
)
from envspec.image.engine import (
    Engine,
    StorageCLI,
)
from envspec.image.importer import Importer
from envspec.image.making import (
    BuildOptions,
    LayerCache,
    Layers,
    _clean_stale_scratch,
    image_plan,
    registry_stage,
)
from envspec.image.oci import sha256_bytes
from envspec.image.output import Image, deliver, write_image
from envspec.image.records import (
    RegistryEntry,
)
from envspec.image.report import BuiltImage, Clock, Reporter
from envspec.lock import Lockfile, Wheel
from envspec.plan import BuildPlan
from envspec.sources import Mirror
from envspec.wheels import abi
from envspec.wheels.fetch import WheelFetcher

_T = TypeVar("_T")
_P = ParamSpec("_P")


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
        run.drop_pulled()
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
            plan, compiler = image_plan(plan, reporter, options)
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
            self.layers.tree_root = self.store.make_staging_root()
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
                and bool(layers.to_make)
                and all(lay.key in entries for lay in layers.to_make)
            )
            if (
                self.early
                and self.store is not None
                and _streams(rc, self.store, self.options, self.layers.comp)
            ):
                layers.stream(entries, self.store.stored_layers())
        self.importer = self._new_importer() if self.store and layers.to_make else None
        if entries and rc is not None:
            self._fetch_entries(rc, entries)
        if (
            abi_unread and layers.to_make
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

    def drop_pulled(self) -> None:
        """A node keeps what ``podman pull`` keeps (issue 59, point 5): the layers this build took
        from the registry cache into the local cache (those not streamed into the store) are
        dropped from it once the image is in the store, unless ``ENVSPEC_KEEP_PULLED`` is on. An
        image that went to no store (``--tag ""``) keeps them: the cache is where they are."""
        if not self.ref or settings.read().keep_pulled:
            return
        for lay in self.plan.layers:
            meta = self.layers.metas.get(lay.key)
            if meta is not None and meta.source == "registry":
                self.cache.evict_layer(self.cache.layer_tar(lay.key))  # False where not there

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

"""Import into containers-storage while the layers are still being made.

The import (untarring every layer into the store) costs about as much as making the layers, so
it runs beside them. Layer IDs are containers/image's chain of diff_ids (``engine.chain_id``), so
a layer's ID is known only once it and every layer under it are made. Two ways, by the store:

- staged (``StorageCLI.can_stage``: envspec-put-layer on overlay): every layer is untarred into
  the store's staging area from the moment its maker starts writing it, each beside the others
  (``envspec-put-layer stage --follow`` reads the growing file); once it is made and its parent
  is in, ``commit`` makes the layer from the staged files in a moment. So no layer waits for
  the one under it, and the last one is in the store soon after its maker ends.
- one after the other (``containers-storage import-layer``, or envspec-put-layer's one-step
  mode): each layer's finished tar is fed to the tool once its parent is in.

Either way the stored diff digest must equal the one the maker computed, or the layer is dropped
and the build stops. The image itself (config, manifest, name) is made only after every layer is
in, by ``finish``. Nothing here decides what a layer holds.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envspec.errors import DamagedEntry, HashMismatch
from envspec.image.engine import (
    Cancelled,
    LayerPut,
    Stage,
    Staged,
    StagingEmptied,
    StorageCLI,
    _drop_staged,
    chain_id,
)
from envspec.image.records import LayerMeta

STAGE_TRIES = 3  # a layer staged and committed at most this often (``Importer._commit``)


@dataclass
class LayerFile:
    """A layer tar and the future of its maker, whose result carries ``diff_id`` and ``size``;
    ``path`` is where the tar is once the maker is done (the cache, or the work directory)."""

    group: str
    path: Path
    made: Future[LayerMeta]
    writing: Path | None = (
        None  # where its maker writes it while it is made (a staged import follows it)
    )
    tree: Path | None = None  # where its maker also makes its files, in the store's staging area
    pipe: Path | None = (
        None  # a FIFO its maker also writes the tar into, for the stager (``tarball.PipeTee``)
    )
    # the layer comes through ``pipe`` from the registry cache (``regcache.stream_layers``): ends
    # with the stream, True or its exception (then the layer is made, and staged from its file)
    streamed: Future[bool] | None = None

    def result(self, cancel: threading.Event) -> LayerMeta:
        while not self.made.done():
            if cancel.is_set():
                raise Cancelled()
            wait([self.made], timeout=0.1)
        return self.made.result()


@dataclass
class Importer:
    """Imports ``layers`` (bottom first) in a thread: ``start``, then ``finish`` (waits, raises
    what went wrong, names the image) or ``abort`` (stops the import, drops the partial layer)."""

    store: StorageCLI
    layers: Sequence[LayerFile]
    on_progress: Callable[[str, int], None] = lambda group, sent: None
    on_stored: Callable[[str, float, float], None] = lambda group, start, end: (
        None
    )  # a layer this import stored, when
    on_staged: Callable[[str, float, float], None] = lambda group, start, end: (
        None
    )  # ... untarred (staged), when
    cancel: threading.Event = field(default_factory=threading.Event)
    top: str = ""
    stored: list[str] = field(
        default_factory=list
    )  # groups this import stored (the others were there)
    _error: BaseException | None = None
    _thread: threading.Thread | None = None
    _halt: threading.Event = field(
        default_factory=threading.Event
    )  # the stagers stop (abort, an error, the end)
    _present: dict[str, str] = field(
        default_factory=dict
    )  # the store's layers when the import began
    _stages: dict[int, Stage] = field(default_factory=dict)  # stagers running, by layer index
    _staged: dict[int, Staged] = field(default_factory=dict)  # staged, not yet committed
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Importer:
        self._thread = threading.Thread(target=self._run, name="envspec-import", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            if self.store.can_stage:
                self._run_staged()
            else:
                self._run_serial()
        except BaseException as e:  # noqa: BLE001 (handed to the caller by finish)
            self._error = e
        finally:
            for (
                lay
            ) in self.layers:  # a maker still waiting for a stager to open its FIFO goes on without
                if lay.pipe is not None:
                    lay.pipe.unlink(missing_ok=True)

    def _run_serial(self) -> None:
        with self.store.locked():
            parent = ""
            for lay in self.layers:
                # containers/image's chain of diff_ids, so `podman pull` of this image into this
                # store finds our layers and image (a chain of content keys would let the import
                # start before a layer is finished, but then a pull back here makes its own
                # layers and fails on the image ID, which is the config digest either way)
                made = lay.result(self.cancel)
                want = made.diff_id
                layer_id = chain_id(parent, want)

                def progress(n: int, g: str = lay.group) -> None:
                    self.on_progress(g, n)

                # a layer made in this build was hashed by its maker as it was written; one
                # taken from the layer cache is hashed again on its way into the store
                start = time.monotonic()
                put = LayerPut(
                    name=lay.group,
                    diff_id=want,
                    check=made.cached,
                    cancel=self.cancel,
                    progress=progress,
                )
                have, ours = self.store.put_layer(layer_id, parent, lay.path, made.size, put)
                if have != want:
                    if ours:
                        self.store.delete_layer(layer_id)
                    if ours and made.cached:
                        raise self._mismatch(lay, made, have)
                    raise HashMismatch(
                        f"containers-storage holds {have or 'nothing'} as the {lay.group} layer "
                        f"{layer_id[:12]}, but this build made {want}",
                        step="import layer",
                        hint=(
                            "the layer's file changed while it was imported; build again"
                            if ours
                            else "the store's layer of this ID holds other bytes (changed on disk?); remove "
                            "the images using it (`podman rmi`) and build again"
                        ),
                    )
                if ours:
                    self.stored.append(lay.group)
                    self.on_stored(lay.group, start, time.monotonic())
                parent = layer_id
            self.top = parent

    # -- staged: every layer untarred as it is written, made in the store in order ---------------
    def _run_staged(self) -> None:
        with self.store.locked():
            self.store.clean_staging()
            self.store.prepare()
            self._present = self.store.stored_layers()
            jobs = []
            for i, lay in enumerate(self.layers):
                fut: Future[_StageDone | None] = Future()
                threading.Thread(
                    target=self._stage_thread,
                    args=(i, lay, fut),
                    name=f"envspec-stage-{lay.group}",
                    daemon=True,
                ).start()
                jobs.append(fut)
            try:
                parent = ""
                for i, (lay, job) in enumerate(zip(self.layers, jobs)):
                    made = lay.result(self.cancel)
                    want = made.diff_id
                    layer_id = chain_id(parent, want)
                    while not job.done():
                        if self.cancel.is_set():
                            raise Cancelled()
                        wait([job], timeout=0.1)
                    done = job.result()
                    if done is not None:
                        self._commit(i, lay, made, (layer_id, parent), done)
                    elif (
                        self._present.get(layer_id) != want
                    ):  # its stager saw it stored: still there?
                        raise self._mismatch(
                            lay, made, self._present.get(layer_id, ""), stored=True
                        )
                    parent = layer_id
                self.top = parent
            finally:
                self._halt.set()  # stagers still running (an error) stop and drop what they staged
                with self._lock:
                    left, self._stages = list(self._stages.values()), {}
                    staged, self._staged = list(self._staged.values()), {}
                for stage in left:
                    stage.kill()
                for got in staged:
                    _drop_staged(got)
                for lay in (
                    self.layers
                ):  # not used (the layer came from a cache), or its maker failed; one
                    # whose maker is still writing is removed by build() once the makers have stopped
                    if lay.tree is not None and lay.made.done() and lay.tree.exists():
                        _drop_staged(
                            Staged(
                                {"staging": str(lay.tree), "tar_split": f"{lay.tree}.tar-split.gz"}
                            )
                        )

    def _commit(
        self, i: int, lay: LayerFile, made: LayerMeta, ids: tuple[str, str], done: _StageDone
    ) -> None:
        """Make layer ``i`` (``ids``: its ID and its parent's) from what its stager staged. Staged
        files that another process removed from the store's staging directory before they were
        in the layer (``StagingEmptied``) are staged again, from the layer's file."""
        want, start = made.diff_id, done.started
        self.on_staged(lay.group, start, done.ended)
        for attempt in range(1, STAGE_TRIES + 1):
            got, digest = done.staged, done.digest
            with self._lock:
                self._staged.pop(i, None)
            if got.size != made.size or (digest and digest != want):
                _drop_staged(got)
                raise self._mismatch(lay, made, digest or f"{got.size} bytes, not {made.size}")
            try:
                have, ours = self.store.commit_staged(*ids, want, got)
                break
            except StagingEmptied:
                if attempt == STAGE_TRIES or not lay.path.is_file():
                    raise
            again = self._stage_attempt(i, lay, use_pipe=False)  # made: from its file
            if not isinstance(again, _StageDone):  # not for a layer that was staged once
                raise StagingEmptied(
                    f"the {lay.group} layer could not be staged again", step="import layer"
                )
            done = again
        if have != want:
            raise self._mismatch(lay, made, have, stored=True)
        if ours:
            self.stored.append(lay.group)
            self.on_stored(lay.group, start, time.monotonic())

    def _mismatch(
        self, lay: LayerFile, made: LayerMeta, have: str, *, stored: bool = False
    ) -> HashMismatch:
        want = made.diff_id
        if stored:
            return HashMismatch(
                f"containers-storage holds {have or 'nothing'} as the {lay.group} layer, but this "
                f"build made {want}",
                step="import layer",
                hint="the store's layer of this ID holds other bytes (changed on disk?); remove the "
                "images using it (`podman rmi`) and build again",
            )
        if made.cached:
            return DamagedEntry(
                f"the cached layer file {lay.path} is not {want} ({have})",
                step="import layer",
                paths=(lay.path,),
                hint="it changed on disk; build again with --no-cache",
            )
        return HashMismatch(
            f"the {lay.group} layer's file untarred into containers-storage is {have}, but its "
            f"maker wrote {want}",
            step="import layer",
            hint="the layer's file changed while it was imported; build again",
        )

    def _known_id(self, i: int) -> str:
        """Layer ``i``'s ID where it and every layer under it are made already, else ""."""
        parent = ""
        for lay in self.layers[: i + 1]:
            if not lay.made.done() or lay.made.exception() is not None:
                return ""
            parent = chain_id(parent, lay.made.result().diff_id)
        return parent

    def _stage_thread(self, i: int, lay: LayerFile, job: Future[_StageDone | None]) -> None:
        try:
            job.set_result(self._stage_one(i, lay))
        except BaseException as e:  # noqa: BLE001 (the commit loop raises it, or the maker's error first)
            job.set_exception(e)

    def _stage_one(self, i: int, lay: LayerFile) -> _StageDone | None:
        """Stage layer ``i`` from its file: the finished one (from the cache, or made already), or
        the one its maker is writing, or the stream from the registry cache. None where the layer
        is in the store already. A stream that fails is staged again from the layer made here."""
        use_pipe = True
        while True:
            got = self._stage_attempt(i, lay, use_pipe)
            if not isinstance(got, _Again):
                return got
            use_pipe = False

    def _stage_attempt(self, i: int, lay: LayerFile, use_pipe: bool) -> _StageDone | None | _Again:
        """Stage layer ``i`` once: from where it can be read first (``_open_source``), its
        stager registered, fed to its end, and its result kept for the commit loop. None where
        the store has the layer; ``_AGAIN`` where the registry cache's stream failed its checks."""
        src = self._open_source(i, lay, use_pipe)
        if src is None:
            return None
        started = time.monotonic()
        stage, digest = self._start_stage(lay, src)
        self._register(i, stage)
        try:
            if src.follow:
                if src.streaming and not _ended_well(lay.streamed, self._halt):
                    stage.kill()  # the stream failed its checks: the layer is made here, staged from its file
                    return _AGAIN
                try:
                    made = lay.result(self._halt)
                except BaseException:
                    stage.kill()  # the maker failed: the stager stops, and what it staged goes
                    raise
                stage.end(made.size)
            got = stage.wait(self._halt)
        finally:
            with self._lock:
                self._stages.pop(i, None)
        with self._lock:
            halted = self._halt.is_set()
            if not halted:
                self._staged[i] = got
        if halted:  # staged whole, but the import has ended without it
            _drop_staged(got)
            raise Cancelled()
        return _StageDone(got, started, digest, time.monotonic())

    def _open_source(self, i: int, lay: LayerFile, use_pipe: bool) -> _Source | None:
        """Wait until layer ``i`` can be read: its finished file, else its maker's FIFO (or the
        registry cache's stream through it) or the file its maker is writing. None where the
        store has the layer already."""
        while True:
            if self._halt.is_set():
                raise Cancelled()
            if lay.made.done():
                made = lay.made.result()
                known = self._known_id(i)
                if known and self._present.get(known) == made.diff_id:
                    return None
                return _Source(os.open(lay.path, os.O_RDONLY), False, made.size, None, False, made)
            src = _follow(lay, use_pipe)
            if src is not None:
                return src
            waits: list[Future[Any]] = [lay.made]
            if lay.streamed is not None and not lay.streamed.done():
                waits.append(lay.streamed)
            wait(waits, timeout=0.05, return_when="FIRST_COMPLETED")

    def _start_stage(self, lay: LayerFile, src: _Source) -> tuple[Stage, str]:
        """The stager of ``src`` (whose descriptor it takes), and the sha256 of a cached layer's
        file read beside it ("" where the maker's is trusted)."""
        stage: Stage | None = None
        try:
            group = lay.group

            def progress(n: int) -> None:
                self.on_progress(group, n)

            # this build's maker wrote it (a registry's bytes are untarred in a chroot, as podman does)
            made = src.made
            own = not src.streaming and (src.follow or (made is not None and made.source == "made"))
            piped = src.follow and stat.S_ISFIFO(os.fstat(src.fd).st_mode)
            # a stager fed through a pipe paces its maker: it runs at the makers' priority
            stage = self.store.stage(
                src.fd,
                follow=src.follow,
                size=None if src.size < 0 else src.size,
                name=group,
                tree=src.tree,
                own=own,
                progress=progress,
                nice=0 if piped else None,
            )
            # a layer made in this build was hashed by its maker as it was written; one taken
            # from the layer cache is hashed again here, beside its untar (OpenSSL's sha256)
            cached = made is not None and made.cached
            digest = _sha256_file(lay.path, self._halt) if not src.follow and cached else ""
        except BaseException:
            if stage is not None:
                stage.kill()
            raise
        finally:
            os.close(src.fd)
        return stage, digest

    def _register(self, i: int, stage: Stage) -> None:
        """Stage ``i`` known to the commit loop, or killed where the import has ended.

        The commit loop's finally sets _halt, then kills what it finds here under the lock: a
        stage registered after that sees _halt set, so nothing staged outlives a failed import."""
        with self._lock:
            self._stages[i] = stage
            halted = self._halt.is_set()
        if halted:
            with self._lock:
                self._stages.pop(i, None)
            stage.kill()
            raise Cancelled()

    def join(self) -> str:
        """Wait for every layer; the top layer's ID. Raises what the import raised."""
        assert self._thread is not None
        while self._thread.is_alive():
            self._thread.join(0.2)
        if self._error is not None:
            raise self._error
        return self.top

    def finish(self, config: bytes, manifest: bytes, ref: str) -> None:
        top = self.join()
        with self.store.locked():
            self.store.put_image(config, manifest, top, ref)

    def abort(self) -> None:
        self.cancel.set()
        self._halt.set()
        if self._thread is not None:
            while self._thread.is_alive():
                self._thread.join(0.2)


@dataclass(frozen=True)
class _Source:
    """Where a stager reads a layer: an open descriptor (the stager's to close), whether its
    maker is still writing it, its size (-1: not known yet), the tree its maker makes its files
    in, whether it is the registry cache's stream, and the maker's result where it had ended."""

    fd: int
    follow: bool
    size: int
    tree: Path | None
    streaming: bool
    made: LayerMeta | None


def _follow(lay: LayerFile, use_pipe: bool) -> _Source | None:
    """A layer still being made, read as it is written: through its FIFO (the maker's tee, or
    the registry cache's stream, unless that failed), else its maker's file; None where neither
    is open yet."""
    stream_failed = (
        lay.streamed is not None and lay.streamed.done() and lay.streamed.exception() is not None
    )
    if lay.pipe is not None and use_pipe and not stream_failed:
        try:  # the read end first: its maker waits for it before it writes
            fd = os.open(lay.pipe, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            pass
        else:
            os.set_blocking(fd, True)
            return _Source(fd, True, -1, lay.tree, lay.streamed is not None, None)
    if lay.writing is not None:
        try:
            return _Source(os.open(lay.writing, os.O_RDONLY), True, -1, lay.tree, False, None)
        except FileNotFoundError:  # not started, or made and moved into the cache meanwhile
            pass
    return None


class _Again:
    """``_stage_attempt``: the stream failed, stage the layer again from its file."""


_AGAIN = _Again()


@dataclass(frozen=True)
class _StageDone:
    """A layer staged whole: the stager's answer, when it started and ended (``time.monotonic``),
    and the sha256 of a cached layer's file read beside it ("" where the maker's is trusted)."""

    staged: Staged
    started: float
    digest: str
    ended: float


def _ended_well(fut: Future[bool] | None, halt: threading.Event) -> bool:
    """Wait for a stream's future: True where it ended with every check held."""
    assert fut is not None
    while not fut.done():
        if halt.is_set():
            raise Cancelled()
        wait([fut], timeout=0.1)
    return fut.exception() is None


def _sha256_file(path: Path, halt: threading.Event) -> str:
    """sha256 of the file (opened again: the stager shares the other descriptor's offset)."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = memoryview(bytearray(1 << 20))
        while n := f.readinto(buf):
            if halt.is_set():
                raise Cancelled()
            h.update(buf[:n])
    return "sha256:" + h.hexdigest()

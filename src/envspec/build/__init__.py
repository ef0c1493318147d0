"""The build stage: lock -> BuildPlan -> layer tars (cached by content key) -> OCI layout ->
outputs, push, and last the tag in containers-storage.

Where containers/storage's own tool is there (``engine.storage_cli()``), layers go into the store
beside the layer makers (``importer``); else skopeo imports the finished layout.

Atomic: everything happens in a work directory under the cache; the image gets its name only
at the very end (after every layer, the config and the manifest are stored), so a failed or
interrupted build (SIGINT, SIGKILL) leaves no tagged image (at most unnamed layers, which the
next build reuses), and child processes die with the build. Concurrent builds sharing a cache
are safe: files enter the cache by atomic rename, and equal keys mean equal bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from envspec.build import layers as layer_makers
from envspec.build.engine import BuildahEngine, Engine, RecordingEngine
from envspec.build.fetch import Cache, WheelFetcher, default_cache_dir
from envspec.build.importer import Importer, LayerFile
from envspec.build.oci import LayerBlob, export_layout, write_layout
from envspec.build.sbom import make_sbom
from envspec.errors import BuildError, HostError
from envspec.services import ENTRYPOINT_IN_IMAGE, render_service_files
from envspec.plan import MAKER_VERSIONS, BuildPlan, Layer, make_plan

__all__ = [
    "build", "BuiltImage", "LayerInfo", "Reporter", "BuildahEngine", "RecordingEngine", "Engine",
    "default_cache_dir",
]


@dataclass(frozen=True)
class LayerInfo:
    digest: str  # the blob digest; layers are uncompressed, so it equals diff_id
    diff_id: str
    size: int
    group: str
    cached: bool
    key: str = ""


@dataclass(frozen=True)
class BuiltImage:
    image: str  # the tag in containers-storage ("" when not tagged)
    digest: str  # manifest digest: the image's identity
    layers: tuple[LayerInfo, ...]
    config_digest: str = ""
    pushed: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "digest": self.digest,
            "config": self.config_digest,
            "layers": [asdict(lay) for lay in self.layers],
            "pushed": list(self.pushed),
            "outputs": list(self.outputs),
        }


class Reporter:
    """Progress events with no-op defaults; the CLI subclasses it with rich progress bars."""

    def fetching(self, name: str, filename: str, size: int) -> None: ...
    def fetched(self, name: str, filename: str, path: Path) -> None: ...
    def layer_started(self, group: str, pins: int, cached: bool) -> None: ...
    def layer_built(self, layer: LayerInfo) -> None: ...
    def importing(self, group: str, sent: int) -> None: ...  # bytes of the layer sent to the store so far
    def committing(self, ref: str, digest: str) -> None: ...
    def pushed(self, dest: str, digest: str) -> None: ...


def _die_with_parent_initializer(niceness: int = 0) -> None:
    from envspec.build.engine import _die_with_parent

    _die_with_parent()
    if niceness:
        os.nice(niceness)


def _cached_meta(cache: Cache, lay: Layer) -> dict | None:
    meta_path, tar = cache.layer_meta(lay.key), cache.layer_tar(lay.key)
    try:
        meta = json.loads(meta_path.read_text())
        if tar.stat().st_size == meta["size"]:
            return meta
    except (OSError, ValueError, KeyError):
        pass
    return None


def _store_layer(cache: Cache, lay: Layer, tmp_tar: Path, result: dict) -> dict:
    meta = {"key": lay.key, "group": lay.group, "maker": MAKER_VERSIONS[lay.group], "diff_id": result["diff_id"],
            "size": result["size"], "entries": result["entries"],
            "pins": [f"{p.name}=={p.version}" for p in lay.pins], "duplicates": result.get("duplicates", [])}
    with cache.locked("layer-" + lay.key.split(":", 1)[-1]):
        os.replace(tmp_tar, cache.layer_tar(lay.key))
        tmp_meta = tmp_tar.with_suffix(".json")
        tmp_meta.write_text(json.dumps(meta, sort_keys=True, indent=1))
        os.replace(tmp_meta, cache.layer_meta(lay.key))
    return meta


def _make_rootfs(plan: BuildPlan, cache: Cache, rootfs: Path, reporter: Reporter) -> Path | None:
    if not plan.debs:
        return None
    try:
        from envspec import debian
    except ImportError as e:
        raise HostError(f"this envspec cannot build a Debian base ({e})", hint="update envspec") from None
    pins = list(plan.debs)
    for pin in pins:
        reporter.fetching(pin.name, pin.filename, pin.size)
    # Configured mirrors first (snapshot from the environment, then ENVSPEC_DEBIAN_MIRROR), then
    # the lock's canonical archive.
    extra = [os.environ.get("ENVSPEC_DEBIAN_MIRROR", "")]
    mirrors = debian.mirror_list((plan.lock.debian.mirror if plan.lock.debian else "") or debian.CANONICAL_MIRROR, mirrors=[m for m in extra if m])
    paths = debian.fetch_debs(pins, mirrors=mirrors, cache_dir=cache.root / "debs")
    for pin in pins:
        reporter.fetched(pin.name, pin.filename, Path(paths[pin.name]))
    debian.make_rootfs(pins, {k: Path(v) for k, v in paths.items()}, rootfs, user=plan.lock.runtime.user,
                       uid=plan.lock.runtime.uid)
    return rootfs


SCRATCH_PREFIX = "envspec-scratch-"


def _scratch_dir(work: Path, need: int) -> Path:
    """Where the throw-away root filesystem is laid down: a tmpfs (``ENVSPEC_SCRATCH``, default
    /dev/shm) where it has room for ``need`` bytes twice over, else the work directory. Creating
    thousands of small files costs a third of the time there (h100 base: 3.6 s against 10.0 s
    on this project's ext4 disk, docs/benchmarks.md). Removed with the rootfs; a killed build's
    is removed by the next one (``_clean_stale_scratch``)."""
    base = Path(os.environ.get("ENVSPEC_SCRATCH", "/dev/shm"))
    try:
        st = os.statvfs(base)
        if os.access(base, os.W_OK) and st.f_bavail * st.f_frsize > 2 * need:
            return Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=base))
    except OSError:
        pass
    return work


def _clean_stale_scratch() -> None:
    base = Path(os.environ.get("ENVSPEC_SCRATCH", "/dev/shm"))
    try:
        entries = list(base.glob(SCRATCH_PREFIX + "*"))
    except OSError:
        return
    from envspec.build.fetch import _pid_alive

    for d in entries:
        pid = d.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def build(lock: Any, *, engine: Engine, cache_dir: str | Path | None = None, reporter: Reporter | None = None,
          tag: str | None = None, outputs: Sequence[str] = (), push: str | None = None, no_cache: bool = False,
          mirrors: Sequence[Any] | None = None, spec_mirrors: Sequence[str] = (), workers: int | None = None,
          verify_dir: Path | None = None) -> BuiltImage:
    """Build the lock's image. ``lock``: the lock stage's model, the dict of a lockfile, or a
    ``BuildPlan``. ``tag=""`` builds without tagging (outputs/push only).
    Raises BuildError/HashMismatch (exit 4), SourceError (3), HostError (5), PlanError (2)."""
    reporter = reporter or Reporter()
    plan = lock if isinstance(lock, BuildPlan) else make_plan(lock)
    cache = Cache(cache_dir)
    cache.clean_stale()
    _clean_stale_scratch()
    ref = plan.tag if tag is None else tag
    workers = workers or min(2, os.cpu_count() or 1)
    if mirrors is None:
        from envspec import sources

        s = sources.discover()
        mirrors = list(s.mirrors)
        if spec_mirrors:
            mirrors = [sources._as_mirror(u, "spec") for u in spec_mirrors] + mirrors
    work = cache.workdir()
    try:
        return _build(plan, engine=engine, cache=cache, reporter=reporter, ref=ref, outputs=outputs, push=push,
                      no_cache=no_cache, mirrors=mirrors, workers=workers, work=work, verify_dir=verify_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _done_future(result: dict) -> Future:
    fut: Future = Future()
    fut.set_result(result)
    return fut


def _build(plan: BuildPlan, *, engine: Engine, cache: Cache, reporter: Reporter, ref: str, outputs: Sequence[str],
           push: str | None, no_cache: bool, mirrors: Sequence[Any], workers: int, work: Path,
           verify_dir: Path | None) -> BuiltImage:
    metas: dict[str, dict] = {}
    todo: list[Layer] = []
    for lay in plan.layers:
        meta = None if (no_cache or not lay.cacheable) else _cached_meta(cache, lay)
        if meta is not None:
            metas[lay.key] = {**meta, "cached": True}
        elif lay.group != "envspec":
            todo.append(lay)

    # Every layer's tar as a LayerFile: where it is (or will be) and the future of its maker.
    made: dict[str, Future] = {key: _done_future(m) for key, m in metas.items()}
    for lay in todo:
        made[lay.key] = Future()
    top = plan.layer("envspec")
    assert top is not None
    made[top.key] = Future()
    files = [LayerFile(lay.group, cache.layer_tar(lay.key), made[lay.key]) for lay in plan.layers
             if lay.group != "envspec"]
    files.append(LayerFile("envspec", work / "envspec-layer.tar", made[top.key]))

    # Into containers-storage beside the makers where its own tool is there and there is work;
    # else (all cached, or no such tool) after the layout is written.
    store = getattr(engine, "storage_cli", lambda: None)() if ref else None
    importer = None
    if store is not None and todo:
        importer = Importer(store, files, on_progress=reporter.importing)  # started once the makers are forked
    try:
        return _make_and_tag(plan, engine=engine, cache=cache, reporter=reporter, ref=ref, outputs=outputs,
                             push=push, mirrors=mirrors, workers=workers, work=work, verify_dir=verify_dir,
                             metas=metas, todo=todo, made=made, store=store, files=files, importer=importer)
    except BaseException:
        if importer is not None:
            importer.abort()
        raise


def _settle(fut: Future, fn: Callable[[], dict]) -> dict:
    """Run ``fn`` and hand its result (or error) to ``fut`` too (the importer waits on it)."""
    try:
        res = fn()
    except BaseException as e:
        fut.set_exception(e)
        raise
    fut.set_result(res)
    return res


def _make_and_tag(plan: BuildPlan, *, engine: Engine, cache: Cache, reporter: Reporter, ref: str,
                  outputs: Sequence[str], push: str | None, mirrors: Sequence[Any], workers: int, work: Path,
                  verify_dir: Path | None, metas: dict[str, dict], todo: list[Layer], made: dict[str, Future],
                  store: Any, files: list[LayerFile], importer: Importer | None) -> BuiltImage:
    # 1. fetch what the layers to build need (wheels; debs come with the rootfs)
    need = [w for lay in todo for w in lay.wheels]
    fetcher = WheelFetcher(cache, mirrors)
    try:
        paths = fetcher.fetch_all(
            need,
            on_start=lambda p: reporter.fetching(p.name, p.filename, p.size),
            on_done=lambda p, path: reporter.fetched(p.name, p.filename, path),
        )
    except BaseException as e:
        for lay in todo:
            made[lay.key].set_exception(e)
        raise

    # 2. wheel layers in worker processes (largest first), the base layer meanwhile here
    wheel_todo = sorted((lay for lay in todo if lay.wheels), key=lambda lay: -sum(w.size for w in lay.wheels))
    platform_json = plan.platform.model_dump_json()
    futures = {}
    pool = None
    if wheel_todo:
        pool = ProcessPoolExecutor(max_workers=max(1, min(workers, len(wheel_todo))),
                                   initializer=_die_with_parent_initializer,
                                   initargs=(int(os.environ.get("ENVSPEC_MAKER_NICE", "0")),))
    try:
        for lay in wheel_todo:
            reporter.layer_started(lay.group, len(lay.wheels), False)
            out = work / f"{lay.group}.tar"
            files_ = [(w.filename, str(paths[w.sha256])) for w in lay.wheels]
            futures[lay.key] = (lay, out, pool.submit(layer_makers.wheel_layer_job, (files_, platform_json, str(out))))
        if importer is not None:  # after the fork of the worker processes: no thread of ours is copied into them
            importer.start()
        base = plan.layer("base")
        if base is not None and base in todo:
            reporter.layer_started("base", len(base.debs), False)

            def make_base() -> dict:
                scratch = _scratch_dir(work, need=8 * sum(d.size for d in plan.debs))
                try:
                    rootfs = _make_rootfs(plan, cache, scratch / "rootfs", reporter)
                    out = work / "base.tar"
                    res = layer_makers.make_base_layer(plan, rootfs, out)
                finally:
                    shutil.rmtree(scratch if scratch != work else scratch / "rootfs", ignore_errors=True)
                return _store_layer(cache, base, out, res)

            metas[base.key] = {**_settle(made[base.key], make_base), "cached": False}
        for key, (lay, out, fut) in futures.items():
            def finished(lay=lay, out=out, fut=fut) -> dict:
                try:
                    res = fut.result()
                except Exception as e:  # noqa: BLE001 (a wheel that installer rejects)
                    raise BuildError(f"installing the {lay.group} layer's wheels failed: {e}",
                                     step=f"layer {lay.group}",
                                     hint="the wheel may be broken or not for this platform; re-lock") from e
                return _store_layer(cache, lay, out, res)

            metas[key] = {**_settle(made[key], finished), "cached": False}
    except BaseException as e:
        for lay in todo:
            if not made[lay.key].done():
                made[lay.key].set_exception(e)
        raise
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    # 3. the envspec layer: lock, SBOM, verifier, entrypoint (always made; it is tiny)
    top = plan.layer("envspec")
    assert top is not None
    reporter.layer_started("envspec", 0, False)
    sbom = make_sbom(plan)
    top_tar = work / "envspec-layer.tar"

    def make_top() -> dict:
        out = work / "envspec.tar"
        res = layer_makers.make_envspec_layer(plan, sbom, out, verify_dir=verify_dir,
                                              service_files=render_service_files(plan.lock))
        os.replace(out, top_tar)
        return res

    res = _settle(made[top.key], make_top)
    metas[top.key] = {"diff_id": res["diff_id"], "size": res["size"], "cached": False, "path": str(top_tar)}

    blobs: list[LayerBlob] = []
    infos: list[LayerInfo] = []
    for lay in plan.layers:
        m = metas[lay.key]
        path = Path(m["path"]) if "path" in m else cache.layer_tar(lay.key)
        blobs.append(LayerBlob(group=lay.group, key=lay.key, path=path, digest=m["diff_id"], size=m["size"],
                               description=f"{len(lay.pins)} pins" if lay.pins else ""))
        info = LayerInfo(digest=m["diff_id"], diff_id=m["diff_id"], size=m["size"], group=lay.group,
                         cached=bool(m["cached"]), key=lay.key)
        infos.append(info)
        reporter.layer_built(info)

    # 4. the OCI layout, then outputs, push, and last the tag
    has_debs = bool(plan.debs)
    deb_names = {d.name for d in plan.debs}
    entrypoint: list[str] = []
    cmd: list[str] = []
    if has_debs:
        entrypoint = ([ "/usr/bin/tini", "--"] if "tini" in deb_names else []) + [ENTRYPOINT_IN_IMAGE]
    rt = plan.lock.runtime
    user = rt.user if has_debs else f"{rt.uid}:{rt.uid}"
    oci_dir = work / "oci"
    ref_name = plan.lock.short_hash or "latest"
    digest, _msize, config = write_layout(oci_dir, plan, blobs, entrypoint=entrypoint, cmd=cmd, user=user,
                                          ref_name=ref_name)
    from envspec.build.oci import sha256_bytes

    done_outputs = []
    for dest in outputs:
        if dest.startswith("oci:"):  # ours to write: hardlinks, no copy of gigabytes
            path, _, name = dest[4:].partition(":")
            try:
                export_layout(oci_dir, Path(path), name)
            except OSError as e:
                raise BuildError(f"cannot write {dest}: {e}", step="output") from e
        else:
            engine.copy(oci_dir, dest)
        done_outputs.append(dest)
    pushed = []
    if push:
        engine.push(oci_dir, push)
        pushed.append(push)
        reporter.pushed(push, digest)
    if ref:
        reporter.committing(ref, digest)
        if importer is None and store is not None and not _already_there(engine, ref, digest):
            importer = Importer(store, files, on_progress=reporter.importing).start()
        if importer is not None:
            importer.finish(config, (oci_dir / "blobs" / "sha256" / digest.split(":", 1)[1]).read_bytes(), ref)
        elif store is None and not _already_there(engine, ref, digest):
            with cache.locked("import"):
                engine.import_image(oci_dir, ref)
    return BuiltImage(image=ref, digest=digest, layers=tuple(infos), config_digest=sha256_bytes(config),
                      pushed=tuple(pushed), outputs=tuple(done_outputs))


def _already_there(engine: Engine, ref: str, digest: str) -> bool:
    get = getattr(engine, "image_digest", None)
    if get is None:
        return False
    try:
        return engine.exists(ref) and get(ref) == digest
    except BuildError:
        return False

"""A lock with a section per platform -> one image per platform -> one OCI image index.

``build_index(lock, ...)`` builds each platform's view of the lock (``Lockfile.for_platform``) with
``build()``, as a one-platform lock is built (same layer order, same content keys: an arm64 image
is made on amd64 without emulation), then writes one OCI image index (a manifest list) whose
manifests name their ``platform`` ({architecture amd64|arm64, os linux}). What ``--push``,
``--output oci:DIR`` and ``--output oci-archive:FILE`` carry is that index, with every image;
its digest is the build's identity, reproducible as each image's is (the index is canonical JSON
of the manifests' digests and sizes, the lock's name and hash, and SOURCE_DATE_EPOCH).

A push attaches to each platform's image what a one-platform push attaches (the registry stage's
``attach``, ``options.registry``: its attestations and, with a signing key, its signature, for its own
manifest digest and its own view of the lock), then, with a key, the index's signature (its ``sign``:
``sha256-<index hex>.sig``), last.

Every platform is built (untagged) before any is named: a platform whose build fails leaves no tag
(the images then go into containers-storage from the layers just made, each checked to be the same
bytes). In containers-storage each platform's image is tagged on its own: the lock's tag with the
architecture after it (``localhost/envspec/NAME:HASH-amd64``, ``...-arm64``; ``--tag REF`` gives
``REF-amd64`` ...). containers-storage holds images, not the index; ``envspec run`` of the lock
takes the host's platform's image.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from envspec.cache.store import Cache
from envspec.errors import BuildError, UsageError
from envspec.image.builder import build
from envspec.image.engine import Engine, RecordingEngine
from envspec.image.making import BuildOptions, registry_stage
from envspec.image.oci import MT_INDEX, created_at, export_layout, write_index
from envspec.image.preview import Preview, preview
from envspec.image.report import BuiltImage, Reporter
from envspec.lock import OCI_ARCH, Lockfile
from envspec.plan import make_plan
from envspec.sources import Mirror


@dataclass(frozen=True)
class BuiltIndex:
    """The image index of a multi-platform lock and the images it names, in the lock's order."""

    digest: str  # the index's: what pushes and OCI outputs carry
    images: tuple[tuple[str, BuiltImage], ...]  # (platform name, its image)
    pushed: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    seconds: float = 0.0
    attached: tuple[
        str, ...
    ] = ()  # the index's own signature (each image's artifacts: its ``attached``)

    @property
    def image(self) -> str:
        """The host-independent name: none (each platform's image has its own tag)."""
        return ""

    def to_json(self) -> dict[str, object]:
        return {
            "digest": self.digest,
            "media_type": MT_INDEX,
            "platforms": [
                {
                    "platform": name,
                    "os": name.split("-", 1)[0],
                    "architecture": _arch(name),
                    **built.to_json(),
                }
                for name, built in self.images
            ],
            "pushed": list(self.pushed),
            "attached": list(self.attached),
            "outputs": list(self.outputs),
            "seconds": round(self.seconds, 3),
        }


def _arch(platform: str) -> str:
    arch = platform.split("-", 1)[1]
    return OCI_ARCH.get(arch, arch)


def platform_tag(tag: str | None, view: Lockfile) -> str | None:
    """The containers-storage name of one platform's image: ``None`` -> the view's own tag
    (``NAME:HASH-ARCH``), ``""`` -> untagged, ``REF`` -> ``REF-ARCH`` (``REF:latest-ARCH`` for a
    reference without a tag)."""
    if not tag:
        return tag
    last = tag.rsplit("/", 1)[-1]
    return (
        f"{tag}-{view.platform.oci_arch}"
        if ":" in last
        else f"{tag}:latest-{view.platform.oci_arch}"
    )


def check_options(options: BuildOptions) -> None:
    """What an image index cannot carry, refused before anything is built (exit 2)."""
    if options.push:
        registry_stage(options)
    for dest in options.outputs:
        if dest.startswith("docker-archive:"):
            raise UsageError(
                f"--output {dest}: a docker archive holds one platform's image, not an image index",
                hint="use oci:DIR or oci-archive:FILE for the index, or build one platform's lock "
                "(a spec with one [target].platforms entry) for docker load",
                reference="index-output-unsupported",
            )


def _build_untagged(
    view: Lockfile,
    layout: Path,
    engine: Engine,
    cache: Cache,
    mirrors: Sequence[Mirror],
    options: BuildOptions,
    reporter: Reporter,
) -> BuiltImage:
    """One platform's image, into the index's ``layout`` under its architecture: not tagged,
    pushed or cached to a registry (the index does that once every platform is made)."""
    opts = dataclasses.replace(
        options,
        tag="",
        outputs=(f"oci:{layout}:{view.platform.oci_arch}",),
        push=None,
        cache_to="",
    )
    return build(make_plan(view), engine, cache, mirrors, options=opts, reporter=reporter)


def build_index(
    lock: Lockfile,
    engine: Engine,
    cache: Cache,
    mirrors: Sequence[Mirror],
    *,
    options: BuildOptions,
    reporter: Reporter | None = None,
) -> BuiltIndex:
    """Build every platform of ``lock`` and the image index over them; deliver the index to
    ``options.outputs`` and ``options.push``. Raises as ``build()`` does, ``UsageError`` first for
    options an index cannot take."""
    check_options(options)
    reporter = reporter or Reporter()
    t0 = time.monotonic()
    work = cache.workdir()
    layout = work / "index"
    views = lock.views()
    try:
        # every platform's image made first, none tagged: a platform that fails to build leaves no tag
        images = [
            (
                view.platform_names[0],
                _build_untagged(view, layout, engine, cache, mirrors, options, reporter),
            )
            for view in views
        ]
        digest, _size = write_index(
            layout,
            [(name.split("-", 1)[0], _arch(name), built.digest) for name, built in images],
            ref_name=lock.short_hash,
            annotations={
                "org.opencontainers.image.created": created_at(),
                "org.opencontainers.image.title": lock.meta.name,
                "org.opencontainers.image.revision": lock.meta.content_hash,
                "io.envspec.lock-hash": lock.meta.content_hash,
            },
        )
        outputs, pushed = deliver_index(engine, layout, digest, options, reporter)
        attached: tuple[str, ...] = ()
        if options.push:
            images, attached = attest_index(
                engine, work / "attest", views, images, digest, options, reporter
            )
        images = _tag_all(views, images, engine, cache, mirrors, options, reporter)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return BuiltIndex(
        digest=digest,
        images=tuple(images),
        pushed=pushed,
        outputs=outputs,
        seconds=time.monotonic() - t0,
        attached=attached,
    )


def attest_index(
    engine: Engine,
    work: Path,
    views: list[Lockfile],
    images: list[tuple[str, BuiltImage]],
    digest: str,
    options: BuildOptions,
    reporter: Reporter,
) -> tuple[list[tuple[str, BuiltImage]], tuple[str, ...]]:
    """Once the index and its images are pushed to ``options.push``: each platform's image gets what
    ``build()`` attaches to a one-platform push (the registry stage's ``attach``: the provenance and
    SBOM of its own view of the lock, for its own manifest digest, and with a key its signature),
    then, with a key, the index its signature naming the index digest, last. Returns the images
    with their ``attached`` and the index's signature reference (none without a key)."""
    assert options.push
    registry = registry_stage(options)
    out = []
    for view, (name, built) in zip(views, images):
        pushed = registry.attach(
            engine.push, work / view.platform.oci_arch, make_plan(view), built.digest, options.push
        )
        for ref, d in pushed:
            reporter.pushed(ref, d)
        out.append((name, dataclasses.replace(built, attached=tuple(r for r, _ in pushed))))
    if not registry.signs:
        return out, ()
    ref, sig_digest = registry.sign(engine.push, work / "index", digest, options.push)
    reporter.pushed(ref, sig_digest)
    return out, (ref,)


def _tag_all(
    views: list[Lockfile],
    images: list[tuple[str, BuiltImage]],
    engine: Engine,
    cache: Cache,
    mirrors: Sequence[Mirror],
    options: BuildOptions,
    reporter: Reporter,
) -> list[tuple[str, BuiltImage]]:
    """Once every platform is built: each image into containers-storage under its tag (``build()``
    again, from the layers just made; the same bytes, checked), and the layers to ``--cache-to``."""
    out = []
    for view, (name, first) in zip(views, images):
        tag = platform_tag(options.tag, view)
        if tag == "" and not options.cache_to:
            out.append((name, first))
            continue
        opts = dataclasses.replace(
            options, tag=tag, outputs=(), push=None, no_cache=False, cache_from=""
        )
        again = build(make_plan(view), engine, cache, mirrors, options=opts, reporter=reporter)
        # the stored image's digest (uncompressed layers): the same whether or not this build compresses
        if again.store_digest != first.store_digest:
            raise BuildError(
                f"{name}: the image made again from the cache has digest {again.store_digest}, the "
                f"first {first.store_digest}",
                step="commit",
                hint="the layer cache holds other bytes than were made: "
                "`envspec cache gc` and build again",
            )
        out.append(
            (
                name,
                dataclasses.replace(
                    first,
                    image=again.image,
                    store_digest=again.store_digest,
                    phases=first.phases + again.phases,
                    seconds=first.seconds + again.seconds,
                    cache_to=again.cache_to,
                    cached_to=again.cached_to,
                ),
            )
        )
    return out


@dataclass(frozen=True)
class IndexPreview:
    """``build --dry-run`` of a multi-platform lock (``preview_all``): each platform's image as it
    is built, then the engine verbs of the index; ``to_json`` is what ``--json`` prints."""

    push: str | None
    outputs: tuple[str, ...]
    engine: list[list[str]]
    platforms: tuple[tuple[str, Preview], ...]  # (platform name, its image's preview)

    def to_json(self) -> dict[str, object]:
        return {
            "index": True,
            "push": self.push,
            "outputs": list(self.outputs),
            "engine": self.engine,
            "platforms": [{"platform": name} | one.to_json() for name, one in self.platforms],
        }


def preview_all(lock: Lockfile, cache: Cache, options: BuildOptions) -> IndexPreview:
    """``build --dry-run`` of a multi-platform lock: each platform's image as it is built (tagged,
    no push or output of its own: ``preview``), then the index (``preview_index``)."""
    return IndexPreview(
        push=options.push,
        outputs=tuple(options.outputs),
        engine=preview_index(lock, options),
        platforms=tuple(
            (
                view.platform_names[0],
                preview(
                    make_plan(view),
                    cache,
                    options=dataclasses.replace(
                        options, tag=platform_tag(options.tag, view), push=None, outputs=()
                    ),
                ),
            )
            for view in lock.views()
        ),
    )


def preview_index(lock: Lockfile, options: BuildOptions) -> list[list[str]]:
    """``build --dry-run`` of a multi-platform lock: the engine verbs after every platform's image
    is built (each tagged on its own: its ``preview``), in the order ``build_index`` runs them: the
    outputs, the push of the index with every image, then each platform's attestations (and, with
    a key, signature) for its own digest, then the index's signature, last. Nothing is run."""
    engine = RecordingEngine()
    comp = options.compression if options.compression != "none" else ""
    layout = Path(f"(index layout{', ' + comp if comp else ''})")
    for dest in options.outputs:
        engine.copy(layout, dest, index=True)
    if options.push:
        engine.push(layout, options.push, index=True)
        registry = registry_stage(options)
        for view in lock.views():
            for what, dest in registry.refs(
                options.push, f"sha256:({view.platform.oci_arch} digest)"
            ):
                engine.push(Path(f"({what}, {view.platform_names[0]})"), dest)
        if registry.signs:
            index_sig = [
                dest
                for what, dest in registry.refs(options.push, "sha256:(index digest)")
                if what == "signature"
            ]
            engine.push(Path("(index signature)"), index_sig[0])
    return [[str(a) for a in c] for c in engine.calls]


def deliver_index(
    engine: Engine, layout: Path, digest: str, options: BuildOptions, reporter: Reporter
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The index of ``layout`` to ``options.outputs`` (oci:DIR: hardlinked, ``oci-archive:``: by the
    engine) and ``options.push`` (every image, then the index, digests kept)."""
    for dest in options.outputs:
        if dest.startswith("oci:"):
            path, _, name = dest[4:].partition(":")
            try:
                export_layout(layout, Path(path), name)
            except OSError as e:
                raise BuildError(f"cannot write {dest}: {e}", step="output") from e
        else:
            engine.copy(layout, dest, index=True)
    if options.push:
        engine.push(layout, options.push, index=True)
        reporter.pushed(options.push, digest)
    return tuple(options.outputs), ((options.push,) if options.push else ())

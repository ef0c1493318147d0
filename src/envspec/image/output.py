"""The image's config and manifest over its layers (``write_image``), one OCI layout of it, and the
outputs it is delivered to: the store's tag, ``oci:``, ``oci-archive:``, ``docker-archive:``, a
push (``deliver``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from envspec.errors import BuildError
from envspec.image.compress import (
    Compression,
)
from envspec.image.engine import (
    Engine,
)
from envspec.image.making import BuildOptions
from envspec.image.oci import LayerBlob, export_layout, write_layout
from envspec.image.report import LayerInfo, Reporter
from envspec.plan import BuildPlan, Layer
from envspec.services import ENTRYPOINT_IN_IMAGE


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

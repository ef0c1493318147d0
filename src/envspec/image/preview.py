"""``build --dry-run``: what a build would make, take from a cache, fetch, build from source and
deliver, read from the plan and the cache without making anything (``preview``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

from envspec.cache.store import Cache
from envspec.image.compress import (
    Compression,
)
from envspec.image.engine import (
    RecordingEngine,
)
from envspec.image.making import BuildOptions, Layers, image_plan, registry_stage
from envspec.image.output import Image, deliver
from envspec.image.report import Reporter
from envspec.plan import BuildPlan, Layer
from envspec.wheels import cost, sdist


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
    estimate: str = ""  # where not cached: its build time here, in words (``cost.estimate``)


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
    plan, _ = image_plan(plan, Reporter(), options)
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
    platform, root, jobs = layers.plan.platform, layers.cache.root, cost.default_jobs()
    out = []
    for w in (w for lay in layers.todo for w in lay.wheels):
        if w.source is None:
            continue
        cached = sdist.cached_wheel(sdist.derivation_of(w, platform), root) is not None
        said = (
            ""
            if cached
            else cost.say_estimate(
                cost.estimate(w, root, cost.sdist_at_hand(w, layers.cache), jobs)
            )
        )
        out.append(
            SourceBuildPreview(
                name=w.name,
                version=w.version,
                sdist=w.filename,
                key=w.source.key,
                cached=cached,
                estimate=said,
            )
        )
    return tuple(out)


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

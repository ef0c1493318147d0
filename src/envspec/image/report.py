"""What a build says as it goes and gives at its end: its phases (``Phase``) and their clock
(``Clock``), the ``Reporter`` the CLI's progress bars subclass, a layer as the build reports it
(``LayerInfo``), and the ``BuiltImage``."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path


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

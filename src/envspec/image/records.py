"""What the layer stage hands on about a layer, typed: what a maker returns (``MadeLayer``), what the
local cache keeps beside a layer's tar and blob (``LayerRecord``, ``BlobRecord``: JSON files, read
back at the next build), and what a build knows of each of its layers wherever it came from
(``LayerMeta``: made here, the local cache, the store, a registry layer cache), and a registry
layer cache's entry of a layer (``RegistryEntry``: what a build fetches or streams)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict


@dataclass(frozen=True)
class MadeBlob:
    """A compressed blob a maker wrote beside its tar (``TarWriter`` with a compression)."""

    digest: str
    size: int
    path: str


class Pyc(BaseModel):
    """The .pyc a maker compiled into a layer."""

    model_config = ConfigDict(frozen=True)
    files: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class MadeLayer:
    """What a layer maker returns (from a worker process: picklable)."""

    diff_id: str
    size: int  # of the tar
    entries: int
    duplicates: tuple[str, ...] = ()  # paths two wheels both install (the later one wins)
    blob: MadeBlob | None = None
    pyc: Pyc = Pyc()


class BlobRecord(BaseModel):
    """A layer's compressed blob: ``<cache>/layers/<key>.<compressor>.json`` beside the blob, or
    the envspec layer's (not cached: no key)."""

    model_config = ConfigDict(frozen=True)
    key: str = ""
    compressor: str
    media_type: str
    digest: str
    size: int


class LayerRecord(BaseModel):
    """A cached layer: ``<cache>/layers/<key>.json`` beside its tar, written last (its presence
    says the tar is whole); a registry cache entry carries it too (``regcache``: its "meta")."""

    model_config = ConfigDict(frozen=True)
    key: str = ""
    group: str = ""
    maker: str = ""  # plan.MAKER_VERSIONS of the group when made
    diff_id: str
    size: int
    entries: int = 0
    pins: list[str] = []
    duplicates: list[str] = []
    pyc: Pyc = Pyc()


LayerSource = Literal["made", "local", "store", "registry"]


@dataclass(frozen=True)
class LayerMeta:
    """A layer of this build once it is there: made here, taken from the local cache, found in
    containers-storage, or fetched from a registry layer cache; its blob of this build's
    compressor where there is one (None: the image carries its tar)."""

    diff_id: str
    size: int  # of the tar
    source: LayerSource
    blob: BlobRecord | None = None
    record: LayerRecord | None = None  # the cache's record, where the layer is in the cache

    @property
    def cached(self) -> bool:
        return self.source != "made"


@dataclass(frozen=True)
class RegistryEntry:
    """A registry layer cache's entry of a layer, read from its manifest and checked
    (``registry.regcache.check_entry``): what the blob must be and what it must decompress to."""

    ref: str  # REPO:TAG
    manifest_digest: str
    key: str
    diff_id: str
    diff_size: int
    compressor: str
    media_type: str
    digest: str  # the blob's
    size: int
    record: LayerRecord  # the layer's record, as the local cache keeps it (its group: the plan's)

    def local_record(self, group: str) -> LayerRecord:
        """The local cache's record of this entry's layer, of the plan's ``group``."""
        return self.record.model_copy(update={"group": group})

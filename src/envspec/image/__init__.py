"""The image stage: ``BuildPlan`` -> layer tars (cached by content key) -> OCI layout -> outputs,
push (through the engine; what goes beside a push, and the registry layer cache, are the registry
stage's, given as ``BuildOptions.registry``), and last the tag in containers-storage.

One module per part: ``builder`` (``build`` and its run, step by step), ``making`` (the layers of
a build made or taken from a cache: ``Layers``, ``BuildOptions``, compression of layers),
``report`` (what a build says as it goes, and the ``BuiltImage`` it gives), ``output`` (the
image's config and manifest, its layout and the outputs it is delivered to), ``preview``
(``build --dry-run``); below them the layer makers (``layers``), the engine, the importer, OCI
layouts, compression, the SBOM and the image index. This file only says what the stage gives.
"""

from envspec.image.builder import build
from envspec.image.compress import DEFAULT as DEFAULT_COMPRESSION
from envspec.image.engine import BuildahEngine, Engine, RecordingEngine
from envspec.image.making import (
    BuildOptions,
    LayerCache,
    Layers,
    RegistrySide,
    compress_layers,
    compress_now,
    store_fetched,
)
from envspec.image.output import docker_archive_named
from envspec.image.preview import LayerPreview, Preview, preview
from envspec.image.report import BuiltImage, LayerInfo, Phase, Reporter

__all__ = [
    "build",
    "preview",
    "Preview",
    "LayerPreview",
    "compress_layers",
    "compress_now",
    "docker_archive_named",
    "store_fetched",
    "DEFAULT_COMPRESSION",
    "BuildOptions",
    "BuiltImage",
    "LayerCache",
    "LayerInfo",
    "Layers",
    "Phase",
    "RegistrySide",
    "Reporter",
    "BuildahEngine",
    "RecordingEngine",
    "Engine",
]

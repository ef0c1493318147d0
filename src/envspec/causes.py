"""The facts of a resolution: why a torch build fits or does not, why a package or a Debian package
cannot be had. The resolver (``resolve``, ``debian.closure``) states them, ``errors.ResolutionImpossible``
carries them, and ``explain`` words them; nothing here words anything.

Each kind of fact is a class of its own, with ``kind`` (the name JSON and the docs use) fixed per
class. Every fact may say which spec key it comes from (``where``: "[target].gpus[0]
(specs/x.toml:5)"), and, for a torch build, the release and the build it judges (``torch``,
``build``), which the resolver adds once it knows them (``dataclasses.replace``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

CauseKind = Literal[
    "variant-not-requested",
    "python-unsupported",
    "arch-missing",
    "unknown-cuda",
    "driver-too-old",
    "driver-past-gpu",
    "arch-fits",
    "driver-floor",
    "release-needs-review",
    "cuda-not-offered",
    "suggestion",
    "no-wheel-for-platform",
    "no-wheel",
    "python-conflict",
    "sdist-metadata-failed",
    "torch-side",
    "python-missing",
    "package-held-back",
    "no-cuda-compiler",
    "unknown-debian-package",
    "invalid-debian-package",
    "debian-unsatisfiable",
]


@dataclass(frozen=True, kw_only=True)
class Cause:
    kind: ClassVar[CauseKind]
    where: str = ""  # the spec key and line behind it
    torch: str = ""  # the torch release judged
    build: str = ""  # the torch build judged (explain.newer_lines: which builds lack what)


# -- a torch build against the spec ---------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class VariantNotRequested(Cause):
    kind: ClassVar[CauseKind] = "variant-not-requested"
    variant: str
    wanted: str  # what [torch].cuda asks for: "cpu", "a CUDA build", "12.8"


@dataclass(frozen=True, kw_only=True)
class PythonUnsupported(Cause):
    kind: ClassVar[CauseKind] = "python-unsupported"
    python: str
    supported: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class ArchMissing(Cause):
    """The build has neither SASS nor PTX that runs on a target GPU."""

    kind: ClassVar[CauseKind] = "arch-missing"
    gpu: str  # its short name
    gpu_name: str
    cc: str
    variant: str
    arch_list: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class UnknownCuda(Cause):
    kind: ClassVar[CauseKind] = "unknown-cuda"
    cuda: str


@dataclass(frozen=True, kw_only=True)
class DriverTooOld(Cause):
    """[target].driver is below the floor of the build's CUDA."""

    kind: ClassVar[CauseKind] = "driver-too-old"
    driver: str
    needed: str
    cuda: str
    policy: str
    variant: str


@dataclass(frozen=True, kw_only=True)
class DriverPastGpu(Cause):
    """The build's CUDA needs a driver newer than a target GPU's last driver branch."""

    kind: ClassVar[CauseKind] = "driver-past-gpu"
    gpu: str
    gpu_name: str
    needed: str
    last: str
    cuda: str
    policy: str
    variant: str
    source: str  # where the last branch is stated


@dataclass(frozen=True, kw_only=True)
class ArchFits(Cause):
    kind: ClassVar[CauseKind] = "arch-fits"
    gpu: str
    why: str


@dataclass(frozen=True, kw_only=True)
class DriverFloor(Cause):
    kind: ClassVar[CauseKind] = "driver-floor"
    floor: str
    policy: str


@dataclass(frozen=True, kw_only=True)
class ReleaseNeedsReview(Cause):
    """`db refresh` added the release without the facts to judge its builds."""

    kind: ClassVar[CauseKind] = "release-needs-review"
    items: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class CudaNotOffered(Cause):
    kind: ClassVar[CauseKind] = "cuda-not-offered"
    wanted: str
    offered: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Suggestion(Cause):
    """What would fit, ignoring the torch range (``resolve.what_would_fit``)."""

    kind: ClassVar[CauseKind] = "suggestion"
    text: str
    gpu: str = ""


# -- Python packages: facts already in words (uv's, an index's) --------------------------------------


@dataclass(frozen=True, kw_only=True)
class Said(Cause):
    """A fact worded where it was found: uv's explanation, an index's answer."""

    text: str


@dataclass(frozen=True, kw_only=True)
class NoWheelForPlatform(Said):
    kind: ClassVar[CauseKind] = "no-wheel-for-platform"


@dataclass(frozen=True, kw_only=True)
class NoWheel(Said):
    kind: ClassVar[CauseKind] = "no-wheel"
    package: str = ""


@dataclass(frozen=True, kw_only=True)
class PythonConflict(Said):
    kind: ClassVar[CauseKind] = "python-conflict"


@dataclass(frozen=True, kw_only=True)
class MetadataBuildFailed(Said):
    """A package published as an sdist whose build failed when asked its metadata (a line of its
    log each)."""

    kind: ClassVar[CauseKind] = "sdist-metadata-failed"
    package: str = ""


@dataclass(frozen=True, kw_only=True)
class TorchSide(Cause):
    """One side of a conflict over torch: a package the spec names (``requirement``, as written)
    and the fitting torch releases it installs beside, newest first (``more``: and older ones not
    asked). Where it installs beside none with the spec's Python (``python``), the Pythons it does
    install on (``pythons``), when that is what rules it out."""

    kind: ClassVar[CauseKind] = "torch-side"
    requirement: str
    releases: tuple[str, ...]
    more: bool = False
    python: str = ""
    pythons: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class PythonMissing(Said):
    kind: ClassVar[CauseKind] = "python-missing"


@dataclass(frozen=True, kw_only=True)
class PackageHeldBack(Said):
    kind: ClassVar[CauseKind] = "package-held-back"


@dataclass(frozen=True, kw_only=True)
class NoCudaCompiler(Said):
    """An sdist builds a CUDA extension and no CUDA compiler wheel exists for the lock's CUDA."""

    kind: ClassVar[CauseKind] = "no-cuda-compiler"


# -- Debian packages ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class UnknownDebianPackage(Cause):
    kind: ClassVar[CauseKind] = "unknown-debian-package"
    name: str
    suite: str
    pockets: tuple[str, ...]
    did_you_mean: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class InvalidDebianPackage(Cause):
    kind: ClassVar[CauseKind] = "invalid-debian-package"
    requested: str


@dataclass(frozen=True, kw_only=True)
class DebianUnsatisfiable(Cause):
    kind: ClassVar[CauseKind] = "debian-unsatisfiable"
    suite: str
    requested: tuple[str, ...]
    apt: tuple[str, ...]  # apt's reasons, as it said them


# -- a torch build judged --------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One build of a torch release, judged: whether it fits, and the facts why (why not)."""

    variant: str
    cuda: str | None
    ok: bool
    facts: tuple[Cause, ...]
    preferred: bool = False
    index: str = (
        ""  # where its wheels come from: PyPI for the build PyPI serves, else the PyTorch index
    )

"""What the resolve stage hands on: the choice of torch (``Choice``, ``TorchChoice``, ``PassedOver``),
the pins (``WheelCandidate``, ``SourceInputs``), the whole ``Resolution``, and uv's pylock.toml
read into models (``PylockPackage``). Plain data: every step of the stage imports it, it imports
none of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from envspec.causes import (
    Candidate,
    Cause,
    ReleaseNeedsReview,
)
from envspec.compat import (
    PLATFORMS,
    Gpu,
    TorchRelease,
    Variant,
)
from envspec.debian.suites import SUITES as DEBIAN_SUITES
from envspec.spec import EnvSpec

if TYPE_CHECKING:  # imported where used: `choose` (explain) needs neither the network nor the host
    from envspec.debian.models import DebPin


DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
HOST_GLIBC = "2_28"  # host-only locks (base = "none"): the manylinux floor torch's own wheels use
# The newest manylinux target uv resolves for: `uv pip compile --help` (uv 0.13.9) lists
# --python-platform x86_64-manylinux_2_17 ... x86_64-manylinux_2_40 and nothing later. A suite
# whose glibc is newer (trixie ships 2.41) locks for manylinux_2_40: every wheel tagged for 2_40
# or older runs on it, and no wheel is published for a newer glibc yet.
UV_MAX_MANYLINUX = (2, 40)


def manylinux_glibc(glibc: str) -> str:
    """The manylinux glibc part of the platform tag for a base's glibc: "2.36" -> "2_36", capped at
    ``UV_MAX_MANYLINUX`` ("2.41" -> "2_40")."""
    major, minor = (int(x) for x in glibc.split(".")[:2])
    major, minor = min((major, minor), UV_MAX_MANYLINUX)
    return f"{major}_{minor}"


class PylockFile(BaseModel):
    """A file of a package in uv's pylock.toml (PEP 751): its name, where it is (``url``, or a
    local ``path``), its size (0: not given) and its hashes."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    name: str = ""
    url: str = ""
    path: str = ""
    size: int = 0
    hashes: dict[str, str] = {}


# What a setup.py imports at its top level that is a distribution of its own, built against:
# module -> the distribution that provides it (flash-attn's setup.py imports torch, packaging and
# wheel, and declares none of them: `pip install --no-build-isolation` is its documented way)
SETUP_IMPORTS: dict[str, str] = {
    "torch": "torch",
    "packaging": "packaging",
    "wheel": "wheel",
    "ninja": "ninja",
    "psutil": "psutil",
    "numpy": "numpy",
    "Cython": "cython",
    "pybind11": "pybind11",
    "setuptools_scm": "setuptools-scm",
    "cpuinfo": "py-cpuinfo",
    "einops": "einops",
    "triton": "triton",
}


class PylockPackage(BaseModel):
    """A package of uv's pylock.toml (PEP 751), as uv writes it: read into this at once
    (``_run_uv``); what else uv writes (its index, markers) is not used."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    name: str
    version: str
    wheels: tuple[PylockFile, ...] = ()
    sdist: PylockFile | None = None
    yanked: str | None = None  # not in pylock.toml: uv's warning that the release is yanked (why)
    # not in pylock.toml: what its metadata build was given beyond its [build-system], the lock's
    # torch for torch-scatter 2.1.2, whose setup.py imports torch and declares nothing (``_run_uv``)
    build_needs: tuple[str, ...] = ()


# Debian's python3 -> (suite, manylinux glibc), derived from debian.models.SUITES (the one source).
SUITES: dict[str, tuple[str, str]] = {
    facts["python"]: (suite, manylinux_glibc(facts["glibc"]))
    for suite, facts in DEBIAN_SUITES.items()
}


# ---------------------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class TorchChoice:
    release: TorchRelease
    variant: Variant  # the chosen build, its PyTorch-index URLs on the spec's [sources].torch_index
    min_driver: str
    candidates: list[Candidate]
    skipped: list[ReleaseNeedsReview] = field(
        default_factory=list
    )  # newer releases left out: they need review
    # the releases within [torch].version newer than the chosen one, newest first, each with the
    # causes none of its builds fits (explain words them: ``explain.newer_lines``)
    newer: list[tuple[str, list[Cause]]] = field(default_factory=list)


@dataclass(frozen=True)
class PassedOver:
    """A torch release that fits the hardware, newer than the one chosen, passed over because a
    package the spec names does not accept it (``with_packages``)."""

    torch: str  # the release passed over
    package: str  # the named package whose requirement excludes it
    version: str  # that package's version in the resolution
    requires: str  # its requirement on torch, as its metadata says ("torch==2.14.0")

    def to_json(self) -> dict[str, str]:
        return {
            "torch": self.torch,
            "package": self.package,
            "version": self.version,
            "requires": self.requires,
        }


@dataclass(frozen=True)
class Choice:
    """Everything decided offline (platform, targets, torch build, hardware contract); at lock time
    the torch release may be moved to fit the packages the spec names (``with_packages``)."""

    spec: EnvSpec
    python: str
    base: str  # "debian:bookworm" | "none" ...
    suite: str | None
    glibc: str
    gpus: list[Gpu]
    torch: TorchChoice | None
    driver_policy: str
    notes: list[str] = field(default_factory=list)
    arch: str = "x86_64"  # the CPU architecture of the hosts: "x86_64" | "aarch64" (from the GPUs)
    # the newer fitting torch releases passed over for a named package (empty: the newest fitting one)
    passed_over: tuple[PassedOver, ...] = ()
    # the named packages whose newest release has no wheel, built from their sdists (``source_only``;
    # set where the indexes were read: ``explain --packages``)
    from_source: tuple[str, ...] = ()
    # `explain --packages`: the dependencies the resolution takes from their sdists ("name version"),
    # transformer-engine-torch for transformer-engine[pytorch]
    from_source_deps: tuple[str, ...] = ()

    @property
    def driver_assumed(self) -> bool:
        """The spec targets GPUs with a CUDA build but sets no [target].driver: the lock's floor is
        what the chosen build needs, assumed of the hosts (docs/lockfile.md)."""
        return (
            bool(self.gpus)
            and not self.spec.target.driver
            and self.torch is not None
            and bool(self.torch.variant.cuda)
        )

    @property
    def platform(self) -> str:
        """ "linux-x86_64" or "linux-aarch64": what wheels, Python tags and Debian packages are for."""
        return PLATFORMS[self.arch]

    @property
    def platform_tag(self) -> str:
        return f"manylinux_{self.glibc}_{self.arch}"

    @property
    def debian_arch(self) -> str:
        return DEBIAN_ARCH[self.arch]

    @property
    def compute_capabilities(self) -> list[str]:
        return sorted({g.cc for g in self.gpus}, key=lambda c: tuple(int(x) for x in c.split(".")))


@dataclass(frozen=True)
class WheelCandidate:
    """A wheel uv chose; ``lock.from_resolution`` turns it into the lock's ``Wheel`` pin."""

    name: str
    version: str
    filename: str
    index: str
    sha256: str
    size: int
    group: str
    direct: bool
    held_back: str | None = None  # a named package below its newest release: why (``held_back``)
    # not in the lock: a release its index marks yanked (why), and a named package's release whose
    # wheel installs nothing (``held_back`` says both)
    yanked: str | None = None
    installs_nothing: bool = False
    # not in the lock as such: what its sdist's metadata build needed beyond its [build-system]
    # (``PylockPackage.build_needs``); ``wheels.sdist.pin_inputs`` gives it to the wheel's build too
    build_needs: tuple[str, ...] = ()
    # a package with no wheel for the platform, locked by its sdist (``filename``, ``sha256``): the
    # inputs its wheel is built from (``wheels.sdist.pin_inputs`` fills them in after resolution)
    source: SourceInputs | None = None

    @property
    def is_sdist(self) -> bool:
        return not self.filename.endswith(".whl")


@dataclass(frozen=True)
class SourceInputs:
    """What a wheel built from an sdist is made from (issue 37): the sdist's build backend and
    build requirements, those pinned as wheels, the Python and the compiler; ``key`` (the hash of
    them all, ``wheels.sdist.Derivation.key``) names the wheel it produces."""

    backend: str
    requires: tuple[str, ...]
    build: tuple[WheelCandidate, ...]
    python: str  # the exact CPython that builds it ("3.11.2")
    compiler: (
        str  # the locked Debian compiler ("gcc-12 12.2.0-14+deb12u1"), "" where the lock has none
    )
    key: str
    # a CUDA extension (it builds against a CUDA torch): NVIDIA's toolkit wheels for the lock's CUDA,
    # and the lock's GPU architectures
    toolkit: tuple[WheelCandidate, ...] = ()
    arch_list: tuple[str, ...] = ()
    env: tuple[
        tuple[str, str], ...
    ] = ()  # the package's own build settings (``wheels.sdist.PACKAGE_ENV``)
    # of ``requires``, what its setup.py imports and does not declare (torch for mamba-ssm): given
    # at the lock's own pins, as uv's match-runtime does (``wheels.sdist.BuildSystem``)
    undeclared: tuple[str, ...] = ()


@dataclass(frozen=True)
class Resolution:
    choice: Choice
    wheels: list[WheelCandidate]
    debs: list[DebPin]
    deb_requested: list[str]


# ---------------------------------------------------------------------------------------
# the Python closure, through uv

TORCH_FAMILY = {"torch", "torchvision", "torchaudio", "torchtext", "torchdata"}

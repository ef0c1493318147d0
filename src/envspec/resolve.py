"""The resolve stage: ``EnvSpec`` + ``CompatDB`` (+ package indexes) -> ``Resolution``.

Two steps. ``choose`` is pure and offline (``envspec explain`` uses it alone): it picks the torch
release and CUDA variant and keeps every candidate's reason. ``resolve_packages`` then asks
uv's resolver for the Python closure and apt for the Debian closure. The core raises facts
(``ResolutionImpossible`` with structured causes); ``explain.py`` words them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from packaging.version import Version
from pydantic import BaseModel, ConfigDict, ValidationError

from envspec import debian  # a lazy package: its modules load on first use
from envspec.cache.dirs import cache_dir_for
from envspec.causes import (
    ArchFits,
    ArchMissing,
    Candidate,
    Cause,
    CudaNotOffered,
    DriverFloor,
    DriverPastGpu,
    DriverTooOld,
    MetadataBuildFailed,
    NoWheel,
    NoWheelForPlatform,
    PythonConflict,
    PythonMissing,
    PythonUnsupported,
    ReleaseNeedsReview,
    Said,
    Suggestion,
    UnknownCuda,
    UnknownDebianPackage,
    VariantNotRequested,
)
from envspec.compat import (
    PLATFORMS,
    CompatDB,
    Gpu,
    TorchRelease,
    Variant,
    arch_runs,
    driver_branch,
    why_arch,
)
from envspec.compat.model import PYPI_INDEX, PYTORCH_INDEX
from envspec.compat.platforms import PypiBuild, pypi_build, pypi_builds
from envspec.debian.suites import SUITES as DEBIAN_SUITES
from envspec.errors import Problem, ResolutionImpossible, SourceError, SpecError
from envspec.spec import EnvSpec, requirement_name

if TYPE_CHECKING:  # imported where used: `choose` (explain) needs neither the network nor the host
    import subprocess

    from envspec.debian.models import DebPin
    from envspec.sides import Ask
    from envspec.sources import ResolvedSources

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


class PylockPackage(BaseModel):
    """A package of uv's pylock.toml (PEP 751), as uv writes it: read into this at once
    (``_run_uv``); what else uv writes (its index, markers) is not used."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    name: str
    version: str
    wheels: tuple[PylockFile, ...] = ()
    sdist: PylockFile | None = None
    yanked: str | None = None  # not in pylock.toml: uv's warning that the release is yanked (why)


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


@dataclass(frozen=True)
class Resolution:
    choice: Choice
    wheels: list[WheelCandidate]
    debs: list[DebPin]
    deb_requested: list[str]


# ---------------------------------------------------------------------------------------
# offline choice


def _cuda_key(v: Variant) -> tuple[int, ...]:
    return tuple(int(x) for x in v.cuda.split(".")) if v.cuda else (0,)


def choose_all(spec: EnvSpec, db: CompatDB) -> list[Choice]:
    """One choice per platform the spec locks for: each of ``[target].platforms`` (in its order),
    else the one its GPUs need."""
    if len(spec.target.platforms) > 1:
        return [choose(spec, db, platform=name) for name in spec.target.platforms]
    return [choose(spec, db)]


def choose(
    spec: EnvSpec, db: CompatDB, *, platform: str | None = None, torch_version: str | None = None
) -> Choice:
    """Pick platform, GPU targets and the torch build. Raises SpecError or ResolutionImpossible.
    ``platform``: which of ``[target].platforms`` to choose for (default its first); with several
    platforms each choice targets the spec's GPUs that ship in that platform's hosts.
    ``torch_version``: that release of torch, not the newest that fits (``with_packages``)."""
    problems: list[Problem] = []
    gpus = _target_gpus(spec, db, problems)
    arch = "x86_64"
    if len(gpus) == len(spec.target.gpus):
        arch, problem = _platform(spec, gpus, platform)
        if problem is not None:
            problems.append(problem)
        if len(spec.target.platforms) > 1:
            gpus = [g for g in gpus if arch in g.host_arch]
    if spec.target.driver:
        problems += gpu_driver_problems(spec, gpus)
    base, suite, glibc = _base(spec, problems)
    if problems:
        raise SpecError(spec.file, problems)
    torch = (
        _choose_torch(spec, db, gpus, arch, only=torch_version) if spec.torch is not None else None
    )
    choice = Choice(
        spec=spec,
        python=spec.python.version,
        base=base,
        suite=suite,
        glibc=glibc,
        gpus=gpus,
        torch=torch,
        driver_policy=spec.target.driver_policy,
        notes=_torch_notes(torch, arch),
        arch=arch,
    )
    if choice.driver_assumed and torch is not None:
        choice.notes.append(
            f"[target].driver is not set: the hosts are assumed to run driver >= {torch.min_driver}, what "
            f"torch {torch.release.version} {torch.variant.name} needs; set it to their oldest driver "
            "(`nvidia-smi --query-gpu=driver_version --format=csv,noheader`) so that envspec picks a build "
            "that runs there"
        )
    return choice


def _target_gpus(spec: EnvSpec, db: CompatDB, problems: list[Problem]) -> list[Gpu]:
    """The DB's GPU for each of [target].gpus; a problem (added to ``problems``) for a name that
    is no NVIDIA GPU, is unknown, or names a Jetson no PyPI torch runs on."""
    gpus: list[Gpu] = []
    for i, name in enumerate(spec.target.gpus):
        g = db.find_gpu(name)
        vendor = None if g is not None else not_nvidia(name)
        if vendor is not None:
            problems.append(
                spec.problem(
                    ("target", "gpus", i),
                    f"'{name}' is not an NVIDIA GPU: it is {vendor}'s, and envspec builds "
                    "CUDA images for NVIDIA GPUs only",
                    hint="name the NVIDIA GPUs the image runs on; for this one, use its vendor's PyTorch build and "
                    "container images (envspec does not lock them)",
                    reference="gpu-not-nvidia",
                )
            )
        elif g is None:
            sugg = db.suggest_gpus(name)
            problems.append(
                spec.problem(
                    ("target", "gpus", i),
                    f"unknown GPU '{name}'",
                    hint=(
                        f"did you mean '{sugg[0]}'?"
                        if sugg
                        else "use a name as nvidia-smi prints it, a short form like 'H100', or 'sm_90'; "
                        "`envspec db show` lists the known GPUs"
                    ),
                    reference="unknown-gpu",
                )
            )
        elif not g.pypi_torch and spec.torch is not None:
            problems.append(_jetson_problem(spec, i, name, g))
        else:
            gpus.append(g)
    return gpus


def _jetson_problem(spec: EnvSpec, i: int, name: str, g: Gpu) -> Problem:
    return spec.problem(
        ("target", "gpus", i),
        f"'{name}' is a Jetson GPU ({g.name}, {g.architecture}, cc {g.cc}): no torch from PyPI or "
        f"download.pytorch.org runs on it (Jetson Linux's CUDA is not the server-Arm CUDA their aarch64 "
        f"wheels are built for, and none has {g.sm} kernels)",
        hint="on the device use NVIDIA's PyTorch for Jetson (https://docs.nvidia.com/deeplearning/frameworks/"
        "install-pytorch-jetson-platform/index.html) or its l4t containers, and lock this spec for the "
        f"servers' GPUs only; the facts and their sources: gpus.toml's family of cc {g.cc} "
        "(`envspec db show --json`)",
        reference="gpu-jetson-no-pypi-torch",
    )


def _base(spec: EnvSpec, problems: list[Problem]) -> tuple[str, str | None, str]:
    """(the base, its Debian suite or None, the glibc the wheels must run on) of [system].base and
    [python].version; a problem (added to ``problems``) where no Debian base ships that Python."""
    py, base = spec.python.version, spec.system.base
    if base == "auto":
        if py in SUITES:
            suite, glibc = SUITES[py]
            return f"debian:{suite}", suite, glibc
        problems.append(
            spec.problem(
                ("python", "version"),
                f"no Debian base ships Python {py}",
                hint='use 3.11 (bookworm) or 3.13 (trixie), or [system].base = "none" for a host-only lock',
                reference="python-unavailable",
            )
        )
        return base, None, HOST_GLIBC
    if base == "none":
        return base, None, HOST_GLIBC
    suite = base.split(":", 1)[1]
    want = next((p for p, (s, _) in SUITES.items() if s == suite), None)
    if want != py:
        problems.append(
            spec.problem(
                ("python", "version"),
                f"Debian {suite} ships Python {want}, not {py}",
                hint=f'set [python].version = "{want}" or [system].base = "auto"',
                reference="python-unavailable",
            )
        )
    return base, suite, SUITES.get(want or "", (None, HOST_GLIBC))[1]


def _torch_notes(torch: TorchChoice | None, arch: str) -> list[str]:
    """What a choice says of its torch: releases left out for review, and off x86_64 where the
    platform's wheels come from."""
    if torch is None:
        return []
    notes = [
        f"torch {c.torch} is in the DB but needs review, so it was not considered: "
        + "; ".join(c.items)
        for c in torch.skipped
    ]
    if arch != "x86_64":
        notes.append(
            "the DB's Python versions and pins are those of PyPI's linux-x86_64 wheels; the "
            f"{PLATFORMS[arch]} wheels are found (or found missing) by the Python resolver at lock time"
        )
        row = pypi_platform_build(torch.release.version, PLATFORMS[arch])
        notes.append(
            f"PyPI's {PLATFORMS[arch]} wheel of torch {torch.release.version} is the {row.variant} build "
            "(compat/data/torch_platforms.toml)"
            if row
            else f"PyPI has no {PLATFORMS[arch]} wheel of torch {torch.release.version} on record: "
            f"every build of it comes from the PyTorch index ({torch.variant.index})"
        )
    return notes


def _platform(
    spec: EnvSpec, gpus: list[Gpu], platform: str | None = None
) -> tuple[str, Problem | None]:
    """The CPU architecture of the hosts: ``platform`` or the first of ``[target].platforms`` (with
    one platform each GPU must ship in such hosts; with several, each GPU in the hosts of one of
    them), else the one every named GPU's hosts share: x86_64 where it can (and without GPUs),
    aarch64 for Grace systems (GH200, GB200, GB300), DGX Spark (GB10) and Jetson; a problem when the
    GPUs need hosts of different architectures and the spec names no platforms."""
    if spec.target.platforms:
        want = next(
            a for a, name in PLATFORMS.items() if name == (platform or spec.target.platforms[0])
        )
        named = {a for a, name in PLATFORMS.items() if name in spec.target.platforms}
        for i, g in enumerate(gpus):
            if (want not in g.host_arch) if len(named) == 1 else not (named & set(g.host_arch)):
                others = " and ".join(PLATFORMS[a] for a in g.host_arch)
                return want, spec.problem(
                    ("target", "gpus", i),
                    f"{g.short} ({g.name}) ships in {others} hosts only, not in "
                    f"{' or '.join(PLATFORMS[a] for a in sorted(named, reverse=True))} hosts as [target].platforms says"
                    + (f" (source: {g.host_arch_source})" if g.host_arch_source else ""),
                    hint=f'set [target].platforms = ["{others}"] or drop the key, or target another GPU',
                    reference="gpu-not-on-platform",
                )
        return want, None
    common = {"x86_64", "aarch64"}
    for g in gpus:
        common &= set(g.host_arch)
    if "x86_64" in common:
        return "x86_64", None
    if "aarch64" in common:
        return "aarch64", None
    arm = [g for g in gpus if "x86_64" not in g.host_arch]
    x86 = [g for g in gpus if "aarch64" not in g.host_arch]
    idx = next(i for i, g in enumerate(gpus) if g in arm)
    return "x86_64", spec.problem(
        ("target", "gpus", idx),
        f"the GPUs need hosts of two CPU architectures: {', '.join(g.short for g in arm)} ship in linux-aarch64 "
        f"(Grace/Arm) hosts only, {', '.join(g.short for g in x86)} in linux-x86_64 hosts",
        hint='name both: [target].platforms = ["linux-x86_64", "linux-aarch64"] (one lock with a section per '
        "platform, each targeting its GPUs), or split the spec",
        reference="mixed-platforms",
    )


# Accelerators of other vendors, by the names people write: AMD Instinct and Radeon, Intel Gaudi,
# Data Center GPU Max and Arc, Apple silicon, Google TPU, AWS Trainium and Inferentia.
_OTHER_VENDORS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "AMD",
        re.compile(
            r"\b(amd|instinct|radeon|mi\s?[1-4]\d{2}[a-z]*|mi\s?\d{2}|rx\s?\d{4}[a-z]*|w\d{4})\b",
            re.I,
        ),
    ),
    (
        "Intel",
        re.compile(
            r"\b(intel|gaudi\s?\d?|habana|arc\s?[ab]\d{3}|(data center )?gpu max(\s?\d{4})?|max\s?1[15][05]0|ponte vecchio)\b",
            re.I,
        ),
    ),
    ("Apple", re.compile(r"\b(apple|m[1-5]\s?(pro|max|ultra)|mps)\b", re.I)),
    ("Google", re.compile(r"\b(tpu(\s?v\d+[a-z]*)?)\b", re.I)),
    ("AWS", re.compile(r"\b(trainium\d?|inferentia\d?|trn[12]|inf[12])\b", re.I)),
)


def not_nvidia(name: str) -> str | None:
    """The vendor of an accelerator that is not NVIDIA's, by its name ("MI300X" -> "AMD"); None otherwise."""
    if re.search(r"nvidia|geforce|quadro|tesla|rtx|gtx", name, re.I):
        return None
    for vendor, pattern in _OTHER_VENDORS:
        if pattern.search(name):
            return vendor
    return None


def gpu_driver_problems(spec: EnvSpec, gpus: list[Gpu]) -> list[Problem]:
    """[target].driver against each GPU's first and last driver branches: the rule holds under
    every driver policy (CUDA's minor-version compatibility lets a runtime load on an older driver,
    it does not teach an old driver a newer GPU, nor a new driver a GPU its branch dropped)."""
    driver = spec.target.driver or ""
    out: list[Problem] = []
    for g in {g.name: g for g in gpus}.values():  # each GPU once, in the spec's order
        cannot = f"driver {driver} cannot drive {g.short} ({g.name}, {g.sm}): "
        if driver and g.driver_too_old(driver):
            out.append(
                spec.problem(
                    ("target", "driver"),
                    cannot
                    + f"it needs driver branch R{g.min_driver} or newer, whatever the driver policy "
                    f"(source: {g.min_driver_source})",
                    hint=f"upgrade the hosts' driver to R{g.min_driver} or newer; CUDA minor-version compatibility "
                    "does not add GPU support to an older driver",
                    reference="driver-too-old-for-gpu",
                )
            )
        elif driver and g.driver_too_new(driver):
            out.append(
                spec.problem(
                    ("target", "driver"),
                    cannot
                    + f"R{g.max_driver} is the last driver branch for it, whatever the driver policy "
                    f"(source: {g.max_driver_source})",
                    hint=f"hosts with {g.short} stay on an R{g.max_driver} driver (set [target].driver to the one they "
                    f"run); a fleet moving past R{g.max_driver} needs newer GPUs",
                    reference="driver-too-new-for-gpu",
                )
            )
    return out


def gpu_driver_floor(gpus: list[Gpu]) -> str:
    """The newest first-driver branch among the GPUs ("520"), or "" when none applies."""
    branches = [g.min_driver for g in gpus if g.min_driver]
    return max(branches, key=driver_branch) if branches else ""


def _max_driver(a: str, b: str) -> str:
    if not a or not b:
        return a or b
    return a if Version(a) >= Version(b) else b


def driver_floor(db: CompatDB, variant: Variant, policy: str) -> str | None:
    if not variant.cuda:
        return ""
    tk = db.cuda_toolkit(variant.cuda)
    if tk is None:
        return None
    return tk.driver_compat if policy == "compat" else tk.driver_strict


def _judge(
    spec: EnvSpec, db: CompatDB, rel: TorchRelease, v: Variant, gpus: list[Gpu]
) -> tuple[bool, list[Cause]]:
    """Whether a variant fits, and the facts why (causes when it does not); explain.py words them."""
    causes: list[Cause] = []
    want = spec.torch.cuda if spec.torch else "auto"
    if want == "cpu" and v.cuda:
        causes.append(VariantNotRequested(variant=v.name, wanted="cpu"))
    if want not in ("cpu", "auto") and v.cuda != want:
        causes.append(VariantNotRequested(variant=v.name, wanted=want))
    if want == "auto" and not v.cuda:
        causes.append(VariantNotRequested(variant=v.name, wanted="a CUDA build"))
    if spec.python.version not in rel.python:
        causes.append(
            PythonUnsupported(
                torch=rel.version, python=spec.python.version, supported=tuple(rel.python)
            )
        )
    if v.cuda:
        causes += _cuda_causes(spec, db, rel, v, gpus, v.cuda)
    if causes:
        return False, causes
    fits: list[Cause] = [ArchFits(gpu=_short(g), why=why_arch(g.cc, v.arch_list)[1]) for g in gpus]
    if v.cuda:
        floor = driver_floor(db, v, spec.target.driver_policy)
        fits.append(DriverFloor(floor=floor or "", policy=spec.target.driver_policy))
    return True, fits


def _cuda_causes(
    spec: EnvSpec, db: CompatDB, rel: TorchRelease, v: Variant, gpus: list[Gpu], cuda: str
) -> list[Cause]:
    """Why a CUDA build does not fit: a GPU it has no kernels for, the driver."""
    causes: list[Cause] = [
        ArchMissing(
            gpu=_short(g),
            gpu_name=g.name,
            cc=g.cc,
            variant=v.name,
            arch_list=tuple(v.arch_list),
            torch=rel.version,
        )
        for g in gpus
        if not any(arch_runs(g.cc, a) for a in v.arch_list)
    ]
    policy = spec.target.driver_policy
    floor = driver_floor(db, v, policy)
    if floor is None:
        causes.append(UnknownCuda(cuda=cuda))
    elif spec.target.driver and Version(spec.target.driver) < Version(floor):
        causes.append(
            DriverTooOld(
                driver=spec.target.driver, needed=floor, cuda=cuda, policy=policy, variant=v.name
            )
        )
    elif floor and not spec.target.driver:
        # the floor the hosts are assumed to run: no newer than a GPU's last branch
        causes += [
            DriverPastGpu(
                gpu=_short(g),
                gpu_name=g.name,
                needed=floor,
                last=g.max_driver,
                cuda=cuda,
                policy=policy,
                variant=v.name,
                source=g.max_driver_source,
            )
            for g in gpus
            if g.driver_too_new(floor)
        ]
    return causes


def _short(g: Gpu) -> str:
    return g.aliases[0] if g.aliases else g.name


def pypi_platform_build(torch_version: str, platform: str) -> PypiBuild | None:
    """Which build PyPI's ``platform`` wheel of this torch release is (None: none on record). For
    linux-x86_64 that is the DB's ``pypi_variant``; other platforms read data/torch_platforms.toml."""
    return None if platform == PLATFORMS["x86_64"] else pypi_build(torch_version, platform)


def _pypi_variant(rel: TorchRelease, arch: str) -> str | None:
    """The variant PyPI's own wheel of ``rel`` is for ``arch``."""
    if arch == "x86_64":
        return rel.pypi_variant
    row = pypi_platform_build(rel.version, PLATFORMS[arch])
    return row.variant if row else None


def platform_arches(v: Variant, rel: TorchRelease, arch: str) -> Variant:
    """``v`` with the CUDA arch list of ``arch``'s build where data/torch_platforms.toml records
    one for it (PyPI's aarch64 builds are compiled for other arches than x86_64's): the arches the
    GPUs are judged by, the lock's hardware contract and what the verifier expects loaded."""
    if arch == "x86_64":
        return v
    row = pypi_platform_build(rel.version, PLATFORMS[arch])
    if row is None or not row.arch_list or row.variant != v.name:
        return v
    return v.model_copy(update={"arch_list": list(row.arch_list)})


def on_platform(v: Variant, rel: TorchRelease, arch: str) -> Variant:
    """``v`` as it is served for ``arch``: on linux-x86_64 as the DB says; elsewhere PyPI serves the
    build data/torch_platforms.toml names (aarch64: the CPU build), and every other build, PyPI's
    x86_64 one among them, comes from the PyTorch index under its local label (torch==2.9.1+cu128)."""
    if arch == "x86_64":
        return v
    if v.name == _pypi_variant(rel, arch):
        return v.model_copy(update={"index": PYPI_INDEX, "local": "", "pypi": True})
    if v.pypi or not v.local:
        local = v.pytorch_local or v.name
        return v.model_copy(
            update={
                "index": v.pytorch_index or f"{PYTORCH_INDEX}/{local}",
                "local": local,
                "pypi": False,
            }
        )
    return v


def _releases(spec: EnvSpec, db: CompatDB) -> list[TorchRelease]:
    """The DB's torch releases within ``[torch].version``, oldest first."""
    assert spec.torch is not None
    spec_set = spec.torch.specifier()
    return [
        r for r in db.torch_releases if spec_set.contains(Version(r.version), prereleases=False)
    ]


def _judge_release(
    spec: EnvSpec, db: CompatDB, rel: TorchRelease, gpus: list[Gpu], arch: str
) -> tuple[Variant | None, list[tuple[Variant, bool, list[Cause]]]]:
    """The build of ``rel`` to take (None: none fits) and every build with whether it fits and why."""
    judged: list[tuple[Variant, bool, list[Cause]]] = []
    for v in sorted(rel.variants.values(), key=_cuda_key):
        v = platform_arches(v, rel, arch)
        ok, facts = _judge(spec, db, rel, v, gpus)
        judged.append((v, ok, facts))
    return _prefer(rel, [v for v, ok, _ in judged if ok], _pypi_variant(rel, arch)), judged


def fitting_releases(
    spec: EnvSpec, db: CompatDB, gpus: list[Gpu], arch: str = "x86_64"
) -> list[str]:
    """The torch releases within ``[torch].version`` with a build that fits the GPUs, driver, Python
    and platform (releases that need review left out), newest first."""
    out = []
    for rel in sorted(_releases(spec, db), key=lambda r: Version(r.version), reverse=True):
        if not rel.needs_review and _judge_release(spec, db, rel, gpus, arch)[0] is not None:
            out.append(rel.version)
    return out


Judged = list[tuple[Variant, bool, list[Cause]]]  # each build, whether it fits, and why


def _rejections(version: str, judged: Judged) -> list[Cause]:
    """Each cause with the build of release ``version`` it rejects."""
    return [
        replace(c, torch=version, build=v.name)
        for v, ok, facts in judged
        if not ok
        for c in facts
        if not isinstance(c, VariantNotRequested)
    ]


def _candidates(spec: EnvSpec, judged: Judged, pick: Variant | None) -> list[Candidate]:
    """Every build judged, as explain shows it: whether it fits, why, and which was taken."""
    return [
        Candidate(
            v.name,
            v.cuda,
            ok,
            tuple(facts),
            preferred=(pick is not None and v.name == pick.name),
            index=v.served_from(spec.sources.torch_index).index,
        )
        for v, ok, facts in judged
    ]


def _choose_torch(
    spec: EnvSpec, db: CompatDB, gpus: list[Gpu], arch: str = "x86_64", only: str | None = None
) -> TorchChoice:
    """The newest release within ``[torch].version`` (only ``only``, where given) with a build that
    fits, and that build."""
    assert spec.torch is not None
    releases = [r for r in _releases(spec, db) if only is None or r.version == only]
    if not releases:
        raise _no_such_torch(spec, db)
    all_causes: list[Cause] = []
    first_candidates: list[Candidate] | None = None
    newer: list[tuple[str, list[Cause]]] = []
    for rel in sorted(releases, key=lambda r: Version(r.version), reverse=True):
        if rel.needs_review:
            # `db refresh` added it without the facts to judge its builds: not a candidate until curated
            review = ReleaseNeedsReview(torch=rel.version, items=tuple(rel.needs_review))
            all_causes.append(replace(review, where=_where(spec, review)))
            newer.append((rel.version, [all_causes[-1]]))
            continue
        pick, judged = _judge_release(spec, db, rel, gpus, arch)
        all_causes += [
            replace(c, torch=rel.version, where=_where(spec, c))
            for _, ok, facts in judged
            if not ok
            for c in facts
            if not isinstance(c, VariantNotRequested)
        ]
        if pick is None:
            # each cause with the build it rejects, for explain to say which builds lack what
            newer.append((rel.version, _rejections(rel.version, judged)))
        cands = _candidates(spec, judged, pick)
        if first_candidates is None:
            first_candidates = cands
        if pick is not None:
            # the lock's floor: the CUDA runtime's (by policy) and, above it, the GPUs' first branches
            floor = _max_driver(
                driver_floor(db, pick, spec.target.driver_policy) or "", gpu_driver_floor(gpus)
            )
            # the DB names download.pytorch.org; the spec may name a mirror of it, and the lock's
            # torch pin, uv's index arguments and the wheels' attribution all take it from here
            return TorchChoice(
                release=rel,
                variant=on_platform(pick, rel, arch).served_from(spec.sources.torch_index),
                min_driver=floor,
                candidates=cands,
                skipped=[c for c in all_causes if isinstance(c, ReleaseNeedsReview)],
                newer=newer,
            )
    raise _impossible(spec, db, gpus, releases, all_causes, first_candidates or [])


def _no_such_torch(spec: EnvSpec, db: CompatDB) -> SpecError:
    assert spec.torch is not None
    known = [r.version for r in db.torch_releases]
    return SpecError(
        spec.file,
        [
            spec.problem(
                ("torch", "version"),
                f"no torch release matches {spec.torch.version!r}",
                hint=f"the compatibility DB {db.version} knows {known[0]} to {known[-1]}; "
                "run `envspec db refresh` for newer releases",
                reference="no-such-torch",
            )
        ],
    )


def _impossible(
    spec: EnvSpec,
    db: CompatDB,
    gpus: list[Gpu],
    releases: list[TorchRelease],
    all_causes: list[Cause],
    candidates: list[Candidate],
) -> ResolutionImpossible:
    """No build of a release in the range fits: every cause (or, where each build was rejected
    only for not being the CUDA [torch].cuda names, that), and what would fit."""
    assert spec.torch is not None
    if not all_causes:  # every variant was rejected only for not being the one [torch].cuda names
        offered = sorted({v.cuda or "cpu" for r in releases for v in r.variants.values()})
        all_causes.append(
            CudaNotOffered(
                wanted=spec.torch.cuda,
                offered=tuple(offered),
                where=spec.problem(("torch", "cuda"), "").where(spec.file),
            )
        )
    suggestions = what_would_fit(spec, db, gpus)
    return ResolutionImpossible(
        f"no build of torch {spec.torch.version} fits {spec.file or 'the spec'}",
        causes=[*_dedupe(all_causes), *suggestions],
        candidates=candidates,
        hint="; ".join(s.text for s in suggestions),
        reference=_main_reference(all_causes),
    )


_CAUSE_KEYS = {
    "arch-missing": ("target", "gpus"),
    "driver-too-old": ("target", "driver"),
    "driver-past-gpu": ("target", "gpus"),
    "python-unsupported": ("python", "version"),
    "unknown-cuda": ("torch", "cuda"),
}


def _where(spec: EnvSpec, cause: Cause) -> str:
    """'[target].driver (specs/x.toml:7)' for the spec key behind a cause."""
    path: tuple[str | int, ...] = _CAUSE_KEYS.get(cause.kind, ("torch", "version"))
    if isinstance(cause, ArchMissing):
        gpu = cause.gpu.lower()
        idx = next(
            (i for i, n in enumerate(spec.target.gpus) if n.lower() in gpu or gpu in n.lower()),
            None,
        )
        if idx is not None:
            path = path + (idx,)
    return spec.problem(path, "").where(spec.file)


def _prefer(rel: TorchRelease, fits: list[Variant], pypi_variant: str | None) -> Variant | None:
    """The stated preference: the build PyPI serves for the platform when it fits, else the
    release's stable CUDA (the build PyPI serves for linux-x86_64; on linux-aarch64 it comes from
    the PyTorch index), else the newest CUDA that fits."""
    if not fits:
        return None
    for name in (pypi_variant, rel.pypi_variant):
        for v in fits:
            if v.name == name:
                return v
    return max(fits, key=_cuda_key)


def _dedupe(causes: list[Cause]) -> list[Cause]:
    """The causes without repeats: two that differ only in the release or the arch list or Pythons
    the release has are said once."""
    seen: set[Cause] = set()
    out: list[Cause] = []
    for c in causes:
        key = replace(c, torch="")
        if isinstance(key, ArchMissing):
            key = replace(key, arch_list=())
        if isinstance(key, PythonUnsupported):
            key = replace(key, supported=())
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _main_reference(causes: list[Cause]) -> str:
    kinds = [c.kind for c in causes]
    for k, ref in (
        ("arch-missing", "no-kernels-for-gpu"),
        ("driver-too-old", "driver-too-old"),
        ("driver-past-gpu", "driver-too-new-for-gpu"),
        ("python-unsupported", "python-unsupported"),
        ("release-needs-review", "release-needs-review"),
    ):
        if k in kinds:
            return ref
    return "no-compatible-torch"


def what_would_fit(spec: EnvSpec, db: CompatDB, gpus: list[Gpu]) -> list[Suggestion]:
    """Ignoring the torch range: the oldest release and its variants that would fit, per blocker."""
    out: list[Suggestion] = []
    for g in gpus:
        fits = [
            (r, v)
            for r in db.torch_releases
            for v in r.variants.values()
            if v.cuda and any(arch_runs(g.cc, a) for a in v.arch_list)
        ]
        if not fits:
            out.append(
                Suggestion(text=f"{_short(g)} ({g.cc}) is run by no torch build the DB knows")
            )
            continue
        first = min(fits, key=lambda rv: Version(rv[0].version))
        variants = sorted({v.name for r, v in fits if r.version == first[0].version})
        sm = f"sm_{g.cc.replace('.', '')}"
        out.append(
            Suggestion(
                gpu=g.name,
                text=f"{_short(g)} needs {sm}: torch >= {first[0].version} with {' or '.join(variants)}",
            )
        )
    if spec.target.driver:
        ok = [
            (r, v)
            for r in db.torch_releases
            for v in r.variants.values()
            if v.cuda
            and (f := driver_floor(db, v, spec.target.driver_policy))
            and Version(spec.target.driver) >= Version(f)
        ]
        if ok:
            newest = max(ok, key=lambda rv: (_cuda_key(rv[1]), Version(rv[0].version)))
            out.append(
                Suggestion(
                    text=f"driver {spec.target.driver} runs up to CUDA {newest[1].cuda} "
                    f"({spec.target.driver_policy}): e.g. torch {newest[0].version} with {newest[1].name}",
                )
            )
    if spec.torch and spec.python.version:
        py_ok = [
            r.version
            for r in db.torch_releases
            if spec.python.version in r.python
            and spec.torch.specifier().contains(Version(r.version))
        ]
        if not py_ok:
            any_ok = [r.version for r in db.torch_releases if spec.python.version in r.python]
            if any_ok:
                out.append(
                    Suggestion(
                        text=f"Python {spec.python.version} has torch wheels from {any_ok[0]} to {any_ok[-1]}",
                    )
                )
    return out


# ---------------------------------------------------------------------------------------
# the Python closure, through uv

TORCH_FAMILY = {"torch", "torchvision", "torchaudio", "torchtext", "torchdata"}


def _is_cuda_wheel(name: str) -> bool:
    return name.startswith("nvidia-") or name.startswith("cuda-") or name == "nvidia"


def requirements(choice: Choice) -> tuple[list[str], list[str], set[str]]:
    """(torch's requirements, everyone's requirements, names the spec asked for)."""
    spec = choice.spec
    torch_reqs: list[str] = []
    direct: set[str] = set()
    if choice.torch is not None:
        assert spec.torch is not None  # choose() picks a torch build only for a [torch] table
        local = f"+{choice.torch.variant.local}" if choice.torch.variant.local else ""
        torch_reqs.append(f"torch=={choice.torch.release.version}{local}")
        torch_reqs += list(spec.torch.packages)
        direct |= {"torch"} | {requirement_name(r) for r in spec.torch.packages}
    team = list(spec.python.packages)
    if spec.services.jupyter and spec.services.jupyter.enabled:
        team += ["jupyterlab"] + list(spec.services.jupyter.extensions)
    direct |= {requirement_name(r) for r in team}
    return torch_reqs, torch_reqs + team, direct


def _uv() -> str:
    import shutil  # subprocess, shutil, tempfile: only the lock stage runs uv (explain stays light)

    found = shutil.which("uv")
    if found:
        return found
    try:
        from uv import find_uv_bin  # the uv wheel ships its binary

        return find_uv_bin()
    except Exception:  # noqa: BLE001
        raise SourceError(
            "uv is not installed", hint="pip install uv", reference="uv-missing"
        ) from None


def _index_args(
    sources: ResolvedSources, choice: Choice, *, torch_index: bool = True
) -> tuple[list[str], list[str]]:
    """uv arguments: the canonical indexes, and the mirrors only where one of those cannot be read
    (a mirror stands in for it: each file it serves is then credited only where its canonical index
    lists it, ``_candidate``). A mirror never joins a resolution whose indexes answer: pip's
    find-links folder with torch 2.13.0+cpu would win over PyPI's 2.13.0 (issue 57).
    ``torch_index``: also the PyTorch index of the chosen build (not where only torch's version is
    wanted, ``with_packages``: every release is on PyPI)."""
    from envspec.sources import (
        flat_folder,
        reachable,
    )  # here: explain does without urllib.request, configparser and html.parser

    args: list[str] = []
    notes: list[str] = []
    canon: list[str] = []
    if torch_index and choice.torch is not None and choice.torch.variant.local:
        canon.append(choice.torch.variant.index)
    canon += list(sources.extra_indexes)
    for url in canon:
        if reachable(url):
            args += ["--find-links" if flat_folder(url) else "--extra-index-url", url]
        else:
            notes.append(f"{url} is unreachable; its files must come from a mirror")
    if flat_folder(sources.index):  # a wheelhouse as the index: its files and no registry's
        args += ["--no-index", "--find-links", sources.index]
    elif reachable(sources.index):
        args += ["--default-index", sources.index]
    else:
        notes.append(f"{sources.index} is unreachable; using mirrors only")
        args += (
            ["--no-index"]
            if not any(m.kind == "index" for m in sources.mirrors)
            else ["--default-index", next(m.url for m in sources.mirrors if m.kind == "index")]
        )
    if notes:
        stand_in: list[str] = []
        for m in sources.mirrors:
            if m.kind == "links":
                stand_in += ["--find-links", m.url]
            elif m.url not in args:
                stand_in += ["--extra-index-url", m.url]
        args = stand_in + args
    return args, notes


@dataclass(frozen=True, kw_only=True)
class UvFlags:
    """How ``_run_uv`` asks uv: the packages to upgrade past the lock's versions, constraints,
    the PyTorch index or not, without dependencies, wheels only (``only_binary``) except for the
    ``no_binary`` packages, which are taken as sdists (a package with no wheel, built from
    source: issue 37)."""

    upgrade: Sequence[str] = ()
    constraints: Sequence[str] = ()
    torch_index: bool = True
    no_deps: bool = False
    only_binary: bool = True
    no_binary: Iterable[str] = ()


def _run_uv(
    reqs: list[str],
    choice: Choice,
    sources: ResolvedSources,
    workdir: Path,
    name: str,
    flags: UvFlags = UvFlags(),
) -> list[PylockPackage]:
    """uv's resolution of ``reqs`` for the choice's platform and Python, as pylock.toml packages
    (``name``: the work files' names)."""
    workdir.mkdir(parents=True, exist_ok=True)
    req = workdir / f"{name}.in"
    req.write_text("\n".join(reqs) + "\n")
    out = workdir / f"pylock.{name}.toml"
    if out.exists():
        out.unlink()
    idx, idx_notes = _index_args(sources, choice, torch_index=flags.torch_index)
    argv = _uv_argv(req, out, choice, idx, flags)
    if flags.constraints:
        c = workdir / f"{name}.constraints.txt"
        c.write_text("\n".join(flags.constraints) + "\n")
        argv += ["--constraint", str(c)]
    for u in flags.upgrade:
        argv += ["--upgrade-package", u]
    env = dict(os.environ)
    env.setdefault("UV_CACHE_DIR", str(cache_dir_for(env) / "uv"))
    env["UV_NO_CONFIG"] = "1"
    proc = _uv_run(argv, env)
    if proc.returncode != 0:
        raise (
            _torch_index_error(proc.stderr, choice, idx_notes)
            or _platform_wheel_error(proc.stderr, choice, idx_notes)
            or (
                _no_wheel_error(proc.stderr, choice, sources, workdir)
                if flags.only_binary
                else None
            )
            or _metadata_build_error(proc.stderr, choice)
            or _uv_error(proc.stderr, reqs, choice, sources)
        )
    from packaging.utils import canonicalize_name

    yanked = _yanked(proc.stderr)
    return [
        p.model_copy(update={"yanked": yanked.get(canonicalize_name(p.name))})
        for p in _pylock_packages(out)
    ]


# uv's warning for a release it takes although its index marks it yanked (PEP 592: only an exact
# pin takes one): `requests==2.32.0` is yanked (reason: "...")
_YANKED = re.compile(r'`([A-Za-z0-9._-]+)==([^`]+)` is yanked(?: \(reason: "(.*)"\))?')


def _yanked(stderr: str) -> dict[str, str]:
    """Normalized name -> why, of each release uv says is yanked (the index's reason, if given)."""
    from packaging.utils import canonicalize_name

    return {
        canonicalize_name(m.group(1)): m.group(3) or "no reason given"
        for m in _YANKED.finditer(stderr)
    }


def _pylock_packages(out: Path) -> list[PylockPackage]:
    """The packages of uv's pylock.toml at ``out``; one not as PEP 751 says: ``SourceError``."""
    raw = tomllib.loads(out.read_text()).get("packages", [])
    packages = []
    for i, p in enumerate(raw):
        try:
            packages.append(PylockPackage.model_validate(p))
        except ValidationError as e:
            first = e.errors()[0]
            where = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in first["loc"])
            raise SourceError(
                f"{out}: uv's resolution is not a pylock.toml envspec reads: packages[{i}]{where}: "
                f"{first['msg']}",
                hint="check `uv --version` (envspec reads uv's PEP 751 output; pip install -U uv)",
                reference="uv-output",
            ) from None
    return packages


def _uv_argv(req: Path, out: Path, choice: Choice, idx: list[str], flags: UvFlags) -> list[str]:
    """`uv pip compile` of ``req`` into ``out`` as pylock.toml, for the choice's Python and
    platform, with the indexes' arguments ``idx``."""
    return [
        _uv(),
        "pip",
        "compile",
        str(req),
        "--format",
        "pylock.toml",
        "-o",
        str(out),
        "--python-version",
        choice.python,
        "--python-platform",
        f"{choice.arch}-manylinux_{choice.glibc}",
        *(["--only-binary", ":all:"] if flags.only_binary else []),
        *(["--no-deps"] if flags.no_deps else []),
        *[a for n in sorted(flags.no_binary) for a in ("--no-binary", n)],
        "--index-strategy",
        "unsafe-best-match",
        "--no-header",
        *idx,
    ]


def _uv_run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run uv, online: it reads each index page it needs, from its HTTP cache where the index let
    it keep the page (PyPI: max-age 600), else from the index. Never ``--offline`` first: offline,
    uv passes over a release whose metadata its cache lacks and takes an older one without failing
    (deepspeed 0.19.8 -> 0.3.1.dev5; vllm 0.19.1 -> 0.16.0, torch 2.10.0 -> 2.9.1 after a lock of
    a spec of torch 2.9), so the answer depended on what other locks had read (issue 57)."""
    import subprocess

    return subprocess.run(argv, capture_output=True, text=True, env=env)


# uv's messages that name a package without a wheel for the platform (compiled by re when a
# resolution fails: explain never reads them)
_NO_VERSION = r"there is no version of ([A-Za-z0-9._-]+)==([^ ,]+)"
_NO_PLATFORM_WHEEL = r"([A-Za-z0-9._-]+)==([^ ,]+) has no wheels with a matching platform tag"
_WHEELS_FOR = r"Wheels are available for `([^`]+)` \(v([^)]+)\) on the following platforms: (.*)"


def _platform_wheel_error(stderr: str, choice: Choice, index_notes: list[str]) -> Exception | None:
    """On a platform other than linux-x86_64, a pinned torch build that no configured index serves
    for it: name the package, the platform and what it does have (exit 2), not a version conflict."""
    from packaging.utils import canonicalize_name

    p = re.search(_NO_PLATFORM_WHEEL, stderr)
    if p is not None:
        return _no_platform_wheel(
            choice, canonicalize_name(p.group(1)), p.group(2), re.search(_WHEELS_FOR, stderr)
        )
    m = re.search(_NO_VERSION, stderr)
    if choice.arch == "x86_64" or m is None or choice.torch is None:
        return None
    name, version = canonicalize_name(m.group(1)), m.group(2)
    if name not in TORCH_FAMILY:
        return None
    spec, v = choice.spec, choice.torch.variant
    row = pypi_platform_build(choice.torch.release.version, choice.platform)
    has = (
        f"PyPI's {choice.platform} wheel of torch {choice.torch.release.version} is its {row.variant} build"
        if row
        else f"PyPI has no {choice.platform} wheel of torch {choice.torch.release.version} on record"
    )
    causes: list[Cause] = [
        NoWheelForPlatform(
            where=spec.problem(("torch", "version"), "").where(spec.file),
            text=f"no {choice.platform} ({choice.platform_tag}) wheel of {name}=={version} on the configured "
            f"indexes ({v.index}); {has} "
            "(compat/data/torch_platforms.toml)",
        )
    ]
    causes += [NoWheelForPlatform(text=n) for n in index_notes]
    return ResolutionImpossible(
        f"{name} {version} has no wheel for {choice.platform}",
        causes=causes,
        hint=(
            f"serve {v.index} through a mirror ([sources].mirrors or pip's config), "
            f"or choose a release and build PyPI has for {choice.platform} "
            f"({_pypi_has(choice.platform)})"
        ),
        reference="no-wheel-for-platform",
    )


def _torch_index_error(stderr: str, choice: Choice, index_notes: list[str]) -> Exception | None:
    """The chosen torch build comes from a PyTorch index that did not answer, and uv found no copy
    of it on a mirror: exit 3 (``index-unavailable``) naming the index and the build, and what the
    reachable indexes offer instead (PyPI's build of the release, and whether it fits), not a
    version conflict."""
    t = choice.torch
    if (
        t is None
        or not t.variant.local
        or not any(n.startswith(f"{t.variant.index} ") for n in index_notes)
    ):
        return None
    if not re.search(r"\btorch\b", stderr):
        return None
    build = f"torch {t.release.version}+{t.variant.local}"
    pypi = t.release.pypi_variant if choice.arch == "x86_64" else None
    pypi_c = next((c for c in t.candidates if c.variant == pypi), None)
    if pypi_c is None:
        offer = f"PyPI has no build of torch {t.release.version} for {choice.platform} on record"
    elif pypi_c.ok:
        offer = (
            f"PyPI serves torch {t.release.version}'s {pypi} build, which fits too: set [torch].cuda = "
            f'"{pypi_c.cuda}" to take it'
        )
    else:
        offer = f"PyPI serves torch {t.release.version}'s {pypi} build, which does not fit these GPUs and driver"
    return SourceError(
        f"{build} ({t.variant.name}, the build that fits these GPUs and driver) comes from "
        f"{t.variant.index}, which does not answer, and no mirror has it; {offer}",
        hint=f"serve {t.variant.index} through a mirror ([sources].mirrors, ENVSPEC_MIRRORS or pip's "
        "config), or name a mirror of the PyTorch index as [sources].torch_index",
        reference="index-unavailable",
    )


# uv: a package none of whose releases has a wheel for the platform (compiled by re on a failure)
_NO_USABLE_WHEELS = r"Wheels are required for `([A-Za-z0-9._-]+)`|([A-Za-z0-9._-]+)(?:==[^ ]+)? has no usable wheels"


def _no_wheel_error(
    stderr: str, choice: Choice, sources: ResolvedSources, workdir: Path
) -> Exception | None:
    """A package with no wheel for the platform and Python (flash-attn: source distributions only):
    named at its place in the spec (its cause's ``package``), with the release a build from source
    would take (uv without ``--only-binary``, no dependencies); not a version conflict. Where the
    spec allows source builds (``[python].from_source``), ``resolve_python`` takes it as an sdist."""
    m = re.search(_NO_USABLE_WHEELS, stderr)
    if m is None:
        return None
    name = m.group(1) or m.group(2)
    try:
        found = _run_uv(
            [name],
            choice,
            sources,
            workdir,
            "sdist",
            UvFlags(torch_index=False, no_deps=True, only_binary=False),
        )
        would = next((p.version for p in found), "")
    except (ResolutionImpossible, SourceError):
        would = ""
    return ResolutionImpossible(
        f"{name} has no wheel for {choice.platform} and Python {choice.python}",
        causes=[
            NoWheel(
                package=name,
                where=_requirement_where(choice, name),
                text=f"no release of {name} has a wheel for {choice.platform} ({choice.platform_tag}) and "
                f'Python {choice.python}, and source builds are off ([python].from_source = "never")'
                + (
                    f" (with a build from source the lock would take {name} {would})"
                    if would
                    else ""
                ),
            )
        ],
        hint=f"drop {name}, pin a version of it that has a wheel for {choice.platform}, or let envspec build it "
        'from its sdist ([python].from_source = "auto", the default)',
        reference="no-wheel",
    )


def _no_wheel_package(e: ResolutionImpossible) -> str | None:
    """The package a ``no-wheel`` error names (``_no_wheel_error``), else None."""
    if e.reference != "no-wheel":
        return None
    return next((c.package for c in e.causes if isinstance(c, NoWheel) and c.package), None)


def _pypi_has(platform: str) -> str:
    """What data/torch_platforms.toml records PyPI serving for ``platform``: "torch >=2.0,<=2.9.1: cpu; ..."."""
    rows = pypi_builds(platform)
    return (
        "; ".join(f"torch {r.torch}: {r.variant}" for r in rows)
        if rows
        else "no torch wheel on record"
    )


def _no_platform_wheel(
    choice: Choice, name: str, version: str, wheels: re.Match[str] | None
) -> Exception:
    """A package whose resolved version has wheels, none of them for the lock's platform: named at
    the spec's requirement for it (else at [python].packages), with the platforms it does have."""
    spec = choice.spec
    path: tuple[str | int, ...] = ("python", "packages")
    for key in (("python", "packages"), ("torch", "packages")):
        section = (
            spec.python.packages
            if key[0] == "python"
            else (spec.torch.packages if spec.torch else [])
        )
        idx = next((i for i, r in enumerate(section) if requirement_name(r) == name), None)
        if idx is not None:
            path = key + (idx,)
            break
    has = (
        f"it has wheels for {wheels.group(3).strip().rstrip('.')}"
        if wheels
        else "it has wheels for other platforms only"
    )
    return ResolutionImpossible(
        f"{name} {version} has no wheel for {choice.platform}",
        causes=[
            NoWheelForPlatform(
                where=spec.problem(path, "").where(spec.file),
                text=f"{name}=={version} has no {choice.platform} ({choice.platform_tag}) wheel; {has}",
            )
        ],
        hint=f"pick a version of {name} with a wheel for {choice.platform}, drop it for this platform, or "
        "lock for the platform it has wheels for ([target].platforms)",
        reference="no-wheel-for-platform",
    )


# uv's explanation of a conflict: a requirement of a package on torch (compiled by re on a failure)
_DEPENDS_ON_TORCH = r"([A-Za-z0-9._-]+)((?:[<>=!~]=?|===)[^ ,]+)? depends on torch((?:[<>=!~]=?|===)[^ ,]+(?:,[<>=!~]=?[^ ,]+)*)"


# a package that no configured index has (compiled by re on a failure)
_NOT_FOUND = r"(?:Because |`)([A-Za-z0-9._-]+)`? was not found in the"


_FAILED_BUILD = r"Failed to build `([A-Za-z0-9._-]+)(?:==|@)([^`]+)`"


def _metadata_build_error(stderr: str, choice: Choice) -> Exception | None:
    """uv asked an sdist's build for its metadata, and the build failed: say which package, that its
    build imports torch where its log says so, and the log's tail (``sdist-metadata-failed``, exit
    2), never an unreachable index."""
    m = re.search(_FAILED_BUILD, stderr)
    if m is None or "build backend returned an error" not in stderr:
        return None
    name, version = m.group(1), m.group(2)
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    said = next((i for i, ln in enumerate(lines) if ln.startswith("hint:")), len(lines))
    tail = lines[:said][-8:]  # the log's tail, without uv's hint (its own project's settings)
    imports_torch = "No module named 'torch'" in stderr
    why = (
        ": its setup imports torch, which its build environment lacks (it does not declare torch "
        "as a build requirement)"
        if imports_torch
        else ""
    )
    return ResolutionImpossible(
        f"{name} {version} is taken from its sdist, and the sdist's build failed when asked for its "
        f"metadata{why}",
        causes=[MetadataBuildFailed(text=ln, package=name) for ln in tail],
        hint=(
            f"a release of {name} with a wheel for {choice.platform} and Python {choice.python} "
            f"(pin it in [python].packages), or drop {name}"
            + (
                "; a build that needs torch is not locked from its sdist yet"
                if imports_torch
                else ""
            )
        ),
        reference="sdist-metadata-failed",
    )


def _uv_error(
    stderr: str,
    reqs: list[str],
    choice: Choice | None = None,
    sources: ResolvedSources | None = None,
) -> Exception:
    text = stderr.strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if "not found in the package registry" in text or "was not found in the" in text:
        return _unknown_packages(re.findall(_NOT_FOUND, text), lines, choice, sources)
    if "No solution found" in text or "unsatisfiable" in text:
        return ResolutionImpossible(
            "the Python packages cannot be installed together",
            causes=[PythonConflict(text=_our_pin(ln.strip(), choice)) for ln in lines[:12]],
            hint=_conflict_hint(text, choice),
            reference="python-conflict",
        )
    return SourceError(
        "the Python resolver (uv) failed:\n  " + "\n  ".join(lines[-12:]),
        hint="check the network or configure a mirror ([sources].mirrors or ENVSPEC_MIRRORS)",
        reference="index-unavailable",
    )


def _unknown_packages(
    missing: list[str], lines: list[str], choice: Choice | None, sources: ResolvedSources | None
) -> ResolutionImpossible:
    """Packages no configured index has: each at its place in the spec, with the names the indexes
    do serve that are closest to it (``sources.close_names``)."""
    from envspec.sources import close_names, project_names  # here: the lock stage only

    names = (
        project_names(sources, cache_dir=cache_dir_for(os.environ))
        if sources is not None and missing
        else set()
    )
    causes: list[Cause] = []
    hints: list[str] = []
    for name in dict.fromkeys(missing):
        close = close_names(name, names) if names else []
        where = _requirement_where(choice, name) if choice is not None else ""
        causes.append(
            PythonMissing(
                where=where,
                text=f"no configured index has a package named {name!r}"
                + (f"; did you mean {close[0]!r}?" if close else ""),
            )
        )
        if close:
            hints.append(
                f"{name!r}: did you mean {close[0]!r}?"
                + (f" (or {', '.join(repr(c) for c in close[1:])})" if close[1:] else "")
            )
    if not causes:
        causes = [PythonMissing(text=ln.strip()) for ln in lines[:8]]
    return ResolutionImpossible(
        "a Python package does not exist on the configured indexes",
        causes=causes,
        hint="; ".join(hints)
        if hints
        else "check the name in [python].packages, or add the index to [sources]",
        reference="unknown-python-package",
    )


def _debian_where(spec: EnvSpec, i: int) -> str:
    """'[system].packages[1] (specs/x.toml:12)' for the spec's i-th Debian package."""
    return spec.problem(("system", "packages", i), "").where(spec.file)


def _requirement_where(choice: Choice, name: str) -> str:
    """'[python].packages[0] (specs/x.toml:9)' for the spec's requirement on ``name``."""
    from packaging.utils import canonicalize_name

    spec = choice.spec
    sections = [(("python", "packages"), spec.python.packages)]
    if spec.torch is not None:
        sections.append((("torch", "packages"), spec.torch.packages))
    for key, reqs in sections:
        for i, r in enumerate(reqs):
            if canonicalize_name(requirement_name(r)) == canonicalize_name(name):
                return spec.problem((*key, i), "").where(spec.file)
    return ""


def _our_pin(line: str, choice: Choice | None) -> str:
    """uv says "you require torch==X" of the pin envspec added for the chosen release: say so."""
    t = choice.torch if choice is not None else None
    if t is None:
        return line
    local = f"+{t.variant.local}" if t.variant.local else ""
    return line.replace(
        f"you require torch=={t.release.version}{local}",
        f"envspec chose torch=={t.release.version}{local} (the newest release within [torch].version "
        "that fits the GPUs, driver and platform, or the one the named packages accept)",
    )


def _conflict_hint(text: str, choice: Choice | None) -> str:
    """The binding constraint of a conflict, where uv names a package's requirement on torch that
    the chosen release does not meet: what to set, else the general advice."""
    t = choice.torch if choice is not None else None
    m = re.search(_DEPENDS_ON_TORCH, text)
    if t is None or m is None:
        return "relax a version in [python].packages; uv's explanation is above"
    from packaging.specifiers import (
        InvalidSpecifier,
        SpecifierSet,
    )  # here: explain does without them

    who, needs = m.group(1) + (m.group(2) or ""), m.group(3)
    try:
        wants = SpecifierSet(needs)
    except InvalidSpecifier:
        return "relax a version in [python].packages; uv's explanation is above"
    if wants.contains(t.release.version, prereleases=True):
        return "relax a version in [python].packages; uv's explanation is above"
    exact = needs[2:] if needs.startswith("==") and "," not in needs and "*" not in needs else ""
    setting = (
        f'set [torch].version = "{".".join(exact.split(".")[:2])}.*"'
        if exact
        else f"set [torch].version to a release {who} accepts (torch{needs})"
    )
    assert choice is not None and choice.spec.torch is not None
    return (
        f'{who} requires torch{needs}, and [torch].version = "{choice.spec.torch.version}" gives torch '
        f"{t.release.version}: {setting}, or leave the choice to envspec (a wider [torch].version: the lock "
        f"chooses torch and the packages together), or pin an older {m.group(1)}"
    )


def _canonical_url(url: str, choice: Choice, sources: ResolvedSources) -> str | None:
    """The canonical index a file's URL is on (uv read it there, with its sha256); None for a
    mirror's."""
    for idx in [sources.index, *sources.extra_indexes]:
        if url.startswith(idx.rsplit("/simple", 1)[0]):
            return idx
    parsed = urlparse(url)
    if parsed.hostname == "files.pythonhosted.org":
        return sources.index
    on_torch_index = url.startswith(sources.torch_index.rstrip("/") + "/")
    if choice.torch is not None and (
        on_torch_index or (parsed.hostname and "pytorch.org" in parsed.hostname)
    ):
        return choice.torch.variant.index
    return None


def _serving(name: str, choice: Choice, sources: ResolvedSources) -> list[str]:
    """The canonical indexes that may serve a package's files, in the order they are asked: the
    PyTorch index of the chosen build for torch's family where that build is not PyPI's, else the
    spec's indexes (and that PyTorch index last, which serves some common packages too)."""
    variant = choice.torch.variant if choice.torch is not None else None
    if variant is not None and variant.local and name in TORCH_FAMILY:
        return [variant.index]
    out = [sources.index, *sources.extra_indexes]
    if variant is not None and variant.local:
        out.append(variant.index)
    return out


def _attribute_index(
    url: str, name: str, choice: Choice, sources: ResolvedSources, filename: str, sha256: str
) -> str:
    """The canonical index a locked file is credited to: the one uv read it from, or, for a file a
    mirror served, the one that lists it with the same sha256 (``sources.credit``)."""
    on = _canonical_url(url, choice, sources)
    if on is not None:
        return on
    from envspec.sources import credit  # here: the lock stage only

    return credit(url, filename, sha256, name, _serving(name, choice, sources), sources)


def with_packages(
    choice: Choice, db: CompatDB, sources: ResolvedSources, *, workdir: Path
) -> Choice:
    """Torch and the packages the spec names, chosen together. ``choose`` takes the newest torch
    release that fits the hardware; a package resolved around it afterwards can only move back, to
    an old release with no bound on torch (vllm 0.2.2 beside torch 2.15.0, which it does not import
    with). Here the named packages come first: uv resolves them, in the spec's order, with torch
    free among the fitting releases, so each takes its newest release and torch the newest release
    they all accept; the choice is then made again for that release (its build, driver floor and
    arch list follow from it), with ``passed_over`` saying which newer fitting releases were passed
    over for which package. Unchanged where the spec names no package, where one release fits, or
    where they cannot be resolved together (the resolution of the chosen release then says why)."""
    spec = choice.spec
    if choice.torch is None or spec.torch is None:
        return choice
    named = _named(spec)
    fitting = fitting_releases(spec, db, choice.gpus, choice.arch)
    if not named or len(fitting) < 2:
        return choice
    try:
        found = _run_uv(
            named + [_torch_among(fitting, [r.version for r in _releases(spec, db)])],
            choice,
            sources,
            workdir,
            "together",
            UvFlags(constraints=list(spec.python.constraints), torch_index=False),
        )
    except (ResolutionImpossible, SourceError):
        common = _raise_sides(choice, db, sources, workdir, named, fitting)
        if common is None or common == choice.torch.release.version:
            return choice
        # each installs beside torch ``common``: what conflicts is another pin, which the
        # resolution of that release names (not a torch none of them takes)
        return choose(
            spec,
            db,
            platform=choice.platform if len(spec.target.platforms) > 1 else None,
            torch_version=common,
        )
    from packaging.utils import canonicalize_name  # here: explain does without packaging.utils

    got = next((p for p in found if canonicalize_name(p.name) == "torch"), None)
    if got is None:
        return choice
    version = str(Version(got.version).public)
    if version == choice.torch.release.version or version not in fitting:
        return choice
    newer = [v for v in fitting if Version(v) > Version(version)]
    held = _held_for(found, named, newer, choice)
    again = choose(
        spec,
        db,
        platform=choice.platform if len(spec.target.platforms) > 1 else None,
        torch_version=version,
    )
    return dataclasses.replace(again, passed_over=tuple(held))


def _asker(choice: Choice, db: CompatDB, sources: ResolvedSources, workdir: Path) -> Ask:
    """``sides.Ask`` through uv: a requirement with torch among the given releases (on another
    Python where one is named), answered by the torch release uv takes, None where it fails."""
    import itertools

    from packaging.utils import canonicalize_name  # here: explain does without packaging.utils

    in_range = [r.version for r in _releases(choice.spec, db)]
    n = itertools.count()

    def ask(requirement: str, releases: Sequence[str], python: str) -> str | None:
        ch = dataclasses.replace(choice, python=python) if python else choice
        try:
            found = _run_uv(
                [requirement, _torch_among(list(releases), in_range)],
                ch,
                sources,
                workdir,
                f"side-{next(n)}",
                UvFlags(constraints=list(choice.spec.python.constraints), torch_index=False),
            )
        except (ResolutionImpossible, SourceError):
            return None
        got = next((p for p in found if canonicalize_name(p.name) == "torch"), None)
        return str(Version(got.version).public) if got is not None else None

    return ask


def _raise_sides(
    choice: Choice,
    db: CompatDB,
    sources: ResolvedSources,
    workdir: Path,
    named: list[str],
    fitting: list[str],
) -> str | None:
    """Where the named packages and torch cannot be resolved together, say every side (issue 57,
    point 4): ``torch-conflict`` naming each package with the fitting releases it installs beside
    where no release is common to them all, or the Python where it is what rules a package out.
    Returns the newest release they each install beside, where there is one (the conflict is over
    another pin), else None where it cannot tell (the chosen release's resolution says why)."""
    from envspec import sides as sidesmod  # here: the lock stage only

    ask = _asker(choice, db, sources, workdir)
    found = sidesmod.find(named, fitting, ask)
    spec = choice.spec
    where = {r: _requirement_where(choice, requirement_name(r)) for r in named}
    causes = [dataclasses.replace(c, where=where[c.requirement]) for c in found.sides]
    empty = [c for c in causes if not c.releases]
    if empty:
        releases = _releases(spec, db)
        in_range = [r.version for r in releases]
        mine = int(choice.python.split(".")[1])
        others = sorted(  # nearest the spec's Python first, the older of two as near
            {p for r in releases for p in r.python} - {choice.python},
            key=lambda p: (abs(int(p.split(".")[1]) - mine), int(p.split(".")[1])),
        )
        ruled = []
        for c in empty:
            ok = sidesmod.python_for(c.requirement, in_range, others, ask)
            if ok:
                ruled.append(dataclasses.replace(c, python=choice.python, pythons=(ok,)))
        if ruled:
            first = ruled[0]
            raise ResolutionImpossible(
                f"{', '.join(c.requirement for c in ruled)}: no release installs on Python "
                f"{choice.python} beside a torch that fits",
                causes=ruled,
                hint=f'set [python].version = "{first.pythons[0]}" (where {first.requirement} '
                f"installs), or drop {first.requirement}",
                reference="python-rules-out-package",
            )
        return None
    if found.decided and found.common:
        return found.common[0]
    if not found.decided or len(causes) < 2:
        return None
    shown = "; ".join(f"{c.requirement}: torch {', '.join(c.releases)}" for c in causes)
    raise ResolutionImpossible(
        f"the packages the spec names install beside no common torch release ({shown})",
        causes=causes,
        hint="no [torch].version installs them all: change or drop one of "
        + ", ".join(c.requirement for c in causes)
        + " (a release of one that installs beside a torch the other accepts)",
        reference="torch-conflict",
    )


def _held_for(
    found: list[PylockPackage], named: list[str], newer: list[str], choice: Choice
) -> list[PassedOver]:
    """Which package held torch back from each of the ``newer`` fitting releases: a named one;
    else torch's own family (torchvision, torchaudio, ... pin torch exactly); else another
    dependency, whose metadata is not read (no package named)."""
    from packaging.utils import canonicalize_name  # here: explain does without packaging.utils

    wanted = {canonicalize_name(requirement_name(r)) for r in named}
    held = [
        h for p in found if canonicalize_name(p.name) in wanted for h in _excludes(p, newer, choice)
    ]
    if not held:
        held = [
            h
            for p in found
            if canonicalize_name(p.name) in TORCH_FAMILY - {"torch"}
            for h in _excludes(p, newer, choice)
        ]
    if not held:
        held = [PassedOver(torch=v, package="", version="", requires="") for v in newer]
    return held


def _torch_among(fitting: list[str], in_range: list[str]) -> str:
    """A requirement on torch that admits the ``fitting`` releases (and their local builds) and no
    other DB release within the spec's range: ``torch>=LOW,<NEXT,!=...``."""
    low, high = min(fitting, key=Version), max(fitting, key=Version)
    above = sorted((v for v in in_range if Version(v) > Version(high)), key=Version)
    nxt = (
        above[0]
        if above
        else ".".join(map(str, (*Version(high).release[:2], Version(high).micro + 1)))
    )
    skip = [v for v in in_range if Version(low) < Version(v) < Version(high) and v not in fitting]
    return f"torch>={low},<{nxt}" + "".join(f",!={v}" for v in sorted(skip, key=Version))


def _excludes(package: PylockPackage, newer: list[str], choice: Choice) -> list[PassedOver]:
    """The ``newer`` torch releases that ``package`` (a uv pylock entry) does not accept, by the
    Requires-Dist on torch in its wheel's metadata (none where the metadata cannot be read)."""
    from packaging.requirements import Requirement  # here: explain does without the marker grammar
    from packaging.utils import canonicalize_name

    if not package.wheels or not newer:
        return []
    try:
        text = _wheel_metadata(package.wheels[0])
    except (OSError, ValueError, SourceError):
        return []
    env = {
        "python_version": choice.python,
        "python_full_version": f"{choice.python}.0",
        "platform_machine": choice.arch,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        try:
            req = Requirement(line.split(":", 1)[1].strip())
        except ValueError:
            continue
        if canonicalize_name(req.name) != "torch" or (
            req.marker is not None and not req.marker.evaluate(env)
        ):
            continue
        out += [
            PassedOver(
                torch=v,
                package=canonicalize_name(package.name),
                version=package.version,
                requires=f"torch{req.specifier}",
            )
            for v in newer
            if not req.specifier.contains(Version(v), prereleases=True)
        ]
    return out


def _wheel_metadata(wheel: PylockFile) -> str:
    """The METADATA of a wheel in uv's pylock (its ``url`` or local ``path``), read in place: a
    local file's members, a remote one's by range requests (``compat.pypi.read_zip_member``)."""
    from envspec.compat.pypi import (
        default_fetch_range,
        read_zip_member,
    )  # here: the lock stage only

    url = wheel.url
    path = (
        Path(unquote(urlparse(url).path))
        if url.startswith("file://")
        else (Path(wheel.path) if wheel.path else None)
    )
    if path is not None:
        import zipfile

        with zipfile.ZipFile(path) as z:
            name = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
            if name is None:
                raise ValueError(f"{path.name} has no .dist-info/METADATA")
            return z.read(name).decode("utf-8", "replace")
    size = wheel.size
    if not url or not size:
        raise ValueError("no URL and size to read the metadata by")
    return read_zip_member(url, size, ".dist-info/METADATA", default_fetch_range).decode(
        "utf-8", "replace"
    )


def _kept_pins(keep: Mapping[str, str], upgrade: list[str]) -> list[str]:
    """The previous lock's versions as constraints, but torch's and those ``upgrade`` frees."""
    from packaging.utils import canonicalize_name

    freed = {canonicalize_name(u) for u in upgrade}
    return [
        f"{name}=={version}"
        for name, version in keep.items()
        if canonicalize_name(name) not in freed and canonicalize_name(name) != "torch"
    ]


def resolve_python(
    choice: Choice,
    sources: ResolvedSources,
    *,
    workdir: Path,
    keep: Mapping[str, str] | None = None,
    upgrade: list[str] | None = None,
) -> list[WheelCandidate]:
    """The Python closure on the image's platform. ``keep``: name -> version of the previous lock's
    wheels, kept where the spec still allows them. Wheels only, except where the spec allows source
    builds (``[python].from_source = "auto"``, the default): a package the spec names whose newest
    release has no wheel, and any package with no wheel at all, are taken as sdists (``source_only``)."""
    from packaging.utils import canonicalize_name  # packaging.tags: the lock stage only

    torch_reqs, all_reqs, direct = requirements(choice)
    if not all_reqs:
        return []
    auto = choice.spec.python.from_source == "auto"
    no_binary = source_only(choice, sources, workdir) if auto else set()

    def closure(upgrade: list[str], constraints: list[str]) -> list[PylockPackage]:
        while (
            True
        ):  # each package uv finds with no wheel at all is taken as an sdist, and uv runs again
            flags = UvFlags(upgrade=upgrade, constraints=constraints, no_binary=no_binary)
            try:
                return _run_uv(all_reqs, choice, sources, workdir, "full", flags)
            except ResolutionImpossible as e:
                name = _no_wheel_package(e)
                if not auto or name is None or canonicalize_name(name) in no_binary:
                    raise
                no_binary.add(canonicalize_name(name))

    # Re-locking keeps the old lock's versions (as constraints) unless the spec no longer allows them
    # or --upgrade-package frees them; then it resolves afresh.
    spec_constraints = list(choice.spec.python.constraints)
    kept = _kept_pins(keep or {}, upgrade or [])
    full = None
    if kept:
        try:
            full = closure([], spec_constraints + kept)
        except ResolutionImpossible:
            full = None
    if full is None:
        full = closure(upgrade or [], spec_constraints)
    pins = {canonicalize_name(p.name): p.version for p in full}
    torch_names: set[str] = set()
    if torch_reqs:
        flags = UvFlags(constraints=[f"{n}=={v}" for n, v in pins.items()], no_binary=no_binary)
        sub = _run_uv(torch_reqs, choice, sources, workdir, "torch", flags)
        torch_names = {canonicalize_name(p.name) for p in sub}
    out: list[WheelCandidate] = []
    for p in full:
        name = canonicalize_name(p.name)
        if name in torch_names:
            group = "cuda" if _is_cuda_wheel(name) else "torch"
        else:
            group = "team" if name in direct else "deps"
        out.append(_candidate(p, choice, sources, group=group, direct=name in direct))
    return sorted(out, key=lambda w: (w.name, w.version, w.filename))


def _named(spec: EnvSpec) -> list[str]:
    """The requirements the spec names: [python].packages, then [torch].packages."""
    return list(spec.python.packages) + (list(spec.torch.packages) if spec.torch else [])


def _newest_any(
    choice: Choice, sources: ResolvedSources, workdir: Path
) -> dict[str, tuple[str, bool]] | None:
    """name -> (version, has a wheel) of the newest release of each package the spec names, of any
    kind (uv without ``--only-binary``, no dependencies); None where they cannot be resolved alone.
    Read once per work directory: ``source_only`` and ``held_back`` both ask."""
    import json

    from packaging.utils import canonicalize_name

    named = _named(choice.spec)
    workdir.mkdir(parents=True, exist_ok=True)
    memo = workdir / "newest-any.json"
    asked = [*named, choice.platform_tag, choice.python]
    if memo.is_file():
        kept = json.loads(memo.read_text())
        if kept["asked"] == asked:
            return (
                {k: (v[0], v[1]) for k, v in kept["found"].items()}
                if kept["found"] is not None
                else None
            )
    found: dict[str, tuple[str, bool]] | None
    try:
        found = {
            canonicalize_name(p.name): (p.version, bool(p.wheels))
            for p in _run_uv(
                named,
                choice,
                sources,
                workdir,
                "newest-any",
                UvFlags(torch_index=False, no_deps=True, only_binary=False),
            )
        }
    except (ResolutionImpossible, SourceError):
        found = None
    memo.write_text(json.dumps({"asked": asked, "found": found}))
    return found


def source_only(choice: Choice, sources: ResolvedSources, workdir: Path) -> set[str]:
    """The packages the spec names whose newest release (for its own requirement, the platform and
    Python) is published as an sdist only: deepspeed 0.19.8, where a wheel-only resolution takes
    0.3.1.dev5, its one release with a wheel. An empty set where the packages cannot be resolved
    alone (the full resolution then says why)."""
    if not _named(choice.spec):
        return set()
    found = _newest_any(choice, sources, workdir) or {}
    return {name for name, (_, has_wheel) in found.items() if not has_wheel}


def _candidate(
    p: PylockPackage, choice: Choice, sources: ResolvedSources, *, group: str, direct: bool = False
) -> WheelCandidate:
    """A package of uv's pylock.toml output as its pin: its wheel, or its sdist where uv took that
    (``resolve_python``'s no_binary: built from source); ``no-wheel`` where it has neither."""
    from packaging.utils import canonicalize_name, parse_wheel_filename

    name = canonicalize_name(p.name)
    wheels = p.wheels
    f = wheels[0] if wheels else p.sdist
    if not f:
        raise ResolutionImpossible(
            f"{name} {p.version} has no wheel for {choice.platform_tag}",
            causes=[
                NoWheel(
                    text=f"{name} {p.version} has neither a wheel "
                    f"for {choice.platform_tag} nor a source distribution",
                )
            ],
            hint="pick a version with a manylinux wheel or an sdist",
            reference="no-wheel",
        )
    url = f.url or f.path
    filename = f.name or unquote(url.rsplit("/", 1)[-1].split("#", 1)[0])
    if wheels:
        parse_wheel_filename(filename)
    size = f.size
    if not size and url.startswith(
        "file://"
    ):  # a local mirror's page may omit sizes; the file says
        with contextlib.suppress(OSError):
            size = os.stat(unquote(urlparse(url).path)).st_size
    return WheelCandidate(
        name=name,
        version=p.version,
        filename=filename,
        index=_attribute_index(url, name, choice, sources, filename, f.hashes["sha256"]),
        sha256=f.hashes["sha256"],
        size=size,
        group=group,
        direct=direct,
        yanked=p.yanked,
        installs_nothing=direct and bool(wheels) and _installs_nothing(url, size),
    )


EMPTY_WHEEL_MAX = 64 * 1024  # a wheel larger than this ships something: not read to find out


def _installs_nothing(url: str, size: int) -> bool:
    """Whether a (small) wheel installs nothing: it holds only its ``.dist-info`` and requires
    nothing (transformer-engine 0.0.0: "Coming soon", 1,097 bytes), a name kept on an index. A
    wheel that cannot be read here is not judged (False)."""
    import io
    import urllib.request
    import zipfile

    from envspec import settings

    if not 0 < size <= EMPTY_WHEEL_MAX:
        return False
    try:
        if url.startswith("file://") or "://" not in url:
            data = Path(unquote(urlparse(url).path)).read_bytes()
        elif settings.read().offline:
            return False
        else:
            with urllib.request.urlopen(url, timeout=30) as resp:  # noqa: S310 (an index's file)
                data = resp.read(EMPTY_WHEEL_MAX + 1)
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            names = z.namelist()
            meta = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
            requires = meta is not None and b"\nRequires-Dist:" in z.read(meta)
    except (OSError, ValueError, zipfile.BadZipFile):
        return False
    return not requires and all(n.split("/", 1)[0].endswith(".dist-info") for n in names)


def build_inputs(
    requires: list[str],
    choice: Choice,
    sources: ResolvedSources,
    *,
    workdir: Path,
    name: str,
    constraints: list[str] | None = None,
) -> list[WheelCandidate]:
    """An sdist's build requirements (``wheels.sdist.build_system``) pinned as wheels for the
    image's platform and Python, each with its sha256: exactly what its isolated build environment
    holds (issue 37). ``name``: the package built, for the work files' names; ``constraints``: the
    lock's own pins (a build against torch gets the lock's torch)."""
    if not requires:
        return []
    found = _run_uv(
        list(requires),
        choice,
        sources,
        workdir,
        f"build-{name}",
        UvFlags(
            constraints=list(constraints or []),
            torch_index=any(requirement_name(r).lower() == "torch" for r in requires),
        ),
    )
    return sorted(
        (_candidate(p, choice, sources, group="build") for p in found),
        key=lambda w: (w.name, w.version, w.filename),
    )


# ---------------------------------------------------------------------------------------
# the Debian closure, through apt (envspec.debian)


def debian_request(choice: Choice) -> list[str]:
    spec = choice.spec
    if choice.suite is None:
        raise ValueError(
            'a lock without a Debian base ([system].base = "none") asks for no Debian packages'
        )
    services = {
        k
        for k in ("jupyter", "ssh")
        if getattr(spec.services, k) and getattr(spec.services, k).enabled
    }
    # torch.compile needs a compiler at run time: Triton builds a C helper (gcc + Python headers) on
    # GPUs, Inductor emits C++ (g++) on CPUs; torch itself links libstdc++. A spec can opt out.
    compiler = spec.system.compiler if spec.system.compiler is not None else spec.torch is not None
    base = set(debian.base_packages(choice.suite, gpu=compiler, services=services))
    if spec.torch is not None:
        base.add("libstdc++6")
        if compiler:
            base.add("g++")
    return sorted(base | set(spec.system.packages))


def resolve_debian(
    choice: Choice, sources: ResolvedSources, *, cache_dir: Path
) -> tuple[list[DebPin], list[str]]:
    if choice.suite is None:
        return [], []
    requested = debian_request(choice)
    try:
        pins = debian.resolve_closure(
            choice.suite,
            requested,
            cache_dir=cache_dir,
            archive=debian.DebianArchive(
                mirror=sources.debian_mirror,
                security_mirror=sources.debian_security_mirror,
                architecture=choice.debian_arch,
            ),
        )
    except ResolutionImpossible as e:  # an unknown package the spec names: its key and line
        wanted = choice.spec.system.packages
        e.causes = [
            replace(c, where=_debian_where(choice.spec, wanted.index(c.name)))
            if isinstance(c, UnknownDebianPackage) and c.name in wanted
            else c
            for c in e.causes
        ]
        raise
    return pins, requested


def _newer_with_wheel(
    name: str,
    top: PylockPackage,
    have: Version,
    torch_version: str | None,
    choice: Choice,
    where: tuple[ResolvedSources, Path],
) -> str:
    """Why the lock holds ``name`` at ``have`` below ``top``, its newest release with a wheel."""
    sources, workdir = where
    reason = _holds_back(top, torch_version, choice, sources, workdir)
    if reason.startswith("Python "):  # an index that does not say Requires-Python (find-links)
        return (
            f"{name} {top.version} needs a newer Python than {choice.python} (Requires-Python "
            f"{reason.split(' ', 1)[1]}); its newest release for Python {choice.python} is {have}"
        )
    return (
        f"{name} {top.version} is the newest release with a wheel for {choice.platform} and "
        f"Python {choice.python}; " + reason
    )


def held_back(
    choice: Choice, wheels: list[WheelCandidate], sources: ResolvedSources, *, workdir: Path
) -> dict[str, str]:
    """name -> why, for each package the spec names that the resolution holds below the newest
    release its own requirement admits for the platform and Python, or at a pre-release nobody
    asked for: the newest release's requirement on torch that the lock's torch does not meet, a
    newer release with no wheel (where source builds are off), a newer Python where the index does
    not say a release's Requires-Python (uv takes it for this Python, and it then cannot be
    installed), else the other packages' requirements; any yanked or empty release
    (``_placeholders``). A release for a newer Python only, on an index that says so, is no release
    for this Python (numpy 2.5 on Python 3.11). Found with two uv runs without dependencies."""
    from packaging.utils import canonicalize_name  # here: explain does without packaging.utils

    spec = choice.spec
    pins = {w.name: w for w in wheels}
    named = [r for r in _named(spec) if canonicalize_name(requirement_name(r)) in pins]
    placeholders = _placeholders(wheels, choice, sources, workdir)
    if not named:
        return placeholders
    try:
        newest = {
            canonicalize_name(p.name): p
            for p in _run_uv(
                named, choice, sources, workdir, "newest", UvFlags(torch_index=False, no_deps=True)
            )
        }
    except (ResolutionImpossible, SourceError):
        return placeholders
    found = _newest_any(choice, sources, workdir)
    if found is None:
        return placeholders
    any_kind = {name: version for name, (version, _) in found.items()}
    torch_version = next((w.version for w in wheels if w.name == "torch"), None)
    out: dict[str, str] = {}
    for req in named:
        name = canonicalize_name(requirement_name(req))
        have = Version(pins[name].version)
        why: list[str] = []
        top = newest.get(name)
        covered = have  # the newest release already explained
        if top is not None and Version(top.version) > have:
            why.append(
                _newer_with_wheel(name, top, have, torch_version, choice, (sources, workdir))
            )
            covered = Version(top.version)
        if name in any_kind and Version(any_kind[name]) > covered:
            why.append(
                f"{name} {any_kind[name]} has no wheel for {choice.platform} and Python {choice.python} (a "
                f'source distribution only), and source builds are off ([python].from_source = "never"); '
                f"with a build from source the lock could take {any_kind[name]}"
            )
        if have.is_prerelease and not _asks_prerelease(req):
            why.append(f"{have} is a pre-release the spec does not ask for")
        if not any(have.release):  # 0.0.0: a name held on the index, no code (issue 57, 6)
            why.insert(0, _placeholder(name, have, top))
        if name in placeholders:
            why.insert(0, placeholders.pop(name))
        if why:
            out[name] = "; ".join(why)
    return {**out, **placeholders}


def _placeholders(
    wheels: list[WheelCandidate], choice: Choice, sources: ResolvedSources, workdir: Path
) -> dict[str, str]:
    """name -> why, for each locked release its index marks yanked (any package: an exact pin took
    it) and each named package's release that installs nothing, with the newest release that is
    neither: uv without the pins (it takes no yanked release) and without the empty release,
    dependencies left out."""
    from packaging.utils import canonicalize_name

    odd = [
        w
        for w in wheels  # a 0.0.0 is said as such (``_placeholder``)
        if w.yanked is not None or (w.installs_nothing and any(Version(w.version).release))
    ]
    if not odd:
        return {}
    real: dict[str, str]
    try:
        real = {
            canonicalize_name(p.name): p.version
            for p in _run_uv(
                [w.name if w.yanked is not None else f"{w.name}!={w.version}" for w in odd],
                choice,
                sources,
                workdir,
                "not-yanked",
                UvFlags(torch_index=False, no_deps=True),
            )
            if not (
                p.wheels
                and _installs_nothing(p.wheels[0].url or p.wheels[0].path, p.wheels[0].size)
            )
        }
    except (ResolutionImpossible, SourceError):
        real = {}
    return {w.name: _placeholder_said(w, real.get(w.name), choice) for w in odd}


def _placeholder_said(w: WheelCandidate, newest: str | None, choice: Choice) -> str:
    """Why a yanked or empty release is held back, and the newest release that is neither."""
    where = f"for {choice.platform} and Python {choice.python}"
    if w.yanked is not None:
        return f"{w.name} {w.version} is yanked on its index (reason: {w.yanked}); " + (
            f"the newest release that is not is {newest}"
            if newest
            else f"no release of it that is not yanked has a wheel {where}"
        )
    return (
        f"{w.name} {w.version} installs nothing (its wheel holds only its metadata and requires "
        "nothing): a placeholder release; "
        + (
            f"the newest release before it with a wheel {where} is {newest}"
            if newest
            else f"no other release of it with a wheel {where} installs something"
        )
    )


def _placeholder(name: str, have: Version, top: PylockPackage | None) -> str:
    """Why a 0.0.0 release is held back: a placeholder, and the newest real release."""
    real = top.version if top is not None and Version(top.version) > have else None
    return f"{name} {have} is a placeholder release (version 0.0.0: a name kept on the index, " + (
        f"no code); the newest real release is {real}" if real else "no code)"
    )


def _holds_back(
    top: PylockPackage,
    torch_version: str | None,
    choice: Choice,
    sources: ResolvedSources,
    workdir: Path,
) -> str:
    """Why the lock does not take ``top`` (a uv pylock entry): its requirement on torch against the
    lock's torch, by its wheel's metadata; else its own requirements, where it cannot be installed
    even alone (vllm 0.34.0: torch==2.14.0 beside torchaudio==2.11.0, which needs torch 2.11.0);
    else the other packages' requirements."""
    if torch_version is not None:
        for h in _excludes(top, [torch_version], choice):
            return f"it requires {h.requires}, and the lock's torch is {torch_version}"
    try:
        _run_uv(
            [f"{top.name}=={top.version}"],
            choice,
            sources,
            workdir,
            "alone",
            UvFlags(torch_index=False),
        )
    except ResolutionImpossible as e:
        said = [
            c.text
            for c in e.causes
            if isinstance(c, PythonMissing) or (isinstance(c, Said) and "Because" in c.text)
        ]
        python = re.search(r"requires Python ([^ ,]+)", " ".join(said))
        if python is not None:
            return f"Python {python.group(1)}"
        return "it cannot be installed even alone, its own requirements conflict" + (
            f" ({said[0].removeprefix('cause: ').strip()})" if said else ""
        )
    except SourceError:
        pass
    return "the other packages' requirements hold it back"


def _asks_prerelease(req: str) -> bool:
    """Whether a requirement names a pre-release (``vllm>=0.35.0rc1``): then one is asked for."""
    from packaging.requirements import InvalidRequirement, Requirement  # here: the lock stage only

    try:
        return any(
            Version(s.version).is_prerelease
            for s in Requirement(req).specifier
            if not s.version.endswith(".*")
        )
    except (InvalidRequirement, ValueError):
        return False


def resolve(
    choice: Choice,
    sources: ResolvedSources,
    *,
    cache_dir: Path,
    keep: Mapping[str, str] | None = None,
    upgrade: list[str] | None = None,
    db: CompatDB | None = None,
) -> Resolution:
    """The lock stage's resolution of a choice: torch moved to fit the named packages where ``db``
    is given (``with_packages``), the Python closure, the Debian closure."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="envspec-resolve-") as tmp:
        if db is not None:
            choice = with_packages(choice, db, sources, workdir=Path(tmp))
            kept_torch = (keep or {}).get("torch")
            if (
                choice.torch is not None
                and kept_torch
                and Version(kept_torch).public != choice.torch.release.version
            ):
                keep = {}  # another torch release: the old lock's versions are no guide (they fit the old one)
        wheels = resolve_python(choice, sources, workdir=Path(tmp), keep=keep, upgrade=upgrade)
        if db is not None:  # the lock stage: say which named package is held back, and why
            why = held_back(choice, wheels, sources, workdir=Path(tmp))
            wheels = [dataclasses.replace(w, held_back=why.get(w.name)) for w in wheels]
    debs, requested = resolve_debian(choice, sources, cache_dir=cache_dir / "apt")
    return Resolution(choice=choice, wheels=wheels, debs=debs, deb_requested=requested)

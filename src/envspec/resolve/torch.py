"""The pure choice of torch: ``choose`` picks the torch release and its CUDA build for the spec's
GPUs, driver and platform from the compatibility DB, keeping every candidate's reason, offline
(``envspec explain`` uses it alone); ``fitting_releases``, ``driver_floor``; and the facts of a
choice that cannot be made (``_impossible``, ``what_would_fit``)."""

from __future__ import annotations

import re
from dataclasses import replace

from packaging.version import Version

from envspec.causes import (
    ArchFits,
    ArchMissing,
    Candidate,
    Cause,
    CudaNotOffered,
    DriverFloor,
    DriverPastGpu,
    DriverTooOld,
    PythonUnsupported,
    ReleaseNeedsReview,
    Suggestion,
    UnknownCuda,
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
from envspec.compat.platforms import PypiBuild, pypi_build
from envspec.errors import Problem, ResolutionImpossible, SpecError
from envspec.resolve.model import HOST_GLIBC, SUITES, Choice, TorchChoice
from envspec.spec import EnvSpec

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

"""Read the DB's data files, check them, and build a ``CompatDB``. Reports every problem at once.
A DB checked before is read from the cache of checked DBs (``cache.py``) instead."""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import ValidationError

from envspec.compat import cache
from envspec.compat.arch import parse_arch, parse_cc
from envspec.compat.model import (
    PYPI_INDEX,
    PYTORCH_INDEX,
    CompatDB,
    CudaToolkit,
    Family,
    Gpu,
    PcieLink,
    TorchRelease,
    Variant,
)
from envspec.errors import CompatDBError

if TYPE_CHECKING:
    from envspec.compat.rows import BuildRow, FamilyRow, GpuRow, PypiRow, Row, ToolkitRow

FORMAT = (
    1  # the manifest's (db.toml's) format this code reads; each data file's own is in FILE_FORMATS
)
DATA_DIR = Path(__file__).parent / "data"
MANIFEST = "db.toml"
FILES = {
    "torch_pypi.toml": "torch releases on PyPI: Python versions, the PyPI build's CUDA/cuDNN/NCCL pins (generated)",
    "torch_variants.toml": "CUDA variants on the PyTorch index: CUDA, cuDNN, NCCL, arch lists (curated)",
    "cuda.toml": "CUDA toolkits: driver floors and nvcc targets (curated)",
    "gpus.toml": "GPUs: architecture families by compute capability (driver branches), and each GPU's names, "
    "product line, memory, peak rates (curated)",
}
# the format of each file this code reads (gpus.toml 2: [[family]] rows per compute capability)
FILE_FORMATS = {
    MANIFEST: FORMAT,
    "torch_pypi.toml": 1,
    "torch_variants.toml": 1,
    "cuda.toml": 1,
    "gpus.toml": 2,
}
LINES = {
    "datacenter": "data center",
    "workstation": "workstation",
    "geforce": "GeForce and TITAN",
    "jetson": "Jetson (integrated)",
}


_R = TypeVar("_R", bound="Row")


HOST_ARCHS = ("x86_64", "aarch64")
TOOLKIT_FIELDS = ("driver_strict", "driver_compat", "archs")


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, file: str, where: str, message: str) -> None:
        self.items.append(f"{file}: {where}: {message}" if where else f"{file}: {message}")

    def raise_if_any(self, root: Path) -> None:
        if not self.items:
            return
        n = len(self.items)
        head = f"compatibility DB at {root}: {n} problem{'s' if n != 1 else ''}"
        raise CompatDBError(
            "\n".join([head] + [f"  {p}" for p in self.items]),
            hint="fix the data file (each row needs a source), or run `envspec db refresh` "
            "to regenerate torch_pypi.toml",
        )


def _read(root: Path, name: str, problems: _Problems) -> dict[str, Any]:
    path = root / name
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.add(name, "", f"missing (expected at {path})")
        return {}
    except tomllib.TOMLDecodeError as exc:
        problems.add(name, "", f"not valid TOML: {exc}")
        return {}
    fmt, want = data.get("format"), FILE_FORMATS[name]
    if fmt != want:
        problems.add(
            name,
            "format",
            f"unknown format {fmt!r}; this envspec reads format {want}"
            + (" (a newer envspec wrote it?)" if isinstance(fmt, int) and fmt > want else ""),
        )
        return {}
    return data


def _rows(
    data: dict[str, Any], key: str, model: type[_R], file: str, problems: _Problems, label: str
) -> list[tuple[str, _R]]:
    out: list[tuple[str, _R]] = []
    raw = data.get(key, [])
    if not isinstance(raw, list):
        problems.add(file, key, "must be an array of tables")
        return out
    for i, row in enumerate(raw):
        where = f"{key}[{i}]" + (
            f" ({row.get(label)!r})" if isinstance(row, dict) and row.get(label) else ""
        )
        try:
            r = model.model_validate(row)
        except ValidationError as exc:
            for e in exc.errors():
                loc = ".".join(str(x) for x in e["loc"])
                problems.add(file, f"{where}.{loc}", e["msg"])
            continue
        if not r.source.strip():
            problems.add(
                file, f"{where}.source", "empty: every row must say where its facts come from"
            )
        out.append((where, r))
    return out


def _version_ok(s: str, file: str, where: str, problems: _Problems) -> bool:
    try:
        Version(s)
        return True
    except InvalidVersion:
        problems.add(file, where, f"{s!r} is not a version")
        return False


def _arch_ok(entries: list[str], file: str, where: str, problems: _Problems) -> None:
    for j, e in enumerate(entries):
        try:
            parse_arch(e)
        except ValueError as exc:
            problems.add(file, f"{where}[{j}]", str(exc))


def _families(rows: list[tuple[str, FamilyRow]], problems: _Problems) -> dict[str, FamilyRow]:
    """The [[family]] rows by compute capability, each checked: a real capability, driver branches
    as numbers with their sources, the last not older than the first, and a reason where a family
    has no first branch."""
    out: dict[str, FamilyRow] = {}
    for where, f in rows:
        try:
            parse_cc(f.cc)
        except ValueError as exc:
            problems.add("gpus.toml", f"{where}.cc", str(exc))
            continue
        if f.cc in out:
            problems.add(
                "gpus.toml", f"{where}.cc", f"{f.cc!r}: a second family for this compute capability"
            )
            continue
        for key, said in _family_problems(f):
            problems.add("gpus.toml", f"{where}.{key}", said)
        out[f.cc] = f
    return out


def _family_problems(f: FamilyRow) -> list[tuple[str, str]]:
    """(key, problem) of one family's driver branches, their sources and its torch note."""
    out = []
    if f.min_driver:
        if not f.min_driver.isdigit():
            out.append(("min_driver", f'{f.min_driver!r} is not a driver branch ("520")'))
        if not f.min_driver_source.strip():
            out.append(("min_driver_source", "empty: a driver floor needs its source"))
    elif not f.driver_note.strip():
        out.append(
            (
                "driver_note",
                "empty: a family without min_driver says why (Jetson Linux brings its own driver)",
            )
        )
    if f.max_driver:
        if not f.max_driver.isdigit():
            out.append(("max_driver", f'{f.max_driver!r} is not a driver branch ("580")'))
        elif f.min_driver.isdigit() and int(f.max_driver) < int(f.min_driver):
            out.append(
                ("max_driver", f"R{f.max_driver} is older than its first branch R{f.min_driver}")
            )
        if not f.max_driver_source.strip():
            out.append(("max_driver_source", "empty: a last driver branch needs its source"))
    if not f.pypi_torch and not f.torch_note.strip():
        out.append(
            (
                "torch_note",
                "empty: a family no PyPI torch runs on says why and what to use instead, with sources",
            )
        )
    return out


def _gpu(
    where: str,
    g: GpuRow,
    families: dict[str, FamilyRow],
    seen_labels: dict[str, str],
    problems: _Problems,
) -> Gpu | None:
    """One [[gpu]] row checked (its family, product line, hosts, sources, names no other GPU has)
    and made a ``Gpu`` with its family's facts; None where it has no family."""
    fam = families.get(g.cc.strip())
    if fam is None:
        known = f" (the families: {', '.join(sorted(families, key=parse_cc))})" if families else ""
        problems.add(
            "gpus.toml",
            f"{where}.cc",
            f"{g.cc!r}: no [[family]] row has this compute capability{known}",
        )
        return None
    if g.line not in LINES:
        problems.add("gpus.toml", f"{where}.line", f"{g.line!r}: one of {', '.join(LINES)}")
    if not g.host_arch or any(a not in HOST_ARCHS for a in g.host_arch):
        problems.add(
            "gpus.toml",
            f"{where}.host_arch",
            f"{g.host_arch!r}: list one or both of {', '.join(HOST_ARCHS)}",
        )
    elif g.host_arch != ["x86_64"] and not g.host_arch_source.strip():
        problems.add(
            "gpus.toml", f"{where}.host_arch_source", "empty: say where the GPU ships on Arm hosts"
        )
    if g.node_allreduce_busbw_gbs is not None and not g.node_allreduce_source.strip():
        problems.add(
            "gpus.toml",
            f"{where}.node_allreduce_source",
            "empty: an expected bus bandwidth needs its source",
        )
    for label in [g.name, *g.aliases]:
        k = "".join(ch for ch in label.lower() if ch.isalnum())
        if k in seen_labels and seen_labels[k] != g.name:
            problems.add("gpus.toml", where, f"{label!r} also names {seen_labels[k]!r}")
        seen_labels[k] = g.name
    return Gpu(
        **g.model_dump(),
        architecture=fam.architecture,
        min_driver=fam.min_driver,
        min_driver_source=fam.min_driver_source,
        max_driver=fam.max_driver,
        max_driver_source=fam.max_driver_source,
        driver_note=fam.driver_note,
        pypi_torch=fam.pypi_torch,
        torch_note=fam.torch_note,
    )


def _cuda_key(v: Variant) -> tuple[int, Version]:
    return (0, Version("0")) if v.cuda is None else (1, Version(v.cuda))


def _build(root: Path) -> CompatDB:
    """The DB from its data files, every row checked; ``CompatDBError`` lists every problem."""
    # the row models are imported here, on a cache miss: a process that reads a checked DB from the
    # cache (cache.py) does not make them
    from envspec.compat.rows import BuildRow, FamilyRow, GpuRow, PcieRow, PypiRow, ToolkitRow

    problems = _Problems()
    manifest = _read(root, MANIFEST, problems)
    files = {name: _read(root, name, problems) for name in FILES}
    problems.raise_if_any(root)
    pypi, gpus = files["torch_pypi.toml"], files["gpus.toml"]
    # every row read first (their problems in the files' order), then checked against each other
    pypi_rows = _rows(pypi, "release", PypiRow, "torch_pypi.toml", problems, "version")
    build_rows = _rows(
        files["torch_variants.toml"],
        "build",
        BuildRow,
        "torch_variants.toml",
        problems,
        "variant",
    )
    tk_rows = _rows(files["cuda.toml"], "toolkit", ToolkitRow, "cuda.toml", problems, "version")
    fam_rows = _rows(gpus, "family", FamilyRow, "gpus.toml", problems, "cc")
    pcie_rows = _rows(gpus, "pcie", PcieRow, "gpus.toml", problems, "gen")
    gpu_rows = _rows(gpus, "gpu", GpuRow, "gpus.toml", problems, "name")
    toolkits = _toolkits(tk_rows, problems)
    # GPUs: a family per compute capability, then the GPUs of each
    families = _families(fam_rows, problems)
    seen_labels: dict[str, str] = {}  # a name or alias (letters and digits) -> the GPU it names
    catalog = [
        g for where, row in gpu_rows if (g := _gpu(where, row, families, seen_labels, problems))
    ]
    # torch builds (curated) and releases (generated)
    releases = _releases(pypi_rows, _builds(build_rows, toolkits, problems), toolkits, problems)
    version, date = _db_version(manifest, pypi, problems)
    problems.raise_if_any(root)
    return CompatDB(
        version=version,
        date=date,
        format=FORMAT,
        torch_releases=releases,
        cuda_toolkits=sorted(toolkits.values(), key=lambda t: Version(t.version)),
        gpus=catalog,
        sources=dict(FILES),
        families=[
            Family(**f.model_dump())
            for f in sorted(families.values(), key=lambda f: parse_cc(f.cc))
        ],
        pcie=[PcieLink(**r.model_dump()) for _, r in sorted(pcie_rows, key=lambda wr: wr[1].gen)],
    )


def _toolkits(rows: list[tuple[str, ToolkitRow]], problems: _Problems) -> dict[str, CudaToolkit]:
    """The CUDA toolkits by version, each checked: versions, driver floors, architectures."""
    toolkits: dict[str, CudaToolkit] = {}
    for where, tk in rows:
        ok = _version_ok(tk.version, "cuda.toml", f"{where}.version", problems)
        ok &= _version_ok(tk.driver_strict, "cuda.toml", f"{where}.driver_strict", problems)
        ok &= _version_ok(tk.driver_compat, "cuda.toml", f"{where}.driver_compat", problems)
        _arch_ok(tk.archs, "cuda.toml", f"{where}.archs", problems)
        for j, f in enumerate(tk.estimated):
            if f not in TOOLKIT_FIELDS:
                problems.add(
                    "cuda.toml",
                    f"{where}.estimated[{j}]",
                    f"{f!r} is not one of {', '.join(TOOLKIT_FIELDS)}",
                )
        if not ok:
            continue
        if tk.version in toolkits:
            problems.add("cuda.toml", where, f"duplicate toolkit {tk.version}")
        # a driver that meets the toolkit's own floor runs it natively, so the compat floor is never higher
        compat = min(tk.driver_compat, tk.driver_strict, key=Version)
        toolkits[tk.version] = CudaToolkit(
            version=tk.version,
            driver_strict=tk.driver_strict,
            driver_compat=compat,
            archs=tk.archs,
            source=tk.source,
            estimated=list(tk.estimated),
        )
    return toolkits


_Build = tuple[str, "BuildRow", SpecifierSet]  # a curated build row, where it is, its torch range


def _builds(
    rows: list[tuple[str, BuildRow]], toolkits: dict[str, CudaToolkit], problems: _Problems
) -> list[_Build]:
    """The curated builds of torch_variants.toml, each checked (a CUDA build names a toolkit of
    cuda.toml and its arch list); a row whose torch range is no specifier is left out."""
    builds: list[_Build] = []
    for where, b in rows:
        try:
            spec = SpecifierSet(b.torch)
        except InvalidSpecifier:
            problems.add(
                "torch_variants.toml", f"{where}.torch", f"{b.torch!r} is not a version specifier"
            )
            continue
        _arch_ok(b.arch_list, "torch_variants.toml", f"{where}.arch_list", problems)
        if b.variant != "cpu":
            for key, said in _cuda_build_problems(b, toolkits):
                problems.add("torch_variants.toml", f"{where}.{key}", said)
        builds.append((where, b, spec))
    return builds


def _cuda_build_problems(b: BuildRow, toolkits: dict[str, CudaToolkit]) -> list[tuple[str, str]]:
    """(key, problem) of a CUDA build row: its CUDA version named, matching its variant, known."""
    out = []
    if not b.cuda:
        out.append(("cuda", f"variant {b.variant} needs a CUDA version"))
    elif b.variant != "cu" + b.cuda.replace(".", ""):
        out.append(("cuda", f"{b.cuda} does not match variant {b.variant}"))
    elif b.cuda not in toolkits:
        out.append(("cuda", f"CUDA {b.cuda} is not in cuda.toml"))
    if not b.arch_list:
        out.append(("arch_list", "a CUDA variant needs its arch list"))
    return out


def _releases(
    rows: list[tuple[str, PypiRow]],
    builds: list[_Build],
    toolkits: dict[str, CudaToolkit],
    problems: _Problems,
) -> list[TorchRelease]:
    """The torch releases of torch_pypi.toml, oldest first, each with its builds."""
    releases: list[TorchRelease] = []
    seen_versions: set[str] = set()
    for where, p in rows:
        if not _version_ok(p.version, "torch_pypi.toml", f"{where}.version", problems):
            continue
        if p.version in seen_versions:
            problems.add("torch_pypi.toml", where, f"duplicate release {p.version}")
        seen_versions.add(p.version)
        variants = _curated_variants(p, builds, problems)
        if p.pypi_variant and p.pypi_variant not in variants:
            carried = _carried_pypi_variant(where, p, releases, toolkits, problems)
            if carried is not None:
                variants[p.pypi_variant] = carried
        ordered = dict(sorted(variants.items(), key=lambda kv: _cuda_key(kv[1])))
        releases.append(
            TorchRelease(
                version=p.version,
                python=p.python,
                pypi_variant=p.pypi_variant or None,
                variants=ordered,
                source=p.source,
                python_freethreaded=p.python_freethreaded,
                needs_review=list(p.needs_review),
            )
        )
    releases.sort(key=lambda r: Version(r.version))
    return releases


def _curated_variants(p: PypiRow, builds: list[_Build], problems: _Problems) -> dict[str, Variant]:
    """The curated builds whose torch range holds the release ``p``, by variant: the one PyPI
    serves takes its CUDA libraries from PyPI's metadata; another's "=pypi" does too."""
    v = Version(p.version)
    variants: dict[str, Variant] = {}
    for bwhere, b, spec in builds:
        if not spec.contains(v, prereleases=True):
            continue
        if b.variant in variants:
            problems.add(
                "torch_variants.toml",
                bwhere,
                f"overlaps another {b.variant} row for torch {p.version}",
            )
            continue
        is_pypi = b.variant == p.pypi_variant
        src = b.source
        cudnn, nccl = b.cudnn or None, b.nccl or None
        if is_pypi:
            if b.cuda != p.cuda:
                problems.add(
                    "torch_variants.toml",
                    bwhere,
                    f"CUDA {b.cuda} but PyPI's {p.version} wheel pins CUDA {p.cuda}",
                )
            cudnn, nccl = p.cudnn or None, p.nccl or None
            src = f"{p.source}; curated: {b.source}"
        else:
            if cudnn == "=pypi":
                cudnn = p.cudnn or None
            if nccl == "=pypi":
                nccl = p.nccl or None
        pt_index = f"{PYTORCH_INDEX}/{b.variant}"
        variants[b.variant] = Variant(
            name=b.variant,
            cuda=b.cuda or None,
            cudnn=cudnn,
            nccl=nccl,
            arch_list=list(b.arch_list),
            index=PYPI_INDEX if is_pypi else pt_index,
            local="" if is_pypi else b.variant,
            source=src,
            pypi=is_pypi,
            pytorch_index=pt_index,
            pytorch_local=b.variant,
        )
    return variants


def _carried_pypi_variant(
    where: str,
    p: PypiRow,
    older: list[TorchRelease],
    toolkits: dict[str, CudaToolkit],
    problems: _Problems,
) -> Variant | None:
    """A release newer than the curated rows: PyPI's build is known from its metadata, its arch
    list is carried over from the newest ``older`` release with the same variant (said in its
    source). None where it cannot be (a problem, or, for a release that needs review, not yet)."""
    assert p.pypi_variant
    prev = next(
        (r.variants[p.pypi_variant] for r in reversed(older) if p.pypi_variant in r.variants),
        None,
    )
    if p.needs_review and (p.cuda not in toolkits or prev is None):
        return None  # refresh said what is missing (TorchRelease.needs_review)
    if p.cuda not in toolkits:
        problems.add("torch_pypi.toml", f"{where}.cuda", f"CUDA {p.cuda} is not in cuda.toml")
        return None
    if prev is None:
        problems.add(
            "torch_variants.toml",
            "",
            f"no {p.pypi_variant} row for torch {p.version} and none before it to carry the arch list from",
        )
        return None
    return Variant(
        name=p.pypi_variant,
        cuda=p.cuda,
        cudnn=p.cudnn or None,
        nccl=p.nccl or None,
        arch_list=list(prev.arch_list),
        index=PYPI_INDEX,
        local="",
        pypi=True,
        pytorch_index=f"{PYTORCH_INDEX}/{p.pypi_variant}",
        pytorch_local=p.pypi_variant,
        source=f"{p.source}; arch list assumed unchanged from an older release (not curated yet)",
    )


def _db_version(
    manifest: dict[str, Any], pypi: dict[str, Any], problems: _Problems
) -> tuple[str, str]:
    """The DB's version and date: the manifest's, or the generated file's where it is newer."""
    version, date = manifest.get("db_version", ""), manifest.get("date", "")
    gen_version, gen_date = pypi.get("db_version", ""), pypi.get("date", "")
    for name, val in (("db_version", version), ("date", date)):
        if not isinstance(val, str) or not val:
            problems.add(MANIFEST, name, "missing")
    if gen_version and version:
        try:
            if Version(gen_version) > Version(version):
                version, date = gen_version, gen_date or date
        except InvalidVersion:
            problems.add("torch_pypi.toml", "db_version", f"{gen_version!r} is not a version")
    return str(version), str(date)


@functools.lru_cache(maxsize=8)
def _load_cached(root: str, validate: bool) -> CompatDB:
    path, names = Path(root), [MANIFEST, *FILES]
    key = cache.cache_key(path, names)
    if key is not None and not validate:
        db = cache.read(key)
        if db is not None:
            return db
    db = _build(path)
    if key is not None and cache.cache_key(path, names) == key:  # not changed while it was read
        cache.write(key, db)
    return db


def load_db(path: Path | None = None, *, validate: bool = False) -> CompatDB:
    """The compatibility DB: the bundled data by default, or the data directory ``path`` (or its
    ``db.toml``). Loaded once per directory and cached. The files are checked (and ``CompatDBError``
    raised listing every problem: file, row, what is wrong, on bad data or an unknown format) when
    they are new to this envspec; a DB checked before, with the same bytes, is read from the cache of
    checked DBs (``cache.py``). ``validate`` checks the files whatever the cache holds (the ``db``
    commands, tests) and stores the result."""
    root = DATA_DIR if path is None else Path(path)
    if root.name == MANIFEST or root.suffix == ".toml":
        root = root.parent
    return _load_cached(str(root.resolve()), validate)

"""Do the lock's compiled packages fit the torch beside them? Read from the binaries.

An extension module built on torch needs torch's symbols exactly as the torch it was built with
exports them: mangled ``c10::``, ``at::`` and ``torch::`` symbols for torch's C++ ABI (vllm,
xformers, flash-attn, older torchvision: they fit one torch release), C functions
(``aoti_torch_*``, ``torch_*``) for its stable ABI (newer torchvision and torchaudio: they fit
the release they were built for and later ones). A package's metadata cannot tell (vllm 0.2.2
declares ``torch>=2.1.0``), so this module reads the ELF files themselves, without importing
anything, so it works for any CPU architecture and without a GPU:

- ``wheel_needs``: for each extension module of a wheel that links ``libtorch*`` or
  ``libc10*``, the torch libraries it links and the torch symbols it leaves undefined (weak
  references and what the wheel's own libraries define are not needs);
- ``torch_exports``: the dynamic symbols the torch wheel's libraries define;
- ``mismatches``: each extension's needs that the locked torch does not meet.

Both reads are kept in the cache by the wheel's sha256 (``AbiCheck``), and so is each verdict,
so a warm check reads a few small files. The torch release a package was most likely built for
comes from its metadata (``torch==X``), its version's local label (``+pt2.4``), the sourced
companion table ``compat/data/torch_builds.toml`` (where the metadata is looser than the
binaries), or another torch wheel checked earlier that meets every need.
"""

from __future__ import annotations

import email.parser
import hashlib
import json
import os
import re
import shutil
import tempfile
import tomllib
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from envspec.errors import AbiMismatch, LockError
from envspec.lock import Lockfile, Wheel

if TYPE_CHECKING:
    from envspec.cache.store import Cache
    from envspec.sources import Mirror

# bump when what a record holds changes: records of another format are read again
RECORD_FORMAT = 3  # 3: a wheel's needs say the torch-named libraries it ships

TORCH_LIB = re.compile(r"^lib(?:torch|c10)[A-Za-z0-9_]*\.so")
# torch's symbols among an extension's undefined ones: names in torch's C++ namespaces (also their
# vtables, typeinfo, and const/volatile/ref-qualified members), libtorch_python's THP* functions,
# and the stable ABI's C functions
TORCH_SYMBOL = re.compile(
    r"^_Z(?:T[VIST])?N[rVKRO]*(?:3c10|2at|5torch|6caffe2)"
    r"|^_Z\d+THP"
    r"|^(?:aoti_torch_|torch_)"
)
EXTENSION_FILE = re.compile(r"\.so(?:\.[0-9]+)*$")
# a wheel version's local label naming the torch it was built for: flash_attn 2.6.3+cu123torch2.4cxx11abiFALSE,
# xformers-style +pt2.4.0, +torch2.5
LOCAL_TORCH = re.compile(r"(?:^|[.+_a-z0-9])(?:torch|pt)(\d+)\.?(\d+)(?:\.?(\d+))?")
SHOWN_SYMBOLS = 3


@dataclass(frozen=True)
class Extension:
    """One extension module of a wheel that links torch: what it needs from torch."""

    path: str  # inside the wheel
    libs: tuple[str, ...]  # the torch libraries it links (DT_NEEDED)
    symbols: tuple[str, ...]  # torch symbols it leaves undefined (mangled, sorted)

    @property
    def kind(self) -> Literal["c++", "stable"]:
        """``c++`` (torch's C++ ABI: one torch release) or ``stable`` (C functions only)."""
        return "c++" if any(s.startswith("_Z") for s in self.symbols) else "stable"


@dataclass(frozen=True)
class WheelNeeds:
    """What one wheel's extension modules need from torch, and its metadata's word on torch."""

    extensions: tuple[Extension, ...] = ()
    torch_requirement: str = ""  # its Requires-Dist on torch, as written ("" where it has none)
    # the libraries named like torch's that the wheel ships itself (torchaudio's libtorchaudio.so):
    # a module linking one of these finds it in the wheel, not in torch
    ships: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> WheelNeeds:
        return cls(
            tuple(
                Extension(e["path"], tuple(e["libs"]), tuple(e["symbols"])) for e in d["extensions"]
            ),
            d.get("torch_requirement", ""),
            tuple(d.get("ships", ())),
        )


@dataclass(frozen=True)
class TorchExports:
    version: str
    libs: frozenset[str]
    symbols: frozenset[str]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TorchExports:
        return cls(d["version"], frozenset(d["libs"]), frozenset(d["symbols"]))


@dataclass(frozen=True)
class Mismatch:
    """An extension module the locked torch cannot load, and why."""

    package: str
    version: str
    module: str  # path inside the wheel
    kind: Literal["c++", "stable"]
    torch: str  # the locked torch's version
    missing_libs: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()  # mangled
    needed: int = 0  # how many torch symbols the module needs
    built_for: str = ""  # the torch release it was most likely built for, and how that is known
    hint: str = ""

    def demangled(self, n: int = SHOWN_SYMBOLS) -> list[str]:
        return [demangle(s) for s in self.missing[:n]]

    def sentence(self) -> str:
        what = []
        if self.missing_libs:
            what.append(
                f"links {', '.join(self.missing_libs)}, which torch {self.torch} does not have"
            )
        if self.missing:
            more = len(self.missing) - SHOWN_SYMBOLS
            shown = "; ".join(self.demangled())
            what.append(
                f"needs {len(self.missing)} of its {self.needed} torch symbols that torch {self.torch} "
                f"does not export ({shown}{f'; and {more} more' if more > 0 else ''})"
            )
        if not what:  # the companion table's word, no binary read
            what.append(f"is not built for torch {self.torch}")
        abi = "torch's C++ ABI" if self.kind == "c++" else "torch's stable ABI"
        built = f"; built for torch {self.built_for}" if self.built_for else ""
        return f"{self.package} {self.version}: {self.module} ({abi}{built}) " + " and ".join(what)

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["missing"] = list(self.missing)
        d["missing_demangled"] = [demangle(s) for s in self.missing]
        d["missing_libs"] = list(self.missing_libs)
        return d


def demangle(symbol: str) -> str:
    """The C++ name of a mangled symbol (``c10::optional<at::Tensor> const&``), through the C++
    runtime's own demangler; the symbol as it is where it is not mangled or cannot be read."""
    if not symbol.startswith("_Z"):
        return symbol
    try:
        import cxxfilt  # type: ignore[import-untyped]

        return str(cxxfilt.demangle(symbol))
    except Exception:  # noqa: BLE001 (no libstdc++ here, or a name it cannot read)
        return symbol


# -- reading ELF files --------------------------------------------------------------------------


@dataclass
class ElfSymbols:
    needed: list[str] = field(default_factory=list)
    undefined: set[str] = field(default_factory=set)  # strong references only
    defined: set[str] = field(default_factory=set)


def elf_symbols(f: IO[bytes]) -> ElfSymbols | None:
    """DT_NEEDED and the dynamic symbols of a shared object; None for what is not an ELF file."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    try:
        elf = ELFFile(f)
        out = ElfSymbols()
        for sec in elf.iter_sections():
            if isinstance(sec, DynamicSection):
                out.needed = [
                    str(t.needed)  # type: ignore[attr-defined]
                    for t in sec.iter_tags()
                    if t.entry.d_tag == "DT_NEEDED"
                ]
        dynsym = elf.get_section_by_name(".dynsym")
        if not isinstance(dynsym, SymbolTableSection):
            return out
        for sym in dynsym.iter_symbols():
            name = sym.name
            if not name:
                continue
            bind = sym["st_info"]["bind"]
            if sym["st_shndx"] == "SHN_UNDEF":
                if bind != "STB_WEAK":
                    out.undefined.add(name)
            elif bind in ("STB_GLOBAL", "STB_WEAK", "STB_GNU_UNIQUE"):
                out.defined.add(name)
        return out
    except (ELFError, ValueError, KeyError):
        return None


def _zip_elf(z: zipfile.ZipFile, info: zipfile.ZipInfo, tmpdir: Path) -> ElfSymbols | None:
    """A shared object inside a wheel, read from a temporary copy (ELF readers seek back and
    forth, which a compressed member cannot do cheaply)."""
    with z.open(info) as src:
        if src.read(4) != b"\x7fELF":
            return None
    fd, name = tempfile.mkstemp(dir=tmpdir, suffix=".so")
    try:
        with os.fdopen(fd, "wb") as dst, z.open(info) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
        with open(name, "rb") as f:
            return elf_symbols(f)
    finally:
        os.unlink(name)


def _metadata(z: zipfile.ZipFile) -> email.message.Message:
    for n in z.namelist():
        if n.count("/") == 1 and n.endswith(".dist-info/METADATA"):
            return email.parser.BytesParser().parsebytes(z.read(n), headersonly=True)
    return email.message.Message()


def torch_requirement(metadata: email.message.Message) -> str:
    """The wheel's Requires-Dist on torch, as written (without markers); "" where it has none."""
    for raw in metadata.get_all("Requires-Dist") or []:
        try:
            req = Requirement(raw)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) == "torch":
            return f"torch{req.specifier}" if str(req.specifier) else "torch"
    return ""


def wheel_needs(path: Path, *, tmpdir: Path | None = None) -> WheelNeeds:
    """What a wheel's extension modules need from torch. A wheel whose metadata does not name
    torch is not read further (it cannot count on torch's libraries being there)."""
    with zipfile.ZipFile(path) as z:
        req = torch_requirement(_metadata(z))
        if not req:
            return WheelNeeds()
        with tempfile.TemporaryDirectory(prefix="envspec-abi-", dir=tmpdir) as td:
            read: dict[str, ElfSymbols] = {}
            for info in z.infolist():
                if EXTENSION_FILE.search(info.filename) and not info.is_dir():
                    syms = _zip_elf(z, info, Path(td))
                    if syms is not None:
                        read[info.filename] = syms
    own = set().union(*(s.defined for s in read.values())) if read else set()
    base = (n.rsplit("/", 1)[-1] for n in read)
    ships = sorted({b for b in base if TORCH_LIB.match(b)})
    exts = []
    for name, syms in sorted(read.items()):
        libs = tuple(n for n in syms.needed if TORCH_LIB.match(n) and n not in ships)
        if not libs:
            continue
        need = sorted(s for s in syms.undefined - own if TORCH_SYMBOL.match(s))
        exts.append(Extension(name, libs, tuple(need)))
    return WheelNeeds(tuple(exts), req, tuple(ships))


def torch_exports(path: Path, version: str, *, tmpdir: Path | None = None) -> TorchExports:
    """The dynamic symbols torch's own libraries (``torch/lib``) define."""
    libs: set[str] = set()
    symbols: set[str] = set()
    with (
        zipfile.ZipFile(path) as z,
        tempfile.TemporaryDirectory(prefix="envspec-abi-", dir=tmpdir) as td,
    ):
        for info in z.infolist():
            parts = info.filename.split("/")
            if (
                len(parts) == 3
                and parts[:2] == ["torch", "lib"]
                and EXTENSION_FILE.search(parts[2])
            ):
                syms = _zip_elf(z, info, Path(td))
                if syms is None:
                    continue
                libs.add(parts[2])
                symbols |= syms.defined
    if not libs:
        raise LockError(
            f"{path.name}: no torch/lib/*.so in this wheel: it is not a torch wheel",
            reference="not-a-torch-wheel",
        )
    return TorchExports(version, frozenset(libs), frozenset(symbols))


# -- judging -------------------------------------------------------------------------------------

# a module built for one torch release among several the wheel ships, which picks the one for the
# torch it runs beside (torch-c-dlpack-ext: libtorch_c_dlpack_addon_torch24-cpu.so ... _torch29-cuda.so)
RELEASE_TAG = re.compile(r"(?:torch|pt)[-_]?(\d)[._]?(\d{1,2})(?![0-9])")


def _release_tag(path: str) -> str | None:
    m = RELEASE_TAG.search(path.rsplit("/", 1)[-1])
    return f"{m.group(1)}.{int(m.group(2))}" if m else None


def loaded_beside(extensions: Sequence[Extension], torch_version: str) -> list[Extension]:
    """The extension modules that load beside this torch: where a wheel ships modules for several
    torch releases (named for them), only those for this torch's release and those named for none."""
    tags = {_release_tag(x.path) for x in extensions} - {None}
    if len(tags) < 2:
        return list(extensions)
    try:
        mine = ".".join(str(n) for n in Version(torch_version).release[:2])
    except InvalidVersion:
        return list(extensions)
    return [x for x in extensions if _release_tag(x.path) in (None, mine)]


def mismatch(
    pin: Wheel, ext: Extension, exports: TorchExports, shipped: Iterable[str] = ()
) -> Mismatch | None:
    """What ``ext`` needs that ``exports`` lacks; None where the locked torch meets every need.
    ``shipped``: the torch-named libraries other locked wheels ship (a library one of them has is
    found there, not judged against torch's)."""
    elsewhere = set(shipped)
    missing_libs = tuple(
        lib for lib in ext.libs if lib not in exports.libs and lib not in elsewhere
    )
    missing = tuple(s for s in ext.symbols if s not in exports.symbols)
    if not missing_libs and not missing:
        return None
    return Mismatch(
        pin.name,
        pin.version,
        ext.path,
        ext.kind,
        exports.version,
        missing_libs,
        missing,
        len(ext.symbols),
    )


@dataclass(frozen=True)
class CompanionRow:
    """A row of the companion table (what a package's binaries were built against): releases of a
    package whose binaries need a torch its metadata does not say."""

    package: str
    versions: SpecifierSet
    torch: SpecifierSet
    built_for: str
    source: str


def companion_table(text: str | None = None) -> list[CompanionRow]:
    """``compat/data/torch_builds.toml`` (or ``text``): rows with their sources."""
    if text is None:
        text = resources.files("envspec.compat").joinpath("data/torch_builds.toml").read_text()
    rows = []
    for i, row in enumerate(tomllib.loads(text).get("build", [])):
        try:
            rows.append(
                CompanionRow(
                    canonicalize_name(row["package"]),
                    SpecifierSet(row["versions"]),
                    SpecifierSet(row["torch"]),
                    row["built_for"],
                    row["source"],
                )
            )
        except (KeyError, InvalidSpecifier) as e:
            raise LockError(
                f"compat/data/torch_builds.toml: build[{i}]: {e}", reference="invalid-compat-db"
            ) from e
    return rows


def table_row(rows: Sequence[CompanionRow], name: str, version: str) -> CompanionRow | None:
    try:
        v = Version(version)
    except InvalidVersion:
        return None
    n = canonicalize_name(name)
    return next(
        (r for r in rows if r.package == n and r.versions.contains(v, prereleases=True)), None
    )


def table_mismatches(lock: Lockfile, rows: Sequence[CompanionRow]) -> list[Mismatch]:
    """What the companion table alone says against the lock (no wheel file needed)."""
    torch = next((w for w in lock.wheels if canonicalize_name(w.name) == "torch"), None)
    if torch is None:
        return []
    tv = Version(torch.version).public
    out = []
    for w in lock.wheels:
        row = table_row(rows, w.name, w.version)
        if row and not row.torch.contains(tv, prereleases=True):
            out.append(
                Mismatch(
                    w.name,
                    w.version,
                    "(every extension module)",
                    "c++",
                    torch.version,
                    built_for=f"{row.built_for}; companion table: {row.source}",
                    hint=_hint(w, torch.version, row.built_for, rows),
                )
            )
    return out


def built_for(
    pin: Wheel, needs: WheelNeeds, rows: Sequence[CompanionRow], others: Iterable[TorchExports] = ()
) -> tuple[str, str]:
    """The torch release ``pin`` was most likely built for, and how that is known."""
    req = needs.torch_requirement
    try:
        spec = Requirement(req).specifier if req else SpecifierSet()
    except InvalidRequirement:
        spec = SpecifierSet()
    pinned = [s.version for s in spec if s.operator in ("==", "===") and "*" not in s.version]
    if pinned:
        return pinned[0], f"its metadata says {req}"
    m = LOCAL_TORCH.search(Version(pin.version).local or "") if _valid(pin.version) else None
    if m:
        release = ".".join(g for g in m.groups() if g)
        return release, f"its version's local label +{Version(pin.version).local}"
    row = table_row(rows, pin.name, pin.version)
    if row:
        return row.built_for, f"companion table: {row.source}"
    fits = [e.version for e in others if all(mismatch(pin, x, e) is None for x in needs.extensions)]
    stable = all(x.kind == "stable" for x in needs.extensions)
    if fits:  # the stable ABI: the oldest release that has it all, and later ones
        best = min(fits, key=_vkey) + " or later" if stable else max(fits, key=_vkey)
        return best, "its torch symbols are all exported by that torch's wheel, read earlier"
    floor = [s.version for s in spec if s.operator in (">=", "~=")]
    if floor and stable:
        return f"{floor[0]} or later", f"its metadata says {req} and it uses the stable ABI only"
    return "", ""


def _valid(v: str) -> bool:
    try:
        Version(v)
        return True
    except InvalidVersion:
        return False


def _vkey(v: str) -> Version:
    try:
        return Version(v)
    except InvalidVersion:
        return Version("0")


def _hint(pin: Wheel, torch_version: str, release: str, rows: Sequence[CompanionRow]) -> str:
    """What to lock instead; never the torch the lock already has."""
    fixes = []
    if release and _vkey(release).public == _vkey(torch_version).public:
        pass  # built for this very torch: a library or symbol is missing for another reason
    elif release and not release.endswith("or later"):
        fixes.append(
            f'the torch it was built for: set [torch] version = "=={release}" in the spec and re-lock'
        )
    elif release:
        fixes.append(
            f"a torch it was built for ({release}): widen [torch] version in the spec and re-lock"
        )
    fitting = [
        r
        for r in rows
        if r.package == canonicalize_name(pin.name)
        and r.torch.contains(Version(torch_version).public, prereleases=True)
    ]
    if fitting:
        fixes.append(
            f"a {pin.name} release built for torch {torch_version} ({fitting[0].versions}): "
            f"pin it in [python].packages and re-lock"
        )
    else:
        fixes.append(
            f"a {pin.name} release built for torch {Version(torch_version).public} (its wheels' "
            f"metadata pins torch=={Version(torch_version).public}): pin it in [python].packages and "
            f"re-lock"
        )
    return "lock " + ", or ".join(fixes)


# -- the check, cached by the wheels' hashes ------------------------------------------------------


class AbiCheck:
    """The check of a lock's compiled packages against its torch, its reads and verdicts kept
    under ``<cache>/abi/`` by the wheels' sha256 (a warm check reads a few small files)."""

    def __init__(self, root: Path, rows: Sequence[CompanionRow] | None = None) -> None:
        self.root = root
        self.rows = list(companion_table() if rows is None else rows)
        self.read_cold: list[
            str
        ] = []  # wheels read from their files in this check (not from records)
        self.judged: list[str] = []  # packages with extensions on torch, judged against it
        self.unchecked: list[str] = []  # wheels a partial check could not read (not at hand)

    def _record(self, kind: str, key: str) -> Path:
        return self.root / kind / f"{key}.json"

    def _load(self, kind: str, key: str) -> dict[str, Any] | None:
        try:
            d = json.loads(self._record(kind, key).read_text())
        except (OSError, ValueError):
            return None
        return d if isinstance(d, dict) and d.get("format") == RECORD_FORMAT else None

    def _save(self, kind: str, key: str, d: dict[str, object]) -> None:
        p = self._record(kind, key)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump({"format": RECORD_FORMAT, **d}, f, separators=(",", ":"))
        os.replace(tmp, p)

    @staticmethod
    def candidates(lock: Lockfile) -> list[Wheel]:
        """The wheels that can hold torch extensions: platform wheels beside torch, not NVIDIA's
        libraries (``cuda`` group), not sdists (a wheel built from source, ``Wheel.source``, is made
        by the build, after this check)."""
        return [
            w
            for w in lock.wheels
            if canonicalize_name(w.name) != "torch"
            and w.group != "cuda"
            and not w.filename.endswith("-none-any.whl")
            and not w.built
        ]

    def unread(self, lock: Lockfile) -> list[Wheel]:
        """The candidate wheels whose files the check still has to read (no record kept)."""
        return [w for w in self.candidates(lock) if self._load("needs", w.sha256) is None]

    def torch_unread(self, lock: Lockfile) -> Wheel | None:
        """The torch wheel, where its exports must be read: a candidate with extensions has no
        verdict kept and the torch wheel no record (call after the candidates' needs are read)."""
        torch = _torch_pin(lock)
        if torch is None or self._load("exports", torch.sha256) is not None:
            return None
        for w in self.candidates(lock):
            d = self._load("needs", w.sha256)
            if (
                d is not None
                and loaded_beside(WheelNeeds.from_json(d).extensions, torch.version)
                and self._load("verdicts", _verdict_key(torch, w)) is None
            ):
                return torch
        return None

    def needs(self, pin: Wheel, path: Path | None) -> WheelNeeds:
        d = self._load("needs", pin.sha256)
        if d is not None:
            return WheelNeeds.from_json(d)
        if path is None:
            raise LockError(
                f"{pin.filename} is needed for the ABI check and is not at hand",
                reference="abi-unread",
            )
        self.root.mkdir(parents=True, exist_ok=True)
        needs = wheel_needs(path, tmpdir=self.root)
        self.read_cold.append(pin.name)
        self._save(
            "needs",
            pin.sha256,
            {
                "extensions": [asdict(e) for e in needs.extensions],
                "torch_requirement": needs.torch_requirement,
                "ships": list(needs.ships),
            },
        )
        return needs

    def exports(self, pin: Wheel, path: Path | None) -> TorchExports:
        d = self._load("exports", pin.sha256)
        if d is not None:
            return TorchExports.from_json(d)
        if path is None:
            raise LockError(
                f"{pin.filename} is needed for the ABI check and is not at hand",
                reference="abi-unread",
            )
        self.root.mkdir(parents=True, exist_ok=True)
        ex = torch_exports(path, pin.version, tmpdir=self.root)
        self.read_cold.append(pin.name)
        self._save(
            "exports",
            pin.sha256,
            {"version": ex.version, "libs": sorted(ex.libs), "symbols": sorted(ex.symbols)},
        )
        return ex

    def _shipped(self, lock: Lockfile, paths: Mapping[str, Path]) -> set[str]:
        """The torch-named libraries the lock's candidate wheels ship themselves, of those read
        (kept records, or files in ``paths``)."""
        out: set[str] = set()
        for pin in self.candidates(lock):
            if pin.sha256 in paths or self._load("needs", pin.sha256) is not None:
                out |= set(self.needs(pin, paths.get(pin.sha256)).ships)
        return out

    def _other_exports(self, torch: Wheel) -> list[TorchExports]:
        out = []
        for p in sorted((self.root / "exports").glob("*.json")):
            if p.stem != torch.sha256 and (d := self._load("exports", p.stem)) is not None:
                out.append(TorchExports.from_json(d))
        return out

    def _explained(
        self, pin: Wheel, torch: Wheel, needs: WheelNeeds, bad: list[Mismatch]
    ) -> list[Mismatch]:
        """``bad`` with the torch release the wheel was built for, and what to do."""
        release, why = built_for(pin, needs, self.rows, self._other_exports(torch))
        hint = _hint(pin, torch.version, release, self.rows)
        return [
            Mismatch(
                **{**asdict(m), "built_for": f"{release}; {why}" if release else "", "hint": hint}
            )
            for m in bad
        ]

    def check(
        self, lock: Lockfile, paths: Mapping[str, Path], *, partial: bool = False
    ) -> list[Mismatch]:
        """Every extension module of the lock's wheels that the locked torch cannot load (``paths``:
        sha256 -> wheel file, for the wheels without records: ``unread``, ``torch_unread``).
        ``partial``: a wheel that is needed and not in ``paths`` is left unchecked (``unchecked``)
        instead of raising."""
        torch = _torch_pin(lock)
        if torch is None:
            return []
        found = table_mismatches(lock, self.rows)
        flagged = {(m.package, m.version) for m in found}
        shipped = self._shipped(lock, paths)
        exports: TorchExports | None = None
        for pin in self.candidates(lock):
            if (pin.name, pin.version) in flagged:
                continue
            if partial and pin.sha256 not in paths and self._load("needs", pin.sha256) is None:
                self.unchecked.append(pin.name)
                continue
            needs = self.needs(pin, paths.get(pin.sha256))
            extensions = loaded_beside(needs.extensions, torch.version)
            if not extensions:
                continue
            self.judged.append(pin.name)
            key = _verdict_key(torch, pin)
            kept = self._load("verdicts", key)
            if kept is not None:
                found += [
                    Mismatch(
                        **{
                            **m,
                            "missing": tuple(m["missing"]),
                            "missing_libs": tuple(m["missing_libs"]),
                        }
                    )
                    for m in kept["mismatches"]
                ]
                continue
            if (
                partial
                and exports is None
                and torch.sha256 not in paths
                and self._load("exports", torch.sha256) is None
            ):
                self.judged.pop()
                self.unchecked.append(pin.name)
                continue
            if exports is None:
                exports = self.exports(torch, paths.get(torch.sha256))
            bad = [m for x in extensions if (m := mismatch(pin, x, exports, shipped)) is not None]
            if bad:
                bad = self._explained(pin, torch, needs, bad)
            self._save("verdicts", key, {"mismatches": [asdict(m) for m in bad]})
            found += bad
        return found


def _torch_pin(lock: Lockfile) -> Wheel | None:
    return next((w for w in lock.wheels if canonicalize_name(w.name) == "torch"), None)


def _verdict_key(torch: Wheel, pin: Wheel) -> str:
    return hashlib.sha256(f"{torch.sha256}\n{pin.sha256}".encode()).hexdigest()


def raise_for(found: Sequence[Mismatch], lock_name: str) -> None:
    """``AbiMismatch`` for what ``check`` found (nothing where it found nothing)."""
    if found:
        raise AbiMismatch(lock_name, list(found))


def _run(
    lock: Lockfile,
    root: Path,
    fetch: Callable[[list[Wheel]], Mapping[str, Path]],
    *,
    lock_name: str,
    partial: bool,
) -> AbiCheck:
    """Read what has no record (``fetch`` gives those wheels' files: first the candidates, then torch
    where one of them links it), judge, raise ``AbiMismatch``. ``partial``: what ``fetch`` does not
    give is left unchecked."""
    check = AbiCheck(root)
    if _torch_pin(lock) is None:
        return check
    raise_for(
        table_mismatches(lock, check.rows), lock_name
    )  # the table alone: no wheel is fetched for it
    todo = check.unread(lock)
    paths = dict(fetch(todo)) if todo else {}
    for w in todo:
        if w.sha256 in paths or not partial:
            check.needs(w, paths.get(w.sha256))
    torch = check.torch_unread(lock)
    if torch is not None:
        paths.update(fetch([torch]))
    raise_for(check.check(lock, paths, partial=partial), lock_name)
    return check


def check_lock(
    lock: Lockfile,
    cache_root: Path,
    fetch: Callable[[list[Wheel]], Mapping[str, Path]],
    *,
    lock_name: str = "the lock",
) -> list[str]:
    """The whole check, as ``envspec build`` runs it (``fetch`` downloads what is not at hand);
    returns the names of the wheels read from their files."""
    return _run(lock, cache_root, fetch, lock_name=lock_name, partial=False).read_cold


@dataclass
class AtHand:
    """What ``check_at_hand`` did: packages with torch extensions judged, wheels it could not read."""

    judged: list[str]
    unchecked: list[str]
    read: list[str]

    def to_json(self) -> dict[str, object]:
        return {"judged": self.judged, "unchecked": self.unchecked, "read": self.read}


def check_at_hand(
    lock: Lockfile, cache: Cache, mirrors: Sequence[Mirror], *, lock_name: str
) -> AtHand:
    """The check with the wheels at hand only (in the cache, or on a mirror on this machine: taken
    into the cache, checked against their sha256); nothing is downloaded. What is not at hand is
    left to ``envspec build``, which always checks. Raises ``AbiMismatch``."""
    from envspec.errors import EnvspecError
    from envspec.wheels.fetch import WheelFetcher

    local = [m for m in mirrors if m.path is not None]
    fetcher = WheelFetcher(cache, local, allow_canonical=False)

    def at_hand(pins: Iterable[Wheel]) -> dict[str, Path]:
        out = {}
        for p in pins:
            if cache.has_blob(p.sha256) or next(fetcher.candidates(p), None) is not None:
                try:
                    out[p.sha256] = fetcher.fetch(p)
                except EnvspecError:
                    continue
        return out

    check = _run(lock, cache.root / "abi", at_hand, lock_name=lock_name, partial=True)
    return AtHand(check.judged, check.unchecked, check.read_cold)

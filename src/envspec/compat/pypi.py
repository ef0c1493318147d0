"""`envspec db refresh`: regenerate the PyPI-derivable part of the compatibility DB.

What package metadata can tell is regenerated here; the curated facts (the variants on the
PyTorch wheel index, their arch lists, CUDA toolkits, GPUs) live in other files and are kept.

For every torch release >= ``since`` on PyPI this reads:

* the release list from PyPI's JSON API (``https://pypi.org/pypi/torch/json``);
* the files of each release from the simple JSON API (``https://pypi.org/simple/torch/`` with
  ``Accept: application/vnd.pypi.simple.v1+json``): the Linux x86_64 wheels' ``cpXY`` tags give the
  Python versions;
* the core metadata (``METADATA``) of one Linux x86_64 wheel: from its PEP 658 file
  (``<wheel url>.metadata``) when the index advertises ``core-metadata``, else by reading only the
  zip's central directory and the ``*.dist-info/METADATA`` member with HTTP range requests (a
  few hundred KiB instead of the whole wheel). Its ``Requires-Dist`` pins
  (``nvidia-cuda-runtime-cu12==12.8.90`` or ``cuda-toolkit[...]==13.0.2``,
  ``nvidia-cudnn-cu1X==…``, ``nvidia-nccl-cu1X==…``) give the CUDA runtime, cuDNN and NCCL of the
  build PyPI serves, hence which variant it is (``cu128``, ``cu130``).

The output (``data/torch_pypi.toml``) is deterministic: releases sorted by version, keys in a
fixed order, no timestamps other than the DB date passed in.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envspec.compat.load import DATA_DIR, _load_cached
from envspec.compat.platforms import _rows, pypi_build
from envspec.errors import SourceError

if TYPE_CHECKING:
    import urllib.request

# a row of torch_pypi.toml as `render` writes it (TOML, read and written as it is): each value a
# string or a list of strings
ReleaseRow = dict[str, str | list[str]]


class PypiFile(BaseModel):
    """A file of PyPI's JSON simple API (PEP 691), read into this where the page is read
    (``_files_by_version``): its name, URL and size, whether it is yanked (True or the reason),
    and whether the index serves its METADATA beside it (PEP 658/714)."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)
    filename: str = ""
    url: str = ""
    size: int = 0
    yanked: bool | str | None = None
    core_metadata: bool | dict[str, str] | None = Field(None, alias="core-metadata")
    dist_info_metadata: bool | dict[str, str] | None = Field(None, alias="dist-info-metadata")

    @property
    def metadata_served(self) -> bool:
        """PEP 714's name first, PEP 658's where the index gives only that."""
        cm = self.core_metadata if self.core_metadata is not None else self.dist_info_metadata
        return bool(cm)


JSON_API = "https://pypi.org/pypi/torch/json"
SIMPLE_API = "https://pypi.org/simple/torch/"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"

Fetch = Callable[[str], bytes]
FetchRange = Callable[
    [str, int, int], bytes
]  # (url, first byte, last byte inclusive); last < 0: suffix


@dataclass
class RefreshReport:
    """What a refresh did: releases written, which were new, changed or the same, and what it could
    not read. Every release of ``releases`` is in exactly one of added, changed, unchanged, kept."""

    out_path: Path
    releases: list[str] = field(default_factory=list)  # every release in the written file
    added: list[str] = field(default_factory=list)  # read now, not in the old file
    changed: list[str] = field(default_factory=list)  # read now, different from the old row
    unchanged: list[str] = field(default_factory=list)  # read now, the same as the old row
    kept: list[str] = field(
        default_factory=list
    )  # not read now (older than `since`, or a problem): old row kept
    removed: list[str] = field(default_factory=list)  # in the old file, not in the new one
    problems: list[str] = field(default_factory=list)  # "2.3.0: no Linux x86_64 wheel"
    source_errors: list[str] = field(
        default_factory=list
    )  # the problems where an index did not answer
    # release -> what the refresh could not derive for it (an unknown CUDA toolkit, no arch list): the
    # release is written with what could be derived, marked `needs_review`, and is not resolvable
    # until the curated data has the missing facts
    needs_review: dict[str, list[str]] = field(default_factory=dict)
    # release -> what data/torch_platforms.toml (curated) lacks or says otherwise about PyPI's wheel
    # for another platform (linux-aarch64: a CPU or a CUDA build): the release stays resolvable on
    # linux-x86_64; on that platform the resolver goes by the curated rows until they are fixed
    platform_review: dict[str, list[str]] = field(default_factory=dict)
    written: bool = False  # whether out_path was (re)written

    @property
    def ok(self) -> bool:
        return not self.problems and not self.needs_review and not self.platform_review

    def to_json(self) -> dict[str, object]:
        """The report as plain JSON data (`envspec db refresh --json`)."""
        return {
            "ok": self.ok,
            "output": str(self.out_path),
            "written": self.written,
            "releases": list(self.releases),
            "added": list(self.added),
            "changed": list(self.changed),
            "unchanged": list(self.unchanged),
            "kept": list(self.kept),
            "removed": list(self.removed),
            "problems": list(self.problems),
            "source_errors": list(self.source_errors),
            "needs_review": {v: list(items) for v, items in self.needs_review.items()},
            "platform_review": {v: list(items) for v, items in self.platform_review.items()},
        }


# ---------------------------------------------------------------------------------------------
# network defaults (only used when no fetcher is injected)


def _urlopen(req: urllib.request.Request, what: str) -> bytes:
    import urllib.request  # only when refreshing for real

    try:
        with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 (https URLs only)
            body: bytes = resp.read()
            return body
    except OSError as exc:
        raise SourceError(
            f"cannot read {what}: {exc}",
            hint="check the network or the index URL; `envspec db refresh` needs PyPI",
        ) from exc


def default_fetch(url: str) -> bytes:
    import urllib.request

    headers = {"User-Agent": "envspec-db-refresh"}
    if url.rstrip("/") == SIMPLE_API.rstrip("/") or url.startswith(SIMPLE_API):
        headers["Accept"] = SIMPLE_JSON
    return _urlopen(urllib.request.Request(url, headers=headers), url)


def default_fetch_range(url: str, start: int, end: int) -> bytes:
    import urllib.request

    rng = f"bytes=-{start}" if end < 0 else f"bytes={start}-{end}"
    req = urllib.request.Request(url, headers={"Range": rng, "User-Agent": "envspec-db-refresh"})
    return _urlopen(req, f"{url} ({rng})")


# ---------------------------------------------------------------------------------------------
# pure helpers (tested directly)


def linux_x86_64_pythons(filenames: list[str]) -> tuple[list[str], list[str]]:
    """Python versions with a Linux x86_64 CPython wheel: (regular, free-threaded), sorted."""
    regular: set[str] = set()
    threaded: set[str] = set()
    for fn in filenames:
        if not fn.endswith(".whl"):
            continue
        try:
            _, _, _, tags = parse_wheel_filename(fn)
        except InvalidWheelFilename:
            continue
        for tag in tags:
            if not (
                tag.platform.startswith(("manylinux", "linux")) and tag.platform.endswith("x86_64")
            ):
                continue
            m = re.fullmatch(r"cp(\d)(\d+)", tag.interpreter)
            if not m:
                continue
            py = f"{m.group(1)}.{m.group(2)}"
            (threaded if tag.abi.endswith("t") else regular).add(py)
    key = lambda s: Version(s)  # noqa: E731
    return sorted(regular, key=key), sorted(threaded, key=key)


_CUDA_RUNTIME = re.compile(r"^(nvidia-cuda-runtime(-cu\d+)?|cuda-toolkit)$")
_CUDNN = re.compile(r"^nvidia-cudnn(-cu\d+)?$")
_NCCL = re.compile(r"^nvidia-nccl(-cu\d+)?$")


def _pin(req: Requirement) -> str | None:
    for spec in req.specifier:
        if spec.operator in ("==", "==="):
            return spec.version
    return None


def pins_from_metadata(metadata: bytes | str, machine: str = "x86_64") -> dict[str, str | None]:
    """CUDA runtime (major.minor), cuDNN, NCCL and the variant name from a wheel's Requires-Dist.

    Only requirements that apply on Linux count (markers are evaluated for Linux ``machine``
    CPython: x86_64, or aarch64 for the platform check of ``platform_builds``).
    Returns {"cuda", "cudnn", "nccl", "variant", "cuda_pin"}; values are None when not pinned.
    """
    text = metadata.decode("utf-8", "replace") if isinstance(metadata, bytes) else metadata
    msg = HeaderParser().parsestr(text)
    out: dict[str, str | None] = {
        "cuda": None,
        "cuda_pin": None,
        "cudnn": None,
        "nccl": None,
        "variant": None,
    }
    env = {
        "platform_system": "Linux",
        "sys_platform": "linux",
        "platform_machine": machine,
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "python_version": "3.12",
        "python_full_version": "3.12.0",
        "extra": "",
    }
    for raw in msg.get_all("Requires-Dist") or []:
        try:
            req = Requirement(raw)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = req.name.lower().replace("_", "-")
        pin = _pin(req)
        if pin is None:
            continue
        if _CUDA_RUNTIME.match(name) and out["cuda_pin"] is None:
            v = Version(pin)
            out["cuda_pin"] = pin
            out["cuda"] = f"{v.major}.{v.minor}"
        elif _CUDNN.match(name):
            out["cudnn"] = pin
        elif _NCCL.match(name):
            out["nccl"] = pin
    if out["cuda"]:
        major, minor = out["cuda"].split(".")
        out["variant"] = f"cu{major}{minor}"
    return out


def _central_directory(url: str, size: int, fetch_range: FetchRange) -> bytes:
    """A remote zip's central directory: found from the end-of-central-directory record at the
    end of the file (or its zip64 record), read from that tail where it is in it."""
    tail_len = min(size, 65536 + 22)
    tail = fetch_range(url, size - tail_len, size - 1)
    eocd = tail.rfind(b"PK\x05\x06")
    if eocd < 0:
        raise ValueError("no end-of-central-directory record")
    cd_size, cd_offset = struct.unpack_from("<II", tail, eocd + 12)
    if cd_offset == 0xFFFFFFFF or cd_size == 0xFFFFFFFF:
        loc = tail.rfind(b"PK\x06\x07", 0, eocd)  # zip64 EOCD locator
        if loc < 0:
            raise ValueError("zip64 without locator")
        (z64_off,) = struct.unpack_from("<Q", tail, loc + 8)
        rec = fetch_range(url, z64_off, z64_off + 55)
        if rec[:4] != b"PK\x06\x06":
            raise ValueError("bad zip64 end-of-central-directory record")
        cd_size, cd_offset = struct.unpack_from("<QQ", rec, 40)
    start_in_tail = size - tail_len
    if cd_offset >= start_in_tail:
        return tail[cd_offset - start_in_tail : cd_offset - start_in_tail + cd_size]
    return fetch_range(url, cd_offset, cd_offset + cd_size - 1)


def _zip64_sizes(extra: bytes, csize: int, usize: int, lho: int) -> tuple[int, int]:
    """(compressed size, local header offset) of a member whose central directory entry gives
    them in its zip64 extra field (0xFFFFFFFF in the 32-bit fields): uncompressed size,
    compressed size and offset, in that order, each only where its field is 0xFFFFFFFF."""
    vals: list[int] = []
    e = 0
    while e + 4 <= len(extra):
        hid, hlen = struct.unpack_from("<HH", extra, e)
        if hid == 1:
            vals = list(struct.unpack_from(f"<{hlen // 8}Q", extra, e + 4))
            break
        e += 4 + hlen
    if usize == 0xFFFFFFFF:
        vals.pop(0)
    if csize == 0xFFFFFFFF:
        csize = vals.pop(0)
    if lho == 0xFFFFFFFF:
        lho = vals.pop(0)
    return csize, lho


def read_zip_member(url: str, size: int, member_suffix: str, fetch_range: FetchRange) -> bytes:
    """Read one member (the first whose name ends with ``member_suffix``) of a remote zip.

    Uses range requests: the end of the file for the end-of-central-directory record (zip64 too),
    the central directory, then the member's local header and data.
    """
    cd = _central_directory(url, size, fetch_range)
    pos = 0
    while pos + 46 <= len(cd) and cd[pos : pos + 4] == b"PK\x01\x02":
        (method,) = struct.unpack_from("<H", cd, pos + 10)
        csize, usize = struct.unpack_from("<II", cd, pos + 20)
        nlen, xlen, clen = struct.unpack_from("<HHH", cd, pos + 28)
        (lho,) = struct.unpack_from("<I", cd, pos + 42)
        name = cd[pos + 46 : pos + 46 + nlen].decode("utf-8", "replace")
        extra = cd[pos + 46 + nlen : pos + 46 + nlen + xlen]
        pos += 46 + nlen + xlen + clen
        if not name.endswith(member_suffix):
            continue
        if 0xFFFFFFFF in (csize, usize, lho):
            csize, lho = _zip64_sizes(extra, csize, usize, lho)
        head = fetch_range(url, lho, lho + 30 - 1)
        fnl, exl = struct.unpack_from("<HH", head, 26)
        data_start = lho + 30 + fnl + exl
        data = fetch_range(url, data_start, data_start + csize - 1) if csize else b""
        if method == 0:
            return data
        if method == 8:
            return zlib.decompress(data, -15)
        raise ValueError(f"unsupported zip compression method {method}")
    raise ValueError(f"no member ending in {member_suffix!r}")


# ---------------------------------------------------------------------------------------------
# the refresh


def _linux_x86_64_wheels(files: list[PypiFile], version: str) -> list[PypiFile]:
    out = []
    for f in files:
        fn = f.filename
        if not fn.endswith(".whl") or f.yanked not in (False, None):
            continue
        try:
            _, ver, _, tags = parse_wheel_filename(fn)
        except InvalidWheelFilename:
            continue
        if str(ver) != version and ver.public != version:
            continue
        if any(
            t.platform.endswith("x86_64")
            and t.platform.startswith(("manylinux", "linux"))
            and not t.abi.endswith("t")
            for t in tags
        ):
            out.append(f)
    return out


def _wheel_metadata(f: PypiFile, fetch: Fetch, fetch_range: FetchRange | None) -> bytes:
    if f.metadata_served:
        return fetch(f.url + ".metadata")
    if fetch_range is None:
        raise ValueError("index does not serve PEP 658 metadata and no range fetcher was given")
    if f.size <= 0:
        raise ValueError("index gives no file size")
    return read_zip_member(f.url, f.size, ".dist-info/METADATA", fetch_range)


def _final_releases(releases: Iterable[str], floor: Version) -> list[Version]:
    """The final releases from ``floor`` on, in order (no pre-, dev- or unparsable versions)."""
    versions = []
    for v in releases:
        try:
            pv = Version(v)
        except InvalidVersion:
            continue
        if pv >= floor and not pv.is_prerelease and not pv.is_devrelease:
            versions.append(pv)
    return sorted(versions)


def _release_row(
    v: str, py: list[str], py_t: list[str], wheel: str, pins: dict[str, str | None]
) -> ReleaseRow:
    """torch_pypi.toml's row of release ``v``: its Pythons, and the pins its ``wheel`` requires."""
    return {
        "version": v,
        "python": py,
        "python_freethreaded": py_t,
        "pypi_variant": pins["variant"] or "",
        "cuda": pins["cuda"] or "",
        "cuda_pin": pins["cuda_pin"] or "",
        "cudnn": pins["cudnn"] or "",
        "nccl": pins["nccl"] or "",
        "wheel": wheel,
        "source": f"pypi-metadata: Requires-Dist of {wheel}; Python versions from "
        f"{SIMPLE_API} file names",
    }


def collect(
    fetch: Fetch, fetch_range: FetchRange | None, since: str = "2.0.0"
) -> tuple[list[ReleaseRow], list[str], list[str]]:
    """Rows for torch_pypi.toml (sorted), the problems met, and those of them where an index did not
    answer (``SourceError`` from a fetcher); pure given its fetchers. The release list and the
    file list are needed at all: a ``SourceError`` reading them propagates."""
    api = json.loads(fetch(JSON_API))
    simple = json.loads(fetch(SIMPLE_API))
    versions = _final_releases(api.get("releases", {}), Version(since))
    files_by_version = _files_by_version(simple)
    rows: list[ReleaseRow] = []
    problems: list[str] = []
    source_errors: list[str] = []
    for pv in versions:
        v = str(pv)
        files = files_by_version.get(v, [])
        py, py_t = linux_x86_64_pythons([f.filename for f in files])
        wheels = _linux_x86_64_wheels(files, v)
        if not wheels:
            problems.append(f"{v}: no Linux x86_64 wheel on the index")
            continue
        # pins are the same for every Python; read the newest Python's wheel
        wheels.sort(key=lambda f: (len(f.filename), f.filename))
        pick = max(
            wheels,
            key=lambda f: Version(
                linux_x86_64_pythons([f.filename])[0][-1]
                if linux_x86_64_pythons([f.filename])[0]
                else "0"
            ),
        )
        try:
            meta = _wheel_metadata(pick, fetch, fetch_range)
        except SourceError as exc:
            problem = f"{v}: cannot read the metadata of {pick.filename}: {exc.message}"
            problems.append(problem)
            source_errors.append(problem)
            continue
        except (ValueError, struct.error, zlib.error) as exc:
            problems.append(f"{v}: cannot read the metadata of {pick.filename}: {exc}")
            continue
        rows.append(_release_row(v, py, py_t, pick.filename, pins_from_metadata(meta)))
    return rows, problems, source_errors


def _files_by_version(simple: dict[str, Any]) -> dict[str, list[PypiFile]]:
    """The simple JSON API's wheel entries, by the version their file names give; an entry that
    is not as PEP 691 says is a ``SourceError``."""
    out: dict[str, list[PypiFile]] = {}
    for i, raw in enumerate(simple.get("files", [])):
        try:
            f = PypiFile.model_validate(raw)
        except ValidationError as e:
            first = e.errors()[0]
            raise SourceError(
                f"{SIMPLE_API}: files[{i}].{'.'.join(map(str, first['loc']))}: {first['msg']}",
                hint="the index's JSON simple page is not as PEP 691 says; try again later",
                reference="index-unavailable",
            ) from None
        try:
            _, ver, _, _ = parse_wheel_filename(f.filename)
        except InvalidWheelFilename:
            continue
        out.setdefault(str(ver), []).append(f)
    return out


def _linux_aarch64_wheel(files: list[PypiFile], version: str) -> PypiFile | None:
    """The manylinux aarch64 CPython wheel of ``version`` for the newest Python (not free-threaded)."""
    best: tuple[Version, PypiFile] | None = None
    for f in files:
        fn = f.filename
        if not fn.endswith(".whl") or f.yanked not in (False, None):
            continue
        try:
            _, ver, _, tags = parse_wheel_filename(fn)
        except InvalidWheelFilename:
            continue
        if str(ver) != version and ver.public != version:
            continue
        for t in tags:
            if (
                t.platform.endswith("aarch64")
                and t.platform.startswith(("manylinux", "linux"))
                and t.interpreter.startswith("cp")
                and not t.abi.endswith("t")
            ):
                py = Version(f"{t.interpreter[2]}.{t.interpreter[3:]}")
                if best is None or py > best[0]:
                    best = (py, f)
    return best[1] if best else None


def platform_builds(
    fetch: Fetch, fetch_range: FetchRange | None, versions: list[str]
) -> tuple[dict[str, dict[str, str]], list[str]]:
    """Which build PyPI's linux-aarch64 wheel of each of ``versions`` is, from its Requires-Dist
    (``pins_from_metadata`` for aarch64: a CUDA runtime that applies there makes it that CUDA's
    build, none the CPU build): version -> {"variant", "wheel"}; and the problems met. A release
    without such a wheel is left out."""
    simple = json.loads(fetch(SIMPLE_API))
    files_by_version = _files_by_version(simple)
    out: dict[str, dict[str, str]] = {}
    problems: list[str] = []
    for v in versions:
        pick = _linux_aarch64_wheel(files_by_version.get(v, []), v)
        if pick is None:
            continue
        try:
            meta = _wheel_metadata(pick, fetch, fetch_range)
        except SourceError as exc:
            problems.append(f"{v}: cannot read the metadata of {pick.filename}: {exc.message}")
            continue
        except (ValueError, struct.error, zlib.error) as exc:
            problems.append(f"{v}: cannot read the metadata of {pick.filename}: {exc}")
            continue
        out[v] = {
            "variant": pins_from_metadata(meta, "aarch64")["variant"] or "cpu",
            "wheel": pick.filename,
        }
    return out, problems


def platform_review(
    found: dict[str, dict[str, str]], curated: Path, platform: str = "linux-aarch64"
) -> dict[str, list[str]]:
    """What data/torch_platforms.toml (in ``curated``) lacks against ``found`` (``platform_builds``)."""
    _rows.cache_clear()  # read the curated file as it is now, not as this process first saw it
    out: dict[str, list[str]] = {}
    for v, b in found.items():
        row = pypi_build(v, platform, root=curated)
        cuda = b["variant"] != "cpu"
        what = f"PyPI's {platform} wheel ({b['wheel']}) is the {b['variant']} build"
        if row is None:
            out[v] = [
                f"{what}; torch_platforms.toml has no row for torch {v}, so {platform} locks take every "
                f"build of it from the PyTorch index: add a [[pypi]] row"
                + (
                    " with its arch_list (the -gencode flags in torch/lib/libtorch_cuda.so)"
                    if cuda
                    else ""
                )
            ]
        elif row.variant != b["variant"]:
            out[v] = [
                f"{what}; torch_platforms.toml says {row.variant} (torch {row.torch}): fix the row"
            ]
        elif cuda and not row.arch_list:
            out[v] = [
                f"{what}; its torch_platforms.toml row has no arch_list: {platform} locks would carry "
                "x86_64's arch list; add it (the -gencode flags in torch/lib/libtorch_cuda.so)"
            ]
    return out


def _q(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def render(rows: list[ReleaseRow], db_version: str, date: str) -> str:
    """Canonical TOML text of torch_pypi.toml (hand-rendered so key order and layout are fixed)."""
    out = [
        "# Generated by `envspec db refresh` from PyPI's index and wheel metadata. Do not edit:",
        "# curated facts live in torch_variants.toml. Rows are sorted by version.",
        "format = 1",
        f"db_version = {_q(db_version)}",
        f"date = {_q(date)}",
        f"source = {_q(SIMPLE_API)}",
        "",
    ]
    for r in sorted(rows, key=lambda r: Version(str(r["version"]))):
        out.append("[[release]]")
        for k in (
            "version",
            "python",
            "python_freethreaded",
            "pypi_variant",
            "cuda",
            "cuda_pin",
            "cudnn",
            "nccl",
            "wheel",
            "needs_review",
            "source",
        ):
            if k == "needs_review" and not r.get(k):
                continue  # written only where there is something to review
            val = r[k]
            if isinstance(val, list):
                out.append(f"{k} = [{', '.join(_q(x) for x in val)}]")
            else:
                out.append(f"{k} = {_q(val)}")
        out.append("")
    return "\n".join(out)


def _curated_dir(out_path: Path) -> Path:
    """The curated data beside the generated file (a copy of the data directory), else the bundled one."""
    return out_path.parent if (out_path.parent / "cuda.toml").is_file() else DATA_DIR


def review_items(rows: dict[str, ReleaseRow], curated: Path) -> dict[str, list[str]]:
    """For each release row, what the curated data lacks to turn it into a usable variant: a CUDA
    toolkit that cuda.toml does not know (no driver floor, no nvcc targets), or a PyPI variant with no
    torch_variants.toml row and no older release to carry the arch list from."""
    import tomllib

    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    cuda = tomllib.loads((curated / "cuda.toml").read_text(encoding="utf-8"))
    builds = tomllib.loads((curated / "torch_variants.toml").read_text(encoding="utf-8"))
    toolkits = {str(t.get("version")) for t in cuda.get("toolkit", [])}
    covered: list[tuple[str, SpecifierSet]] = []
    for b in builds.get("build", []):
        try:
            covered.append((str(b.get("variant")), SpecifierSet(str(b.get("torch")))))
        except InvalidSpecifier:
            continue
    out: dict[str, list[str]] = {}
    seen_variants: set[str] = set()
    for v in sorted(rows, key=Version):
        r = rows[v]
        variant, cu = str(r.get("pypi_variant") or ""), str(r.get("cuda") or "")
        items: list[str] = []
        if cu and cu not in toolkits:
            items.append(
                f"CUDA {cu} is not in cuda.toml: add its row (driver floors from the CUDA release notes' "
                "Tables 2 and 3, nvcc targets) before this release can be resolved"
            )
        has_row = any(
            name == variant and spec.contains(Version(v), prereleases=True)
            for name, spec in covered
        )
        if variant and variant != "cpu" and not has_row and variant not in seen_variants:
            items.append(
                f"no {variant} row in torch_variants.toml and no older release with {variant} to carry "
                "the arch list from: add the row (arch list from the release's build scripts)"
            )
        if variant and not items:
            seen_variants.add(variant)  # a later release can carry this one's arch list
        if items:
            out[v] = items
    return out


def _merge_rows(
    new: dict[str, ReleaseRow],
    old_rows: dict[str, ReleaseRow],
    since: str,
    problems: list[str],
    report: RefreshReport,
) -> dict[str, ReleaseRow]:
    """The rows read now, and the old rows of releases not read (older than ``since``, or whose
    reading failed); ``report`` says which were added, changed, unchanged and kept."""
    failed = {p.split(":", 1)[0] for p in problems}
    merged = dict(new)
    for v, r in old_rows.items():
        if v not in merged and (Version(v) < Version(since) or v in failed):
            merged[v] = r  # keep what we could not (or were not asked to) re-read
            report.kept.append(v)
    for v in new:
        if v not in old_rows:
            report.added.append(v)
        elif {k: old_rows[v].get(k) for k in new[v]} != new[v]:
            report.changed.append(v)
        else:
            report.unchanged.append(v)
    for names in (report.added, report.changed, report.unchanged, report.kept):
        names.sort(key=Version)
    return merged


def refresh(
    out_path: Path,
    fetch: Fetch | None = None,
    since: str = "2.0.0",
    *,
    fetch_range: FetchRange | None = None,
    db_version: str | None = None,
    date: str | None = None,
) -> RefreshReport:
    """Regenerate ``out_path`` (torch_pypi.toml) from PyPI; returns what changed.

    ``fetch`` (url -> bytes) and ``fetch_range`` (url, first, last -> bytes) default to urllib;
    tests inject recorded responses. Releases older than ``since`` already in ``out_path`` are
    kept as they are. The file is written atomically, and only when at least one release was read.
    """
    import datetime
    import os
    import tomllib

    out_path = Path(out_path)
    if fetch is None:
        fetch = default_fetch
        if fetch_range is None:
            fetch_range = default_fetch_range
    old_rows: dict[str, ReleaseRow] = {}
    if out_path.exists():
        old = tomllib.loads(out_path.read_text())
        old_rows = {r["version"]: r for r in old.get("release", [])}
    rows, problems, source_errors = collect(fetch, fetch_range, since)
    report = RefreshReport(out_path=out_path, problems=problems, source_errors=source_errors)
    if not rows:
        return report
    new = {str(r["version"]): r for r in rows}
    merged = _merge_rows(new, old_rows, since, problems, report)
    found, platform_problems = platform_builds(fetch, fetch_range, list(new))
    report.problems += platform_problems
    curated = _curated_dir(out_path)
    if not (curated / "torch_platforms.toml").is_file():  # a data copy without it: the bundled rows
        curated = DATA_DIR
    report.platform_review = platform_review(found, curated)
    for v, items in review_items(merged, _curated_dir(out_path)).items():
        merged[v] = dict(merged[v], needs_review=items)
        report.needs_review[v] = items
    for v in list(merged):
        if v not in report.needs_review:
            merged[v].pop("needs_review", None)
    report.removed = sorted((set(old_rows) - set(merged)), key=Version)
    report.releases = sorted(merged, key=Version)
    today = date or datetime.date.today().isoformat()
    text = render(list(merged.values()), db_version or today.replace("-", "."), today)
    tmp = out_path.with_suffix(out_path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, out_path)
    report.written = True
    _load_cached.cache_clear()  # a DB loaded earlier in this process is stale now
    return report

"""Reading the lock the verifier checks against (docs/lockfile.md, format versions 1 and 2).

Only the standard library: this module is copied into images. The verifier reads the lock's
TOML into ``Lock``, a typed dict of the few tables it needs (each a table, else absent: where it
enters, ``_tables``); unknown keys are ignored (``revision`` grows
for additive changes), an unknown ``version`` is refused. A lock with a section per platform (version 2,
``[platforms.<name>.*]``) is read as the one-platform lock of this host's platform (or
``ENVSPEC_PLATFORM``'s): its shared tables and that section's, so a host-mode ``envspec verify
--lock multi.lock`` checks the host against what its image would carry.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from pathlib import Path
from typing import TypedDict, cast

from . import settings

DEFAULT_LOCK = "/opt/envspec/envspec.lock"  # where envspec's image builder bakes the lock
KNOWN_VERSIONS = (1, 2)
MULTI_VERSION = 2  # a section per platform


class MetaTable(TypedDict, total=False):
    name: str
    content_hash: str


class PlatformTable(TypedDict, total=False):
    venv: str  # the image's venv: a verifier running in its python is in "image" mode


class HardwareTable(TypedDict, total=False):
    gpus: list[str]  # the spec's GPUs, as the compatibility database names them
    compute_capabilities: list[str]
    arch_list: list[str]  # what torch must be compiled for, "sm_90"
    driver_floor: str
    driver_policy: str
    driver_assumed: bool  # the spec named no driver: the floor was assumed
    expected: dict[str, float | dict[str, float]]  # GEMM rates, for all GPUs or by GPU name


class TorchTable(TypedDict, total=False):
    version: str
    local: str
    variant: str  # "cu130", "cpu"
    cuda: str
    cudnn: str
    nccl: str


class RuntimeTable(TypedDict, total=False):
    tf32: bool
    matmul_precision: str
    shm_size: str | int  # "16g", or bytes
    env: dict[str, str]


class WheelRow(TypedDict):
    name: str
    version: str


# A lock as the verifier reads it (one platform's view of a lock with sections): the tables it
# checks against, and where the file is and its bytes' hash (``load_lock`` sets them)
Lock = TypedDict(
    "Lock",
    {
        "version": int,
        "revision": int,
        "meta": MetaTable,
        "platform": PlatformTable,
        "hardware": HardwareTable,
        "torch": TorchTable,
        "runtime": RuntimeTable,
        "wheels": list[WheelRow],
        "__path__": str,
        "__file_sha256__": str,
        "__platform__": str,
    },
    total=False,
)
TABLES = ("meta", "platform", "hardware", "torch", "runtime")  # each a table where it is there


class LockReadError(Exception):
    """The lock cannot be read: a bad-input error (exit code 2 at the CLI)."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


def find_lock(explicit: str | os.PathLike[str] | None = None) -> tuple[Path, str]:
    """Where the lock is and why: --lock, else $ENVSPEC_LOCK, else the image's path."""
    if explicit:
        return Path(explicit), "--lock"
    env = settings.get(settings.LOCK)
    if env:
        return Path(env), settings.LOCK
    return Path(DEFAULT_LOCK), "default image path"


# a top-level table header at the start of a line: [name], [name.sub], [[name]], [[name.sub]]
_HEADER = re.compile(r"^\[\[?\s*([A-Za-z0-9_-]+)[^\n]*$", re.MULTILINE)


def _only_tables(text: str, tables: tuple[str, ...]) -> str:
    """The lock's text cut down to its top-level keys and the tables whose first name is in
    ``tables`` (with their sub-tables): TOML that parses to the same values for those tables,
    in a fraction of the time (a lock's [[wheels]] and [[debian.packages]] are most of it)."""
    keep, pos, name = [], 0, ""
    for m in _HEADER.finditer(text):
        if not name or name in tables:
            keep.append(text[pos : m.start()])
        pos, name = m.start(), m.group(1)
    if not name or name in tables:
        keep.append(text[pos:])
    return "".join(keep)


def _missing(data: dict[str, object]) -> list[str]:
    """What the verifier needs and the lock (one platform's view) lacks."""
    problems = []
    for table in ("platform", "hardware"):
        if not isinstance(data.get(table), dict):
            problems.append(f"[{table}] is missing")
    wheels = data.get("wheels", [])
    if not isinstance(wheels, list):
        problems.append("[[wheels]] must be an array of tables")
    else:
        for i, w in enumerate(wheels):
            for key in ("name", "version"):
                if not isinstance(w, dict) or not isinstance(w.get(key), str):
                    problems.append(f"wheels[{i}].{key} is missing")
    return problems


def load_lock(path: str | os.PathLike[str], *, tables: tuple[str, ...] | None = None) -> Lock:
    """The lock's tables the verifier reads (``Lock``). ``tables``: read only these top-level
    tables (and the top-level keys), e.g. the start-up hook's ("meta", "platform", "hardware",
    "torch", "runtime"); the others are absent from the dict and not checked."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise LockReadError(
            f"no lockfile at {p}",
            "pass --lock PATH or set ENVSPEC_LOCK; inside an envspec image the lock is "
            f"{DEFAULT_LOCK}",
        ) from None
    except OSError as e:
        raise LockReadError(f"cannot read lockfile {p}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
        part: dict[str, object] | None = None
        if tables is not None:
            try:
                part = tomllib.loads(_only_tables(text, tables))
            except tomllib.TOMLDecodeError:
                part = None  # a cut in an odd place: the whole file says what is wrong
        full = (
            part is None or part.get("version") == MULTI_VERSION
        )  # the sections are under [platforms]
        data = tomllib.loads(text) if full or part is None else part
    except UnicodeDecodeError as e:
        raise LockReadError(f"{p} is not UTF-8 text (byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise LockReadError(f"{p} is not valid TOML: {e}") from None
    if full:  # the whole text was read: its tables must give its content hash
        _check_hash(data, p)
    version = data.get("version")
    if version not in KNOWN_VERSIONS or (
        version == MULTI_VERSION and not isinstance(data.get("platforms"), dict)
    ):
        raise LockReadError(
            f"{p}: lock format version {version!r} is not one this verifier reads "
            f"(it reads {', '.join(map(str, KNOWN_VERSIONS))}; version {MULTI_VERSION} with [platforms.<name>] sections)",
            "use the envspec that wrote the lock, or re-lock with this one",
        )
    if version == MULTI_VERSION:
        data = _platform_view(data, p)
    problems = _missing(data)
    if problems:
        raise LockReadError(f"{p}: " + "; ".join(problems))
    wrong = variant_problems(data)
    if wrong:
        raise LockReadError(
            f"{p}: " + "; ".join(f"{text} ({ref})" for ref, text in wrong),
            "this lock would build another torch than it says: re-lock from the spec "
            "(`envspec lock SPEC`) where its canonical indexes answer",
        )
    data.setdefault("meta", {})
    data["__path__"] = str(p)
    data["__file_sha256__"] = "sha256:" + hashlib.sha256(raw).hexdigest()
    return _tables(data)


_FAMILY = (
    "torch",
    "torchvision",
    "torchaudio",
)  # each build carries its variant as its local label


def _label(version: str, filename: str) -> str:
    if filename.endswith(".whl") and filename.count("-") >= 4:
        version = filename.split("-")[1]
    return version.split("+", 1)[1].lower() if "+" in version else ""


def variant_problems(data: dict[str, object]) -> list[tuple[str, str]]:
    """(reference, sentence) for each pin of one platform's view that says another build than its
    [torch] table, as envspec's own reader says (``envspec.lock.variant_problems``, issue 57)."""
    torch = data.get("torch")
    t = torch if isinstance(torch, dict) else None
    wheels = data.get("wheels")
    out = []
    for w in wheels if isinstance(wheels, list) else []:
        if not isinstance(w, dict):
            continue
        name, version = str(w.get("name", "")), str(w.get("version", ""))
        filename, index = str(w.get("filename", "")), str(w.get("index", ""))
        label = _label(version, filename)
        if t is not None and name in _FAMILY and label != str(t.get("local", "")):
            local = str(t.get("local", ""))
            want = f"+{local}" if local else "no local label: PyPI's build"
            out.append(
                (
                    "lock-torch-variant",
                    f"[torch] variant = {t.get('variant')!r} ({want}), and its {name} wheel is "
                    f"{version} ({filename}, index {index})",
                )
            )
        elif t is not None and name == "torch" and index and t.get("index") not in (None, index):
            out.append(
                (
                    "lock-torch-variant",
                    f"[torch] index = {t.get('index')!r}, and its torch wheel names {index!r} "
                    f"({filename})",
                )
            )
        elif label and index.rstrip("/") == "https://pypi.org/simple":
            out.append(
                (
                    "lock-index-mismatch",
                    f"{name} {version} ({filename}) is credited to {index}, which serves no "
                    "version with a local label",
                )
            )
    return out


def _tables(data: dict[str, object]) -> Lock:
    """The lock's TOML as a ``Lock``: a table of ``TABLES`` that is not a table is absent (the
    checks then find nothing locked there); the rows of [[wheels]] were checked (``_missing``)."""
    for name in TABLES:
        if name in data and not isinstance(data[name], dict):
            del data[name]
    return cast(Lock, data)


def _check_hash(data: dict[str, object], p: Path) -> None:
    """A lock changed after ``envspec lock`` wrote it (its tables but [meta] no longer hash to
    ``[meta].content_hash``) is refused, as envspec's own reader refuses it (``lock-tampered``)."""
    meta = data.get("meta")
    claimed = meta.get("content_hash") if isinstance(meta, dict) else None
    if not isinstance(claimed, str) or not claimed:
        return
    body = {k: v for k, v in data.items() if k != "meta"}
    got = (
        "sha256:"
        + hashlib.sha256(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
    )
    if got != claimed:
        raise LockReadError(
            f"{p}: its content does not match its [meta].content_hash: it was changed after `envspec lock` "
            "wrote it (lock-tampered)",
            "edit the spec, not the lock, and run `envspec lock SPEC`; or restore the lock as written",
        )


def host_platform() -> str:
    """This host's platform as locks name it: ``linux-x86_64``, ``linux-aarch64``."""
    import platform

    machine = platform.machine().lower()
    return "linux-" + {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def _platform_view(data: dict[str, object], p: Path) -> dict[str, object]:
    """A version-2 lock as the one-platform lock of this host (``ENVSPEC_PLATFORM`` overrides):
    the shared tables, then the section's; ``__platform__`` names it."""
    sections = data["platforms"]
    assert isinstance(sections, dict)  # load_lock checked it
    name = settings.get(settings.PLATFORM) or host_platform()
    part = sections.get(name)
    if not isinstance(part, dict):
        raise LockReadError(
            f"{p}: the lock has no section for this host's platform {name} (it has "
            f"{', '.join(sorted(sections)) or 'none'})",
            "lock the spec with this platform in [target].platforms, or set ENVSPEC_PLATFORM to one it has",
        )
    view = {k: v for k, v in data.items() if k != "platforms"}
    view.update(part)
    view["__platform__"] = name
    return view


def lock_hash(lock: Lock) -> str:
    """The lock's content hash (``[meta].content_hash``), else the hash of the file's bytes."""
    h = lock.get("meta", {}).get("content_hash", "")
    return str(h or lock.get("__file_sha256__", ""))

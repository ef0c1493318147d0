"""A content-keyed cache of the validated compatibility DB, so that a process that only reads the
DB (``envspec explain``) does not check project data that was checked before.

The DB's data files are project data, not user input: ``load.py`` reads them and checks them with
the pydantic row models and the cross-checks whenever they change. What it built is then written
here, as the JSON of ``CompatDB.to_json()``, under a key that is the sha256 of everything the
result depends on: this file's format, the envspec and pydantic versions, the source of the modules
that turn files into the DB (``load.py``, ``rows.py``, ``model.py``, ``arch.py``) and the name and bytes of each
data file. A later process with the same key builds the same models from the stored values with
``model_construct`` (pydantic's constructor for trusted, already validated data: no validation, no
schema built), so the objects ``resolve`` gets are the DB's models with equal values
(tests/unit/test_compat_cache.py compares both ways field by field).

Layout: ``<cache>/compat-db/<key>.json`` (``envspec.cache.dirs``), one header line (the key and the
sha256 of the rest) and the payload. An entry that is missing, unreadable, of another key, or
whose payload does not match its sha256 is ignored: the DB is checked again and the entry written
anew (atomically: a temporary file renamed into place). A cache that cannot be written is not an
error. The newest ``KEEP`` entries are kept.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import envspec
from envspec.cache.dirs import cache_dir_for
from envspec.compat.model import CompatDB, CudaToolkit, Family, Gpu, PcieLink, TorchRelease, Variant

CACHE_FORMAT = 2  # of the entry (header + payload); part of the key
KEEP = 8  # entries kept in the folder: the bundled DB under a few envspec versions, and data dirs
SUBDIR = "compat-db"
_CODE = (
    "load.py",
    "rows.py",
    "model.py",
    "arch.py",
)  # the modules whose code decides what a data file becomes


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    return cache_dir_for(os.environ if env is None else env) / SUBDIR


def cache_key(root: Path, names: Iterable[str]) -> str | None:
    """The key of the DB built from the data files ``names`` in ``root``; None when a file cannot be
    read (then the DB is checked, which reports it)."""
    from pydantic import VERSION as PYDANTIC_VERSION

    h = hashlib.sha256(
        f"envspec compat-db cache {CACHE_FORMAT}\0{envspec.__version__}\0{PYDANTIC_VERSION}\0".encode()
    )
    here = Path(__file__).parent
    try:
        for name in _CODE:
            _add(h, f"code/{name}", (here / name).read_bytes())
        for name in names:
            _add(h, name, (root / name).read_bytes())
    except OSError:
        return None
    return h.hexdigest()


def _add(h: hashlib._Hash, name: str, data: bytes) -> None:
    h.update(f"{name}\0{len(data)}\0".encode())
    h.update(data)


def read(key: str, folder: Path | None = None) -> CompatDB | None:
    """The DB stored under ``key``, or None (no entry, or one that is not whole: it is ignored)."""
    try:
        path = (folder or cache_dir()) / f"{key}.json"
        blob = path.read_bytes()
        head, _, payload = blob.partition(b"\n")
        meta = json.loads(head)
        if meta.get("key") != key or meta.get("sha256") != hashlib.sha256(payload).hexdigest():
            return None
        return from_json(json.loads(payload))
    except (OSError, RuntimeError, ValueError, KeyError, TypeError, AttributeError):
        return None  # RuntimeError: no home folder to find the cache in (Path.home())


def write(key: str, db: CompatDB, folder: Path | None = None) -> None:
    """Store ``db`` under ``key``, atomically; a cache that cannot be written is left as it is."""
    try:
        folder = folder or cache_dir()
    except RuntimeError:
        return  # no home folder to put the cache in (Path.home())
    payload = json.dumps(db.to_json(), sort_keys=True, separators=(",", ":")).encode()
    head = json.dumps(
        {"key": key, "sha256": hashlib.sha256(payload).hexdigest(), "format": CACHE_FORMAT}
    ).encode()
    tmp = folder / f".{key}.{os.getpid()}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(head + b"\n" + payload)
        os.replace(tmp, folder / f"{key}.json")
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # no folder to have left it in
        return
    _prune(folder)


def _prune(folder: Path) -> None:
    try:
        entries = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in entries[KEEP:]:
            old.unlink(missing_ok=True)
    except OSError:
        pass  # another process pruned the same entry first


def from_json(data: dict[str, Any]) -> CompatDB:
    """The DB from ``CompatDB.to_json()``'s values, which were validated when they were made."""
    releases = [
        TorchRelease.model_construct(
            **{
                **r,
                "variants": {
                    name: Variant.model_construct(**v) for name, v in r["variants"].items()
                },
            }
        )
        for r in data["torch_releases"]
    ]
    return CompatDB(
        version=data["db_version"],
        date=data["date"],
        format=data["format"],
        torch_releases=releases,
        cuda_toolkits=[CudaToolkit.model_construct(**t) for t in data["cuda_toolkits"]],
        gpus=[Gpu.model_construct(**g) for g in data["gpus"]],
        sources=dict(data["sources"]),
        families=[Family.model_construct(**f) for f in data["families"]],
        pcie=[PcieLink.model_construct(**x) for x in data["pcie"]],
    )

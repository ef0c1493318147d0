"""Helpers for the build tests: tiny wheels made on the spot, and lock variants.

Imported by tests/unit/test_build*.py and tests/e2e/test_build*.py (by path: tests/ is not a
package)."""

from __future__ import annotations

import base64
import copy
import hashlib
import io
import tomllib
import zipfile
from pathlib import Path

from envspec import lock as lockmod
from envspec.lock import Lockfile, text_data

HERE = Path(__file__).resolve().parent


def _rec(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")


def make_wheel(
    dest_dir: Path,
    name: str,
    version: str,
    files: dict[str, bytes] | None = None,
    entry_points: str = "",
) -> tuple[Path, str]:
    """Write ``{name}-{version}-py3-none-any.whl`` into ``dest_dir``; return (path, sha256 hex).
    Member order and times are fixed, so the same arguments give the same bytes."""
    mod = name.replace("-", "_")
    files = dict(files or {f"{mod}/__init__.py": f"__version__ = {version!r}\n".encode()})
    di = f"{mod}-{version}.dist-info"
    files[f"{di}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{di}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: envspec-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    if entry_points:
        files[f"{di}/entry_points.txt"] = entry_points.encode()
    record = (
        "".join(f"{p},{_rec(d)},{len(d)}\n" for p, d in sorted(files.items())) + f"{di}/RECORD,,\n"
    )
    files[f"{di}/RECORD"] = record.encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(files):
            zi = zipfile.ZipInfo(p, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            z.writestr(zi, files[p])
    data = buf.getvalue()
    path = Path(dest_dir) / f"{mod}-{version}-py3-none-any.whl"
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def data(lock: str | Lockfile = "small.lock") -> dict:
    """A lock as the plain dict of its TOML, to edit in a test: a fixture's name, or a model."""
    if isinstance(lock, str):
        return tomllib.loads((HERE / lock).read_text())
    return text_data(lock)


def load(name: str = "small.lock") -> Lockfile:
    return lockmod.load(HERE / name)


def rehash(lock: dict) -> Lockfile:
    """An edited lock dict as the model, with a fresh content hash."""
    return Lockfile.model_validate(lock).with_hash()


def with_wheel(lock: dict | Lockfile, name: str, **changes) -> Lockfile:
    """A copy of ``lock`` with wheel ``name``'s fields changed (and a new content hash)."""
    out = copy.deepcopy(lock) if isinstance(lock, dict) else data(lock)
    for w in out["wheels"]:
        if w["name"] == name:
            w.update(changes)
    return rehash(out)


def local_lock(
    tmp: Path,
    wheels: list[tuple[str, str, str]],
    *,
    name: str = "unit",
    files: dict[str, dict[str, bytes]] | None = None,
) -> tuple[Lockfile, Path]:
    """A lock of tiny wheels [(name, version, group)] made in ``tmp/wheels`` (a find-links
    mirror), no Debian packages; ``files``: a wheel's members by its name, where not the default.
    Returns (the lock, the mirror directory)."""
    mirror = Path(tmp) / "wheels"
    mirror.mkdir(parents=True, exist_ok=True)
    lock = data("small.lock")
    lock["meta"]["name"] = name
    lock["wheels"] = []
    for wname, version, group in wheels:
        path, sha = make_wheel(mirror, wname, version, files=(files or {}).get(wname))
        lock["wheels"].append(
            {
                "name": wname,
                "version": version,
                "filename": path.name,
                "index": "https://pypi.invalid/simple",
                "sha256": sha,
                "size": path.stat().st_size,
                "group": group,
                "direct": group == "team",
            }
        )
    return rehash(lock), mirror

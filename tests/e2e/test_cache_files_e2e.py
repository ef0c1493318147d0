"""The cache owns its files on a file system with reflinks (issue 39): a wheel from a ``file://``
mirror on a loop-mounted XFS (``mkfs.xfs``: reflinks on by default) enters the cache as a reflink,
an inode of its own, read-only; a byte changed in it leaves the mirror's file as it was, and the
next fetch heals it. On ext4 (no reflinks) the same wheel is read where it is
(tests/unit/test_build.py)."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data" / "build"))
import helpers  # noqa: E402

from envspec import sources  # noqa: E402
from envspec.cache.store import Cache, copy_local, reflink  # noqa: E402
from envspec.lock import Wheel  # noqa: E402
from envspec.wheels.fetch import WheelFetcher  # noqa: E402

pytestmark = [pytest.mark.e2e]
if shutil.which("mkfs.xfs") is None or os.geteuid() != 0:
    pytestmark.append(
        pytest.mark.skip(
            reason="needs root and mkfs.xfs (apt-get install xfsprogs) for a loop-mounted XFS"
        )
    )


def test_a_wheel_from_a_mirror_on_xfs_enters_the_cache_as_a_reflink_and_heals(tmp_path):
    from conftest import loop_fs

    with loop_fs(
        tmp_path / "xfs.img", tmp_path / "xfs", ["mkfs.xfs", "-q", "-m", "reflink=1"], "512M"
    ) as fs:
        (fs / "mirror").mkdir()
        path, sha = helpers.make_wheel(
            fs / "mirror", "pkg", "1.0", files={"pkg/data.bin": os.urandom(1 << 20)}
        )
        before = hashlib.sha256(path.read_bytes()).hexdigest()
        assert reflink(path, fs / "probe") and copy_local(path, fs / "probe2") == "reflink"
        cache = Cache(fs / "cache")
        warned: list[str] = []
        f = WheelFetcher(
            cache,
            [sources.Mirror((fs / "mirror").as_uri(), "links", "xfs")],
            on_damaged=warned.append,
        )
        pin = Wheel(
            name="pkg", version="1.0", filename=path.name, index="", sha256=sha, group="deps"
        )
        got = f.fetch(pin)
        assert got == cache.blob(sha) and f.in_place == {}  # in the cache, not read in place
        st = got.stat()
        assert st.st_ino != path.stat().st_ino and st.st_nlink == 1 and st.st_mode & 0o777 == 0o444
        got.chmod(0o644)
        with open(got, "r+b") as fh:  # copy on write: the mirror's blocks stay as they were
            fh.seek(1000)
            b = fh.read(1)
            fh.seek(1000)
            fh.write(bytes([b[0] ^ 0xFF]))
        assert hashlib.sha256(path.read_bytes()).hexdigest() == before
        again = WheelFetcher(cache, f.mirrors, on_damaged=warned.append).fetch(pin)
        assert hashlib.sha256(again.read_bytes()).hexdigest() == sha and len(warned) == 1

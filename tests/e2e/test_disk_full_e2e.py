"""A build that runs out of disk says which of its directories is full and what it needs (issue 43,
point 9): the cache on a small file system of its own, then containers-storage on one, each with
real buildah and the layer importer (root only: loop mounts)."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest
from conftest import loop_fs, private_storage

from envspec.cli import main

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "lockfiles" / "smoke.lock"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="loop mounts need root")


def _build(lock: Path) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["build", str(lock), "--no-cache", "-q"])
    return rc, err.getvalue()


def test_a_full_cache_is_named(tmp_path, monkeypatch):
    with (
        loop_fs(
            tmp_path / "cache.img", tmp_path / "cache", ["mkfs.ext4", "-q", "-F"], "24M"
        ) as cache,
        private_storage(tmp_path / "store"),
    ):
        monkeypatch.setenv("ENVSPEC_CACHE", str(cache))
        rc, err = _build(SMOKE)
    assert rc == 5, err
    assert (
        "error[disk-full]" in err
        and f"no space left on device in the cache ({tmp_path / 'cache'}" in err
    ), err
    assert "a first build of smoke's image needs about" in err and "<- full" in err
    assert "envspec cache gc" in err and "Traceback" not in err


def test_a_full_store_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVSPEC_CACHE", str(tmp_path / "cache"))
    with (
        loop_fs(
            tmp_path / "store.img", tmp_path / "store", ["mkfs.ext4", "-q", "-F"], "48M"
        ) as store,
        private_storage(store),
    ):
        rc, err = _build(SMOKE)
    assert rc == 5, err
    assert (
        "error[disk-full]" in err
        and f"no space left on device in containers-storage ({tmp_path / 'store'}" in err
    ), err
    assert "podman image prune" in err and "Traceback" not in err

"""Compressed pushes and archives end to end: two machines (two storage roots, two caches, both
--no-cache) push one manifest digest to Debian's docker-registry; the registry holds zstd (or
gzip) blobs that decompress to the layers' diff_ids; podman pulls the image into a third store
and runs it; an oci-archive carries the same blobs; the CLI's --json names what was pushed."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data" / "build"))
import helpers  # noqa: E402

from envspec import lock as lockmod  # noqa: E402
from envspec.run import podman_args  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.network]

for tool in ("skopeo", "buildah", "podman", "docker-registry"):
    if shutil.which(tool) is None:
        pytestmark.append(
            pytest.mark.skip(reason=f"{tool} is not installed (apt-get install -y {tool})")
        )

DATA = helpers.HERE
REPO = DATA.parents[2]
LOCK = DATA / "small-debian.lock"
MAGIC = {"zstd": b"\x28\xb5\x2f\xfd", "gzip": b"\x1f\x8b\x08"}


@pytest.fixture(scope="module")
def debs(tmp_path_factory):
    return tmp_path_factory.mktemp("debs")


@pytest.fixture
def registry(tmp_path):
    from conftest import start_registry

    base = tmp_path / "registry"
    base.mkdir()
    with start_registry(base) as addr:
        yield addr, base / "registry-data"


def _cache(base: Path, debs: Path, name: str) -> Path:
    c = base / name
    c.mkdir(parents=True, exist_ok=True)
    (c / "debs").symlink_to(debs)
    return c


def _build_in_own_store(tmp_path, debs, name, **kw):
    """One "machine": its own storage root and cache."""
    from conftest import private_storage

    from envspec import sources
    from envspec.cache.store import Cache
    from envspec.image import BuildahEngine, BuildOptions, build
    from envspec.plan import make_plan
    from envspec.registry.stage import Registry

    with private_storage(tmp_path / f"storage-{name}"):
        return build(
            make_plan(lockmod.load(LOCK)),
            BuildahEngine(),
            Cache(_cache(tmp_path, debs, f"cache-{name}")),
            sources.discover().mirrors,
            options=BuildOptions(no_cache=True, registry=Registry(), **kw),
        )


def _raw(ref: str) -> bytes:
    return subprocess.run(
        ["skopeo", "inspect", "--raw", "--tls-verify=false", ref],
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout


def _decompress(name: str, data: bytes) -> bytes:
    return (
        gzip.decompress(data)
        if name == "gzip"
        else zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
    )


def _registry_blob(data_dir: Path, digest: str) -> bytes:
    hexd = digest.split(":")[1]
    return (
        data_dir / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexd[:2] / hexd / "data"
    ).read_bytes()


def test_two_machines_push_one_zstd_digest_and_podman_pulls_and_runs_it(tmp_path, debs, registry):
    addr, data_dir = registry
    a = _build_in_own_store(tmp_path, debs, "a", push=f"{addr}/envspec/small:a", tag="")
    b = _build_in_own_store(tmp_path, debs, "b", push=f"{addr}/envspec/small:b")
    assert a.compression == b.compression == "zstd"
    assert a.digest == b.digest and a.store_digest == b.store_digest and a.digest != a.store_digest
    for tag in ("a", "b"):  # what the registry serves is byte for byte what envspec computed
        assert (
            "sha256:" + hashlib.sha256(_raw(f"docker://{addr}/envspec/small:{tag}")).hexdigest()
            == a.digest
        )
    manifest = json.loads(_raw(f"docker://{addr}/envspec/small@{a.digest}"))
    assert {m["mediaType"] for m in manifest["layers"]} == {
        "application/vnd.oci.image.layer.v1.tar+zstd"
    }
    stored = 0
    for m, lay in zip(manifest["layers"], a.layers):
        blob = _registry_blob(data_dir, m["digest"])  # the registry's own file
        assert blob[:4] == MAGIC["zstd"] and len(blob) == m["size"] == lay.size < lay.diff_size
        assert "sha256:" + hashlib.sha256(_decompress("zstd", blob)).hexdigest() == lay.diff_id
        stored += len(blob)
    assert stored < sum(lay.diff_size for lay in a.layers) / 2

    from conftest import private_storage

    with private_storage(tmp_path / "storage-c") as host:  # a third machine pulls
        pm = ["podman", *host.storage.args()]
        subprocess.run(
            [*pm, "pull", "--quiet", "--tls-verify=false", f"{addr}/envspec/small@{a.digest}"],
            check=True,
            capture_output=True,
            timeout=300,
        )
        out = subprocess.run(
            [
                *pm,
                "run",
                "--rm",
                *podman_args(host)[1],
                f"{addr}/envspec/small@{a.digest}",
                "cat",
                "/opt/envspec/envspec.lock",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout == LOCK.read_text()


def test_oci_archive_carries_the_compressed_blobs(tmp_path, debs):
    arch = tmp_path / "img.tar"
    img = _build_in_own_store(
        tmp_path, debs, "a", outputs=(f"oci-archive:{arch}", f"oci:{tmp_path / 'oci'}"), tag=""
    )
    with tarfile.open(arch) as tf:
        index = json.loads(tf.extractfile("index.json").read())
        assert index["manifests"][0]["digest"] == img.digest
        for lay in img.layers:
            blob = tf.extractfile(f"blobs/sha256/{lay.digest.split(':')[1]}").read()
            assert blob[:4] == MAGIC["zstd"] and len(blob) == lay.size
    oci = json.loads((tmp_path / "oci" / "index.json").read_text())
    assert oci["manifests"][0]["digest"] == img.digest


def test_cli_gzip_push_reports_the_pushed_digest(tmp_path, debs, registry):
    from conftest import private_storage

    addr, data_dir = registry
    dest = f"{addr}/envspec/small:gzip"
    with private_storage(tmp_path / "storage"):
        env = {
            **os.environ,
            "ENVSPEC_CACHE": str(_cache(tmp_path, debs, "cache")),
            "PYTHONPATH": str(REPO / "src"),
        }
        cp = subprocess.run(
            [
                sys.executable,
                "-m",
                "envspec",
                "build",
                str(LOCK),
                "--push",
                dest,
                "--compression",
                "gzip",
                "--json",
                "--tag",
                "",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
        )
    assert cp.returncode == 0, cp.stderr[-3000:]
    out = json.loads(cp.stdout)
    raw = _raw(f"docker://{dest}")
    assert out["compression"] == "gzip" and out["pushed"] == [dest]
    assert "sha256:" + hashlib.sha256(raw).hexdigest() == out["digest"] != out["store_digest"]
    for m, lay in zip(json.loads(raw)["layers"], out["layers"]):
        assert m["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip" == lay["media_type"]
        blob = _registry_blob(data_dir, m["digest"])
        assert (
            blob[:3] == MAGIC["gzip"]
            and "sha256:" + hashlib.sha256(gzip.decompress(blob)).hexdigest() == lay["diff_id"]
        )


def _wait_gone(pid: int, timeout: float = 300) -> None:
    import time

    end = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and time.monotonic() < end:
        try:  # reaped by init once the CLI that started it is gone; a zombie counts as ended
            if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
                return
        except (OSError, IndexError):
            return
        time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists(), (
        f"the background compression {pid} still runs after {timeout} s"
    )


def test_a_local_build_is_uncompressed_and_compresses_in_the_background_for_the_push_after_it(
    tmp_path, debs, registry
):
    from conftest import private_storage

    addr, _ = registry
    cache = _cache(tmp_path, debs, "cache")
    with private_storage(tmp_path / "storage"):
        env = {
            **os.environ,
            "ENVSPEC_CACHE": str(cache),
            "PYTHONPATH": str(REPO / "src"),
            "ENVSPEC_BACKGROUND_COMPRESS": "on",
        }
        cp = subprocess.run(
            [sys.executable, "-m", "envspec", "build", str(LOCK), "--no-cache", "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
        )
        assert cp.returncode == 0, cp.stderr[-3000:]
        local = json.loads(cp.stdout)
        # only tagged in the store: no compression, the store's digest, and the layers' blobs made after it
        assert (local["compression"], local["carried_compression"]) == ("none", "zstd")
        assert local["digest"] == local["store_digest"]
        assert all(lay["digest"] == lay["diff_id"] for lay in local["layers"])
        bg = local["background_compress"]
        assert bg["command"][-4:] == ["compress", str(LOCK.resolve()), "--compression", "zstd"]
        _wait_gone(bg["pid"])
        cacheable = [lay for lay in local["layers"] if lay["group"] != "envspec"]
        assert f"compressed {len(cacheable)} layers" in Path(bg["log"]).read_text()
        assert len(list((cache / "layers").glob("*.tar.zst"))) == len(cacheable)
        dry = subprocess.run(
            [
                sys.executable,
                "-m",
                "envspec",
                "build",
                str(LOCK),
                "--push",
                f"{addr}/envspec/small:bg",
                "--dry-run",
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert dry.returncode == 0, dry.stderr[-2000:]
        rows = [r for r in json.loads(dry.stdout)["layers"] if r["group"] != "envspec"]
        assert rows and all(r["cached"] and r["compressed"] for r in rows)
        pushed = subprocess.run(
            [
                sys.executable,
                "-m",
                "envspec",
                "build",
                str(LOCK),
                "--push",
                f"{addr}/envspec/small:bg",
                "--json",
                "--tag",
                "",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
        )
        assert pushed.returncode == 0, pushed.stderr[-3000:]
        out = json.loads(pushed.stdout)
        assert out["compression"] == "zstd" and out["store_digest"] == local["store_digest"]
        assert out["background_compress"] is None and out["config"] == local["config"]
    fresh = _build_in_own_store(
        tmp_path, debs, "fresh", compress=True
    )  # compressed while made, elsewhere
    assert (
        fresh.digest
        == out["digest"]
        == "sha256:" + hashlib.sha256(_raw(f"docker://{addr}/envspec/small:bg")).hexdigest()
    )

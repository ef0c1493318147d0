"""A node's pull from the registry layer cache, streamed (issue 44; docs/build.md, "A node's
pull"): every blob read from the registry, checked, decompressed and untarred into the store as
it arrives, with no file of the blob or of its tar on the way.

Against Debian's docker-registry on loopback (tests/e2e/conftest.py) and one in proxy mode in
front of it (a pull-through mirror, as a cluster-local mirror is), with real podman storage:

- a fresh node gets the image A built (the same config digest, layers from the registry, an image
  that runs), its envspec cache holding no layer; built again on the same store with an empty
  envspec cache, no layer is read (they are the store's);
- through the pull-through mirror, the same image, the mirror serving the entries' manifests
  with the digests the registry has;
- a build killed while its layers are being untarred leaves no half layer: every layer in the
  store is whole and one of the image's, and the next build finishes the same image and leaves
  no staging directory;
- a damaged blob and an entry that lies about its diff_id are warnings; those layers are made
  here, and the image is the same.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import private_storage, start_registry

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "lockfiles" / "smoke.lock"
REPO = "team/envspec-cache"

pytestmark = pytest.mark.skipif(
    any(
        subprocess.run(["which", t], capture_output=True).returncode
        for t in ("docker-registry", "podman", "skopeo")
    ),
    reason="needs docker-registry, podman and skopeo",
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A registry whose cache machine A filled with smoke.lock's layers; (base, registry, A's build)."""
    base = tmp_path_factory.mktemp("stream-e2e")
    (base / "debs").mkdir()
    (base / "reg").mkdir()
    with start_registry(base / "reg") as reg:
        with private_storage(base / "storage-a"):
            a = built(envspec(machine(base, "a"), "--cache-to", f"{reg}/{REPO}", "--tag", ""))
        assert set(sources(a).values()) == {"made"}
        yield base, reg, a


def machine(base: Path, name: str) -> dict[str, str]:
    """A fresh machine's environment: its own envspec cache (the .debs shared)."""
    cache = base / f"cache-{name}"
    cache.mkdir()
    (cache / "debs").symlink_to(base / "debs")
    return {**os.environ, "ENVSPEC_CACHE": str(cache), "PYTHONPATH": str(ROOT / "src")}


def envspec(env, *args, popen: bool = False):
    argv = [sys.executable, "-m", "envspec", "build", str(LOCK), "--json", *args]
    if popen:
        return subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)


def built(cp) -> dict:
    assert cp.returncode == 0, (cp.stdout[-2000:], cp.stderr[-4000:])
    return json.loads(cp.stdout)


def sources(out: dict) -> dict[str, str]:
    return {lay["group"]: lay["source"] for lay in out["layers"]}


def streamed(out: dict) -> set[str]:
    """The groups whose layer came as a stream (their phase says where its seconds went)."""
    return {
        p["name"].removeprefix("cache fetch ")
        for p in out["phases"]
        if p["name"].startswith("cache fetch ") and "detail" in p
    }


def cacheable(a: dict) -> list[dict]:
    return list(a["layers"])  # the envspec layer too: keyed by its inputs (issue 59)


def store_layers(host) -> list[dict]:
    st = host.storage
    cp = subprocess.run(
        [
            "containers-storage",
            "--graph",
            st.root,
            "--run",
            st.runroot,
            "--storage-driver",
            st.driver,
            "layers",
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout or "[]") or []


def test_a_fresh_node_streams_every_layer_into_its_store(world, tmp_path):
    from envspec.run import podman_args

    base, reg, a = world
    groups = {lay["group"] for lay in cacheable(a)}
    with private_storage(tmp_path / "storage-b") as host:
        env = machine(base, "b")
        b = built(envspec(env, "--cache-from", f"{reg}/{REPO}"))
        assert sources(b) == {g: "registry" for g in groups}  # it makes no layer
        assert streamed(b) == groups
        assert b["config"] == a["config"] and b["store_digest"] == a["store_digest"]
        # nothing went through a file: the envspec cache holds no layer of them
        assert not list((Path(env["ENVSPEC_CACHE"]) / "layers").glob("*.tar*"))
        # the staging area spreads the staged layers over the block groups (issue 59)
        staging = Path(host.storage.root) / "overlay" / "envspec-staging"
        if stat_fs(staging).startswith("ext"):
            got = subprocess.run(["lsattr", "-d", str(staging)], capture_output=True, text=True)
            assert "T" in got.stdout.split()[0], got
        run = subprocess.run(
            [
                "podman",
                *host.storage.args(),
                "run",
                "--rm",
                *podman_args(host)[1],
                "--network=none",
                b["image"],
                "python",
                "-c",
                "print(6 * 7)",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0 and run.stdout.strip().endswith("42"), run.stderr[-2000:]

        # the same store, an empty envspec cache: the layers are the store's, nothing is read
        again = built(envspec(machine(base, "b2"), "--cache-from", f"{reg}/{REPO}"))
        assert sources(again) == {g: "store" for g in groups}
        assert streamed(again) == set() and again["config"] == a["config"]


def test_through_a_pull_through_mirror_the_digests_are_unchanged(world, tmp_path):
    base, reg, a = world
    from envspec.image.compress import Compression
    from envspec.registry.regcache import tag_for

    (tmp_path / "mirror").mkdir()
    with start_registry(tmp_path / "mirror", proxy_of=reg) as mirror:
        for lay in cacheable(a):
            tag = tag_for(lay["key"], Compression("zstd"))
            digests = [
                subprocess.run(
                    [
                        "skopeo",
                        "inspect",
                        "--raw",
                        "--tls-verify=false",
                        f"docker://{r}/{REPO}:{tag}",
                    ],
                    capture_output=True,
                    check=True,
                ).stdout
                for r in (reg, mirror)
            ]
            assert digests[0] == digests[1]  # the entry's manifest byte for byte, so its digest too
        with private_storage(tmp_path / "storage-m"):
            m = built(envspec(machine(base, "m"), "--cache-from", f"{mirror}/{REPO}"))
    assert set(sources(m).values()) == {"registry"} and streamed(m) == {
        g["group"] for g in cacheable(a)
    }
    assert m["config"] == a["config"] and m["store_digest"] == a["store_digest"]


def test_a_pull_killed_while_untarring_leaves_no_half_layer(world, tmp_path):
    base, reg, a = world
    diff_ids = {lay["diff_id"] for lay in a["layers"]}
    with private_storage(tmp_path / "storage-k") as host:
        staging = Path(host.storage.root) / "overlay" / "envspec-staging"
        proc = envspec(machine(base, "k"), "--cache-from", f"{reg}/{REPO}", popen=True)
        try:
            end = time.monotonic() + 300
            # kill it once a layer is half untarred: a staging directory with files in it
            while not any(
                d.is_dir() and any(d.iterdir())
                for d in (staging.iterdir() if staging.is_dir() else [])
            ):
                assert proc.poll() is None, (
                    "the build ended before its import could be killed",
                    proc.stderr.read(),
                )
                assert time.monotonic() < end
                time.sleep(0.005)
            os.killpg(proc.pid, signal.SIGKILL)
        finally:
            proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        for lay in store_layers(host):  # whatever the store kept is whole, and the image's
            assert lay.get("diff-digest") in diff_ids, lay
            assert not lay.get("flags", {}).get("incomplete"), lay
        assert not subprocess.run(
            ["podman", *host.storage.args(), "images", "-q"], capture_output=True, text=True
        ).stdout.strip()

        k = built(envspec(machine(base, "k2"), "--cache-from", f"{reg}/{REPO}"))
        assert k["config"] == a["config"] and k["store_digest"] == a["store_digest"]
        assert not list(staging.iterdir())  # the killed build's staging directories are gone


def test_a_damaged_or_lying_stream_is_a_warning_and_its_layer_is_made(world, tmp_path):
    from conftest import lying_entry_facts

    from envspec.image.compress import Compression
    from envspec.registry.regcache import tag_for, write_entry

    base, reg, a = world
    damaged, lying = cacheable(a)[0], cacheable(a)[1]
    regdata = base / "reg" / "registry-data" / "docker" / "registry" / "v2"
    hexd = damaged["digest"].split(":", 1)[1]
    data = regdata / "blobs" / "sha256" / hexd[:2] / hexd / "data"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2 : len(raw) // 2 + 64] = bytes(64)
    data.write_bytes(bytes(raw))
    hexl = lying["digest"].split(":", 1)[1]
    wrong = "sha256:" + "0" * 64
    tag = tag_for(lying["key"], Compression("zstd"))
    write_entry(
        tmp_path / "lie",
        regdata / "blobs" / "sha256" / hexl[:2] / hexl / "data",
        lying_entry_facts(lying, wrong),
    )
    subprocess.run(
        [
            "skopeo",
            "copy",
            "--quiet",
            "--preserve-digests",
            "--dest-tls-verify=false",
            f"oci:{tmp_path / 'lie'}",
            f"docker://{reg}/{REPO}:{tag}",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    with private_storage(tmp_path / "storage-c"):
        cp = envspec(machine(base, "c"), "--cache-from", f"{reg}/{REPO}")
        c = built(cp)
    assert sources(c)[damaged["group"]] == "made" and sources(c)[lying["group"]] == "made"
    assert c["config"] == a["config"] and c["store_digest"] == a["store_digest"]
    assert (
        f"layer cache entry {reg}/{REPO}:{tag_for(damaged['key'], Compression('zstd'))} not used"
        in cp.stderr
    )
    assert "the blob's bytes are not the ones recorded" in cp.stderr, cp.stderr[-3000:]
    assert wrong in cp.stderr  # what was wrong: the diff_id it claimed


def stat_fs(p: Path) -> str:
    return subprocess.run(["stat", "-f", "-c", "%T", str(p)], capture_output=True, text=True).stdout

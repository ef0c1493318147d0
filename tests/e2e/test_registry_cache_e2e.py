"""The registry as the team's layer cache (``build --cache-to`` / ``--cache-from``) against a
registry that behaves like a real one (tests/e2e/tlsregistry.py: TLS with a CA of the test,
htpasswd, credentials from an auth.json).

Machines are simulated by their own container storage root and their own envspec cache (the
.debs, which are no layers, are shared, to fetch them once): machine A builds lockfiles/smoke.lock
with ``--cache-to`` and pushes its layers as cache entries; machine B, empty, builds with
``--cache-from`` (given by ENVSPEC_CACHE_FROM, as CI would) and takes every cacheable layer from
the registry: same image digest, and an image that runs. Then one entry's blob is damaged in the
registry's storage and another entry is replaced by one that lies about its diff_id: machine C
warns about both, makes those layers itself and still gets the same digest; nothing of the bad
entries is in its cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tlsregistry  # noqa: E402

pytestmark = tlsregistry.pytest_marks()

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "lockfiles" / "smoke.lock"
REPO = "team/envspec-cache"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("regcache-e2e")
    (base / "debs").mkdir()
    with tlsregistry.start_tls_registry(base / "reg") as reg:
        yield base, reg


def machine(base: Path, name: str) -> dict[str, str]:
    """A fresh machine's environment: its own cache (the .debs shared) and XDG_RUNTIME_DIR."""
    cache = base / f"cache-{name}"
    cache.mkdir()
    (cache / "debs").symlink_to(base / "debs")
    return {
        **os.environ,
        "ENVSPEC_CACHE": str(cache),
        "PYTHONPATH": str(ROOT / "src"),
        "XDG_RUNTIME_DIR": str(base / f"runtime-{name}"),
    }


def envspec(env, reg, *args):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "envspec",
            "build",
            str(LOCK),
            "--authfile",
            str(reg.authfile),
            "--cert-dir",
            str(reg.cert_dir),
            "--json",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=900,
    )


def built(cp) -> dict:
    assert cp.returncode == 0, (cp.stdout[-2000:], cp.stderr[-4000:])
    return json.loads(cp.stdout)


def sources(out: dict) -> dict[str, str]:
    return {lay["group"]: lay["source"] for lay in out["layers"]}


def test_a_second_machine_builds_from_the_registry_cache(world, tmp_path):
    from conftest import lying_entry_facts, private_storage

    from envspec.image.compress import Compression
    from envspec.registry.regcache import tag_for, write_entry
    from envspec.run import podman_args

    base, reg = world
    cache_ref = f"{reg.address}/{REPO}"

    # machine A: makes every layer and fills the cache
    with private_storage(tmp_path / "storage-a"):
        a = built(envspec(machine(base, "a"), reg, "--cache-to", cache_ref))
    assert set(sources(a).values()) == {"made"}
    cacheable = a["layers"]  # the envspec layer too: keyed by its inputs (issue 59)
    assert len(cacheable) >= 2
    tags = [tag_for(lay["key"], Compression("zstd")) for lay in cacheable]
    assert sorted(a["cache"]["pushed"]) == sorted(f"{cache_ref}:{t}" for t in tags)
    assert set(tags) <= set(reg.tags(REPO))

    # machine B: empty store and cache, the cache named by the environment (CI's way)
    with private_storage(tmp_path / "storage-b") as host:
        env_b = {**machine(base, "b"), "ENVSPEC_CACHE_FROM": cache_ref}
        b = built(envspec(env_b, reg))
        assert sources(b) == {lay["group"]: "registry" for lay in cacheable}  # it makes none
        # a local build: the image as the store holds it (uncompressed); A pushed the cache, so compressed
        assert (b["compression"], a["compression"]) == ("none", "zstd")
        assert b["digest"] == b["store_digest"] == a["store_digest"] and b["config"] == a["config"]
        assert b["cache"] == {"from": cache_ref, "to": "", "pushed": []}
        # streamed over HTTPS with the authfile's credentials (registry/client.py), not through skopeo
        assert {p["name"] for p in b["phases"] if "detail" in p} == {
            f"cache fetch {lay['group']}" for lay in cacheable
        }
        assert [lay["diff_id"] for lay in b["layers"]] == [lay["diff_id"] for lay in a["layers"]]
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

    # machine F: the layers fetched through files (no stream): once the image is in the store,
    # its cache keeps none of them, as `podman pull` keeps only the store (issue 59, point 5)
    with private_storage(tmp_path / "storage-f"):
        env_f = {**machine(base, "f"), "ENVSPEC_CACHE_STREAM": "off"}
        f = built(envspec(env_f, reg, "--cache-from", cache_ref))
        assert set(sources(f).values()) == {"registry"} and f["config"] == a["config"]
        assert not list((base / "cache-f" / "layers").glob("*.tar*"))
        env_k = {**machine(base, "k"), "ENVSPEC_CACHE_STREAM": "off", "ENVSPEC_KEEP_PULLED": "on"}
        k = built(envspec(env_k, reg, "--cache-from", cache_ref))
        assert set(sources(k).values()) == {"registry"}
        assert len(list((base / "cache-k" / "layers").glob("*.tar"))) == len(cacheable)

    # damage one entry's blob in the registry's storage; make another entry lie about its diff_id
    damaged, lying = cacheable[0], cacheable[1]
    hexd = damaged["digest"].split(":", 1)[1]
    data = (
        reg.storage / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexd[:2] / hexd / "data"
    )
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2 : len(raw) // 2 + 64] = bytes(64)
    data.write_bytes(bytes(raw))
    blob = base / "lying-blob"
    subprocess.run(
        [
            "skopeo",
            "copy",
            "--quiet",
            "--preserve-digests",
            "--src-authfile",
            str(reg.authfile),
            "--src-cert-dir",
            str(reg.cert_dir),
            f"docker://{cache_ref}:{tags[1]}",
            f"oci:{base / 'real'}",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    shutil.copyfile(base / "real" / "blobs" / "sha256" / lying["digest"].split(":", 1)[1], blob)
    wrong = "sha256:" + "0" * 64
    write_entry(
        base / "lie",
        blob,
        lying_entry_facts(lying, wrong),
    )
    subprocess.run(
        [
            "skopeo",
            "copy",
            "--quiet",
            "--preserve-digests",
            "--dest-authfile",
            str(reg.authfile),
            "--dest-cert-dir",
            str(reg.cert_dir),
            f"oci:{base / 'lie'}",
            f"docker://{cache_ref}:{tags[1]}",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )

    # machine C: both layers made here, with a warning naming each entry; the same digest still
    with private_storage(tmp_path / "storage-c"):
        env_c = machine(base, "c")
        cp = envspec(
            env_c, reg, "--cache-from", cache_ref, "--compression", "zstd"
        )  # named: compressed, as A's
        c = built(cp)
    assert sources(c)[damaged["group"]] == "made" and sources(c)[lying["group"]] == "made"
    assert c["digest"] == a["digest"]
    for t in tags[:2]:
        assert f"layer cache entry {cache_ref}:{t} not used" in cp.stderr, cp.stderr[-3000:]
    assert wrong in cp.stderr  # what was wrong: the diff_id it claimed
    meta = json.loads(
        (
            Path(env_c["ENVSPEC_CACHE"]) / "layers" / (lying["key"].split(":", 1)[1] + ".json")
        ).read_text()
    )
    assert meta["diff_id"] == lying["diff_id"]  # the made layer's, not the lie's


def test_a_mistyped_cache_ref_is_bad_input(world):
    base, reg = world
    env = machine(base, "typo")
    for ref in ("team/cache", f"{reg.address}/team/cache:latest", f"{reg.address}/Team/Cache"):
        cp = envspec(env, reg, "--cache-from", ref)
        assert cp.returncode == 2, (ref, cp.stdout, cp.stderr[-2000:])
        assert json.loads(cp.stdout)["error"]["reference"] == "cache-ref-invalid"
    cp = envspec({**env, "ENVSPEC_CACHE_TO": "not a ref"}, reg)
    assert cp.returncode == 2 and "ENVSPEC_CACHE_TO" in json.loads(cp.stdout)["error"]["message"]


def test_an_unreachable_cache_is_a_warning_and_the_build_goes_on(world, tmp_path):
    from conftest import private_storage

    base, reg = world
    nowhere = f"127.0.0.1:{tlsregistry.free_port()}/{REPO}"
    with private_storage(tmp_path / "storage-d"):
        cp = envspec(
            machine(base, "d"), reg, "--cache-from", nowhere, "--cache-to", nowhere, "--tag", ""
        )
        d = built(cp)
    assert set(sources(d).values()) == {"made"} and d["cache"]["pushed"] == []
    assert f"the layer cache {nowhere} could not be read" in cp.stderr
    assert f"to the layer cache {nowhere} failed" in cp.stderr

"""``envspec build --push`` against a registry that behaves like a real one (tests/e2e/tlsregistry.py):
Debian's docker-registry on loopback with TLS (a CA this test makes) and htpasswd authentication,
credentials from a containers auth.json (``--authfile``, ``REGISTRY_AUTH_FILE``), the CA from
``--cert-dir``. Wrong credentials, no trusted CA, nothing listening and a push cut off half-way
(the registry killed) are exit 3 with their reference and no traceback; the registry, restarted
on the same storage, has no tag for the failed push, and the build tagged nothing locally.

The image is lockfiles/smoke.lock's (a Debian base of ~100 MB, one wheel layer), built once into a
cache and a private container storage shared by the module; every test has its own registry.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tlsregistry  # noqa: E402

pytestmark = tlsregistry.pytest_marks()

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "lockfiles" / "smoke.lock"


STORAGE_ARGS: list[str] = []  # podman's options for the module's private storage


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The environment of every `envspec` run here: a cache and a container storage of the module."""
    from conftest import private_storage

    base = tmp_path_factory.mktemp("registry-e2e")
    with private_storage(base / "storage") as host:
        STORAGE_ARGS[:] = host.storage.args()
        yield {
            **os.environ,
            "ENVSPEC_CACHE": str(base / "cache"),
            "PYTHONPATH": str(ROOT / "src"),
            "XDG_RUNTIME_DIR": str(base / "runtime"),
        }  # no auth.json of this machine's user


@pytest.fixture
def registry(tmp_path):
    with tlsregistry.start_tls_registry(tmp_path / "reg") as reg:
        yield reg


def envspec(env, *args, extra_env=None):
    return subprocess.run(
        [sys.executable, "-m", "envspec", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**env, **(extra_env or {})},
        timeout=900,
    )


def lock_hash() -> str:
    from envspec import lock as lockmod

    return lockmod.load(LOCK).short_hash


def failed(cp, reference: str) -> dict:
    """The run failed with exit 3 and ``reference``, in --json and on stderr, without a traceback."""
    assert cp.returncode == 3, (cp.returncode, cp.stdout[-2000:], cp.stderr[-3000:])
    err = json.loads(cp.stdout)["error"]
    assert err["reference"] == reference, err
    assert f"error[{reference}]" in cp.stderr and "hint:" in cp.stderr
    assert "Traceback" not in cp.stderr + cp.stdout
    return err


FAILED_TAG = "localhost/envspec/smoke:push-failed"  # the local tag of builds whose push fails


def not_tagged_locally(env) -> bool:
    cp = subprocess.run(
        ["podman", *STORAGE_ARGS, "images", "--format", "{{.Repository}}:{{.Tag}}"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return FAILED_TAG not in cp.stdout.split()


def image_tags(registry, repo: str) -> list[str]:
    """The repository's tags less the attestation and signature tags a push adds beside the image
    (``sha256-<hex>.att``/``.sig``, registry/attest.py)."""
    return sorted(
        t
        for t in registry.tags(repo)
        if not (t.startswith("sha256-") and t.endswith((".att", ".sig")))
    )


def test_push_with_authfile_and_ca_keeps_the_digest(env, registry):
    dest = f"{registry.address}/envspec/smoke:{lock_hash()}"
    cp = envspec(
        env,
        "build",
        str(LOCK),
        "--push",
        dest,
        "--authfile",
        str(registry.authfile),
        "--cert-dir",
        str(registry.cert_dir),
        "--json",
    )
    assert cp.returncode == 0, cp.stderr[-3000:]
    out = json.loads(cp.stdout)
    assert out["pushed"] == [dest]
    assert image_tags(registry, "envspec/smoke") == [lock_hash()]
    status, manifest = registry.manifest("envspec/smoke", lock_hash())
    assert status == 200 and "sha256:" + hashlib.sha256(manifest).hexdigest() == out["digest"]
    assert "sha256-" + out["digest"].split(":")[1] + ".att" in registry.tags(
        "envspec/smoke"
    )  # through the same access
    for layer in json.loads(manifest)["layers"]:
        assert registry.blob_status("envspec/smoke", layer["digest"]) == 200

    # the containers convention: REGISTRY_AUTH_FILE when --authfile is not given; TLS verified
    cp = envspec(
        env,
        "build",
        str(LOCK),
        "--push",
        f"{registry.address}/envspec/smoke:again",
        "--cert-dir",
        str(registry.cert_dir),
        "--tls-verify=true",
        "--json",
        extra_env={"REGISTRY_AUTH_FILE": str(registry.authfile)},
    )
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert image_tags(registry, "envspec/smoke") == sorted([lock_hash(), "again"])


def test_wrong_credentials_exit_3_and_push_nothing(env, registry, tmp_path):
    bad = registry.write_authfile(tmp_path / "bad.json", tlsregistry.USER, "not-the-password")
    dest = f"{registry.address}/envspec/smoke:{lock_hash()}"
    cp = envspec(
        env,
        "build",
        str(LOCK),
        "--push",
        dest,
        "--authfile",
        str(bad),
        "--cert-dir",
        str(registry.cert_dir),
        "--tag",
        FAILED_TAG,
        "--json",
    )
    err = failed(cp, "registry-auth-failed")
    assert registry.address in err["message"] and str(bad) in err["hint"]
    assert registry.tags("envspec/smoke") == []
    assert not_tagged_locally(env)  # a failed build tags nothing

    cp = envspec(
        env, "build", str(LOCK), "--push", dest, "--cert-dir", str(registry.cert_dir), "--json"
    )
    failed(cp, "registry-auth-failed")  # no credentials at all


def test_untrusted_certificate_is_a_tls_error(env, registry):
    dest = f"{registry.address}/envspec/smoke:{lock_hash()}"
    cp = envspec(
        env,
        "build",
        str(LOCK),
        "--push",
        dest,
        "--authfile",
        str(registry.authfile),
        "--tls-verify=true",
        "--json",
    )
    err = failed(cp, "registry-tls-failed")
    assert "--cert-dir" in err["hint"]
    assert registry.tags("envspec/smoke") == []


def test_unreachable_registry_exit_3(env, tmp_path):
    address = f"127.0.0.1:{tlsregistry.free_port()}"  # nothing listens there
    cp = envspec(env, "build", str(LOCK), "--push", f"{address}/envspec/smoke:x", "--json")
    err = failed(cp, "registry-unreachable")
    assert address in err["message"] and err["registry"] == address


def test_missing_authfile_is_bad_input_before_building(env, tmp_path):
    cp = envspec(
        env,
        "build",
        str(LOCK),
        "--push",
        "127.0.0.1:1/envspec/smoke:x",
        "--authfile",
        str(tmp_path / "nope.json"),
        "--json",
    )
    assert (
        cp.returncode == 2 and json.loads(cp.stdout)["error"]["reference"] == "authfile-not-found"
    )
    cp = envspec(
        env,
        "build",
        str(LOCK),
        "--push",
        "127.0.0.1:1/envspec/smoke:x",
        "--json",
        extra_env={"REGISTRY_AUTH_FILE": str(tmp_path / "nope.json")},
    )
    assert cp.returncode == 2 and "REGISTRY_AUTH_FILE" in json.loads(cp.stdout)["error"]["message"]


def test_push_cut_off_half_way_tags_nothing(env, registry, tmp_path):
    """The registry is killed once 10 MB of the push went through (the base layer is ~100 MB):
    exit 3 push-interrupted; restarted on the same storage, the registry has no tag and no
    manifest for it, and the same push then succeeds."""
    tag = lock_hash()
    envspec(
        env, "build", str(LOCK), "--tag", "", "--json"
    )  # layers cached: the push is what is cut
    with tlsregistry.CutProxy(
        ("127.0.0.1", registry.port), 10 << 20, on_cut=lambda: registry.stop(kill=True)
    ) as proxy:
        auth = tlsregistry.write_authfile(
            tmp_path / "proxy-auth.json", proxy.address, tlsregistry.USER, tlsregistry.PASSWORD
        )
        dest = f"{proxy.address}/envspec/smoke:{tag}"
        cp = envspec(
            env,
            "build",
            str(LOCK),
            "--push",
            dest,
            "--authfile",
            str(auth),
            "--cert-dir",
            str(registry.cert_dir),
            "--tag",
            FAILED_TAG,
            "--json",
        )
        assert proxy.cut.is_set() and proxy.sent >= 10 << 20
    err = failed(cp, "push-interrupted")
    assert proxy.address in err["message"]
    assert not_tagged_locally(env)
    assert registry.proc is None  # killed mid-push
    uploads = list(
        registry.storage.glob("docker/registry/v2/repositories/envspec/smoke/_uploads/*")
    )
    assert uploads, "the registry was killed before any upload began: the test cut nothing"
    registry.start()
    assert registry.tags("envspec/smoke") == []
    assert registry.manifest("envspec/smoke", tag)[0] == 404

    cp = envspec(
        env,
        "build",
        str(LOCK),
        "--push",
        f"{registry.address}/envspec/smoke:{tag}",
        "--authfile",
        str(registry.authfile),
        "--cert-dir",
        str(registry.cert_dir),
        "--json",
    )
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert image_tags(registry, "envspec/smoke") == [tag]

"""One lock with a section per platform (lockfiles/smoke-multi.lock) built into one OCI image index
(issue 13): an amd64 and an arm64 image, both made on this amd64 machine without emulation, pushed
to Debian's docker-registry on loopback (conftest.start_registry) as one manifest list, written as
``oci:DIR`` and ``oci-archive:FILE``; checked with real tools: ``skopeo inspect --raw`` shows the
index with each manifest's platform, ``podman pull --arch`` takes the right image for each
architecture, ``envspec verify-image`` checks the signed index and each platform's image against its
section of the lock (and fails a swapped signature), and two ``--no-cache`` builds give one index
digest. One signed build and push for the module (fixture ``pushed``); private storage roots and caches.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envspec import lock as lockmod

pytestmark = [pytest.mark.e2e, pytest.mark.network]
for tool in ("skopeo", "buildah", "podman", "docker-registry"):
    if shutil.which(tool) is None:
        pytestmark.append(
            pytest.mark.skip(reason=f"{tool} is not installed (scripts/dev.sh setup)")
        )

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "lockfiles" / "smoke-multi.lock"
MT_INDEX = "application/vnd.oci.image.index.v1+json"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from conftest import private_storage

    base = tmp_path_factory.mktemp("multiarch-e2e")
    with private_storage(base / "storage") as host:
        yield (
            {
                **os.environ,
                "ENVSPEC_CACHE": str(base / "cache"),
                "PYTHONPATH": str(ROOT / "src"),
                "XDG_RUNTIME_DIR": str(base / "runtime"),
            },
            host,
        )


def envspec(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "envspec", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=900,
    )


@pytest.fixture(scope="module")
def pushed(env, tmp_path_factory):
    """The module's one build and push: smoke-multi, signed (a PEM key), to a registry on loopback."""
    from conftest import start_registry
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    e, _host = env
    base = tmp_path_factory.mktemp("multiarch-registry")
    priv = ec.generate_private_key(ec.SECP256R1())
    key, pub = base / "signing.pem", base / "signing.pub"
    key.write_bytes(
        priv.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    pub.write_bytes(
        priv.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    with start_registry(base) as reg:
        ref = f"{reg}/smoke-multi:test"
        first = envspec(
            e,
            "build",
            str(LOCK),
            "--push",
            ref,
            "--sign-by-sigstore-private-key",
            str(key),
            "--json",
        )
        assert first.returncode == 0, first.stderr
        yield {
            "registry": reg,
            "ref": ref,
            "built": json.loads(first.stdout),
            "pub": pub,
            "base": base,
        }


def test_two_platforms_push_as_one_index_that_podman_pulls_per_arch(env, pushed):
    e, host = env
    lock = lockmod.load(LOCK)
    reg, ref, built = pushed["registry"], pushed["ref"], pushed["built"]
    assert built["media_type"] == MT_INDEX and built["pushed"] == [ref]
    plats = {p["platform"]: p for p in built["platforms"]}
    assert list(plats) == ["linux-x86_64", "linux-aarch64"]
    assert [p["architecture"] for p in built["platforms"]] == ["amd64", "arm64"]
    # each platform's image, tagged on its own in containers-storage
    for view in lock.views():
        p = plats[view.platform_names[0]]
        assert p["image"] == view.image_tag and p["image"].endswith("-" + view.platform.oci_arch)
        assert [lay["group"] for lay in p["layers"]] == ["base", "team", "envspec"]

    # envspec run of the lock takes this host's image; the other one only under emulation, when asked
    e_run = {**e, "ENVSPEC_STORAGE_ROOT": os.environ["ENVSPEC_STORAGE_ROOT"]}
    here = envspec(e_run, "run", "--no-mount", str(LOCK), "--", "uname", "-m")
    assert here.returncode == 0 and here.stdout.strip() == "x86_64", here.stderr
    refused = envspec(
        e_run, "run", "--no-mount", "--platform", "linux-aarch64", str(LOCK), "--", "uname", "-m"
    )
    assert (
        refused.returncode == 2
        and "error[emulation-not-asked]" in refused.stderr
        and "--emulate" in refused.stderr
    )
    if host.runs_arch("aarch64"):
        there = envspec(
            e_run,
            "run",
            "--no-mount",
            "--platform",
            "linux-aarch64",
            "--emulate",
            str(LOCK),
            "--",
            "uname",
            "-m",
        )
        assert there.returncode == 0 and there.stdout.strip() == "aarch64", there.stderr

    # the registry holds the index as it was built (its digest kept), each manifest with its platform
    raw = subprocess.run(
        ["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref}"],
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout
    import hashlib

    assert "sha256:" + hashlib.sha256(raw).hexdigest() == built["digest"]
    index = json.loads(raw)
    assert index["mediaType"] == MT_INDEX
    assert [
        (m["platform"]["os"], m["platform"]["architecture"], m["digest"])
        for m in index["manifests"]
    ] == [
        ("linux", "amd64", plats["linux-x86_64"]["digest"]),
        ("linux", "arm64", plats["linux-aarch64"]["digest"]),
    ]

    # podman on either kind of host takes its own image
    podman = ["podman", *host.storage.args()]
    for arch, name in (("arm64", "linux-aarch64"), ("amd64", "linux-x86_64")):
        pulled = f"{reg}/smoke-multi:test"
        subprocess.run(
            [*podman, "rmi", "--force", "--ignore", pulled], capture_output=True, timeout=120
        )
        pull = subprocess.run(
            [*podman, "pull", "--quiet", "--tls-verify=false", "--arch", arch, pulled],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert pull.returncode == 0, pull.stderr
        info = json.loads(
            subprocess.run(
                [*podman, "image", "inspect", pulled],
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout
        )[0]
        assert info["Architecture"] == arch and info["Os"] == "linux"
        assert info["Labels"]["io.envspec.lock-hash"] == lock.for_platform(name).meta.content_hash
        subprocess.run([*podman, "rmi", "--force", pulled], capture_output=True, timeout=120)

    # --check-digest compares a rebuild's index with the pushed one
    check = envspec(e, "build", str(LOCK), "--check-digest", ref, "--json")
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["check_digest"] == {
        "ref": ref,
        "pushed": built["digest"],
        "built": built["digest"],
        "same": True,
    }


def verify(env, *args: str) -> tuple[int, dict]:
    cp = envspec(env, "verify-image", *args, "--json")
    assert cp.stdout.strip(), cp.stderr
    return cp.returncode, json.loads(cp.stdout)


def statuses(report: dict) -> dict[str, str]:
    return {f["check"]: f["status"] for f in report["findings"]}


def test_a_signed_index_verifies_each_platform_and_a_tampered_platform_fails(env, pushed):
    """The index pushed with a key: its signature and each platform's image (signature, provenance,
    SBOM, lock hash) against that platform's section of the lock; the wrong key fails; the arm64
    image's signature replaced by the amd64 one's fails that platform only."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    e, _host = env
    reg, ref, built, pub = pushed["registry"], pushed["ref"], pushed["built"], str(pushed["pub"])
    repo = f"{reg}/smoke-multi"
    digests = {p["platform"]: p["digest"] for p in built["platforms"]}
    sig = {name: f"{repo}:{d.replace(':', '-')}.sig" for name, d in digests.items()}
    assert built["attached"] == [f"{repo}:{built['digest'].replace(':', '-')}.sig"]
    for p in built["platforms"]:
        assert p["attached"] == [f"{repo}:{p['digest'].replace(':', '-')}.att", sig[p["platform"]]]
    tags = json.loads(
        subprocess.run(
            ["skopeo", "list-tags", "--tls-verify=false", f"docker://{repo}"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    )["Tags"]
    assert len(tags) == 6 and "test" in tags  # the index, 2 x (.att, .sig), the index's .sig

    rc, report = verify(e, ref, "--key", pub, "--lock", str(LOCK))
    assert rc == 0 and report["ok"], [f for f in report["findings"] if f["status"] != "pass"]
    got = statuses(report)
    assert got["index.signature"] == got["index.lock-hash"] == got["index.platforms"] == "pass"
    for name in ("linux-x86_64", "linux-aarch64"):
        for check in (
            "signature",
            "platform",
            "provenance.lock",
            "provenance.materials",
            "sbom.packages",
            "image.lock-hash",
        ):
            assert got[f"{name}.{check}"] == "pass", (name, check)
    # one platform's image by digest, against its section of the two-platform lock
    rc, one = verify(e, f"{repo}@{digests['linux-aarch64']}", "--key", pub, "--lock", str(LOCK))
    assert rc == 0 and statuses(one)["linux-aarch64.provenance.lock"] == "pass", one

    other = pushed["base"] / "other.pub"
    other.write_bytes(
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    rc, report = verify(e, ref, "--key", str(other), "--lock", str(LOCK))
    failed = {c for c, st in statuses(report).items() if st == "fail"}
    assert (
        rc == 1
        and {"index.signature", "linux-x86_64.signature", "linux-aarch64.signature"} <= failed
    )

    kept = pushed["base"] / "arm64-sig"
    copy = [
        "skopeo",
        "copy",
        "--quiet",
        "--preserve-digests",
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
    ]
    subprocess.run(
        [*copy, f"docker://{sig['linux-aarch64']}", f"oci:{kept}"],
        capture_output=True,
        check=True,
        timeout=120,
    )
    try:  # the amd64 image's (valid) signature put under the arm64 image's tag
        subprocess.run(
            [*copy, f"docker://{sig['linux-x86_64']}", f"docker://{sig['linux-aarch64']}"],
            capture_output=True,
            check=True,
            timeout=120,
        )
        rc, report = verify(e, ref, "--key", pub, "--lock", str(LOCK))
        failed = {c for c, st in statuses(report).items() if st == "fail"}
        assert rc == 1 and failed == {"linux-aarch64.signature"}, report
    finally:
        subprocess.run(
            [*copy, f"oci:{kept}", f"docker://{sig['linux-aarch64']}"],
            capture_output=True,
            check=True,
            timeout=120,
        )
    assert verify(e, ref, "--key", pub, "--lock", str(LOCK))[0] == 0


@pytest.mark.slow  # two builds from nothing, ~80 s here
def test_two_no_cache_builds_give_one_index_digest_as_oci_dir_and_archive(env, tmp_path):
    e, _host = env
    out, archive = tmp_path / "oci", tmp_path / "index.tar"
    first = envspec(
        e, "build", str(LOCK), "--no-cache", "--output", f"oci:{out}", "--json", "--tag", ""
    )
    assert first.returncode == 0, first.stderr
    built = json.loads(first.stdout)
    second = envspec(
        e, "build", str(LOCK), "--no-cache", "--output", f"oci-archive:{archive}", "--json"
    )
    assert second.returncode == 0, second.stderr
    again = json.loads(second.stdout)
    assert again["digest"] == built["digest"], "two --no-cache builds give one index digest"
    assert [p["digest"] for p in again["platforms"]] == [p["digest"] for p in built["platforms"]]
    top = json.loads((out / "index.json").read_text())
    assert [(m["mediaType"], m["digest"]) for m in top["manifests"]] == [
        (MT_INDEX, built["digest"])
    ]
    for arch in ("arm64", "amd64"):
        seen = json.loads(
            subprocess.run(
                ["skopeo", "inspect", "--override-arch", arch, f"oci-archive:{archive}"],
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            ).stdout
        )
        assert seen["Architecture"] == arch and seen["Digest"] == built["digest"]


def test_an_index_refuses_a_docker_archive_before_building(env, tmp_path):
    e, _host = env
    cp = envspec(e, "build", str(LOCK), "--output", f"docker-archive:{tmp_path / 'x.tar'}")
    assert cp.returncode == 2, cp.stderr
    assert (
        "error[index-output-unsupported]" in cp.stderr
        and "docker archive holds one platform" in cp.stderr
    )
    assert not (tmp_path / "x.tar").exists()


def test_a_platform_that_fails_to_build_leaves_no_platform_tagged(env, tmp_path):
    """The amd64 image builds, the arm64 one fails (a wheel whose hash the lock pins wrong): exit 4,
    and neither platform's image is named in containers-storage."""
    e, host = env
    lock = lockmod.load(LOCK)
    arm = lock.parts[1]
    bad = [w.model_copy(update={"sha256": "0" * 64}) if w.name == "six" else w for w in arm.wheels]
    broken = lock.model_copy(
        update={
            "meta": lock.meta.model_copy(update={"name": "broken-multi"}),
            "parts": [lock.parts[0], arm.model_copy(update={"wheels": bad})],
        }
    ).with_hash()
    path = tmp_path / "broken-multi.lock"
    path.write_text(lockmod.dumps(broken))
    cp = envspec(e, "build", str(path))
    assert cp.returncode == 4, cp.stdout + cp.stderr
    assert "six" in cp.stderr
    images = subprocess.run(
        ["podman", *host.storage.args(), "images", "--format", "{{.Repository}}:{{.Tag}}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert images.returncode == 0, images.stderr
    assert "broken-multi" not in images.stdout, images.stdout

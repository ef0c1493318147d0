"""Signed pushes with provenance, end to end: `envspec build lockfiles/smoke.lock --push` with a
cosign-format key into Debian's docker-registry on loopback (plain HTTP), then `envspec
verify-image` and `envspec build --check-digest` as a user runs them, and the attacks they must
catch: an unsigned image, another image's manifest under the tag (with the good image's
signature copied beside it), an altered provenance, the wrong key, the wrong lock.

The CLI runs in subprocesses with a private storage root and cache (one smoke build for the
module, the others come from its cache).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.network]
for _tool in ("skopeo", "buildah", "podman", "docker-registry"):
    if shutil.which(_tool) is None:
        pytest.skip(f"{_tool} is not installed (scripts/dev.sh setup)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "lockfiles" / "smoke.lock"
OTHER_LOCK = ROOT / "tests" / "data" / "build" / "small.lock"


class Env:
    def __init__(self, base: Path, registry: str) -> None:
        self.base, self.registry = base, registry
        self.env = {
            **os.environ,
            "ENVSPEC_STORAGE_ROOT": str(base / "storage"),
            "ENVSPEC_CACHE": str(base / "cache"),
            "PYTHONPATH": str(ROOT / "src"),
        }
        self.key, self.pub, self.passfile = base / "cosign.key", base / "cosign.pub", base / "pass"

    def envspec(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "envspec", *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=ROOT,
            timeout=900,
        )

    def skopeo(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["skopeo", *args], capture_output=True, text=True, check=True, timeout=300
        )

    def push_signed(self, ref: str) -> dict:
        p = self.envspec(
            "build",
            str(SMOKE),
            "--push",
            ref,
            "--sign-by-sigstore-private-key",
            str(self.key),
            "--sign-passphrase-file",
            str(self.passfile),
            "--json",
        )
        assert p.returncode == 0, p.stdout + p.stderr
        return json.loads(p.stdout)

    def verify(self, ref: str, *extra: str) -> tuple[int, dict]:
        p = self.envspec("verify-image", ref, "--key", str(self.pub), "--json", *extra)
        assert p.returncode != 0 or p.stdout, p.stderr
        return p.returncode, (json.loads(p.stdout) if p.stdout.strip() else {"stderr": p.stderr})


def failed(report: dict) -> set[str]:
    return {f["check"] for f in report["findings"] if f["status"] == "fail"}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from conftest import private_storage, start_registry
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from envspec.registry.attest import encrypt_sigstore_key

    base = tmp_path_factory.mktemp("signed")
    with start_registry(base) as registry, private_storage(base / "storage"):
        e = Env(base, registry)
        priv = ec.generate_private_key(ec.SECP256R1())
        e.key.write_bytes(encrypt_sigstore_key(priv, b"test passphrase"))  # cosign's format
        e.passfile.write_text("test passphrase\n")
        e.pub.write_bytes(
            priv.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        e.built = e.push_signed(f"{registry}/envspec/smoke:v1")
        yield e


def test_a_signed_push_verifies_and_carries_its_attestations(env):
    ref = f"{env.registry}/envspec/smoke:v1"
    digest = env.built["digest"]
    tag = digest.replace(":", "-")
    assert env.built["attached"] == [
        f"{env.registry}/envspec/smoke:{tag}.att",
        f"{env.registry}/envspec/smoke:{tag}.sig",
    ]
    tags = json.loads(
        env.skopeo(
            "list-tags", "--tls-verify=false", f"docker://{env.registry}/envspec/smoke"
        ).stdout
    )
    assert {"v1", f"{tag}.att", f"{tag}.sig"} == set(tags["Tags"])
    rc, report = env.verify(ref, "--lock", str(SMOKE))
    assert rc == 0 and report["ok"], report
    by = {f["check"]: f for f in report["findings"]}
    assert by["provenance.lock"]["observed"] == by["provenance.lock"]["expected"]
    assert by["provenance.materials"]["status"] == "pass" and by["signature"]["status"] == "pass"
    rc, report = env.verify(
        f"{env.registry}/envspec/smoke@{digest}", "--lock", str(SMOKE)
    )  # by digest too
    assert rc == 0, report
    human = env.envspec("verify-image", ref, "--key", str(env.pub))
    assert (
        human.returncode == 0
        and "PASS    signature" in human.stdout
        and "skip    lock" in human.stdout
    )


def test_the_attestations_are_what_the_lock_says(env):
    """The provenance in the registry: every .deb and wheel of the lock with its sha256, the lock's hash, envspec."""
    from envspec import lock as lockmod

    out = env.base / "att"
    tag = env.built["digest"].replace(":", "-") + ".att"
    env.skopeo(
        "copy",
        "--quiet",
        "--preserve-digests",
        "--src-tls-verify=false",
        f"docker://{env.registry}/envspec/smoke:{tag}",
        f"oci:{out}",
    )
    index = json.loads((out / "index.json").read_text())
    manifest = json.loads(
        (out / "blobs" / "sha256" / index["manifests"][0]["digest"].split(":")[1]).read_text()
    )
    statements = []
    for lay in manifest["layers"]:
        assert lay["mediaType"] == "application/vnd.dsse.envelope.v1+json"
        envelope = json.loads((out / "blobs" / "sha256" / lay["digest"].split(":")[1]).read_text())
        statements.append(json.loads(base64.b64decode(envelope["payload"])))
    prov = next(s for s in statements if s["predicateType"] == "https://slsa.dev/provenance/v1")
    lock = lockmod.load(SMOKE)
    deps = {
        d["digest"]["sha256"] for d in prov["predicate"]["buildDefinition"]["resolvedDependencies"]
    }
    assert deps == {p.sha256 for p in lock.wheels} | {p.sha256 for p in lock.debian.packages} | {
        lock.meta.content_hash.split(":")[1]
    }
    assert prov["subject"][0]["digest"]["sha256"] == env.built["digest"].split(":")[1]
    assert prov["predicate"]["runDetails"]["builder"]["id"] == "https://envspec.dev/builder"


def test_an_unsigned_image_is_refused(env):
    p = env.envspec("build", str(SMOKE), "--push", f"{env.registry}/envspec/unsigned:v1", "--json")
    assert p.returncode == 0, p.stderr
    assert len(json.loads(p.stdout)["attached"]) == 1  # attestations, no signature
    rc, report = env.verify(f"{env.registry}/envspec/unsigned:v1", "--lock", str(SMOKE))
    assert rc == 1 and {"signature", "provenance.signature", "sbom.signature"} <= failed(report)


def test_another_manifest_under_the_tag_is_refused_even_with_the_signature_copied(env):
    """An attacker pushes another image under a signed tag, and copies the good signature to the
    new digest's .sig tag: the signed payload names the other digest."""
    good = f"docker://{env.registry}/envspec/smoke:v1"
    evil_ref = f"{env.registry}/envspec/smoke:v2"
    layout = env.base / "evil"
    env.skopeo(
        "copy",
        "--quiet",
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
        f"docker://{env.registry}/envspec/unsigned:{env.built['digest'].replace(':', '-')}.att",
        f"oci:{layout}",
    )  # any other manifest will do: the unsigned attestations
    env.skopeo(
        "copy",
        "--quiet",
        "--preserve-digests",
        "--dest-tls-verify=false",
        f"oci:{layout}",
        f"docker://{evil_ref}",
    )
    rc, report = env.verify(evil_ref)
    assert rc == 1 and {"signature", "attestations"} <= failed(report)
    evil_digest = report["fingerprint"]["digest"]
    assert evil_digest != env.built["digest"]
    sig = f"{env.registry}/envspec/smoke:{env.built['digest'].replace(':', '-')}.sig"
    env.skopeo(
        "copy",
        "--quiet",
        "--preserve-digests",
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
        f"docker://{sig}",
        f"docker://{env.registry}/envspec/smoke:{evil_digest.replace(':', '-')}.sig",
    )
    rc, report = env.verify(evil_ref)
    sig_finding = next(f for f in report["findings"] if f["check"] == "signature")
    assert (
        rc == 1 and sig_finding["status"] == "fail" and "another image" in sig_finding["observed"]
    )
    assert env.verify(good.removeprefix("docker://"))[0] == 0  # the good tag is untouched


def test_an_altered_provenance_and_the_wrong_key_and_lock_are_refused(env):
    from envspec.registry import attest

    ref = f"{env.registry}/envspec/altered:v1"
    built = env.push_signed(ref)
    tag = built["digest"].replace(":", "-") + ".att"
    got = env.base / "got-att"
    env.skopeo(
        "copy",
        "--quiet",
        "--preserve-digests",
        "--src-tls-verify=false",
        f"docker://{env.registry}/envspec/altered:{tag}",
        f"oci:{got}",
    )
    index = json.loads((got / "index.json").read_text())
    manifest = json.loads(
        (got / "blobs" / "sha256" / index["manifests"][0]["digest"].split(":")[1]).read_text()
    )
    blobs = []
    for lay in manifest["layers"]:
        data = (got / "blobs" / "sha256" / lay["digest"].split(":")[1]).read_bytes()
        envelope = json.loads(data)
        st = json.loads(base64.b64decode(envelope["payload"]))
        if st["predicateType"] == attest.SLSA_PROVENANCE:  # claim another lock, keep the signature
            st["predicate"]["buildDefinition"]["externalParameters"]["lock"]["content_hash"] = (
                "sha256:" + "0" * 64
            )
            envelope["payload"] = base64.b64encode(json.dumps(st).encode()).decode()
            data = json.dumps(envelope).encode()
        blobs.append(attest.Blob(lay["mediaType"], data, tuple(lay.get("annotations", {}).items())))
    attest.write_artifact(env.base / "altered", blobs, ref_name="att")
    env.skopeo(
        "copy",
        "--quiet",
        "--preserve-digests",
        "--dest-tls-verify=false",
        f"oci:{env.base / 'altered'}",
        f"docker://{env.registry}/envspec/altered:{tag}",
    )
    rc, report = env.verify(ref, "--lock", str(SMOKE))
    assert (
        rc == 1
        and "provenance.signature" in failed(report)
        and "sbom.signature" not in failed(report)
    )

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    other = env.base / "other.pub"
    other.write_bytes(
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    p = env.envspec(
        "verify-image", f"{env.registry}/envspec/smoke:v1", "--key", str(other), "--json"
    )
    assert p.returncode == 1 and {"signature", "provenance.signature"} <= failed(
        json.loads(p.stdout)
    )
    rc, report = env.verify(f"{env.registry}/envspec/smoke:v1", "--lock", str(OTHER_LOCK))
    assert rc == 1 and {"provenance.lock", "provenance.materials", "image.lock-hash"} <= failed(
        report
    )


def test_check_digest_rebuilds_and_compares_with_the_pushed_image(env):
    p = env.envspec(
        "build", str(SMOKE), "--check-digest", f"{env.registry}/envspec/smoke:v1", "--json"
    )
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)["check_digest"]
    assert got["same"] and got["pushed"] == got["built"] == env.built["digest"]
    p = env.envspec(
        "build", str(SMOKE), "--check-digest", f"{env.registry}/envspec/smoke:v2"
    )  # the other manifest
    assert p.returncode == 1 and "different digest" in p.stderr and env.built["digest"] in p.stderr


def test_an_unreachable_registry_is_exit_3(env):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, out = env.verify(f"127.0.0.1:{port}/envspec/smoke:v1")
    assert rc == 3 and out["error"]["reference"] == "registry-unreachable"
    p = env.envspec("build", str(SMOKE), "--check-digest", f"127.0.0.1:{port}/envspec/smoke:v1")
    assert p.returncode == 3, p.stderr

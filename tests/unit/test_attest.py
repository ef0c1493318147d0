"""Provenance, attestations and signatures of pushed images (registry/attest.py) and their
checks (verify_image.py), against a fake registry reader: no registry, no skopeo."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from envspec import __version__
from envspec import lock as lockmod
from envspec.errors import SourceError, UsageError
from envspec.image.oci import canonical_json
from envspec.image.sbom import make_sbom
from envspec.plan import make_plan
from envspec.registry import attest
from envspec.registry.verify_image import (
    RegistryReader,
    check_signature,
    open_envelope,
    verify_image,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "build"
DIGEST = "sha256:" + "ab" * 32
REF = "127.0.0.1:5000/team/img:v1"


@pytest.fixture(scope="module")
def plan():
    return make_plan(lockmod.load(DATA / "small-debian.lock"))


@pytest.fixture(scope="module")
def key():
    return attest.SigningKey(ec.generate_private_key(ec.SECP256R1()))


def test_provenance_lists_the_lock_every_deb_and_every_wheel_and_names_envspec(plan):
    st = attest.provenance(plan, DIGEST, lock_path="tests/data/build/small-debian.lock")
    assert (
        st["_type"] == "https://in-toto.io/Statement/v1"
        and st["predicateType"] == "https://slsa.dev/provenance/v1"
    )
    assert st["subject"] == [{"name": plan.lock.meta.name, "digest": {"sha256": "ab" * 32}}]
    bd = st["predicate"]["buildDefinition"]
    assert bd["externalParameters"]["lock"] == {
        "path": "tests/data/build/small-debian.lock",
        "content_hash": plan.lock.meta.content_hash,
    }
    deps = bd["resolvedDependencies"]
    got = {d["digest"]["sha256"] for d in deps}
    want = {d.sha256 for d in plan.debs} | {w.sha256 for w in plan.wheels}
    assert plan.debs and plan.wheels  # the fixture has both kinds
    assert got == want | {plan.lock.meta.content_hash.split(":", 1)[1]}
    assert len(deps) == len(plan.debs) + len(plan.wheels) + 1  # one row each, nothing twice
    assert deps[0]["annotations"]["role"] == "lock"
    wheel = next(d for d in deps if d["annotations"].get("kind") == "wheel")
    assert wheel["uri"].endswith("#" + wheel["name"]) and wheel["name"].endswith(".whl")
    assert st["predicate"]["runDetails"]["builder"] == {
        "id": attest.BUILDER_ID,
        "version": {"envspec": __version__},
    }


def test_statements_are_the_same_bytes_every_time_whatever_the_clock(plan, monkeypatch):
    a = canonical_json(attest.provenance(plan, DIGEST))
    sbom_a = canonical_json(attest.sbom_statement(plan, DIGEST, make_sbom(plan)))
    monkeypatch.setenv(
        "SOURCE_DATE_EPOCH", "1700000000"
    )  # the image's time may move; the provenance has none
    assert canonical_json(attest.provenance(plan, DIGEST)) == a
    assert b"1970" not in a and b"2023" not in a
    unsigned = attest.attestation_blobs(plan, DIGEST, make_sbom(plan), None)
    again = attest.attestation_blobs(plan, DIGEST, make_sbom(plan), None)
    assert unsigned == again  # no key, no signature: the artifact's bytes are fixed
    assert json.loads(base64.b64decode(json.loads(unsigned[1].data)["payload"]))[
        "predicate"
    ] == json.loads(make_sbom(plan))
    assert sbom_a  # built before the clock moved; the SBOM's own time follows SOURCE_DATE_EPOCH


def test_a_signed_envelope_verifies_and_any_change_breaks_it(plan, key):
    env = attest.envelope(attest.provenance(plan, DIGEST), key)
    pub = key.key.public_key()
    st, ok = open_envelope(pub, env)
    assert ok and st is not None and st.subject[0].digest["sha256"] == "ab" * 32
    assert st.predicate_type == attest.SLSA_PROVENANCE
    doc = json.loads(env)
    forged = json.loads(base64.b64decode(doc["payload"]))
    forged["predicate"]["buildDefinition"]["externalParameters"]["lock"]["content_hash"] = (
        "sha256:" + "0" * 64
    )
    doc["payload"] = base64.b64encode(canonical_json(forged)).decode()
    assert open_envelope(pub, canonical_json(doc))[1] is False
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    assert open_envelope(other, env)[1] is False
    assert (
        open_envelope(pub, attest.envelope(attest.provenance(plan, DIGEST), None))[1] is False
    )  # unsigned


def _artifact(blobs: list[attest.Blob], tmp: Path, name: str) -> tuple[bytes, dict[str, bytes]]:
    d = tmp / name
    digest = attest.write_artifact(d, blobs, ref_name=name)
    files = {"sha256:" + p.name: p.read_bytes() for p in (d / "blobs" / "sha256").iterdir()}
    return files[digest], files


def test_the_image_signature_names_digest_and_repository(key, tmp_path):
    pub = key.key.public_key()
    good = _artifact([attest.signature_blob(REF, DIGEST, key)], tmp_path, "good")
    repo = attest.repository(REF)
    assert repo == "127.0.0.1:5000/team/img"
    assert check_signature(pub, good, DIGEST, repo).status == "pass"
    assert check_signature(pub, None, DIGEST, repo).status == "fail"  # unsigned
    other_digest = "sha256:" + "cd" * 32
    f = check_signature(
        pub, good, other_digest, repo
    )  # another image's signature copied to this tag
    assert f.status == "fail" and "another image" in f.observed
    assert check_signature(pub, good, DIGEST, "127.0.0.1:5000/other/img").status == "fail"
    wrong_key = ec.generate_private_key(ec.SECP256R1()).public_key()
    assert "does not verify" in check_signature(wrong_key, good, DIGEST, repo).observed
    manifest, blobs = good
    payload_digest = json.loads(manifest)["layers"][0]["digest"]
    blobs = {
        **blobs,
        payload_digest: blobs[payload_digest].replace(b"ab", b"cd"),
    }  # served bytes not the listed ones
    assert check_signature(pub, (manifest, blobs), DIGEST, repo).status == "fail"


def test_keys_cosign_format_and_pem_with_passphrases(tmp_path):
    priv = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "cosign.key").write_bytes(attest.encrypt_sigstore_key(priv, b"pw", n=1024))
    k = attest.SigningKey.load(tmp_path / "cosign.key", b"pw")
    assert k.public_pem() == priv.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with pytest.raises(UsageError, match="wrong passphrase"):
        attest.SigningKey.load(tmp_path / "cosign.key", b"nope")
    ed = ed25519.Ed25519PrivateKey.generate()
    (tmp_path / "ed.pem").write_bytes(
        ed.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pw"),
        )
    )
    k2 = attest.SigningKey.load(tmp_path / "ed.pem", b"pw")
    from envspec.registry.verify_image import verify_bytes

    assert verify_bytes(ed.public_key(), k2.sign(b"data"), b"data") and not verify_bytes(
        ed.public_key(), k2.sign(b"x"), b"y"
    )
    with pytest.raises(UsageError) as e:
        attest.SigningKey.load(tmp_path / "missing.key")
    assert e.value.reference == "signing-key-unreadable"


class FakeRegistry(RegistryReader):
    """What a registry serves, by reference: manifests and configs by tag or digest, artifacts by tag."""

    def __init__(self) -> None:
        super().__init__()
        self.manifests: dict[str, bytes] = {}
        self.configs: dict[str, bytes] = {}
        self.artifacts: dict[str, tuple[bytes, dict[str, bytes]]] = {}

    def manifest(self, ref):
        return self.manifests.get(ref)

    def config(self, ref):
        return self.configs.get(ref)

    def artifact(self, ref):
        return self.artifacts.get(ref)


def _pushed(plan, key, tmp: Path, *, sign: bool = True) -> tuple[FakeRegistry, str]:
    """What `envspec build --push REF` leaves in a registry for ``plan``, with a fake image."""
    reg = FakeRegistry()
    config = canonical_json(
        {"config": {"Labels": {"io.envspec.lock-hash": plan.lock.meta.content_hash}}}
    )
    cdigest = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = canonical_json(
        {
            "schemaVersion": 2,
            "config": {"digest": cdigest},
            "annotations": {"io.envspec.lock-hash": plan.lock.meta.content_hash},
        }
    )
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    repo = attest.repository(REF)
    reg.manifests[REF] = reg.manifests[f"{repo}@{digest}"] = manifest
    reg.configs[f"{repo}@{digest}"] = config
    reg.artifacts[f"{repo}:{attest.att_tag(digest)}"] = _artifact(
        attest.attestation_blobs(plan, digest, make_sbom(plan), key if sign else None), tmp, "att"
    )
    if sign:
        reg.artifacts[f"{repo}:{attest.sig_tag(digest)}"] = _artifact(
            [attest.signature_blob(REF, digest, key)], tmp, "sig"
        )
    return reg, digest


def _failed(report) -> set[str]:
    return {f.check for f in report.findings if f.status == "fail"}


def test_verify_image_passes_a_pushed_image_and_names_each_check(plan, key, tmp_path):
    reg, digest = _pushed(plan, key, tmp_path)
    report = verify_image(REF, key.key.public_key(), reg, plan.lock)
    assert report.ok, [f.to_dict() for f in report.findings if f.status != "pass"]
    checks = {f.check for f in report.findings}
    assert {
        "signature",
        "provenance.signature",
        "provenance.subject",
        "provenance.lock",
        "provenance.materials",
        "sbom.signature",
        "sbom.subject",
        "sbom.packages",
        "image.lock-hash",
    } <= checks
    assert report.fingerprint["digest"] == digest
    assert verify_image(
        f"{attest.repository(REF)}@{digest}", key.key.public_key(), reg, plan.lock
    ).ok


def test_verify_image_refuses_unsigned_tampered_and_other_lock(plan, key, tmp_path):
    pub = key.key.public_key()
    reg, _ = _pushed(plan, key, tmp_path / "u", sign=False)
    assert {"signature", "provenance.signature", "sbom.signature"} <= _failed(
        verify_image(REF, pub, reg, plan.lock)
    )

    reg, digest = _pushed(plan, key, tmp_path / "t")
    other = make_plan(
        lockmod.load(DATA / "small.lock")
    )  # another lock's provenance, signed, under this image
    att_ref = f"{attest.repository(REF)}:{attest.att_tag(digest)}"
    reg.artifacts[att_ref] = _artifact(
        attest.attestation_blobs(other, digest, make_sbom(other), key), tmp_path, "x"
    )
    failed = _failed(verify_image(REF, pub, reg, plan.lock))
    assert {"provenance.lock", "provenance.materials", "sbom.packages", "image.lock-hash"} <= failed
    assert "provenance.signature" not in failed  # signed by the key: only the lock gives it away

    reg, digest = _pushed(plan, key, tmp_path / "m")
    reg.manifests[REF] = reg.manifests[REF].replace(
        b"schemaVersion", b"schemaversion"
    )  # another manifest, same tag
    assert {"signature", "attestations"} <= _failed(verify_image(REF, pub, reg, plan.lock))

    assert _failed(verify_image(REF, pub, FakeRegistry(), plan.lock)) == {"image"}


def test_verify_image_says_where_the_registry_serves_no_manifest(plan, key, tmp_path):
    pub = key.key.public_key()
    reg, digest = _pushed(plan, key, tmp_path)
    for served in (b"<html>502 Bad Gateway</html>", b'{"layers": "none"}', b"[]"):
        reg.manifests[REF] = served
        with pytest.raises(SourceError) as e:
            verify_image(REF, pub, reg, plan.lock)
        assert e.value.reference == "registry-read-failed" and REF in e.value.message


def test_verify_image_fails_a_config_that_is_not_an_image_config(plan, key, tmp_path):
    pub = key.key.public_key()
    reg, digest = _pushed(plan, key, tmp_path)
    repo = attest.repository(REF)
    config = b'{"config": {"Labels": ["not", "a", "table"]}}'
    manifest = canonical_json(
        {
            "schemaVersion": 2,
            "config": {"digest": "sha256:" + hashlib.sha256(config).hexdigest()},
            "annotations": {"io.envspec.lock-hash": plan.lock.meta.content_hash},
        }
    )
    reg.manifests[REF] = manifest
    reg.configs[f"{repo}@sha256:{hashlib.sha256(manifest).hexdigest()}"] = config
    failed = _failed(verify_image(REF, pub, reg, plan.lock))
    assert "image.lock-hash" in failed  # no label read from a config that does not read


def test_registry_documents_read_what_they_know_and_refuse_wrong_types():
    from envspec.registry import ocidocs

    m = ocidocs.read(
        ocidocs.Manifest,
        b'{"mediaType": "x", "manifests": [{"digest": "sha256:1", "platform": '
        b'{"os": "linux", "architecture": "arm64", "variant": "v8"}}], "future": 1}',
    )
    assert m is not None and m.manifests[0].platform == ocidocs.Platform(
        os="linux", architecture="arm64"
    )
    assert m.layers == [] and m.config is None and m.annotations == {}
    assert ocidocs.read(ocidocs.Manifest, b'{"annotations": {"a": 1}}') is None
    assert ocidocs.read(ocidocs.Manifest, b"not json") is None
    st = ocidocs.read(ocidocs.Statement, b'{"predicateType": "p", "predicate": {"k": [1, "v"]}}')
    assert st is not None and st.predicate == {"k": [1, "v"]} and st.subject == []
    assert ocidocs.read_object(ocidocs.Sbom, {"packages": "none"}) is None


def test_registry_reader_says_not_found_and_unreachable_apart():
    import subprocess

    def fake(stderr: bytes, rc: int = 1):
        return lambda argv, **kw: subprocess.CompletedProcess(argv, rc, b"", stderr)

    assert (
        RegistryReader(run=fake(b"reading manifest x: manifest unknown")).manifest(
            "127.0.0.1:1/a:b"
        )
        is None
    )
    with pytest.raises(SourceError) as e:
        RegistryReader(run=fake(b"dial tcp 127.0.0.1:1: connect: connection refused")).manifest(
            "127.0.0.1:1/a:b"
        )
    assert e.value.reference == "registry-unreachable" and e.value.exit_code == 3
    seen = []
    RegistryReader(
        run=lambda argv, **kw: seen.append(argv) or subprocess.CompletedProcess(argv, 0, b"{}", b"")
    ).manifest("registry.example.com/a:b")
    assert "--tls-verify=false" not in seen[0]  # TLS is verified except on loopback
    RegistryReader(
        run=lambda argv, **kw: seen.append(argv) or subprocess.CompletedProcess(argv, 0, b"{}", b"")
    ).manifest("127.0.0.1:1/a:b")
    assert "--tls-verify=false" in seen[1]


GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden" / "attest"


def test_provenance_bytes_are_golden(plan):
    """The exact bytes pushed for tests/data/build/small-debian.lock (regenerate with
    ENVSPEC_REGEN_GOLDEN=1 python -m pytest tests/unit/test_attest.py, and review the diff)."""
    import os

    got = (
        canonical_json(
            attest.provenance(
                plan,
                DIGEST,
                lock_path="tests/data/build/small-debian.lock",
                tool_version="0.0.0-golden",
            )
        )
        + b"\n"
    )
    golden = GOLDEN / "small-debian.provenance.json"
    if os.environ.get("ENVSPEC_REGEN_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_bytes(got)
    assert golden.is_file(), f"{golden} is missing; run with ENVSPEC_REGEN_GOLDEN=1"
    assert got == golden.read_bytes(), "the provenance changed; regenerate if intended"


def test_cli_refuses_signing_without_push_and_check_digest_with_push(tmp_path, capsys):
    from envspec.cli import main

    lock = str(DATA / "small.lock")
    key = tmp_path / "k.pem"
    key.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    assert main(["build", lock, "--sign-by-sigstore-private-key", str(key)]) == 2
    assert "sign-without-push" in capsys.readouterr().err
    assert (
        main(["build", lock, "--push", "127.0.0.1:1/a:b", "--check-digest", "127.0.0.1:1/a:b"]) == 2
    )
    assert (
        main(
            [
                "build",
                lock,
                "--push",
                "127.0.0.1:1/a:b",
                "--sign-by-sigstore-private-key",
                str(tmp_path / "nope.pem"),
            ]
        )
        == 2
    )
    assert "signing-key-unreadable" in capsys.readouterr().err
    assert (
        main(["verify-image", "127.0.0.1:1/a:b", "--key", str(key)]) == 2
    )  # a private key is no public key
    assert "public-key-unreadable" in capsys.readouterr().err

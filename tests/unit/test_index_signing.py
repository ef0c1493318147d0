"""Signing an image index and verifying it (image/index.py ``attest_index``, verify_image.py), through
a fake registry that takes the pushes the build makes (every layout pushed is stored as the registry
would serve it) and serves them to the verifier: no registry, no skopeo, no build of layers.

The images are real OCI layouts of lockfiles/smoke-multi.lock's two views (``oci.write_layout``
with no layers: real configs with their os/architecture and lock-hash labels) under a real index
(``oci.write_index``), so the digests signed are the ones the verifier computes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from test_attest import FakeRegistry

from envspec import lock as lockmod
from envspec.errors import LockError
from envspec.image import BuildOptions, BuiltImage, Reporter
from envspec.image.index import attest_index, check_options
from envspec.image.oci import write_index, write_layout
from envspec.lock import Lockfile
from envspec.plan import make_plan
from envspec.registry import attest
from envspec.registry.stage import Registry
from envspec.registry.verify_image import platform_name, verify_image
from envspec.verify.model import FAIL, PASS, SKIP

ROOT = Path(__file__).resolve().parents[2]
MULTI = ROOT / "lockfiles" / "smoke-multi.lock"
REF = "127.0.0.1:5000/team/smoke-multi:v1"
REPO = attest.repository(REF)


class PushingRegistry(FakeRegistry):
    """A registry and the engine's push into it: a pushed OCI layout's top manifest is served at the
    reference and by digest, with its blobs; for an index, each image it lists too."""

    def __init__(self) -> None:
        super().__init__()
        self.pushes: list[str] = []

    def push(self, oci_dir: Path, dest: str, *, index: bool = False) -> None:
        self.pushes.append(dest)
        blobs = {
            "sha256:" + p.name: p.read_bytes()
            for p in (Path(oci_dir) / "blobs" / "sha256").iterdir()
        }
        top = json.loads((Path(oci_dir) / "index.json").read_bytes())["manifests"][0]["digest"]
        repo = attest.repository(dest)
        self._serve(dest, repo, top, blobs)
        if index:
            for m in json.loads(blobs[top])["manifests"]:
                self._serve(f"{repo}@{m['digest']}", repo, m["digest"], blobs)

    def _serve(self, ref: str, repo: str, digest: str, blobs: dict[str, bytes]) -> None:
        raw = blobs[digest]
        for at in (ref, f"{repo}@{digest}"):
            self.manifests[at] = raw
            self.artifacts[at] = (raw, blobs)
        config = json.loads(raw).get("config", {}).get("digest")
        if config in blobs:
            self.configs[f"{repo}@{digest}"] = blobs[config]

    def drop(self, ref: str) -> None:
        """The tag removed from the registry."""
        self.manifests.pop(ref, None)
        self.artifacts.pop(ref, None)


@pytest.fixture(scope="module")
def lock() -> Lockfile:
    return lockmod.load(MULTI)


@pytest.fixture(scope="module")
def key():
    return attest.SigningKey(ec.generate_private_key(ec.SECP256R1()))


def _push_index(
    lock: Lockfile, tmp: Path, key, *, sign: bool = True, index_lock: Lockfile | None = None
) -> tuple[PushingRegistry, str, dict[str, str]]:
    """What `envspec build LOCK --push REF [--sign-by-sigstore-private-key]` leaves in a registry:
    each view's image, the index over them, then ``attest_index``'s artifacts."""
    reg = PushingRegistry()
    layout = tmp / "index"
    views = lock.views()
    images = []
    for view in views:
        digest, _size, _config = write_layout(
            layout,
            make_plan(view),
            [],
            entrypoint=[],
            cmd=[],
            user="envspec",
            ref_name=view.platform.oci_arch,
        )
        images.append((view.platform_names[0], BuiltImage(image="", digest=digest, layers=())))
    whole = index_lock or lock
    digest, _ = write_index(
        layout,
        [(v.platform.os, v.platform.oci_arch, b.digest) for v, (_, b) in zip(views, images)],
        ref_name="x",
        annotations={"io.envspec.lock-hash": whole.meta.content_hash},
    )
    reg.push(layout, REF, index=True)
    options = BuildOptions(
        push=REF,
        registry=Registry(key=key if sign else None, lock_path="lockfiles/smoke-multi.lock"),
    )
    check_options(options)  # a signing key is no longer refused for an index
    out, attached = attest_index(reg, tmp / "attest", views, images, digest, options, Reporter())
    assert attached == ((f"{REPO}:{attest.sig_tag(digest)}",) if sign else ())
    for (
        name,
        built,
    ) in out:  # each image carries what a one-platform push attaches, for its own digest
        want = [f"{REPO}:{attest.att_tag(built.digest)}"] + (
            [f"{REPO}:{attest.sig_tag(built.digest)}"] if sign else []
        )
        assert list(built.attached) == want, name
    return reg, digest, {name: b.digest for name, b in images}


def by_check(report) -> dict[str, str]:
    return {f.check: f.status for f in report.findings}


def test_a_signed_index_pushes_each_platform_its_artifacts_then_the_index_signature_last(
    lock, key, tmp_path
):
    reg, digest, digests = _push_index(lock, tmp_path, key)
    amd, arm = digests["linux-x86_64"], digests["linux-aarch64"]
    assert reg.pushes == [
        REF,
        f"{REPO}:{attest.att_tag(amd)}",
        f"{REPO}:{attest.sig_tag(amd)}",
        f"{REPO}:{attest.att_tag(arm)}",
        f"{REPO}:{attest.sig_tag(arm)}",
        f"{REPO}:{attest.sig_tag(digest)}",
    ]
    # each platform's provenance is about its own digest and its own view of the lock
    from envspec.registry.verify_image import open_envelope

    for view in lock.views():
        d = digests[view.platform_names[0]]
        manifest, blobs = reg.artifacts[f"{REPO}:{attest.att_tag(d)}"]
        statements = [
            open_envelope(key.key.public_key(), blobs[lay["digest"]])
            for lay in json.loads(manifest)["layers"]
        ]
        prov = next(
            st for st, ok in statements if ok and st and st.predicate_type == attest.SLSA_PROVENANCE
        )
        assert prov.subject[0].digest["sha256"] == d.split(":")[1]
        params = prov.predicate["buildDefinition"]["externalParameters"]
        assert params["lock"]["content_hash"] == view.meta.content_hash != lock.meta.content_hash
        assert params["platform"] == f"linux/{view.platform.oci_arch}"
    # the index's signature names the index digest
    manifest, blobs = reg.artifacts[f"{REPO}:{attest.sig_tag(digest)}"]
    payload = json.loads(blobs[json.loads(manifest)["layers"][0]["digest"]])
    assert payload["critical"]["image"]["docker-manifest-digest"] == digest


def test_an_unsigned_index_push_still_attests_each_platform(lock, tmp_path):
    reg, digest, digests = _push_index(lock, tmp_path, None, sign=False)
    assert reg.pushes == [REF, *(f"{REPO}:{attest.att_tag(d)}" for d in digests.values())]


def test_a_signed_index_verifies_with_findings_for_each_platform(lock, key, tmp_path):
    reg, digest, digests = _push_index(lock, tmp_path, key)
    report = verify_image(REF, key.key.public_key(), reg, lock)
    assert report.ok, [f.to_dict() for f in report.findings if f.status != PASS]
    got = by_check(report)
    assert {"image", "index.signature", "index.lock-hash", "index.platforms"} <= set(got)
    for name in ("linux-x86_64", "linux-aarch64"):
        for check in (
            "image",
            "platform",
            "signature",
            "provenance.signature",
            "provenance.subject",
            "provenance.lock",
            "provenance.materials",
            "sbom.signature",
            "sbom.packages",
            "image.lock-hash",
        ):
            assert got.get(f"{name}.{check}") == PASS, (name, check)
        assert report.fingerprint[f"{name}.digest"] == digests[name]
    assert "signature" not in got  # every image's check names its platform
    assert report.fingerprint["digest"] == digest and report.lock_hash == lock.meta.content_hash
    # by digest too, and without a lock (then nothing is compared with one)
    assert verify_image(f"{REPO}@{digest}", key.key.public_key(), reg, lock).ok
    bare = verify_image(REF, key.key.public_key(), reg)
    assert bare.ok and by_check(bare)["lock"] == SKIP and "index.lock-hash" not in by_check(bare)


def test_a_missing_or_swapped_platform_signature_fails_that_platform_only(lock, key, tmp_path):
    reg, _digest, digests = _push_index(lock, tmp_path, key)
    arm, amd = digests["linux-aarch64"], digests["linux-x86_64"]
    reg.drop(f"{REPO}:{attest.sig_tag(arm)}")
    report = verify_image(REF, key.key.public_key(), reg, lock)
    failed = {f.check for f in report.findings if f.status == FAIL}
    assert failed == {"linux-aarch64.signature"} and report.exit_code == 1
    # the amd64 image's signature copied to the arm64 one's tag: it names another digest
    reg.artifacts[f"{REPO}:{attest.sig_tag(arm)}"] = reg.artifacts[f"{REPO}:{attest.sig_tag(amd)}"]
    report = verify_image(REF, key.key.public_key(), reg, lock)
    f = next(f for f in report.findings if f.check == "linux-aarch64.signature")
    assert f.status == FAIL and "another image" in f.observed


def test_the_wrong_key_fails_the_index_and_every_image(lock, key, tmp_path):
    reg, _digest, _ = _push_index(lock, tmp_path, key)
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    failed = {f.check for f in verify_image(REF, other, reg, lock).findings if f.status == FAIL}
    assert {
        "index.signature",
        "linux-x86_64.signature",
        "linux-aarch64.signature",
        "linux-x86_64.provenance.signature",
        "linux-aarch64.sbom.signature",
    } <= failed


def test_an_index_signature_missing_or_of_another_lock_fails(lock, key, tmp_path):
    reg, digest, _ = _push_index(lock, tmp_path, key)
    reg.drop(f"{REPO}:{attest.sig_tag(digest)}")
    assert {
        f.check
        for f in verify_image(REF, key.key.public_key(), reg, lock).findings
        if f.status == FAIL
    } == {"index.signature"}
    other = lock.model_copy(
        update={"meta": lock.meta.model_copy(update={"content_hash": "sha256:" + "0" * 64})}
    )
    reg, _, _ = _push_index(
        lock, tmp_path / "other", key, index_lock=other
    )  # the index claims another lock
    assert "index.lock-hash" in {
        f.check
        for f in verify_image(REF, key.key.public_key(), reg, lock).findings
        if f.status == FAIL
    }


def test_a_one_platform_lock_checks_its_platform_and_skips_the_other(lock, key, tmp_path):
    reg, _digest, _ = _push_index(lock, tmp_path, key)
    arm_view = lock.for_platform("linux-aarch64")  # what the arm64 image carries as its lock
    report = verify_image(REF, key.key.public_key(), reg, arm_view)
    got = by_check(report)
    assert (
        report.ok and got["linux-x86_64"] == SKIP and got["linux-aarch64.provenance.lock"] == PASS
    )
    assert got["index.lock-hash"] == PASS  # the view's part_of is the whole lock's hash
    assert not any(c.startswith("linux-x86_64.") for c in got)
    # a one-platform lock of a platform the index lacks
    other = lock.for_platform("linux-x86_64").replace_part(
        platform=lock.parts[0].platform.model_copy(update={"arch": "ppc64le"})
    )
    assert by_check(verify_image(REF, key.key.public_key(), reg, other))["index.platforms"] == FAIL


def test_an_index_entry_under_another_platform_fails(lock, key, tmp_path):
    reg, digest, digests = _push_index(lock, tmp_path, key)
    raw = json.loads(reg.manifests[REF])
    raw["manifests"][1]["platform"]["architecture"] = (
        "amd64"  # both entries say amd64; not resigned
    )
    reg.manifests[REF] = json.dumps(raw).encode()
    failed = {
        f.check
        for f in verify_image(REF, key.key.public_key(), reg, lock).findings
        if f.status == FAIL
    }
    assert {"index.signature", "index.platforms", "linux-x86_64.platform"} <= failed


def test_one_image_with_a_multi_platform_lock_is_checked_against_its_section(lock, key, tmp_path):
    reg, _digest, digests = _push_index(lock, tmp_path, key)
    arm = f"{REPO}@{digests['linux-aarch64']}"
    report = verify_image(arm, key.key.public_key(), reg, lock, lock_path=str(MULTI))
    got = by_check(report)
    assert report.ok, [f.to_dict() for f in report.findings if f.status != PASS]
    assert got["linux-aarch64.platform"] == PASS and got["linux-aarch64.provenance.lock"] == PASS
    assert report.lock_hash == lock.for_platform("linux-aarch64").meta.content_hash
    # a lock without a section for the image's platform: bad input, exit 2
    only_amd = lock.model_copy(
        update={
            "parts": [
                lock.parts[0],
                lock.parts[0].model_copy(
                    update={
                        "platform": lock.parts[0].platform.model_copy(update={"arch": "ppc64le"})
                    }
                ),
            ]
        }
    )
    with pytest.raises(LockError) as e:
        verify_image(arm, key.key.public_key(), reg, only_amd, lock_path="x.lock")
    assert e.value.reference == "platform-not-in-lock" and e.value.exit_code == 2
    assert "x.lock" in e.value.message and "linux/arm64" in e.value.message


def test_platform_names_are_the_locks():
    assert (
        platform_name("linux", "arm64") == "linux-aarch64"
        and platform_name("linux", "amd64") == "linux-x86_64"
    )
    assert platform_name("linux", "ppc64le") == "linux-ppc64le"


def test_cli_verify_image_of_a_multi_platform_lock_and_an_image_of_another_platform(
    lock, key, tmp_path, monkeypatch, capsys
):
    """The CLI: exit 0 over an index, 2 (platform-not-in-lock) for an image whose platform the lock lacks."""
    import envspec.registry.verify_image as vi
    from envspec.cli import main

    reg, _digest, digests = _push_index(lock, tmp_path, key)
    monkeypatch.setattr(vi, "RegistryReader", lambda *a, **kw: reg)
    pub = tmp_path / "k.pub"
    pub.write_bytes(key.public_pem())
    assert main(["verify-image", REF, "--key", str(pub), "--lock", str(MULTI), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and {"linux-x86_64.signature", "linux-aarch64.signature"} <= {
        f["check"] for f in out["findings"]
    }
    two = tmp_path / "odd.lock"
    odd = lock.model_copy(
        update={
            "parts": [
                lock.parts[0],
                lock.parts[0].model_copy(
                    update={
                        "platform": lock.parts[0].platform.model_copy(update={"arch": "ppc64le"})
                    }
                ),
            ]
        }
    ).with_hash()
    two.write_text(lockmod.dumps(odd))
    assert (
        main(
            [
                "verify-image",
                f"{REPO}@{digests['linux-aarch64']}",
                "--key",
                str(pub),
                "--lock",
                str(two),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "platform-not-in-lock" in err and str(two) in err


def test_dry_run_of_a_two_platform_push_lists_each_platforms_attestations_and_the_index_signature():
    from envspec.image import BuildOptions
    from envspec.image.index import preview_index
    from envspec.lock import load

    lock = load(Path(__file__).resolve().parents[2] / "lockfiles" / "smoke-multi.lock")
    signed = preview_index(
        lock,
        BuildOptions(
            push="localhost:5000/t/smoke",
            registry=Registry(key=object()),  # type: ignore[arg-type]
            outputs=("oci-archive:/tmp/x.tar",),
        ),
    )
    assert signed == [
        ["copy", "(index layout, zstd)", "oci-archive:/tmp/x.tar", "index"],
        ["push", "(index layout, zstd)", "localhost:5000/t/smoke", "index"],
        [
            "push",
            "(attestations, linux-x86_64)",
            "localhost:5000/t/smoke:sha256-(amd64 digest).att",
        ],
        ["push", "(signature, linux-x86_64)", "localhost:5000/t/smoke:sha256-(amd64 digest).sig"],
        [
            "push",
            "(attestations, linux-aarch64)",
            "localhost:5000/t/smoke:sha256-(arm64 digest).att",
        ],
        ["push", "(signature, linux-aarch64)", "localhost:5000/t/smoke:sha256-(arm64 digest).sig"],
        ["push", "(index signature)", "localhost:5000/t/smoke:sha256-(index digest).sig"],
    ]
    unsigned = preview_index(lock, BuildOptions(push="localhost:5000/t/smoke", registry=Registry()))
    assert [c[1] for c in unsigned] == [
        "(index layout, zstd)",
        "(attestations, linux-x86_64)",
        "(attestations, linux-aarch64)",
    ]
    assert (
        preview_index(lock, BuildOptions()) == []
    )  # only tagged in the store: nothing after the images

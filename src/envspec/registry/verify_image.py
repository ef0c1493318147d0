"""``envspec verify-image REF --key PUB [--lock LOCK]``: check a pushed image in its registry,
without pulling its layers or running it (docs/usage.md, "verify-image").

What is read (through skopeo, so credentials and TLS follow the containers conventions): the
image's manifest (its digest is the image's identity), its config, and the two artifacts that
``envspec build --push`` attaches by cosign's tag scheme (``registry/attest.py``): the signature
``sha256-<hex>.sig`` and the attestations ``sha256-<hex>.att``. What is checked, each a verifier
``Finding`` (check, status, expected, observed, hint):

- ``signature``: a simple-signing payload whose signature verifies with the public key, naming
  this manifest digest and this repository (what containers/image's ``sigstoreSigned`` policy
  with ``matchRepository`` checks; Debian's skopeo is built without it, so envspec checks it
  with ``cryptography``);
- ``provenance.*`` and ``sbom.*``: each DSSE envelope's signature, each statement's subject
  (this digest), the builder, and with ``--lock`` the lock's content hash and the materials
  (every .deb and wheel sha256 of the lock, no more, no fewer);
- ``image.lock-hash``: the lock hash the image's config labels and manifest annotations carry
  (covered by the signed digest) is the provenance's and the expected one.

An image index (what ``envspec build --push`` of a lock with a section per platform pushes,
``image/index.py``): ``index.signature`` (the index's own ``.sig``, naming the index digest),
``index.lock-hash`` (its ``io.envspec.lock-hash`` annotation is the lock's) and ``index.platforms``
(an image for each of the lock's platforms), then each platform's image as above, its findings
named ``<platform>.<check>`` (``linux-aarch64.signature``, ``linux-x86_64.provenance.lock``, ...)
and checked against that platform's view of the lock (``Lockfile.for_platform``); with a
one-platform lock only its platform's image, the others ``skip``. One image with a lock that has
a section per platform is checked against the section of its config's os/architecture.

The lock file in the image's top layer is not read (that would need the registry's blob API
beyond skopeo); the labels that name it are in the signed config.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from envspec.errors import HostError, LockError, SourceError, UsageError
from envspec.image.engine import RegistryAccess, skopeo_registry_args
from envspec.image.oci import MT_INDEX
from envspec.lock import OCI_ARCH, Lockfile
from envspec.plan import make_plan
from envspec.registry import attest
from envspec.registry.ocidocs import (
    D,
    Descriptor,
    Envelope,
    ImageConfig,
    Manifest,
    Platform,
    Provenance,
    Sbom,
    SignaturePayload,
    Statement,
    read,
    read_object,
)
from envspec.verify.model import FAIL, PASS, SKIP, WARN, Finding, Report, Status

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

_NOT_FOUND = ("manifest unknown", "not found", "name unknown", "404")
_UNREACHABLE = (
    "connection refused",
    "no such host",
    "i/o timeout",
    "network is unreachable",
    "no route to host",
    "dial tcp",
    "server misbehaving",
    "connection reset",
    "eof",
)


@dataclass
class RegistryReader:
    """Read-only registry access with skopeo, by the push's rules (``image.engine.RegistryAccess``:
    credentials, CA, TLS verified except for a loopback registry without a cert dir)."""

    access: RegistryAccess = field(default_factory=RegistryAccess)
    run: Callable[..., subprocess.CompletedProcess[bytes]] = field(
        default=subprocess.run, repr=False
    )

    def _opts(self, ref: str, prefix: str = "") -> list[str]:
        return skopeo_registry_args(self.access, ref, prefix)

    def _skopeo(self, ref: str, argv: list[str]) -> bytes | None:
        try:
            cp = self.run(["skopeo", *argv], capture_output=True, timeout=600)
        except FileNotFoundError:
            raise HostError(
                "skopeo not found on PATH; verify-image and --check-digest read registries with it",
                hint="apt-get install -y skopeo",
            ) from None
        if cp.returncode == 0:
            return bytes(cp.stdout)
        err = (
            cp.stderr.decode("utf-8", "replace") if isinstance(cp.stderr, bytes) else str(cp.stderr)
        )
        low = err.lower()
        if any(k in low for k in _NOT_FOUND) and not any(
            k in low for k in ("connection refused", "no such host")
        ):
            return None
        tail = "\n".join(err.strip().splitlines()[-3:])
        registry = ref.removeprefix("docker://").split("/", 1)[0]
        if any(k in low for k in _UNREACHABLE):
            raise SourceError(
                f"the registry {registry} could not be reached ({tail})",
                reference="registry-unreachable",
                hint=f"check that a registry listens on {registry} and that this machine reaches it",
            )
        raise SourceError(
            f"reading {ref} failed: {tail}",
            reference="registry-read-failed",
            hint="check the credentials (--authfile) and TLS (--cert-dir, --tls-verify)",
        )

    def manifest(self, ref: str) -> bytes | None:
        """The manifest's bytes as the registry serves them (their sha256 is the digest), or None."""
        return self._skopeo(ref, ["inspect", "--raw", *self._opts(ref), _docker(ref)])

    def config(self, ref: str) -> bytes | None:
        return self._skopeo(ref, ["inspect", "--config", "--raw", *self._opts(ref), _docker(ref)])

    def artifact(self, ref: str) -> tuple[bytes, dict[str, bytes]] | None:
        """A small artifact (signature, attestations): its manifest bytes and its blobs by digest,
        or None where the tag does not exist. The blobs are as the registry gave them; the caller
        checks them against the manifest."""
        with tempfile.TemporaryDirectory(prefix="envspec-artifact-") as td:
            out = Path(td) / "a"
            if not self.copy_to(ref, out, Path(td)):
                return None
            index = json.loads((out / "index.json").read_bytes())
            mdigest = index["manifests"][0]["digest"]
            blobs = {
                "sha256:" + p.name: p.read_bytes() for p in (out / "blobs" / "sha256").iterdir()
            }
            return blobs[mdigest], blobs

    def copy_to(self, ref: str, dest: Path, tmpdir: Path) -> bool:
        """Copy what ``ref`` names, unchanged (``--preserve-digests``), into the OCI layout ``dest``
        (skopeo's big temporary files in ``tmpdir``); False where the registry does not have it.
        skopeo checks each blob against its digest on the way (a damaged blob is a SourceError)."""
        tmpdir.mkdir(parents=True, exist_ok=True)
        return (
            self._skopeo(
                ref,
                [
                    "--tmpdir",
                    str(tmpdir),
                    "copy",
                    "--quiet",
                    "--preserve-digests",
                    *self._opts(ref, "src-"),
                    _docker(ref),
                    f"oci:{dest}",
                ],
            )
            is not None
        )


def _docker(ref: str) -> str:
    return ref if ref.startswith("docker://") else "docker://" + ref


def manifest_digest(reader: RegistryReader, ref: str) -> str:
    """The digest of the manifest ``ref`` names in its registry ("" when there is none)."""
    raw = reader.manifest(ref)
    return "sha256:" + hashlib.sha256(raw).hexdigest() if raw is not None else ""


# --- signatures -----------------------------------------------------------------------------------


def load_public_key(path: str | Path) -> PublicKeyTypes:
    from cryptography.hazmat.primitives import serialization

    try:
        return serialization.load_pem_public_key(Path(path).read_bytes())
    except (OSError, ValueError) as e:
        raise UsageError(
            f"--key {path}: not a PEM public key ({e})",
            reference="public-key-unreadable",
            hint="the public half of the signing key (cosign.pub, or `openssl pkey -pubout`)",
        ) from e


def verify_bytes(public_key: PublicKeyTypes, signature: bytes, data: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

    try:
        if isinstance(public_key, ec.EllipticCurvePublicKey):
            public_key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        elif isinstance(public_key, ed25519.Ed25519PublicKey):
            public_key.verify(signature, data)
        elif isinstance(public_key, rsa.RSAPublicKey):
            public_key.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
        else:
            return False
    except (InvalidSignature, ValueError):
        return False
    return True


def _layers(
    manifest: bytes, blobs: dict[str, bytes], media_type: str
) -> list[tuple[Descriptor, bytes]]:
    """The manifest's layers of ``media_type`` with their bytes, each checked against its digest
    (none where the manifest does not read)."""
    out = []
    m = read(Manifest, manifest)
    for lay in m.layers if m is not None else []:
        data = blobs.get(lay.digest)
        if (
            lay.media_type == media_type
            and data is not None
            and "sha256:" + hashlib.sha256(data).hexdigest() == lay.digest
        ):
            out.append((lay, data))
    return out


def check_signature(
    public_key: PublicKeyTypes,
    artifact: tuple[bytes, dict[str, bytes]] | None,
    digest: str,
    repo: str,
    *,
    check: str = "signature",
) -> Finding:
    expected = f"a signature by the key of {digest[:19]}… in {repo}"
    if artifact is None:
        return Finding(
            check,
            FAIL,
            expected,
            f"no signature ({attest.sig_tag(digest)} is not in {repo})",
            hint="the image was pushed without a key: push with --sign-by-sigstore-private-key",
        )
    seen = []
    for lay, payload in _layers(*artifact, attest.MT_SIMPLESIGNING):
        sig = base64.b64decode(lay.annotations.get(attest.SIG_ANNOTATION, "") or b"")
        if not verify_bytes(public_key, sig, payload):
            seen.append("a signature that does not verify with this key")
            continue
        signed_payload = read(SignaturePayload, payload)
        if signed_payload is None:
            seen.append("a signed payload that is not a simple-signing document")
            continue
        crit = signed_payload.critical
        signed = crit.image.docker_manifest_digest
        signed_repo = attest.repository(crit.identity.docker_reference)
        if crit.type != attest.SIGNATURE_TYPE or signed != digest:
            seen.append(f"a signature of another image ({signed[:19]}…)")
        elif signed_repo != repo:
            seen.append(f"a signature of this digest for another repository ({signed_repo})")
        else:
            return Finding(check, PASS, expected, f"signed, key verifies ({digest[:19]}…)")
    return Finding(
        check,
        FAIL,
        expected,
        "; ".join(seen) or "no usable signature layer",
        hint="this is not the image that was signed with this key: do not trust it",
    )


def open_envelope(public_key: PublicKeyTypes, data: bytes) -> tuple[Statement | None, bool]:
    """(the statement, whether a signature in the envelope verifies with the key)."""
    env = read(Envelope, data)
    if env is None:
        return None, False
    try:
        payload = base64.b64decode(env.payload)
    except ValueError:
        return None, False
    statement = read(Statement, payload)
    if statement is None:
        return None, False
    pae = attest.pae(env.payload_type, payload)
    ok = env.payload_type == attest.IN_TOTO_PAYLOAD and any(
        verify_bytes(public_key, base64.b64decode(s.sig), pae) for s in env.signatures
    )
    return statement, ok


# --- the checks -----------------------------------------------------------------------------------

INDEX_TYPES = (MT_INDEX, "application/vnd.docker.distribution.manifest.list.v2+json")
_LOCK_ARCH = {
    oci: arch for arch, oci in OCI_ARCH.items() if arch != oci
}  # OCI's names -> the lock's: arm64 -> aarch64


def is_index(manifest: Manifest) -> bool:
    """An image index (manifest list) rather than one image's manifest."""
    return manifest.media_type in INDEX_TYPES or (
        "manifests" in manifest.model_fields_set and "config" not in manifest.model_fields_set
    )


def platform_name(os_name: str, architecture: str) -> str:
    """The lock's name of an OCI platform: linux/arm64 -> "linux-aarch64" (a lock section's key)."""
    return f"{os_name or 'unknown'}-{_LOCK_ARCH.get(architecture, architecture or 'unknown')}"


def _no_lock() -> Finding:
    return Finding(
        "lock",
        SKIP,
        "--lock LOCK",
        "not given: the lock hash is not compared",
        hint="pass --lock LOCK to check the image was built from it",
    )


def _no_image(ref: str) -> Finding:
    return Finding(
        "image",
        FAIL,
        f"an image at {ref}",
        "no such image in the registry",
        hint="check the reference; `skopeo inspect docker://REF` lists what is there",
    )


def verify_image(
    ref: str,
    public_key: PublicKeyTypes,
    reader: RegistryReader,
    lock: Lockfile | None = None,
    *,
    lock_path: str = "",
) -> Report:
    """The findings for the pushed image ``ref``: one image, or an image index and each platform's
    image in it (their findings named ``<platform>.<check>``, e.g. ``linux-aarch64.signature``),
    each platform checked against its section of ``lock``. Raises SourceError (3) when the
    registry cannot be read; LockError ``platform-not-in-lock`` (2) for one image whose platform
    ``lock`` (a lock with a section per platform) has no section for."""
    report = Report(level="image", mode="registry", lock_path=ref)
    repo = attest.repository(ref)
    raw = reader.manifest(ref)
    if raw is None:
        report.add(_no_image(ref))
        return report
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    wanted = ref.split("@", 1)[1] if "@" in ref else ""
    manifest = _manifest_of(ref, raw)
    index = is_index(manifest)
    report.add(
        Finding(
            "image",
            PASS if not wanted or wanted == digest else FAIL,
            wanted or "a manifest",
            digest + (f" (an image index of {len(manifest.manifests)} images)" if index else ""),
            hint="" if not wanted or wanted == digest else "the registry served another manifest",
        )
    )
    report.fingerprint["digest"] = digest
    if index:
        report.lock_hash = _verify_index(report, repo, digest, manifest, public_key, reader, lock)
    else:
        config = reader.config(f"{repo}@{digest}")
        view, prefix = lock, ""
        if lock is not None and lock.multi:
            view, prefix = _section_for_image(report, ref, manifest, config, lock, lock_path)
        report.lock_hash = _check_image(
            report, _Pulled(repo, digest, manifest, config), public_key, reader, view, prefix
        )
    if lock is None:
        report.add(_no_lock())
    return report


def _manifest_of(ref: str, raw: bytes) -> Manifest:
    """The manifest the registry served for ``ref``, read; SourceError (3) where it is not one."""
    manifest = read(Manifest, raw)
    if manifest is None:
        raise SourceError(
            f"{ref}: the registry served a manifest that is not an OCI manifest or index "
            f"({len(raw)} bytes)",
            reference="registry-read-failed",
            hint="check the reference; `skopeo inspect --raw docker://REF` shows what it serves",
        )
    return manifest


def _config_of(manifest: Manifest, config: bytes | None) -> ImageConfig | None:
    """The image config, where it is the one the manifest names (so the signed digest covers it)
    and reads as one; else None."""
    named = manifest.config.digest if manifest.config is not None else None
    if config is None or "sha256:" + hashlib.sha256(config).hexdigest() != named:
        return None
    got = read(ImageConfig, config)
    return got if got is not None and got.model_fields_set else None


def _section_for_image(
    report: Report,
    ref: str,
    manifest: Manifest,
    config: bytes | None,
    lock: Lockfile,
    lock_path: str,
) -> tuple[Lockfile | None, str]:
    """One image against a lock with a section per platform: the section whose platform is the image
    config's os/architecture (its view, ``Lockfile.for_platform``) and the findings' prefix."""
    cfg = _config_of(manifest, config)
    os_name, arch = (cfg.os, cfg.architecture) if cfg is not None else ("", "")
    if not arch:
        report.add(
            Finding(
                "platform",
                FAIL,
                "the image config's os/architecture, to pick the lock's section",
                "the config could not be read, or is not the one the manifest names",
                hint="the image is damaged or not an envspec image: do not trust it",
            )
        )
        return None, ""
    part = lock.find_part(arch)
    if part is None or part.platform.os != os_name:
        raise LockError(
            f"{lock_path or lock.meta.name}: no section for {os_name}/{arch}, the platform of the image "
            f"{ref} (the lock has {', '.join(lock.platform_names)})",
            reference="platform-not-in-lock",
            hint="pass the lock the image was built from; `envspec verify-image` of the image index "
            "checks every platform's image",
        )
    report.add(
        Finding(
            f"{part.name}.platform",
            PASS,
            "a section of the lock for the image's platform",
            f"{os_name}/{arch}: [platforms.{part.name}]",
        )
    )
    return lock.for_platform(part.name), part.name + "."


def _verify_index(
    report: Report,
    repo: str,
    digest: str,
    index: Manifest,
    public_key: PublicKeyTypes,
    reader: RegistryReader,
    lock: Lockfile | None,
) -> str:
    """The index's signature and lock hash, then each platform's image as ``_check_image`` checks one,
    against its section of ``lock`` (a one-platform lock: its platform's image only, the others
    skipped). Returns the lock hash the index names."""
    report.add(
        check_signature(
            public_key,
            reader.artifact(f"{repo}:{attest.sig_tag(digest)}"),
            digest,
            repo,
            check="index.signature",
        )
    )
    platforms = [m.platform or Platform() for m in index.manifests]
    entries = [(platform_name(p.os, p.architecture), m) for p, m in zip(platforms, index.manifests)]
    annotation = index.annotations.get("io.envspec.lock-hash", "")
    if lock is not None:
        _check_index_lock(report, annotation, [n for n, _ in entries], lock)
    for name, m in entries:
        view = None
        if lock is not None:
            part = lock.find_part(name)
            if part is None:
                report.add(
                    Finding(
                        name,
                        SKIP,
                        "a section of the lock for this platform",
                        f"the lock has none ({', '.join(lock.platform_names)}): its image is not checked",
                        hint="pass the lock with a section per platform to check every image",
                    )
                )
                continue
            view = lock.for_platform(part.name)
        img = _index_entry(report, repo, name, m, reader)
        if img is not None:
            _check_image(report, img, public_key, reader, view, f"{name}.")
    return annotation


def _check_index_lock(report: Report, annotation: str, names: list[str], lock: Lockfile) -> None:
    """The lock the index was made from (the one given, or the one a platform's view is part of),
    and an image for each of the lock's platforms."""
    whole = lock.meta.content_hash if lock.multi else lock.meta.part_of or ""
    if whole:
        ok = annotation == whole
        report.add(
            Finding(
                "index.lock-hash",
                PASS if ok else FAIL,
                whole,
                annotation or "(none)",
                hint="" if ok else "the index was made from another lock",
            )
        )
    want = lock.platform_names
    ok = (sorted(names) == sorted(want)) if lock.multi else want[0] in names
    report.add(
        Finding(
            "index.platforms",
            PASS if ok else FAIL,
            " and ".join(want) + ("" if lock.multi else " (the lock's one platform)"),
            ", ".join(names) or "(none)",
            hint="" if ok else "the index does not hold an image for each of the lock's platforms",
        )
    )


def _index_entry(
    report: Report, repo: str, name: str, m: Descriptor, reader: RegistryReader
) -> _Pulled | None:
    """The image an index entry names, fetched: its manifest the one the index names, its config
    of the platform the index lists it under. None where the registry does not hold it."""
    mdigest = m.digest
    at = f"{repo}@{mdigest}"
    raw = reader.manifest(at) if mdigest else None
    if raw is None:
        report.add(
            Finding(
                f"{name}.image",
                FAIL,
                mdigest or "a digest",
                "no such manifest in the registry",
                hint="the index names an image the registry does not hold",
            )
        )
        return None
    got = "sha256:" + hashlib.sha256(raw).hexdigest()
    report.add(
        Finding(
            f"{name}.image",
            PASS if got == mdigest else FAIL,
            mdigest,
            got,
            hint="" if got == mdigest else "the registry served another manifest",
        )
    )
    report.fingerprint[f"{name}.digest"] = got
    manifest, config = _manifest_of(at, raw), reader.config(at)
    cfg = _config_of(manifest, config)
    listed = m.platform or Platform()
    want_p = f"{listed.os}/{listed.architecture}"
    seen_p = f"{cfg.os}/{cfg.architecture}" if cfg is not None else "(no config the manifest names)"
    report.add(
        Finding(
            f"{name}.platform",
            PASS if want_p == seen_p else FAIL,
            f"{want_p} (the index's entry)",
            seen_p,
            hint="" if want_p == seen_p else "the index lists this image under another platform",
        )
    )
    return _Pulled(repo, got, manifest, config)


@dataclass(frozen=True)
class _Pulled:
    """One image as its registry gives it: where, its digest, its manifest and config."""

    repo: str
    digest: str
    manifest: Manifest
    config: bytes | None


def _check_image(
    report: Report,
    img: _Pulled,
    public_key: PublicKeyTypes,
    reader: RegistryReader,
    lock: Lockfile | None,
    prefix: str = "",
) -> str:
    """One image's findings (each check's name after ``prefix``): its signature, its attestations,
    with ``lock`` (one platform's) the lock and materials they name, and the lock hash its config and
    manifest carry. Returns that lock hash."""
    report.add(
        check_signature(
            public_key,
            reader.artifact(f"{img.repo}:{attest.sig_tag(img.digest)}"),
            img.digest,
            img.repo,
            check=prefix + "signature",
        )
    )
    statements = _statements(report, img, public_key, reader, prefix)
    prov = _predicate(statements, "provenance", Provenance)
    prov_lock = _check_provenance(report, prov, lock, prefix)
    if lock is not None:
        report.add(_sbom_packages(_predicate(statements, "sbom", Sbom), lock, prefix))
    return _check_lock_hash(report, img, lock, prov_lock, prefix)


def _statements(
    report: Report, img: _Pulled, public_key: PublicKeyTypes, reader: RegistryReader, prefix: str
) -> dict[str, Statement]:
    """The image's attestations (provenance, SBOM) by kind, each checked: signed by the key,
    about this image, both there."""
    att = reader.artifact(f"{img.repo}:{attest.att_tag(img.digest)}")
    statements: dict[str, Statement] = {}
    if att is None:
        report.add(
            Finding(
                prefix + "attestations",
                FAIL,
                f"{attest.att_tag(img.digest)} in {img.repo}",
                "none",
                hint="push the image with `envspec build --push` (it attaches provenance and SBOM)",
            )
        )
        return statements
    for _lay, data in _layers(*att, attest.MT_DSSE):
        st, signed = open_envelope(public_key, data)
        kind = {attest.SLSA_PROVENANCE: "provenance", attest.SPDX_PREDICATE: "sbom"}.get(
            st.predicate_type if st is not None else "", ""
        )
        if st is None or not kind or kind in statements:
            continue
        statements[kind] = st
        report.add(
            Finding(
                f"{prefix}{kind}.signature",
                PASS if signed else FAIL,
                "signed by the key",
                "verifies" if signed else "no signature that verifies with this key",
                hint="" if signed else "the attestation was altered or made without the key",
            )
        )
        subjects = [s.digest.get("sha256", "") for s in st.subject]
        ok = img.digest.split(":", 1)[1] in subjects
        report.add(
            Finding(
                f"{prefix}{kind}.subject",
                PASS if ok else FAIL,
                img.digest,
                ", ".join("sha256:" + s for s in subjects) or "(none)",
                hint="" if ok else "the attestation is about another image",
            )
        )
    for kind in ("provenance", "sbom"):
        if kind not in statements:
            report.add(
                Finding(
                    f"{prefix}{kind}.present",
                    FAIL,
                    f"a {kind} attestation",
                    "none in the attestations",
                )
            )
    return statements


def _predicate(statements: dict[str, Statement], kind: str, model: type[D]) -> D | None:
    """The predicate of the statement of ``kind``, read as ``model``; None where there is no
    such statement or its predicate is not of that shape."""
    st = statements.get(kind)
    return read_object(model, st.predicate) if st is not None and st.predicate else None


def _check_provenance(
    report: Report, prov: Provenance | None, lock: Lockfile | None, prefix: str
) -> str:
    """The provenance's builder, and with ``lock`` the lock and materials it names. Returns the
    lock hash it names ("": none)."""
    if prov is not None:
        builder = prov.run_details.builder
        report.add(
            Finding(
                prefix + "provenance.builder",
                PASS if builder.id == attest.BUILDER_ID else FAIL,
                attest.BUILDER_ID,
                f"{builder.id} {builder.version}".strip(),
            )
        )
    prov_lock = prov.build_definition.external_parameters.lock.content_hash if prov else ""
    if lock is not None:
        expected_lock = lock.meta.content_hash
        ok = bool(prov_lock) and prov_lock == expected_lock
        report.add(
            Finding(
                prefix + "provenance.lock",
                PASS if ok else FAIL,
                expected_lock,
                prov_lock or "(none)",
                hint="" if ok else "the image was built from another lock",
            )
        )
        report.add(_materials(prov, lock, prefix))
    return prov_lock


def _check_lock_hash(
    report: Report, img: _Pulled, lock: Lockfile | None, prov_lock: str, prefix: str
) -> str:
    """The lock hash in the image's config (label) and manifest (annotation): the same, and the
    one of the lock given and of the provenance. Returns it."""
    cfg = _config_of(img.manifest, img.config)
    label = cfg.config.labels.get("io.envspec.lock-hash", "") if cfg is not None else ""
    annotation = img.manifest.annotations.get("io.envspec.lock-hash", "")
    expected_lock = lock.meta.content_hash if lock is not None else ""
    wants = {h for h in (expected_lock, prov_lock) if h}  # the lock given, the provenance's
    ok = bool(label) and label == annotation and wants <= {label}
    report.add(
        Finding(
            prefix + "image.lock-hash",
            PASS if ok else FAIL,
            " = ".join(sorted(wants)) or "the same lock hash in labels and annotations",
            f"label {label or '(none)'}, annotation {annotation or '(none)'}",
            hint=""
            if ok
            else "the image's config, the provenance and the expected lock do not agree",
        )
    )
    return str(label or prov_lock)


def _materials(prov: Provenance | None, lock: Lockfile, prefix: str = "") -> Finding:
    plan = make_plan(lock)
    want = (
        {d.sha256 for d in plan.debs}
        | {w.sha256 for w in plan.wheels}
        | {lock.meta.content_hash.split(":")[-1]}
    )
    deps = prov.build_definition.resolved_dependencies if prov is not None else []
    got = {d.digest.get("sha256", "") for d in deps}
    missing, extra = want - got, got - want
    status: Status = PASS if not missing and not extra else FAIL
    return Finding(
        prefix + "provenance.materials",
        status,
        f"{len(want)} materials: the lock, its .debs and wheels",
        f"{len(got)}"
        + (f"; {len(missing)} missing" if missing else "")
        + (f"; {len(extra)} extra" if extra else ""),
        hint="" if status == PASS else "the provenance lists other files than the lock pins",
    )


def _sbom_packages(sbom: Sbom | None, lock: Lockfile, prefix: str = "") -> Finding:
    plan = make_plan(lock)
    want = {d.sha256 for d in plan.debs} | {w.sha256 for w in plan.wheels}
    got = {c.checksum_value for p in sbom.packages for c in p.checksums} if sbom else set()
    if sbom is None:
        return Finding(prefix + "sbom.packages", FAIL, f"{len(want)} packages", "no SBOM")
    ok = want == got
    return Finding(
        prefix + "sbom.packages",
        PASS if ok else FAIL,
        f"{len(want)} packages of the lock",
        f"{len(got)} with these sha256"
        if ok
        else f"{len(got & want)} of them, {len(got - want)} others",
        hint="" if ok else "the SBOM does not describe the lock's packages",
    )


def exit_code(report: Report) -> int:
    return report.exit_code


__all__ = [
    "RegistryReader",
    "verify_image",
    "manifest_digest",
    "load_public_key",
    "exit_code",
    "WARN",
]

"""Signatures and attestations of a pushed image, in the registry next to it (docs/build.md,
"Signing and attestations").

Tag scheme (cosign's, which Debian's docker-registry 2.8 serves: it has no referrers API), in
the image's own repository, named from the image's manifest digest ``sha256:<hex>``:

- ``sha256-<hex>.att``: an OCI manifest whose layers are DSSE envelopes (``application/vnd.dsse.envelope.v1+json``)
  of two in-toto Statements about the image: the SLSA provenance (``https://slsa.dev/provenance/v1``)
  and the SBOM (``https://spdx.dev/Document``, the SPDX document the image carries);
- ``sha256-<hex>.sig``: with a signing key, the image's signature in the sigstore format that
  cosign and containers/image (``use-sigstore-attachments``) read: a layer
  ``application/vnd.dev.cosign.simplesigning.v1+json`` holding the "simple signing" payload
  (the signed manifest digest and the pushed reference), the signature in the layer's
  annotation ``dev.cosignproject.cosign/signature``.

An image index (``image/index.py``) gets a ``.sig`` of its own, named from the index digest
(``sign``), beside each of its images' ``.att`` and ``.sig`` (``attach``, once per image).

With a key, each envelope is signed too (DSSE: the signature covers the payload type and the
statement), so an attestation cannot be swapped or altered without the key; the ``.att``
manifest itself is not signed (cosign's model). The statements are canonical
JSON made from the lock and the digest alone (no clock: the build's ``SOURCE_DATE_EPOCH`` is in
the image, the statements carry no time), so every machine makes the same bytes; only the
signatures differ (ECDSA signatures are randomized).

The signing is envspec's own (``cryptography``): Debian's skopeo 1.9.3 is built with sigstore
signing disabled ("Debian-local change: sigstore disabled"). Keys: a cosign/sigstore key
(``ENCRYPTED SIGSTORE PRIVATE KEY`` or ``ENCRYPTED COSIGN PRIVATE KEY``: scrypt + NaCl
secretbox, read with PyNaCl) or any PKCS#8/SEC1 PEM private key (``openssl genpkey``), with or
without a passphrase; ECDSA P-256 (cosign's), Ed25519 or RSA.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from envspec import __version__
from envspec.errors import UsageError
from envspec.image.oci import MT_CONFIG, MT_INDEX, MT_MANIFEST, canonical_json, sha256_bytes
from envspec.plan import BuildPlan

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

# the engine's push: an OCI layout's image to a reference, with the image's credentials and TLS
Push = Callable[[Path, str], None]

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
SPDX_PREDICATE = "https://spdx.dev/Document"
BUILD_TYPE = "https://envspec.dev/build/v1"  # a name for how envspec builds (docs/build.md), not a URL to fetch
BUILDER_ID = "https://envspec.dev/builder"
IN_TOTO_PAYLOAD = "application/vnd.in-toto+json"
MT_DSSE = "application/vnd.dsse.envelope.v1+json"
MT_SIMPLESIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
SIG_ANNOTATION = "dev.cosignproject.cosign/signature"
PREDICATE_ANNOTATION = "predicateType"
SIGNATURE_TYPE = "cosign container image signature"


def sig_tag(digest: str) -> str:
    return digest.replace(":", "-", 1) + ".sig"


def att_tag(digest: str) -> str:
    return digest.replace(":", "-", 1) + ".att"


def repository(ref: str) -> str:
    """HOST[:PORT]/REPO of a reference HOST[:PORT]/REPO[:TAG][@DIGEST] (``docker://`` dropped)."""
    ref = ref.removeprefix("docker://").split("@", 1)[0]
    host, _, path = ref.partition("/")
    if ":" in path.rsplit("/", 1)[-1]:
        path = path.rsplit(":", 1)[0]
    return f"{host}/{path}" if path else host


# --- the statements ---------------------------------------------------------------------------------

# an in-toto statement, as JSON (the SLSA provenance and SPDX SBOM predicates are theirs to define)
Statement = dict[str, object]


def provenance(
    plan: BuildPlan, image_digest: str, *, lock_path: str = "", tool_version: str = __version__
) -> Statement:
    """The SLSA v1 provenance of the image ``image_digest`` built from ``plan``: materials are the
    lock (its content hash) and every .deb and wheel with its sha256; the builder is envspec."""
    lock = plan.lock
    meta = lock.meta
    lock_digest = meta.content_hash.split(":", 1)[-1]
    deps: list[dict[str, object]] = [
        {
            "name": lock_path or f"{meta.name}.lock",
            "uri": f"envspec-lock:{meta.name}",
            "digest": {"sha256": lock_digest},
            "annotations": {
                "role": "lock",
                "lock_text_sha256": hashlib.sha256(plan.lock_text.encode()).hexdigest(),
            },
        }
    ]
    mirror = lock.debian.mirror.rstrip("/") if lock.debian else ""
    for d in sorted(plan.debs, key=lambda d: (d.name, d.architecture, d.version)):
        deps.append(
            {
                "name": d.filename.rsplit("/", 1)[-1],
                "uri": f"{mirror}/{d.filename}" if mirror else d.filename,
                "digest": {"sha256": d.sha256},
                "annotations": {"kind": "deb", "package": d.name, "version": d.version},
            }
        )
    for w in sorted(plan.wheels, key=lambda w: (w.name, w.version, w.filename)):
        deps.append(
            {
                "name": w.filename,
                "uri": f"{w.index.rstrip('/')}/{w.name}/#{w.filename}",
                "digest": {"sha256": w.sha256},
                "annotations": {
                    "kind": "wheel",
                    "package": w.name,
                    "version": w.version,
                    "group": w.group,
                },
            }
        )
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": meta.name, "digest": {"sha256": image_digest.split(":", 1)[-1]}}],
        "predicateType": SLSA_PROVENANCE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "lock": {"path": lock_path, "content_hash": meta.content_hash},
                    "platform": f"{lock.platform.os}/{plan.platform.oci_arch}",
                },
                "internalParameters": {"spec_hash": meta.spec_hash, "db_version": meta.db_version},
                "resolvedDependencies": deps,
            },
            "runDetails": {"builder": {"id": BUILDER_ID, "version": {"envspec": tool_version}}},
        },
    }


def sbom_statement(plan: BuildPlan, image_digest: str, sbom: bytes) -> Statement:
    """The SBOM the image carries, as an in-toto Statement about the image."""
    return {
        "_type": STATEMENT_TYPE,
        "subject": [
            {"name": plan.lock.meta.name, "digest": {"sha256": image_digest.split(":", 1)[-1]}}
        ],
        "predicateType": SPDX_PREDICATE,
        "predicate": json.loads(sbom),
    }


# --- signing --------------------------------------------------------------------------------------


@dataclass
class SigningKey:
    """A private key that signs envspec's signatures and envelopes (ECDSA P-256 with SHA-256,
    as cosign does; Ed25519; RSA PKCS#1 v1.5 with SHA-256)."""

    key: PrivateKeyTypes
    path: str = ""

    @classmethod
    def load(cls, path: str | Path, passphrase: bytes | None = None) -> SigningKey:
        from cryptography.hazmat.primitives import serialization

        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise UsageError(
                f"--sign-by-sigstore-private-key {path}: {e.strerror}",
                reference="signing-key-unreadable",
                hint="a cosign/sigstore private key or a PEM private key (docs/build.md)",
            ) from e
        text = data.decode("ascii", "replace")
        try:
            if "ENCRYPTED SIGSTORE PRIVATE KEY" in text or "ENCRYPTED COSIGN PRIVATE KEY" in text:
                der = _decrypt_sigstore(text, passphrase or b"")
                return cls(serialization.load_der_private_key(der, None), str(path))
            return cls(serialization.load_pem_private_key(data, passphrase or None), str(path))
        except (ValueError, TypeError) as e:
            raise UsageError(
                f"--sign-by-sigstore-private-key {path}: cannot read the key ({e})",
                reference="signing-key-unreadable",
                hint="check --sign-passphrase-file; keys: cosign generate-key-pair, or "
                "`openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256` (docs/build.md)",
            ) from e

    def sign(self, data: bytes) -> bytes:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

        if isinstance(self.key, ec.EllipticCurvePrivateKey):
            return self.key.sign(data, ec.ECDSA(hashes.SHA256()))
        if isinstance(self.key, ed25519.Ed25519PrivateKey):
            return self.key.sign(data)
        if isinstance(self.key, rsa.RSAPrivateKey):
            return self.key.sign(data, padding.PKCS1v15(), hashes.SHA256())
        raise UsageError(
            f"{self.path}: keys of type {type(self.key).__name__} cannot sign here",
            reference="signing-key-unsupported",
            hint="use an ECDSA P-256, Ed25519 or RSA key",
        )

    def public_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        pem: bytes = self.key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return pem

    def keyid(self) -> str:
        return key_id(self.public_pem())


def key_id(public_pem: bytes) -> str:
    """sha256 of the public key's DER (SubjectPublicKeyInfo): names the key in envelopes."""
    from cryptography.hazmat.primitives import serialization

    pub = serialization.load_pem_public_key(public_pem)
    der = pub.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return "sha256:" + hashlib.sha256(der).hexdigest()


def _decrypt_sigstore(text: str, passphrase: bytes) -> bytes:
    """The PKCS#8 DER inside a cosign/sigstore encrypted key: JSON (kdf scrypt, cipher
    nacl/secretbox, base64 fields) in a PEM block (sigstore's cryptoutils format)."""
    lines = [
        ln.strip() for ln in text.strip().splitlines() if ln.strip() and not ln.startswith("-----")
    ]
    doc = json.loads(base64.b64decode("".join(lines)))
    kdf, cipher = doc["kdf"], doc["cipher"]
    if kdf.get("name") != "scrypt" or cipher.get("name") != "nacl/secretbox":
        raise ValueError(f"unknown key encryption {kdf.get('name')}/{cipher.get('name')}")
    p = kdf["params"]
    n, r = int(p["N"]), int(p["r"])
    secret = hashlib.scrypt(
        passphrase,
        salt=base64.b64decode(kdf["salt"]),
        n=n,
        r=r,
        p=int(p["p"]),
        dklen=32,
        maxmem=256 * n * r,
    )
    try:
        import nacl.exceptions
        import nacl.secret
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ValueError("reading a cosign/sigstore key needs PyNaCl (pip install pynacl)") from e
    try:
        return nacl.secret.SecretBox(secret).decrypt(
            base64.b64decode(doc["ciphertext"]), base64.b64decode(cipher["nonce"])
        )
    except nacl.exceptions.CryptoError:
        raise ValueError("wrong passphrase") from None


def encrypt_sigstore_key(
    private_key: PrivateKeyTypes, passphrase: bytes, *, n: int = 32768
) -> bytes:
    """``private_key`` as an ``ENCRYPTED SIGSTORE PRIVATE KEY`` PEM (what cosign and
    containers/image read): used by the tests, and by anyone who wants cosign to read an envspec key."""
    import os

    import nacl.secret
    from cryptography.hazmat.primitives import serialization

    der = private_key.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    salt, nonce = os.urandom(32), os.urandom(24)
    secret = hashlib.scrypt(passphrase, salt=salt, n=n, r=8, p=1, dklen=32, maxmem=256 * n * 8)
    ct = nacl.secret.SecretBox(secret).encrypt(der, nonce).ciphertext
    doc = {
        "kdf": {
            "name": "scrypt",
            "params": {"N": n, "r": 8, "p": 1},
            "salt": base64.b64encode(salt).decode(),
        },
        "cipher": {"name": "nacl/secretbox", "nonce": base64.b64encode(nonce).decode()},
        "ciphertext": base64.b64encode(ct).decode(),
    }
    body = base64.encodebytes(json.dumps(doc).encode()).decode()
    return f"-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n{body}-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n".encode()


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what an envelope's signature covers."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def envelope(statement: Statement, key: SigningKey | None) -> bytes:
    """A DSSE envelope of the statement, signed by ``key`` (no signature without one)."""
    payload = canonical_json(statement)
    sigs = (
        [
            {
                "keyid": key.keyid(),
                "sig": base64.b64encode(key.sign(pae(IN_TOTO_PAYLOAD, payload))).decode(),
            }
        ]
        if key is not None
        else []
    )
    return canonical_json(
        {
            "payload": base64.b64encode(payload).decode(),
            "payloadType": IN_TOTO_PAYLOAD,
            "signatures": sigs,
        }
    )


def simple_signing_payload(docker_reference: str, digest: str) -> bytes:
    """The payload that a sigstore image signature signs (containers/image's and cosign's
    "simple signing" format): the manifest digest and the reference it was pushed as."""
    return canonical_json(
        {
            "critical": {
                "identity": {"docker-reference": docker_reference},
                "image": {"docker-manifest-digest": digest},
                "type": SIGNATURE_TYPE,
            },
            "optional": {"creator": f"envspec {__version__}"},
        }
    )


# --- artifacts as OCI layouts ---------------------------------------------------------------------


@dataclass(frozen=True)
class Blob:
    media_type: str
    data: bytes
    annotations: tuple[tuple[str, str], ...] = ()


def write_artifact(dest: Path, blobs: list[Blob], *, ref_name: str) -> str:
    """An OCI layout at ``dest`` holding one manifest whose layers are ``blobs``, laid out as
    cosign does (an image config listing the layers, so every registry and skopeo take it).
    Returns the manifest digest; equal blobs give equal bytes."""
    out = dest / "blobs" / "sha256"
    out.mkdir(parents=True, exist_ok=True)

    def put(data: bytes) -> str:
        digest = sha256_bytes(data)
        (out / digest.split(":", 1)[1]).write_bytes(data)
        return digest

    layers = []
    for b in blobs:
        entry: dict[str, object] = {
            "mediaType": b.media_type,
            "digest": put(b.data),
            "size": len(b.data),
        }
        if b.annotations:
            entry["annotations"] = dict(b.annotations)
        layers.append(entry)
    config = canonical_json(
        {
            "architecture": "",
            "os": "",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [lay["digest"] for lay in layers]},
        }
    )
    manifest = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": MT_MANIFEST,
            "config": {"mediaType": MT_CONFIG, "digest": put(config), "size": len(config)},
            "layers": layers,
        }
    )
    digest = put(manifest)
    (dest / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
    (dest / "index.json").write_bytes(
        canonical_json(
            {
                "schemaVersion": 2,
                "mediaType": MT_INDEX,
                "manifests": [
                    {
                        "mediaType": MT_MANIFEST,
                        "digest": digest,
                        "size": len(manifest),
                        "annotations": {"org.opencontainers.image.ref.name": ref_name},
                    }
                ],
            }
        )
    )
    return digest


def attestation_blobs(
    plan: BuildPlan, image_digest: str, sbom: bytes, key: SigningKey | None, *, lock_path: str = ""
) -> list[Blob]:
    statements = [
        provenance(plan, image_digest, lock_path=lock_path),
        sbom_statement(plan, image_digest, sbom),
    ]
    return [
        Blob(MT_DSSE, envelope(s, key), ((PREDICATE_ANNOTATION, str(s["predicateType"])),))
        for s in statements
    ]


def signature_blob(docker_reference: str, digest: str, key: SigningKey) -> Blob:
    payload = simple_signing_payload(docker_reference, digest)
    return Blob(
        MT_SIMPLESIGNING, payload, ((SIG_ANNOTATION, base64.b64encode(key.sign(payload)).decode()),)
    )


@dataclass(frozen=True)
class Attached:
    """What ``attach`` pushed: the references and the attestation manifest's digest."""

    attestations: str
    attestation_digest: str
    signature: str = ""
    signature_digest: str = ""

    def pushed(self) -> tuple[tuple[str, str], ...]:
        """(reference, manifest digest) of each artifact pushed, in push order."""
        return tuple(
            (r, d)
            for r, d in (
                (self.attestations, self.attestation_digest),
                (self.signature, self.signature_digest),
            )
            if r
        )


def attach(
    push: Push,
    work: Path,
    plan: BuildPlan,
    image_digest: str,
    dest: str,
    sbom: bytes,
    key: SigningKey | None,
    *,
    lock_path: str = "",
) -> Attached:
    """Push the attestations of the image ``image_digest`` pushed as ``dest`` (and, with ``key``,
    the image's signature) with ``push(layout_dir, ref)``: the engine's push, so credentials and
    TLS are the image's. The signature goes last: a signature exists only for what is in the
    registry. The attestation manifest itself is not signed: its envelopes are. ``work``: a
    directory of this image's own (its artifacts' layouts are written there)."""
    repo = repository(dest)
    att_dir = work / "attestations"
    att_digest = write_artifact(
        att_dir,
        attestation_blobs(plan, image_digest, sbom, key, lock_path=lock_path),
        ref_name="att",
    )
    att_ref = f"{repo}:{att_tag(image_digest)}"
    push(att_dir, att_ref)
    if key is None:
        return Attached(att_ref, att_digest)
    sig_ref, sig_digest = sign(push, work, image_digest, dest, key)
    return Attached(att_ref, att_digest, signature=sig_ref, signature_digest=sig_digest)


def sign(push: Push, work: Path, digest: str, dest: str, key: SigningKey) -> tuple[str, str]:
    """Push the signature of the manifest ``digest`` (an image's or an image index's) pushed as
    ``dest``, as ``REPO:sha256-<hex>.sig``; returns (that reference, the signature manifest's
    digest). Called once what it signs is in the registry."""
    sig_dir = work / "signature"
    sig_digest = write_artifact(
        sig_dir, [signature_blob(dest.removeprefix("docker://"), digest, key)], ref_name="sig"
    )
    sig_ref = f"{repository(dest)}:{sig_tag(digest)}"
    push(sig_dir, sig_ref)
    return sig_ref, sig_digest

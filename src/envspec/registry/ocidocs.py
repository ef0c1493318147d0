"""What ``verify-image`` reads of what a registry serves, as models: an image's manifest or an
image index, its config, a signature's payload, an attestation's DSSE envelope and the in-toto
statement inside it (a SLSA provenance or an SPDX SBOM predicate).

The registry's JSON enters here and nowhere else: each document is read into its model where it
is fetched (``read``), and the checks see fields, not dicts. The models take what they know and
ignore the rest (OCI and in-toto documents grow); a field that is absent reads as empty, so a
check finds "none" where it looks; a document that is not JSON, or whose field has the wrong
type, does not read (``read`` gives None: the caller's finding says so).
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError
from pydantic.alias_generators import to_camel


class Document(BaseModel):
    """A registry's JSON document: camelCase keys, unknown keys ignored, absent ones empty."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class Platform(Document):
    os: str = ""
    architecture: str = ""


class Descriptor(Document):
    """A content descriptor: what a manifest says of its config, a layer, or an index's image."""

    media_type: str = ""
    digest: str = ""
    size: int = 0
    annotations: dict[str, str] = {}
    platform: Platform | None = None


class Manifest(Document):
    """An image manifest or an image index (manifest list): which one is ``is_index``'s to say."""

    media_type: str = ""
    config: Descriptor | None = None
    layers: list[Descriptor] = []
    manifests: list[Descriptor] = []
    annotations: dict[str, str] = {}


class ContainerConfig(Document):
    labels: dict[str, str] = Field(default={}, alias="Labels")


class ImageConfig(Document):
    """An image's config: the platform it is for and its labels."""

    os: str = ""
    architecture: str = ""
    config: ContainerConfig = ContainerConfig()


class SignedImage(Document):
    docker_manifest_digest: str = Field(default="", alias="docker-manifest-digest")


class SignedIdentity(Document):
    docker_reference: str = Field(default="", alias="docker-reference")


class SignedCritical(Document):
    type: str = ""
    image: SignedImage = SignedImage()
    identity: SignedIdentity = SignedIdentity()


class SignaturePayload(Document):
    """A simple-signing payload: the image digest and repository a signature is of."""

    critical: SignedCritical = SignedCritical()


class EnvelopeSignature(Document):
    sig: str = ""


class Envelope(Document):
    """A DSSE envelope: a base64 payload of a type, and its signatures."""

    payload: str
    payload_type: str = ""
    signatures: list[EnvelopeSignature] = []


class Subject(Document):
    digest: dict[str, str] = {}


class Statement(Document):
    """An in-toto statement: the images it is about, and its predicate (read by its type)."""

    subject: list[Subject] = []
    predicate_type: str = ""
    predicate: dict[str, JsonValue] = {}


class Builder(Document):
    id: str = ""
    version: dict[str, str] = {}


class RunDetails(Document):
    builder: Builder = Builder()


class LockParameter(Document):
    content_hash: str = Field(default="", alias="content_hash")


class ExternalParameters(Document):
    lock: LockParameter = LockParameter()


class Material(Document):
    digest: dict[str, str] = {}


class BuildDefinition(Document):
    external_parameters: ExternalParameters = ExternalParameters()
    resolved_dependencies: list[Material] = []


class Provenance(Document):
    """A SLSA provenance predicate: who built the image, from which lock and materials."""

    run_details: RunDetails = RunDetails()
    build_definition: BuildDefinition = BuildDefinition()


class Checksum(Document):
    checksum_value: str = ""


class SbomPackage(Document):
    checksums: list[Checksum] = []


class Sbom(Document):
    """An SPDX document: its packages' checksums."""

    packages: list[SbomPackage] = []


D = TypeVar("D", bound=Document)


def read(model: type[D], data: bytes | str) -> D | None:
    """``data`` read as ``model``; None where it is not JSON of that shape."""
    try:
        return model.model_validate_json(data)
    except ValidationError:
        return None


def read_object(model: type[D], data: dict[str, JsonValue]) -> D | None:
    """An object already parsed (a statement's predicate) read as ``model``; None where it is
    not of that shape."""
    try:
        return model.model_validate(data)
    except ValidationError:
        return None

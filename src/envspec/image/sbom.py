"""The image's SBOM: SPDX 2.3 JSON listing every Debian package and wheel with version and
sha256. Deterministic: fixed creation time (SOURCE_DATE_EPOCH or 1970), sorted packages,
a namespace derived from the lock hash, canonical JSON."""

from __future__ import annotations

import re
import urllib.parse

from envspec.debian.models import DebPin
from envspec.image.oci import canonical_json, created_at
from envspec.lock import Wheel
from envspec.plan import BuildPlan


def _spdx_id(kind: str, name: str, version: str) -> str:
    return "SPDXRef-" + re.sub(r"[^A-Za-z0-9.-]+", "-", f"{kind}-{name}-{version}")


def make_sbom(plan: BuildPlan, *, tool_version: str = "") -> bytes:
    meta = plan.lock.meta
    root_id = "SPDXRef-image"
    packages: list[dict[str, object]] = [
        {
            "SPDXID": root_id,
            "name": meta.name,
            "versionInfo": plan.lock.short_hash,
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": False,
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
            "copyrightText": "NOASSERTION",
            "primaryPackagePurpose": "CONTAINER",
            "comment": f"lock {meta.content_hash}",
        }
    ]
    rels = [
        {
            "spdxElementId": "SPDXRef-DOCUMENT",
            "relationshipType": "DESCRIBES",
            "relatedSpdxElement": root_id,
        }
    ]
    mirror = plan.lock.debian.mirror.rstrip("/") if plan.lock.debian else ""
    for sid, package in [
        *(
            (_spdx_id("deb", f"{d.name}-{d.architecture}", d.version), _deb_package(d, mirror))
            for d in plan.debs
        ),
        *((_spdx_id("pypi", w.name, w.version), _wheel_package(w)) for w in plan.wheels),
    ]:
        packages.append({"SPDXID": sid, **package})
        rels.append(
            {"spdxElementId": root_id, "relationshipType": "CONTAINS", "relatedSpdxElement": sid}
        )
    doc = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{meta.name}-{plan.lock.short_hash}",
        "documentNamespace": f"urn:envspec:sbom:{meta.name}:{meta.content_hash.split(':', 1)[-1]}",
        "creationInfo": {
            "created": created_at(),
            "creators": [f"Tool: envspec{('-' + tool_version) if tool_version else ''}"],
        },
        "packages": packages,
        "relationships": rels,
    }
    return canonical_json(doc) + b"\n"


def _deb_package(d: DebPin, mirror: str) -> dict[str, object]:
    """A .deb's SPDX package (its SPDXID first, added by the caller)."""
    return {
        "name": d.name,
        "versionInfo": d.version,
        "downloadLocation": f"{mirror}/{d.filename}" if mirror else "NOASSERTION",
        "filesAnalyzed": False,
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": "NOASSERTION",
        "copyrightText": "NOASSERTION",
        "supplier": "Organization: Debian",
        "checksums": [{"algorithm": "SHA256", "checksumValue": d.sha256}],
        "externalRefs": [
            {
                "referenceCategory": "PACKAGE-MANAGER",
                "referenceType": "purl",
                "referenceLocator": f"pkg:deb/debian/{d.name}@{urllib.parse.quote(d.version)}"
                f"?arch={d.architecture}",
            }
        ],
        "primaryPackagePurpose": "LIBRARY",
    }


def _wheel_package(w: Wheel) -> dict[str, object]:
    """A wheel's SPDX package (its SPDXID first, added by the caller)."""
    return {
        "name": w.name,
        "versionInfo": w.version,
        "downloadLocation": f"{w.index.rstrip('/')}/{w.name}/#{w.filename}"
        if w.index
        else "NOASSERTION",
        "packageFileName": w.filename,
        "filesAnalyzed": False,
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": "NOASSERTION",
        "copyrightText": "NOASSERTION",
        "checksums": [{"algorithm": "SHA256", "checksumValue": w.sha256}],
        "externalRefs": [
            {
                "referenceCategory": "PACKAGE-MANAGER",
                "referenceType": "purl",
                "referenceLocator": f"pkg:pypi/{w.name}@{w.version}",
            }
        ],
        "primaryPackagePurpose": "LIBRARY",
        "comment": f"layer group {w.group}",
    }

"""OCI image layout writing: config, manifest, index, all as deterministic JSON.

Deterministic JSON = sorted keys, no spaces, UTF-8. ``created`` is SOURCE_DATE_EPOCH or 1970.
A layout's layers are either the uncompressed tars (``application/vnd.oci.image.layer.v1.tar``:
what goes into containers-storage and docker archives; a layer's digest is its diff_id) or
their compressed blobs (``+zstd``/``+gzip``, ``image/compress.py``: what pushes and OCI outputs
carry); ``skopeo copy --preserve-digests`` keeps the blobs as they are on the way to a registry.
The config (diff_ids) is the same for both; the manifest digest is the image's identity.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from envspec.image.tarball import source_date_epoch
from envspec.plan import LOCK_PATH_IN_IMAGE, BuildPlan

MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER = "application/vnd.oci.image.layer.v1.tar"


def canonical_json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )


def sha256_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def created_at() -> str:
    return datetime.fromtimestamp(source_date_epoch(), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class LayerBlob:
    group: str
    key: str
    path: (
        Path | None
    )  # the blob: the uncompressed tar or its compressed file (in the cache); None: not in the layout
    digest: str  # the blob's digest (== diff_id when uncompressed)
    size: int  # the blob's size
    description: str = ""
    diff_id: str = ""  # the uncompressed tar's digest ("": == digest)
    media_type: str = MT_LAYER


def nvidia_require_cuda(plan: BuildPlan) -> str:
    """``NVIDIA_REQUIRE_CUDA`` for the container toolkit: comma = and.

    Policy ``compat`` (CUDA minor-version compatibility): any driver of the toolkit's major
    branch at or above the lock's floor runs it, so require ``cuda>=MAJOR.0``; ``strict``
    requires the toolkit's own ``cuda>=MAJOR.MINOR``. Both add ``driver>=FLOOR``.
    """
    cuda, hw = plan.lock.torch.cuda if plan.lock.torch else "", plan.lock.hardware
    if not cuda:
        return ""
    major, _, minor = cuda.partition(".")
    need = f"cuda>={major}.0" if hw.driver_policy == "compat" else f"cuda>={major}.{minor or '0'}"
    if hw.driver_floor:
        need += f",driver>={hw.driver_floor}"
    return need


def image_env(plan: BuildPlan) -> list[str]:
    p, rt = plan.platform, plan.lock.runtime
    env: dict[str, str] = {
        "PATH": f"{p.venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "VIRTUAL_ENV": p.venv,
        "LANG": "C.UTF-8",
        "ENVSPEC_LOCK": LOCK_PATH_IN_IMAGE,
    }
    if plan.lock.torch and plan.lock.torch.cuda:
        env["NVIDIA_VISIBLE_DEVICES"] = "all"
        env["NVIDIA_DRIVER_CAPABILITIES"] = "compute,utility"
        env["NVIDIA_REQUIRE_CUDA"] = nvidia_require_cuda(plan)
    if rt.tf32:
        env["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] = "1"
    else:
        env["NVIDIA_TF32_OVERRIDE"] = "0"
    env.update(rt.env)  # the spec's [runtime].env wins
    return [f"{k}={env[k]}" for k in sorted(env)]


def image_labels(plan: BuildPlan) -> dict[str, str]:
    lock, p = plan.lock, plan.platform
    meta, hw, torch = lock.meta, lock.hardware, lock.torch
    labels = {
        "org.opencontainers.image.title": meta.name,
        "org.opencontainers.image.description": f"envspec image of lock {meta.name} ({meta.content_hash})",
        "org.opencontainers.image.version": lock.short_hash,
        "org.opencontainers.image.revision": meta.content_hash,
        "org.opencontainers.image.created": created_at(),
        "org.opencontainers.image.base.name": p.base,
        "io.envspec.lock-hash": meta.content_hash,
        "io.envspec.spec-hash": meta.spec_hash,
        "io.envspec.db-version": meta.db_version,
        "io.envspec.arch-list": ",".join(hw.arch_list),
        "io.envspec.gpus": ",".join(hw.gpus),
        "io.envspec.driver-floor": hw.driver_floor,
        "io.envspec.driver-policy": hw.driver_policy,
        "io.envspec.torch": f"{torch.version}+{torch.variant}" if torch else "",
        "io.envspec.cuda": torch.cuda if torch else "",
        "io.envspec.python": p.python_full or p.python,
        "io.envspec.user": lock.runtime.user,
        "io.envspec.shm-size": lock.runtime.shm_size,
        "io.envspec.lock-path": LOCK_PATH_IN_IMAGE,
    }
    return {k: v for k, v in labels.items() if v}


def image_config(
    plan: BuildPlan, layers: list[LayerBlob], *, entrypoint: list[str], cmd: list[str], user: str
) -> dict[str, object]:
    cfg: dict[str, object] = {
        "Env": image_env(plan),
        "User": user,
        "WorkingDir": "/" + plan.lock.runtime.workdir.strip("/"),
        "Labels": image_labels(plan),
    }
    if entrypoint:
        cfg["Entrypoint"] = entrypoint
    if cmd:
        cfg["Cmd"] = cmd
    when = created_at()
    return {
        "architecture": plan.platform.oci_arch,
        "os": plan.platform.os,
        "created": when,
        "author": "envspec",
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": [lay.diff_id or lay.digest for lay in layers]},
        "history": [
            {
                "created": when,
                "created_by": f"envspec {lay.group} layer",
                "comment": lay.description or lay.key,
            }
            for lay in layers
        ],
    }


def _place_blob(
    blobs: Path, digest: str, src: Path | None = None, data: bytes | None = None
) -> None:
    dest = blobs / digest.split(":", 1)[1]
    if dest.exists():
        return
    if data is not None:
        tmp = dest.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, dest)
        return
    if (
        src is None
    ):  # a layer streamed into the store alone: this layout is the store's (image.Layers.layout_path)
        return
    try:
        os.link(src, dest)  # same file system as the cache: no copy of gigabytes
    except OSError:
        shutil.copyfile(src, dest)


def image_manifest(
    plan: BuildPlan, layers: list[LayerBlob], config_digest: str, config_size: int
) -> dict[str, object]:
    """The image manifest: its config, its layers with their group and key, the lock's hash."""
    meta = plan.lock.meta
    return {
        "schemaVersion": 2,
        "mediaType": MT_MANIFEST,
        "config": {"mediaType": MT_CONFIG, "digest": config_digest, "size": config_size},
        "layers": [
            {
                "mediaType": lay.media_type,
                "digest": lay.digest,
                "size": lay.size,
                "annotations": {
                    "io.envspec.layer.group": lay.group,
                    "io.envspec.layer.key": lay.key,
                },
            }
            for lay in layers
        ],
        "annotations": {
            "org.opencontainers.image.created": created_at(),
            "org.opencontainers.image.title": meta.name,
            "org.opencontainers.image.revision": meta.content_hash,
            "io.envspec.lock-hash": meta.content_hash,
        },
    }


def write_layout(
    dest: Path,
    plan: BuildPlan,
    layers: list[LayerBlob],
    *,
    entrypoint: list[str],
    cmd: list[str],
    user: str,
    ref_name: str,
) -> tuple[str, int, bytes]:
    """Write an OCI image layout at ``dest`` (an empty or new directory). Returns (manifest
    digest, manifest size, config bytes)."""
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    for lay in layers:
        _place_blob(blobs, lay.digest, src=lay.path)
    config = canonical_json(image_config(plan, layers, entrypoint=entrypoint, cmd=cmd, user=user))
    config_digest = sha256_bytes(config)
    _place_blob(blobs, config_digest, data=config)
    manifest = image_manifest(plan, layers, config_digest, len(config))
    mbytes = canonical_json(manifest)
    mdigest = sha256_bytes(mbytes)
    _place_blob(blobs, mdigest, data=mbytes)
    index = {
        "schemaVersion": 2,
        "mediaType": MT_INDEX,
        "manifests": [
            {
                "mediaType": MT_MANIFEST,
                "digest": mdigest,
                "size": len(mbytes),
                "annotations": {"org.opencontainers.image.ref.name": ref_name},
            }
        ],
    }
    (dest / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
    (dest / "index.json").write_bytes(canonical_json(index))
    return mdigest, len(mbytes), config


def export_layout(src: Path, dest: Path, ref_name: str = "") -> None:
    """Put the image of layout ``src`` into the OCI layout ``dest`` (``--output oci:DIR``):
    blobs hardlinked (copied across file systems), the manifest added to ``dest``'s index.json,
    replacing an entry of the same ref name. An existing non-layout, non-empty ``dest`` is refused."""
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()) and not (dest / "index.json").is_file():
        raise FileExistsError(f"{dest} exists and is not an OCI image layout")
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    for b in sorted((src / "blobs" / "sha256").iterdir()):
        _place_blob(blobs, "sha256:" + b.name, src=b)
    new = json.loads((src / "index.json").read_bytes())["manifests"]
    if ref_name:
        for m in new:
            m.setdefault("annotations", {})["org.opencontainers.image.ref.name"] = ref_name
    index: dict[str, Any] = {"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": []}
    if (dest / "index.json").is_file():
        index = json.loads((dest / "index.json").read_bytes())
    names = {m.get("annotations", {}).get("org.opencontainers.image.ref.name") for m in new} - {
        None
    }
    kept = [
        m
        for m in index.get("manifests", [])
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") not in names
        and m["digest"] not in {n["digest"] for n in new}
    ]
    index["manifests"] = kept + new
    (dest / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
    tmp = dest / "index.json.tmp"
    tmp.write_bytes(canonical_json(index))
    os.replace(tmp, dest / "index.json")


def write_index(
    layout: Path, images: list[tuple[str, str, str]], *, ref_name: str, annotations: dict[str, str]
) -> tuple[str, int]:
    """Make the OCI layout ``layout`` (which holds the images' manifests and blobs) hold one image
    index (manifest list) over ``images``, (os, architecture, manifest digest) each in this order,
    with each manifest's ``platform``; ``index.json`` then names the index only, as ``ref_name``.
    Deterministic: the same images give the same index bytes. Returns (index digest, size)."""
    blobs = layout / "blobs" / "sha256"
    manifests = []
    for os_name, arch, digest in images:
        size = (blobs / digest.split(":", 1)[1]).stat().st_size
        manifests.append(
            {
                "mediaType": MT_MANIFEST,
                "digest": digest,
                "size": size,
                "platform": {"architecture": arch, "os": os_name},
            }
        )
    index = {
        "schemaVersion": 2,
        "mediaType": MT_INDEX,
        "manifests": manifests,
        "annotations": annotations,
    }
    data = canonical_json(index)
    digest = sha256_bytes(data)
    _place_blob(blobs, digest, data=data)
    top = {
        "schemaVersion": 2,
        "mediaType": MT_INDEX,
        "manifests": [
            {
                "mediaType": MT_INDEX,
                "digest": digest,
                "size": len(data),
                "annotations": {"org.opencontainers.image.ref.name": ref_name},
            }
        ],
    }
    (layout / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
    tmp = layout / "index.json.tmp"
    tmp.write_bytes(canonical_json(top))
    os.replace(tmp, layout / "index.json")
    return digest, len(data)

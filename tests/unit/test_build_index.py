"""The image index of a multi-platform lock (image/index.py, oci.write_index): deterministic bytes,
each manifest's platform, per-platform tags, and what an index cannot carry (a docker archive) refused
up front."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envspec import lock as lockmod
from envspec.errors import UsageError
from envspec.image import BuildOptions
from envspec.image.index import check_options, platform_tag
from envspec.image.oci import MT_INDEX, MT_MANIFEST, canonical_json, sha256_bytes, write_index
from envspec.registry.stage import Registry

ROOT = Path(__file__).parents[2]
MULTI = ROOT / "lockfiles" / "smoke-multi.lock"


def _layout(tmp: Path) -> tuple[Path, list[str]]:
    blobs = tmp / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    digests = []
    for arch in ("amd64", "arm64"):
        data = canonical_json({"schemaVersion": 2, "mediaType": MT_MANIFEST, "arch": arch})
        d = sha256_bytes(data)
        (blobs / d.split(":")[1]).write_bytes(data)
        digests.append(d)
    return tmp, digests


def test_the_index_names_each_manifest_with_its_platform_and_is_deterministic(tmp_path):
    a, digests = _layout(tmp_path / "a")
    b, _ = _layout(tmp_path / "b")
    images = [("linux", "amd64", digests[0]), ("linux", "arm64", digests[1])]
    da, size = write_index(
        a, images, ref_name="abc", annotations={"io.envspec.lock-hash": "sha256:x"}
    )
    db, _ = write_index(b, images, ref_name="abc", annotations={"io.envspec.lock-hash": "sha256:x"})
    assert da == db
    raw = (a / "blobs" / "sha256" / da.split(":")[1]).read_bytes()
    assert len(raw) == size and sha256_bytes(raw) == da
    index = json.loads(raw)
    assert index["mediaType"] == MT_INDEX
    assert [(m["platform"], m["digest"], m["mediaType"]) for m in index["manifests"]] == [
        ({"architecture": "amd64", "os": "linux"}, digests[0], MT_MANIFEST),
        ({"architecture": "arm64", "os": "linux"}, digests[1], MT_MANIFEST),
    ]
    top = json.loads((a / "index.json").read_text())
    assert top["manifests"] == [
        {
            "mediaType": MT_INDEX,
            "digest": da,
            "size": size,
            "annotations": {"org.opencontainers.image.ref.name": "abc"},
        }
    ]
    other, _ = write_index(
        a, images[::-1], ref_name="abc", annotations={"io.envspec.lock-hash": "sha256:x"}
    )
    assert other != da  # the order is the lock's, and it is part of the index


def test_each_platform_image_gets_its_own_tag():
    lock = lockmod.load(MULTI)
    arm = lock.for_platform("linux-aarch64")
    assert platform_tag(None, arm) is None  # the build takes the view's own: NAME:HASH-arm64
    assert arm.image_tag.endswith(f":{lock.short_hash}-arm64")
    assert platform_tag("", arm) == ""
    assert platform_tag("localhost:5000/team/smoke:v1", arm) == "localhost:5000/team/smoke:v1-arm64"
    assert (
        platform_tag("localhost:5000/team/smoke", arm) == "localhost:5000/team/smoke:latest-arm64"
    )


@pytest.mark.parametrize(
    "options, words",
    [
        (BuildOptions(outputs=("docker-archive:/tmp/x.tar",)), "docker archive holds one platform"),
        (
            BuildOptions(
                outputs=("oci:/tmp/x", "docker-archive:/tmp/x.tar"),
                push="r/x",
                registry=Registry(key=object()),
            ),
            "docker archive holds one platform",
        ),  # type: ignore[arg-type]
    ],
)
def test_what_an_index_cannot_carry_is_refused(options, words):
    with pytest.raises(UsageError) as e:
        check_options(options)
    assert e.value.reference == "index-output-unsupported" and words in e.value.message


def test_an_index_can_be_pushed_signed():
    """Signing is no longer refused for an index (tests/unit/test_index_signing.py: what it pushes)."""
    check_options(
        BuildOptions(push="r/x", registry=Registry(key=object()), outputs=("oci:/tmp/x",))
    )  # type: ignore[arg-type]


def test_dry_run_of_a_multi_platform_lock_previews_each_platform(capsys, monkeypatch, tmp_path):
    from envspec.cli import main

    monkeypatch.setenv("ENVSPEC_CACHE", str(tmp_path / "cache"))
    assert main(["build", str(MULTI), "--dry-run", "--push", "localhost:5000/x:1"]) == 0
    lock = lockmod.load(MULTI)
    said = (
        capsys.readouterr().out
    )  # a person's summary (issue 43, 6): each platform's image and layers
    assert said.startswith(f"dry run of {MULTI}: nothing is built, fetched or written")
    assert all(f"{v.platform_names[0]}: image {v.image_tag}" in said for v in lock.views())
    assert "(--json: the whole plan, with each layer's pins)" in said and "{" not in said
    assert main(["build", str(MULTI), "--dry-run", "--push", "localhost:5000/x:1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["index"] is True
    assert [p["platform"] for p in out["platforms"]] == ["linux-x86_64", "linux-aarch64"]
    assert [p["image"] for p in out["platforms"]] == [v.image_tag for v in lock.views()]

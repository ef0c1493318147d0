"""``envspec cache`` and ``envspec cache gc`` on a real cache: lockfiles/smoke.lock built into a
temp cache (XDG_CACHE_HOME), junk entries added (a wheel, a .deb and a layer no lock needs, last
used long ago); a collection keeping that lock removes the junk and keeps its layers, and the
rebuild finds every cacheable layer in the cache (``--json``'s per-layer ``cached``)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.network]

for tool in ("skopeo", "buildah"):
    if shutil.which(tool) is None:
        pytestmark.append(
            pytest.mark.skip(reason=f"{tool} is not installed (scripts/dev.sh setup)")
        )

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "lockfiles" / "smoke.lock"
LONG_AGO = time.time() - 30 * 24 * 3600


def envspec(env, *args):
    cp = subprocess.run(
        [sys.executable, "-m", "envspec", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=900,
    )
    assert cp.returncode == 0, (args, cp.stdout[-2000:], cp.stderr[-3000:])
    return json.loads(cp.stdout) if "--json" in args else cp.stdout


def junk(cache: Path) -> dict[str, Path]:
    paths = {}
    for kind, rel in (
        ("wheel", "blobs/sha256/{}"),
        ("deb", "debs/sha256/{}"),
        ("layer", "layers/{}.tar"),
    ):
        hexd = hashlib.sha256(f"junk {kind}".encode()).hexdigest()
        p = cache / "envspec" / rel.format(hexd)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(4096))
        if kind == "layer":
            p.with_suffix(".json").write_text(json.dumps({"group": "junk", "size": 4096}))
            os.utime(p.with_suffix(".json"), (LONG_AGO, LONG_AGO))
        os.utime(p, (LONG_AGO, LONG_AGO))
        paths[kind] = p
    return paths


def test_gc_keeps_the_locks_layers_and_removes_junk(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ENVSPEC_CACHE"}
    env |= {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "PYTHONPATH": str(ROOT / "src")}
    first = envspec(env, "build", str(LOCK), "--tag", "", "--json")
    cache = tmp_path / "xdg"
    made = {lay["key"].split(":", 1)[1] for lay in first["layers"]}  # the envspec layer's too
    assert made and all((cache / "envspec" / "layers" / f"{k}.tar").is_file() for k in made)
    listed = envspec(env, "cache", "--json")
    assert listed["cache"] == str(cache / "envspec")
    assert listed["kinds"]["layer"]["count"] == len(made) and listed["kinds"]["deb"]["count"] > 0
    j = junk(cache)

    dry = envspec(
        env, "cache", "gc", "--dry-run", "--json"
    )  # the repository's locks, smoke.lock among them
    assert str(LOCK) in dry["locks"]
    assert sorted(e["paths"][-1] for e in dry["removed"]) == sorted(str(p) for p in j.values())
    assert all(p.exists() for p in j.values())  # a dry run removes nothing

    done = envspec(env, "cache", "gc", str(LOCK), "--json")
    assert {e["kind"] for e in done["removed"]} == {"wheel", "deb", "layer"} and len(
        done["removed"]
    ) == 3
    assert not any(p.exists() for p in j.values()) and not j["layer"].with_suffix(".json").exists()
    after = envspec(env, "cache", "--json")
    assert after["kinds"]["layer"]["count"] == len(made)
    assert after["kinds"]["deb"]["count"] == listed["kinds"]["deb"]["count"]

    again = envspec(env, "build", str(LOCK), "--tag", "", "--json")
    assert again["digest"] == first["digest"]
    # every layer cached, the envspec layer too (kept for the lock: keyed as the build keys it)
    assert all(lay["cached"] for lay in again["layers"])

    # kept for another lock only, smoke's layers are unneeded, but used a moment ago: the grace
    # period keeps them (a build of another process may be about to use them)
    other = envspec(
        env, "cache", "gc", "--json", str(ROOT / "tests" / "data" / "build" / "small.lock")
    )
    assert not [e for e in other["removed"] if e["kind"] == "layer"]
    assert other["kept"]["recent"] >= len(made)
    assert all((cache / "envspec" / "layers" / f"{k}.tar").is_file() for k in made)


def test_a_node_may_drop_the_layers_its_store_holds(tmp_path):
    """``envspec cache`` marks the layers containers-storage holds too and ``cache gc --stored``
    drops them, needed by a lock or not (issue 59, point 5); the image stays in the store."""
    from conftest import private_storage

    env = {k: v for k, v in os.environ.items() if k != "ENVSPEC_CACHE"}
    env |= {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "PYTHONPATH": str(ROOT / "src")}
    with private_storage(tmp_path / "storage") as host:
        env["ENVSPEC_STORAGE_ROOT"] = os.environ["ENVSPEC_STORAGE_ROOT"]
        tag = "localhost/envspec-test/cache-gc-stored:1"
        built = envspec(env, "build", str(LOCK), "--tag", tag, "--json")
        layers = cachegc_layers(tmp_path)
        assert len(layers) == len(built["layers"])
        listed = envspec(env, "cache", "--json")
        assert listed["store"]["read"] and listed["store"]["layers_in_store"] == len(layers)
        assert all(e["in_store"] for e in listed["entries"] if e["kind"] == "layer")
        assert "a node may drop" in envspec(env, "cache")
        done = envspec(env, "cache", "gc", str(LOCK), "--stored", "--json")
        assert done["removed_in_store"] == len(layers)
        assert {e["kind"] for e in done["removed"]} == {"layer"} and not cachegc_layers(tmp_path)
        assert envspec(env, "cache", "--json")["kinds"]["deb"]["count"] > 0  # the lock needs them
        cp = subprocess.run(
            ["podman", *host.storage.args(), "image", "exists", tag], capture_output=True
        )
        assert cp.returncode == 0, cp.stderr


def cachegc_layers(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "xdg" / "envspec" / "layers").glob("*.tar"))

"""build(): fetch, layers, cache, OCI layout, SBOM, config; with the recording engine and tiny
wheels made on the spot in a find-links mirror (no network, no buildah)."""

import hashlib
import json
import os
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data" / "build"))
import helpers  # noqa: E402

from envspec import sources  # noqa: E402
from envspec.cache.store import Cache  # noqa: E402
from envspec.errors import BuildError, HashMismatch, SourceError, UsageError  # noqa: E402
from envspec.host import ASK_NONE, Storage, detect_host  # noqa: E402
from envspec.image import BuildOptions, RecordingEngine, Reporter, build, preview  # noqa: E402
from envspec.image.layers import envspec_layer_inputs  # noqa: E402
from envspec.image.oci import nvidia_require_cuda  # noqa: E402
from envspec.lock import Wheel  # noqa: E402
from envspec.plan import keyed_top, make_plan  # noqa: E402
from envspec.registry.stage import Registry  # noqa: E402
from envspec.wheels.fetch import WheelFetcher  # noqa: E402

WHEELS = [
    ("cudalib", "1.0", "cuda"),
    ("torchish", "2.0", "torch"),
    ("depa", "0.1", "deps"),
    ("depb", "0.2", "deps"),
    ("teampkg", "1.0", "team"),
]


class Recorder(Reporter):
    def __init__(self):
        self.events = []

    def fetching(self, name, filename, size):
        self.events.append(("fetching", name))

    def layer_built(self, layer):
        self.events.append(("layer_built", layer.group, layer.cached))

    def committing(self, ref, digest):
        self.events.append(("committing", ref))


@pytest.fixture
def env(tmp_path):
    lock, mirror = helpers.local_lock(tmp_path, WHEELS)
    mirrors = [sources.Mirror(mirror.as_uri(), "links", "test")]
    return lock, mirrors, tmp_path


def _build(lock, mirrors, cache, **kw):
    eng = kw.pop("engine", None) or RecordingEngine()
    rep = Recorder()
    options = BuildOptions(
        registry=Registry(), **{k: tuple(v) if k == "outputs" else v for k, v in kw.items()}
    )
    return (
        build(make_plan(lock), eng, Cache(cache), mirrors, options=options, reporter=rep),
        eng,
        rep,
    )


def test_build_makes_every_layer_then_tags_last(env):
    lock, mirrors, tmp = env
    img, eng, rep = _build(lock, mirrors, tmp / "cache")
    assert [lay.group for lay in img.layers] == ["base", "cuda", "torch", "deps", "team", "envspec"]
    assert not any(lay.cached for lay in img.layers)
    assert eng.calls[-1][0] == "import_image" and eng.calls[-1][2] == img.image
    assert eng.images[img.image] == img.store_digest  # the store holds the uncompressed layers
    assert ("committing", img.image) in rep.events
    # only tagged in the store: its layers stay uncompressed, as the store keeps them (compress_now)
    assert img.compression == "none" and img.digest == img.store_digest
    assert all(lay.digest == lay.diff_id and lay.size == lay.diff_size for lay in img.layers)
    pushed, _, _ = _build(lock, mirrors, tmp / "cache", push="registry.example/x:1")
    assert (
        pushed.compression == "zstd" and pushed.digest != pushed.store_digest == img.store_digest
    )  # pushes carry zstd blobs
    assert all(lay.digest != lay.diff_id and lay.size < lay.diff_size for lay in pushed.layers)


def test_compression_none_keeps_the_uncompressed_layers(env):
    lock, mirrors, tmp = env
    img, eng, _ = _build(lock, mirrors, tmp / "cache", compression="none")
    assert img.digest == img.store_digest == eng.images[img.image]
    assert all(lay.digest == lay.diff_id and lay.size == lay.diff_size for lay in img.layers)
    zst, _, _ = _build(lock, mirrors, tmp / "cache")
    assert zst.store_digest == img.store_digest  # the same image in the store, whatever is pushed


def test_unchanged_lock_rebuilds_nothing(env):
    lock, mirrors, tmp = env
    first, eng, _ = _build(lock, mirrors, tmp / "cache")
    again, eng2, rep = _build(lock, mirrors, tmp / "cache", engine=eng)
    assert again.digest == first.digest
    # the envspec layer too: keyed by its inputs (the lock, envspec's sources; issue 59)
    assert [lay.cached for lay in again.layers] == [True] * 6
    assert not [e for e in rep.events if e[0] == "fetching"]
    assert [
        c for c in eng.calls if c[0] == "import_image"
    ].__len__() == 1  # already there: no re-import


def test_no_cache_builds_give_one_digest(env):
    lock, mirrors, tmp = env
    a, _, _ = _build(lock, mirrors, tmp / "c1", no_cache=True)
    b, _, _ = _build(lock, mirrors, tmp / "c2", no_cache=True)
    assert a.digest == b.digest and a.layers == b.layers


def test_one_team_change_rebuilds_team_and_above_only(env):
    lock, mirrors, tmp = env
    a, _, _ = _build(lock, mirrors, tmp / "cache")
    path, sha = helpers.make_wheel(tmp / "wheels", "teampkg", "1.1")
    lock2 = helpers.with_wheel(lock, "teampkg", version="1.1", filename=path.name, sha256=sha)
    b, _, _ = _build(lock2, mirrors, tmp / "cache")
    da = {lay.group: lay.digest for lay in a.layers}
    db = {lay.group: lay.digest for lay in b.layers}
    assert [g for g in da if da[g] != db[g]] == ["team", "envspec"]
    assert [lay.group for lay in b.layers if not lay.cached] == ["team", "envspec"]


def test_wrong_sha256_stops_the_build_and_tags_nothing(env):
    lock, mirrors, tmp = env
    bad = helpers.with_wheel(lock, "depa", sha256="0" * 64)
    eng = RecordingEngine()
    with pytest.raises(HashMismatch) as e:
        _build(bad, mirrors, tmp / "cache", engine=eng)
    assert "depa-0.1-py3-none-any.whl" in e.value.message and "0" * 64 in e.value.message
    assert eng.images == {} and not [c for c in eng.calls if c[0] == "import_image"]
    assert list((tmp / "cache" / "tmp").iterdir()) == []  # work dirs removed


def test_a_file_no_source_has_is_a_source_error(env):
    lock, mirrors, tmp = env
    bad = helpers.with_wheel(lock, "depa", filename="depa-9.9-py3-none-any.whl")
    with pytest.raises(SourceError, match="depa-9.9"):
        _build(bad, mirrors, tmp / "cache")


def test_a_push_without_the_registry_stage_is_refused_before_anything_is_made(env):
    lock, mirrors, tmp = env
    eng = RecordingEngine()
    with pytest.raises(UsageError) as e:  # the image stage cannot attest a push itself
        build(
            make_plan(lock),
            eng,
            Cache(tmp / "cache"),
            mirrors,
            options=BuildOptions(push="r.example/x:1"),
        )
    assert e.value.reference == "registry-stage-missing" and eng.calls == []
    assert not list((tmp / "cache" / "layers").iterdir())


def test_engine_failure_leaves_no_tag(env):
    lock, mirrors, tmp = env
    eng = RecordingEngine(fail_on="push")
    with pytest.raises(BuildError):
        _build(lock, mirrors, tmp / "cache", engine=eng, push="127.0.0.1:5000/x/y:z")
    assert eng.images == {}


def test_outputs_and_push_happen_before_the_tag(env):
    lock, mirrors, tmp = env
    img, eng, _ = _build(
        lock, mirrors, tmp / "cache", outputs=["oci-archive:/x.tar"], push="127.0.0.1:1/a/b:c"
    )
    verbs = [c[0] for c in eng.calls if c[0] != "image_digest"]
    assert verbs == [
        "copy",
        "push",
        "push",
        "import_image",
    ]  # the image, then its attestations (no key: no .sig)
    att = f"127.0.0.1:1/a/b:{img.digest.replace(':', '-')}.att"
    assert [c[2] for c in eng.calls if c[0] == "push"] == ["127.0.0.1:1/a/b:c", att]
    assert (
        img.pushed == ("127.0.0.1:1/a/b:c",)
        and img.attached == (att,)
        and img.outputs == ("oci-archive:/x.tar",)
    )


def test_oci_output_is_written_by_envspec_and_merges_into_a_layout(env):
    lock, mirrors, tmp = env
    out = tmp / "out"
    a, eng, _ = _build(lock, mirrors, tmp / "cache", outputs=[f"oci:{out}:first"])
    path, sha = helpers.make_wheel(tmp / "wheels", "teampkg", "1.1")
    b, _, _ = _build(
        helpers.with_wheel(lock, "teampkg", version="1.1", filename=path.name, sha256=sha),
        mirrors,
        tmp / "cache",
        outputs=[f"oci:{out}:second"],
    )
    assert not [c for c in eng.calls if c[0] == "copy"]
    index = json.loads((out / "index.json").read_text())
    refs = {
        m["annotations"]["org.opencontainers.image.ref.name"]: m["digest"]
        for m in index["manifests"]
    }
    assert refs == {"first": a.digest, "second": b.digest}
    for lay in a.layers + b.layers:
        assert (out / "blobs" / "sha256" / lay.digest.split(":")[1]).stat().st_size == lay.size


def _layout(tmp, lock, mirrors):
    """Build with a fake engine that keeps a copy of the OCI layout."""
    import shutil

    class Keep(RecordingEngine):
        def import_image(self, oci_dir, ref):
            shutil.copytree(oci_dir, tmp / "layout")
            super().import_image(oci_dir, ref)

    img, _, _ = _build(lock, mirrors, tmp / "cache", engine=Keep())
    return img, tmp / "layout"


def _blob(layout, digest):
    return (layout / "blobs" / "sha256" / digest.split(":")[1]).read_bytes()


def test_layout_config_and_labels(env):
    lock, mirrors, tmp = env
    img, layout = _layout(tmp, lock, mirrors)
    index = json.loads((layout / "index.json").read_text())
    assert (
        index["manifests"][0]["digest"] == img.store_digest
    )  # the store's layout: uncompressed layers
    mbytes = _blob(layout, img.store_digest)
    assert "sha256:" + hashlib.sha256(mbytes).hexdigest() == img.store_digest
    assert mbytes == json.dumps(json.loads(mbytes), sort_keys=True, separators=(",", ":")).encode()
    manifest = json.loads(mbytes)
    assert [lay["mediaType"] for lay in manifest["layers"]] == [
        "application/vnd.oci.image.layer.v1.tar"
    ] * 6
    config = json.loads(_blob(layout, manifest["config"]["digest"]))
    c = config["config"]
    env_ = dict(e.split("=", 1) for e in c["Env"])
    assert env_["PATH"].startswith("/opt/venv/bin:")
    assert env_["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env_["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert env_["NVIDIA_REQUIRE_CUDA"] == "cuda>=13.0,driver>=580.65.06"
    assert env_["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] == "1" and env_["NCCL_DEBUG"] == "WARN"
    assert env_["ENVSPEC_LOCK"] == "/opt/envspec/envspec.lock"
    assert c["WorkingDir"] == "/workspace" and c["User"] == "1000:1000"  # no Debian base: numeric
    assert c["Labels"]["io.envspec.lock-hash"] == lock.meta.content_hash
    assert c["Labels"]["io.envspec.arch-list"] == "sm_80,sm_90,compute_90"
    assert c["Labels"]["io.envspec.driver-floor"] == "580.65.06"
    assert config["created"] == "1970-01-01T00:00:00Z" and config["architecture"] == "amd64"
    assert config["rootfs"]["diff_ids"] == [lay.diff_id for lay in img.layers]
    assert [h["created_by"] for h in config["history"]][1] == "envspec cuda layer"


def test_envspec_layer_carries_lock_sbom_verifier(env):
    lock, mirrors, tmp = env
    img, layout = _layout(tmp, lock, mirrors)
    top = layout / "blobs" / "sha256" / img.layers[-1].diff_id.split(":")[1]
    with tarfile.open(top) as tf:
        names = tf.getnames()
        lock_text = tf.extractfile("opt/envspec/envspec.lock").read().decode()
        sbom = json.loads(tf.extractfile("opt/envspec/sbom.spdx.json").read())
        entry = tf.getmember("opt/envspec/entrypoint.sh")
        entry_text = tf.extractfile(entry).read().decode()
    assert entry.mode == 0o755 and entry_text.startswith("#!/bin/sh\n")
    assert "envspec.verify --startup" in entry_text  # rendered by envspec.services
    assert lock.meta.content_hash in lock_text
    assert "opt/envspec/lib/envspec/verify/__init__.py" in names and "opt/venv/bin/envspec" in names
    assert sbom["spdxVersion"] == "SPDX-2.3"
    listed = {
        (p["name"], p["versionInfo"], p["checksums"][0]["checksumValue"])
        for p in sbom["packages"][1:]
    }
    assert listed == {(w.name, w.version, w.sha256) for w in lock.wheels}


def test_wheel_layer_contents(env):
    lock, mirrors, tmp = env
    img, layout = _layout(tmp, lock, mirrors)
    team = layout / "blobs" / "sha256" / img.layers[4].diff_id.split(":")[1]
    with tarfile.open(team) as tf:
        names = tf.getnames()
        record = (
            tf.extractfile("opt/venv/lib/python3.11/site-packages/teampkg-1.0.dist-info/RECORD")
            .read()
            .decode()
        )
        installer = tf.extractfile(
            "opt/venv/lib/python3.11/site-packages/teampkg-1.0.dist-info/INSTALLER"
        ).read()
    assert "opt/venv/lib/python3.11/site-packages/teampkg/__init__.py" in names
    assert (
        "opt/venv/lib/python3.11/site-packages/teampkg/__pycache__/__init__.cpython-311.pyc"
        in names
    )
    assert "teampkg/__init__.py,sha256=" in record and installer == b"envspec\n"
    assert "teampkg/__pycache__/__init__.cpython-311.pyc,sha256=" in record


def test_entry_point_scripts_get_the_venv_shebang(tmp_path):
    (tmp_path / "w").mkdir()
    path, sha = helpers.make_wheel(
        tmp_path / "w", "tool", "1.0", entry_points="[console_scripts]\ntool = tool:main\n"
    )
    lock = helpers.data(helpers.local_lock(tmp_path, [])[0])
    lock["wheels"] = [
        {
            "name": "tool",
            "version": "1.0",
            "filename": path.name,
            "index": "",
            "sha256": sha,
            "size": 0,
            "group": "team",
            "direct": True,
        }
    ]
    img, layout = _layout(
        tmp_path, helpers.rehash(lock), [sources.Mirror((tmp_path / "w").as_uri(), "links", "t")]
    )
    team = layout / "blobs" / "sha256" / img.layers[1].diff_id.split(":")[1]
    with tarfile.open(team) as tf:
        script = tf.getmember("opt/venv/bin/tool")
        body = tf.extractfile(script).read().decode()
    assert body.startswith("#!/opt/venv/bin/python\n") and script.mode == 0o755


def test_fetch_from_a_simple_index_mirror_by_filename(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    path, sha = helpers.make_wheel(files, "pkg-x", "1.0")
    page = tmp_path / "simple" / "pkg-x"
    page.mkdir(parents=True)
    (page / "index.html").write_text(
        f'<a href="../../files/{path.name}#sha256={sha}">{path.name}</a>'
    )
    f = WheelFetcher(
        Cache(tmp_path / "cache"), [sources.Mirror((tmp_path / "simple").as_uri(), "index", "t")]
    )
    got = f.fetch(
        Wheel(name="pkg-x", version="1.0", filename=path.name, index="", sha256=sha, group="deps")
    )
    assert got.read_bytes() == path.read_bytes() and (
        got == path or got.name == sha
    )  # read in place, or a reflink


def test_nvidia_require_cuda_follows_the_policy():
    lock = helpers.data()
    assert nvidia_require_cuda(make_plan(helpers.rehash(lock))) == "cuda>=13.0,driver>=580.65.06"
    lock["hardware"]["driver_policy"] = "strict"
    lock["torch"]["cuda"] = "12.8"
    assert nvidia_require_cuda(make_plan(helpers.rehash(lock))) == "cuda>=12.8,driver>=580.65.06"
    lock["torch"]["cuda"] = ""
    assert nvidia_require_cuda(make_plan(helpers.rehash(lock))) == ""


def test_host_detection_uses_the_storage_root_and_hard_limits(tmp_path):
    from envspec.run import podman_args

    h = detect_host(
        env={"ENVSPEC_STORAGE_ROOT": str(tmp_path / "s"), "PATH": os.environ.get("PATH", "")},
        ask=ASK_NONE,
    )
    st = h.storage
    assert st.args()[:2] == ["--root", str(tmp_path / "s")]
    assert len(st.runroot) <= 50  # podman's limit
    assert st.ref("a:b").startswith(f"containers-storage:[{st.driver}@{tmp_path / 's'}+")
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1048576 and not h.cap_sys_resource:
        assert (
            f"nofile={hard}:{hard}" in podman_args(h)[1]
        )  # podman's default capped to the hard limit
    assert Storage().ref("x") == "containers-storage:x"


def test_stale_work_dirs_of_dead_builds_are_removed(tmp_path):
    cache = Cache(tmp_path)
    dead = tmp_path / "tmp" / "999999999-abc"
    dead.mkdir()
    live = cache.workdir()
    cache.clean_stale()
    assert not dead.exists() and live.exists()


def test_an_unreachable_index_is_named_in_the_error(tmp_path):
    f = WheelFetcher(Cache(tmp_path / "cache"), [], timeout=5)
    pin = Wheel(
        name="pkg",
        version="1.0",
        filename="pkg-1.0-py3-none-any.whl",
        index="http://127.0.0.1:9/simple",
        sha256="a" * 64,
        group="deps",
    )
    with pytest.raises(SourceError) as e:
        f.fetch(pin)
    assert "pkg-1.0-py3-none-any.whl" in e.value.message and "127.0.0.1:9" in e.value.message
    assert "refused" in e.value.message.lower()


def test_a_damaged_cached_wheel_is_fetched_again(tmp_path):
    (tmp_path / "w").mkdir()
    path, sha = helpers.make_wheel(tmp_path / "w", "pkg", "1.0")
    cache = Cache(tmp_path / "cache")
    cache.blob(sha).write_bytes(b"not the wheel")
    f = WheelFetcher(cache, [sources.Mirror((tmp_path / "w").as_uri(), "links", "t")])
    got = f.fetch_all(
        [Wheel(name="pkg", version="1.0", filename=path.name, index="", sha256=sha, group="deps")]
    )
    assert got[sha].read_bytes() == path.read_bytes()


def _flip(path: Path, at: int) -> None:
    path.chmod(0o644)  # what a stray write by the owner (or by root) needs; then one byte changed
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0xFF]))


def test_a_wheel_from_a_local_mirror_is_copied_read_only_and_heals_without_touching_the_mirror(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(WheelFetcher, "read_in_place", False)  # the copy (reflink or in-kernel)
    (tmp_path / "w").mkdir()
    path, sha = helpers.make_wheel(tmp_path / "w", "pkg", "1.0")
    mirror_bytes = path.read_bytes()
    cache = Cache(tmp_path / "cache")
    warned: list[str] = []
    f = WheelFetcher(
        cache, [sources.Mirror((tmp_path / "w").as_uri(), "links", "t")], on_damaged=warned.append
    )
    pin = Wheel(name="pkg", version="1.0", filename=path.name, index="", sha256=sha, group="deps")
    got = f.fetch(pin)
    assert (
        got == cache.blob(sha)
        and got.stat().st_ino != path.stat().st_ino
        and got.stat().st_nlink == 1
    )
    assert got.stat().st_mode & 0o777 == 0o444
    _flip(got, 10)
    assert path.read_bytes() == mirror_bytes  # the mirror is not damaged with it
    again = WheelFetcher(cache, f.mirrors, on_damaged=warned.append).fetch(pin)
    assert again.read_bytes() == mirror_bytes and again.stat().st_mode & 0o777 == 0o444
    assert len(warned) == 1 and path.name in warned[0] and "fetched again" in warned[0]


def test_a_wheel_from_a_local_mirror_without_reflinks_is_read_where_it_is(tmp_path):
    from envspec.cache.store import reflink
    from envspec.image import layers as layer_makers

    (tmp_path / "w").mkdir()
    path, sha = helpers.make_wheel(tmp_path / "w", "pkg", "1.0")
    if reflink(path, tmp_path / "probe"):
        pytest.skip("this file system has reflinks: the wheel enters the cache as one")
    assert not (tmp_path / "probe").exists()
    cache = Cache(tmp_path / "cache")
    f = WheelFetcher(cache, [sources.Mirror((tmp_path / "w").as_uri(), "links", "t")])
    got = f.fetch(
        Wheel(name="pkg", version="1.0", filename=path.name, index="", sha256=sha, group="deps")
    )
    assert got == path and not cache.has_blob(sha) and list((cache.root / "tmp").iterdir()) == []
    assert path.stat().st_mode & 0o777 == 0o644  # nothing of the mirror's changed
    ident = f.in_place[sha]
    out = layer_makers.make_wheel_layer(
        [(path.name, str(path), ident)], helpers.load().platform, tmp_path / "a.tar"
    )
    assert out.size > 0  # unchanged: made
    _flip(path, 10)  # the mirror's file written after its hash was checked: the maker refuses it
    with pytest.raises(HashMismatch, match="changed after its sha256 was checked"):
        layer_makers.make_wheel_layer(
            [(path.name, str(path), ident)], helpers.load().platform, tmp_path / "b.tar"
        )


def test_no_source_with_the_locked_bytes_names_every_source_tried(tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    path, sha = helpers.make_wheel(tmp_path / "a", "pkg", "1.0")
    (tmp_path / "b" / path.name).write_bytes(b"other bytes")
    path.write_bytes(b"changed bytes")
    mirrors = [sources.Mirror((tmp_path / d).as_uri(), "links", d) for d in ("a", "b")]
    pin = Wheel(name="pkg", version="1.0", filename=path.name, index="", sha256=sha, group="deps")
    with pytest.raises(HashMismatch) as e:
        WheelFetcher(Cache(tmp_path / "cache"), mirrors).fetch(pin)
    msg = e.value.message
    assert sha in msg and (tmp_path / "a").as_uri() in msg and (tmp_path / "b").as_uri() in msg
    assert (
        hashlib.sha256(b"changed bytes").hexdigest() in msg
        and hashlib.sha256(b"other bytes").hexdigest() in msg
    )


def test_installed_record_matches_every_file_written_rewritten_script_included(tmp_path):
    from envspec.image import layers as layer_makers

    big = os.urandom(300_000) + b"\0" * 3_000_000  # several inflate chunks, one highly compressible
    script = (
        b"#!python\nprint('hi')\n"  # installer rewrites this shebang: its RECORD hash must be new
    )
    (tmp_path / "w").mkdir()
    path, sha = helpers.make_wheel(
        tmp_path / "w",
        "recpkg",
        "1.0",
        files={
            "recpkg/__init__.py": b"",
            "recpkg/blob.bin": big,
            "recpkg-1.0.data/scripts/hello": script,
        },
    )
    lock = helpers.data(helpers.local_lock(tmp_path, [])[0])
    lock["wheels"] = [
        {
            "name": "recpkg",
            "version": "1.0",
            "filename": path.name,
            "index": "",
            "sha256": sha,
            "size": 0,
            "group": "team",
            "direct": True,
        }
    ]
    img, layout = _layout(
        tmp_path, helpers.rehash(lock), [sources.Mirror((tmp_path / "w").as_uri(), "links", "t")]
    )
    team = layout / "blobs" / "sha256" / img.layers[1].diff_id.split(":")[1]
    site = "opt/venv/lib/python3.11/site-packages/"
    with tarfile.open(team) as tf:
        record = tf.extractfile(site + "recpkg-1.0.dist-info/RECORD").read().decode()
        rows = [ln.split(",") for ln in record.splitlines() if ln]
        for p, h, size in rows:
            if not h:
                continue
            member = tf.getmember(os.path.normpath(site + p))
            data = tf.extractfile(member).read()
            assert h == helpers._rec(data) and int(size) == len(data), p
        assert tf.extractfile(site + "recpkg/blob.bin").read() == big
        hello = tf.extractfile("opt/venv/bin/hello").read()
    assert hello.startswith(b"#!/opt/venv/bin/python") and hello != script
    assert any(p.endswith("bin/hello") for p, _, _ in rows)
    import zipfile

    deflated = tmp_path / "deflated.zip"  # a deflated member is inflated by ISA-L, not zlib
    with zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("blob.bin", big)
    with zipfile.ZipFile(deflated) as zf:
        stream = layer_makers._open_member(zf, zf.getinfo("blob.bin"))
        assert type(stream._decompressor).__module__ == "isal_zlib" and stream.read() == big


def test_dry_run_goes_through_the_recording_engine_and_does_nothing(env):
    lock, mirrors, tmp = env
    plan = make_plan(lock)
    cache = Cache(tmp / "cache")
    before = preview(
        plan,
        cache,
        options=BuildOptions(
            push="127.0.0.1:1/a/b:c", outputs=("oci-archive:/x.tar",), registry=Registry()
        ),
    )
    keyed = keyed_top(plan, envspec_layer_inputs(plan, None, None))
    assert [(r.layer.group, r.layer.key, r.cached) for r in before.layers] == [
        (lay.group, lay.key, False) for lay in keyed.layers
    ]
    assert keyed.layers[-1].cacheable and not plan.layers[-1].cacheable
    assert before.image == plan.tag and before.fetch.wheels == len(lock.wheels)
    assert [c[0] for c in before.engine] == ["copy", "push", "push", "import_image"]
    assert before.engine[2][2] == "127.0.0.1:1/a/b:sha256-(digest).att"
    assert before.to_json()["engine"][2] == list(before.engine[2])  # --json: the same, as lists
    assert not list((tmp / "cache" / "layers").iterdir()) and not cache.has_blob(
        lock.wheels[0].sha256
    )
    _build(lock, mirrors, tmp / "cache")
    after = preview(plan, cache)
    assert [r.cached for r in after.layers] == [True] * 6  # the envspec layer too
    assert after.to_json()["fetch"] == {"wheels": 0, "wheel_bytes": 0, "debs": 0, "deb_bytes": 0}
    assert after.engine == (("import_image", "(oci layout)", plan.tag),)


def test_progress_events_come_as_the_work_happens(env):
    lock, mirrors, tmp = env

    class Timeline(Reporter):
        def __init__(self):
            self.events = []

        def fetching(self, name, filename, size):
            self.events.append(("fetching", name))

        def fetched(self, name, filename, path):
            self.events.append(("fetched", name))

        def layer_started(self, group, pins, cached):
            self.events.append(("started", group))

        def layer_built(self, layer):
            self.events.append(("built", layer.group))

    rep = Timeline()
    build(make_plan(lock), RecordingEngine(), Cache(tmp / "cache"), mirrors, reporter=rep)
    ev = rep.events
    for w in lock.wheels:  # each wheel: its own start and end, before its layer is made
        assert (
            ev.index(("fetching", w.name))
            < ev.index(("fetched", w.name))
            < ev.index(("built", w.group))
        )
    assert [e[1] for e in ev if e[0] == "built"][-1] == "envspec"
    assert sorted(e[1] for e in ev if e[0] == "built") == sorted(
        lay.group for lay in make_plan(lock).layers
    )


def test_each_deb_is_one_fetching_event_however_many_mirrors_are_tried(tmp_path):
    from envspec.debian.models import DebPin
    from envspec.image.making import _DebEvents

    class Rec(Reporter):
        def __init__(self):
            self.events = []

        def fetching(self, name, filename, size):
            self.events.append(("fetching", name, size))

        def fetched(self, name, filename, path):
            self.events.append(("fetched", name))

    pin = DebPin(
        name="tzdata",
        version="2025b-0+deb12u1",
        architecture="all",
        size=7,
        filename="pool/main/t/tzdata/tzdata_2025b-0+deb12u1_all.deb",
        sha256="a" * 64,
        suite="bookworm",
    )
    cached = pin.model_copy(update={"name": "bash", "sha256": "b" * 64})
    rep = Rec()
    events = _DebEvents(rep)
    events.fetching(pin, "http://mirror-a/x")  # the first mirror fails ...
    events.fetching(pin, "http://mirror-b/x")  # ... the second serves it
    events.fetched(pin, tmp_path / "x", False)
    events.fetched(cached, tmp_path / "y", True)  # in the cache already: no download, no event
    assert rep.events == [("fetching", "tzdata", 7), ("fetched", "tzdata")]


def test_docker_archive_output_carries_the_image_name():
    from envspec.image import docker_archive_named

    tag = "localhost/envspec/cpu:4d31fdd8ed3c"
    assert (
        docker_archive_named("docker-archive:/tmp/cpu.tar", tag)
        == f"docker-archive:/tmp/cpu.tar:{tag}"
    )
    assert (
        docker_archive_named("docker-archive:/tmp/cpu.tar:acme/cpu:1", tag)
        == "docker-archive:/tmp/cpu.tar:acme/cpu:1"
    )
    assert docker_archive_named("oci-archive:/tmp/cpu.tar", tag) == "oci-archive:/tmp/cpu.tar"
    assert docker_archive_named("docker-archive:/tmp/cpu.tar", "") == "docker-archive:/tmp/cpu.tar"


def test_phases_say_what_the_build_spent_its_time_on_as_each_ends(env):
    lock, mirrors, tmp = env

    class Phases(Reporter):
        def __init__(self):
            self.phases = []

        def phase(self, phase):
            self.phases.append(phase)

    rep = Phases()
    img = build(make_plan(lock), RecordingEngine(), Cache(tmp / "cache"), mirrors, reporter=rep)
    names = [p.name for p in img.phases]
    made = [f"layer {lay.group}" for lay in img.layers]
    assert set(made) <= set(names) and {"fetch", "layout", "deliver", "commit"} <= set(names)
    assert list(img.phases) == rep.phases  # each sent to the reporter as it ended
    for p in img.phases:
        assert 0 <= p.start <= p.end <= img.seconds, p
    at = {p.name: p for p in img.phases}
    assert at["fetch"].end <= min(at[m].start for m in made if m != "layer base")  # wheels first
    assert max(at[m].end for m in made) <= at["layout"].start <= at["commit"].start
    j = img.to_json()
    assert j["seconds"] == round(img.seconds, 3) and [p["name"] for p in j["phases"]] == names
    assert all(set(p) == {"name", "start_s", "end_s", "s"} for p in j["phases"])

    again = build(make_plan(lock), RecordingEngine(), Cache(tmp / "cache"), mirrors)
    # every layer cached, the envspec layer too
    assert [p.name for p in again.phases if p.name.startswith("layer ")] == []


def test_a_damaged_cached_layer_is_dropped_and_the_build_runs_again_once(tmp_path, monkeypatch):
    import envspec.image.builder as image_mod
    from envspec.errors import DamagedEntry

    cache = Cache(tmp_path / "cache")
    hexkey = "ab" * 32
    tar, meta = cache.layer_tar(hexkey), cache.layer_meta(hexkey)
    blob = cache.root / "layers" / f"{hexkey}.zstd-1.tar.zst"
    outside = tmp_path / "outside.tar"
    outside.write_bytes(b"not the cache's")
    runs: list[int] = []

    def damaged(*a, **kw):
        runs.append(1)
        for p in (tar, meta, blob):
            p.write_bytes(b"x")
        raise DamagedEntry(f"the cached layer file {tar} is not sha256:...", paths=(tar,))

    class Said(image_mod.Reporter):
        said: list[str] = []

        def warning(self, message: str) -> None:
            self.said.append(message)

    monkeypatch.setattr(image_mod, "_build", damaged)
    with pytest.raises(
        DamagedEntry
    ):  # damaged again once made again: the second time stops the build
        image_mod.build(None, None, cache, [], reporter=Said())
    assert len(runs) == 2 and len(Said.said) == 1 and "made again" in Said.said[0]

    def once(*a, **kw):
        runs.append(1)
        if len(runs) == 3:
            raise DamagedEntry("damaged", paths=(tar,))
        assert (
            not tar.exists() and not meta.exists() and not blob.exists()
        )  # dropped, compressed blob too
        return "built"

    monkeypatch.setattr(image_mod, "_build", once)
    assert image_mod.build(None, None, cache, []) == "built" and len(runs) == 4

    def elsewhere(*a, **kw):  # not a layer of this cache: nothing is removed, the error stands
        raise DamagedEntry("damaged", paths=(outside,))

    monkeypatch.setattr(image_mod, "_build", elsewhere)
    with pytest.raises(DamagedEntry):
        image_mod.build(None, None, cache, [])
    assert outside.exists()


def test_a_read_only_entry_refuses_a_write_by_its_owner(tmp_path):
    import subprocess

    (tmp_path / "w").mkdir()
    path, sha = helpers.make_wheel(tmp_path / "w", "pkg", "1.0")
    f = WheelFetcher(
        Cache(tmp_path / "cache"), [sources.Mirror((tmp_path / "w").as_uri(), "links", "t")]
    )
    f.read_in_place = False  # an entry of the cache, not the mirror's file
    entry = f.fetch(
        Wheel(name="pkg", version="1.0", filename=path.name, index="", sha256=sha, group="deps")
    )
    assert entry.parent == Cache(tmp_path / "cache").blob(sha).parent
    # the write is tried by the entry's owner, not root (whom no mode stops): through an O_PATH
    # descriptor, so only the entry's own mode decides, not the directories above it
    fd = os.open(entry, os.O_PATH)
    try:
        owner = 65534 if os.geteuid() == 0 else os.geteuid()
        if os.geteuid() == 0:
            os.chown(entry, owner, owner)
        probe = (
            "import sys\ntry:\n    open(f'/proc/self/fd/{sys.argv[1]}', 'r+b')\nexcept PermissionError:\n"
            "    sys.exit(13)\n"
        )
        kw = {"user": owner, "group": owner, "extra_groups": []} if os.geteuid() == 0 else {}
        python = (
            "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        )  # one nobody can run
        ro = subprocess.run([python, "-c", probe, str(fd)], pass_fds=(fd,), cwd="/", **kw)
        entry.chmod(0o644)  # the same write on a writable entry goes through: the probe can tell
        rw = subprocess.run([python, "-c", probe, str(fd)], pass_fds=(fd,), cwd="/", **kw)
    finally:
        os.close(fd)
    assert (ro.returncode, rw.returncode) == (13, 0)


def test_the_envspec_layer_is_keyed_by_what_it_is_made_of(env):
    """Issue 59, point 3: the envspec layer is cacheable (a node that pulls every layer from a
    registry cache makes none), so its key follows each input besides the lock: the verifier's
    sources, envspec's own, the authorized-keys file."""
    lock, _mirrors, tmp = env
    plan = make_plan(lock)
    here = envspec_layer_inputs(plan, None, None)
    assert here == envspec_layer_inputs(plan, None, None) and len(here) == 64
    verify = tmp / "verify"
    verify.mkdir()
    (verify / "__main__.py").write_text("print('a')\n")
    a = envspec_layer_inputs(plan, None, verify)
    (verify / "__main__.py").write_text("print('b')\n")
    assert len({here, a, envspec_layer_inputs(plan, None, verify)}) == 3
    keyed = keyed_top(plan, a)
    assert [lay.key for lay in keyed.layers[:-1]] == [lay.key for lay in plan.layers[:-1]]
    assert keyed.layers[-1].cacheable and keyed.layers[-1].key != plan.layers[-1].key
    assert keyed_top(plan, "") is plan  # no inputs: made every build, as before

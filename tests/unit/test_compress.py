"""image/compress.py and compressed builds: the blobs decompress to the layer tars, are the same
on every run and for any number of threads, and the cache keeps them per compressor."""

import gzip
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data" / "build"))
import helpers  # noqa: E402

from envspec import sources  # noqa: E402
from envspec.cache.store import Cache  # noqa: E402
from envspec.errors import BuildError  # noqa: E402
from envspec.image import BuildOptions, RecordingEngine, build, compress  # noqa: E402
from envspec.image.compress import Compression, compress_file  # noqa: E402
from envspec.image.layers import envspec_layer_inputs  # noqa: E402
from envspec.image.tarball import TarWriter  # noqa: E402
from envspec.plan import keyed_top, make_plan  # noqa: E402
from envspec.registry.stage import Registry  # noqa: E402

WHEELS = [("cudalib", "1.0", "cuda"), ("torchish", "2.0", "torch"), ("teampkg", "1.0", "team")]


def _decompress(name, data):
    if name == "gzip":
        return gzip.decompress(data)
    return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()


def _tar(path, comp, payload):
    """A tar of a few files, some larger than a gzip block, written with ``comp``."""
    with TarWriter(path, compression=comp) as w:
        for i, chunk in enumerate(payload):
            w.add_file(f"/data/f{i}", None, len(chunk), data=chunk)
        return w.close()


def _payload():
    rnd = hashlib.sha256()
    parts = []
    for i in range(5):  # text-like, random-like, zeros: 0.2 to 3 MB each
        rnd.update(str(i).encode())
        seed = rnd.digest()
        parts.append((b"line %d of some text\n" % i) * (20000 * (i + 1)))
        parts.append(
            b"".join(
                hashlib.sha256(seed + j.to_bytes(4, "big")).digest() for j in range(8000 * i + 1)
            )
        )
        parts.append(b"\0" * (300000 * i))
    return parts


@pytest.mark.parametrize("name", ["zstd", "gzip"])
def test_blob_decompresses_to_the_tar_and_is_hashed_as_written(tmp_path, name):
    comp = Compression(name)
    res = _tar(tmp_path / "l.tar", comp, _payload())
    blob = (tmp_path / ("l.tar" + comp.suffix)).read_bytes()
    assert res.blob_path == tmp_path / ("l.tar" + comp.suffix)
    assert res.blob_digest == "sha256:" + hashlib.sha256(blob).hexdigest() and res.blob_size == len(
        blob
    )
    tar = (tmp_path / "l.tar").read_bytes()
    assert _decompress(name, blob) == tar and len(blob) < len(tar) / 2
    assert res.diff_id == "sha256:" + hashlib.sha256(tar).hexdigest()
    with tarfile.open(fileobj=io.BytesIO(_decompress(name, blob))) as tf:
        assert len(tf.getnames()) == res.entries


@pytest.mark.parametrize("name", ["zstd", "gzip"])
def test_same_bytes_on_every_run_and_for_any_number_of_threads(tmp_path, monkeypatch, name):
    comp = Compression(name)
    digests = set()
    for n in (1, 2, 3, 8):
        monkeypatch.setattr(compress, "threads", lambda n=n: n)
        for run in range(2):
            digests.add(_tar(tmp_path / f"{n}-{run}.tar", comp, _payload()).blob_digest)
    assert len(digests) == 1


def test_gzip_header_has_no_name_and_no_time(tmp_path):
    _tar(tmp_path / "l.tar", Compression("gzip"), [b"x" * 10])
    head = (tmp_path / "l.tar.gz").read_bytes()[:10]
    assert head[:4] == b"\x1f\x8b\x08\x00" and head[4:8] == b"\0\0\0\0"  # no FNAME flag, mtime 0


def test_compress_file_equals_compressing_while_writing(tmp_path):
    for name in ("zstd", "gzip"):
        comp = Compression(name)
        res = _tar(tmp_path / f"{name}.tar", comp, _payload())
        assert compress_file(tmp_path / f"{name}.tar", tmp_path / f"again{comp.suffix}", comp) == (
            res.blob_digest,
            res.blob_size,
        )


def test_ids_name_the_compressor_version_and_level():
    assert Compression("zstd").id == "zstd-" + ".".join(map(str, zstandard.ZSTD_VERSION)) + "-3"
    assert Compression("gzip").id.startswith("gzip-zlib") and Compression("gzip").id.endswith("-6")
    assert Compression("zstd").media_type == "application/vnd.oci.image.layer.v1.tar+zstd"
    assert Compression("none").media_type == "application/vnd.oci.image.layer.v1.tar"
    with pytest.raises(BuildError):
        compress.compression("xz")


@pytest.fixture
def env(tmp_path):
    lock, mirror = helpers.local_lock(tmp_path, WHEELS)
    return lock, [sources.Mirror(mirror.as_uri(), "links", "test")], tmp_path


def _build(lock, mirrors, cache, **kw):
    return build(
        make_plan(lock), RecordingEngine(), Cache(cache), mirrors, options=BuildOptions(**kw)
    )


@pytest.mark.parametrize("name", ["zstd", "gzip"])
def test_oci_output_carries_the_compressed_blobs(env, name):
    lock, mirrors, tmp = env
    out = tmp / "out"
    img = _build(lock, mirrors, tmp / "cache", outputs=(f"oci:{out}",), compression=name)
    index = json.loads((out / "index.json").read_text())
    assert index["manifests"][0]["digest"] == img.digest
    manifest = json.loads((out / "blobs" / "sha256" / img.digest.split(":")[1]).read_bytes())
    assert [m["mediaType"] for m in manifest["layers"]] == [
        f"application/vnd.oci.image.layer.v1.tar+{name}"
    ] * 5
    assert [m["digest"] for m in manifest["layers"]] == [lay.digest for lay in img.layers]
    config = json.loads(
        (out / "blobs" / "sha256" / manifest["config"]["digest"].split(":")[1]).read_bytes()
    )
    assert config["rootfs"]["diff_ids"] == [lay.diff_id for lay in img.layers]
    for lay in img.layers:
        blob = (out / "blobs" / "sha256" / lay.digest.split(":")[1]).read_bytes()
        assert len(blob) == lay.size
        assert "sha256:" + hashlib.sha256(_decompress(name, blob)).hexdigest() == lay.diff_id


def test_two_caches_same_compressed_digest_and_a_rebuild_does_not_recompress(env, monkeypatch):
    lock, mirrors, tmp = env
    a = _build(lock, mirrors, tmp / "c1", no_cache=True, compress=True)
    b = _build(lock, mirrors, tmp / "c2", no_cache=True, compress=True)
    assert a.digest == b.digest and [lay.digest for lay in a.layers] == [
        lay.digest for lay in b.layers
    ]
    blobs = sorted((tmp / "c1" / "layers").glob("*.tar.zst"))
    assert len(blobs) == 5  # every layer, the envspec one too (keyed by its inputs)
    before = {p: p.stat().st_ino for p in blobs}
    calls = []
    monkeypatch.setattr("envspec.image.making.compress_file", lambda *a: calls.append(a))
    again = _build(lock, mirrors, tmp / "c1", compress=True)
    assert again.digest == a.digest and not calls
    assert {p: p.stat().st_ino for p in blobs} == before


def test_a_layer_cached_without_this_compressor_is_compressed_once(env):
    lock, mirrors, tmp = env
    plain = _build(lock, mirrors, tmp / "cache", compression="none")
    assert not list((tmp / "cache" / "layers").glob("*.tar.*"))
    gz = _build(lock, mirrors, tmp / "cache", compression="gzip", compress=True)
    assert all(lay.cached for lay in gz.layers[:-1]) and gz.store_digest == plain.store_digest
    assert len(list((tmp / "cache" / "layers").glob("*.tar.gz"))) == 5
    fresh = _build(lock, mirrors, tmp / "other", compression="gzip", no_cache=True, compress=True)
    assert fresh.digest == gz.digest  # compressed after the fact or while made: the same bytes
    metas = [json.loads(p.read_text()) for p in (tmp / "cache" / "layers").glob("*.gzip-*.json")]
    assert {m["compressor"] for m in metas} == {Compression("gzip").id}


def test_dry_run_says_the_compression(env):
    from envspec.image import preview

    lock, mirrors, tmp = env
    summary = preview(
        make_plan(lock),
        Cache(tmp / "cache"),
        options=BuildOptions(compression="gzip", compress=True),
    )
    assert summary.compression == "gzip"
    local = preview(make_plan(lock), Cache(tmp / "cache"), options=BuildOptions(compression="gzip"))
    assert (local.compression, local.carried_compression) == (
        "none",
        "gzip",
    )  # nothing carries it
    pushed = preview(
        make_plan(lock),
        Cache(tmp / "cache"),
        options=BuildOptions(compression="gzip", push="r.example/x:1", registry=Registry()),
    )
    assert pushed.compression == "gzip"


@pytest.mark.parametrize(
    "kw, now",
    [
        ({}, False),  # a local build: the store keeps the tars
        ({"outputs": ("docker-archive:/tmp/x.tar",)}, False),  # a docker archive carries tars
        ({"outputs": ("oci:/tmp/x",)}, True),
        ({"outputs": ("docker-archive:/tmp/x.tar", "oci-archive:/tmp/x.tar")}, True),
        ({"push": "r.example/x:1"}, True),
        ({"cache_to": "r.example/cache"}, True),
        ({"cache_from": "r.example/cache"}, False),  # its entries' blobs are kept, not made
        ({"compress": True}, True),
        ({"compress": False, "push": "r.example/x:1"}, False),
    ],
)
def test_compress_now_only_where_something_carries_the_layers(kw, now):
    from envspec.image import compress_now

    assert compress_now(BuildOptions(**kw)) is now


def test_a_local_build_keeps_its_layers_uncompressed_and_a_push_of_it_compresses_them_once(
    env, monkeypatch
):
    lock, mirrors, tmp = env
    local = _build(lock, mirrors, tmp / "cache")
    assert (local.compression, local.carried_compression) == (
        "none",
        "zstd",
    ) and local.digest == local.store_digest
    assert all(lay.digest == lay.diff_id and lay.size == lay.diff_size for lay in local.layers)
    assert not list((tmp / "cache" / "layers").glob("*.tar.*"))  # no compressed blob made
    out = tmp / "out"
    carried = _build(lock, mirrors, tmp / "cache", outputs=(f"oci:{out}",))
    assert (
        carried.compression == "zstd"
        and carried.store_digest == local.store_digest != carried.digest
    )
    assert carried.config_digest == local.config_digest  # one image ID, whichever form
    fresh = _build(lock, mirrors, tmp / "other", no_cache=True, compress=True)
    assert fresh.digest == carried.digest  # compressed after the fact or while made: the same bytes


def test_compress_layers_makes_the_blobs_a_later_push_takes_and_each_layer_once(env, monkeypatch):
    import threading

    from envspec.image import compress_layers

    lock, mirrors, tmp = env
    local = _build(lock, mirrors, tmp / "cache")
    assert not list((tmp / "cache" / "layers").glob("*.tar.zst"))
    made: list = []
    threads = [
        threading.Thread(
            target=lambda: made.extend(
                compress_layers(make_plan(lock), Cache(tmp / "cache"), Compression("zstd"))
            )
        )
        for _ in range(2)
    ]  # two at once (a background one and `cache compress`): each layer once
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cacheable = [lay for lay in local.layers if lay.group != "envspec"]
    assert sorted(lay.group for lay in made) == sorted(lay.group for lay in cacheable)
    assert len(list((tmp / "cache" / "layers").glob("*.tar.zst"))) == len(cacheable)
    assert (
        compress_layers(make_plan(lock), Cache(tmp / "cache"), Compression("zstd")) == []
    )  # nothing left
    calls = []
    real = compress.compress_file
    monkeypatch.setattr(
        "envspec.image.making.compress_file",
        lambda *a, **k: calls.append(Path(a[0]).name) or real(*a, **k),
    )
    out = tmp / "out"
    carried = _build(lock, mirrors, tmp / "cache", outputs=(f"oci:{out}",))
    # every cached layer's blob was there but the envspec layer's (``compress_layers`` is given
    # no spec to key it by its inputs: it compresses what ``make_plan`` keys), 10 kB
    top = keyed_top(make_plan(lock), envspec_layer_inputs(make_plan(lock), None, None))
    assert calls == [Cache(tmp / "cache").layer_tar(top.layers[-1].key).name]
    fresh = _build(lock, mirrors, tmp / "other", no_cache=True, compress=True)
    assert carried.digest == fresh.digest
    assert {lay.group: lay.digest for lay in made} == {
        lay.group: lay.digest for lay in fresh.layers if lay.group != "envspec"
    }

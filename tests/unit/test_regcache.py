"""The registry layer cache (registry/regcache.py): the entry format, its checks, and build() with
--cache-from/--cache-to against an in-memory registry (the fake serves whatever bytes it holds,
checking nothing: the checks are envspec's). The real registry: tests/e2e/test_registry_cache_e2e.py."""

import gzip
import hashlib
import json
import sys
from pathlib import Path

import pytest
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data" / "build"))
import helpers  # noqa: E402

from envspec import sources  # noqa: E402
from envspec.cache.store import Cache  # noqa: E402
from envspec.errors import RegistryError, SourceError, UsageError  # noqa: E402
from envspec.image import BuildOptions, RecordingEngine, Reporter, build  # noqa: E402
from envspec.image.compress import Compression  # noqa: E402
from envspec.image.records import LayerRecord
from envspec.plan import make_plan  # noqa: E402
from envspec.registry.regcache import (
    ARTIFACT_TYPE,
    BadEntry,
    EntryFacts,
    RegistryCache,
    check_entry,
    entry_manifest,
    parse_ref,  # noqa: E402
    tag_for,
    unpack,
    write_entry,
)

KEY = "sha256:" + "ab" * 32
WHEELS = [("torchish", "2.0", "torch"), ("depa", "0.1", "deps"), ("teampkg", "1.0", "team")]


def sha(b: bytes) -> str:
    return "sha256:" + hashlib.sha256(b).hexdigest()


def _compress(tar: bytes, name: str) -> bytes:
    return {
        "zstd": lambda: zstandard.ZstdCompressor().compress(tar),
        "gzip": lambda: gzip.compress(tar),
        "none": lambda: tar,
    }[name]()


def _entry(tar: bytes, name: str = "zstd", **over):
    comp = Compression(name)
    blob = _compress(tar, name)
    fields = dict(
        key=KEY,
        group="deps",
        comp_id=comp.id,
        media_type=comp.media_type,
        digest=sha(blob),
        size=len(blob),
        diff_id=sha(tar),
        diff_size=len(tar),
        record=LayerRecord(diff_id=sha(tar), size=len(tar), entries=3, pins=["a==1"]),
    )
    fields.update(over)
    _config, manifest = entry_manifest(EntryFacts(**fields))
    return blob, manifest, comp


# --- the entry format --------------------------------------------------------------------------


def test_an_entry_round_trips_and_is_the_same_bytes_everywhere():
    tar = b"tar bytes " * 1000
    blob, manifest, comp = _entry(tar)
    assert _entry(tar)[1] == manifest  # canonical: every machine writes the same entry
    m = json.loads(manifest)
    assert m["artifactType"] == ARTIFACT_TYPE and len(m["layers"]) == 1
    assert m["layers"][0] == {"mediaType": comp.media_type, "digest": sha(blob), "size": len(blob)}
    e = check_entry(manifest, ref="r:t", key=KEY, comp=comp)
    assert (e.digest, e.diff_id, e.diff_size, e.compressor) == (
        sha(blob),
        sha(tar),
        len(tar),
        comp.id,
    )
    assert e.local_record("deps") == LayerRecord(
        key=KEY, group="deps", diff_id=sha(tar), size=len(tar), entries=3, pins=["a==1"]
    )


@pytest.mark.parametrize(
    "change, says",
    [
        (
            lambda m: m.update(artifactType="application/x-other"),
            "not an envspec layer-cache entry",
        ),
        (
            lambda m: m["annotations"].update({"dev.envspec.cache.key": "sha256:" + "cd" * 32}),
            "entry of key",
        ),
        (lambda m: m["layers"].append(m["layers"][0]), "2 layers"),
        (
            lambda m: m["layers"][0].update(
                mediaType="application/vnd.oci.image.layer.v1.tar+gzip"
            ),
            "its blob is",
        ),
        (lambda m: m["layers"][0].update(digest="md5:xyz"), "not a sha256 digest"),
        (lambda m: m["annotations"].pop("dev.envspec.cache.diff-size"), "cannot be read"),
    ],
)
def test_an_entry_that_is_not_ours_or_not_for_this_key_is_refused(change, says):
    _blob, manifest, comp = _entry(b"x" * 100)
    m = json.loads(manifest)
    change(m)
    with pytest.raises(BadEntry, match=says):
        check_entry(json.dumps(m).encode(), ref="r:t", key=KEY, comp=comp)
    with pytest.raises(BadEntry, match="cannot be read"):
        check_entry(b"not json", ref="r:t", key=KEY, comp=comp)


@pytest.mark.parametrize("name", ["zstd", "gzip", "none"])
def test_unpack_checks_the_blob_and_the_diff_id(tmp_path, name):
    tar = bytes(range(256)) * 4000
    blob, manifest, comp = _entry(tar, name)
    entry = check_entry(manifest, ref="r:t", key=KEY, comp=comp)
    (tmp_path / "blob").write_bytes(blob)
    unpack(tmp_path / "blob", tmp_path / "out.tar", entry, comp)
    assert (tmp_path / "out.tar").read_bytes() == tar

    bad = bytearray(blob)
    bad[-10] ^= 0xFF  # damaged bytes: the digest (or the stream) says so; no tar is left
    (tmp_path / "blob").write_bytes(bytes(bad))
    with pytest.raises(BadEntry, match="blob"):
        unpack(tmp_path / "blob", tmp_path / "out2.tar", entry, comp)
    assert not (tmp_path / "out2.tar").exists()


def test_unpack_refuses_an_entry_that_lies_about_its_diff_id(tmp_path):
    tar = b"the real layer" * 500
    other = (
        b"another layer!" * 500
    )  # same size, other bytes: a self-consistent blob of the wrong layer
    blob, manifest, comp = _entry(other, diff_id=sha(tar))
    entry = check_entry(manifest, ref="r:t", key=KEY, comp=comp)
    (tmp_path / "blob").write_bytes(blob)
    with pytest.raises(
        BadEntry, match=f"decompresses to {sha(other)}.*not to the layer's diff_id {sha(tar)}"
    ):
        unpack(tmp_path / "blob", tmp_path / "out.tar", entry, comp)
    assert not (tmp_path / "out.tar").exists()
    blob, manifest, comp = _entry(tar, diff_size=10)  # more bytes than recorded: stops early
    (tmp_path / "blob").write_bytes(blob)
    with pytest.raises(BadEntry, match="more than the 10 bytes"):
        unpack(
            tmp_path / "blob",
            tmp_path / "out.tar",
            check_entry(manifest, ref="r:t", key=KEY, comp=comp),
            comp,
        )


def test_cache_refs_and_tags():
    assert parse_ref("127.0.0.1:5000/team/cache", "--cache-from") == "127.0.0.1:5000/team/cache"
    assert parse_ref("docker://registry.example.com/a/b-c", "x") == "registry.example.com/a/b-c"
    assert parse_ref("localhost/cache", "x") == "localhost/cache"
    for bad in (
        "team/cache",
        "127.0.0.1:5000/cache:latest",
        "127.0.0.1:5000/cache@sha256:" + "0" * 64,
        "127.0.0.1:5000/Cache",
        "127.0.0.1:5000",
        "",
        "a b/c",
    ):
        with pytest.raises(UsageError) as e:
            parse_ref(bad, "ENVSPEC_CACHE_FROM")
        assert e.value.reference == "cache-ref-invalid" and "ENVSPEC_CACHE_FROM" in e.value.message
    tag = tag_for(KEY, Compression("zstd"))
    assert tag == "layer-" + "ab" * 32 + "-zstd" and len(tag) <= 128


# --- build() with a registry cache --------------------------------------------------------------


class FakeRegistry:
    """Manifests by REPO:TAG, blobs by digest, as pushed; serves them back unchecked."""

    def __init__(self):
        self.tags: dict[str, bytes] = {}
        self.blobs: dict[str, bytes] = {}
        self.down = False
        self.refuse_push = False

    def manifest(self, ref):
        if self.down:
            raise SourceError(
                "the registry 127.0.0.1:9 could not be reached", reference="registry-unreachable"
            )
        return self.tags.get(ref)

    def copy_to(self, ref, dest, tmpdir):
        repo, _, digest = ref.partition("@")
        found = [m for r, m in self.tags.items() if r.startswith(repo + ":") and sha(m) == digest]
        if not found:
            return False
        out = dest / "blobs" / "sha256"
        out.mkdir(parents=True)
        m = json.loads(found[0])
        for d in [m["config"]["digest"]] + [lay["digest"] for lay in m["layers"]]:
            (out / d.split(":")[1]).write_bytes(self.blobs[d])
        (out / digest.split(":")[1]).write_bytes(found[0])
        return True

    def push(self, layout: Path, ref: str):
        if self.refuse_push:
            raise RegistryError(
                f"push to {ref}: the registry refused the credentials",
                registry="r",
                reference="registry-auth-failed",
            )
        digest = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
        for f in (layout / "blobs" / "sha256").iterdir():
            self.blobs["sha256:" + f.name] = f.read_bytes()
        self.tags[ref] = self.blobs[digest]


class Warnings(Reporter):
    def __init__(self):
        self.warnings = []

    def warning(self, message):
        self.warnings.append(message)


REF = "127.0.0.1:5000/team/cache"


@pytest.fixture
def env(tmp_path):
    lock, mirror = helpers.local_lock(tmp_path, WHEELS)
    return lock, [sources.Mirror(mirror.as_uri(), "links", "test")], tmp_path


def _build(env, reg, machine, *, cache_from="", cache_to="", **kw):
    lock, mirrors, tmp = env
    rep = Warnings()
    rc = RegistryCache(cache_from, cache_to, reg, reg.push)
    img = build(
        make_plan(lock),
        RecordingEngine(),
        Cache(tmp / machine),
        mirrors,
        reporter=rep,
        registry_cache=rc,
        options=BuildOptions(cache_from=cache_from, cache_to=cache_to, **kw),
    )
    return img, rep.warnings


def _sources(img):
    return {lay.group: lay.source for lay in img.layers}


def test_a_second_machine_takes_every_layer_from_the_registry(env, monkeypatch):
    reg = FakeRegistry()
    a, warns = _build(env, reg, "a", cache_to=REF)
    assert set(_sources(a).values()) == {"made"} and not warns
    cacheable = list(a.layers)  # the envspec layer too: keyed by its inputs (issue 59)
    assert sorted(a.cached_to) == sorted(
        f"{REF}:{tag_for(lay.key, Compression('zstd'))}" for lay in cacheable
    )
    again, _ = _build(env, reg, "a", cache_to=REF)  # the registry has them: nothing pushed twice
    assert again.cached_to == () and set(_sources(again).values()) == {"local"}

    b, warns = _build(
        env, reg, "b", cache_from=REF
    )  # a local build: the image the store holds, uncompressed
    assert not warns
    assert _sources(b) == {lay.group: "registry" for lay in cacheable}  # it makes no layer
    assert b.compression == "none" and b.digest == b.store_digest == a.store_digest
    assert b.to_json()["layers"][0]["source"] == "registry"
    # the image is in the store: b's cache keeps none of them, as `podman pull` would (issue 59)
    assert not list((env[2] / "b" / "layers").iterdir())
    monkeypatch.setenv("ENVSPEC_KEEP_PULLED", "on")  # unless asked to
    kept, _ = _build(env, reg, "b", cache_from=REF)
    assert set(_sources(kept).values()) == {"registry"}
    c, _ = _build(
        env, reg, "b", cache_from=REF, compress=True
    )  # now in b's own cache, with the fetched blobs
    assert {lay.source for lay in c.layers} == {"local"}
    assert (c.compression, c.digest, c.store_digest) == ("zstd", a.digest, a.store_digest)


def test_a_registry_entry_of_another_compressor_is_recompressed_here(env):
    reg = FakeRegistry()
    a, _ = _build(env, reg, "a", cache_to=REF, compression="gzip")
    b, _ = _build(
        env, reg, "b", cache_from=REF, compression="zstd", compress=True
    )  # gzip entries are not zstd ones
    assert set(_sources(b).values()) == {"made"}
    z, _ = _build(env, reg, "z", cache_to=REF, compression="zstd")
    b2, _ = _build(env, reg, "b2", cache_from=REF, compression="zstd", compress=True)
    assert b2.digest == z.digest and "registry" in _sources(b2).values()


def test_damaged_and_lying_entries_are_warned_about_and_the_layers_made(env):
    reg = FakeRegistry()
    a, _ = _build(env, reg, "a", cache_to=REF)
    layers = {lay.group: lay for lay in a.layers}
    bad = bytearray(reg.blobs[layers["torch"].digest])
    bad[len(bad) // 2] ^= 0xFF
    reg.blobs[layers["torch"].digest] = bytes(bad)  # wrong bytes under the recorded digest
    deps = layers["deps"]
    lie = json.loads(reg.tags[f"{REF}:{tag_for(deps.key, Compression('zstd'))}"])
    lie["annotations"]["dev.envspec.cache.diff-id"] = layers[
        "team"
    ].diff_id  # a diff_id that is not the blob's
    raw = json.dumps(lie).encode()
    reg.blobs[sha(raw)] = raw
    reg.tags[f"{REF}:{tag_for(deps.key, Compression('zstd'))}"] = raw
    team = layers["team"]  # the entry of another key under this key's tag
    reg.tags[f"{REF}:{tag_for(team.key, Compression('zstd'))}"] = reg.tags[
        f"{REF}:{tag_for(layers['base'].key, Compression('zstd'))}"
    ]

    b, warns = _build(env, reg, "b", cache_from=REF, compress=True)
    assert b.digest == a.digest
    assert _sources(b) == {
        "base": "registry",
        "torch": "made",
        "deps": "made",
        "team": "made",
        "envspec": "registry",
    }
    assert len(warns) == 3
    assert any(
        tag_for(layers["torch"].key, Compression("zstd")) in w and "not the ones recorded" in w
        for w in warns
    )
    assert any(
        tag_for(deps.key, Compression("zstd")) in w and "not to the layer's diff_id" in w
        for w in warns
    )
    assert any(tag_for(team.key, Compression("zstd")) in w and "entry of key" in w for w in warns)
    cache = Cache(env[2] / "b")
    for lay in (layers["torch"], deps, team):  # what is in the cache is what was made here
        meta = json.loads(cache.layer_meta(lay.key).read_text())
        assert meta["diff_id"] == lay.diff_id
        assert (
            "sha256:" + hashlib.sha256(cache.layer_tar(lay.key).read_bytes()).hexdigest()
            == lay.diff_id
        )


def test_an_unreachable_cache_warns_once_and_a_failed_cache_push_leaves_a_good_image(env):
    reg = FakeRegistry()
    reg.down = True
    a, warns = _build(env, reg, "a", cache_from=REF, compress=True)
    assert set(_sources(a).values()) == {"made"}
    assert len(warns) == 1 and "could not be read" in warns[0] and REF in warns[0]
    reg.down, reg.refuse_push = False, True
    b, warns = _build(env, reg, "b", cache_to=REF)
    assert b.digest == a.digest and b.cached_to == ()
    assert (
        len(warns) == 1
        and "refused the credentials" in warns[0]
        and "the image is built" in warns[0]
    )


def test_no_cache_reads_no_registry_but_still_fills_it(env):
    reg = FakeRegistry()
    _build(env, reg, "a", cache_to=REF)
    reg.down = True  # would warn if asked
    b, warns = _build(env, reg, "b", cache_from=REF, no_cache=True)
    assert set(_sources(b).values()) == {"made"} and not warns


def test_write_entry_links_the_blob(tmp_path):
    blob = tmp_path / "blob"
    blob.write_bytes(b"zzz")
    d = write_entry(
        tmp_path / "e",
        blob,
        EntryFacts(
            key=KEY,
            group="deps",
            comp_id="none",
            media_type="application/vnd.oci.image.layer.v1.tar",
            digest=sha(b"zzz"),
            size=3,
            diff_id=sha(b"zzz"),
            diff_size=3,
            record=None,
        ),
    )
    linked = tmp_path / "e" / "blobs" / "sha256" / sha(b"zzz").split(":")[1]
    assert linked.stat().st_ino == blob.stat().st_ino
    assert sha((tmp_path / "e" / "blobs" / "sha256" / d.split(":")[1]).read_bytes()) == d


def test_precedence_flag_then_environment_then_spec(monkeypatch):
    import argparse

    from envspec.cli.build import _cache_refs
    from envspec.spec import Sources

    spec = Sources(cache_from="spec.example.com/c", cache_to="spec.example.com/c")

    def refs(cache_from=None, cache_to=None, sources=spec):
        return _cache_refs(
            argparse.Namespace(cache_from=cache_from, cache_to=cache_to, target="s.toml"), sources
        )

    monkeypatch.delenv("ENVSPEC_CACHE_FROM", raising=False)
    monkeypatch.delenv("ENVSPEC_CACHE_TO", raising=False)
    assert refs() == ("spec.example.com/c", "spec.example.com/c")
    assert refs(sources=None) == ("", "")  # a lock carries no cache: only a spec's [sources] does
    monkeypatch.setenv("ENVSPEC_CACHE_FROM", "env.example.com/c")
    monkeypatch.setenv("ENVSPEC_CACHE_TO", "")  # set and empty: off, whatever the spec says
    assert refs() == ("env.example.com/c", "")
    assert refs(cache_from="cli.example.com/c", cache_to="cli.example.com/d") == (
        "cli.example.com/c",
        "cli.example.com/d",
    )
    assert refs(cache_from="") == ("", "")
    with pytest.raises(UsageError, match=r"s.toml \[sources\] cache_from"):
        monkeypatch.delenv("ENVSPEC_CACHE_FROM")
        refs(sources=Sources(cache_from="no-registry"))


def test_the_summary_says_where_the_layers_came_from():
    from envspec.cli.build import _built_lines
    from envspec.image import BuiltImage, LayerInfo

    def lay(group, source):
        return LayerInfo(
            digest="sha256:" + "1" * 64,
            diff_id="sha256:" + "2" * 64,
            size=1,
            group=group,
            cached=source != "made",
            source=source,
        )

    built = BuiltImage(
        image="",
        digest="sha256:" + "3" * 64,
        cache_from=REF,
        cache_to=REF,
        cached_to=(f"{REF}:t",),
        layers=(
            lay("base", "registry"),
            lay("torch", "registry"),
            lay("team", "local"),
            lay("envspec", "made"),
        ),
    )
    lines = _built_lines(built, None, None, target="x.lock")
    assert lines[0].endswith(
        f"(1 of 4 layers made, 1 from the cache, 2 from the registry cache {REF})"
    )
    assert f"pushed 1 layers to the layer cache {REF}" in lines
    assert built.to_json()["cache"] == {"from": REF, "to": REF, "pushed": [f"{REF}:t"]}
    assert [row["source"] for row in built.to_json()["layers"]] == [
        "registry",
        "registry",
        "local",
        "made",
    ]
    # a node's second pull: the layers its store holds are not read again (image.Layers.stream)
    again = BuiltImage(
        image="",
        digest="sha256:" + "3" * 64,
        cache_from=REF,
        layers=(
            lay("base", "store"),
            lay("torch", "store"),
            lay("team", "registry"),
            lay("envspec", "made"),
        ),
    )
    assert _built_lines(again, None, None, target="x.lock")[0].endswith(
        f"(1 of 4 layers made, 2 in the store already, 1 from the registry cache {REF})"
    )


def test_a_build_from_the_registry_reads_no_wheel_for_the_abi_check(env, monkeypatch):
    """The ABI check runs first with the wheels at hand; the wheels it could not read are read
    (fetched) only where a layer is made here: not where every layer comes from the registry."""
    import envspec.image.builder as image

    calls: list[str] = []
    monkeypatch.setattr(
        image,
        "check_abi_at_hand",
        lambda lock, cache, mirrors: calls.append("at hand") or ["torchish"],
    )

    def full(lock, cache, mirrors, reporter):
        calls.append("full")

    monkeypatch.setattr(image, "check_abi", full)
    reg = FakeRegistry()
    a, _ = _build(env, reg, "a", cache_to=REF)
    assert calls == ["at hand", "full"] and set(_sources(a).values()) == {
        "made"
    }  # made here: read first

    calls.clear()
    b, _ = _build(env, reg, "b", cache_from=REF)
    assert calls == ["at hand"] and b.store_digest == a.store_digest
    assert {lay.source for lay in b.layers if lay.group != "envspec"} == {"registry"}

    calls.clear()
    torch = next(lay for lay in a.layers if lay.group == "torch")
    del reg.tags[
        f"{REF}:{tag_for(torch.key, Compression('zstd'))}"
    ]  # one layer to make here after all
    c, _ = _build(env, reg, "c", cache_from=REF)
    assert calls == ["at hand", "full"] and _sources(c)["torch"] == "made"

    calls.clear()
    monkeypatch.setattr(
        image, "check_abi_at_hand", lambda lock, cache, mirrors: calls.append("at hand") or []
    )
    d, _ = _build(env, reg, "d")  # every wheel at hand: read once
    assert calls == ["at hand"]

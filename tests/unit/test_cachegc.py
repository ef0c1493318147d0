"""envspec cache / cache gc on a temp cache with fake entries (cache/gc.py)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest

from envspec.cache import gc as cachegc
from envspec.cache.store import Cache
from envspec.cli.cache import _needed
from envspec.errors import UsageError

DATA = Path(__file__).resolve().parents[1] / "data" / "build"
OLD = time.time() - 10 * 24 * 3600  # ten days ago: out of the grace period


def hexof(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def put(path: Path, size: int, used: float = OLD) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.utime(path, (used, used))
    return path


def fake_cache(tmp_path: Path) -> tuple[Cache, dict[str, str]]:
    c = Cache(tmp_path / "cache")
    names = {k: hexof(k) for k in ("wheel-a", "wheel-b", "deb-a", "deb-b", "layer-a", "layer-b")}
    put(c.blob(names["wheel-a"]), 100)
    put(c.blob(names["wheel-b"]), 200)
    put(c.root / "debs" / "sha256" / names["deb-a"], 300)
    put(c.root / "debs" / "sha256" / names["deb-b"], 400)
    for k in ("layer-a", "layer-b"):
        put(c.layer_tar(names[k]), 1000)
        record = {"group": k, "size": 1000, "diff_id": "sha256:" + hexof("tar of " + k)}
        c.layer_meta(names[k]).write_text(json.dumps(record))
        os.utime(c.layer_meta(names[k]), (OLD, OLD))
    # not entries: a .deb being downloaded, a build's work directory, the resolver's caches
    put(c.root / "debs" / "sha256" / f".{names['deb-a']}.123.456.abcd.part", 50, used=time.time())
    put(c.root / "tmp" / "999999-x" / "base.tar", 70)
    put(c.root / "uv" / "wheels" / "w.whl", 80)
    put(c.root / "layers" / "junk.tmp", 10)
    return c, names


def needed_of(names: dict[str, str], *keys: str) -> cachegc.Needed:
    n = cachegc.Needed()
    for k in keys:
        {"wheel": n.wheels, "deb": n.debs, "layer": n.layers}[k.split("-")[0]].add(names[k])
    return n


def test_scan_finds_wheels_debs_layers_and_nothing_else(tmp_path):
    c, names = fake_cache(tmp_path)
    entries = cachegc.scan(c)
    assert sorted((e.kind, e.name) for e in entries) == sorted(
        [
            ("wheel", names["wheel-a"]),
            ("wheel", names["wheel-b"]),
            ("deb", names["deb-a"]),
            ("deb", names["deb-b"]),
            ("layer", names["layer-a"]),
            ("layer", names["layer-b"]),
        ]
    )
    layer = next(e for e in entries if e.name == names["layer-a"])
    assert (
        layer.group == "layer-a"
        and layer.size == 1000 + c.layer_meta(names["layer-a"]).stat().st_size
    )
    info = cachegc.summary(c, entries)
    assert info.kinds["wheel"] == {"count": 2, "bytes": 300}
    assert info.kinds["deb"] == {"count": 2, "bytes": 700}
    assert info.other["uv/"] == 80 and info.other["tmp/"] == 70
    assert info.other["debs/ (not entries)"] == 50 and info.other["layers/ (not entries)"] == 10


def test_gc_keeps_what_locks_need_and_removes_the_rest(tmp_path):
    c, names = fake_cache(tmp_path)
    needed = needed_of(names, "wheel-a", "deb-b", "layer-a")
    plan = cachegc.collect(c, needed)
    assert sorted(e.name for e in plan.remove) == sorted(
        [names["wheel-b"], names["deb-a"], names["layer-b"]]
    )
    assert plan.freed == 200 + 300 + sum(e.size for e in plan.remove if e.kind == "layer")
    assert c.blob(names["wheel-a"]).exists() and not c.blob(names["wheel-b"]).exists()
    assert not (c.root / "debs" / "sha256" / names["deb-a"]).exists()
    assert (c.root / "debs" / "sha256" / names["deb-b"]).exists()
    assert c.layer_tar(names["layer-a"]).exists() and c.layer_meta(names["layer-a"]).exists()
    assert (
        not c.layer_tar(names["layer-b"]).exists() and not c.layer_meta(names["layer-b"]).exists()
    )
    # what is not an entry is left alone
    assert (
        list((c.root / "debs" / "sha256").glob(".*.part"))
        and (c.root / "tmp" / "999999-x" / "base.tar").exists()
    )
    assert (c.root / "uv" / "wheels" / "w.whl").exists() and (
        c.root / "layers" / "junk.tmp"
    ).exists()
    assert cachegc.collect(c, needed).remove == []  # a second run has nothing to do


def test_dry_run_removes_nothing(tmp_path):
    c, names = fake_cache(tmp_path)

    def files():
        return sorted(str(p) for p in c.root.rglob("*") if p.is_file() and p.parent.name != "locks")

    before = files()
    plan = cachegc.collect(c, cachegc.Needed(), dry_run=True)
    assert len(plan.remove) == 6
    assert files() == before


def test_recently_used_entries_are_kept(tmp_path):
    c, names = fake_cache(tmp_path)
    now = time.time()
    os.utime(c.blob(names["wheel-b"]), (now, OLD))  # read a minute ago (atime), written long ago
    plan = cachegc.collect(c, cachegc.Needed())
    assert [e.name for e in plan.remove if e.kind == "wheel"] == [names["wheel-a"]]
    assert ("wheel", names["wheel-b"]) in {
        (e.kind, e.name) for e, why in plan.keep if why == "recent"
    }
    assert c.blob(names["wheel-b"]).exists()


def test_size_budget_keeps_the_most_recently_used_and_never_what_a_lock_needs(tmp_path):
    c, names = fake_cache(tmp_path)
    for i, k in enumerate(("wheel-b", "deb-a", "deb-b")):  # wheel-b oldest ... deb-b newest
        os.utime(
            c.root / ("blobs" if k.startswith("wheel") else "debs") / "sha256" / names[k],
            (OLD + i, OLD + i),
        )
    needed = needed_of(names, "wheel-a", "layer-a", "layer-b")
    entries = cachegc.scan(c)
    base = sum(e.size for e in entries if needed.needs(e))
    plan = cachegc.plan_gc(
        entries, needed, keep_size=base + 750
    )  # room for deb-b (400) and deb-a (300)
    assert [e.name for e in plan.remove] == [names["wheel-b"]]
    assert {e.name for e, why in plan.keep if why == "budget"} == {names["deb-a"], names["deb-b"]}
    assert plan.over_budget == 0
    plan = cachegc.plan_gc(
        entries, needed, keep_size=base + 450
    )  # deb-b only; deb-a does not fit, wheel-b does
    assert {e.name for e, why in plan.keep if why == "budget"} == {names["deb-b"]}
    assert {e.name for e in plan.remove} == {names["deb-a"], names["wheel-b"]}
    plan = cachegc.plan_gc(
        entries, needed, keep_size=10
    )  # less than the locks need: they are kept anyway
    assert {e.name for e, _ in plan.keep} == {names["wheel-a"], names["layer-a"], names["layer-b"]}
    assert plan.over_budget == base - 10


def test_needed_from_a_real_lock_is_its_wheels_and_plan_layers():
    """... its envspec layer included, keyed as a build keys it (``plan.keyed_top``)."""
    from envspec import lock as lockmod
    from envspec.image.layers import envspec_layer_inputs
    from envspec.plan import keyed_top, make_plan

    lock = lockmod.load(DATA / "small.lock")
    needed, bad = _needed([DATA / "small.lock"])
    assert bad == []
    assert needed.wheels == {w.sha256 for w in lock.wheels}
    plan = make_plan(lock)
    keyed = keyed_top(plan, envspec_layer_inputs(plan, None, None))
    assert needed.layers == {lay.key.split(":", 1)[1] for lay in keyed.layers if lay.cacheable}
    top = keyed.layer("envspec").key.split(":", 1)[1]
    assert top in needed.layers and top not in {lay.key for lay in plan.layers}


def test_a_multi_platform_lock_needs_what_each_platforms_image_needs():
    from envspec import lock as lockmod
    from envspec.image.layers import envspec_layer_inputs
    from envspec.plan import keyed_top, make_plan

    path = Path(__file__).parents[2] / "lockfiles" / "smoke-multi.lock"
    lock = lockmod.load(path)
    needed, bad = _needed([path])
    assert bad == []
    debs = {d.sha256 for v in lock.views() for d in (v.debian.packages if v.debian else ())}
    assert needed.debs == debs and len(debs) > len(lock.parts[0].debian.packages)
    plans = [make_plan(v) for v in lock.views()]
    assert needed.layers == {
        lay.key.split(":", 1)[1]
        for plan in plans
        for lay in keyed_top(plan, envspec_layer_inputs(plan, None, None)).layers
        if lay.cacheable
    }


def test_gc_waits_for_a_running_build(tmp_path):
    c, names = fake_cache(tmp_path)
    build = c.in_use()  # what build() holds while it runs
    waiting, done = threading.Event(), threading.Event()
    said: list[list[str]] = []
    # a dry run removes nothing and waits for nobody (issue 43, 11: it waited 36 s)
    plan = cachegc.collect(
        c, cachegc.Needed(), dry_run=True, on_wait=lambda users: said.append(users)
    )
    assert said == [] and plan.remove and c.blob(names["wheel-a"]).exists()

    def gc():
        cachegc.collect(
            c, cachegc.Needed(), on_wait=lambda users: (said.append(users), waiting.set())
        )
        done.set()

    t = threading.Thread(target=gc)
    t.start()
    assert waiting.wait(30)
    assert not done.is_set() and c.blob(names["wheel-a"]).exists()  # blocked on the build's lock
    assert said and any(u.startswith(f"pid {os.getpid()}: ") for u in said[0]), (
        said
    )  # the builds are named
    build.release()
    t.join(30)
    assert done.is_set() and not c.blob(names["wheel-a"]).exists()


def test_default_locks_are_the_envspec_locks_of_the_repository(tmp_path):
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    text = (DATA / "small.lock").read_text()
    for rel in ("lockfiles/a.lock", "examples/team/lockfiles/b.lock"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    (repo / "uv.lock").write_text("version = 1\n")  # another tool's
    (repo / ".venv" / "x").mkdir(parents=True)
    (repo / ".venv" / "x" / "c.lock").write_text(text)
    (repo / "sub").mkdir()
    found = cachegc.default_locks(repo / "sub")
    assert found == sorted([repo / "examples/team/lockfiles/b.lock", repo / "lockfiles/a.lock"])


def test_parse_size():
    assert cachegc.parse_size("0") == 0
    assert cachegc.parse_size("20G") == 20 << 30
    assert cachegc.parse_size("1.5GiB") == 3 << 29
    assert cachegc.parse_size("500MB") == 500 * 10**6
    with pytest.raises(UsageError) as e:
        cachegc.parse_size("lots")
    assert e.value.reference == "bad-size"


def test_layers_the_store_holds_too_go_whatever_the_locks_need(tmp_path):
    """``cache gc --stored`` (issue 59, point 5): a layer whose diff_id containers-storage holds
    goes, needed by a lock and used a moment ago or not; the others are collected as before."""
    c, names = fake_cache(tmp_path)
    os.utime(c.layer_tar(names["layer-a"]))  # used just now
    stored = {"sha256:" + hexof("tar of layer-a"), "sha256:" + hexof("another image's layer")}
    entries = cachegc.scan(c)
    assert [e.name for e in cachegc.in_store(entries, stored)] == [names["layer-a"]]
    needed = needed_of(names, "wheel-a", "deb-a", "deb-b", "wheel-b", "layer-a", "layer-b")
    plan = cachegc.collect(c, needed, stored=stored)
    assert [e.name for e in plan.remove] == [names["layer-a"]] and plan.stored == 1
    assert not c.layer_tar(names["layer-a"]).exists() and c.layer_tar(names["layer-b"]).exists()
    assert plan.to_json()["removed_in_store"] == 1
    # without the store's diff_ids, what a lock needs stays
    assert cachegc.collect(c, needed).remove == []


def test_cli_says_what_a_node_may_drop(tmp_path, monkeypatch, capsys):
    from envspec.cli import cache as cli_cache
    from envspec.cli import main

    c, names = fake_cache(tmp_path)
    monkeypatch.setenv("ENVSPEC_CACHE", str(c.root))
    stored = frozenset({"sha256:" + hexof("tar of layer-b")})
    monkeypatch.setattr(cli_cache, "_stored_diff_ids", lambda: (stored, ""))
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert "a node may drop 1 layers" in out and "cache gc --stored" in out
    assert (
        f"layer {names['layer-b'][:12]} layer-b" in out and out.count("in containers-storage") == 1
    )
    assert main(["cache", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["store"]["layers_in_store"] == 1 and got["store"]["read"]
    assert {e["name"]: e["in_store"] for e in got["entries"] if e["kind"] == "layer"} == {
        names["layer-a"]: False,
        names["layer-b"]: True,
    }
    assert main(["cache", "gc", str(DATA / "small.lock"), "--stored", "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed_in_store"] == 1
    monkeypatch.setattr(cli_cache, "_stored_diff_ids", lambda: (None, "no store here"))
    assert main(["cache"]) == 0
    assert "could not be read (no store here)" in capsys.readouterr().out
    assert main(["cache", "gc", "--stored"]) == 5
    assert "no store here" in capsys.readouterr().err


def test_cli_cache_and_gc(tmp_path, monkeypatch, capsys):
    from envspec.cli import cache as cli_cache
    from envspec.cli import main

    c, names = fake_cache(tmp_path)
    monkeypatch.setenv("ENVSPEC_CACHE", str(c.root))
    monkeypatch.setattr(cli_cache, "_stored_diff_ids", lambda: (frozenset(), ""))
    assert main(["cache", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kinds"]["layer"]["count"] == 2 and len(out["entries"]) == 6
    assert main(["cache", "gc", str(DATA / "small.lock"), "--dry-run", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dry_run"] and len(out["removed"]) == 6 and c.blob(names["wheel-a"]).exists()
    assert main(["cache", "gc", str(DATA / "small.lock")]) == 0
    assert "removed 6 entries" in capsys.readouterr().out
    assert cachegc.scan(c) == []
    assert main(["cache", "gc", str(tmp_path / "missing.lock")]) == 2


def test_wheels_built_from_sdists_are_entries_kept_by_the_locks_that_build_them(tmp_path):
    """<cache>/built/<key>/ (wheels/sdist.py): one entry (wheel, wheel.json, build.log), kept where a
    lock's [wheels.source].key names it, removed whole otherwise."""
    c, names = fake_cache(tmp_path)
    for k in ("built-a", "built-b"):
        d = c.root / "built" / hexof(k)
        put(d / "pkg-1.0-py3-none-any.whl", 500)
        put(d / "build.log", 20)
        put(d / "wheel.json", 10)
    put(c.root / "built" / "not-a-key" / "x", 5)
    entries = cachegc.scan(c)
    built = {e.name: e for e in entries if e.kind == "built"}
    assert (
        set(built) == {hexof("built-a"), hexof("built-b")} and built[hexof("built-a")].size == 530
    )
    assert cachegc.summary(c, entries).kinds["built"] == {"count": 2, "bytes": 1060}
    needed = needed_of(names, "wheel-a", "wheel-b", "deb-a", "deb-b", "layer-a", "layer-b")
    needed.add("x.lock", [("built", hexof("built-a"))])
    plan = cachegc.collect(c, needed)
    assert [(e.kind, e.name) for e in plan.remove] == [("built", hexof("built-b"))]
    assert (c.root / "built" / hexof("built-a") / "pkg-1.0-py3-none-any.whl").exists()
    assert (
        not (c.root / "built" / hexof("built-b")).exists()
        and (c.root / "built" / "not-a-key" / "x").exists()
    )


def test_gc_never_follows_a_link_out_of_the_cache(tmp_path):
    c, names = fake_cache(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = put(outside / "mirror.whl", 123)
    tree = outside / "tree"
    tree.mkdir()
    put(tree / "wheel.json", 10)  # what the removal of a built entry takes first
    blob_link = c.blob(hexof("linked-wheel"))
    blob_link.symlink_to(victim)  # a link named as an entry, to a file outside
    (c.root / "layers" / f"{hexof('linked-layer')}.tar").symlink_to(victim)
    (c.root / "built").mkdir(exist_ok=True)
    (c.root / "built" / hexof("linked-built")).symlink_to(tree)  # a link to a directory outside
    os.utime(blob_link, (OLD, OLD), follow_symlinks=False)
    entries = cachegc.scan(c)
    assert not [
        e
        for e in entries
        if e.name in (hexof("linked-wheel"), hexof("linked-layer"), hexof("linked-built"))
    ]
    cachegc.collect(c, cachegc.Needed())  # nothing is needed: every entry goes
    assert victim.read_bytes() == b"x" * 123 and (tree / "wheel.json").exists()
    assert not c.blob(names["wheel-a"]).exists()  # the real entries did go


def test_gc_does_not_enter_a_kind_directory_that_links_out_of_the_cache(tmp_path):
    c = Cache(tmp_path / "cache")
    outside = tmp_path / "mirror"
    outside.mkdir()
    victim = put(outside / hexof("a-wheel"), 50)
    (c.root / "blobs" / "sha256").rmdir()
    (c.root / "blobs" / "sha256").symlink_to(outside)
    assert cachegc.scan(c) == []
    cachegc.collect(c, cachegc.Needed())
    assert victim.exists()


def test_a_layers_compressed_blobs_are_part_of_it_and_go_with_it(tmp_path):
    """issue 43, 11: `envspec cache` listed a layer's compressed blobs as "layers/ (not entries)",
    never collected; they are part of the layer's entry (its size, its removal), and a blob whose
    layer is gone is an entry of that layer's key, collected as the layer would be. Every other
    directory is listed with what it is."""
    c, names = fake_cache(tmp_path)
    layers = c.root / "layers"
    for key, part in ((names["layer-a"], "a"), (hexof("layer-gone"), "gone")):
        put(layers / f"{key}.zstd-1.5.7-3.tar.zst", 300)
        (layers / f"{key}.zstd-1.5.7-3.json").write_text(json.dumps({"compressor": "zstd-1.5.7-3"}))
        os.utime(layers / f"{key}.zstd-1.5.7-3.json", (OLD, OLD))
        os.utime(layers / f"{key}.zstd-1.5.7-3.tar.zst", (OLD, OLD))
    entries = {e.name: e for e in cachegc.scan(c) if e.kind == "layer"}
    a = entries[names["layer-a"]]
    assert (
        a.paths[0] == c.layer_meta(names["layer-a"]) and len(a.paths) == 4 and a.group == "layer-a"
    )
    gone = entries[hexof("layer-gone")]
    assert {p.name.split(".", 1)[1] for p in gone.paths} == {
        "zstd-1.5.7-3.json",
        "zstd-1.5.7-3.tar.zst",
    }
    info = cachegc.summary(c)
    assert info.other["layers/ (not entries)"] == 10  # junk.tmp only
    assert (
        "interrupted" in info.other_what["layers/ (not entries)"]
        or "killed" in info.other_what["layers/ (not entries)"]
    )
    assert "resolver" in info.other_what["uv/"] and "running builds" in info.other_what["tmp/"]
    plan = cachegc.collect(c, needed_of(names, "layer-b"), grace=0)
    assert {e.name for e in plan.remove if e.kind == "layer"} == {
        names["layer-a"],
        hexof("layer-gone"),
    }
    assert sorted(p.name for p in layers.iterdir()) == sorted(
        [f"{names['layer-b']}.tar", f"{names['layer-b']}.json", "junk.tmp"]
    )

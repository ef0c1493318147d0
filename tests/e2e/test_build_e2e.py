"""envspec build end to end: real skopeo/buildah/podman, Debian's docker-registry.

Every test uses its own container storage root (ENVSPEC_STORAGE_ROOT) and cache, so the
results are the same on a used machine and a fresh one. The fixture locks are
tests/data/build/small.lock (wheels only) and small-debian.lock (plus a Debian base: runnable).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data" / "build"))
import helpers  # noqa: E402

from envspec import lock as lockmod  # noqa: E402
from envspec.errors import BuildError, HashMismatch, SourceError  # noqa: E402
from envspec.host import find_put_layer  # noqa: E402
from envspec.run import podman_args  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.network]

for tool in ("skopeo", "buildah", "podman"):
    if shutil.which(tool) is None:
        pytestmark.append(
            pytest.mark.skip(reason=f"{tool} is not installed (apt-get install -y {tool})")
        )

DATA = helpers.HERE
SMOKE = DATA.parents[2] / "lockfiles" / "smoke.lock"
RUNNER = DATA / "run_build.py"


@pytest.fixture(scope="module")
def debs(tmp_path_factory):
    """One download of the Debian closure for the whole module (the tests' caches link to it)."""
    return tmp_path_factory.mktemp("debs")


@pytest.fixture
def storage(tmp_path):
    from conftest import private_storage

    root = tmp_path / "storage"
    with private_storage(root):
        yield root


@pytest.fixture
def engine(storage):
    from envspec.image import BuildahEngine

    return BuildahEngine()


def new_cache(base: Path, debs: Path, name: str = "cache") -> Path:
    c = base / name
    c.mkdir(parents=True, exist_ok=True)
    if not (c / "debs").exists():
        (c / "debs").symlink_to(debs)
    return c


def do_build(lock, engine, cache, **kw):
    from envspec import sources
    from envspec.cache.store import Cache
    from envspec.image import BuildOptions, build
    from envspec.plan import make_plan
    from envspec.registry.stage import Registry

    options = BuildOptions(
        registry=Registry(), **{k: tuple(v) if k == "outputs" else v for k, v in kw.items()}
    )
    return build(make_plan(lock), engine, Cache(cache), sources.discover().mirrors, options=options)


def podman(engine, *args, check=True):
    return subprocess.run(
        ["podman", *engine.host.storage.args(), *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=300,
    )


def small_debian():
    return lockmod.load(DATA / "small-debian.lock")


# --- reproducibility and cache -------------------------------------------------------------------


def test_two_no_cache_builds_at_different_times_give_one_digest(engine, tmp_path, debs):
    lock = small_debian()
    a = do_build(lock, engine, new_cache(tmp_path, debs, "c1"), no_cache=True)
    time.sleep(1.1)  # any leaked clock would now show
    b = do_build(lock, engine, new_cache(tmp_path, debs, "c2"), no_cache=True)
    assert a.digest == b.digest
    assert [lay.digest for lay in a.layers] == [lay.digest for lay in b.layers]
    assert (
        engine.image_digest(a.image) == a.store_digest
    )  # storage keeps our manifest bytes (uncompressed layers)


needs_store_tools = pytest.mark.skipif(
    shutil.which("containers-storage") is None or os.geteuid() != 0 or find_put_layer() is None,
    reason="needs root, containers-storage and envspec-put-layer (scripts/dev.sh setup installs and builds them)",
)


@needs_store_tools
def test_imports_by_put_layer_containers_storage_and_skopeo_agree_and_storage_gives_our_bytes_back(
    engine, tmp_path, debs, monkeypatch
):
    from conftest import private_storage

    from envspec.image import BuildahEngine

    lock = small_debian()
    assert engine.storage_cli() is not None and engine.storage_cli().put_tool == find_put_layer()
    a = do_build(lock, engine, new_cache(tmp_path, debs, "c1"))
    assert engine.image_digest(a.image) == a.store_digest
    # out of containers-storage again (as `podman push` reads it): the very layer bytes we made
    # (containers/image rewrites the manifest on the way out, dropping the layers' annotations,
    # which is why `envspec build --push` sends envspec's own layout)
    out = tmp_path / "from-storage"
    subprocess.run(
        [
            "skopeo",
            "copy",
            "--quiet",
            "--dest-oci-accept-uncompressed-layers",
            engine.host.storage.ref(a.image),
            f"oci:{out}",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    mdigest = json.loads((out / "index.json").read_text())["manifests"][0]["digest"]
    manifest = json.loads((out / "blobs" / "sha256" / mdigest.split(":")[1]).read_text())
    assert [lay["digest"] for lay in manifest["layers"]] == [
        lay.diff_id for lay in a.layers
    ]  # uncompressed
    assert (
        podman(
            engine,
            "run",
            *podman_args(engine.host)[1],
            "--rm",
            "--network",
            "none",
            a.image,
            "python",
            "-c",
            "print(6 * 7)",
        ).stdout.split()[-1]
        == "42"
    )

    # the layers containers-storage holds are the ones we made, whatever tool put them there
    store = engine.storage_cli()
    stored = json.loads(
        subprocess.run(
            store._cs("layers", "--json"), capture_output=True, text=True, check=True
        ).stdout
    )
    assert sorted(lay["diff-digest"] for lay in stored) == sorted(lay.diff_id for lay in a.layers)
    for (
        lay
    ) in a.layers:  # containers/storage's own diff of each stored layer: our tar, byte for byte
        layer_id = next(x["id"] for x in stored if x["diff-digest"] == lay.diff_id)
        diff = subprocess.run(store._cs("diff", layer_id), capture_output=True, check=True).stdout
        assert "sha256:" + hashlib.sha256(diff).hexdigest() == lay.diff_id

    # staged (the default here): nothing left in the staging area, and the files, modes, owners and
    # times in the store are those containers/storage's own PutLayer gives the same tars
    assert store.can_stage and not any(
        (Path(store.root) / store.driver / "envspec-staging").iterdir()
    )
    staging = Path(store.root) / store.driver / "envspec-staging"
    if subprocess.run(
        ["stat", "-f", "-c", "%T", str(staging)], capture_output=True, text=True
    ).stdout.startswith("ext"):
        got = subprocess.run(["lsattr", "-d", str(staging)], capture_output=True, text=True)
        assert "T" in got.stdout.split()[0], got  # spread over block groups (issue 59)
    monkeypatch.setenv("ENVSPEC_STAGED_IMPORT", "off")
    with private_storage(tmp_path / "storage-put"):
        put = BuildahEngine()
        assert put.storage_cli() is not None and not put.storage_cli().can_stage
        d = do_build(lock, put, new_cache(tmp_path, debs, "c4"))
        assert d.digest == a.digest and put.image_digest(d.image) == a.store_digest
        for x in stored:
            assert _tree(Path(store.root) / "overlay" / x["id"] / "diff") == _tree(
                Path(put.storage_cli().root) / "overlay" / x["id"] / "diff"
            ), x["id"]
    monkeypatch.delenv("ENVSPEC_STAGED_IMPORT")

    monkeypatch.setenv("ENVSPEC_PUT_LAYER", "off")  # containers-storage's own import-layer
    with private_storage(tmp_path / "storage-cli"):
        cli = BuildahEngine()
        assert cli.storage_cli() is not None and cli.storage_cli().put_tool is None
        c = do_build(lock, cli, new_cache(tmp_path, debs, "c3"))
        assert c.digest == a.digest and cli.image_digest(c.image) == a.store_digest
        # the image record `envspec-put-layer image` made is the one containers-storage's own
        # create-image, set-image-data and add-names make
        assert _image_record(store, a.image) == _image_record(cli.storage_cli(), c.image)

    monkeypatch.setenv("ENVSPEC_IMPORT", "skopeo")
    with private_storage(tmp_path / "storage-skopeo"):
        other = BuildahEngine()
        assert other.storage_cli() is None
        b = do_build(lock, other, new_cache(tmp_path, debs, "c2"))
        assert b.digest == a.digest and other.image_digest(b.image) == a.store_digest


def _image_record(store, ref: str) -> dict:
    """What containers-storage records of the image ``ref``, less the times it was made at."""
    rec = json.loads(
        subprocess.run(
            store._cs("image", "--json", ref), capture_output=True, text=True, check=True
        ).stdout
    )
    rec = rec[0] if isinstance(rec, list) else rec
    assert rec["id"] and rec["layer"] and rec["names"] == [ref] and rec["big-data-names"], rec
    return {k: v for k, v in rec.items() if k not in ("created", "metadata-time")}


def _tree(root: Path) -> list[tuple]:
    """Every entry under ``root``: path, mode, owner, size, mtime (directories' too), link target."""
    out = []
    for dirpath, dirs, files in os.walk(root):
        for name in ["", *dirs, *files]:
            p = Path(dirpath) / name if name else Path(dirpath)
            st = p.lstat()
            out.append(
                (
                    str(p.relative_to(root)),
                    st.st_mode,
                    st.st_uid,
                    st.st_gid,
                    0 if p.is_dir() else st.st_size,
                    st.st_mtime_ns if p != root else 0,
                    os.readlink(p) if p.is_symlink() else "",
                )
            )
    return sorted(set(out))


@needs_store_tools
def test_a_layer_left_without_content_by_a_killed_import_is_made_again(engine, tmp_path, debs):
    """A layer record a killed import left with no content (no diff digest) under the ID the build
    needs is replaced by the staged layer: the image builds, and the layer holds its bytes."""
    from conftest import private_storage

    from envspec.image import BuildahEngine

    lock = small_debian()
    a = do_build(lock, engine, new_cache(tmp_path, debs, "c1"))
    base_id = a.layers[0].diff_id.split(":", 1)[
        1
    ]  # the bottom layer's ID is its diff_id (chain of one)
    with private_storage(tmp_path / "storage-b"):
        eng = BuildahEngine()
        store = eng.storage_cli()
        assert store is not None and store.can_stage
        subprocess.run(store._cs("create-layer", "--id", base_id), check=True, capture_output=True)
        assert store.layer_diff_id(base_id) == ""
        b = do_build(lock, eng, new_cache(tmp_path, debs, "c2"))
        assert eng.image_digest(b.image) == a.store_digest
        assert store.layer_diff_id(base_id) == a.layers[0].diff_id
        diff = subprocess.run(store._cs("diff", base_id), capture_output=True, check=True).stdout
        assert "sha256:" + hashlib.sha256(diff).hexdigest() == a.layers[0].diff_id


@needs_store_tools
def test_a_killed_builds_staging_is_removed_and_a_failing_maker_leaves_no_layer(
    engine, tmp_path, debs, monkeypatch
):
    """Staged import: what a killed build left in the staging area goes with the next import; a
    maker that fails while its layer is being untarred leaves no layer, no staging, no image."""
    from conftest import private_storage

    from envspec.image import BuildahEngine
    from envspec.image import layers as layer_makers

    lock = small_debian()
    with private_storage(tmp_path / "storage"):
        eng = BuildahEngine()
        store = eng.storage_cli()
        assert store is not None and store.can_stage
        left = Path(store.root) / store.driver / "envspec-staging" / "12345-killed"
        (left / "usr").mkdir(parents=True)
        (left.parent / "12345-killed.tar-split.gz").write_bytes(b"x")
        real = layer_makers.make_base_layer

        def failing(plan, rootfs, out, *a, **kw):  # writes half a layer, then fails
            real(plan, rootfs, out, *a, **kw)
            with open(out, "r+b") as f:
                f.truncate(Path(out).stat().st_size // 2)
            time.sleep(0.5)
            raise BuildError("the base layer failed (test)", step="layer base")

        monkeypatch.setattr(layer_makers, "make_base_layer", failing)
        with pytest.raises(BuildError, match="failed \\(test\\)"):
            do_build(lock, eng, new_cache(tmp_path, debs, "c1"))
        assert not any(left.parent.iterdir()), sorted(
            p.name for p in left.parent.iterdir()
        )  # the killed build's, and the failed one's
        assert (
            json.loads(
                subprocess.run(
                    store._cs("layers", "--json"), capture_output=True, text=True, check=True
                ).stdout
                or "[]"
            )
            == []
        )
        monkeypatch.setattr(layer_makers, "make_base_layer", real)
        ok = do_build(lock, eng, new_cache(tmp_path, debs, "c2"))
        assert eng.image_digest(ok.image) == ok.store_digest and not any(left.parent.iterdir())


@needs_store_tools
@pytest.mark.skipif(not SMOKE.exists(), reason="lockfiles/smoke.lock is not there")
def test_podman_runs_on_the_store_during_the_import_leave_every_layer_whole(engine, tmp_path, debs):
    """Each podman run on the store empties overlay's staging directory as it ends (its store's
    Shutdown runs the driver's Cleanup), where envspec-put-layer commit moves a staged layer's
    files on their way into the layer. With podman run on the store again and again during a
    staged import, the image is made, and every layer gives back the bytes its maker wrote
    (files taken from under a commit are staged again)."""
    import threading

    from envspec.image.engine import chain_id

    store = engine.storage_cli()
    assert store is not None and store.can_stage
    stop, runs = threading.Event(), []

    def podman_meanwhile() -> None:
        while not stop.is_set():
            runs.append(podman(engine, "images", "-q", check=False).returncode)

    other = threading.Thread(target=podman_meanwhile, daemon=True)
    other.start()
    try:
        img = do_build(lockmod.load(SMOKE), engine, new_cache(tmp_path, debs), no_cache=True)
    finally:
        stop.set()
        other.join(120)
    assert len(runs) > 1 and set(runs) == {0}
    assert engine.image_digest(img.image) == img.store_digest
    layer_id = ""
    for lay in img.layers:
        layer_id = chain_id(layer_id, lay.diff_id)
        diff = subprocess.run(store._cs("diff", layer_id), capture_output=True, check=True).stdout
        assert "sha256:" + hashlib.sha256(diff).hexdigest() == lay.diff_id, lay.group


@needs_store_tools
def test_a_cached_layer_damaged_on_disk_is_made_again_and_a_wheel_from_a_file_mirror_heals(
    engine, tmp_path, debs
):
    """One byte of a cached layer and one of a cached wheel of that layer changed: the next build,
    into a new store, finds the layer damaged on its way in, drops it, makes it again from the
    wheel, finds the wheel damaged, drops it, takes it again from its file:// mirror (read where
    it is, or a reflink: the cache shares no inode with the mirror, whose files stay as they
    were) and ends with the same image."""
    from conftest import private_storage

    from envspec import sources
    from envspec.cache.store import Cache
    from envspec.image import BuildahEngine, BuildOptions, Reporter, build
    from envspec.plan import make_plan
    from envspec.registry.stage import Registry

    lock = small_debian()
    first = do_build(lock, engine, new_cache(tmp_path, debs, "fill"))
    mirror = (
        tmp_path / "mirror"
    )  # a find-links folder of the lock's wheels, as a team's file:// mirror
    mirror.mkdir()
    from envspec.wheels.fetch import WheelFetcher

    got = WheelFetcher(Cache(tmp_path / "fill"), sources.discover().mirrors).fetch_all(
        list(lock.wheels)
    )
    for w in lock.wheels:
        shutil.copyfile(got[w.sha256], mirror / w.filename)
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in mirror.iterdir()}
    mirrors = [sources.Mirror(mirror.as_uri(), "links", "test mirror")]

    class Warnings(Reporter):
        def __init__(self) -> None:
            self.said: list[str] = []

        def warning(self, message: str) -> None:
            self.said.append(message)

    def flip(path: Path, at: int) -> None:
        path.chmod(0o644)  # entries are read-only: a write needs this first (root aside)
        with open(path, "r+b") as f:  # one byte, same size: only a hash can tell
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0xFF]))

    cache = new_cache(tmp_path, debs)
    a = build(
        make_plan(lock), engine, Cache(cache), mirrors, options=BuildOptions(registry=Registry())
    )
    assert a.digest == first.digest
    blobs = cache / "blobs" / "sha256"
    mirror_inodes = {p.stat().st_ino for p in mirror.iterdir()}
    for p in (
        blobs.iterdir()
    ):  # read in place (ext4), or a reflink of its own (btrfs, XFS): never the mirror's inode
        assert (
            p.stat().st_ino not in mirror_inodes
            and p.stat().st_nlink == 1
            and p.stat().st_mode & 0o777 == 0o444
        )
    layer = next(lay for lay in a.layers if lay.group == "team")
    tar = cache / "layers" / (layer.key.split(":", 1)[1] + ".tar")
    assert (
        tar.stat().st_mode & 0o777 == 0o444
        and tar.with_suffix(".json").stat().st_mode & 0o777 == 0o444
    )
    flip(tar, layer.diff_size // 2)
    wheel = next(w for w in lock.wheels if w.group == "team")
    damaged = (
        blobs / wheel.sha256
    )  # a cached copy of the team's wheel with one byte changed (an older build's)
    if not damaged.exists():
        shutil.copyfile(mirror / wheel.filename, damaged)
    flip(damaged, 100)
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in mirror.iterdir()} == before

    with private_storage(tmp_path / "storage2"):
        other = BuildahEngine()
        said = Warnings()
        b = build(
            make_plan(lock),
            other,
            Cache(cache),
            mirrors,
            options=BuildOptions(registry=Registry()),
            reporter=said,
        )
        assert b.digest == a.digest and other.exists(b.image)
        assert any(
            "cached layer file" in m and str(tar) in m and "made again" in m for m in said.said
        ), said.said
        assert any(wheel.filename in m and "fetched again" in m for m in said.said), said.said
    assert not damaged.exists() or hashlib.sha256(damaged.read_bytes()).hexdigest() == wheel.sha256
    assert hashlib.sha256(tar.read_bytes()).hexdigest() == layer.diff_id.split(":", 1)[1]
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in mirror.iterdir()} == before


def test_unchanged_lock_rebuilds_nothing(engine, tmp_path, debs):
    cache = new_cache(tmp_path, debs)
    lock = small_debian()
    first = do_build(lock, engine, cache)
    again = do_build(lock, engine, cache)
    assert again.digest == first.digest
    # every layer, the envspec layer too: keyed by its inputs (issue 59)
    assert [lay.cached for lay in again.layers] == [True] * len(again.layers)


def test_one_team_change_changes_only_team_and_above(engine, tmp_path, debs):
    cache = new_cache(tmp_path, debs)
    base = helpers.load("small-debian.lock")
    a = do_build(base, engine, cache)
    changed = helpers.with_wheel(
        base,
        "six",
        version="1.16.0",
        filename="six-1.16.0-py2.py3-none-any.whl",
        sha256="8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254",
        size=11053,
    )
    b = do_build(changed, engine, cache)
    da = {lay.group: lay.digest for lay in a.layers}
    db = {lay.group: lay.digest for lay in b.layers}
    assert [g for g in da if da[g] != db[g]] == ["team", "envspec"]
    assert [lay.group for lay in b.layers if not lay.cached] == ["team", "envspec"]
    assert engine.exists(a.image) and engine.exists(b.image) and a.image != b.image


def test_locks_sharing_torch_and_cuda_share_those_layers(engine, tmp_path, debs):
    a_lock = helpers.load("small-debian.lock")
    other = helpers.data(a_lock)
    other["meta"]["name"] = "build-small-other"
    b_lock = helpers.with_wheel(
        other,
        "iniconfig",
        version="2.1.0",
        filename="iniconfig-2.1.0-py3-none-any.whl",
        sha256="9deba5723312380e77435581c6bf4935c94cbfab9b1ed33ef8d238ea168eb760",
        size=5992,
    )
    a = do_build(a_lock, engine, new_cache(tmp_path, debs, "ca"))
    b = do_build(b_lock, engine, new_cache(tmp_path, debs, "cb"))
    da = {lay.group: lay.digest for lay in a.layers}
    db = {lay.group: lay.digest for lay in b.layers}
    assert [g for g in da if da[g] == db[g]] == ["base", "cuda", "torch", "team"]


# --- faults ----------------------------------------------------------------------------------------


def test_wrong_sha256_stops_the_build_and_tags_nothing(engine, tmp_path, debs):
    bad = helpers.with_wheel(helpers.load("small-debian.lock"), "idna", sha256="1" * 64)
    ref = "localhost/envspec/build-small-debian:" + bad.meta.content_hash[7:19]
    with pytest.raises(HashMismatch, match="idna-3.20"):
        do_build(bad, engine, new_cache(tmp_path, debs))
    assert not engine.exists(ref)
    assert engine.containers() == []


def test_a_deb_the_mirror_no_longer_has_names_it_and_the_way_out(engine, tmp_path, debs):
    lock = helpers.data("small-debian.lock")
    pin = next(p for p in lock["debian"]["packages"] if p["name"] == "tzdata")
    pin["version"] = "1900a-0+deb12u1"
    pin["filename"] = pin["filename"].rsplit("/", 1)[0] + "/tzdata_1900a-0+deb12u1_all.deb"
    pin["sha256"] = "2" * 64
    (tmp_path / "fresh-debs").mkdir()
    with pytest.raises(SourceError) as e:
        do_build(helpers.rehash(lock), engine, new_cache(tmp_path, tmp_path / "fresh-debs"))
    assert "tzdata" in e.value.message and "1900a" in e.value.message
    assert "snapshot" in e.value.hint


def _children(pid: int) -> list[tuple[int, str]]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if ppid == pid:
            out.append((int(d.name), comm))
    return out


def _spawn(lock_path: Path, cache: Path, *extra: str) -> subprocess.Popen:
    # SIGINT back to its default: a shell's background job (`.ci/run &`) starts with it ignored,
    # and python then never turns it into KeyboardInterrupt
    return subprocess.Popen(
        [sys.executable, str(RUNNER), str(lock_path), str(cache), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _wait_for(cond, proc, timeout=120.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.005)
    return False


@pytest.mark.parametrize(
    "sig,when", [(signal.SIGINT, "layers"), (signal.SIGKILL, "layers"), (signal.SIGKILL, "import")]
)
def test_interrupted_build_leaves_no_tag_and_the_next_one_works(engine, tmp_path, debs, sig, when):
    lock_path = DATA / "small-debian.lock"
    ref = lockmod.load(lock_path)
    tag = f"localhost/envspec/{ref.meta.name}:{ref.short_hash}"
    cache = new_cache(tmp_path, debs)
    big_tmp = Path(os.environ.get("TMPDIR", "/var/tmp"))
    before = set(big_tmp.glob("storage*"))
    proc = _spawn(lock_path, cache, "--no-cache")
    if when == "layers":
        hit = _wait_for(lambda: any((cache / "tmp").glob("*/base.tar")), proc)
    else:
        # envspec-put-layer or containers-storage's tool (names cut to 15 characters by the kernel),
        # else skopeo
        hit = _wait_for(
            lambda: any(
                c in ("skopeo", "containers-stor", "envspec-put-lay")
                for _, c in _children(proc.pid)
            ),
            proc,
        )
    assert hit, f"the build ended before the {when} step: {proc.communicate()}"
    kids = [p for p, _ in _children(proc.pid)]
    proc.send_signal(sig)
    rc = proc.wait(timeout=120)
    assert rc != 0, ("the build was not stopped", proc.communicate())
    time.sleep(0.5)
    for k in kids:  # children die with the build (PR_SET_PDEATHSIG)
        assert (
            not Path(f"/proc/{k}").exists()
            or "Z" in Path(f"/proc/{k}/stat").read_text().split(")")[1][:3]
        )
    assert not engine.exists(tag)
    assert engine.containers() == []
    img = do_build(lockmod.load(lock_path), engine, cache)
    assert img.image == tag and engine.exists(tag)
    assert len(podman(engine, "images", "--all", "--quiet", "--no-trunc").stdout.split()) == 1
    assert list((cache / "tmp").iterdir()) == []  # the dead build's work dir is gone
    assert set(big_tmp.glob("storage*")) <= before  # skopeo's temporary files were in it


def test_two_concurrent_builds_of_one_lock_agree(engine, tmp_path, debs):
    lock_path = DATA / "small-debian.lock"
    cache = new_cache(tmp_path, debs)
    procs = [_spawn(lock_path, cache) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    digests = {json.loads(o[0])["store_digest"] for o in outs}
    assert len(digests) == 1
    assert len(podman(engine, "images", "--all", "--quiet", "--no-trunc").stdout.split()) == 1
    assert engine.image_digest(json.loads(outs[0][0])["image"]) == digests.pop()


# --- the image itself -----------------------------------------------------------------------------


def test_image_runs_under_podman_with_labels_lock_and_sbom(engine, tmp_path, debs):
    lock = small_debian()
    img = do_build(lock, engine, new_cache(tmp_path, debs))
    run = ["run", "--rm", *podman_args(engine.host)[1], img.image]
    out = podman(
        engine,
        *run,
        "python",
        "-c",
        "import six, idna, sys, os; print(sys.prefix, six.__version__, idna.__version__, os.getuid(), os.getcwd())",
    )
    assert out.stdout.split() == ["/opt/venv", "1.17.0", "3.20", "1000", "/workspace"]
    inspect = json.loads(podman(engine, "image", "inspect", img.image).stdout)[0]
    labels = inspect["Labels"]
    assert labels["io.envspec.lock-hash"] == lock.meta.content_hash
    assert labels["io.envspec.spec-hash"] == lock.meta.spec_hash
    assert (
        labels["io.envspec.driver-floor"] == "580.65.06"
        and labels["org.opencontainers.image.title"] == lock.meta.name
    )
    assert inspect["Config"]["User"] == "envspec"
    text = podman(engine, *run, "cat", "/opt/envspec/envspec.lock").stdout
    assert text == (DATA / "small-debian.lock").read_text()
    sbom = json.loads(podman(engine, *run, "cat", "/opt/envspec/sbom.spdx.json").stdout)
    names = {p["name"] for p in sbom["packages"]}
    assert {d.name for d in lock.debian.packages} | {w.name for w in lock.wheels} <= names
    assert all(p["checksums"][0]["checksumValue"] for p in sbom["packages"][1:])
    # tini is PID 1, the user's shell works, the envspec launcher is on PATH
    out = podman(
        engine, *run, "sh", "-c", "cat /proc/1/comm; command -v envspec; id -un"
    ).stdout.split()
    assert out == ["tini", "/opt/venv/bin/envspec", "envspec"]


# --- registry -------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def registry(tmp_path):
    if shutil.which("docker-registry") is None:
        pytest.skip("docker-registry is not installed (apt-get install -y docker-registry)")
    port = _free_port()
    cfg = tmp_path / "registry.yml"
    cfg.write_text(
        "version: 0.1\n"
        "log:\n  level: error\n"
        f"storage:\n  filesystem:\n    rootdirectory: {tmp_path / 'registry-data'}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    end = time.monotonic() + 30
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("docker-registry did not start")
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=10)


def test_push_keeps_the_digest_and_pulls_back(engine, tmp_path, debs, registry):
    lock = small_debian()
    dest = f"{registry}/envspec/small:{lock.short_hash}"
    img = do_build(lock, engine, new_cache(tmp_path, debs), push=dest)
    by_digest = f"docker://{registry}/envspec/small@{img.digest}"
    raw = subprocess.run(
        ["skopeo", "inspect", "--raw", "--tls-verify=false", by_digest],
        capture_output=True,
        check=True,
    ).stdout
    import hashlib

    assert "sha256:" + hashlib.sha256(raw).hexdigest() == img.digest
    pulled = tmp_path / "pulled"
    subprocess.run(
        [
            "skopeo",
            "copy",
            "--quiet",
            "--src-tls-verify=false",
            "--preserve-digests",
            by_digest,
            f"oci:{pulled}",
        ],
        check=True,
        capture_output=True,
    )
    index = json.loads((pulled / "index.json").read_text())
    assert index["manifests"][0]["digest"] == img.digest
    out = podman(engine, "pull", "--tls-verify=false", f"{registry}/envspec/small@{img.digest}")
    assert out.returncode == 0


def test_outputs_oci_and_archives(engine, tmp_path, debs):
    lock = lockmod.load(DATA / "small.lock")
    outs = [
        f"oci:{tmp_path / 'out-oci'}",
        f"oci-archive:{tmp_path / 'img.tar'}",
        f"docker-archive:{tmp_path / 'docker.tar'}",
    ]
    img = do_build(lock, engine, new_cache(tmp_path, debs), outputs=outs, tag="")
    assert img.image == "" and img.outputs == tuple(outs)
    index = json.loads((tmp_path / "out-oci" / "index.json").read_text())
    assert index["manifests"][0]["digest"] == img.digest
    raw = subprocess.run(
        ["skopeo", "inspect", "--raw", f"oci:{tmp_path / 'out-oci'}"],
        capture_output=True,
        check=True,
    ).stdout
    import hashlib

    assert "sha256:" + hashlib.sha256(raw).hexdigest() == img.digest
    assert (tmp_path / "img.tar").stat().st_size > 0 and (
        tmp_path / "docker.tar"
    ).stat().st_size > 0


def test_a_damaged_cached_layer_is_made_again_before_it_goes_into_an_oci_output(
    engine, tmp_path, debs
):
    """Without an import into a store nothing else reads a cached layer: an output build checks
    the files it carries (and a tar it compresses), drops the damaged one, makes it again."""
    from envspec import sources
    from envspec.cache.store import Cache
    from envspec.image import BuildOptions, Reporter, build
    from envspec.plan import make_plan
    from envspec.registry.stage import Registry

    lock = lockmod.load(DATA / "small.lock")
    cache = new_cache(tmp_path, debs)
    a = do_build(lock, engine, cache, outputs=[f"oci:{tmp_path / 'a'}"], tag="")
    for tar in (cache / "layers").glob(
        "*.tar"
    ):  # every cached tar, one byte changed (its blob is compressed from it)
        tar.chmod(0o644)
        with open(tar, "r+b") as f:
            f.seek(700)
            b = f.read(1)
            f.seek(700)
            f.write(bytes([b[0] ^ 0xFF]))
    for blob in (cache / "layers").glob(
        "*.tar.*"
    ):  # and the compressed blobs gone: made again from the tars
        blob.unlink()

    class Said(Reporter):
        def __init__(self) -> None:
            self.said: list[str] = []

        def warning(self, message: str) -> None:
            self.said.append(message)

    said = Said()
    b = build(
        make_plan(lock),
        engine,
        Cache(cache),
        sources.discover().mirrors,
        reporter=said,
        options=BuildOptions(registry=Registry(), outputs=(f"oci:{tmp_path / 'b'}",), tag=""),
    )
    assert b.digest == a.digest
    # every cached layer, the envspec layer's too (keyed by its inputs, issue 59)
    assert sum("made again" in m for m in said.said) == len(a.layers)
    for blob in (
        tmp_path / "b" / "blobs" / "sha256"
    ).iterdir():  # every blob of the output is what its name says
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name


@pytest.mark.skipif(not SMOKE.exists(), reason="lockfiles/smoke.lock is not there")
def test_smoke_lock_two_no_cache_builds_one_digest_and_it_runs(engine, tmp_path, debs):
    lock = lockmod.load(SMOKE)
    a = do_build(lock, engine, new_cache(tmp_path, debs, "c1"), no_cache=True)
    time.sleep(1.1)
    b = do_build(lock, engine, new_cache(tmp_path, debs, "c2"), no_cache=True)
    assert a.digest == b.digest and a.image == f"localhost/envspec/smoke:{lock.short_hash}"
    wanted = {w.name: w.version for w in lock.wheels}
    code = (
        "import importlib.metadata as m, json; print(json.dumps({d: m.version(d) for d in %r}))"
        % sorted(wanted)
    )
    out = podman(engine, "run", "--rm", *podman_args(engine.host)[1], a.image, "python", "-c", code)
    assert json.loads(out.stdout) == wanted


@pytest.mark.skipif(not SMOKE.exists(), reason="lockfiles/smoke.lock is not there")
def test_smoke_image_python_runs_the_built_pyc_and_writes_none(engine, tmp_path, debs):
    """The image's python imports each wheel module from the .pyc the build wrote (unchecked-hash:
    with the source changed inside the container, the module is still the built one), and an
    import as root, in a writable venv, writes no .pyc of its own; so do the Debian standard
    library (base layer) and the verifier's start-up hook (envspec layer)."""
    from envspec.image.bytecode import find_compiler

    lock = lockmod.load(SMOKE)
    if not find_compiler(lock.platform).python:
        pytest.skip(f"no CPython {lock.platform.python_full} on this host: the build makes no .pyc")
    img = do_build(lock, engine, new_cache(tmp_path, debs))
    script = (
        "import importlib.util, pathlib, sys, sysconfig\n"
        "site = pathlib.Path(sysconfig.get_paths()['purelib'])\n"
        "before = sorted(str(p) for p in site.rglob('*'))\n"
        "src = site / 'six.py'\n"
        "src.write_text(src.read_text() + '\\nraise SystemExit(\"the source ran\")\\n')\n"
        "import six, idna\n"
        "data = pathlib.Path(six.__cached__).read_bytes()\n"
        "print(six.__cached__, idna.__cached__, data[:4] == importlib.util.MAGIC_NUMBER, data[4:8].hex())\n"
        "print(sorted(str(p) for p in site.rglob('*')) == before)\n"
    )
    out = podman(
        engine,
        "run",
        "--rm",
        "--user",
        "0",
        *podman_args(engine.host)[1],
        img.image,
        "python",
        "-c",
        script,
    ).stdout.split()
    assert out == [
        f"/opt/venv/lib/python{lock.platform.python}/site-packages/__pycache__/six.cpython-311.pyc",
        f"/opt/venv/lib/python{lock.platform.python}/site-packages/idna/__pycache__/__init__.cpython-311.pyc",
        "True",
        "01000000",
        "True",
    ]
    # the Debian standard library and the verifier (root's, under /opt/envspec/lib) come with their
    # .pyc too: a start imports them from the built files and, as root, writes none
    script = (
        "import os, subprocess, sys\n"
        "roots = ['/usr/lib/python3.11', '/usr/lib/python3/dist-packages', '/opt/envspec/lib']\n"
        "def listing():\n"
        "    return sorted(os.path.join(d, f) for r in roots for d, _, fs in os.walk(r) for f in fs)\n"
        "before = listing()\n"
        "import dataclasses, typing, pathlib, tomllib, ctypes, json\n"
        "data = open(dataclasses.__cached__, 'rb').read()\n"
        "p = subprocess.run([sys.executable, '-m', 'envspec.verify', '--startup'], capture_output=True, text=True,\n"
        "                   env={**os.environ, 'PYTHONPATH': '/opt/envspec/lib'})\n"
        "print(p.stdout, p.stderr, file=sys.stderr)\n"
        "hook = open('/opt/envspec/lib/envspec/verify/__pycache__/startup.cpython-311.pyc', 'rb').read()\n"
        "print(dataclasses.__cached__, dataclasses.__cached__ in before, data[4:8].hex(), p.returncode,\n"
        "      hook[4:8].hex(), listing() == before)\n"
    )
    # flags 01 (unchecked-hash): the build's, not one Python wrote at run time (timestamp, 00), as the
    # entrypoint's own start-up hook, run as root before the script, would have
    cp = podman(
        engine,
        "run",
        "--rm",
        "--user",
        "0",
        *podman_args(engine.host)[1],
        img.image,
        "python",
        "-c",
        script,
    )
    assert cp.stdout.split() == [
        f"/usr/lib/python{lock.platform.python}/__pycache__/dataclasses.cpython-311.pyc",
        "True",
        "01000000",
        "0",
        "01000000",
        "True",
    ], cp.stderr


@needs_store_tools
def test_cli_build_reports_its_phases_and_ends_saying_where_the_image_is_and_how_to_start_it(
    storage, tmp_path, debs
):
    """`envspec build` as a user runs it: `--json` carries the phases (each layer made and imported);
    the plain command ends with the image, its digest, the store it is in (the printed podman
    command finds it there) and the `envspec run` lines."""
    import shlex

    env = {
        **os.environ,
        "ENVSPEC_CACHE": str(new_cache(tmp_path, debs)),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
    }
    lock = DATA / "small-debian.lock"
    # before it is built: run says so (exit 5, image-not-built), not podman's pull from localhost:443
    cp = subprocess.run(
        [sys.executable, "-m", "envspec", "run", str(lock), "--no-mount", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (
        cp.returncode == 5
        and "image-not-built" in cp.stderr
        and f"envspec build {lock}" in cp.stderr
    ), cp.stderr
    assert "pinging container registry" not in cp.stderr
    cp = subprocess.run(
        [sys.executable, "-m", "envspec", "build", str(lock), "--no-cache", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert cp.returncode == 0, cp.stderr
    built = json.loads(cp.stdout)
    phases = {p["name"]: p for p in built["phases"]}
    for lay in built["layers"]:
        made, imported = phases[f"layer {lay['group']}"], phases[f"import {lay['group']}"]
        # staged: the import begins while the layer is made, and ends once it is made
        assert (
            imported["start_s"] <= imported["end_s"] and made["end_s"] <= imported["end_s"] + 0.01
        )
        assert imported["end_s"] <= built["seconds"] + 0.01
    assert built["storage"]["root"] == str(storage)

    cp = subprocess.run(
        [sys.executable, "-m", "envspec", "build", str(lock)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    assert lines[0].startswith(f"built {built['image']} in ")
    # only tagged in the store: the uncompressed image's digest, said so (docs/build.md, "Which digest")
    assert built["compression"] == "none" and built["digest"] == built["store_digest"]
    assert lines[1].startswith(f"digest {built['digest']} (its layers uncompressed")
    assert lines[2] == f"image id {built['config']}"
    assert lines[3].startswith(f"stored in containers-storage at {storage}")
    listed = subprocess.run(
        shlex.split(lines[4].removeprefix("  list it: ")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built["image"].rsplit(":", 1)[1] in listed.stdout
    assert (
        f"envspec run {lock}" in cp.stdout
        and f"envspec run {lock} --no-mount -- envspec verify" in cp.stdout
    )

    # `envspec run` as printed: the command's own exit status comes back, and no container stays
    # (podman 4.3's --rm can lose the status: envspec runs it by name and removes it after)
    cp = subprocess.run(
        [
            sys.executable,
            "-m",
            "envspec",
            "run",
            str(lock),
            "--no-mount",
            "--",
            "sh",
            "-c",
            "exit 3",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cp.returncode == 3, cp.stdout + cp.stderr
    from envspec.host import ASK_NONE, detect_host

    ps = subprocess.run(
        ["podman", *detect_host(ask=ASK_NONE).storage.args(), "ps", "-a", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ps.returncode == 0 and "envspec-run-" not in ps.stdout, ps.stdout + ps.stderr

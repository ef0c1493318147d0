"""The import beside the layer makers (image/importer.py) and the feed of a growing file
(engine._feed), with a fake store that reads each layer through the real feed; the real
containers-storage tool is exercised by tests/e2e/test_build_e2e.py."""

import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from envspec import host as host_mod
from envspec.errors import BuildError, HashMismatch
from envspec.image import engine as eng_mod
from envspec.image import importer as importer_mod
from envspec.image.engine import Cancelled, LayerPut, Staged, chain_id
from envspec.image.importer import Importer, LayerFile
from envspec.image.records import LayerMeta, LayerSource


def test_chain_id_is_containers_image_style():
    assert chain_id("", "sha256:" + "ab" * 32) == "ab" * 32
    assert (
        chain_id("p" * 64, "sha256:" + "cd" * 32)
        == hashlib.sha256(("p" * 64 + "+" + "cd" * 32).encode()).hexdigest()
    )


def _reader(fd: int, into: bytearray) -> threading.Thread:
    def run():
        while chunk := os.read(fd, 65536):
            into.extend(chunk)
        os.close(fd)

    t = threading.Thread(target=run)
    t.start()
    return t


def test_feed_sends_the_whole_file_and_reports_progress(tmp_path):
    data = os.urandom(2_500_000)  # more than two chunks
    (tmp_path / "cuda.tar").write_bytes(data)
    r, w = os.pipe()
    got = bytearray()
    reader = _reader(r, got)
    sent = []
    with os.fdopen(w, "wb") as pipe:
        eng_mod._feed(pipe, tmp_path / "cuda.tar", len(data), threading.Event(), sent.append)
    reader.join()
    assert bytes(got) == data
    assert sent[-1] == len(got) and sent == sorted(sent)


def test_feed_stops_on_cancel(tmp_path):
    (tmp_path / "t.tar").write_bytes(b"x" * 10)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled), open(os.devnull, "wb") as pipe:
        eng_mod._feed(pipe, tmp_path / "t.tar", 10, cancel, lambda n: None)


def test_feed_refuses_a_file_shorter_than_its_maker_says(tmp_path):
    (tmp_path / "short.tar").write_bytes(b"y" * 10)
    with pytest.raises(BuildError, match="ends at 10 bytes"), open(os.devnull, "wb") as pipe:
        eng_mod._feed(pipe, tmp_path / "short.tar", 20, threading.Event(), lambda n: None)


def test_checked_feed_sends_the_file_and_accepts_its_own_digest(tmp_path):
    data = os.urandom(2_500_000)
    (tmp_path / "cuda.tar").write_bytes(data)
    r, w = os.pipe()
    got = bytearray()
    reader = _reader(r, got)
    with os.fdopen(w, "wb") as pipe:
        eng_mod._feed(
            pipe,
            tmp_path / "cuda.tar",
            len(data),
            threading.Event(),
            lambda n: None,
            want="sha256:" + hashlib.sha256(data).hexdigest(),
        )
    reader.join()
    assert bytes(got) == data


def test_checked_feed_refuses_a_file_whose_bytes_changed(tmp_path):
    data = os.urandom(300_000)
    (tmp_path / "cuda.tar").write_bytes(data[:-1] + b"!")  # the cached file, damaged on disk
    with (
        pytest.raises(HashMismatch, match="cached layer file") as e,
        open(os.devnull, "wb") as pipe,
    ):
        eng_mod._feed(
            pipe,
            tmp_path / "cuda.tar",
            len(data),
            threading.Event(),
            lambda n: None,
            want="sha256:" + hashlib.sha256(data).hexdigest(),
        )
    assert "--no-cache" in e.value.hint


def test_put_layer_tool_is_found_by_env_beside_python_or_on_path(tmp_path, monkeypatch):
    tool = tmp_path / "bin" / "envspec-put-layer"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("ENVSPEC_PUT_LAYER", str(tool))
    assert host_mod.find_put_layer() == str(tool)
    monkeypatch.setenv("ENVSPEC_PUT_LAYER", "off")
    assert host_mod.find_put_layer() is None
    monkeypatch.delenv("ENVSPEC_PUT_LAYER")
    monkeypatch.setattr(host_mod.sys, "executable", str(tmp_path / "bin" / "python"))
    assert host_mod.find_put_layer() == str(tool)
    monkeypatch.setattr(host_mod.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert host_mod.find_put_layer() == str(tool)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert host_mod.find_put_layer() is None


def test_importer_stops_on_the_makers_error_and_stores_nothing(tmp_path, store_kind):
    store = store_kind()
    fut: Future = Future()
    imp = Importer(store, [LayerFile("torch", tmp_path / "t.tar", fut)]).start()
    fut.set_exception(BuildError("wheel rejected", step="layer torch"))
    with pytest.raises(BuildError, match="wheel rejected"):
        imp.finish(b"{}", b"{}", "localhost/envspec/x:1")
    assert store.layers == {} and store.images == {}


class FakeStore:
    """Layers by ID with their content read through the real feed; records every call."""

    can_stage = False

    def __init__(self, corrupt: str = ""):
        self.layers: dict[str, tuple[str, str]] = {}  # id -> (parent, diff digest)
        self.calls: list[tuple] = []
        self.images: dict[str, tuple] = {}
        self.corrupt = corrupt  # a group whose bytes the "store" gets wrong
        self.checked: dict[
            str, bool
        ] = {}  # group -> whether the importer asked for its file to be hashed

    @contextlib.contextmanager
    def locked(self):
        yield

    def layer_diff_id(self, layer_id):
        return self.layers[layer_id][1] if layer_id in self.layers else None

    def delete_layer(self, layer_id):
        self.calls.append(("delete", layer_id))
        self.layers.pop(layer_id, None)

    def put_layer(self, layer_id, parent, tar, size, put=LayerPut()):
        name, check, cancel, progress = put.name, put.check, put.cancel, put.progress
        if layer_id in self.layers:
            return self.layers[layer_id][1], False
        self.checked[name] = check
        r, w = os.pipe()
        got = bytearray()
        reader = _reader(r, got)
        try:
            with os.fdopen(w, "wb") as pipe:
                eng_mod._feed(pipe, tar, size, cancel or threading.Event(), progress)
        finally:
            reader.join()
        group = name
        if group == self.corrupt:
            got += b"!"
        digest = "sha256:" + hashlib.sha256(bytes(got)).hexdigest()
        self.layers[layer_id] = (parent, digest)
        self.calls.append(("put", layer_id, parent, group))
        return digest, True

    def put_image(self, config, manifest, top, ref):
        self.images[ref] = (config, manifest, top)


class FakeStage:
    """A stager in a thread: follows the file at ``fd`` (a copy of it) as envspec-put-layer stage does,
    hashing what it reads."""

    def __init__(self, fd, follow, size, name, corrupt, progress):
        self.f = os.fdopen(os.dup(fd), "rb", buffering=0)
        self.final = size
        self.closed = False
        self.killed = False
        self.name, self.corrupt, self.progress = name, corrupt, progress
        self.out: dict | None = None
        self.error: str = ""
        self.tree: Path | None = None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self):
        h, n = hashlib.sha256(), 0
        while not self.killed:
            chunk = self.f.read(65536 if self.final is None else min(65536, self.final - n))
            if chunk:
                h.update(chunk)
                n += len(chunk)
                self.progress(n)
                continue
            if self.final is not None and n >= self.final:
                break
            if self.final is not None or self.closed:
                self.error = "the maker stopped" if self.closed else "short file"
                return
            time.sleep(0.005)
        self.out = Staged(
            {
                "staging": str(self.tree) if self.tree is not None else f"/staged/{self.name}",
                "tar_split": "",
                "size": n + (self.name == self.corrupt),
            }
        )

    def end(self, size):
        self.final = size

    def close(self):
        self.closed = True

    def wait(self, halt):
        while self.thread.is_alive():
            if halt.is_set():
                self.kill()
                raise Cancelled()
            self.thread.join(0.05)
        self.f.close()
        if self.out is None:
            raise BuildError(f"staging {self.name} failed: {self.error}", step="import layer")
        return self.out

    def kill(self):
        self.killed = True
        self.thread.join()


class StagingStore(FakeStore):
    """The staged import: layers untarred while written (FakeStage), made in order by commit_staged."""

    can_stage = True

    def __init__(self, corrupt: str = ""):
        super().__init__(corrupt)
        import shutil
        import tempfile
        import weakref

        self.root = Path(tempfile.mkdtemp(prefix="envspec-test-staging-"))
        weakref.finalize(self, shutil.rmtree, self.root, True)  # no folder left in /tmp per test
        self.stages: list[tuple[str, bool]] = []  # (group, followed)
        self.owns: list[tuple[str, bool]] = []  # (group, told it is this build's own tar)
        self.trees: list[
            tuple[str, list[str]]
        ] = []  # (group, files in the tree its maker made, when staged)
        self.fed: dict[
            str, tuple[str, int | None]
        ] = {}  # group -> (what its stager read: fifo/file, its niceness)

    def clean_staging(self):
        self.calls.append(("clean",))

    def prepare(self):
        self.calls.append(("prepare",))

    def staging_root(self):
        return self.root

    def make_staging_root(self):
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root

    def stored_layers(self):
        return {lid: d for lid, (_, d) in self.layers.items()}

    def stage(
        self, fd, *, follow, size, name="", tree=None, own=False, progress=lambda n: None, nice=None
    ):
        self.stages.append((name, follow))
        self.owns.append((name, own))
        self.fed[name] = ("fifo" if stat.S_ISFIFO(os.fstat(fd).st_mode) else "file", nice)
        stage = FakeStage(fd, follow, size, name, self.corrupt, progress)
        stage.tree = tree
        return stage

    def commit_staged(self, layer_id, parent, diff_id, staged):
        if layer_id in self.layers:
            return self.layers[layer_id][1], False
        self.layers[layer_id] = (parent, diff_id)
        tree = Path(staged.staging)
        group = tree.name.split("-")[1] if tree.is_dir() else tree.name  # a tree is PID-GROUP-...
        self.calls.append(("put", layer_id, parent, group))
        if tree.is_dir():  # the files its maker made: moved into the "store"
            self.trees.append((group, sorted(p.name for p in tree.rglob("*"))))
            shutil.rmtree(tree)
        return diff_id, True


@pytest.fixture(params=["serial", "staged"])
def store_kind(request):
    return FakeStore if request.param == "serial" else StagingStore


def _meta(data: bytes, source: LayerSource = "made") -> LayerMeta:
    return LayerMeta("sha256:" + hashlib.sha256(data).hexdigest(), len(data), source)


def _files(tmp_path, groups, source: LayerSource = "made"):
    out = []
    for g in groups:
        data = (g * 1000).encode()
        (tmp_path / f"{g}.tar").write_bytes(data)
        fut: Future = Future()
        fut.set_result(_meta(data, source))
        out.append(LayerFile(g, tmp_path / f"{g}.tar", fut))
    return out


def test_importer_chains_ids_by_diff_id_and_names_the_image_last(tmp_path, store_kind):
    store = store_kind()
    files = _files(tmp_path, ["base", "cuda", "envspec"])
    imp = Importer(store, files).start()
    imp.finish(b"{config}", b"{manifest}", "localhost/envspec/x:1")
    base_id = chain_id("", files[0].made.result().diff_id)
    cuda_id = chain_id(base_id, files[1].made.result().diff_id)
    top_id = chain_id(cuda_id, files[2].made.result().diff_id)
    assert [c[1:3] for c in store.calls if c[0] == "put"] == [
        (base_id, ""),
        (cuda_id, base_id),
        (top_id, cuda_id),
    ]
    assert store.images["localhost/envspec/x:1"] == (b"{config}", b"{manifest}", top_id)
    assert imp.stored == ["base", "cuda", "envspec"]

    again = Importer(
        store, _files(tmp_path, ["base", "cuda", "envspec"])
    ).start()  # all there: nothing put
    again.finish(b"{config}", b"{manifest}", "localhost/envspec/x:2")
    assert again.stored == [] and len([c for c in store.calls if c[0] == "put"]) == 3


def test_importer_drops_a_layer_whose_stored_digest_differs(tmp_path, store_kind):
    store = store_kind(corrupt="cuda")
    imp = Importer(store, _files(tmp_path, ["base", "cuda", "envspec"])).start()
    with pytest.raises(HashMismatch, match="cuda"):
        imp.finish(b"{}", b"{}", "localhost/envspec/x:1")
    assert store.images == {}
    base_id = chain_id("", "sha256:" + hashlib.sha256(b"base" * 1000).hexdigest())
    cuda_id = chain_id(base_id, "sha256:" + hashlib.sha256(b"cuda" * 1000).hexdigest())
    assert (
        cuda_id not in store.layers
    )  # dropped (serial), or never made (staged: checked before the commit)
    assert ("delete", cuda_id) in store.calls or store.can_stage


def test_importer_abort_stops_a_layer_still_being_made(tmp_path, store_kind):
    store = store_kind()
    fut: Future = Future()
    (tmp_path / "cuda.tar").write_bytes(b"partial")
    imp = Importer(
        store, [LayerFile("cuda", tmp_path / "cuda.tar", fut)]
    ).start()  # waits for the maker
    time.sleep(0.2)
    imp.abort()
    assert store.images == {} and store.layers == {}
    with pytest.raises(Cancelled):
        imp.join()


def _grow(
    path: Path, data: bytes, fut: Future, *, fail: bool = False, step: int = 4096
) -> threading.Thread:
    """A maker in a thread: writes ``path`` in pieces, then resolves ``fut`` (or fails it half-way)."""

    def run():
        with open(path, "wb") as f:
            for i in range(0, len(data), step):
                if fail and i >= len(data) // 2:
                    fut.set_exception(BuildError("wheel rejected", step="layer torch"))
                    return
                f.write(data[i : i + step])
                f.flush()
                time.sleep(0.002)
        fut.set_result(_meta(data))

    t = threading.Thread(target=run)
    return t


def test_staged_import_follows_a_layer_while_its_maker_writes_it(tmp_path):
    store = StagingStore()
    data = os.urandom(400_000)
    fut: Future = Future()
    writing = tmp_path / "torch.tar"
    maker = _grow(writing, data, fut)
    imp = Importer(
        store, [LayerFile("torch", tmp_path / "cache.tar", fut, writing=writing)]
    ).start()
    maker.start()
    imp.finish(b"{}", b"{}", "localhost/envspec/x:1")
    maker.join()
    assert store.stages == [("torch", True)]  # opened while written, not after
    assert store.owns == [("torch", True)]  # its maker is this build's: untarred without a chroot
    assert list(store.layers.values()) == [("", "sha256:" + hashlib.sha256(data).hexdigest())]
    assert imp.stored == ["torch"]


def test_staged_import_stops_with_the_makers_error_when_the_maker_fails_half_way(tmp_path):
    store = StagingStore()
    fut: Future = Future()
    writing = tmp_path / "torch.tar"
    maker = _grow(writing, os.urandom(400_000), fut, fail=True)
    imp = Importer(
        store, [LayerFile("torch", tmp_path / "cache.tar", fut, writing=writing)]
    ).start()
    maker.start()
    with pytest.raises(BuildError, match="wheel rejected"):
        imp.finish(b"{}", b"{}", "localhost/envspec/x:1")
    maker.join()
    assert store.stages == [("torch", True)] and store.layers == {} and store.images == {}


def test_staged_import_refuses_a_cached_layer_file_whose_bytes_changed(tmp_path):
    files = _files(tmp_path, ["base", "cuda"], source="local")
    (tmp_path / "cuda.tar").write_bytes(b"CUDA" + b"cuda" * 999)  # same size, other bytes
    store = StagingStore()
    with pytest.raises(HashMismatch, match="cached layer file .*cuda.tar"):
        Importer(store, files).start().finish(b"{}", b"{}", "localhost/envspec/x:1")
    assert [c[3] for c in store.calls if c[0] == "put"] == ["base"] and store.images == {}


def test_only_a_tar_this_build_made_is_staged_as_its_own(tmp_path):
    """A layer from the layer cache or a registry is untarred chrooted (until its digest is
    checked, its entries could point anywhere); one this build's maker wrote is not."""
    files = [
        _files(tmp_path, [group], source)[0]
        for group, source in zip(
            ["base", "cuda", "team", "envspec"], ["made", "local", "registry", "store"]
        )
    ]
    store = StagingStore()
    Importer(store, files).start().finish(b"{}", b"{}", "localhost/envspec/x:1")
    assert sorted(store.owns) == [
        ("base", True),
        ("cuda", False),
        ("envspec", False),
        ("team", False),
    ]


def test_stage_passes_own_only_to_a_tool_that_knows_it(tmp_path, monkeypatch):
    """``--own`` goes to a tool whose ``stage -h`` lists it, for a tar it untars (not a --tree)."""
    import subprocess as sp

    usage = (
        "Usage of envspec-put-layer stage:\n  -fd int\n    \tthe tar\n  -follow\n    \tx\n"
        "  -tree string\n    \ty\n"
    )
    tools = {}
    for name, extra in (("new", "  -own\n    \tz\n"), ("old", "")):
        t = tmp_path / name
        t.write_text(f"#!/bin/sh\nprintf '{usage}{extra}' >&2\nexit 2\n")
        t.chmod(0o755)
        tools[name] = str(t)
    assert "own" in eng_mod._stage_flags(tools["new"]) and "tree" in eng_mod._stage_flags(
        tools["new"]
    )
    assert "own" not in eng_mod._stage_flags(tools["old"])
    argvs = []

    class Proc:
        def __init__(self, argv, **kw):
            argvs.append(argv)
            self.args, self.stdout, self.stdin = argv, None, None

    monkeypatch.setattr(sp, "Popen", Proc)
    monkeypatch.setattr(eng_mod.Stage, "start", lambda self: self)
    for name in ("new", "old"):
        st = eng_mod.StorageCLI(
            None, str(tmp_path / "g"), str(tmp_path / "r"), "overlay", put_tool=tools[name]
        )
        st.stage(0, follow=True, size=None, own=True)
        st.stage(0, follow=True, size=None, own=True, tree=tmp_path / "t")
        st.stage(0, follow=False, size=5, own=False)
    assert ["--own" in a for a in argvs] == [True, False, False, False, False, False]


def test_staged_import_skips_a_cached_layer_the_store_has(tmp_path):
    store = StagingStore()
    Importer(store, _files(tmp_path, ["base", "cuda"])).start().finish(
        b"{}", b"{}", "localhost/envspec/x:1"
    )
    assert sorted(g for g, _ in store.stages) == ["base", "cuda"]
    again = Importer(store, _files(tmp_path, ["base", "cuda", "envspec"])).start()
    again.finish(b"{}", b"{}", "localhost/envspec/x:2")
    assert sorted(g for g, _ in store.stages) == [
        "base",
        "cuda",
        "envspec",
    ]  # base and cuda not staged again
    assert again.stored == ["envspec"]


# --- build() with a store: layers go in beside the makers -----------------------------------------

import sys  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data" / "build"))
import helpers  # noqa: E402

from envspec import sources  # noqa: E402
from envspec.cache.store import Cache  # noqa: E402
from envspec.image import BuildOptions, RecordingEngine  # noqa: E402
from envspec.image import build as _build  # noqa: E402
from envspec.plan import make_plan  # noqa: E402


def build(lock, *, engine, cache_dir, mirrors, **options):
    return _build(
        make_plan(lock), engine, Cache(cache_dir), mirrors, options=BuildOptions(**options)
    )


WHEELS = [
    ("cudalib", "1.0", "cuda"),
    ("torchish", "2.0", "torch"),
    ("depa", "0.1", "deps"),
    ("teampkg", "1.0", "team"),
]


class StoreEngine(RecordingEngine):
    def __init__(self, store):
        super().__init__()
        self.store = store

    def storage_cli(self):
        return self.store


class Naming:
    """A fake store that also tells its engine the images it names (mixed into FakeStore/StagingStore)."""

    def __init__(self, engine_images, **kw):
        super().__init__(**kw)
        self.engine_images = engine_images

    def put_image(self, config, manifest, top, ref):
        super().put_image(config, manifest, top, ref)
        self.engine_images[ref] = "sha256:" + hashlib.sha256(manifest).hexdigest()


class NamingStore(Naming, FakeStore):
    pass


class NamingStagingStore(Naming, StagingStore):
    pass


def _store_engine(staged=False, **kw):
    eng = StoreEngine(None)
    eng.store = (NamingStagingStore if staged else NamingStore)(eng.images, **kw)
    return eng


@pytest.fixture(params=[False, True], ids=["serial", "staged"])
def staged(request, monkeypatch):
    """Whether the build's store stages its layers; ``hashed``: the files a staged import hashed."""
    hashed: list[str] = []
    real = importer_mod._sha256_file
    monkeypatch.setattr(
        importer_mod,
        "_sha256_file",
        lambda path, halt: hashed.append(path.name) or real(path, halt),
    )
    request.node.hashed = hashed
    return request.param


def test_build_imports_each_layer_with_the_store_and_names_it_last(tmp_path, staged, request):
    lock, mirror = helpers.local_lock(tmp_path, WHEELS)
    mirrors = [sources.Mirror(mirror.as_uri(), "links", "test")]
    eng = _store_engine(staged)
    img = build(lock, engine=eng, cache_dir=tmp_path / "cache", mirrors=mirrors)
    puts = [c for c in eng.store.calls if c[0] == "put"]
    assert [c[3] for c in puts] == [lay.group for lay in img.layers]
    assert eng.images[img.image] == img.store_digest
    assert not [c for c in eng.calls if c[0] == "import_image"]  # skopeo not used
    stored = {c[1]: eng.store.layers[c[1]][1] for c in puts}
    assert sorted(stored.values()) == sorted(lay.diff_id for lay in img.layers)

    again = build(
        lock, engine=eng, cache_dir=tmp_path / "cache", mirrors=mirrors
    )  # no-op: nothing put
    assert again.digest == img.digest and len([c for c in eng.store.calls if c[0] == "put"]) == len(
        puts
    )

    new = build(
        lock,
        engine=eng,
        cache_dir=tmp_path / "cache2",
        mirrors=mirrors,
        no_cache=True,
        tag="localhost/envspec/again:1",
    )  # made again, same bytes: only the name is new
    assert new.digest == img.digest and len([c for c in eng.store.calls if c[0] == "put"]) == len(
        puts
    )
    assert eng.images["localhost/envspec/again:1"] == img.store_digest
    # made in this build: the maker's digest is trusted, the file is not hashed again on its way
    # (a staged one: its size is compared with the maker's)
    assert eng.store.checked == ({} if staged else {lay.group: False for lay in img.layers})
    assert request.node.hashed == []
    if (
        staged
    ):  # the wheel layers' makers made their files in the staging area too (the torch layer's
        # maker, the critical path, only its tar: its stager untars it); nothing is left there
        assert {g for g, names in eng.store.trees if names} == {g for _, _, g in WHEELS} - {"torch"}
        assert [g for g, names in eng.store.trees if not names] in ([], ["torch"])
        assert "cudalib" in " ".join(
            n for g, names in eng.store.trees if g == "cuda" for n in names
        )
        assert list(eng.store.root.iterdir()) == []
        # each layer made here reached its stager through a FIFO from its maker (the tar went to the
        # cache past the page cache), the stager at the makers' priority; the envspec layer, made
        # after the makers, from its file
        assert eng.store.fed == {
            **{lay.group: ("fifo", 0) for lay in img.layers if lay.group != "envspec"},
            "envspec": ("file", None),
        }


def test_layers_from_the_cache_are_hashed_on_their_way_into_a_new_store(tmp_path, staged, request):
    lock, mirror = helpers.local_lock(tmp_path, WHEELS)
    mirrors = [sources.Mirror(mirror.as_uri(), "links", "test")]
    img = build(lock, engine=_store_engine(staged), cache_dir=tmp_path / "cache", mirrors=mirrors)
    eng = _store_engine(staged)  # an empty store, the same layer cache
    again = build(lock, engine=eng, cache_dir=tmp_path / "cache", mirrors=mirrors)
    assert again.digest == img.digest
    cached = {lay.group for lay in again.layers if lay.cached}
    assert cached == {lay.group for lay in again.layers}  # the envspec layer too (issue 59)
    if staged:
        assert len(request.node.hashed) == len(cached)
    else:
        assert eng.store.checked == {lay.group: lay.group in cached for lay in again.layers}


def test_a_failing_maker_stops_the_import_and_names_nothing(tmp_path, staged):
    lock, mirror = helpers.local_lock(tmp_path, WHEELS)
    mirrors = [sources.Mirror(mirror.as_uri(), "links", "test")]
    eng = _store_engine(staged)
    with pytest.raises(HashMismatch):
        build(
            helpers.with_wheel(lock, "depa", sha256="0" * 64),
            engine=eng,
            cache_dir=tmp_path / "cache",
            mirrors=mirrors,
        )
    assert eng.images == {} and eng.store.images == {}


def test_a_store_that_reads_other_bytes_stops_the_build(tmp_path, staged):
    lock, mirror = helpers.local_lock(tmp_path, WHEELS)
    mirrors = [sources.Mirror(mirror.as_uri(), "links", "test")]
    eng = _store_engine(staged, corrupt="torch")
    with pytest.raises(HashMismatch, match="torch"):
        build(lock, engine=eng, cache_dir=tmp_path / "cache", mirrors=mirrors)
    assert eng.images == {} and not any(
        lay[1]
        for lid, lay in eng.store.layers.items()
        if ("put", lid, lay[0], "torch") in eng.store.calls
    )


def test_nothing_else_opens_the_store_while_its_layers_go_in(tmp_path, staged):
    """A buildah or podman run on the store empties its staging directory as it ends (overlay's
    Cleanup): the build asks the store for the image only where no import is under way, and
    otherwise once the import has ended."""
    lock, mirror = helpers.local_lock(tmp_path, WHEELS)
    mirrors = [sources.Mirror(mirror.as_uri(), "links", "test")]
    eng = _store_engine(staged)
    log = eng.store.calls  # the store's calls and the engine's, in order
    slow_put = eng.store.put_layer
    slow_commit = getattr(eng.store, "commit_staged", None)

    def put_layer(*a, **kw):
        time.sleep(0.2)  # the import lags behind the makers
        return slow_put(*a, **kw)

    def commit_staged(*a, **kw):
        time.sleep(0.2)
        assert slow_commit is not None
        return slow_commit(*a, **kw)

    eng.store.put_layer = put_layer
    eng.store.commit_staged = commit_staged
    real_digest = eng.image_digest
    eng.image_digest = lambda ref: log.append(("image_digest", ref)) or real_digest(ref)
    img = build(lock, engine=eng, cache_dir=tmp_path / "cache", mirrors=mirrors)
    verbs = [c[0] for c in log if c[0] in ("put", "image_digest")]
    last_put = max(i for i, verb in enumerate(verbs) if verb == "put")
    assert verbs.count("put") == len(img.layers)
    assert "image_digest" not in verbs[:last_put]


def test_a_layer_whose_staged_files_another_process_removed_is_staged_again_from_its_file(
    tmp_path,
):
    """envspec-put-layer commit exits 3 where a buildah or podman run on the store emptied its
    staging directory first: the importer stages that layer again from the file its maker
    wrote, and the build goes on; a layer emptied every time stops it."""
    lock, mirror = helpers.local_lock(tmp_path, WHEELS)
    mirrors = [sources.Mirror(mirror.as_uri(), "links", "test")]

    def emptying(times):
        eng = _store_engine(staged=True)
        real = eng.store.commit_staged
        left = {"deps": times}

        def commit_staged(layer_id, parent, diff_id, staged):
            name = Path(staged.staging).name  # a tree is PID-GROUP-...
            group = name.split("-")[1] if "-" in name else name
            if left.get(group, 0) > 0:
                left[group] -= 1
                eng_mod._drop_staged(staged)
                raise eng_mod.StagingEmptied("emptied (fake)", step="import layer")
            return real(layer_id, parent, diff_id, staged)

        eng.store.commit_staged = commit_staged
        return eng

    eng = emptying(1)
    img = build(lock, engine=eng, cache_dir=tmp_path / "cache", mirrors=mirrors)
    assert eng.images[img.image] == img.store_digest
    assert [g for g, _ in eng.store.stages].count("deps") == 2
    assert eng.store.fed["deps"] == ("file", None)  # the second time from the finished file
    puts = [c[3] for c in eng.store.calls if c[0] == "put"]
    assert puts == [lay.group for lay in img.layers]

    eng = emptying(importer_mod.STAGE_TRIES)
    with pytest.raises(eng_mod.StagingEmptied):
        build(lock, engine=eng, cache_dir=tmp_path / "cache2", mirrors=mirrors, no_cache=True)
    assert eng.images == {} and [g for g, _ in eng.store.stages].count("deps") == 3


def test_an_envspec_put_layer_without_stage_imports_one_layer_after_the_other(
    tmp_path, monkeypatch
):
    """A tool built before `stage` existed (a venv not set up again) is used the old way."""
    old, new = tmp_path / "old", tmp_path / "new"
    old.write_text(
        "#!/bin/sh\necho 'envspec-put-layer: --graph, --run, --id and --diff-digest are required' >&2\nexit 2\n"
    )
    new.write_text(
        "#!/bin/sh\necho 'envspec-put-layer: stage: --graph and one of --fd or --file are required' >&2\n"
        "exit 2\n"
    )
    for f in (old, new):
        f.chmod(0o755)
    monkeypatch.delenv("ENVSPEC_STAGED_IMPORT", raising=False)

    def store(tool, driver="overlay"):
        return eng_mod.StorageCLI(
            None, str(tmp_path / "g"), str(tmp_path / "r"), driver, put_tool=str(tool)
        )

    assert store(new).can_stage and not store(old).can_stage and not store(new, "vfs").can_stage
    monkeypatch.setenv("ENVSPEC_STAGED_IMPORT", "off")
    assert not store(new).can_stage


def test_a_maker_waiting_for_its_stager_goes_on_when_the_import_fails_before_staging(tmp_path):
    """The importer removes the FIFOs it will never read: a maker waiting to hand its tar over
    writes the file alone instead of waiting for a reader (tarball.PipeTee)."""
    from envspec.image.tarball import PipeTee

    class Broken(StagingStore):
        def clean_staging(self):
            raise BuildError("the store is gone", step="import layer")

    fifo = tmp_path / "torch.tar.fifo"
    os.mkfifo(fifo)
    fut: Future = Future()
    tees: list[PipeTee] = []
    maker = threading.Thread(target=lambda: tees.append(PipeTee(fifo, wait=60)))
    maker.start()
    imp = Importer(
        Broken(),
        [
            LayerFile(
                "torch", tmp_path / "cache.tar", fut, writing=tmp_path / "torch.tar", pipe=fifo
            )
        ],
    ).start()
    with pytest.raises(BuildError, match="the store is gone"):
        imp.join()
    maker.join(60)
    assert not maker.is_alive() and tees[0].fd == -1 and not fifo.exists()


def _import_stream(tmp_path, group, path, stream):
    """One layer ``group`` streamed through its FIFO (``regcache.stream_layers``' part played by
    ``stream(tee, fifo, made, streamed)`` on a thread) into a StagingStore's import, run to its end."""
    from envspec.image.tarball import PipeTee

    store = StagingStore()
    fifo = tmp_path / f"{group}.tar.fifo"
    os.mkfifo(fifo)
    made: Future = Future()
    streamed: Future = Future()
    imp = Importer(store, [LayerFile(group, path, made, pipe=fifo, streamed=streamed)]).start()
    t = threading.Thread(target=lambda: stream(PipeTee(fifo, wait=60), fifo, made, streamed))
    t.start()
    imp.finish(b"{}", b"{}", "localhost/envspec/x:1")
    t.join()
    return store, imp


def test_a_stream_that_fails_its_checks_is_staged_again_from_the_layer_made_here(tmp_path):
    """regcache.stream_layers: a layer from the registry cache comes through its FIFO; a stream
    that fails (here half-way) ends its future with the error, its stager is killed, and the
    layer, made here instead, is staged from its file (a chrooted untar: not this build's own)."""
    from envspec.registry.regcache import BadEntry

    data = os.urandom(300_000)

    def stream(tee, fifo, made, streamed):
        tee.write(memoryview(data[: len(data) // 2]))
        tee.close()
        streamed.set_exception(BadEntry("the blob's bytes are not the ones recorded"))
        fifo.unlink()
        (tmp_path / "torch.tar").write_bytes(data)  # made here after all
        made.set_result(_meta(data, "made"))

    store, imp = _import_stream(tmp_path, "torch", tmp_path / "torch.tar", stream)
    assert store.stages == [("torch", True), ("torch", False)]  # the stream followed, then the file
    assert store.owns == [
        ("torch", False),
        ("torch", True),
    ]  # the registry's bytes chrooted; its own file not
    assert list(store.layers.values()) == [("", "sha256:" + hashlib.sha256(data).hexdigest())]
    assert ("prepare",) in store.calls


def test_a_stream_that_holds_is_committed_without_a_file(tmp_path):
    data = os.urandom(200_000)

    def stream(tee, fifo, made, streamed):
        for i in range(0, len(data), 65536):
            tee.write(memoryview(data[i : i + 65536]))
        tee.close()
        streamed.set_result(True)
        made.set_result(_meta(data, "registry"))

    store, imp = _import_stream(tmp_path, "base", tmp_path / "nowhere.tar", stream)
    assert store.stages == [("base", True)] and store.owns == [("base", False)]
    assert not (tmp_path / "nowhere.tar").exists()
    assert imp.stored == ["base"]


def _fs_type(p: Path) -> str:
    return subprocess.run(
        ["stat", "-f", "-c", "%T", str(p)], capture_output=True, text=True
    ).stdout.strip()


def test_the_staging_area_spreads_its_directories_over_block_groups(tmp_path):
    """ext4's top-directory flag on the staging area (issue 59): set once, the other flags kept;
    a file system without it (tmpfs) is left as it is."""
    from envspec.image.engine import FS_TOPDIR_FL, spread_dirs

    d = tmp_path / "overlay" / "envspec-staging"
    d.mkdir(parents=True)
    if not _fs_type(d).startswith("ext"):
        pytest.skip(f"{tmp_path} is {_fs_type(d)}, not ext2/3/4")
    before = subprocess.run(["lsattr", "-d", str(d)], capture_output=True, text=True).stdout
    assert "T" not in before.split()[0]
    assert spread_dirs(d) and spread_dirs(d)  # twice: the flag is there, nothing changes
    after = subprocess.run(["lsattr", "-d", str(d)], capture_output=True, text=True).stdout
    flags = after.split()[0]
    assert "T" in flags and flags.replace("T", "-") == before.split()[0]
    assert FS_TOPDIR_FL == 0x00020000
    shm = Path("/dev/shm")
    if shm.is_dir() and _fs_type(shm) == "tmpfs":
        assert not spread_dirs(shm)
    assert not spread_dirs(tmp_path / "missing")

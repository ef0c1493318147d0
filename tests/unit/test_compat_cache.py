"""The cache of checked compatibility DBs (envspec.compat.cache): a DB read from it is the DB the
data files give when they are checked, model for model and field for field; an entry that is not
whole, or of other data, code or versions, is never used; bad data is never stored."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import envspec
from envspec.compat import DATA_DIR, CompatDB, load_db
from envspec.compat import cache as dbcache
from envspec.compat import load as dbload
from envspec.compat.model import CudaToolkit, Gpu, TorchRelease, Variant
from envspec.errors import CompatDBError

ROOT = Path(__file__).resolve().parents[2]
NAMES = [dbload.MANIFEST, *dbload.FILES]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch) -> Path:
    """Each test gets an empty cache and an empty in-process cache of loaded DBs."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("ENVSPEC_CACHE", str(folder))
    dbload._load_cached.cache_clear()
    yield folder / dbcache.SUBDIR
    dbload._load_cached.cache_clear()


def _copy(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    shutil.copytree(DATA_DIR, d)
    return d


def _same_model(a, b, where: str) -> None:
    assert type(a) is type(b), where
    for name in type(a).model_fields:
        va, vb = getattr(a, name), getattr(b, name)
        if isinstance(va, dict) and va and isinstance(next(iter(va.values())), Variant):
            assert list(va) == list(vb), f"{where}.{name}"  # order: ascending CUDA
            for k in va:
                _same_model(va[k], vb[k], f"{where}.{name}[{k}]")
            continue
        assert type(va) is type(vb) and va == vb, f"{where}.{name}: {va!r} != {vb!r}"
        if isinstance(va, list):
            assert [type(x) for x in va] == [type(x) for x in vb], f"{where}.{name}"
    assert a.model_fields_set == b.model_fields_set, where
    assert (
        a.__pydantic_extra__ == b.__pydantic_extra__
        and a.__pydantic_private__ == b.__pydantic_private__
    ), where
    assert a == b, where


def _same_db(checked: CompatDB, cached: CompatDB) -> None:
    assert (cached.version, cached.date, cached.format, cached.sources) == (
        checked.version,
        checked.date,
        checked.format,
        checked.sources,
    )
    for kind in ("torch_releases", "cuda_toolkits", "gpus"):
        a, b = getattr(checked, kind), getattr(cached, kind)
        assert len(a) == len(b) > 0, kind
        for i, (x, y) in enumerate(zip(a, b)):
            _same_model(x, y, f"{kind}[{i}]")
    # the lookups built from the rows
    assert list(cached._releases) == list(checked._releases) and list(cached._toolkits) == list(
        checked._toolkits
    )
    assert {k: g.name for k, g in cached._gpu_keys.items()} == {
        k: g.name for k, g in checked._gpu_keys.items()
    }
    assert cached._gpu_labels == checked._gpu_labels
    assert cached.to_json() == checked.to_json()


def test_the_cached_db_is_the_checked_db_field_by_field(own_cache):
    checked = dbload._build(DATA_DIR)
    key = dbcache.cache_key(DATA_DIR, NAMES)
    assert key
    dbcache.write(key, checked)
    cached = dbcache.read(key)
    assert cached is not None and cached is not checked
    _same_db(checked, cached)
    # what the resolver asks of it answers the same
    for g in checked.gpus:
        for label in [g.name, *g.aliases]:
            assert cached.find_gpu(label) == checked.find_gpu(label), label
    r = cached.torch_releases[-1]
    for v in r.variants.values():
        assert v.served_from("https://mirror.example/whl") == checked.torch_release(
            r.version
        ).variants[v.name].served_from("https://mirror.example/whl")


def test_load_db_stores_the_checked_db_and_a_later_process_reads_it_without_checking(own_cache):
    first = load_db()
    entries = list(own_cache.glob("*.json"))
    assert [p.name for p in entries] == [f"{dbcache.cache_key(DATA_DIR, NAMES)}.json"]
    # a fresh interpreter: the loader's check would fail, so the DB can only come from the cache;
    # no pydantic schema of the DB's models is built, and the row models are not imported
    code = (
        "import json, sys, envspec.compat.load as l, envspec.compat.model as m\n"
        "def no(root):\n    raise AssertionError('checked again')\n"
        "l._build = no\n"
        "db = l.load_db()\n"
        "built = [c.__name__ for c in (m.Variant, m.TorchRelease, m.CudaToolkit, m.Gpu) if c.__pydantic_complete__]\n"
        "rows = 'envspec.compat.rows' in sys.modules\n"
        "json.dump({'db': db.to_json(), 'built': built, 'rows': rows}, sys.stdout)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["built"] == [] and out["rows"] is False  # the row models were not even made
    assert out["db"] == json.loads(json.dumps(first.to_json()))


def test_validate_checks_the_files_whatever_the_cache_holds(own_cache, monkeypatch):
    load_db()
    calls = []
    real = dbload._build
    monkeypatch.setattr(dbload, "_build", lambda root: calls.append(root) or real(root))
    dbload._load_cached.cache_clear()
    load_db()
    assert calls == []  # read from the cache
    load_db(validate=True)
    assert calls == [DATA_DIR.resolve()]


@pytest.mark.parametrize(
    "damage", ["truncated", "payload-changed", "not-json", "other-key", "empty"]
)
def test_an_entry_that_is_not_whole_is_ignored_and_written_again(own_cache, monkeypatch, damage):
    good = load_db()
    (entry,) = own_cache.glob("*.json")
    blob = entry.read_bytes()
    head, _, payload = blob.partition(b"\n")
    if damage == "truncated":
        entry.write_bytes(blob[: len(blob) // 2])
    elif (
        damage == "payload-changed"
    ):  # still valid JSON, other values: the sha256 in the header tells
        entry.write_bytes(head + b"\n" + payload.replace(b'"cc":"9.0"', b'"cc":"9.1"', 1))
    elif damage == "not-json":
        entry.write_bytes(b"\x00\xff garbage\n{")
    elif damage == "other-key":
        meta = json.loads(head)
        meta["key"] = "0" * 64
        entry.write_bytes(json.dumps(meta).encode() + b"\n" + payload)
    else:
        entry.write_bytes(b"")
    assert dbcache.read(entry.stem) is None
    calls = []
    real = dbload._build
    monkeypatch.setattr(dbload, "_build", lambda root: calls.append(root) or real(root))
    dbload._load_cached.cache_clear()
    again = load_db()
    assert calls == [DATA_DIR.resolve()]  # checked again
    _same_db(good, again)
    assert entry.read_bytes() == blob  # and stored anew, whole


def test_changed_data_gets_a_new_key_and_the_old_entry_is_not_used(tmp_path, own_cache):
    d = _copy(tmp_path)
    before = load_db(d)
    h100 = before.find_gpu("H100")
    assert h100 is not None and h100.memory_gib == 80
    key_before = dbcache.cache_key(d, NAMES)
    g = (d / "gpus.toml").read_text()
    assert g.count("memory_gib = 80\n") >= 1
    (d / "gpus.toml").write_text(
        g.replace('name = "NVIDIA H100 80GB HBM3"', 'name = "NVIDIA H100 80GB HBM3 test"', 1)
    )
    dbload._load_cached.cache_clear()
    after = load_db(d)
    assert dbcache.cache_key(d, NAMES) != key_before
    assert after.find_gpu("NVIDIA H100 80GB HBM3 test") is not None
    assert before.find_gpu("NVIDIA H100 80GB HBM3 test") is None
    assert len(list(own_cache.glob("*.json"))) == 2


def test_the_key_covers_the_code_and_the_versions(monkeypatch):
    key = dbcache.cache_key(DATA_DIR, NAMES)
    monkeypatch.setattr(envspec, "__version__", envspec.__version__ + ".post1")
    assert dbcache.cache_key(DATA_DIR, NAMES) != key
    monkeypatch.undo()
    import pydantic

    monkeypatch.setattr(pydantic, "VERSION", pydantic.VERSION + ".post1")
    assert dbcache.cache_key(DATA_DIR, NAMES) != key
    monkeypatch.undo()
    assert dbcache.cache_key(DATA_DIR, NAMES) == key
    assert dbcache.cache_key(DATA_DIR, [*NAMES, "no-such-file.toml"]) is None


def test_bad_data_is_never_stored(tmp_path, own_cache):
    d = _copy(tmp_path)
    (d / "gpus.toml").write_text(
        (d / "gpus.toml").read_text().replace('cc = "3.7"', 'cc = "three"', 1)
    )
    for _ in range(2):  # the same error the second time: nothing was stored
        dbload._load_cached.cache_clear()
        with pytest.raises(
            CompatDBError, match=r"gpus.toml: family\[1\] \('three'\).cc: not a compute capability"
        ):
            load_db(d)
    assert not own_cache.exists() or list(own_cache.glob("*.json")) == []


def test_a_cache_that_cannot_be_written_is_not_an_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("ENVSPEC_CACHE", str(blocker))
    dbload._load_cached.cache_clear()
    db = load_db()
    assert db.find_gpu("H100") is not None
    assert blocker.read_text() == "not a folder"


def test_no_home_folder_means_no_cache_not_an_error(monkeypatch):
    # a container user with no HOME and no passwd entry: Path.home() raises RuntimeError
    for var in ("ENVSPEC_CACHE", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(var, raising=False)

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    dbload._load_cached.cache_clear()
    assert load_db().find_gpu("H100") is not None


def test_only_the_newest_entries_are_kept(own_cache):
    db = dbload._build(DATA_DIR)
    for i in range(dbcache.KEEP + 3):
        dbcache.write(f"{i:064x}", db)
        os.utime(own_cache / f"{i:064x}.json", (1_000_000 + i, 1_000_000 + i))
    dbcache.write("f" * 64, db)
    names = sorted(p.name for p in own_cache.glob("*.json"))
    assert len(names) == dbcache.KEEP and f"{'f' * 64}.json" in names
    assert f"{0:064x}.json" not in names
    assert not list(own_cache.glob(".*.tmp"))  # no temporary file left behind


def test_model_types_of_a_cached_db(own_cache):
    load_db()
    dbload._load_cached.cache_clear()
    db = load_db()
    assert all(type(r) is TorchRelease for r in db.torch_releases)
    assert all(type(v) is Variant for r in db.torch_releases for v in r.variants.values())
    assert all(type(t) is CudaToolkit for t in db.cuda_toolkits) and all(
        type(g) is Gpu for g in db.gpus
    )

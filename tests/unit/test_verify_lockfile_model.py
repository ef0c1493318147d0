"""The verifier's stdlib lock reader (verify/lockfile.py, copied into images) reads what the model
(envspec.lock.Lockfile) writes, field by field, for every committed lock.

Two halves. Every field of the model, walked recursively, is in the reader's dict at the same path
with the same value (absent only where the model holds None, which the lock's TOML leaves out, or
where a hand-written test lock relies on the field's default). And every key the verifier's checks
actually look up, recorded while they run against fake probes, is a field of the model, present
in the lock with the model's value: a check cannot read a key the model never writes, read it
elsewhere, or fall back to a default of its own where the model has a value.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from test_verify_fakes import FakeSystem, FakeTorch

from envspec import lock as lockmod
from envspec.verify.checks import run_checks
from envspec.verify.lockfile import load_lock, lock_hash

REPO = Path(__file__).parents[2]
# every lock in the repository but those made wrong on purpose (tests/data/first-hour: bad inputs)
LOCKS = sorted(
    {
        *REPO.glob("lockfiles/*.lock"),
        *REPO.glob("tests/data/**/*.lock"),
        *REPO.glob("examples/**/*.lock"),
    }
    - set(REPO.glob("tests/data/first-hour/**/*.lock"))
)
MISSING = object()
Path_ = tuple[str | int, ...]

# Keys the verifier looks up that the model does not write, with why that is allowed. Each must be
# absent from every committed lock (the verifier then falls back as said).
READ_BUT_NOT_WRITTEN: dict[Path_, str] = {
    (
        "hardware",
        "expected",
    ): "per-GPU GEMM rates; Hardware has no such field, so the verifier uses verify/rates.py",
}
# What the checks read at the least; guards the recorder against recording nothing.
READ_AT_LEAST: set[Path_] = {
    ("meta", "name"),
    ("meta", "content_hash"),
    ("platform", "venv"),
    ("hardware", "gpus"),
    ("hardware", "compute_capabilities"),
    ("hardware", "arch_list"),
    ("hardware", "driver_floor"),
    ("hardware", "driver_policy"),
    ("torch",),
    ("torch", "version"),
    ("torch", "local"),
    ("torch", "variant"),
    ("torch", "cuda"),
    ("torch", "cudnn"),
    ("torch", "nccl"),
    ("runtime", "env"),
    ("runtime", "shm_size"),
    ("runtime", "tf32"),
    ("runtime", "matmul_precision"),
    ("wheels",),
    ("wheels", "*", "name"),
    ("wheels", "*", "version"),
}


def _fields(value: BaseModel) -> list[str]:
    """A model's fields as the lock's text names them: a one-platform lock's part is flat."""
    if isinstance(value, lockmod.Lockfile):
        return [n for n in type(value).model_fields if n != "parts"] + list(lockmod.PART_FIELDS)
    return list(type(value).model_fields)


def _walk(value: Any, path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    """(path, value) of every field of the model, containers and leaves, recursively."""
    if isinstance(value, BaseModel):
        for name in _fields(value):
            child = getattr(value, name)
            yield (*path, name), child
            yield from _walk(child, (*path, name))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield (*path, i), child
            yield from _walk(child, (*path, i))
    elif isinstance(value, dict):
        for k, child in value.items():
            yield (*path, k), child
            yield from _walk(child, (*path, k))


def _defaults(value: Any, path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    """(path, default) of every model field that has one, at the paths ``_walk`` gives."""
    if isinstance(value, lockmod.Lockfile):
        yield from _defaults(value.part, path)
    if isinstance(value, BaseModel):
        for name, info in type(value).model_fields.items():
            if name == "parts":
                continue
            if not info.is_required():
                yield (*path, name), info.get_default(call_default_factory=True)
            yield from _defaults(getattr(value, name), (*path, name))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _defaults(child, (*path, i))


def _plain(value: Any) -> Any:
    """A model value as the lock's TOML holds it."""
    if isinstance(value, lockmod.Lockfile):
        return lockmod.text_data(value)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _is_table(value: Any) -> bool:
    """A table or an array of tables: compared by presence (and length), its fields one by one."""
    return isinstance(value, BaseModel) or (
        isinstance(value, list) and bool(value) and isinstance(value[0], BaseModel)
    )


def _same(value: Any, got: Any) -> bool:
    """Whether the reader's ``got`` is the model's ``value``, at one path."""
    if value is None:
        return got is MISSING
    if _is_table(value):
        return got is not MISSING and (not isinstance(value, list) or len(got) == len(value))
    return bool(got == _plain(value))


def _at(data: Any, path: Path_) -> Any:
    for key in path:
        if isinstance(key, int):
            if not isinstance(data, list) or key >= len(data):
                return MISSING
        elif not isinstance(data, dict) or key not in data:
            return MISSING
        data = data[key]
    return data


def _generic(path: Path_) -> Path_:
    return tuple("*" if isinstance(k, int) else k for k in path)


class _Recording(dict):
    """The reader's dict, noting every key looked up (nested tables and arrays of tables too)."""

    def __init__(self, data: dict[str, Any], path: Path_, seen: set[Path_]) -> None:
        super().__init__({k: _record(v, (*path, k), seen) for k, v in data.items()})
        self._path = path
        self._seen = seen

    def __getitem__(self, key: str) -> Any:
        self._seen.add((*self._path, key))
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._seen.add((*self._path, key))
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self._seen.add((*self._path, key))
        return super().__contains__(key)


def _record(value: Any, path: Path_, seen: set[Path_]) -> Any:
    if isinstance(value, dict):
        return _Recording(value, path, seen)
    if isinstance(value, list):
        return [_record(v, (*path, i), seen) for i, v in enumerate(value)]
    return value


def _verifier_reads(path: Path) -> set[Path_]:
    """The lock keys the checks look up, at the full level, on a GPU machine and on one without torch."""
    seen: set[Path_] = set()
    skip = (
        "torch.compile",
        "nccl",
        "integrity.files",
    )  # subprocesses and file hashing: no lock keys
    for system in (FakeSystem(torch=FakeTorch()), FakeSystem(torch=None)):
        run_checks(_Recording(load_lock(path), (), seen), level="full", system=system, skip=skip)
    return {
        p for p in seen if not str(p[0]).startswith("__")
    }  # the reader's own __path__, __file_sha256__


def _views() -> list[tuple[Path, str]]:
    """(lock, platform) per committed lock and platform: the verifier reads one platform's lock,
    a multi-platform lock's view (``Lockfile.for_platform``) as its images carry it."""
    return [(p, name) for p in LOCKS for name in lockmod.load(p).platform_names]


@pytest.fixture(params=_views(), ids=lambda v: f"{v[0].relative_to(REPO)}:{v[1]}")
def lock_path(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    path, name = request.param
    lock = lockmod.load(path)
    if not lock.multi:
        return path
    view = tmp_path / f"{name}.lock"
    view.write_text(lockmod.dumps(lock.for_platform(name)))
    return view


def test_there_are_locks_to_compare():
    assert len(LOCKS) >= 10 and any(p.parent.name == "lockfiles" for p in LOCKS)


def test_the_reader_holds_every_field_the_model_writes(lock_path):
    model = lockmod.load(lock_path)
    data = load_lock(lock_path)
    defaults = dict(_defaults(model))
    wrong = []
    for path, value in _walk(model):
        got = _at(data, path)
        if got is MISSING and path in defaults and value == defaults[path]:
            continue  # left out of the file, the model's default: the reader has nothing to misread
        if not _same(value, got):
            wrong.append(f"{'.'.join(map(str, path))}: model {_plain(value)!r}, reader {got!r}")
    assert wrong == []
    assert {k for k in data if not k.startswith("__")} == set(
        _plain(model)
    )  # no table added or dropped
    assert lock_hash(data) == model.meta.content_hash


def test_every_key_the_verifier_reads_is_a_field_of_the_model(lock_path):
    model = lockmod.load(lock_path)
    data = load_lock(lock_path)
    fields = {_generic(p) for p, _ in _walk(model)} | {(name,) for name in _fields(model)}
    reads = _verifier_reads(lock_path)
    generic_reads = {_generic(p) for p in reads}
    unknown = generic_reads - fields - set(READ_BUT_NOT_WRITTEN)
    assert unknown == set(), f"the verifier reads keys the model does not write: {sorted(unknown)}"
    for p in READ_BUT_NOT_WRITTEN:
        assert _at(data, p) is MISSING
    # each of them, where the verifier reads it, holds the model's value (a table: is there iff the
    # model has it; the keys read inside it are compared one by one)
    values = dict(_walk(model))
    for p in reads:
        if _generic(p) in READ_BUT_NOT_WRITTEN:
            continue
        value, got = values.get(p), _at(data, p)
        assert _same(value, got), (
            f"{'.'.join(map(str, p))}: model {_plain(value)!r}, verifier reads {got!r}"
        )
    missed = READ_AT_LEAST - generic_reads
    if model.torch is not None and model.wheels:
        assert missed == set(), f"the recorder saw no read of {sorted(missed)}"


@pytest.mark.parametrize(
    "path, name",
    [v for v in _views() if lockmod.load(v[0]).multi],
    ids=lambda v: str(v) if isinstance(v, str) else v.name,
)
def test_a_multi_platform_lock_is_read_as_the_hosts_section(path, name, tmp_path, monkeypatch):
    """Host mode (`envspec verify --lock multi.lock`): the verifier reads the host's section of a
    version-2 lock (ENVSPEC_PLATFORM names another) as the view its image carries."""
    view = tmp_path / f"{name}.lock"
    view.write_text(lockmod.dumps(lockmod.load(path).for_platform(name)))
    monkeypatch.setenv("ENVSPEC_PLATFORM", name)
    whole, one = load_lock(path), load_lock(view)
    assert whole["__platform__"] == name
    for t in ("platform", "hardware", "torch", "runtime", "services", "debian", "wheels"):
        assert whole.get(t) == one.get(t), t
    assert _verifier_reads(path) == _verifier_reads(view)


def test_a_multi_platform_lock_without_the_hosts_section_is_refused(tmp_path, monkeypatch):
    from envspec.verify.lockfile import LockReadError

    multi = next(p for p in LOCKS if lockmod.load(p).multi)
    monkeypatch.setenv("ENVSPEC_PLATFORM", "linux-riscv64")
    with pytest.raises(
        LockReadError, match="no section for this host's platform linux-riscv64"
    ) as e:
        load_lock(multi)
    assert "linux-aarch64" in e.value.message and "ENVSPEC_PLATFORM" in e.value.hint

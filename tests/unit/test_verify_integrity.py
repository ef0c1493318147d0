"""Integrity against a real wheel installed with pypa/installer into a fake venv: one changed
byte fails naming the file; an extra distribution fails naming the package. The quick level
hashes shared objects and checks other files by size; the full level hashes every file."""

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

import pytest
from test_verify_fakes import FakeSystem, by_check

from envspec.verify.checks import run_checks
from envspec.verify.integrity import HashCache, check_files, find_dists, is_native, owner_index

installer = pytest.importorskip("installer")
from installer.destinations import SchemeDictionaryDestination  # noqa: E402
from installer.sources import WheelFile  # noqa: E402

WHEELS = Path(__file__).parent.parent / "data" / "verify" / "wheels"
# wheel-0.40.0: a real PyPI wheel (pypa/wheel), copied from CPython's test data
LOCKED = WHEELS / "wheel-0.40.0-py3-none-any.whl"
EXTRA = WHEELS / "example-21.12-py3-none-any.whl"


def install(wheel: Path, venv: Path) -> Path:
    site = venv / "lib" / "python3.12" / "site-packages"
    scheme = {k: str(site) for k in ("purelib", "platlib")}
    scheme.update(scripts=str(venv / "bin"), data=str(venv), headers=str(venv / "include"))
    dest = SchemeDictionaryDestination(scheme, interpreter=sys.executable, script_kind="posix")
    with WheelFile.open(wheel) as source:
        installer.install(source, dest, {"INSTALLER": b"envspec-test"})
    return site


def cpu_lock(venv: Path) -> dict:
    return {
        "version": 1,
        "meta": {"name": "tiny", "content_hash": "sha256:" + "11" * 32},
        "platform": {"venv": str(venv)},
        "hardware": {"gpus": [], "arch_list": [], "driver_floor": "", "driver_policy": "compat"},
        "runtime": {},
        "wheels": [{"name": "wheel", "version": "0.40.0", "group": "team", "sha256": ""}],
    }


@pytest.fixture
def venv(tmp_path):
    v = tmp_path / "venv"
    site = install(LOCKED, v)
    return v, site


def verify(venv_site, mode="auto", level="quick", lock=None):
    v, site = venv_site
    system = FakeSystem(sites=[site], prefix=str(v), driver=None, nodes=())
    return run_checks(
        lock or cpu_lock(v), level=level, mode=mode, system=system, skip=("torch.compile",)
    )


def make_wheel(dest: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    """A wheel with a RECORD, written here (no binary in the repository)."""
    dist_info = f"{name}-{version}.dist-info"
    files = dict(files)
    files[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    )
    files[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: envspec-test\nRoot-Is-Purelib: false\nTag: py3-none-any\n"
    )
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    wheel = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return wheel


# the name decides (is_native): these bytes stand in for a library, the verifier only hashes them
NATIVE_FILES = {
    "nativepkg/__init__.py": b"from . import _impl  # the extension module\n",
    "nativepkg/_impl.cpython-312-x86_64-linux-gnu.so": b"\x7fELF" + bytes(range(256)) * 64,
    "nativepkg/lib/libnative.so.12": b"\x7fELF" + bytes(range(255, -1, -1)) * 32,
    "nativepkg/data.json": b'{"kernels": ["a", "b"]}\n',
}


@pytest.fixture
def native_venv(tmp_path):
    v = tmp_path / "venv"
    site = install(make_wheel(tmp_path, "nativepkg", "1.0", NATIVE_FILES), v)
    lock = cpu_lock(v)
    lock["wheels"] = [{"name": "nativepkg", "version": "1.0", "group": "team", "sha256": ""}]
    return (v, site), lock


def flip(path: Path, at: int = 10) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_untouched_venv_passes(venv):
    r = verify(venv)
    f = by_check(r)
    assert r.mode == "image"
    assert f["integrity.packages"].status == "pass"
    assert f["integrity.files"].status == "pass"
    # every file of the wheel but RECORD, plus what the installer wrote (INSTALLER, the script);
    # a pure-Python wheel: at the quick level nothing to hash, every file checked by size
    n = len(zipfile.ZipFile(LOCKED).namelist()) - 1 + 2
    assert f"0 shared objects, 0 B hashed; {n} other files" in f["integrity.files"].observed
    assert (
        f["integrity.files"].data["sized_files"] == n
        and f["integrity.files"].data["hashed_files"] == 0
    )
    assert f["torch.import"].status == "skip"  # this lock has no [torch]
    assert r.ok, r.to_json()
    full = by_check(verify(venv, level="full"))["integrity.files"]
    assert (
        full.status == "pass" and f"{n} files" in full.observed and full.data["hashed_files"] == n
    )


def test_same_size_change_to_a_python_file_is_seen_at_full_level(venv):
    v, site = venv
    target = site / "wheel" / "cli" / "__init__.py"
    flip(target)
    # quick: the size is as RECORD says, and a .py file is not hashed (docs/verify.md, Levels)
    assert by_check(verify(venv))["integrity.files"].status == "pass"
    r = verify(venv, level="full")
    f = by_check(r)["integrity.files"]
    assert f.status == "fail"
    assert str(target) in f.observed and "changed" in f.observed and "wheel" in f.observed
    assert f.data["files"] == [str(target)]
    assert r.exit_code == 1


def test_python_file_of_another_size_fails_at_quick_level(venv):
    v, site = venv
    target = site / "wheel" / "cli" / "__init__.py"
    size = target.stat().st_size
    target.write_bytes(target.read_bytes() + b"# edited\n")
    r = verify(venv)
    f = by_check(r)["integrity.files"]
    assert f.status == "fail" and r.exit_code == 1
    assert f.data["files"] == [str(target)]
    assert f"size {size + 9} B, RECORD says {size} B" in f.observed


def test_changed_native_library_fails_at_quick_level(native_venv):
    venv_site, lock = native_venv
    _, site = venv_site
    r = verify(venv_site, lock=lock)
    f = by_check(r)["integrity.files"]
    assert f.status == "pass", r.to_json()
    assert f.data["hashed_files"] == 2 and f.data["hashed_bytes"] == (4 + 256 * 64) + (4 + 256 * 32)
    for rel in ("nativepkg/lib/libnative.so.12", "nativepkg/_impl.cpython-312-x86_64-linux-gnu.so"):
        lib = site / rel
        flip(lib, at=1000)  # same size: only the hash sees it
        f = by_check(verify(venv_site, lock=lock))["integrity.files"]
        assert f.status == "fail" and f.data["files"] == [str(lib)], f.observed
        assert "sha256 differs" in f.observed
        flip(lib, at=1000)


def test_size_check_runs_without_reading_the_file(native_venv):
    # a file whose size matches is not hashed at the quick level; every file is at the full level
    venv_site, lock = native_venv
    _, site = venv_site
    dists = find_dists([site])

    class Counting(HashCache):
        def __init__(self):
            super().__init__()
            self.asked = []

        def digest(self, path):
            self.asked.append(path.name)
            return super().digest(path)

    cache = Counting()
    res = check_files([dists["nativepkg"]], cache, hash_all=False)
    assert not res.problems
    assert sorted(cache.asked) == ["_impl.cpython-312-x86_64-linux-gnu.so", "libnative.so.12"]
    assert (
        res.sized == 5
    )  # __init__.py, data.json, METADATA, WHEEL, INSTALLER (the installer hashed it)
    full = check_files([dists["nativepkg"]], Counting(), hash_all=True)
    assert not full.problems and full.hashed == 7 and full.sized == 0


def test_native_rule():
    for name in (
        "torch/lib/libtorch_cuda.so",
        "nvidia/cudnn/lib/libcudnn_engines_precompiled.so.9",
        "nvidia/cu13/lib/libnvrtc-builtins.so.13.0",
        "torch/_C.cpython-312-x86_64-linux-gnu.so",
        "triton/_C/libtriton.so",
        "numpy.libs/libscipy_openblas64_-ff651d7f.so",
    ):
        assert is_native(name), name
    for name in (
        "torch/__init__.py",
        "torch/__pycache__/__init__.cpython-312.pyc",
        "torch/lib/libfoo.so.py",
        "nvidia/cu13/include/cuda.h",
        "torch/share/cmake/Torch/TorchConfig.cmake",
        "a.solution",
    ):
        assert not is_native(name), name


def test_deleted_file_fails(venv):
    v, site = venv
    (site / "wheel" / "metadata.py").unlink()
    f = by_check(verify(venv))["integrity.files"]
    assert f.status == "fail" and "metadata.py (missing" in f.observed


def test_extra_distribution_fails_naming_the_package(venv):
    v, site = venv
    install(EXTRA, v)
    r = verify(venv)
    e = by_check(r)["integrity.extra"]
    assert e.status == "fail" and "example 21.12" in e.observed
    assert "pip-installed" in e.hint
    # in host mode (another python) extra packages are expected: a warning
    host = verify(venv, mode="host")
    assert by_check(host)["integrity.extra"].status == "warn"


def test_missing_and_wrong_version(venv):
    v, site = venv
    lock = cpu_lock(v)
    lock["wheels"] = [
        {"name": "wheel", "version": "0.41.0", "group": "team"},
        {"name": "torch", "version": "2.14.1", "group": "torch"},
    ]
    system = FakeSystem(sites=[site], prefix=str(v), driver=None, nodes=())
    r = run_checks(lock, level="quick", system=system, skip=("torch.compile",))
    f = by_check(r)
    assert (
        f["integrity.missing"].status == "fail"
        and "torch 2.14.1" in f["integrity.missing"].observed
    )
    assert (
        f["integrity.versions"].status == "fail"
        and "wheel 0.40.0 (locked 0.41.0)" in f["integrity.versions"].observed
    )
    # host mode: torch's stack must still be complete; other packages only warn
    lock["wheels"] = [{"name": "wheel", "version": "0.41.0", "group": "team"}]
    r = run_checks(lock, level="quick", mode="host", system=system, skip=("torch.compile",))
    assert by_check(r)["integrity.versions"].status == "warn"


def test_owner_index_maps_a_file_to_its_distribution(venv):
    v, site = venv
    dists = find_dists([site])
    target = site / "wheel" / "wheelfile.py"
    owners = owner_index(dists, [target])
    dist, entry = owners[target]
    assert dist.name == "wheel" and dist.version == "0.40.0" and entry.sha256


def test_the_top_level_modules_holding_extension_modules_come_from_record(native_venv, venv):
    from envspec.verify import integrity

    (v, site), _ = native_venv
    dists = integrity.find_dists([site])
    assert integrity.extension_modules(dists["nativepkg"]) == ["nativepkg"]
    _, pure_site = venv
    assert integrity.extension_modules(integrity.find_dists([pure_site])["wheel"]) == []


def test_the_full_level_imports_each_locked_module_with_extensions_and_names_each_failure(
    native_venv,
):
    venv_site, lock = native_venv
    quick = by_check(verify(venv_site, lock=lock))
    assert "imports" not in quick  # the full level's
    f = by_check(verify(venv_site, level="full", lock=lock))["imports"]
    assert f.status == "fail" and f.data["modules"] == ["nativepkg"]
    assert f.observed.startswith("nativepkg: ImportError") and "_impl" in f.observed
    assert "abi-mismatch" in f.hint


def test_import_modules_goes_on_past_a_failure_and_a_crash(tmp_path):
    import os
    import sys

    from envspec.verify.probes import import_modules

    (tmp_path / "good.py").write_text("X = 1\n")
    (tmp_path / "bad.py").write_text("raise ImportError('undefined symbol: _ZN3c104gone')\n")
    (tmp_path / "crash.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    (tmp_path / "after.py").write_text("Y = 2\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    got = {
        r.module: r.error
        for r in import_modules(["good", "bad", "crash", "after"], python=sys.executable, env=env)
    }
    assert got["good"] == "" and got["after"] == ""
    assert got["bad"] == "ImportError: undefined symbol: _ZN3c104gone"
    assert got["crash"] == "the importing process died with signal 11"

"""Integrity against a real wheel installed with pypa/installer into a fake venv: one changed
byte fails naming the file; an extra distribution fails naming the package."""

import sys
import zipfile
from pathlib import Path

import pytest

from envspec.verify.checks import run_checks
from envspec.verify.integrity import find_dists, owner_index

from test_verify_fakes import FakeSystem, by_check

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


def verify(venv_site, mode="auto"):
    v, site = venv_site
    system = FakeSystem(sites=[site], prefix=str(v), driver=None, nodes=())
    return run_checks(cpu_lock(v), level="quick", mode=mode, system=system, skip=("torch.compile",))


def test_untouched_venv_passes(venv):
    r = verify(venv)
    f = by_check(r)
    assert r.mode == "image"
    assert f["integrity.packages"].status == "pass"
    assert f["integrity.files"].status == "pass"
    # every file of the wheel but RECORD, plus what the installer wrote (INSTALLER, the script)
    n = len(zipfile.ZipFile(LOCKED).namelist()) - 1 + 2
    assert f"{n} files" in f["integrity.files"].observed
    assert f["torch.import"].status == "skip"  # this lock has no [torch]
    assert r.ok, r.to_json()


def test_one_changed_byte_fails_naming_the_file(venv):
    v, site = venv
    target = site / "wheel" / "cli" / "__init__.py"
    data = bytearray(target.read_bytes())
    data[10] ^= 0x01
    target.write_bytes(bytes(data))
    r = verify(venv)
    f = by_check(r)["integrity.files"]
    assert f.status == "fail"
    assert str(target) in f.observed and "changed" in f.observed and "wheel" in f.observed
    assert f.data["files"] == [str(target)]
    assert r.exit_code == 1


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
    lock["wheels"] = [{"name": "wheel", "version": "0.41.0", "group": "team"},
                      {"name": "torch", "version": "2.14.1", "group": "torch"}]
    system = FakeSystem(sites=[site], prefix=str(v), driver=None, nodes=())
    r = run_checks(lock, level="quick", system=system, skip=("torch.compile",))
    f = by_check(r)
    assert f["integrity.missing"].status == "fail" and "torch 2.14.1" in f["integrity.missing"].observed
    assert f["integrity.versions"].status == "fail" and "wheel 0.40.0 (locked 0.41.0)" in f["integrity.versions"].observed
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

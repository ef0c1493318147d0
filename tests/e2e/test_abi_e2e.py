"""The ABI check on real wheels from the indexes: torchvision's extensions against the torch
beside them (src/envspec/wheels/abi.py), through `envspec lock` and `envspec build`.

- torchvision 0.29.1 uses torch's stable ABI (``_C_stable.so``, built for torch 2.14): beside
  torch 2.14.1 it is accepted at lock time; beside the older torch 2.13.0 (CPU) the build refuses;
- torchvision 0.28.0 uses torch's C++ ABI (``_C.so``, built for torch 2.13.0): beside torch
  2.14.1 the build refuses, naming the missing symbol demangled and the torch it was built for.

The refused locks are made from a real lock by swapping one pin (the resolver itself never
pairs them: their metadata pins torch); nothing is tagged from them.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envspec import lock as lockmod
from envspec import sources
from envspec.lock import Wheel

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.network,
    pytest.mark.skipif(
        not sources.reachable("https://pypi.org/simple") and not os.environ.get("CI"),
        reason="PyPI unreachable",
    ),
]

SPEC = """name = "tv-abi"
[target]
gpus = ["H100"]
driver = "580.65.06"
[python]
version = "3.11"
packages = ["numpy>=2", "torchvision==0.29.1"]
[torch]
version = "2.14.*"
cuda = "auto"
"""


def run_cli(*args, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), ENVSPEC_CACHE=str(cache))
    return subprocess.run(
        [sys.executable, "-m", "envspec", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=900,
    )


def _wheel_file(name: str, version: str, dest: Path) -> Path:
    """A wheel of ``name`` ``version`` for CPython 3.11 on x86_64 Linux, as pip finds it (its
    configured mirrors, then PyPI)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--python-version",
            "3.11",
            "--platform",
            "manylinux_2_28_x86_64",
            "-d",
            str(dest),
            f"{name}=={version}",
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    [path] = dest.glob(f"{name}-{version}-*.whl")
    return path


def _swap(lock: lockmod.Lockfile, name: str, version: str, out: Path) -> Path:
    """``lock`` with ``name`` pinned at ``version`` (that wheel's real file and sha256)."""
    path = _wheel_file(name, version, out.parent / f"{name}-{version}")
    pin = Wheel(
        name=name,
        version=version,
        filename=path.name,
        index="https://pypi.org/simple",
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        size=path.stat().st_size,
        group="deps",
    )
    wheels = [w for w in lock.wheels if w.name != name] + [pin]
    lockmod.write_atomic(out, lockmod.dumps(lock.model_copy(update={"wheels": wheels}).with_hash()))
    return out


@pytest.fixture(scope="module")
def locked(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("abi")
    spec = tmp / "tv.toml"
    spec.write_text(SPEC)
    cache = tmp / "cache"
    r = run_cli("lock", str(spec), "-o", str(tmp / "tv.lock"), "--json", cache=cache)
    assert r.returncode == 0, r.stderr
    return tmp, cache, json.loads(r.stdout)


def test_a_stable_abi_package_beside_a_newer_torch_is_accepted_at_lock_time(locked):
    tmp, cache, out = locked
    lk = lockmod.load(tmp / "tv.lock")
    assert {w.name: w.version for w in lk.wheels}[
        "torchvision"
    ] == "0.29.1" and lk.torch.version == "2.14.1"
    [abi] = out["abi"]
    assert abi["judged"] == ["torchvision"], out["abi"]
    # the reads are kept by the wheels' sha256: a second lock reads no wheel
    r = run_cli("lock", str(tmp / "tv.toml"), "-o", str(tmp / "tv.lock"), "--json", cache=cache)
    assert r.returncode == 0 and json.loads(r.stdout)["abi"][0]["read"] == []


def test_a_cxx_abi_package_beside_another_torch_release_is_refused_before_the_first_layer(locked):
    from conftest import private_storage

    tmp, cache, _ = locked
    bad = _swap(lockmod.load(tmp / "tv.lock"), "torchvision", "0.28.0", tmp / "tv-cxx.lock")
    with private_storage(tmp / "storage-cxx") as host:
        r = run_cli(
            "build", str(bad), "--tag", "localhost/envspec-abi-cxx:1", "--json", cache=cache
        )
        assert r.returncode == 2, r.stdout + r.stderr
        err = json.loads(r.stdout)["error"]
        assert err["reference"] == "abi-mismatch"
        [m, *_] = err["mismatches"]
        assert (m["package"], m["version"], m["kind"], m["torch"]) == (
            "torchvision",
            "0.28.0",
            "c++",
            "2.14.1",
        )
        assert m["module"] == "torchvision/_C.so"
        assert m["built_for"].startswith("2.13.0; its metadata says torch==2.13.0")
        assert any(
            s.startswith("c10::") and "(" in s for s in m["missing_demangled"]
        )  # demangled, with its signature
        assert '[torch] version = "==2.13.0"' in err["hint"]
        exists = subprocess.run(
            ["podman", *host.storage.args(), "image", "exists", "localhost/envspec-abi-cxx:1"]
        )
        assert exists.returncode == 1, "nothing is tagged from a lock that cannot run"


def test_pypis_torchvision_beside_the_cpu_torch_is_refused_before_anything_is_fetched(locked):
    """PyPI's torchvision 0.29.1 (its CUDA build, no local label) put beside lockfiles/cpu.lock's
    torch 2.13.0+cpu: the lock says another build than its [torch] table (issue 57, point 2), and
    the dry run and the build refuse it as they read it (lock-torch-variant, exit 2). (Such a lock was once judged by the ABI check alone, by the stable-ABI symbols
    torchvision's _C_stable.so needs from a newer torch: that judgement is tests/unit/test_abi.py's,
    a consistent pair of real wheels needing the PyTorch index this machine cannot read.)"""
    tmp, cache, _ = locked
    cpu = lockmod.load(ROOT / "lockfiles" / "cpu.lock")
    bad = _swap(cpu, "torchvision", "0.29.1", tmp / "tv-stable-old.lock")
    for args in (["--json", "--dry-run"], ["--tag", "localhost/envspec-abi-stable:1"]):
        r = run_cli("build", str(bad), *args, cache=cache)
        assert r.returncode == 2, r.stdout + r.stderr
        said = r.stdout + r.stderr
        assert "lock-torch-variant" in said and "its torchvision wheel is 0.29.1" in said, said
        assert "[torch] variant = 'cpu' (+cpu)" in said, said

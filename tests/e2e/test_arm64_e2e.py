"""arm64 images built on this (amd64) machine without emulation, then run and verified here under
qemu-user-static through binfmt_misc (issue 13).

The build runs no binary of the image: the one it used to run, the image's static ldconfig, is
replaced for a foreign tree by debian/ldcache.py, which is checked here against the builder's own
ldconfig on an amd64 tree of the same lock shape. Running needs Debian's qemu-user-static with
its binfmt_misc entries enabled (scripts/dev.sh setup); where the kernel cannot, those tests skip
and say why. Private storage roots and caches, as in test_build_e2e.py.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from envspec import lock as lockmod

pytestmark = [pytest.mark.e2e, pytest.mark.network]

for tool in ("skopeo", "buildah", "podman"):
    if shutil.which(tool) is None:
        pytestmark.append(
            pytest.mark.skip(reason=f"{tool} is not installed (apt-get install -y {tool})")
        )
if platform.machine() != "x86_64":
    pytestmark.append(pytest.mark.skip(reason="these tests build arm64 images on an x86_64 host"))

ROOT = Path(__file__).resolve().parents[2]
SMOKE_ARM = ROOT / "lockfiles" / "smoke-arm64.lock"
CPU_ARM = ROOT / "lockfiles" / "cpu-arm64.lock"
SMOKE = ROOT / "lockfiles" / "smoke.lock"
ELF_MACHINE = {62: "x86_64", 183: "aarch64"}


@pytest.fixture(scope="module")
def debs(tmp_path_factory):
    """One download of the .debs for the module (the tests' caches link to it)."""
    return tmp_path_factory.mktemp("debs")


@pytest.fixture
def host(tmp_path):
    from conftest import private_storage

    with private_storage(tmp_path / "storage") as h:
        yield h


def new_cache(base: Path, debs: Path, name: str) -> Path:
    c = base / name
    c.mkdir(parents=True, exist_ok=True)
    (c / "debs").symlink_to(debs)
    return c


def do_build(lock_path: Path, host, cache: Path, **kw):
    from envspec import sources
    from envspec.cache.store import Cache
    from envspec.image import BuildahEngine, BuildOptions, build
    from envspec.plan import make_plan

    return build(
        make_plan(lockmod.load(lock_path)),
        BuildahEngine(host),
        Cache(cache),
        sources.discover().mirrors,
        options=BuildOptions(**kw),
    )


def needs_emulation(host) -> None:
    if not host.runs_arch("aarch64"):
        pytest.skip(
            "no arm64 emulation on this host: "
            + (host.binfmt_note or "binfmt_misc has no qemu-aarch64")
            + " (scripts/dev.sh setup mounts binfmt_misc and enables it where the kernel allows)"
        )


def envspec_cli(
    *args: str, env: dict | None = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    e = dict(os.environ, **(env or {}))
    e["PYTHONPATH"] = str(ROOT / "src")
    return subprocess.run(
        [sys.executable, "-m", "envspec", *args],
        capture_output=True,
        text=True,
        env=e,
        timeout=timeout,
        cwd=ROOT,
    )


def oci_layers(host, image: str, dest: Path) -> tuple[dict, list[Path]]:
    """The image's config and layer tars, copied out of the store as an OCI layout."""
    subprocess.run(
        ["skopeo", "copy", "--quiet", host.storage.ref(image), f"oci:{dest}"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    index = json.loads((dest / "index.json").read_text())
    blob = lambda d: dest / "blobs" / "sha256" / d.split(":", 1)[1]  # noqa: E731
    manifest = json.loads(blob(index["manifests"][0]["digest"]).read_text())
    config = json.loads(blob(manifest["config"]["digest"]).read_text())
    return config, [blob(layer["digest"]) for layer in manifest["layers"]]


def elf_machines(tar_path: Path) -> dict[str, int]:
    """ELF e_machine -> how many regular files of the layer are ELF objects for it."""
    out: dict[str, int] = {}
    with tarfile.open(tar_path) as tf:
        for m in tf:
            if not m.isfile() or m.size < 20:
                continue
            head = tf.extractfile(m).read(20)  # type: ignore[union-attr]
            if head[:4] == b"\x7fELF":
                arch = ELF_MACHINE.get(int.from_bytes(head[18:20], "little"), str(head[18:20]))
                out[arch] = out.get(arch, 0) + 1
    return out


# --- build -----------------------------------------------------------------------------------------


def test_arm64_smoke_image_builds_here_reproducibly_with_arm64_contents(host, tmp_path, debs):
    a = do_build(SMOKE_ARM, host, new_cache(tmp_path, debs, "c1"), no_cache=True)
    time.sleep(1.1)
    b = do_build(SMOKE_ARM, host, new_cache(tmp_path, debs, "c2"), no_cache=True)
    lock = lockmod.load(SMOKE_ARM)
    assert a.digest == b.digest and a.image == f"localhost/envspec/smoke-arm64:{lock.short_hash}"
    config, layers = oci_layers(host, a.image, tmp_path / "oci")
    assert (config["architecture"], config["os"]) == ("arm64", "linux")
    machines: dict[str, int] = {}
    names: set[str] = set()
    for layer in layers:
        for k, v in elf_machines(layer).items():
            machines[k] = machines.get(k, 0) + v
        with tarfile.open(layer) as tf:
            names |= set(tf.getnames())
    assert machines.get("aarch64", 0) > 50 and "x86_64" not in machines, machines
    assert "usr/lib/aarch64-linux-gnu/ld-linux-aarch64.so.1" in names
    assert "usr/lib/python3.11/lib-dynload/_ssl.cpython-311-aarch64-linux-gnu.so" in names
    assert not any("x86_64-linux-gnu" in n for n in names)
    # the stdlib's .pyc were made by the host's CPython of the lock's python_full (they do not
    # depend on the CPU): the base layer holds them beside the arm64 interpreter
    assert "usr/lib/python3.11/__pycache__/os.cpython-311.pyc" in names


def test_ldcache_agrees_with_ldconfig_on_an_amd64_tree(tmp_path, debs):
    """The Python cache writer, run on the tree the amd64 smoke lock makes, lists what the image's
    own ldconfig wrote there, entry for entry and in its order."""
    from envspec import debian
    from envspec.debian import ldcache

    lock = lockmod.load(SMOKE)
    assert lock.debian is not None
    pins = list(lock.debian.packages)
    paths = debian.fetch_debs(pins, mirrors=debian.mirror_list(lock.debian.mirror), cache_dir=debs)
    root = tmp_path / "rootfs"
    debian.make_rootfs(pins, paths, root)
    real = ldcache.parse((root / "etc" / "ld.so.cache").read_bytes())
    assert len(real) > 40
    assert ldcache.cache_entries(root, 62) == real


# --- run and verify under emulation -----------------------------------------------------------------


def test_envspec_run_starts_the_arm64_image_under_emulation_and_verify_passes(host, tmp_path, debs):
    needs_emulation(host)
    built = do_build(SMOKE_ARM, host, new_cache(tmp_path, debs, "c"))
    env = {"ENVSPEC_STORAGE_ROOT": os.environ["ENVSPEC_STORAGE_ROOT"]}
    shown = envspec_cli(
        "run", "--print", "--emulate", "--no-mount", str(SMOKE_ARM), "--", "true", env=env
    )
    assert (
        shown.returncode == 0 and " --arch arm64 " in shown.stdout and "emulation" in shown.stdout
    ), shown
    cp = envspec_cli(
        "run",
        "--emulate",
        "--no-mount",
        str(SMOKE_ARM),
        "--",
        "sh",
        "-c",
        "uname -m; ldconfig -p | head -2; cat /sys/devices/system/cpu/cpu0/regs/identification/midr_el1; "
        "echo CPUS=$(getconf _NPROCESSORS_ONLN); envspec verify --json; echo VERIFY_RC=$?",
        env=env,
    )
    out = cp.stdout
    assert out.splitlines()[0] == "aarch64", out + cp.stderr
    # the CPU ID an arm64 kernel gives (torch's oneDNN reads it), and the host's CPUs still counted
    from envspec.host import GRACE_MIDR_EL1

    assert GRACE_MIDR_EL1 in out.splitlines() and f"CPUS={os.cpu_count()}" in out.splitlines(), out
    assert "(libc6,AArch64)" in out  # the written ld.so.cache, read by the image's own ldconfig
    report = json.JSONDecoder().raw_decode(out[out.index("{") :])[0]
    assert "VERIFY_RC=0" in out and report["ok"], out[-3000:] + cp.stderr[-2000:]
    by = {f["check"]: f for f in report["findings"]}
    assert (
        by["integrity.packages"]["status"] == "pass" and by["integrity.files"]["status"] == "pass"
    )
    assert built.image.endswith(lockmod.load(SMOKE_ARM).short_hash)


def test_one_changed_file_in_the_arm64_image_fails_its_verifier(host, tmp_path, debs):
    needs_emulation(host)
    from envspec.run import RunOptions, plan_run

    do_build(SMOKE_ARM, host, new_cache(tmp_path, debs, "c"))
    argv = plan_run(
        lockmod.load(SMOKE_ARM),
        [
            "sh",
            "-c",
            "echo '# edited' >> \"$(python -c 'import six; "
            "print(six.__file__)')\"; envspec verify --json; "
            "echo VERIFY_RC=$?",
        ],
        host=host,
        options=RunOptions(mount_cwd=False, emulate=True),
    ).argv
    at = argv.index("run") + 1
    argv[at:at] = ["--user", "0"]  # the venv belongs to root: only root can change a file in it
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    out = cp.stdout
    assert "VERIFY_RC=1" in out, out[-3000:] + cp.stderr[-2000:]
    report = json.JSONDecoder().raw_decode(out[out.index("{") :])[0]
    f = {x["check"]: x for x in report["findings"]}["integrity.files"]
    assert f["status"] == "fail" and "six.py (changed: size" in f["observed"], f


@pytest.mark.slow
def test_arm64_cpu_torch_image_passes_its_cpu_checks_under_emulation(host, tmp_path, debs):
    """lockfiles/cpu-arm64.lock: PyPI's aarch64 torch (the CPU build), built here, its verifier
    run under qemu: torch imports, the CPU numerics and integrity pass."""
    needs_emulation(host)
    do_build(CPU_ARM, host, new_cache(tmp_path, debs, "c"))
    cp = envspec_cli(
        "run",
        "--emulate",
        "--no-mount",
        str(CPU_ARM),
        "--",
        "sh",
        "-c",
        "envspec verify --json; echo VERIFY_RC=$?",
        env={"ENVSPEC_STORAGE_ROOT": os.environ["ENVSPEC_STORAGE_ROOT"]},
        timeout=1200,
    )
    out = cp.stdout
    report = json.JSONDecoder().raw_decode(out[out.index("{") :])[0]
    by = {f["check"]: f for f in report["findings"]}
    assert "VERIFY_RC=0" in out, out[-4000:] + cp.stderr[-2000:]
    assert all(
        by[c]["status"] == "pass"
        for c in ("torch.version", "torch.cuda", "numerics.cpu", "integrity.files")
    ), by
    assert "2.9.1" in by["torch.version"]["observed"]


# --- lock --------------------------------------------------------------------------------------------


def test_lock_names_a_package_without_an_aarch64_wheel_at_its_line(tmp_path):
    """PyPI's intel-openmp 2024.2.1 has x86 and Windows wheels only: exit 2, at the spec's line."""
    spec = tmp_path / "omp.toml"
    spec.write_text(
        'name = "omp"\n[target]\nplatforms = ["linux-aarch64"]\n[python]\n'
        'packages = ["six==1.16.0", "intel-openmp==2024.2.1"]\n'
    )
    cp = envspec_cli("lock", str(spec), "-o", str(tmp_path / "omp.lock"), timeout=300)
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert (
        "no-wheel-for-platform" in cp.stderr and f"[python].packages[1] ({spec}:5)" in cp.stderr
    ), cp.stderr
    assert "manylinux1_x86_64" in cp.stderr and not (tmp_path / "omp.lock").exists()

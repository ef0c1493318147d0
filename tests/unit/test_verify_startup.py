"""The container start-up hook (`python -m envspec.verify --startup`): it judges the driver and the
GPUs with torch unimportable, imports no torch and none of the full verifier, and reads only the
lock tables it needs.

The machine is faked with the verifier's test hook ENVSPEC_FAKE_ROOT (the probes read /proc, /dev,
/sys and $ENVSPEC_FAKE_ROOT/lib/libnvidia-ml.so.1 under it), and NVML with a small C library built
here that answers the calls probes.probe_nvml makes through ctypes (skipped where no C compiler).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_verify_fakes import rehash_text

from envspec.verify import startup
from envspec.verify.lockfile import load_lock

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
LOCKS = ROOT / "lockfiles"
GPU_LOCK = (
    LOCKS / "h100-train.lock"
)  # driver_floor 580.65.06, arch_list sm_75 ... sm_120, H100 (cc 9.0)


def _proc_version(version: str) -> str:
    return (
        f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
        "(dvs-builder@U22-I3-AE18-23-3)  Tue Sep 23 00:52:08 UTC 2025\nGCC version:  gcc version 12.2.0\n"
    )


def fake_root(
    tmp_path: Path, driver: str | None, *, nodes=("nvidia0", "nvidiactl", "nvidia-uvm")
) -> Path:
    """A machine: /proc/driver/nvidia/version saying ``driver`` (None: no driver), /dev nodes."""
    root = tmp_path / "root"
    (root / "dev" / "shm").mkdir(parents=True)
    if driver is not None:
        (root / "proc" / "driver" / "nvidia").mkdir(parents=True)
        (root / "proc" / "driver" / "nvidia" / "version").write_text(_proc_version(driver))
        for n in nodes:
            (root / "dev" / n).write_text("")
    return root


NVML_C = r"""
#include <string.h>
typedef struct { unsigned long long total, free, used; } mem_t;
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlSystemGetDriverVersion(char *b, unsigned n) { strncpy(b, DRIVER, n); return 0; }
int nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = CUDA; return 0; }
int nvmlDeviceGetCount_v2(unsigned *c) { *c = COUNT; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) { *h = (void *)(unsigned long)(i + 1); return 0; }
int nvmlDeviceGetName(void *h, char *b, unsigned n) { strncpy(b, NAME, n); return 0; }
int nvmlDeviceGetMemoryInfo(void *h, mem_t *m) { m->total = 80ULL << 30; m->free = 79ULL << 30; m->used = 1ULL << 30;
                                                 return 0; }
int nvmlDeviceGetCudaComputeCapability(void *h, int *ma, int *mi) { *ma = MAJOR; *mi = MINOR; return 0; }
"""


def fake_nvml(
    root: Path, *, driver: str, name: str, cc: str, count: int = 2, cuda: int = 13000
) -> None:
    cc_exe = shutil.which("cc") or shutil.which("gcc")
    if cc_exe is None:
        pytest.skip("no C compiler to build the fake libnvidia-ml.so.1 (apt-get install -y gcc)")
    major, minor = cc.split(".")
    src = root / "nvml.c"
    src.write_text(NVML_C)
    (root / "lib").mkdir(exist_ok=True)
    subprocess.run(
        [
            cc_exe,
            "-shared",
            "-fPIC",
            "-o",
            str(root / "lib" / "libnvidia-ml.so.1"),
            str(src),
            f'-DDRIVER="{driver}"',
            f'-DNAME="{name}"',
            f"-DCUDA={cuda}",
            f"-DCOUNT={count}",
            f"-DMAJOR={major}",
            f"-DMINOR={minor}",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )


@pytest.fixture
def no_torch(tmp_path) -> Path:
    """A directory that, first on PYTHONPATH, makes `import torch` fail."""
    d = tmp_path / "no-torch"
    (d / "torch").mkdir(parents=True)
    (d / "torch" / "__init__.py").write_text(
        "raise ImportError('torch is unimportable in this test')\n"
    )
    return d


def hook(
    lock: Path, root: Path, no_torch: Path, mode: str = "strict"
) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ENVSPEC_", "NCCL_", "CUDA_", "TORCH_"))
    }
    env.update(
        PYTHONPATH=f"{no_torch}{os.pathsep}{SRC}",
        ENVSPEC_LOCK=str(lock),
        ENVSPEC_VERIFY=mode,
        ENVSPEC_FAKE_ROOT=str(root),
        NCCL_DEBUG="WARN",
    )  # NCCL_DEBUG: h100-train's [runtime].env
    return subprocess.run(
        [sys.executable, "-m", "envspec.verify", "--startup"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_hook_judges_the_driver_with_torch_unimportable(tmp_path, no_torch):
    old = hook(GPU_LOCK, fake_root(tmp_path / "old", "570.86.15"), no_torch)
    assert old.returncode == 1, old.stderr
    assert (
        "FAIL driver: 570.86.15 (from kernel module)" in old.stderr and ">= 580.65.06" in old.stderr
    )
    assert "torch" not in old.stderr.replace(
        "torch variant", ""
    )  # no torch finding, no import error
    assert "WARN test_hook" in old.stderr  # a faked machine never passes silently

    ok = hook(GPU_LOCK, fake_root(tmp_path / "ok", "580.95.05"), no_torch)
    assert ok.returncode == 0, ok.stderr
    assert "FAIL" not in ok.stderr and "WARN driver" not in ok.stderr


def test_hook_reads_gpus_through_nvml(tmp_path, no_torch):
    root = fake_root(tmp_path, "580.95.05")
    fake_nvml(root, driver="580.95.05", name="NVIDIA H100 80GB HBM3", cc="9.0")
    p = hook(GPU_LOCK, root, no_torch)
    assert p.returncode == 0 and "FAIL" not in p.stderr, p.stderr

    # a GPU the lock has no kernels for: the lock is cut to Ampere only
    lock = tmp_path / "ampere.lock"
    text = GPU_LOCK.read_text()
    arch = text[text.index("arch_list = [") : text.index("]", text.index("arch_list = [")) + 1]
    lock.write_text(text.replace(arch, 'arch_list = ["sm_80", "sm_86"]', 1))
    p = hook(lock, root, no_torch)
    assert p.returncode == 1
    assert "FAIL gpu.0.arch: NVIDIA H100 80GB HBM3, cc 9.0: no locked kernel runs" in p.stderr
    assert "FAIL gpu.1.arch" in p.stderr  # every GPU NVML lists


def test_hook_fails_a_driver_older_than_the_gpu(tmp_path, no_torch):
    # NVML and the kernel module agree on a 565 driver; a Blackwell GPU needs R570
    root = fake_root(tmp_path, "565.57.01")
    fake_nvml(root, driver="565.57.01", name="NVIDIA B200", cc="10.0", count=1, cuda=12070)
    lock = tmp_path / "low-floor.lock"
    lock.write_text(
        GPU_LOCK.read_text().replace('driver_floor = "580.65.06"', 'driver_floor = "525.60.13"', 1)
    )
    p = hook(lock, root, no_torch)
    assert "FAIL driver.gpu.0" in p.stderr and "R570" in p.stderr, p.stderr
    assert p.returncode == 1


def test_nvml_and_kernel_module_disagreeing_fails(tmp_path, no_torch):
    root = fake_root(tmp_path, "580.95.05")
    fake_nvml(root, driver="575.51.03", name="NVIDIA H100 80GB HBM3", cc="9.0", count=1)
    p = hook(GPU_LOCK, root, no_torch)
    assert (
        "FAIL driver.userspace" in p.stderr
        and "kernel module 580.95.05, NVML 575.51.03" in p.stderr
    ), p.stderr


def test_gpu_lock_without_a_driver_skips_as_before(tmp_path):
    lock = load_lock(GPU_LOCK)
    r = startup.run_startup(
        lock, system=startup.Machine(str(fake_root(tmp_path, None)), nvidia_smi=False)
    )
    f = {x.check: x for x in r.findings}
    assert f["driver"].status == "skip" and "no NVIDIA driver found" in f["driver"].observed
    assert f["container.gpu"].status == "skip"
    assert f["gpu"].status == "skip" and "no NVIDIA driver" in f["gpu"].observed
    assert not [x for x in r.findings if x.status == "fail"]


def test_cpu_lock_without_a_driver_is_quiet(tmp_path, no_torch):
    p = hook(LOCKS / "cpu.lock", fake_root(tmp_path, None), no_torch)
    assert p.returncode == 0
    lines = [
        ln for ln in p.stderr.splitlines() if "test_hook" not in ln and "at start-up" not in ln
    ]
    assert lines == [], p.stderr


def test_hook_imports_no_torch_and_not_the_full_verifier(tmp_path):
    # in the hook's own process (python -c): what it left in sys.modules
    code = (
        "import json, sys\n"
        "from envspec.verify import startup\n"
        "rc = startup.hook('warn')\n"
        "print(json.dumps([rc, sorted(m for m in sys.modules if m.startswith(('torch', 'envspec', 'argparse',"
        " 'subprocess', 'concurrent')))]))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(SRC),
        "ENVSPEC_LOCK": str(GPU_LOCK),
        "ENVSPEC_FAKE_ROOT": str(fake_root(tmp_path, "580.95.05")),
    }
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert p.returncode == 0, p.stderr
    rc, mods = json.loads(p.stdout)
    assert rc == 0
    assert not [m for m in mods if m == "torch" or m.startswith("torch.")]
    assert not {
        "envspec.verify.checks",
        "envspec.verify.torchprobe",
        "envspec.verify.integrity",
        "envspec.verify.cli",
        "argparse",
        "subprocess",
        "concurrent.futures",
    } & set(mods), mods
    assert "envspec.verify.startup" in mods


def test_startup_check_in_process_leaves_no_torch(monkeypatch, tmp_path, capsys):
    from envspec.verify import cli

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    monkeypatch.setenv(startup.FAKE_ROOT_ENV, str(fake_root(tmp_path, "570.86.15")))
    before = set(sys.modules)
    assert cli.startup_check("strict", lock_path=str(GPU_LOCK)) == 1
    assert "FAIL driver: 570.86.15" in capsys.readouterr().err
    assert not {m for m in set(sys.modules) - before if m.startswith("torch")}


def test_lock_tables_read_as_the_whole_file():
    for path in sorted(LOCKS.glob("*.lock")):
        if path.read_text().count("\nversion = 1\n") != 1:
            continue  # a multi-platform lock: images carry one platform's view (version 1), the verifier reads that
        whole, part = load_lock(path), load_lock(path, tables=startup.LOCK_TABLES)
        for key in startup.LOCK_TABLES + ("version", "revision", "__file_sha256__"):
            assert part.get(key) == whole.get(key), (path.name, key)
        assert "wheels" not in part and "debian" not in part and "wheels" in whole


def test_lock_tables_fall_back_to_the_whole_file(tmp_path):
    # a header-like line inside a multi-line array: the cut does not parse, the whole file does
    p = tmp_path / "odd.lock"
    p.write_text(
        rehash_text(
            GPU_LOCK.read_text().replace("[hardware]\n", "[hardware]\nextra = [\n[1, 2],\n]\n", 1)
        )
    )
    part = load_lock(p, tables=startup.LOCK_TABLES)
    assert part["hardware"]["extra"] == [[1, 2]] and part["hardware"]["driver_floor"] == "580.65.06"


def test_module_entry_hands_other_arguments_to_the_full_cli(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    p = subprocess.run(
        [sys.executable, "-m", "envspec.verify", "--startup", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0 and "usage: envspec verify" in p.stdout


def test_startup_args_are_the_hooks_own_or_the_full_clis():
    assert startup.startup_args(["--startup"]) == (True, None)
    assert startup.startup_args(["verify", "--startup", "--lock", "a.lock"]) == (True, "a.lock")
    assert startup.startup_args(["--lock=b.lock", "--startup"]) == (True, "b.lock")
    assert startup.startup_args(["--startup", "--help"]) == (False, None)
    assert startup.startup_args(["--startup", "--lock"]) == (
        False,
        None,
    )  # argparse says what is missing

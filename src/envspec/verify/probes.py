"""Probes of the machine that need no torch: driver, GPUs through NVML, container plumbing.

Each probe returns plain data (or None when the source is absent) and never raises for a
missing driver; the checks in ``startup.py`` and ``checks.py`` turn the data into findings.
Standard library only, and cheap to import (the container start-up hook imports this module):
``shutil`` and ``subprocess`` are imported only when nvidia-smi is asked.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict

PROC_DRIVER = "/proc/driver/nvidia/version"
NVML_LIB = "libnvidia-ml.so.1"


class NvmlGpu(TypedDict):
    """A GPU as NVML (or nvidia-smi) names it; what it did not answer is absent."""

    index: int
    name: NotRequired[str]
    memory_total: NotRequired[int]
    memory_free: NotRequired[int]
    cc: NotRequired[str]


@dataclass
class DriverInfo:
    version: str = ""  # "580.159.04"
    cuda: str = ""  # highest CUDA the driver supports, "13.0" (NVML/nvidia-smi only)
    source: str = ""  # where the version was read
    gpus: list[NvmlGpu] = field(default_factory=list)  # NVML's view of each GPU


def parse_proc_version(text: str) -> str:
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue ..." (also "Open Kernel Module")
    m = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else ""


def version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in re.split(r"[.\-+]", v):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


class _NvmlMemory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


def probe_nvml(lib: str = NVML_LIB) -> DriverInfo | None:
    """The driver and GPUs through libnvidia-ml.so.1 (ctypes), or None when NVML is absent.
    ``lib``: the library's name (found by the dynamic loader) or a path."""
    try:
        nvml = ctypes.CDLL(lib)
    except OSError:
        return None
    try:
        if nvml.nvmlInit_v2() != 0:
            return None
        info = DriverInfo(source="NVML")
        buf = ctypes.create_string_buffer(96)
        if nvml.nvmlSystemGetDriverVersion(buf, 96) == 0:
            info.version = buf.value.decode()
        cuda = ctypes.c_int()
        if nvml.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(cuda)) == 0:
            info.cuda = f"{cuda.value // 1000}.{cuda.value % 1000 // 10}"
        count = ctypes.c_uint()
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0:
            for i in range(count.value):
                h = ctypes.c_void_p()
                if nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) != 0:
                    continue
                gpu: NvmlGpu = {"index": i}
                if nvml.nvmlDeviceGetName(h, buf, 96) == 0:
                    gpu["name"] = buf.value.decode()
                mem = _NvmlMemory()
                if nvml.nvmlDeviceGetMemoryInfo(h, ctypes.byref(mem)) == 0:
                    gpu["memory_total"] = mem.total
                    gpu["memory_free"] = mem.free
                ma, mi = ctypes.c_int(), ctypes.c_int()
                if (
                    nvml.nvmlDeviceGetCudaComputeCapability(h, ctypes.byref(ma), ctypes.byref(mi))
                    == 0
                ):
                    gpu["cc"] = f"{ma.value}.{mi.value}"
                info.gpus.append(gpu)
        nvml.nvmlShutdown()
        return info
    except (AttributeError, OSError):
        return None


def probe_nvidia_smi() -> DriverInfo | None:
    import shutil  # noqa: PLC0415 (lazy: the start-up hook never runs nvidia-smi)
    import subprocess  # noqa: PLC0415

    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [
                exe,
                "--query-gpu=driver_version,name,compute_cap,memory.total",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    info = DriverInfo(source="nvidia-smi")
    for i, line in enumerate(l for l in out.splitlines() if l.strip()):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4:
            continue
        info.version = parts[0]
        gpu: NvmlGpu = {"index": i, "name": parts[1], "cc": parts[2]}
        if parts[3].isdigit():
            gpu["memory_total"] = int(parts[3]) * 2**20
        info.gpus.append(gpu)
    return info


def probe_driver(
    proc_path: str = PROC_DRIVER, *, nvml_lib: str = NVML_LIB, nvidia_smi: bool = True
) -> DriverInfo | None:
    """The driver version: the kernel module's file first, then NVML, then (``nvidia_smi``)
    nvidia-smi. The GPUs (name, compute capability, memory) come from NVML or nvidia-smi."""
    info = probe_nvml(nvml_lib)
    try:
        v = parse_proc_version(Path(proc_path).read_text())
    except OSError:
        v = ""
    if v:
        if info is None:
            info = DriverInfo()
        if info.version and info.version != v:
            # user-space NVML and kernel module differ: "Driver/library version mismatch"
            info.source = f"kernel module {v}, NVML {info.version}"
        else:
            info.source = "kernel module" + (" + NVML" if info.source == "NVML" else "")
        info.version = v
        return info
    if info is not None and info.version:
        return info
    return probe_nvidia_smi() if nvidia_smi else None


# -- container plumbing --------------------------------------------------------------------


def in_container(root: str = "/") -> bool:
    r = Path(root)
    if (r / ".dockerenv").exists() or (r / "run/.containerenv").exists():
        return True
    try:
        return any(k in (r / "proc/1/cgroup").read_text() for k in ("docker", "kubepods", "libpod"))
    except OSError:
        return False


def device_nodes(dev: str = "/dev") -> list[str]:
    try:
        return sorted(p.name for p in Path(dev).iterdir() if p.name.startswith("nvidia"))
    except OSError:
        return []


def shm_bytes(path: str = "/dev/shm") -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(s: str | int) -> int:
    """Docker-style sizes: "16g", "512m", "1gb", "2GiB", or a number of bytes."""
    if isinstance(s, int):
        return s
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)(?:i?[bB])?\s*", str(s))
    if not m:
        raise ValueError(f"not a size: {s!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def infiniband_present(sysfs: str = "/sys/class/infiniband") -> bool:
    try:
        return any(Path(sysfs).iterdir())
    except OSError:
        return False


# -- what torch.compile needs at run time ----------------------------------------------------


@dataclass
class Toolchain:
    compiler_role: str  # "C++ compiler" | "C compiler"
    compiler_wanted: str  # what was looked for, e.g. "$CXX or g++"
    compiler_path: str  # "" when none was found
    include_dir: str
    python_h: bool


def compile_toolchain(gpu: bool, env: Mapping[str, str] | None = None) -> Toolchain:
    """The compiler and headers torch.compile would call, found the way they find them.

    CPU: Inductor's C++ backend runs ``$CXX``, else ``g++`` (torch/_inductor/config.py,
    ``cpp.cxx``). GPU: Triton builds its launcher with ``$CC``, else ``gcc``, else ``clang``
    (triton/runtime/build.py). Both include ``Python.h`` from ``sysconfig``'s include directory.
    """
    import shutil
    import sysconfig

    env = os.environ if env is None else env
    if gpu:
        role, names = "C compiler", [env["CC"]] if env.get("CC") else ["gcc", "clang"]
        wanted = "$CC, else gcc or clang"
    else:
        role, names = "C++ compiler", [env["CXX"]] if env.get("CXX") else ["g++"]
        wanted = "$CXX, else g++"
    path = ""
    for n in names:
        found = shutil.which(n, path=env.get("PATH"))
        if found:
            path = found
            break
    include = sysconfig.get_paths().get("include", "")
    return Toolchain(
        role, wanted, path, include, bool(include) and Path(include, "Python.h").is_file()
    )


# the child that imports modules one by one, a JSON line after each (its last line names the module
# in progress where it dies: a segfault in an extension's initialiser kills the child, not the verifier)
_IMPORT_CHILD = r"""
import importlib, json, sys, time, traceback
for name in sys.argv[1:]:
    print(json.dumps({"start": name}), flush=True)
    t0 = time.perf_counter()
    try:
        importlib.import_module(name)
        err = ""
    except BaseException as e:
        err = "".join(traceback.format_exception_only(type(e), e)).strip()
    print(json.dumps({"module": name, "error": err, "seconds": round(time.perf_counter() - t0, 3)}), flush=True)
"""


@dataclass
class ImportResult:
    module: str
    error: str = ""  # "" where it imported
    seconds: float = 0.0


def import_modules(
    modules: list[str], *, python: str, timeout: float = 300, env: Mapping[str, str] | None = None
) -> list[ImportResult]:
    """Import each module in a child python, in order, and say which failed and how; a child that
    dies (a crash in an extension's initialiser) or runs past ``timeout`` is named against the
    module it was importing, and the rest are imported by a new child."""
    import json
    import subprocess
    import time

    out: list[ImportResult] = []
    todo = list(modules)
    deadline = time.monotonic() + timeout
    while todo:
        left = deadline - time.monotonic()
        if left <= 0:
            out += [
                ImportResult(m, f"not imported: the imports ran past {timeout:.0f} s") for m in todo
            ]
            break
        try:
            proc = subprocess.run(
                [python, "-c", _IMPORT_CHILD, *todo],
                capture_output=True,
                text=True,
                timeout=left,
                env=None if env is None else dict(env),
            )
            stdout, why = (
                proc.stdout,
                (
                    f"the importing process died with signal {-proc.returncode}"
                    if proc.returncode < 0
                    else f"the importing process exited {proc.returncode}"
                ),
            )
        except subprocess.TimeoutExpired as e:
            stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            why = f"its import ran past {timeout:.0f} s"
        current = None
        for line in stdout.splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if "start" in d:
                current = d["start"]
            elif "module" in d:
                out.append(ImportResult(d["module"], d["error"], d["seconds"]))
                current = None
        done = {r.module for r in out}
        todo = [m for m in todo if m not in done]
        if current is not None and current in todo:
            out.append(ImportResult(current, why))
            todo.remove(current)
        elif todo:  # the child ended before starting the next one: no way on
            out += [ImportResult(m, why) for m in todo]
            break
    return out

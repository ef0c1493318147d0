"""The container start-up hook and the checks that need no torch (``python -m envspec.verify --startup``).

What it checks, cheaply (docs/verify.md, "The start-up hook"): the lock, the environment
variables known to cost speed, the container's GPU plumbing and /dev/shm, the driver (present,
at or above the lock's floor, a branch that knows each GPU, kernel module and NVML agreeing) and
each GPU's model and compute capability against the lock's arch list, all read from /proc, /dev,
/sys and NVML (``libnvidia-ml.so.1`` through ctypes). No torch, no hashing, no subprocess: the
imports are kept to this module, probes, archrule, driverrule, lockfile and model. ``checks.py``'s
full run extends ``MachineChecks`` with the checks that need torch.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from . import archrule, driverrule, probes, settings
from .lockfile import Lock, LockReadError, find_lock, load_lock, lock_hash
from .model import FAIL, PASS, SKIP, WARN, Finding, Report, Status

if TYPE_CHECKING:  # the start-up hook imports no health check
    from .health import GpuHealth, Nvml

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
# what the start-up checks read of the lock (the hook parses only these tables: a lock's
# [[wheels]] and [[debian.packages]] take most of its parse time)
LOCK_TABLES = ("meta", "platform", "hardware", "torch", "runtime")

# Test hook (never for production): the probes read /proc, /dev, /sys and NVML
# ($ENVSPEC_FAKE_ROOT/lib/libnvidia-ml.so.1) under this directory instead of /; every report made
# with it carries a `test_hook` warning.
FAKE_ROOT_ENV = settings.FAKE_ROOT


# Environment settings that cost speed or hide errors, with the reason (checked as "env.NAME").
# value None: any value is flagged.
BAD_ENV: tuple[tuple[str, str | None, str], ...] = (
    (
        "NCCL_P2P_DISABLE",
        "1",
        "turns off NCCL's direct GPU-to-GPU (NVLink/PCIe peer) transport; "
        "all-reduce goes through host memory at a fraction of the speed. Advice to set it is common "
        "and wrong on NVLink machines; unset it",
    ),
    (
        "NCCL_SHM_DISABLE",
        "1",
        "turns off NCCL's shared-memory transport between processes of one node",
    ),
    (
        "CUDA_LAUNCH_BLOCKING",
        "1",
        "serializes every kernel launch (a debugging switch); training runs several times slower",
    ),
    (
        "TORCH_CUDNN_V8_API_DISABLED",
        "1",
        "falls back to cuDNN's legacy API and loses the v8/v9 "
        "engine heuristics (removed in recent torch; has no use in production)",
    ),
    (
        "PYTORCH_NO_CUDA_MEMORY_CACHING",
        "1",
        "turns off PyTorch's caching allocator: every "
        "allocation calls cudaMalloc, much slower (a debugging switch)",
    ),
    (
        "CUDA_CACHE_DISABLE",
        "1",
        "turns off the driver's JIT cache: PTX is recompiled on every start",
    ),
    (
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "0",
        "a failed collective hangs the job instead of aborting it",
    ),
    ("NCCL_DEBUG", "TRACE", "logs every NCCL call; slows collectives and floods logs"),
    (
        "TORCH_CUDA_SANITIZER",
        None,
        "runs the CUDA stream sanitizer on every kernel (debugging only)",
    ),
)
IB_ENV = (
    "NCCL_IB_DISABLE",
    "1",
    "turns off InfiniBand/RoCE for NCCL on a machine that has IB "
    "devices; cross-node traffic falls back to TCP sockets",
)


class Machine:
    """The machine as the torch-free checks see it. Every method is a probe; tests override them.

    ``root`` (default ``$ENVSPEC_FAKE_ROOT``, else ``/``): where /proc, /dev, /sys and NVML are
    read. ``nvidia_smi``: whether the driver probe may fall back to running nvidia-smi (the
    start-up hook does not: it starts no process)."""

    def __init__(self, root: str | None = None, *, nvidia_smi: bool = True) -> None:
        self.env: Mapping[str, str] = os.environ
        self.root = root if root is not None else (settings.get(FAKE_ROOT_ENV) or "/")
        self.nvidia_smi = nvidia_smi

    def path(self, p: str) -> str:
        return p if self.root == "/" else os.path.join(self.root, p.lstrip("/"))

    def prefix(self) -> Path:
        return Path(sys.prefix)

    def executable(self) -> str:
        return sys.executable

    def driver(self) -> probes.DriverInfo | None:
        lib = probes.NVML_LIB if self.root == "/" else self.path(f"/lib/{probes.NVML_LIB}")
        return probes.probe_driver(
            self.path(probes.PROC_DRIVER),
            nvml_lib=lib,
            nvidia_smi=self.nvidia_smi and self.root == "/",
        )

    def driver_loaded(self) -> bool:
        return Path(self.path(probes.PROC_DRIVER)).exists()

    def in_container(self) -> bool:
        return probes.in_container(self.root)

    def device_nodes(self) -> list[str]:
        return probes.device_nodes(self.path("/dev"))

    def shm_bytes(self) -> int | None:
        return probes.shm_bytes(self.path("/dev/shm"))

    def infiniband(self) -> bool:
        return probes.infiniband_present(self.path("/sys/class/infiniband"))

    def nvml(self) -> Nvml | None:
        """NVML for the health checks (``health.Nvml``), or None where it is absent."""
        from . import health  # noqa: PLC0415 (the start-up hook runs no health check)

        return health.Nvml.open(
            probes.NVML_LIB if self.root == "/" else self.path(f"/lib/{probes.NVML_LIB}")
        )

    def kernel_log(self) -> str | None:
        """The kernel log since boot (/dev/kmsg), None where it cannot be read."""
        from . import health  # noqa: PLC0415

        return health.read_kmsg(self.path("/dev/kmsg"))


def arch_judgement(
    arch_list: list[str],
    cc: str,
    name: str,
    *,
    declared: list[str],
    names: list[str],
    torch_arch: list[str] | None = None,
) -> tuple[Status, str, list[str]]:
    """(status, hint, runnable arch entries) for a GPU of compute capability ``cc`` and the lock's
    ``arch_list`` (and, in the full run, the loaded torch's arch list)."""
    usable, kind = archrule.runnable_by(arch_list, cc)
    t_kind = archrule.runnable_by(torch_arch, cc)[1] if torch_arch else "?"
    status: Status = PASS
    hint = ""
    if kind == "none":
        status = FAIL
        major, minor = archrule.parse_cc(cc)
        hint = (
            f"no entry of the lock's arch list runs on compute capability {cc}: it needs SASS "
            f"sm_{major}Z with Z <= {minor}, or PTX compute_XY with XY <= {major}{minor}. Lock for a "
            f"torch that includes sm_{major}{minor} (add {name!r} to [target].gpus)"
        )
    elif t_kind == "none":
        status = FAIL
        hint = f"the loaded torch has no kernels for cc {cc} ({' '.join(torch_arch or [])})"
    elif kind == "ptx":
        status = WARN
        hint = (
            f"only PTX ({', '.join(usable)}) runs on cc {cc}: the driver JIT-compiles every kernel at "
            "first use (minutes) and newer instructions go unused"
        )
    elif declared and cc not in declared:
        status = WARN
        hint = f"cc {cc} is not a declared target ({', '.join(declared)}) but the locked kernels run on it"
    elif names and name not in names:
        status = WARN
        hint = (
            f"{name} is not a declared target ({', '.join(names)}) but the locked kernels run on it"
        )
    return status, hint, usable


class MachineChecks:
    """One run of the checks that need no torch (the "startup" level); checks.py's ``_Run``
    extends it for the quick and full levels."""

    def __init__(
        self,
        lock: Lock,
        level: str,
        mode: str,
        system: Machine,
        skip: tuple[str, ...] = (),
    ) -> None:
        self.lock = lock
        self.level = level
        self.sys = system
        self.skip = skip
        self.platform = lock.get("platform", {})
        self.hardware = lock.get("hardware", {})
        self.torch_lock = lock.get("torch", {})
        self.runtime = lock.get("runtime", {})
        venv = self.platform.get("venv", "")
        if mode == "auto":
            same = bool(venv) and os.path.realpath(venv) == os.path.realpath(str(system.prefix()))
            mode = "image" if same else "host"
        self.mode = mode
        self.report = Report(
            level=level,
            lock_path=lock.get("__path__", ""),
            lock_hash=lock_hash(lock),
            lock_name=lock.get("meta", {}).get("name", ""),
            mode=mode,
        )
        self.driver: probes.DriverInfo | None = None
        self.health_gpus: list[GpuHealth] = []  # each GPU's, once check_health ran

    # helpers -----------------------------------------------------------------------------
    def add(
        self,
        check: str,
        status: Status,
        expected: str = "",
        observed: str = "",
        hint: str = "",
        **data: object,
    ) -> Finding:
        return self.report.add(Finding(check, status, str(expected), str(observed), hint, data))

    def wanted(self, name: str) -> bool:
        return not any(name == s or name.startswith(s + ".") for s in self.skip)

    def timed(self, name: str, fn: Callable[[], None]) -> None:
        if not self.wanted(name):
            return
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:  # a probe that breaks is a finding, never a crash
            import traceback  # noqa: PLC0415 (only when a check breaks)

            self.add(
                name,
                FAIL,
                observed=f"the check raised {type(e).__name__}: {e}",
                hint="a bug in the verifier or a broken library; -v (or the JSON's data.traceback) "
                "shows the traceback",
                traceback=traceback.format_exc()[-4000:],
            )
        self.report.timings[name] = self.report.timings.get(name, 0.0) + time.perf_counter() - t0

    @property
    def expects_gpu(self) -> bool:
        return str(self.torch_lock.get("variant", "")).startswith("cu") or bool(
            self.hardware.get("gpus")
        )

    def add_header(self) -> None:
        """The ``lock`` and ``mode`` findings every report starts with (and the test hook's)."""
        self.add(
            "lock",
            PASS,
            expected="a lockfile of format version 1",
            observed=f"{self.report.lock_path or '(in memory)'}: {self.report.lock_name or '?'} "
            f"{self.report.lock_hash[:19]}",
        )
        py = self.sys.executable()
        self.add(
            "mode",
            PASS,
            expected=f"image: python of {self.platform.get('venv', '?')}",
            observed=f"{self.mode}: {py}"
            + (
                " (host mode: the lock's venv is not this python;"
                " see docs/verify.md for what is relaxed)"
                if self.mode == "host"
                else ""
            ),
        )
        root = getattr(self.sys, "root", "/")
        if root != "/":
            self.add(
                "test_hook",
                WARN,
                expected=f"{FAKE_ROOT_ENV} unset",
                observed=f"the probes read /proc, /dev, /sys and NVML under {root}",
                hint="a test hook: never set it in production",
            )

    # the start-up run --------------------------------------------------------------------
    def run(self) -> Report:
        t_start = time.perf_counter()
        self.add_header()
        self.timed("env", self.check_env)
        self.timed("container", self.check_container)
        self.timed("driver", self.check_driver)
        self.timed("gpu", self.check_nvml_gpus)
        self.report.timings["total"] = time.perf_counter() - t_start
        return self.report

    def check_nvml_gpus(self) -> None:
        """Each GPU NVML lists (every GPU the container can open; CUDA_VISIBLE_DEVICES is not
        applied) against the lock's arch list: model and compute capability, no CUDA context."""
        d = self.driver
        if not self.expects_gpu:
            self.add(
                "gpu", SKIP, observed="skipped: a CPU lock (no [hardware].gpus, torch variant cpu)"
            )
            return
        if d is None or not d.version:
            self.add("gpu", SKIP, observed="skipped: no NVIDIA driver")
            return
        if "NVML" not in d.source:
            self.add(
                "gpu",
                SKIP,
                expected="each GPU's model and compute capability (NVML)",
                observed=f"{probes.NVML_LIB} is not loadable here: not checked at start; "
                "`envspec verify` checks the GPUs through torch",
            )
            return
        gpus = [g for g in d.gpus if g.get("cc")]
        self.add(
            "gpu.count",
            PASS if gpus else FAIL,
            expected="at least one GPU (NVML)",
            observed=f"{len(gpus)}: "
            + ", ".join(str(g.get("name", "?")) for g in gpus[:4])
            + (f" and {len(gpus) - 4} more" if len(gpus) > 4 else ""),
            hint=""
            if gpus
            else "the driver is loaded but NVML lists no GPU: the container was started "
            "without GPUs (--device nvidia.com/gpu=all, or --gpus all)",
        )
        arch_list = [str(a) for a in self.hardware.get("arch_list", [])]
        declared = [str(c) for c in self.hardware.get("compute_capabilities", [])]
        names = [str(g) for g in self.hardware.get("gpus", [])]
        for g in gpus:
            self.add_arch(
                int(g.get("index", 0)),
                str(g.get("name", "?")),
                str(g["cc"]),
                arch_list,
                declared=declared,
                names=names,
            )

    def add_arch(
        self,
        i: int,
        name: str,
        cc: str,
        arch_list: list[str],
        *,
        declared: list[str],
        names: list[str],
        torch_arch: list[str] | None = None,
    ) -> None:
        status, hint, usable = arch_judgement(
            arch_list, cc, name, declared=declared, names=names, torch_arch=torch_arch
        )
        self.add(
            f"gpu.{i}.arch",
            status,
            expected=f"runnable by {' '.join(arch_list) or '(empty arch list)'}"
            + (f"; cc in {', '.join(declared)}" if declared else ""),
            observed=f"{name}, cc {cc}: "
            + (f"runs {', '.join(usable)}" if usable else "no locked kernel runs"),
            hint=hint,
            name=name,
            cc=cc,
        )

    # env and container -------------------------------------------------------------------
    def check_env(self) -> None:
        env = self.sys.env
        rules = list(BAD_ENV)
        if self.sys.infiniband():
            rules.append(IB_ENV)
        flagged = 0
        for name, bad, why in rules:
            v = env.get(name)
            if v is None or (bad is not None and v.strip() != bad):
                continue
            flagged += 1
            self.add(
                f"env.{name}",
                WARN,
                expected=f"{name} unset",
                observed=f"{name}={v}",
                hint=f"{why}. Unset {name} unless you are debugging.",
            )
        for k, v in sorted((self.runtime.get("env") or {}).items()):
            got = env.get(k)
            if got != str(v):
                self.add(
                    f"env.{k}",
                    WARN if self.mode == "host" else FAIL,
                    expected=f"{k}={v} ([runtime].env)",
                    observed=f"{k}={got}" if got is not None else f"{k} unset",
                    hint="the image sets it; a `-e`/`--env` at container start or the job file overrides it",
                )
                flagged += 1
        if not flagged:
            self.add(
                "env",
                PASS,
                expected="no setting known to cost speed; [runtime].env as locked",
                observed="none found",
            )

    def check_container(self) -> None:
        nodes = self.sys.device_nodes()
        driver_loaded = self.sys.driver_loaded()
        inside = self.sys.in_container()
        if self.expects_gpu and not driver_loaded and not nodes:
            self.add(
                "container.gpu",
                SKIP,
                expected="GPU plumbing (NVIDIA_* variables, /dev/nvidia*)",
                observed="no NVIDIA kernel driver on this machine: no GPU to pass through, not checked",
            )
        elif inside and self.expects_gpu:
            self._check_nvidia_env()
        if self.expects_gpu and (driver_loaded or nodes):
            self._check_devices(nodes, driver_loaded)
        self._check_shm()

    def _check_nvidia_env(self) -> None:
        """The NVIDIA container toolkit's variables: GPUs made visible, compute and utility."""
        env = self.sys.env
        vis = env.get("NVIDIA_VISIBLE_DEVICES")
        caps = env.get("NVIDIA_DRIVER_CAPABILITIES", "")
        if vis in (None, "", "void", "none"):
            self.add(
                "container.nvidia_visible_devices",
                WARN,
                expected="NVIDIA_VISIBLE_DEVICES=all (or GPU ids)",
                observed=f"NVIDIA_VISIBLE_DEVICES={vis}" if vis is not None else "unset",
                hint="with the NVIDIA container toolkit's legacy hook no GPU is injected; "
                "envspec images set it to all; pass --gpus all or a CDI device",
            )
        elif caps and not (
            {"compute", "utility"} <= set(caps.split(",")) or "all" in caps.split(",")
        ):
            self.add(
                "container.nvidia_driver_capabilities",
                WARN,
                expected="compute,utility (or all)",
                observed=caps,
                hint="without 'compute' the CUDA driver library is not mounted; "
                "without 'utility' nvidia-smi and NVML are missing",
            )
        else:
            self.add(
                "container.nvidia_env",
                PASS,
                expected="NVIDIA_VISIBLE_DEVICES and NVIDIA_DRIVER_CAPABILITIES",
                observed=f"NVIDIA_VISIBLE_DEVICES={vis} NVIDIA_DRIVER_CAPABILITIES={caps or '(default)'}",
            )

    def _check_devices(self, nodes: list[str], driver_loaded: bool) -> None:
        """/dev/nvidiactl, /dev/nvidia-uvm and a node per GPU passed to the container."""
        gpu_nodes = [n for n in nodes if n[len("nvidia") :].isdigit()]
        if not nodes and driver_loaded:
            self.add(
                "container.devices",
                FAIL,
                expected="/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia<N>",
                observed="the kernel driver is loaded but no /dev/nvidia* node is present",
                hint="the container was started without GPUs: podman/docker --gpus all, "
                "or --device nvidia.com/gpu=all (CDI)",
            )
        elif nodes:
            missing = [n for n in ("nvidiactl", "nvidia-uvm") if n not in nodes]
            if not missing and "nvidia-uvm-tools" not in nodes:
                self.add(
                    "container.devices.uvm_tools",
                    WARN,
                    expected="/dev/nvidia-uvm-tools",
                    observed="absent: CUDA runs, but profilers (Nsight Systems, CUPTI, DCGM's profiling "
                    "metrics) cannot attach",
                    hint="pass it to the container (--device /dev/nvidia-uvm-tools; the toolkit's CDI "
                    "spec lists it), or create it on the host (nvidia-modprobe -u -c=0)",
                )
            self.add(
                "container.devices",
                FAIL if missing else PASS,
                expected="/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia<N>",
                observed=f"{len(gpu_nodes)} GPU node(s); "
                + ", ".join(f"/dev/{n}" for n in nodes[:6])
                + (f" (missing {', '.join(missing)})" if missing else ""),
                hint="CUDA needs nvidia-uvm for managed memory and nvidiactl for any context; "
                "load the nvidia-uvm module (nvidia-modprobe -u -c=0)"
                if missing
                else "",
            )

    def _check_shm(self) -> None:
        """/dev/shm at least [runtime].shm_size."""
        want = self.runtime.get("shm_size")
        have = self.sys.shm_bytes()
        if want:
            try:
                want_b = probes.parse_size(want)
            except ValueError:
                self.add(
                    "container.shm",
                    WARN,
                    expected=str(want),
                    observed="unparseable [runtime].shm_size",
                )
                return
            if have is None:
                self.add(
                    "container.shm",
                    WARN,
                    expected=f">= {want}",
                    observed="/dev/shm is missing",
                    hint="DataLoader workers and NCCL's shared-memory transport need /dev/shm",
                )
            elif have + (1 << 20) < want_b:
                self.add(
                    "container.shm",
                    WARN,
                    expected=f">= {want} ([runtime].shm_size)",
                    observed=f"/dev/shm is {probes.human_bytes(have)}",
                    hint=f"start the container with --shm-size={want} (docker/podman default is 64m; "
                    "DataLoader workers die with 'bus error' and NCCL falls back)",
                )
            else:
                self.add(
                    "container.shm",
                    PASS,
                    expected=f">= {want}",
                    observed=f"/dev/shm is {probes.human_bytes(have)}",
                )

    # driver ------------------------------------------------------------------------------
    def check_health(self) -> None:
        """The node's health (issue 31): per GPU, over NVML, uncorrected ECC errors, row remapping or
        page retirement, throttling, persistence mode, the PCIe link and the NVLinks; and the XID
        events of the kernel log (health.py)."""
        from . import health  # noqa: PLC0415

        if not self.expects_gpu and not (self.driver and self.driver.gpus):
            return
        nvml = self.sys.nvml()
        if nvml is None:
            self.add(
                "health",
                SKIP,
                expected="the GPUs' health over NVML",
                observed="no NVML (libnvidia-ml.so.1) here: the GPUs' health is not read",
                hint="the NVIDIA container toolkit mounts it with NVIDIA_DRIVER_CAPABILITIES=utility",
            )
            return
        try:
            gpus = health.read_all(nvml)
        finally:
            nvml.close()
        self.health_gpus = gpus  # the full level's copy check reads the PCIe links
        for g in gpus:
            for f in health.gpu_findings(g, gpus_in_node=len(gpus)):
                if self.wanted(f.check):
                    self.report.add(f)
        if self.wanted("health.xid"):
            self.report.extend(
                health.xid_findings(
                    self.sys.kernel_log(), {g.bus_id: g.index for g in gpus if g.bus_id}
                )
            )

    def _no_driver(self, floor: str, policy: str) -> None:
        """No driver here: GPU checks skipped, or none needed for a CPU lock."""
        if self.expects_gpu:
            self.add(
                "driver",
                SKIP,
                expected=f">= {floor} ({policy} policy)" if floor else "an NVIDIA driver",
                observed="no NVIDIA driver found (no /proc/driver/nvidia/version, no libnvidia-ml.so.1"
                + (", no nvidia-smi" if getattr(self.sys, "nvidia_smi", True) else "")
                + "): this machine has no usable GPU, GPU checks are skipped",
            )
        else:
            self.add(
                "driver",
                SKIP,
                expected="none (CPU lock)",
                observed="no NVIDIA driver; none needed",
            )

    def _check_userspace(self, source: str) -> None:
        """The kernel module and NVML of one driver version (``source``: where it was read)."""
        if "mismatch" in source or ("NVML" in source and "kernel" in source and "," in source):
            self.add(
                "driver.userspace",
                FAIL,
                expected="the same version in kernel module and NVML",
                observed=source,
                hint="driver/library version mismatch: reboot or reload the kernel module "
                "after a driver upgrade, or mount the host's matching libraries",
            )

    def check_driver(self) -> None:
        floor = str(self.hardware.get("driver_floor", ""))
        policy = str(self.hardware.get("driver_policy", "compat"))
        self.driver = d = self.sys.driver()
        if d is None or not d.version:
            self._no_driver(floor, policy)
            return
        have = probes.version_tuple(d.version)
        status: Status = PASS
        hint = ""
        if floor and have < probes.version_tuple(floor):
            status = FAIL
            hint = (
                f"this lock needs driver >= {floor} under the '{policy}' policy; upgrade the host "
                "driver, or lock for an older CUDA (a lower floor)"
            )
            if self.hardware.get(
                "driver_assumed"
            ):  # the spec set no [target].driver: the floor was a guess
                hint += (
                    f"; the spec set no [target].driver, so the lock assumed {floor}: set it to this "
                    f"host's {d.version} and lock again for a build that runs here"
                )
        tcuda = str(self.torch_lock.get("cuda", ""))
        extra = ""
        if d.cuda and tcuda:
            dc, tc = probes.version_tuple(d.cuda), probes.version_tuple(tcuda)
            if policy == "strict" and dc < tc:
                status, hint = (
                    FAIL,
                    f"strict policy: the driver supports CUDA {d.cuda}, the lock's runtime is {tcuda}",
                )
            elif dc[:1] < tc[:1]:
                status, hint = (
                    FAIL,
                    (
                        f"the driver supports CUDA {d.cuda}; a CUDA {tcuda} runtime needs a "
                        f"{tc[0]}.x driver at least"
                    ),
                )
            extra = f", supports CUDA {d.cuda}"
        self.add(
            "driver",
            status,
            expected=f">= {floor} ({policy} policy)" if floor else "any",
            observed=f"{d.version} (from {d.source}{extra})",
            hint=hint,
        )
        self.check_driver_knows_gpus(d)
        self._check_userspace(d.source)

    def check_driver_knows_gpus(self, d: probes.DriverInfo) -> None:
        """Each GPU needs a driver branch that knows it, under every policy (driverrule.py)."""
        kinds = sorted(
            {(str(g.get("name", "")), str(g.get("cc", ""))) for g in d.gpus if g.get("cc")}
        )
        for i, (name, cc) in enumerate(kinds):
            old, words = driverrule.too_old(d.version, cc)
            need = driverrule.first_branch(cc)
            if need is None:
                continue
            new, last_words = driverrule.too_new(d.version, cc)
            last = driverrule.last_branch(cc)
            expected = f"driver branch >= R{need} for {name}: {words}"
            if last is not None:
                expected = f"driver branch R{need} to R{last} for {name}: {words}; {last_words}"
            hint = ""
            if old:
                hint = (
                    f"a driver older than R{need} cannot drive {name}, whatever the CUDA compatibility policy: "
                    "upgrade the host driver"
                )
            elif new:
                hint = (
                    f"a driver newer than R{last} cannot drive {name}: run an R{last} driver on this host, or the "
                    "job on newer GPUs"
                )
            self.add(
                f"driver.gpu.{i}",
                FAIL if old or new else PASS,
                expected=expected,
                observed=f"driver {d.version} (branch R{driverrule.branch(d.version)})",
                hint=hint,
            )


def run_startup(
    lock: Lock,
    *,
    mode: str = "auto",
    strict: bool = False,
    system: Machine | None = None,
    skip: tuple[str, ...] = (),
) -> Report:
    """The "startup" level: the checks above, against ``lock`` (a dict as ``load_lock`` returns)."""
    r = MachineChecks(lock, "startup", mode, system or Machine(nvidia_smi=False), tuple(skip))
    r.report.strict = strict
    return r.run()


def _say(text: str, stream: TextIO) -> None:
    stream.write(text)
    stream.flush()


def hook(
    mode: str | None = None,
    *,
    lock_path: str | None = None,
    stream: TextIO | None = None,
    system: Machine | None = None,
) -> int:
    """The container start-up hook. mode (default $ENVSPEC_VERIFY, else "warn"):
    off: nothing; warn: print warnings and failures, return 0; strict: return 1 on a failure,
    2 when the lock cannot be read. Runs ``run_startup``: no torch, no hashing, no GPU work."""
    mode = (mode or settings.get(settings.VERIFY) or "warn").strip().lower() or "warn"
    mode = {
        "0": "off",
        "no": "off",
        "false": "off",
        "on": "strict",
        "1": "strict",
        "yes": "strict",
        "true": "strict",
    }.get(mode, mode)
    out = stream or sys.stderr
    if mode == "off":
        return EXIT_OK
    if mode not in ("warn", "strict"):
        _say(
            f"envspec verify: ENVSPEC_VERIFY={mode!r} is not off, warn or strict; using warn\n", out
        )
        mode = "warn"
    path, source = find_lock(lock_path)
    try:
        lock = load_lock(path, tables=LOCK_TABLES)
    except LockReadError as e:
        _say(f"envspec verify: {e.message} (lock from {source})\n", out)
        return EXIT_BAD_INPUT if mode == "strict" else EXIT_OK
    try:
        report = run_startup(lock, system=system)
    except Exception:  # the hook must never keep a container from starting in warn mode
        import traceback  # noqa: PLC0415

        _say("envspec verify: the start-up check crashed:\n" + traceback.format_exc(), out)
        return EXIT_FAILED if mode == "strict" else EXIT_OK
    for f in report.findings:
        if f.status in (WARN, FAIL):
            _say(
                f"envspec verify: {f.status.upper()} {f.check}: {f.observed} (expected {f.expected})"
                + (f"; {f.hint}" if f.hint else "")
                + "\n",
                out,
            )
    c = report.counts()
    if c[FAIL] or c[WARN]:
        _say(
            f"envspec verify: {c[FAIL]} fail, {c[WARN]} warn at start-up (ENVSPEC_VERIFY={mode}); "
            "run `envspec verify` for the full report\n",
            out,
        )
    if mode == "strict" and c[FAIL]:
        return EXIT_FAILED
    return EXIT_OK


def startup_args(argv: list[str]) -> tuple[bool, str | None]:
    """Whether ``argv`` (``python -m envspec.verify``'s, a leading ``verify`` dropped) is the hook's
    own, ``--startup [--lock PATH]``, read without argparse; and its lock path. Anything else
    (``--help``, a typo) is the full verifier's to answer (``__main__`` hands it to ``cli.main``)."""
    args = argv[1:] if argv[:1] == ["verify"] else argv
    lock_path: str | None = None
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--startup":
            i += 1
        elif a == "--lock" and i + 1 < len(args):
            lock_path, i = args[i + 1], i + 2
        elif a.startswith("--lock="):
            lock_path, i = a[len("--lock=") :], i + 1
        else:
            return False, None
    return True, lock_path

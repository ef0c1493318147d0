"""run_checks(lock) -> Report: every check, in order, from cheap to expensive.

The machine is reached through a ``TorchMachine`` object (probes); unit tests pass a fake one. Each
check appends Findings; none raises for a broken machine (a probe that throws becomes a failing
finding naming the exception), so one report lists every problem at once.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from . import integrity, probes, rates, settings, startup, torchprobe
from .lockfile import Lock, TorchTable
from .model import FAIL, PASS, SKIP, WARN, Report, Status

LEVELS = ("startup", "quick", "full")
IMPORT_TIMEOUT = 300.0  # seconds for the full level's imports of the locked extension modules

# Host mode (a python that is not the lock's venv) holds these to the lock exactly and only
# warns about the rest: torch, triton and the nvidia-* wheels that carry the CUDA libraries
# decide which kernels and libraries run; pure-Python dependencies (cuda-bindings and
# cuda-pathfinder included) and other packages may differ on a shared host.
HOST_STRICT = ("torch", "triton")
ALWAYS_ALLOWED_EXTRA = ("pip",)  # `python -m venv` bootstraps pip into every venv


class TorchMachine(startup.Machine):
    """The machine as the verifier sees it: ``startup.Machine``'s probes plus those that need
    torch or the installed files. Every method is a probe; tests override them."""

    def __init__(self) -> None:
        super().__init__()
        self._torch: tuple[torchprobe.Torch | None, str] | None = None

    def hostname(self) -> str:
        return socket.gethostname()

    def torch(self) -> tuple[torchprobe.Torch | None, str]:
        if self._torch is None:
            self._torch = torchprobe.import_torch()
        return self._torch

    def site_dirs(self) -> list[Path]:
        return integrity.site_dirs()

    def loaded_libraries(self) -> dict[str, list[str]]:
        return torchprobe.loaded_libraries()

    def compile_probe(self, timeout: float) -> torchprobe.CompileProbe:
        """Start the torch.compile child (full level); tests start another command instead."""
        return torchprobe.CompileProbe(timeout)

    def import_modules(self, modules: list[str], timeout: float) -> list[probes.ImportResult]:
        """Import each module in a child of this python (full level)."""
        return probes.import_modules(modules, python=sys.executable, timeout=timeout)

    def compile_toolchain(self, gpu: bool) -> probes.Toolchain:
        return probes.compile_toolchain(gpu, self.env)


def version_matches(locked: str, installed: str) -> bool:
    """PEP 440 ``==`` for a pin: a locked version without a local label ("2.11.0") is met by
    any local build of it ("2.11.0+cu130"); with a label, the label must match too."""
    if locked == installed:
        return True
    return "+" not in locked and installed.split("+", 1)[0] == locked


def _short(items: list[str], n: int = 8) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def _vprefix(v: str, n: int = 3) -> str:
    return ".".join(v.split(".")[:n])


class _Run(startup.MachineChecks):
    """State of one verification run (the checks share what they have probed). The checks that
    need no torch (env, container, driver) are ``startup.MachineChecks``'s."""

    def __init__(
        self,
        lock: Lock,
        level: str,
        mode: str,
        system: TorchMachine,
        skip: tuple[str, ...],
        compile_timeout: float,
        allreduce: str = "inprocess",
    ) -> None:
        if level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, not {level!r}")
        super().__init__(lock, level, mode, system, skip)
        self.sys: TorchMachine = system
        self.compile_timeout = compile_timeout
        self.allreduce = allreduce
        self.wheels = {integrity.normalize(w["name"]): w for w in lock.get("wheels", [])}
        self.torch: torchprobe.Torch | None = None  # once check_torch imported it
        self.tinfo = torchprobe.no_torch()  # until check_torch imports it
        self.hash_cache = integrity.HashCache()
        self.compile_probe: torchprobe.CompileProbe | None = None
        self.dists: dict[str, integrity.Dist] = {}
        self.libs: dict[str, list[str]] = {}
        self.gemm_digest = ""  # the full level's exact GEMM's digest(s)

    @property
    def imported_torch(self) -> torchprobe.Torch:
        """torch, for the checks that run once ``check_torch`` imported it."""
        if self.torch is None:
            raise RuntimeError("a check that needs torch ran before torch was imported")
        return self.torch

    def is_torch_stack(self, name: str) -> bool:
        """The binary core of torch's stack: what host mode still holds to the lock exactly."""
        return name in HOST_STRICT or name.startswith("nvidia-")

    # the run -----------------------------------------------------------------------------
    def run(self) -> Report:
        try:
            return self._run_all()
        finally:  # also on SIGTERM (cli.py turns it into SystemExit) and Ctrl-C
            if self.compile_probe is not None:
                self.compile_probe.close()  # its whole process group: nothing outlives the verifier

    def _run_all(self) -> Report:
        t_start = time.perf_counter()
        self.add_header()
        # start the slow, independent work first so that it overlaps the torch import
        # the real torch.compile is the full level's (a cold compile on 2 cores: 20-90+ s); the
        # quick level checks the toolchain it needs (check_compile_toolchain)
        compile_probe = None
        if self.level == "full" and self.wanted("torch.compile") and self.lock.get("torch"):
            self.compile_probe = compile_probe = self.sys.compile_probe(self.compile_timeout)
        hasher = None
        if self.wanted("integrity"):
            self.dists = integrity.find_dists(self.sys.site_dirs())
            if self.level != "startup" and self.wanted("integrity.files"):
                hasher = _Background(self._hash_locked_files)
        self.timed("env", self.check_env)
        self.timed("container", self.check_container)
        self.timed("driver", self.check_driver)
        if self.level != "startup":
            self.timed("health", self.check_health)
        self.timed("torch", self.check_torch)
        if self.torch is not None and self.tinfo.get("cuda_available"):
            self.timed("gpu", self.check_gpus)
            if self.level != "startup":
                self.timed("libs", self.check_libs)
                self.timed("numerics", self.check_numerics)
            self.timed("tf32", self.check_tf32)
        else:
            self._skip_gpu_checks()
            if self.torch is not None and self.level != "startup":
                self.timed("numerics", self.check_cpu_numerics)
        if self.wanted("integrity"):
            self.timed("integrity", self.check_dist_set)
            if hasher is not None:
                t0 = time.perf_counter()
                checked = hasher.join()
                self.report.timings["integrity.wait"] = time.perf_counter() - t0
                self.report_files(checked, hasher.seconds)
        if self.level == "full" and self.wheels:
            self.timed("imports", self.check_imports)
        if self.level == "full" and self.torch is not None and self.tinfo.get("cuda_available"):
            self.timed("perf", self.check_perf)
            self.timed("perf.copy", self.check_copy)
            self.timed("health.sdc", self.check_sdc)
            self.timed("nccl", self.check_allreduce)
        if self.level != "startup" and self.lock.get("torch"):
            self.timed("torch.compile.toolchain", self.check_compile_toolchain)
            if compile_probe is not None:
                self.timed("torch.compile", lambda: self.check_compile(compile_probe))
            elif self.level == "quick" and self.wanted("torch.compile"):
                self.add(
                    "torch.compile",
                    SKIP,
                    expected="torch.compile of a small function runs (--level full)",
                    observed="not run at the quick level (a cold compile takes 20-90 s or more on a few "
                    "cores); torch.compile.toolchain checked what it needs",
                    hint="envspec verify --level full runs it",
                )
        self.timed("fingerprint", self.make_fingerprint)
        self.report.timings["total"] = time.perf_counter() - t_start
        return self.report

    # torch -------------------------------------------------------------------------------
    def check_torch(self) -> None:
        t0 = time.perf_counter()
        torch, err = self.sys.torch()
        self.report.timings["torch.import"] = time.perf_counter() - t0
        if torch is None:
            self._torch_missing(err)
            return
        self.torch = torch
        self.tinfo = ti = torchprobe.torch_info(torch)
        tl = self.torch_lock
        if not tl:
            self.add(
                "torch.version",
                WARN,
                expected="no torch (the lock has no [torch])",
                observed=ti["full"],
                hint="torch is importable but the lock does not name it",
            )
            return
        self._check_torch_build(ti, tl)
        if not ti["cuda"]:
            return
        self._check_torch_libs(ti, tl)
        self.check_arch_list()
        if not ti["cuda_available"] and self.driver is not None and self.driver.version:
            self.add(
                "torch.cuda_available",
                FAIL,
                expected="torch.cuda.is_available() is True",
                observed=f"False with driver {self.driver.version}: {ti.get('cuda_error', '')}".strip(),
                hint="torch cannot reach the GPU: check the driver floor, CUDA_VISIBLE_DEVICES and the device nodes",
            )

    def _torch_missing(self, err: str) -> None:
        """torch does not import: a failure where the lock has torch (with the missing system
        library where that is why), else a skip."""
        if self.torch_lock:
            hint = "torch checks and GPU checks cannot run; install the locked torch (or run in the image)"
            m = re.search(r"(lib[\w+.-]+\.so[\w.]*): cannot open shared object file", err)
            if m:
                hint = (
                    f"a system library torch links against is missing: {m.group(1)}. In an image, add the "
                    "Debian package that ships it to the spec's system packages (libstdc++.so.6: libstdc++6; "
                    "libgomp.so.1: libgomp1) and rebuild"
                )
            self.add(
                "torch.import",
                FAIL,
                expected=f"torch {self.torch_lock.get('version', '')}",
                observed=f"import torch failed: {err}",
                hint=hint,
            )
        else:
            self.add(
                "torch.import",
                SKIP,
                expected="no torch (the lock has no [torch])",
                observed=err,
            )

    def _check_torch_build(self, ti: torchprobe.TorchInfo, tl: TorchTable) -> None:
        """The torch imported is the locked release and build (its CUDA)."""
        exp = tl.get("version", "") + (f"+{tl['local']}" if tl.get("local") else "")
        ok = ti["version"] == tl.get("version") and (
            not tl.get("local") or ti["local"] == tl.get("local")
        )
        self.add(
            "torch.version",
            PASS if ok else FAIL,
            expected=exp,
            observed=ti["full"],
            hint=""
            if ok
            else "the torch in this python is not the locked one; rebuild the image or re-lock",
        )
        want_cuda = str(tl.get("cuda", ""))
        if want_cuda != ti["cuda"]:
            self.add(
                "torch.cuda",
                FAIL,
                expected=want_cuda or "none (CPU build)",
                observed=ti["cuda"] or "none (CPU build)",
                hint="torch.version.cuda differs from the lock: a different variant of torch is installed",
            )
        else:
            self.add(
                "torch.cuda",
                PASS,
                expected=want_cuda or "none (CPU build)",
                observed=ti["cuda"] or "none (CPU build)",
            )

    def _check_torch_libs(self, ti: torchprobe.TorchInfo, tl: TorchTable) -> None:
        """cuDNN and NCCL as this process loaded them, against the lock's."""
        for key, label, got in (
            ("cudnn", "torch.backends.cudnn.version()", ti.get("cudnn", "")),
            ("nccl", "torch.cuda.nccl.version()", ti.get("nccl", "")),
        ):
            want = str(tl.get(key, ""))
            if not want:
                self.add(f"torch.{key}", SKIP, expected="not locked", observed=got)
                continue
            ok = bool(got) and _vprefix(got) == _vprefix(want)
            self.add(
                f"torch.{key}",
                PASS if ok else FAIL,
                expected=want,
                observed=f"{got or 'unavailable'} ({label})",
                hint=""
                if ok
                else (
                    f"the {key} library this process loaded is {got or 'missing'}, the lock pins "
                    f"{want}: another copy on the library path or a second wheel shipping the "
                    f"same file; see libs.{key}"
                ),
            )

    def _skip_gpu_checks(self) -> None:
        why = "no GPU visible"
        if not self.expects_gpu:
            why = "a CPU lock (no [hardware].gpus, torch variant cpu)"
        elif self.torch is None:
            why = "torch is not importable"
        elif not self.tinfo.get("cuda"):
            why = "torch is a CPU build"
        elif self.driver is None or not self.driver.version:
            why = "no NVIDIA driver"
        for check in ("gpu", "libs", "tf32", "numerics.gpu") + (
            ("perf", "nccl") if self.level == "full" else ()
        ):
            if self.wanted(check):
                self.add(check, SKIP, observed=f"skipped: {why}")  # noqa: PERF401

    def check_arch_list(self) -> None:
        """The loaded torch's compiled arches against the lock's ``[hardware].arch_list``: needs no
        GPU (the list is compiled into libtorch_cuda), so a lock that describes another build (an
        x86_64 list for an aarch64 torch) is caught on any machine, under emulation too."""
        arch_list = [str(a) for a in self.hardware.get("arch_list", [])]
        torch_arch = self.tinfo.get("arch_list", [])
        if arch_list and torch_arch and sorted(set(arch_list)) != sorted(set(torch_arch)):
            self.add(
                "torch.arch_list",
                WARN,
                expected=" ".join(arch_list) + " ([hardware].arch_list)",
                observed=" ".join(torch_arch) + " (torch.cuda.get_arch_list())",
                hint="the lock describes a torch built for other architectures than the one loaded: "
                "the lock is wrong for this torch, or the wrong torch is installed",
            )
        elif torch_arch:
            self.add(
                "torch.arch_list",
                PASS,
                expected=" ".join(arch_list) or "(not locked)",
                observed=" ".join(torch_arch),
            )

    def check_gpus(self) -> None:
        devices = self.tinfo["devices"]
        arch_list = [str(a) for a in self.hardware.get("arch_list", [])]
        declared = [str(c) for c in self.hardware.get("compute_capabilities", [])]
        names = [str(g) for g in self.hardware.get("gpus", [])]
        torch_arch = self.tinfo.get("arch_list", [])
        self.add(
            "gpu.count",
            PASS if devices else FAIL,
            expected="at least one visible GPU",
            observed=f"{len(devices)}: "
            + _short([d["name"] for d in devices], 4)
            + (
                f" (CUDA_VISIBLE_DEVICES={self.sys.env['CUDA_VISIBLE_DEVICES']})"
                if "CUDA_VISIBLE_DEVICES" in self.sys.env
                else ""
            ),
        )
        for d in devices:
            i, cc = d["index"], d["cc"]
            self.add_arch(
                i, d["name"], cc, arch_list, declared=declared, names=names, torch_arch=torch_arch
            )
            # at start-up no CUDA context is made (one per GPU costs seconds on 8 GPUs)
            free = (
                torchprobe.memory_free(self.imported_torch, i) if self.level != "startup" else None
            )
            total = d["memory_total"]
            mstat: Status = PASS
            mhint = ""
            if free is not None and free < 0.5 * total:
                mstat = WARN
                mhint = "more than half of this GPU's memory is in use by other processes (nvidia-smi shows them)"
            self.add(
                f"gpu.{i}.memory",
                mstat,
                expected="most memory free",
                observed=f"{probes.human_bytes(total)} total"
                + (f", {probes.human_bytes(free)} free" if free is not None else ""),
                hint=mhint,
                total_bytes=total,
                free_bytes=free,
            )

    def check_tf32(self) -> None:
        want_tf32 = self.runtime.get("tf32")
        want_prec = self.runtime.get("matmul_precision")
        st = torchprobe.tf32_state(self.imported_torch)
        obs = (
            f"matmul.allow_tf32={st['matmul_allow_tf32']} cudnn.allow_tf32={st['cudnn_allow_tf32']} "
            f"float32_matmul_precision={st['matmul_precision']!r}"
        )
        if want_tf32 is None and want_prec is None:
            self.add("tf32", SKIP, expected="not locked", observed=obs)
            return
        problems = []
        if want_prec is not None and st["matmul_precision"] != want_prec:
            problems.append(
                f"float32 matmul precision is {st['matmul_precision']!r}, not {want_prec!r}"
            )
        if want_tf32 is not None:
            if want_prec is None and bool(want_tf32) != st["matmul_allow_tf32"]:
                problems.append(f"matmul TF32 is {'on' if st['matmul_allow_tf32'] else 'off'}")
            if bool(want_tf32) != st["cudnn_allow_tf32"]:
                problems.append(f"cuDNN TF32 is {'on' if st['cudnn_allow_tf32'] else 'off'}")
        exp = f"tf32={want_tf32} matmul_precision={want_prec!r}"
        if problems:
            self.add(
                "tf32",
                WARN if self.mode == "host" else FAIL,
                expected=exp,
                observed=obs,
                hint="; ".join(problems)
                + ". PyTorch turns TF32 matmuls off by default since 1.12 (fp32 GEMMs run "
                "~8x slower on Ampere and later). In the image the entrypoint sets it; on a host call "
                f"torch.set_float32_matmul_precision({want_prec or 'high'!r}) in your program",
            )
        else:
            self.add("tf32", PASS, expected=exp, observed=obs)

    def _lib_file(
        self, f: str, owners: dict[Path, tuple[integrity.Dist, integrity.RecordEntry]]
    ) -> tuple[str, str]:
        """(what is wrong with the loaded library ``f``, "") or ("", where it comes from): it must
        be a file of a wheel the lock pins, at the locked version, with its RECORD's bytes."""
        rp = Path(os.path.realpath(f))
        hit = owners.get(rp)
        if hit is None:
            return (
                f"{f} is listed in no installed package's RECORD (a system copy or a "
                "copy on LD_LIBRARY_PATH)",
                "",
            )
        dist, entry = hit
        w = self.wheels.get(dist.name)
        if w is None:
            return (
                f"{rp.name} comes from {dist.name} {dist.version}, which the lock does not name",
                "",
            )
        if not version_matches(str(w.get("version")), dist.version):
            return (
                f"{rp.name} comes from {dist.name} {dist.version}, the lock pins {w.get('version')}",
                "",
            )
        if entry.sha256:
            got = integrity.b64_sha256_file(rp, self.hash_cache)
            if got != entry.sha256:
                return (
                    f"{rp.name} bytes differ from {dist.name} {dist.version}'s RECORD "
                    f"(sha256 {integrity.b64_to_hex(got)[:16]}… vs {integrity.b64_to_hex(entry.sha256)[:16]}…)",
                    "",
                )
        return "", f"{rp.name} ({dist.name} {dist.version})"

    def check_libs(self) -> None:
        torchprobe.init_cuda_libraries(self.imported_torch)
        self.libs = libs = self.sys.loaded_libraries()
        paths = [Path(p) for ps in libs.values() for p in ps]
        owners = integrity.owner_index(
            self.dists or integrity.find_dists(self.sys.site_dirs()), paths
        )
        integrity.hash_many([Path(os.path.realpath(p)) for p in paths], self.hash_cache)
        locked = {"cudnn": self.torch_lock.get("cudnn"), "nccl": self.torch_lock.get("nccl")}
        for key, label in (
            ("cudart", "CUDA runtime"),
            ("cublas", "cuBLAS"),
            ("cudnn", "cuDNN"),
            ("nccl", "NCCL"),
        ):
            files = libs.get(key, [])
            if not files:
                self.add(
                    f"libs.{key}",
                    SKIP if key == "cudnn" else WARN,
                    expected=f"{label} loaded from a locked wheel",
                    observed=f"no {label} library mapped in this process",
                    hint=""
                    if key == "cudnn"
                    else "torch may link it statically; nothing to compare",
                )
                continue
            bad, good = [], []
            for f in files:
                problem, ok = self._lib_file(f, owners)
                if problem:
                    bad.append(problem)
                else:
                    good.append(ok)
            want = f" {locked[key]}" if locked.get(key) else ""
            self.add(
                f"libs.{key}",
                FAIL if bad else PASS,
                expected=f"{label}{want} loaded from a locked wheel, bytes as its RECORD says",
                observed="; ".join(bad) if bad else _short(good, 3),
                hint=(
                    "the library in memory is not the locked one: two wheels writing the same file, "
                    "LD_LIBRARY_PATH or /etc/ld.so.conf pointing at another copy, or an edited file; "
                    "reinstall the locked wheel"
                )
                if bad
                else "",
                files=files,
            )

    def check_numerics(self) -> None:
        for d in self.tinfo["devices"]:
            errs = torchprobe.matmul_errors(self.imported_torch, f"cuda:{d['index']}")
            over = {k: v for k, v in errs.items() if v > torchprobe.TOLERANCE[k]}
            self.add(
                f"numerics.{d['index']}",
                FAIL if over else PASS,
                expected="relative error <= "
                + " ".join(f"{k}:{v:g}" for k, v in torchprobe.TOLERANCE.items()),
                observed=" ".join(f"{k}:{v:.1e}" for k, v in errs.items()),
                hint=(
                    "a 1024^3 matmul differs from the float64 reference beyond the dtype's tolerance: "
                    "a faulty GPU (check ECC/Xid errors in dmesg) or a broken cuBLAS"
                    + (
                        "; fp32 too coarse: TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 forces TF32 into fp32 GEMMs"
                        if "fp32" in over
                        else ""
                    )
                )
                if over
                else "",
                errors=errs,
            )

    def check_cpu_numerics(self) -> None:
        err = torchprobe.cpu_matmul_error(self.imported_torch)
        tol = torchprobe.TOLERANCE["fp32"]
        self.add(
            "numerics.cpu",
            PASS if err <= tol else FAIL,
            expected=f"fp32 relative error <= {tol:g}",
            observed=f"{err:.1e}",
            hint="" if err <= tol else "the CPU BLAS gives wrong results",
        )

    # integrity ---------------------------------------------------------------------------
    def _locked_installed(self) -> list[integrity.Dist]:
        return [d for n, d in sorted(self.dists.items()) if n in self.wheels]

    def _hash_locked_files(self) -> integrity.FileCheck:
        return integrity.check_files(
            self._locked_installed(), self.hash_cache, hash_all=self.level == "full"
        )

    def check_imports(self) -> None:
        """Every locked top-level module that holds extension modules imports (full level): an
        extension built for another torch fails here with its undefined symbol."""
        dists = self.dists or integrity.find_dists(self.sys.site_dirs())
        modules = sorted(
            {
                m
                for n, d in dists.items()
                if n in self.wheels
                for m in integrity.extension_modules(d)
            }
        )
        if not modules:
            self.add(
                "imports",
                SKIP,
                expected="locked modules with extension modules import",
                observed="no locked package with extension modules is installed in this python",
            )
            return
        results = self.sys.import_modules(modules, IMPORT_TIMEOUT)
        failed = [r for r in results if r.error]
        took = sum(r.seconds for r in results)
        self.add(
            "imports",
            FAIL if failed else PASS,
            expected=f"the {len(modules)} locked top-level modules with extension modules import",
            observed=(
                "; ".join(f"{r.module}: {r.error.splitlines()[-1]}" for r in failed)
                if failed
                else f"all import ({_short(modules)}; {took:.1f} s)"
            ),
            hint=(
                "an extension module built for another torch or library than the one installed: "
                "`envspec build` refuses such a lock (abi-mismatch); rebuild from a fresh lock"
                if failed
                else ""
            ),
            modules=modules,
            failed={r.module: r.error for r in failed},
        )

    def check_dist_set(self) -> None:
        host = self.mode == "host"
        missing_fail: list[str] = []
        missing_warn: list[str] = []
        ver_fail: list[str] = []
        ver_warn: list[str] = []
        for name, w in sorted(self.wheels.items()):
            d = self.dists.get(name)
            relaxed = host and not self.is_torch_stack(name)
            if d is None:
                (missing_warn if relaxed else missing_fail).append(f"{name} {w.get('version')}")
            elif not version_matches(str(w.get("version")), d.version):
                (ver_warn if relaxed else ver_fail).append(
                    f"{name} {d.version} (locked {w.get('version')})"
                )
        sites = ", ".join(str(s) for s in self.sys.site_dirs())
        if missing_fail or missing_warn:
            self.add(
                "integrity.missing",
                FAIL if missing_fail else WARN,
                expected="every locked package installed",
                observed="not installed: " + _short(missing_fail + missing_warn),
                hint=f"looked in {sites}"
                + ("; host mode: only torch's stack must be complete" if host else ""),
                packages=missing_fail + missing_warn,
            )
        if ver_fail or ver_warn:
            self.add(
                "integrity.versions",
                FAIL if ver_fail else WARN,
                expected="installed versions as locked",
                observed=_short(ver_fail + ver_warn),
                packages=ver_fail + ver_warn,
                hint="reinstall from the lock (or rebuild the image)",
            )
        extra = sorted(
            n for n in self.dists if n not in self.wheels and n not in ALWAYS_ALLOWED_EXTRA
        )
        extra_v = [f"{n} {self.dists[n].version}" for n in extra]
        if extra:
            self.add(
                "integrity.extra",
                WARN if host else FAIL,
                expected="no package the lock does not name",
                observed=f"{len(extra)} not in the lock: " + _short(extra_v),
                hint=(
                    "host mode: this python holds other packages too; expected on a shared host"
                    if host
                    else "something was pip-installed after the build; add it to the spec and re-lock, or remove it"
                ),
                packages=extra_v,
            )
        if not (missing_fail or missing_warn or ver_fail or ver_warn or extra):
            self.add(
                "integrity.packages",
                PASS,
                expected=f"{len(self.wheels)} locked packages, no others",
                observed=f"{len(self.dists)} installed, all as locked",
            )

    def report_files(self, checked: integrity.FileCheck, seconds: float) -> None:
        host = self.mode == "host"
        problems = checked.problems
        hard = [p for p in problems if not (host and not self.is_torch_stack(p.dist))]
        listed = [
            f"{p.path} ({p.problem}{': ' + p.detail if p.detail else ''}, {p.dist})"
            for p in problems
        ]
        if not self._locked_installed():
            self.add(
                "integrity.files",
                SKIP,
                expected="RECORD hashes of locked packages",
                observed="no locked package is installed in this python",
            )
            return
        nfiles = checked.hashed + checked.sized
        if self.level == "full":
            expected = "every file of every locked package as its RECORD says (sha256)"
            did = f"{checked.hashed} files, {probes.human_bytes(checked.hashed_bytes)} hashed"
        else:
            expected = (
                "every locked package's shared objects (*.so*) as its RECORD says (sha256), every other "
                "file present at its RECORD size (--level full hashes every file)"
            )
            did = (
                f"{checked.hashed} shared objects, {probes.human_bytes(checked.hashed_bytes)} hashed; "
                f"{checked.sized} other files, {probes.human_bytes(checked.sized_bytes)} size-checked"
            )
        self.add(
            "integrity.files",
            (FAIL if hard else WARN) if problems else PASS,
            expected=expected,
            observed=(f"{len(problems)} of {nfiles} files differ: " + _short(listed, 5))
            if problems
            else f"{did}; unchanged ({seconds:.1f} s, {checked.workers} threads)",
            hint="files of locked packages were edited or deleted after install; reinstall them or rebuild"
            if problems
            else "",
            files=[p.path for p in problems],
            hashed_files=checked.hashed,
            hashed_bytes=checked.hashed_bytes,
            sized_files=checked.sized,
            sized_bytes=checked.sized_bytes,
            seconds=round(seconds, 3),
            threads=checked.workers,
        )

    # speed -------------------------------------------------------------------------------
    def check_perf(self) -> None:
        lock_expected = (
            self.hardware.get("expected")
            if isinstance(self.hardware.get("expected"), dict)
            else None
        )
        bf16: dict[int, float] = {}
        for d in self.tinfo["devices"]:
            i = d["index"]
            results = {}
            for kind in ("bf16", "tf32", "fp32"):
                results[kind] = torchprobe.gemm_tflops(self.imported_torch, i, kind)
            bf16[i] = results["bf16"]
            for kind in ("bf16", "tf32"):
                got = results[kind]
                exp = rates.expected_rate(d["name"], kind, lock_expected)
                extra = f" (fp32 without TF32: {results['fp32']:.0f})" if kind == "tf32" else ""
                if exp is None:
                    self.add(
                        f"perf.{i}.{kind}",
                        WARN,
                        expected="a datasheet rate for this GPU",
                        observed=f"{got:.0f} TFLOP/s{extra}; {d['name']} is not in the rate table",
                        hint="add [hardware.expected] to the lock or a row to verify/rates.py",
                        tflops=got,
                    )
                    continue
                rate, src = exp
                frac = got / rate
                status: Status = (
                    PASS
                    if frac >= rates.PASS_FRACTION
                    else WARN
                    if frac >= rates.FAIL_FRACTION
                    else FAIL
                )
                self.add(
                    f"perf.{i}.{kind}",
                    status,
                    expected=f">= {rates.PASS_FRACTION:.0%} of {rate:g} TFLOP/s ({src}, dense)",
                    observed=f"{got:.0f} TFLOP/s = {frac:.0%}{extra}",
                    hint=""
                    if status == PASS
                    else "slow GEMM: check clocks and power (nvidia-smi -q -d PERFORMANCE,CLOCK), other processes "
                    "on the GPU, and thermal throttling",
                    tflops=got,
                    expected_tflops=rate,
                    fraction=frac,
                    **({"fp32_tflops": results["fp32"]} if kind == "tf32" else {}),
                )
        self.gemm_spread(bf16)

    def gemm_spread(self, bf16: dict[int, float]) -> None:
        """The slowest GPU of the node against its fastest (bf16 GEMM): a GPU that lags its peers by
        more than 10% slows every synchronous step of a job that spans them."""
        want = f"the slowest GPU's bf16 GEMM >= {rates.GEMM_SPREAD:.0%} of the node's fastest"
        if len(bf16) < 2:
            self.add(
                "perf.gemm_spread",
                SKIP,
                expected=want,
                observed=f"{len(bf16)} GPU: no peer to compare with",
            )
            return
        best, worst = max(bf16, key=lambda i: bf16[i]), min(bf16, key=lambda i: bf16[i])
        frac = bf16[worst] / bf16[best] if bf16[best] else 0.0
        ok = frac >= rates.GEMM_SPREAD
        self.add(
            "perf.gemm_spread",
            PASS if ok else FAIL,
            expected=want,
            observed=f"GPU {worst} {bf16[worst]:.0f} TFLOP/s = {frac:.0%} of GPU {best}'s {bf16[best]:.0f}",
            hint=""
            if ok
            else f"GPU {worst} is slower than its peers: check its clocks, temperature and power "
            f"(health.gpu.{worst}.throttle, nvidia-smi -q -d PERFORMANCE -i {worst}); drain the "
            "node, and reseat or RMA the GPU if it stays slow",
            slowest_gpu=worst,
            fastest_gpu=best,
            fraction=frac,
        )

    def _link_of(self, d: torchprobe.TorchDevice) -> dict[str, int | None]:
        """The PCIe link NVML reported for torch's device ``d`` (matched by PCI address, else by index)."""
        from . import health  # noqa: PLC0415

        gpus = self.health_gpus
        key = health.pci_key(d.get("pci", "")) if d.get("pci") else None
        for g in gpus:
            if key is not None and g.bus_id and health.pci_key(g.bus_id) == key:
                return dict(g.pcie)
        same = [g for g in gpus if g.index == d["index"]]
        return dict(same[0].pcie) if len(gpus) == len(self.tinfo["devices"]) and same else {}

    def check_copy(self) -> None:
        """Host-to-device and device-to-host copy bandwidth per GPU against what its PCIe link should
        give (lanes x the generation's rate x the share a healthy node reaches)."""
        from . import health  # noqa: PLC0415

        for d in self.tinfo["devices"]:
            i = d["index"]
            got = torchprobe.copy_gbps(self.imported_torch, i)
            link = self._link_of(d)
            gen, width = link.get("max_gen"), link.get("max_width")
            per_lane = health.PCIE_GBS_PER_LANE.get(gen or 0)
            for way, words in (("h2d", "host to GPU"), ("d2h", "GPU to host")):
                v = got[way]
                if not per_lane or not width:
                    self.add(
                        f"perf.{i}.{way}",
                        WARN,
                        expected=f"{words} copies at the PCIe link's rate",
                        observed=f"{v:.1f} GB/s; NVML gave no PCIe link to judge it against",
                        gbps=v,
                    )
                    continue
                line = per_lane * width
                floor = rates.COPY_FRACTION * line
                status: Status = PASS if v >= floor else WARN if v >= floor / 2 else FAIL
                self.add(
                    f"perf.{i}.{way}",
                    status,
                    expected=f">= {floor:.0f} GB/s ({rates.COPY_FRACTION:.0%} of PCIe gen {gen} x{width}'s "
                    f"{line:.0f} GB/s: {rates.COPY_SOURCE})",
                    observed=f"{v:.1f} GB/s = {v / line:.0%} of the link's rate",
                    hint=""
                    if status == PASS
                    else "slow copies starve the data loader and checkpoints: the link may run below its width or "
                    f"generation under load (health.gpu.{i}.pcie), the GPU may sit behind the other CPU "
                    "socket's PCIe switch (run it under numactl on its own socket), or the IOMMU may be in "
                    "translation mode (iommu=pt); reseat the GPU if it persists",
                    gbps=v,
                    expected_gbps=floor,
                    link_gbps=line,
                )

    def check_sdc(self) -> None:
        """Silent data corruption: a GEMM whose exact result every GPU must reproduce bit for bit."""
        ref = torchprobe.exact_gemm_reference(self.imported_torch)
        digests = set()
        for d in self.tinfo["devices"]:
            i = d["index"]
            res = torchprobe.exact_gemm(
                self.imported_torch, self.imported_torch.device("cuda", i), ref
            )
            digests.add(res["digest"])
            n = torchprobe.EXACT_GEMM_N
            self.add(
                f"health.gpu.{i}.sdc",
                PASS if res["ok"] else FAIL,
                expected=f"a {n}x{n}x{n} GEMM of integers with an exact result (TF32 tensor cores and FP32): "
                "row and column sums equal the CPU's",
                observed=f"exact, digest {res['digest']}"
                if res["ok"]
                else f"wrong result in {', '.join(res['wrong'])}: the GPU computes wrong bits",
                hint=""
                if res["ok"]
                else "silent data corruption: drain the node now, run DCGM's diagnostics "
                "(dcgmi diag -r 3) and RMA the GPU",
                digest=res["digest"],
            )
        self.gemm_digest = "/".join(sorted(digests))

    def check_allreduce(self) -> None:
        devices = [d["index"] for d in self.tinfo["devices"]]
        if len(devices) < 2:
            self.add(
                "nccl.allreduce",
                SKIP,
                expected="an all-reduce across the visible GPUs",
                observed=f"{len(devices)} GPU visible: nothing to all-reduce across",
            )
            return
        if self.allreduce == "processes":
            res = torchprobe.allreduce_spawn(len(devices))
            res["note"] = "one process a GPU"
        else:
            try:
                res = torchprobe.allreduce_local(self.imported_torch, devices)
                res["note"] = "one process, torch.cuda.nccl"
            except Exception as e:  # torch.cuda.nccl missing or broken: one process a GPU instead
                res = torchprobe.allreduce_spawn(len(devices))
                res["note"] = (
                    f"in-process torch.cuda.nccl failed ({type(e).__name__}: {e}); one process a GPU"
                )
        sizes = res["sizes"]
        table_ = "; ".join(
            f"{probes.human_bytes(s['bytes'])}: {s['busbw_gbps']:.0f}" for s in sizes
        )
        self.allreduce_speed(sizes, len(devices))
        self.add(
            "nccl.allreduce",
            PASS if res["correct"] else FAIL,
            expected=f"sum {res['expected_sum']:g} on every GPU; bus bandwidth (GB/s) reported",
            observed=(
                "correct" if res["correct"] else f"wrong sum on GPU(s) {res['wrong_devices']}"
            )
            + f"; busbw GB/s {table_}"
            + (f" ({res['note']})" if res.get("note") else ""),
            hint=""
            if res["correct"]
            else "NCCL returned a wrong result: a faulty link or GPU; run nccl-tests "
            "and check dmesg for Xid errors",
            gpus=len(devices),
            sizes=sizes,
        )

    def allreduce_speed(self, sizes: list[torchprobe.AllreduceSize], n: int) -> None:
        """The largest message's bus bandwidth against what a healthy node of n such GPUs reaches,
        where that figure is known (8 GPUs of one model: rates.ALLREDUCE_8)."""
        names = {d["name"] for d in self.tinfo["devices"]}
        exp = rates.ALLREDUCE_8.get(next(iter(names))) if len(names) == 1 and n == 8 else None
        got = max(sizes, key=lambda s: s["bytes"])["busbw_gbps"] if sizes else 0.0
        if exp is None:
            return  # no sourced figure for this GPU and count: nccl.allreduce reports what was measured
        want, src = exp
        ok = got >= want
        self.add(
            "nccl.allreduce.busbw",
            PASS if ok else FAIL,
            expected=f">= {want:g} GB/s at 8 GPUs ({src})",
            observed=f"{got:.0f} GB/s ({probes.human_bytes(max(s['bytes'] for s in sizes))} message)",
            hint=""
            if ok
            else "slow all-reduce: an NVLink down (health.gpu.N.nvlink), NCCL_P2P_DISABLE or "
            "NCCL_NVLS_ENABLE set (env.*), the fabric manager down (systemctl status "
            "nvidia-fabricmanager); drain the node and run nccl-tests' all_reduce_perf",
            busbw_gbps=got,
            expected_busbw_gbps=want,
        )

    def check_compile(self, probe: torchprobe.CompileProbe) -> None:
        res = probe.result()
        if res.get("ok"):
            self.add(
                "torch.compile",
                PASS,
                expected="torch.compile of a small function runs",
                observed=f"ran on {res.get('device')} in {res.get('seconds', 0):.1f} s (child process)",
            )
            return
        err = res.get("error", "")
        text = (err + res.get("traceback", "")).lower()
        if res.get("timeout"):
            hint = "slow first compile (cold Triton/Inductor cache) or a hang; retry, or raise --compile-timeout"
            status: Status = WARN
        elif "cannot open shared object file" in text or "no module named 'torch'" in text:
            hint = "torch itself does not import here; see torch.import"
            status = FAIL
        elif any(
            s in text
            for s in (
                "python.h",
                "compiler",
                "gcc",
                "cc1",
                "invalidcxx",
                "calledprocesserror",
                "ld:",
            )
        ):
            hint = (
                "torch.compile builds code at run time: Inductor's CPU backend needs a C++ compiler (g++), "
                "Triton on GPUs a C compiler (gcc), both the Python headers (python3-dev / libpython3.X-dev); "
                "add them to the spec's system packages"
            )
            status = FAIL
        else:
            hint = "torch.compile failed; run the program with TORCH_LOGS=+dynamo for details"
            status = FAIL
        self.add(
            "torch.compile",
            status,
            expected="torch.compile of a small function runs",
            observed=err,
            hint=hint,
        )

    def check_compile_toolchain(self) -> None:
        """What torch.compile calls at run time, without compiling: Inductor's C++ compiler on CPU,
        Triton's C compiler on GPUs, and the Python headers both include (torch-free, microseconds)."""
        gpu = bool(self.tinfo.get("cuda_available"))
        tc = self.sys.compile_toolchain(gpu)
        who = "Triton (GPU)" if gpu else "Inductor's C++ backend (CPU)"
        want = f"{tc.compiler_role} for {who} and Python.h"
        missing = []
        if not tc.compiler_path:
            missing.append(f"no {tc.compiler_role} ({tc.compiler_wanted})")
        if not tc.python_h:
            missing.append(f"no Python.h in {tc.include_dir}")
        self.add(
            "torch.compile.toolchain",
            FAIL if missing else PASS,
            expected=want,
            observed="; ".join(missing)
            if missing
            else f"{tc.compiler_path}, {tc.include_dir}/Python.h",
            hint=(
                "torch.compile builds code at run time: Inductor's CPU backend needs a C++ compiler (g++), "
                "Triton on GPUs a C compiler (gcc), both the Python headers (python3-dev / libpython3.X-dev); "
                "add them to the spec's system packages, or set CXX / CC"
            )
            if missing
            else "",
            compiler=tc.compiler_path,
            python_h=tc.python_h,
        )

    # fingerprint -------------------------------------------------------------------------
    def make_fingerprint(self) -> None:
        fp = {
            "hostname": self.sys.hostname(),
            "image": settings.get(settings.IMAGE_DIGEST, self.sys.env)
            or ""
            or f"lock:{self.report.lock_hash}",
            "lock": self.report.lock_hash,
            "driver": self.driver.version if self.driver else "",
            "torch": (self.tinfo.get("full", "") + " " + self.tinfo.get("git", "")[:12]).strip(),
            "cuda": self.tinfo.get("cuda", ""),
            "gpu": "",
            "nccl_lib": "",
        }
        if self.gemm_digest:
            fp["gemm_result"] = (
                self.gemm_digest
            )  # the full level's exact GEMM: the same on every node
        devs = self.tinfo.get("devices", [])
        if devs:
            names = sorted({d["name"] for d in devs})
            fp["gpu"] = f"{len(devs)} x " + "/".join(names)
        nccl = self.libs.get("nccl", [])
        if nccl:
            fp["nccl_lib"] = "sha256:" + integrity.b64_to_hex(
                integrity.b64_sha256_file(Path(os.path.realpath(nccl[0])), self.hash_cache)
            )
        self.report.fingerprint = fp


class _Background:
    """The locked files hashed on a thread while the other checks run."""

    def __init__(self, fn: Callable[[], integrity.FileCheck]) -> None:
        self._fn = fn
        self._result: integrity.FileCheck | None = None
        self._error: BaseException | None = None
        self.seconds = 0.0
        self._t = threading.Thread(target=self._run, name="envspec-verify-hash", daemon=True)
        self._t.start()

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            self._result = self._fn()
        except BaseException as e:  # re-raised in join
            self._error = e
        self.seconds = time.perf_counter() - t0

    def join(self) -> integrity.FileCheck:
        self._t.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None  # the thread ended without an error: it set it
        return self._result


def run_checks(
    lock: Lock,
    *,
    level: str = "quick",
    mode: str = "auto",
    strict: bool = False,
    system: TorchMachine | None = None,
    skip: tuple[str, ...] = (),
    compile_timeout: float = 60.0,
    allreduce: str = "inprocess",
) -> Report:
    """Verify the machine against ``lock`` (a dict as read by ``lockfile.load_lock``).

    level: "startup" (the container start-up hook's torch-free checks, ``startup.run_startup``), "quick" (no heavy GPU work), "full"
    (adds GEMM speed and the all-reduce). mode: "auto" | "image" | "host". skip: check names
    or prefixes to leave out (e.g. "torch.compile", "integrity"). allreduce: "inprocess" (one
    process, torch.cuda.nccl) or "processes" (one process a GPU under torchrun).
    """
    if level == "startup":  # the torch-free checks only (startup.py)
        return startup.run_startup(lock, mode=mode, strict=strict, system=system, skip=tuple(skip))
    r = _Run(lock, level, mode, system or TorchMachine(), tuple(skip), compile_timeout, allreduce)
    r.report.strict = strict
    return r.run()

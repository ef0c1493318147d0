"""``envspec doctor [LOCK]``: is this host ready to build and run the lock's image?

Each check returns ``Finding``s: a status, what was found, and how to fix it. ``fail`` means
something blocks: building (buildah, skopeo, their storage, disk space) or running the lock's
image on this host's GPUs (a driver older than the lock's floor, GPUs the arch list cannot run,
GPUs with no way into containers). A host without a GPU is a fine build host: that is a
``warn`` for a GPU lock, ``info`` otherwise, and the exit status stays 0.

Every look at the machine goes through a ``Probe`` (which, run, read, free space, rlimits), so
tests inject a fake one; ``SystemProbe`` is the real machine. Nothing here prints.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Protocol, Sequence

from envspec.compat import best_arch

Status = Literal["ok", "warn", "fail", "info"]
UNPACK_FACTOR = 2.5  # wheels and debs are compressed; installed trees are ~2-3x larger
UNLIMITED = -1
APT_BUILD = "apt-get install -y buildah skopeo podman runc"
TOOLKIT_FIX = ("install NVIDIA's container toolkit (apt-get install -y nvidia-container-toolkit, from NVIDIA's "
               "apt repository) and write the CDI spec: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml")
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")


@dataclass(frozen=True)
class Finding:
    check: str  # short id: driver, gpus, toolkit, engine, runtime, buildah, storage, disk, skopeo, import, cgroup, rlimits
    status: Status
    what: str
    fix: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------
# probes

class Probe(Protocol):
    def which(self, name: str) -> str | None: ...
    def run(self, argv: Sequence[str], timeout: float = 20) -> tuple[int, str, str]: ...
    def read(self, path: str) -> str | None: ...
    def exists(self, path: str) -> bool: ...
    def listdir(self, path: str) -> list[str]: ...
    def free_bytes(self, path: str) -> tuple[int, int] | None: ...  # (free bytes, device id) of the FS holding path
    def hard_limit(self, name: str) -> int: ...  # -1 = unlimited
    def env(self) -> Mapping[str, str]: ...
    def euid(self) -> int: ...
    def cap_sys_resource(self) -> bool: ...


class SystemProbe:
    """The real machine."""

    def which(self, name: str) -> str | None:
        from envspec.build.engine import PUT_LAYER, find_put_layer  # (envspec.build is slow to import)

        if name == PUT_LAYER:  # found as envspec build finds it (beside this python, ENVSPEC_PUT_LAYER)
            return find_put_layer()
        return shutil.which(name)

    def run(self, argv: Sequence[str], timeout: float = 20) -> tuple[int, str, str]:
        try:
            cp = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                                env={**os.environ, "LC_ALL": "C"})
        except FileNotFoundError:
            return 127, "", f"{argv[0]}: not found"
        except subprocess.TimeoutExpired:
            return 124, "", f"{argv[0]}: timed out after {timeout:.0f}s"
        except OSError as e:
            return 126, "", str(e)
        return cp.returncode, cp.stdout, cp.stderr

    def read(self, path: str) -> str | None:
        try:
            return Path(path).read_text(errors="replace")
        except OSError:
            return None

    def exists(self, path: str) -> bool:
        return Path(path).exists()

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []

    def free_bytes(self, path: str) -> tuple[int, int] | None:
        p = Path(path)
        while not p.exists() and p != p.parent:
            p = p.parent
        try:
            st = os.statvfs(p)
            return st.f_bavail * st.f_frsize, os.stat(p).st_dev
        except OSError:
            return None

    def hard_limit(self, name: str) -> int:
        h = resource.getrlimit(getattr(resource, f"RLIMIT_{name.upper()}"))[1]
        return UNLIMITED if h == resource.RLIM_INFINITY else int(h)

    def env(self) -> Mapping[str, str]:
        return os.environ

    def euid(self) -> int:
        return os.geteuid()

    def cap_sys_resource(self) -> bool:
        text = self.read("/proc/self/status") or ""
        m = re.search(r"^CapEff:\s*([0-9a-f]+)", text, re.M)
        return bool(int(m.group(1), 16) >> 24 & 1) if m else self.euid() == 0


# ---------------------------------------------------------------------------------------
# helpers

def _lock_dict(lock: Any) -> dict[str, Any] | None:
    if lock is None:
        return None
    if isinstance(lock, (str, Path)):
        from envspec.lock import load

        lock = load(lock)
    if isinstance(lock, dict):
        return lock
    return lock.model_dump(mode="json", exclude_none=True)


def _vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def _human(n: float) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _wants_gpu(lock: dict | None) -> bool:
    t = (lock or {}).get("torch") or {}
    return bool(t) and str(t.get("variant", "cpu")) != "cpu"


def _lock_name(lock: dict | None) -> str:
    return str(((lock or {}).get("meta") or {}).get("name", "")) or "the lock"


def driver_version(probe: Probe) -> tuple[str, str]:
    """(version, where it was read) or ("", "")."""
    text = probe.read("/proc/driver/nvidia/version")
    if text:
        m = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+([0-9]+\.[0-9]+(?:\.[0-9]+)?)", text)
        if m:
            return m.group(1), "/proc/driver/nvidia/version"
    if probe.which("nvidia-smi"):
        rc, out, _ = probe.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        if rc == 0 and out.strip():
            return out.strip().splitlines()[0].strip(), "nvidia-smi"
    return "", ""


# ---------------------------------------------------------------------------------------
# checks

def check_driver(probe: Probe, lock: dict | None) -> list[Finding]:
    ver, where = driver_version(probe)
    hw = (lock or {}).get("hardware") or {}
    floor = str(hw.get("driver_floor", "") or "")
    policy = str(hw.get("driver_policy", "compat") or "compat")
    if not ver:
        if _wants_gpu(lock):
            return [Finding("driver", "warn",
                            f"no NVIDIA GPU driver on this host (no /proc/driver/nvidia/version, no nvidia-smi): it can "
                            f"build {_lock_name(lock)}'s image but cannot run its GPU code (needs driver >= {floor or '?'})",
                            fix="nothing to do on a build host; on a GPU host install NVIDIA's driver "
                                f"{'>= ' + floor if floor else ''} (apt-get install -y nvidia-driver, or cuda-drivers "
                                "from NVIDIA's repository)".replace("  ", " "),
                            detail={"driver": "", "floor": floor})]
        return [Finding("driver", "info", "no NVIDIA GPU driver on this host: fine for building images and for CPU work",
                        detail={"driver": ""})]
    detail = {"driver": ver, "source": where, "floor": floor, "policy": policy}
    if floor and _vtuple(ver) < _vtuple(floor):
        fix = f"upgrade the NVIDIA driver to {floor} or newer"
        if policy == "strict":
            fix += "; or re-lock with driver_policy = \"compat\" if the lock's CUDA minor version allows an older driver"
        else:
            fix += ("; data-center GPUs can instead use CUDA forward compatibility (the cuda-compat package of the "
                    f"lock's CUDA version), or re-lock with [target].driver = \"{ver}\" for an older torch build")
        return [Finding("driver", "fail", f"NVIDIA driver {ver} is older than {_lock_name(lock)}'s floor {floor} "
                                          f"(policy {policy}): its CUDA libraries will not load", fix=fix, detail=detail)]
    if floor:
        return [Finding("driver", "ok", f"NVIDIA driver {ver} (>= the lock's floor {floor}, policy {policy})",
                        detail=detail)]
    return [Finding("driver", "ok" if lock else "info", f"NVIDIA driver {ver}", detail=detail)]


def check_gpus(probe: Probe, lock: dict | None) -> list[Finding]:
    if not probe.which("nvidia-smi"):
        return []
    rc, out, err = probe.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"])
    if rc != 0:
        return [Finding("gpus", "warn", f"nvidia-smi failed: {(err or out).strip()[:200]}",
                        fix="check the driver: nvidia-smi, dmesg | grep -i nvrm")]
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if parts and parts[0]:
            gpus.append((parts[0], parts[1] if len(parts) > 1 else ""))
    if not gpus:
        return [Finding("gpus", "warn", "the driver is loaded but nvidia-smi lists no GPU")]
    hw = (lock or {}).get("hardware") or {}
    arch_list = list(hw.get("arch_list", []) or [])
    out_findings = []
    seen: set[tuple[str, str]] = set()
    for name, cc in gpus:
        if (name, cc) in seen:
            continue
        seen.add((name, cc))
        n = sum(1 for g in gpus if g == (name, cc))
        label = f"{n} x {name} (compute capability {cc or '?'})"
        if not arch_list or not cc or not _wants_gpu(lock):
            out_findings.append(Finding("gpus", "info", label, detail={"name": name, "cc": cc, "count": n}))
            continue
        arch = best_arch(cc, list(arch_list))
        if not arch:
            out_findings.append(Finding("gpus", "fail", f"{label}: the lock's torch has no kernels for it "
                                                         f"(arch list {', '.join(arch_list)})",
                                        fix="add this GPU to [target].gpus and re-lock (envspec explain shows the "
                                            "torch builds that cover it)", detail={"name": name, "cc": cc}))
        else:
            how = "through PTX (JIT at first use: slow start)" if arch.startswith("compute_") else f"as {arch}"
            out_findings.append(Finding("gpus", "ok", f"{label}: runs the lock's kernels {how}",
                                        detail={"name": name, "cc": cc, "count": n, "arch": arch}))
    return out_findings


def _cdi_specs(probe: Probe) -> list[str]:
    out = []
    for d in CDI_DIRS:
        for f in probe.listdir(d):
            if f.endswith((".yaml", ".yml", ".json")):
                text = probe.read(f"{d}/{f}") or ""
                if "nvidia.com/gpu" in text:
                    out.append(f"{d}/{f}")
    return out


def check_toolkit(probe: Probe, lock: dict | None, has_driver: bool) -> list[Finding]:
    cdi = _cdi_specs(probe)
    ctk = probe.which("nvidia-ctk") or probe.which("nvidia-container-toolkit") or probe.which("nvidia-container-runtime-hook")
    detail = {"cdi_specs": cdi, "toolkit": ctk or ""}
    if not has_driver:
        if cdi or ctk:
            return [Finding("toolkit", "info", "NVIDIA container toolkit present, but no driver", detail=detail)]
        return [Finding("toolkit", "info", "no NVIDIA container toolkit or CDI spec: not needed on a host without GPUs",
                        detail=detail)]
    if cdi:
        return [Finding("toolkit", "ok", f"CDI spec for nvidia.com/gpu: {', '.join(cdi)} (envspec run passes "
                                         "--device nvidia.com/gpu=all)", detail=detail)]
    if ctk:
        return [Finding("toolkit", "warn", "NVIDIA container toolkit installed but no CDI spec: podman containers get "
                                           "no GPU (docker's --gpus works)",
                        fix="nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml", detail=detail)]
    status: Status = "fail" if _wants_gpu(lock) else "warn"
    return [Finding("toolkit", status, "GPUs are here but neither the NVIDIA container toolkit nor a CDI spec: "
                                       "containers cannot see them", fix=TOOLKIT_FIX, detail=detail)]


def _docker_daemon(probe: Probe) -> bool:
    host = probe.env().get("DOCKER_HOST", "")
    if host and not host.startswith("unix://"):
        return True
    return probe.exists(host.removeprefix("unix://") or "/var/run/docker.sock")


def check_engine(probe: Probe) -> list[Finding]:
    found = []
    if probe.which("podman"):
        rc, out, _ = probe.run(["podman", "--version"])
        found.append(Finding("engine", "ok", (out.strip() or "podman") + " (envspec run uses it)",
                             detail={"engine": "podman", "version": out.strip()}))
    if probe.which("docker"):
        if _docker_daemon(probe):
            found.append(Finding("engine", "ok" if not found else "info", "docker with a reachable daemon socket",
                                 detail={"engine": "docker"}))
        else:
            found.append(Finding("engine", "info", "a docker client without a daemon (no /var/run/docker.sock): "
                                                   "not usable; envspec uses podman", detail={"engine": "docker-client"}))
    if not any(f.status == "ok" for f in found):
        found.append(Finding("engine", "warn", "no container engine: images can be built (buildah) but not started here",
                             fix="apt-get install -y podman runc"))
    return found


def cgroup_version(probe: Probe) -> str:
    if probe.exists("/sys/fs/cgroup/cgroup.controllers"):
        return "v2"
    if probe.exists("/sys/fs/cgroup/unified"):
        return "hybrid"
    return "v1"


def check_runtime(probe: Probe) -> list[Finding]:
    if not probe.which("podman"):
        return []
    cg = cgroup_version(probe)
    crun, runc = probe.which("crun"), probe.which("runc")
    have = [n for n, p in (("crun", crun), ("runc", runc)) if p]
    detail = {"cgroup": cg, "runtimes": have}
    if cg != "v2":
        if runc:
            return [Finding("runtime", "ok", f"runc (cgroup {cg}: envspec run passes --runtime runc, as crun refuses "
                                             "v1 and hybrid hierarchies)", detail=detail)]
        return [Finding("runtime", "warn", f"cgroup {cg} with {', '.join(have) or 'no OCI runtime'}: crun refuses this "
                                           "hierarchy, so podman cannot start containers", fix="apt-get install -y runc",
                        detail=detail)]
    if have:
        return [Finding("runtime", "ok", f"{' and '.join(have)} on cgroup v2", detail=detail)]
    return [Finding("runtime", "warn", "no OCI runtime (crun or runc): podman cannot start containers",
                    fix="apt-get install -y crun", detail=detail)]


def _storage_root(probe: Probe) -> tuple[str, str, str]:
    """(graph root, driver, where from)."""
    env = probe.env()
    if env.get("ENVSPEC_STORAGE_ROOT"):
        return env["ENVSPEC_STORAGE_ROOT"], env.get("ENVSPEC_STORAGE_DRIVER", ""), "ENVSPEC_STORAGE_ROOT"
    rc, out, _ = probe.run(["buildah", "info"])
    if rc == 0:
        try:
            store = json.loads(out).get("store", {})
            return str(store.get("GraphRoot", "")), str(store.get("GraphDriverName", "")), "buildah info"
        except ValueError:
            pass
    root = "/var/lib/containers/storage" if probe.euid() == 0 else \
        str(Path(env.get("HOME", "~")) / ".local/share/containers/storage")
    return root, "", "default"


def check_network(probe: Probe) -> list[Finding]:
    """podman's bridge subnet shadowed by another interface's route (buildah's CNI bridge)."""
    if not probe.which("podman"):
        return []
    from envspec.run import bridge_conflict

    netavark = probe.exists("/usr/lib/podman/netavark") or probe.exists("/usr/libexec/podman/netavark")
    bridge = "podman0" if netavark else "cni-podman0"
    other = bridge_conflict(probe.read("/proc/net/route") or "", bridge, "10.88.0.0/16")
    if not other:
        return [Finding("network", "ok", f"no route shadows podman's bridge ({bridge}, 10.88.0.0/16)")]
    fallback = "envspec run uses --network slirp4netns instead" if probe.which("slirp4netns") else \
        "apt-get install -y slirp4netns to let envspec run work around it"
    return [Finding("network", "warn", f"{other} has a route over podman's bridge subnet 10.88.0.0/16 (left by "
                                       f"buildah's CNI networking): bridged containers' ports time out; {fallback}",
                    fix=f"ip link delete {other} (when no buildah container is running)",
                    detail={"interface": other, "bridge": bridge})]


def check_build_tools(probe: Probe) -> list[Finding]:
    from envspec.build.engine import PUT_LAYER

    out = []
    for tool in ("buildah", "skopeo"):
        if not probe.which(tool):
            out.append(Finding(tool, "fail", f"{tool} not found: envspec build needs it", fix=APT_BUILD))
            continue
        rc, ver, err = probe.run([tool, "--version"])
        out.append(Finding(tool, "ok" if rc == 0 else "fail", ver.strip() or f"{tool}: {err.strip()[:200]}",
                           fix="" if rc == 0 else f"reinstall: apt-get install --reinstall -y {tool}"))
    put, cs = probe.which(PUT_LAYER), probe.which("containers-storage")
    if cs and put:
        out.append(Finding("import", "ok", f"containers-storage and {put} found: envspec build imports layers "
                                           "beside the layer makers, each untarred once",
                           detail={"put_layer": put}))
    elif cs:
        out.append(Finding("import", "warn", f"{PUT_LAYER} not found: envspec build imports with "
                                             "containers-storage alone, which hashes every layer twice more "
                                             "(cold builds up to twice as slow, docs/build.md)",
                           fix="scripts/dev.sh setup (compiles it; needs golang-go and "
                               "golang-github-containers-storage-dev), or set ENVSPEC_PUT_LAYER to its path"))
    else:
        out.append(Finding("import", "warn", "containers-storage not found: envspec build imports with skopeo, "
                                             "which copies every layer once more (docs/build.md)",
                           fix="apt-get install -y containers-storage"))
    return out


def check_storage(probe: Probe) -> list[Finding]:
    if not probe.which("buildah"):
        return []
    root, driver, src = _storage_root(probe)
    detail = {"root": root, "driver": driver, "from": src}
    if src == "buildah info" and driver == "vfs":
        return [Finding("storage", "warn", f"containers-storage at {root} uses vfs: every layer is a full copy "
                                           "(slow, and disk-hungry)",
                        fix="use overlay: apt-get install -y fuse-overlayfs, or set driver = \"overlay\" in "
                            "/etc/containers/storage.conf", detail=detail)]
    if src == "default":
        return [Finding("storage", "warn", f"`buildah info` failed; assuming containers-storage at {root}",
                        fix="run `buildah info` to see why", detail=detail)]
    return [Finding("storage", "ok", f"containers-storage: {driver or 'default driver'} at {root} ({src})",
                    detail=detail)]


def _cache_dir(env: Mapping[str, str]) -> str:
    if env.get("ENVSPEC_CACHE"):
        return env["ENVSPEC_CACHE"]
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "/root")) / ".cache")
    return str(Path(base) / "envspec")


def check_disk(probe: Probe, lock: dict | None) -> list[Finding]:
    root, _driver, _ = _storage_root(probe) if probe.which("buildah") else ("/var/lib/containers/storage", "", "")
    cache = _cache_dir(probe.env())
    fs_store, fs_cache = probe.free_bytes(root), probe.free_bytes(cache)
    if fs_store is None:
        return [Finding("disk", "warn", f"cannot tell the free space at {root}")]
    if lock is None:
        return [Finding("disk", "info", f"{_human(fs_store[0])} free for containers-storage ({root})",
                        detail={"free": fs_store[0], "root": root})]
    sizes = [int(w.get("size", 0) or 0) for w in lock.get("wheels", []) or []]
    sizes += [int(p.get("size", 0) or 0) for p in ((lock.get("debian") or {}).get("packages", []) or [])]
    unknown = sum(1 for s in sizes if s == 0)
    packed = sum(sizes)
    unpacked = packed * UNPACK_FACTOR
    # The build keeps the downloads and the layer tars in its cache, then copies the layers into
    # containers-storage: compressed + unpacked in the cache, unpacked again in the storage.
    need_cache, need_store = packed + unpacked, unpacked
    if fs_cache is not None and fs_cache[1] == fs_store[1]:
        checks = [(root + f" and the cache {cache}", fs_store[0], need_cache + need_store)]
    else:
        checks = [(root, fs_store[0], need_store)]
        if fs_cache is not None:
            checks.append((f"the cache {cache}", fs_cache[0], need_cache))
    out = []
    note = f" ({unknown} package sizes unknown to the lock: more may be needed)" if unknown else ""
    for where, free, need in checks:
        detail = {"where": where, "free": free, "need": int(need), "packages": packed, "unknown_sizes": unknown}
        msg = f"{_human(free)} free for {where}; the image needs about {_human(need)}" \
              f" ({_human(packed)} of packages, ~{UNPACK_FACTOR}x unpacked){note}"
        if free < need:
            out.append(Finding("disk", "fail", msg, fix=f"free {_human(need - free)} or point ENVSPEC_CACHE / "
                                                        "ENVSPEC_STORAGE_ROOT at a larger disk", detail=detail))
        elif free < need * 1.25:
            out.append(Finding("disk", "warn", msg + ": little room left", detail=detail))
        else:
            out.append(Finding("disk", "ok", msg, detail=detail))
    return out


def check_cgroup(probe: Probe) -> list[Finding]:
    cg = cgroup_version(probe)
    what = {"v2": "cgroup v2 (unified)", "hybrid": "cgroup v1 controllers with a v2 mount (hybrid)",
            "v1": "cgroup v1"}[cg]
    kernel = (probe.read("/proc/sys/kernel/osrelease") or "").strip()
    fs = probe.read("/proc/filesystems") or ""
    overlay = "overlay" in fs
    return [Finding("cgroup", "info", f"{what}; kernel {kernel or '?'}" + ("" if overlay else "; no overlay file system"),
                    detail={"cgroup": cg, "kernel": kernel, "overlay": overlay})]


def _limit(name: str, v: int) -> str:
    if v == UNLIMITED:
        return "unlimited"
    return _human(v) if name in ("memlock", "stack", "data", "fsize", "as") else str(v)


def check_rlimits(probe: Probe, lock: dict | None) -> list[Finding]:
    can_raise = probe.euid() == 0 and probe.cap_sys_resource()
    wanted = {str(k): int(v) for k, v in (((lock or {}).get("runtime") or {}).get("ulimits") or {}).items()}
    names = sorted(set(wanted) | {"nofile", "nproc"})
    hard = {n: probe.hard_limit(n) for n in names}
    shown = ", ".join(f"{n} {_limit(n, h)}" for n, h in hard.items())
    if can_raise:
        return [Finding("rlimits", "info", f"hard limits: {shown}; podman may raise them", detail={"hard": hard})]
    pid_max = int((probe.read("/proc/sys/kernel/pid_max") or "0").strip() or 0)
    extra = ""
    if pid_max and (hard["nproc"] == UNLIMITED or hard["nproc"] > pid_max):
        extra = f" (nproc at most pid_max {pid_max}: podman lowers its own limit to it)"
    out = [Finding("rlimits", "info", f"hard limits: {shown}; podman cannot raise them here (no CAP_SYS_RESOURCE or "
                                      f"rootless): envspec run passes --ulimit values within them{extra}",
                   detail={"hard": hard, "pid_max": pid_max})]
    for n, v in sorted(wanted.items()):
        h = hard.get(n, UNLIMITED)
        if h != UNLIMITED and (v == UNLIMITED or v > h):
            out.append(Finding("rlimits", "warn", f"the lock asks {n} {_limit(n, v)}; this host's hard limit is "
                                                  f"{_limit(n, h)}: containers get {_limit(n, h)}",
                               fix=f"raise the hard limit (e.g. /etc/security/limits.conf: * hard {n} unlimited, or "
                                   f"LimitMEMLOCK=/LimitNOFILE= in the service that starts your shell)",
                               detail={"name": n, "wanted": v, "hard": h}))
    return out


def check_rootless(probe: Probe) -> list[Finding]:
    if probe.euid() == 0:
        return []
    user = probe.env().get("USER", "")
    subuid = probe.read("/etc/subuid") or ""
    if user and not re.search(rf"^{re.escape(user)}:", subuid, re.M):
        return [Finding("rootless", "warn", f"rootless: no /etc/subuid range for {user}: podman can map one uid only",
                        fix=f"usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user}")]
    if not probe.which("newuidmap"):
        return [Finding("rootless", "warn", "rootless without newuidmap", fix="apt-get install -y uidmap")]
    return [Finding("rootless", "ok", f"rootless as {user or probe.euid()} with a subuid range")]


def run_doctor(lock: Any = None, probe: Probe | None = None) -> list[Finding]:
    """Check this host (through ``probe``) against ``lock`` (a Lockfile, its dict, a path, or None)."""
    probe = probe or SystemProbe()
    d = _lock_dict(lock)
    findings: list[Finding] = []
    findings += check_driver(probe, d)
    has_driver = bool(driver_version(probe)[0])
    if has_driver:
        findings += check_gpus(probe, d)
    findings += check_toolkit(probe, d, has_driver)
    findings += check_engine(probe)
    findings += check_runtime(probe)
    findings += check_network(probe)
    findings += check_build_tools(probe)
    findings += check_storage(probe)
    findings += check_disk(probe, d)
    findings += check_cgroup(probe)
    findings += check_rlimits(probe, d)
    findings += check_rootless(probe)
    return findings


# ---------------------------------------------------------------------------------------
# words

def doctor_exit_code(findings: Sequence[Finding]) -> int:
    """1 when something blocks (a ``fail``), else 0."""
    return 1 if any(f.status == "fail" for f in findings) else 0


def doctor_lines(findings: Sequence[Finding]) -> list[str]:
    lines = []
    for f in findings:
        lines.append(f"{f.status:<5} {f.check:<9} {f.what}")
        if f.fix and f.status in ("fail", "warn"):
            lines.append(f"{'':<16}fix: {f.fix}")
    n = {s: sum(1 for f in findings if f.status == s) for s in ("fail", "warn")}
    if n["fail"]:
        lines.append(f"{n['fail']} problem{'s' if n['fail'] != 1 else ''} block{'s' if n['fail'] == 1 else ''} "
                     f"this host (see fix lines above)")
    elif n["warn"]:
        lines.append(f"nothing blocks building; {n['warn']} warning{'s' if n['warn'] != 1 else ''}")
    else:
        lines.append("all good")
    return lines


def doctor_json(findings: Sequence[Finding]) -> dict[str, Any]:
    return {"exit_code": doctor_exit_code(findings), "findings": [asdict(f) for f in findings]}

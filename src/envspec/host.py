"""What this host is, found once: ``detect_host()`` -> ``Host``.

``run`` (the argv that starts an image here), ``doctor`` (is this host ready) and the build's
engine (where containers-storage is) all read the same ``Host``; none of them looks at the
machine again. Every file read goes under ``root`` (/proc, /sys, /etc, /run, ...), tools are found
on the ``PATH`` of ``env``, and commands go through ``run``, so tests describe a host with a
directory tree, an environment and a fake runner, or build a ``Host`` directly.

Cheap by default: file checks and PATH look-ups. The facts that need a command are asked for
in ``ask``: ``buildah info`` (where containers-storage is, when ``ENVSPEC_STORAGE_ROOT`` does not
say), ``versions`` (``--version`` of podman, buildah and skopeo), ``nvidia-smi`` (the GPUs;
the driver version where /proc does not have it) and ``docker info`` (the daemon's storage
driver, cgroup driver and runtimes, where a daemon socket is found). ``envspec run --print`` asks for none of them.

The host quirks these facts feed were seen on this project's Debian 12 machines: cgroup v1 and
hybrid hierarchies (crun rejects them), no systemd as PID 1, no CAP_SYS_RESOURCE with hard
limits below podman's defaults, kernel.pid_max below the nproc hard limit, and buildah's CNI
bridge shadowing podman's (see ``bridge_conflict``).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal, Protocol, TypedDict

from envspec import settings
from envspec.cache.dirs import (
    cache_dir_for,
)  # the one rule, kept light for explain; re-exported here

Cgroup = Literal["v2", "hybrid", "v1"]
Ask = Literal["buildah info", "versions", "nvidia-smi", "docker info"]
ASK_ALL: frozenset[Ask] = frozenset(
    {"buildah info", "versions", "nvidia-smi", "docker info"}
)  # what doctor reports
ASK_DOCKER: frozenset[Ask] = frozenset(
    {"docker info"}
)  # what `envspec run --engine docker` checks first
ASK_STORAGE: frozenset[Ask] = frozenset({"buildah info"})  # what a build needs
ASK_NONE: frozenset[Ask] = frozenset()  # file checks only: what `envspec run` needs

UNLIMITED = -1
CAP_SYS_RESOURCE = 24
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
PODMAN_SUBNET = "10.88.0.0/16"
PUT_LAYER = "envspec-put-layer"
# Where each storage fact came from (``Storage.source``).
FROM_ENV = "ENVSPEC_STORAGE_ROOT"
FROM_BUILDAH = "buildah info"
FROM_DEFAULT = "default"

# Tools looked up on PATH. (containers-storage: ``ENVSPEC_CONTAINERS_STORAGE`` may name another
# binary; envspec-put-layer is found by ``find_put_layer``.)
TOOLS = (
    "podman",
    "docker",
    "buildah",
    "skopeo",
    "containers-storage",
    "crun",
    "runc",
    "slirp4netns",
    "newuidmap",
    "nvidia-smi",
    "nvidia-ctk",
    "nvidia-container-toolkit",
    "nvidia-container-runtime-hook",
)
VERSIONED = ("podman", "buildah", "skopeo")
NVIDIA_TOOLKIT = ("nvidia-ctk", "nvidia-container-toolkit", "nvidia-container-runtime-hook")
HOST_INITS = ("/usr/bin/tini", "/usr/bin/dumb-init")  # an init podman can inject with --init-path
PODMAN_INITS = ("/usr/libexec/podman/catatonit", "/usr/bin/catatonit")  # podman's own --init
NETAVARK_DIRS = ("/usr/lib/podman", "/usr/libexec/podman")
PODMAN_NETWORK = "/etc/containers/networks/podman.json"

# /proc/self/limits names -> the names ``--ulimit`` and the lock use.
_LIMIT_NAMES = {
    "Max cpu time": "cpu",
    "Max file size": "fsize",
    "Max data size": "data",
    "Max stack size": "stack",
    "Max core file size": "core",
    "Max resident set": "rss",
    "Max processes": "nproc",
    "Max open files": "nofile",
    "Max locked memory": "memlock",
    "Max address space": "as",
    "Max file locks": "locks",
    "Max pending signals": "sigpending",
    "Max msgqueue size": "msgqueue",
    "Max nice priority": "nice",
    "Max realtime priority": "rtprio",
    "Max realtime timeout": "rttime",
}


class Runner(Protocol):
    """Runs a command: (exit status, stdout, stderr); 127 when it is not found, 124 on timeout."""

    def __call__(self, argv: Sequence[str], timeout: float = 20) -> tuple[int, str, str]: ...


def run_command(argv: Sequence[str], timeout: float = 20) -> tuple[int, str, str]:
    """The real runner (C locale, so the output is parseable)."""
    try:
        cp = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "LC_ALL": "C"},
        )
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]}: timed out after {timeout:.0f}s"
    except OSError as e:
        return 126, "", str(e)
    return cp.returncode, cp.stdout, cp.stderr


# ---------------------------------------------------------------------------------------
# the facts


@dataclass(frozen=True)
class Tool:
    path: str
    version: str = ""  # what `TOOL --version` printed, stripped ("" when not asked)
    error: str = ""  # what it said when `--version` failed ("" when it worked or was not asked)


@dataclass(frozen=True)
class Storage:
    """containers-storage as envspec uses it."""

    root: str = ""  # the graph root ("" = unknown)
    runroot: str = ""  # ("" = unknown: not asked, or a default)
    driver: str = ""
    source: str = FROM_DEFAULT  # FROM_ENV, FROM_BUILDAH, or FROM_DEFAULT (a guess: not asked, or buildah failed)
    driver_from_env: bool = False  # ENVSPEC_STORAGE_DRIVER chose the driver

    @property
    def custom(self) -> bool:
        """envspec's own storage (ENVSPEC_STORAGE_ROOT), which every command must be told about."""
        return self.source == FROM_ENV

    def args(self) -> list[str]:
        """podman's and buildah's global options for this storage ([] for the system's)."""
        args = []
        if self.custom:
            args += ["--root", self.root, "--runroot", self.runroot]
        if self.driver and (self.custom or self.driver_from_env):
            args += ["--storage-driver", self.driver]
        return args

    def ref(self, ref: str) -> str:
        """A skopeo ``containers-storage:`` reference on this storage."""
        if self.custom:
            return (
                f"containers-storage:[{self.driver or 'overlay'}@{self.root}+{self.runroot}]{ref}"
            )
        return f"containers-storage:{ref}"


@dataclass(frozen=True)
class DockerDaemon:
    """What ``docker info`` said about the daemon the client talks to (``DOCKER_HOST``, else
    /var/run/docker.sock). ``error`` is what the client said when the daemon did not answer."""

    address: str  # DOCKER_HOST, or unix:///var/run/docker.sock
    error: str = ""  # "" when the daemon answered
    version: str = ""  # the daemon's (the client may be newer: they agree on an API version)
    storage_driver: str = ""  # overlay2, vfs, fuse-overlayfs, ...
    cgroup_driver: str = ""  # cgroupfs or systemd
    cgroup_version: str = ""  # "1" or "2"
    runtimes: tuple[
        str, ...
    ] = ()  # registered OCI runtimes (``nvidia`` where the NVIDIA toolkit configured one)
    default_runtime: str = ""
    root_dir: str = ""  # DockerRootDir

    @property
    def answered(self) -> bool:
        return not self.error

    @property
    def nvidia_runtime(self) -> bool:
        return "nvidia" in self.runtimes


@dataclass(frozen=True)
class DiskFree:
    free: int  # bytes available to us
    device: int  # st_dev of the file system (two paths on one device share their free space)


@dataclass(frozen=True)
class HostGpu:
    name: str
    cc: str  # compute capability, "9.0"; "" when nvidia-smi does not say


def _frozen_map(m: Mapping[str, object]) -> Mapping[str, object]:
    return MappingProxyType(dict(m))


@dataclass(frozen=True)
class Host:
    """What this host is. ``detect_host()`` fills it in; tests build one. The defaults describe
    a plain rootful podman host on cgroup v2 with systemd and no GPU."""

    # kernel
    kernel: str = ""  # /proc/sys/kernel/osrelease
    machine: str = "x86_64"  # the CPU architecture (uname -m): "x86_64" | "aarch64"
    binfmt: tuple[
        str, ...
    ] = ()  # other architectures the kernel runs through qemu-user-static (binfmt_misc, F flag)
    binfmt_note: str = ""  # why none is there, when another architecture cannot run: what to do
    overlay: bool = True  # the kernel has the overlay file system
    cgroup: Cgroup = "v2"  # "v2" (unified), "hybrid" (v1 controllers and a v2 mount) or "v1"
    systemd: bool = True  # booted with systemd (podman's default cgroup manager needs it)
    pid_max: int = 4194304  # /proc/sys/kernel/pid_max (0: unknown)
    selinux: bool = False  # SELinux enforcing
    bridge: str = (
        "podman0"  # podman's default network interface: netavark's podman0 or CNI's cni-podman0
    )
    bridge_subnet: str = PODMAN_SUBNET
    bridge_conflict: str = ""  # an interface whose route shadows podman's bridge subnet ("" = none)
    # this process
    euid: int = 0
    user: str = ""  # $USER
    subuid: bool = False  # /etc/subuid has a range for ``user``
    cap_sys_resource: bool = True  # may raise rlimits above the hard limits
    rlimits: Mapping[str, tuple[int, int]] = field(
        default_factory=dict
    )  # name -> (soft, hard); -1 = unlimited
    cwd: str = "/home/user/project"
    cwd_uid: int = 1000  # owner of cwd
    tty: bool = False  # stdin and stdout are terminals
    env_names: frozenset[str] = (
        frozenset()
    )  # the environment variables that are set (names only, never values)
    # tools and engines
    tools: Mapping[str, Tool] = field(default_factory=dict)  # found tools only
    docker: Literal["", "daemon", "client", "podman"] = (
        ""  # a docker with a daemon, one without, podman's shim
    )
    docker_daemon: DockerDaemon | None = (
        None  # what ``docker info`` said (None: not asked, or no daemon socket)
    )
    docker_host: str = (
        "unix:///var/run/docker.sock"  # the daemon docker talks to (DOCKER_HOST, else the system's)
    )
    runtime_override: str = ""  # ENVSPEC_RUNTIME
    host_init: str = ""  # an init podman can inject (--init-path) when an image has none
    podman_init: bool = True  # podman's own --init binary (catatonit) is installed
    # GPUs
    driver_version: str = ""  # NVIDIA's kernel module
    driver_source: str = ""  # where it was read: /proc/driver/nvidia/version or nvidia-smi
    gpus: tuple[HostGpu, ...] = ()  # as nvidia-smi lists them (one per device)
    gpu_error: str = ""  # what nvidia-smi said when it failed
    cdi_gpu_specs: tuple[str, ...] = ()  # CDI spec files that name nvidia.com/gpu
    # storage and cache
    storage: Storage = field(default_factory=Storage)
    storage_free: DiskFree | None = None  # the file system holding storage.root (None: unknown)
    cache_dir: Path = Path("/root/.cache/envspec")
    cache_free: DiskFree | None = None

    def __post_init__(self) -> None:  # read-only views, so a Host stays what was found
        object.__setattr__(self, "rlimits", _frozen_map(self.rlimits))
        object.__setattr__(self, "tools", _frozen_map(self.tools))

    def runs_arch(self, arch: str) -> bool:
        """Whether containers of CPU architecture ``arch`` ("aarch64") start here: natively or
        under emulation."""
        return arch == self.machine or arch in self.binfmt

    # -- tools ------------------------------------------------------------------------------
    def which(self, name: str) -> str:
        """The path of tool ``name``, "" when it is not here."""
        t = self.tools.get(name)
        return t.path if t else ""

    @property
    def engines(self) -> tuple[str, ...]:
        """Usable container engines, preferred first: podman, docker with a reachable daemon (one
        whose socket is there and, when ``docker info`` was asked, that answered)."""
        docker = self.docker == "daemon" and (
            self.docker_daemon is None or self.docker_daemon.answered
        )
        return tuple(
            e for e, ok in (("podman", bool(self.which("podman"))), ("docker", docker)) if ok
        )

    @property
    def docker_remote(self) -> bool:
        """DOCKER_HOST names a daemon on another machine (tcp://, ssh://)."""
        return not self.docker_host.startswith("unix://")

    @property
    def runtimes(self) -> tuple[str, ...]:
        """OCI runtimes on PATH."""
        return tuple(r for r in ("crun", "runc") if self.which(r))

    @property
    def runtime(self) -> str:
        """The runtime podman should use ("" = podman's default): ``ENVSPEC_RUNTIME``, else runc
        where crun is absent or the hierarchy is v1/hybrid (crun rejects those)."""
        if self.runtime_override:
            return self.runtime_override
        if "runc" in self.runtimes and (self.cgroup != "v2" or "crun" not in self.runtimes):
            return "runc"
        return ""

    @property
    def cgroup_manager(self) -> Literal["systemd", "cgroupfs"]:
        """podman's systemd cgroup manager needs systemd as PID 1; without it cgroupfs works."""
        return "systemd" if self.systemd else "cgroupfs"

    @property
    def nvidia_toolkit(self) -> str:
        """The NVIDIA container toolkit's binary (what docker's --gpus needs), "" when absent."""
        return next((p for p in map(self.which, NVIDIA_TOOLKIT) if p), "")

    @property
    def put_layer(self) -> str:
        return self.which(PUT_LAYER)

    # -- the process ------------------------------------------------------------------------
    @property
    def rootless(self) -> bool:
        return self.euid != 0

    def soft(self, name: str) -> int:
        return self.rlimits.get(name, (UNLIMITED, UNLIMITED))[0]

    def hard(self, name: str) -> int:
        return self.rlimits.get(name, (UNLIMITED, UNLIMITED))[1]

    def ceiling(self, name: str) -> int:
        """The highest value podman can give a container for rlimit ``name`` when it cannot raise
        limits: the hard limit, and for nproc also pid_max. (podman lowers its own nproc limit to
        pid_max before starting conmon, so the container cannot get more; seen on this project's
        Debian 12 hosts: pid_max 32768, nproc hard limit 96365, nproc=96365 fails with EPERM.)"""
        h = self.hard(name)
        if name == "nproc" and self.pid_max > 0:
            h = self.pid_max if h == UNLIMITED else min(h, self.pid_max)
        return h


# ---------------------------------------------------------------------------------------
# rules shared with code that does not need a whole Host


def find_put_layer(env: Mapping[str, str] | None = None) -> str | None:
    """envspec's own layer import tool (``image/putlayer/main.go``, built by ``scripts/dev.sh
    setup``): ``ENVSPEC_PUT_LAYER`` (a path; empty or ``off`` for none), else next to this Python
    (the venv's bin), else on PATH."""
    env = os.environ if env is None else env
    path = env.get("PATH", os.defpath)
    given = settings.read(env).put_layer
    if given is not None:
        return None if given in ("", "off") else shutil.which(given, path=path)
    beside = Path(sys.executable).parent / PUT_LAYER
    if os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(PUT_LAYER, path=path)


def short_runroot(storage_root: str, root: Path = Path("/")) -> str:
    """A run root for a custom storage root. podman refuses run roots longer than 50 characters
    ("the specified runroot is longer than 50 characters": it puts sockets there), so it is a
    short path named by a hash of the root, not a folder inside it."""
    tag = hashlib.sha256(str(Path(storage_root).absolute()).encode()).hexdigest()[:12]
    base = "/run" if os.access(_under(root, "/run"), os.W_OK) else "/tmp"
    return f"{base}/envspec-{tag}"


def bridge_conflict(route_table: str, bridge: str = "podman0", subnet: str = PODMAN_SUBNET) -> str:
    """The interface (other than ``bridge``) with a route overlapping podman's subnet, or "".

    Seen on this project's Debian 12 hosts: buildah (CNI) leaves a ``cni-podman0`` bridge, down,
    with the route 10.88.0.0/16 that netavark's ``podman0`` also uses; the older route wins (a
    link-down route is still used unless ignore_routes_with_linkdown is set), so published
    ports and the containers' own addresses time out."""
    try:
        net = ipaddress.ip_network(subnet, strict=False)
    except ValueError:
        return ""
    for line in route_table.splitlines()[1:]:
        f = line.split()
        if len(f) < 8 or f[0] == bridge:
            continue
        try:
            dest = ipaddress.IPv4Address(int(f[1], 16).to_bytes(4, "little"))
            mask = ipaddress.IPv4Address(int(f[7], 16).to_bytes(4, "little"))
            route = ipaddress.ip_network(f"{dest}/{mask}", strict=False)
        except ValueError:
            continue
        if route.prefixlen > 0 and route.overlaps(net):
            return f[0]
    return ""


# ---------------------------------------------------------------------------------------
# detection


def _under(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def _read(root: Path, path: str) -> str | None:
    try:
        return _under(root, path).read_text(errors="replace")
    except OSError:
        return None


# binfmt_misc entries of Debian's qemu-user-static, by the architecture they run
QEMU_BINFMT = {"aarch64": "qemu-aarch64", "x86_64": "qemu-x86_64"}


def _binfmt(root: Path, machine: str) -> tuple[tuple[str, ...], str]:
    """The other architectures binfmt_misc runs here (their qemu entry enabled, with the F flag:
    the interpreter is opened at registration, so it works inside a container's root), and what
    to do when the other one cannot run."""
    if (_read(root, "/proc/sys/fs/binfmt_misc/status") or "").strip() != "enabled":
        return (), (
            "binfmt_misc is not mounted or disabled: mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc "
            "(scripts/dev.sh setup does), then update-binfmts --enable"
        )
    out = []
    notes = []
    for arch, name in sorted(QEMU_BINFMT.items()):
        if arch == machine:
            continue
        entry = _read(root, f"/proc/sys/fs/binfmt_misc/{name}")
        if entry is None:
            notes.append(
                f"no binfmt_misc entry {name}: apt-get install -y qemu-user-static binfmt-support"
            )
            continue
        lines = entry.splitlines()
        flags = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("flags:")), "")
        if not lines or lines[0].strip() != "enabled":
            notes.append(f"binfmt_misc entry {name} is disabled: update-binfmts --enable {name}")
        elif "F" not in flags:
            notes.append(
                f"binfmt_misc entry {name} lacks the F flag (containers cannot reach its interpreter): "
                "use Debian's qemu-user-static, which registers it with F"
            )
        else:
            out.append(arch)
    return tuple(out), "; ".join(notes)


def _int(text: str | None) -> int:
    try:
        return int((text or "").strip())
    except ValueError:
        return 0


def _cgroup(root: Path) -> Cgroup:
    cg = _under(root, "/sys/fs/cgroup")
    if (cg / "cgroup.controllers").exists():
        return "v2"
    if (cg / "unified").is_dir():
        return "hybrid"
    return "v1"


def _status_field(status: str, name: str) -> list[str]:
    m = re.search(rf"^{name}:\s*(.*)$", status, re.M)
    return m.group(1).split() if m else []


def _rlimits(text: str) -> dict[str, tuple[int, int]]:
    """/proc/self/limits: name -> (soft, hard), -1 for unlimited."""
    out = {}
    for line in text.splitlines()[1:]:
        m = re.match(r"(Max [a-z ]+?)\s{2,}(\S+)\s+(\S+)", line)
        if not m or m.group(1) not in _LIMIT_NAMES:
            continue
        vals = [
            UNLIMITED if v == "unlimited" else int(v) if v.isdigit() else UNLIMITED
            for v in m.group(2, 3)
        ]
        out[_LIMIT_NAMES[m.group(1)]] = (vals[0], vals[1])
    return out


def _docker(
    exe: str, env: Mapping[str, str], root: Path, ask: Collection[Ask] = ASK_ALL
) -> Literal["", "daemon", "client", "podman"]:
    """Which docker this is (a daemon's client, podman's shim), read from its file; "" for a
    build (``ASK_STORAGE``), which never runs it (a cold read on a node's pull, issue 59)."""
    if not exe or ask == ASK_STORAGE:
        return ""
    try:
        head = Path(exe).read_bytes()[:4096]
    except OSError:
        head = b""
    if head.startswith(b"#!") and b"podman" in head:
        return "podman"  # podman-docker's shim: that is podman
    host = env.get("DOCKER_HOST", "")
    if host and not host.startswith("unix://"):
        return "daemon"  # a remote daemon: cannot check cheaply, trust the configuration
    sock = host.removeprefix("unix://") or "/var/run/docker.sock"
    return (
        "daemon" if _under(root, sock).exists() else "client"
    )  # a client without a daemon (seen here) runs nothing


def docker_address(env: Mapping[str, str]) -> str:
    """The daemon the docker client talks to: ``DOCKER_HOST``, else the system socket."""
    return env.get("DOCKER_HOST", "") or "unix:///var/run/docker.sock"


def _docker_daemon(run: Runner, env: Mapping[str, str]) -> DockerDaemon:
    """``docker info`` as JSON. The client prints its own half even when the daemon does not
    answer (exit 1, "Cannot connect to the Docker daemon at ..."), so the daemon's half is
    read only from an answer with a ServerVersion."""
    address = docker_address(env)
    rc, out, err = run(["docker", "info", "--format", "{{json .}}"])
    try:
        d = json.loads(out) if out.strip().startswith("{") else {}
    except ValueError:
        d = {}
    if not isinstance(d, dict) or not d.get("ServerVersion"):
        said = " ".join((err or out).split())[:300] or f"exit status {rc}"
        return DockerDaemon(address, error=said)
    runtimes = d.get("Runtimes") or {}
    return DockerDaemon(
        address,
        version=str(d.get("ServerVersion", "")),
        storage_driver=str(d.get("Driver", "")),
        cgroup_driver=str(d.get("CgroupDriver", "")),
        cgroup_version=str(d.get("CgroupVersion", "")),
        runtimes=tuple(sorted(runtimes)) if isinstance(runtimes, dict) else (),
        default_runtime=str(d.get("DefaultRuntime", "")),
        root_dir=str(d.get("DockerRootDir", "")),
    )


def _cdi_gpu_specs(root: Path) -> tuple[str, ...]:
    found = []
    for d in CDI_DIRS:
        p = _under(root, d)
        if not p.is_dir():
            continue
        for f in sorted(p.iterdir()):
            if f.suffix not in (".yaml", ".yml", ".json"):
                continue
            try:
                text = f.read_text(errors="replace")
            except OSError:
                continue
            if "nvidia.com/gpu" in text:
                found.append(f"{d}/{f.name}")
    return tuple(found)


def _podman_bridge(root: Path) -> tuple[str, str]:
    """(interface, subnet) of podman's default network: netavark's podman0 where netavark is
    installed, else CNI's cni-podman0; 10.88.0.0/16 unless podman.json says otherwise."""
    netavark = any(_under(root, d).joinpath("netavark").exists() for d in NETAVARK_DIRS)
    iface, subnet = ("podman0" if netavark else "cni-podman0"), PODMAN_SUBNET
    try:
        d = json.loads(_read(root, PODMAN_NETWORK) or "")
        iface = d.get("network_interface") or iface
        subnet = (d.get("subnets") or [{}])[0].get("subnet") or subnet
    except (ValueError, AttributeError, IndexError):
        pass
    return iface, subnet


def _fs_type(root: Path, path: str) -> str:
    """The type of the file system mounted at the longest mount point that is a prefix of ``path``."""
    best, kind = "", ""
    for line in (_read(root, "/proc/self/mounts") or "").splitlines():
        parts = line.split()
        if len(parts) >= 3 and path.startswith(parts[1]) and len(parts[1]) >= len(best):
            best, kind = parts[1], parts[2]
    return kind


def storage_driver_for(
    path: str | Path, overlay: bool, root: Path = Path("/")
) -> Literal["overlay", "vfs"]:
    """The storage driver for a store at ``path``: overlay where the kernel has it (``overlay``)
    and ``path`` is not itself on overlayfs (overlay on overlay fails), else vfs. envspec's own
    storage root follows it, and so does a dockerd started by the tests (overlay2)."""
    return (
        "overlay" if overlay and _fs_type(root, str(Path(path).absolute())) != "overlay" else "vfs"
    )


def _storage(
    root: Path, env: Mapping[str, str], run: Runner, overlay: bool, euid: int, buildah: bool
) -> Storage:
    """ENVSPEC_STORAGE_ROOT (its run root a short path; overlay where the kernel has it and the
    root is not itself on overlayfs, else vfs), else what ``buildah info`` reports, else the
    default location (not asked, or buildah failed)."""
    conf = settings.read(env)
    driver_env = conf.storage_driver
    given = conf.storage_root
    if given:
        runroot = conf.storage_runroot or short_runroot(given, root)
        driver = driver_env or storage_driver_for(given, overlay, root)
        return Storage(given, runroot, driver, FROM_ENV, driver_from_env=bool(driver_env))
    if buildah:
        rc, out, _ = run(["buildah", "info"])
        if rc == 0:
            try:
                store = json.loads(out).get("store", {})
                return Storage(
                    str(store.get("GraphRoot", "")),
                    str(store.get("RunRoot", "")),
                    driver_env or str(store.get("GraphDriverName", "")),
                    FROM_BUILDAH,
                    driver_from_env=bool(driver_env),
                )
            except (ValueError, AttributeError):
                pass
    graph = (
        "/var/lib/containers/storage"
        if euid == 0
        else str(Path(env.get("HOME", "~")) / ".local/share/containers/storage")
    )
    return Storage(graph, "", driver_env, FROM_DEFAULT, driver_from_env=bool(driver_env))


def disk_free(root: Path, path: str | Path) -> DiskFree | None:
    """Free space of the file system that holds ``path`` (or would: its nearest existing parent)."""
    p = _under(root, str(Path(path).absolute()))
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
        return DiskFree(st.f_bavail * st.f_frsize, os.stat(p).st_dev)
    except OSError:
        return None


def _driver_version(root: Path, run: Runner, smi: str, ask: Collection[Ask]) -> tuple[str, str]:
    """(version, where it was read) or ("", "")."""
    text = _read(root, "/proc/driver/nvidia/version")
    if text:
        m = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+([0-9]+\.[0-9]+(?:\.[0-9]+)?)", text)
        if m:
            return m.group(1), "/proc/driver/nvidia/version"
    if smi and "nvidia-smi" in ask:
        rc, out, _ = run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        if rc == 0 and out.strip():
            return out.strip().splitlines()[0].strip(), "nvidia-smi"
    return "", ""


def _gpus(run: Runner) -> tuple[tuple[HostGpu, ...], str]:
    rc, out, err = run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"])
    if rc != 0:
        return (), (err or out).strip()[:200] or f"exit status {rc}"
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if parts and parts[0]:
            gpus.append(HostGpu(parts[0], parts[1] if len(parts) > 1 else ""))
    return tuple(gpus), ""


def _tools(env: Mapping[str, str], run: Runner, ask: Collection[Ask]) -> dict[str, Tool]:
    """The tools on PATH (containers-storage as ENVSPEC_CONTAINERS_STORAGE names it), the layer
    import helper, and where ``ask`` allows the versions of those that have one."""
    path = env.get("PATH", os.defpath)
    tools: dict[str, Tool] = {}
    for name in TOOLS:
        exe = (
            shutil.which(settings.read(env).containers_storage or name, path=path)
            if name == "containers-storage"
            else shutil.which(name, path=path)
        )
        if exe:
            tools[name] = Tool(exe)
    put = find_put_layer(env)
    if put:
        tools[PUT_LAYER] = Tool(put)
    if "versions" in ask:
        for name in VERSIONED:
            if name in tools:
                rc, out, err = run([name, "--version"])
                error = "" if rc == 0 else (err.strip()[:200] or f"exit status {rc}")
                tools[name] = Tool(tools[name].path, out.strip(), error)
    return tools


def _identity(root: Path) -> tuple[int, bool]:
    """(the effective uid, whether this process may raise its limits: CAP_SYS_RESOURCE) from
    /proc/self/status (root alone has it where that cannot be read)."""
    status = _read(root, "/proc/self/status") or ""
    uids = _status_field(status, "Uid")
    euid = int(uids[1]) if len(uids) > 1 and uids[1].isdigit() else os.geteuid()
    cap = _status_field(status, "CapEff")
    try:
        return euid, bool(int(cap[0], 16) >> CAP_SYS_RESOURCE & 1) if cap else euid == 0
    except ValueError:
        return euid, euid == 0


class _SystemFiles(TypedDict):
    """What /proc, /sys, /etc and /run say of this host (``detect_host``)."""

    kernel: str
    cgroup: Cgroup
    systemd: bool
    pid_max: int
    selinux: bool
    bridge: str
    bridge_subnet: str
    bridge_conflict: str
    rlimits: Mapping[str, tuple[int, int]]
    host_init: str
    podman_init: bool
    cdi_gpu_specs: tuple[str, ...]


def _system_files(root: Path) -> _SystemFiles:
    bridge, subnet = _podman_bridge(root)
    return _SystemFiles(
        kernel=(_read(root, "/proc/sys/kernel/osrelease") or "").strip(),
        cgroup=_cgroup(root),
        systemd=_under(root, "/run/systemd/system").is_dir(),
        pid_max=_int(_read(root, "/proc/sys/kernel/pid_max")),
        selinux=(_read(root, "/sys/fs/selinux/enforce") or "").strip() == "1",
        bridge=bridge,
        bridge_subnet=subnet,
        bridge_conflict=bridge_conflict(_read(root, "/proc/net/route") or "", bridge, subnet),
        rlimits=_rlimits(_read(root, "/proc/self/limits") or ""),
        host_init=next((p for p in HOST_INITS if _under(root, p).exists()), ""),
        podman_init=any(_under(root, p).exists() for p in PODMAN_INITS),
        cdi_gpu_specs=_cdi_gpu_specs(root),
    )


def _owner(path: str, default: int) -> int:
    """The uid owning ``path``; ``default`` where it cannot be read."""
    try:
        return os.stat(path).st_uid
    except OSError:
        return default


def detect_host(
    root: Path = Path("/"),
    env: Mapping[str, str] | None = None,
    run: Runner = run_command,
    *,
    ask: Collection[Ask] = ASK_ALL,
    cwd: str | None = None,
) -> Host:
    """Look at this host once. ``root``: where /proc, /sys, /etc and /run are read (a fake tree in
    tests); ``env``: the environment (PATH finds the tools; default ``os.environ``); ``run``: runs
    the commands ``ask`` allows; ``cwd``: the directory ``envspec run`` mounts (default: this
    process's). No container is started."""
    env = dict(os.environ) if env is None else env
    cwd = cwd or os.getcwd()
    tools = _tools(env, run, ask)
    euid, cap_sys_resource = _identity(root)
    user = env.get("USER", "")
    overlay = "overlay" in (_read(root, "/proc/filesystems") or "")
    storage = _storage(
        root, env, run, overlay, euid, buildah="buildah info" in ask and "buildah" in tools
    )
    cache = cache_dir_for(env)
    smi = tools["nvidia-smi"].path if "nvidia-smi" in tools else ""
    driver, driver_source = _driver_version(root, run, smi, ask)
    gpus, gpu_error = _gpus(run) if smi and driver and "nvidia-smi" in ask else ((), "")
    docker = _docker(tools["docker"].path if "docker" in tools else "", env, root, ask)
    daemon = _docker_daemon(run, env) if docker == "daemon" and "docker info" in ask else None
    machine = platform.machine() or "x86_64"
    binfmt, binfmt_note = _binfmt(root, machine)
    return Host(
        **_system_files(root),
        machine=machine,
        binfmt=binfmt,
        binfmt_note=binfmt_note,
        overlay=overlay,
        euid=euid,
        user=user,
        subuid=bool(user)
        and re.search(rf"^{re.escape(user)}:", _read(root, "/etc/subuid") or "", re.M) is not None,
        cap_sys_resource=cap_sys_resource,
        cwd=cwd,
        cwd_uid=_owner(cwd, euid),
        tty=bool(sys.stdin and sys.stdin.isatty() and sys.stdout and sys.stdout.isatty()),
        env_names=frozenset(env),
        tools=tools,
        docker=docker,
        docker_daemon=daemon,
        docker_host=docker_address(env),
        runtime_override=settings.read(env).runtime,
        driver_version=driver,
        driver_source=driver_source,
        gpus=gpus,
        gpu_error=gpu_error,
        storage=storage,
        storage_free=disk_free(root, storage.root) if storage.root else None,
        cache_dir=cache,
        cache_free=disk_free(root, cache),
    )


# --- an arm64 container's CPU under qemu-user ---------------------------------------------------

# Grace's cores (Arm Neoverse V2, r0p0): implementer 0x41 (Arm), part 0xd4f. Under qemu-user the
# container sees the x86_64 host's /sys/devices/system/cpu, which has no regs/identification;
# oneDNN's xbyak_aarch64 (in torch >= 2.11's aarch64 wheels) reads MIDR_EL1 from there at import
# and the process then dies of SIGSEGV ("Can't open MIDR_EL1 sysfs entry").
GRACE_MIDR_EL1 = "0x00000000410fd4f0"
SYSFS_CPU = Path("/sys/devices/system/cpu")


def emulated_cpu_dir(cache_dir: Path, arch: str) -> Path:
    """Where the copy of this host's /sys/devices/system/cpu for an emulated ``arch`` container
    is kept (``write_emulated_cpu_dir`` makes it)."""
    return cache_dir / "emulation" / f"sys-devices-system-cpu-{arch}"


def _copy_cpu_files(source: Path, dest: Path, rel: Path) -> None:
    """The regular readable files of ``source/rel`` (no links, no subdirectories) into ``dest/rel``."""
    import os

    here = source / rel
    try:
        names = sorted(os.listdir(here))
    except OSError:
        return
    for name in names:
        src = here / name
        if src.is_symlink() or not src.is_file():
            continue
        try:
            data = src.read_bytes()
        except OSError:  # write-only or refused attributes
            continue
        (dest / rel).mkdir(parents=True, exist_ok=True)
        (dest / rel / name).write_bytes(data)


def write_emulated_cpu_dir(
    dest: Path, *, source: Path = SYSFS_CPU, midr: str = GRACE_MIDR_EL1
) -> bool:
    """``dest``: the CPU list of this host's ``source`` (/sys/devices/system/cpu: its top-level
    files, online, possible, present, ..., and each cpuN's topology; regular readable files, no
    links) with every cpuN given ``regs/identification/midr_el1`` = ``midr`` and ``revidr_el1`` =
    0, as an arm64 kernel has them. Not the x86_64 caches (cpuN/cache): torch 2.14.1's aarch64 CPU
    probe, fed the host's cache list, segfaults under qemu too; an arm64 VM often has none. Made
    beside ``dest`` and renamed into place, so that two runs never see half of it; made again
    each time (the host's CPUs may have changed). False when ``source`` cannot be read (the
    caller then leaves /sys alone)."""
    import os
    import shutil
    import tempfile

    try:
        top = sorted(os.listdir(source))
    except OSError:
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".cpu-", dir=dest.parent))
    try:
        _copy_cpu_files(source, tmp, Path("."))
        for name in top:
            if name.startswith("cpu") and name[3:].isdigit() and (source / name).is_dir():
                (tmp / name).mkdir()
                _copy_cpu_files(source, tmp, Path(name) / "topology")
        for name in top:
            if name.startswith("cpu") and name[3:].isdigit() and (tmp / name).is_dir():
                ident = tmp / name / "regs" / "identification"
                ident.mkdir(parents=True, exist_ok=True)
                (ident / "midr_el1").write_text(midr + "\n")
                (ident / "revidr_el1").write_text("0x0000000000000000\n")
        os.chmod(tmp, 0o755)
        old = None
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=".old-", dir=dest.parent))
            os.rename(dest, old / "d")
        os.rename(tmp, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return True
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return False

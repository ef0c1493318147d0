"""``envspec run SPEC|LOCK|IMAGE [-- CMD...]``: the command that starts an image, right for this host.

Pure at the core: ``plan_run(target, cmd, facts=...)`` returns a ``RunPlan`` (the argv and the
warnings) from the lock and a ``HostFacts`` record; ``detect_host_facts()`` is the one place
that looks at the machine, so tests inject facts and golden files stay deterministic. The CLI
prints ``RunPlan.shell()`` (``--print``) or execs ``RunPlan.argv``.

What the argv carries, and why:

- GPUs: CDI (``--device nvidia.com/gpu=all``) where a CDI spec names ``nvidia.com/gpu``
  (podman); docker uses ``--gpus all`` (its CDI support is a daemon feature the client cannot
  see). Podman without a CDI spec gets no GPU flag and a warning that says how to make one.
- ``--shm-size`` and ``--ulimit`` from the lock's ``[runtime]``: PyTorch's DataLoader workers
  pass tensors through /dev/shm, whose container default (64 MB) is far too small.
- the services' ports on loopback only (``-p 127.0.0.1:P:P``): Jupyter and SSH need a token or
  a key, but a workstation's services are still not the whole network's business.
- the current directory on ``/workspace``; relabelled (``:z``) only where SELinux is on.
- host quirks (seen on this project's Debian 12 machines): crun rejects cgroup v1 and hybrid
  hierarchies, so podman gets ``--runtime runc`` there; without CAP_SYS_RESOURCE podman
  cannot raise rlimits above its own hard limits, and its defaults (nofile 1048576, nproc
  4194304) exceed them, so ``--ulimit`` values are capped to the hard limits; without systemd
  podman gets ``--cgroup-manager cgroupfs``.

This module also renders the image's entrypoint and service files (``render_service_files``),
which the build's envspec layer includes: they are what ``run`` starts.
"""

from __future__ import annotations

import os
import re
import resource
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from envspec.errors import HostError, UsageError
from envspec.lock import as_dict as _lock_dict
from envspec.services import WORKSPACE

# podman's default rlimits for a rootful container (containers.conf "default_ulimits" unset).
PODMAN_DEFAULT_LIMITS = {"nofile": 1048576, "nproc": 4194304}
PASSTHROUGH_ENV = ("ENVSPEC_VERIFY", "JUPYTER_TOKEN", "ENVSPEC_AUTHORIZED_KEYS")
INIT_PACKAGES = ("tini", "dumb-init")
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")

_RLIMITS = {
    "core": resource.RLIMIT_CORE, "cpu": resource.RLIMIT_CPU, "data": resource.RLIMIT_DATA,
    "fsize": resource.RLIMIT_FSIZE, "memlock": resource.RLIMIT_MEMLOCK, "nofile": resource.RLIMIT_NOFILE,
    "nproc": resource.RLIMIT_NPROC, "stack": resource.RLIMIT_STACK, "as": resource.RLIMIT_AS,
}
UNLIMITED = -1


# ---------------------------------------------------------------------------------------
# host facts

@dataclass(frozen=True)
class HostFacts:
    """What ``plan_run`` needs to know about the host. ``detect_host_facts()`` fills it in."""

    engines: tuple[str, ...] = ("podman",)  # usable engines, preferred first
    cdi_gpu_specs: tuple[str, ...] = ()  # CDI spec files that name nvidia.com/gpu
    nvidia_toolkit: bool = False  # nvidia-container-toolkit (what docker's --gpus needs)
    cgroup: str = "v2"  # "v2" (unified), "hybrid" (v1 controllers + a v2 mount) or "v1"
    runtimes: tuple[str, ...] = ("crun", "runc")  # OCI runtimes on PATH
    systemd: bool = True  # booted with systemd (podman's default cgroup manager needs it)
    rootless: bool = False
    cap_sys_resource: bool = True  # may raise rlimits above the hard limits
    hard_limits: tuple[tuple[str, int], ...] = ()  # (rlimit name, hard limit; -1 = unlimited)
    selinux: bool = False
    cwd: str = "/home/user/project"
    cwd_uid: int = 1000
    tty: bool = False
    env: tuple[tuple[str, str], ...] = ()  # PASSTHROUGH_ENV variables that are set
    storage_args: tuple[str, ...] = ()  # podman --root/--runroot/--storage-driver, as the build used
    host_init: str = ""  # an init podman can inject (--init-path) when an image has none
    podman_init: bool = True  # podman's own --init binary (catatonit) is installed
    pid_max: int = 4194304  # /proc/sys/kernel/pid_max
    bridge_conflict: str = ""  # an interface whose route shadows podman's bridge subnet ("" = none)
    slirp4netns: bool = True  # user-mode networking is installed

    def ceiling(self, name: str) -> int:
        """The highest value podman can give a container for rlimit ``name`` when it cannot raise
        limits: the hard limit, and for nproc also pid_max. (podman lowers its own nproc limit to
        pid_max before starting conmon, so the container cannot get more; seen on this project's
        Debian 12 hosts: pid_max 32768, nproc hard limit 96365, nproc=96365 fails with EPERM.)"""
        h = self.hard(name)
        if name == "nproc" and self.pid_max > 0:
            h = self.pid_max if h == UNLIMITED else min(h, self.pid_max)
        return h

    def hard(self, name: str) -> int:
        return dict(self.hard_limits).get(name, UNLIMITED)


def _docker_usable(env: Mapping[str, str]) -> bool:
    exe = shutil.which("docker")
    if exe is None:
        return False
    try:
        head = Path(exe).read_bytes()[:4096]
    except OSError:
        head = b""
    if head.startswith(b"#!") and b"podman" in head:
        return False  # podman-docker's shim: that is podman
    host = env.get("DOCKER_HOST", "")
    if host and not host.startswith("unix://"):
        return True  # a remote daemon: cannot check cheaply, trust the configuration
    sock = host.removeprefix("unix://") or "/var/run/docker.sock"
    return Path(sock).exists()  # a client without a daemon (seen here) cannot run anything


def cgroup_layout(root: str = "/sys/fs/cgroup") -> str:
    r = Path(root)
    if (r / "cgroup.controllers").exists():
        return "v2"
    if (r / "unified").is_dir():
        return "hybrid"
    return "v1"


def cdi_gpu_specs(dirs: Sequence[str] = CDI_DIRS) -> tuple[str, ...]:
    found = []
    for d in dirs:
        p = Path(d)
        if not p.is_dir():
            continue
        for f in sorted(p.iterdir()):
            if f.suffix not in (".yaml", ".yml", ".json"):
                continue
            try:
                text = f.read_text(errors="replace")
            except OSError:
                continue
            if re.search(r"nvidia\.com/gpu", text):
                found.append(str(f))
    return tuple(found)


def _has_cap(bit: int) -> bool:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> bit & 1)
    except (OSError, ValueError):
        pass
    return os.geteuid() == 0


def detect_host_facts(env: Mapping[str, str] | None = None, cwd: str | None = None) -> HostFacts:
    """Look at this machine: cheap file checks only, no container is started."""
    env = dict(os.environ) if env is None else env
    cwd = cwd or os.getcwd()
    engines = []
    if shutil.which("podman"):
        engines.append("podman")
    if _docker_usable(env):
        engines.append("docker")
    hard = []
    for name in ("nofile", "nproc", "memlock", "stack"):
        h = resource.getrlimit(_RLIMITS[name])[1]
        hard.append((name, UNLIMITED if h == resource.RLIM_INFINITY else int(h)))
    storage: tuple[str, ...] = ()
    try:  # the storage the build put the image in (ENVSPEC_STORAGE_ROOT): run must look there
        from envspec.build.engine import detect_host

        storage = tuple(detect_host(dict(env)).storage_args())
    except Exception:  # noqa: BLE001 (build stage absent or unusable: the system storage)
        storage = ()
    try:
        cwd_uid = os.stat(cwd).st_uid
    except OSError:
        cwd_uid = os.getuid()
    host_init = next((p for p in ("/usr/bin/tini", "/usr/bin/dumb-init") if Path(p).exists()), "")
    podman_init = any(Path(p).exists() for p in ("/usr/libexec/podman/catatonit", "/usr/bin/catatonit"))
    return HostFacts(
        engines=tuple(engines),
        cdi_gpu_specs=cdi_gpu_specs(),
        nvidia_toolkit=bool(shutil.which("nvidia-container-toolkit") or shutil.which("nvidia-container-runtime-hook")
                            or shutil.which("nvidia-ctk")),
        cgroup=cgroup_layout(),
        runtimes=tuple(r for r in ("crun", "runc") if shutil.which(r)),
        systemd=Path("/run/systemd/system").is_dir(),
        rootless=os.geteuid() != 0,
        cap_sys_resource=_has_cap(24),  # CAP_SYS_RESOURCE
        hard_limits=tuple(hard),
        selinux=Path("/sys/fs/selinux/enforce").exists() and Path("/sys/fs/selinux/enforce").read_text().strip() == "1",
        cwd=cwd,
        cwd_uid=cwd_uid,
        tty=sys.stdin.isatty() and sys.stdout.isatty(),
        env=tuple((k, env[k]) for k in PASSTHROUGH_ENV if k in env),
        storage_args=storage,
        host_init=host_init,
        podman_init=podman_init,
        pid_max=_pid_max(),
        bridge_conflict=_bridge_conflict_here(),
        slirp4netns=shutil.which("slirp4netns") is not None,
    )


def _bridge_conflict_here() -> str:
    try:
        table = Path("/proc/net/route").read_text()
    except OSError:
        return ""
    return bridge_conflict(table, *podman_bridge())


def podman_bridge(netavark_dirs: Sequence[str] = ("/usr/lib/podman", "/usr/libexec/podman"),
                  conf: str = "/etc/containers/networks/podman.json") -> tuple[str, str]:
    """(interface, subnet) of podman's default network: netavark's podman0 where netavark is
    installed, else CNI's cni-podman0; 10.88.0.0/16 unless podman.json says otherwise."""
    netavark = any(Path(d, "netavark").exists() for d in netavark_dirs)
    iface, subnet = ("podman0" if netavark else "cni-podman0"), "10.88.0.0/16"
    try:
        import json

        d = json.loads(Path(conf).read_text())
        iface = d.get("network_interface") or iface
        subnet = (d.get("subnets") or [{}])[0].get("subnet") or subnet
    except (OSError, ValueError, AttributeError, IndexError):
        pass
    return iface, subnet


def bridge_conflict(route_table: str, bridge: str = "podman0", subnet: str = "10.88.0.0/16") -> str:
    """The interface (other than ``bridge``) with a route overlapping podman's subnet, or "".

    Seen on this project's Debian 12 hosts: buildah (CNI) leaves a ``cni-podman0`` bridge, down,
    with the route 10.88.0.0/16 that netavark's ``podman0`` also uses; the older route wins (a
    link-down route is still used unless ignore_routes_with_linkdown is set), so published
    ports and the containers' own addresses time out."""
    import ipaddress

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


def _pid_max() -> int:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text().strip())
    except (OSError, ValueError):
        return 0


# ---------------------------------------------------------------------------------------
# target: SPEC, LOCK or IMAGE

@dataclass(frozen=True)
class Target:
    image: str
    lock: dict[str, Any] | None = None  # the lock as a dict, when known
    source: str = ""  # what was given
    warnings: tuple[str, ...] = ()


def image_ref(lock: Mapping[str, Any]) -> str:
    """``localhost/envspec/<meta.name>:<first 12 hex of meta.content_hash>`` (docs/lockfile.md)."""
    meta = lock.get("meta") or {}
    short = str(meta.get("content_hash", "")).split(":", 1)[-1][:12]
    if not short:
        raise UsageError("the lock has no content_hash, so it names no image", hint="re-create it with `envspec lock`",
                         reference="invalid-lock")
    return f"localhost/envspec/{meta.get('name')}:{short}"


def resolve_target(target: Any) -> Target:
    """A spec path (its lock is found next to it), a lockfile path, a lock model or dict, or an
    image reference."""
    if not isinstance(target, (str, Path)):
        d = _lock_dict(target)
        return Target(image_ref(d), d, source="lock")
    text = str(target)
    p = Path(text)
    if p.is_file():
        from envspec import lock as lockmod

        if p.suffix == ".toml":
            from envspec.spec import load_spec

            spec = load_spec(p)
            candidates = [lockmod.default_path(spec.name), lockmod.default_path(spec.name, p.parent.parent / "lockfiles"),
                          p.parent / f"{spec.name}.lock"]
            lp = next((c for c in candidates if c.is_file()), None)
            if lp is None:
                raise UsageError(f"{p}: no lock for spec {spec.name!r} (looked for {candidates[0]})",
                                 hint=f"run `envspec lock {p}` and `envspec build {p}` first",
                                 reference="lock-not-found")
            lk = lockmod.load(lp)
            warnings = []
            reasons = lockmod.stale_reasons(lk, spec)
            if reasons:
                warnings.append(f"{lp} is out of date with {p} ({reasons[0]}); running the image of the lock; "
                                f"run `envspec lock {p}` and `envspec build {p}` to update it")
            d = _lock_dict(lk)
            return Target(image_ref(d), d, source=str(lp), warnings=tuple(warnings))
        d = _lock_dict(lockmod.load(p))
        return Target(image_ref(d), d, source=str(p))
    if p.suffix in (".toml", ".lock") or text.startswith(("./", "../", "/")):
        raise UsageError(f"{text}: no such file", hint="give a spec, a lockfile or an image reference",
                         reference="bad-usage")
    return Target(text, None, source="image")


# ---------------------------------------------------------------------------------------
# the plan

@dataclass(frozen=True)
class RunPlan:
    argv: list[str]
    warnings: list[str] = field(default_factory=list)
    engine: str = "podman"
    image: str = ""
    notes: list[str] = field(default_factory=list)  # what to do next: URLs, ssh line

    def shell(self) -> str:
        """The command, shell-quoted (what ``--print`` prints)."""
        return shlex.join(self.argv)

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "image": self.image, "argv": list(self.argv), "command": self.shell(),
                "warnings": list(self.warnings), "notes": list(self.notes)}


def run_lines(plan: RunPlan) -> list[str]:
    """``--print``: the command, then warnings and notes as shell comments (pasteable)."""
    lines = [plan.shell()]
    lines += [f"# warning: {w}" for w in plan.warnings]
    lines += [f"# {n}" for n in plan.notes]
    return lines


def _ulimits(lock: Mapping[str, Any] | None, engine: str, facts: HostFacts, warnings: list[str]) -> list[str]:
    """``--ulimit`` flags: the lock's, plus podman's defaults made explicit where they would exceed
    the host's hard limits; each capped to the hard limit where podman could not raise it."""
    wanted: dict[str, int] = {}
    if lock:
        for k, v in dict((lock.get("runtime") or {}).get("ulimits") or {}).items():
            wanted[str(k)] = int(v)
    capped = engine == "podman" and (facts.rootless or not facts.cap_sys_resource)
    if capped:
        for name, default in PODMAN_DEFAULT_LIMITS.items():
            h = facts.ceiling(name)
            if name not in wanted and h != UNLIMITED and h < default:
                wanted[name] = h
    flags = []
    for name in sorted(wanted):
        v = wanted[name]
        if capped:
            h = facts.ceiling(name)
            if h != UNLIMITED and (v == UNLIMITED or v > h):
                if name in ((lock or {}).get("runtime") or {}).get("ulimits", {}):
                    warnings.append(f"the lock asks for {name}={'unlimited' if v == UNLIMITED else v}; podman "
                                    f"cannot give more than {h} here: using {h}")
                v = h
        flags += ["--ulimit", f"{name}={v}:{v}"]
    return flags


def _has_init(lock: Mapping[str, Any] | None, image: str) -> bool | None:
    """Whether the image has its own init (tini or dumb-init) as PID 1; None when unknown."""
    if lock is None:
        return True if image.startswith("localhost/envspec/") else None
    deb = lock.get("debian") or {}
    names = {p.get("name") for p in deb.get("packages", []) or []}
    return any(n in names for n in INIT_PACKAGES)


def _wants_gpu(lock: Mapping[str, Any] | None) -> bool:
    if lock is None:
        return True  # an image we know nothing about: offer the GPUs
    torch = lock.get("torch") or {}
    return bool(torch) and str(torch.get("variant", "cpu")) != "cpu"


def _enabled_services(lock: Mapping[str, Any] | None) -> list[tuple[str, int]]:
    out = []
    for name in ("jupyter", "ssh"):
        s = ((lock or {}).get("services") or {}).get(name) or {}
        if s and s.get("enabled", True):
            out.append((name, int(s.get("port", 8888 if name == "jupyter" else 2222))))
    return out


def plan_run(target: Any, cmd: Sequence[str] = (), *, engine: str | None = None, facts: HostFacts | None = None,
             bind: str = "127.0.0.1", detach: bool = False, name: str | None = None,
             mount_cwd: bool = True, gpus: bool = True, host_ports: Mapping[int, int] | None = None,
             image: str | None = None) -> RunPlan:
    """The argv that starts ``target`` (a spec or lockfile path, a lock, or an image reference)
    on this host, with the warnings a user should see. ``host_ports`` maps a service's port in the
    container to another port on the host (default: the same). ``image`` runs another reference
    of the lock's image (a registry copy pulled by digest) with the lock's settings. Raises ``HostError`` when no engine is
    usable, ``UsageError``/``LockError`` for a bad target."""
    facts = facts or detect_host_facts()
    t = target if isinstance(target, Target) else resolve_target(target)
    lock = t.lock
    image = image or t.image
    warnings = list(t.warnings)
    notes: list[str] = []

    if engine is None:
        if not facts.engines:
            raise HostError("no container engine: neither podman nor a reachable docker daemon",
                            hint="apt-get install -y podman runc", reference="no-container-engine")
        engine = facts.engines[0]
    elif engine not in ("podman", "docker"):
        raise UsageError(f"unknown engine {engine!r}", hint="use --engine podman or --engine docker")
    elif engine not in facts.engines:
        warnings.append(f"{engine} does not look usable on this host"
                        + (" (no daemon socket)" if engine == "docker" else " (not on PATH)"))

    argv: list[str] = [engine]
    if engine == "podman":
        argv += list(facts.storage_args)
        if not facts.systemd:
            # podman's systemd cgroup manager needs systemd as PID 1; without it cgroupfs works.
            argv += ["--cgroup-manager", "cgroupfs"]
    argv += ["run", "--rm"]
    if detach:
        argv.append("-d")
    elif facts.tty:
        argv.append("-it")
    else:
        argv.append("-i")
    if name:
        argv += ["--name", name]

    if engine == "podman":
        if facts.cgroup != "v2":
            if "runc" in facts.runtimes:
                # crun rejects cgroup v1/hybrid hierarchies on this project's Debian 12 hosts.
                argv += ["--runtime", "runc"]
            else:
                warnings.append(f"cgroup {facts.cgroup} host without runc: crun may refuse to start the container "
                                "(apt-get install -y runc)")
        if facts.bridge_conflict and not facts.rootless:
            if facts.slirp4netns:
                argv += ["--network", "slirp4netns"]
                warnings.append(f"the interface {facts.bridge_conflict} has a route over podman's bridge subnet, so "
                                "bridge networking would time out: using --network slirp4netns (user-mode, slower). "
                                f"Fix the host: ip link delete {facts.bridge_conflict} (when no buildah container "
                                "uses it)")
            else:
                warnings.append(f"the interface {facts.bridge_conflict} has a route over podman's bridge subnet: "
                                "published ports will time out (apt-get install -y slirp4netns, or "
                                f"ip link delete {facts.bridge_conflict})")
        if facts.rootless and lock is not None:
            uid = int((lock.get("runtime") or {}).get("uid", 1000))
            # Your files in /workspace stay yours: the image's user is you on the host.
            argv += ["--userns", f"keep-id:uid={uid},gid={uid}"]

    has_init = _has_init(lock, image)
    if has_init is False or has_init is None:
        if engine == "docker":
            argv.append("--init")
        elif facts.podman_init:
            argv.append("--init")
        elif facts.host_init:
            argv += ["--init", "--init-path", facts.host_init]
        else:
            warnings.append("the image has no init and podman's (catatonit) is not installed: zombie processes of "
                            "DataLoader workers will not be reaped (apt-get install -y catatonit)")

    if gpus and _wants_gpu(lock):
        if engine == "podman":
            if facts.cdi_gpu_specs:
                argv += ["--device", "nvidia.com/gpu=all"]
            else:
                warnings.append("no CDI spec names nvidia.com/gpu (looked in /etc/cdi, /var/run/cdi): the container "
                                "gets no GPU. Make one: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml "
                                "(package nvidia-container-toolkit)")
        else:
            argv += ["--gpus", "all"]
            if not facts.nvidia_toolkit:
                warnings.append("docker's --gpus needs the NVIDIA container toolkit, which is not installed here "
                                "(apt-get install -y nvidia-container-toolkit)")

    rt = (lock or {}).get("runtime") or {}
    if rt.get("shm_size"):
        argv += ["--shm-size", str(rt["shm_size"])]
    elif lock is None:
        argv += ["--shm-size", "16g"]
        warnings.append("no lock: --shm-size 16g and no ulimits or ports; give the spec or lockfile instead")
    argv += _ulimits(lock, engine, facts, warnings)

    host_ports = dict(host_ports or {})
    for svc, port in _enabled_services(lock):
        hp = int(host_ports.pop(port, port))
        argv += ["-p", f"{bind}:{hp}:{port}" if bind else f"{hp}:{port}"]
        host = bind if bind and bind != "0.0.0.0" else "127.0.0.1"
        if svc == "jupyter":
            notes.append(f"Jupyter: http://{host}:{hp}/lab?token=<JUPYTER_TOKEN, or the token the container prints>")
        else:
            user = rt.get("user", "envspec")
            notes.append(f"SSH: ssh -p {hp} {user}@{host}")
    if host_ports:
        raise UsageError(f"no service of the image listens on port {', '.join(map(str, sorted(host_ports)))}",
                         hint="map a service's port: " + ", ".join(f"{p}" for _s, p in _enabled_services(lock)) or
                              "the image has no services", reference="bad-usage")
    if bind and bind not in ("127.0.0.1", "::1", "localhost") and _enabled_services(lock):
        warnings.append(f"services are published on {bind}, not loopback only: anyone who can reach this host "
                        "can reach them (they still need the token or a key)")

    if mount_cwd:
        cwd = os.path.normpath(facts.cwd)
        if cwd == "/":
            warnings.append("the current directory is /: not mounting it on /workspace")
        else:
            opts = ":z" if facts.selinux else ""  # shared label: several containers may mount it
            argv += ["-v", f"{cwd}:{WORKSPACE}{opts}"]
            uid = int(rt.get("uid", 1000)) if lock else None
            if uid is not None and not facts.rootless and facts.cwd_uid != uid:
                warnings.append(f"{cwd} belongs to uid {facts.cwd_uid} on the host; the image's user is uid {uid}: "
                                f"it can read but maybe not write /workspace (chown -R {uid}:{uid} the directory, "
                                "or run rootless podman)")

    for k, _v in facts.env:
        argv += ["-e", k]  # the name only: the value comes from this environment, never the argv

    argv.append(image)
    argv += list(cmd)

    if engine == "docker" and image.startswith("localhost/envspec/"):
        warnings.append(f"envspec builds into containers-storage, which docker does not read: load it with "
                        f"skopeo copy containers-storage:{image} docker-daemon:{image}")
    return RunPlan(argv=argv, warnings=warnings, engine=engine, image=image, notes=notes)

"""``envspec run SPEC|LOCK|IMAGE [-- CMD...]``: the command that starts an image, right for this host.

Pure at the core: ``plan_run(runnable, cmd, host=...)`` returns a ``RunCommand`` (the argv, the
warnings and the notes) from the lock and the ``Host`` that ``envspec.host.detect_host()``
found, so tests build a ``Host`` and golden files stay deterministic. The CLI prints
``RunCommand.shell()`` (``--print``) or execs ``RunCommand.argv``.

What the argv carries, and why:

- GPUs: CDI (``--device nvidia.com/gpu=all``) where a CDI spec names ``nvidia.com/gpu``
  (podman); docker uses ``--gpus all`` (its CDI support is a daemon feature the client cannot
  see). Podman without a CDI spec gets no GPU flag and a warning that says how to make one.
- ``--shm-size`` and ``--ulimit`` from the lock's ``[runtime]``: PyTorch's DataLoader workers
  pass tensors through /dev/shm, whose container default (64 MB) is far too small.
- the services' ports on loopback only (``-p 127.0.0.1:P:P``): Jupyter and SSH need a token or
  a key, but a workstation's services are still not the whole network's business. With a
  command the image starts no service unless ``ENVSPEC_SERVICES`` asks (the entrypoint's rule),
  so then no port is published either.
- the current directory on ``/workspace``; relabelled (``:z``) only where SELinux is on.
- host quirks (seen on this project's Debian 12 machines): crun rejects cgroup v1 and hybrid
  hierarchies, so podman gets ``--runtime runc`` there (``Host.runtime``); without
  CAP_SYS_RESOURCE podman cannot raise rlimits above its own hard limits, and its defaults
  (nofile 1048576, nproc 4194304) exceed them, so ``--ulimit`` values are capped to the hard
  limits; without systemd podman gets ``--cgroup-manager cgroupfs``.

The image's entrypoint and service files, which ``run`` starts, are rendered by
``envspec.services.render_service_files`` into the build's envspec layer.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from envspec import lock as lockmod
from envspec.errors import HostError, UsageError
from envspec.host import GRACE_MIDR_EL1, UNLIMITED, Host, Runner, emulated_cpu_dir, run_command
from envspec.lock import Lockfile
from envspec.services import WORKSPACE
from envspec.spec import load_spec

# podman's default rlimits for a rootful container (containers.conf "default_ulimits" unset).
PODMAN_DEFAULT_LIMITS = {"nofile": 1048576, "nproc": 4194304}
PASSTHROUGH_ENV = ("ENVSPEC_VERIFY", "ENVSPEC_SERVICES", "JUPYTER_TOKEN", "ENVSPEC_AUTHORIZED_KEYS")
INIT_PACKAGES = ("tini", "dumb-init")


# ---------------------------------------------------------------------------------------
# what to run: SPEC, LOCK or IMAGE


@dataclass(frozen=True)
class Runnable:
    """An image to start, with its lock when it is known."""

    image: str
    lock: Lockfile | None = None
    source: str = ""  # what was given
    warnings: tuple[str, ...] = ()

    @classmethod
    def of_lock(
        cls, lock: Lockfile, source: str = "lock", warnings: tuple[str, ...] = ()
    ) -> Runnable:
        """The lock's image, by its tag (docs/lockfile.md)."""
        if not lock.short_hash:
            raise UsageError(
                "the lock has no content_hash, so it names no image",
                hint="re-create it with `envspec lock`",
                reference="invalid-lock",
            )
        return cls(lock.image_tag, lock, source=source, warnings=warnings)


def resolve_runnable(target: str | Path | Lockfile) -> Runnable:
    """A spec path (its lock is found next to it), a lockfile path, a lock, or an image reference."""
    if isinstance(target, Lockfile):
        return Runnable.of_lock(target)
    text = str(target)
    p = Path(text)
    if p.is_file():
        if p.suffix == ".toml":
            spec = load_spec(p)
            candidates = [lockmod.default_path(p, spec.name), p.parent / f"{spec.name}.lock"]
            lp = next((c for c in candidates if c.is_file()), None)
            if lp is None:
                raise UsageError(
                    f"{p}: no lock for spec {spec.name!r} (looked for {candidates[0]})",
                    hint=f"run `envspec lock {p}` and `envspec build {p}` first",
                    reference="lock-not-found",
                )
            lk = lockmod.load(lp)
            warnings = []
            reasons = lockmod.stale_reasons(lk, spec)
            if reasons:
                warnings.append(
                    f"{lp} is out of date with {p} ({reasons[0]}); running the image of the lock; "
                    f"run `envspec lock {p}` and `envspec build {p}` to update it"
                )
            return Runnable.of_lock(lk, source=str(lp), warnings=tuple(warnings))
        return Runnable.of_lock(lockmod.load(p), source=str(p))
    if p.suffix in (".toml", ".lock") or text.startswith(("./", "../", "/")):
        raise UsageError(
            f"{text}: no such file",
            hint="give a spec, a lockfile or an image reference",
            reference="bad-usage",
        )
    return Runnable(text, None, source="image")


# ---------------------------------------------------------------------------------------
# the command


@dataclass(frozen=True)
class RunCommand:
    argv: list[str]
    warnings: list[str] = field(default_factory=list)
    engine: str = "podman"
    image: str = ""
    notes: list[str] = field(default_factory=list)  # what to do next: URLs, ssh line
    load_hint: str = (
        ""  # docker and an envspec-built image: how to load it (a warning until docker is asked)
    )
    emulated_cpu: str = (
        ""  # the directory mounted on /sys/devices/system/cpu (``host.write_emulated_cpu_dir``)
    )

    def without_emulated_cpu(self) -> RunCommand:
        """This command without the /sys/devices/system/cpu mount (its directory could not be made)."""
        import dataclasses

        mount = f"{self.emulated_cpu}:/sys/devices/system/cpu:ro"
        i = self.argv.index(mount)
        return dataclasses.replace(
            self,
            argv=self.argv[: i - 1] + self.argv[i + 1 :],
            emulated_cpu="",
            notes=[
                n for n in self.notes if not n.startswith("/sys/devices/system/cpu is this host's")
            ],
            warnings=[
                *self.warnings,
                f"could not copy /sys/devices/system/cpu into {self.emulated_cpu}: "
                "torch >= 2.11 (aarch64) may segfault at import under qemu",
            ],
        )

    def shell(self) -> str:
        """The command, shell-quoted (what ``--print`` prints)."""
        return shlex.join(self.argv)

    def to_json(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "image": self.image,
            "argv": list(self.argv),
            "command": self.shell(),
            "warnings": list(self.warnings),
            "notes": list(self.notes),
        }


def attached(command: RunCommand, token: str) -> tuple[list[str], list[str]]:
    """How ``envspec run`` starts a podman container it waits for: without ``--rm``, under a name
    (the user's ``--name``, else ``envspec-run-TOKEN``), and the argv that removes it after.

    podman 4.3 (Debian 12) races its own ``--rm``: the cleanup process conmon starts removes the
    container while ``podman run`` still waits for it, and ``podman run`` then exits 127 with
    "getting exit code of container ... from DB: no such exit code (container in state running)"
    (seen here after a 27 s ``envspec verify``; fixed upstream in podman 5). A container that is
    not auto-removed keeps its exit code, so podman reports the command's own status. Docker,
    detached runs and ``--print`` keep ``--rm``."""
    argv = list(command.argv)
    if command.engine != "podman" or "-d" in argv or "--rm" not in argv:
        return argv, []
    at = argv.index("run")
    argv.remove("--rm")
    options = argv[at : argv.index(command.image, at)] if command.image in argv[at:] else argv[at:]
    if "--name" in options:
        name = options[options.index("--name") + 1]
    else:
        name = f"envspec-run-{token}"
        argv[at + 1 : at + 1] = ["--name", name]
    return argv, [*argv[:at], "rm", "--force", "--ignore", name]


def run_lines(command: RunCommand) -> list[str]:
    """``--print``: the command, then warnings and notes as shell comments (pasteable)."""
    lines = [command.shell()]
    lines += [f"# warning: {w}" for w in command.warnings]
    lines += [f"# {n}" for n in command.notes]
    return lines


def _podman_global(host: Host) -> list[str]:
    """podman's global options here: the storage the build used, and cgroupfs where there is no systemd."""
    args = host.storage.args()
    if host.cgroup_manager != "systemd":
        args += ["--cgroup-manager", host.cgroup_manager]
    return args


def _runtime(host: Host, warnings: list[str]) -> list[str]:
    if host.runtime:  # crun rejects cgroup v1/hybrid hierarchies on this project's Debian 12 hosts
        return ["--runtime", host.runtime]
    if host.cgroup != "v2":
        warnings.append(
            f"cgroup {host.cgroup} host without runc: crun may refuse to start the container "
            "(apt-get install -y runc)"
        )
    return []


def _ulimits(lock: Lockfile | None, engine: str, host: Host, warnings: list[str]) -> list[str]:
    """``--ulimit`` flags: the lock's, plus podman's defaults made explicit where they would exceed
    the host's hard limits; each capped to the hard limit where the engine could not raise it.

    docker: a local daemon started on a host whose capability bounding set lacks CAP_SYS_RESOURCE
    (this project's Debian 12 machines: PID 1 has it in CapEff but not in CapBnd, so no process
    gets it) cannot raise limits either, and runc fails the start ("error setting rlimit type 8:
    operation not permitted" for memlock=-1). Its containers inherit the daemon's own limits, so
    docker gets no podman defaults, only the lock's values capped."""
    asked = dict(lock.runtime.ulimits) if lock else {}
    wanted = dict(asked)
    if engine == "podman":
        capped = host.rootless or not host.cap_sys_resource
    else:
        capped = not host.cap_sys_resource and not host.docker_remote
    if capped and engine == "podman":
        for name, default in PODMAN_DEFAULT_LIMITS.items():
            h = host.ceiling(name)
            if name not in wanted and h != UNLIMITED and h < default:
                wanted[name] = h
    flags = []
    for name in sorted(wanted):
        v = wanted[name]
        if capped:
            h = host.ceiling(name)
            if h != UNLIMITED and (v == UNLIMITED or v > h):
                if name in asked:
                    warnings.append(
                        f"the lock asks for {name}={_limit_text(name, v)}; {engine} "
                        f"cannot give more than {_limit_text(name, h)} here: using {h}"
                    )
                v = h
        flags += ["--ulimit", f"{name}={v}:{v}"]
    return flags


# the rlimits counted in bytes (setrlimit(2)); the others count files, processes, signals, ...
BYTE_LIMITS = frozenset({"as", "core", "data", "fsize", "memlock", "msgqueue", "rss", "stack"})


def _limit_text(name: str, v: int) -> str:
    """A limit's value as a person reads it: "unlimited", a count, or bytes with their size."""
    if v == UNLIMITED:
        return "unlimited"
    if name in BYTE_LIMITS and v >= 1024:
        from envspec.cache.gc import human

        return f"{v} ({human(v)})"
    return str(v)


def podman_args(host: Host) -> tuple[list[str], list[str]]:
    """(global options, ``run`` options) that any podman container needs on this host, as
    ``plan_run`` gives them without a lock: the build's storage, the cgroup manager, the runtime
    and rlimits podman can give. For tests and scripts that start containers of envspec images."""
    return _podman_global(host), _runtime(host, []) + _ulimits(None, "podman", host, [])


def _has_init(lock: Lockfile | None, image: str) -> bool | None:
    """Whether the image has its own init (tini or dumb-init) as PID 1; None when unknown."""
    if lock is None:
        return True if image.startswith("localhost/envspec/") else None
    names = {p.name for p in lock.debian.packages} if lock.debian else set()
    return any(n in names for n in INIT_PACKAGES)


def _enabled_services(lock: Lockfile | None) -> list[tuple[str, int]]:
    """(name, port in the container) of each service the image starts."""
    if lock is None:
        return []
    s = lock.services
    return [
        (n, p.port)
        for n in s.enabled()
        if (p := s.jupyter if n == "jupyter" else s.ssh) is not None
    ]


@dataclass
class _Argv:
    """The command being put together, with what the user should read beside it."""

    argv: list[str]
    warnings: list[str]
    notes: list[str] = field(default_factory=list)
    emulated_cpu: str = ""

    def add(self, *args: str) -> None:
        self.argv += args

    def warn(self, text: str) -> None:
        self.warnings.append(text)

    def note(self, text: str) -> None:
        self.notes.append(text)


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How ``plan_run`` starts an image (`envspec run`'s flags)."""

    engine: str | None = None  # podman or docker (default: the host's usable one)
    bind: str = "127.0.0.1"  # the host address the services' ports are published on
    detach: bool = False
    name: str | None = None
    mount_cwd: bool = True
    gpus: bool = True
    # a service's port in the container -> another port on the host (default: the same)
    host_ports: Mapping[int, int] | None = None
    # another reference of the lock's image (a registry copy pulled by digest), with the lock's settings
    image: str | None = None
    # an image of another CPU architecture may start under emulation (``--emulate``; without it such
    # an image is refused, ``emulation-not-asked``)
    emulate: bool = False
    platform: str | None = None  # which section of a multi-platform lock (default: the host's)


def _shm(lock: Lockfile | None, out: _Argv) -> None:
    """The lock's /dev/shm size; 16g, with a warning, for an image without a lock."""
    if lock is None:
        out.add("--shm-size", "16g")
        out.warn(
            "no lock: --shm-size 16g and no ulimits or ports; give the spec or lockfile instead"
        )
    elif lock.runtime.shm_size:
        out.add("--shm-size", lock.runtime.shm_size)


def _docker_load_hint(image: str) -> str:
    """How to get an image envspec built into docker, which does not read containers-storage;
    "" for an image not built here."""
    if not image.startswith("localhost/envspec/"):
        return ""
    return (
        f"envspec builds into containers-storage, which docker does not read: load {image} into docker "
        f"once (envspec build LOCK --output docker-archive:image.tar && docker load -i image.tar, or "
        f"skopeo copy containers-storage:{image} docker-daemon:{image}, then docker image inspect {image}"
        f": skopeo reports success even when the daemon failed to store the image)"
    )


def plan_run(
    target: Runnable | Lockfile | str | Path,
    cmd: Sequence[str] = (),
    *,
    host: Host,
    options: RunOptions = RunOptions(),
) -> RunCommand:
    """The argv that starts ``target`` (a ``Runnable``, a lock, a spec or lockfile path, or an
    image reference) on ``host``, with the warnings a user should see. Raises ``HostError`` when
    no engine is usable, ``UsageError``/``LockError`` for a bad target."""
    o = options
    t = target if isinstance(target, Runnable) else resolve_runnable(target)
    t = _platform_view(t, host, o.platform)
    lock = t.lock
    image = o.image or t.image
    out = _Argv([], list(t.warnings))
    engine = _engine(host, o.engine, out)
    out.add(engine, *(_podman_global(host) if engine == "podman" else []), "run", "--rm")
    if lock is not None and lock.platform.arch != host.machine:
        _emulated(host, engine, lock, out, asked=o.emulate)
    out.add("-d" if o.detach else "-it" if host.tty else "-i")
    if o.name:
        out.add("--name", o.name)
    if engine == "podman":
        out.add(*_runtime(host, out.warnings))
        _podman_network(host, lock, out)
    _init(host, engine, _has_init(lock, image), out)
    if o.gpus and (
        lock is None or lock.wants_gpu
    ):  # an image we know nothing about: offer the GPUs
        _gpus(host, engine, out)
    _shm(lock, out)
    # a capped memlock matters for pinned memory and RDMA on a GPU host; on a machine with no
    # NVIDIA driver it is a fact to know, not a warning
    out.add(*_ulimits(lock, engine, host, out.warnings if host.driver_version else out.notes))
    # the entrypoint starts the services without a command, or when ENVSPEC_SERVICES names them
    _ports(
        lock,
        o.bind,
        dict(o.host_ports or {}),
        out,
        started=not cmd or "ENVSPEC_SERVICES" in host.env_names,
    )
    if o.mount_cwd:
        _mount_cwd(host, lock, out)
    # the names only: the values come from this environment, never the argv
    out.add(*(a for k in PASSTHROUGH_ENV if k in host.env_names for a in ("-e", k)))
    out.add(image, *cmd)
    load_hint = _docker_load_hint(image) if engine == "docker" else ""
    if load_hint:
        out.warn(load_hint)
    return RunCommand(
        argv=out.argv,
        warnings=out.warnings,
        engine=engine,
        image=image,
        notes=out.notes,
        load_hint=load_hint,
        emulated_cpu=out.emulated_cpu,
    )


def _platform_view(t: Runnable, host: Host, platform: str | None) -> Runnable:
    """The one-platform lock to run: of a multi-platform lock the section ``platform`` names, else
    the host's (``UsageError`` when it has none: another platform's image must be asked for)."""
    lock = t.lock
    if lock is None:
        if platform:
            raise UsageError(
                f"--platform {platform}: {t.image} is an image reference, not a lock with sections",
                hint="give the lock (or spec), or pull the image with podman pull --arch",
                reference="bad-usage",
            )
        return t
    want = platform or (f"linux-{host.machine}" if lock.multi else None)
    if want is None:
        return t
    if lock.find_part(want) is None:
        if not platform:
            others = " or ".join(f"--platform {n} --emulate" for n in lock.platform_names)
            raise UsageError(
                f"lock {lock.meta.name} has no section for this host's platform, {want} (it has "
                f"{', '.join(lock.platform_names)})",
                hint=f"run another platform's image under emulation: {others}; or add {want} to "
                "[target].platforms and lock again",
                reference="platform-not-in-lock",
            )
        lock.for_platform(want)  # raises platform-not-in-lock, naming the sections
    view = lock.for_platform(want)
    if view is lock:
        return t
    return Runnable(view.image_tag, view, source=t.source, warnings=t.warnings)


def _emulated(host: Host, engine: str, lock: Lockfile, out: _Argv, *, asked: bool = False) -> None:
    """An image of another CPU architecture (an arm64 image on an amd64 host): it starts under
    qemu-user-static through binfmt_misc when asked for (``--emulate``) and the kernel has that,
    and not at all otherwise."""
    arch, oci = lock.platform.arch, lock.platform.oci_arch
    if not asked:
        raise UsageError(
            f"the image is for linux-{arch} ({oci}) and this host is linux-{host.machine}: it can only "
            "run under emulation (qemu-user-static), many times slower and without GPUs, which "
            "envspec run does only when asked",
            hint="add --emulate to run it under emulation"
            + (
                ""
                if host.runs_arch(arch)
                else f" (needs qemu-user-static and binfmt_misc for {arch}: scripts/dev.sh setup)"
            )
            + f"; or run it on a linux-{arch} host",
            reference="emulation-not-asked",
        )
    if not host.runs_arch(arch):
        raise UsageError(
            f"the image is for linux-{arch} ({oci}) and this host is linux-{host.machine}, with no "
            f"emulation for {arch}",
            hint=(host.binfmt_note or "apt-get install -y qemu-user-static binfmt-support")
            + "; or run it on a linux-"
            + arch
            + " host",
            reference="arch-not-runnable",
        )
    out.add("--arch", oci) if engine == "podman" else out.add("--platform", f"linux/{oci}")
    out.warn(
        f"the image is for linux-{arch}: it runs under emulation (qemu-{arch} through binfmt_misc), many times "
        "slower than on its own hosts, and without GPUs"
    )
    if arch == "aarch64":
        # torch's oneDNN reads each CPU's MIDR_EL1 from sysfs at import; the x86_64 host's sysfs has
        # none, and torch >= 2.11 (aarch64) then dies of SIGSEGV under qemu
        out.emulated_cpu = str(emulated_cpu_dir(host.cache_dir, arch))
        out.add("-v", f"{out.emulated_cpu}:/sys/devices/system/cpu:ro")
        out.note(
            f"/sys/devices/system/cpu is this host's, with Grace's CPU ID (MIDR_EL1 {GRACE_MIDR_EL1}, Neoverse "
            "V2) added, which torch's oneDNN reads at import; without it torch >= 2.11 segfaults under qemu"
        )


def _engine(host: Host, asked: str | None, out: _Argv) -> str:
    if asked is None:
        if not host.engines:
            raise HostError(
                "no container engine: neither podman nor a reachable docker daemon",
                hint="apt-get install -y podman runc",
                reference="no-container-engine",
            )
        return host.engines[0]
    if asked not in ("podman", "docker"):
        raise UsageError(f"unknown engine {asked!r}", hint="use --engine podman or --engine docker")
    if asked not in host.engines:
        out.warn(
            f"{asked} does not look usable on this host"
            + (" (no daemon socket)" if asked == "docker" else " (not on PATH)")
        )
    return asked


ENGINE_FAILED = (
    125  # podman's and docker's exit status when the engine itself failed, not the command
)


def check_engine_ready(host: Host, engine: str) -> None:
    """Before starting a container: the engine can be reached. For docker, ``host`` must have been
    detected with ``ask`` including "docker info" (``host.ASK_DOCKER``). Raises ``HostError``
    naming the engine, the daemon's address and the step."""
    if engine != "docker":
        return
    address = host.docker_host
    if host.docker in ("", "podman"):
        raise HostError(
            "docker: no docker client here (step: connect to the daemon)"
            if not host.docker
            else "docker: `docker` is podman's shim, not a docker client (step: connect to the daemon)",
            hint="use --engine podman, or apt-get install -y docker.io",
            reference="docker-unreachable",
        )
    if host.docker == "client":
        raise HostError(
            f"docker: no daemon socket at {address} (step: connect to the daemon, before docker run)",
            hint="start the daemon (systemctl start docker, or dockerd), or set DOCKER_HOST to one "
            "that runs; or use --engine podman",
            reference="docker-unreachable",
        )
    d = host.docker_daemon
    if d is not None and not d.answered:
        raise HostError(
            f"docker: the daemon at {d.address} did not answer `docker info` (step: connect to the "
            f"daemon, before docker run): {d.error}",
            hint="start the daemon, or check who may use its socket (the docker group); "
            "or use --engine podman",
            reference="docker-unreachable",
        )


def check_docker_image(command: RunCommand, run: Runner | None = None) -> None:
    """Before ``docker run`` of an image envspec built: docker's daemon has it (``docker image
    inspect``). Without this, docker tries to pull ``localhost/envspec/...`` from a registry on
    localhost:80 and fails with a message about the network. Raises ``HostError``
    (``docker-image-missing``) with the ways to load it. Other images are docker's business."""
    if command.engine != "docker" or not command.load_hint:
        return
    rc, _out, err = (run or run_command)(
        ["docker", "image", "inspect", "--format", "{{.Id}}", command.image]
    )
    if rc == 0:
        return
    said = " ".join(err.split())[:300]
    raise HostError(
        f"docker's daemon has no image {command.image} (step: before docker run){': ' + said if said else ''}",
        hint="load it once: envspec build LOCK --output docker-archive:image.tar && docker load -i "
        "image.tar (docker load reports a daemon that runs out of space; skopeo copy ... "
        "docker-daemon: does not); or use --engine podman",
        reference="docker-image-missing",
    )


def check_podman_image(
    command: RunCommand, source: str = "LOCK", run: Runner | None = None
) -> None:
    """Before ``podman run`` of an image envspec builds (``localhost/envspec/...``): the store has
    it (``podman image exists``, with the run's own storage options). Without this, podman tries
    to pull it from a registry on localhost:443 and ends with three retries' worth of network
    errors. Raises ``HostError`` (``image-not-built``) naming the build command."""
    if command.engine != "podman" or not command.image.startswith("localhost/envspec/"):
        return
    head = command.argv[: command.argv.index("run")]
    rc, _out, _err = (run or run_command)([*head, "image", "exists", command.image])
    if rc != 1:  # 0: there; anything else: podman's own trouble, which podman run then reports
        return
    raise HostError(
        f"the image {command.image} is not in this store (step: before podman run): the lock has "
        "not been built here, or was built into another storage root",
        hint=f"build it: envspec build {source} (ENVSPEC_STORAGE_ROOT must be the one the build used)",
        reference="image-not-built",
    )


def start_failed(command: RunCommand, returncode: int) -> HostError:
    """``ENGINE_FAILED`` from ``podman run``/``docker run``: the engine (a daemon that refused, an
    image it does not have, a runtime that failed) stopped before the command ran."""
    where = ""
    if command.engine == "docker":
        where = " (docker's daemon refused or failed: its message is above)"
    return HostError(
        f"{command.engine} run could not start the container of {command.image} "
        f"(step: start the container, exit status {returncode}){where}",
        hint=f"the lines above are {command.engine}'s own; `envspec run --print` shows the command, "
        "`envspec doctor` checks this host",
        reference="container-start-failed",
    )


def _podman_network(host: Host, lock: Lockfile | None, out: _Argv) -> None:
    if host.bridge_conflict and not host.rootless:
        if host.which("slirp4netns"):
            out.add("--network", "slirp4netns")
            out.warn(
                f"the interface {host.bridge_conflict} has a route over podman's bridge subnet, so "
                "bridge networking would time out: using --network slirp4netns (user-mode, slower). "
                f"Fix the host: ip link delete {host.bridge_conflict} (when no buildah container uses it)"
            )
        else:
            out.warn(
                f"the interface {host.bridge_conflict} has a route over podman's bridge subnet: "
                "published ports will time out (apt-get install -y slirp4netns, or "
                f"ip link delete {host.bridge_conflict})"
            )
    if host.rootless and lock is not None:
        uid = lock.runtime.uid
        # Your files in /workspace stay yours: the image's user is you on the host.
        out.add("--userns", f"keep-id:uid={uid},gid={uid}")


def _init(host: Host, engine: str, has_init: bool | None, out: _Argv) -> None:
    """An init as PID 1 where the image has none (or may have none): reaps DataLoader workers."""
    if has_init:
        return
    if engine == "docker" or host.podman_init:
        out.add("--init")
    elif host.host_init:
        out.add("--init", "--init-path", host.host_init)
    else:
        out.warn(
            "the image has no init and podman's (catatonit) is not installed: zombie processes of "
            "DataLoader workers will not be reaped (apt-get install -y catatonit)"
        )


def _gpus(host: Host, engine: str, out: _Argv) -> None:
    if not host.driver_version and not (engine == "docker" and host.docker_remote):
        # no kernel module, nothing to pass through: the container runs on the CPU, as the machine does
        out.note(
            "no NVIDIA driver on this machine (no /proc/driver/nvidia/version): the container gets no GPU"
        )
        return
    if engine == "podman":
        if host.cdi_gpu_specs:
            out.add("--device", "nvidia.com/gpu=all")
        else:
            out.warn(
                "no CDI spec names nvidia.com/gpu (looked in /etc/cdi, /var/run/cdi): the container "
                "gets no GPU. Make one: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml "
                "(package nvidia-container-toolkit)"
            )
    elif (
        host.nvidia_toolkit
        or host.docker_remote
        or (host.docker_daemon and host.docker_daemon.nvidia_runtime)
    ):
        out.add("--gpus", "all")
    else:  # the daemon refuses --gpus without it ('could not select device driver "" with capabilities: [[gpu]]')
        out.warn(
            "docker's --gpus needs the NVIDIA container toolkit, which is not installed here: the container "
            "gets no GPU (apt-get install -y nvidia-container-toolkit, from NVIDIA's apt repository; then "
            "nvidia-ctk runtime configure --runtime=docker)"
        )


def _service_note(svc: str, lock: Lockfile, addr: str, port: int) -> str:
    """Where a started service is reached from this host."""
    if svc == "jupyter":
        return f"Jupyter: http://{addr}:{port}/lab?token=<JUPYTER_TOKEN, or the token the container prints>"
    return f"SSH: ssh -p {port} {lock.runtime.user}@{addr}"


def start_lines(target: str, lock: Lockfile, *, image: str = "") -> list[str]:
    """How to start the image of ``lock`` (built as ``image``, default the lock's tag) with
    ``envspec run``: with its services, with a command, with its verifier. ``target``: the spec or
    lockfile the user named (what ``envspec run`` takes)."""
    import platform

    run = f"envspec run {shlex.quote(target)}" + (
        f" --image {shlex.quote(image)}" if image and image != lock.image_tag else ""
    )
    if (
        lock.platform.arch != platform.machine()
    ):  # another architecture's image: under emulation, when asked
        run += (
            f" --platform {lock.platform_names[0]} --emulate" if lock.meta.part_of else " --emulate"
        )
    services = _enabled_services(lock)
    if services:
        names = " and ".join("JupyterLab" if s == "jupyter" else "SSH" for s, _ in services)
        lines = [f"start it with {names}: {run}"]
        lines += [f"  {_service_note(s, lock, '127.0.0.1', p)}" for s, p in services]
    else:
        lines = [
            f"start a shell in it: {run}",
            "  (no services in this image: add [services.jupyter] or [services.ssh] to the spec for JupyterLab "
            "or SSH, docs/usage.md)",
        ]
    lines += [
        f"run a command: {run} -- python train.py",
        f"check this machine against the lock: {run} --no-mount -- envspec verify",
    ]
    return lines


def _ports(
    lock: Lockfile | None,
    bind: str,
    host_ports: dict[int, int],
    out: _Argv,
    *,
    started: bool = True,
) -> None:
    """The services' ports, on ``bind`` (loopback by default); ``host_ports`` is used up.
    ``started``: whether the entrypoint will start the services (not beside a command, unless
    ENVSPEC_SERVICES asks)."""
    services = _enabled_services(lock)
    if services and not started:
        names = ", ".join(s for s, _p in services)
        if host_ports:
            raise UsageError(
                f"--port maps a service's port, but beside a command the image starts no service "
                f"({names})",
                hint="set ENVSPEC_SERVICES=all (or some of: "
                + ",".join(s for s, _p in services)
                + ") to start them beside the command, "
                "or give no command",
                reference="bad-usage",
            )
        out.notes.append(
            f"the services ({names}) do not start beside a command; ENVSPEC_SERVICES=all in this "
            "environment starts them too (docs/usage.md)"
        )
        return
    for svc, port in services:
        hp = int(host_ports.pop(port, port))
        out.add("-p", f"{bind}:{hp}:{port}" if bind else f"{hp}:{port}")
        addr = bind if bind and bind != "0.0.0.0" else "127.0.0.1"
        if lock is not None:
            out.notes.append(_service_note(svc, lock, addr, hp))
    if host_ports:
        raise UsageError(
            f"no service of the image listens on port {', '.join(map(str, sorted(host_ports)))}",
            hint=("map a service's port: " + ", ".join(f"{p}" for _s, p in services))
            if services
            else "the image has no services",
            reference="bad-usage",
        )
    if bind and bind not in ("127.0.0.1", "::1", "localhost") and services:
        out.warn(
            f"services are published on {bind}, not loopback only: anyone who can reach this host "
            "can reach them (they still need the token or a key)"
        )


def _mount_cwd(host: Host, lock: Lockfile | None, out: _Argv) -> None:
    cwd = os.path.normpath(host.cwd)
    if cwd == "/":
        out.warn("the current directory is /: not mounting it on /workspace")
        return
    opts = ":z" if host.selinux else ""  # shared label: several containers may mount it
    out.add("-v", f"{cwd}:{WORKSPACE}{opts}")
    if lock is not None and not host.rootless and host.cwd_uid != lock.runtime.uid:
        uid = lock.runtime.uid
        out.warn(
            f"{cwd} belongs to uid {host.cwd_uid} on the host; the image's user is uid {uid}: "
            f"it can read but maybe not write /workspace (chown -R {uid}:{uid} the directory, "
            "or run rootless podman)"
        )

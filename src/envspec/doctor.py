"""``envspec doctor [LOCK]``: is this host ready to build and run the lock's image?

Each check returns ``Diagnosis``es: a status, what was found, and how to fix it. ``fail`` means
something blocks: building (buildah, skopeo, their storage, disk space) or running the lock's
image on this host's GPUs (a driver older than the lock's floor, GPUs the arch list cannot run,
GPUs with no way into containers). A host without a GPU is a fine build host: that is a
``warn`` for a GPU lock, ``info`` otherwise, and the exit status stays 0.

doctor reports what ``envspec.host.detect_host()`` found (a ``Host``) against the lock; it does
not look at the machine itself, so tests give it a ``Host`` they build. Nothing here prints.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from envspec.compat import best_arch, driver_branch, load_db
from envspec.errors import HostError
from envspec.host import (
    FROM_BUILDAH,
    FROM_DEFAULT,
    PUT_LAYER,
    UNLIMITED,
    DockerDaemon,
    Host,
    disk_free,
)
from envspec.lock import Lockfile

Status = Literal["ok", "warn", "fail", "info"]
UNPACK_FACTOR = 2.5  # wheels and debs are compressed; installed trees are ~2-3x larger
APT_BUILD = "apt-get install -y buildah skopeo podman runc"
TOOLKIT_FIX = (
    "install NVIDIA's container toolkit (apt-get install -y nvidia-container-toolkit, from NVIDIA's "
    "apt repository) and write the CDI spec: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"
)


@dataclass(frozen=True)
class Diagnosis:
    check: str  # short id: driver, gpus, toolkit, engine, runtime, buildah, storage, disk, skopeo, import, cgroup, rlimits
    status: Status
    what: str
    fix: str = ""
    detail: Mapping[str, object] = field(
        default_factory=dict
    )  # what --json says beside the message


# ---------------------------------------------------------------------------------------
# helpers


def _vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def _human(n: float) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _wants_gpu(lock: Lockfile | None) -> bool:
    return lock is not None and lock.wants_gpu


def _lock_name(lock: Lockfile | None) -> str:
    return (lock.meta.name if lock else "") or "the lock"


# ---------------------------------------------------------------------------------------
# checks


def check_driver(host: Host, lock: Lockfile | None) -> list[Diagnosis]:
    ver, where = host.driver_version, host.driver_source
    floor = lock.hardware.driver_floor if lock else ""
    policy = (lock.hardware.driver_policy if lock else "") or "compat"
    if not ver:
        if _wants_gpu(lock):
            return [
                Diagnosis(
                    "driver",
                    "warn",
                    f"no NVIDIA GPU driver on this host (no /proc/driver/nvidia/version, no nvidia-smi): it "
                    f"can build {_lock_name(lock)}'s image but cannot run its GPU code (needs driver >= "
                    f"{floor or '?'})",
                    fix="nothing to do on a build host; on a GPU host install NVIDIA's driver "
                    f"{'>= ' + floor if floor else ''} (apt-get install -y nvidia-driver, or cuda-drivers "
                    "from NVIDIA's repository)".replace("  ", " "),
                    detail={"driver": "", "floor": floor},
                )
            ]
        return [
            Diagnosis(
                "driver",
                "info",
                "no NVIDIA GPU driver on this host: fine for building images and for CPU work",
                detail={"driver": ""},
            )
        ]
    detail = {"driver": ver, "source": where, "floor": floor, "policy": policy}
    if floor and _vtuple(ver) < _vtuple(floor):
        fix = f"upgrade the NVIDIA driver to {floor} or newer"
        if policy == "strict":
            fix += '; or re-lock with driver_policy = "compat" if the lock\'s CUDA minor version allows an older driver'
        else:
            fix += (
                "; data-center GPUs can instead use CUDA forward compatibility (the cuda-compat package of the "
                f'lock\'s CUDA version), or re-lock with [target].driver = "{ver}" for an older torch build'
            )
        return [
            Diagnosis(
                "driver",
                "fail",
                f"NVIDIA driver {ver} is older than {_lock_name(lock)}'s floor {floor} "
                f"(policy {policy}): its CUDA libraries will not load",
                fix=fix,
                detail=detail,
            )
        ]
    if floor:
        return [
            Diagnosis(
                "driver",
                "ok",
                f"NVIDIA driver {ver} (>= the lock's floor {floor}, policy {policy})",
                detail=detail,
            )
        ]
    return [Diagnosis("driver", "ok" if lock else "info", f"NVIDIA driver {ver}", detail=detail)]


def check_driver_knows_gpus(host: Host) -> list[Diagnosis]:
    """The driver's branch against each GPU's first and last ones (the compat DB's gpus.toml, by
    nvidia-smi name, else by compute capability): a driver outside them cannot drive the GPU under
    any policy."""
    if not host.driver_version or not host.gpus:
        return []
    db = load_db()
    out: list[Diagnosis] = []
    for name, cc in sorted({(g.name, g.cc) for g in host.gpus}):
        gpu = db.find_gpu(name)
        if gpu is None or not gpu.min_driver:
            gpu = next((g for g in db.gpus if g.cc == cc and g.min_driver), None)
        if gpu is None or not gpu.min_driver:
            continue
        detail = {
            "name": name,
            "cc": cc,
            "driver": host.driver_version,
            "min_driver": gpu.min_driver,
            "source": gpu.min_driver_source,
        }
        if gpu.max_driver:
            detail.update(max_driver=gpu.max_driver, max_driver_source=gpu.max_driver_source)
        if gpu.driver_too_old(host.driver_version):
            out.append(
                Diagnosis(
                    "driver",
                    "fail",
                    f"NVIDIA driver {host.driver_version} cannot drive {name}: it needs driver branch "
                    f"R{gpu.min_driver} or newer, whatever the CUDA policy (from: {gpu.min_driver_source})",
                    fix=f"upgrade the NVIDIA driver to R{gpu.min_driver} or newer",
                    detail=detail,
                )
            )
        elif gpu.driver_too_new(host.driver_version):
            out.append(
                Diagnosis(
                    "driver",
                    "fail",
                    f"NVIDIA driver {host.driver_version} cannot drive {name}: R{gpu.max_driver} is the "
                    f"last driver branch for it (from: {gpu.max_driver_source})",
                    fix=f"install an R{gpu.max_driver} driver on this host, or move the job to newer GPUs",
                    detail=detail,
                )
            )
        else:
            last = f" and R{gpu.max_driver} or older" if gpu.max_driver else ""
            out.append(
                Diagnosis(
                    "driver",
                    "ok",
                    f"driver branch R{driver_branch(host.driver_version)} drives {name} "
                    f"(needs R{gpu.min_driver} or newer{last})",
                    detail=detail,
                )
            )
    return out


def check_gpus(host: Host, lock: Lockfile | None) -> list[Diagnosis]:
    if not host.which("nvidia-smi"):
        return []
    if host.gpu_error:
        return [
            Diagnosis(
                "gpus",
                "warn",
                f"nvidia-smi failed: {host.gpu_error}",
                fix="check the driver: nvidia-smi, dmesg | grep -i nvrm",
            )
        ]
    gpus = [(g.name, g.cc) for g in host.gpus]
    if not gpus:
        return [Diagnosis("gpus", "warn", "the driver is loaded but nvidia-smi lists no GPU")]
    arch_list = list(lock.hardware.arch_list) if lock else []
    out: list[Diagnosis] = []
    seen: set[tuple[str, str]] = set()
    for name, cc in gpus:
        if (name, cc) in seen:
            continue
        seen.add((name, cc))
        n = sum(1 for g in gpus if g == (name, cc))
        label = f"{n} x {name} (compute capability {cc or '?'})"
        if not arch_list or not cc or not _wants_gpu(lock):
            out.append(
                Diagnosis("gpus", "info", label, detail={"name": name, "cc": cc, "count": n})
            )
            continue
        arch = best_arch(cc, arch_list)
        if not arch:
            out.append(
                Diagnosis(
                    "gpus",
                    "fail",
                    f"{label}: the lock's torch has no kernels for it "
                    f"(arch list {', '.join(arch_list)})",
                    fix="add this GPU to [target].gpus and re-lock (envspec explain shows the "
                    "torch builds that cover it)",
                    detail={"name": name, "cc": cc},
                )
            )
        else:
            how = (
                "through PTX (JIT at first use: slow start)"
                if arch.startswith("compute_")
                else f"as {arch}"
            )
            out.append(
                Diagnosis(
                    "gpus",
                    "ok",
                    f"{label}: runs the lock's kernels {how}",
                    detail={"name": name, "cc": cc, "count": n, "arch": arch},
                )
            )
    return out


def check_toolkit(host: Host, lock: Lockfile | None) -> list[Diagnosis]:
    cdi = list(host.cdi_gpu_specs)
    ctk = host.nvidia_toolkit
    detail = {"cdi_specs": cdi, "toolkit": ctk}
    if not host.driver_version:
        if cdi or ctk:
            return [
                Diagnosis(
                    "toolkit",
                    "info",
                    "NVIDIA container toolkit present, but no driver",
                    detail=detail,
                )
            ]
        return [
            Diagnosis(
                "toolkit",
                "info",
                "no NVIDIA container toolkit or CDI spec: not needed on a host without GPUs",
                detail=detail,
            )
        ]
    if cdi:
        return [
            Diagnosis(
                "toolkit",
                "ok",
                f"CDI spec for nvidia.com/gpu: {', '.join(cdi)} (envspec run passes "
                "--device nvidia.com/gpu=all)",
                detail=detail,
            )
        ]
    if ctk:
        return [
            Diagnosis(
                "toolkit",
                "warn",
                "NVIDIA container toolkit installed but no CDI spec: podman containers "
                "get no GPU (docker's --gpus works)",
                fix="nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml",
                detail=detail,
            )
        ]
    status: Status = "fail" if _wants_gpu(lock) else "warn"
    return [
        Diagnosis(
            "toolkit",
            status,
            "GPUs are here but neither the NVIDIA container toolkit nor a CDI spec: "
            "containers cannot see them",
            fix=TOOLKIT_FIX,
            detail=detail,
        )
    ]


def check_engine(host: Host, lock: Lockfile | None = None) -> list[Diagnosis]:
    found = []
    podman = host.tools.get("podman")
    if podman:
        found.append(
            Diagnosis(
                "engine",
                "ok",
                (podman.version or "podman") + " (envspec run uses it)",
                detail={"engine": "podman", "version": podman.version},
            )
        )
    if host.docker == "daemon":
        found += _docker_daemon(host, lock, primary=not found)
    elif host.docker == "client":
        found.append(
            Diagnosis(
                "engine",
                "info",
                "a docker client without a daemon (no /var/run/docker.sock): "
                "not usable; envspec uses podman",
                detail={"engine": "docker-client"},
            )
        )
    elif host.docker == "podman":
        found.append(
            Diagnosis(
                "engine",
                "info",
                f"docker is podman's shim (podman-docker, {host.which('docker')}): "
                "that is podman, not a docker daemon",
                detail={"engine": "podman-docker"},
            )
        )
    if not any(f.status == "ok" for f in found):
        found.append(
            Diagnosis(
                "engine",
                "warn",
                "no container engine: images can be built (buildah) but not started here",
                fix="apt-get install -y podman runc",
            )
        )
    return found


def _docker_daemon(host: Host, lock: Lockfile | None, primary: bool) -> list[Diagnosis]:
    """A docker daemon socket is there: what ``docker info`` said about the daemon behind it."""
    d = host.docker_daemon
    if d is None:  # not asked: the socket alone
        return [
            Diagnosis(
                "engine",
                "ok" if primary else "info",
                "docker with a reachable daemon socket",
                detail={"engine": "docker"},
            )
        ]
    if not d.answered:
        return [
            Diagnosis(
                "engine",
                "warn",
                f"docker: a daemon socket is at {d.address} but `docker info` got no "
                f"answer: {d.error}",
                fix="start the daemon (systemctl start docker, or dockerd), or point DOCKER_HOST at one",
                detail={"engine": "docker", "address": d.address, "error": d.error},
            )
        ]
    detail = {
        "engine": "docker",
        "address": d.address,
        "version": d.version,
        "storage_driver": d.storage_driver,
        "cgroup_driver": d.cgroup_driver,
        "cgroup_version": d.cgroup_version,
        "runtimes": list(d.runtimes),
        "default_runtime": d.default_runtime,
        "root_dir": d.root_dir,
        "nvidia_runtime": d.nvidia_runtime,
    }
    out = [
        Diagnosis(
            "engine",
            "ok" if primary else "info",
            f"docker {d.version} at {d.address}: storage driver {d.storage_driver or '?'}, cgroup driver "
            f"{d.cgroup_driver or '?'} (cgroup v{d.cgroup_version or '?'}), runtimes "
            f"{', '.join(d.runtimes) or 'none'} (default {d.default_runtime or '?'})",
            detail=detail,
        )
    ]
    if d.storage_driver == "vfs":
        out.append(
            Diagnosis(
                "docker-storage",
                "warn",
                "docker stores images with vfs: every layer is a full copy "
                "(an envspec GPU image takes several times its size, and "
                "starts slowly)",
                fix="use overlay2 on a file system that supports it (dockerd --storage-driver overlay2)",
                detail=detail,
            )
        )
    if host.driver_version or _wants_gpu(lock):
        out.append(_docker_gpu(host, lock, d, detail))
    return out


def _docker_gpu(
    host: Host, lock: Lockfile | None, d: DockerDaemon, detail: dict[str, object]
) -> Diagnosis:
    """Whether ``docker run --gpus all`` works: through the daemon's nvidia runtime or the
    NVIDIA container toolkit; without either it blocks only where docker is the one engine
    that could run the lock's GPU code here."""
    if d.nvidia_runtime or host.nvidia_toolkit:
        how = (
            "the daemon's nvidia runtime"
            if d.nvidia_runtime
            else f"the NVIDIA toolkit ({host.nvidia_toolkit})"
        )
        return Diagnosis(
            "docker-gpu", "ok", f"docker --gpus all works through {how}", detail=detail
        )
    status: Status = (
        "fail" if host.driver_version and _wants_gpu(lock) and not host.which("podman") else "warn"
    )
    return Diagnosis(
        "docker-gpu",
        status,
        "docker has no nvidia runtime and the NVIDIA container toolkit "
        "is not installed: `docker run --gpus all` will fail",
        fix=TOOLKIT_FIX + "; then nvidia-ctk runtime configure --runtime=docker",
        detail=detail,
    )


def check_runtime(host: Host) -> list[Diagnosis]:
    if not host.which("podman"):
        return []
    cg = host.cgroup
    have = list(host.runtimes)
    detail = {"cgroup": cg, "runtimes": have, "runtime": host.runtime}
    if host.runtime_override:
        return [
            Diagnosis(
                "runtime",
                "info",
                f"{host.runtime_override} (ENVSPEC_RUNTIME; envspec run passes "
                f"--runtime {host.runtime_override}); cgroup {cg}",
                detail=detail,
            )
        ]
    if cg != "v2":
        if host.runtime == "runc":
            return [
                Diagnosis(
                    "runtime",
                    "ok",
                    f"runc (cgroup {cg}: envspec run passes --runtime runc, as crun "
                    "refuses v1 and hybrid hierarchies)",
                    detail=detail,
                )
            ]
        return [
            Diagnosis(
                "runtime",
                "warn",
                f"cgroup {cg} with {', '.join(have) or 'no OCI runtime'}: crun refuses "
                "this hierarchy, so podman cannot start containers",
                fix="apt-get install -y runc",
                detail=detail,
            )
        ]
    if have:
        return [Diagnosis("runtime", "ok", f"{' and '.join(have)} on cgroup v2", detail=detail)]
    return [
        Diagnosis(
            "runtime",
            "warn",
            "no OCI runtime (crun or runc): podman cannot start containers",
            fix="apt-get install -y crun",
            detail=detail,
        )
    ]


def check_network(host: Host) -> list[Diagnosis]:
    """podman's bridge subnet shadowed by another interface's route (buildah's CNI bridge)."""
    if not host.which("podman"):
        return []
    bridge, subnet, other = host.bridge, host.bridge_subnet, host.bridge_conflict
    if not other:
        return [
            Diagnosis("network", "ok", f"no route shadows podman's bridge ({bridge}, {subnet})")
        ]
    fallback = (
        "envspec run uses --network slirp4netns instead"
        if host.which("slirp4netns")
        else "apt-get install -y slirp4netns to let envspec run work around it"
    )
    return [
        Diagnosis(
            "network",
            "warn",
            f"{other} has a route over podman's bridge subnet {subnet} (left by "
            f"buildah's CNI networking): bridged containers' ports time out; {fallback}",
            fix=f"ip link delete {other} (when no buildah container is running)",
            detail={"interface": other, "bridge": bridge},
        )
    ]


def check_build_tools(host: Host) -> list[Diagnosis]:
    out = []
    for name in ("buildah", "skopeo"):
        tool = host.tools.get(name)
        if tool is None:
            out.append(
                Diagnosis(name, "fail", f"{name} not found: envspec build needs it", fix=APT_BUILD)
            )
            continue
        out.append(
            Diagnosis(
                name,
                "fail" if tool.error else "ok",
                tool.version or f"{name}: {tool.error}",
                fix=f"reinstall: apt-get install --reinstall -y {name}" if tool.error else "",
            )
        )
    put, cs = host.put_layer, host.which("containers-storage")
    if cs and put:
        out.append(
            Diagnosis(
                "import",
                "ok",
                f"containers-storage and {put} found: envspec build imports layers "
                "beside the layer makers, each untarred once",
                detail={"put_layer": put},
            )
        )
    elif cs:
        out.append(
            Diagnosis(
                "import",
                "warn",
                f"{PUT_LAYER} not found: envspec build imports with "
                "containers-storage alone, which hashes every layer twice more "
                "(cold builds up to twice as slow, docs/build.md)",
                fix="scripts/dev.sh setup (compiles it; needs golang-go and "
                "golang-github-containers-storage-dev), or set ENVSPEC_PUT_LAYER to its path",
            )
        )
    else:
        out.append(
            Diagnosis(
                "import",
                "warn",
                "containers-storage not found: envspec build imports with skopeo, "
                "which copies every layer once more (docs/build.md)",
                fix="apt-get install -y containers-storage",
            )
        )
    return out


def check_storage(host: Host) -> list[Diagnosis]:
    if not host.which("buildah"):
        return []
    st = host.storage
    detail = {"root": st.root, "driver": st.driver, "from": st.source}
    if st.source == FROM_BUILDAH and st.driver == "vfs":
        return [
            Diagnosis(
                "storage",
                "warn",
                f"containers-storage at {st.root} uses vfs: every layer is a full copy "
                "(slow, and disk-hungry)",
                fix='use overlay: apt-get install -y fuse-overlayfs, or set driver = "overlay" in '
                "/etc/containers/storage.conf",
                detail=detail,
            )
        ]
    if st.source == FROM_DEFAULT:
        return [
            Diagnosis(
                "storage",
                "warn",
                f"`buildah info` failed; assuming containers-storage at {st.root}",
                fix="run `buildah info` to see why",
                detail=detail,
            )
        ]
    return [
        Diagnosis(
            "storage",
            "ok",
            f"containers-storage: {st.driver or 'default driver'} at {st.root} ({st.source})",
            detail=detail,
        )
    ]


def check_disk(host: Host, lock: Lockfile | None) -> list[Diagnosis]:
    root, cache = host.storage.root, str(host.cache_dir)
    fs_store, fs_cache = host.storage_free, host.cache_free
    if fs_store is None:
        return [Diagnosis("disk", "warn", f"cannot tell the free space at {root}")]
    if lock is None:
        return [
            Diagnosis(
                "disk",
                "info",
                f"{_human(fs_store.free)} free for containers-storage ({root})",
                detail={"free": fs_store.free, "root": root},
            )
        ]
    packed, unpacked, unknown = _first_build(lock)
    # The build keeps the downloads and the layer tars in its cache, then copies the layers into
    # containers-storage: compressed + unpacked in the cache, unpacked again in the storage.
    need_cache, need_store = packed + unpacked, unpacked
    in_cache, in_store = _first_build_words(packed, unpacked)
    if fs_cache is not None and fs_cache.device == fs_store.device:
        checks = [
            (
                root + f" and the cache {cache}",
                fs_store.free,
                need_cache + need_store,
                f"{in_cache}, {in_store}",
            )
        ]
    else:
        checks = [(root, fs_store.free, need_store, in_store)]
        if fs_cache is not None:
            checks.append((f"the cache {cache}", fs_cache.free, need_cache, in_cache))
    note = f"; {unknown} package sizes unknown to the lock: more may be needed" if unknown else ""
    return [
        _disk_room(lock.meta.name, where, free, need, parts, packed, unknown, note)
        for where, free, need, parts in checks
    ]


def _disk_room(
    name: str,
    where: str,
    free: int,
    need: float,
    parts: str,
    packed: int,
    unknown: int,
    note: str,
) -> Diagnosis:
    """Whether ``free`` bytes at ``where`` hold a first build's ``need`` (``parts``: what goes there)."""
    detail = {
        "where": where,
        "free": free,
        "need": int(need),
        "packages": packed,
        "unknown_sizes": unknown,
    }
    msg = (
        f"{_human(free)} free for {where}; a first build of {name}'s image needs about "
        f"{_human(need)} there: {parts} (packages unpack to ~{UNPACK_FACTOR}x; what the cache holds "
        f"already is not written again){note}"
    )
    if free < need:
        return Diagnosis(
            "disk",
            "fail",
            msg,
            fix=f"free {_human(need - free)} or point ENVSPEC_CACHE / "
            "ENVSPEC_STORAGE_ROOT at a larger disk",
            detail=detail,
        )
    if free < need * 1.25:
        return Diagnosis("disk", "warn", msg + ": little room left", detail=detail)
    return Diagnosis("disk", "ok", msg, detail=detail)


def _first_build(lock: Lockfile) -> tuple[int, float, int]:
    """What a first build of the lock's image writes: the packages' bytes (downloads), their
    estimated bytes unpacked (a layer tar in the cache, the same again in containers-storage), and
    how many packages the lock gives no size for."""
    sizes = [w.size for w in lock.wheels] + (
        [p.size for p in lock.debian.packages] if lock.debian else []
    )
    packed = sum(sizes)
    return packed, packed * UNPACK_FACTOR, sum(1 for s in sizes if s == 0)


def _first_build_words(packed: float, unpacked: float) -> tuple[str, str]:
    """The cache's part and containers-storage's part of a first build, in words."""
    return (
        f"{_human(packed)} of package downloads and ~{_human(unpacked)} of layer tars in the cache",
        f"~{_human(unpacked)} of unpacked image in containers-storage",
    )


def is_disk_full(err: BaseException) -> bool:
    """The error is the disk running out (ENOSPC), raised here or said by a tool it ran."""
    import errno

    if isinstance(err, OSError) and err.errno == errno.ENOSPC:
        return True
    text = f"{getattr(err, 'message', '')} {getattr(err, 'stderr_tail', '')} {err}".lower()
    return "no space left on device" in text


def disk_full_error(err: BaseException, host: Host, lock: Lockfile) -> HostError:
    """A build that ran out of disk, said as which of its directories (containers-storage, the
    cache, the temporary folder) is full, how much each has free now, and what the build needs;
    ``is_disk_full(err)`` must hold."""
    import tempfile

    places = [
        (
            "containers-storage",
            host.storage.root or "/var/lib/containers/storage",
            "`podman image prune` or "
            "`podman rmi` of images no longer used; ENVSPEC_STORAGE_ROOT moves it",
        ),
        ("the cache", str(host.cache_dir), "`envspec cache gc`; ENVSPEC_CACHE moves it"),
        (
            "the temporary folder",
            tempfile.gettempdir(),
            "remove what is left there; TMPDIR moves it",
        ),
    ]
    free = {path: (f.free if (f := disk_free(Path("/"), path)) else 0) for _, path, _ in places}
    text = f"{getattr(err, 'filename', '') or ''} {getattr(err, 'message', '')} {getattr(err, 'stderr_tail', '')} {err}"
    named = [
        pl for pl in places if pl[1] and pl[1] in text
    ]  # the path the error names, else the fullest
    full = (
        max(named, key=lambda pl: len(pl[1])) if named else min(places, key=lambda pl: free[pl[1]])
    )
    packed, unpacked, _unknown = _first_build(lock)
    need_words = (
        f"a first build of {lock.meta.name}'s image needs about {_human(packed + 2 * unpacked)}: "
        + ", ".join(_first_build_words(packed, unpacked))
    )
    rows = "\n".join(
        f"  {what:<21} {path:<40} {_human(free[path])} free"
        + ("  <- full" if (what, path) == full[:2] else "")
        for what, path, _ in places
    )
    return HostError(
        f"the disk ran out while building: no space left on device in {full[0]} ({full[1]}, "
        f"{_human(free[full[1]])} free now); {need_words}\n{rows}",
        hint=f"free space in {full[0]}: {full[2]}; `envspec doctor LOCK` checks the space before a build",
        reference="disk-full",
    )


def check_arch(host: Host, lock: Lockfile | None) -> list[Diagnosis]:
    """The host's CPU architecture, whether the other one runs here under emulation, and whether
    the lock's image starts here. An arm64 image is built on amd64 without emulation, so only
    running it needs qemu-user-static."""
    others = [a for a in ("x86_64", "aarch64") if a != host.machine]
    emu = [a for a in others if a in host.binfmt]
    what = f"linux-{host.machine}" + (
        f"; runs linux-{', linux-'.join(emu)} images under emulation (qemu-user-static, "
        "binfmt_misc)"
        if emu
        else f"; no emulation for linux-{', linux-'.join(others)}"
    )
    detail = {"machine": host.machine, "emulation": list(emu)}
    if lock is None or lock.platform.arch == host.machine:
        return [Diagnosis("arch", "info", what, fix="" if emu else host.binfmt_note, detail=detail)]
    if host.runs_arch(lock.platform.arch):
        return [
            Diagnosis(
                "arch",
                "warn",
                f"{what}: the lock's linux-{lock.platform.arch} image runs here under "
                "emulation only (slow, no GPUs)",
                detail=detail,
            )
        ]
    return [
        Diagnosis(
            "arch",
            "fail",
            f"{what}: the lock's linux-{lock.platform.arch} image cannot start here "
            "(it builds here all the same)",
            fix=host.binfmt_note or "apt-get install -y qemu-user-static binfmt-support",
            detail=detail,
        )
    ]


def check_cgroup(host: Host) -> list[Diagnosis]:
    cg = host.cgroup
    what = {
        "v2": "cgroup v2 (unified)",
        "hybrid": "cgroup v1 controllers with a v2 mount (hybrid)",
        "v1": "cgroup v1",
    }[cg]
    return [
        Diagnosis(
            "cgroup",
            "info",
            f"{what}; kernel {host.kernel or '?'}"
            + ("" if host.overlay else "; no overlay file system"),
            detail={"cgroup": cg, "kernel": host.kernel, "overlay": host.overlay},
        )
    ]


def _limit(name: str, v: int) -> str:
    if v == UNLIMITED:
        return "unlimited"
    return _human(v) if name in ("memlock", "stack", "data", "fsize", "as") else str(v)


def check_rlimits(host: Host, lock: Lockfile | None) -> list[Diagnosis]:
    can_raise = host.euid == 0 and host.cap_sys_resource
    wanted = dict(lock.runtime.ulimits) if lock else {}
    names = sorted(set(wanted) | {"nofile", "nproc"})
    hard = {n: host.hard(n) for n in names}
    shown = ", ".join(f"{n} {_limit(n, h)}" for n, h in hard.items())
    if can_raise:
        return [
            Diagnosis(
                "rlimits",
                "info",
                f"hard limits: {shown}; podman may raise them",
                detail={"hard": hard},
            )
        ]
    pid_max = host.pid_max
    extra = ""
    if pid_max and (hard["nproc"] == UNLIMITED or hard["nproc"] > pid_max):
        extra = f" (nproc at most pid_max {pid_max}: podman lowers its own limit to it)"
    out = [
        Diagnosis(
            "rlimits",
            "info",
            f"hard limits: {shown}; podman cannot raise them here (no CAP_SYS_RESOURCE "
            f"or rootless): envspec run passes --ulimit values within them{extra}",
            detail={"hard": hard, "pid_max": pid_max},
        )
    ]
    for n, v in sorted(wanted.items()):
        h = hard.get(n, UNLIMITED)
        if h != UNLIMITED and (v == UNLIMITED or v > h):
            out.append(
                Diagnosis(
                    "rlimits",
                    "warn",
                    f"the lock asks {n} {_limit(n, v)}; this host's hard limit is "
                    f"{_limit(n, h)}: containers get {_limit(n, h)}",
                    fix=f"raise the hard limit (e.g. /etc/security/limits.conf: * hard {n} unlimited, or "
                    f"LimitMEMLOCK=/LimitNOFILE= in the service that starts your shell)",
                    detail={"name": n, "wanted": v, "hard": h},
                )
            )
    return out


def check_rootless(host: Host) -> list[Diagnosis]:
    if not host.rootless:
        return []
    user = host.user
    if user and not host.subuid:
        return [
            Diagnosis(
                "rootless",
                "warn",
                f"rootless: no /etc/subuid range for {user}: podman can map one uid only",
                fix=f"usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user}",
            )
        ]
    if not host.which("newuidmap"):
        return [
            Diagnosis(
                "rootless", "warn", "rootless without newuidmap", fix="apt-get install -y uidmap"
            )
        ]
    return [Diagnosis("rootless", "ok", f"rootless as {user or host.euid} with a subuid range")]


def run_doctor(host: Host, lock: Lockfile | None = None) -> list[Diagnosis]:
    """Check ``host`` (what ``detect_host()`` found) against ``lock`` (or no lock)."""
    out: list[Diagnosis] = []
    out += check_driver(host, lock)
    out += check_driver_knows_gpus(host)
    if host.driver_version:
        out += check_gpus(host, lock)
    out += check_toolkit(host, lock)
    out += check_engine(host, lock)
    out += check_runtime(host)
    out += check_network(host)
    out += check_build_tools(host)
    out += check_storage(host)
    out += check_disk(host, lock)
    out += check_cgroup(host)
    out += check_arch(host, lock)
    out += check_rlimits(host, lock)
    out += check_rootless(host)
    return out


# ---------------------------------------------------------------------------------------
# words


def doctor_exit_code(diagnoses: Sequence[Diagnosis]) -> int:
    """1 when something blocks (a ``fail``), else 0."""
    return 1 if any(d.status == "fail" for d in diagnoses) else 0


def doctor_lines(diagnoses: Sequence[Diagnosis]) -> list[str]:
    lines = []
    for d in diagnoses:
        lines.append(f"{d.status:<5} {d.check:<9} {d.what}")
        if d.fix and d.status in ("fail", "warn"):
            lines.append(f"{'':<16}fix: {d.fix}")
    n = {s: sum(1 for d in diagnoses if d.status == s) for s in ("fail", "warn")}
    if n["fail"]:
        lines.append(
            f"{n['fail']} problem{'s' if n['fail'] != 1 else ''} block{'s' if n['fail'] == 1 else ''} "
            f"this host (see fix lines above)"
        )
    elif n["warn"]:
        lines.append(f"nothing blocks building; {n['warn']} warning{'s' if n['warn'] != 1 else ''}")
    else:
        lines.append("all good")
    return lines


def doctor_json(diagnoses: Sequence[Diagnosis]) -> dict[str, object]:
    """The JSON ``--json`` prints (its key stays ``findings``: scripts read it)."""
    return {"exit_code": doctor_exit_code(diagnoses), "findings": [asdict(d) for d in diagnoses]}

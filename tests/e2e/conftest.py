"""Shared by the end-to-end tests: a private container storage root, torn down whole."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path


@contextlib.contextmanager
def private_storage(root: Path):
    """Point envspec (ENVSPEC_STORAGE_ROOT) at ``root`` for the block; afterwards remove every
    image, container and mount under it, so a used machine and a fresh one behave alike."""
    from envspec.host import ASK_STORAGE, detect_host

    old = os.environ.get("ENVSPEC_STORAGE_ROOT")
    os.environ["ENVSPEC_STORAGE_ROOT"] = str(root)
    host = detect_host(ask=ASK_STORAGE)
    try:
        yield host
    finally:
        subprocess.run(["podman", *host.storage.args(), "system", "reset", "--force"],
                       capture_output=True, check=False)
        # the overlay driver keeps <root>/overlay bind-mounted on itself after the last user
        mounts = [ln.split()[1] for ln in Path("/proc/self/mounts").read_text().splitlines()]
        for m in sorted((m for m in mounts if m.startswith((str(root), host.storage.runroot))), reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(host.storage.runroot, ignore_errors=True)
        if old is None:
            os.environ.pop("ENVSPEC_STORAGE_ROOT", None)
        else:
            os.environ["ENVSPEC_STORAGE_ROOT"] = old


# --- docker: Debian's dockerd, started by a test on its own -------------------------------------

class Dockerd:
    """A dockerd of our own: its data root, exec root, socket and bridge under one short temp
    directory (a unix socket path must fit in 108 bytes), reached through ``env`` (DOCKER_HOST)."""

    def __init__(self, base: Path, address: str, bridge: str, args: list[str], proc: subprocess.Popen) -> None:
        self.base, self.address, self.bridge, self.args, self.proc = base, address, bridge, args, proc

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.address}

    def docker(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        cp = subprocess.run(["docker", *args], capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and cp.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} failed ({cp.returncode}):\n{cp.stdout}\n{cp.stderr}")
        return cp

    def log(self) -> str:
        return (self.base / "dockerd.log").read_text(errors="replace")


def dockerd_args(base: Path, host, bridge: str) -> list[str]:
    """dockerd's options on this host, from the same facts envspec's ``Host`` gives podman:
    - storage: overlay2 where the kernel has overlay and ``base`` is not itself on overlayfs
      (overlay on overlay fails), else vfs: the rule ``host._storage`` applies to ENVSPEC_STORAGE_ROOT;
    - cgroups: ``Host.cgroup_manager`` (cgroupfs without systemd as PID 1, as on this project's hosts);
    - runtime: runc (``Host.runtime``: crun rejects the hybrid hierarchy; Debian's dockerd uses runc anyway);
    - network: our own bridge (``bridge``: two test daemons on one machine would fight over docker0),
      no iptables/NAT/forwarding (published ports go through docker-proxy on loopback; a test must not
      change the host's firewall)."""
    from envspec.host import storage_driver_for

    overlay = storage_driver_for(base, host.overlay) == "overlay"
    return ["--data-root", str(base / "data"), "--exec-root", str(base / "exec"), "--pidfile", str(base / "d.pid"),
            "--host", f"unix://{base}/d.sock", "--storage-driver", "overlay2" if overlay else "vfs",
            "--exec-opt", f"native.cgroupdriver={host.cgroup_manager}", "--default-runtime", "runc",
            "--bridge", bridge, "--iptables=false", "--ip-masq=false", "--ip-forward=false"]


@contextlib.contextmanager
def start_dockerd(subnet: str = "172.29.0.1/24"):
    """Start Debian's dockerd for the block and stop it after, removing its bridge and files."""
    import tempfile
    import time

    from envspec.host import ASK_NONE, detect_host

    host = detect_host(ask=ASK_NONE)
    base = Path(tempfile.mkdtemp(prefix="esd-", dir="/tmp"))
    bridge = "esd" + base.name[4:12].replace("_", "")
    for argv in (["ip", "link", "add", bridge, "type", "bridge"], ["ip", "addr", "add", subnet, "dev", bridge],
                 ["ip", "link", "set", bridge, "up"]):
        subprocess.run(argv, check=True, capture_output=True)
    args = dockerd_args(base, host, bridge)
    log = (base / "dockerd.log").open("w")
    proc = subprocess.Popen(["dockerd", *args], stdout=log, stderr=subprocess.STDOUT)
    d = Dockerd(base, f"unix://{base}/d.sock", bridge, args, proc)
    try:
        end = time.monotonic() + 60
        while d.docker("version", check=False, timeout=20).returncode != 0:
            if proc.poll() is not None or time.monotonic() > end:
                raise AssertionError(f"dockerd {' '.join(args)} did not start:\n{d.log()[-3000:]}")
            time.sleep(0.5)
        yield d
    finally:
        cp = d.docker("ps", "-aq", check=False)
        if cp.stdout.split():
            d.docker("rm", "-f", *cp.stdout.split(), check=False)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        subprocess.run(["ip", "link", "delete", bridge], capture_output=True, check=False)
        mounts = [ln.split()[1] for ln in Path("/proc/self/mounts").read_text().splitlines()]
        for m in sorted((m for m in mounts if m.startswith(str(base))), reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True, check=False)
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def start_registry(base: Path):
    """Debian's docker-registry on a free loopback port; yields "127.0.0.1:PORT"."""
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = base / "registry.yml"
    cfg.write_text("version: 0.1\nlog:\n  level: error\n"
                   f"storage:\n  filesystem:\n    rootdirectory: {base / 'registry-data'}\n"
                   f"http:\n  addr: 127.0.0.1:{port}\n")
    proc = subprocess.Popen(["docker-registry", "serve", str(cfg)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > end:
                    raise AssertionError("docker-registry did not start") from None
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)

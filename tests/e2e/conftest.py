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
        subprocess.run(
            ["podman", *host.storage.args(), "system", "reset", "--force"],
            capture_output=True,
            check=False,
        )
        # the overlay driver keeps <root>/overlay bind-mounted on itself after the last user
        mounts = [ln.split()[1] for ln in Path("/proc/self/mounts").read_text().splitlines()]
        for m in sorted(
            (m for m in mounts if m.startswith((str(root), host.storage.runroot))), reverse=True
        ):
            subprocess.run(["umount", "-l", m], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(host.storage.runroot, ignore_errors=True)
        if old is None:
            os.environ.pop("ENVSPEC_STORAGE_ROOT", None)
        else:
            os.environ["ENVSPEC_STORAGE_ROOT"] = old


@contextlib.contextmanager
def loop_fs(img: Path, mnt: Path, mkfs: list[str], size: str, *, direct_io: bool = False):
    """A new file system of its own (``mkfs``: e.g. ``["mkfs.ext4", "-q", "-F"]``) on the sparse
    file ``img`` of ``size``, loop-mounted on ``mnt`` (made) for the block (root only); unmounted,
    detached and the file removed afterwards. ``direct_io``: the loop device reads and writes the
    file past the page cache (its pages are not cached twice)."""
    mnt.mkdir(exist_ok=True)
    subprocess.run(["truncate", "-s", size, str(img)], check=True)
    try:
        subprocess.run([*mkfs, str(img)], check=True)
        dev = subprocess.run(
            ["losetup", *(["--direct-io=on"] if direct_io else []), "-f", "--show", str(img)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        try:
            subprocess.run(["mount", dev, str(mnt)], check=True)
            try:
                yield mnt
            finally:
                subprocess.run(["umount", "-l", str(mnt)], check=False)
        finally:
            subprocess.run(["losetup", "-d", dev], check=False)
    finally:
        img.unlink(missing_ok=True)


# --- docker: Debian's dockerd, started by a test on its own -------------------------------------


class Dockerd:
    """A dockerd of our own: its data root, exec root, socket and bridge under one short temp
    directory (a unix socket path must fit in 108 bytes), reached through ``env`` (DOCKER_HOST)."""

    def __init__(
        self, base: Path, address: str, bridge: str, args: list[str], proc: subprocess.Popen
    ) -> None:
        self.base, self.address, self.bridge, self.args, self.proc = (
            base,
            address,
            bridge,
            args,
            proc,
        )

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.address}

    def docker(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        cp = subprocess.run(
            ["docker", *args], capture_output=True, text=True, env=self.env, timeout=timeout
        )
        if check and cp.returncode != 0:
            raise AssertionError(
                f"docker {' '.join(args)} failed ({cp.returncode}):\n{cp.stdout}\n{cp.stderr}"
            )
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
    return [
        "--data-root",
        str(base / "data"),
        "--exec-root",
        str(base / "exec"),
        "--pidfile",
        str(base / "d.pid"),
        "--host",
        f"unix://{base}/d.sock",
        "--storage-driver",
        "overlay2" if overlay else "vfs",
        "--exec-opt",
        f"native.cgroupdriver={host.cgroup_manager}",
        "--default-runtime",
        "runc",
        "--bridge",
        bridge,
        "--iptables=false",
        "--ip-masq=false",
        "--ip-forward=false",
    ]


@contextlib.contextmanager
def start_dockerd(subnet: str = "172.29.0.1/24"):
    """Start Debian's dockerd for the block and stop it after, removing its bridge and files."""
    import tempfile
    import time

    from envspec.host import ASK_NONE, detect_host

    host = detect_host(ask=ASK_NONE)
    base = Path(tempfile.mkdtemp(prefix="esd-", dir="/tmp"))
    bridge = "esd" + base.name[4:12].replace("_", "")
    for argv in (
        ["ip", "link", "add", bridge, "type", "bridge"],
        ["ip", "addr", "add", subnet, "dev", bridge],
        ["ip", "link", "set", bridge, "up"],
    ):
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
def start_registry(base: Path, proxy_of: str = ""):
    """Debian's docker-registry on a free loopback port; yields "127.0.0.1:PORT". ``proxy_of``
    ("HOST:PORT", plain HTTP): a pull-through mirror of that registry (``proxy.remoteurl``)."""
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = base / "registry.yml"
    cfg.write_text(
        "version: 0.1\nlog:\n  level: error\n"
        f"storage:\n  filesystem:\n    rootdirectory: {base / 'registry-data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
        + (f"proxy:\n  remoteurl: http://{proxy_of}\n" if proxy_of else "")
    )
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
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


# --- Slurm: Debian's munged, slurmctld and slurmd on loopback -----------------------------------

SLURM_CONF = """\
# Written by tests/e2e/conftest.py: a throw-away cluster on loopback, everything under {base}.
ClusterName=envspec-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={base}/munge.sock
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool/%n
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd-%n.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd-%n.log
# no cgroup plugins: this project's hosts have a hybrid hierarchy and no systemd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
{nodes}
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class Slurm:
    """A running test cluster: ``env`` carries SLURM_CONF for sbatch, srun, scontrol."""

    def __init__(self, base: Path, nodes: list[str]) -> None:
        self.base, self.nodes = base, nodes

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.base / "slurm.conf")}

    def logs(self) -> str:
        return "\n".join(
            f"== {p.name}\n{p.read_text(errors='replace')[-2000:]}"
            for p in sorted((self.base / "log").glob("*.log"))
        )


def _free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@contextlib.contextmanager
def start_slurm(nodes: int = 2):
    """munged (its own key and socket), slurmctld and one slurmd per node name, all on this host
    (Debian's slurmd runs several on one host when each node has its own port), in the
    foreground under this process; stopped and removed after the block."""
    import tempfile
    import time

    base = Path(tempfile.mkdtemp(prefix="ess-", dir="/tmp"))  # short: the munge socket path
    base.chmod(0o755)  # munged wants its socket's directory reachable by everyone
    for d in ("state", "spool", "log"):
        (base / d).mkdir()
    key = base / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    ctld_port, *node_ports = _free_ports(1 + nodes)
    names = [f"node{i + 1}" for i in range(nodes)]
    lines = [
        f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={p} CPUs=1"
        for n, p in zip(names, node_ports)
    ]
    (base / "slurm.conf").write_text(
        SLURM_CONF.format(base=base, ctld_port=ctld_port, nodes="\n".join(lines))
    )
    cluster = Slurm(base, names)
    procs: list[subprocess.Popen] = []

    def daemon(*argv: str) -> None:
        procs.append(
            subprocess.Popen(
                list(argv),
                env=cluster.env,
                stdout=subprocess.DEVNULL,
                stderr=(base / "log" / f"{argv[0]}-{len(procs)}.err").open("w"),
            )
        )

    try:
        daemon(
            "munged",
            "-F",
            "-f",
            f"--socket={base}/munge.sock",
            f"--key-file={key}",
            f"--log-file={base}/log/munged.log",
            f"--pid-file={base}/munged.pid",
            f"--seed-file={base}/munged.seed",
        )
        end = time.monotonic() + 20
        while not (base / "munge.sock").exists():
            if time.monotonic() > end:
                raise AssertionError(f"munged did not start:\n{cluster.logs()}")
            time.sleep(0.1)
        daemon("slurmctld", "-D", "-i")
        for n in names:
            daemon("slurmd", "-D", "-N", n)
        end = time.monotonic() + 60
        while True:
            cp = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N %t"],
                capture_output=True,
                text=True,
                env=cluster.env,
                timeout=20,
            )
            states = dict(ln.split() for ln in cp.stdout.splitlines() if len(ln.split()) == 2)
            if sorted(states) == names and all(s == "idle" for s in states.values()):
                break
            if time.monotonic() > end or any(p.poll() is not None for p in procs):
                raise AssertionError(
                    f"the test cluster did not come up ({cp.stdout}{cp.stderr}):\n{cluster.logs()}"
                )
            time.sleep(0.5)
        yield cluster
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(base, ignore_errors=True)


def lying_entry_facts(entry: dict, diff_id: str):
    """The facts of a pushed registry cache entry (``entry``: as ``build --json`` reports it,
    zstd), but claiming ``diff_id``: an entry whose blob does not decompress to what it says."""
    from envspec.image.compress import Compression
    from envspec.registry.regcache import EntryFacts

    return EntryFacts(
        key=entry["key"],
        group=entry["group"],
        comp_id=Compression("zstd").id,
        media_type=entry["media_type"],
        digest=entry["digest"],
        size=entry["size"],
        diff_id=diff_id,
        diff_size=entry["diff_size"],
        record=None,
    )


def cpu_torch_links(folder: Path) -> Path:
    """A find-links folder as a CI machine's pip configuration names one: a torch 2.13.0+cpu wheel
    (its metadata only), which PEP 440's torch==2.13.0 matches (issue 57). The tests that set pip
    up with it make their own, so what this machine's configuration holds plays no part."""
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(
            "torch-2.13.0+cpu.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n",
        )
    return folder


def in_image(ref: str, entrypoint: str, args: list[str], *, timeout: int = 300):
    """``entrypoint args`` in a fresh container of ``ref``, past the image's entrypoint (no
    services, no start-up check), with the host quirks ``envspec run`` handles (runtime, ulimits)."""
    from dataclasses import replace

    from envspec.host import ASK_NONE, detect_host
    from envspec.run import Runnable, RunOptions, plan_run

    command = plan_run(
        Runnable(ref, None),
        host=replace(detect_host(ask=ASK_NONE), tty=False),
        options=RunOptions(mount_cwd=False, gpus=False),
    )
    i = command.argv.index(ref)
    argv = command.argv[:i] + ["--entrypoint", entrypoint] + command.argv[i:] + args
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def out_of_reach(lock_path: Path) -> str | None:
    """Why a build of ``lock_path`` cannot fetch each of its wheels here, or None: a wheel whose
    index this machine does not reach, and which no mirror envspec is set up with (ENVSPEC_MIRRORS,
    pip's configuration) serves by its filename (``WheelFetcher.candidates``, mirrors only).
    lockfiles/cpu.lock's torch is PyTorch's CPU build from download.pytorch.org; where that host is
    out of reach, a mirror must hold the very file (its sha256 is checked as it is fetched). A test
    that builds such a lock skips with this reason, rather than pass or fail by what the machine's
    mirrors happen to hold (issue 57, 8)."""
    import tempfile

    from envspec import lock as lockmod
    from envspec import sources
    from envspec.cache.store import Cache
    from envspec.wheels.fetch import WheelFetcher

    wheels = lockmod.load(lock_path).wheels
    reached = {i: sources.reachable(i) for i in {w.index for w in wheels}}
    with tempfile.TemporaryDirectory() as tmp:
        mirrors = WheelFetcher(Cache(tmp), sources.discover().mirrors, allow_canonical=False)
        missing = [
            w for w in wheels if not reached[w.index] and next(mirrors.candidates(w), None) is None
        ]
    if not missing:
        return None
    return (
        f"{lock_path.name}: {', '.join(w.filename for w in missing[:3])} can be fetched neither "
        f"from {missing[0].index} (unreachable here) nor from a mirror envspec is set up with; "
        "name a folder that holds them in ENVSPEC_MIRRORS to run this test"
    )

"""envspec.host: the facts of a host, read from a fake /proc, /sys, /etc and /run tree, a fake
PATH and a fake command runner; and once from this real host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envspec.host import (
    ASK_ALL,
    ASK_DOCKER,
    ASK_NONE,
    FROM_BUILDAH,
    FROM_DEFAULT,
    FROM_ENV,
    UNLIMITED,
    Host,
    HostGpu,
    Storage,
    cache_dir_for,
    detect_host,
)
from envspec.run import plan_run, podman_args

LIMITS = """Limit                     Soft Limit           Hard Limit           Units
Max cpu time              unlimited            unlimited            seconds
Max stack size            8388608              unlimited            bytes
Max processes             96363                96365                processes
Max open files            1024                 20000                files
Max locked memory         8388608              8388608              bytes
Max realtime priority     0                    0
"""
ROUTES = (
    "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"
    "cni-podman0\t0000580A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n"
)


def put(root: Path, path: str, text: str = "", mode: int | None = None) -> Path:
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    if mode is not None:
        p.chmod(mode)
    return p


def debian_tree(root: Path, *, cap: str = "000001fffeffffff", uid: int = 0) -> Path:
    """This project's Debian 12 machines: hybrid cgroups, no systemd, no CAP_SYS_RESOURCE
    (bit 24 of CapEff is 0), pid_max 32768, nofile hard limit 20000."""
    (root / "sys/fs/cgroup/unified").mkdir(parents=True)
    put(
        root,
        "/proc/self/status",
        f"Name:\tpython\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nCapEff:\t{cap}\n",
    )
    put(root, "/proc/self/limits", LIMITS)
    put(root, "/proc/sys/kernel/pid_max", "32768\n")
    put(root, "/proc/sys/kernel/osrelease", "6.1.0-28-amd64\n")
    put(root, "/proc/filesystems", "nodev\tsysfs\nnodev\toverlay\n\text4\n")
    put(root, "/proc/self/mounts", "/dev/sda1 / ext4 rw 0 0\n")
    put(root, "/usr/bin/tini")
    return root


def tools(bin_dir: Path, *names: str, script: str = "#!/bin/sh\n") -> str:
    """Fake executables in ``bin_dir``; returns it as a PATH."""
    for n in names:
        put(bin_dir, n, script, 0o755)
    return str(bin_dir)


class Runner:
    """Answers commands from a table (argv prefix -> result) and records them."""

    def __init__(self, table: dict[tuple[str, ...], tuple[int, str, str]] | None = None) -> None:
        self.table = table or {}
        self.ran: list[tuple[str, ...]] = []

    def __call__(self, argv, timeout: float = 20) -> tuple[int, str, str]:
        self.ran.append(tuple(argv))
        for prefix, res in self.table.items():
            if tuple(argv[: len(prefix)]) == prefix:
                return res
        return 127, "", f"{argv[0]}: not found"


def refuse(argv, timeout: float = 20) -> tuple[int, str, str]:
    raise AssertionError(f"ran {argv} though no command was asked for")


def host_of(
    tmp_path: Path, env: dict[str, str] | None = None, run=refuse, ask=ASK_NONE, **tree
) -> Host:
    root = (
        debian_tree(tmp_path / "root", **tree)
        if not (tmp_path / "root").exists()
        else tmp_path / "root"
    )
    env = {"PATH": str(tmp_path / "bin"), "HOME": "/home/ada", **(env or {})}
    return detect_host(root, env, run, ask=ask, cwd=str(tmp_path))


@pytest.mark.parametrize("layout", ["v2", "hybrid", "v1"])
def test_cgroup_layout(tmp_path, layout):
    root = tmp_path / "root"
    (root / "sys/fs/cgroup").mkdir(parents=True)
    if layout == "hybrid":
        (root / "sys/fs/cgroup/unified").mkdir()
    if layout == "v2":
        put(root, "/sys/fs/cgroup/cgroup.controllers", "cpu memory\n")
        (root / "sys/fs/cgroup/unified").mkdir()  # the file decides, not the folder
    assert detect_host(root, {"PATH": ""}, refuse, ask=ASK_NONE).cgroup == layout


def test_debian_hybrid_host(tmp_path):
    path = tools(tmp_path / "bin", "podman", "runc", "slirp4netns")
    h = host_of(tmp_path, {"PATH": path})
    assert h.cgroup == "hybrid" and not h.systemd and h.cgroup_manager == "cgroupfs"
    assert h.kernel == "6.1.0-28-amd64" and h.overlay and h.pid_max == 32768
    assert h.euid == 0 and not h.rootless and not h.cap_sys_resource
    assert h.engines == ("podman",) and h.runtimes == ("runc",) and h.runtime == "runc"
    assert h.host_init == "/usr/bin/tini" and not h.podman_init and h.which("slirp4netns")
    assert h.selinux is False and h.bridge_conflict == "" and h.cdi_gpu_specs == ()


def test_cap_sys_resource_is_bit_24_of_capeff(tmp_path):
    assert not host_of(tmp_path / "a", cap="000001fffeffffff").cap_sys_resource  # 0xe: bit 24 off
    assert host_of(tmp_path / "b", cap="000001ffffffffff").cap_sys_resource
    assert not host_of(tmp_path / "c", cap="0000000000000000", uid=1000).cap_sys_resource
    h = host_of(tmp_path / "c")
    assert h.euid == 1000 and h.rootless


def test_rlimits_and_their_ceiling(tmp_path):
    h = host_of(tmp_path)
    assert (h.soft("nofile"), h.hard("nofile")) == (1024, 20000)
    assert h.hard("stack") == UNLIMITED and h.soft("stack") == 8388608
    assert h.hard("nproc") == 96365 and h.ceiling("nproc") == 32768  # pid_max below the hard limit
    assert (
        h.ceiling("nofile") == 20000 and h.hard("core") == UNLIMITED
    )  # a limit /proc does not list
    assert h.rlimits["rtprio"] == (0, 0)


def test_rlimits_capping_as_run_does_it(tmp_path):
    """Without CAP_SYS_RESOURCE podman's defaults (nofile 1048576, nproc 4194304) are capped to
    the hard limits, nproc to pid_max; with it, nothing is passed."""
    path = tools(tmp_path / "bin", "podman", "runc")
    h = host_of(tmp_path, {"PATH": path})
    assert podman_args(h) == (
        ["--cgroup-manager", "cgroupfs"],
        ["--runtime", "runc", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768"],
    )
    able = host_of(tmp_path / "cap", {"PATH": path}, cap="000001ffffffffff")
    assert podman_args(able)[1] == ["--runtime", "runc"]
    argv = plan_run("docker.io/library/debian:bookworm", host=h).argv
    assert "nofile=20000:20000" in argv and "nproc=32768:32768" in argv


def test_cdi_specs_that_name_nvidia_gpus(tmp_path):
    root = debian_tree(tmp_path / "root")
    put(root, "/var/run/cdi/other.yaml", "cdiVersion: 0.5.0\nkind: example.com/fpga\n")
    assert host_of(tmp_path).cdi_gpu_specs == ()
    put(root, "/etc/cdi/nvidia.yaml", "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")
    put(root, "/etc/cdi/notes.txt", "nvidia.com/gpu\n")  # not a spec file
    put(root, "/var/run/cdi/nvidia.json", '{"kind": "nvidia.com/gpu"}')
    assert host_of(tmp_path).cdi_gpu_specs == ("/etc/cdi/nvidia.yaml", "/var/run/cdi/nvidia.json")


def test_docker_needs_a_reachable_daemon(tmp_path):
    root = debian_tree(tmp_path / "root")
    path = tools(tmp_path / "bin", "docker", "podman")
    h = host_of(tmp_path, {"PATH": path})
    assert h.docker == "client" and h.engines == ("podman",)
    put(root, "/var/run/docker.sock")
    assert host_of(tmp_path, {"PATH": path}).engines == ("podman", "docker")
    assert host_of(tmp_path, {"PATH": path, "DOCKER_HOST": "unix:///srv/d.sock"}).docker == "client"
    put(root, "/srv/d.sock")
    assert host_of(tmp_path, {"PATH": path, "DOCKER_HOST": "unix:///srv/d.sock"}).docker == "daemon"
    assert (
        host_of(tmp_path, {"PATH": path, "DOCKER_HOST": "tcp://10.0.0.2:2376"}).docker == "daemon"
    )
    shim = tools(tmp_path / "shim", "docker", script='#!/bin/sh\nexec podman "$@"\n')
    h = host_of(tmp_path, {"PATH": f"{shim}:{path}"})
    assert h.docker == "podman" and h.engines == ("podman",)  # podman-docker's shim is podman


DOCKER_INFO = json.dumps(
    {  # `docker info --format '{{json .}}'` of Debian's dockerd 20.10 on this project's hosts
        "ServerVersion": "20.10.24+dfsg1",
        "Driver": "overlay2",
        "CgroupDriver": "cgroupfs",
        "CgroupVersion": "1",
        "Runtimes": {"runc": {"path": "runc"}, "io.containerd.runc.v2": {"path": "runc"}},
        "DefaultRuntime": "runc",
        "DockerRootDir": "/srv/docker",
        "ClientInfo": {"Version": "28.2.2"},
    }
)


def test_docker_info_gives_the_daemons_facts_only_when_asked(tmp_path):
    root = debian_tree(tmp_path / "root")
    path = tools(tmp_path / "bin", "docker")
    put(root, "/srv/d.sock")
    env = {"PATH": path, "DOCKER_HOST": "unix:///srv/d.sock"}
    assert host_of(tmp_path, env).docker_daemon is None  # not asked: no command runs (refuse)
    run = Runner({("docker", "info"): (0, DOCKER_INFO + "\n", "")})
    d = host_of(tmp_path, env, run=run, ask=ASK_DOCKER).docker_daemon
    assert d is not None and d.answered
    assert (d.version, d.storage_driver, d.cgroup_driver, d.cgroup_version) == (
        "20.10.24+dfsg1",
        "overlay2",
        "cgroupfs",
        "1",
    )
    assert d.runtimes == ("io.containerd.runc.v2", "runc") and d.default_runtime == "runc"
    assert not d.nvidia_runtime and d.address == "unix:///srv/d.sock"
    with_nvidia = json.loads(DOCKER_INFO)
    with_nvidia["Runtimes"]["nvidia"] = {"path": "nvidia-container-runtime"}
    run = Runner({("docker", "info"): (0, json.dumps(with_nvidia), "")})
    assert host_of(tmp_path, env, run=run, ask=ASK_DOCKER).docker_daemon.nvidia_runtime


def test_a_daemon_socket_that_does_not_answer_is_no_engine(tmp_path):
    root = debian_tree(tmp_path / "root")
    path = tools(tmp_path / "bin", "docker")
    put(root, "/var/run/docker.sock")  # left behind by a daemon that is gone
    client_half = json.dumps(
        {"ServerVersion": "", "Driver": "", "ClientInfo": {"Version": "28.2.2"}}
    )
    said = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
    h = host_of(
        tmp_path,
        {"PATH": path},
        run=Runner({("docker", "info"): (1, client_half, said)}),
        ask=ASK_DOCKER,
    )
    assert h.docker == "daemon" and h.docker_daemon is not None
    assert not h.docker_daemon.answered and "Cannot connect" in h.docker_daemon.error
    assert h.engines == ()
    assert host_of(tmp_path, {"PATH": path}).engines == (
        "docker",
    )  # not asked: the socket is trusted


def test_cache_dir_rule(tmp_path, monkeypatch):
    assert cache_dir_for({"ENVSPEC_CACHE": "/c", "XDG_CACHE_HOME": "/x", "HOME": "/h"}) == Path(
        "/c"
    )
    assert cache_dir_for({"XDG_CACHE_HOME": "/x", "HOME": "/h"}) == Path("/x/envspec")
    assert cache_dir_for({"HOME": "/h"}) == Path("/h/.cache/envspec")
    assert (
        host_of(tmp_path, {"XDG_CACHE_HOME": str(tmp_path / "xdg")}).cache_dir
        == tmp_path / "xdg" / "envspec"
    )
    assert host_of(tmp_path).cache_dir == Path("/home/ada/.cache/envspec")
    from envspec.cache.store import default_cache_dir  # the build's cache follows the same rule

    monkeypatch.delenv("ENVSPEC_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "envspec"


def test_storage_from_env(tmp_path):
    store = tmp_path / "s"
    h = host_of(
        tmp_path, {"ENVSPEC_STORAGE_ROOT": str(store)}, run=refuse, ask=ASK_ALL
    )  # buildah is not asked
    st = h.storage
    assert st.source == FROM_ENV and st.custom and st.root == str(store)
    assert len(st.runroot) <= 50 and st.runroot.startswith(
        "/tmp/envspec-"
    )  # podman's limit; no writable /run here
    assert st.driver == "overlay"  # the kernel has it, and the root is not on overlayfs
    assert st.args() == [
        "--root",
        str(store),
        "--runroot",
        st.runroot,
        "--storage-driver",
        "overlay",
    ]
    assert st.ref("a:b") == f"containers-storage:[overlay@{store}+{st.runroot}]a:b"
    assert h.storage_free is not None and h.storage_free.free > 0
    put(
        tmp_path / "root",
        "/proc/self/mounts",
        f"overlay / overlay rw 0 0\n/dev/sda1 {tmp_path}x ext4 rw 0 0\n",
    )
    assert (
        host_of(tmp_path, {"ENVSPEC_STORAGE_ROOT": str(store)}).storage.driver == "vfs"
    )  # overlay on overlay
    h = host_of(
        tmp_path,
        {
            "ENVSPEC_STORAGE_ROOT": str(store),
            "ENVSPEC_STORAGE_DRIVER": "btrfs",
            "ENVSPEC_STORAGE_RUNROOT": "/run/x",
        },
    )
    assert h.storage.args()[-4:] == ["--runroot", "/run/x", "--storage-driver", "btrfs"]
    assert Storage().args() == [] and Storage().ref("x") == "containers-storage:x"


def test_storage_from_buildah_info_or_a_default(tmp_path):
    path = tools(tmp_path / "bin", "buildah")
    info = json.dumps(
        {
            "store": {
                "GraphRoot": "/var/lib/containers/storage",
                "RunRoot": "/run/containers/storage",
                "GraphDriverName": "overlay",
            }
        }
    )
    run = Runner({("buildah", "info"): (0, info, "")})
    st = host_of(tmp_path, {"PATH": path}, run=run, ask={"buildah info"}).storage
    assert (st.root, st.runroot, st.driver, st.source) == (
        "/var/lib/containers/storage",
        "/run/containers/storage",
        "overlay",
        FROM_BUILDAH,
    )
    assert (
        st.args() == [] and st.ref("x") == "containers-storage:x"
    )  # the system's storage: nothing to say
    st = host_of(
        tmp_path,
        {"PATH": path},
        run=Runner({("buildah", "info"): (1, "", "boom")}),
        ask={"buildah info"},
    ).storage
    assert (st.root, st.source) == ("/var/lib/containers/storage", FROM_DEFAULT)
    assert (
        host_of(tmp_path, {"PATH": path}).storage.source == FROM_DEFAULT
    )  # not asked: no command ran


def test_driver_version_sources(tmp_path):
    root = debian_tree(tmp_path / "root")
    path = tools(tmp_path / "bin", "nvidia-smi")
    smi = Runner(
        {
            ("nvidia-smi", "--query-gpu=driver_version"): (0, "575.57.08\n575.57.08\n", ""),
            ("nvidia-smi", "--query-gpu=name,compute_cap"): (
                0,
                "NVIDIA H100 80GB HBM3, 9.0\n" * 2,
                "",
            ),
        }
    )
    h = host_of(tmp_path, {"PATH": path}, run=smi, ask={"nvidia-smi"})
    assert (h.driver_version, h.driver_source) == ("575.57.08", "nvidia-smi")
    assert h.gpus == (HostGpu("NVIDIA H100 80GB HBM3", "9.0"),) * 2 and h.gpu_error == ""
    put(
        root,
        "/proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build\n",
    )
    h = host_of(tmp_path, {"PATH": path}, run=smi, ask={"nvidia-smi"})
    assert (h.driver_version, h.driver_source) == ("580.65.06", "/proc/driver/nvidia/version")
    h = host_of(
        tmp_path,
        {"PATH": path},
        run=Runner({("nvidia-smi",): (9, "", "NVIDIA-SMI has failed")}),
        ask={"nvidia-smi"},
    )
    assert h.gpus == () and "NVIDIA-SMI has failed" in h.gpu_error
    assert host_of(tmp_path / "none").driver_version == ""
    assert host_of(tmp_path / "none").driver_source == ""


def test_tools_and_versions(tmp_path):
    path = tools(
        tmp_path / "bin",
        "podman",
        "buildah",
        "skopeo",
        "containers-storage",
        "nvidia-ctk",
        "newuidmap",
    )
    put_layer = put(tmp_path, "/opt/envspec-put-layer", "#!/bin/sh\n", 0o755)
    run = Runner(
        {
            ("podman", "--version"): (0, "podman version 4.3.1\n", ""),
            ("buildah", "--version"): (0, "buildah version 1.28.2\n", ""),
            ("skopeo", "--version"): (126, "", "exec format error\n"),
        }
    )
    h = host_of(
        tmp_path, {"PATH": path, "ENVSPEC_PUT_LAYER": str(put_layer)}, run=run, ask={"versions"}
    )
    assert h.tools["podman"].version == "podman version 4.3.1" and h.tools["buildah"].error == ""
    assert h.tools["skopeo"].error == "exec format error"
    assert (
        h.put_layer == str(put_layer)
        and h.which("containers-storage") == f"{path}/containers-storage"
    )
    assert h.nvidia_toolkit == f"{path}/nvidia-ctk" and h.which("crun") == ""
    assert sorted(run.ran) == [
        ("buildah", "--version"),
        ("podman", "--version"),
        ("skopeo", "--version"),
    ]
    h = host_of(
        tmp_path,
        {"PATH": path, "ENVSPEC_PUT_LAYER": "off", "ENVSPEC_CONTAINERS_STORAGE": "newuidmap"},
    )
    assert h.put_layer == "" and h.which("containers-storage") == f"{path}/newuidmap"


def test_systemd_selinux_bridge_inits_subuid(tmp_path):
    root = debian_tree(tmp_path / "root")
    (root / "run/systemd/system").mkdir(parents=True)
    put(root, "/sys/fs/selinux/enforce", "1\n")
    put(root, "/proc/net/route", ROUTES)
    put(root, "/usr/lib/podman/netavark")
    put(root, "/usr/libexec/podman/catatonit")
    put(root, "/etc/subuid", "ada:100000:65536\n")
    h = host_of(tmp_path, {"USER": "ada"})
    assert h.systemd and h.cgroup_manager == "systemd" and h.selinux
    assert (h.bridge, h.bridge_subnet, h.bridge_conflict) == (
        "podman0",
        "10.88.0.0/16",
        "cni-podman0",
    )
    assert h.podman_init and h.user == "ada" and h.subuid
    assert not host_of(tmp_path, {"USER": "bob"}).subuid
    put(
        root,
        "/etc/containers/networks/podman.json",
        json.dumps({"network_interface": "podman9", "subnets": [{"subnet": "10.99.0.0/16"}]}),
    )
    h = host_of(tmp_path)
    assert (h.bridge, h.bridge_subnet, h.bridge_conflict) == ("podman9", "10.99.0.0/16", "")


def test_runtime_rule(tmp_path):
    path = tools(tmp_path / "bin", "podman", "crun", "runc")
    assert host_of(tmp_path, {"PATH": path}).runtime == "runc"  # hybrid
    (tmp_path / "root/sys/fs/cgroup/cgroup.controllers").write_text("cpu\n")
    assert host_of(tmp_path, {"PATH": path}).runtime == ""  # v2 with crun: podman's default
    assert host_of(tmp_path, {"PATH": tools(tmp_path / "b2", "runc")}).runtime == "runc"  # no crun
    assert host_of(tmp_path, {"PATH": path, "ENVSPEC_RUNTIME": "crun"}).runtime == "crun"


def test_a_host_is_read_only_and_holds_no_secret_values(tmp_path):
    h = host_of(tmp_path, {"JUPYTER_TOKEN": "s3cret"})
    assert "JUPYTER_TOKEN" in h.env_names and "s3cret" not in repr(h)
    with pytest.raises(TypeError):
        h.tools["podman"] = h.tools.get("podman")  # type: ignore[index]


def test_detect_host_runs_here():
    h = detect_host(ask=ASK_NONE)
    assert h.cgroup in ("v1", "v2", "hybrid")
    assert all(e in ("podman", "docker") for e in h.engines)
    assert h.cache_dir.is_absolute() and h.pid_max >= 0

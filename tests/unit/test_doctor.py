"""envspec doctor: each check against a fake ``Host``, and once on this real host."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from envspec.compat import best_arch
from envspec.doctor import Diagnosis, doctor_exit_code, doctor_json, doctor_lines, run_doctor
from envspec.host import (
    FROM_BUILDAH,
    DiskFree,
    DockerDaemon,
    Host,
    HostGpu,
    Storage,
    Tool,
    detect_host,
)
from envspec.lock import load

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
GPU_LOCK = GOLDEN / "diff" / "new.lock"  # cu130, floor 580.65.06, H100
GIB = 1 << 30
VERSIONS = {
    "podman": "podman version 4.3.1",
    "buildah": "buildah version 1.28.2",
    "skopeo": "skopeo version 1.9.3",
}


def _tools(*names: str, **paths: str) -> dict[str, Tool]:
    out = {n: Tool(f"/usr/bin/{n}", VERSIONS.get(n, "")) for n in names}
    out.update({n.replace("_", "-"): Tool(p) for n, p in paths.items()})
    return out


def build_host(**kw) -> Host:
    """This project's machines: podman, runc, buildah, skopeo, hybrid cgroups, no GPU."""
    h = Host(
        tools=_tools("podman", "buildah", "skopeo", "runc"),
        cgroup="hybrid",
        kernel="6.1.0-28-amd64",
        overlay=True,
        bridge="podman0",
        storage=Storage(
            "/var/lib/containers/storage", "/run/containers/storage", "overlay", FROM_BUILDAH
        ),
        storage_free=DiskFree(80 * GIB, 1),
        cache_dir=Path("/root/.cache/envspec"),
        cache_free=DiskFree(80 * GIB, 1),
        rlimits={
            "nofile": (20000, 20000),
            "nproc": (96365, 96365),
            "memlock": (8 << 20, 8 << 20),
            "stack": (-1, -1),
        },
        euid=0,
        cap_sys_resource=False,
        pid_max=32768,
    )
    return replace(h, **kw)


def gpu_host(
    driver="580.82.07", gpus=(HostGpu("NVIDIA H100 80GB HBM3", "9.0"),) * 2, cdi=True
) -> Host:
    h = build_host()
    tools = dict(h.tools) | _tools("nvidia-smi", "crun")
    if cdi:
        tools |= _tools("nvidia-ctk")
    return replace(
        h,
        cgroup="v2",
        driver_version=driver,
        driver_source="/proc/driver/nvidia/version",
        gpus=gpus,
        tools=tools,
        cdi_gpu_specs=("/etc/cdi/nvidia.yaml",) if cdi else (),
    )


def by(diagnoses, check) -> list[Diagnosis]:
    return [d for d in diagnoses if d.check == check]


def test_build_host_without_gpu_is_fine():
    f = run_doctor(build_host(), load(GPU_LOCK))
    assert doctor_exit_code(f) == 0
    d = by(f, "driver")[0]
    assert d.status == "warn" and "no NVIDIA GPU driver" in d.what and "580.65.06" in d.what
    assert by(f, "runtime")[0].status == "ok" and "--runtime runc" in by(f, "runtime")[0].what
    assert by(f, "disk")[0].status == "ok"
    assert any(x.status == "warn" and "memlock" in x.what for x in by(f, "rlimits"))
    text = "\n".join(doctor_lines(f))
    assert "nothing blocks building" in text


def test_no_lock_no_gpu_is_info():
    f = run_doctor(build_host(), None)
    assert by(f, "driver")[0].status == "info"
    assert doctor_exit_code(f) == 0


def test_missing_build_tools_block():
    h = build_host(tools=_tools("podman", "runc"))
    f = run_doctor(h, None)
    assert doctor_exit_code(f) == 1
    bad = [x for x in f if x.status == "fail"]
    assert {x.check for x in bad} == {"buildah", "skopeo"}
    assert all("apt-get install" in x.fix for x in bad)


def test_broken_build_tool_blocks():
    tools = _tools("podman", "buildah", "runc") | {
        "skopeo": Tool("/usr/bin/skopeo", "", "exec format error")
    }
    f = by(run_doctor(build_host(tools=tools), None), "skopeo")[0]
    assert f.status == "fail" and "exec format error" in f.what and "--reinstall" in f.fix


def test_disk_too_small_blocks():
    f = run_doctor(
        build_host(storage_free=DiskFree(3 * GIB, 1), cache_free=DiskFree(3 * GIB, 1)),
        load(GPU_LOCK),
    )
    disk = by(f, "disk")[0]
    assert disk.status == "fail" and disk.detail["need"] > 3 * GIB
    assert doctor_exit_code(f) == 1


def test_disk_cache_on_another_fs():
    h = build_host(storage_free=DiskFree(100 * GIB, 1), cache_free=DiskFree(1 * GIB, 2))
    disk = by(run_doctor(h, load(GPU_LOCK)), "disk")
    assert [x.status for x in disk] == ["ok", "fail"]


def test_gpu_host_ok():
    f = run_doctor(gpu_host(), load(GPU_LOCK))
    assert doctor_exit_code(f) == 0, doctor_lines(f)
    assert by(f, "driver")[0].status == "ok"
    g = by(f, "gpus")[0]
    assert g.status == "ok" and g.detail["count"] == 2 and g.detail["arch"] == "sm_90"
    assert by(f, "toolkit")[0].status == "ok"


def test_old_driver_blocks():
    f = run_doctor(gpu_host(driver="570.172.08"), load(GPU_LOCK))
    d = by(f, "driver")[0]
    assert d.status == "fail" and "older than" in d.what and "580.65.06" in d.fix
    assert doctor_exit_code(f) == 1


def test_gpu_without_kernels_blocks():
    f = run_doctor(gpu_host(gpus=(HostGpu("Tesla T4", "7.5"),)), load(GPU_LOCK))
    assert by(f, "gpus")[0].status == "fail"  # the new lock dropped sm_75 and has no older PTX


def test_gpu_without_toolkit_blocks():
    f = run_doctor(gpu_host(cdi=False), load(GPU_LOCK))
    t = by(f, "toolkit")[0]
    assert t.status == "fail" and "nvidia-ctk cdi generate" in t.fix


def test_nvidia_smi_failing_or_listing_nothing_warns():
    g = by(
        run_doctor(replace(gpu_host(), gpus=(), gpu_error="NVIDIA-SMI has failed"), load(GPU_LOCK)),
        "gpus",
    )[0]
    assert g.status == "warn" and "NVIDIA-SMI has failed" in g.what
    g = by(run_doctor(replace(gpu_host(), gpus=()), load(GPU_LOCK)), "gpus")[0]
    assert g.status == "warn" and "lists no GPU" in g.what


@pytest.mark.parametrize(
    "cc,archs,want",
    [
        ("9.0", ["sm_80", "sm_90"], "sm_90"),
        ("8.9", ["sm_80", "sm_86", "sm_90"], "sm_86"),  # L4/L40S run sm_86 SASS
        ("10.3", ["sm_100", "sm_120"], "sm_100"),  # B300 runs sm_100
        ("10.0", ["sm_90a", "sm_120"], ""),  # an `a` variant runs only on its own capability
        ("12.0", ["sm_90", "compute_90"], "compute_90"),  # PTX JIT
        ("7.5", ["sm_80", "compute_80"], ""),
    ],
)
def test_runs_on(cc, archs, want):
    assert best_arch(cc, archs) == want


def test_engine_and_runtime_missing_are_warnings():
    f = run_doctor(build_host(tools=_tools("buildah", "skopeo", "runc")), None)
    assert by(f, "engine")[0].status == "warn" and doctor_exit_code(f) == 0
    r = by(
        run_doctor(build_host(tools=_tools("podman", "buildah", "skopeo", "crun")), None), "runtime"
    )[0]
    assert r.status == "warn" and "apt-get install -y runc" in r.fix


def test_docker_without_daemon_or_podman_shim_is_no_engine():
    for docker in ("client", "podman"):
        f = by(
            run_doctor(
                build_host(tools=_tools("buildah", "skopeo", "runc", "docker"), docker=docker), None
            ),
            "engine",
        )
        assert [x.status for x in f] == ["info", "warn"]
    f = by(
        run_doctor(
            build_host(tools=_tools("buildah", "skopeo", "runc", "docker"), docker="daemon"), None
        ),
        "engine",
    )
    assert f[0].status == "ok" and "reachable daemon" in f[0].what


DAEMON = DockerDaemon(
    "unix:///srv/d.sock",
    version="20.10.24+dfsg1",
    storage_driver="overlay2",
    cgroup_driver="cgroupfs",
    cgroup_version="1",
    runtimes=("io.containerd.runc.v2", "runc"),
    default_runtime="runc",
    root_dir="/srv/docker",
)


def docker_host(daemon: DockerDaemon, **kw) -> Host:
    return build_host(
        tools=_tools("buildah", "skopeo", "runc", "docker"),
        docker="daemon",
        docker_daemon=daemon,
        **kw,
    )


def test_docker_daemon_facts_are_reported():
    f = by(run_doctor(docker_host(DAEMON), None), "engine")
    assert [x.status for x in f] == ["ok"]
    for fact in (
        "20.10.24+dfsg1",
        "unix:///srv/d.sock",
        "overlay2",
        "cgroupfs",
        "cgroup v1",
        "default runc",
    ):
        assert fact in f[0].what, (fact, f[0].what)
    assert f[0].detail["storage_driver"] == "overlay2" and f[0].detail["nvidia_runtime"] is False
    assert not by(
        run_doctor(docker_host(DAEMON), None), "docker-gpu"
    )  # no GPU, no GPU lock: nothing to say


def test_docker_daemon_that_does_not_answer_is_a_warning_naming_the_address():
    d = DockerDaemon(
        "unix:///var/run/docker.sock",
        error="Cannot connect to the Docker daemon at unix:///var/run/"
        "docker.sock. Is the docker daemon running?",
    )
    f = by(run_doctor(docker_host(d), None), "engine")
    assert (
        f[0].status == "warn"
        and "unix:///var/run/docker.sock" in f[0].what
        and "Cannot connect" in f[0].what
    )
    assert "dockerd" in f[0].fix and f[-1].status == "warn"  # and no engine at all


def test_docker_vfs_storage_is_a_warning():
    f = by(run_doctor(docker_host(replace(DAEMON, storage_driver="vfs")), None), "docker-storage")
    assert f[0].status == "warn" and "overlay2" in f[0].fix


def test_docker_gpus_need_the_nvidia_runtime_or_toolkit():
    lock = load(GPU_LOCK)
    gpu = dict(driver_version="580.65.06", gpus=(HostGpu("NVIDIA H100 80GB HBM3", "9.0"),))
    f = by(run_doctor(docker_host(DAEMON, **gpu), lock), "docker-gpu")
    assert (
        f[0].status == "fail" and "nvidia-ctk runtime configure" in f[0].fix
    )  # docker is the only engine
    with_podman = docker_host(DAEMON, **gpu)
    with_podman = replace(with_podman, tools={**with_podman.tools, **_tools("podman")})
    assert by(run_doctor(with_podman, lock), "docker-gpu")[0].status == "warn"
    f = by(
        run_doctor(docker_host(replace(DAEMON, runtimes=("nvidia", "runc")), **gpu), lock),
        "docker-gpu",
    )
    assert f[0].status == "ok" and "nvidia runtime" in f[0].what


def test_json_shape():
    j = doctor_json(run_doctor(build_host(), None))
    assert j["exit_code"] == 0
    assert {"check", "status", "what", "fix", "detail"} <= set(j["findings"][0])
    json.dumps(j)


def test_real_host():
    """On this machine: no GPU reported plainly; exit 0 where buildah, skopeo and disk are fine."""
    import shutil

    f = run_doctor(detect_host(), load(GPU_LOCK))
    lines = doctor_lines(f)
    assert lines and all(isinstance(x, str) for x in lines)
    drivers = by(f, "driver")
    assert len(drivers) == 1
    if not Path("/proc/driver/nvidia/version").exists() and not shutil.which("nvidia-smi"):
        assert drivers[0].status == "warn" and "no NVIDIA GPU driver" in drivers[0].what
    build_ok = shutil.which("buildah") and shutil.which("skopeo")
    if build_ok and all(x.status != "fail" for x in by(f, "disk") + by(f, "storage")):
        assert doctor_exit_code(f) == 0, lines


def test_network_conflict():
    n = by(run_doctor(build_host(bridge_conflict="cni-podman0"), None), "network")[0]
    assert n.status == "warn" and "ip link delete cni-podman0" in n.fix
    assert by(run_doctor(build_host(), None), "network")[0].status == "ok"


def test_containers_storage_tool_present_or_warned():
    tools = _tools(
        "podman",
        "buildah",
        "skopeo",
        "runc",
        "containers-storage",
        envspec_put_layer="/opt/envspec/bin/envspec-put-layer",
    )
    f = by(run_doctor(build_host(tools=tools), None), "import")[0]
    assert f.status == "ok" and f.detail["put_layer"] == "/opt/envspec/bin/envspec-put-layer"
    del tools["envspec-put-layer"]
    f = by(run_doctor(build_host(tools=tools), None), "import")[0]
    assert f.status == "warn" and "scripts/dev.sh setup" in f.fix and "twice" in f.what
    del tools["containers-storage"]
    f = by(run_doctor(build_host(tools=tools), None), "import")[0]
    assert f.status == "warn" and "apt-get install -y containers-storage" in f.fix


def test_rootless_needs_a_subuid_range_and_newuidmap():
    r = by(run_doctor(build_host(euid=1000, user="ada"), None), "rootless")[0]
    assert r.status == "warn" and "usermod --add-subuids" in r.fix
    r = by(run_doctor(build_host(euid=1000, user="ada", subuid=True), None), "rootless")[0]
    assert r.status == "warn" and "uidmap" in r.fix
    h = build_host(euid=1000, user="ada", subuid=True)
    r = by(run_doctor(replace(h, tools=dict(h.tools) | _tools("newuidmap")), None), "rootless")[0]
    assert r.status == "ok"
    assert by(run_doctor(build_host(), None), "rootless") == []


def test_a_driver_older_than_the_gpus_first_branch_fails_without_a_lock():
    # no lock, no CUDA floor: the GPU rule alone (gpus.toml: H100 needs R520, RTX 5090 R570)
    f = run_doctor(gpu_host(driver="470.82.01"))
    d = [x for x in by(f, "driver") if x.detail.get("min_driver")]
    assert len(d) == 1 and d[0].status == "fail" and doctor_exit_code(f) != 0
    assert (
        "cannot drive NVIDIA H100 80GB HBM3" in d[0].what
        and "R520" in d[0].what
        and "R520" in d[0].fix
    )
    f = run_doctor(gpu_host(driver="565.57.01", gpus=(HostGpu("NVIDIA GeForce RTX 5090", "12.0"),)))
    assert [x.status for x in by(f, "driver") if x.detail.get("min_driver") == "570"] == ["fail"]
    # a GPU the DB does not name is judged by its compute capability
    f = run_doctor(gpu_host(driver="515.65.01", gpus=(HostGpu("NVIDIA L4 Rev B", "8.9"),)))
    assert [x.status for x in by(f, "driver") if x.detail.get("min_driver") == "520"] == ["fail"]


def test_a_driver_newer_than_the_gpus_last_branch_fails():
    # gpus.toml: R580 is the last branch for Volta, R470 for Kepler
    f = run_doctor(gpu_host(driver="590.48.01", gpus=(HostGpu("Tesla V100-SXM2-32GB", "7.0"),)))
    d = [x for x in by(f, "driver") if x.detail.get("max_driver")]
    assert [x.status for x in d] == ["fail"] and doctor_exit_code(f) != 0
    assert (
        "cannot drive Tesla V100-SXM2-32GB" in d[0].what
        and "R580 is the last" in d[0].what
        and "R580" in d[0].fix
    )
    f = run_doctor(gpu_host(driver="470.256.02", gpus=(HostGpu("Tesla K80", "3.7"),)))
    d = [x for x in by(f, "driver") if x.detail.get("max_driver")]
    assert [x.status for x in d] == ["ok"] and "R340 or newer and R470 or older" in d[0].what


def test_a_driver_that_knows_the_gpu_says_so():
    f = run_doctor(gpu_host(driver="580.82.07"), load(GPU_LOCK))
    d = [x for x in by(f, "driver") if x.detail.get("min_driver")]
    assert [x.status for x in d] == ["ok"] and "needs R520 or newer" in d[0].what


def test_the_disk_check_says_what_the_space_is_for():
    """issue 43, 12: "about 24.2 GiB (4.0 GiB of packages, ~2.5x unpacked)" said nothing of what for:
    the space is a first build's, split into the cache's part and containers-storage's."""
    from envspec.doctor import check_disk

    lock = load(GPU_LOCK)
    one = check_disk(build_host(), lock)  # one file system for both
    assert len(one) == 1 and f"a first build of {lock.meta.name}'s image needs about" in one[0].what
    assert "of package downloads" in one[0].what and "layer tars in the cache" in one[0].what
    assert "unpacked image in containers-storage" in one[0].what
    two = check_disk(
        build_host(cache_free=DiskFree(80 * GIB, 2)), lock
    )  # the cache on another disk
    assert [("containers-storage" in d.what, "layer tars" in d.what) for d in two] == [
        (True, False),
        (False, True),
    ]
    short = check_disk(
        build_host(storage_free=DiskFree(1 << 20, 1), cache_free=DiskFree(1 << 20, 1)), lock
    )
    assert short[0].status == "fail" and "ENVSPEC_CACHE" in short[0].fix

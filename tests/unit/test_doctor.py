"""envspec doctor: each check against a fake host, and once on this real host."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from envspec.compat import best_arch
from envspec.doctor import (Finding, SystemProbe, doctor_exit_code, doctor_json, doctor_lines,
                            driver_version, run_doctor)
from envspec.lock import load

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
GPU_LOCK = GOLDEN / "diff" / "new.lock"  # cu130, floor 580.65.06, H100


@dataclass
class FakeProbe:
    tools: dict[str, str] = field(default_factory=dict)  # name -> path
    commands: dict[tuple, tuple[int, str, str]] = field(default_factory=dict)  # argv prefix -> result
    files: dict[str, str] = field(default_factory=dict)
    free: dict[str, tuple[int, int]] = field(default_factory=dict)  # path prefix -> (free, dev)
    limits: dict[str, int] = field(default_factory=lambda: {"nofile": 1048576, "nproc": -1, "memlock": -1,
                                                              "stack": -1})
    environ: dict[str, str] = field(default_factory=lambda: {"HOME": "/root"})
    uid: int = 0
    cap: bool = True
    ran: list = field(default_factory=list)

    def which(self, name):
        return self.tools.get(name)

    def run(self, argv, timeout=20):
        self.ran.append(tuple(argv))
        for prefix, res in self.commands.items():
            if tuple(argv[:len(prefix)]) == prefix:
                return res
        return 127, "", "not found"

    def read(self, path):
        return self.files.get(path)

    def exists(self, path):
        return path in self.files or any(f.startswith(path.rstrip("/") + "/") for f in self.files)

    def listdir(self, path):
        pre = path.rstrip("/") + "/"
        return sorted({f[len(pre):].split("/")[0] for f in self.files if f.startswith(pre)})

    def free_bytes(self, path):
        best = max((p for p in self.free if path.startswith(p)), key=len, default=None)
        return self.free[best] if best else None

    def hard_limit(self, name):
        return self.limits.get(name, -1)

    def env(self):
        return self.environ

    def euid(self):
        return self.uid

    def cap_sys_resource(self):
        return self.cap


BUILDAH_INFO = json.dumps({"store": {"GraphRoot": "/var/lib/containers/storage", "GraphDriverName": "overlay"}})
GIB = 1 << 30


def build_host(**kw) -> FakeProbe:
    """This project's machines: podman, runc, buildah, skopeo, hybrid cgroups, no GPU."""
    p = FakeProbe(
        tools={t: f"/usr/bin/{t}" for t in ("podman", "buildah", "skopeo", "runc")},
        commands={("podman", "--version"): (0, "podman version 4.3.1\n", ""),
                  ("buildah", "--version"): (0, "buildah version 1.28.2\n", ""),
                  ("skopeo", "--version"): (0, "skopeo version 1.9.3\n", ""),
                  ("buildah", "info"): (0, BUILDAH_INFO, "")},
        files={"/sys/fs/cgroup/unified/cgroup.procs": "", "/proc/sys/kernel/osrelease": "6.1.0-28-amd64\n",
               "/proc/filesystems": "nodev\toverlay\n\text4\n"},
        free={"/": (80 * GIB, 1)},
        limits={"nofile": 20000, "nproc": 96365, "memlock": 8 << 20, "stack": -1}, cap=False,
    )
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def gpu_host(driver="580.82.07", gpus="NVIDIA H100 80GB HBM3, 9.0\n" * 2, cdi=True) -> FakeProbe:
    p = build_host()
    p.files = {**p.files, "/sys/fs/cgroup/cgroup.controllers": "cpu memory\n",
               "/proc/driver/nvidia/version": f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver}  Tue Jul 8 2025\n"}
    del p.files["/sys/fs/cgroup/unified/cgroup.procs"]
    p.tools["nvidia-smi"] = "/usr/bin/nvidia-smi"
    p.commands[("nvidia-smi", "--query-gpu=name,compute_cap")] = (0, gpus, "")
    if cdi:
        p.files["/etc/cdi/nvidia.yaml"] = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n"
        p.tools["nvidia-ctk"] = "/usr/bin/nvidia-ctk"
    p.tools["crun"] = "/usr/bin/crun"
    return p


def by(findings, check) -> list[Finding]:
    return [f for f in findings if f.check == check]


def test_build_host_without_gpu_is_fine():
    f = run_doctor(load(GPU_LOCK), probe=build_host())
    assert doctor_exit_code(f) == 0
    d = by(f, "driver")[0]
    assert d.status == "warn" and "no NVIDIA GPU driver" in d.what and "580.65.06" in d.what
    assert by(f, "runtime")[0].status == "ok" and "--runtime runc" in by(f, "runtime")[0].what
    assert by(f, "disk")[0].status == "ok"
    assert any(x.status == "warn" and "memlock" in x.what for x in by(f, "rlimits"))
    text = "\n".join(doctor_lines(f))
    assert "nothing blocks building" in text


def test_no_lock_no_gpu_is_info():
    f = run_doctor(None, probe=build_host())
    assert by(f, "driver")[0].status == "info"
    assert doctor_exit_code(f) == 0


def test_missing_build_tools_block():
    p = build_host()
    del p.tools["buildah"]
    del p.tools["skopeo"]
    f = run_doctor(None, probe=p)
    assert doctor_exit_code(f) == 1
    bad = [x for x in f if x.status == "fail"]
    assert {x.check for x in bad} == {"buildah", "skopeo"}
    assert all("apt-get install" in x.fix for x in bad)


def test_disk_too_small_blocks():
    f = run_doctor(load(GPU_LOCK), probe=build_host(free={"/": (3 * GIB, 1)}))
    disk = by(f, "disk")[0]
    assert disk.status == "fail" and disk.detail["need"] > 3 * GIB
    assert doctor_exit_code(f) == 1


def test_disk_cache_on_another_fs():
    p = build_host(free={"/": (100 * GIB, 1), "/root/.cache": (1 * GIB, 2)})
    disk = by(run_doctor(load(GPU_LOCK), probe=p), "disk")
    assert [x.status for x in disk] == ["ok", "fail"]


def test_gpu_host_ok():
    f = run_doctor(load(GPU_LOCK), probe=gpu_host())
    assert doctor_exit_code(f) == 0, doctor_lines(f)
    assert by(f, "driver")[0].status == "ok"
    g = by(f, "gpus")[0]
    assert g.status == "ok" and g.detail["count"] == 2 and g.detail["arch"] == "sm_90"
    assert by(f, "toolkit")[0].status == "ok"


def test_old_driver_blocks():
    f = run_doctor(load(GPU_LOCK), probe=gpu_host(driver="570.172.08"))
    d = by(f, "driver")[0]
    assert d.status == "fail" and "older than" in d.what and "580.65.06" in d.fix
    assert doctor_exit_code(f) == 1


def test_gpu_without_kernels_blocks():
    f = run_doctor(load(GPU_LOCK), probe=gpu_host(gpus="Tesla T4, 7.5\n"))
    assert by(f, "gpus")[0].status == "fail"  # the new lock dropped sm_75 and has no older PTX


def test_gpu_without_toolkit_blocks():
    f = run_doctor(load(GPU_LOCK), probe=gpu_host(cdi=False))
    t = by(f, "toolkit")[0]
    assert t.status == "fail" and "nvidia-ctk cdi generate" in t.fix


def test_driver_version_sources():
    p = FakeProbe(tools={"nvidia-smi": "x"},
                  commands={("nvidia-smi", "--query-gpu=driver_version"): (0, "575.57.08\n575.57.08\n", "")})
    assert driver_version(p) == ("575.57.08", "nvidia-smi")
    p = FakeProbe(files={"/proc/driver/nvidia/version":
                         "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build\n"})
    assert driver_version(p)[0] == "580.65.06"
    assert driver_version(FakeProbe()) == ("", "")


@pytest.mark.parametrize("cc,archs,want", [
    ("9.0", ["sm_80", "sm_90"], "sm_90"),
    ("8.9", ["sm_80", "sm_86", "sm_90"], "sm_86"),  # L4/L40S run sm_86 SASS
    ("10.3", ["sm_100", "sm_120"], "sm_100"),  # B300 runs sm_100
    ("10.0", ["sm_90a", "sm_120"], ""),  # an `a` variant runs only on its own capability
    ("12.0", ["sm_90", "compute_90"], "compute_90"),  # PTX JIT
    ("7.5", ["sm_80", "compute_80"], ""),
])
def test_runs_on(cc, archs, want):
    assert best_arch(cc, archs) == want


def test_engine_and_runtime_missing_are_warnings():
    p = build_host()
    del p.tools["podman"]
    f = run_doctor(None, probe=p)
    assert by(f, "engine")[0].status == "warn" and doctor_exit_code(f) == 0
    p = build_host()
    del p.tools["runc"]
    p.tools["crun"] = "/usr/bin/crun"
    r = by(run_doctor(None, probe=p), "runtime")[0]
    assert r.status == "warn" and "apt-get install -y runc" in r.fix


def test_json_shape():
    j = doctor_json(run_doctor(None, probe=build_host()))
    assert j["exit_code"] == 0
    assert {"check", "status", "what", "fix", "detail"} <= set(j["findings"][0])
    json.dumps(j)


def test_real_host():
    """On this machine: no GPU reported plainly; exit 0 where buildah, skopeo and disk are fine."""
    import shutil

    f = run_doctor(load(GPU_LOCK), probe=SystemProbe())
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
    routes = ("Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"
              "cni-podman0\t0000580A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n")
    p = build_host()
    p.files = {**p.files, "/proc/net/route": routes, "/usr/lib/podman/netavark": ""}
    n = by(run_doctor(None, probe=p), "network")[0]
    assert n.status == "warn" and "ip link delete cni-podman0" in n.fix
    p.files["/proc/net/route"] = routes.splitlines()[0] + "\n"
    assert by(run_doctor(None, probe=p), "network")[0].status == "ok"


def test_containers_storage_tool_present_or_warned():
    p = build_host()
    p.tools["containers-storage"] = "/usr/bin/containers-storage"
    p.tools["envspec-put-layer"] = "/opt/envspec/bin/envspec-put-layer"
    f = by(run_doctor(None, probe=p), "import")[0]
    assert f.status == "ok" and f.detail["put_layer"] == "/opt/envspec/bin/envspec-put-layer"
    del p.tools["envspec-put-layer"]
    f = by(run_doctor(None, probe=p), "import")[0]
    assert f.status == "warn" and "scripts/dev.sh setup" in f.fix and "twice" in f.what
    del p.tools["containers-storage"]
    f = by(run_doctor(None, probe=p), "import")[0]
    assert f.status == "warn" and "apt-get install -y containers-storage" in f.fix

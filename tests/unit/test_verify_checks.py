"""run_checks against fake probes: each check's verdict and wording, exit codes, JSON, metrics."""

import json

from test_verify_fakes import GPU_WORK, FakeSystem, FakeTorch, by_check, make_lock

from envspec.verify import render
from envspec.verify.checks import run_checks
from envspec.verify.probes import DriverInfo


def run(lock=None, **sys_kw):
    skip = sys_kw.pop("skip", GPU_WORK)
    strict = sys_kw.pop("strict", False)
    level = sys_kw.pop("level", "quick")
    return run_checks(
        lock or make_lock(), level=level, system=FakeSystem(**sys_kw), skip=skip, strict=strict
    )


def test_matching_machine_passes():
    r = run(torch=FakeTorch())
    f = by_check(r)
    assert r.ok and r.exit_code == 0, r.to_json()
    assert f["driver"].status == "pass" and "580.95.05" in f["driver"].observed
    assert f["gpu.0.arch"].status == "pass" and "sm_90" in f["gpu.0.arch"].observed
    assert f["torch.nccl"].status == "pass" and f["torch.cudnn"].status == "pass"
    assert f["tf32"].status == "pass"
    assert r.mode == "image"
    assert r.fingerprint["gpu"] == "1 x NVIDIA H100 80GB HBM3"


def test_no_gpu_machine_skips_gpu_checks_plainly():
    r = run(torch=None, driver=None, nodes=())
    f = by_check(r)
    assert f["driver"].status == "skip"
    assert "no NVIDIA driver found" in f["driver"].observed
    assert "GPU checks are skipped" in f["driver"].observed
    assert f["torch.import"].status == "fail"  # the lock names torch
    assert f["gpu"].status == "skip" and "torch is not importable" in f["gpu"].observed
    assert r.exit_code == 1


def test_cpu_torch_against_cuda_lock_fails_with_reason():
    r = run(torch=FakeTorch(version="2.14.1+cpu", cuda=None, devices=()), driver=None, nodes=())
    f = by_check(r)
    assert f["torch.cuda"].status == "fail"
    assert f["torch.cuda"].observed == "none (CPU build)"
    assert f["gpu"].observed == "skipped: torch is a CPU build"


def test_driver_below_floor_fails_with_hint():
    r = run(torch=FakeTorch(), driver=DriverInfo("570.86.15", "12.8", "kernel module"))
    d = by_check(r)["driver"]
    assert d.status == "fail"
    assert "570.86.15" in d.observed and ">= 580.65.06" in d.expected
    assert "upgrade" in d.hint or "13" in d.hint


def test_a100_only_lock_on_h100_fails_naming_the_rule():
    lock = make_lock(
        hardware={
            "gpus": ["NVIDIA A100-SXM4-80GB"],
            "compute_capabilities": ["8.0"],
            "arch_list": ["sm_80"],
            "driver_floor": "580.65.06",
            "driver_policy": "compat",
        }
    )
    r = run(lock, torch=FakeTorch())
    f = by_check(r)
    a = f["gpu.0.arch"]
    assert a.status == "fail"
    assert "cc 9.0" in a.observed and "no locked kernel runs" in a.observed
    assert "sm_9" in a.hint and "compute_XY with XY <= 90" in a.hint
    assert f["torch.arch_list"].status == "warn"  # the lock does not describe the loaded torch


def test_ptx_only_is_a_warning():
    lock = make_lock()
    lock["hardware"] = dict(
        lock["hardware"], arch_list=["sm_80", "compute_80"], compute_capabilities=[], gpus=[]
    )
    r = run(lock, torch=FakeTorch(arch_list=("sm_80", "compute_80")))
    a = by_check(r)["gpu.0.arch"]
    assert a.status == "warn" and "JIT" in a.hint


def test_undeclared_but_runnable_gpu_warns():
    r = run(torch=FakeTorch(devices=(("NVIDIA H200", 9, 0), ("NVIDIA L4", 8, 9))))
    f = by_check(r)
    assert f["gpu.0.arch"].status == "warn" and "not a declared target" in f["gpu.0.arch"].hint
    assert (
        f["gpu.1.arch"].status == "warn"
        and "cc 8.9 is not a declared target" in f["gpu.1.arch"].hint
    )
    assert r.ok and not run(torch=FakeTorch(devices=(("NVIDIA H200", 9, 0),)), strict=True).ok


def test_nccl_metadata_vs_loaded_library_version():
    r = run(torch=FakeTorch(nccl=(2, 28, 9)))
    n = by_check(r)["torch.nccl"]
    assert n.status == "fail"
    assert n.expected == "2.30.7" and "2.28.9" in n.observed
    assert "second wheel" in n.hint


def test_tf32_off_fails_in_image_warns_on_host():
    img = run(torch=FakeTorch(tf32=(False, True), precision="highest"))
    t = by_check(img)["tf32"]
    assert t.status == "fail" and "'highest', not 'high'" in t.hint and "since 1.12" in t.hint
    host = run(torch=FakeTorch(tf32=(False, True), precision="highest"), prefix="/usr")
    assert host.mode == "host" and by_check(host)["tf32"].status == "warn"


def test_bad_env_settings_flagged_with_reason():
    r = run(
        torch=FakeTorch(),
        env={"NCCL_P2P_DISABLE": "1", "CUDA_LAUNCH_BLOCKING": "1", "NCCL_IB_DISABLE": "1"},
    )
    f = by_check(r)
    assert f["env.NCCL_P2P_DISABLE"].status == "warn" and "NVLink" in f["env.NCCL_P2P_DISABLE"].hint
    assert "serializes" in f["env.CUDA_LAUNCH_BLOCKING"].hint
    assert "env.NCCL_IB_DISABLE" not in f  # no InfiniBand here: nothing lost
    r2 = run(torch=FakeTorch(), env={"NCCL_IB_DISABLE": "1"}, ib=True)
    assert by_check(r2)["env.NCCL_IB_DISABLE"].status == "warn"


def test_runtime_env_from_lock_is_checked():
    lock = make_lock()
    lock["runtime"] = dict(lock["runtime"], env={"NCCL_DEBUG": "WARN"})
    r = run(lock, torch=FakeTorch(), env={"NCCL_DEBUG": "INFO"})
    e = by_check(r)["env.NCCL_DEBUG"]
    assert e.status == "fail" and e.observed == "NCCL_DEBUG=INFO"


def test_container_plumbing():
    r = run(
        torch=FakeTorch(), container=True, env={"NVIDIA_VISIBLE_DEVICES": "void"}, shm=64 * 2**20
    )
    f = by_check(r)
    assert f["container.nvidia_visible_devices"].status == "warn"
    assert f["container.shm"].status == "warn" and "--shm-size=16g" in f["container.shm"].hint
    assert "64.0 MiB" in f["container.shm"].observed
    r2 = run(
        torch=FakeTorch(),
        container=True,
        nodes=("nvidia0", "nvidiactl"),
        env={"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"},
    )
    f2 = by_check(r2)
    assert f2["container.nvidia_env"].status == "pass"
    assert (
        f2["container.devices"].status == "fail"
        and "nvidia-uvm" in f2["container.devices"].observed
    )


def test_busy_gpu_memory_warns():
    r = run(torch=FakeTorch(free_fraction=0.2))
    assert by_check(r)["gpu.0.memory"].status == "warn"


def test_json_schema_and_exit_codes():
    r = run(torch=FakeTorch(nccl=(2, 28, 9)))
    d = json.loads(r.to_json())
    assert d["ok"] is False and d["schema"] == 1 and d["level"] == "quick"
    assert d["lock"]["hash"] == "sha256:" + "ab" * 32
    assert set(d["counts"]) == {"pass", "warn", "fail", "skip"}
    for f in d["findings"]:
        assert {"check", "status", "expected", "observed", "hint"} <= set(f)
        assert f["status"] in ("pass", "warn", "fail", "skip")
    assert "total" in d["timings"] and "hostname" in d["fingerprint"]
    assert r.exit_code == 1


def test_table_and_prometheus_text(tmp_path):
    r = run(torch=FakeTorch(nccl=(2, 28, 9)))
    text = render.table(r)
    assert "FAIL    torch.nccl" in text and "hint:" in text and text.rstrip().endswith("s")
    prom = render.prometheus(r, now=1.0)
    assert 'envspec_verify_ok{lock="h100-train"' in prom and "} 0" in prom
    assert 'check="torch.nccl",status="fail"} 1' in prom
    assert "# TYPE envspec_verify_findings gauge" in prom
    out = tmp_path / "m" / "verify.prom"
    render.write_atomic(out, prom)
    assert out.read_text() == prom and [p.name for p in out.parent.iterdir()] == ["verify.prom"]


def test_startup_level_judges_nvml_gpus_without_torch():
    class NoTorch(FakeSystem):
        def torch(self):
            raise AssertionError("the startup level asked for torch")

    drv = DriverInfo(
        "580.95.05",
        "13.0",
        "kernel module + NVML",
        gpus=[
            {"index": 0, "name": "NVIDIA H100 80GB HBM3", "cc": "9.0", "memory_total": 80 * 2**30}
        ],
    )
    r = run_checks(make_lock(), level="startup", system=NoTorch(driver=drv))
    f = by_check(r)
    assert f["driver"].status == "pass" and f["gpu.count"].status == "pass"
    assert f["gpu.0.arch"].status == "pass" and "sm_90" in f["gpu.0.arch"].observed
    assert not any(
        c.startswith(("torch", "tf32", "numerics", "perf", "libs", "nccl", "integrity")) for c in f
    )
    # a GPU the lock's arch list cannot run fails at start, as in the quick level
    lock = make_lock(
        hardware={
            "gpus": ["NVIDIA H100 80GB HBM3"],
            "arch_list": ["sm_80"],
            "driver_floor": "580.65.06",
            "driver_policy": "compat",
        }
    )
    g = by_check(run_checks(lock, level="startup", system=NoTorch(driver=drv)))["gpu.0.arch"]
    assert g.status == "fail" and "sm_90" in g.hint


def test_startup_level_without_nvml_leaves_the_gpus_to_verify():
    r = run(torch=FakeTorch(), level="startup")  # FakeSystem's driver: the kernel module only
    f = by_check(r)
    assert f["driver"].status == "pass"
    assert f["gpu"].status == "skip" and "libnvidia-ml.so.1" in f["gpu"].observed


def test_a_probe_that_raises_is_a_finding_not_a_crash():
    class Boom(FakeTorch):
        def get_float32_matmul_precision(self):
            raise RuntimeError("boom")

    r = run(torch=Boom())
    t = by_check(r)["tf32"]
    assert t.status == "fail" and "RuntimeError: boom" in t.observed


def test_version_matching_follows_pep440_equality():
    from envspec.verify.checks import version_matches

    assert version_matches("2.11.0", "2.11.0+cu130")
    assert not version_matches("2.11.0+cpu", "2.11.0+cu130")
    assert not version_matches("2.11.0", "2.11.1")


def test_missing_system_library_hint():
    r = run(
        torch=None,
        torch_error="ImportError: libstdc++.so.6: cannot open shared object file: No such file",
    )
    t = by_check(r)["torch.import"]
    assert t.status == "fail" and "libstdc++.so.6" in t.hint and "libstdc++6" in t.hint


def test_compile_failure_hints():
    from envspec.verify.checks import _Run

    class Probe:
        def __init__(self, res):
            self.res = res

        def result(self):
            return self.res

    def one(res):
        r = _Run(make_lock(), "quick", "image", FakeSystem(), (), 1.0)
        r.check_compile(Probe(res))
        return r.report.findings[0]

    f = one(
        {"ok": False, "error": "InductorError: InvalidCxxCompiler: No working C++ compiler found"}
    )
    assert f.status == "fail" and "g++" in f.hint and "python3-dev" in f.hint
    f = one({"ok": False, "timeout": True, "error": "did not finish within 1 s"})
    assert f.status == "warn"
    assert one({"ok": True, "device": "cuda", "seconds": 2.0}).status == "pass"


def test_driver_older_than_the_gpus_first_branch_fails_whatever_the_floor():
    # a lock with a low floor (cu118 under compat) on a Hopper GPU with a 470 driver
    lock = make_lock(
        hardware={
            "gpus": ["NVIDIA H100 80GB HBM3"],
            "compute_capabilities": ["9.0"],
            "arch_list": ["sm_90"],
            "driver_floor": "450.80.02",
            "driver_policy": "compat",
        }
    )
    drv = DriverInfo(
        "470.82.01", "11.4", "kernel module", gpus=[{"name": "NVIDIA H100 80GB HBM3", "cc": "9.0"}]
    )
    f = by_check(run(lock, torch=FakeTorch(), driver=drv))
    g = f["driver.gpu.0"]
    assert (
        g.status == "fail"
        and "R520" in g.expected
        and "470.82.01" in g.observed
        and "upgrade" in g.hint
    )
    drv = DriverInfo(
        "580.95.05", "13.0", "kernel module", gpus=[{"name": "NVIDIA H100 80GB HBM3", "cc": "9.0"}]
    )
    assert by_check(run(torch=FakeTorch(), driver=drv))["driver.gpu.0"].status == "pass"


def test_driver_newer_than_the_gpus_last_branch_fails():
    # a V100 host whose driver moved past R580, the last branch for Volta
    lock = make_lock(
        hardware={
            "gpus": ["Tesla V100-SXM2-32GB"],
            "compute_capabilities": ["7.0"],
            "arch_list": ["sm_70"],
            "driver_floor": "525.60.13",
            "driver_policy": "compat",
        }
    )
    drv = DriverInfo(
        "590.48.01", "13.1", "kernel module", gpus=[{"name": "Tesla V100-SXM2-32GB", "cc": "7.0"}]
    )
    g = by_check(run(lock, torch=FakeTorch(), driver=drv))["driver.gpu.0"]
    assert g.status == "fail" and "R384 to R580" in g.expected and "590.48.01" in g.observed
    assert "R580" in g.hint and "newer GPUs" in g.hint
    drv = DriverInfo(
        "580.95.05", "13.0", "kernel module", gpus=[{"name": "Tesla V100-SXM2-32GB", "cc": "7.0"}]
    )
    assert by_check(run(lock, torch=FakeTorch(), driver=drv))["driver.gpu.0"].status == "pass"


def test_the_lock_arch_list_is_checked_without_a_gpu():
    """An aarch64 torch (sm_80 sm_90 sm_100 sm_110 sm_120) against a lock written with x86_64's
    list: caught on a machine with no GPU (no driver, under emulation), where gpu.* are skipped."""
    lock = make_lock()
    lock["hardware"] = dict(
        lock["hardware"], arch_list=["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    )
    aarch64 = ("sm_80", "sm_90", "sm_100", "sm_110", "sm_120")
    f = by_check(run(lock, torch=FakeTorch(devices=(), arch_list=aarch64), driver=None, nodes=()))
    assert f["gpu"].status == "skip"
    a = f["torch.arch_list"]
    assert a.status == "warn" and "sm_110" in a.observed and "sm_75" in a.expected
    lock["hardware"]["arch_list"] = list(aarch64)
    assert (
        by_check(run(lock, torch=FakeTorch(devices=(), arch_list=aarch64), driver=None, nodes=()))[
            "torch.arch_list"
        ].status
        == "pass"
    )


def test_compiled_arches_fall_back_to_the_flags_when_the_list_needs_a_gpu():
    from types import SimpleNamespace

    from envspec.verify.torchprobe import compiled_arches

    t = FakeTorch(devices=(), arch_list=())  # a release whose get_arch_list() is [] without a GPU
    t._C = SimpleNamespace(_cuda_getArchFlags=lambda: "sm_80 sm_90 compute_90")
    assert compiled_arches(t) == ["sm_80", "sm_90", "compute_90"]
    t._C = SimpleNamespace()  # a CPU build: nothing
    assert compiled_arches(t) == []

"""The verifier's node health checks (issue 31) over a fake NVML: recorded answers played back
behind the same ctypes calls (test_verify_fakes.FakeNvml), one fault at a time; the XID reader; the exact GEMM
that finds silent data corruption, on the CPU; the full level's speed judgements with their
measurements faked."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from test_verify_fakes import GPU_WORK, FakeNvml, FakeSystem, FakeTorch, by_check, make_lock

from envspec.verify import health, rates, render, torchprobe
from envspec.verify.checks import run_checks

DATA = Path(__file__).parent.parent / "data" / "verify"
HEALTHY = {
    "format": 1,
    "gpus": [
        {
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "bus_id": "00000000:18:00.0",
            "ecc_enabled": True,
            "ecc_uncorrected": 0,
            "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": 0, "failed": 0},
            "retired_pages": None,
            "event_reasons": health.IDLE,
            "persistence": 1,
            "pcie": {"gen": 1, "max_gen": 5, "gpu_max_gen": 5, "width": 16, "max_width": 16},
            "nvlinks": [1] * 18,
        }
    ],
}


def recorded(n: int = 1, **over) -> dict:
    """HEALTHY with n GPUs, GPU 0's answers changed by ``over``."""
    rec = copy.deepcopy(HEALTHY)
    rec["gpus"] = [
        dict(copy.deepcopy(rec["gpus"][0]), index=i, bus_id=f"00000000:{0x18 + i:02x}:00.0")
        for i in range(n)
    ]
    rec["gpus"][0].update(over)
    return rec


def findings(rec: dict) -> dict:
    nvml = health.Nvml(FakeNvml(rec))
    gpus = health.read_all(nvml)
    return {f.check: f for g in gpus for f in health.gpu_findings(g, gpus_in_node=len(gpus))}


def test_the_fake_plays_back_what_was_recorded():
    nvml = health.Nvml(FakeNvml(recorded(2)))
    assert health.record(nvml) == recorded(2)


def test_a_healthy_gpu_passes_every_check():
    f = findings(recorded(2))
    for name in ("ecc", "row_remap", "throttle", "persistence", "pcie", "nvlink"):
        assert f[f"health.gpu.0.{name}"].status == "pass", f[f"health.gpu.0.{name}"]
    assert "18 of 18 up" in f["health.gpu.0.nvlink"].observed
    assert "idle" in f["health.gpu.0.pcie"].observed  # gen 1 of 5 at idle: the link saves power


@pytest.mark.parametrize(
    "over, check, status, words, remedy",
    [
        ({"ecc_uncorrected": 3}, "ecc", "fail", "3 uncorrected", "RMA"),
        (
            {"remapped_rows": {"correctable": 0, "uncorrectable": 1, "pending": 1, "failed": 0}},
            "row_remap",
            "fail",
            "waits for a GPU reset",
            "reset the GPU",
        ),
        (
            {"remapped_rows": {"correctable": 0, "uncorrectable": 9, "pending": 0, "failed": 1}},
            "row_remap",
            "fail",
            "failed",
            "RMA",
        ),
        (
            {"remapped_rows": None, "retired_pages": {"dbe": 2, "sbe": 0, "pending": 1}},
            "retired_pages",
            "fail",
            "waits for a reboot",
            "reboot",
        ),
        (
            {"event_reasons": health.HW_SLOWDOWN | health.SW_POWER_CAP},
            "throttle",
            "fail",
            "hardware slowdown",
            "drain the node",
        ),
        (
            {"event_reasons": health.HW_POWER_BRAKE},
            "throttle",
            "fail",
            "power brake",
            "power supply",
        ),
        ({"event_reasons": health.SW_POWER_CAP}, "throttle", "pass", "power cap", ""),
        ({"persistence": 0}, "persistence", "warn", "off", "nvidia-persistenced"),
        (
            {"pcie": {"gen": 5, "max_gen": 5, "gpu_max_gen": 5, "width": 8, "max_width": 16}},
            "pcie",
            "fail",
            "gen 5 x8",
            "reseat",
        ),
        (
            {
                "event_reasons": 0,
                "pcie": {"gen": 3, "max_gen": 5, "gpu_max_gen": 5, "width": 16, "max_width": 16},
            },
            "pcie",
            "warn",
            "gen 3 x16",
            "reseat",
        ),
        ({"nvlinks": [1] * 17 + [0]}, "nvlink", "fail", "down: link(s) 17", "fabricmanager"),
    ],
)
def test_each_fault_is_found_with_its_remedy(over, check, status, words, remedy):
    f = findings(recorded(2, **over))[f"health.gpu.0.{check}"]
    assert f.status == status, f
    assert words in f.observed, f
    assert remedy in f.hint, f
    assert findings(recorded(2, **over))[
        "health.gpu.1." + check.replace("retired_pages", "row_remap")
    ].status in ("pass", "skip"), "the fault is GPU 0's alone"


def test_what_a_gpu_does_not_have_is_skipped_not_failed():
    f = findings(
        recorded(
            1,
            ecc_enabled=None,
            ecc_uncorrected=None,
            remapped_rows=None,
            retired_pages=None,
            event_reasons=None,
            persistence=None,
            pcie={},
            nvlinks=[None] * 18,
        )
    )
    assert {x.status for x in f.values()} == {"skip"}, {k: x.status for k, x in f.items()}
    assert "health.gpu.0.persistence" not in f  # nothing to say
    # one GPU whose NVLinks exist but none is up: no peer to link to
    f = findings(recorded(1, nvlinks=[0] * 18))
    assert (
        f["health.gpu.0.nvlink"].status == "skip" and "one GPU" in f["health.gpu.0.nvlink"].observed
    )


def test_xids_are_read_from_the_kernel_log_by_gpu():
    bus = {"00000000:18:00.0": 0, "00000000:19:00.0": 1}
    log = (
        "6,1234,5678,-;NVRM: Xid (PCI:0000:19:00): 79, pid=0, name=, GPU has fallen off the bus.\n"
        "4,1235,5679,-;NVRM: Xid (PCI:0000:18:00): 13, pid=42, Graphics Exception\n"
    )
    (f,) = health.xid_findings(log, bus)
    assert (
        f.status == "fail"
        and "GPU 1: Xid 79 (GPU has fallen off the bus)" in f.observed
        and "RMA" in f.hint
    )
    assert f.data == {"events": 2, "xids": [13, 79]}
    (f,) = health.xid_findings("NVRM: Xid (PCI:0000:18:00): 63, pid=0, Row Remapper", bus)
    assert f.status == "warn" and "GPU 0" in f.observed
    (f,) = health.xid_findings("NVRM: Xid (PCI:0000:18:00): 13, pid=42, Graphics Exception", bus)
    assert f.status == "pass" and "application" in f.observed
    (f,) = health.xid_findings(None, bus)
    assert f.status == "skip" and "CAP_SYSLOG" in f.observed


def test_the_kernel_log_is_read_without_blocking(tmp_path):
    p = tmp_path / "kmsg"
    p.write_text("6,1,2,-;NVRM: Xid (PCI:0000:18:00): 48, pid=0, DBE\n")
    assert "Xid" in health.read_kmsg(str(p))
    assert health.read_kmsg(str(tmp_path / "absent")) is None


def test_the_whole_run_reports_health_in_json_and_metrics():
    rec = recorded(1, ecc_uncorrected=2)
    r = run_checks(
        make_lock(),
        level="quick",
        system=FakeSystem(torch=FakeTorch(), nvml=rec, kmsg=""),
        skip=GPU_WORK,
    )
    f = by_check(r)
    assert f["health.gpu.0.ecc"].status == "fail" and not r.ok
    assert f["health.xid"].status == "pass"
    assert "health" in r.timings
    doc = json.loads(r.to_json())
    assert any(
        x["check"] == "health.gpu.0.ecc" and x["data"]["uncorrected"] == 2 for x in doc["findings"]
    )
    prom = render.prometheus(r, now=0)
    assert "envspec_verify_check{" in prom and 'check="health.gpu.0.ecc",status="fail"} 1' in prom
    assert "envspec_verify_gpu_ecc_uncorrected{" in prom and 'gpu="0"} 2' in prom
    assert "envspec_verify_xid_events{" in prom and "envspec_verify_gpu_nvlinks_up{" in prom
    # the start-up hook reads no health: it starts in a tenth of a second
    r = run_checks(
        make_lock(), level="startup", system=FakeSystem(torch=FakeTorch(), nvml=rec), skip=GPU_WORK
    )
    assert not any(x.check.startswith("health") for x in r.findings)


def test_no_nvml_is_a_skip_that_says_why():
    r = run_checks(make_lock(), level="quick", system=FakeSystem(torch=FakeTorch()), skip=GPU_WORK)
    f = by_check(r)
    assert f["health"].status == "skip" and "libnvidia-ml.so.1" in f["health"].observed


def test_the_exact_gemm_is_exact_and_finds_a_wrong_bit():
    import torch

    ref = torchprobe.exact_gemm_reference(torch, n=256)
    res = torchprobe.exact_gemm(torch, torch.device("cpu"), ref)
    assert res["ok"] and res["agree"] and len(res["digest"]) == 16
    again = torchprobe.exact_gemm(
        torch, torch.device("cpu"), torchprobe.exact_gemm_reference(torch, n=256)
    )
    assert again["digest"] == res["digest"], "the same inputs everywhere: the same digest"
    bad = dict(ref, rows=ref["rows"].clone())
    bad["rows"][7] += 1  # what a GPU that flips a bit of one product would give
    res = torchprobe.exact_gemm(torch, torch.device("cpu"), bad)
    assert not res["ok"] and res["wrong"] == ["tf32", "fp32"]


class _Measured:
    """torchprobe's measurements replaced by given numbers (the judgements are what is tested)."""

    def __init__(self, monkeypatch, *, bf16=(800.0,), copy=(50.0, 52.0), busbw=470.0, exact=True):
        rates_by_gpu = list(bf16)
        monkeypatch.setattr(
            torchprobe,
            "gemm_tflops",
            lambda t, i, kind, **k: rates_by_gpu[i] if kind == "bf16" else rates_by_gpu[i] / 2,
        )
        monkeypatch.setattr(
            torchprobe, "copy_gbps", lambda t, i, **k: {"h2d": copy[0], "d2h": copy[1]}
        )
        monkeypatch.setattr(torchprobe, "exact_gemm_reference", lambda t, **k: {})
        monkeypatch.setattr(
            torchprobe,
            "exact_gemm",
            lambda t, d, ref: {
                "ok": exact,
                "agree": exact,
                "wrong": [] if exact else ["tf32"],
                "digest": "0123456789abcdef",
            },
        )
        monkeypatch.setattr(
            torchprobe,
            "allreduce_local",
            lambda t, devs, **k: {
                "correct": True,
                "wrong_devices": [],
                "expected_sum": 36.0,
                "sizes": [
                    {
                        "bytes": 1 << 30,
                        "time_us": 1.0,
                        "algbw_gbps": busbw * 8 / 14,
                        "busbw_gbps": busbw,
                    }
                ],
            },
        )


def _full(monkeypatch, n=1, name="NVIDIA H100 80GB HBM3", **measured):
    _Measured(monkeypatch, **measured)

    class Dev(FakeTorch):
        def __init__(self):
            super().__init__(devices=((name, 9, 0),) * n)
            self.device = lambda kind, i: (kind, i)

    rec = recorded(n, name=name)
    return run_checks(
        make_lock(),
        level="full",
        system=FakeSystem(torch=Dev(), nvml=rec, kmsg=""),
        skip=GPU_WORK + ("imports", "torch.compile.toolchain"),
    )


def test_copy_bandwidth_is_judged_against_the_pcie_link(monkeypatch):
    r = _full(monkeypatch, copy=(50.0, 52.0))
    assert "envspec_verify_copy_gbps{" in render.prometheus(r, now=0)
    f = by_check(r)
    assert f["perf.0.h2d"].status == "pass" and "PCIe gen 5 x16" in f["perf.0.h2d"].expected
    floor = rates.COPY_FRACTION * 16 * health.PCIE_GBS_PER_LANE[5]
    assert f["perf.0.h2d"].data["expected_gbps"] == pytest.approx(floor) == pytest.approx(48.0)
    f = by_check(_full(monkeypatch, copy=(30.0, 12.0)))
    assert f["perf.0.h2d"].status == "warn" and f["perf.0.d2h"].status == "fail"
    assert "numactl" in f["perf.0.d2h"].hint


def test_the_slowest_gpu_within_ten_percent_of_the_fastest(monkeypatch):
    f = by_check(_full(monkeypatch, n=4, bf16=(800.0, 790.0, 805.0, 700.0)))
    g = f["perf.gemm_spread"]
    assert (
        g.status == "fail"
        and "GPU 3 700 TFLOP/s = 87% of GPU 2's 805" in g.observed
        and "RMA" in g.hint
    )
    assert (
        by_check(_full(monkeypatch, n=4, bf16=(800.0, 790.0, 805.0, 760.0)))[
            "perf.gemm_spread"
        ].status
        == "pass"
    )
    assert by_check(_full(monkeypatch, n=1))["perf.gemm_spread"].status == "skip"


def test_silent_data_corruption_fails_the_gpu_and_enters_the_fingerprint(monkeypatch):
    r = _full(monkeypatch, n=2)
    assert (
        by_check(r)["health.gpu.1.sdc"].status == "pass"
        and r.fingerprint["gemm_result"] == "0123456789abcdef"
    )
    f = by_check(_full(monkeypatch, n=2, exact=False))["health.gpu.0.sdc"]
    assert f.status == "fail" and "wrong bits" in f.observed and "RMA" in f.hint


def test_all_reduce_bus_bandwidth_at_eight_gpus(monkeypatch):
    f = by_check(_full(monkeypatch, n=8, busbw=470.0))
    assert (
        f["nccl.allreduce.busbw"].status == "pass"
        and ">= 460 GB/s" in f["nccl.allreduce.busbw"].expected
    )
    f = by_check(_full(monkeypatch, n=8, busbw=300.0))
    assert f["nccl.allreduce.busbw"].status == "fail" and "nvlink" in f["nccl.allreduce.busbw"].hint
    f = by_check(_full(monkeypatch, n=8, name="NVIDIA H200", busbw=440.0))
    assert (
        f["nccl.allreduce.busbw"].status == "pass"
        and ">= 431 GB/s" in f["nccl.allreduce.busbw"].expected
    )
    assert "nccl.allreduce.busbw" not in by_check(
        _full(monkeypatch, n=4, busbw=300.0)
    )  # no sourced figure


def test_the_recorded_answers_of_real_gpus_pass():
    """What real, healthy GPUs answered (recorded on the device machine: docs/verify-h200.md)."""
    paths = sorted(DATA.glob("nvml-*.json"))
    if not paths:
        pytest.skip("no recorded NVML answers in tests/data/verify")
    for p in paths:
        rec = json.loads(p.read_text())
        f = findings(rec)
        bad = {k: (x.status, x.observed) for k, x in f.items() if x.status in ("fail", "warn")}
        assert not bad, (p.name, bad)

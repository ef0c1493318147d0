"""Node health: the GPU faults that stop jobs, read through NVML and the kernel log (issue 31).

NVML is ``libnvidia-ml.so.1`` (which the NVIDIA container toolkit mounts) called through ctypes,
so the verifier still needs nothing but the standard library (and torch for the full level's
measurements, which live in torchprobe.py). ``Nvml`` wraps the calls; each answers its value, or
None where the GPU or the driver does not have it (no ECC on a GeForce, no NVLink on a PCIe card, a
function an old driver lacks). ``gpu_findings`` turns one GPU's answers into findings in the usual
shape, with a hint naming the remedy (reset, drain, reseat, RMA); ``xid_findings`` reads the XID
events of the kernel log since boot. ``record`` captures a machine's answers as JSON
(tests/data/verify/nvml-*.json), which the tests' ``FakeNvml`` (tests/unit/test_verify_fakes.py)
plays back behind the same ctypes calls.

Run ``python -m envspec.verify.health --record`` on a GPU machine to print its answers.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from .model import FAIL, PASS, SKIP, WARN, Finding, Status

NVML_SUCCESS = 0
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT = 1
NVML_NVLINK_MAX_LINKS = 18

# clocks event (throttle) reasons, nvml.h's nvmlClocksEventReason*
IDLE = 0x1
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
# the reasons that mean a sick or badly cooled GPU (a power cap under load is the normal state)
BAD_REASONS = {
    HW_SLOWDOWN: "hardware slowdown",
    HW_THERMAL: "hardware thermal slowdown",
    HW_POWER_BRAKE: "hardware power brake (the PSU or the chassis asked for it)",
    SW_THERMAL: "software thermal slowdown",
}

# PCIe: usable GB/s per lane and direction, per generation (the line rate after encoding)
PCIE_GBS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


class _PciInfo(ctypes.Structure):  # nvmlPciInfo_t (v3)
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


Handle = ctypes.c_void_p  # an nvmlDevice_t
_Int = ctypes.c_uint | ctypes.c_ulonglong | ctypes.c_int  # what NVML writes a number into


class Nvml:
    """The NVML calls the health checks make. ``lib`` is a ``ctypes.CDLL`` of libnvidia-ml.so.1, or
    a ``FakeNvml`` that answers the same calls."""

    def __init__(self, lib: object) -> None:
        self.lib = lib

    @classmethod
    def open(cls, path: str = "libnvidia-ml.so.1") -> Nvml | None:
        try:
            lib = ctypes.CDLL(path)
            if lib.nvmlInit_v2() != NVML_SUCCESS:
                return None
        except (OSError, AttributeError):
            return None
        return cls(lib)

    def close(self) -> None:
        fn = getattr(self.lib, "nvmlShutdown", None)
        if fn is not None:
            fn()

    def _call(self, name: str, *args: object) -> int | None:
        """The call's return code; None where the library has no such function."""
        try:
            fn = getattr(self.lib, name)
        except AttributeError:
            return None
        return int(fn(*args))

    def count(self) -> int:
        n = ctypes.c_uint()
        return (
            n.value if self._call("nvmlDeviceGetCount_v2", ctypes.byref(n)) == NVML_SUCCESS else 0
        )

    def handle(self, index: int) -> Handle | None:
        h = ctypes.c_void_p()
        return (
            h
            if self._call("nvmlDeviceGetHandleByIndex_v2", index, ctypes.byref(h)) == NVML_SUCCESS
            else None
        )

    def name(self, h: Handle) -> str:
        buf = ctypes.create_string_buffer(96)
        return (
            buf.value.decode()
            if self._call("nvmlDeviceGetName", h, buf, 96) == NVML_SUCCESS
            else ""
        )

    def _uint(
        self, name: str, h: Handle, *extra: object, ctype: type[_Int] = ctypes.c_uint
    ) -> int | None:
        v = ctype()
        return (
            int(v.value) if self._call(name, h, *extra, ctypes.byref(v)) == NVML_SUCCESS else None
        )

    def ecc_uncorrected(self, h: Handle) -> int | None:
        """Uncorrected ECC errors since the driver loaded (volatile); None without ECC."""
        return self._uint(
            "nvmlDeviceGetTotalEccErrors",
            h,
            NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            NVML_VOLATILE_ECC,
            ctype=ctypes.c_ulonglong,
        )

    def ecc_enabled(self, h: Handle) -> bool | None:
        cur, pend = ctypes.c_int(), ctypes.c_int()
        if (
            self._call("nvmlDeviceGetEccMode", h, ctypes.byref(cur), ctypes.byref(pend))
            != NVML_SUCCESS
        ):
            return None
        return bool(cur.value)

    def remapped_rows(self, h: Handle) -> dict[str, int] | None:
        """Row remapping (Ampere and newer): rows remapped for correctable and uncorrectable errors,
        whether a remap waits for a GPU reset, whether a remap failed."""
        c, u, p, f = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
        if (
            self._call(
                "nvmlDeviceGetRemappedRows",
                h,
                ctypes.byref(c),
                ctypes.byref(u),
                ctypes.byref(p),
                ctypes.byref(f),
            )
            != NVML_SUCCESS
        ):
            return None
        return {
            "correctable": c.value,
            "uncorrectable": u.value,
            "pending": p.value,
            "failed": f.value,
        }

    def retired_pages(self, h: Handle) -> dict[str, int] | None:
        """Page retirement (before Ampere): pages retired for double-bit and repeated single-bit
        errors, and whether a retirement waits for a reboot."""
        out: dict[str, int] = {}
        for key, cause in (
            ("dbe", NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT),
            ("sbe", NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT),
        ):
            n = ctypes.c_uint(0)
            rc = self._call("nvmlDeviceGetRetiredPages", h, cause, ctypes.byref(n), None)
            if rc not in (NVML_SUCCESS, NVML_ERROR_INSUFFICIENT_SIZE):
                return None
            out[key] = n.value
        pending = self._uint("nvmlDeviceGetRetiredPagesPendingStatus", h, ctype=ctypes.c_int)
        out["pending"] = pending or 0
        return out

    def event_reasons(self, h: Handle) -> int | None:
        """The active clocks event (throttle) reasons, a bit mask."""
        for fn in (
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        ):
            v = self._uint(fn, h, ctype=ctypes.c_ulonglong)
            if v is not None:
                return v
        return None

    def persistence(self, h: Handle) -> int | None:
        return self._uint("nvmlDeviceGetPersistenceMode", h, ctype=ctypes.c_int)

    def pcie(self, h: Handle) -> dict[str, int | None]:
        return {
            "gen": self._uint("nvmlDeviceGetCurrPcieLinkGeneration", h),
            "max_gen": self._uint("nvmlDeviceGetMaxPcieLinkGeneration", h),
            "gpu_max_gen": self._uint("nvmlDeviceGetGpuMaxPcieLinkGeneration", h),
            "width": self._uint("nvmlDeviceGetCurrPcieLinkWidth", h),
            "max_width": self._uint("nvmlDeviceGetMaxPcieLinkWidth", h),
        }

    def nvlinks(self, h: Handle) -> list[int | None]:
        """Each NVLink's state (1 up, 0 down), None where the GPU has no such link."""
        out: list[int | None] = []
        for link in range(NVML_NVLINK_MAX_LINKS):
            v = ctypes.c_int()
            rc = self._call("nvmlDeviceGetNvLinkState", h, link, ctypes.byref(v))
            out.append(int(v.value) if rc == NVML_SUCCESS else None)
        return out

    def bus_id(self, h: Handle) -> str:
        pci = _PciInfo()
        if self._call("nvmlDeviceGetPciInfo_v3", h, ctypes.byref(pci)) != NVML_SUCCESS:
            return ""
        bus: bytes = pci.busId
        return bus.decode(errors="replace")


@dataclass
class GpuHealth:
    """What NVML answered for one GPU (None: not supported there)."""

    index: int
    name: str = ""
    bus_id: str = ""
    ecc_enabled: bool | None = None
    ecc_uncorrected: int | None = None
    remapped_rows: dict[str, int] | None = None
    retired_pages: dict[str, int] | None = None
    event_reasons: int | None = None
    persistence: int | None = None
    pcie: dict[str, int | None] = field(default_factory=dict)
    nvlinks: list[int | None] = field(default_factory=list)


def read_gpu(nvml: Nvml, index: int) -> GpuHealth | None:
    h = nvml.handle(index)
    if h is None:
        return None
    return GpuHealth(
        index=index,
        name=nvml.name(h),
        bus_id=nvml.bus_id(h),
        ecc_enabled=nvml.ecc_enabled(h),
        ecc_uncorrected=nvml.ecc_uncorrected(h),
        remapped_rows=nvml.remapped_rows(h),
        retired_pages=nvml.retired_pages(h),
        event_reasons=nvml.event_reasons(h),
        persistence=nvml.persistence(h),
        pcie=nvml.pcie(h),
        nvlinks=nvml.nvlinks(h),
    )


def read_all(nvml: Nvml) -> list[GpuHealth]:
    return [g for g in (read_gpu(nvml, i) for i in range(nvml.count())) if g is not None]


# -- findings --------------------------------------------------------------------------------------

DRAIN = "drain the node (no new jobs), "
RESET = "reset the GPU when it is idle (nvidia-smi -r -i {i}, or reboot the node)"


def _f(
    check: str,
    status: Status,
    expected: str,
    observed: str,
    hint: str = "",
    data: Mapping[str, object] | None = None,
    **more: object,
) -> Finding:
    return Finding(
        check,
        status,
        expected=expected,
        observed=observed,
        hint=hint,
        data={**(data or {}), **more},
    )


def gpu_findings(g: GpuHealth, *, gpus_in_node: int) -> list[Finding]:
    """One GPU's health findings (``health.gpu.N.*``), one function a check."""
    p = f"health.gpu.{g.index}"
    out = [_ecc_finding(p, g), _memory_repair_finding(p, g), _throttle_finding(p, g)]
    if g.persistence is not None:
        out.append(_persistence_finding(p, g.persistence))
    out += [_pcie_finding(p, g), _nvlink_finding(p, g, gpus_in_node)]
    return out


def _ecc_finding(p: str, g: GpuHealth) -> Finding:
    want = "no uncorrected ECC error since the driver loaded"
    if g.ecc_uncorrected is None:
        return _f(
            f"{p}.ecc",
            SKIP,
            want,
            "this GPU reports no ECC counters (no ECC memory, or ECC off)"
            if g.ecc_enabled is not True
            else "NVML gave no ECC counter",
        )
    if g.ecc_uncorrected > 0:
        return _f(
            f"{p}.ecc",
            FAIL,
            want,
            f"{g.ecc_uncorrected} uncorrected ECC error(s)",
            DRAIN + RESET.format(i=g.index) + "; if errors come back, RMA the GPU",
            uncorrected=g.ecc_uncorrected,
        )
    return _f(f"{p}.ecc", PASS, want, "0", uncorrected=0)


def _memory_repair_finding(p: str, g: GpuHealth) -> Finding:
    """Row remapping (Ampere and newer), else page retirement (older), else nothing to read."""
    rr, rp = g.remapped_rows, g.retired_pages
    if rr is not None:
        if rr["failed"]:
            return _f(
                f"{p}.row_remap",
                FAIL,
                "no failed row remap",
                "a row remap failed: the GPU ran out of spare rows",
                DRAIN + "and RMA the GPU",
                data=rr,
            )
        if rr["pending"]:
            return _f(
                f"{p}.row_remap",
                FAIL,
                "no row remap pending",
                f"a row remap waits for a GPU reset ({rr['uncorrectable']} row(s) remapped for "
                "uncorrectable errors)",
                DRAIN + RESET.format(i=g.index) + ", which applies the remap",
                data=rr,
            )
        return _f(
            f"{p}.row_remap",
            PASS,
            "no row remap pending or failed",
            f"{rr['correctable']} + {rr['uncorrectable']} row(s) remapped (correctable + "
            "uncorrectable), none pending",
            data=rr,
        )
    if rp is not None:
        if rp["pending"]:
            return _f(
                f"{p}.retired_pages",
                FAIL,
                "no page retirement pending",
                f"a page retirement waits for a reboot ({rp['dbe']} double-bit, {rp['sbe']} "
                "single-bit pages retired)",
                DRAIN + "and reboot it to retire the pages",
                data=rp,
            )
        return _f(
            f"{p}.retired_pages",
            PASS,
            "no page retirement pending",
            f"{rp['dbe']} double-bit and {rp['sbe']} single-bit page(s) retired, none pending",
            data=rp,
        )
    return _f(
        f"{p}.row_remap",
        SKIP,
        "no row remap or page retirement pending",
        "this GPU reports neither (no ECC memory)",
    )


def _throttle_finding(p: str, g: GpuHealth) -> Finding:
    want = "no hardware slowdown, thermal or power-brake throttling"
    if g.event_reasons is None:
        return _f(f"{p}.throttle", SKIP, want, "NVML gave no clocks event reasons")
    bad = [words for bit, words in BAD_REASONS.items() if g.event_reasons & bit]
    hint = (
        "check the GPU's temperature, fans and airflow, and the power supply "
        "(nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER); drain the node until it clears; "
        "reseat the GPU if it is one GPU of a cool node"
    )
    return _f(
        f"{p}.throttle",
        FAIL if bad else PASS,
        want,
        "; ".join(bad) if bad else _reasons_text(g.event_reasons),
        hint if bad else "",
        reasons=g.event_reasons,
    )


def _persistence_finding(p: str, mode: int) -> Finding:
    hint = (
        "without it the driver tears the GPU down between processes: each job start pays seconds "
        "of initialisation; run nvidia-persistenced (or nvidia-smi -pm 1)"
    )
    return _f(
        f"{p}.persistence",
        PASS if mode else WARN,
        "persistence mode on",
        "on" if mode else "off",
        "" if mode else hint,
    )


def _reasons_text(mask: int) -> str:
    if mask == 0:
        return "none"
    names = {
        IDLE: "idle",
        0x2: "application clocks setting",
        SW_POWER_CAP: "power cap (normal under load)",
        0x10: "sync boost",
        0x100: "display clocks",
    }
    words = [w for bit, w in names.items() if mask & bit]
    return ", ".join(words) or f"0x{mask:x}"


def _pcie_finding(p: str, g: GpuHealth) -> Finding:
    pc = g.pcie
    gen, max_gen, width, max_width = (
        pc.get("gen"),
        pc.get("max_gen"),
        pc.get("width"),
        pc.get("max_width"),
    )
    want = "the PCIe link at the width and generation the GPU and the slot allow"
    if gen is None or max_gen is None or width is None or max_width is None:
        return _f(
            f"{p}.pcie",
            SKIP,
            want,
            "NVML gave no PCIe link state (an integrated GPU, or a virtual one)",
        )
    data = {k: v for k, v in pc.items() if v is not None}
    now = f"gen {gen} x{width}, the link allows gen {max_gen} x{max_width}"
    if width < max_width:
        return _f(
            f"{p}.pcie",
            FAIL,
            want,
            now,
            "the link trained narrower than its slot: a badly seated GPU, a "
            "damaged riser or slot; drain the node and reseat the GPU (RMA if it persists)",
            data=data,
        )
    if gen < max_gen:
        idle = bool(g.event_reasons is not None and g.event_reasons & IDLE)
        if idle:  # an idle GPU drops its link to a low generation to save power: not a fault
            return _f(
                f"{p}.pcie",
                PASS,
                want,
                now + " (the GPU is idle: the link drops its speed then; the "
                "full level's copy bandwidth measures it under load)",
                data=data,
            )
        return _f(
            f"{p}.pcie",
            WARN,
            want,
            now + " while the GPU is busy",
            "a link below its generation under load: check the slot's BIOS setting, then reseat the GPU; "
            "the full level's copy bandwidth says what it costs",
            data=data,
        )
    return _f(f"{p}.pcie", PASS, want, now, data=data)


def _nvlink_finding(p: str, g: GpuHealth, gpus_in_node: int) -> Finding:
    links = [s for s in g.nvlinks if s is not None]
    want = "every NVLink of the GPU up"
    if not links:
        return _f(f"{p}.nvlink", SKIP, want, "this GPU has no NVLink (or NVML gives no link state)")
    up = sum(1 for s in links if s == 1)
    down = [i for i, s in enumerate(g.nvlinks) if s == 0]
    if up == 0 and gpus_in_node <= 1:
        return _f(
            f"{p}.nvlink",
            SKIP,
            want,
            f"{len(links)} link(s), none up: this node shows one GPU, with no "
            "peer or NVSwitch to link to",
            links=len(links),
            up=0,
        )
    if down:
        return _f(
            f"{p}.nvlink",
            FAIL,
            want,
            f"{up} of {len(links)} up; down: link(s) {', '.join(map(str, down))}",
            "a link down halves or worse this GPU's all-reduce bandwidth: drain the node, reset the GPUs "
            "(or reboot), check the NVSwitch fabric manager (systemctl status nvidia-fabricmanager); RMA the "
            "board if it stays down",
            links=len(links),
            up=up,
        )
    return _f(f"{p}.nvlink", PASS, want, f"{up} of {len(links)} up", links=len(links), up=up)


# -- XID events ------------------------------------------------------------------------------------

# XIDs that mean the GPU or its memory failed (drain it), and those that warn of it; the others are
# most often an application's own errors (13, 31, 43: a bad kernel, an illegal address)
XID_FAIL = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    64: "row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
XID_WARN = {
    63: "row remapping event (a reset applies it)",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
}
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")


def parse_xids(text: str) -> list[tuple[str, int]]:
    """The (PCI bus id, XID) pairs in kernel log text."""
    return [(m.group(1).lower(), int(m.group(2))) for m in _XID.finditer(text)]


def read_kmsg(path: str = "/dev/kmsg", limit: int = 8 << 20) -> str | None:
    """The kernel log since boot (what the ring buffer still holds), or None where it cannot be
    read (not root, a container without CAP_SYSLOG)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    chunks: list[bytes] = []
    total = 0
    try:
        while total < limit:
            try:
                rec = os.read(fd, 8192)
            except BlockingIOError:
                break  # the end of the buffer
            except OSError as e:
                if e.errno == 32:  # EPIPE: a record was overwritten while reading; go on
                    continue
                break
            if not rec:
                break
            chunks.append(rec)
            total += len(rec)
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def xid_findings(text: str | None, bus_ids: dict[str, int]) -> list[Finding]:
    """``health.xid``: the XID events in the kernel log, by GPU (``bus_ids``: NVML bus id -> index)."""
    want = "no XID error of a failing GPU since boot"
    if text is None:
        return [
            _f(
                "health.xid",
                SKIP,
                want,
                "the kernel log cannot be read here (/dev/kmsg needs root, and a "
                "container needs CAP_SYSLOG)",
                "read it on the host: dmesg | grep -i xid",
            )
        ]
    events = parse_xids(text)

    by_key = {pci_key(b): i for b, i in bus_ids.items()}

    def gpu_of(bus: str) -> str:
        i = by_key.get(pci_key(bus))
        return f"GPU {i}" if i is not None else f"PCI {bus}"

    bad = [(gpu_of(b), x) for b, x in events if x in XID_FAIL]
    warn = [(gpu_of(b), x) for b, x in events if x in XID_WARN]
    other = [x for _, x in events if x not in XID_FAIL and x not in XID_WARN]
    data = {"events": len(events), "xids": sorted({x for _, x in events})}
    if bad:
        words = "; ".join(f"{w}: Xid {x} ({XID_FAIL[x]})" for w, x in _uniq(bad))
        return [
            _f(
                "health.xid",
                FAIL,
                want,
                words,
                "drain the node; Xid 79, 48, 95 and 140 mean a reset or a "
                "reboot at least and, when they come back, an RMA; 74 a reseat of the NVLink bridge or the "
                "board; 119/120 a driver upgrade or a reboot",
                data=data,
            )
        ]
    if warn:
        words = "; ".join(f"{w}: Xid {x} ({XID_WARN[x]})" for w, x in _uniq(warn))
        return [
            _f(
                "health.xid",
                WARN,
                want,
                words,
                "watch the GPU: reset it when idle to apply a row remap; "
                "repeated events mean an RMA",
                data=data,
            )
        ]
    observed = (
        "none"
        if not events
        else f"{len(events)} event(s) of XID {', '.join(map(str, sorted(set(other))))} "
        "(an application's errors, not the GPU's)"
    )
    return [_f("health.xid", PASS, want, observed, data=data)]


def pci_key(bus: str) -> tuple[int, int, int] | None:
    """(domain, bus, device) of "0000:18:00" (the kernel's) or "00000000:18:00.0" (NVML's)."""
    m = re.search(r"(?:([0-9a-fA-F]+):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.\d)?$", bus.strip())
    return (int(m.group(1) or "0", 16), int(m.group(2), 16), int(m.group(3), 16)) if m else None


def _uniq(items: list[tuple[str, int]]) -> list[tuple[str, int]]:
    seen: list[tuple[str, int]] = []
    for it in items:
        if it not in seen:
            seen.append(it)
    return seen


# -- recorded answers ------------------------------------------------------------------------------


def record(nvml: Nvml) -> dict[str, object]:
    """Every answer the health checks read, as JSON-able data (the tests' ``FakeNvml`` plays it back)."""
    return {"format": 1, "gpus": [g.__dict__ for g in read_all(nvml)]}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["--record"]:
        print("usage: python -m envspec.verify.health --record", file=sys.stderr)
        return 2
    nvml = Nvml.open()
    if nvml is None:
        print("no NVML here (libnvidia-ml.so.1)", file=sys.stderr)
        return 1
    try:
        print(json.dumps(record(nvml), indent=1))
    finally:
        nvml.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

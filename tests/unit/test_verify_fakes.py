"""Fakes for the verifier's unit tests (no tests here; named test_* to stay in the verify paths): a
stand-in torch module with the attributes the checks read, and a lock builder."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from envspec.verify import health
from envspec.verify.checks import TorchMachine
from envspec.verify.probes import DriverInfo


def content_hash(lock: dict[str, Any]) -> str:
    """The content hash of a lock's tables (all but [meta] and the reader's own ``__*__`` keys)."""
    import hashlib
    import json

    body = {k: v for k, v in lock.items() if k != "meta" and not k.startswith("__")}
    return (
        "sha256:"
        + hashlib.sha256(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
    )


def rehash_text(text: str) -> str:
    """A lock's text with its content hash made right again after an edit (as `envspec lock` writes it)."""
    import tomllib

    data = tomllib.loads(text)
    return text.replace(data["meta"]["content_hash"], content_hash(data), 1)


def make_lock(**over: Any) -> dict[str, Any]:
    """A CUDA lock in the docs/lockfile.md shape, as load_lock returns it; `over` replaces tables."""
    lock: dict[str, Any] = {
        "version": 1,
        "revision": 0,
        "meta": {"name": "h100-train", "content_hash": "sha256:" + "ab" * 32},
        "platform": {"python": "3.12", "venv": "/opt/venv", "base": "debian:bookworm"},
        "hardware": {
            "gpus": ["NVIDIA H100 80GB HBM3"],
            "compute_capabilities": ["9.0"],
            "arch_list": ["sm_80", "sm_90", "sm_100", "sm_120", "compute_120"],
            "driver_floor": "580.65.06",
            "driver_policy": "compat",
        },
        "torch": {
            "version": "2.14.1",
            "local": "",
            "variant": "cu130",
            "cuda": "13.0",
            "cudnn": "9.24.0.43",
            "nccl": "2.30.7",
        },
        "runtime": {"tf32": True, "matmul_precision": "high", "shm_size": "16g", "env": {}},
        "wheels": [{"name": "torch", "version": "2.14.1", "group": "torch"}],
        "__path__": "test.lock",
    }
    lock.update(over)
    return lock


class FakeTorch:
    """Enough of torch for torch_info, tf32_state and memory_free."""

    def __init__(
        self,
        *,
        version="2.14.1",
        cuda="13.0",
        cudnn=92400,
        nccl=(2, 30, 7),
        devices=(("NVIDIA H100 80GB HBM3", 9, 0),),
        arch_list=("sm_80", "sm_90", "sm_100", "sm_120", "compute_120"),
        tf32=(True, True),
        precision="high",
        free_fraction=0.95,
    ):
        self.__version__ = version
        self.version = SimpleNamespace(cuda=cuda, git_version="0123456789abcdef")
        mem = 80 * 2**30
        props = [
            SimpleNamespace(name=n, major=ma, minor=mi, total_memory=mem, multi_processor_count=132)
            for n, ma, mi in devices
        ]
        self._precision = precision
        self.cuda = SimpleNamespace(
            is_available=lambda: bool(cuda) and bool(props),
            device_count=lambda: len(props),
            get_device_properties=lambda i: props[i],
            get_arch_list=lambda: list(arch_list),
            mem_get_info=lambda i: (int(mem * free_fraction), mem),
            nccl=SimpleNamespace(version=lambda: nccl),
        )
        self.backends = SimpleNamespace(
            cudnn=SimpleNamespace(version=lambda: cudnn, allow_tf32=tf32[1]),
            cuda=SimpleNamespace(matmul=SimpleNamespace(allow_tf32=tf32[0])),
        )

    def get_float32_matmul_precision(self) -> str:
        return self._precision


class FakeSystem(TorchMachine):
    def __init__(
        self,
        *,
        env=None,
        driver=DriverInfo("580.95.05", "13.0", "kernel module"),
        torch=None,
        torch_error="No module named 'torch'",
        nodes=("nvidia0", "nvidiactl", "nvidia-uvm"),
        shm=32 * 2**30,
        container=False,
        ib=False,
        sites=(),
        prefix="/opt/venv",
        libs=None,
        nvml=None,
        kmsg=None,
    ) -> None:
        super().__init__()
        self._nvml = (
            nvml  # recorded NVML answers (health.record's shape), played back by health.FakeNvml
        )
        self._kmsg = kmsg
        self.env = dict(env or {})
        self._driver = driver
        self._torch_mod = torch
        self._torch_error = torch_error
        self._nodes = list(nodes)
        self._shm = shm
        self._container = container
        self._ib = ib
        self._sites = [Path(s) for s in sites]
        self._prefix = Path(prefix)
        self._libs = libs or {}

    def hostname(self) -> str:
        return "node-a"

    def prefix(self) -> Path:
        return self._prefix

    def executable(self) -> str:
        return str(self._prefix / "bin" / "python")

    def driver(self):
        return self._driver

    def torch(self):
        return (self._torch_mod, "") if self._torch_mod is not None else (None, self._torch_error)

    def in_container(self) -> bool:
        return self._container

    def device_nodes(self):
        return self._nodes

    def shm_bytes(self):
        return self._shm

    def infiniband(self) -> bool:
        return self._ib

    def nvml(self):
        from envspec.verify import health

        return health.Nvml(FakeNvml(self._nvml)) if self._nvml is not None else None

    def kernel_log(self):
        return self._kmsg

    def site_dirs(self):
        return self._sites

    def loaded_libraries(self):
        return self._libs

    def import_modules(self, modules, timeout):
        """Imported for real, by this python with the fake site directories on its path."""
        import os
        import sys

        from envspec.verify.probes import import_modules

        env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(s) for s in self._sites))
        return import_modules(modules, python=sys.executable, timeout=timeout, env=env)


# checks that need a real GPU or a real torch; unit tests with FakeTorch leave them out
GPU_WORK = ("libs", "numerics", "torch.compile", "integrity")


def by_check(report) -> dict[str, Any]:
    return {f.check: f for f in report.findings}


class FakeNvml:
    """Recorded NVML answers behind the same ctypes calls (for tests): each nvml* function of the
    library that the health checks call, writing its answer through the ctypes pointers it is given
    and returning NVML_ERROR_NOT_SUPPORTED (3) where the record has none."""

    NOT_SUPPORTED = 3

    def __init__(self, recorded: dict[str, Any]) -> None:
        self.gpus = [dict(g) for g in recorded["gpus"]]

    @staticmethod
    def _set(ptr: Any, value: Any) -> None:
        ptr._obj.value = value

    def _gpu(self, h: Any) -> dict[str, Any]:
        return self.gpus[
            (h.value if hasattr(h, "value") else int(h)) - 1
        ]  # handle i + 1: a NULL is no handle

    def nvmlInit_v2(self) -> int:
        return 0

    def nvmlShutdown(self) -> int:
        return 0

    def nvmlDeviceGetCount_v2(self, n: Any) -> int:
        self._set(n, len(self.gpus))
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, i: int, h: Any) -> int:
        if i >= len(self.gpus):
            return 2
        self._set(h, i + 1)
        return 0

    def nvmlDeviceGetName(self, h: Any, buf: Any, size: int) -> int:
        buf.value = self._gpu(h)["name"].encode()[: size - 1]
        return 0

    def nvmlDeviceGetPciInfo_v3(self, h: Any, pci: Any) -> int:
        bus = self._gpu(h).get("bus_id")
        if not bus:
            return self.NOT_SUPPORTED
        pci._obj.busId = bus.encode()
        return 0

    def _value(self, ptr: Any, value: Any) -> int:
        if value is None:
            return self.NOT_SUPPORTED
        self._set(ptr, value)
        return 0

    def nvmlDeviceGetTotalEccErrors(self, h: Any, kind: int, counter: int, out: Any) -> int:
        return self._value(out, self._gpu(h).get("ecc_uncorrected"))

    def nvmlDeviceGetEccMode(self, h: Any, cur: Any, pend: Any) -> int:
        v = self._gpu(h).get("ecc_enabled")
        if v is None:
            return self.NOT_SUPPORTED
        self._set(cur, int(v))
        self._set(pend, int(v))
        return 0

    def nvmlDeviceGetRemappedRows(self, h: Any, c: Any, u: Any, p: Any, f: Any) -> int:
        rr = self._gpu(h).get("remapped_rows")
        if rr is None:
            return self.NOT_SUPPORTED
        for ptr, key in ((c, "correctable"), (u, "uncorrectable"), (p, "pending"), (f, "failed")):
            self._set(ptr, rr[key])
        return 0

    def nvmlDeviceGetRetiredPages(self, h: Any, cause: int, count: Any, addresses: Any) -> int:
        rp = self._gpu(h).get("retired_pages")
        if rp is None:
            return self.NOT_SUPPORTED
        self._set(
            count, rp["dbe" if cause == health.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT else "sbe"]
        )
        return 0

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Any, out: Any) -> int:
        rp = self._gpu(h).get("retired_pages")
        return self._value(out, None if rp is None else rp["pending"])

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any, out: Any) -> int:
        return self._value(out, self._gpu(h).get("event_reasons"))

    def nvmlDeviceGetPersistenceMode(self, h: Any, out: Any) -> int:
        return self._value(out, self._gpu(h).get("persistence"))

    def _pcie(self, h: Any, key: str, out: Any) -> int:
        return self._value(out, (self._gpu(h).get("pcie") or {}).get(key))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: Any, out: Any) -> int:
        return self._pcie(h, "gen", out)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: Any, out: Any) -> int:
        return self._pcie(h, "max_gen", out)

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, h: Any, out: Any) -> int:
        return self._pcie(h, "gpu_max_gen", out)

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: Any, out: Any) -> int:
        return self._pcie(h, "width", out)

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: Any, out: Any) -> int:
        return self._pcie(h, "max_width", out)

    def nvmlDeviceGetNvLinkState(self, h: Any, link: int, out: Any) -> int:
        links = self._gpu(h).get("nvlinks") or []
        return self._value(out, links[link] if link < len(links) else None)

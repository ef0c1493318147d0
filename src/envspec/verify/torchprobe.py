"""Probes that need torch. Every function takes the torch module as an argument (imported
lazily by the caller) so that the verifier runs, and says so, where torch is absent."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from types import ModuleType
from typing import NotRequired, Protocol, TypedDict

# The torch module as imported. mypy does not read torch (pyproject.toml), so what its attributes
# give is untyped until a probe turns it into a str, int, float or bool: every probe here returns
# plain values, in the shapes below.
Torch = ModuleType


class Device(Protocol):
    """A ``torch.device``: the probes pass it on, and read its type."""

    @property
    def type(self) -> str: ...


class Tensor(Protocol):
    """A tensor as the exact GEMM uses it (its inputs are handed from one probe to another)."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    def to(self, *args: object, **kwargs: object) -> Tensor: ...
    def __matmul__(self, other: Tensor) -> Tensor: ...
    def __mul__(self, other: Tensor) -> Tensor: ...
    def sum(self, dim: int) -> Tensor: ...
    def cpu(self) -> Tensor: ...
    def tolist(self) -> list[int]: ...


class TorchDevice(TypedDict):
    """A GPU as torch sees it."""

    index: int
    name: str
    cc: str
    memory_total: int
    sm_count: int
    pci: str


class TorchInfo(TypedDict):
    """The torch this process imported: its release and build, and with a CUDA build its CUDA,
    cuDNN and NCCL, arch list and GPUs."""

    version: str
    local: str
    full: str
    git: str
    cuda: str
    cuda_available: bool
    devices: list[TorchDevice]
    arch_list: list[str]
    cuda_error: NotRequired[str]
    cudnn: NotRequired[str]
    nccl: NotRequired[str]


class Tf32State(TypedDict):
    matmul_allow_tf32: bool
    cudnn_allow_tf32: bool
    matmul_precision: str


class ExactGemmInputs(TypedDict):
    """The silent-data-corruption GEMM's int8 inputs and their exact row and column sums."""

    a: Tensor
    b: Tensor
    rows: object
    cols: object


class ExactGemm(TypedDict):
    """One GPU's exact GEMM: right or not (and which kinds were wrong), its result's digest."""

    ok: bool
    wrong: list[str]
    digest: str
    agree: bool


class AllreduceSize(TypedDict):
    bytes: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float


class Allreduce(TypedDict):
    """An all-reduce across this node's GPUs: correct or not, and its speed at each size."""

    correct: bool
    wrong_devices: list[int] | list[str]
    expected_sum: float
    sizes: list[AllreduceSize]
    note: NotRequired[str]  # how it ran (``checks``): one process, or one a GPU and why


class CompileResult(TypedDict, total=False):
    """What the torch.compile child answered (its JSON line), or why there is no answer."""

    ok: bool
    timeout: bool
    error: str
    device: str
    seconds: float
    traceback: str


# Shared libraries whose loaded bytes must be the locked ones: (key, file-name pattern).
LIB_PATTERNS = (
    ("cudart", re.compile(r"^libcudart\.so")),
    ("cublas", re.compile(r"^libcublas(Lt)?\.so")),
    ("cudnn", re.compile(r"^libcudnn(_\w+)?\.so")),
    ("nccl", re.compile(r"^libnccl\.so")),
)


def import_torch() -> tuple[Torch | None, str]:
    """(torch module or None, error text)."""
    import warnings

    try:
        with warnings.catch_warnings():
            # torch warns at import where numpy is not installed (an image without numpy): not the
            # verifier's business, and a report that starts with a warning reads as a failure
            warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
            import torch  # noqa: PLC0415 (lazy on purpose: verify must run without torch)
    except Exception as e:  # ImportError, or an OSError from a broken CUDA library
        return None, f"{type(e).__name__}: {e}"
    return torch, ""


def split_version(v: str) -> tuple[str, str]:
    public, _, local = v.partition("+")
    return public, local


def cudnn_version(torch: Torch) -> str:
    try:
        v = torch.backends.cudnn.version()
    except Exception:
        return ""
    if not v:
        return ""
    # cuDNN >= 9: major*10000 + minor*100 + patch; cuDNN 8: major*1000 + minor*100 + patch
    if v >= 90000:
        return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
    return f"{v // 1000}.{v % 1000 // 100}.{v % 100}"


def nccl_version(torch: Torch) -> str:
    try:
        v = torch.cuda.nccl.version()
    except Exception:
        return ""
    if isinstance(v, tuple):
        return ".".join(str(x) for x in v[:3])
    # older torch: an int, major*10000 + minor*100 + patch (NCCL >= 2.9)
    return f"{v // 10000}.{v % 10000 // 100}.{v % 100}" if v else ""


def compiled_arches(torch: Torch) -> list[str]:
    """The CUDA arches this torch was compiled for (``torch.cuda.get_arch_list()``; where that
    answers [] without a usable GPU, as some releases do, the flags it reads: ``_cuda_getArchFlags``)."""
    try:
        got = list(torch.cuda.get_arch_list())
    except Exception:
        got = []
    if got:
        return got
    try:
        flags = torch._C._cuda_getArchFlags()
    except Exception:
        return []
    return [f for f in str(flags or "").split() if f.startswith(("sm_", "compute_"))]


def no_torch() -> TorchInfo:
    """What ``torch_info`` says where no torch was imported: no release, no CUDA, no GPU."""
    return {
        "version": "",
        "local": "",
        "full": "",
        "git": "",
        "cuda": "",
        "cuda_available": False,
        "devices": [],
        "arch_list": [],
    }


def torch_info(torch: Torch) -> TorchInfo:
    full = str(torch.__version__)
    public, local = split_version(full)
    info: TorchInfo = {
        "version": public,
        "local": local,
        "full": full,
        "git": str(getattr(torch.version, "git_version", "") or ""),
        "cuda": str(torch.version.cuda or ""),
        "cuda_available": False,
        "devices": [],
        "arch_list": [],
    }
    if not info["cuda"]:
        return info
    try:
        info["cuda_available"] = bool(torch.cuda.is_available())
    except Exception as e:
        info["cuda_error"] = str(e)
    info["cudnn"] = cudnn_version(torch)
    info["nccl"] = nccl_version(torch)
    info["arch_list"] = compiled_arches(torch)
    if info["cuda_available"]:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            info["devices"].append(
                {
                    "index": i,
                    "name": str(p.name),
                    "cc": f"{p.major}.{p.minor}",
                    "memory_total": int(p.total_memory),
                    "sm_count": int(getattr(p, "multi_processor_count", 0)),
                    "pci": _pci_of(p),
                }
            )
    return info


def _pci_of(props: object) -> str:
    """The device's PCI address as NVML writes it ("00000000:18:00.0"), "" where torch does not say."""
    try:
        domain, bus, device = (
            getattr(props, "pci_domain_id"),
            getattr(props, "pci_bus_id"),
            getattr(props, "pci_device_id"),
        )
        return f"{int(domain):08x}:{int(bus):02x}:{int(device):02x}.0"
    except (AttributeError, TypeError, ValueError):
        return ""


def memory_free(torch: Torch, index: int) -> int | None:
    try:
        free, _ = torch.cuda.mem_get_info(index)
        return int(free)
    except Exception:
        return None


def tf32_state(torch: Torch) -> Tf32State:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch >= 2.9 warns on the allow_tf32 spelling
        return {
            "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
            "matmul_precision": str(torch.get_float32_matmul_precision()),
        }


def loaded_libraries(maps: str = "/proc/self/maps") -> dict[str, list[str]]:
    """Files of the CUDA runtime, cuBLAS, cuDNN and NCCL mapped into this process, by key."""
    out: dict[str, list[str]] = {}
    try:
        lines = open(maps, encoding="utf-8", errors="replace").read().splitlines()
    except OSError:
        return out
    seen = set()
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path = parts[5].strip()
        if path.endswith(" (deleted)") or path in seen:
            continue
        seen.add(path)
        base = os.path.basename(path)
        for key, pat in LIB_PATTERNS:
            if pat.match(base):
                out.setdefault(key, []).append(path)
    return {k: sorted(v) for k, v in out.items()}


def init_cuda_libraries(torch: Torch) -> None:
    """Make torch load the libraries it loads lazily: CUDA context, cuBLAS, cuDNN, NCCL."""
    x = torch.ones(64, 64, device="cuda")
    (x @ x).sum().item()
    try:
        conv = torch.nn.functional.conv2d
        conv(torch.ones(1, 1, 8, 8, device="cuda"), torch.ones(1, 1, 3, 3, device="cuda"))
    except Exception:
        pass  # a broken cuDNN shows in the cudnn findings
    torch.cuda.nccl.version()
    torch.cuda.synchronize()


# -- numerics ------------------------------------------------------------------------------

# Normwise relative error ||C - C64||_F / ||C64||_F of an n x n x n product of N(0,1) inputs
# (rounded to the dtype first, so only accumulation and output rounding count). Unit roundoff
# u: bf16 2^-8, fp16 2^-11, tf32 2^-11 (inputs rounded inside the GEMM), fp32 2^-24. A correct
# GEMM stays near u; the bounds allow ~4u (and K-dependent growth for fp32), a broken kernel or a
# bad GPU lands orders of magnitude above.
TOLERANCE = {"bf16": 2e-2, "fp16": 3e-3, "tf32": 3e-3, "fp32": 1e-5}


def matmul_errors(torch: Torch, device: str, n: int = 1024) -> dict[str, float]:
    g = torch.Generator(device=device).manual_seed(1234)
    a32 = torch.randn(n, n, device=device, generator=g)
    b32 = torch.randn(n, n, device=device, generator=g)
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
    out: dict[str, float] = {}
    try:
        for name, dtype, tf32 in (
            ("bf16", torch.bfloat16, False),
            ("fp16", torch.float16, False),
            ("tf32", torch.float32, True),
            ("fp32", torch.float32, False),
        ):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.backends.cuda.matmul.allow_tf32 = tf32
            a, b = a32.to(dtype), b32.to(dtype)
            ref = a.double() @ b.double()
            c = (a @ b).double()
            out[name] = float(torch.linalg.norm(c - ref) / torch.linalg.norm(ref))
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.backends.cuda.matmul.allow_tf32 = saved[0]
            torch.set_float32_matmul_precision(saved[1])
    return out


def cpu_matmul_error(torch: Torch, n: int = 256) -> float:
    g = torch.Generator().manual_seed(1234)
    a = torch.randn(n, n, generator=g)
    b = torch.randn(n, n, generator=g)
    ref = a.double() @ b.double()
    return float(torch.linalg.norm((a @ b).double() - ref) / torch.linalg.norm(ref))


# -- speed ---------------------------------------------------------------------------------


def gemm_tflops(
    torch: Torch, index: int, kind: str, n: int = 8192, warmup: int = 3, iters: int = 10
) -> float:
    """Dense n^3 GEMM rate on one GPU, timed with CUDA events after warm-up."""
    dev = torch.device("cuda", index)
    dtype = torch.bfloat16 if kind == "bf16" else torch.float32
    saved = torch.backends.cuda.matmul.allow_tf32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.backends.cuda.matmul.allow_tf32 = kind == "tf32"
    try:
        with torch.cuda.device(dev):
            a = torch.randn(n, n, device=dev, dtype=dtype)
            b = torch.randn(n, n, device=dev, dtype=dtype)
            c = torch.empty(n, n, device=dev, dtype=dtype)
            for _ in range(warmup):
                torch.mm(a, b, out=c)
            torch.cuda.synchronize(dev)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                torch.mm(a, b, out=c)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
            del a, b, c
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.backends.cuda.matmul.allow_tf32 = saved
    return 2.0 * n**3 * iters / (float(ms) / 1e3) / 1e12


def copy_gbps(
    torch: Torch, index: int, nbytes: int = 256 << 20, iters: int = 5
) -> dict[str, float]:
    """Host-to-device and device-to-host copy bandwidth in GB/s over pinned host memory, timed with
    CUDA events after a warm-up (what a data loader's transfers and a checkpoint's get)."""
    dev = torch.device("cuda", index)
    out: dict[str, float] = {}
    with torch.cuda.device(dev):
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        gpu = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        for name, dst, src in (("h2d", gpu, host), ("d2h", host, gpu)):
            for _ in range(2):
                dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize(dev)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            out[name] = nbytes * iters / (start.elapsed_time(end) / 1e3) / 1e9
        del host, gpu
    return out


EXACT_GEMM_N = 4096
EXACT_GEMM_SEED = 20261205


def exact_gemm_reference(
    torch: Torch, n: int = EXACT_GEMM_N, seed: int = EXACT_GEMM_SEED
) -> ExactGemmInputs:
    """The inputs of the silent-data-corruption GEMM and its exact row and column sums, made on the
    CPU from a fixed seed: every node and every GPU computes the same product of the same inputs."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-1, 2, (n, n), generator=g, dtype=torch.int8)
    b = torch.randint(-1, 2, (n, n), generator=g, dtype=torch.int8)
    a64, b64 = a.to(torch.int64), b.to(torch.int64)
    rows = a64 @ b64.sum(dim=1)  # (A B) 1 = A (B 1)
    cols = a64.sum(dim=0) @ b64  # 1' (A B) = (1' A) B
    return {"a": a, "b": b, "rows": rows, "cols": cols}


def exact_gemm(torch: Torch, dev: Device, ref: ExactGemmInputs) -> ExactGemm:
    """The product of ``ref``'s inputs on one GPU, in TF32 on the tensor cores and in FP32 on the
    CUDA cores. The inputs are -1, 0 or 1, so every product and partial sum is an integer far below
    2^24: exact in TF32 and FP32 in any order of summation, on any GPU and any cuBLAS kernel. So the
    row and column sums must equal the CPU's exactly, and the result's digest is the same everywhere;
    a GPU that computes wrong bits (silent data corruption) differs."""
    import contextlib  # noqa: PLC0415
    import hashlib  # noqa: PLC0415

    saved = torch.backends.cuda.matmul.allow_tf32
    out: ExactGemm = {"ok": True, "wrong": [], "digest": "", "agree": True}
    digests = []
    try:
        with torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext():
            a = ref["a"].to(dev).to(torch.float32)
            b = ref["b"].to(dev).to(torch.float32)
            for kind in ("tf32", "fp32"):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    torch.backends.cuda.matmul.allow_tf32 = kind == "tf32"
                c = (a @ b).to(torch.int64)
                rows, cols = c.sum(dim=1).cpu(), c.sum(dim=0).cpu()
                good = bool(torch.equal(rows, ref["rows"])) and bool(torch.equal(cols, ref["cols"]))
                if not good:
                    out["ok"] = False
                    out["wrong"].append(kind)
                weights = torch.arange(1, c.shape[1] + 1, device=dev, dtype=torch.int64)
                mix = (c * weights).sum(dim=1).cpu()
                digests.append(
                    hashlib.sha256(
                        str(rows.tolist() + cols.tolist() + mix.tolist()).encode()
                    ).hexdigest()
                )
                del c
            del a, b
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.backends.cuda.matmul.allow_tf32 = saved
    out["digest"] = digests[0][:16]
    out["agree"] = len(set(digests)) == 1
    if not out["agree"] and out["ok"]:
        out["ok"] = False
        out["wrong"].append("tf32 and fp32 differ")
    return out


ALLREDUCE_SIZES = (8 << 20, 64 << 20, 256 << 20, 1 << 30)


def allreduce_size(size: int, seconds: float, ranks: int) -> AllreduceSize:
    """One message size's all-reduce, as nccl-tests reports it: its time, the algorithm bandwidth
    and the bus bandwidth (2(n-1)/n of the algorithm's)."""
    algbw = size / seconds / 1e9
    return {
        "bytes": size,
        "time_us": seconds * 1e6,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * 2 * (ranks - 1) / ranks,
    }


def allreduce_local(
    torch: Torch, devices: list[int], sizes: tuple[int, ...] = ALLREDUCE_SIZES, iters: int = 10
) -> Allreduce:
    """All-reduce across this process's GPUs with torch.cuda.nccl (one communicator clique, as
    nccl-tests does with -g N). Returns correctness and per-size algbw/busbw in GB/s."""
    n = len(devices)
    # correctness: GPU i holds i+1 everywhere; the sum is n(n+1)/2 on every GPU
    xs = [torch.full((1 << 20,), float(i + 1), device=f"cuda:{d}") for i, d in enumerate(devices)]
    torch.cuda.nccl.all_reduce(xs)
    for d in devices:
        torch.cuda.synchronize(d)
    want = n * (n + 1) / 2
    wrong = [d for d, x in zip(devices, xs) if not bool((x == want).all())]
    results: list[AllreduceSize] = []
    for size in sizes:
        numel = size // 4
        bufs = [torch.zeros(numel, device=f"cuda:{d}") for d in devices]
        for _ in range(2):
            torch.cuda.nccl.all_reduce(bufs)
        for d in devices:
            torch.cuda.synchronize(d)
        t0 = time.perf_counter()
        for _ in range(iters):
            torch.cuda.nccl.all_reduce(bufs)
        for d in devices:
            torch.cuda.synchronize(d)
        results.append(allreduce_size(size, (time.perf_counter() - t0) / iters, n))
        del bufs
    return {"correct": not wrong, "wrong_devices": wrong, "expected_sum": want, "sizes": results}


_SPAWN_SCRIPT = r"""
import json, os, sys, time
import torch, torch.distributed as dist
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
x = torch.full((1 << 20,), float(rank + 1), device="cuda")
dist.all_reduce(x)
ok = torch.tensor([1.0 if bool((x == world * (world + 1) / 2).all()) else 0.0], device="cuda")
dist.all_reduce(ok)
res = []
for size in json.loads(sys.argv[1]):
    buf = torch.zeros(size // 4, device="cuda")
    for _ in range(2):
        dist.all_reduce(buf)
    torch.cuda.synchronize(); dist.barrier(); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        dist.all_reduce(buf)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / 10
    res.append({"bytes": size, "time_us": dt * 1e6, "algbw_gbps": size / dt / 1e9,
                "busbw_gbps": size / dt / 1e9 * 2 * (world - 1) / world})
    del buf
if rank == 0:
    print("RESULT " + json.dumps({"correct": int(ok.item()) == world, "sizes": res}))
dist.destroy_process_group()
"""


def allreduce_spawn(
    ngpus: int, sizes: tuple[int, ...] = ALLREDUCE_SIZES, timeout: float = 120.0
) -> Allreduce:
    """All-reduce with one process a GPU (torch.distributed, NCCL), launched by torchrun."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(_SPAWN_SCRIPT)
    try:
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={ngpus}",
                f.name,
                json.dumps(list(sizes)),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        os.unlink(f.name)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])  # the child's answer, of the script above
            correct = bool(r["correct"])
            return {
                "correct": correct,
                "wrong_devices": [] if correct else ["?"],
                "expected_sum": ngpus * (ngpus + 1) / 2,
                "sizes": [_size_of(x) for x in r["sizes"]],
            }
    raise RuntimeError(f"the one-process-a-GPU all-reduce failed: {(p.stderr or p.stdout)[-600:]}")


def _size_of(x: dict[str, float]) -> AllreduceSize:
    """One size's timing as the all-reduce child wrote it (JSON numbers)."""
    return {
        "bytes": int(x["bytes"]),
        "time_us": float(x["time_us"]),
        "algbw_gbps": float(x["algbw_gbps"]),
        "busbw_gbps": float(x["busbw_gbps"]),
    }


# -- torch.compile, in a child process (isolated, time-bounded, overlaps the other checks) ----

_COMPILE_SCRIPT = r"""
import json, sys, time
t0 = time.perf_counter()
try:
    import torch
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    def f(x):
        return torch.sin(x) * 2.0 + x.cos()
    x = torch.randn(4096, device=dev)
    got = torch.compile(f)(x)
    ok = torch.allclose(got, f(x), rtol=1e-4, atol=1e-5)
    print(json.dumps({"ok": bool(ok), "device": dev, "seconds": time.perf_counter() - t0,
                      "error": "" if ok else "compiled result differs from eager"}))
except BaseException as e:
    import traceback
    tail = traceback.format_exc()[-1500:]
    print(json.dumps({"ok": False, "device": "", "seconds": time.perf_counter() - t0,
                      "error": f"{type(e).__name__}: {e}"[:800], "traceback": tail}))
"""


class CompileProbe:
    """torch.compile in a child process that leads its own process group (session), so that a
    timeout or the verifier's end kills the child and everything it started (Inductor's C++
    compiler, Triton's gcc, worker pools): nothing outlives the verifier, and a container whose
    main process is the verifier ends when it does. ``argv`` replaces the child's command (tests)."""

    def __init__(self, timeout: float, argv: list[str] | None = None) -> None:
        self.timeout = timeout
        self.t0 = time.monotonic()
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # one kernel to build: compiling in-process is faster than starting Inductor's worker pool
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
        self.proc = subprocess.Popen(
            argv or [sys.executable, "-c", _COMPILE_SCRIPT],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,  # setsid(): the child's pid is its process group's id
        )
        self.pgid = self.proc.pid

    def kill_group(self) -> None:
        """SIGKILL every process of the child's group (the child itself included, if alive)."""
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except OSError:  # ProcessLookupError: the group is empty
            pass

    def _reap(self) -> tuple[str, str]:
        try:  # every writer of the pipes is dead now, so EOF comes at once
            return self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a grandchild that left the group (setsid) holds a pipe
            for pipe in (self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    pipe.close()
            self.proc.wait()  # the child itself is dead (SIGKILL above)
            return "", ""

    def result(self) -> CompileResult:
        left = max(1.0, self.timeout - (time.monotonic() - self.t0))
        try:
            out, err = self.proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            self.close()
            return {
                "ok": False,
                "timeout": True,
                "error": f"did not finish within {self.timeout:.0f} s",
            }
        self.kill_group()  # what a finished child left behind
        for line in reversed(out.splitlines()):
            if line.startswith("{"):
                try:
                    answer = json.loads(line)  # the child's, of _COMPILE_SCRIPT
                except ValueError:
                    break
                if isinstance(answer, dict):
                    return _compile_result(answer)
                break
        return {"ok": False, "error": f"child exited {self.proc.returncode}: {err.strip()[-800:]}"}

    def close(self) -> None:
        """Kill the group and reap the child, unless ``result`` already did; safe to call twice."""
        if self.proc.returncode is None:
            self.kill_group()
            self.proc.kill()  # the child itself, should it have left its group
            self._reap()


def _compile_result(answer: dict[str, object]) -> CompileResult:
    """The compile child's JSON line as a ``CompileResult``: the keys it writes, of their types."""
    out: CompileResult = {"ok": answer.get("ok") is True}
    for key in ("error", "device", "traceback"):
        v = answer.get(key)
        if isinstance(v, str):
            out[key] = v
    seconds = answer.get("seconds")
    if isinstance(seconds, int | float):
        out["seconds"] = float(seconds)
    return out

#!/usr/bin/env python3
"""Run a CUDA extension built from its sdist by envspec on a real GPU, against the same computation
in plain torch (issue 38, point 3; issue 58, point 5). The wheel's name says which:

- torchsort: ``isotonic_cuda`` (PAV isotonic regression, the heart of its soft rank) against PAV in
  plain Python, and ``soft_rank`` on the GPU against its CPU extension and torch's own ranks;
- causal-conv1d: ``causal_conv1d_fn`` (a depthwise causal convolution, with and without SiLU)
  against torch's ``conv1d`` with the same weights, in float32, float16 and bfloat16, and its
  gradients against torch's.

    python bench/cuda_extension_check.py WHEEL [--json OUT]

The wheel is unzipped into a temp folder put first on ``sys.path`` (an install without pip or a
network, beside the machine's torch); it prints what it ran on and each comparison, and exits 1
when one is off by more than its tolerance. Needs torch with a CUDA GPU; nothing of envspec.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

Check = Callable[..., None]


def pav_nonincreasing(y: list[float]) -> list[float]:
    """argmin over non-increasing v of sum (v_i - y_i)^2: pool adjacent violators, in Python."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in y:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] <= blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    out: list[float] = []
    for s, c in blocks:
        out += [s / c] * int(c)
    return out


def torchsort_checks(torch: Any, dev: Any, check: Check, res: dict) -> None:
    """torchsort's extension against plain torch (issue 38, point 3)."""
    import torchsort
    from torchsort import isotonic_cuda  # the extension: an ImportError here is the failure

    res["extension"] = Path(isotonic_cuda.__file__).name
    g = torch.Generator().manual_seed(38)
    for dtype, tol in ((torch.float64, 1e-8), (torch.float32, 1e-4)):
        y = torch.randn(256, 300, generator=g, dtype=torch.float64)
        want = torch.tensor([pav_nonincreasing(row.tolist()) for row in y], dtype=torch.float64)
        got = isotonic_cuda.isotonic_l2(y.to(dev, dtype)).double().cpu()
        check(
            f"isotonic_l2 on the GPU ({dtype}) against PAV in plain torch/Python, 256x300",
            (got - want).abs().max().item(),
            tol,
        )

    x = torch.randn(128, 500, generator=g, dtype=torch.float64)
    for eps in (1.0, 0.1):
        cpu = torchsort.soft_rank(x, regularization_strength=eps)  # torchsort's C++ extension
        gpu = torchsort.soft_rank(x.to(dev), regularization_strength=eps).cpu()
        check(
            f"soft_rank on the GPU against its CPU extension, eps={eps}, 128x500",
            (gpu - cpu).abs().max().item(),
            1e-9,
        )
        n = x.shape[1]
        sums = gpu.sum(dim=1)  # a point of the permutahedron: the ranks' sum is n(n+1)/2
        check(
            f"soft_rank rows sum to n(n+1)/2, eps={eps}",
            (sums - n * (n + 1) / 2).abs().max().item(),
            1e-6,
        )
    hard = (x.argsort(dim=1).argsort(dim=1) + 1).double()  # torch's own ranks, 1..n
    # with eps below the smallest gap between two values of a row, the soft ranks are the ranks
    eps = x.sort(dim=1).values.diff(dim=1).min().item() / 10
    soft = torchsort.soft_rank(x.to(dev), regularization_strength=eps).cpu()
    check(
        f"soft_rank with eps={eps:.2g} on the GPU against torch's ranks (argsort of argsort)",
        (soft - hard).abs().max().item(),
        1e-6,
    )

    # relative to the largest gradient; float32: the backward sums up to 500 terms of a pooled block
    # in another order on the GPU than on the CPU, so about n * 2^-23 = 6e-5 apart (2026-12-05, H200: 3.0e-5)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-4)):
        xg = x.to(dev, dtype).requires_grad_()
        xc = x.to(dtype).clone().requires_grad_()
        (torchsort.soft_rank(xg, regularization_strength=0.5) ** 2).sum().backward()
        (torchsort.soft_rank(xc, regularization_strength=0.5) ** 2).sum().backward()
        scale = xc.grad.abs().max().item()
        check(
            f"soft_rank's gradient on the GPU against the CPU extension's ({dtype}), relative to its largest "
            f"({scale:.3g})",
            (xg.grad.cpu() - xc.grad).abs().max().item() / scale,
            tol,
        )

    big = torch.randn(4096, 1000, device=dev)
    torchsort.soft_rank(big)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        torchsort.soft_rank(big)
    torch.cuda.synchronize()
    res["soft_rank_4096x1000_ms"] = round((time.perf_counter() - t) / 20 * 1000, 3)
    print(
        f"soft_rank of 4096x1000 float32 on the GPU: {res['soft_rank_4096x1000_ms']} ms", flush=True
    )


def causal_conv1d_checks(torch: Any, dev: Any, check: Check, res: dict) -> None:
    """causal-conv1d's extension against torch's conv1d (issue 58, point 5): x (batch, dim, seqlen),
    a weight (dim, width) and a bias, each output t from inputs t-width+1 .. t."""
    import causal_conv1d_cuda  # the extension: an ImportError here is the failure
    import torch.nn.functional as F
    from causal_conv1d import causal_conv1d_fn

    res["extension"] = Path(causal_conv1d_cuda.__file__).name
    g = torch.Generator().manual_seed(58)
    batch, dim, seqlen, width = 4, 256, 2048, 4

    def reference(x: Any, w: Any, b: Any, act: str | None) -> Any:
        y = F.conv1d(x, w.unsqueeze(1), b, padding=width - 1, groups=dim)[..., :seqlen]
        return F.silu(y) if act == "silu" else y

    # float32 exact to rounding; half precisions: the kernel accumulates in float32, torch in its own
    for dtype, tol in ((torch.float32, 1e-4), (torch.float16, 1e-2), (torch.bfloat16, 5e-2)):
        x = torch.randn(batch, dim, seqlen, generator=g)
        w = torch.randn(dim, width, generator=g) / width
        b = torch.randn(dim, generator=g)
        for act in (None, "silu"):
            got = causal_conv1d_fn(
                x.to(dev, dtype), w.to(dev, dtype), b.to(dev, dtype), activation=act
            )
            want = reference(x.double(), w.double(), b.double(), act)
            check(
                f"causal_conv1d_fn on the GPU ({dtype}, activation={act}) against torch's conv1d "
                f"(float64), {batch}x{dim}x{seqlen}, width {width}",
                (got.double().cpu() - want).abs().max().item(),
                tol,
            )
    x = torch.randn(batch, dim, seqlen, generator=g, device="cpu").to(dev).requires_grad_()
    w = (torch.randn(dim, width, generator=g) / width).to(dev).requires_grad_()
    b = torch.randn(dim, generator=g).to(dev).requires_grad_()
    (causal_conv1d_fn(x, w, b, activation="silu") ** 2).sum().backward()
    mine = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    (reference(x, w, b, "silu") ** 2).sum().backward()
    for name, got, t in zip(("x", "weight", "bias"), mine, (x, w, b)):
        scale = t.grad.abs().max().item()
        check(
            f"causal_conv1d_fn's gradient of {name} (float32) against torch's, relative to its "
            f"largest ({scale:.3g})",
            (got - t.grad).abs().max().item() / scale,
            1e-4,
        )
    big = torch.randn(8, 2048, 4096, device=dev, dtype=torch.bfloat16)
    wb = torch.randn(2048, width, device=dev, dtype=torch.bfloat16)
    causal_conv1d_fn(big, wb, activation="silu")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        causal_conv1d_fn(big, wb, activation="silu")
    torch.cuda.synchronize()
    res["causal_conv1d_8x2048x4096_bf16_ms"] = round((time.perf_counter() - t0) / 20 * 1000, 3)
    print(
        f"causal_conv1d_fn of 8x2048x4096 bfloat16 on the GPU: "
        f"{res['causal_conv1d_8x2048x4096_bf16_ms']} ms",
        flush=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("wheel")
    ap.add_argument("--json")
    a = ap.parse_args()
    site = Path(tempfile.mkdtemp(prefix="cuda-ext-"))
    with zipfile.ZipFile(a.wheel) as z:
        z.extractall(site)
    sys.path.insert(0, str(site))

    import torch

    dev = torch.device("cuda")
    res: dict = {
        "wheel": Path(a.wheel).name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "driver": torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") else "",
        "python": sys.version.split()[0],
        "torch_arch_list": torch.cuda.get_arch_list(),
        "checks": [],
    }
    ok = True

    def check(name: str, err: float, tol: float, **extra: object) -> None:
        nonlocal ok
        good = err <= tol
        ok &= good
        res["checks"].append(
            {"check": name, "max_abs_err": err, "tolerance": tol, "ok": good, **extra}
        )
        print(
            f"{'PASS' if good else 'FAIL'}  {name}: max |diff| {err:.3g} (tolerance {tol:g})",
            flush=True,
        )

    if Path(a.wheel).name.startswith("causal_conv1d-"):
        causal_conv1d_checks(torch, dev, check, res)
    else:
        torchsort_checks(torch, dev, check, res)
    res["ok"] = ok
    print(json.dumps({k: v for k, v in res.items() if k != "checks"}))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

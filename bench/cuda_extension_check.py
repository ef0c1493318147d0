#!/usr/bin/env python3
"""Run a CUDA extension built from its sdist by envspec on a real GPU (issue 38, point 3):
torchsort's ``isotonic_cuda`` (PAV isotonic regression, the heart of its soft rank) against the
same computation in plain torch, and ``soft_rank`` on the GPU against its CPU extension and
against torch's own ranks.

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
from pathlib import Path


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
    import torchsort
    from torchsort import isotonic_cuda  # the extension: an ImportError here is the failure

    dev = torch.device("cuda")
    res: dict = {
        "wheel": Path(a.wheel).name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "driver": torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") else "",
        "python": sys.version.split()[0],
        "extension": Path(isotonic_cuda.__file__).name,
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
    res["ok"] = ok
    print(json.dumps({k: v for k, v in res.items() if k != "checks"}))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

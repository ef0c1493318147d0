"""Expected dense GEMM rates per GPU model, in TFLOP/s (no structured sparsity).

verify/ cannot import envspec.compat, so it carries this table: every GPU whose row in the compat
DB's gpus.toml has a dense BF16 or TF32 rate, by the name nvidia-smi and torch print, with the
datasheet the rate comes from (gpus.toml's row says which figure: half the "with sparsity" one
where the datasheet gives only that). tests/unit/test_driver_rules_agree.py keeps it equal to
gpus.toml. A lock may override it with ``[hardware.expected]`` (see docs/verify.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# nvidia-smi name -> (bf16 dense TFLOP/s, tf32 dense TFLOP/s, source); None where not published
RATES: dict[str, tuple[float | None, float | None, str]] = {
    "NVIDIA A30": (
        165.0,
        82.0,
        "https://www.nvidia.com/content/dam/en-zz/Solutions/data-center/products/a30-gpu/pdf/a30-datasheet.pdf",
    ),
    "NVIDIA A100-SXM4-40GB": (
        312.0,
        156.0,
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
    ),
    "NVIDIA A100-PCIE-40GB": (
        312.0,
        156.0,
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
    ),
    "NVIDIA A100-SXM4-80GB": (
        312.0,
        156.0,
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
    ),
    "NVIDIA A100 80GB PCIe": (
        312.0,
        156.0,
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
    ),
    "NVIDIA A800-SXM4-80GB": (312.0, 156.0, "NVIDIA A800 Tensor Core GPU datasheet"),
    "NVIDIA A800 80GB PCIe": (312.0, 156.0, "NVIDIA A800 Tensor Core GPU datasheet"),
    "NVIDIA A10": (
        125.0,
        62.5,
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/a10-datasheet.pdf",
    ),
    "NVIDIA A10G": (70.0, 35.0, "https://aws.amazon.com/ec2/instance-types/g5/"),
    "NVIDIA A40": (
        149.7,
        74.8,
        "https://images.nvidia.com/content/Solutions/data-center/a40/nvidia-a40-datasheet.pdf",
    ),
    "NVIDIA A2": (18.0, 9.0, "https://www.nvidia.com/en-us/data-center/products/a2/"),
    "NVIDIA A16": (17.9, 9.0, "https://www.nvidia.com/en-us/data-center/products/a16-gpu/"),
    "NVIDIA L4": (121.0, 60.0, "https://www.nvidia.com/en-us/data-center/l4/"),
    "NVIDIA L40S": (362.05, 183.0, "https://www.nvidia.com/en-us/data-center/l40s/"),
    "NVIDIA L40": (
        181.05,
        90.5,
        "https://images.nvidia.com/content/Solutions/data-center/vgpu-L40-datasheet.pdf",
    ),
    "NVIDIA H100 PCIe": (
        756.0,
        378.0,
        "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
    ),
    "NVIDIA H100 80GB HBM3": (
        989.0,
        494.0,
        "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
    ),
    "NVIDIA H100 NVL": (
        835.0,
        417.0,
        "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
    ),
    "NVIDIA H200": (989.0, 494.0, "https://www.nvidia.com/en-us/data-center/h200/"),
    "NVIDIA H200 NVL": (835.0, 417.0, "https://www.nvidia.com/en-us/data-center/h200/"),
    "NVIDIA GH200 480GB": (
        989.0,
        494.0,
        "https://resources.nvidia.com/en-us-grace-cpu/grace-hopper-superchip",
    ),
    "NVIDIA GH200 144G HBM3e": (
        989.0,
        494.0,
        "https://resources.nvidia.com/en-us-grace-cpu/grace-hopper-superchip",
    ),
    "NVIDIA H800": (989.5, 494.5, "NVIDIA H800 Tensor Core GPU datasheet"),
    "NVIDIA H800 PCIe": (756.5, 378.0, "NVIDIA H800 Tensor Core GPU datasheet"),
    "NVIDIA B200": (2250.0, 1125.0, "https://www.nvidia.com/en-us/data-center/hgx/"),
    "NVIDIA GB200": (2500.0, 1250.0, "https://www.nvidia.com/en-us/data-center/gb200-nvl72/"),
    "NVIDIA B300 SXM6 AC": (2250.0, 1125.0, "https://www.nvidia.com/en-us/data-center/hgx/"),
    "NVIDIA GB300": (2500.0, 1250.0, "https://www.nvidia.com/en-us/data-center/gb300-nvl72/"),
    "NVIDIA RTX A6000": (
        154.8,
        77.4,
        "https://www.nvidia.com/content/dam/en-zz/Solutions/design-visualization/quadro-product-literature/proviz-print-nvidia-rtx-a6000-datasheet-us-nvidia-1454980-r9-web.pdf",
    ),
    "NVIDIA RTX 6000 Ada Generation": (
        364.2,
        182.1,
        "https://www.nvidia.com/content/dam/en-zz/Solutions/design-visualization/rtx-6000/proviz-print-rtx6000-datasheet-web-2504660.pdf",
    ),
    "NVIDIA GeForce RTX 3090": (
        71.0,
        35.6,
        "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf",
    ),
    "NVIDIA GeForce RTX 4090": (
        165.2,
        82.6,
        "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",
    ),
    "NVIDIA GeForce RTX 5090": (
        209.5,
        104.8,
        "https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/nvidia-rtx-blackwell-gpu-architecture.pdf",
    ),
}


# nvidia-smi name -> (NCCL all-reduce bus bandwidth in GB/s a healthy node of 8 such GPUs reaches,
# source): gpus.toml's node_allreduce_busbw_gbs, kept equal by the same test
ALLREDUCE_8: dict[str, tuple[float, str]] = {
    "NVIDIA H100 80GB HBM3": (460.0, "Azure HPC node health checks, nd96isr_h100_v5.conf"),
    "NVIDIA H200": (431.0, "Azure HPC node health checks, nd96isr_h200_v5.conf"),
}
# host<->GPU copies: a healthy node reaches this share of the link's rate (lanes x GB/s per lane):
# Azure's node health checks mark an H100 node unhealthy below 48 GB/s (check_gpu_bw 48) on its
# PCIe gen 5 x16 link, 16 x 3.938 = 63.0 GB/s (health.PCIE_GBS_PER_LANE)
COPY_FRACTION = 48.0 / (16 * 3.938)
COPY_SOURCE = "Azure HPC node health checks: check_gpu_bw 48 on PCIe gen 5 x16"
# the slowest GPU of a node within this share of its fastest (gpu-fryer's rule)
GEMM_SPREAD = 0.90


def _key(name: str) -> str:
    """A name without case, spaces, punctuation and the "NVIDIA" prefix older drivers left out."""
    key = re.sub(r"[^0-9a-z]", "", name.lower())
    return key[len("nvidia") :] if key.startswith("nvidia") else key


_BY_KEY = {_key(n): v for n, v in RATES.items()}


# A GEMM below PASS_FRACTION of the datasheet rate is a warning, below FAIL_FRACTION a failure.
# Large square bf16 GEMMs reach 75-85% of the dense datasheet rate on healthy Hopper parts (the
# datasheet assumes boost clock at full tensor-core occupancy; power and clock limits take the
# rest: 785-798 of 989 measured on H200 here). Below 60% means a power cap, thermal or clock
# throttling, a contended GPU, or a wrong library; below 30% something is broken.
PASS_FRACTION = 0.60
FAIL_FRACTION = 0.30


def expected_rate(
    name: str, kind: str, lock_expected: Mapping[str, float | Mapping[str, float]] | None = None
) -> tuple[float, str] | None:
    """(TFLOP/s, source) for ``kind`` in {"bf16", "tf32"} on the GPU called ``name``."""
    key = f"{kind}_tflops"
    if lock_expected:
        per_gpu = lock_expected.get(name)
        if isinstance(per_gpu, Mapping) and key in per_gpu:
            return float(per_gpu[key]), "lock [hardware.expected]"
        flat = lock_expected.get(key)
        if flat is not None and not isinstance(flat, Mapping):
            return float(flat), "lock [hardware.expected]"
    row = _BY_KEY.get(_key(name))
    if row is None:
        return None
    rate = row[0] if kind == "bf16" else row[1]
    return (rate, row[2]) if rate is not None else None

"""Expected dense GEMM rates per GPU model, in TFLOP/s (no structured sparsity).

verify/ cannot import envspec.compat, so it carries this small table; a lock may override it
with ``[hardware.expected]`` (see docs/verify.md). Sources: NVIDIA datasheets, dense figures
(half the "with sparsity" numbers): H100/H200 SXM datasheet (BF16 989.4, TF32 494.7),
H100 PCIe (756.5 / 378), H100 NVL and H200 NVL (835.5 / 417.5), A100 (312 / 156),
L40S (366 / 183), L4 (121 / 60), A10 (125 / 62.5), B200 HGX (2250 / 1100).
"""

from __future__ import annotations

from typing import Any

# (substring of torch's device name, bf16 dense TFLOP/s, tf32 dense TFLOP/s, source); first match
# wins, so the more specific names come first.
RATES: tuple[tuple[str, float, float, str], ...] = (
    ("H200 NVL", 835.5, 417.5, "NVIDIA H200 NVL datasheet"),
    ("H200", 989.4, 494.7, "NVIDIA H200 SXM datasheet"),
    ("GH200", 989.4, 494.7, "NVIDIA GH200 datasheet"),
    ("H100 NVL", 835.5, 417.5, "NVIDIA H100 NVL datasheet"),
    ("H100 PCIe", 756.5, 378.0, "NVIDIA H100 PCIe datasheet"),
    ("H100", 989.4, 494.7, "NVIDIA H100 SXM datasheet"),
    ("A100", 312.0, 156.0, "NVIDIA A100 datasheet"),
    ("L40S", 366.0, 183.0, "NVIDIA L40S datasheet"),
    ("L4", 121.0, 60.0, "NVIDIA L4 datasheet"),
    ("A10", 125.0, 62.5, "NVIDIA A10 datasheet"),
    ("B200", 2250.0, 1100.0, "NVIDIA HGX B200 datasheet"),
)

# A GEMM below PASS_FRACTION of the datasheet rate is a warning, below FAIL_FRACTION a failure.
# Large square bf16 GEMMs reach 75-85% of the dense datasheet rate on healthy Hopper parts (the
# datasheet assumes boost clock at full tensor-core occupancy; power and clock limits take the
# rest: 785-798 of 989 measured on H200 here). Below 60% means a power cap, thermal or clock
# throttling, a contended GPU, or a wrong library; below 30% something is broken.
PASS_FRACTION = 0.60
FAIL_FRACTION = 0.30


def expected_rate(name: str, kind: str, lock_expected: dict[str, Any] | None = None) -> tuple[float, str] | None:
    """(TFLOP/s, source) for ``kind`` in {"bf16", "tf32"} on the GPU called ``name``."""
    key = f"{kind}_tflops"
    if lock_expected:
        per_gpu = lock_expected.get(name)
        if isinstance(per_gpu, dict) and key in per_gpu:
            return float(per_gpu[key]), "lock [hardware.expected]"
        if key in lock_expected and not isinstance(lock_expected[key], dict):
            return float(lock_expected[key]), "lock [hardware.expected]"
    for sub, bf16, tf32, src in RATES:
        if sub in name:
            return (bf16 if kind == "bf16" else tf32), src
    return None

"""The GPU driver-branch rules, kept here because the verifier imports nothing from envspec.

A driver drives only the GPUs its branch knows: whatever CUDA's minor-version compatibility lets a
runtime load on, a 470 driver cannot drive a Hopper GPU. Each compute capability's first production
branch is the branch of the GA driver of the CUDA toolkit that first compiled for it (CUDA Toolkit
release notes, Table 3). And a GPU whose architecture NVIDIA retired is driven by no branch after
its last one. The compat DB's gpus.toml carries the same floors and last branches per GPU, with
sources; tests/unit/test_driver_rules_agree.py keeps the two in step.
"""

from __future__ import annotations

# compute capability -> (first driver branch, family, the CUDA toolkit that introduced it)
FIRST_BRANCH: dict[str, tuple[int, str, str]] = {
    "3.5": (304, "Kepler GK110", "CUDA 5.0"),
    "3.7": (340, "Kepler GK210", "CUDA 6.5 (estimated)"),
    "5.0": (331, "Maxwell GM107", "CUDA 6.0"),
    "5.2": (343, "Maxwell GM20x", "CUDA 6.5 for GeForce GTX 9xx"),
    "6.0": (367, "Pascal GP100", "CUDA 8.0"),
    "6.1": (367, "Pascal GP10x", "CUDA 8.0"),
    "7.0": (384, "Volta", "CUDA 9.0"),
    "7.5": (410, "Turing", "CUDA 10.0"),
    "8.0": (450, "Ampere GA100", "CUDA 11.0"),
    "8.6": (455, "Ampere GA10x", "CUDA 11.1"),
    "8.9": (520, "Ada", "CUDA 11.8"),
    "9.0": (520, "Hopper", "CUDA 11.8"),
    "10.0": (570, "Blackwell", "CUDA 12.8"),
    "10.3": (575, "Blackwell Ultra", "CUDA 12.9"),
    "12.0": (570, "Blackwell (GeForce, RTX PRO)", "CUDA 12.8"),
    "12.1": (575, "Blackwell GB10", "CUDA 12.9"),
}
# Jetson's 5.3, 6.2, 7.2, 8.7 and 11.0 are absent on purpose: Jetson Linux brings its own driver.

# compute capability -> (last driver branch, the source): NVIDIA named R470 the last branch for
# Kepler and R580 the last for Maxwell, Pascal and Volta; a newer branch does not drive them.
_R470 = "NVIDIA: R470 is the last driver branch for Kepler (Data Center GPU driver documentation)"
_R580 = (
    "NVIDIA's Unix graphics feature deprecation schedule: the 580 series is the last to support Maxwell, "
    "Pascal and Volta"
)
LAST_BRANCH: dict[str, tuple[int, str]] = {
    "3.5": (470, _R470),
    "3.7": (470, _R470),
    "5.0": (580, _R580),
    "5.2": (580, _R580),
    "6.0": (580, _R580),
    "6.1": (580, _R580),
    "7.0": (580, _R580),
}


def branch(version: str) -> int:
    """The branch of a driver version: "570.86.16" -> 570."""
    return int(str(version).strip().split(".", 1)[0])


def first_branch(cc: str) -> int | None:
    """The first driver branch that drives a GPU of this compute capability, None when unknown."""
    row = FIRST_BRANCH.get(str(cc).strip())
    return row[0] if row else None


def too_old(driver: str, cc: str) -> tuple[bool, str]:
    """(whether ``driver`` is of a branch older than the GPU's first one, and the rule in words)."""
    row = FIRST_BRANCH.get(str(cc).strip())
    if row is None:
        return False, f"no first-branch fact for compute capability {cc}"
    need, family, toolkit = row
    words = f"{family} (cc {cc}) needs driver branch R{need} or newer (first with {toolkit})"
    return branch(driver) < need, words


def last_branch(cc: str) -> int | None:
    """The last driver branch that drives a GPU of this compute capability, None where there is none."""
    row = LAST_BRANCH.get(str(cc).strip())
    return row[0] if row else None


def too_new(driver: str, cc: str) -> tuple[bool, str]:
    """(whether ``driver`` is of a branch newer than the GPU's last one, and the rule in words)."""
    row = LAST_BRANCH.get(str(cc).strip())
    if row is None:
        return False, f"no last-branch fact for compute capability {cc}"
    last, source = row
    return branch(driver) > last, f"R{last} is the last driver branch for cc {cc} ({source})"

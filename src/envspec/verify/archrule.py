"""The compute-capability rule, kept here because the verifier imports nothing from envspec.

A GPU of capability X.Y runs:
- SASS built for ``sm_XZ`` with the same major X and Z <= Y (binary compatibility within a major);
- PTX built for ``compute_AB`` with AB <= XY, through the driver's JIT;
- nothing built for an architecture-specific ``a`` variant (``sm_90a``) of another capability,
  and family ``f`` variants (``sm_100f``) only on the same major with Z <= Y.
Source: CUDA C Programming Guide, "Compute Capability" and "Binary compatibility"; CUDA 12.9
release notes for family-specific (``f``) targets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

_ARCH = re.compile(r"^(sm|compute)_(\d+)(\d)([af]?)$")


@dataclass(frozen=True)
class Arch:
    kind: Literal["sm", "compute"]  # SASS or PTX
    major: int
    minor: int
    variant: str  # "", "a" or "f"

    @property
    def text(self) -> str:
        return f"{self.kind}_{self.major}{self.minor}{self.variant}"


def parse_arch(s: str) -> Arch:
    m = _ARCH.match(s.strip())
    if not m:
        raise ValueError(f"not an architecture name: {s!r} (expected sm_XY or compute_XY)")
    kind: Literal["sm", "compute"] = "sm" if m.group(1) == "sm" else "compute"
    return Arch(kind, int(m.group(2)), int(m.group(3)), m.group(4))


def parse_cc(cc: str | tuple[int, int]) -> tuple[int, int]:
    if isinstance(cc, tuple):
        return cc
    major, _, minor = str(cc).partition(".")
    return int(major), int(minor or 0)


def runs(arch: Arch, cc: tuple[int, int]) -> bool:
    major, minor = cc
    if arch.variant == "a":  # architecture-specific: exactly that capability
        return (arch.major, arch.minor) == (major, minor)
    if arch.kind == "sm" or arch.variant == "f":
        return arch.major == major and arch.minor <= minor
    return (arch.major, arch.minor) <= (major, minor)  # plain PTX: JIT forward


def runnable_by(arch_list: list[str], cc: str | tuple[int, int]) -> tuple[list[str], str]:
    """Which entries of ``arch_list`` a GPU of capability ``cc`` can run, and the best kind.

    Returns (usable entries, "sass" | "ptx" | "none"): "sass" when some machine code runs
    natively, "ptx" when only JIT-compiled PTX does (slow first start, may lack features).
    """
    c = parse_cc(cc)
    usable = []
    for a in arch_list:
        try:
            arch = parse_arch(a)
        except ValueError:
            continue
        if runs(arch, c):
            usable.append(arch.text)
    if any(u.startswith("sm_") for u in usable):
        return usable, "sass"
    if usable:
        return usable, "ptx"
    return [], "none"

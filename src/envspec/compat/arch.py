"""The architecture rule: which compiled GPU code runs on which compute capability.

An arch-list entry is ``sm_XY`` (SASS, machine code for capability X.Y) or ``compute_XY`` (PTX,
virtual code the driver JIT-compiles), optionally suffixed ``a`` (architecture-specific) or ``f``
(family-specific). The last digit is the minor version: ``sm_86`` is 8.6, ``sm_100`` is 10.0,
``sm_121`` is 12.1.

For a GPU of capability X.Y (sources: CUDA C++ Programming Guide, "Binary Compatibility",
"PTX Compatibility" and "Feature Availability",
https://docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/compute-capabilities.html):

* SASS ``sm_XZ`` runs when the major is the same and Z <= Y (``sm_86`` runs on 8.9, never on 9.0);
* PTX ``compute_AB`` runs when A.B <= X.Y (the driver JIT-compiles it for the newer GPU);
* ``sm_XYa`` / ``compute_XYa`` use architecture-specific features: they run on X.Y only;
* ``sm_XYf`` / ``compute_XYf`` (CUDA 12.9+) use family-specific features: they run on the GPUs of
  the same family at or after X.Y, which we read as same major and minor >= Y (``sm_100f`` runs on
  10.0 and 10.3, ``sm_103f`` on 10.3 only, ``sm_120f`` on 12.0 and 12.1). NVIDIA's guide: code for
  ``compute_100f`` is compatible with devices of compute capability 10.0 and 10.3.

PTX also needs a driver new enough for the PTX ISA version; that is the driver floor's job, not
this rule's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

_ARCH = re.compile(r"^(sm|compute)_(\d{2,3})([af]?)$")
_CC = re.compile(r"^(\d{1,2})\.(\d)$")


@dataclass(frozen=True)
class Arch:
    kind: Literal["sass", "ptx"]
    major: int
    minor: int
    suffix: str  # "" | "a" | "f"
    text: str

    @property
    def number(self) -> int:
        return self.major * 10 + self.minor


def parse_arch(entry: str) -> Arch:
    """``sm_90a`` -> Arch("sass", 9, 0, "a"); raises ValueError on anything else."""
    m = _ARCH.match(entry.strip())
    if not m:
        raise ValueError(
            f"not an arch-list entry: {entry!r} (expected sm_XY or compute_XY, optionally with a/f)"
        )
    digits = m.group(2)
    return Arch(
        "sass" if m.group(1) == "sm" else "ptx",
        int(digits[:-1]),
        int(digits[-1]),
        m.group(3),
        entry.strip(),
    )


def parse_cc(cc: str) -> tuple[int, int]:
    """``"9.0"`` -> (9, 0); raises ValueError."""
    m = _CC.match(str(cc).strip())
    if not m:
        raise ValueError(f"not a compute capability: {cc!r} (expected X.Y such as 9.0 or 12.0)")
    return int(m.group(1)), int(m.group(2))


def _runs(cc: tuple[int, int], a: Arch) -> bool:
    x, y = cc
    if a.suffix == "a":
        return (a.major, a.minor) == (x, y)
    if a.suffix == "f":
        return a.major == x and a.minor <= y
    if a.kind == "sass":
        return a.major == x and a.minor <= y
    return (a.major, a.minor) <= (x, y)


def arch_runs(cc: str, arch: str) -> bool:
    """Whether code compiled for ``arch`` (an arch-list entry) runs on a GPU of capability ``cc``."""
    return _runs(parse_cc(cc), parse_arch(arch))


def _reason(cc: str, a: Arch) -> str:
    x, y = parse_cc(cc)
    if a.suffix == "a":
        return f"{a.text} {'SASS' if a.kind == 'sass' else 'PTX'} runs on {cc} (architecture-specific, exact match)"
    if a.suffix == "f":
        return (
            f"{a.text} {'SASS' if a.kind == 'sass' else 'PTX'} runs on {cc} "
            f"(family-specific, same major, {a.minor} <= {y})"
        )
    if a.kind == "sass":
        if a.minor == y:
            return f"{a.text} SASS runs on {cc} (exact match)"
        return f"{a.text} SASS runs on {cc} (same major, {a.minor} <= {y})"
    return f"{a.text} PTX runs on {cc} through the driver's JIT ({a.number} <= {x * 10 + y})"


def _preference(cc: tuple[int, int], a: Arch) -> tuple[bool, int, int, bool]:
    # what the CUDA runtime loads: the closest SASS first, then the newest PTX
    return (a.kind == "sass", a.major, a.minor, a.suffix != "")


def best_arch(cc: str, arch_list: list[str]) -> str:
    """The entry of ``arch_list`` the CUDA runtime would load on ``cc`` (closest SASS, else newest
    PTX), or "" when none runs. Malformed entries are ignored."""
    try:
        c = parse_cc(cc)
    except ValueError:
        return ""
    good = []
    for e in arch_list:
        try:
            a = parse_arch(e)
        except ValueError:
            continue
        if _runs(c, a):
            good.append(a)
    return max(good, key=lambda a: _preference(c, a)).text if good else ""


def why_arch(cc: str, arch_list: list[str]) -> tuple[bool, str]:
    """Whether any entry of ``arch_list`` runs on ``cc``, and one line saying which entry and why.

    Raises ValueError on a malformed ``cc`` or entry.
    """
    c = parse_cc(cc)
    parsed = [parse_arch(e) for e in arch_list]
    if not parsed:
        return False, f"the arch list is empty (a CPU build?): nothing runs on {cc}"
    good = [a for a in parsed if _runs(c, a)]
    if good:
        return True, _reason(cc, max(good, key=lambda a: _preference(c, a)))
    x, y = c
    need = f"sm_{x}{y}" if y == 0 else f"sm_{x}0..sm_{x}{y}"
    return False, (
        f"no entry runs on {cc}: SASS needs {need} (same major, minor <= {y}), "
        f"PTX needs compute_AB with AB <= {x}{y}; the list has {', '.join(a.text for a in parsed)}"
    )

"""The compatibility database: torch releases and their CUDA variants, CUDA toolkits, GPUs.

Data with provenance (``data/*.toml``, every row with a source), a frozen model, pure queries and
the architecture rule. Nothing is loaded at import; ``load_db()`` reads and caches. See
docs/compat-db.md. ``refresh`` (PyPI, packaging's requirement parser) is imported on first use, so
that ``envspec explain`` does not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from envspec.compat.arch import arch_runs, best_arch, parse_arch, parse_cc, why_arch
from envspec.compat.load import DATA_DIR, FORMAT, load_db
from envspec.compat.model import (
    PLATFORMS,
    CompatDB,
    CudaToolkit,
    Family,
    Gpu,
    TorchRelease,
    Variant,
    driver_branch,
)

if TYPE_CHECKING:
    from envspec.compat.pypi import RefreshReport, refresh

__all__ = [
    "CompatDB",
    "CudaToolkit",
    "DATA_DIR",
    "FORMAT",
    "Family",
    "Gpu",
    "RefreshReport",
    "TorchRelease",
    "Variant",
    "PLATFORMS",
    "arch_runs",
    "best_arch",
    "driver_branch",
    "load_db",
    "parse_arch",
    "parse_cc",
    "refresh",
    "why_arch",
]


def __getattr__(name: str) -> object:
    if name not in ("RefreshReport", "refresh"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from envspec.compat import pypi  # on first use: explain and lock do without the refresh's code

    value = getattr(pypi, name)
    globals()[name] = value  # the next lookup finds it without this hook
    return value

"""The compatibility database: torch releases and their CUDA variants, CUDA toolkits, GPUs.

Data with provenance (``data/*.toml``, every row with a source), a frozen model, pure queries and
the architecture rule. Nothing is loaded at import; ``load_db()`` reads and caches. See
docs/compat-db.md.
"""

from envspec.compat.arch import arch_runs, best_arch, parse_arch, parse_cc, why_arch
from envspec.compat.load import DATA_DIR, FORMAT, load_db
from envspec.compat.model import PLATFORMS, CompatDB, CudaToolkit, Gpu, TorchRelease, Variant, driver_branch
from envspec.compat.pypi import RefreshReport, refresh

__all__ = [
    "CompatDB", "CudaToolkit", "DATA_DIR", "FORMAT", "Gpu", "RefreshReport", "TorchRelease", "Variant",
    "PLATFORMS", "arch_runs", "best_arch", "driver_branch", "load_db", "parse_arch", "parse_cc", "refresh", "why_arch",
]

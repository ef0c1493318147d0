"""Time the Debian stages for the GPU base set; the numbers go into docs/debian.md.

    python tests/data/debian/measure.py [--suite bookworm] [--runs 3] [--services ssh] [--jobs N]

Each run starts from an empty cache in a temporary directory: resolve cold (apt-get update,
the index, the closure), resolve warm, fetch cold (every .deb downloaded), fetch warm (every
.deb checked in the cache), make_rootfs. Prints one line per run and the medians. Needs the
mirror; make_rootfs needs root (chroot for ldconfig -r).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "src"))

from envspec.debian import base_packages, fetch_debs, make_rootfs, mirror_list, resolve_closure  # noqa: E402


def du(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                total += os.lstat(p).st_size
    return total


def one(suite: str, services: set[str], jobs: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="envspec-measure-") as tmp:
        cache = Path(tmp) / "cache"
        req = base_packages(suite, gpu=True, services=services)
        t = time.monotonic()
        pins = resolve_closure(suite, req, cache_dir=cache)
        out["resolve_cold"] = time.monotonic() - t
        t = time.monotonic()
        resolve_closure(suite, req, cache_dir=cache)
        out["resolve_warm"] = time.monotonic() - t
        t = time.monotonic()
        paths = fetch_debs(pins, mirrors=mirror_list(snapshot=""), cache_dir=cache)
        out["fetch_cold"] = time.monotonic() - t
        t = time.monotonic()
        fetch_debs(pins, mirrors=mirror_list(snapshot=""), cache_dir=cache)
        out["fetch_warm"] = time.monotonic() - t
        t = time.monotonic()
        make_rootfs(pins, paths, Path(tmp) / "rootfs", jobs=jobs)
        out["rootfs"] = time.monotonic() - t
        out["packages"] = len(pins)
        out["download_mb"] = sum(p.size for p in pins) / 1e6
        out["rootfs_mb"] = du(Path(tmp) / "rootfs") / 1e6
        shutil.rmtree(Path(tmp) / "rootfs")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="bookworm")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--services", default="")
    ap.add_argument(
        "--jobs", type=int, default=0, help="make_rootfs's decompression workers (0: default)"
    )
    args = ap.parse_args()
    services = {s for s in args.services.split(",") if s}
    rows = []
    for i in range(args.runs):
        r = one(args.suite, services, args.jobs)
        rows.append(r)
        print(f"run {i + 1}: " + "  ".join(f"{k}={v:.2f}" for k, v in r.items()), flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print("median: " + "  ".join(f"{k}={v:.2f}" for k, v in med.items()))
    print(f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

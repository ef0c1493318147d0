#!/usr/bin/env python3
"""Measure the ABI check (src/envspec/wheels/abi.py) of a lock's compiled packages against its torch.

    python bench/abi.py LOCK [--cache DIR] [--runs 5] [--keep]

The lock's wheels the check reads (platform wheels beside torch, and torch) are fetched first into
the cache (``--cache``, default a new temp dir; the configured mirrors, then the indexes), and the
time that takes is reported apart. Then:

- cold: the check with an empty ``<cache>/abi`` (every candidate wheel's extension modules and
  torch's libraries read from the wheel files), median of ``--runs`` runs;
- warm: the check again with what the cold run kept (the reads and verdicts by sha256), as every
  later ``envspec build`` of the lock runs it, median of ``--runs`` runs.

Each run is the check as build runs it (``abi.check_lock``), in this process. Prints a Markdown
table for docs/benchmarks.md; the temp cache is removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def main() -> int:
    from envspec import lock as lockmod
    from envspec import sources
    from envspec.cache.store import Cache
    from envspec.errors import AbiMismatch
    from envspec.wheels import abi
    from envspec.wheels.fetch import WheelFetcher

    ap = argparse.ArgumentParser()
    ap.add_argument("lock")
    ap.add_argument("--cache")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    lock = lockmod.load(a.lock)
    root = Path(a.cache) if a.cache else Path(tempfile.mkdtemp(prefix="envspec-bench-abi-"))
    cache = Cache(root)
    try:
        pins = abi.AbiCheck.candidates(lock) + [w for w in lock.wheels if w.name == "torch"]
        t0 = time.perf_counter()
        paths = WheelFetcher(cache, sources.discover().mirrors).fetch_all(pins)
        fetch_s = time.perf_counter() - t0
        size = sum(w.size for w in pins)

        def once() -> tuple[float, list[str], str]:
            t = time.perf_counter()
            try:
                read = abi.check_lock(
                    lock, root / "abi", lambda ps: {p.sha256: paths[p.sha256] for p in ps}
                )
                verdict = "accepted"
            except AbiMismatch as e:
                read, verdict = [], f"refused: {len(e.mismatches)} extension module(s)"
            return time.perf_counter() - t, read, verdict

        cold, warm = [], []
        read: list[str] = []
        verdict = ""
        for _ in range(a.runs):
            shutil.rmtree(root / "abi", ignore_errors=True)
            s, r, verdict = once()
            cold.append(s)
            read = r or read
        for _ in range(a.runs):
            s, _r, verdict = once()
            warm.append(s)
        check = abi.AbiCheck(root / "abi")
        check.check(lock, {}, partial=True) if verdict == "accepted" else None
        judged = check.judged
        print(
            f"lock {a.lock}: {len(lock.wheels)} wheels, {len(pins) - 1} candidates + torch "
            f"({size / 1e9:.2f} GB), fetched in {fetch_s:.1f} s; {verdict}; packages with extensions on "
            f"torch: {', '.join(judged) or '-'}"
        )
        print()
        print("| check | median (s) | runs |")
        print("| --- | --- | --- |")
        print(
            f"| cold (every wheel read) | {statistics.median(cold):.2f} | {', '.join(f'{x:.2f}' for x in cold)} |"
        )
        print(
            f"| warm (kept reads and verdicts) | {statistics.median(warm) * 1000:.1f} ms | "
            f"{', '.join(f'{x * 1000:.1f}' for x in warm)} ms |"
        )
    finally:
        if not a.keep and not a.cache:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

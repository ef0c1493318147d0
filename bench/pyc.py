"""What the .pyc cost a build: each wheel layer of a lock made with and without them.

    python bench/pyc.py lockfiles/cpu.lock [--json out.json]
    python bench/pyc.py lockfiles/smoke.lock --base [--json out.json]

``--base``: the base layer instead (the lock's .debs fetched and laid into a rootfs first, not
timed), made without and with the .pyc of its Debian Python modules.

The wheels are fetched into the cache first (not timed). Each layer is made twice in this
process, one after the other (no worker pool, so the CPU times are the layer's own): once
without .pyc, once with them (``bytecode.find_compiler``); reported per layer: CPU seconds of
the maker (user+sys) and of its compiler child, wall seconds, layer bytes, .pyc count and bytes.
Results go into docs/benchmarks.md with the command, machine and date.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

from envspec import sources
from envspec.cache.store import Cache, Identity
from envspec.image import layers
from envspec.image.bytecode import find_compiler
from envspec.lock import load
from envspec.plan import make_plan
from envspec.wheels.fetch import WheelFetcher


def _cpu() -> tuple[float, float]:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("lock")
    ap.add_argument("--json")
    ap.add_argument(
        "--base",
        action="store_true",
        help="the base layer (Debian rootfs) instead of the wheel layers",
    )
    ns = ap.parse_args()
    plan = make_plan(load(ns.lock))
    choice = find_compiler(plan.platform)
    if not choice.python:
        print(f"no compiler: {choice.reason}", file=sys.stderr)
        return 2
    cache = Cache()
    if ns.base:
        return _base(plan, cache, (choice.python, choice.cache_tag), ns.json)
    wheels = [w for lay in plan.layers for w in lay.wheels]
    paths = WheelFetcher(cache, sources.discover().mirrors).fetch_all(wheels)
    rows = []
    with tempfile.TemporaryDirectory(dir=cache.root) as tmp:
        for lay in plan.layers:
            if not lay.wheels:
                continue
            files: list[tuple[str, str, Identity | None]] = [
                (w.filename, str(paths[w.sha256]), None) for w in lay.wheels
            ]
            row: dict = {"group": lay.group, "wheels": len(files)}
            for mode, comp in (("plain", None), ("pyc", (choice.python, choice.cache_tag))):
                out = Path(tmp) / f"{lay.group}-{mode}.tar"
                (s0, c0), t0 = _cpu(), time.perf_counter()
                res = layers.make_wheel_layer(files, plan.platform, out, None, comp)
                (s1, c1), t1 = _cpu(), time.perf_counter()
                row[mode] = {
                    "cpu_s": round(s1 - s0, 2),
                    "compiler_cpu_s": round(c1 - c0, 2),
                    "wall_s": round(t1 - t0, 2),
                    "bytes": res.size,
                    "pyc": res.pyc.model_dump(),
                }
                out.unlink()
            row["extra_cpu_s"] = round(
                row["pyc"]["cpu_s"]
                + row["pyc"]["compiler_cpu_s"]
                - row["plain"]["cpu_s"]
                - row["plain"]["compiler_cpu_s"],
                2,
            )
            row["extra_bytes"] = row["pyc"]["bytes"] - row["plain"]["bytes"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    total = {
        "extra_cpu_s": round(sum(r["extra_cpu_s"] for r in rows), 2),
        "extra_bytes": sum(r["extra_bytes"] for r in rows),
        "plain_cpu_s": round(sum(r["plain"]["cpu_s"] for r in rows), 2),
        "pyc_files": sum(r["pyc"]["pyc"]["files"] for r in rows),
        "compiler": f"{choice.python} {choice.version}",
    }
    print(json.dumps(total))
    if ns.json:
        Path(ns.json).write_text(
            json.dumps({"lock": ns.lock, "layers": rows, "total": total}, indent=1) + "\n"
        )
    return 0


def _base(plan, cache: Cache, compiler: tuple[str, str], json_out: str | None) -> int:
    from envspec import debian

    lock = plan.lock
    base = plan.layer("base")
    mirrors = debian.mirror_list(
        (lock.debian.mirror if lock.debian else "") or debian.CANONICAL_MIRROR
    )
    paths = debian.fetch_debs(list(base.debs), mirrors=mirrors, cache_dir=cache.root / "debs")
    with tempfile.TemporaryDirectory(dir=cache.root) as tmp:
        rootfs = Path(tmp) / "rootfs"
        debian.make_rootfs(
            list(base.debs), paths, rootfs, user=lock.runtime.user, uid=lock.runtime.uid
        )
        row: dict = {
            "group": "base",
            "debs": len(base.debs),
            "modules": len(layers.rootfs_py_files(rootfs, plan.platform.python)),
        }
        for mode, comp in (("plain", None), ("pyc", compiler)):
            out = Path(tmp) / f"base-{mode}.tar"
            (s0, c0), t0 = _cpu(), time.perf_counter()
            res = layers.make_base_layer(plan, rootfs, out, None, comp)
            (s1, c1), t1 = _cpu(), time.perf_counter()
            row[mode] = {
                "cpu_s": round(s1 - s0, 2),
                "compiler_cpu_s": round(c1 - c0, 2),
                "wall_s": round(t1 - t0, 2),
                "bytes": res.size,
                "pyc": res.pyc.model_dump(),
            }
            out.unlink()
    row["extra_cpu_s"] = round(
        row["pyc"]["cpu_s"]
        + row["pyc"]["compiler_cpu_s"]
        - row["plain"]["cpu_s"]
        - row["plain"]["compiler_cpu_s"],
        2,
    )
    row["extra_bytes"] = row["pyc"]["bytes"] - row["plain"]["bytes"]
    print(json.dumps(row))
    if json_out:
        Path(json_out).write_text(
            json.dumps({"lock": str(lock.meta.content_hash), "layers": [row]}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

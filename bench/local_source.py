#!/usr/bin/env python3
"""Benchmark: how a wheel from a local source (a ``file://`` mirror, a find-links folder) enters
the cache, measured by the cold build it is part of (issue 39, point 1).

    .venv/bin/python bench/local_source.py [--lock lockfiles/h100-train.lock] [--rounds 2]
                                           [--ways inplace,copy,link,read] [--json OUT]

The ways (``envspec.wheels.fetch.WheelFetcher``, switched in this process):
  inplace   what envspec does where the file system has no reflinks: the mirror's file read
            where it is, hashed there when fetched, and checked unchanged (its identity) by the
            layer maker that unzips it (``read_in_place``)
  copy      a copy into the cache (``read_in_place = False``: ``copy_local``, a reflink where the
            file system has them, else copy_file_range, the copy staying in the kernel), then
            the copy hashed
  read      the copy through this process (read, write 1 MiB at a time)
  link      a hard link into the cache, as envspec did until issue 39 (reads and writes what
            reading in place does, but the inode is the mirror's)
The unzip floor: `unzip -q` of every wheel, one after another, from the same mirror.

Per round, rotating which goes first, each run on a new ext4 of its own (bench/cache.py's
fresh_fs: a loop-mounted sparse file with direct I/O), holding the mirror (copied in, untimed),
the cache and the storage root, so a reflink or a link is possible where the file system has
them; then `sync` and a drop of the page cache, so every run reads the mirror from the disk.
The .debs are fetched once, before (their cache is shared: not what is measured). Timed: the
whole `build()` of an empty cache and storage root, as `envspec build LOCK` runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from _common import emit  # noqa: E402
from cache import drop_caches, fresh_fs  # noqa: E402  bench/cache.py
from conftest import private_storage  # noqa: E402  (the tests' storage roots)


def _link(src: Path, dest: Path) -> str:
    os.link(src, dest)
    return "link"


def _read(src: Path, dest: Path) -> str:
    with open(src, "rb") as fi, open(dest, "wb") as fo:
        shutil.copyfileobj(fi, fo, 1 << 20)
    return "read"


def main() -> int:
    from envspec import lock as lockmod
    from envspec import sources
    from envspec.cache import store
    from envspec.cache.store import Cache
    from envspec.image import BuildahEngine, BuildOptions, build
    from envspec.plan import make_plan
    from envspec.registry.stage import Registry
    from envspec.wheels import fetch as fetchmod

    ap = argparse.ArgumentParser()
    ap.add_argument("--lock", default="lockfiles/h100-train.lock")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ways", default="inplace,copy,link")
    ap.add_argument("--json")
    ap.add_argument("--tmp", default=os.environ.get("TMPDIR", "/var/tmp"))
    a = ap.parse_args()
    ways = {"inplace": None, "copy": store.copy_local, "read": _read, "link": _link}
    chosen = a.ways.split(",")
    lock = lockmod.load(ROOT / a.lock if not Path(a.lock).is_absolute() else a.lock)
    plan = make_plan(lock)
    rows: list[dict] = []
    res: dict = {
        "lock": a.lock,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "wheels": len(plan.wheels),
        "wheel_bytes": sum(w.size for w in plan.wheels),
        "rows": rows,
    }
    with tempfile.TemporaryDirectory(prefix="envspec-bench-local-", dir=a.tmp) as td:
        base = Path(td)
        seed = Cache(
            base / "seed"
        )  # the lock's wheels (from the machine's mirrors) and .debs, once
        paths = fetchmod.WheelFetcher(seed, sources.discover().mirrors).fetch_all(list(plan.wheels))
        files = {w.filename: paths[w.sha256] for w in plan.wheels}
        from envspec import debian

        deb_pins = list(plan.layer("base").debs)
        if deb_pins:
            debian.fetch_debs(
                deb_pins,
                cache_dir=seed.root / "debs",
                mirrors=debian.mirror_list(
                    (lock.debian.mirror if lock.debian else "") or debian.CANONICAL_MIRROR
                ),
            )

        def mirror_in(fs: Path) -> Path:
            m = fs / "mirror"
            m.mkdir()
            for name, p in files.items():
                shutil.copyfile(p, m / name)
            return m

        def floor(n: int) -> dict:
            with fresh_fs(base, f"floor-{n}", True) as fs:
                m = mirror_in(fs)
                drop_caches()
                t = time.monotonic()
                for w in plan.wheels:
                    subprocess.run(
                        ["unzip", "-q", "-o", str(m / w.filename), "-d", str(fs / "unzipped")],
                        check=True,
                    )
                return {
                    "what": "unzip floor",
                    "round": n,
                    "seconds": round(time.monotonic() - t, 2),
                }

        def one(way: str, n: int) -> dict:
            with fresh_fs(base, f"{way}-{n}", True) as fs, private_storage(fs / "storage"):
                m = mirror_in(fs)
                cache = fs / "cache"
                cache.mkdir()
                (cache / "debs").symlink_to(seed.root / "debs")
                if ways[way] is not None:
                    fetchmod.copy_local = ways[way]  # type: ignore[assignment]
                    fetchmod.WheelFetcher.read_in_place = False
                try:
                    drop_caches()
                    t = time.monotonic()
                    img = build(
                        plan,
                        BuildahEngine(),
                        Cache(cache),
                        [sources.Mirror(m.as_uri(), "links", "env")],
                        options=BuildOptions(registry=Registry()),
                    )
                    dt = time.monotonic() - t
                finally:
                    fetchmod.copy_local = store.copy_local
                    fetchmod.WheelFetcher.read_in_place = True
                fetch = sum(p.end - p.start for p in img.phases if p.name in ("fetch", "abi check"))
                return {
                    "what": way,
                    "round": n,
                    "seconds": round(dt, 2),
                    "digest": img.digest,
                    "fetch_and_abi_s": round(fetch, 2),
                    "phases": {p.name: round(p.end - p.start, 2) for p in img.phases},
                }

        steps = [("floor", None)] + [(w, w) for w in chosen]
        for n in range(a.rounds):
            k = n % len(steps)
            for name, way in steps[k:] + steps[:k]:
                rows.append(floor(n) if way is None else one(way, n))
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "phases"}), flush=True)
    floor_med = statistics.median(r["seconds"] for r in rows if r["what"] == "unzip floor")
    res["unzip_floor_s"] = floor_med
    for way in chosen:
        xs = [r["seconds"] for r in rows if r["what"] == way]
        res[way] = {
            "median_s": statistics.median(xs),
            "min_s": min(xs),
            "max_s": max(xs),
            "x_floor": round(statistics.median(xs) / floor_med, 3),
        }
    res["same_digest"] = len({r["digest"] for r in rows if "digest" in r}) == 1
    emit(res, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

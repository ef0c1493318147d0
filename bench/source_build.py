#!/usr/bin/env python3
"""Measure the builds of a lock's wheels from their sdists (src/envspec/wheels/sdist.py, issue 37).

    python bench/source_build.py LOCK [--runs 3] [--parallel 1] [--jobs 0] [--keep]

In a new temp cache (``--keep``: not removed), for the lock's pins built from source
(``[wheels.source]``):

- fetch: the sdists and their build requirements, by sha256 (the configured mirrors, then the
  indexes);
- sandbox: the lock's Debian base laid down as the builds' root file system (once per build
  that has something to build; the .debs come from the usual cache);
- cold: every source pin built (``build_all``: in the sandbox, ``--parallel`` at once with
  ``--jobs`` compile jobs each), its cache entries removed before each of ``--runs`` runs; the
  median per package and of the whole, and whether every run gave the same wheel bytes;
- cached: the same call with the wheels in the cache (what every later build does), median;
- peak memory: the largest sum of resident memory of the builds' processes (uv, Python, the
  compilers; sampled every 0.5 s from /proc), over the cold runs.

Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from envspec.wheels.sdist import SourceEvents  # noqa: E402  (src/ is on sys.path now)

if TYPE_CHECKING:
    from envspec.lock import Wheel


def main() -> int:
    from envspec import debian, sources
    from envspec import lock as lockmod
    from envspec.cache.store import Cache
    from envspec.host import cache_dir_for
    from envspec.wheels import sdist
    from envspec.wheels.fetch import WheelFetcher

    ap = argparse.ArgumentParser()
    ap.add_argument("lock")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=0)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument(
        "--host-python",
        default="",
        help="a host-mode lock (no Debian base, so no sandbox): build with this interpreter of the "
        "lock's Python on this host, its C++ compiler the host's, its CUDA compiler the pinned one; "
        "the wheels are copied to --out",
    )
    ap.add_argument(
        "--out", default="", help="with --host-python: the folder the built wheels are copied to"
    )
    ap.add_argument(
        "--progress",
        action="store_true",
        help="print each compile step with the seconds since the build began (for a build too long to "
        "finish: run it under `timeout` and count the steps per minute)",
    )
    a = ap.parse_args()
    lock = lockmod.load(a.lock)
    pins = [w for w in lock.wheels if w.source is not None]
    if not pins:
        print(f"{a.lock} builds nothing from source", file=sys.stderr)
        return 1
    root = Path(tempfile.mkdtemp(prefix="envspec-bench-source-"))
    cache = Cache(root / "cache")
    mirrors = sources.discover(None).mirrors
    try:
        t = time.monotonic()
        files = WheelFetcher(cache, mirrors).fetch_all(
            pins + [b for w in pins if w.source for b in (*w.source.build, *w.source.toolkit)]
        )
        fetch_s = time.monotonic() - t

        if (
            a.host_python
        ):  # no Debian base: the build on this host (sdist.cached_build without a sandbox)
            return host_build(a, lock, pins, files, cache, fetch_s)

        sandbox_s: list[float] = []
        boxes: list[Path] = []

        assert lock.debian is not None  # a lock with a Debian base (else --host-python)
        base = lock.debian

        def sandbox() -> sdist.Sandbox:
            debs = list(base.packages)
            start = time.monotonic()
            paths = debian.fetch_debs(
                debs,
                mirrors=debian.mirror_list(base.mirror),
                cache_dir=cache_dir_for(os.environ) / "debs",
            )
            dest = root / f"rootfs-{len(boxes)}"
            debian.make_rootfs(debs, paths, dest, user=lock.runtime.user, uid=lock.runtime.uid)
            boxes.append(dest)
            sandbox_s.append(time.monotonic() - start)
            return sdist.Sandbox(dest, f"/usr/bin/python{lock.platform.python}")

        per: dict[str, list[float]] = {w.name: [] for w in pins}
        shas: dict[str, set[str]] = {w.name: set() for w in pins}
        whole: list[float] = []
        peaks: list[int] = []
        for _ in range(a.runs):
            shutil.rmtree(root / "cache" / "built", ignore_errors=True)
            for box in boxes:
                shutil.rmtree(box, ignore_errors=True)
            t = time.monotonic()
            began = time.monotonic()
            with PeakMemory() as memory:
                built = sdist.build_all(
                    lock,
                    pins,
                    files,
                    cache.root,
                    sandbox=sandbox,
                    parallel=a.parallel,
                    jobs=a.jobs,
                    events=_Timed(per, began, a.progress),
                )
            whole.append(time.monotonic() - t)
            peaks.append(memory.peak)
            for w in pins:
                shas[w.name].add(
                    json.loads((built[w.sha256].parent / "wheel.json").read_text())["sha256"]
                )
                kept = root / f"run-{len(whole)}"  # each run's wheel, to compare where they differ
                kept.mkdir(exist_ok=True)
                shutil.copy2(built[w.sha256], kept / built[w.sha256].name)
        cached: list[float] = []
        for _ in range(max(3, a.runs)):
            t = time.monotonic()
            sdist.build_all(
                lock, pins, files, cache.root, sandbox=sandbox, parallel=a.parallel, jobs=a.jobs
            )
            cached.append(time.monotonic() - t)

        med = statistics.median
        print(
            f"lock {a.lock}: {len(pins)} package(s) from source; {a.runs} cold runs, parallel {a.parallel}, "
            f"jobs {a.jobs or 'auto'}, {os.cpu_count()} cores"
        )
        print()
        print("| step | median | runs |")
        print("|---|---|---|")
        print(f"| fetch sdists and build requirements (once) | {fetch_s:.2f} s | 1 |")
        print(
            f"| sandbox: the lock's Debian base as a root file system | {med(sandbox_s):.2f} s | {len(sandbox_s)} |"
        )
        for w in pins:
            same = (
                "same bytes every run"
                if len(shas[w.name]) == 1
                else f"{len(shas[w.name])} different wheels"
            )
            print(
                f"| build {w.name} {w.version} from its sdist ({same}) | {med(per[w.name]):.2f} s | {len(per[w.name])} |"
            )
        print(f"| all of them, cold (sandbox included) | {med(whole):.2f} s | {len(whole)} |")
        print(
            f"| peak memory of the builds' processes, cold (largest of the runs) | "
            f"{max(peaks) / 2**20:.0f} MiB | {len(peaks)} |"
        )
        print(
            f"| all of them, cached (every later build) | {med(cached) * 1000:.1f} ms | {len(cached)} |"
        )
        return 0 if all(len(s) == 1 for s in shas.values()) else 1
    finally:
        if a.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


class PeakMemory:
    """The largest sum of resident memory of this process's descendants (a build's uv, Python and
    compilers, in its sandbox or not), sampled every ``every`` seconds in a ``with`` block."""

    def __init__(self, every: float = 0.5) -> None:
        import threading

        self.every, self.peak = every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, descendants_rss(os.getpid()))


def descendants_rss(root: int) -> int:
    """Bytes resident in the processes below ``root`` (from /proc/<pid>/stat: ppid and rss)."""
    parent: dict[int, int] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(d)], rss[int(d)] = int(fields[1]), int(fields[21]) * page
    total = 0
    for pid, size in rss.items():
        p = parent.get(pid, 0)
        while p not in (0, 1, root):
            p = parent.get(p, 0)
        total += size if p == root and pid != root else 0
    return total


class _Timed(SourceEvents):
    """``build_all``'s events as this script keeps them: each wheel's seconds, and with
    ``--progress`` each compile step with the seconds since the build began."""

    def __init__(self, per: dict[str, list[float]], began: float, progress: bool) -> None:
        self.per, self.began, self.show = per, began, progress

    def start(self, w: Wheel) -> None:
        pass

    def progress(self, w: Wheel, step: str) -> None:
        if self.show:
            print(f"{time.monotonic() - self.began:8.1f} s  {w.name}: {step}", flush=True)

    def done(self, w: Wheel, wheel: Path, seconds: float, cached: bool) -> None:
        self.per[w.name].append(seconds)


def host_build(a, lock, pins, files, cache, fetch_s: float) -> int:
    """Each pin of a host-mode lock built once on this host with ``--host-python``, timed, and its
    wheel copied to ``--out``; prints what was built with what."""
    from envspec.resolve.uv import _uv
    from envspec.wheels import sdist

    out = Path(a.out or ".")
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    for w in pins:
        d = sdist.derivation_of(w, lock.platform)
        jobs = a.jobs or max(1, min(os.cpu_count() or 1, sdist.memory_jobs()))
        t = time.monotonic()
        with PeakMemory() as memory:
            wheel, _ = sdist.cached_build(
                d,
                files[w.sha256],
                files,
                cache.root,
                builder=sdist.Builder(uv=_uv(), python=a.host_python, jobs=jobs),
                on_progress=(
                    lambda step: print(
                        f"{time.monotonic() - began:8.1f} s  {w.name}: {step}", flush=True
                    )
                )
                if a.progress
                else None,
            )
        secs = time.monotonic() - t
        shutil.copy2(wheel, out / wheel.name)
        import hashlib
        import subprocess

        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        version = subprocess.run(
            [a.host_python, "-VV"], capture_output=True, text=True
        ).stdout.strip()
        print(
            f"built {wheel.name} ({wheel.stat().st_size} bytes, sha256 {digest}) in {secs:.1f} s: "
            f"{jobs} jobs, arch list {' '.join(d.arch_list)}, toolkit "
            f"{', '.join(f'{t.name} {t.version}' for t in d.toolkit)}, Python {version} ({a.host_python}); "
            f"fetch {fetch_s:.1f} s; peak memory of its processes {memory.peak / 2**20:.0f} MiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

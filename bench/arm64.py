"""Benchmark (issue 13): the cold build of an arm64 image next to the amd64 one, on this (amd64)
machine, in one run: the h100-train stack on both platforms.

    .venv/bin/python bench/arm64.py [--rounds 2] [--settle 61] [--keep] [--json bench/arm64-result-h100-train.json]

The locks: lockfiles/h100-train.lock (specs/h100.toml: torch 2.14.1 cu130 for linux-x86_64) and
lockfiles/gh200-train.lock (specs/gh200.toml: the same stack for GH200 hosts, linux-aarch64; PyPI's
aarch64 wheel of torch 2.11 .. 2.15 is the same CUDA 13 build as x86_64's, with the same 32 wheels
at the same versions). `--amd64-lock`/`--arm64-lock` take another pair: the run of 2026-12-02 (449458f) used
bench/lockfiles/cuda-stack-{amd64,arm64}.lock (torch 2.9.1, whose aarch64 PyPI wheel is a CPU
build), the substitute used while PyPI listed no aarch64 CUDA torch (docs/benchmarks.md).

In one run, with one cache for both locks (a temp dir under $ENVSPEC_BENCH_DIR, default /var/tmp):
  fetch        every wheel (the configured mirrors, then the lock's index: PyPI for aarch64) and
               every .deb (Debian's mirror) of each lock into the cache, timed per platform
               (amd64 first: the pure-Python wheels both locks share are then already there)
  unzip floor  each lock's own wheels unzipped, one after another (bench/build.py's unzip_floor)
  cold build   `envspec build LOCK --no-cache --json` as a subprocess (bench/build.py's
               cli_build), a new storage root each (ENVSPEC_STORAGE_ROOT), dropped after it, and
               the cache's layer tars removed (wheels and .debs kept); in the order amd64, arm64,
               arm64, amd64 with --rounds 2 (the machine is shared: alternating spreads its
               noise over both), amd64, arm64 with --rounds 1
Each build's row: wall, the build's own seconds and phases, CPU seconds of its process tree,
the CPU seconds the whole machine spent meanwhile (/proc/stat: the others' share), the load
averages before and after, the image's layer sizes and podman's size for it. Then arm64/amd64
(the median of each platform's builds) and each build / its own unzip floor.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ (also when imported)

import build as bench_build  # noqa: E402  bench/build.py (puts src/ on sys.path)
from _common import emit  # noqa: E402

from envspec import lock as lockmod  # noqa: E402
from envspec import sources  # noqa: E402
from envspec.cache.store import Cache  # noqa: E402
from envspec.host import detect_host  # noqa: E402
from envspec.plan import make_plan  # noqa: E402
from envspec.wheels.fetch import WheelFetcher  # noqa: E402

ROOT = bench_build.ROOT
LOCKS = {
    "amd64": ROOT / "lockfiles" / "h100-train.lock",
    "arm64": ROOT / "lockfiles" / "gh200-train.lock",
}


def machine_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (not idle nor iowait) since boot, /proc/stat."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = sum(f[:8]) - f[3] - f[4]  # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def fetch(plan, cache: Path) -> dict:
    """Every wheel and .deb of ``plan`` into ``cache``, timed; where the wheels came from."""
    mirrors = sources.discover().mirrors
    fetcher = WheelFetcher(Cache(cache), mirrors)
    before = {w.sha256 for w in plan.wheels if Cache(cache).has_blob(w.sha256)}
    t = time.monotonic()
    paths = fetcher.fetch_all(plan.wheels)
    wheels_s = time.monotonic() - t
    t = time.monotonic()
    ndebs = bench_build.fetch_debs(plan, cache)
    debs_s = time.monotonic() - t
    origin: dict[str, int] = {}
    for w in plan.wheels:
        where = next(fetcher.candidates(w), ("?", ""))[0]
        origin[where] = origin.get(where, 0) + w.size
    return {
        "paths": paths,
        "row": {
            "wheels_s": round(wheels_s, 1),
            "debs_s": round(debs_s, 1),
            "total_s": round(wheels_s + debs_s, 1),
            "wheels": len(plan.wheels),
            "wheels_already_cached": len(before),
            "debs": ndebs,
            "wheel_bytes": sum(w.size for w in plan.wheels),
            "wheel_bytes_fetched": sum(w.size for w in plan.wheels if w.sha256 not in before),
            "wheel_bytes_by_source": origin,
        },
    }


def podman_size(storage: Path, image: str) -> int | None:
    env = {**os.environ, "ENVSPEC_STORAGE_ROOT": str(storage)}
    st = detect_host(ask=(), env=env).storage
    cp = subprocess.run(
        ["podman", *st.args(), "image", "inspect", "--format", "{{.Size}}", image],
        capture_output=True,
        text=True,
        env=env,
    )
    return int(cp.stdout.strip()) if cp.returncode == 0 and cp.stdout.strip().isdigit() else None


def one_build(name: str, cache: Path, storage: Path) -> dict:
    import threading

    low = [shutil.disk_usage(cache).free]
    done = threading.Event()

    def watch_disk() -> None:  # the disk is shared: the least free space while it ran
        while not done.wait(1.0):
            low[0] = min(low[0], shutil.disk_usage(cache).free)

    watcher = threading.Thread(target=watch_disk, daemon=True)
    watcher.start()
    load0, cpu0 = load(), machine_cpu_s()
    try:
        row = bench_build.cli_build(
            LOCKS[name], cache, storage, as_json=True
        )  # sync + settle first
    finally:
        done.set()
        watcher.join()
    cpu1 = machine_cpu_s()
    row = {"platform": name, "load_before": load0, "load_after": load(), **row}
    # the machine's busy CPU over the build (and the settle wait before it, the others' only)
    row["machine_cpu_s_incl_settle"] = round(cpu1 - cpu0, 1)
    row["least_free_disk_gb"] = round(low[0] / 1e9, 1)
    if row.get("rc") == 0:
        row["podman_size"] = podman_size(storage, row["image"])
    bench_build.drop_storage(storage)
    for sub in ("layers", "tmp"):  # the layer tars this build made (GBs); the wheels and .debs stay
        shutil.rmtree(cache / sub, ignore_errors=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--rounds",
        type=int,
        default=2,
        choices=(1, 2),
        help="2: amd64, arm64, arm64, amd64; 1: amd64, arm64",
    )
    ap.add_argument(
        "--settle",
        type=float,
        default=bench_build.SETTLE,
        help="seconds to wait (after a sync) before each timed unzip and build (bench/build.py timed())",
    )
    ap.add_argument("--keep", action="store_true", help="keep the cache (the temp dir)")
    ap.add_argument(
        "--json", default=str(ROOT / "bench" / "arm64-result-h100-train.json")
    )  # 2026-12-02 (449458f): arm64-result.json
    ap.add_argument(
        "--amd64-lock",
        default=str(LOCKS["amd64"]),
        help="another pair of locks (a quick try: lockfiles/smoke.lock)",
    )
    ap.add_argument(
        "--arm64-lock", default=str(LOCKS["arm64"]), help="(lockfiles/smoke-arm64.lock)"
    )
    args = ap.parse_args()
    LOCKS.update(amd64=Path(args.amd64_lock).resolve(), arm64=Path(args.arm64_lock).resolve())
    bench_build.SETTLE = args.settle
    work = Path(
        tempfile.mkdtemp(
            prefix="envspec-bench-arm64-", dir=os.environ.get("ENVSPEC_BENCH_DIR", "/var/tmp")
        )
    )
    cache = work / "cache"
    res: dict = {
        "command": " ".join(["bench/arm64.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "arch": platform.machine(),
            "cpus": os.cpu_count(),
            "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        },
        "load_start": load(),
        "settle_s": args.settle,
        "envspec": " ".join(bench_build.envspec_argv()),
        "locks": {
            k: str(v.relative_to(ROOT) if v.is_relative_to(ROOT) else v) for k, v in LOCKS.items()
        },
    }
    storages: list[Path] = []
    try:
        plans = {k: make_plan(lockmod.load(p)) for k, p in LOCKS.items()}
        res["fetch"], paths = {}, {}
        for k, plan in plans.items():
            got = fetch(plan, cache)
            res["fetch"][k], paths[k] = got["row"], got["paths"]
        res["unzip_floor_s"] = {
            k: bench_build.unzip_floor(plan, paths[k], work / f"unzipped-{k}")
            for k, plan in plans.items()
        }
        order = ["amd64", "arm64", "arm64", "amd64"][: 2 * args.rounds]
        res["order"] = order
        builds = []
        for i, k in enumerate(order):
            storages.append(work / f"storage-{i}")
            row = one_build(k, cache, storages[-1])
            if row.get("rc") == 0 and res["unzip_floor_s"][k]:
                row["x_unzip_floor"] = round(row["wall_s"] / res["unzip_floor_s"][k], 2)
            builds.append(row)
        res["builds"] = builds
        ok = {k: [b for b in builds if b["platform"] == k and b.get("rc") == 0] for k in LOCKS}
        if ok["amd64"] and ok["arm64"]:
            med = {k: statistics.median(b["wall_s"] for b in rows) for k, rows in ok.items()}
            res["median_wall_s"] = med
            res["arm64_over_amd64"] = round(med["arm64"] / med["amd64"], 2)
            res["median_x_unzip_floor"] = {
                k: round(med[k] / res["unzip_floor_s"][k], 2) if res["unzip_floor_s"][k] else None
                for k in LOCKS
            }
            res["one_digest_per_platform"] = {
                k: len({b["digest"] for b in rows}) == 1 for k, rows in ok.items()
            }
            res["image_bytes"] = {
                k: {"layers": rows[0]["layers_bytes"], "podman": rows[0].get("podman_size")}
                for k, rows in ok.items()
            }
    finally:
        for st in storages:
            if st.exists():
                bench_build.drop_storage(st)
        res["load_end"] = load()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            res["kept"] = str(work)
    emit(res, args.json)
    return 0 if all(b.get("rc") == 0 for b in res.get("builds", [])) and res.get("builds") else 1


if __name__ == "__main__":
    raise SystemExit(main())

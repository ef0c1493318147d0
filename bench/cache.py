"""Benchmark: a fresh node getting a lock's image from a warm registry layer cache, beside
`podman pull` of the same image from the same registry and the machine's floor for it, in one
run (issue 14, point 2; issue 59: goal <= 0.5x podman pull and within 1.3x of the floor, on the
machine's own file system).

    .venv/bin/python bench/cache.py [--lock lockfiles/cpu.lock] [--rounds 3] [--json OUT]
                                    [--a-cache DIR] [--fs here|fresh|tmp]

Under a temp dir (removed at the end), Debian's docker-registry on loopback:
  machine A      envspec build --cache-to REG/bench/cache --push REG/bench/img:TAG (not timed:
                 it fills the cache and pushes the image podman pulls; --a-cache DIR: its
                 envspec cache, e.g. ~/.cache/envspec where the lock was built before)
  then, per round, rotating which goes first, each after `sync` and a drop of the page cache
  (the registry's blobs are read from its disk by every one alike):
  from cache     a fresh node (empty storage root, empty envspec cache: no wheels, no .debs, and
                 no pip configuration: none of this machine's wheel mirrors)
                 runs envspec build --cache-from REG/bench/cache; every cacheable layer must come
                 from the registry and the image (its config digest, the ID podman shows) must be A's
  podman pull    `podman pull REG/bench/img@DIGEST` into another empty storage root
  floor          what the disk and cores allow for this image: every layer's blob read from the
                 registry (curl), decompressed (zstd) and untarred (GNU tar) into a fresh directory
                 on the storage's disk, all layers at once; also each step alone (fetch to
                 /dev/null; fetch and decompress to /dev/null), to say where the floor's time goes
Where every timed run writes (--fs; issue 59, point 2):
  here   (the default) beside the default containers-storage (podman's graph root, e.g.
         /var/lib/containers/envspec-bench-*) and envspec cache (~/.cache/envspec-bench-*): the
         machine's own file system and parent directories, the previous run's store removed just
         before, as on a node that replaces images (never the default stores themselves)
  fresh  a new ext4 (with its journal, as a node's) on a sparse file, loop-mounted with direct I/O:
         on a root ext4 with no journal, ext4 skips, one by one, the inodes deleted in the last
         minutes when it makes a file (``recently_deleted``, perf), so there each run pays for
         the removal of the one before it, unless it makes its directories where the removed
         ones were not (envspec's staging area does: ENVSPEC_SPREAD_STAGING, docs/build.md);
         a fresh file system does not
  tmp    a plain directory under --tmp (the smoke test's)
Each run also reports the disk its store and envspec cache take afterwards (``du``; issue 59,
point 5: a pull leaves no second copy of the layers).
Seconds are wall-clock of each command as a user runs it, CPU seconds are the command's with its
children (user + system); the medians, the spread (min, max) and the machine's load are recorded
(on a shared machine the numbers are noisy).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from _common import emit  # noqa: E402  bench/_common.py (run as a script: its directory is on sys.path)
from conftest import loop_fs, private_storage, start_registry  # noqa: E402  (the tests' registry, storage, loop file systems)

DECOMPRESS = {"zstd": "zstd -dc", "gzip": "gzip -dc", "tar": "cat"}


def busy_s() -> float:
    """Seconds the machine's CPUs were busy since boot, every process and kernel thread (the
    kernel's writeback of the untarred files too), from /proc/stat (user, nice, system, irq,
    softirq, steal)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def cpu_s() -> float:
    """User + system seconds of this script's waited-for children so far (their children too)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def drop_caches() -> bool:
    """``sync`` and drop the page cache (root only); False where it cannot be dropped."""
    subprocess.run(["sync"], check=False)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


FS_WAYS = ("here", "fresh", "tmp")


def default_dirs() -> tuple[Path, Path]:
    """Where containers-storage (podman's graph root) and envspec's cache are by default here."""
    from envspec.settings import cache_dir_for

    cp = subprocess.run(
        ["podman", "info", "--format", "{{.Store.GraphRoot}}"], capture_output=True, text=True
    )
    graph = Path(cp.stdout.strip() or "/var/lib/containers/storage")
    return graph, cache_dir_for({k: v for k, v in os.environ.items() if k != "ENVSPEC_CACHE"})


@contextlib.contextmanager
def node_dirs(base: Path, name: str, way: str):
    """A node's (storage root, envspec cache) for one run, removed afterwards. ``way``: "fresh",
    both on a new ext4 of its own (a sparse file, loop-mounted); "here", beside the default
    containers-storage and envspec cache (the same file system and parent directories, never
    the stores themselves), where the previous run's store was just removed, as on a node that
    replaces images; "tmp", under ``base``."""
    if way != "here":
        with fresh_fs(base, name, way == "fresh") as d:
            yield d / "storage", d / "cache"
        return
    graph, cache = default_dirs()
    store = graph.parent / f"envspec-bench-{name}-{os.getpid()}"
    cache = cache.parent / f"envspec-bench-{name}-{os.getpid()}"
    try:
        yield store / "storage", cache
    finally:
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)


@contextlib.contextmanager
def fresh_fs(base: Path, name: str, on: bool):
    """A directory on a new ext4 of its own (a sparse file, loop-mounted), removed afterwards;
    ``on`` False: a plain directory under ``base``."""
    d = base / name
    d.mkdir()
    if not on:
        try:
            yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)
        return
    # direct I/O to the backing file: its pages are not cached twice (a sync of the loop device
    # then takes what one of the disk takes: 0.7 s against 1.6-2.5 s for 887 MB here)
    try:
        with loop_fs(base / f"{name}.img", d, ["mkfs.ext4", "-q", "-F"], "60G", direct_io=True):
            yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def disk_bytes(*paths: Path) -> int:
    """Bytes of disk the paths take (``du``: blocks, each hard-linked file once)."""
    there = [str(p) for p in paths if p.exists()]
    if not there:
        return 0
    cp = subprocess.run(["du", "-s", "-c", "-B1", *there], capture_output=True, text=True)
    return int(cp.stdout.splitlines()[-1].split()[0])


def user_env(**extra: str) -> dict[str, str]:
    """The environment a user's envspec runs in: this one, with src/ on the path and envspec's
    modules compiled once as pip would have installed them (PYTHONDONTWRITEBYTECODE, where this
    shell sets it, would make every run compile them again: 0.1 s of each cpu.lock run)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(ROOT / "src"), **extra}


def envspec(
    lock: str,
    env: dict[str, str],
    *args: str,
    perf: Path | None = None,
    cprofile: Path | None = None,
) -> tuple[float, dict]:
    """``perf``: the run recorded there, the whole machine's (kernel threads too), with call graphs;
    ``cprofile``: the Python side's profile written there."""
    wrap = ["perf", "record", "-q", "-a", "-g", "-F", "499", "-o", str(perf), "--"] if perf else []
    prof = ["-m", "cProfile", "-o", str(cprofile)] if cprofile else []
    t = time.monotonic()
    cp = subprocess.run(
        [*wrap, sys.executable, *prof, "-m", "envspec", "build", lock, "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    dt = time.monotonic() - t
    if cp.returncode != 0:
        raise SystemExit(f"envspec build {' '.join(args)} failed:\n{cp.stderr[-3000:]}")
    if "warning" in cp.stderr:
        print(cp.stderr[-2000:], file=sys.stderr)
    return dt, json.loads(cp.stdout)


def blobs_of(addr: str, repo: str, digest: str) -> list[tuple[str, str, int]]:
    """(digest, compression, size) of the image's layer blobs, from its manifest."""
    raw = subprocess.run(
        ["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{addr}/{repo}@{digest}"],
        capture_output=True,
        check=True,
    ).stdout
    out = []
    for lay in json.loads(raw)["layers"]:
        mt = lay["mediaType"]
        kind = "zstd" if mt.endswith("zstd") else "gzip" if mt.endswith("gzip") else "tar"
        out.append((lay["digest"], kind, int(lay["size"])))
    return out


def floor(
    addr: str, repo: str, blobs: list[tuple[str, str, int]], dest: Path | None, upto: str
) -> float:
    """Seconds for every blob at once through ``upto``: "fetch" (to /dev/null), "decompress" (to
    /dev/null) or "untar" (into ``dest``/<i>)."""
    procs = []
    t = time.monotonic()
    for i, (digest, kind, _size) in enumerate(blobs):
        cmd = f"curl -sf http://{addr}/v2/{repo}/blobs/{digest}"
        if upto == "fetch":
            cmd += " -o /dev/null"
        elif upto == "decompress":
            cmd += f" | {DECOMPRESS[kind]} > /dev/null"
        else:
            assert dest is not None
            (dest / str(i)).mkdir(parents=True)
            cmd += f" | {DECOMPRESS[kind]} | tar -x -C {dest / str(i)}"
        procs.append(subprocess.Popen(["bash", "-o", "pipefail", "-c", cmd]))
    rcs = [p.wait() for p in procs]
    dt = time.monotonic() - t
    if any(rcs):
        raise SystemExit(f"the floor's {upto} failed: {rcs}")
    return dt


def spread(xs: list[float]) -> dict:
    s = sorted(xs)
    return {
        "median": round(s[len(s) // 2], 2),
        "min": round(s[0], 2),
        "max": round(s[-1], 2),
        "n": len(s),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lock", default="lockfiles/cpu.lock")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--tmp", default=os.environ.get("TMPDIR", "/var/tmp"))
    ap.add_argument(
        "--a-cache", help="machine A's envspec cache (default: an empty one under the temp dir)"
    )
    ap.add_argument(
        "--fs",
        choices=FS_WAYS,
        default="here",
        help="where each run's store and cache are: beside the default containers-storage and "
        "envspec cache (here), on a new loop-mounted ext4 per run (fresh), under --tmp (tmp)",
    )
    ap.add_argument(
        "--steps",
        default="envspec,podman,floor",
        help="which runs each round makes (comma-separated, of envspec, podman, floor)",
    )
    ap.add_argument(
        "--perf",
        help="record each envspec run with `perf record -a -g` into DIR/envspec-<round>.data",
    )
    ap.add_argument(
        "--cprofile",
        help="profile each envspec run's Python with cProfile into DIR/envspec-<round>.prof",
    )
    args = ap.parse_args()
    rows: list[dict] = []
    res: dict = {
        "lock": args.lock,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "fs": args.fs,
        "load_before": os.getloadavg(),
        "rows": rows,
    }
    with tempfile.TemporaryDirectory(prefix="envspec-bench-cache-", dir=args.tmp) as td:
        base = Path(td)
        (base / "reg").mkdir()
        with start_registry(base / "reg") as addr:
            cache_ref = f"{addr}/bench/cache"
            with private_storage(base / "storage-a"):
                subprocess.run(
                    [sys.executable, "-m", "compileall", "-q", str(ROOT / "src" / "envspec")],
                    check=True,
                )
                env = user_env(ENVSPEC_CACHE=args.a_cache or str(base / "cache-a"))
                _, a = envspec(
                    args.lock,
                    env,
                    "--cache-to",
                    cache_ref,
                    "--push",
                    f"{addr}/bench/img:cpu",
                    "--tag",
                    "",
                )
            res["digest"], res["config"] = a["digest"], a["config"]
            res["blob_bytes"] = sum(lay["size"] for lay in a["layers"])
            res["uncompressed_bytes"] = sum(lay["diff_size"] for lay in a["layers"])
            res["cache_entries"] = len(a["cache"]["pushed"])
            blobs = blobs_of(addr, "bench/img", a["digest"])

            def from_cache(n: int) -> dict:
                with (
                    node_dirs(base, f"node-b{n}", args.fs) as (store, cache),
                    private_storage(store),
                ):
                    # a compute node reaches the registry, not this machine's wheel mirrors
                    env = {
                        k: v
                        for k, v in user_env(
                            ENVSPEC_CACHE=str(cache), PIP_CONFIG_FILE=os.devnull
                        ).items()
                        if k not in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")
                    }
                    res["drop_caches"] = drop_caches()
                    perf = Path(args.perf, f"envspec-{n}.data") if args.perf else None
                    prof = Path(args.cprofile, f"envspec-{n}.prof") if args.cprofile else None
                    dt, b = envspec(
                        args.lock, env, "--cache-from", cache_ref, perf=perf, cprofile=prof
                    )
                    disk = {"store": disk_bytes(store), "cache": disk_bytes(cache)}
                srcs = {lay["group"]: lay["source"] for lay in b["layers"]}
                assert all(s == "registry" for s in srcs.values()), srcs  # the envspec layer too
                # the same image: its config (the image ID podman shows) is A's
                assert b["config"] == a["config"], (b["config"], a["config"])
                return {
                    "what": "envspec",
                    "round": n,
                    "seconds": dt,
                    "sources": srcs,
                    "same_image": True,
                    "build_s": b["seconds"],
                    "phases": b["phases"],
                    "disk": disk,
                }

            def pull(n: int) -> dict:
                with (
                    node_dirs(base, f"node-p{n}", args.fs) as (store, _cache),
                    private_storage(store) as host,
                ):
                    drop_caches()
                    t = time.monotonic()
                    cp = subprocess.run(
                        [
                            "podman",
                            *host.storage.args(),
                            "pull",
                            "--quiet",
                            "--tls-verify=false",
                            f"docker://{addr}/bench/img@{a['digest']}",
                        ],
                        capture_output=True,
                        text=True,
                    )
                    dt = time.monotonic() - t
                    if cp.returncode != 0:
                        raise SystemExit(f"podman pull failed:\n{cp.stderr[-3000:]}")
                    assert cp.stdout.strip() == a["config"].split(":", 1)[1], (
                        cp.stdout,
                        a["config"],
                    )
                    disk = {"store": disk_bytes(store)}
                    return {"what": "podman pull", "round": n, "seconds": dt, "disk": disk}

            def floors(n: int) -> dict:
                row: dict = {"what": "floor", "round": n}
                for upto in ("fetch", "decompress", "untar"):
                    with node_dirs(base, f"node-f{n}-{upto}", args.fs) as (store, _cache):
                        drop_caches()
                        row[upto] = round(floor(addr, "bench/img", blobs, store, upto), 3)
                row["seconds"] = row["untar"]
                return row

            named = {"envspec": from_cache, "podman": pull, "floor": floors}
            steps = [named[s] for s in args.steps.split(",")]
            for n in range(args.rounds):
                for fn in steps[n % len(steps) :] + steps[: n % len(steps)]:
                    c0, b0 = cpu_s(), busy_s()
                    rows.append(fn(n))
                    rows[-1]["cpu_s"] = round(cpu_s() - c0, 2)  # the floor's: of its three runs
                    rows[-1]["busy_s"] = round(
                        busy_s() - b0, 2
                    )  # the whole machine's, set-up included
                    print(json.dumps(rows[-1]), flush=True)
    res["load_after"] = os.getloadavg()
    for what in ("envspec", "podman pull", "floor"):
        if any(r["what"] == what for r in rows):
            res[what] = spread([r["seconds"] for r in rows if r["what"] == what])
    for step in ("fetch", "decompress"):
        if any(r["what"] == "floor" for r in rows):
            res[f"floor {step}"] = spread([r[step] for r in rows if r["what"] == "floor"])
    if len(steps) < 3:
        emit(res, args.json)
        return 0
    res["ratio_podman"] = round(res["envspec"]["median"] / res["podman pull"]["median"], 3)
    res["ratio_floor"] = round(res["envspec"]["median"] / res["floor"]["median"], 3)
    res["goal_met"] = res["ratio_podman"] <= 0.5 and res["ratio_floor"] <= 1.3
    emit(res, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

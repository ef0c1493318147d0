"""Benchmark: a fresh machine building a lock from a warm registry layer cache, next to
`podman pull` of the same image from the same registry, in one run (issue 14, point 2: goal
within 1.2x of podman pull).

    .venv/bin/python bench/cache.py [--lock lockfiles/cpu.lock] [--rounds 2] [--json OUT]

Under a temp dir (removed at the end), Debian's docker-registry on loopback:
  machine A      envspec build --cache-to REG/bench/cache --push REG/bench/img:TAG (not timed:
                 it fills the cache and pushes the image podman pulls)
  then, per round, alternating which goes first:
  from cache     a fresh machine (empty storage root, empty envspec cache: no wheels, no .debs)
                 runs envspec build --cache-from REG/bench/cache; every cacheable layer must come
                 from the registry and the digest must be A's
  podman pull    `podman pull REG/bench/img@DIGEST` into another empty storage root
Seconds are wall-clock of each command as a user runs it; the machine's load is recorded (on a
shared machine the numbers are noisy).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from conftest import private_storage, start_registry  # noqa: E402  (the tests' registry and storage)

from _common import emit  # noqa: E402  bench/_common.py (run as a script: its directory is on sys.path)


def envspec(lock: str, env: dict[str, str], *args: str) -> tuple[float, dict]:
    t = time.monotonic()
    cp = subprocess.run([sys.executable, "-m", "envspec", "build", lock, "--json", *args], capture_output=True,
                        text=True, env=env, cwd=ROOT)
    dt = time.monotonic() - t
    if cp.returncode != 0:
        raise SystemExit(f"envspec build {' '.join(args)} failed:\n{cp.stderr[-3000:]}")
    if "warning" in cp.stderr:
        print(cp.stderr[-2000:], file=sys.stderr)
    return dt, json.loads(cp.stdout)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lock", default="lockfiles/cpu.lock")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--tmp", default=os.environ.get("TMPDIR", "/var/tmp"))
    args = ap.parse_args()
    rows: list[dict] = []
    res: dict = {"lock": args.lock, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "cpus": os.cpu_count(), "load_before": os.getloadavg(), "rows": rows}
    with tempfile.TemporaryDirectory(prefix="envspec-bench-cache-", dir=args.tmp) as td:
        base = Path(td)
        (base / "reg").mkdir()
        with start_registry(base / "reg") as addr:
            cache_ref = f"{addr}/bench/cache"
            with private_storage(base / "storage-a"):
                env = {**os.environ, "ENVSPEC_CACHE": str(base / "cache-a"), "PYTHONPATH": str(ROOT / "src")}
                _, a = envspec(args.lock, env, "--cache-to", cache_ref, "--push", f"{addr}/bench/img:cpu", "--tag", "")
            res["digest"] = a["digest"]
            res["blob_bytes"] = sum(lay["size"] for lay in a["layers"])
            res["uncompressed_bytes"] = sum(lay["diff_size"] for lay in a["layers"])
            res["cache_entries"] = len(a["cache"]["pushed"])

            def from_cache(n: int) -> dict:
                with private_storage(base / f"storage-b{n}"):
                    env = {**os.environ, "ENVSPEC_CACHE": str(base / f"cache-b{n}"), "PYTHONPATH": str(ROOT / "src")}
                    dt, b = envspec(args.lock, env, "--cache-from", cache_ref)
                srcs = {lay["group"]: lay["source"] for lay in b["layers"]}
                assert all(s == "registry" for g, s in srcs.items() if g != "envspec"), srcs
                assert b["digest"] == a["digest"], (b["digest"], a["digest"])
                return {"what": "envspec build --cache-from (fresh machine)", "round": n, "seconds": dt,
                        "sources": srcs, "same_digest": True,
                        "phases": {p["name"]: p["s"] for p in b["phases"]}}

            def pull(n: int) -> dict:
                with private_storage(base / f"storage-p{n}") as host:
                    t = time.monotonic()
                    cp = subprocess.run(["podman", *host.storage.args(), "pull", "--quiet", "--tls-verify=false",
                                         f"docker://{addr}/bench/img@{a['digest']}"], capture_output=True, text=True)
                    dt = time.monotonic() - t
                    if cp.returncode != 0:
                        raise SystemExit(f"podman pull failed:\n{cp.stderr[-3000:]}")
                    return {"what": "podman pull", "round": n, "seconds": dt}

            for n in range(args.rounds):
                order = (from_cache, pull) if n % 2 == 0 else (pull, from_cache)
                for fn in order:
                    rows.append(fn(n))
                    print(json.dumps(rows[-1]), flush=True)
    res["load_after"] = os.getloadavg()
    ours = sorted(r["seconds"] for r in rows if r["what"].startswith("envspec"))
    theirs = sorted(r["seconds"] for r in rows if r["what"] == "podman pull")
    res["median_envspec_s"] = ours[len(ours) // 2]
    res["median_podman_pull_s"] = theirs[len(theirs) // 2]
    res["ratio"] = round(res["median_envspec_s"] / res["median_podman_pull_s"], 3)
    res["goal_met"] = res["ratio"] <= 1.2
    emit(res, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: `envspec build --push` with compressed layers against `podman push` of the same
image, each to a fresh Debian docker-registry on loopback.

    .venv/bin/python bench/push.py [--lock lockfiles/cpu.lock] [--compression zstd,gzip,none] [--json OUT]

In one storage root and one cache (under a temp dir, removed at the end):
  warm-up         envspec build --compression none (fetches wheels and .debs; not reported)
  podman push     `podman push` (containers/image's gzip: its default) of the image in the store
  cold X          envspec build --no-cache --push --compression X: layers made and compressed
                  as they are written, then pushed
  warm X          envspec build --push --compression X again, to another fresh registry: the
                  layers and their compressed blobs come from the cache, only the push is left
  build, none     envspec build --no-cache without push or compression: what the layers cost
Bytes stored: `du -sb` of each registry's data directory. Each run's seconds are wall-clock of
the CLI as a user runs it. The machine's load is recorded: on a shared machine the numbers are noisy.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
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


def du(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def envspec(lock: str, env: dict[str, str], *args: str) -> tuple[float, dict]:
    t = time.monotonic()
    cp = subprocess.run([sys.executable, "-m", "envspec", "build", lock, "--json", *args], capture_output=True,
                        text=True, env=env, cwd=ROOT)
    dt = time.monotonic() - t
    if cp.returncode != 0:
        raise SystemExit(f"envspec build {' '.join(args)} failed:\n{cp.stderr[-3000:]}")
    return dt, json.loads(cp.stdout)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lock", default="lockfiles/cpu.lock")
    ap.add_argument("--compression", default="zstd,gzip,none")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--tmp", default=os.environ.get("TMPDIR", "/var/tmp"))
    args = ap.parse_args()
    rows: list[dict] = []
    res: dict = {"lock": args.lock, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "cpus": os.cpu_count(), "load_before": os.getloadavg(), "rows": rows}
    with tempfile.TemporaryDirectory(prefix="envspec-bench-push-", dir=args.tmp) as td, \
            private_storage(Path(td) / "storage") as host, contextlib.ExitStack() as stack:
        base = Path(td)
        env = {**os.environ, "ENVSPEC_CACHE": str(base / "cache"), "PYTHONPATH": str(ROOT / "src")}

        def registry(name: str) -> tuple[str, Path]:
            d = base / f"reg-{name}"
            d.mkdir()
            return stack.enter_context(start_registry(d)), d / "registry-data"

        _, warm = envspec(args.lock, env, "--compression", "none")
        image = warm["image"]
        res["uncompressed_bytes"] = sum(lay["diff_size"] for lay in warm["layers"])

        dt, _ = envspec(args.lock, env, "--compression", "none", "--no-cache", "--tag", "")
        rows.append({"what": "envspec build --no-cache, no push, none", "seconds": dt})

        addr, data = registry("podman")
        t = time.monotonic()
        subprocess.run(["podman", *host.storage.args(), "push", "--quiet", "--tls-verify=false", image,
                        f"docker://{addr}/bench/img:podman"], check=True, capture_output=True)
        rows.append({"what": "podman push (gzip)", "seconds": time.monotonic() - t, "bytes": du(data)})
        print(json.dumps(rows[-1]), flush=True)

        for comp in args.compression.split(","):
            addr, data = registry(f"cold-{comp}")
            dt, out = envspec(args.lock, env, "--compression", comp, "--no-cache", "--tag", "",
                              "--push", f"{addr}/bench/img:{comp}")
            rows.append({"what": f"envspec build --no-cache --push, {comp}", "seconds": dt, "bytes": du(data),
                         "digest": out["digest"]})
            print(json.dumps(rows[-1]), flush=True)
            addr, data = registry(f"warm-{comp}")
            dt, again = envspec(args.lock, env, "--compression", comp, "--tag", "", "--push", f"{addr}/bench/img:{comp}")
            rows.append({"what": f"envspec build --push (layers cached), {comp}", "seconds": dt, "bytes": du(data),
                         "digest": again["digest"], "same_digest": again["digest"] == out["digest"]})
            print(json.dumps(rows[-1]), flush=True)
    res["load_after"] = os.getloadavg()
    emit(res, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

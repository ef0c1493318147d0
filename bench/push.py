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
  after local     the users' flow since local builds keep their layers uncompressed (docs/build.md,
                  "Which digest"): `envspec build LOCK` (nothing named: no compression), then
                  `envspec build LOCK --push REF`, once with the background compression off (the
                  push compresses what it carries) and once with it on, the push started after the
                  background job ended (its seconds reported apart)
Bytes stored: `du -sb` of each registry's data directory. Each run's seconds are wall-clock of
the CLI as a user runs it. The machine's load is recorded: on a shared machine the numbers are noisy.
"""

from __future__ import annotations

import argparse
import contextlib
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

from _common import emit, wait_gone  # noqa: E402  bench/_common.py (run as a script: its directory is on sys.path)
from conftest import private_storage, start_registry  # noqa: E402  (the tests' registry and storage)


def du(path: Path) -> int:
    return int(
        subprocess.run(
            ["du", "-sb", str(path)], capture_output=True, text=True, check=True
        ).stdout.split()[0]
    )


def envspec(lock: str, env: dict[str, str], *args: str) -> tuple[float, dict]:
    t = time.monotonic()
    cp = subprocess.run(
        [sys.executable, "-m", "envspec", "build", lock, "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    dt = time.monotonic() - t
    if cp.returncode != 0:
        raise SystemExit(f"envspec build {' '.join(args)} failed:\n{cp.stderr[-3000:]}")
    return dt, json.loads(cp.stdout)


def after_local(lock: str, env: dict[str, str], cache: Path, registry) -> list[dict]:
    """A local build, then a push of it: with the background compression off, then on."""
    from envspec.image.compress import Compression

    rows = []
    off = {**env, "ENVSPEC_BACKGROUND_COMPRESS": "off"}
    dt, local = envspec(lock, off, "--no-cache")
    assert local["compression"] == "none", local["compression"]
    rows.append(
        {
            "what": "envspec build --no-cache (local: layers kept uncompressed)",
            "seconds": dt,
            "digest": local["digest"],
        }
    )
    print(json.dumps(rows[-1]), flush=True)
    addr, data = registry("after-local-off")
    dt, out = envspec(lock, off, "--tag", "", "--push", f"{addr}/bench/img:after-local")
    rows.append(
        {
            "what": "envspec build --push after it, background compression off (compressed while pushing)",
            "seconds": dt,
            "bytes": du(data),
            "digest": out["digest"],
        }
    )
    print(json.dumps(rows[-1]), flush=True)
    for p in (cache / "layers").glob(
        f"*.{Compression('zstd').id}.*"
    ):  # the cache as that local build left it
        p.unlink()
    on = {**env, "ENVSPEC_BACKGROUND_COMPRESS": "on"}
    t = time.monotonic()
    dt, local = envspec(lock, on, "--no-cache")
    bg = local["background_compress"]
    wait_gone(bg["pid"])
    rows.append(
        {
            "what": "envspec build --no-cache, and the background compression it starts",
            "seconds": dt,
            "background_done_s": round(time.monotonic() - t, 1),
        }
    )
    print(json.dumps(rows[-1]), flush=True)
    addr, data = registry("after-local-on")
    dt, again = envspec(lock, on, "--tag", "", "--push", f"{addr}/bench/img:after-local")
    rows.append(
        {
            "what": "envspec build --push after it, the background compression done",
            "seconds": dt,
            "bytes": du(data),
            "digest": again["digest"],
            "same_digest": again["digest"] == out["digest"],
        }
    )
    print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lock", default="lockfiles/cpu.lock")
    ap.add_argument("--compression", default="zstd,gzip,none")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--tmp", default=os.environ.get("TMPDIR", "/var/tmp"))
    args = ap.parse_args()
    rows: list[dict] = []
    res: dict = {
        "lock": args.lock,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg(),
        "rows": rows,
    }
    with (
        tempfile.TemporaryDirectory(prefix="envspec-bench-push-", dir=args.tmp) as td,
        private_storage(Path(td) / "storage") as host,
        contextlib.ExitStack() as stack,
    ):
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

        if "zstd" in args.compression.split(","):
            rows.extend(after_local(args.lock, env, base / "cache", registry))

        addr, data = registry("podman")
        t = time.monotonic()
        subprocess.run(
            [
                "podman",
                *host.storage.args(),
                "push",
                "--quiet",
                "--tls-verify=false",
                image,
                f"docker://{addr}/bench/img:podman",
            ],
            check=True,
            capture_output=True,
        )
        rows.append(
            {"what": "podman push (gzip)", "seconds": time.monotonic() - t, "bytes": du(data)}
        )
        print(json.dumps(rows[-1]), flush=True)

        for comp in args.compression.split(","):
            addr, data = registry(f"cold-{comp}")
            dt, out = envspec(
                args.lock,
                env,
                "--compression",
                comp,
                "--no-cache",
                "--tag",
                "",
                "--push",
                f"{addr}/bench/img:{comp}",
            )
            rows.append(
                {
                    "what": f"envspec build --no-cache --push, {comp}",
                    "seconds": dt,
                    "bytes": du(data),
                    "digest": out["digest"],
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            addr, data = registry(f"warm-{comp}")
            dt, again = envspec(
                args.lock,
                env,
                "--compression",
                comp,
                "--tag",
                "",
                "--push",
                f"{addr}/bench/img:{comp}",
            )
            rows.append(
                {
                    "what": f"envspec build --push (layers cached), {comp}",
                    "seconds": dt,
                    "bytes": du(data),
                    "digest": again["digest"],
                    "same_digest": again["digest"] == out["digest"],
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    res["load_after"] = os.getloadavg()
    emit(res, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

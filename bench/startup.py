"""Benchmark: an image's first minute, as a user meets it (issue 15).

    .venv/bin/python bench/startup.py [--lock lockfiles/h100-train.lock] [--runs 5] [--json OUT]
                                      [--no-peer] [--verify-runs 2]

Builds the lock's image with the CLI (`envspec build LOCK`; a no-op when it is already in the
store) and a peer image the plain way (FROM envspec's own Debian base layer, the only base that can
be reached here; `RUN python -m ensurepip && pip install --no-deps --no-index` of the lock's own
wheel files, so pip byte-compiles them as it always does), then times, each `--runs` times in a new
container started with the argv `envspec run IMAGE --json --no-mount` gives (the host's runtime,
ulimits, shm; GPUs where there are any):

  true, hook       `podman run IMAGE true`: the entrypoint's start-up check, then `true`
  true, hook off   the same with ENVSPEC_VERIFY=off
  true, peer       `podman run PEER true`
  import torch     `python -c 'import torch'` in the envspec image (hook off) and in the peer
  verify quick     `envspec verify` (quick level) in the envspec image (hook off), its exit code too
  bare import      `python -c 'import torch'` once more, right before verify, for verify's ratio

Medians and the ratios the issue sets goals for go into the JSON. The store is the default one
(or ENVSPEC_STORAGE_ROOT); the peer image is removed at the end unless --keep-peer.
"""

from __future__ import annotations

import argparse
import importlib.util
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

from _common import emit  # noqa: E402  bench/_common.py (run as a script: its directory is on sys.path)

from envspec import lock as lockmod  # noqa: E402
from envspec import sources
from envspec.cache.store import Cache  # noqa: E402
from envspec.image import BuildahEngine  # noqa: E402
from envspec.plan import make_plan  # noqa: E402
from envspec.wheels.fetch import WheelFetcher  # noqa: E402

ENVSPEC = [sys.executable, "-m", "envspec"]
PEER_REF = "localhost/bench/peer-startup:1"


def envspec_cli(*args: str, capture: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([*ENVSPEC, *args], capture_output=capture, text=True, env=env, check=True)


def run_argv(image: str, lock: Path, env: dict[str, str], cmd: list[str]) -> list[str]:
    """The argv `envspec run` would exec for ``cmd`` in ``image``, with ``env`` set in the container."""
    out = json.loads(
        envspec_cli("run", str(lock), "--image", image, "--json", "--no-mount", "--", *cmd).stdout
    )
    argv = list(out["argv"])
    at = argv.index("run") + 1
    for k, v in env.items():
        argv[at:at] = ["-e", f"{k}={v}"]
    return argv


def timed_runs(argv: list[str], runs: int) -> dict:
    """``runs`` starts of ``argv`` as `envspec run` does them (``run.attached``: by name, without
    podman 4.3's racy --rm, the container removed after; the removal is not timed)."""
    from envspec.run import RunCommand, attached

    times, codes = [], []
    for i in range(runs):
        image = next(a for a in argv if a.startswith("localhost/"))
        run, remove = attached(
            RunCommand(argv=argv, engine="podman", image=image), f"bench-{os.getpid()}-{i}"
        )
        t0 = time.monotonic()
        cp = subprocess.run(run, capture_output=True, text=True)
        times.append(time.monotonic() - t0)
        codes.append(cp.returncode)
        subprocess.run(remove, capture_output=True)
    return {
        "median_s": round(statistics.median(times), 3),
        "min_s": round(min(times), 3),
        "max_s": round(max(times), 3),
        "runs": [round(t, 3) for t in times],
        "exit_codes": codes,
        "stderr_tail": cp.stderr[-800:],
    }


def build_peer(lock: lockmod.Lockfile, engine: BuildahEngine, work: Path) -> tuple[str, float]:
    """The plain Containerfile way on envspec's own base layer (bench/build.py's peer)."""
    spec = importlib.util.spec_from_file_location(
        "bench_build", Path(__file__).with_name("build.py")
    )
    assert spec is not None and spec.loader is not None
    bench_build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_build)
    plan = make_plan(lock)
    cache = Cache()
    paths = WheelFetcher(cache, sources.discover().mirrors).fetch_all(plan.wheels)
    containerfile = bench_build.peer_containerfile(engine, plan, paths, cache.root, work)
    argv = [
        "buildah",
        *engine.host.storage.args(),
        "bud",
        "--isolation",
        "chroot",
        "--layers=false",
        "-v",
        f"{work / 'wheels'}:/wheels:ro",
        "-t",
        PEER_REF,
        "-f",
        str(containerfile),
        str(work),
    ]
    t0 = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True)
    return PEER_REF, time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lock", default=str(ROOT / "lockfiles" / "h100-train.lock"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--verify-runs", type=int, default=2)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--keep-peer", action="store_true")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()

    lock_path = Path(args.lock).resolve()
    lock = lockmod.load(lock_path)
    res: dict = {"lock": str(lock_path), "runs": args.runs}
    t0 = time.monotonic()
    built = json.loads(envspec_cli("build", str(lock_path), "--json", "--quiet").stdout)
    res["build_s"] = round(time.monotonic() - t0, 1)
    image = built["image"]
    res["image"], res["digest"] = image, built["digest"]
    engine = BuildahEngine()
    work = Path(
        tempfile.mkdtemp(
            prefix="envspec-bench-startup-", dir=os.environ.get("ENVSPEC_BENCH_DIR", "/var/tmp")
        )
    )
    peer = None
    try:
        if not args.no_peer:
            peer, t = build_peer(lock, engine, work)
            res["peer_build_s"] = round(t, 1)
        off = {"ENVSPEC_VERIFY": "off"}
        torch_cmd = ["python", "-c", "import torch"]
        res["true_hook"] = timed_runs(run_argv(image, lock_path, {}, ["true"]), args.runs)
        res["true_hook_off"] = timed_runs(run_argv(image, lock_path, off, ["true"]), args.runs)
        res["import_torch"] = timed_runs(run_argv(image, lock_path, off, torch_cmd), args.runs)
        if peer:
            res["peer_true"] = timed_runs(run_argv(peer, lock_path, {}, ["true"]), args.runs)
            res["peer_import_torch"] = timed_runs(
                run_argv(peer, lock_path, {}, torch_cmd), args.runs
            )
        res["verify_quick"] = timed_runs(
            run_argv(image, lock_path, off, ["envspec", "verify"]), args.verify_runs
        )
        res["bare_import_before_verify"] = timed_runs(run_argv(image, lock_path, off, torch_cmd), 1)
        med = lambda k: res[k]["median_s"]  # noqa: E731
        res["ratio_hook"] = round(med("true_hook") / med("true_hook_off"), 2)
        res["ratio_verify_to_import"] = round(med("verify_quick") / med("import_torch"), 2)
        if peer:
            res["ratio_import_to_peer"] = round(med("import_torch") / med("peer_import_torch"), 2)
    finally:
        if peer and not args.keep_peer:
            for ref in (peer, "localhost/bench/base:1"):
                subprocess.run(
                    ["podman", *engine.host.storage.args(), "rmi", "-f", ref], capture_output=True
                )
        shutil.rmtree(work, ignore_errors=True)
    emit(res, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the container start-up hook costs (issue 15: a tenth of a second or so, no torch).

Alternates, in one run, a new process each time:
  floor  `python -c pass` (the interpreter's own start)
  hook   `python -m envspec.verify --startup` against LOCK (this tree's verifier, ENVSPEC_VERIFY=warn)
and, with --image, `podman run --rm IMAGE true` with the hook (ENVSPEC_VERIFY=warn) and without it
(ENVSPEC_VERIFY=off), whose ratio is the issue's goal (<= 1.3). Prints wall and CPU (user+sys of
the child) medians; CPU time says more than wall on a loaded machine.

    python bench/startup_hook.py --lock lockfiles/h100-train.lock --runs 15
    python bench/startup_hook.py --lock lockfiles/cpu.lock --image localhost/envspec/cpu:TAG \\
        --podman-args "--root /tmp/x/storage --runroot /tmp/x/run" --run-args "--runtime runc"
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    cp = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if cp.returncode != 0:
        raise SystemExit(f"{shlex.join(argv)} exited {cp.returncode}:\n{cp.stdout}\n{cp.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def summary(samples: list[tuple[float, float]]) -> dict[str, float]:
    walls, cpus = [s[0] for s in samples], [s[1] for s in samples]
    return {
        "wall_median_s": round(statistics.median(walls), 4),
        "wall_min_s": round(min(walls), 4),
        "cpu_median_s": round(statistics.median(cpus), 4),
        "runs": len(samples),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lock", default=str(ROOT / "lockfiles" / "h100-train.lock"))
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument(
        "--image", help="also time `podman run --rm IMAGE true` with and without the hook"
    )
    ap.add_argument(
        "--podman-args", default="", help="podman's global options (a private storage root)"
    )
    ap.add_argument("--run-args", default="", help="options for `podman run` (e.g. --runtime runc)")
    args = ap.parse_args()

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(ROOT / "src"), ENVSPEC_LOCK=args.lock, ENVSPEC_VERIFY="warn")
    cases: dict[str, tuple[list[str], dict[str, str]]] = {
        "floor: python -c pass": ([sys.executable, "-c", "pass"], env),
        "hook: python -m envspec.verify --startup": (
            [sys.executable, "-m", "envspec.verify", "--startup"],
            env,
        ),
    }
    if args.image:
        podman = [
            "podman",
            *shlex.split(args.podman_args),
            "run",
            "--rm",
            *shlex.split(args.run_args),
        ]
        for mode in ("warn", "off"):
            cases[f"podman run IMAGE true, ENVSPEC_VERIFY={mode}"] = (
                [*podman, "-e", f"ENVSPEC_VERIFY={mode}", args.image, "true"],
                env,
            )
    for argv, e in cases.values():  # warm the page cache and write the .pyc files once
        timed(argv, e)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, (argv, e) in cases.items():
            samples[name].append(timed(argv, e))
    out = {name: summary(s) for name, s in samples.items()}
    if args.image:
        on, off = (
            out[f"podman run IMAGE true, ENVSPEC_VERIFY={m}"]["wall_median_s"]
            for m in ("warn", "off")
        )
        out["ratio hook/off (wall medians; goal <= 1.3)"] = {"ratio": round(on / off, 3)}
    print(
        json.dumps(
            {
                "lock": args.lock,
                "python": sys.version.split()[0],
                "load_avg": os.getloadavg(),
                "results": out,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

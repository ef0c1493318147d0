#!/usr/bin/env python3
"""Measure `envspec explain` and a warm `envspec lock` of a spec, beside uv alone on the same requirements.

    python bench/lock.py [specs/h100.toml] [--runs 5] [--bytecode] [--cold N]

``--cold N``: also N cold locks, each with an empty envspec cache (``ENVSPEC_CACHE``: uv's cache
and the Debian indexes inside it) and no lock file, as on a fresh machine (the wheels' metadata
and the Debian indexes all read from the network). bench/specs/ has the stacks of issue 35 (the
vllm stack, a transformers stack).

Each figure is the median wall time of N runs of the command as a user runs it (a new process
each time, so imports count), with the median CPU time (user + system) of those processes. Where the environment sets PYTHONDONTWRITEBYTECODE (this project's
development VM does) and the source tree has no __pycache__, every run compiles envspec's modules
again, which an installed envspec (pip writes the .pyc files) never does; ``--bytecode`` measures
as installed: the children may write their bytecode, into a private PYTHONPYCACHEPREFIX, that one
untimed explain run fills (and the lock's first run, reported apart, fills for the rest); that run
(or, without ``--bytecode``, the set-up's own load) also fills envspec's cache of the checked
compatibility DB (docs/compat-db.md, "Loading"), as any earlier command would have. The
first output line says which, and the load average. "uv alone" runs `uv pip compile` with the same
requirements, platform, Python and indexes that envspec passes it, so the difference is envspec's
own cost.
Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
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


class Runs(list):
    """The wall times of the runs, and in ``cpu`` the CPU time (user + system) of each."""

    cpu: list[float]


def timed(argv: list[str], runs: int, env: dict) -> Runs:
    out, cpu = Runs(), []
    for _ in range(runs):
        before = os.times()
        t = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        out.append(time.perf_counter() - t)
        after = os.times()
        # the child's user + system time (with its own children: uv for a lock)
        cpu.append(
            after.children_user
            - before.children_user
            + after.children_system
            - before.children_system
        )
        if proc.returncode != 0:
            sys.exit(f"failed: {' '.join(argv)}\n{proc.stderr}")
    out.cpu = cpu
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec", nargs="?", default=str(ROOT / "specs" / "h100.toml"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--cold",
        type=int,
        default=0,
        metavar="N",
        help="also N cold locks, each with an empty cache",
    )
    ap.add_argument(
        "--bytecode",
        action="store_true",
        help="let the measured processes use a bytecode cache (a private PYTHONPYCACHEPREFIX), "
        "filled by one untimed run",
    )
    a = ap.parse_args()

    from envspec.compat import load_db
    from envspec.host import cache_dir_for
    from envspec.resolve import choose
    from envspec.resolve.uv import _index_args, _uv, requirements
    from envspec.sources import discover
    from envspec.spec import load_spec

    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    py = sys.executable
    spec = load_spec(a.spec)
    choice = choose(spec, load_db())
    tmp = Path(tempfile.mkdtemp(prefix="envspec-bench-"))
    if a.bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
        subprocess.run([py, "-m", "envspec", "explain", a.spec], capture_output=True, env=env)
    bytecode = (
        "cached (--bytecode)"
        if a.bytecode
        else (
            "compiled each run (PYTHONDONTWRITEBYTECODE)"
            if env.get("PYTHONDONTWRITEBYTECODE")
            else "as the tree has it"
        )
    )
    lockpath = tmp / "bench.lock"
    rows = []
    explain = timed([py, "-m", "envspec", "explain", a.spec], a.runs, env)
    rows.append(("envspec explain", explain, "goal < 0.3 s"))
    if a.cold:
        colds = Runs()
        colds.cpu = []
        for i in range(a.cold):
            one = timed(
                [py, "-m", "envspec", "lock", a.spec, "-o", str(tmp / f"cold{i}.lock"), "-q"],
                1,
                dict(env, ENVSPEC_CACHE=str(tmp / f"cache-cold{i}")),
            )
            colds += one
            colds.cpu += one.cpu
            shutil.rmtree(tmp / f"cache-cold{i}", ignore_errors=True)
        rows.append(
            ("envspec lock (cold: empty cache, no lock)", colds, "goal <= 15 s (vllm stack)")
        )
    cold = timed(
        [py, "-m", "envspec", "lock", a.spec, "-o", str(lockpath), "-q"], 1, env
    )  # fills caches
    warm = timed([py, "-m", "envspec", "lock", a.spec, "-o", str(lockpath), "-q"], a.runs, env)
    rows.append(("envspec lock (first run here)", cold, ""))
    rows.append(("envspec lock (warm)", warm, "goal < 2 s (h100); <= 3 s (vllm stack)"))

    _, reqs, _ = requirements(choice)
    (tmp / "r.in").write_text("\n".join(reqs) + "\n")
    idx, _ = _index_args(discover(spec.sources), choice)
    uv_env = dict(env, UV_CACHE_DIR=str(cache_dir_for(os.environ) / "uv"), UV_NO_CONFIG="1")
    uv = timed(
        [
            _uv(),
            "pip",
            "compile",
            str(tmp / "r.in"),
            "--format",
            "pylock.toml",
            "-o",
            str(tmp / "pylock.toml"),
            "--quiet",
            "--python-version",
            choice.python,
            "--python-platform",
            f"x86_64-manylinux_{choice.glibc}",
            "--only-binary",
            ":all:",
            "--index-strategy",
            "unsafe-best-match",
            *idx,
        ],
        a.runs,
        uv_env,
    )
    rows.append(("uv pip compile alone (same requirements, warm)", uv, "the resolver's own floor"))
    from envspec import lock as lockmod

    wheels = len(lockmod.load(lockpath).wheels)
    shutil.rmtree(tmp)

    print(
        f"spec: {a.spec} ({wheels} wheels); runs: {a.runs}; python: {sys.version.split()[0]}; cores: {os.cpu_count()}; "
        f"bytecode: {bytecode}; load average: {os.getloadavg()[0]:.1f}"
    )
    print()
    print("| what | median s | min s | max s | CPU median s | note |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, xs, note in rows:
        print(
            f"| {name} | {statistics.median(xs):.3f} | {min(xs):.3f} | {max(xs):.3f} | "
            f"{statistics.median(xs.cpu):.3f} | {note} |"
        )


if __name__ == "__main__":
    main()

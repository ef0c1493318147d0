#!/usr/bin/env python3
"""`envspec explain` of two source trees, alternately in the same minutes: wall and CPU time.

    python bench/explain_ab.py OTHER_TREE [--spec specs/h100.toml] [--runs 9] [--json] [--instructions]

OTHER_TREE is a checkout (or `git archive` copy) of envspec, e.g. main before a change; this
tree is the one the script lives in. Each run is a new process, `python -m envspec explain SPEC`
with PYTHONPATH set to the tree's src/, so imports count. On a shared machine wall times move
with the load; the CPU time of the child (user + system, from ``os.times()``) and the ratio of the
two trees measured alternately are the steadier figures. Bytecode is cached as an installed
envspec has it (a private PYTHONPYCACHEPREFIX per tree, filled by one untimed run each) unless
``--no-bytecode``. That untimed run also fills envspec's cache of the checked compatibility DB
(``<cache>/compat-db/``, docs/compat-db.md, "Loading") where the tree has one, as any earlier
envspec command on the machine would have: the timed runs are a user's second and later explain.
``--instructions`` adds the instructions one run of each tree executes, counted by valgrind's
callgrind (PYTHONHASHSEED=0; about 40 s a run), which the machine's load does not change.
Prints a Markdown table for docs/benchmarks.md and the load average.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from _common import instructions, timed_child  # noqa: E402  bench/_common.py (its directory is on sys.path)


def one(tree: Path, argv: list[str], env: dict) -> tuple[float, float]:
    return timed_child([sys.executable, "-m", "envspec", *argv], env, ROOT, label=str(tree))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "other", type=Path, help="the tree to compare with (its src/ is put on PYTHONPATH)"
    )
    ap.add_argument("--spec", default="specs/h100.toml")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--json", action="store_true", help="measure `explain --json`")
    ap.add_argument("--no-bytecode", action="store_true", help="compile every module each run")
    ap.add_argument(
        "--instructions", action="store_true", help="also count instructions with valgrind (slow)"
    )
    a = ap.parse_args()
    argv = ["explain", a.spec] + (["--json"] if a.json else [])
    trees = {"this tree": ROOT, f"{a.other}": a.other.resolve()}
    tmp = Path(tempfile.mkdtemp(prefix="envspec-ab-"))
    envs = {}
    for i, (name, tree) in enumerate(trees.items()):
        env = dict(os.environ, PYTHONPATH=str(tree / "src"))
        if a.no_bytecode:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        else:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(tmp / f"pyc{i}")
            one(tree, argv, env)  # fills the bytecode cache, untimed
        envs[name] = env
    load = [os.getloadavg()[0]]
    res: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    for _ in range(a.runs):
        for name, tree in trees.items():
            res[name].append(one(tree, argv, envs[name]))
    load.append(os.getloadavg()[0])
    counts = (
        {
            name: instructions([sys.executable, "-m", "envspec", *argv], envs[name], ROOT)
            for name in trees
        }
        if a.instructions
        else {}
    )
    shutil.rmtree(tmp)
    print(
        f"`envspec {' '.join(argv)}`, {a.runs} runs each, alternated; python {sys.version.split()[0]}; "
        f"cores: {os.cpu_count()}; bytecode: {'compiled each run' if a.no_bytecode else 'cached'}; "
        f"load average (1 min) {load[0]:.2f} at the start, {load[1]:.2f} at the end"
    )
    print()
    extra = " instructions (M) |" if counts else ""
    print("| tree | wall median s | wall min s | wall max s | CPU median s | CPU min s |" + extra)
    print("| --- | --- | --- | --- | --- | --- |" + (" --- |" if counts else ""))
    for name, xs in res.items():
        wall, cpu = [w for w, _ in xs], [c for _, c in xs]
        n = counts.get(name)
        print(
            f"| {name} | {statistics.median(wall):.3f} | {min(wall):.3f} | {max(wall):.3f} | "
            f"{statistics.median(cpu):.3f} | {min(cpu):.3f} |"
            + ((f" {n / 1e6:.0f} |" if n else " - |") if counts else "")
        )


if __name__ == "__main__":
    main()

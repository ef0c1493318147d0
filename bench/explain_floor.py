#!/usr/bin/env python3
"""`envspec explain` beside the floor its libraries set: how much of it is envspec's own.

    python bench/explain_floor.py [--spec specs/h100.toml] [--runs 9] [--instructions]

Three commands, each a new process, run alternately: ``python -c pass``; the *library floor*,
a process that imports every module outside envspec that ``envspec explain SPEC`` imports (the
list is taken from one run of explain in a child) and makes and validates one one-field pydantic
model (what any pydantic model costs first: the plugin loader, the schema machinery); and explain
itself (``python -m envspec explain SPEC`` of this tree). The floor runs with
``PYDANTIC_DISABLE_PLUGINS=__all__``, as explain does. Bytecode is cached (a private
PYTHONPYCACHEPREFIX, filled by one untimed run of each, which also fills the cache of the checked
compatibility DB). On a shared machine wall times move with the load; the CPU time of the child
(user + system) is steadier, and ``--instructions`` adds the instructions each command executes,
counted by valgrind's callgrind (one run each, PYTHONHASHSEED=0; about 40 s each), which the load
does not change. Prints a Markdown table for docs/benchmarks.md and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from _common import instructions, timed_child  # noqa: E402  bench/_common.py (its directory is on sys.path)

LIST_MODULES = """
import json, sys
from envspec.cli import main
main(sys.argv[2:])
json.dump(sorted(m for m in sys.modules if m != "__main__" and not m.startswith("envspec")), open(sys.argv[1], "w"))
"""

FLOOR = """
import importlib, json, sys
for name in json.load(open(sys.argv[1])):
    try:
        importlib.import_module(name)
    except ImportError:
        pass
from pydantic import BaseModel
class One(BaseModel):
    x: int
One(x=1)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default="specs/h100.toml")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument(
        "--instructions", action="store_true", help="also count instructions with valgrind (slow)"
    )
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="envspec-floor-"))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), PYTHONPYCACHEPREFIX=str(tmp / "pyc"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    mods = tmp / "modules.json"
    subprocess.run(
        [sys.executable, "-c", LIST_MODULES, str(mods), "explain", a.spec],
        cwd=ROOT,
        env=env,
        capture_output=True,
        check=False,
    )
    floor_env = dict(env, PYDANTIC_DISABLE_PLUGINS="__all__")
    cmds = {
        "`python -c pass`": ([sys.executable, "-c", "pass"], env),
        f"library floor ({len(json.loads(mods.read_text()))} modules + one pydantic model)": (
            [sys.executable, "-c", FLOOR, str(mods)],
            floor_env,
        ),
        f"`envspec explain {a.spec}`": ([sys.executable, "-m", "envspec", "explain", a.spec], env),
    }
    for argv, e in cmds.values():
        timed_child(argv, e, ROOT)  # fills the bytecode cache (and the DB cache), untimed
    load = [os.getloadavg()[0]]
    res: dict[str, list[tuple[float, float]]] = {name: [] for name in cmds}
    for _ in range(a.runs):
        for name, (argv, e) in cmds.items():
            res[name].append(timed_child(argv, e, ROOT))
    load.append(os.getloadavg()[0])
    counts = (
        {name: instructions(argv, e, ROOT) for name, (argv, e) in cmds.items()}
        if a.instructions
        else {}
    )
    shutil.rmtree(tmp)
    print(
        f"{a.runs} runs each, alternated; python {sys.version.split()[0]}; cores: {os.cpu_count()}; bytecode cached; "
        f"load average (1 min) {load[0]:.2f} at the start, {load[1]:.2f} at the end"
    )
    print()
    print(
        "| command | wall median s | wall min s | CPU median s | CPU min s |"
        + (" instructions (M) |" if counts else "")
    )
    print("| --- | --- | --- | --- | --- |" + (" --- |" if counts else ""))
    for name, xs in res.items():
        wall, cpu = [w for w, _ in xs], [c for _, c in xs]
        n = counts.get(name)
        print(
            f"| {name} | {statistics.median(wall):.3f} | {min(wall):.3f} | {statistics.median(cpu):.3f} | "
            f"{min(cpu):.3f} |" + ((f" {n / 1e6:.0f} |" if n else " - |") if counts else "")
        )


if __name__ == "__main__":
    main()

"""Benchmark: `envspec verify --level quick` inside an image against a bare `import torch` in the
same image, as a user runs them (`podman run --rm IMAGE ...`, the start-up hook off so that only
the command is timed). Issue 15's goal: quick verify within 15 s and within 3x of the import.

    .venv/bin/python bench/verify_quick.py --image localhost/envspec/h100-train:TAG [--runs 5]
        [--baseline] [--json OUT]

Each round runs, one after another: `python -c 'import torch'`, then `envspec verify --level
quick --json` with this checkout's verifier (src/envspec/verify bind-mounted over the image's
copy), then, with --baseline, the image's own verifier (what the image was built with): the
before/after comparison in the same minute. Every command runs under a small timer inside the
container that reports its wall time and its CPU time (user+sys of the command and its
children, from getrusage): on a shared machine the wall time moves with the load, the CPU time
much less. The podman invocation's own wall time is recorded too. Ratios are taken per round
(verify / import of the same round), then the median. The machine's load average is recorded
before and after.

podman's storage is the one envspec uses on this machine (ENVSPEC_STORAGE_ROOT, as `envspec run`
finds it); --podman-args/--run-args replace it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

VERIFY_SRC = ROOT / "src" / "envspec" / "verify"
IMAGE_VERIFY = "/opt/envspec/lib/envspec/verify"  # where images carry the verifier

# runs argv[1:], prints one JSON line: wall seconds, CPU seconds of the command's processes, exit code
TIMER = (
    "import json, resource, subprocess, sys, time\n"
    "t = time.perf_counter()\n"
    "p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)\n"
    "wall = time.perf_counter() - t\n"
    "ru = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "sys.stderr.write(p.stderr[-2000:])\n"
    "print('TIMER ' + json.dumps({'wall': wall, 'cpu': ru.ru_utime + ru.ru_stime, 'rc': p.returncode}))\n"
    "print(p.stdout)\n"
)


def podman_base(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    if args.podman_args is not None or args.run_args is not None:
        return shlex.split(args.podman_args or ""), shlex.split(args.run_args or "")
    from envspec.host import ASK_STORAGE, detect_host
    from envspec.run import podman_args

    return podman_args(detect_host(ask=ASK_STORAGE))


def one(glob: list[str], run: list[str], image: str, cmd: list[str], mount: bool) -> dict:
    argv = ["podman", *glob, "run", "--rm", *run, "-e", "ENVSPEC_VERIFY=off"]
    if mount:
        argv += ["-v", f"{VERIFY_SRC}:{IMAGE_VERIFY}:ro"]
    argv += [image, "python", "-c", TIMER, *cmd]
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    outer = time.perf_counter() - t0
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("TIMER ")), None)
    if line is None:
        raise RuntimeError(
            f"{' '.join(cmd)}: no timer line (podman exit {p.returncode}): {p.stderr[-1500:]}"
        )
    res = json.loads(line[6:])
    res["podman_wall"] = outer
    if cmd[:2] == ["envspec", "verify"]:
        rest = p.stdout[p.stdout.index(line) + len(line) :]
        report = json.loads(rest[rest.index("{") :])
        by = {f["check"]: f for f in report["findings"]}
        res["ok"] = report["ok"]
        res["timings"] = {
            k: report["timings"].get(k) for k in ("torch.import", "integrity.wait", "total")
        }
        files = by.get("integrity.files", {})
        res["integrity.files"] = {"observed": files.get("observed"), **files.get("data", {})}
        res["torch.compile"] = by.get("torch.compile", {}).get("observed")
    return res


def summary(rows: list[dict], key: str) -> dict:
    vals = [r[key] for r in rows]
    return {
        "median": round(statistics.median(vals), 2),
        "min": round(min(vals), 2),
        "max": round(max(vals), 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--baseline", action="store_true", help="also run the image's own verifier")
    ap.add_argument("--podman-args", help="podman's global options (default: envspec's storage)")
    ap.add_argument("--run-args", help="options for `podman run` (default: envspec's)")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()
    glob, run = podman_base(args)
    kinds = {
        "import": (["python", "-c", "import torch"], False),
        "verify_quick": (["envspec", "verify", "--level", "quick", "--json"], True),
    }
    if args.baseline:
        kinds["verify_quick_image"] = (["envspec", "verify", "--level", "quick", "--json"], False)
    load_before = os.getloadavg()
    one(glob, run, args.image, ["true"], False)  # page cache and storage warm for every kind alike
    rounds = []
    for i in range(args.runs):
        r = {k: one(glob, run, args.image, cmd, mount) for k, (cmd, mount) in kinds.items()}
        rounds.append(r)
        print(
            f"round {i + 1}: "
            + ", ".join(f"{k} {v['wall']:.1f} s wall / {v['cpu']:.1f} s CPU" for k, v in r.items()),
            file=sys.stderr,
        )
    out = {
        "image": args.image,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "host": platform.node(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": args.runs,
        "wall": {k: summary([r[k] for r in rounds], "wall") for k in kinds},
        "cpu": {k: summary([r[k] for r in rounds], "cpu") for k in kinds},
        "ratio_wall": {
            k: round(statistics.median(r[k]["wall"] / r["import"]["wall"] for r in rounds), 2)
            for k in kinds
            if k != "import"
        },
        "ratio_cpu": {
            k: round(statistics.median(r[k]["cpu"] / r["import"]["cpu"] for r in rounds), 2)
            for k in kinds
            if k != "import"
        },
        "rounds": rounds,
    }
    text = json.dumps(out, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""N torchrun-style "nodes" on loopback (gloo, CPU only): every rank verifies, rank 0 compares
the fingerprints and all-reduces across all of them. The last node is made to differ
(ENVSPEC_FAKE_FINGERPRINT, the verifier's test hook), so the report must name it. This is the
multi-node path of tests/e2e/test_verify_two_nodes.py at 4 and 8 ranks, for hosts with the cores
for it (docs/verify-h200.md, issue 6: no 4- or 8-GPU machine was lent).

    python bench/verify_cpu_nodes.py --nodes 4 8 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "data" / "verify"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(n: int, out: Path, lock: Path, timeout: float) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = []
    t0 = time.monotonic()
    for node in range(n):
        env = dict(
            os.environ,
            PYTHONPATH=str(ROOT / "src"),
            GLOO_SOCKET_IFNAME="lo",
            PYTHONUNBUFFERED="1",
            CUDA_VISIBLE_DEVICES="",
            OMP_NUM_THREADS="1",
        )
        env.pop("ENVSPEC_FAKE_FINGERPRINT", None)
        if node == n - 1:
            env["ENVSPEC_FAKE_FINGERPRINT"] = "driver=470.00.00"
        argv = [
            sys.executable,
            "-m",
            "envspec.verify",
            "--lock",
            str(lock),
            "--skip",
            "torch.compile,integrity.files",
            "--nnodes",
            str(n),
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            f"bench{n}",
            "--json-out",
            str(out / f"node{node}.json"),
        ]
        procs.append(
            subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
    wall = time.monotonic() - t0
    (out / "logs.txt").write_text(
        "\n\n".join(
            f"--- node {i} (exit {p.returncode})\n{log}"
            for i, (p, log) in enumerate(zip(procs, logs))
        )
    )
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("node*.json"))]
    res: dict = {
        "nodes": n,
        "wall_s": round(wall, 1),
        "exit_codes": [p.returncode for p in procs],
        "reports_written": len(reports),
    }
    if reports:
        by = {f["check"]: f for f in reports[0]["findings"]}
        for check in ("cluster.driver", "cluster.torch", "cluster.allreduce"):
            f = by.get(check, {})
            res[check] = {
                "status": f.get("status"),
                "observed": f.get("observed"),
                "data": f.get("data"),
            }
        res["nodes_in_report"] = len(reports[0].get("nodes", []))
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    from this_python import lock_text_for_this_python

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lock = out / "this-python.lock"
    lock.write_text(lock_text_for_this_python(sys.prefix))
    results = [run(n, out / f"nodes{n}", lock, args.timeout) for n in args.nodes]
    text = json.dumps(results, indent=1)
    (out / "summary.json").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Two torchrun "nodes" on loopback (gloo, CPU): every rank verifies, rank 0 compares the
fingerprints and names the node that differs (made to differ with the ENVSPEC_FAKE_FINGERPRINT
test hook), then all-reduces across both."""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

SRC = Path(__file__).resolve().parents[2] / "src"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data" / "verify"))
from this_python import lock_text_for_this_python  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_one_differs(tmp_path):
    lock = tmp_path / "this.lock"
    lock.write_text(lock_text_for_this_python(sys.prefix))
    port = free_port()
    procs = []
    for node, fake in ((0, ""), (1, "driver=470.00.00")):
        env = dict(os.environ, PYTHONPATH=str(SRC), GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
        env.pop("ENVSPEC_FAKE_FINGERPRINT", None)
        if fake:
            env["ENVSPEC_FAKE_FINGERPRINT"] = fake
        argv = [
            sys.executable,
            "-m",
            "envspec.verify",
            "--lock",
            str(lock),
            "--skip",
            "torch.compile,integrity.files",
            "--nnodes",
            "2",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "e2e",
            "--json-out",
            str(tmp_path / f"node{node}.json"),
        ]
        procs.append(
            subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outs = [p.communicate(timeout=240)[0] for p in procs]
    codes = [p.returncode for p in procs]
    reports = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("node*.json"))]
    assert len(reports) == 1, outs  # only rank 0 writes the cluster report
    rep = reports[0]
    by = {f["check"]: f for f in rep["findings"]}
    drv = by["cluster.driver"]
    assert drv["status"] == "fail", drv
    assert re.search(r"node \d \([^)]*rank \d\): 470\.00\.00", drv["observed"]), drv
    assert by["cluster.torch"]["status"] == "pass"
    assert by["cluster.test_hook"]["status"] == "warn"
    ar = by["cluster.allreduce"]
    assert ar["status"] == "pass" and "correct" in ar["observed"]
    assert ar["data"]["ranks"] == 2
    assert len(rep["nodes"]) == 2
    # the process that held rank 0 exits 1 (a cluster finding failed); the other passes locally
    assert sorted(codes) == [0, 1], outs
    assert all("Traceback" not in o for o in outs), outs

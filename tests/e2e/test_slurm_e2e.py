"""``envspec cluster render --slurm`` for real: a Slurm cluster of two nodes on loopback
(conftest.start_slurm: Debian's munged, slurmctld and two slurmd), the rendered job file
submitted as it is with ``sbatch --wait``, two tasks (one per node) running the cluster
verification on CPU (gloo over loopback) in host mode (``--container none``: each node's
envspec against a lock of this Python).

- every node the same: the job exits 0, rank 0's report lists both ranks and passes the
  fingerprint comparison and the all-reduce;
- the second task made to report another driver (the ENVSPEC_FAKE_FINGERPRINT test hook,
  limited to SLURM_PROCID 1): the job fails, its output names the failed step, and the report
  names the node with driver 470.00.00.

The pyxis form (``srun --container-image=...@sha256:...``), which needs NVIDIA's pyxis plugin
(not packaged in Debian), is checked against its golden file in tests/unit/test_cluster.py.
Skips only where slurm-wlm or munge is not installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e]
torch = pytest.importorskip("torch")
for _tool, _pkg in (
    ("slurmctld", "slurm-wlm"),
    ("slurmd", "slurm-wlm"),
    ("sbatch", "slurm-client"),
    ("munged", "munge"),
):
    if shutil.which(_tool) is None:
        pytest.skip(
            f"{_tool} is not installed (apt-get install -y slurm-wlm munge)",
            allow_module_level=True,
        )
if os.geteuid() != 0:
    pytest.skip(
        "a test cluster's slurmd runs jobs as any user: it needs root", allow_module_level=True
    )

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "data" / "verify"))
from this_python import lock_text_for_this_python  # noqa: E402

IMAGE = (
    "registry.example/envspec/this-python@sha256:" + "5" * 64
)  # host mode: named in the job, not pulled


@pytest.fixture(scope="module")
def slurm():
    from conftest import start_slurm

    with start_slurm(nodes=2) as cluster:
        yield cluster


def render_and_submit(
    slurm, work: Path, **env_extra: str
) -> tuple[subprocess.CompletedProcess, str, dict | None]:
    """Render the job with the CLI, submit it with ``sbatch --wait``; (sbatch, the job's output, rank 0's report)."""
    from conftest import _free_ports

    work.mkdir()
    lock = work / "this.lock"
    lock.write_text(lock_text_for_this_python(sys.prefix))
    job = work / "verify.sbatch"
    report = work / "report.json"
    env = {
        **slurm.env,
        "PYTHONPATH": str(ROOT / "src"),
        "PYTHONUNBUFFERED": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        **env_extra,
    }
    for k in ("ENVSPEC_FAKE_FINGERPRINT", "ENVSPEC_FAKE_FINGERPRINT_TASK"):
        if k not in env_extra:
            env.pop(k, None)
    cp = subprocess.run(
        [
            sys.executable,
            "-m",
            "envspec",
            "cluster",
            "render",
            "--slurm",
            "--container",
            "none",
            "--image",
            IMAGE,
            "--lock",
            str(lock),
            "--nnodes",
            "2",
            "--gpus-per-node",
            "0",
            "--level",
            "quick",
            "--rdzv-port",
            str(_free_ports(1)[0]),
            "--time",
            "00:05:00",
            "-o",
            str(job),
            "--",
            "--skip",
            "torch.compile,integrity.files",
            "--json-out",
            str(report),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert cp.returncode == 0, cp.stderr
    sub = subprocess.run(
        ["sbatch", "--wait", "--parsable", str(job)],
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
        timeout=300,
    )
    outs = sorted(work.glob("envspec-verify-*.out"))
    output = outs[0].read_text(errors="replace") if outs else f"(no job output)\n{slurm.logs()}"
    return sub, output, json.loads(report.read_text()) if report.exists() else None


def test_two_tasks_agree_and_the_job_passes(slurm, tmp_path):
    sub, output, rep = render_and_submit(slurm, tmp_path / "same")
    assert sub.returncode == 0, f"{sub.stdout}{sub.stderr}\n{output}"
    assert "envspec cluster verify: 2 node(s) agree" in output
    assert rep is not None, output
    by = {f["check"]: f for f in rep["findings"]}
    assert len(rep["nodes"]) == 2 and sorted(n["rank"] for n in rep["nodes"]) == [0, 1]
    for key in ("driver", "torch", "lock"):
        assert (
            by[f"cluster.{key}"]["status"] == "pass"
            and "on all 2 ranks" in by[f"cluster.{key}"]["observed"]
        )
    assert by["cluster.nodes"]["status"] == "pass"
    assert (
        by["cluster.allreduce"]["status"] == "pass"
        and by["cluster.allreduce"]["data"]["ranks"] == 2
    )
    assert "cluster.test_hook" not in by


def test_one_task_with_another_driver_fails_the_job_naming_it(slurm, tmp_path):
    sub, output, rep = render_and_submit(
        slurm,
        tmp_path / "odd",
        ENVSPEC_FAKE_FINGERPRINT="driver=470.00.00",
        ENVSPEC_FAKE_FINGERPRINT_TASK="1",
    )
    assert sub.returncode != 0, output
    assert (
        "the step 'srun envspec verify' (host mode) of job" in output
        and "failed (exit status" in output
    )
    assert rep is not None, output
    by = {f["check"]: f for f in rep["findings"]}
    drv = by["cluster.driver"]
    assert drv["status"] == "fail" and re.search(
        r"node \d \([^)]*rank \d\): 470\.00\.00", drv["observed"]
    ), drv
    assert by["cluster.torch"]["status"] == "pass"
    assert (
        by["cluster.test_hook"]["status"] == "warn"
        and "rank" in by["cluster.test_hook"]["observed"]
    )
    assert len(rep["nodes"]) == 2

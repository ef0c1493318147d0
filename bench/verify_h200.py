"""Run the verifier's H200 measurements in one go (for the device machine; see docs/verify-h200.md).

    python3 bench/verify_h200.py --out "$OUT" [--lock L] [--wrong-lock W]

Runs, in order: quick and full on GPU 0 alone (CUDA_VISIBLE_DEVICES=0), quick and full on both
GPUs, the wrong lock (must fail), quick again with warm caches, the start-up hook (as is, with a
torch that raises on import, and strict against the wrong lock: must fail), and a bare
`import torch` for the baseline. On one GPU (`--gpus 1`, or what nvidia-smi lists) the 2-GPU and
two-node runs are left out and the wrong lock runs on the one GPU. Writes results.json (every report, exit code, wall time) and
report.txt (every table) under --out, plus env.json (what the machine is).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAFE_ENV = {  # NVLink multicast stays off on shared hosts (KINDS.md); unbuffered output
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "PYTHONUNBUFFERED": "1",
}


def sh(cmd: list[str], timeout: float = 60) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return (p.stdout + p.stderr).strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"{type(e).__name__}: {e}"


def machine() -> dict:
    torch_info = sh(
        [
            sys.executable,
            "-c",
            (
                "import json, torch, torch.backends.cudnn as c; print(json.dumps({'torch': torch.__version__, "
                "'cuda': torch.version.cuda, 'cudnn': c.version(), 'nccl': list(torch.cuda.nccl.version()), "
                "'arch_list': torch.cuda.get_arch_list(), 'devices': [torch.cuda.get_device_name(i) for i in "
                "range(torch.cuda.device_count())]}))"
            ),
        ],
        120,
    )
    pip = sh([sys.executable, "-m", "pip", "list", "--format", "json"], 120)
    try:
        pkgs = {p["name"].lower(): p["version"] for p in json.loads(pip)}
    except ValueError:
        pkgs = {"error": pip[-500:]}
    return {
        "python": sys.executable,
        "nvidia_smi": sh(["nvidia-smi"]),
        "topo": sh(["nvidia-smi", "topo", "-m"]),
        "torch": torch_info,
        "packages": pkgs,
        "dev": sh(["ls", "-l", "/dev/"]).count("nvidia"),
        "shm": sh(["df", "-h", "/dev/shm"]),
        "proc_driver": sh(["cat", "/proc/driver/nvidia/version"]),
        "gcc": sh(["gcc", "--version"]).splitlines()[0] if sh(["gcc", "--version"]) else "",
    }


# the quick level's health step alone, five times in one process: NVML opened, every GPU read, the
# kernel log read (what check_health does), each round timed
HEALTH_TIMING = r"""
import json, time
from envspec.verify import health
rounds = []
for _ in range(5):
    t0 = time.perf_counter()
    nvml = health.Nvml.open()
    t1 = time.perf_counter()
    gpus = health.read_all(nvml) if nvml else []
    t2 = time.perf_counter()
    if nvml:
        nvml.close()
    log = health.read_kmsg()
    t3 = time.perf_counter()
    rounds.append({"open_s": t1 - t0, "read_s": t2 - t1, "kmsg_s": t3 - t2, "total_s": t3 - t0,
                   "gpus": len(gpus), "kmsg_readable": log is not None,
                   "xids": health.parse_xids(log or "")})
print(json.dumps({"rounds": rounds}, indent=1))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--lock", default="")
    ap.add_argument(
        "--wrong-lock", default="tests/data/verify/h200-wrong-a100.lock"
    )  # run from the repo root
    ap.add_argument("--timeout", type=float, default=150)
    ap.add_argument(
        "--gpus",
        type=int,
        default=0,
        help="GPUs to use (default: all that nvidia-smi -L lists); "
        "with 1 the 2-GPU and two-node runs are left out",
    )
    a = ap.parse_args()
    os.chdir(ROOT)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    lock = a.lock or next(
        p
        for p in ("lockfiles/h200-host.lock", "tests/data/verify/h200-host.lock")
        if (ROOT / p).exists()
    )
    (out / "env.json").write_text(json.dumps(machine(), indent=1))
    work = Path(tempfile.mkdtemp(prefix="verify-h200-"))  # at most 8 files may come back from $OUT
    base_env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **SAFE_ENV)
    verify = [sys.executable, "-m", "envspec.verify"]
    gpus = a.gpus or sh(["nvidia-smi", "-L"]).count("GPU ")
    # a torch that cannot be imported: the start-up hook must judge the driver and GPU without it
    no_torch = work / "no-torch"
    (no_torch / "torch").mkdir(parents=True)
    (no_torch / "torch" / "__init__.py").write_text(
        "raise ImportError('the start-up hook imported torch')\n"
    )
    hook_env = {"ENVSPEC_LOCK": lock, "ENVSPEC_VERIFY": "warn"}
    # the node health's NVML answers (tests/data/verify/nvml-*.json) and what reading them costs
    rec = subprocess.run(
        verify[:2] + ["envspec.verify.health", "--record"],
        env=base_env,
        capture_output=True,
        text=True,
        timeout=a.timeout,
    )
    (out / "nvml.json").write_text(
        rec.stdout or json.dumps({"rc": rec.returncode, "stderr": rec.stderr[-2000:]})
    )
    timing = subprocess.run(
        [sys.executable, "-c", HEALTH_TIMING],
        env=base_env,
        capture_output=True,
        text=True,
        timeout=a.timeout,
    )
    (out / "health-timing.json").write_text(
        timing.stdout or json.dumps({"stderr": timing.stderr[-2000:]})
    )
    runs = [
        (
            "quick-1gpu",
            {"CUDA_VISIBLE_DEVICES": "0"},
            verify + ["--lock", lock, "--level", "quick"],
        ),
        (
            "full-1gpu",
            {"CUDA_VISIBLE_DEVICES": "0"},
            verify + ["--lock", lock, "--level", "full", "--prometheus", str(work / "verify.prom")],
        ),
        ("quick-2gpu", {}, verify + ["--lock", lock, "--level", "quick"]),
        (
            "full-2gpu",
            {},
            verify + ["--lock", lock, "--level", "full", "--prometheus", str(work / "verify.prom")],
        ),
        (
            "allreduce-processes-2gpu",
            {},
            verify
            + [
                "--lock",
                lock,
                "--level",
                "full",
                "--allreduce",
                "processes",
                "--skip",
                "integrity,torch.compile,numerics,perf,libs",
            ],
        ),
        ("wrong-lock-2gpu", {}, verify + ["--lock", a.wrong_lock, "--level", "quick"]),
        ("quick-2gpu-warm", {}, verify + ["--lock", lock, "--level", "quick"]),
        ("startup-hook", hook_env, verify + ["--startup"]),
        (
            "startup-hook-no-torch",
            {**hook_env, "PYTHONPATH": f"{no_torch}:{ROOT / 'src'}"},
            verify + ["--startup"],
        ),
        (
            "startup-hook-wrong-lock",
            {"ENVSPEC_LOCK": a.wrong_lock, "ENVSPEC_VERIFY": "strict"},
            verify + ["--startup"],
        ),
        (
            "import-torch",
            {},
            [sys.executable, "-c", "import torch, torch.cuda; torch.cuda.is_available()"],
        ),
    ]
    if gpus < 2:
        runs = [r for r in runs if "2gpu" not in r[0]]
        runs.insert(
            2, ("wrong-lock-1gpu", {}, verify + ["--lock", a.wrong_lock, "--level", "quick"])
        )
    results, text = {}, []
    for name, env_over, cmd in runs:
        jpath = work / f"{name}.json"
        full_cmd = cmd + (
            ["--json-out", str(jpath)] if "--startup" not in cmd and "-c" not in cmd else []
        )
        t0 = time.perf_counter()
        try:
            p = subprocess.run(
                full_cmd,
                env=dict(base_env, **env_over),
                capture_output=True,
                text=True,
                timeout=a.timeout,
            )
            rc, so, se = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, so, se = (
                124,
                (e.stdout or b"").decode(errors="replace")
                if isinstance(e.stdout, bytes)
                else (e.stdout or ""),
                "TIMEOUT",
            )
        wall = time.perf_counter() - t0
        rep = json.loads(jpath.read_text()) if jpath.exists() else None
        shown = " ".join(f"{k}={v}" for k, v in env_over.items())
        shown_cmd = ["python3", *cmd[1:]]
        cmd_text = (shown + " " if shown else "") + " ".join(shown_cmd).replace(str(work) + "/", "")
        results[name] = {
            "cmd": cmd_text,
            "rc": rc,
            "wall_s": round(wall, 2),
            "report": rep,
            "stderr_tail": se[-3000:],
        }
        text.append(
            f"===== {name}: rc={rc} wall={wall:.1f}s\n$ {cmd_text}\n{so}\n{se[-1500:] if rc not in (0, 1) or name.startswith('startup-hook') else ''}"
        )
        print(f"{name}: rc={rc} wall={wall:.1f}s", flush=True)
        (out / "results.json").write_text(json.dumps(results, indent=1))
        (out / "report.txt").write_text("\n".join(text))
    if gpus < 2:
        prom = work / "verify.prom"
        if prom.exists():
            (out / "verify.prom").write_text(prom.read_text())
        return 0
    # two "nodes" on this host, one GPU each, c10d on loopback: the cross-node path with NCCL
    t0 = time.perf_counter()
    procs = []
    for node in (0, 1):
        cmd = verify + [
            "--lock",
            lock,
            "--level",
            "full",
            "--skip",
            "integrity.files,torch.compile,perf,numerics",
            "--nnodes",
            "2",
            "--rdzv-endpoint",
            "127.0.0.1:29555",
            "--rdzv-id",
            "h200",
            "--json-out",
            str(work / f"cluster-node{node}.json"),
        ]
        procs.append(
            subprocess.Popen(
                cmd,
                env=dict(base_env, CUDA_VISIBLE_DEVICES=str(node)),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = []
    for proc in procs:
        try:
            outs.append(proc.communicate(timeout=a.timeout)[0])
        except subprocess.TimeoutExpired:
            proc.kill()
            outs.append("TIMEOUT")
    wall = time.perf_counter() - t0
    reps = [json.loads(f.read_text()) for f in sorted(work.glob("cluster-node*.json"))]
    results["cluster-2nodes-loopback"] = {
        "cmd": "CUDA_VISIBLE_DEVICES=<0|1> python3 -m envspec.verify --lock "
        + lock
        + " --level full --skip "
        "integrity.files,torch.compile,perf,numerics --nnodes 2 --rdzv-endpoint 127.0.0.1:29555 --rdzv-id h200",
        "rc": [p.returncode for p in procs],
        "wall_s": round(wall, 2),
        "report": reps[0] if reps else None,
        "stderr_tail": "\n----\n".join(o[-2500:] for o in outs),
    }
    text.append("===== cluster-2nodes-loopback\n" + "\n----\n".join(outs))
    print(
        f"cluster-2nodes-loopback: rc={[p.returncode for p in procs]} wall={wall:.1f}s", flush=True
    )
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "report.txt").write_text("\n".join(text))
    prom = work / "verify.prom"
    if prom.exists():
        (out / "verify.prom").write_text(prom.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

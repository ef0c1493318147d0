"""Verification across nodes: launch under torchrun, gather fingerprints, compare, all-reduce.

Every rank runs the local checks; then rank 0 gathers each rank's fingerprint and verdict over
torch.distributed (gloo: works on any node, GPU or not), names the nodes whose fingerprint
differs from the majority, and measures an all-reduce across all ranks (NCCL on GPUs, gloo on
CPUs). One process per node by default: that process verifies all of its node's GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

from . import settings
from .model import FAIL, PASS, SKIP, WARN, Finding, NodeEntry, Report
from .torchprobe import AllreduceSize, Device, Torch, allreduce_size

COMPARED = ("image", "lock", "driver", "gpu", "nccl_lib", "torch", "cuda", "gemm_result")
# Test hook, never for production: JSON or "key=value,key=value" that overrides fields of this
# rank's fingerprint so a CPU test can make one "node" differ. A finding says it was used.
FAKE_ENV = settings.FAKE_FINGERPRINT
# With it, only the Slurm task whose SLURM_PROCID equals this value fakes (a job's tasks share one
# environment, so a Slurm test cannot give one task its own ENVSPEC_FAKE_FINGERPRINT).
FAKE_TASK_ENV = settings.FAKE_FINGERPRINT_TASK
RESULT_DIR_ENV = settings.RESULT_DIR  # set by launch(): where ranks leave their exit codes

# Options consumed by the launcher (not forwarded to the ranks); value-taking ones.
LAUNCH_OPTS = (
    "--nproc-per-node",
    "--rdzv-endpoint",
    "--rdzv-id",
    "--rdzv-backend",
    "--node-rank",
    "--master-addr",
    "--master-port",
)


def under_torchrun(env: Mapping[str, str] = os.environ) -> bool:
    return "RANK" in env and "WORLD_SIZE" in env


def forwarded_argv(argv: list[str]) -> list[str]:
    out, skip_next = [], False
    for a in argv:
        if skip_next:
            skip_next = False
            continue
        name = a.split("=", 1)[0]
        if name in LAUNCH_OPTS:
            skip_next = "=" not in a
            continue
        out.append(a)
    return out


def torchrun_argv(args: argparse.Namespace, argv: list[str]) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(args.nnodes),
        "--nproc-per-node",
        str(args.nproc_per_node),
        "--max-restarts",
        "0",
    ]
    if args.master_addr:  # static rendezvous: every node names the same master and its own rank
        cmd += [
            "--master-addr",
            args.master_addr,
            "--master-port",
            str(args.master_port),
            "--node-rank",
            str(args.node_rank or 0),
        ]
    else:
        if not args.rdzv_endpoint:
            raise ValueError(
                "--nnodes needs --rdzv-endpoint HOST:PORT (c10d rendezvous) or --master-addr"
            )
        cmd += [
            "--rdzv-backend",
            args.rdzv_backend,
            "--rdzv-endpoint",
            args.rdzv_endpoint,
            "--rdzv-id",
            args.rdzv_id,
        ]
        if args.node_rank is not None:
            cmd += ["--node-rank", str(args.node_rank)]
    return cmd + ["-m", "envspec.verify", *forwarded_argv(argv)]


def launch(args: argparse.Namespace, argv: list[str]) -> int:
    import subprocess  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    env = dict(os.environ)
    results = tempfile.mkdtemp(prefix="envspec-verify-")
    env[RESULT_DIR_ENV] = results
    pkg_root = str(Path(__file__).resolve().parents[2])  # the directory holding envspec/
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    rc = subprocess.call(torchrun_argv(args, argv), env=env)
    codes = []
    for f in sorted(Path(results).glob("rank-*.rc")):
        codes.append(int(f.read_text().strip() or "1"))
        f.unlink()
    os.rmdir(results) if not any(Path(results).iterdir()) else None
    # ranks exit 0 to torchrun (which prints a traceback for any other code) and leave their
    # verdict here; no verdict at all means a rank crashed: torchrun's own code stands
    return max(codes) if codes and rc == 0 else (rc or 1)


def finish_rank(code: int, env: Mapping[str, str] = os.environ) -> int:
    """Under our own launcher, record the verdict and exit 0; under a user's torchrun, exit code."""
    d = settings.get(RESULT_DIR_ENV, env)
    if not d:
        return code
    Path(d, f"rank-{env.get('RANK', '0')}.rc").write_text(str(code))
    return 0


def apply_fake(fp: dict[str, str], env: Mapping[str, str]) -> bool:
    raw = settings.get(FAKE_ENV, env) or ""
    if not raw:
        return False
    task = settings.get(FAKE_TASK_ENV, env) or ""
    if task and env.get("SLURM_PROCID", "") != task:
        return False
    if raw.lstrip().startswith("{"):
        fp.update({k: str(v) for k, v in json.loads(raw).items()})
    else:
        for pair in raw.split(","):
            k, _, v = pair.partition("=")
            if k.strip():
                fp[k.strip()] = v.strip()
    return True


def node_label(entry: NodeEntry) -> str:
    return f"node {entry['node_rank']} ({entry['fingerprint'].get('hostname', '?')}, rank {entry['rank']})"


def compare(entries: list[NodeEntry]) -> list[Finding]:
    """Findings naming the nodes whose fingerprint differs from the majority, key by key."""
    out: list[Finding] = []
    for key in COMPARED:
        values = Counter(e["fingerprint"].get(key, "") for e in entries)
        if len(values) <= 1:
            v = next(iter(values), "")
            out.append(
                Finding(
                    f"cluster.{key}",
                    PASS,
                    expected="the same on every node",
                    observed=f"{v or '(none)'} on all {len(entries)} ranks",
                )
            )
            continue
        (majority, count), (_, second) = values.most_common(2)
        if count == second:  # no majority: name every node with its value
            named = "; ".join(
                f"{node_label(e)}: {e['fingerprint'].get(key, '') or '(none)'}" for e in entries
            )
            out.append(
                Finding(
                    f"cluster.{key}",
                    FAIL,
                    expected="one value on every node",
                    observed=f"no majority among {len(entries)} ranks: {named}",
                    hint=f"the nodes do not run the same {key}; find the odd ones and drain or fix them",
                    data={"odd_nodes": [node_label(e) for e in entries]},
                )
            )
            continue
        odd = [e for e in entries if e["fingerprint"].get(key, "") != majority]
        named = "; ".join(
            f"{node_label(e)}: {e['fingerprint'].get(key, '') or '(none)'}" for e in odd
        )
        out.append(
            Finding(
                f"cluster.{key}",
                FAIL,
                expected=f"{majority or '(none)'} (as on {count} of {len(entries)} ranks)",
                observed=f"differs on {named}",
                hint=f"these nodes do not run what the others run ({key}); drain them or fix them before a job spans them",
                data={"odd_nodes": [node_label(e) for e in odd]},
            )
        )
    return out


def _rank0_findings(entries: list[NodeEntry], world: int) -> list[Finding]:
    """Rank 0's view of every rank's entry: the fingerprints compared, each test hook set, and
    whether every rank passed its local checks."""
    findings = compare(entries)
    for e in entries:
        if e.get("test_hook"):
            findings.append(
                Finding(
                    "cluster.test_hook",
                    WARN,
                    expected=f"{FAKE_ENV} unset on every node",
                    observed=f"{node_label(e)} faked its fingerprint with {FAKE_ENV}",
                    hint="a test hook; never set it in production",
                )
            )
    bad = [e for e in entries if not e["ok"]]
    findings.append(
        Finding(
            "cluster.nodes",
            FAIL if bad else PASS,
            expected=f"every one of {world} ranks passes its local checks",
            observed=(
                "; ".join(f"{node_label(e)} failed {', '.join(e['failed'][:5])}" for e in bad)
                if bad
                else f"{world} ranks ok"
            ),
            hint="read that node's own report (run verify there)" if bad else "",
        )
    )
    return findings


def cluster_phase(
    report: Report, torch: Torch, env: Mapping[str, str] = os.environ, level: str = "quick"
) -> Report:
    """Run on every rank after the local checks; returns the report to print (rank 0's has the
    cluster findings; the others' are unchanged)."""
    import torch.distributed as dist  # noqa: PLC0415

    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    local_rank = int(env.get("LOCAL_RANK", "0"))
    node_rank = int(env.get("GROUP_RANK", env.get("NODE_RANK", "0")))
    fp = dict(report.fingerprint)
    faked = apply_fake(fp, env)
    if faked:  # rank 0 reports it as cluster.test_hook
        report.fingerprint = fp
    t0 = time.perf_counter()
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    entry: NodeEntry = {
        "rank": rank,
        "node_rank": node_rank,
        "local_rank": local_rank,
        "fingerprint": fp,
        "test_hook": faked,
        "ok": report.ok,
        "failed": [f.check for f in report.findings if f.status == FAIL],
    }
    entries = [node_entry(e) for e in gather_json(dist, torch, entry, world)]
    report.timings["cluster.gather"] = time.perf_counter() - t0
    findings: list[Finding] = []
    if rank == 0:
        findings += _rank0_findings(entries, world)
        report.nodes = entries
    t0 = time.perf_counter()
    findings_ar = _allreduce(dist, torch, world, local_rank, level)
    report.timings["cluster.allreduce"] = time.perf_counter() - t0
    if rank == 0:
        findings += findings_ar
        report.extend(findings)
    dist.barrier()
    dist.destroy_process_group()
    return report


def node_entry(raw: object) -> NodeEntry:
    """A rank's entry as ``gather_json`` brought it (JSON that this code wrote on that rank),
    read into a ``NodeEntry``; its keys in the order the JSON had them (sorted)."""
    if not isinstance(raw, dict):
        raise ValueError(f"a rank sent {type(raw).__name__}, not its entry")
    fp, failed = raw.get("fingerprint"), raw.get("failed")
    return {
        "failed": [str(c) for c in failed] if isinstance(failed, list) else [],
        "fingerprint": {str(k): str(v) for k, v in fp.items()} if isinstance(fp, dict) else {},
        "local_rank": int(raw["local_rank"]),
        "node_rank": int(raw["node_rank"]),
        "ok": raw.get("ok") is True,
        "rank": int(raw["rank"]),
        "test_hook": raw.get("test_hook") is True,
    }


def gather_json(dist: ModuleType, torch: Torch, obj: object, world: int) -> list[object]:
    """all_gather of a JSON-able object over the default (gloo) group. Not all_gather_object:
    that one pickles and needs numpy, which a minimal image may lack."""
    data = json.dumps(obj, sort_keys=True).encode()
    size = torch.tensor([len(data)], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, size)
    longest = max(int(s.item()) for s in sizes)
    buf = torch.zeros(longest, dtype=torch.uint8)
    buf[: len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    bufs = [torch.zeros(longest, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(bufs, buf)
    return [json.loads(bytes(b[: int(n.item())].tolist())) for b, n in zip(bufs, sizes)]


def _time_allreduce(
    dist: ModuleType,
    torch: Torch,
    size: int,
    dev: Device,
    group: object,
    world: int,
    use_cuda: bool,
) -> AllreduceSize:
    """One message size's all-reduce, warmed up once, then timed over 5: its time, algorithm
    and bus bandwidth (nccl-tests' busbw: 2(n-1)/n of the algorithm's)."""
    iters = 5
    buf = torch.zeros(size // 4, device=dev)
    dist.all_reduce(buf, group=group)
    if use_cuda:
        torch.cuda.synchronize(dev)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf, group=group)
    if use_cuda:
        torch.cuda.synchronize(dev)
    dt = (time.perf_counter() - t0) / iters
    del buf
    return allreduce_size(size, dt, world)


def _allreduce(
    dist: ModuleType, torch: Torch, world: int, local_rank: int, level: str
) -> list[Finding]:
    if world < 2:
        return [
            Finding(
                "cluster.nccl.allreduce", SKIP, observed="one rank: nothing to all-reduce across"
            )
        ]
    use_cuda = bool(torch.cuda.is_available())
    sizes: tuple[int, ...]
    dev: Device
    group: object
    if use_cuda:
        dev = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        group = dist.new_group(backend="nccl")
        sizes = (8 << 20, 64 << 20, 256 << 20, 1 << 30) if level == "full" else (8 << 20, 64 << 20)
        backend = "nccl"
    else:
        dev = torch.device("cpu")
        group = None
        sizes = (1 << 20, 8 << 20) if level == "full" else (1 << 20,)
        backend = "gloo"
    rank = dist.get_rank()
    x = torch.full((1 << 18,), float(rank + 1), device=dev)
    dist.all_reduce(x, group=group)
    want = world * (world + 1) / 2
    correct = torch.tensor([1.0 if bool((x == want).all()) else 0.0], device=dev)
    dist.all_reduce(correct, group=group)
    ok = int(correct.item()) == world
    # a message size's timing (bytes exact: < 2**53)
    results = [_time_allreduce(dist, torch, size, dev, group, world, use_cuda) for size in sizes]
    table = "; ".join(f"{int(s['bytes']) >> 20} MiB: {s['busbw_gbps']:.1f}" for s in results)
    return [
        Finding(
            "cluster.nccl.allreduce" if use_cuda else "cluster.allreduce",
            PASS if ok else FAIL,
            expected=f"sum {want:g} on all {world} ranks ({backend}); bus bandwidth (GB/s) reported",
            observed=("correct" if ok else "WRONG sum on some rank") + f"; busbw GB/s {table}",
            hint="" if ok else "a collective returned a wrong result: a faulty NIC, link or GPU",
            data={"sizes": results, "backend": backend, "ranks": world},
        )
    ]

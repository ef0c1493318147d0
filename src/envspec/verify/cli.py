"""`envspec verify ...`: argument parsing, printing and exit codes (the verifier's edge).

Entry points: ``main(argv)`` (the CLI; ``python -m envspec.verify``), ``startup_check(mode)``
(the image entrypoint's hook; ``python -m envspec.verify --startup``).
Exit codes: 0 nothing failed, 1 a check failed (a warning too with --strict), 2 bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TextIO

from . import multinode, render, startup
from .checks import TorchMachine, run_checks
from .lockfile import LockReadError, find_lock, load_lock
from .model import FAIL, WARN

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="envspec verify",
        description="Check this machine against an envspec lock: driver, GPUs, libraries, integrity, "
        "speed. Exit 0: nothing failed; 1: a check failed; 2: bad input.",
        epilog="examples:\n  envspec verify                                   # in an image: its own lock\n"
        "  envspec verify --lock lockfiles/h100-train.lock --level full --json\n"
        "  srun envspec verify --level full --nnodes 4 --nproc-per-node 8 --rdzv-endpoint node1:29400",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--lock",
        metavar="PATH",
        help="the lockfile (default: $ENVSPEC_LOCK, else "
        "/opt/envspec/envspec.lock, the path baked into images)",
    )
    p.add_argument(
        "--level",
        choices=("quick", "full"),
        default="quick",
        help="quick (default): shared objects hashed, other files checked by size, no compile, no "
        "heavy GPU work; full: adds hashing every file, a real torch.compile, GEMM TFLOPS and "
        "the NCCL all-reduce (docs/verify.md, Levels)",
    )
    p.add_argument(
        "--mode",
        choices=("auto", "image", "host"),
        default="auto",
        help="image: this python is the lock's venv; host: any other python (relaxed, see "
        "docs/verify.md); auto (default) decides by comparing sys.prefix with [platform].venv",
    )
    p.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    p.add_argument("--json-out", metavar="FILE", help="also write the JSON report to FILE")
    p.add_argument(
        "--prometheus",
        metavar="FILE",
        help="write node-exporter textfile metrics to FILE (atomically)",
    )
    p.add_argument("--strict", action="store_true", help="warnings fail too (exit 1)")
    _add_check_flags(p)
    p.add_argument("-v", "--verbose", action="store_true", help="show every hint and tracebacks")
    _add_cluster_flags(p)
    return p


def _add_check_flags(p: argparse.ArgumentParser) -> None:
    """Which checks run, and how: --skip, --compile-timeout, --allreduce, --startup."""
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="CHECK",
        help="leave out a check or a group (prefix), e.g. torch.compile, integrity; repeatable, "
        "comma-separated",
    )
    p.add_argument(
        "--compile-timeout",
        type=float,
        default=90.0,
        metavar="S",
        help="full level: seconds the torch.compile child may take (default 90); on a timeout "
        "its whole process group is killed",
    )
    p.add_argument(
        "--allreduce",
        choices=("inprocess", "processes"),
        default="inprocess",
        help="full level: all-reduce in this process over torch.cuda.nccl (default) or with one "
        "process a GPU (torch.distributed, as training runs)",
    )
    p.add_argument(
        "--startup",
        action="store_true",
        help="the container start-up hook: the checks that need no torch (driver, GPUs through NVML, "
        "environment, /dev/shm), mode from $ENVSPEC_VERIFY=off|warn|strict",
    )


def _add_cluster_flags(p: argparse.ArgumentParser) -> None:
    """The flags of a run across nodes (torchrun's rendezvous)."""
    g = p.add_argument_group("across nodes (re-launches under torchrun unless already under it)")
    g.add_argument(
        "--nnodes", type=int, metavar="N", help="number of nodes; every node runs the same command"
    )
    g.add_argument(
        "--nproc-per-node",
        type=int,
        default=1,
        metavar="P",
        help="processes per node (default 1: one process verifies all of its node's GPUs)",
    )
    g.add_argument(
        "--rdzv-endpoint", metavar="HOST:PORT", help="c10d rendezvous endpoint (a node's address)"
    )
    g.add_argument(
        "--rdzv-id", default="envspec-verify", help="rendezvous id (default envspec-verify)"
    )
    g.add_argument("--rdzv-backend", default="c10d", help="rendezvous backend (default c10d)")
    g.add_argument(
        "--node-rank", type=int, metavar="R", help="this node's rank (static rendezvous)"
    )
    g.add_argument("--master-addr", metavar="HOST", help="static rendezvous instead of c10d")
    g.add_argument(
        "--master-port",
        type=int,
        default=29500,
        metavar="PORT",
        help="the static rendezvous's port on --master-addr (default 29500)",
    )


def _print(text: str, stream: TextIO | None = None) -> None:
    (stream or sys.stdout).write(text)
    (stream or sys.stdout).flush()


@contextlib.contextmanager
def _sigterm_exits() -> Iterator[None]:
    """SIGTERM (docker/podman stop, Slurm's kill, a timeout) raises SystemExit(143) while the
    checks run, so that they unwind and the compile probe's process group is killed. Python's
    default would end this process at once and leave the probe's children running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main(argv: list[str] | None = None, *, system: TorchMachine | None = None) -> int:
    """The CLI. ``system`` replaces the machine's probes (tests)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "verify":  # the image's `envspec verify ...` launcher passes it through
        argv = argv[1:]
    args = build_parser().parse_args(argv)
    if args.startup:
        return startup_check(None, lock_path=args.lock)
    skip = tuple(s.strip() for item in args.skip for s in item.split(",") if s.strip())
    distributed = multinode.under_torchrun() and (
        args.nnodes or int(os.environ.get("WORLD_SIZE", "1")) > 1
    )
    if args.nnodes and not multinode.under_torchrun():
        try:
            return multinode.launch(args, argv)
        except ValueError as e:
            _print(f"envspec verify: error: {e}\n", sys.stderr)
            return EXIT_BAD_INPUT
    path, source = find_lock(args.lock)
    try:
        lock = load_lock(path)
    except LockReadError as e:
        _print(f"envspec verify: error: {e.message} (lock from {source})\n", sys.stderr)
        if e.hint:
            _print(f"  hint: {e.hint}\n", sys.stderr)
        return EXIT_BAD_INPUT
    system = system or TorchMachine()
    with _sigterm_exits():
        report = run_checks(
            lock,
            level=args.level,
            mode=args.mode,
            strict=args.strict,
            system=system,
            skip=skip,
            compile_timeout=args.compile_timeout,
            allreduce=args.allreduce,
        )
    rank0 = True
    if distributed:
        torch, err = system.torch()
        if torch is None:
            _print(f"envspec verify: error: --nnodes needs torch: {err}\n", sys.stderr)
            return EXIT_BAD_INPUT
        report = multinode.cluster_phase(report, torch, level=args.level)
        rank0 = int(os.environ["RANK"]) == 0
    if args.json_out and rank0:
        render.write_atomic(args.json_out, report.to_json())
    if args.prometheus:
        render.write_atomic(args.prometheus, render.prometheus(report))
    if rank0:
        _print(report.to_json() if args.json else render.table(report, verbose=args.verbose))
    else:
        c = report.counts()
        _print(
            f"envspec verify rank {os.environ['RANK']}: {'OK' if report.ok else 'FAILED'} "
            f"({c[FAIL]} fail, {c[WARN]} warn); rank 0 prints the cluster report\n",
            sys.stderr,
        )
    return multinode.finish_rank(report.exit_code) if distributed else report.exit_code


def startup_check(
    mode: str | None = None, *, lock_path: str | None = None, stream: TextIO | None = None
) -> int:
    """The container start-up hook (``startup.hook``). mode (default $ENVSPEC_VERIFY, else "warn"):
    off: nothing; warn: print warnings and failures, return 0; strict: return 1 on a failure.

    Runs the "startup" level: lock, environment, container plumbing and /dev/shm, the driver and
    the GPUs' models and compute capabilities against the lock, read from /proc, /dev and NVML.
    No torch, no hashing, no GPU work (docs/verify.md, "The start-up hook").
    """
    return startup.hook(mode, lock_path=lock_path, stream=stream)


def launcher(argv: list[str] | None = None) -> int:
    """The in-image `envspec` script: only `envspec verify ...` exists there."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "verify":
        _print(
            "usage: envspec verify [options]   (this image carries only the verifier; "
            "see `envspec verify --help`)\n",
            sys.stderr,
        )
        return EXIT_BAD_INPUT
    return main(argv[1:])

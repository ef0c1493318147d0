"""`envspec run SPEC|LOCK|IMAGE [-- CMD...]`: the image started with podman or docker.

The stages are imported inside the handlers: every command's module is imported when the
command line starts, and `envspec explain` must not pay for the others' libraries
(docs/benchmarks.md, explain).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from envspec.cli.common import JSON_HELP, Subparsers, command, console, print_json
from envspec.errors import EXIT_OK, UsageError

if TYPE_CHECKING:
    from envspec.run import RunCommand, RunOptions


def cmd_run(args: argparse.Namespace) -> int:
    from envspec.host import ASK_DOCKER, ASK_NONE, detect_host
    from envspec.run import (
        ENGINE_FAILED,
        attached,
        check_docker_image,
        check_engine_ready,
        check_podman_image,
        plan_run,
        resolve_runnable,
        run_lines,
        start_failed,
    )

    cmd = list(args.cmd or [])
    ports = _ports(args.port or [])
    runnable = resolve_runnable(args.target)
    host = detect_host(ask=ASK_NONE)  # file checks only: --print stays fast
    command = plan_run(runnable, cmd, host=host, options=_options(args, ports))
    if command.emulated_cpu:  # the command mounts it (also the one --print shows)
        from envspec.host import write_emulated_cpu_dir

        if not write_emulated_cpu_dir(Path(command.emulated_cpu)):
            command = command.without_emulated_cpu()
    if args.json:
        print_json(command.to_json())
        return EXIT_OK
    if args.print:
        sys.stdout.write("\n".join(run_lines(command)) + "\n")
        return EXIT_OK
    if command.engine == "docker":
        check_engine_ready(detect_host(ask=ASK_DOCKER), "docker")
        check_docker_image(command)  # the image is there: the hint how to load it is no warning now
    elif runnable.lock is not None and not args.image:
        check_podman_image(command, source=str(args.target))
    _say_before(command)
    argv, remove = attached(command, f"{os.getpid()}-{os.urandom(3).hex()}")
    try:
        rc = _run_foreground(argv)
    finally:
        if remove:  # podman keeps the stopped container (and so its exit code) until this
            import subprocess

            subprocess.run(
                remove, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
            )
    if rc == ENGINE_FAILED:
        raise start_failed(command, rc)
    return rc


def _options(args: argparse.Namespace, ports: dict[int, int]) -> RunOptions:
    from envspec.run import RunOptions

    return RunOptions(
        engine=args.engine,
        bind=args.bind,
        detach=args.detach,
        name=args.name,
        mount_cwd=not args.no_mount,
        gpus=not args.no_gpu,
        host_ports=ports,
        image=args.image,
        emulate=args.emulate,
        platform=args.platform,
    )


def _ports(flags: list[str]) -> dict[int, int]:
    """--port HOST:CONTAINER flags: the container's port -> the host's."""
    ports: dict[int, int] = {}
    for p in flags:
        outside, _, inside = p.partition(":")
        if not (outside.isdigit() and inside.isdigit()):
            raise UsageError(f"--port {p!r} is not HOST:CONTAINER", hint="e.g. --port 18888:8888")
        ports[int(inside)] = int(outside)
    return ports


def _say_before(command: RunCommand) -> None:
    """The warnings and notes of the command (not the docker load hint: the image is there),
    said before the container takes the terminal."""
    con = console(stderr=True)
    for w in command.warnings:
        if w != command.load_hint:
            con.print(f"warning: {w}", markup=False)
    for n in command.notes:
        con.print(f"note: {n}", markup=False)
    sys.stdout.flush()
    sys.stderr.flush()


def _run_foreground(argv: list[str]) -> int:
    """Run ``argv`` with this process's terminal and return its exit status (not exec: an engine
    that fails to start the container is then named, with the step). Ctrl-C reaches the child
    through the terminal; SIGTERM and SIGHUP sent to envspec are passed on."""
    import signal
    import subprocess

    child = subprocess.Popen(argv)
    forward = {
        sig: signal.signal(sig, lambda s, _f: child.send_signal(s))
        for sig in (signal.SIGTERM, signal.SIGHUP)
    }
    try:
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:  # the child got the same SIGINT: wait for it to finish
                continue
    finally:
        for sig, old in forward.items():
            signal.signal(sig, old)


def add_run(sub: Subparsers) -> None:
    s = command(
        sub,
        "run",
        help="start the image with podman or docker: GPUs, shm, ports, services, this directory",
        description="Start the lock's image with podman or docker, with the GPUs (CDI or the NVIDIA "
        "runtime), the lock's shm size, ulimits and environment, its services' ports on "
        "loopback, and the current directory on /workspace. A command after -- runs instead "
        "of the services.",
        examples=[
            "envspec run specs/h100.toml                              # Jupyter and SSH, as the spec says",
            "envspec run lockfiles/h100-train.lock -- python train.py --epochs 3",
            "envspec run lockfiles/h100-train.lock --print -- envspec verify   # the command, not run",
        ],
    )
    s.add_argument(
        "target",
        metavar="SPEC|LOCK|IMAGE",
        help="a spec (its lock's image), a lockfile, or an image reference",
    )
    s.add_argument("--print", action="store_true", help="print the command instead of running it")
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    s.add_argument(
        "--engine",
        choices=("podman", "docker"),
        help="the container engine (default: podman where it works, else a reachable docker)",
    )
    s.add_argument("--image", help="run this image reference instead of the lock's tag")
    s.add_argument(
        "--bind",
        default="127.0.0.1",
        help="address the services' ports listen on (default loopback)",
    )
    s.add_argument(
        "--port", action="append", metavar="HOST:CONTAINER", help="publish a service port elsewhere"
    )
    s.add_argument(
        "-d", "--detach", action="store_true", help="start it in the background and print its name"
    )
    s.add_argument("--name", help="the container's name (default: envspec-run-<random>)")
    s.add_argument(
        "--no-mount", action="store_true", help="do not mount the current directory on /workspace"
    )
    s.add_argument(
        "--no-gpu",
        action="store_true",
        help="start it without GPUs (a GPU image then runs its CPU paths)",
    )
    s.add_argument(
        "--emulate",
        action="store_true",
        help="run an image of another CPU architecture (arm64 on amd64) under qemu-user-static "
        "(binfmt_misc); without it such an image is refused (exit 2)",
    )
    s.add_argument(
        "--platform",
        metavar="linux-x86_64|linux-aarch64",
        help="which section of a multi-platform lock to run (default: this host's)",
    )
    s.set_defaults(func=cmd_run, cmd=[])  # the command after `--` is split off before parsing

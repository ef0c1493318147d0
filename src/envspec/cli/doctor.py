"""`envspec doctor [LOCK]`: this host checked before building or running.

The stages are imported inside the handlers: every command's module is imported when the
command line starts, and `envspec explain` must not pay for the others' libraries
(docs/benchmarks.md, explain).
"""

from __future__ import annotations

import argparse

from envspec.cli.common import JSON_HELP, Subparsers, command, console, print_json


def cmd_doctor(args: argparse.Namespace) -> int:
    from envspec.doctor import doctor_exit_code, doctor_json, doctor_lines, run_doctor
    from envspec.host import detect_host
    from envspec.lock import load

    lock = load(args.lock) if args.lock else None
    host = detect_host()
    if lock is not None and lock.multi:  # the host's platform's section (else the first)
        lock = lock.for_platform(host.machine) if lock.find_part(host.machine) else lock.views()[0]
    diagnoses = run_doctor(host, lock)
    if args.json:
        print_json(doctor_json(diagnoses))
    else:
        con = console()
        for line in doctor_lines(diagnoses):
            con.print(line, markup=False)
    return doctor_exit_code(diagnoses)


def add_doctor(sub: Subparsers) -> None:
    s = command(
        sub,
        "doctor",
        help="check this host before building or running: tools, storage, disk, GPUs, driver",
        description="Check this host before building or running: buildah, podman or docker, the NVIDIA "
        "driver and container toolkit, storage and free disk, cgroups, rlimits; against a lock, "
        "its driver floor, GPUs and the space its build needs. Exit 1 when something blocks.",
        examples=["envspec doctor", "envspec doctor lockfiles/h100-train.lock --json"],
    )
    s.add_argument("lock", nargs="?", metavar="LOCK", help="a lockfile to check the host against")
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    s.set_defaults(func=cmd_doctor)

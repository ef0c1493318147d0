"""`envspec diff OLD.lock NEW.lock`: what changed and which layers it rebuilds.

The stages are imported inside the handlers: every command's module is imported when the
command line starts, and `envspec explain` must not pay for the others' libraries
(docs/benchmarks.md, explain).
"""

from __future__ import annotations

import argparse

from envspec.cli.common import JSON_HELP, Subparsers, command, console, print_json
from envspec.errors import EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    from envspec.diff import diff_files, diff_lines

    d = diff_files(args.old, args.new)
    if args.json:
        print_json(d.to_json())
    else:
        con = console()
        for line in diff_lines(d):
            con.print(line, markup=False)
    return EXIT_OK


def add_diff(sub: Subparsers) -> None:
    s = command(
        sub,
        "diff",
        help="what changed between two locks, and which layers it rebuilds",
        description="What changed between two locks, in the order a reviewer reads it: the platform and "
        "the GPU stack, then wheels and Debian packages, other fields, and which image layers "
        "are rebuilt and how much is pushed.",
        examples=[
            "envspec diff <(git show main:lockfiles/train.lock) lockfiles/train.lock",
            "envspec diff lockfiles/cpu.lock lockfiles/cpu-arm64.lock --json",
        ],
    )
    s.add_argument("old", metavar="OLD", help="the lock before")
    s.add_argument("new", metavar="NEW", help="the lock after")
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    s.set_defaults(func=cmd_diff)

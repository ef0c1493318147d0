"""`envspec diff OLD.lock NEW.lock`: what changed and which layers it rebuilds.

The stages are imported inside the handlers: every command's module is imported when the
command line starts, and `envspec explain` must not pay for the others' libraries
(docs/benchmarks.md, explain).
"""

from __future__ import annotations

from envspec.cli.common import console, print_json
from envspec.errors import EXIT_OK


def cmd_diff(args) -> int:
    from envspec.diff import diff_files, diff_lines

    d = diff_files(args.old, args.new)
    if args.json:
        print_json(d.to_json())
    else:
        con = console()
        for line in diff_lines(d):
            con.print(line, markup=False)
    return EXIT_OK


def add_diff(sub) -> None:
    s = sub.add_parser("diff", help="what changed between two locks, and which layers it rebuilds")
    s.add_argument("old")
    s.add_argument("new")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_diff)

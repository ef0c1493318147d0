"""`envspec cluster render ...`: job files that verify N nodes (``envspec.cluster`` parses its own
arguments); this module only lists it in `envspec --help`."""

from __future__ import annotations

from envspec.cli.common import Subparsers


def add_cluster(sub: Subparsers) -> None:
    sub.add_parser(
        "cluster", help="render job files that verify N nodes (see `envspec cluster render --help`)"
    )


def run_cluster(argv: list[str]) -> int:
    """`envspec cluster render ARGS` (``argv`` without the word cluster)."""
    # imported here: jinja2 and the templates are not loaded for the other commands
    from envspec.cluster import main

    return main(argv)

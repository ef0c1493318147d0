"""`envspec verify ...`: the verifier parses its own arguments, as it does alone inside images
(``envspec.verify.cli``); this module only lists it in `envspec --help`."""

from __future__ import annotations

from envspec.cli.common import Subparsers


def add_verify(sub: Subparsers) -> None:
    sub.add_parser(
        "verify", help="check the live machine against a lock (see `envspec verify --help`)"
    )


def run_verify(argv: list[str]) -> int:
    """`envspec verify ARGS` (``argv`` without the word verify)."""
    # imported here: the verifier's modules are not loaded for the other commands
    from envspec.verify.cli import main

    return main(argv)

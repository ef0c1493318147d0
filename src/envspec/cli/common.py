"""What every command shares: plain output (no rich where start-up time counts), JSON,
paths and flag values."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from envspec.errors import UsageError

if TYPE_CHECKING:
    from rich.console import Console

# the sub-commands' action of a parser: each command module adds its parser to it (generic in
# typeshed only)
if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    Subparsers = argparse._SubParsersAction


def console(stderr: bool = False) -> Console:
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            """rich exits 1 when the reader goes away; raised on, ``cli.main`` ends with 141 as for
            plain output (``| head``)."""
            self.quiet = True
            raise BrokenPipeError

    return _Console(stderr=stderr, highlight=False, soft_wrap=True)


JSON_HELP = 'print the result as JSON on stdout (an error too: {"ok": false, "error": ...})'
QUIET_HELP = "say nothing but warnings and errors"


def command(
    sub: Subparsers, name: str, *, help: str, examples: Sequence[str], description: str = ""
) -> argparse.ArgumentParser:
    """A command's sub-parser: its one-line ``help`` (``envspec --help`` lists it), and for its own
    --help a description (``description``, else the help) and examples."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help,
        description=description or (help[:1].upper() + help[1:] + "."),
        epilog="examples:\n" + "\n".join(f"  {e}" for e in examples),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def say(text: str, stderr: bool = False) -> None:
    """One line (or several) of plain text, as it is: no markup, no emoji codes, no wrapping. Used
    where start-up time counts (`explain`, errors), so that rich (tens of ms to import) is not
    needed there. Flushed, as rich does, so that it interleaves with the other stream as before."""
    stream = sys.stderr if stderr else sys.stdout
    stream.write(text + "\n")
    stream.flush()


def print_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def bool_flag(flag: str, value: str | None) -> bool | None:
    if value is None:
        return None
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise UsageError(f"{flag}={value}: expected true or false", hint=f"e.g. {flag}=false")

"""docs/cli.md, generated from the parsers: every command, its description, usage, options and
examples, so that the page and `--help` cannot disagree (tests/unit/test_cli_reference.py).

    python -m envspec.cli.reference > docs/cli.md
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

WIDTH = 100


def _parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(the command line's words, its parser) for every command and sub-command, in `--help`'s order."""
    from envspec import cluster
    from envspec.cli import GROUPS, build_parser
    from envspec.verify.cli import build_parser as verify_parser

    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    for names in GROUPS.values():
        for name in names:
            if name == "verify":
                yield "envspec verify", verify_parser()
                continue
            if name == "cluster":
                yield "envspec cluster render", cluster.build_parser()
                continue
            p = sub.choices[name]
            yield f"envspec {name}", p
            inner = next((a for a in p._actions if isinstance(a, argparse._SubParsersAction)), None)
            for child, cp in (inner.choices.items() if inner else ()):
                yield f"envspec {name} {child}", cp


def _usage(words: str, p: argparse.ArgumentParser) -> str:
    f = argparse.HelpFormatter(prog=words, width=WIDTH)
    f.add_usage(p.usage, p._actions, p._mutually_exclusive_groups, prefix="")
    return f.format_help().strip()


def _option(a: argparse.Action) -> str:
    if a.option_strings:
        names = ", ".join(a.option_strings)
        if a.nargs != 0:
            names += " " + (a.metavar if isinstance(a.metavar, str) else (a.dest.upper() if not a.choices
                                                                        else "{" + ",".join(map(str, a.choices)) + "}"))
        return names
    return a.metavar if isinstance(a.metavar, str) else a.dest.upper()


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def markdown() -> str:
    out = ["# The command line", "",
           "Generated from the parsers by `python -m envspec.cli.reference > docs/cli.md`; "
           "`envspec COMMAND --help` says the same. Exit codes: README.md.", ""]
    from envspec.cli import GROUPS

    out += ["| group | commands |", "| --- | --- |"]
    out += [f"| {g} | {', '.join(f'`{n}`' for n in names)} |" for g, names in GROUPS.items()]
    for words, p in _parsers():
        out += ["", f"## `{words}`", "", _cell(p.description or ""), "", "```", _usage(words, p), "```", ""]
        rows = [a for a in p._actions if not isinstance(a, argparse._HelpAction)]
        if rows:
            out += ["| argument | meaning |", "| --- | --- |"]
            out += [f"| `{_cell(_option(a))}` | {_cell(a.help or '')} |" for a in rows]
        if p.epilog and p.epilog.startswith("examples:"):
            out += ["", "Examples:", "", "```sh", *[line[2:] for line in p.epilog.splitlines()[1:]], "```"]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(markdown())

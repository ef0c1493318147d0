"""The command line: the only package that prints or exits. ``main`` parses (one parser, built
in ``build_parser``) and hands each command to its module: ``lock`` (explain and lock), ``db``,
``build``, ``verify_image``, ``cache``, ``run``, ``doctor``, ``diff``, ``verify``, ``cluster``; each
module holds its command's options, help and handler, ``common`` what they share.

Exit codes are listed in ``envspec.errors``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from envspec import __version__
from envspec.cli import (
    build,
    cache,
    cluster,
    db,
    diff,
    doctor,
    init,
    lock,
    run,
    verify,
    verify_image,
)
from envspec.cli.common import console, print_json, say
from envspec.errors import (
    EXIT_BAD_INPUT,
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EnvspecError,
    ResolutionImpossible,
)

# Each command's sub-parser, in the order `envspec --help` lists them.
_COMMANDS = {
    "init": init.add_init,
    "lock": lock.add_lock,
    "explain": lock.add_explain,
    "db": db.add_db,
    "build": build.add_build,
    "verify-image": verify_image.add_verify_image,
    "cache": cache.add_cache,
    "run": run.add_run,
    "doctor": doctor.add_doctor,
    "diff": diff.add_diff,
    "verify": verify.add_verify,
    "cluster": cluster.add_cluster,
}


# How `envspec --help` groups the commands: a newcomer's path first.
GROUPS = {
    "start here": ("init", "explain", "lock", "build", "run"),
    "images": ("diff", "verify-image", "cache"),
    "machines": ("doctor", "verify"),
    "cluster": ("cluster",),
    "database": ("db",),
}


def _command_of(argv: list[str]) -> str | None:
    """The command ``argv`` names when nothing but ``-v``/``--verbose`` comes before it, else None
    (no command, an unknown one, --help, --version: the whole parser answers those)."""
    for arg in argv:
        if arg not in ("-v", "--verbose"):
            return arg if arg in _COMMANDS else None
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with ``command``, only that command's sub-parser (what ``main``
    parses a command line with: it parses, helps and fails the same way for that command, and
    argparse's set-up of every command is about 2% of `envspec explain`: callgrind, 2026-12-03,
    commit 8dddca3)."""
    p = argparse.ArgumentParser(
        prog="envspec",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="envspec [-h] [--version] [-v] COMMAND ...",
        description="Reproducible GPU deep-learning environments: a spec (TOML) locked\n"
        "against a compatibility DB, built into an OCI image bit for bit,\n"
        "verified on the machine it runs on.",
        epilog="`envspec COMMAND --help` says more, with examples; docs/cli.md lists every option.",
    )
    p.add_argument("--version", action="version", version=f"envspec {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="show tracebacks and commands")
    # prog: a command's usage line names the command (`usage: envspec cache gc [-h] ...`), not the
    # top parser's usage and then the command
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", help=argparse.SUPPRESS, prog="envspec")
    for name, add in _COMMANDS.items():
        if command is None or name == command:
            add(sub)
    if command is None:  # the commands by group, each with its one line
        helps = {a.dest: a.help or "" for a in sub._choices_actions}
        width = max(map(len, helps)) + 2
        p.description = (p.description or "") + "".join(
            f"\n\n{group}:\n" + "\n".join(f"  {name:<{width}}{helps[name]}" for name in names)
            for group, names in GROUPS.items()
        )
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # the reader went away (`envspec explain SPEC | head`): no traceback; stdout pointed at
        # /dev/null so the interpreter's last flush does not fail again; 141, as a command that
        # SIGPIPE ended (128 + 13) gives a shell
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [
        "verify"
    ]:  # the verifier parses its own arguments (it also runs alone inside images)
        return verify.run_verify(argv[1:])
    if argv[:1] == ["cluster"]:  # `envspec cluster render ...`: job files for torchrun across nodes
        return cluster.run_cluster(argv[1:])
    parser = build_parser(_command_of(argv))
    after: list[str] = []
    if argv[:1] == ["run"] and "--" in argv:  # `envspec run TARGET [options] -- CMD...`
        i = argv.index("--")
        argv, after = argv[:i], argv[i + 1 :]
    args = parser.parse_args(argv)
    if after:
        args.cmd = after
    if not getattr(args, "func", None):
        build_parser().print_help()  # every command's
        return EXIT_BAD_INPUT
    if (
        args.func is not lock.cmd_explain
    ):  # explain is offline and logs nothing: it does without the logging module
        import logging

        logging.basicConfig(
            level=logging.WARNING, format="warning: %(message)s"
        )  # the core's warnings, e.g. stale indexes
    try:
        code: int = args.func(args)
        return code
    except EnvspecError as e:
        from envspec import (
            explain,
        )  # (its words for an impossible resolution; imported where an error is told)

        if getattr(args, "json", False):
            print_json(
                explain.impossible_json(e)
                if isinstance(e, ResolutionImpossible)
                else {"ok": False, "error": e.to_json()}
            )
        if args.verbose:
            import traceback

            say(traceback.format_exc(), stderr=True)
        if isinstance(e, ResolutionImpossible):
            lines = explain.impossible_lines(e)
            say(f"error[{e.reference}]: " + "\n".join(lines), stderr=True)
        else:
            say(f"error[{e.reference}]: {e.message}", stderr=True)
        if e.hint and not e.hint_in_message:
            say(f"hint: {e.hint}", stderr=True)
        return e.exit_code
    except KeyboardInterrupt:
        console(stderr=True).print("interrupted; nothing was half-written", markup=False)
        return EXIT_INTERRUPTED

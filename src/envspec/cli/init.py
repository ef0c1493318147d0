"""`envspec init`: write a commented spec, asking for what the options do not give (in a
terminal), never overwriting a file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from envspec.cli.common import Subparsers, command, console
from envspec.errors import EXIT_OK, UsageError


def _ask(question: str, default: str) -> str:
    """One question on the terminal; the default where the answer is empty."""
    answer = input(f"{question} [{default}]: " if default else f"{question}: ").strip()
    return answer or default


def _refuse_existing(out: Path) -> None:
    if out.exists():
        raise UsageError(
            f"{out} exists; envspec init never overwrites a file",
            hint=f"edit {out}, or give another path with -o",
            reference="file-exists",
        )


def _split(values: list[str] | None) -> tuple[str, ...]:
    return tuple(v.strip() for item in values or () for v in item.split(",") if v.strip())


def _gpus(args: argparse.Namespace, tty: bool) -> tuple[str, ...]:
    """The GPUs given, else asked for in a terminal (none: a CPU image)."""
    gpus = _split(args.gpu)
    if not gpus and not args.cpu:
        if not tty:
            raise UsageError(
                "no --gpu and no --cpu: which GPUs does the image run on?",
                hint="e.g. envspec init --gpu H100 (names: `envspec db show`), or --cpu for a CPU image",
                reference="bad-usage",
            )
        gpus = _split([_ask("GPUs the image runs on, comma-separated (none: a CPU image)", "H100")])
        gpus = () if gpus == ("none",) else gpus
    return gpus


def _driver(args: argparse.Namespace, tty: bool, gpus: tuple[str, ...], notes: list[str]) -> str:
    """The hosts' oldest driver: given, asked for (this host's offered), or this host's (noted)."""
    from envspec.host import ASK_NONE, detect_host

    driver: str = args.driver or ""
    if gpus and not driver:
        here = detect_host(ask=ASK_NONE).driver_version  # this host's driver, where it has one
        driver = (
            _ask(
                "the oldest NVIDIA driver on the hosts (empty: assume the newest build's floor)",
                here,
            )
            if tty
            else here
        )
        if driver and not args.driver and not tty:
            notes.append(
                f"--driver not given: this host's driver {driver} is taken as the hosts' oldest"
            )
    return driver


def cmd_init(args: argparse.Namespace) -> int:
    from envspec import init
    from envspec.lock import default_path

    tty = sys.stdin.isatty() and not args.yes
    name = args.name or Path.cwd().name.lower().replace(" ", "-") or "env"
    out = Path(args.output) if args.output else Path("specs") / f"{name}.toml"
    _refuse_existing(
        out
    )  # before any question: nothing to ask for a file that is never overwritten
    notes: list[str] = []
    gpus = _gpus(args, tty)
    driver = _driver(args, tty, gpus, notes)
    torch = args.torch or (
        _ask("torch versions (2.14: every 2.14 release; *: the newest that fits)", "*")
        if tty
        else "*"
    )
    python = args.python or (
        _ask("Python (3.11: Debian bookworm; 3.13: trixie)", "3.11") if tty else "3.11"
    )
    packages = (
        _split([args.packages])
        if args.packages is not None
        else (
            _split([_ask("Python packages beside torch, comma-separated PEP 508 requirements", "")])
            if tty
            else ()
        )
    )
    answers = init.Answers(
        name=name, gpus=gpus, driver=driver, torch=torch, python=python, packages=packages
    )
    text, spec = init.make_spec(answers, out, default_path(out, name))
    from envspec.lock import write_atomic

    _refuse_existing(out)  # written meanwhile, while the questions were asked
    write_atomic(out, text)
    con = console(stderr=True)
    for n in notes:
        con.print(f"note: {n}", markup=False)
    con.print(
        f"wrote {out}: {', '.join(gpus) or 'CPU'}, torch {spec.torch.version if spec.torch else '-'}, "
        f"Python {python}; next: envspec explain {out}",
        markup=False,
    )
    return EXIT_OK


def add_init(sub: Subparsers) -> None:
    s = command(
        sub,
        "init",
        help="write a commented spec for your GPUs, driver, torch and packages",
        description="Write a commented spec that locks as written: checked against the compatibility DB "
        "first (the GPUs, driver, Python and torch must fit together). In a terminal it asks "
        "for what the options do not give; given every value, it asks nothing. It never "
        "overwrites a file.",
        examples=[
            'envspec init --gpu H100 --driver 580.65.06 --torch 2.14 --packages "transformers,datasets"',
            "envspec init --cpu --name ci -o specs/ci.toml",
            "envspec init                               # asks",
        ],
    )
    _add_spec_flags(s)
    s.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="where to write (default specs/<name>.toml); an existing file is never overwritten",
    )
    s.add_argument(
        "-y",
        "--yes",
        action="store_true",
        help="ask nothing: take the defaults for what is not given",
    )
    s.set_defaults(func=cmd_init)


def _add_spec_flags(s: argparse.ArgumentParser) -> None:
    """``init``'s flags for what goes into the spec."""
    s.add_argument(
        "--name",
        help="the spec's name, which names its lock and image (default: this folder's name)",
    )
    s.add_argument(
        "--gpu",
        action="append",
        metavar="GPU",
        help='a GPU the image runs on, e.g. H100 or "A100 80GB" (repeatable or comma-separated; '
        "names: `envspec db show`)",
    )
    s.add_argument(
        "--cpu", action="store_true", help="a CPU image: no GPUs, the CPU build of torch"
    )
    s.add_argument(
        "--driver",
        metavar="VERSION",
        help="the oldest NVIDIA driver on the hosts, e.g. 580.65.06 (default: this host's, where it "
        "has one; else left out, and the newest build's floor is assumed)",
    )
    s.add_argument(
        "--torch",
        metavar="VERSION",
        help="torch versions: 2.14 (every 2.14 release), ==2.14.1, >=2.12 (default *: the newest that fits)",
    )
    s.add_argument(
        "--python", metavar="X.Y", help="3.11 (Debian bookworm, the default) or 3.13 (trixie)"
    )
    s.add_argument(
        "--packages",
        metavar="REQS",
        help="Python packages beside torch, comma-separated PEP 508 requirements, e.g. "
        '"transformers>=4.50,datasets" (default: none)',
    )

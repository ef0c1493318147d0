"""`envspec db show` and `envspec db refresh`: the compatibility database.

The stages are imported inside the handlers: every command's module is imported when the
command line starts, and `envspec explain` must not pay for the others' libraries
(docs/benchmarks.md, explain).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from envspec.cli.common import Subparsers, command, console, print_json
from envspec.errors import EXIT_CHECK_FAILED, EXIT_OK, EXIT_SOURCE

if TYPE_CHECKING:
    from rich.table import Table

    from envspec.compat.model import CompatDB
    from envspec.compat.pypi import RefreshReport


def cmd_db(args: argparse.Namespace) -> int:
    from envspec.compat import load_db

    if args.db_cmd == "refresh":
        return _refresh(args)
    db = load_db(
        validate=True
    )  # the db commands check the data files whatever the cache of checked DBs holds
    if args.json:
        print_json(db.to_json())
        return EXIT_OK
    if args.html:
        from envspec import explain
        from envspec.lock import write_atomic

        write_atomic(args.html, explain.db_html(db))
        console().print(
            f"wrote {args.html}: the GPU x torch x CUDA-variant matrix of DB {db.version} "
            "(one self-contained page)",
            markup=False,
        )
        return EXIT_OK
    _show(db)
    return EXIT_OK


def _refresh(args: argparse.Namespace) -> int:
    """`envspec db refresh`: torch_pypi.toml regenerated from PyPI; what changed, the problems
    met and the releases that need review."""
    from envspec.compat import DATA_DIR, refresh

    report = refresh(Path(args.output) if args.output else DATA_DIR / "torch_pypi.toml")
    # 3: an index did not answer for some release; 1: releases could not be read (README, errors.py)
    # a release that needs review (a CUDA the DB does not know, no arch list) is written, but fails the run
    code = (
        EXIT_SOURCE
        if report.source_errors
        else EXIT_CHECK_FAILED
        if report.problems or report.needs_review or report.platform_review
        else EXIT_OK
    )
    if args.json:
        print_json(report.to_json())
        return code
    con = console()
    n = len(report.releases)
    counts = ", ".join(
        f"{len(names)} {what}"
        for what, names in (
            ("added", report.added),
            ("changed", report.changed),
            ("unchanged", report.unchanged),
            ("kept", report.kept),
            ("removed", report.removed),
        )
    )
    con.print(
        f"{'wrote' if report.written else 'did not write'} {report.out_path}: "
        f"{n} release{'s' if n != 1 else ''} ({counts})",
        markup=False,
    )
    for what, names in (
        ("added", report.added),
        ("changed", report.changed),
        ("removed", report.removed),
    ):
        if names:
            con.print(f"  {what}: {', '.join(names)}", markup=False)
    _say_problems(report)
    _say_reviews(report)
    return code


def _say_problems(report: RefreshReport) -> None:
    """The releases that could not be read, and what to do."""
    if not report.problems:
        return
    err = console(stderr=True)
    for problem in report.problems:
        err.print(f"problem: {problem}", markup=False)
    err.print(
        "hint: "
        + (
            "an index did not answer: check the network and run it again; "
            if report.source_errors
            else ""
        )
        + "a release that could not be read keeps its old row, if the file had one",
        markup=False,
    )


def _say_reviews(report: RefreshReport) -> None:
    """The releases written that need review before they resolve, and what is missing."""
    for review, hint in (
        (
            report.needs_review,
            "these releases were written with what their metadata says and "
            "are left out of resolution until cuda.toml / torch_variants.toml have the missing rows "
            "(docs/compat-db.md, Refreshing)",
        ),
        (
            report.platform_review,
            "these releases resolve on linux-x86_64; on linux-aarch64 the "
            'resolver goes by compat/data/torch_platforms.toml, curated (docs/compat-db.md, "The '
            "platform's torch build\")",
        ),
    ):
        if not review:
            continue
        err = console(stderr=True)
        for version, items in review.items():
            for item in items:
                err.print(f"needs review: torch {version}: {item}", markup=False)
        err.print("hint: " + hint, markup=False)


def _show(db: CompatDB) -> None:
    """The DB as tables: a row per build of each torch release (its CUDA, cuDNN, NCCL, driver
    floors, arch list), a row per GPU family (compute capability, architecture, driver branches),
    and a table per product line (data center, workstation, GeForce and TITAN, Jetson) with a row
    per GPU (its aliases, compute capability, architecture, driver branches, host CPUs, rates). In a terminal, rich tables; piped, the same rows one line each, never wrapped, so
    that grep finds a whole entry."""
    import sys

    from envspec.compat.load import LINES

    tty = sys.stdout.isatty()
    con = console()
    if not tty:
        con.width = 100_000  # a line per row: no wrapping where no person reads the width
    con.print(f"compatibility DB {db.version} ({db.date})", markup=False)
    con.print(_releases_table(db, tty))
    con.print(_families_table(db, tty))
    for line, title in LINES.items():
        con.print(_gpus_table(db, line, title, tty))


def _releases_table(db: CompatDB, tty: bool) -> Table:
    """A row per build of each torch release (its CUDA, cuDNN, NCCL, driver floors, arch list)."""
    from rich.box import SIMPLE_HEAD
    from rich.table import Table

    from envspec.resolve import driver_floor

    t = Table(
        "torch",
        "build",
        "python",
        "CUDA",
        "cuDNN",
        "NCCL",
        "driver >= (compat / strict)",
        "arch list",
        title="torch releases (* the build PyPI serves)",
        box=SIMPLE_HEAD if tty else None,
        title_justify="left",
    )
    for r in db.torch_releases:
        for v in r.variants.values():
            floors = (
                f"{driver_floor(db, v, 'compat') or '?'} / {driver_floor(db, v, 'strict') or '?'}"
                if v.cuda
                else "-"
            )
            t.add_row(
                r.version,
                v.name + (" *" if v.name == r.pypi_variant else ""),
                " ".join(r.python),
                v.cuda or "-",
                v.cudnn or "-",
                v.nccl or "-",
                floors,
                " ".join(v.arch_list) or "-",
            )
    return t


def _families_table(db: CompatDB, tty: bool) -> Table:
    """A row per GPU family: compute capability, architecture, chips, driver branches."""
    from rich.box import SIMPLE_HEAD
    from rich.table import Table

    f = Table(
        "cc",
        "architecture",
        "chips",
        "first driver",
        "last driver",
        title="GPU families (a compute capability fixes the architecture and the driver branches)",
        box=SIMPLE_HEAD if tty else None,
        title_justify="left",
    )
    for x in db.families:
        f.add_row(
            x.cc,
            x.architecture,
            x.chips or "-",
            f"R{x.min_driver}" if x.min_driver else "(Jetson Linux's)",
            f"R{x.max_driver}" if x.max_driver else "-",
        )
    return f


def _gpus_table(db: CompatDB, line: str, title: str, tty: bool) -> Table:
    """A row per GPU of one product line: aliases, compute capability, architecture, driver
    branches, host CPUs, rates."""
    from rich.box import SIMPLE_HEAD
    from rich.table import Table

    g = Table(
        "GPU",
        "aliases",
        "cc",
        "architecture",
        "first driver",
        "last driver",
        "hosts",
        "memory GiB",
        "bf16 TFLOPS",
        "tf32 TFLOPS",
        "GB/s",
        title=f"GPUs, {title} (the names \\[target].gpus takes: the name or an alias)",
        box=SIMPLE_HEAD if tty else None,
        title_justify="left",
    )
    for gx in db.gpus:
        if gx.line != line:
            continue
        g.add_row(
            gx.name,
            ", ".join(gx.aliases) or "-",
            gx.cc,
            gx.architecture,
            f"R{gx.min_driver}" if gx.min_driver else "-",
            f"R{gx.max_driver}" if gx.max_driver else "-",
            " ".join(gx.host_arch) or "-",
            _n(gx.memory_gib),
            _n(gx.bf16_tflops),
            _n(gx.tf32_tflops),
            _n(gx.mem_bw_gbs),
        )
    return g


def _n(v: float | None) -> str:
    return "-" if v is None else (f"{v:g}")


def add_db(sub: Subparsers) -> None:
    s = command(
        sub,
        "db",
        help="the compatibility database: torch builds, CUDA, cuDNN, NCCL, GPUs, driver branches",
        description="The versioned, sourced compatibility database that `explain` and `lock` resolve "
        "against: `db show` prints it (or writes one HTML page), `db refresh` regenerates its "
        "PyPI-derived part.",
        examples=[
            "envspec db show | grep H100",
            "envspec db show --html db.html",
            "envspec db refresh -o /tmp/db.toml",
        ],
    )
    dsub = s.add_subparsers(dest="db_cmd", metavar="ACTION", required=True, help="show or refresh")
    d = command(
        dsub,
        "show",
        help="print the DB: a row per torch build and per GPU (the names a spec takes)",
        examples=["envspec db show", "envspec db show --json", "envspec db show --html db.html"],
    )
    d.add_argument("--json", action="store_true", help="print the whole DB as JSON")
    d.add_argument(
        "--html",
        metavar="FILE",
        help="write one self-contained HTML page: the GPU x torch x CUDA-variant "
        "matrix with driver floors, filterable, each cell linked to its source",
    )
    d = command(
        dsub,
        "refresh",
        help="regenerate the PyPI-derived part from the package index",
        examples=["envspec db refresh", "envspec db refresh -o /tmp/torch_pypi.toml --json"],
    )
    d.add_argument(
        "-o", "--output", metavar="PATH", help="where to write (default: the bundled data file)"
    )
    d.add_argument("--json", action="store_true", help="print the report as JSON")
    s.set_defaults(func=cmd_db)

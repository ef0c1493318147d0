"""`envspec cache`, `envspec cache gc` and `envspec cache compress`.

The stages are imported inside the handlers: every command's module is imported when the
command line starts, and `envspec explain` must not pay for the others' libraries
(docs/benchmarks.md, explain).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from envspec.cli.common import JSON_HELP, Subparsers, command, console, print_json
from envspec.errors import EXIT_OK, EnvspecError, HostError

if TYPE_CHECKING:
    from envspec.cache.gc import CacheEntry, GcPlan, Needed
    from envspec.cache.store import Cache


def _cache_compress(args: argparse.Namespace, cache: Cache) -> int:
    """`envspec cache compress LOCK`: the compressed blobs of the lock's cached layers, made now."""
    import time
    from dataclasses import asdict

    from envspec import lock as lockmod
    from envspec.image import compress_layers
    from envspec.image.compress import compression
    from envspec.plan import make_plan

    started = time.monotonic()
    made = compress_layers(
        make_plan(lockmod.load(Path(args.lock))), cache, compression(args.compression)
    )
    seconds = time.monotonic() - started
    if args.json:
        print_json(
            {
                "lock": args.lock,
                "compression": args.compression,
                "seconds": round(seconds, 3),
                "layers": [asdict(lay) for lay in made],
            }
        )
    else:
        console().print(
            f"compressed {len(made)} layers ({sum(lay.diff_size for lay in made) / 1e6:.1f} MB -> "
            f"{sum(lay.size for lay in made) / 1e6:.1f} MB {args.compression}) in {seconds:.1f} s",
            markup=False,
        )
    return EXIT_OK


def _needed(paths: list[Path]) -> tuple[Needed, list[str]]:
    """What the locks at ``paths`` need of the cache (``plan.cache_entries``), and the locks that
    could not be read ("path: why"). A lock named on the command line that cannot be read is
    refused before this."""
    from envspec import lock as lockmod
    from envspec.cache.gc import Needed
    from envspec.image.layers import envspec_layer_inputs
    from envspec.plan import BuildPlan, cache_entries, keyed_top

    def top(plan: BuildPlan) -> BuildPlan:  # the envspec layer as a build of the lock keys it
        return keyed_top(plan, envspec_layer_inputs(plan, None, None))

    needed, bad = Needed(), list[str]()
    for p in paths:
        try:
            needed.add(str(p), cache_entries(lockmod.load(p), top))
        except EnvspecError as e:
            bad.append(f"{p}: {e.message.splitlines()[0].rstrip(':')}")
    return needed, bad


def _stored_diff_ids() -> tuple[frozenset[str] | None, str]:
    """The diff_ids of the layers in containers-storage (the store a build imports into:
    ENVSPEC_STORAGE_ROOT, else buildah's), or None and why they could not be read."""
    from envspec.image.engine import BuildahEngine

    try:
        store = BuildahEngine().storage_cli()
    except EnvspecError as e:
        return None, e.message.splitlines()[0]
    if store is None:
        return None, "containers-storage's own tool is not here, or this is not root"
    return frozenset(d for d in store.stored_layers().values() if d), ""


def cmd_cache(args: argparse.Namespace) -> int:
    from envspec.cache.dirs import cache_dir_for
    from envspec.cache.store import Cache

    cache = Cache(cache_dir_for(os.environ))
    if args.cache_cmd == "compress":
        return _cache_compress(args, cache)
    if args.cache_cmd != "gc":
        return _cache_show(args, cache)
    return _cache_gc(args, cache)


def _cache_show(args: argparse.Namespace, cache: Cache) -> int:
    """`envspec cache`: what the cache holds, by kind, and each layer."""
    from envspec.cache import gc as cachegc

    entries = cachegc.scan(cache)
    info = cachegc.summary(cache, entries)
    stored, why = _stored_diff_ids()
    droppable = {e.name for e in cachegc.in_store(entries, stored or ())}
    if args.json:
        store = {"read": stored is not None, "why": why, "layers_in_store": len(droppable)}
        store["bytes_in_store"] = sum(e.size for e in entries if e.name in droppable)
        print_json(
            info.to_json()
            | {"store": store}
            | {"entries": [e.to_json() | _in_store(e, droppable) for e in entries]}
        )
        return EXIT_OK
    con = console()
    con.print(f"cache {info.cache}: {cachegc.human(info.total_bytes)}", markup=False)
    for kind, row in info.kinds.items():
        con.print(
            f"  {kind + 's':<8} {row['count']:>6}  {cachegc.human(row['bytes']):>11}",
            markup=False,
        )
    for name, size in info.other.items():
        con.print(f"  {name:<24} {cachegc.human(size):>11}  {info.other_what[name]}", markup=False)
    for e in (e for e in entries if e.kind == "layer"):
        tar = any(q.name == f"{e.name}.tar" for q in e.paths)
        con.print(
            f"  layer {e.name[:12]} {e.group or '?':<10} {cachegc.human(e.size):>11}"
            + ("" if tar else "  (its compressed blob only: the layer was removed)")
            + ("  in containers-storage" if e.name in droppable else ""),
            markup=False,
        )
    _say_droppable(entries, droppable, why)
    return EXIT_OK


def _in_store(e: CacheEntry, droppable: set[str]) -> dict[str, bool]:
    return {"in_store": e.name in droppable} if e.kind == "layer" else {}


def _say_droppable(entries: list[CacheEntry], droppable: set[str], why: str) -> None:
    """What a node may drop (issue 59, point 5): the layers containers-storage holds too."""
    from envspec.cache import gc as cachegc

    con = console()
    if why:
        con.print(f"containers-storage's layers could not be read ({why})", markup=False)
        return
    size = sum(e.size for e in entries if e.kind == "layer" and e.name in droppable)
    con.print(
        f"a node may drop {len(droppable)} layers ({cachegc.human(size)}) that containers-storage "
        "holds too: `envspec cache gc --stored` (a build with --cache-from finds them in the "
        "store; the layers a build takes from a registry cache are not kept unless "
        "ENVSPEC_KEEP_PULLED=on)"
        if droppable
        else "no layer here is in containers-storage too: nothing a node may drop",
        markup=False,
    )


def _cache_gc(args: argparse.Namespace, cache: Cache) -> int:
    """`envspec cache gc`: what no lock needs removed (the locks named, else the repository's)."""
    from envspec.cache import gc as cachegc

    if args.locks:
        paths = [Path(p) for p in args.locks]
        from envspec import lock as lockmod

        for p in paths:  # a lock named here that cannot be read stops the collection (exit 2)
            lockmod.load(p)
    else:
        paths = cachegc.default_locks(Path.cwd())
    needed, bad = _needed(paths)
    keep_size = cachegc.parse_size(args.keep_size) if args.keep_size is not None else None
    stored = _stored_for_gc() if args.stored else frozenset()
    err = console(stderr=True)
    for b in bad:
        err.print(f"warning: skipped {b}: what it needs may be removed", markup=False)
    if not paths and not args.json:
        err.print(
            f"note: no envspec locks under {cachegc.repository_root(Path.cwd())}: no entry is kept for a lock",
            markup=False,
        )
    plan = cachegc.collect(
        cache,
        needed,
        keep_size=keep_size,
        dry_run=args.dry_run,
        on_wait=lambda users: err.print(
            f"waiting for the {len(users) or ''} build(s) using the cache to finish"
            + "".join(f"\n  {u}" for u in users),
            markup=False,
        ),
        stored=stored,
    )
    if args.json:
        print_json(
            {
                "ok": True,
                "cache": str(cache.root),
                "dry_run": args.dry_run,
                "locks": [str(p) for p in paths],
                "skipped_locks": bad,
            }
            | plan.to_json()
        )
        return EXIT_OK
    _say_collected(args, plan, len(paths), keep_size)
    return EXIT_OK


def _stored_for_gc() -> frozenset[str]:
    """``cache gc --stored``: the store's diff_ids, or an error (exit 5) naming why not."""
    got, why = _stored_diff_ids()
    if got is None:
        raise HostError(
            f"cache gc --stored: containers-storage's layers could not be read ({why})",
            hint="run it as root where buildah and containers-storage are installed "
            "(scripts/dev.sh setup), or leave --stored out",
        )
    return got


def _say_collected(
    args: argparse.Namespace, plan: GcPlan, locks: int, keep_size: int | None
) -> None:
    """What `cache gc` removed (or would), and what it kept and why."""
    from envspec.cache import gc as cachegc

    con, err = console(), console(stderr=True)
    verb = "would remove" if args.dry_run else "removed"
    for e in plan.remove:
        con.print(
            f"{verb} {e.kind} {e.name[:16]}{' ' + e.group if e.group else ''}  {cachegc.human(e.size)}",
            markup=False,
        )
    plural = {"wheel": "wheels", "deb": "debs", "layer": "layers", "built": "built wheels"}
    counts = ", ".join(
        f"{sum(1 for e in plan.remove if e.kind == k)} {plural[k]}" for k in cachegc.KINDS
    )
    kept = plan.kept
    con.print(
        f"{verb} {len(plan.remove)} entries ({counts}"
        + (f"; {plan.stored} layers in containers-storage" if plan.stored else "")
        + f"), {cachegc.human(plan.freed)}; kept {kept['count']} "
        f"({cachegc.human(kept['bytes'])}): {kept['needed']} needed by {locks} locks, "
        f"{kept['recent']} used in the last {cachegc.GRACE_S // 60} minutes"
        + (
            f", {kept['budget']} within --keep-size {args.keep_size}"
            if keep_size is not None
            else ""
        ),
        markup=False,
    )
    if plan.over_budget:
        err.print(
            f"note: what the locks need exceeds --keep-size {args.keep_size} by "
            f"{cachegc.human(plan.over_budget)}; it is kept",
            markup=False,
        )


def add_cache(sub: Subparsers) -> None:
    s = command(
        sub,
        "cache",
        help="what envspec's cache holds; `cache gc` removes what no lock needs",
        description="List what envspec's cache holds (wheels, .debs, layers, wheels built from sdists, and "
        "what each other folder is); `cache gc` removes the entries no lock needs; `cache "
        "compress` makes a lock's compressed layer blobs ahead of a push.",
        examples=[
            "envspec cache",
            "envspec cache gc --dry-run",
            "envspec cache gc --keep-size 50G",
            "envspec cache compress lockfiles/h100-train.lock",
        ],
    )
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    csub = s.add_subparsers(
        dest="cache_cmd", metavar="ACTION", help="gc or compress (none: list the cache)"
    )
    _add_gc(csub)
    c = command(
        csub,
        "compress",
        help="make the compressed blobs of a lock's cached layers now, so that a push "
        "need not (a local build starts this in the background)",
        examples=["envspec cache compress lockfiles/h100-train.lock --compression gzip"],
    )
    c.add_argument("lock", metavar="LOCK", help="the lockfile whose layers to compress")
    c.add_argument(
        "--compression",
        choices=("zstd", "gzip"),
        default="zstd",
        help="the compression a later push will use (default zstd)",
    )
    c.add_argument("--json", action="store_true", help=JSON_HELP)
    s.set_defaults(func=cmd_cache, cache_cmd=None)


def _add_gc(csub: Subparsers) -> None:
    c = command(
        csub,
        "gc",
        help="remove the wheels, .debs and layers that the locks do not need",
        examples=[
            "envspec cache gc                    # keep what this repository's locks need",
            "envspec cache gc lockfiles/h100-train.lock --keep-size 50G",
            "envspec cache gc --stored           # a node: drop what the store holds too",
        ],
    )
    c.add_argument(
        "locks",
        nargs="*",
        metavar="LOCK",
        help="keep what these locks need (default: every envspec *.lock in this repository)",
    )
    c.add_argument(
        "--keep-size",
        metavar="SIZE",
        help="also keep the most recently used other entries while the cache stays within SIZE (e.g. 20G)",
    )
    c.add_argument(
        "--stored",
        action="store_true",
        help="also remove the layers containers-storage holds too (the same diff_id), whatever "
        "the locks need: what a node that pulls its images may drop",
    )
    c.add_argument(
        "--dry-run", action="store_true", help="say what would be removed; remove nothing"
    )
    c.add_argument("--json", action="store_true", help=JSON_HELP)

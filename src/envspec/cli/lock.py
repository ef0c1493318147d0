"""`envspec explain SPEC` and `envspec lock SPEC`; the lock a command given a spec uses (`lock_for`).

The stages are imported inside the handlers: every command's module is imported when the
command line starts, and `envspec explain` must not pay for the others' libraries
(docs/benchmarks.md, explain).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from envspec.cli.common import JSON_HELP, QUIET_HELP, Subparsers, command, console, print_json, say
from envspec.errors import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    EnvspecError,
    LockError,
    ResolutionImpossible,
    StaleLock,
)

if TYPE_CHECKING:
    from envspec.compat.model import CompatDB
    from envspec.lock import Lockfile, Wheel
    from envspec.resolve import Choice, Resolution
    from envspec.sources import ResolvedSources
    from envspec.spec import EnvSpec
    from envspec.wheels.abi import AtHand
    from envspec.wheels.cost import Estimate


def cmd_explain(args: argparse.Namespace) -> int:
    # pydantic's documented switch for its plugins: no discovery, which scans every installed package's
    # entry points (about 1.5% of explain's time, docs/benchmarks.md); envspec's models are its own, and
    # explain starts no process that could inherit the setting. A value the caller set is kept.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    from envspec import explain
    from envspec.compat import load_db
    from envspec.resolve import choose
    from envspec.spec import load_spec

    spec = load_spec(args.spec)
    db = load_db()
    try:
        if len(spec.target.platforms) > 1:  # a section per platform: each platform's choice
            return _explain_platforms(args, spec, db)
        choice = _with_packages(choose(spec, db), db) if args.packages else choose(spec, db)
    except ResolutionImpossible as e:
        if args.json:
            print_json(explain.impossible_json(e))
        else:
            for line in explain.impossible_lines(e):
                say(line, stderr=True)
            if e.candidates:
                say("candidates of the newest matching release:", stderr=True)
                for c in e.candidates:
                    say(f"  - {c.variant:<7} {explain.candidate_reason(c)}", stderr=True)
        return e.exit_code
    if args.json:
        print_json(explain.choice_json(choice, packages=args.packages))
    else:
        for line in explain.choice_lines(choice, packages=args.packages):
            say(line)
    return EXIT_OK


def _with_packages(choice: Choice, db: CompatDB) -> Choice:
    """`explain --packages`: the choice moved as `lock` moves it, torch chosen together with the
    packages the spec names (``resolve.with_packages``: reads the indexes)."""
    import tempfile

    from envspec.resolve import closure, source_only, with_packages
    from envspec.sources import discover

    sources = discover(choice.spec.sources)
    with tempfile.TemporaryDirectory(prefix="envspec-explain-") as tmp:
        moved = with_packages(choice, db, sources, workdir=Path(tmp))
        if choice.spec.python.from_source != "auto":
            return moved
        # the whole closure, as `lock` resolves it: the dependencies it takes from their sdists,
        # and the torch those built from sdists compile against (``resolve.closure``)
        moved, wheels = closure(moved, sources, db, workdir=Path(tmp))
        named = source_only(moved, sources, Path(tmp))
        deps = [f"{w.name} {w.version}" for w in wheels if w.is_sdist and not w.direct]
        return dataclasses.replace(
            moved, from_source=tuple(sorted(named)), from_source_deps=tuple(sorted(deps))
        )


def _explain_platforms(args: argparse.Namespace, spec: EnvSpec, db: CompatDB) -> int:
    """`explain` of a spec naming both platforms: the choice for each, in the spec's order
    (--json: {"platforms": [choice, ...]}). An impossible platform raises as for one."""
    from envspec import explain
    from envspec.resolve import choose_all

    choices = [_with_packages(c, db) if args.packages else c for c in choose_all(spec, db)]
    if args.json:
        print_json({"platforms": [explain.choice_json(c, packages=args.packages) for c in choices]})
        return EXIT_OK
    for i, c in enumerate(choices):
        if i:
            say("")
        for line in explain.choice_lines(c, packages=args.packages):
            say(line)
    return EXIT_OK


def _debian_request(spec: EnvSpec) -> list[str] | None:
    """The Debian packages a lock of this spec would ask for now (offline), or None when unknown."""
    from envspec.resolve import debian_request

    choice = _offline_choice(spec)
    return debian_request(choice) if choice is not None and choice.suite else None


def _offline_platforms(spec: EnvSpec) -> list[str] | None:
    """The platforms a lock of this spec is for now (offline), or None when it cannot choose."""
    from envspec.compat import load_db
    from envspec.resolve import choose_all

    try:
        return [c.platform for c in choose_all(spec, load_db())]
    except EnvspecError:
        return None


def _offline_choice(spec: EnvSpec) -> Choice | None:
    """What `explain` would choose for the spec now, or None when it cannot choose."""
    from envspec.compat import load_db
    from envspec.resolve import choose

    try:
        return choose(spec, load_db())
    except EnvspecError:
        return None


def cmd_lock(args: argparse.Namespace) -> int:
    from envspec import lock as lockmod
    from envspec.compat import load_db
    from envspec.resolve import choose_all
    from envspec.sources import discover
    from envspec.spec import load_spec

    spec = load_spec(args.spec)
    out = Path(args.output) if args.output else lockmod.default_path(args.spec, spec.name)
    if args.check:
        return _check(args, spec, out)
    db = load_db()
    choices = choose_all(spec, db)
    sources = discover(spec.sources)
    old = _old_lock(out, quiet=args.json)
    keep = {p.name: {w.name: w.version for w in p.wheels} for p in old.parts} if old else {}
    if old is not None:
        sources = dataclasses.replace(sources, confirmed=_confirmed(old))
    results = _resolve_all(args, spec, db, choices, sources, keep=keep)
    lock = lockmod.from_resolutions(
        results, spec_path=lockmod.spec_relative_to_lock(args.spec, out), db_version=db.version
    )
    held = _held_back(lock)
    if held and spec.python.held_back == "error":  # before anything is written: the old lock stays
        from envspec.causes import PackageHeldBack  # not at the top: `build` imports this module

        raise ResolutionImpossible(
            f'{len(held)} package(s) the spec names are held back ([python].held_back = "error")',
            causes=[PackageHeldBack(text=h["why"]) for h in held],
            hint="act on each reason, pin the package where its current release is wanted, or set "
            '[python].held_back = "warn"',
            reference="package-held-back",
        )
    at_hand = _abi_at_hand(lock, sources, out)
    text = lockmod.dumps(lock)
    changed = not out.exists() or out.read_text(encoding="utf-8") != text
    if changed:
        lockmod.write_atomic(out, text)
    lockmod.remember(text, lock.meta.content_hash)
    locked = _Locked(out, lock, results, at_hand, held, changed)
    if args.json:
        print_json(_locked_json(locked))
    _say_locked(args, locked)
    return EXIT_OK


def _check(args: argparse.Namespace, spec: EnvSpec, out: Path) -> int:
    """`lock --check`: whether the lock at ``out`` is up to date with the spec (offline)."""
    from envspec import lock as lockmod

    old = lockmod.load(out)
    now = _offline_platforms(spec)
    reasons = lockmod.stale_reasons(
        old, spec, debian_requested=_debian_request(spec), platforms=now
    )
    held = _held_back(old)
    if spec.python.held_back == "error":
        reasons += [f'held back ([python].held_back = "error"): {h["why"]}' for h in held]
    if args.json:
        print_json({"ok": not reasons, "lock": str(out), "reasons": reasons, "held_back": held})
        return EXIT_CHECK_FAILED if reasons else EXIT_OK
    if spec.python.held_back == "warn":
        for h in held:
            console(stderr=True).print(
                f"warning: {h['platform'] + ': ' if old.multi else ''}{h['why']}", markup=False
            )
    if reasons:
        con = console(stderr=True)
        con.print(f"{out} is out of date with {args.spec}:", markup=False)
        for r in reasons:
            con.print(f"  - {r}", markup=False)
        con.print(f"hint: run `envspec lock {args.spec}`", markup=False)
    else:
        console().print(f"{out} is up to date with {args.spec}", markup=False)
    return EXIT_CHECK_FAILED if reasons else EXIT_OK


def _old_lock(out: Path, *, quiet: bool) -> Lockfile | None:
    """The lock being re-locked: re-locking keeps its versions where the spec allows them, and its
    files are the record of what their indexes served when it was made. None for a lock that was
    edited by hand (it is rewritten from the spec) or cannot be read."""
    from envspec import lock as lockmod

    if not out.exists():
        return None
    try:
        return lockmod.load(out)
    except lockmod.LockTampered as e:
        if not quiet:
            console(stderr=True).print(
                f"warning: {e.message}; it is rewritten from the spec, keeping none of its versions",
                markup=False,
            )
    except EnvspecError:
        pass
    return None


def _confirmed(lock: Lockfile) -> tuple[tuple[str, str, str], ...]:
    """(filename, sha256, index) of every file the lock names: its wheels and sdists, and their
    build inputs."""
    files = {
        (f.filename, f.sha256, f.index)
        for p in lock.parts
        for w in p.wheels
        for f in [w, *(w.source.build + w.source.toolkit if w.source else [])]
    }
    return tuple(sorted(files))


def _resolve_all(
    args: argparse.Namespace,
    spec: EnvSpec,
    db: CompatDB,
    choices: list[Choice],
    sources: ResolvedSources,
    *,
    keep: dict[str, dict[str, str]],
) -> list[Resolution]:
    """Each platform's choice resolved with the packages (uv), and the build inputs of each
    package built from its sdist pinned."""
    from envspec.cache.dirs import cache_dir_for
    from envspec.resolve import resolve

    con = console(stderr=True)
    results = []
    for choice in choices:
        if not args.quiet and not args.json:
            t = choice.torch
            con.print(
                f"resolving {spec.name}"
                + (f" for {choice.platform}" if len(choices) > 1 else "")
                + ": "
                + (f"torch {t.release.version} {t.variant.name}" if t else "no torch"),
                markup=False,
            )
        res = resolve(
            choice,
            sources,
            cache_dir=cache_dir_for(os.environ),
            keep=keep.get(choice.platform, {}),
            db=db,
            upgrade=args.upgrade_package or [],
        )
        if any(w.is_sdist for w in res.wheels):
            res = _pin_build_inputs(res, sources)
        results.append(res)
    return results


def _pin_build_inputs(res: Resolution, sources: ResolvedSources) -> Resolution:
    import tempfile

    from envspec.cache.dirs import cache_dir_for
    from envspec.cache.store import Cache
    from envspec.wheels import sdist

    with tempfile.TemporaryDirectory(prefix="envspec-build-inputs-") as tmp:
        return sdist.pin_inputs(res, sources, Cache(cache_dir_for(os.environ)), workdir=Path(tmp))


def _abi_at_hand(lock: Lockfile, sources: ResolvedSources, out: Path) -> list[AtHand]:
    """The compiled packages checked against the torch beside them, with the wheels at hand
    (`build` checks them all), before anything is written: a lock that cannot run is not written."""
    from envspec.cache.dirs import cache_dir_for
    from envspec.cache.store import Cache
    from envspec.wheels import abi

    abi_cache = Cache(cache_dir_for(os.environ))
    return [
        abi.check_at_hand(view, abi_cache, sources.mirrors, lock_name=str(out))
        for view in lock.views()
    ]


@dataclasses.dataclass(frozen=True)
class _Locked:
    """What `lock` made, for its last words."""

    out: Path
    lock: Lockfile
    results: list[Resolution]
    at_hand: list[AtHand]
    held: list[dict[str, str]]
    changed: bool

    @property
    def mismatches(self) -> list[str]:
        """Where a wheel's metadata and the DB's row disagree (the lock pins the wheel's)."""
        return list(
            dict.fromkeys(
                m for p in self.lock.parts for m in (p.torch.db_mismatch or [] if p.torch else [])
            )
        )


def _locked_json(done: _Locked) -> dict[str, object]:
    from envspec import explain

    lock = done.lock
    return {
        "ok": True,
        "lock": str(done.out),
        "changed": done.changed,
        "content_hash": lock.meta.content_hash,
        "wheels": sum(len(p.wheels) for p in lock.parts),
        "debs": sum(len(p.debian.packages) if p.debian else 0 for p in lock.parts),
        "platform": lock.platform_names[0],
        "platforms": lock.platform_names,
        "db_mismatch": done.mismatches,
        "held_back": done.held,
        "from_source": _from_source(lock),
        "abi": [
            {"platform": v.platform_names[0]} | a.to_json()
            for v, a in zip(lock.views(), done.at_hand)
        ],
        "torch": [
            {
                "platform": res.choice.platform,
                "version": res.choice.torch.release.version if res.choice.torch else None,
                "passed_over": explain.passed_over_json(res.choice),
            }
            for res in done.results
        ],
    }


def _say_locked(args: argparse.Namespace, done: _Locked) -> None:
    """`lock`'s last words on stderr: the driver it assumed and the DB's mismatches (even with
    -q), then what it chose and why, and (even with -q) what it holds back and what it wrote."""
    from envspec import explain

    con = console(stderr=True)
    if not args.json:  # said even with -q: the lock's driver floor is a guess about the hosts
        for line in explain.driver_assumed_lines(done.lock):
            con.print(line, markup=False)
    for m in done.mismatches:
        con.print(
            f"warning: {m}; the lock pins the wheel's version (the DB row is wrong: report it)",
            markup=False,
        )
    if args.json:
        return
    if not args.quiet:
        for line in _details(done):
            con.print(line, markup=False)
    for h in done.held:  # printed even with --quiet: a package the lock holds back is a warning
        con.print(
            f"warning: {h['platform'] + ': ' if done.lock.multi else ''}{h['why']} "
            '([python].held_back = "error" refuses the lock)',
            markup=False,
        )
    con.print(_summary(args, done), markup=False)


def _details(done: _Locked) -> list[str]:
    """The releases the packages passed over, the ABI check, the packages built from source."""
    from envspec import explain

    lock = done.lock
    lines: list[str] = []
    for res in done.results:
        for line in explain.passed_over_lines(res.choice):
            lines.append((f"{res.choice.platform}: " if lock.multi else "") + line)
    for v, a in zip(lock.views(), done.at_hand):
        if a.judged or a.unchecked:
            lines.append((f"{v.platform_names[0]}: " if lock.multi else "") + abi_line(a, v))
    for f in _from_source(lock):
        lines.append(
            (f"{f['platform']}: " if lock.multi else "")
            + f"from source: {f['name']} {f['version']} "
            f"({f['sdist']}; {f['backend']} with {', '.join(f['build']) or 'nothing else'}"
            + (
                f"; CUDA from {', '.join(f['toolkit'])} for {' '.join(f['arch_list'])}"
                if f["toolkit"]
                else ""
            )
            + ")"
            + (
                f"; {', '.join(f['undeclared'])} given to its build at the lock's pins (its "
                f"setup.py imports {'it' if len(f['undeclared']) == 1 else 'them'} undeclared)"
                if f["undeclared"]
                else ""
            )
            + f", built by `envspec build`: {f['estimate']}; once: "
            "`envspec build --cache-to REPO` shares the wheel with every machine that builds "
            "this lock"
        )
    return lines


def _summary(args: argparse.Namespace, done: _Locked) -> str:
    """What was written (or, for `build --dry-run`, locked in a temporary folder)."""
    lock = done.lock
    counts = "; ".join(
        f"{p.name}: " * lock.multi + f"{len(p.wheels)} wheels, "
        f"{len(p.debian.packages) if p.debian else 0} Debian packages"
        for p in lock.parts
    )
    short = f"{lock.meta.content_hash[:19]}…"
    if getattr(args, "dry_run_of", None):  # the lockfile is left alone
        return f"locked {args.dry_run_of} without writing it (--dry-run): {counts}, lock {short}"
    return f"{'wrote' if done.changed else 'unchanged'} {done.out}: {counts}, lock {short}"


def abi_line(a: AtHand, lock: Lockfile) -> str:
    """One line on the ABI check done at lock time."""
    t = lock.torch.version if lock.torch else "torch"
    said = (
        f"extensions of {', '.join(a.judged)} load beside torch {t}"
        if a.judged
        else "no wheel at hand has extensions on torch"
    )
    if a.unchecked:
        said += (
            f"; {len(a.unchecked)} platform wheel(s) not at hand ({', '.join(a.unchecked[:3])}"
            f"{', ...' if len(a.unchecked) > 3 else ''}) are checked by `envspec build`"
        )
    return f"abi: {said}"


class _FromSource(TypedDict):
    """A package the lock builds from its sdist, as `lock --json` and its last lines say it."""

    platform: str
    name: str
    version: str
    sdist: str
    sha256: str
    backend: str
    build: list[str]
    python: str
    compiler: str
    key: str
    toolkit: list[str]
    arch_list: list[str]
    # what its setup.py imports and does not declare, given at the lock's pins (match-runtime)
    undeclared: list[str]
    estimate_s: float | None  # its build time here (``cost.estimate``), None where not known
    estimate: str  # that in words, with what it is from


def _from_source(lock: Lockfile) -> list[_FromSource]:
    """The packages the lock builds from their sdists (``[wheels.source]``), platform by platform,
    with the time each build is expected to take here (issue 58, point 6)."""
    from envspec.cache.store import Cache
    from envspec.wheels import cost

    cache, jobs = Cache(), cost.default_jobs()
    out = []
    for part in lock.parts:
        for w in part.wheels:
            if w.source is None:
                continue
            e = cost.estimate(w, cache.root, cost.sdist_at_hand(w, cache), jobs)
            out.append(_one_from_source(part.name, w, e, cost.say_estimate(e)))
    return out


def _one_from_source(platform: str, w: Wheel, e: Estimate | None, said: str) -> _FromSource:
    assert w.source is not None
    return _FromSource(
        platform=platform,
        name=w.name,
        version=w.version,
        sdist=w.filename,
        sha256=w.sha256,
        backend=w.source.backend,
        build=[f"{b.name} {b.version}" for b in w.source.build],
        python=w.source.python,
        compiler=w.source.compiler,
        key=w.source.key,
        toolkit=[f"{b.name} {b.version}" for b in w.source.toolkit],
        arch_list=list(w.source.arch_list),
        undeclared=list(w.source.undeclared or []),
        estimate_s=round(e.seconds) if e is not None else None,
        estimate=said,
    )


def _held_back(lock: Lockfile) -> list[dict[str, str]]:
    """The wheels the lock records as held back (``resolve.held_back``), platform by platform."""
    return [
        {"platform": part.name, "name": w.name, "version": w.version, "why": w.held_back}
        for part in lock.parts
        for w in part.wheels
        if w.held_back
    ]


def lock_for(
    target: str, *, locked: bool, quiet: bool, write: bool = True
) -> tuple[Lockfile, Path]:
    """A lockfile path, or a spec whose lock is found, checked, and made or refreshed when needed;
    ``write=False`` (``build --dry-run``): a lock that must be made is made in a temporary folder
    and the lockfile is left as it is."""
    from envspec import lock as lockmod

    path = Path(target)
    if path.suffix != ".toml":
        return lockmod.load(path), path
    from envspec.spec import load_spec

    spec = load_spec(path)
    out = lockmod.default_path(path, spec.name)
    if _lock_is_fresh(spec, path, out, locked=locked, quiet=quiet, write=write):
        return lockmod.load(out), out
    return _relock(path, out, write=write), out


def _lock_is_fresh(
    spec: EnvSpec, path: Path, out: Path, *, locked: bool, quiet: bool, write: bool
) -> bool:
    """Whether the lock ``out`` of the spec at ``path`` is up to date; where it is not (or is
    missing), an error with ``locked``, else a word on stderr that it is made first."""
    from envspec import lock as lockmod

    con = console(stderr=True)
    if out.exists():
        now = _offline_platforms(spec)
        reasons = lockmod.stale_reasons(
            lockmod.load(out), spec, debian_requested=_debian_request(spec), platforms=now
        )
        if not reasons:
            return True
        if locked:
            raise StaleLock(out, reasons)
        if not quiet:
            con.print(
                f"{out} is out of date with {path} ({reasons[0]}); locking first"
                + ("" if write else f" (--dry-run: {out} is not written)"),
                markup=False,
            )
    else:
        if locked:
            raise LockError(
                f"{out}: no lockfile for {path}",
                hint=f"run `envspec lock {path}` (or drop --locked)",
                reference="lock-not-found",
            )
        if not quiet:
            con.print(
                f"{out} does not exist; locking {path} first"
                + ("" if write else f" (--dry-run: {out} is not written)"),
                markup=False,
            )
    return False


def _relock(path: Path, out: Path, *, write: bool) -> Lockfile:
    """`lock` of the spec at ``path`` into ``out``; a dry run (not ``write``) locks in a
    temporary folder, from a copy of the old lock (whose versions re-locking keeps)."""
    import contextlib
    import tempfile

    from envspec import lock as lockmod

    with (
        tempfile.TemporaryDirectory(prefix="envspec-dry-lock-")
        if not write
        else contextlib.nullcontext() as tmp
    ):
        made = Path(tmp) / out.name if tmp else out
        if tmp and out.exists():
            made.write_bytes(out.read_bytes())
        cmd_lock(
            argparse.Namespace(
                spec=str(path),
                output=str(made),
                check=False,
                upgrade_package=None,
                json=False,
                quiet=True,
                dry_run_of=None if write else str(out),
            )
        )
        return lockmod.load(made)


def add_lock(sub: Subparsers) -> None:
    s = command(
        sub,
        "lock",
        help="resolve a spec into a lockfile: every wheel and .deb pinned by sha256",
        description="Resolve a spec against the compatibility DB and the package indexes, torch together "
        "with the packages on it, into a lockfile: every wheel, sdist and Debian package pinned "
        "with its sha256, and the hardware contract (GPUs, arch list, driver floor). Re-locking "
        "keeps the versions the spec still allows.",
        examples=[
            "envspec lock specs/h100.toml                 # writes lockfiles/h100-train.lock",
            "envspec lock specs/h100.toml --check         # in CI: exit 1 when the lock is stale",
            "envspec lock specs/h100.toml --upgrade-package vllm",
        ],
    )
    s.add_argument("spec", metavar="SPEC", help="the spec (TOML)")
    s.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="lockfile path (default lockfiles/<name>.lock beside the spec's specs/ folder)",
    )
    s.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 with reasons when the lock no longer matches the spec",
    )
    s.add_argument(
        "--upgrade-package",
        action="append",
        metavar="NAME",
        help="let NAME move to its newest version (repeatable)",
    )
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    s.add_argument("-q", "--quiet", action="store_true", help=QUIET_HELP)
    s.set_defaults(func=cmd_lock)


def add_explain(sub: Subparsers) -> None:
    s = command(
        sub,
        "explain",
        help="which torch build, CUDA and driver floor a spec gets, and why (offline)",
        description="Say which torch release and build fit the spec's GPUs, driver, Python and platform, "
        "every candidate with the reason it fits or not, and why newer releases were passed "
        "over. Offline: reads only the compatibility DB.",
        examples=[
            "envspec explain specs/h100.toml",
            "envspec explain specs/h100.toml --packages   # with the packages, as `lock` chooses",
        ],
    )
    s.add_argument("spec", metavar="SPEC", help="the spec (TOML)")
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    s.add_argument(
        "--packages",
        action="store_true",
        help="choose torch together with the packages the spec names, as `lock` does, and say which "
        "newer releases they pass over (reads the package indexes)",
    )
    s.set_defaults(func=cmd_explain)

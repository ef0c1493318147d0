"""The command line: the only module that prints or exits.

Exit codes are listed in ``envspec.errors``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from envspec import __version__
from envspec.errors import (EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_INTERRUPTED, EXIT_OK, EnvspecError,
                            ResolutionImpossible, UsageError)

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from envspec.image import BuiltImage
    from envspec.image.index import BuiltIndex


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def _say(text: str, stderr: bool = False) -> None:
    """One line (or several) of plain text, as it is: no markup, no emoji codes, no wrapping. Used
    where start-up time counts (`explain`, errors), so that rich (tens of ms to import) is not
    needed there. Flushed, as rich does, so that it interleaves with the other stream as before."""
    stream = sys.stderr if stderr else sys.stdout
    stream.write(text + "\n")
    stream.flush()


def _print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")


# ---------------------------------------------------------------------------------------
# lock / explain / db

def cmd_explain(args) -> int:
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
        choice = choose(spec, db)
    except ResolutionImpossible as e:
        if args.json:
            _print_json(explain.impossible_json(e))
        else:
            for line in explain.impossible_lines(e):
                _say(line, stderr=True)
            if e.candidates:
                _say("candidates of the newest matching release:", stderr=True)
                for c in e.candidates:
                    _say(f"  - {c.variant:<7} {explain.candidate_reason(c)}", stderr=True)
        return e.exit_code
    if args.json:
        _print_json(explain.choice_json(choice))
    else:
        for line in explain.choice_lines(choice):
            _say(line)
    return EXIT_OK


def _explain_platforms(args, spec, db) -> int:
    """`explain` of a spec naming both platforms: the choice for each, in the spec's order
    (--json: {"platforms": [choice, ...]}). An impossible platform raises as for one."""
    from envspec import explain
    from envspec.resolve import choose_all

    choices = choose_all(spec, db)
    if args.json:
        _print_json({"platforms": [explain.choice_json(c) for c in choices]})
        return EXIT_OK
    for i, c in enumerate(choices):
        if i:
            _say("")
        for line in explain.choice_lines(c):
            _say(line)
    return EXIT_OK


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def _debian_request(spec) -> list[str] | None:
    """The Debian packages a lock of this spec would ask for now (offline), or None when unknown."""
    from envspec.resolve import debian_request

    choice = _offline_choice(spec)
    return debian_request(choice) if choice is not None and choice.suite else None


def _offline_platforms(spec) -> list[str] | None:
    """The platforms a lock of this spec is for now (offline), or None when it cannot choose."""
    from envspec.compat import load_db
    from envspec.resolve import choose_all

    try:
        return [c.platform for c in choose_all(spec, load_db())]
    except EnvspecError:
        return None


def _offline_choice(spec):
    """What `explain` would choose for the spec now, or None when it cannot choose."""
    from envspec.compat import load_db
    from envspec.resolve import choose

    try:
        return choose(spec, load_db())
    except EnvspecError:
        return None


def cmd_lock(args) -> int:
    from envspec import lock as lockmod
    from envspec.spec import load_spec

    spec = load_spec(args.spec)
    out = Path(args.output) if args.output else lockmod.default_path(spec.name)
    if args.check:
        old = lockmod.load(out)
        now = _offline_platforms(spec)
        reasons = lockmod.stale_reasons(old, spec, debian_requested=_debian_request(spec),
                                        platforms=now)
        if args.json:
            _print_json({"ok": not reasons, "lock": str(out), "reasons": reasons})
        elif reasons:
            con = _console(stderr=True)
            con.print(f"{out} is out of date with {args.spec}:", markup=False)
            for r in reasons:
                con.print(f"  - {r}", markup=False)
            con.print(f"hint: run `envspec lock {args.spec}`", markup=False)
        else:
            _console().print(f"{out} is up to date with {args.spec}", markup=False)
        return EXIT_CHECK_FAILED if reasons else EXIT_OK
    from envspec.compat import load_db
    from envspec.host import cache_dir_for
    from envspec.resolve import choose_all, resolve
    from envspec.sources import discover

    db = load_db()
    choices = choose_all(spec, db)
    sources = discover(spec.sources)
    keep: dict[str, dict[str, str]] = {}
    if out.exists():  # re-locking keeps the old lock's versions where the spec allows them
        try:
            keep = {p.name: {w.name: w.version for w in p.wheels} for p in lockmod.load(out).parts}
        except EnvspecError:
            keep = {}
    con = _console(stderr=True)
    results = []
    for choice in choices:
        if not args.quiet and not args.json:
            t = choice.torch
            con.print(f"resolving {spec.name}" + (f" for {choice.platform}" if len(choices) > 1 else "") + ": "
                      + (f"torch {t.release.version} {t.variant.name}" if t else "no torch"), markup=False)
        results.append(resolve(choice, sources, cache_dir=cache_dir_for(os.environ), keep=keep.get(choice.platform, {}),
                               upgrade=args.upgrade_package or []))
    lock = lockmod.from_resolutions(results, spec_path=_rel(Path(args.spec)), db_version=db.version)
    text = lockmod.dumps(lock)
    changed = not out.exists() or out.read_text(encoding="utf-8") != text
    if changed:
        lockmod.write_atomic(out, text)
    mismatches = [m for p in lock.parts for m in (p.torch.db_mismatch or [] if p.torch else [])]
    if args.json:
        _print_json({"ok": True, "lock": str(out), "changed": changed, "content_hash": lock.meta.content_hash,
                     "wheels": sum(len(p.wheels) for p in lock.parts),
                     "debs": sum(len(p.debian.packages) if p.debian else 0 for p in lock.parts),
                     "platform": lock.platform_names[0], "platforms": lock.platform_names,
                     "db_mismatch": list(dict.fromkeys(mismatches))})
    if mismatches:
        warn = _console(stderr=True)
        for m in dict.fromkeys(mismatches):
            warn.print(f"warning: {m}; the lock pins the wheel's version (the DB row is wrong: report it)", markup=False)
    if not args.json and not args.quiet:
        counts = "; ".join(f"{p.name}: " * lock.multi + f"{len(p.wheels)} wheels, "
                           f"{len(p.debian.packages) if p.debian else 0} Debian packages" for p in lock.parts)
        con.print(f"{'wrote' if changed else 'unchanged'} {out}: {counts}, lock {lock.meta.content_hash[:19]}…",
                  markup=False)
    return EXIT_OK


def cmd_db(args: argparse.Namespace) -> int:
    from envspec.compat import load_db

    if args.db_cmd == "refresh":
        from envspec.compat import DATA_DIR, refresh
        from envspec.errors import EXIT_SOURCE

        report = refresh(Path(args.output) if args.output else DATA_DIR / "torch_pypi.toml")
        # 3: an index did not answer for some release; 1: releases could not be read (README, errors.py)
        # a release that needs review (a CUDA the DB does not know, no arch list) is written, but fails the run
        code = (EXIT_SOURCE if report.source_errors else
                EXIT_CHECK_FAILED if report.problems or report.needs_review or report.platform_review else EXIT_OK)
        if args.json:
            _print_json(report.to_json())
            return code
        con = _console()
        n = len(report.releases)
        counts = ", ".join(f"{len(names)} {what}" for what, names in (
            ("added", report.added), ("changed", report.changed), ("unchanged", report.unchanged),
            ("kept", report.kept), ("removed", report.removed)))
        con.print(f"{'wrote' if report.written else 'did not write'} {report.out_path}: "
                  f"{n} release{'s' if n != 1 else ''} ({counts})", markup=False)
        for what, names in (("added", report.added), ("changed", report.changed), ("removed", report.removed)):
            if names:
                con.print(f"  {what}: {', '.join(names)}", markup=False)
        if report.problems:
            err = _console(stderr=True)
            for problem in report.problems:
                err.print(f"problem: {problem}", markup=False)
            err.print("hint: " + ("an index did not answer: check the network and run it again; "
                                  if report.source_errors else "")
                      + "a release that could not be read keeps its old row, if the file had one", markup=False)
        for review, hint in ((report.needs_review, "these releases were written with what their metadata says and "
                              "are left out of resolution until cuda.toml / torch_variants.toml have the missing rows "
                              "(docs/compat-db.md, Refreshing)"),
                             (report.platform_review, "these releases resolve on linux-x86_64; on linux-aarch64 the "
                              "resolver goes by compat/data/torch_platforms.toml, curated (docs/compat-db.md, \"The "
                              "platform's torch build\")")):
            if not review:
                continue
            err = _console(stderr=True)
            for version, items in review.items():
                for item in items:
                    err.print(f"needs review: torch {version}: {item}", markup=False)
            err.print("hint: " + hint, markup=False)
        return code
    db = load_db(validate=True)  # the db commands check the data files whatever the cache of checked DBs holds
    if args.json:
        _print_json(db.to_json())
        return EXIT_OK
    if args.html:
        from envspec import explain
        from envspec.lock import write_atomic

        write_atomic(args.html, explain.db_html(db))
        _console().print(f"wrote {args.html}: the GPU x torch x CUDA-variant matrix of DB {db.version} "
                         "(one self-contained page)", markup=False)
        return EXIT_OK
    from rich.table import Table

    con = _console()
    con.print(f"compatibility DB {db.version} ({db.date})", markup=False)
    t = Table("torch", "python", "PyPI build", "variants (CUDA / cuDNN / NCCL)", title="torch releases")
    for r in db.torch_releases:
        vs = ", ".join(f"{v.name}" + (f" {v.cuda}/{v.cudnn or '-'}/{v.nccl or '-'}" if v.cuda else "")
                       for v in r.variants.values())
        t.add_row(r.version, " ".join(r.python), r.pypi_variant or "-", vs)
    con.print(t)
    g = Table("GPU", "cc", "memory GiB", "bf16 TFLOPS", "tf32 TFLOPS", "GB/s", title="GPUs")
    for x in db.gpus:
        g.add_row(x.name, x.cc, _n(x.memory_gib), _n(x.bf16_tflops), _n(x.tf32_tflops), _n(x.mem_bw_gbs))
    con.print(g)
    return EXIT_OK


def _lock_for(target: str, *, locked: bool, quiet: bool):
    """A lockfile path, or a spec whose lock is found, checked, and made or refreshed when needed."""
    from envspec import lock as lockmod

    path = Path(target)
    if path.suffix != ".toml":
        return lockmod.load(path), path
    from envspec.spec import load_spec

    spec = load_spec(path)
    out = lockmod.default_path(spec.name)
    con = _console(stderr=True)
    if out.exists():
        now = _offline_platforms(spec)
        reasons = lockmod.stale_reasons(lockmod.load(out), spec, debian_requested=_debian_request(spec),
                                        platforms=now)
        if not reasons:
            return lockmod.load(out), out
        if locked:
            from envspec.errors import StaleLock

            raise StaleLock(out, reasons)
        if not quiet:
            con.print(f"{out} is out of date with {path} ({reasons[0]}); locking first", markup=False)
    else:
        if locked:
            from envspec.errors import LockError

            raise LockError(f"{out}: no lockfile for {path}", hint=f"run `envspec lock {path}` (or drop --locked)",
                            reference="lock-not-found")
        if not quiet:
            con.print(f"{out} does not exist; locking {path} first", markup=False)
    ns = argparse.Namespace(spec=str(path), output=str(out), check=False, upgrade_package=None, json=False, quiet=True)
    cmd_lock(ns)
    return lockmod.load(out), out


_SOURCE_WORDS = {"made": "made", "local": "from the local cache", "registry": "from the registry cache"}


class _Progress:
    """rich progress bars for the build's events (the core only reports events)."""

    def __init__(self, quiet: bool):
        from envspec.image import Reporter

        self.quiet = quiet
        self.con = _console(stderr=True)
        outer = self

        class R(Reporter):
            def fetching(self, name, filename, size):
                outer._task("fetch", f"fetching {filename}", size)

            def fetched(self, name, filename, path):
                outer._done("fetch")

            def layer_started(self, group, pins, cached):
                outer._line(f"layer {group}: building ({pins} pins)" if pins else f"layer {group}: building")

            def layer_built(self, layer):
                outer._line(f"layer {layer.group:<8} {layer.digest[:19]}  {layer.size / 1e6:9.1f} MB"
                            f"  {_SOURCE_WORDS.get(layer.source, layer.source)}")

            def importing(self, group, sent):
                outer._bytes(f"into containers-storage: {group}", sent)

            def committing(self, ref, digest):
                outer._line(f"tagging {ref} ({digest[:19]})")

            def pushed(self, dest, digest):
                outer._line(f"pushed {dest}@{digest}")

            def warning(self, message):  # printed even with --quiet
                (outer.progress.console if outer.progress else outer.con).print(f"warning: {message}", markup=False)

        self.reporter = R()
        self.progress: Progress | None = None
        self.tasks: dict[str, TaskID] = {}
        self.counts: dict[str, int] = {}
        import threading

        self.lock = threading.Lock()

    def __enter__(self):
        if not self.quiet:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), console=self.con, transient=True)
            self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def _task(self, kind, desc, size):
        if self.progress is None:
            return
        if kind not in self.tasks:
            self.tasks[kind] = self.progress.add_task("fetching files", total=0)
        self.progress.update(self.tasks[kind], total=(self.progress.tasks[self.tasks[kind]].total or 0) + 1)

    def _bytes(self, desc, sent):
        """One bar per layer on its way into containers-storage (its size is known only once
        it is made, so the bar counts bytes)."""
        if self.progress is None:
            return
        with self.lock:  # layers go into the store from several threads at once
            if desc not in self.tasks:
                self.tasks[desc] = self.progress.add_task(desc, total=None)
        self.progress.update(self.tasks[desc], description=f"{desc} {sent / 1e6:,.0f} MB")

    def _done(self, kind):
        if self.progress is not None and kind in self.tasks:
            self.progress.advance(self.tasks[kind])

    def _line(self, text):
        if not self.quiet:
            (self.progress.console if self.progress else self.con).print(text, markup=False)


def cmd_build(args) -> int:
    from envspec import sources
    from envspec.image import DEFAULT_COMPRESSION, BuildahEngine, BuildOptions, build, preview
    from envspec.image.engine import registry_access
    from envspec.cache.store import Cache
    from envspec.host import ASK_NONE, ASK_STORAGE, detect_host
    from envspec.plan import make_plan
    from envspec.registry.stage import Registry

    spec_sources = None
    if Path(args.target).suffix == ".toml":
        from envspec.spec import load_spec

        spec_sources = load_spec(args.target).sources
    cache_from, cache_to = _cache_refs(args, spec_sources)
    # checked before building; only for a push or a registry cache (a stale REGISTRY_AUTH_FILE does
    # not stop a local build)
    access = (registry_access(args.authfile, args.cert_dir, _bool_flag("--tls-verify", args.tls_verify))
              if args.push or cache_from or cache_to else None)
    lock, lock_path = _lock_for(args.target, locked=args.locked, quiet=args.quiet or args.json)
    if spec_sources is not None and spec_sources.debian_snapshot and not os.environ.get("ENVSPEC_DEBIAN_SNAPSHOT"):
        os.environ["ENVSPEC_DEBIAN_SNAPSHOT"] = spec_sources.debian_snapshot  # tried first for pinned .debs
    plan = make_plan(lock) if not lock.multi else None
    sign_key = _signing_key(args)
    if args.check_digest and args.push:
        raise UsageError("--check-digest and --push together", hint="--check-digest compares a rebuild with an "
                         "image pushed before; push from one build, check from another")
    options = BuildOptions(tag=args.tag, outputs=tuple(args.output or ()), push=args.push, no_cache=args.no_cache,
                           registry=Registry(key=sign_key, lock_path=_rel(lock_path)),
                           cache_from=cache_from, cache_to=cache_to,
                           compression=args.compression or DEFAULT_COMPRESSION,
                           # named, or for --check-digest's comparison with a pushed image: compressed now
                           compress=True if (args.compression or args.check_digest) else None)
    if lock.multi:
        from envspec.image.index import check_options

        check_options(options)  # what an image index cannot carry: refused before anything is built
    if args.dry_run:  # the plan, what is cached, what would be fetched, the engine's verbs; nothing done
        dry_cache = Cache(detect_host(ask=ASK_NONE).cache_dir)
        if plan is None:
            from envspec.image.index import platform_tag, preview_index

            # each platform's image as it is built (tagged, no push or output of its own), then the index
            _print_json({"index": True, "push": options.push, "outputs": list(options.outputs),
                         "engine": preview_index(lock, options), "platforms": [
                {"platform": v.platform_names[0]} | preview(make_plan(v), dry_cache, options=dataclasses.replace(
                    options, tag=platform_tag(options.tag, v), push=None, outputs=())) for v in lock.views()]})
        else:
            _print_json(preview(plan, dry_cache, options=options))
        return EXIT_OK
    host = detect_host(ask=ASK_STORAGE)  # its tools and storage; no GPU query for a build
    cache = Cache(host.cache_dir)
    engine = BuildahEngine(host, registry=access) if access else BuildahEngine(host)
    mirrors = sources.discover(spec_sources).mirrors
    with _Progress(args.quiet or args.json) as prog:
        if plan is None:  # a section per platform: an image each, one image index over them
            from envspec.image.index import build_index

            built: BuiltImage | BuiltIndex = build_index(lock, engine, cache, mirrors, options=options,
                                                         reporter=prog.reporter)
        else:
            built = build(plan, engine, cache, mirrors, options=options, reporter=prog.reporter)
    if args.check_digest:  # the independent rebuild: same lock, same bytes, same digest
        return _check_digest(args, built)
    background = _compress_in_background(built, lock_path, host.cache_dir) if plan is not None else None
    if args.json:
        _print_json(built.to_json() | {"lock": str(lock_path), "storage": _storage_json(host),
                                       "background_compress": background})
    elif not args.quiet:
        con = _console()
        for line in (_index_lines(built, host, lock, target=args.target) if plan is None
                     else _built_lines(built, host, lock, target=args.target)):
            con.print(line, markup=False)
        if background:
            con.print(f"compressing its layers for a later push, in the background at the lowest priority (pid "
                      f"{background['pid']}, log {background['log']}; ENVSPEC_BACKGROUND_COMPRESS=off: not)",
                      markup=False)
    else:
        _console().print(built.digest, markup=False)
    return EXIT_OK


def _compress_in_background(built, lock_path, cache_dir) -> dict | None:
    """After a build that kept its layers uncompressed (nothing carried them: ``image.compress_now``),
    `envspec cache compress LOCK` in a process of its own, at the lowest CPU and I/O priority, so that
    a later push or OCI output of the lock finds the compressed blobs; a push started before it
    ends waits for the layer it is compressing, never compresses one twice. Off with
    ENVSPEC_BACKGROUND_COMPRESS=off (or 0/no/false). Returns its pid, log and command, or None."""
    import shutil
    import subprocess

    if not built.image or built.compression == built.carried_compression:
        return None
    if os.environ.get("ENVSPEC_BACKGROUND_COMPRESS", "on").strip().lower() in ("0", "off", "no", "false"):
        return None
    argv = [sys.executable, "-m", "envspec", "cache", "compress", str(Path(lock_path).resolve()),
            "--compression", built.carried_compression]
    low = ([*(["ionice", "-c", "3"] if shutil.which("ionice") else []), "nice", "-n", "19"]
           if shutil.which("nice") else [])
    log = Path(cache_dir) / "compress.log"
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:  # the last one's
            proc = subprocess.Popen([*low, *argv], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True)
    except OSError:  # a push then compresses them itself
        return None
    return {"pid": proc.pid, "log": str(log), "command": argv}


def _cache_refs(args, spec_sources) -> tuple[str, str]:
    """The registry cache repositories of a build: --cache-from/--cache-to, else ENVSPEC_CACHE_FROM/
    ENVSPEC_CACHE_TO, else the spec's [sources] cache_from/cache_to (a lock carries none); each
    checked (a mistyped one is exit 2, cache-ref-invalid). "" (flag or variable) turns it off."""
    from envspec.registry.regcache import parse_ref

    refs = []
    for name in ("cache_from", "cache_to"):
        flag, var = "--" + name.replace("_", "-"), "ENVSPEC_" + name.upper()
        value, where = getattr(args, name), flag
        if value is None and var in os.environ:
            value, where = os.environ[var], var
        if value is None and spec_sources is not None:
            value, where = getattr(spec_sources, name), f"{args.target} [sources] {name}"
        refs.append(parse_ref(value, where) if value else "")
    return refs[0], refs[1]


def _signing_key(args):
    """The key of --sign-by-sigstore-private-key (with --sign-passphrase-file), or None."""
    if not args.sign_by_sigstore_private_key:
        if args.sign_passphrase_file:
            raise UsageError("--sign-passphrase-file without --sign-by-sigstore-private-key",
                             hint="name the key to sign with: --sign-by-sigstore-private-key PATH")
        return None
    if not args.push:
        raise UsageError("--sign-by-sigstore-private-key without --push", reference="sign-without-push",
                         hint="signatures and attestations are pushed beside the image: add --push REF")
    from envspec.registry.attest import SigningKey

    passphrase = None
    if args.sign_passphrase_file:
        try:
            passphrase = Path(args.sign_passphrase_file).read_bytes().rstrip(b"\r\n")
        except OSError as e:
            raise UsageError(f"--sign-passphrase-file {args.sign_passphrase_file}: {e.strerror}") from e
    return SigningKey.load(args.sign_by_sigstore_private_key, passphrase)


def _check_digest(args, built) -> int:
    from envspec.image.engine import registry_access
    from envspec.registry.verify_image import RegistryReader, manifest_digest

    # the push's registry options (--authfile, --cert-dir, --tls-verify) reach the pushed image too
    reader = RegistryReader(registry_access(args.authfile, args.cert_dir, _bool_flag("--tls-verify", args.tls_verify)))
    pushed = manifest_digest(reader, args.check_digest)
    same = pushed == built.digest
    if args.json:
        _print_json(built.to_json() | {"check_digest": {"ref": args.check_digest, "pushed": pushed,
                                                         "built": built.digest, "same": same}})
    else:
        con = _console(stderr=not same)
        if same:
            con.print(f"same digest: {args.check_digest} is {pushed}, and so is this rebuild", markup=False)
        else:
            con.print(f"different digest: {args.check_digest} is {pushed or '(no such image)'}, this rebuild is "
                      f"{built.digest}", markup=False)
            con.print("hint: the pushed image was not built from this lock by this envspec (or with other "
                      "layer options); `envspec verify-image` shows what its provenance says", markup=False)
    return EXIT_OK if same else EXIT_CHECK_FAILED


def _cache_compress(args, cache) -> int:
    """`envspec cache compress LOCK`: the compressed blobs of the lock's cached layers, made now."""
    from envspec import lock as lockmod
    from envspec.image import compress_layers
    from envspec.image.compress import compression
    from envspec.plan import make_plan

    import time
    from dataclasses import asdict

    started = time.monotonic()
    made = compress_layers(make_plan(lockmod.load(Path(args.lock))), cache, compression(args.compression))
    seconds = time.monotonic() - started
    if args.json:
        _print_json({"lock": args.lock, "compression": args.compression, "seconds": round(seconds, 3),
                     "layers": [asdict(lay) for lay in made]})
    else:
        _console().print(f"compressed {len(made)} layers ({sum(lay.diff_size for lay in made) / 1e6:.1f} MB -> "
                         f"{sum(lay.size for lay in made) / 1e6:.1f} MB {args.compression}) in {seconds:.1f} s",
                         markup=False)
    return EXIT_OK


def _needed(paths: list[Path]):
    """What the locks at ``paths`` need of the cache (``plan.cache_entries``), and the locks that
    could not be read ("path: why"). A lock named on the command line that cannot be read is
    refused before this."""
    from envspec import lock as lockmod
    from envspec.cache.gc import Needed
    from envspec.plan import cache_entries

    needed, bad = Needed(), []
    for p in paths:
        try:
            needed.add(str(p), cache_entries(lockmod.load(p)))
        except EnvspecError as e:
            bad.append(f"{p}: {e.message.splitlines()[0].rstrip(':')}")
    return needed, bad


def cmd_cache(args) -> int:
    from envspec.cache import gc as cachegc
    from envspec.cache.store import Cache
    from envspec.host import cache_dir_for

    cache = Cache(cache_dir_for(os.environ))
    if args.cache_cmd == "compress":
        return _cache_compress(args, cache)
    if args.cache_cmd != "gc":
        entries = cachegc.scan(cache)
        info = cachegc.summary(cache, entries)
        if args.json:
            _print_json(info | {"entries": [e.to_json() for e in entries]})
            return EXIT_OK
        con = _console()
        con.print(f"cache {info['cache']}: {cachegc.human(info['total_bytes'])}", markup=False)
        for kind, row in info["kinds"].items():
            con.print(f"  {kind + 's':<8} {row['count']:>6}  {cachegc.human(row['bytes']):>11}", markup=False)
        for name, size in info["other"].items():
            con.print(f"  {name:<24} {cachegc.human(size):>11}  (not collected)", markup=False)
        for e in (e for e in entries if e.kind == "layer"):
            con.print(f"  layer {e.name[:12]} {e.group or '?':<10} {cachegc.human(e.size):>11}", markup=False)
        return EXIT_OK
    if args.locks:
        paths = [Path(p) for p in args.locks]
        from envspec import lock as lockmod

        for p in paths:  # a lock named here that cannot be read stops the collection (exit 2)
            lockmod.load(p)
    else:
        paths = cachegc.default_locks(Path.cwd())
    needed, bad = _needed(paths)
    keep_size = cachegc.parse_size(args.keep_size) if args.keep_size is not None else None
    err = _console(stderr=True)
    for b in bad:
        err.print(f"warning: skipped {b}: what it needs may be removed", markup=False)
    if not paths and not args.json:
        err.print(f"note: no envspec locks under {cachegc.repository_root(Path.cwd())}: no entry is kept for a lock",
                  markup=False)
    plan = cachegc.collect(cache, needed, keep_size=keep_size, dry_run=args.dry_run,
                           on_wait=lambda: err.print("waiting for the builds using the cache to finish", markup=False))
    if args.json:
        _print_json({"ok": True, "cache": str(cache.root), "dry_run": args.dry_run,
                     "locks": [str(p) for p in paths], "skipped_locks": bad} | plan.to_json())
        return EXIT_OK
    con = _console()
    verb = "would remove" if args.dry_run else "removed"
    for e in plan.remove:
        con.print(f"{verb} {e.kind} {e.name[:16]}{' ' + e.group if e.group else ''}  {cachegc.human(e.size)}",
                  markup=False)
    counts = ", ".join(f"{sum(1 for e in plan.remove if e.kind == k)} {k}s" for k in cachegc.KINDS)
    kept = plan.to_json()["kept"]
    con.print(f"{verb} {len(plan.remove)} entries ({counts}), {cachegc.human(plan.freed)}; kept {kept['count']} "
              f"({cachegc.human(kept['bytes'])}): {kept['needed']} needed by {len(paths)} locks, "
              f"{kept['recent']} used in the last {cachegc.GRACE_S // 60} minutes"
              + (f", {kept['budget']} within --keep-size {args.keep_size}" if keep_size is not None else ""),
              markup=False)
    if plan.over_budget:
        err.print(f"note: what the locks need exceeds --keep-size {args.keep_size} by "
                  f"{cachegc.human(plan.over_budget)}; it is kept", markup=False)
    return EXIT_OK


def _bool_flag(flag: str, value: str | None) -> bool | None:
    if value is None:
        return None
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise UsageError(f"{flag}={value}: expected true or false", hint=f"e.g. {flag}=false")


def cmd_verify_image(args) -> int:
    from envspec.verify.render import table
    from envspec.image.engine import registry_access
    from envspec.registry.verify_image import RegistryReader, load_public_key, verify_image

    key = load_public_key(args.key)
    lock = None
    if args.lock:
        from envspec.lock import load

        lock = load(args.lock)
    reader = RegistryReader(registry_access(args.authfile, args.cert_dir, _bool_flag("--tls-verify", args.tls_verify)))
    report = verify_image(args.ref, key, reader, lock, lock_path=args.lock or "")
    report.lock_name = args.ref
    if args.json:
        _print_json(report.to_dict())
    else:
        sys.stdout.write(table(report))
    return report.exit_code


def _storage_json(host) -> dict[str, str]:
    st = host.storage
    return {"root": st.root, "runroot": st.runroot, "driver": st.driver, "from": st.source}


def _index_lines(built, host, lock, *, target: str) -> list[str]:
    """What `envspec build` of a multi-platform lock says: each platform's image, the index."""
    lines = []
    for name, one in built.images:
        made = sum(lay.source == "made" for lay in one.layers)
        lines.append(f"{name}: built {one.image or '(not named in containers-storage)'} in {one.seconds:.1f} s "
                     f"({made} of {len(one.layers)} layers made), digest {one.digest}")
    lines.append(f"image index {built.digest} over {', '.join(n for n, _ in built.images)}")
    lines += [f"written to {dest}" for dest in built.outputs]
    lines += [f"pushed {dest}@{built.digest}" for dest in built.pushed]
    lines += [f"attached {ref}" for _, one in built.images for ref in one.attached]
    lines += [f"attached {ref} (the index's signature)" for ref in built.attached]
    from envspec.run import start_lines

    here = next((v for v in lock.views() if v.platform.arch == host.machine), None)
    if here is not None:
        lines += start_lines(target, here)
    return lines


def _built_lines(built, host, lock, *, target: str) -> list[str]:
    """What `envspec build` says at its end: the image, its digest, where it is kept, and how to
    start it (with its services, with a command)."""
    import shlex

    from envspec.run import start_lines

    name = built.image or "(not named in containers-storage: --tag '')"
    local = sum(lay.source == "local" for lay in built.layers)
    remote = sum(lay.source == "registry" for lay in built.layers)
    made = len(built.layers) - local - remote
    lines = [f"built {name} in {built.seconds:.1f} s ({made} of {len(built.layers)} layers made"
             + (f", {local} from the cache" if local else "")
             + (f", {remote} from the registry cache {built.cache_from}" if remote else "") + ")",
             f"digest {built.digest}" + ("" if built.compression == built.carried_compression else
                                          " (its layers uncompressed, as the store keeps them; a push carries them "
                                          "compressed, under another digest: docs/build.md, \"Which digest\")"),
             f"image id {built.config_digest}"]
    if built.cached_to:
        lines.append(f"pushed {len(built.cached_to)} layers to the layer cache {built.cache_to}")
    lines += [f"written to {dest}" for dest in built.outputs]
    lines += [f"pushed {dest}@{built.digest}" for dest in built.pushed]  # the compressed manifest's digest
    lines += [f"attached {ref}" for ref in built.attached]
    if not built.image:
        return lines
    st = host.storage
    where = f"containers-storage at {st.root}" if st.root else "podman's containers-storage"
    if st.custom:
        where += " (ENVSPEC_STORAGE_ROOT: keep it set for envspec run)"
    repo = built.image.rsplit(":", 1)[0] if ":" in built.image.rsplit("/", 1)[-1] else built.image
    lines += [f"stored in {where}", f"  list it: {shlex.join(['podman', *st.args(), 'images', repo])}"]
    return lines + start_lines(target, lock, image=built.image)


def cmd_diff(args) -> int:
    from envspec.diff import diff_files, diff_lines

    d = diff_files(args.old, args.new)
    if args.json:
        _print_json(d.to_json())
    else:
        con = _console()
        for line in diff_lines(d):
            con.print(line, markup=False)
    return EXIT_OK


def cmd_doctor(args) -> int:
    from envspec.doctor import doctor_exit_code, doctor_json, doctor_lines, run_doctor
    from envspec.host import detect_host
    from envspec.lock import load

    lock = load(args.lock) if args.lock else None
    host = detect_host()
    if lock is not None and lock.multi:  # the host's platform's section (else the first)
        lock = lock.for_platform(host.machine) if lock.find_part(host.machine) else lock.views()[0]
    diagnoses = run_doctor(host, lock)
    if args.json:
        _print_json(doctor_json(diagnoses))
    else:
        con = _console()
        for line in doctor_lines(diagnoses):
            con.print(line, markup=False)
    return doctor_exit_code(diagnoses)


def cmd_run(args) -> int:
    from envspec.host import ASK_DOCKER, ASK_NONE, detect_host
    from envspec.run import (ENGINE_FAILED, attached, check_docker_image, check_engine_ready, check_podman_image,
                             plan_run, resolve_runnable, run_lines, start_failed)

    cmd = list(args.cmd or [])
    ports: dict[int, int] = {}
    for p in args.port or []:
        outside, _, inside = p.partition(":")
        if not (outside.isdigit() and inside.isdigit()):
            raise UsageError(f"--port {p!r} is not HOST:CONTAINER", hint="e.g. --port 18888:8888")
        ports[int(inside)] = int(outside)
    runnable = resolve_runnable(args.target)
    host = detect_host(ask=ASK_NONE)  # file checks only: --print stays fast
    command = plan_run(runnable, cmd, host=host, engine=args.engine, bind=args.bind, detach=args.detach,
                       name=args.name, mount_cwd=not args.no_mount, gpus=not args.no_gpu, host_ports=ports,
                       image=args.image, emulate=args.emulate, platform=args.platform)
    if command.emulated_cpu:  # the command mounts it (also the one --print shows)
        from envspec.host import write_emulated_cpu_dir

        if not write_emulated_cpu_dir(Path(command.emulated_cpu)):
            command = command.without_emulated_cpu()
    if args.json:
        _print_json(command.to_json())
        return EXIT_OK
    if args.print:
        sys.stdout.write("\n".join(run_lines(command)) + "\n")
        return EXIT_OK
    con = _console(stderr=True)
    if command.engine == "docker":
        check_engine_ready(detect_host(ask=ASK_DOCKER), "docker")
        check_docker_image(command)  # the image is there: the hint how to load it is no warning now
    elif runnable.lock is not None and not args.image:
        check_podman_image(command, source=str(args.target))
    for w in command.warnings:
        if w != command.load_hint:
            con.print(f"warning: {w}", markup=False)
    for n in command.notes:
        con.print(f"note: {n}", markup=False)
    sys.stdout.flush()
    sys.stderr.flush()
    argv, remove = attached(command, f"{os.getpid()}-{os.urandom(3).hex()}")
    try:
        rc = _run_foreground(argv)
    finally:
        if remove:  # podman keeps the stopped container (and so its exit code) until this
            import subprocess

            subprocess.run(remove, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    if rc == ENGINE_FAILED:
        raise start_failed(command, rc)
    return rc


def _run_foreground(argv: list[str]) -> int:
    """Run ``argv`` with this process's terminal and return its exit status (not exec: an engine
    that fails to start the container is then named, with the step). Ctrl-C reaches the child
    through the terminal; SIGTERM and SIGHUP sent to envspec are passed on."""
    import signal
    import subprocess

    child = subprocess.Popen(argv)
    forward = {sig: signal.signal(sig, lambda s, _f: child.send_signal(s)) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:  # the child got the same SIGINT: wait for it to finish
                continue
    finally:
        for sig, old in forward.items():
            signal.signal(sig, old)


def _n(v) -> str:
    return "-" if v is None else (f"{v:g}")


# ---------------------------------------------------------------------------------------

def _add_lock(sub) -> None:
    s = sub.add_parser("lock", help="resolve a spec into a lockfile")
    s.add_argument("spec")
    s.add_argument("-o", "--output", help="lockfile path (default lockfiles/<name>.lock)")
    s.add_argument("--check", action="store_true", help="exit 1 with reasons when the lock no longer matches the spec")
    s.add_argument("--upgrade-package", action="append", metavar="NAME", help="let NAME move to its newest version")
    s.add_argument("--json", action="store_true")
    s.add_argument("-q", "--quiet", action="store_true")
    s.set_defaults(func=cmd_lock)


def _add_explain(sub) -> None:
    s = sub.add_parser("explain", help="which torch build fits the spec, and why (offline)")
    s.add_argument("spec")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_explain)


def _add_db(sub) -> None:
    s = sub.add_parser("db", help="the compatibility database")
    dsub = s.add_subparsers(dest="db_cmd", metavar="ACTION", required=True)
    d = dsub.add_parser("show", help="print the DB")
    d.add_argument("--json", action="store_true")
    d.add_argument("--html", metavar="FILE", help="write one self-contained HTML page: the GPU x torch x CUDA-variant "
                                                  "matrix with driver floors, filterable, each cell linked to its source")
    d = dsub.add_parser("refresh", help="regenerate the PyPI-derived part from the package index")
    d.add_argument("-o", "--output", help="where to write (default: the bundled data file)")
    d.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_db)


def _add_build(sub) -> None:
    s = sub.add_parser("build", help="build the lock's OCI image with buildah")
    s.add_argument("target", metavar="SPEC|LOCK")
    s.add_argument("--tag", help="image reference (default localhost/envspec/<name>:<lock hash>)")
    s.add_argument("--output", action="append", metavar="oci:DIR|oci-archive:FILE|docker-archive:FILE",
                   help="also write the image here (repeatable)")
    s.add_argument("--push", metavar="REF", help="push to a registry, keeping the digest")
    s.add_argument("--compression", choices=("zstd", "gzip", "none"),
                   help="of the layers that --push, --output oci:/oci-archive: and --cache-to carry (default zstd; "
                        "gzip for docker < 23); named, it also compresses a local build's layers, to report the digest "
                        "a push would have (docs/build.md, \"Which digest\")")
    s.add_argument("--sign-by-sigstore-private-key", metavar="PATH",
                   help="sign the pushed image and its attestations with this key (cosign/sigstore or PEM)")
    s.add_argument("--sign-passphrase-file", metavar="PATH", help="the signing key's passphrase")
    s.add_argument("--check-digest", metavar="REF",
                   help="rebuild, then compare the digest with the image pushed as REF (exit 1 when they differ)")
    s.add_argument("--authfile", metavar="PATH",
                   help="registry credentials, a containers auth.json (default: $REGISTRY_AUTH_FILE, else "
                        "skopeo's: ${XDG_RUNTIME_DIR}/containers/auth.json)")
    s.add_argument("--cert-dir", metavar="DIR", help="trust the CA certificates (*.crt) in DIR for the push and the registry cache")
    s.add_argument("--tls-verify", metavar="true|false",
                   help="verify the registry's TLS certificate (default: yes, except for a loopback registry "
                        "without --cert-dir)")
    s.add_argument("--cache-from", metavar="REF",
                   help="take layers from the registry cache REF (HOST[:PORT]/REPO; default: $ENVSPEC_CACHE_FROM, "
                        "else the spec's [sources] cache_from)")
    s.add_argument("--cache-to", metavar="REF",
                   help="push made layers to the registry cache REF (default: $ENVSPEC_CACHE_TO, else the spec's "
                        "[sources] cache_to)")
    s.add_argument("--no-cache", action="store_true", help="rebuild every layer (no local or registry cache is read)")
    s.add_argument("--locked", action="store_true", help="refuse to build when the lock is missing or stale")
    s.add_argument("--dry-run", action="store_true",
                   help="print the plan (layers, pins, content keys, cached or not), what would be fetched, and "
                        "the engine steps; do nothing")
    s.add_argument("--json", action="store_true")
    s.add_argument("-q", "--quiet", action="store_true")
    s.set_defaults(func=cmd_build)


def _add_verify_image(sub) -> None:
    s = sub.add_parser("verify-image", help="check a pushed image's signature, provenance and lock in its registry")
    s.add_argument("ref", metavar="REF", help="HOST/REPO:TAG or HOST/REPO@sha256:...")
    s.add_argument("--key", required=True, metavar="PUB", help="the signer's public key (PEM)")
    s.add_argument("--lock", metavar="LOCK", help="the lock the image must have been built from")
    s.add_argument("--authfile", metavar="PATH", help="registry credentials (default: $REGISTRY_AUTH_FILE)")
    s.add_argument("--cert-dir", metavar="DIR", help="trust the CA certificates (*.crt) in DIR")
    s.add_argument("--tls-verify", metavar="true|false", help="verify TLS (default: yes, except on loopback)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_verify_image)


def _add_cache(sub) -> None:
    s = sub.add_parser("cache", help="what envspec's cache holds; `cache gc` removes what no lock needs")
    s.add_argument("--json", action="store_true")
    csub = s.add_subparsers(dest="cache_cmd", metavar="ACTION")
    c = csub.add_parser("gc", help="remove the wheels, .debs and layers that the locks do not need")
    c.add_argument("locks", nargs="*", metavar="LOCK",
                   help="keep what these locks need (default: every envspec *.lock in this repository)")
    c.add_argument("--keep-size", metavar="SIZE",
                   help="also keep the most recently used other entries while the cache stays within SIZE (e.g. 20G)")
    c.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")
    c.add_argument("--json", action="store_true")
    c = csub.add_parser("compress", help="make the compressed blobs of a lock's cached layers now, so that a push "
                                         "need not (a local build starts this in the background)")
    c.add_argument("lock", metavar="LOCK")
    c.add_argument("--compression", choices=("zstd", "gzip"), default="zstd")
    c.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_cache, cache_cmd=None)


def _add_run(sub) -> None:
    s = sub.add_parser("run", help="start the image with podman or docker, GPUs, shm, ports and this directory")
    s.add_argument("target", metavar="SPEC|LOCK|IMAGE")
    s.add_argument("--print", action="store_true", help="print the command instead of running it")
    s.add_argument("--json", action="store_true")
    s.add_argument("--engine", choices=("podman", "docker"))
    s.add_argument("--image", help="run this image reference instead of the lock's tag")
    s.add_argument("--bind", default="127.0.0.1", help="address the services' ports listen on (default loopback)")
    s.add_argument("--port", action="append", metavar="HOST:CONTAINER", help="publish a service port elsewhere")
    s.add_argument("-d", "--detach", action="store_true")
    s.add_argument("--name")
    s.add_argument("--no-mount", action="store_true", help="do not mount the current directory on /workspace")
    s.add_argument("--no-gpu", action="store_true")
    s.add_argument("--emulate", action="store_true",
                   help="run an image of another CPU architecture (arm64 on amd64) under qemu-user-static "
                        "(binfmt_misc); without it such an image is refused (exit 2)")
    s.add_argument("--platform", metavar="linux-x86_64|linux-aarch64",
                   help="which section of a multi-platform lock to run (default: this host's)")
    s.set_defaults(func=cmd_run, cmd=[])  # the command after `--` is split off before parsing


def _add_doctor(sub) -> None:
    s = sub.add_parser("doctor", help="check this host before building or running")
    s.add_argument("lock", nargs="?", help="a lockfile to check the host against")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_doctor)


def _add_diff(sub) -> None:
    s = sub.add_parser("diff", help="what changed between two locks, and which layers it rebuilds")
    s.add_argument("old")
    s.add_argument("new")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_diff)


def _add_verify(sub) -> None:
    sub.add_parser("verify", help="check the live machine against a lock (see `envspec verify --help`)")


def _add_cluster(sub) -> None:
    sub.add_parser("cluster", help="render job files that verify N nodes (see `envspec cluster render --help`)")


# Each command's sub-parser, in the order `envspec --help` lists them.
_COMMANDS = {
    "lock": _add_lock,
    "explain": _add_explain,
    "db": _add_db,
    "build": _add_build,
    "verify-image": _add_verify_image,
    "cache": _add_cache,
    "run": _add_run,
    "doctor": _add_doctor,
    "diff": _add_diff,
    "verify": _add_verify,
    "cluster": _add_cluster,
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
    argparse's set-up of every command is about 2% of `envspec explain`, docs/benchmarks.md
    session 12)."""
    p = argparse.ArgumentParser(prog="envspec", description="Reproducible GPU deep-learning environments.")
    p.add_argument("--version", action="version", version=f"envspec {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="show tracebacks and commands")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    for name, add in _COMMANDS.items():
        if command is None or name == command:
            add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["verify"]:  # the verifier parses its own arguments (it also runs alone inside images)
        from envspec.verify.cli import main as verify_main

        return verify_main(argv[1:])
    if argv[:1] == ["cluster"]:  # `envspec cluster render ...`: job files for torchrun across nodes
        from envspec.cluster import main as cluster_main

        return cluster_main(argv[1:])
    parser = build_parser(_command_of(argv))
    after: list[str] = []
    if argv[:1] == ["run"] and "--" in argv:  # `envspec run TARGET [options] -- CMD...`
        i = argv.index("--")
        argv, after = argv[:i], argv[i + 1:]
    args = parser.parse_args(argv)
    if after:
        args.cmd = after
    if not getattr(args, "func", None):
        build_parser().print_help()  # every command's
        return EXIT_BAD_INPUT
    if args.func is not cmd_explain:  # explain is offline and logs nothing: it does without the logging module
        import logging

        logging.basicConfig(level=logging.WARNING, format="warning: %(message)s")  # the core's warnings, e.g. stale indexes
    try:
        return args.func(args)
    except EnvspecError as e:
        from envspec import explain

        if getattr(args, "json", False):
            _print_json(explain.impossible_json(e) if isinstance(e, ResolutionImpossible)
                        else {"ok": False, "error": e.to_json()})
        if args.verbose:
            import traceback

            _say(traceback.format_exc(), stderr=True)
        if isinstance(e, ResolutionImpossible):
            lines = explain.impossible_lines(e)
            _say(f"error[{e.reference}]: " + "\n".join(lines), stderr=True)
        else:
            _say(f"error[{e.reference}]: {e.message}", stderr=True)
        if e.hint and not e.hint_in_message:
            _say(f"hint: {e.hint}", stderr=True)
        return e.exit_code
    except KeyboardInterrupt:
        _console(stderr=True).print("interrupted; nothing was half-written", markup=False)
        return EXIT_INTERRUPTED

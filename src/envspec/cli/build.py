"""`envspec build SPEC|LOCK`: its options, its progress bars and what it says at its end.

The stages are imported inside the handlers: every command's module is imported when the
command line starts, and `envspec explain` must not pay for the others' libraries
(docs/benchmarks.md, explain).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from envspec.cli.common import JSON_HELP, Subparsers, bool_flag, command, console, print_json, rel
from envspec.cli.lock import lock_for
from envspec.errors import EXIT_CHECK_FAILED, EXIT_OK, EnvspecError, UsageError

if TYPE_CHECKING:
    from envspec.host import Host
    from envspec.image import BuildOptions, BuiltImage, Preview
    from envspec.image.engine import RegistryAccess
    from envspec.image.index import BuiltIndex, IndexPreview
    from envspec.lock import Lockfile
    from envspec.plan import BuildPlan
    from envspec.registry.attest import SigningKey
    from envspec.settings import Settings
    from envspec.spec import Build as SpecBuild
    from envspec.spec import Sources


def cmd_build(args: argparse.Namespace) -> int:
    from envspec.image.engine import registry_access
    from envspec.plan import make_plan

    spec_sources, spec_build = _spec_tables(args.target)
    cache_from, cache_to = _cache_refs(args, spec_sources)
    # checked before building; only for a push or a registry cache (a stale REGISTRY_AUTH_FILE does
    # not stop a local build)
    access = (
        registry_access(args.authfile, args.cert_dir, bool_flag("--tls-verify", args.tls_verify))
        if args.push or cache_from or cache_to
        else None
    )
    lock, lock_path = lock_for(
        args.target, locked=args.locked, quiet=args.quiet or args.json, write=not args.dry_run
    )
    if (
        spec_sources is not None
        and spec_sources.debian_snapshot
        and not _settings().debian_snapshot
    ):
        # tried first for pinned .debs (debian.fetch reads it where the build fetches them)
        from envspec.settings import DEBIAN_SNAPSHOT

        os.environ[DEBIAN_SNAPSHOT] = spec_sources.debian_snapshot
    plan = make_plan(lock) if not lock.multi else None
    options = _options(args, lock, lock_path, spec_build, (cache_from, cache_to))
    if args.dry_run:  # the plan, what is cached, what would be fetched, the engine's verbs
        return _dry_run(args, lock, lock_path, plan, options)
    built, host = _build(args, lock, plan, options, access, spec_sources)
    if args.check_digest:  # the independent rebuild: same lock, same bytes, same digest
        return _check_digest(args, built)
    _say_built(args, built, host, lock, lock_path)
    return EXIT_OK


def _spec_tables(target: str) -> tuple[Sources | None, SpecBuild | None]:
    """The spec's [sources] and [build] where a spec is built (a lock carries neither)."""
    if Path(target).suffix != ".toml":
        return None, None
    from envspec.spec import load_spec

    spec = load_spec(target)
    return spec.sources, spec.build


def _options(
    args: argparse.Namespace,
    lock: Lockfile,
    lock_path: Path,
    spec_build: SpecBuild | None,
    cache_refs: tuple[str, str],
) -> BuildOptions:
    """The build's options from its flags, the spec's [build] and the registry cache's names."""
    from envspec.image import DEFAULT_COMPRESSION, BuildOptions
    from envspec.lock import lock_base
    from envspec.registry.stage import Registry

    sign_key = _signing_key(args)
    if args.check_digest and args.push:
        raise UsageError(
            "--check-digest and --push together",
            hint="--check-digest compares a rebuild with an "
            "image pushed before; push from one build, check from another",
        )
    options = BuildOptions(
        tag=args.tag,
        outputs=tuple(args.output or ()),
        push=args.push,
        no_cache=args.no_cache,
        registry=Registry(key=sign_key, lock_path=rel(lock_path)),
        cache_from=cache_refs[0],
        cache_to=cache_refs[1],
        source_parallel=spec_build.parallel if spec_build else 1,
        source_jobs=spec_build.jobs if spec_build else 0,
        compression=args.compression or DEFAULT_COMPRESSION,
        # named, or for --check-digest's comparison with a pushed image: compressed now
        compress=True if (args.compression or args.check_digest) else None,
        # [meta].spec is relative to the folder holding lockfiles/, not to where envspec runs
        spec_dir=(lock_base(lock_path) / Path(lock.meta.spec).parent) if lock.meta.spec else None,
    )
    if lock.multi:
        from envspec.image.index import check_options

        check_options(options)  # what an image index cannot carry: refused before anything is built
    return options


def _dry_run(
    args: argparse.Namespace,
    lock: Lockfile,
    lock_path: Path,
    plan: BuildPlan | None,
    options: BuildOptions,
) -> int:
    """`build --dry-run`: the plan, what is cached, what would be fetched, the engine's verbs;
    nothing fetched, made or written."""
    from envspec.cache.store import Cache
    from envspec.host import ASK_NONE, detect_host
    from envspec.image import preview
    from envspec.image.index import preview_all

    dry_cache = Cache(detect_host(ask=ASK_NONE).cache_dir)
    shown: Preview | IndexPreview = (
        preview_all(lock, dry_cache, options)
        if plan is None
        else preview(plan, dry_cache, options=options)
    )
    if args.json:
        print_json(shown.to_json())
    else:
        con = console()
        for line in _dry_run_lines(shown, lock, lock_path):
            con.print(line, markup=False)
    return EXIT_OK


def _build(
    args: argparse.Namespace,
    lock: Lockfile,
    plan: BuildPlan | None,
    options: BuildOptions,
    access: RegistryAccess | None,
    spec_sources: Sources | None,
) -> tuple[BuiltImage | BuiltIndex, Host]:
    """The image (or, for a lock with a section per platform, the image index), with progress
    bars; a full disk said as such (which directory, how much the build needs)."""
    from envspec import sources
    from envspec.cache.store import Cache
    from envspec.cli.progress import BuildProgress
    from envspec.host import ASK_STORAGE, detect_host
    from envspec.image import BuildahEngine, build

    host = detect_host(ask=ASK_STORAGE)  # its tools and storage; no GPU query for a build
    cache = Cache(host.cache_dir)
    engine = BuildahEngine(host, registry=access) if access else BuildahEngine(host)
    mirrors = sources.discover(spec_sources).mirrors
    try:
        with BuildProgress(args.quiet or args.json) as prog:
            if plan is None:  # a section per platform: an image each, one image index over them
                from envspec.image.index import build_index

                built: BuiltImage | BuiltIndex = build_index(
                    lock, engine, cache, mirrors, options=options, reporter=prog.reporter
                )
            else:
                built = build(plan, engine, cache, mirrors, options=options, reporter=prog.reporter)
    except (OSError, EnvspecError) as e:
        from envspec.doctor import disk_full_error, is_disk_full

        if is_disk_full(e):
            raise disk_full_error(e, host, lock) from None
        raise
    return built, host


def _say_built(
    args: argparse.Namespace,
    built: BuiltImage | BuiltIndex,
    host: Host,
    lock: Lockfile,
    lock_path: Path,
) -> None:
    """What `build` says at its end (JSON with --json, the digest alone with --quiet), after
    starting the background compression of a local build's layers."""
    from envspec.image import BuiltImage

    background = (
        _compress_in_background(built, lock_path, host.cache_dir)
        if isinstance(built, BuiltImage)
        else None
    )
    if args.json:
        print_json(
            built.to_json()
            | {
                "lock": str(lock_path),
                "storage": _storage_json(host),
                "background_compress": background,
            }
        )
    elif not args.quiet:
        con = console()
        for line in (
            _built_lines(built, host, lock, target=args.target)
            if isinstance(built, BuiltImage)
            else _index_lines(built, host, lock, target=args.target)
        ):
            con.print(line, markup=False)
        if background:
            con.print(
                f"compressing its layers for a later push, in the background at the lowest priority (pid "
                f"{background['pid']}, log {background['log']}; ENVSPEC_BACKGROUND_COMPRESS=off: not)",
                markup=False,
            )
    else:
        console().print(built.digest, markup=False)


def _compress_in_background(
    built: BuiltImage, lock_path: Path, cache_dir: Path
) -> dict[str, object] | None:
    """After a build that kept its layers uncompressed (nothing carried them: ``image.compress_now``),
    `envspec cache compress LOCK` in a process of its own, at the lowest CPU and I/O priority, so that
    a later push or OCI output of the lock finds the compressed blobs; a push started before it
    ends waits for the layer it is compressing, never compresses one twice. Off with
    ENVSPEC_BACKGROUND_COMPRESS=off (or 0/no/false). Returns its pid, log and command, or None."""
    import shutil
    import subprocess

    if not built.image or built.compression == built.carried_compression:
        return None
    if not _settings().background_compress:
        return None
    argv = [
        sys.executable,
        "-m",
        "envspec",
        "cache",
        "compress",
        str(Path(lock_path).resolve()),
        "--compression",
        built.carried_compression,
    ]
    low = (
        [*(["ionice", "-c", "3"] if shutil.which("ionice") else []), "nice", "-n", "19"]
        if shutil.which("nice")
        else []
    )
    log = Path(cache_dir) / "compress.log"
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:  # the last one's
            proc = subprocess.Popen(
                [*low, *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
    except OSError:  # a push then compresses them itself
        return None
    return {"pid": proc.pid, "log": str(log), "command": argv}


def _settings() -> Settings:
    from envspec import settings

    return settings.read()


def _cache_refs(args: argparse.Namespace, spec_sources: Sources | None) -> tuple[str, str]:
    """The registry cache repositories of a build: --cache-from/--cache-to, else ENVSPEC_CACHE_FROM/
    ENVSPEC_CACHE_TO, else the spec's [sources] cache_from/cache_to (a lock carries none); each
    checked (a mistyped one is exit 2, cache-ref-invalid). "" (flag or variable) turns it off."""
    from envspec.registry.regcache import parse_ref

    refs = []
    conf = _settings()
    for name in ("cache_from", "cache_to"):
        flag, var = "--" + name.replace("_", "-"), "ENVSPEC_" + name.upper()
        value, where = getattr(args, name), flag
        if value is None and getattr(conf, name) is not None:
            value, where = getattr(conf, name), var
        if value is None and spec_sources is not None:
            value, where = getattr(spec_sources, name), f"{args.target} [sources] {name}"
        refs.append(parse_ref(value, where) if value else "")
    return refs[0], refs[1]


def _signing_key(args: argparse.Namespace) -> SigningKey | None:
    """The key of --sign-by-sigstore-private-key (with --sign-passphrase-file), or None."""
    if not args.sign_by_sigstore_private_key:
        if args.sign_passphrase_file:
            raise UsageError(
                "--sign-passphrase-file without --sign-by-sigstore-private-key",
                hint="name the key to sign with: --sign-by-sigstore-private-key PATH",
            )
        return None
    if not args.push:
        raise UsageError(
            "--sign-by-sigstore-private-key without --push",
            reference="sign-without-push",
            hint="signatures and attestations are pushed beside the image: add --push REF",
        )
    from envspec.registry.attest import SigningKey

    passphrase = None
    if args.sign_passphrase_file:
        try:
            passphrase = Path(args.sign_passphrase_file).read_bytes().rstrip(b"\r\n")
        except OSError as e:
            raise UsageError(
                f"--sign-passphrase-file {args.sign_passphrase_file}: {e.strerror}"
            ) from e
    return SigningKey.load(args.sign_by_sigstore_private_key, passphrase)


def _check_digest(args: argparse.Namespace, built: BuiltImage | BuiltIndex) -> int:
    from envspec.image.engine import registry_access
    from envspec.registry.verify_image import RegistryReader, manifest_digest

    # the push's registry options (--authfile, --cert-dir, --tls-verify) reach the pushed image too
    reader = RegistryReader(
        registry_access(args.authfile, args.cert_dir, bool_flag("--tls-verify", args.tls_verify))
    )
    pushed = manifest_digest(reader, args.check_digest)
    same = pushed == built.digest
    if args.json:
        print_json(
            built.to_json()
            | {
                "check_digest": {
                    "ref": args.check_digest,
                    "pushed": pushed,
                    "built": built.digest,
                    "same": same,
                }
            }
        )
    else:
        con = console(stderr=not same)
        if same:
            con.print(
                f"same digest: {args.check_digest} is {pushed}, and so is this rebuild",
                markup=False,
            )
        else:
            con.print(
                f"different digest: {args.check_digest} is {pushed or '(no such image)'}, this rebuild is "
                f"{built.digest}",
                markup=False,
            )
            con.print(
                "hint: the pushed image was not built from this lock by this envspec (or with other "
                "layer options); `envspec verify-image` shows what its provenance says",
                markup=False,
            )
    return EXIT_OK if same else EXIT_CHECK_FAILED


def _dry_run_lines(shown: Preview | IndexPreview, lock: Lockfile, lock_path: Path) -> list[str]:
    """What `build --dry-run` says to a person (``--json``: the whole plan, each layer's pins): the
    image, its layers and whether each is cached, what would be fetched and built, the steps."""
    from envspec.explain import driver_assumed_lines
    from envspec.image.index import IndexPreview

    lines = [f"dry run of {lock_path}: nothing is built, fetched or written"]
    lines += driver_assumed_lines(lock)
    if isinstance(shown, IndexPreview):  # each platform's image, then the index's steps
        for name, one in shown.platforms:
            lines += _image_preview_lines(one, f"{name}: ")
        lines.append("then: " + "; ".join(" ".join(step) for step in shown.engine))
    else:
        lines += _image_preview_lines(shown, "")
        if shown.engine:
            lines.append("  then: " + "; ".join(" ".join(step) for step in shown.engine))
    lines.append("(--json: the whole plan, with each layer's pins)")
    return lines


def _image_preview_lines(one: Preview, where: str) -> list[str]:
    """One image of a dry run: its layers and whether each is cached, what would be fetched and
    built from sdists, the registry layer cache."""
    from envspec.cache.gc import human

    lines = [f"{where}image {one.image}", f"  {'layer':<8} {'pins':>5}  {'key':<12}  state"]
    for row in one.layers:
        lay = row.layer
        state = (
            "made at build (never cached)"
            if not lay.cacheable
            else "cached"
            if row.cached
            else "to make"
        )
        lines.append(f"  {lay.group:<8} {len(lay.pins):>5}  {lay.key.split(':')[-1][:12]}  {state}")
    f = one.fetch
    lines.append(
        f"  to fetch: {f.wheels} wheels ({human(f.wheel_bytes)}), {f.debs} Debian packages "
        f"({human(f.deb_bytes)})"
    )
    if one.source_builds:
        lines.append(
            "  built from sdists: "
            + ", ".join(
                f"{b.name} {b.version} ({'cached' if b.cached else 'to build, ' + b.estimate})"
                for b in one.source_builds
            )
        )
        if any(not b.cached for b in one.source_builds) and not one.cache_to:
            lines.append(
                "  once: `--cache-to REPO` shares the built wheels with every machine that "
                "builds this lock (--cache-from there)"
            )
    if one.cache_from or one.cache_to:
        lines.append(
            f"  registry layer cache: from {one.cache_from or '-'}, to {one.cache_to or '-'}"
        )
    return lines


def _storage_json(host: Host) -> dict[str, str]:
    st = host.storage
    return {"root": st.root, "runroot": st.runroot, "driver": st.driver, "from": st.source}


def _index_lines(built: BuiltIndex, host: Host, lock: Lockfile, *, target: str) -> list[str]:
    """What `envspec build` of a multi-platform lock says: each platform's image, the index."""
    lines = []
    for name, one in built.images:
        made = sum(lay.source == "made" for lay in one.layers)
        lines.append(
            f"{name}: built {one.image or '(not named in containers-storage)'} in {one.seconds:.1f} s "
            f"({made} of {len(one.layers)} layers made), digest {one.digest}"
        )
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


def _built_lines(built: BuiltImage, host: Host, lock: Lockfile, *, target: str) -> list[str]:
    """What `envspec build` says at its end: the image, its digest, where it is kept, and how to
    start it (with its services, with a command)."""
    import shlex

    from envspec.explain import driver_assumed_lines
    from envspec.run import start_lines

    name = built.image or "(not named in containers-storage: --tag '')"
    local = sum(lay.source == "local" for lay in built.layers)
    remote = sum(lay.source == "registry" for lay in built.layers)
    stored = sum(lay.source == "store" for lay in built.layers)
    made = len(built.layers) - local - remote - stored
    lines = driver_assumed_lines(lock) + [
        f"built {name} in {built.seconds:.1f} s ({made} of {len(built.layers)} layers made"
        + (f", {local} from the cache" if local else "")
        + (f", {stored} in the store already" if stored else "")
        + (f", {remote} from the registry cache {built.cache_from}" if remote else "")
        + ")",
        f"digest {built.digest}"
        + (
            ""
            if built.compression == built.carried_compression
            else " (its layers uncompressed, as the store keeps them; a push carries them "
            'compressed, under another digest: docs/build.md, "Which digest")'
        ),
        f"image id {built.config_digest}",
    ]
    if built.cached_to:
        lines.append(f"pushed {len(built.cached_to)} layers to the layer cache {built.cache_to}")
    lines += [f"written to {dest}" for dest in built.outputs]
    lines += [
        f"pushed {dest}@{built.digest}" for dest in built.pushed
    ]  # the compressed manifest's digest
    lines += [f"attached {ref}" for ref in built.attached]
    if not built.image:
        return lines
    st = host.storage
    where = f"containers-storage at {st.root}" if st.root else "podman's containers-storage"
    if st.custom:
        where += " (ENVSPEC_STORAGE_ROOT: keep it set for envspec run)"
    repo = built.image.rsplit(":", 1)[0] if ":" in built.image.rsplit("/", 1)[-1] else built.image
    lines += [
        f"stored in {where}",
        f"  list it: {shlex.join(['podman', *st.args(), 'images', repo])}",
    ]
    return lines + start_lines(target, lock, image=built.image)


def add_build(sub: Subparsers) -> None:
    s = command(
        sub,
        "build",
        help="build the lock's OCI image with buildah (locks first when needed)",
        description="Build the lock's OCI image with buildah, bit for bit the same from the same lock on any "
        "machine, in layers (base, cuda, torch, deps, team, envspec) so that a small change "
        "rebuilds and pushes a small layer. Given a spec, its lock is made or refreshed first.",
        examples=[
            "envspec build specs/h100.toml",
            "envspec build lockfiles/h100-train.lock --dry-run        # what it would do",
            "envspec build lockfiles/h100-train.lock --push registry.example/ml/train:v3 \\",
            "    --cache-to registry.example/ml/cache             # CI: push the image and its layers",
            "envspec build lockfiles/h100-train.lock --cache-from registry.example/ml/cache  # a node",
        ],
    )
    s.add_argument(
        "target",
        metavar="SPEC|LOCK",
        help="a spec (its lock is found, made or refreshed) or a lockfile",
    )
    s.add_argument("--tag", help="image reference (default localhost/envspec/<name>:<lock hash>)")
    s.add_argument(
        "--output",
        action="append",
        metavar="oci:DIR|oci-archive:FILE|docker-archive:FILE",
        help="also write the image here (repeatable)",
    )
    _add_registry_flags(s)
    _add_cache_flags(s)
    s.add_argument(
        "--locked", action="store_true", help="refuse to build when the lock is missing or stale"
    )
    s.add_argument(
        "--dry-run",
        action="store_true",
        help="say what a build would do (the layers, cached or not, what would be fetched, the engine "
        "steps; --json: the whole plan with each layer's pins) and do nothing: no image, no "
        "lockfile written (a missing or stale lock is made in a temporary folder)",
    )
    s.add_argument(
        "--json",
        action="store_true",
        help=JSON_HELP + "; with the build's phases and each layer's source",
    )
    s.add_argument("-q", "--quiet", action="store_true", help="print only the digest")
    s.set_defaults(func=cmd_build)


def _add_registry_flags(s: argparse.ArgumentParser) -> None:
    """--push and what goes with it: compression, signing, the digest check, the registry's
    credentials and TLS."""
    s.add_argument("--push", metavar="REF", help="push to a registry, keeping the digest")
    s.add_argument(
        "--compression",
        choices=("zstd", "gzip", "none"),
        help="of the layers that --push, --output oci:/oci-archive: and --cache-to carry (default zstd; "
        "gzip for docker < 23); named, it also compresses a local build's layers, to report the digest "
        'a push would have (docs/build.md, "Which digest")',
    )
    s.add_argument(
        "--sign-by-sigstore-private-key",
        metavar="PATH",
        help="sign the pushed image and its attestations with this key (cosign/sigstore or PEM)",
    )
    s.add_argument("--sign-passphrase-file", metavar="PATH", help="the signing key's passphrase")
    s.add_argument(
        "--check-digest",
        metavar="REF",
        help="rebuild, then compare the digest with the image pushed as REF (exit 1 when they differ)",
    )
    s.add_argument(
        "--authfile",
        metavar="PATH",
        help="registry credentials, a containers auth.json (default: $REGISTRY_AUTH_FILE, else "
        "skopeo's: ${XDG_RUNTIME_DIR}/containers/auth.json)",
    )
    s.add_argument(
        "--cert-dir",
        metavar="DIR",
        help="trust the CA certificates (*.crt) in DIR for the push and the registry cache",
    )
    s.add_argument(
        "--tls-verify",
        metavar="true|false",
        help="verify the registry's TLS certificate (default: yes, except for a loopback registry "
        "without --cert-dir)",
    )


def _add_cache_flags(s: argparse.ArgumentParser) -> None:
    """The registry layer cache, and --no-cache."""
    s.add_argument(
        "--cache-from",
        metavar="REF",
        help="take layers from the registry cache REF (HOST[:PORT]/REPO; default: $ENVSPEC_CACHE_FROM, "
        "else the spec's [sources] cache_from)",
    )
    s.add_argument(
        "--cache-to",
        metavar="REF",
        help="push made layers to the registry cache REF (default: $ENVSPEC_CACHE_TO, else the spec's "
        "[sources] cache_to)",
    )
    s.add_argument(
        "--no-cache",
        action="store_true",
        help="rebuild every layer (no local or registry cache is read)",
    )

"""uv runs: the requirements a choice gives (``requirements``), the indexes' arguments (the canonical
ones; mirrors only where one of those cannot be read), ``_run_uv`` (`uv pip compile` into
pylock.toml, read into ``PylockPackage``; a failure read by ``failures``)."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from envspec.cache.dirs import cache_dir_for
from envspec.errors import ResolutionImpossible, SourceError
from envspec.resolve.failures import (
    _FAILED_BUILD,
    _metadata_build_error,
    _no_wheel_error,
    _platform_wheel_error,
    _torch_index_error,
    _uv_error,
)
from envspec.resolve.model import SETUP_IMPORTS, Choice, PylockPackage
from envspec.spec import EnvSpec, requirement_name

if TYPE_CHECKING:  # imported where used: `choose` (explain) needs neither the network nor the host
    import subprocess

    from envspec.sources import ResolvedSources


def requirements(choice: Choice) -> tuple[list[str], list[str], set[str]]:
    """(torch's requirements, everyone's requirements, names the spec asked for)."""
    spec = choice.spec
    torch_reqs: list[str] = []
    direct: set[str] = set()
    if choice.torch is not None:
        assert spec.torch is not None  # choose() picks a torch build only for a [torch] table
        local = f"+{choice.torch.variant.local}" if choice.torch.variant.local else ""
        torch_reqs.append(f"torch=={choice.torch.release.version}{local}")
        torch_reqs += list(spec.torch.packages)
        direct |= {"torch"} | {requirement_name(r) for r in spec.torch.packages}
    team = list(spec.python.packages)
    if spec.services.jupyter and spec.services.jupyter.enabled:
        team += ["jupyterlab"] + list(spec.services.jupyter.extensions)
    direct |= {requirement_name(r) for r in team}
    return torch_reqs, torch_reqs + team, direct


def _uv() -> str:
    import shutil  # subprocess, shutil, tempfile: only the lock stage runs uv (explain stays light)

    found = shutil.which("uv")
    if found:
        return found
    try:
        from uv import find_uv_bin  # the uv wheel ships its binary

        return find_uv_bin()
    except Exception:  # noqa: BLE001
        raise SourceError(
            "uv is not installed", hint="pip install uv", reference="uv-missing"
        ) from None


def _index_args(
    sources: ResolvedSources, choice: Choice, *, torch_index: bool = True
) -> tuple[list[str], list[str]]:
    """uv arguments: the canonical indexes, and the mirrors only where one of those cannot be read
    (a mirror stands in for it: each file it serves is then credited only where its canonical index
    lists it, ``_candidate``). A mirror never joins a resolution whose indexes answer: pip's
    find-links folder with torch 2.13.0+cpu would win over PyPI's 2.13.0 (issue 57).
    ``torch_index``: also the PyTorch index of the chosen build (not where only torch's version is
    wanted, ``with_packages``: every release is on PyPI)."""
    from envspec.sources import (
        flat_folder,
        reachable,
    )  # here: explain does without urllib.request, configparser and html.parser

    args: list[str] = []
    notes: list[str] = []
    canon: list[str] = []
    if torch_index and choice.torch is not None and choice.torch.variant.local:
        canon.append(choice.torch.variant.index)
    canon += list(sources.extra_indexes)
    for url in canon:
        if reachable(url):
            args += ["--find-links" if flat_folder(url) else "--extra-index-url", url]
        else:
            notes.append(f"{url} is unreachable; its files must come from a mirror")
    if flat_folder(sources.index):  # a wheelhouse as the index: its files and no registry's
        args += ["--no-index", "--find-links", sources.index]
    elif reachable(sources.index):
        args += ["--default-index", sources.index]
    else:
        notes.append(f"{sources.index} is unreachable; using mirrors only")
        args += (
            ["--no-index"]
            if not any(m.kind == "index" for m in sources.mirrors)
            else ["--default-index", next(m.url for m in sources.mirrors if m.kind == "index")]
        )
    if notes:
        stand_in: list[str] = []
        for m in sources.mirrors:
            if m.kind == "links":
                stand_in += ["--find-links", m.url]
            elif m.url not in args:
                stand_in += ["--extra-index-url", m.url]
        args = stand_in + args
    return args, notes


@dataclass(frozen=True, kw_only=True)
class UvFlags:
    """How ``_run_uv`` asks uv: the packages to upgrade past the lock's versions, constraints,
    the PyTorch index or not, without dependencies, wheels only (``only_binary``) except for the
    ``no_binary`` packages, which are taken as sdists (a package with no wheel, built from
    source: issue 37)."""

    upgrade: Sequence[str] = ()
    constraints: Sequence[str] = ()
    torch_index: bool = True
    no_deps: bool = False
    only_binary: bool = True
    no_binary: Iterable[str] = ()


def _run_uv(
    reqs: list[str],
    choice: Choice,
    sources: ResolvedSources,
    workdir: Path,
    name: str,
    flags: UvFlags = UvFlags(),
) -> list[PylockPackage]:
    """uv's resolution of ``reqs`` for the choice's platform and Python, as pylock.toml packages
    (``name``: the work files' names)."""
    workdir.mkdir(parents=True, exist_ok=True)
    req = workdir / f"{name}.in"
    req.write_text("\n".join(reqs) + "\n")
    out = workdir / f"pylock.{name}.toml"
    if out.exists():
        out.unlink()
    idx, idx_notes = _index_args(sources, choice, torch_index=flags.torch_index)
    argv = _uv_argv(req, out, choice, idx, flags)
    argv += _constraint_args(workdir, name, choice, flags)
    env = dict(os.environ)
    env.setdefault("UV_CACHE_DIR", str(cache_dir_for(env) / "uv"))
    env["UV_NO_CONFIG"] = "1"
    proc, needs = _uv_built(argv, env, workdir / f"{name}.uv.toml", choice, flags)
    if proc.returncode != 0:
        raise (
            _torch_index_error(proc.stderr, choice, idx_notes)
            or _platform_wheel_error(proc.stderr, choice, idx_notes)
            or (
                _no_wheel_error(
                    proc.stderr, choice, lambda name: _would_build(name, choice, sources, workdir)
                )
                if flags.only_binary
                else None
            )
            or _metadata_build_error(proc.stderr, choice)
            or _uv_error(proc.stderr, reqs, choice, sources)
        )
    from packaging.utils import canonicalize_name

    yanked = _yanked(proc.stderr)
    packages = _pylock_packages(out)
    if not yanked and not needs:  # almost always: no copy
        return packages
    return [
        p.model_copy(
            update={
                "yanked": yanked.get(canonicalize_name(p.name)),
                "build_needs": tuple(needs.get(canonicalize_name(p.name), ())),
            }
        )
        for p in packages
    ]


# uv's words for an sdist whose metadata build failed on an import: the package, then the module
_MISSING_MODULE = re.compile(r"No module named '([A-Za-z0-9_]+)")


def _uv_built(
    argv: list[str], env: dict[str, str], config: Path, choice: Choice, flags: UvFlags
) -> tuple[subprocess.CompletedProcess[str], dict[str, list[str]]]:
    """uv run until no sdist's metadata build fails for want of a distribution its setup.py imports
    and its [build-system] does not declare (torch-scatter 2.1.2: torch): each such one is given to
    that package's build, the lock's own torch for torch, as uv's ``extra-build-dependencies`` with
    ``match-runtime`` would (issue 58, point 1), and uv runs again. Returns uv's last run and, by
    normalized package name, what was given."""
    import tomli_w

    needs: dict[str, list[str]] = {}
    while True:
        run = argv
        if needs:
            given = {k: [_runtime_pin(d, choice, flags) for d in v] for k, v in needs.items()}
            config.write_text(tomli_w.dumps({"extra-build-dependencies": given}))
            run = [*argv, "--config-file", str(config)]
        proc = _uv_run(run, env)
        found = _undeclared_import(proc.stderr) if proc.returncode != 0 else None
        if (
            found is None
            or found[1] in needs.get(found[0], [])
            or (found[1] == "torch" and choice.torch is None)
        ):
            return proc, needs
        needs.setdefault(found[0], []).append(found[1])


def _undeclared_import(stderr: str) -> tuple[str, str] | None:
    """(package, distribution) where uv says an sdist's metadata build failed on importing a module
    of a distribution a setup.py builds against (``SETUP_IMPORTS``); None for any other failure."""
    from packaging.utils import canonicalize_name

    failed = re.search(_FAILED_BUILD, stderr)
    missing = _MISSING_MODULE.search(stderr)
    if failed is None or missing is None:
        return None
    dist = SETUP_IMPORTS.get(missing.group(1))
    return (canonicalize_name(failed.group(1)), dist) if dist else None


def _runtime_pin(dist: str, choice: Choice, flags: UvFlags) -> str:
    """The requirement a metadata build is given for ``dist``: the choice's torch, with its local
    version where its index is asked (``torch==2.14.1+cu126``); the lock's constraint where one
    names ``dist``; else the distribution's name."""
    from packaging.utils import canonicalize_name

    if dist == "torch" and choice.torch is not None:
        local = choice.torch.variant.local if flags.torch_index else ""
        return f"torch=={choice.torch.release.version}{'+' + local if local else ''}"
    return next(
        (c for c in flags.constraints if canonicalize_name(requirement_name(c)) == dist), dist
    )


# uv's warning for a release it takes although its index marks it yanked (PEP 592: only an exact
# pin takes one): `requests==2.32.0` is yanked (reason: "...")
_YANKED = re.compile(r'`([A-Za-z0-9._-]+)==([^`]+)` is yanked(?: \(reason: "(.*)"\))?')


def _yanked(stderr: str) -> dict[str, str]:
    """Normalized name -> why, of each release uv says is yanked (the index's reason, if given)."""
    from packaging.utils import canonicalize_name

    return {
        canonicalize_name(m.group(1)): m.group(3) or "no reason given"
        for m in _YANKED.finditer(stderr)
    }


def _pylock_packages(out: Path) -> list[PylockPackage]:
    """The packages of uv's pylock.toml at ``out``; one not as PEP 751 says: ``SourceError``."""
    raw = tomllib.loads(out.read_text()).get("packages", [])
    packages = []
    for i, p in enumerate(raw):
        try:
            packages.append(PylockPackage.model_validate(p))
        except ValidationError as e:
            first = e.errors()[0]
            where = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in first["loc"])
            raise SourceError(
                f"{out}: uv's resolution is not a pylock.toml envspec reads: packages[{i}]{where}: "
                f"{first['msg']}",
                hint="check `uv --version` (envspec reads uv's PEP 751 output; pip install -U uv)",
                reference="uv-output",
            ) from None
    return packages


def _constraint_args(workdir: Path, name: str, choice: Choice, flags: UvFlags) -> list[str]:
    """uv's arguments for the constraints, the packages to upgrade and the builds' torch."""
    argv: list[str] = []
    if flags.constraints:
        c = workdir / f"{name}.constraints.txt"
        c.write_text("\n".join(flags.constraints) + "\n")
        argv += ["--constraint", str(c)]
    for u in flags.upgrade:
        argv += ["--upgrade-package", u]
    if choice.torch is not None and not flags.no_deps:
        # every sdist's metadata build that installs torch gets the choice's, as match-runtime
        # would: transformer-engine-torch says which core it needs from its build's torch.version.cuda
        b = workdir / f"{name}.build-constraints.txt"
        b.write_text(_runtime_pin("torch", choice, flags) + "\n")
        argv += ["--build-constraints", str(b)]
    return argv


def _uv_argv(req: Path, out: Path, choice: Choice, idx: list[str], flags: UvFlags) -> list[str]:
    """`uv pip compile` of ``req`` into ``out`` as pylock.toml, for the choice's Python and
    platform, with the indexes' arguments ``idx``."""
    return [
        _uv(),
        "pip",
        "compile",
        str(req),
        "--format",
        "pylock.toml",
        "-o",
        str(out),
        "--python-version",
        choice.python,
        "--python-platform",
        f"{choice.arch}-manylinux_{choice.glibc}",
        *(["--only-binary", ":all:"] if flags.only_binary else []),
        *(["--no-deps"] if flags.no_deps else []),
        *[a for n in sorted(flags.no_binary) for a in ("--no-binary", n)],
        "--index-strategy",
        "unsafe-best-match",
        "--no-header",
        *idx,
    ]


def _uv_run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run uv, online: it reads each index page it needs, from its HTTP cache where the index let
    it keep the page (PyPI: max-age 600), else from the index. Never ``--offline`` first: offline,
    uv passes over a release whose metadata its cache lacks and takes an older one without failing
    (deepspeed 0.19.8 -> 0.3.1.dev5; vllm 0.19.1 -> 0.16.0, torch 2.10.0 -> 2.9.1 after a lock of
    a spec of torch 2.9), so the answer depended on what other locks had read (issue 57)."""
    import subprocess

    return subprocess.run(argv, capture_output=True, text=True, env=env)


def _would_build(name: str, choice: Choice, sources: ResolvedSources, workdir: Path) -> str:
    """The release of ``name`` a build from source would take (uv without ``--only-binary``, no
    dependencies); "" where there is none."""
    try:
        found = _run_uv(
            [name],
            choice,
            sources,
            workdir,
            "sdist",
            UvFlags(torch_index=False, no_deps=True, only_binary=False),
        )
        return next((p.version for p in found), "")
    except (ResolutionImpossible, SourceError):
        return ""


def _named(spec: EnvSpec) -> list[str]:
    """The requirements the spec names: [python].packages, then [torch].packages."""
    return list(spec.python.packages) + (list(spec.torch.packages) if spec.torch else [])
